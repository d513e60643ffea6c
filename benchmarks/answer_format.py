"""Answer formats side by side on the real sampler: EoH's free answer against the prefilled, code-first one
(:mod:`coevo.ahd.answer`), optionally with grammar-constrained decoding, on the four problems' main configs.

For each problem (``--problems``; each read from ``configs/ahd/<problem>.yaml``: training set, sampling settings,
evaluation limits) and each arm (``--arms``), ``--prompts`` EoH calls (operators i1, m1, m2, i1 in turn; the
problem's seed heuristic, evaluated on the training set, is the parent of m1/m2) go through
:class:`coevo.ahd.sampler.HeuristicSampler` exactly as in a run: one batched ``generate`` on the engine, the
answer read back (:func:`coevo.ahd.answer.read_answer`), the code evaluated in the sandbox on the config's
training instances and recorded in a throw-away SQLite store. Duplicates are not rejected (every answer that
compiles is evaluated). Every arm samples with the same seeds (batch seed ``--seed``; request i
``request_seed(seed, i)``) and the config's temperature, top-p and stop strings.

Arms: ``free`` (today's prompt and parser, the config's token cap), ``prefill`` (the continued assistant turn,
the stop rule at the function's end; cap ``--prefill-max-new-tokens``, default the config's), ``grammar``
(``prefill`` plus :data:`coevo.ahd.answer.BODY_REGEX` through vLLM's structured outputs).

Output: a table, then one JSON line per problem and arm ``{"metric": "answer_format", "problem", "arm",
"prompts", "defines_and_compiles_pct", "valid_pct", "completion_tokens", "tokens_per_valid", "cut_at_cap_pct",
"failures": {kind: n}, "tokens_p50", "tokens_p95", "tokens_max", "valid_equal_seed", "valid_distinct_objectives",
"wall_s", "max_new_tokens", "engine", "cpu"}`` (an arm the engine refuses gives ``{"metric": "answer_format",
"problem", "arm", "error"}``), and per problem one line ``{"metric": "answer_format_gain", "problem",
"valid_pct_free", "valid_pct_prefill", "tokens_per_valid_ratio" (prefill / free), "goal_valid_pct": 60,
"goal_tokens_ratio": 0.25, "met"}``. ``--samples-out FILE`` writes every answer (JSON lines: problem, arm,
operator, text, finish_reason, failure, objective).

Minutes on a 2-core CPU (engine start ~1 min, then about half a minute of decoding per problem and arm).
Usage::

    python benchmarks/answer_format.py [--problems tsp_construct,kp_construct,cvrp_construct,bpp_online]
        [--arms free,prefill] [--prompts 16] [--seed 2024] [--prefill-max-new-tokens N] [--backend auto]
        [--json-out FILE] [--samples-out FILE]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coevo.ahd.answer import ANSWER_FORMATS

PROBLEMS = ("tsp_construct", "kp_construct", "cvrp_construct", "bpp_online")
OPERATORS = ("i1", "m1", "m2", "i1")
#: ``--parents main``: the operators of the main job's later rounds (ES members' m1/m2 and EoH's e1, e2, m1, m2)
MAIN_OPERATORS = ("m1", "m2", "e1", "m1", "m2", "e2", "m1", "m2")
ARMS = {
    "free": ("free", False),
    "prefill": ("prefill", False),
    "grammar": ("prefill", True),
    "change": ("prefill", False),
}
assert {f for f, _ in ARMS.values()} <= set(ANSWER_FORMATS)


def _percentile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))])


def _novel(valid, sampler) -> int:
    """Valid samples whose per-instance objectives differ from the seeds' and from every earlier sample's."""
    from coevo.ahd.sampler import behaviour_key

    seen = set(sampler._seed_behaviours.values())
    n = 0
    for t in valid:
        key = behaviour_key((t.meta.get("metrics") or {}).get("objectives"))
        if key is not None and key not in seen:
            seen.add(key)
            n += 1
    return n


def run_arm(problem_name, arm, policy, args, samples_out) -> dict:
    """One arm on one problem: ``--prompts`` sampler calls, their trajectories summarised."""
    from coevo.ahd.sampler import HeuristicSampler, SamplerSettings
    from coevo.budget import Budget
    from coevo.config import load_config
    from coevo.context import RunContext
    from coevo.store import TrajectoryStore

    cfg, _ = load_config(ROOT / "configs" / "ahd" / f"{problem_name}.yaml")
    ev = next(e.params for e in cfg.evolvers if e.type in ("eoh", "sample"))
    base, _, temp = arm.partition("@")
    fmt, grammar = ARMS[base]
    with tempfile.TemporaryDirectory(prefix="coevo-answer-format-") as tmp:
        store = TrajectoryStore(Path(tmp) / "store.sqlite")
        ctx = RunContext(
            run_id=arm, run_dir=Path(tmp), store=store, budget=Budget(store, arm, None), sampling=cfg.sampling
        )
        params = ctx.sampling_params(temperature=ev.temperature, top_p=ev.top_p, top_k=ev.top_k)
        if temp:  # "ARM@T[/TOP_P[/TOP_K]]": the config's decoding with these settings instead
            t, _, rest = temp.partition("/")
            top_p, _, top_k = rest.partition("/")
            params = replace(params, temperature=float(t))
            if top_p:
                params = replace(params, top_p=float(top_p))
            if top_k:
                params = replace(params, top_k=int(top_k))
        if fmt == "prefill" and args.prefill_max_new_tokens:
            params = replace(params, max_new_tokens=args.prefill_max_new_tokens)
        if fmt == "free" and args.free_max_new_tokens:
            params = replace(params, max_new_tokens=args.free_max_new_tokens)
        from coevo.ahd.problem import load_problem

        problem = load_problem(problem_name)
        settings = SamplerSettings(  # the config's training set and limits; no retries, repairs or dedup
            train_size=ev.train_size or problem.default_size,
            train_count=ev.train_count,
            train_seed=ev.train_seed if ev.train_seed is not None else args.seed,
            eval_timeout_s=ev.eval_timeout_s,
            eval_memory_mb=ev.eval_memory_mb,
            eval_workers=ev.eval_workers,
            reject_duplicates=False,
            answer_format=fmt,
            answer_grammar=grammar,
            change_marks=base == "change",
        )
        sampler = HeuristicSampler(
            problem, settings, owner="eoh", run_id=arm, store=store, budget=Budget(store, arm, None), sampling=params
        )
        seed = sampler.seed_individual()
        starts = [seed]
        if args.parents == "main":  # the main job's starting population: the published seeds, best first
            starts = [sampler.seed_individual(name) for name in getattr(ev, "seed_heuristics", [])] + [seed]
            starts = [s for s in starts if s.objective is not None]
            starts.sort(key=lambda s: s.objective, reverse=problem.direction == "maximize")
        operators = OPERATORS if args.parents == "seed" else MAIN_OPERATORS
        jobs = []
        for i in range(args.prompts):
            op = operators[i % len(operators)]
            if op == "i1":
                parents = []
            elif op in ("e1", "e2"):
                parents = starts[:2] if len(starts) > 1 else starts
            else:
                parents = [starts[(i // len(operators)) % len(starts)]] if args.parents == "main" else [seed]
            jobs.append(sampler.job(op, key=sampler.key(problem_name, op, i), seed=args.seed, parents=parents))
        t0 = time.perf_counter()
        try:
            trajs = sampler.sample(jobs, round_index=0, generation=0, policy=policy)
        except Exception as exc:  # noqa: BLE001 - an arm the engine refuses is reported, the others go on
            return {
                "metric": "answer_format",
                "problem": problem_name,
                "arm": arm,
                "error": f"{type(exc).__name__}: {exc}",
            }
        wall = time.perf_counter() - t0
        store.close()
    n = len(trajs)
    tokens = [t.completion_tokens for t in trajs]
    valid = [t for t in trajs if t.valid]
    objectives = [t.meta["objective"] for t in valid]
    if samples_out is not None:
        for t in trajs:
            samples_out.write(
                json.dumps(
                    {
                        "problem": problem_name,
                        "arm": arm,
                        "operator": t.meta["operator"],
                        "text": t.steps[0].model_output,
                        "finish_reason": t.meta["finish_reason"],
                        "completion_tokens": t.completion_tokens,
                        "failure": t.failure,
                        "detail": (t.failure_detail or "")[:300],
                        "objective": t.meta.get("objective"),
                    }
                )
                + "\n"
            )
    return {
        "metric": "answer_format",
        "problem": problem_name,
        "arm": arm,
        "prompts": n,
        "defines_and_compiles_pct": round(100 * sum(t.meta.get("code") is not None for t in trajs) / n, 1),
        "valid_pct": round(100 * len(valid) / n, 1),
        "completion_tokens": sum(tokens),
        "tokens_per_valid": round(sum(tokens) / len(valid), 1) if valid else None,
        "cut_at_cap_pct": round(100 * sum(t.meta["finish_reason"] == "length" for t in trajs) / n, 1),
        "failures": dict(Counter(t.failure for t in trajs if not t.valid)),
        "tokens_p50": _percentile(tokens, 0.5),
        "tokens_p95": _percentile(tokens, 0.95),
        "tokens_max": max(tokens) if tokens else None,
        "valid_equal_seed": sum(abs(o - seed.objective) <= 1e-9 * max(1.0, abs(seed.objective)) for o in objectives),
        "valid_distinct_objectives": len({round(o, 9) for o in objectives}),
        "valid_novel_pct": round(100 * _novel(valid, sampler) / n, 1),
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "wall_s": round(wall, 1),
        "max_new_tokens": params.max_new_tokens,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument(
        "--arms", default="free,prefill", help="comma-separated; ARM@T[/TOP_P[/TOP_K]] overrides the config's decoding"
    )
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--prefill-max-new-tokens", type=int, default=None, help="token cap of the prefill arms")
    ap.add_argument("--free-max-new-tokens", type=int, default=None, help="token cap of the free arm")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--backend", default="auto", choices=["auto", "hf", "vllm"])
    ap.add_argument(
        "--parents",
        default="seed",
        choices=["seed", "main"],
        help="seed: the problem's seed heuristic is every parent (operators i1, m1, m2, i1); main: the "
        "main job's starting population (its published seeds too; operators m1, m2, e1, m1, m2, e2, ...)",
    )
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--samples-out", default=None)
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for a in arms:
        if a.partition("@")[0] not in ARMS:
            ap.error(f"--arms: unknown arm {a!r}; known: {', '.join(ARMS)}")
    problems = [p.strip() for p in args.problems.split(",") if p.strip()]
    if args.prompts < 1:
        ap.error("--prompts must be >= 1")

    from coevo.backends.factory import cpu_isa, make_policy, resolve_engine
    from coevo.backends.spec import ModelConfig

    # SIGTERM (a scheduler's kill, `kill PID`) ends the run through the finally below, which stops the engine's
    # processes; Python's default would leave vLLM's EngineCore running
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    mcfg = resolve_engine(ModelConfig(name=args.model, backend=args.backend, dtype="auto"))
    engine = f"{mcfg.backend}:{mcfg.dtype}"
    t0 = time.perf_counter()
    policy = make_policy(mcfg)
    print(f"engine {engine} started in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    cpu = cpu_isa()
    rows = []
    samples_out = open(args.samples_out, "w") if args.samples_out else None  # noqa: SIM115
    try:
        for problem in problems:
            for arm in arms:
                row = run_arm(problem, arm, policy, args, samples_out)
                row.update(engine=engine, cpu=cpu)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        policy.close()
        if samples_out is not None:
            samples_out.close()
    lines = list(rows)
    for problem in problems:
        by_arm = {r["arm"]: r for r in rows if r["problem"] == problem and "error" not in r}
        free, pre = by_arm.get("free"), by_arm.get("prefill")
        if free and pre:
            ratio = (
                pre["tokens_per_valid"] / free["tokens_per_valid"]
                if pre["tokens_per_valid"] and free["tokens_per_valid"]
                else None
            )
            lines.append(
                {
                    "metric": "answer_format_gain",
                    "problem": problem,
                    "valid_pct_free": free["valid_pct"],
                    "valid_pct_prefill": pre["valid_pct"],
                    "tokens_per_valid_ratio": None if ratio is None else round(ratio, 3),
                    "goal_valid_pct": 60,
                    "goal_tokens_ratio": 0.25,
                    "met": pre["valid_pct"] >= 60 and (ratio is not None and ratio <= 0.25 or not free["valid_pct"]),
                }
            )
    head = (
        f"{'problem':16} {'arm':8} {'compiles%':>9} {'valid%':>7} {'tokens':>7} {'tok/valid':>9} {'cut%':>5} failures"
    )
    print(head)
    for r in rows:
        if "error" in r:
            print(f"{r['problem']:16} {r['arm']:8} error: {r['error'][:200]}")
            continue
        print(
            f"{r['problem']:16} {r['arm']:8} {r['defines_and_compiles_pct']:9.1f} {r['valid_pct']:7.1f} "
            f"{r['completion_tokens']:7d} {r['tokens_per_valid'] or float('nan'):9.1f} {r['cut_at_cap_pct']:5.1f} "
            f"{r['failures']}"
        )
    out = "\n".join(json.dumps(line) for line in lines)
    print(out)
    if args.json_out:
        Path(args.json_out).write_text(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

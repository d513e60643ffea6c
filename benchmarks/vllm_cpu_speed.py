"""Sampling throughput on CPU, side by side: HF (``HFPolicy``) against vLLM's CPU build (``VLLMPolicy``), on the
main job's shapes.

The main job (``configs/ahd/tsp_construct.yaml``) samples batches of 8 EoH children: ``--rows`` chat prompts built
by ``coevo.ahd.prompts.build_messages`` for TSP constructive (operators e1, e2, m1, m2 in turn, the seed
heuristic as parent; the rows share the system prompt and the task text, as in the job), then
``--max-new-tokens`` sampled tokens each (T 1.0, top-p 0.98, seeded, no stop string, so that every row decodes
the full length unless the model ends it). Each engine runs in its own child process, one after another: it
loads the model, warms up on one short prompt, then times one ``generate`` call of all rows. Peak memory is the
largest sum of PSS (proportional set size: shared pages split between processes) over the child and its
processes (vLLM's engine core and worker), sampled every 0.5 s.

Engines (``--engines``, comma-separated), each ``<engine>[+nopreload]``:

* ``hf:<dtype>``: ``HFPolicy`` (float32 runs its linear layers through oneDNN, ``model.cpu_linear: auto``);
* ``vllm:<dtype>[:<binding>]``: ``VLLMPolicy``, eager, prefix caching, KV cache ``--kv-cache-gib``; ``binding``:
  ``coevo`` (the default: as coevo starts it, every core, ``coevo.backends.vllm_env``), ``vllm`` (vLLM's own
  default: ``VLLM_CPU_OMP_THREADS_BIND=auto`` with one core reserved for the scheduler on x86, so one core of
  two computes: coevo's default before 2026-12-06), or a CPU list such as ``0-1``
  (``VLLM_CPU_OMP_THREADS_BIND=<cpus>``, no reserved core: a manual setting);
* ``vllm-lowrank:<dtype>[:<binding>]``: a low-rank ES generation: ``--members`` members x rows/members prompts as
  LoRA adapters of rank ``--rank`` in one call, after a plain call of the same rows on the same engine (the ES
  update is not timed);
* ``run[:<binding>]``: the engine exactly as ``coevo run`` starts it for ``--config`` (default the main job,
  ``configs/ahd/tsp_construct.yaml``): ``coevo.backends.factory.make_policy`` with the run's LoRA settings
  (``backend: auto`` resolved here) and the output routed to the logger ``coevo.vllm``; the batch is the same
  as the other engines' (the config's stop string is not used, so every engine decodes the same shapes).

``+nopreload`` starts a vLLM engine without coevo's preloads (``COEVO_VLLM_PRELOAD=0``: vLLM then preloads
torch's libgomp itself, as before 2026-12-06); without it tcmalloc and Intel OpenMP are preloaded where found.
So ``run:vllm+nopreload`` is the engine ``coevo run`` started before this change, ``run`` the one it starts now.

``--repeats R`` runs the engine list R times, interleaved (round r starts at engine r mod n), so that engines
compared share the machine's load; tokens/s per engine is the median over its runs, and the ratios below are
taken from those medians (per-round ratios go to each JSON line too).

Prints a table, then one JSON line per engine run and rows ``{"metric": "cpu_sampling", "engine", "round",
"dtype", "rows", "new_tokens", "prompt_tokens", "completion_tokens", "tok_s", "wall_s", "start_s",
"peak_pss_gib", "cached_prompt_tokens", "worker_threads", "cpu", "cores", "avx512", "avx512_bf16", "amx"}`` and
ratio lines ``{"metric", "value", "goal", "met", "of", "over", "per_round"}``:

* ``vllm_over_hf_tok_s`` (goal 1.0): the best vLLM engine over the best HF one;
* ``run_over_old_default_tok_s`` (goal 1.4): ``run`` over ``run:vllm+nopreload`` (else over
  ``vllm:<dtype>:vllm+nopreload``);
* ``run_over_best_manual_tok_s`` (goal 0.95): ``run`` over the best engine with a manual CPU list;
* ``preload_over_nopreload_tok_s`` (goal 1.0, the preloads are kept only where they help): each engine over the
  same engine with ``+nopreload``;
* for a ``vllm-lowrank`` engine its tokens/s over the plain call's (``vllm_lowrank_over_plain_tok_s``) and, when
  the plain ``vllm`` engine of the same settings ran too, over that engine's tokens/s and its peak PSS over that
  engine's (``vllm_lowrank_over_plain_engine_tok_s``, goal 0.95; ``vllm_lowrank_peak_pss_ratio``, goal 1.05).

Each engine runs for minutes with the 0.5B model on 2 cores (the HF child did not finish 8 x 256 within 23 min
on a 2-core machine shared with a load of 5-6; on an idle one the main job samples such a batch in about 2.5
min); ``--child-timeout-s`` bounds each. Usage::

    python benchmarks/vllm_cpu_speed.py [--model NAME_OR_DIR] [--rows 8] [--max-new-tokens 256]
        [--engines hf:float32,vllm:bfloat16,vllm:bfloat16:0-1] [--repeats 1] [--json-out FILE]

    # the engine as `coevo run` starts it, side by side with the old default and the manual settings:
    python benchmarks/vllm_cpu_speed.py --repeats 2 \
        --engines run,run:vllm+nopreload,vllm:bfloat16:0-1+nopreload,vllm:bfloat16:0-1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

from coevo.backends.factory import cpu_isa

DEFAULT_ENGINES = "hf:float32,vllm:bfloat16,vllm:bfloat16:0-1"
MAIN_CONFIG = ROOT / "configs" / "ahd" / "tsp_construct.yaml"
OPERATORS = ("e1", "e2", "m1", "m2")


def eoh_prompts(rows: int) -> list[list[dict]]:
    """``rows`` EoH operator prompts for TSP constructive (e1, e2, m1, m2 in turn; the seed heuristic as parent)."""
    from coevo.ahd.problem import load_problem
    from coevo.ahd.prompts import build_messages

    problem = load_problem("tsp_construct")
    spec, code = problem.prompt_spec(), problem.seed_heuristic_code()
    out = []
    for i in range(rows):
        op = OPERATORS[i % len(OPERATORS)]
        parent = SimpleNamespace(thought=f"visit the nearest unvisited node (variant {i})", code=code, objective=6.5)
        parents = [parent, parent] if op in ("e1", "e2") else [parent]
        out.append(build_messages(op, spec, parents))
    return out


class PeakMemory:
    """Largest PSS sum (bytes) of this process and its descendants, sampled every ``interval_s`` in a thread."""

    def __init__(self, interval_s: float = 0.5) -> None:
        import psutil

        self.psutil, self.interval_s, self.peak = psutil, interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> int:
        me = self.psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_full_info().pss
            except self.psutil.Error:
                continue
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.sample()
        return self.peak


def _lowrank_population(policy, convs, params, args) -> tuple[list, float, dict]:
    """A low-rank ES generation on the engine: ``--members`` members (antithetic pairs, rank ``--rank``) x the
    ``convs`` as LoRA adapters in one ``generate`` call (prompt-major rows, as ``coevo.es`` lays them out), after
    a plain ``generate`` of the same rows on the same engine (no adapter). Returns the population's completions,
    its wall time and the plain run's numbers. The ES update (in the workers) is not timed here."""
    from coevo.es import ScopeSpec
    from coevo.types import ESMember

    members = [
        ESMember(seed=100 + i // 2, sigma=1e-3, sign=1 if i % 2 == 0 else -1, index=i) for i in range(args.members)
    ]
    rows = [(m, c) for c in convs for m in members]
    t0 = time.perf_counter()
    plain = policy.generate([c for _, c in rows], params)
    plain_s = time.perf_counter() - t0
    replica = policy.es_replica(ScopeSpec("all_linear"), master_weights=False)
    t0 = time.perf_counter()
    with replica.population(members, args.rank) as pop:
        out = pop.generate(rows, params)
    wall = time.perf_counter() - t0
    plain_tokens = sum(c.completion_tokens for c in plain)
    return out, wall, {"members": args.members, "rank": args.rank, "plain_tok_s": round(plain_tokens / plain_s, 2)}


def child(args: argparse.Namespace) -> int:
    """Run one engine (``args.child``) and print its JSON line; vLLM's lines go to stderr (the parent shows the tail
    of a failed engine's)."""
    import logging

    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("coevo.vllm").setLevel(logging.INFO)  # a routed engine's output (engine `run`)
    spec, _, option = args.child.partition("+")
    if option not in ("", "nopreload"):
        raise SystemExit(f"--engines: unknown option +{option} in {args.child!r} (only +nopreload)")
    if option == "nopreload":
        os.environ["COEVO_VLLM_PRELOAD"] = "0"
    kind, *rest = spec.split(":")
    dtype, bind = (
        (None, rest[0] if rest else "coevo") if kind == "run" else (rest[0], rest[1] if len(rest) > 1 else "coevo")
    )
    if bind == "vllm":
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "auto"  # set by the user: coevo leaves vLLM's binding alone
    elif bind != "coevo":
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    from coevo.backends.base import SamplingParams
    from coevo.backends.models import resolve_model

    memory = PeakMemory()
    path = resolve_model(args.model)
    convs = eoh_prompts(args.rows)
    t0 = time.perf_counter()
    if kind == "run":
        from coevo.backends.factory import make_policy, resolve_engine
        from coevo.config import load_config
        from coevo.placement import lora_needs

        config, _ = load_config(args.config)
        model = resolve_engine(config.model)
        dtype = model.dtype
        policy = make_policy(model, lora=lora_needs(config.evolvers))
    elif kind == "hf":
        from coevo.backends.hf import HFPolicy

        policy = HFPolicy(path, dtype=dtype, batch_size=args.rows)
    elif kind in ("vllm", "vllm-lowrank"):
        from coevo.backends.vllm_engine import VLLMPolicy

        lora = {"enable_lora": True, "max_loras": args.members, "max_lora_rank": 8} if kind == "vllm-lowrank" else {}
        policy = VLLMPolicy(
            path,
            dtype=dtype,
            enforce_eager=True,
            kv_cache_gib=args.kv_cache_gib,
            max_model_len=args.max_model_len,
            **lora,
        )
    else:
        raise SystemExit(f"--engines: unknown engine {kind!r} (hf, vllm or vllm-lowrank)")
    start_s = time.perf_counter() - t0
    policy.generate([[{"role": "user", "content": "Say hi."}]], SamplingParams(max_new_tokens=4, seed=1))
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=0.98, seed=args.seed)
    extra = {}
    if kind == "vllm-lowrank":
        convs = convs[: max(1, args.rows // args.members)]
        out, wall, extra = _lowrank_population(policy, convs, params, args)
    else:
        t0 = time.perf_counter()
        out = policy.generate(convs, params)
        wall = time.perf_counter() - t0
    peak = memory.stop()
    completion = sum(c.completion_tokens for c in out)
    threads = policy.es_state().get("threads") if kind != "hf" else None  # the cores the worker computes on
    row = {
        "metric": "cpu_sampling",
        "engine": args.child,
        "dtype": dtype,
        "rows": args.rows,
        "new_tokens": args.max_new_tokens,
        "prompt_tokens": sum(c.prompt_tokens for c in out),
        "completion_tokens": completion,
        "tok_s": round(completion / wall, 2),
        "wall_s": round(wall, 1),
        "start_s": round(start_s, 1),
        "peak_pss_gib": round(peak / 2**30, 2),
        "cached_prompt_tokens": sum(int(c.meta.get("cached_tokens", 0)) for c in out) if kind != "hf" else None,
        "worker_threads": threads,
        **extra,
        **cpu_isa(),
    }
    policy.close()
    print("RESULT " + json.dumps(row), flush=True)
    return 0


def _run_child(engine: str, args: argparse.Namespace) -> dict | None:
    """One engine in its own process (:func:`child`); its JSON row, or None (said on stderr) when it failed."""
    cmd = [sys.executable, __file__, "--child", engine, "--model", args.model, "--rows", str(args.rows)]
    cmd += ["--max-new-tokens", str(args.max_new_tokens), "--seed", str(args.seed), "--config", str(args.config)]
    cmd += ["--kv-cache-gib", str(args.kv_cache_gib), "--max-model-len", str(args.max_model_len)]
    cmd += ["--members", str(args.members), "--rank", str(args.rank)]
    print(f"running {engine} ...", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=args.child_timeout_s)
    except subprocess.TimeoutExpired:
        print(f"{engine}: no result within --child-timeout-s {args.child_timeout_s:g}", file=sys.stderr)
        return None
    found = [ln[len("RESULT ") :] for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not found:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        print(f"{engine}: failed (exit {proc.returncode}):\n{tail}", file=sys.stderr)
        return None
    return json.loads(found[-1])


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def _ratio(metric: str, of: str, over: str, by_engine: dict, goal: float, *, at_most: bool = False) -> dict:
    """``{"metric", "value", "goal", "met", "of", "over", "per_round"}``: median tokens/s of ``of`` over ``over``'s,
    and the ratio within each round where both ran."""
    value = round(_median([r["tok_s"] for r in by_engine[of]]) / _median([r["tok_s"] for r in by_engine[over]]), 3)
    rounds = {r["round"]: r["tok_s"] for r in by_engine[over]}
    per_round = [round(r["tok_s"] / rounds[r["round"]], 3) for r in by_engine[of] if r["round"] in rounds]
    met = value <= goal if at_most else value >= goal
    return {"metric": metric, "value": value, "goal": goal, "met": met, "of": of, "over": over, "per_round": per_round}


def ratio_lines(rows: list[dict]) -> list[dict]:
    """The ratio lines of the module docstring from the engines' rows (medians over rounds)."""
    by_engine: dict[str, list[dict]] = {}
    for r in rows:
        by_engine.setdefault(r["engine"], []).append(r)
    med = {e: _median([r["tok_s"] for r in rs]) for e, rs in by_engine.items()}
    lines = []
    hf = [e for e in med if e.startswith("hf:")]
    vl = [e for e in med if e.startswith(("vllm:", "run"))]
    if hf and vl:
        lines.append(_ratio("vllm_over_hf_tok_s", max(vl, key=med.get), max(hf, key=med.get), by_engine, 1.0))
    if "run" in med:
        old = next(
            (e for e in ("run:vllm+nopreload", *(e for e in med if e.endswith(":vllm+nopreload"))) if e in med), None
        )
        if old is not None:
            lines.append(_ratio("run_over_old_default_tok_s", "run", old, by_engine, 1.4))
        manual = [e for e in med if e.split("+")[0].rsplit(":", 1)[-1][:1].isdigit()]
        if manual:
            lines.append(_ratio("run_over_best_manual_tok_s", "run", max(manual, key=med.get), by_engine, 0.95))
    for e in med:
        if not e.endswith("+nopreload") and f"{e}+nopreload" in med:
            lines.append(_ratio("preload_over_nopreload_tok_s", e, f"{e}+nopreload", by_engine, 1.0))
    for r in rows:
        if not r["engine"].startswith("vllm-lowrank:"):
            continue
        same = r["engine"].replace("vllm-lowrank:", "vllm:", 1)
        base = next((p for p in rows if p["engine"] == same and p["round"] == r["round"]), None)
        ratio = round(r["tok_s"] / r["plain_tok_s"], 3)
        lines.append({"metric": "vllm_lowrank_over_plain_tok_s", "engine": r["engine"], "value": ratio,
                      "goal": 0.95, "met": ratio >= 0.95, "plain": "same engine, no adapter"})  # fmt: skip
        if base is not None:
            ratio = round(r["tok_s"] / base["tok_s"], 3)
            lines.append({"metric": "vllm_lowrank_over_plain_engine_tok_s", "engine": r["engine"], "value": ratio,
                          "goal": 0.95, "met": ratio >= 0.95})  # fmt: skip
            mem = round(r["peak_pss_gib"] / base["peak_pss_gib"], 3)
            lines.append({"metric": "vllm_lowrank_peak_pss_ratio", "engine": r["engine"], "value": mem,
                          "goal": 1.05, "met": mem <= 1.05})  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="registry name or HF folder")
    ap.add_argument("--rows", type=int, default=8, help="prompts per generate call (the main job: 8)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument(
        "--engines",
        default=DEFAULT_ENGINES,
        help="comma-separated hf:<dtype> / vllm:<dtype>[:<binding>] / run[:<binding>], each [+nopreload]",
    )
    ap.add_argument("--repeats", type=int, default=1, help="run the engine list this many times, interleaved")
    ap.add_argument("--config", default=str(MAIN_CONFIG), help="run: the config whose engine `coevo run` starts")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--kv-cache-gib", type=float, default=2.0, help="vLLM KV cache (GiB)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument(
        "--members", type=int, default=4, help="vllm-lowrank: ES members (LoRA adapters); rows/members prompts each"
    )
    ap.add_argument("--rank", type=int, default=1, help="vllm-lowrank: rank of the low-rank perturbations")
    ap.add_argument("--json-out", default=None, help="also append the JSON lines to this file")
    ap.add_argument("--child-timeout-s", type=float, default=1200, help="give up on an engine after this long")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    from coevo.tables import md_table

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    rows = []
    for r in range(args.repeats):
        for engine in engines[r % len(engines) :] + engines[: r % len(engines)]:  # interleaved, rotated
            row = _run_child(engine, args)
            if row is not None:
                rows.append({**row, "round": r})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # each run's line as soon as it is known
    if not rows:
        return 1
    cols = ["engine", "round", "rows", "new_tokens", "completion_tokens", "tok_s", "worker_threads", "start_s"]
    cols += ["peak_pss_gib"]
    print(md_table(cols, [[r.get(c) for c in cols] for r in rows]))
    print(f"CPU: {rows[0]['cpu']} ({rows[0]['cores']} cores; avx512 {rows[0]['avx512']}, "
          f"avx512_bf16 {rows[0]['avx512_bf16']}, amx {rows[0]['amx']})")  # fmt: skip
    lines = list(rows) + ratio_lines(rows)
    for line in lines:
        print(json.dumps(line))
    if args.json_out:
        with open(args.json_out, "a") as fh:
            fh.writelines(json.dumps(line) + "\n" for line in lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

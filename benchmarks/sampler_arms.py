"""Three ways to train the AHD sampler side by side: ES, GRPO, DPO (JSON lines).

Two commands:

``measure``: the cost of one update of each method on the same TSP prompts and the same number of LLM samples,
each in a fresh interpreter (so one method's peak memory is not another's), on the model ``--model`` (HF, float32):

* ``es``: one low-rank ES generation (EGGROLL rank ``--rank``, ``--members`` members in antithetic pairs) as the
  ``eoh_children`` rollout runs it: every member answers EoH's m1 / m2 prompts on the population (nearest
  neighbour + EoH's published AEL heuristic) in one batched population call, the answers are evaluated, rank
  rewards, one update (:class:`coevo.es.GenerationRecord` applied by the HF replica). Measured: the generation
  (sampling + evaluation, then the update in a window of its own);
* ``grpo`` / ``dpo``: one step of the ``grpo_ahd`` / ``dpo_ahd`` evolver (:mod:`coevo.evolvers.sampler_training`):
  ``--prompts`` m1 / m2 prompts on the same population x ``--answers`` answers, sampled, evaluated, then one update
  (GRPO: one optimizer step; DPO: one pass over typed pairs from those answers, at most ``--pairs``). Measured: the
  whole step, and the update alone (the evolver's own record: :mod:`coevo.training.meter`).

Peak memory is the peak resident set size of the measured window (``VmHWM`` reset at its start,
:mod:`coevo.training.meter`); it includes the weights (float32: 4 bytes per parameter) in every method. One line
per method: ``{"method", "model", "samples", "window_wall_s", "window_peak_rss_mib", "update_wall_s",
"update_peak_rss_mib", "rss_before_mib", ...}``, then a line ``{"ratio": "es/grpo", ...}`` with the ES / GRPO
peak-memory ratio (the seed paper's: 0.143, full-parameter GRPO of Qwen3.5-4B on GPUs).

``arms``: the full arm table (frozen, ES, noise-only, GRPO, DPO, frozen 1.5B; the held-out sampler test before
and after): the same as ``benchmarks/sampler_train.py``, whose ``ARMS`` hold the GRPO and DPO arms (each trains
with its config and is tested with its last adapter folder, merged by ``coevo model merge`` for ``--backend vllm``).

Usage::

    flock /tmp/coevo-heavy.lock .venv/bin/python benchmarks/sampler_arms.py measure --model qwen2.5-coder-0.5b-instruct \\
        --out runs/sampler_arms_measure.jsonl
    .venv/bin/python benchmarks/sampler_arms.py measure --model tiny:micro --max-new-tokens 8 --out /tmp/m.jsonl  # smoke
    .venv/bin/python benchmarks/sampler_arms.py arms --arms frozen,es,noise,grpo,dpo --prompts 16 --out runs/sampler_arms
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# ----------------------------------------------------------------------------------------------- measure
def _context(tmp: Path, model: str, args):
    """A run context over a fresh store, the model in float32 on HF, and an EoH evolver on TSP50 whose population
    is nearest neighbour + EoH's published AEL heuristic (the main job's starting population)."""
    from coevo.backends.hf import HFPolicy
    from coevo.budget import Budget
    from coevo.config import SamplingConfig
    from coevo.context import RunContext
    from coevo.evolvers.eoh import EoHConfig, EoHEvolver
    from coevo.store import TrajectoryStore

    store = TrajectoryStore(tmp / "store.sqlite")
    ctx = RunContext(
        run_id="measure",
        run_dir=tmp,
        store=store,
        budget=Budget(store, "measure"),
        seed=args.seed,
        policy_factory=lambda: HFPolicy(model, dtype="float32", batch_size=8),
        sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=0.98, stop=["\n```\n"]),
    )
    eoh = EoHEvolver(
        "eoh",
        EoHConfig(
            problem="tsp_construct",
            train_size=50,
            train_count=8,
            train_seed=2024,
            test_sizes=[50],
            test_count=4,
            test_seed=1234,
            validation_count=0,
            population_size=4,
            include_seed_heuristic=True,
            seed_heuristics=["eoh_ael"],
        ),
        ctx,
    )
    eoh.add_seed_heuristics()
    ctx.evolvers = {"eoh": eoh}
    return ctx, eoh


def _es(ctx, eoh, args) -> dict[str, Any]:
    from coevo.es import GenerationRecord, ScopeSpec, normalize_rewards
    from coevo.rollouts.eoh_children import EoHChildrenConfig, EoHChildrenRollout
    from coevo.training.meter import measure
    from coevo.types import ESMember

    policy = ctx.policy
    replica = policy.es_replica(ScopeSpec("all_linear"), master_weights=False, restore_mode="exact")
    rng = ctx.rng("es", 0)
    seeds = [rng.getrandbits(63) for _ in range(args.members // 2)]
    members = [
        ESMember(seed=s, sigma=1e-3, sign=sign, index=2 * i + j)
        for i, s in enumerate(seeds)
        for j, sign in enumerate((1, -1))
    ]
    rollout = EoHChildrenRollout(
        EoHChildrenConfig(evolver="eoh", operators=["m1", "m2"], children_per_operator=1, reward="rank"), ctx
    )
    with measure() as usage, replica.population(members, args.rank) as pop:
        trajs = rollout.run_population(
            pop, members, generation=0, key_prefixes=[f"measure/es/g00000/m{m.index:03d}" for m in members]
        )
    with measure() as update:  # a window of its own (a nested one would reset the outer peak)
        rewards = rollout.population_rewards(trajs)
        record = GenerationRecord(
            generation=0,
            seeds=[m.seed for m in members],
            signs=[m.sign for m in members],
            rewards=rewards,
            coeffs=normalize_rewards(rewards, "zscore").tolist(),
            sigma=1e-3,
            alpha=5e-4,
            normalization="zscore",
            scope=ScopeSpec("all_linear").to_dict(),
            perturbation="lowrank",
            rank=args.rank,
        )
        replica.apply(record)
    samples = sum(t.llm_calls for ts in trajs for t in ts)
    return {
        "samples": samples,
        "valid": sum(t.valid for ts in trajs for t in ts),
        "window_wall_s": usage.wall_s + update.wall_s,
        "window_peak_rss_mib": max(usage.peak_rss_mib, update.peak_rss_mib),
        "rss_before_mib": usage.rss_before_mib,
        "update_wall_s": update.wall_s,
        "update_peak_rss_mib": update.peak_rss_mib,
        "update_rss_before_mib": update.rss_before_mib,
        "members": len(members),
        "rank": args.rank,
    }


def _trainer(method: str, ctx, eoh, args) -> dict[str, Any]:
    from coevo.artifacts import SAMPLER_UPDATE
    from coevo.evolvers.dpo_ahd import DPOAHDConfig, DPOAHDEvolver
    from coevo.evolvers.grpo_ahd import GRPOAHDConfig, GRPOAHDEvolver
    from coevo.training.meter import measure

    common = {
        "evolver": "eoh",
        "operators": ["m1", "m2"],
        "prompts_per_step": args.prompts,
        "answers_per_prompt": args.answers,
        "total_updates": 1,
        "learning_rate": 1e-5,
        "micro_batch": args.micro_batch,
        "lora": {"r": args.lora_r, "alpha": 2 * args.lora_r},
    }
    if method == "grpo":
        ev = GRPOAHDEvolver("arm", GRPOAHDConfig(**common), ctx)
    else:
        ev = DPOAHDEvolver("arm", DPOAHDConfig(**common, pairs="typed", max_pairs=args.pairs), ctx)
    ctx.evolvers["arm"] = ev
    ev.setup()
    ev.policy  # noqa: B018 (load the model and attach the adapter outside the window)
    with measure() as usage:
        rep = ev.step(1)
    (row,) = [a.content for a in ctx.store.list_artifacts(SAMPLER_UPDATE)]
    return {
        "samples": rep.samples,
        "valid": int(rep.metrics.get("valid_answers", 0)),
        "window_wall_s": usage.wall_s,
        # the update's own window reset VmHWM: the sampling's peak is what it read just before
        "window_peak_rss_mib": max(usage.peak_rss_mib, row.get("peak_before_mib") or 0.0),
        "sampling_peak_rss_mib": row.get("peak_before_mib"),
        "rss_before_mib": usage.rss_before_mib,
        "update_wall_s": row.get("wall_s"),
        "update_peak_rss_mib": row.get("peak_rss_mib"),
        "update_rss_before_mib": row.get("rss_before_mib"),
        "skipped": row.get("skipped"),
        "loss": row.get("loss"),
        "pairs": row.get("pairs"),
        "groups_with_signal": row.get("groups_with_signal"),
        "lora_r": args.lora_r,
    }


def _variant(args) -> int:
    """One method in this process (``measure --variant``); prints its JSON line."""
    import torch

    from coevo.backends.factory import cpu_isa

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        ctx, eoh = _context(Path(tmp), args.model, args)
        out = _es(ctx, eoh, args) if args.variant == "es" else _trainer(args.variant, ctx, eoh, args)
        ctx.store.close()
    line = {
        "method": args.variant,
        "model": args.model,
        **out,
        "max_new_tokens": args.max_new_tokens,
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_isa(),
    }
    print(json.dumps(line), flush=True)
    return 0


def measure_all(args) -> int:
    """Each method in a fresh interpreter; JSON lines to ``--out`` (appended) and stdout."""
    rows = []
    for method in args.methods.split(","):
        cmd = [sys.executable, __file__, "measure", "--variant", method, *args.passthrough]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"{method}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        rows.append(json.loads(lines[-1]))
        with open(args.out, "a") as fh:
            fh.write(lines[-1] + "\n")
        print(lines[-1], flush=True)
    by = {r["method"]: r for r in rows}
    if "es" in by and "grpo" in by:
        grpo_peak = max(by["grpo"]["window_peak_rss_mib"], by["grpo"]["update_peak_rss_mib"] or 0)
        ratio = {
            "ratio": "es/grpo",
            "peak_rss": by["es"]["window_peak_rss_mib"] / grpo_peak,
            "above_weights": (by["es"]["window_peak_rss_mib"] - by["es"]["rss_before_mib"])
            / max(1e-9, grpo_peak - by["grpo"]["rss_before_mib"]),
            "paper": 0.143,
        }
        with open(args.out, "a") as fh:
            fh.write(json.dumps(ratio) + "\n")
        print(json.dumps(ratio), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------- arms
def arms(argv: list[str]) -> int:
    """The full arm table: ``benchmarks/sampler_train.py``, whose arms include GRPO and DPO (module docstring)."""
    import sampler_train  # benchmarks/sampler_train.py (issue 53's runner; this folder is on sys.path)

    return sampler_train.main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "arms":
        return arms(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["measure"])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--methods", default="es,grpo,dpo")
    ap.add_argument("--variant", choices=["es", "grpo", "dpo"], help="(internal) run one method in this process")
    ap.add_argument("--members", type=int, default=2, help="ES population (antithetic pairs)")
    ap.add_argument("--rank", type=int, default=1, help="ES low-rank perturbation rank")
    ap.add_argument("--prompts", type=int, default=2, help="GRPO / DPO prompts (groups) per update")
    ap.add_argument("--answers", type=int, default=2, help="GRPO / DPO answers per prompt")
    ap.add_argument("--pairs", type=int, default=2, help="DPO pairs per update at most")
    ap.add_argument("--micro-batch", type=int, default=1, help="sequences per backward pass")
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--out", default="sampler_arms_measure.jsonl")
    args = ap.parse_args(argv)
    if args.variant:
        return _variant(args)
    args.passthrough = [a for a in argv[1:]]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return measure_all(args)


if __name__ == "__main__":
    sys.exit(main())

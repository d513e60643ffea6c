"""Learning per wall-clock second: low-rank vs full-rank ES on one config, several seeds (issue 9 benchmark d).

Runs ``coevo run CONFIG`` once per (perturbation, seed), one after another (never side by side: they would
share the CPUs), each under the same wall budget (``budget.max_wall_s``), with ``evolvers.es.perturbation``
set to ``full`` and to ``lowrank`` (rank ``--rank``) and ``run.seed`` to each seed; everything else comes from
the config. Then, from each run's store: the held-out reward of the centre (trajectories with ``member=None``,
``split="test"``) at every evaluation, against the wall-clock seconds since the run's first trajectory.

Writes ``OUT/curves.png`` (held-out reward vs wall seconds, one line per run, one colour per perturbation),
``OUT/results.json`` (every run's curve), ``OUT/table.md`` (per perturbation: seeds, generations completed,
held-out reward at generation 0 and at the last evaluation, gain as mean +- std over seeds, held-out reward
reached per wall-clock minute, wall second of the last evaluation) and prints that table and one JSON line
per perturbation. A run whose folder holds a finished run of the same settings (``es_learning.json``) is reused, so a rerun
only adds what is missing; ``--set`` overrides go to every run (e.g. another model for a smoke test).

Usage::

    python benchmarks/es_learning.py --config configs/es/arithmetic_dense.yaml --wall 240 --seeds 0 1 2 \\
        --out /tmp/es_learning [--eval-every 1] [--rank 1] [--threads N]
    python benchmarks/es_learning.py --wall 60 --seeds 0 1 --threads 1 --out /tmp/es_learning_smoke \\
        --set model.name=tiny:micro --set evolvers.es.total_generations=2 \\
        --set evolvers.es.rollout.cases_per_member=2 --set evolvers.es.rollout.test_cases=2   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_one(config: Path, out: Path, kind: str, seed: int, args: argparse.Namespace) -> Path:
    """One ``coevo run`` (reused when its folder holds a finished run of the same settings, else run afresh);
    returns the run folder."""
    run_dir = out / f"{kind}-s{seed}"
    sets = [
        f"run.seed={seed}",
        f"budget.max_wall_s={args.wall}",
        f"evolvers.es.perturbation={kind}",
        f"evolvers.es.eval_every={args.eval_every}",
        "report.plots=false",
        *args.set,
    ]
    if kind == "lowrank":
        sets += [f"evolvers.es.rank={args.rank}", "evolvers.es.master_weights=false"]
    marker = run_dir / "es_learning.json"
    settings = {"config": str(config.resolve()), "set": sets}
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "coevo.cli", "run", str(config), "--out", str(run_dir), "--no-progress"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ)
    if args.threads:  # torch reads OMP_NUM_THREADS at start-up
        env["OMP_NUM_THREADS"] = str(args.threads)
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=args.wall * 3 + 600)
    marker.write_text(json.dumps(settings))
    return run_dir


def curve(run_dir: Path) -> dict:
    """Held-out reward (and greedy exact match) at each evaluation of the centre, vs wall seconds."""
    from coevo.store import TrajectoryStore

    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        trajs = s.query(run_id=run_dir.name, order_by="id")
        rows = s.es_history(run_dir.name, "es")
    if not trajs:
        raise SystemExit(f"{run_dir}: the run stored no trajectory within its wall budget (raise --wall)")
    t0 = min(t.started_at for t in trajs)
    evals: dict[int, list] = {}
    for t in trajs:
        if t.member is None and t.meta.get("split") == "test":
            evals.setdefault(t.generation, []).append(t)
    points = []
    for g in sorted(evals):
        ts = evals[g]
        exact = [t.meta.get("exact") for t in ts if t.meta.get("exact") is not None]
        points.append(
            {
                "generation": g,
                "wall_s": max(t.started_at + t.duration_s for t in ts) - t0,
                "reward": sum(t.reward for t in ts) / len(ts),
                "exact": sum(exact) / len(exact) if exact else None,
            }
        )
    if not points:
        raise SystemExit(f"{run_dir}: no held-out evaluation finished within the wall budget (raise --wall)")
    return {"run": run_dir.name, "generations": len(rows), "points": points}


def summarise(results: dict[str, list[dict]]) -> list[dict]:
    out = []
    for kind, runs in results.items():
        first = [r["points"][0]["reward"] for r in runs]
        last = [r["points"][-1]["reward"] for r in runs]
        gain = [b - a for a, b in zip(first, last, strict=True)]
        sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0
        out.append(
            {
                "perturbation": kind,
                "seeds": len(runs),
                "generations": statistics.mean(r["generations"] for r in runs),
                "reward_gen0": statistics.mean(first),
                "reward_last": statistics.mean(last),
                "gain_mean": statistics.mean(gain),
                "gain_std": sd(gain),
                "last_wall_s": statistics.mean(r["points"][-1]["wall_s"] for r in runs),
                "gain_per_minute": statistics.mean(
                    60 * g / max(r["points"][-1]["wall_s"], 1e-9) for g, r in zip(gain, runs, strict=True)
                ),
            }
        )
    return out


def markdown_table(table: list[dict]) -> str:
    """The summary rows as a Markdown table (one row per perturbation)."""
    head = ["perturbation", "seeds", "generations", "held-out R gen 0", "held-out R last", "gain (mean +- std)"]
    head += ["gain per wall minute", "last eval at s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        lines.append(
            f"| {r['perturbation']} | {r['seeds']} | {r['generations']:.1f} | {r['reward_gen0']:.4f} | "
            f"{r['reward_last']:.4f} | {r['gain_mean']:+.4f} +- {r['gain_std']:.4f} | "
            f"{r['gain_per_minute']:+.5f} | {r['last_wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, list[dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, colour in (("full", "tab:blue"), ("lowrank", "tab:orange")):
        for i, r in enumerate(results.get(kind, [])):
            ax.plot(
                [p["wall_s"] for p in r["points"]],
                [p["reward"] for p in r["points"]],
                "o-",
                color=colour,
                alpha=0.8,
                label=kind if i == 0 else None,
            )
    ax.set_xlabel("wall-clock seconds since the run's first rollout")
    ax.set_ylabel("held-out reward (log p(answer) per token)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "es" / "arithmetic_dense.yaml"))
    ap.add_argument("--wall", type=float, default=240.0, help="wall budget per run (s)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=1)
    ap.add_argument("--kinds", nargs="+", default=["full", "lowrank"], choices=["full", "lowrank"])
    ap.add_argument("--out", default="/tmp/es_learning")
    ap.add_argument("--threads", type=int, default=0, help="torch threads of every run (0: torch's default)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {k: [] for k in args.kinds}
    for seed in args.seeds:
        for kind in args.kinds:
            results[kind].append(curve(run_one(Path(args.config), out, kind, seed, args)))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "curves.png", f"ES on {Path(args.config).name}: full vs low-rank, {args.wall:g} s each")
    table = summarise(results)
    text = markdown_table(table)
    (out / "table.md").write_text(text)
    print(text, end="")
    for r in table:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

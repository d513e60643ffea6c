"""Held-out check of finished main-job runs: the best heuristic of each run against nearest neighbour and the
published seeds, re-evaluated here in the sandbox on the main job's held-out sets, one JSON line per run and size,
and a plot.

For each run folder: ``best_heuristic.py`` (what the run wrote), the problem's seed heuristic (nearest
neighbour for TSP) and every heuristic named in the run's ``seed_heuristics`` are evaluated on ``test_count``
instances per held-out size (``test_seed``), as the run's ``config.yaml`` gives them. The ratio to nearest
neighbour is what ReEvo reports for constructive TSP (Ye et al., NeurIPS 2024, Table 1: 6.2269 / 6.8919 =
0.9035 on TSP50).

Usage::

    .venv/bin/python benchmarks/main_job_heldout.py RUN_DIR [RUN_DIR ...] --out runs/main_job_heldout
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coevo.ahd.evaluate import evaluate_many
from coevo.ahd.problem import load_problem
from coevo.ahd.seeds import run_instance_seed
from coevo.tables import md_table

#: ReEvo's constructive-TSP ratio to nearest neighbour on TSP50 (Table 1)
REEVO_RATIO_TSP50 = 6.2269 / 6.8919


def run_rows(run_dir: Path) -> list[dict]:
    """One row per held-out size of ``run_dir``: objectives of the best, the seed and the published seeds."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    ahd = next(e for e in cfg["evolvers"] if e.get("type") in ("eoh", "sample"))
    problem = load_problem(ahd["problem"])
    codes = {"best": (run_dir / "best_heuristic.py").read_text(), "seed": problem.seed_heuristic_code()}
    for name in ahd.get("seed_heuristics") or []:
        codes[name] = problem.published_heuristic_code(name)
    rows = []
    test_seed = run_instance_seed(run_dir, ahd["name"], "test", ahd.get("test_seed"))
    for size in ahd["test_sizes"]:
        inst = problem.generate(size, ahd["test_count"], test_seed)
        results = dict(zip(codes, evaluate_many(problem, list(codes.values()), inst)))
        row = {
            "run": run_dir.name,
            "run_seed": cfg["run"]["seed"],
            "size": size,
            **{f"{k}_objective": r.objective if r.valid else None for k, r in results.items()},
        }
        if row["best_objective"] and row["seed_objective"]:
            row["best_over_seed"] = row["best_objective"] / row["seed_objective"]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("runs/main_job_heldout"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [r for d in args.runs for r in run_rows(d)]
    with open(args.out / "main_job_heldout.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    names = [k[: -len("_objective")] for k in rows[0] if k.endswith("_objective")]
    print(
        md_table(
            ["run seed", "size", *names, "best / seed"],
            [
                [r["run_seed"], r["size"], *[r.get(f"{n}_objective") for n in names], r.get("best_over_seed")]
                for r in rows
            ],
        )
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["size"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 3.4))
    for ax, size in zip(axes if len(sizes) > 1 else [axes], sizes):
        sub = [r for r in rows if r["size"] == size]
        for i, n in enumerate(names):
            ys = [r[f"{n}_objective"] / r["seed_objective"] for r in sub]
            ax.scatter([i] * len(ys), ys, label=n)
        if size == 50:
            ax.axhline(REEVO_RATIO_TSP50, ls="--", c="gray", label="ReEvo (published)")
        ax.set_xticks(range(len(names)), names)
        ax.set_title(f"held-out n={size}")
        ax.set_ylabel("objective / nearest neighbour")
    axes_list = list(axes) if len(sizes) > 1 else [axes]
    axes_list[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "main_job_heldout.png", dpi=110)
    print(f"wrote {args.out / 'main_job_heldout.jsonl'} and main_job_heldout.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

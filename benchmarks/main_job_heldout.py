"""Held-out check of finished main-job runs: the best heuristic of each run against the problem's seed heuristic
and the published seeds, re-evaluated here in the sandbox on the main job's held-out sets, one JSON line per run
and size, a per-problem verdict and a plot. Any of the four problems (TSP, KP, CVRP, BPP): directions come from
the problem (KP maximises).

For each run folder: ``best_heuristic.py`` (what the run wrote), the problem's seed heuristic (nearest
neighbour, greedy, capacity-aware nearest neighbour, Best Fit) and every heuristic named in the run's
``seed_heuristics`` are evaluated on ``test_count`` instances per held-out size (``test_seed``), as the run's
``config.yaml`` gives them, with the gap to the problem's reference. The ratio to nearest neighbour is what ReEvo
reports for constructive TSP (Ye et al., NeurIPS 2024, Table 1: 6.2269 / 6.8919 = 0.9035 on TSP50).

Verdict per problem (issue 42's goal, printed as JSON lines ``{"metric", "problem", "value", "met"}``): in every
run the best is no worse than the seed heuristic at every held-out size; and it is strictly better at >= 2 of 3
sizes (TSP, CVRP, BPP) or, on KP, its gap to the optimum is below greedy's at every size.

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
            "problem": problem.name,
            "direction": problem.direction,
            "size": size,
            **{f"{k}_objective": r.objective if r.valid else None for k, r in results.items()},
            **{f"{k}_gap_percent": r.metrics.get("gap_percent") if r.valid else None for k, r in results.items()},
            "reference": results["seed"].metrics.get("reference"),
        }
        if row["best_objective"] and row["seed_objective"]:
            row["best_over_seed"] = row["best_objective"] / row["seed_objective"]
        row["best_vs_seed"] = compare(row["best_objective"], row["seed_objective"], problem.direction)
        rows.append(row)
    return rows


def compare(best: float | None, seed: float | None, direction: str) -> str | None:
    """``"better"``, ``"tie"`` or ``"worse"`` for the best against the seed in the problem's direction; None when
    either is invalid."""
    if best is None or seed is None:
        return None
    if best == seed:
        return "tie"
    return "better" if (best < seed) == (direction == "minimize") else "worse"


def verdicts(rows: list[dict]) -> list[dict]:
    """Issue 42's goal per problem over the runs given (see the module docstring)."""
    out = []
    for problem in sorted({r["problem"] for r in rows}):
        runs: dict[str, list[dict]] = {}
        for r in rows:
            if r["problem"] == problem:
                runs.setdefault(r["run"], []).append(r)
        never_worse = sum(all(r["best_vs_seed"] in ("better", "tie") for r in rs) for rs in runs.values())
        if problem == "kp_construct":
            second = sum(
                all(r["best_gap_percent"] is not None and r["best_gap_percent"] < r["seed_gap_percent"] for r in rs)
                for rs in runs.values()
            )
            goal2 = "gap to the optimum below greedy's at every size"
        else:
            second = sum(sum(r["best_vs_seed"] == "better" for r in rs) >= 2 for rs in runs.values())
            goal2 = "strictly better than the seed at >= 2 sizes"
        out.append(
            {
                "metric": "best no worse than the seed at every held-out size",
                "problem": problem,
                "value": f"{never_worse}/{len(runs)}",
                "met": never_worse == len(runs),
            }
        )
        out.append({"metric": goal2, "problem": problem, "value": f"{second}/{len(runs)}", "met": second == len(runs)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("runs/main_job_heldout"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [r for d in args.runs for r in run_rows(d)]
    metrics = verdicts(rows)
    with open(args.out / "main_job_heldout.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
        fh.writelines(json.dumps({"type": "metric", **m}) + "\n" for m in metrics)
    for problem in sorted({r["problem"] for r in rows}):
        sub = [r for r in rows if r["problem"] == problem]
        names = list(dict.fromkeys(k[: -len("_objective")] for r in sub for k in r if k.endswith("_objective")))
        print(f"\n{problem} ({sub[0]['direction']}; gap reference: {sub[0]['reference']})\n")
        print(
            md_table(
                ["run seed", "size", *names, "best gap %", "seed gap %", "best / seed", "best vs seed"],
                [
                    [
                        r["run_seed"],
                        r["size"],
                        *[r.get(f"{n}_objective") for n in names],
                        r.get("best_gap_percent"),
                        r.get("seed_gap_percent"),
                        r.get("best_over_seed"),
                        r["best_vs_seed"],
                    ]
                    for r in sub
                ],
            )
        )
    for m in metrics:
        print(json.dumps(m))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["problem"], r["size"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, (problem, size) in zip(axes[0], panels):
        sub = [r for r in rows if r["problem"] == problem and r["size"] == size]
        names = list(dict.fromkeys(k[: -len("_objective")] for r in sub for k in r if k.endswith("_objective")))
        for i, n in enumerate(names):
            ys = [r[f"{n}_objective"] / r["seed_objective"] for r in sub if r.get(f"{n}_objective") is not None]
            ax.scatter([i] * len(ys), ys, label=n)
        if problem == "tsp_construct" and size == 50:
            ax.axhline(REEVO_RATIO_TSP50, ls="--", c="gray", label="ReEvo (published)")
        ax.set_xticks(range(len(names)), names, fontsize=7)
        better = "lower" if sub[0]["direction"] == "minimize" else "higher"
        ax.set_title(f"{problem} held-out n={size}", fontsize=9)
        ax.set_ylabel(f"objective / seed heuristic ({better} is better)", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "main_job_heldout.png", dpi=110)
    print(f"wrote {args.out / 'main_job_heldout.jsonl'} and main_job_heldout.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What ``tune`` (ES over a heuristic's constants, no LLM tokens) adds to heuristics that LLM searches published.

Each case is a heuristic as its authors published it (code quoted below with its source), tuned by
:class:`coevo.evolvers.tune.TuneEvolver` on a training set drawn from the run seed, then evaluated before and
after on held-out instances that tuning never sees (a fixed test seed, disjoint from every training seed):

- ``tsp/eoh_ael``: EoH's example heuristic for constructive TSP (FeiLiu36/EoH
  ``examples/tsp_construct/evaluation/heuristic.py``, also AEL's in ReEvo's ``test_synthetic.ipynb``): four weights
  and a threshold, GPT-3.5-written.
- ``tsp/reevo``: ReEvo's best constructive-TSP heuristic (ai4co/reevo ``problems/tsp_constructive/test/
  test_synthetic.ipynb``, ``select_next_node_ReEvo``; Ye et al., NeurIPS 2024, Table 1: 6.2269 on TSP50 vs nearest
  neighbour's 6.8919, ratio 0.9035).
- ``bpp/funsearch_weibull``: FunSearch's heuristic for Weibull bin packing (google-deepmind/funsearch
  ``bin_packing/bin_packing.ipynb``; Romera-Paredes et al., Nature 2024), integer exponents.
- ``kp/mcts_ahd``, ``kp/agentic_esopt``: MCTS-AHD's and the seed paper's constructive knapsack heuristics
  (heuristics/kp_construct/published/, sources there); the reference is greedy by value density.
- ``cvrp/eoh``: EoH's constructive CVRP heuristic (heuristics/cvrp_construct/published/eoh.py); the reference is
  capacity-aware nearest neighbour.
- ``kp/greedy``, ``cvrp/nearest``: the problems' own seed heuristics, to show whether ``tune`` finds constants in them.

Reported per case and run seed: training objective before / after, held-out objective per size before / after,
the reference heuristic (the problem's seed heuristic: nearest neighbour, Best Fit, greedy) on the same held-out
instances, evaluations spent and seconds. "Better" follows the problem's direction (KP maximises). Output: a Markdown table, one JSON line per row and per summary metric (``OUT/tune_published.jsonl``),
and a plot of held-out objective relative to the reference before / after (``OUT/tune_published.png``).

Usage::

    .venv/bin/python benchmarks/tune_published.py --seeds 2024,2025,2026 --out runs/tune_published
    .venv/bin/python benchmarks/tune_published.py --cases tsp/reevo --seeds 1 --generations 2   # quick look
    .venv/bin/python benchmarks/tune_published.py --cases cvrp/eoh --train-count 32   # a larger training set
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coevo.ahd.problem import load_problem
from coevo.tables import md_table

EOH_AEL = load_problem("tsp_construct").published_heuristic_code("eoh_ael")

REEVO = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    weights = {'distance_to_current': 0.4,
               'average_distance_to_unvisited': 0.25,
               'std_dev_distance_to_unvisited': 0.25,
               'distance_to_destination': 0.1}
    scores = {}
    for node in unvisited_nodes:
        future_distances = [distance_matrix[node, i] for i in unvisited_nodes if i != node]
        if future_distances:
            average_distance_to_unvisited = sum(future_distances) / len(future_distances)
            std_dev_distance_to_unvisited = (sum((x - average_distance_to_unvisited) ** 2 for x in future_distances) / len(future_distances)) ** 0.5
        else:
            average_distance_to_unvisited = std_dev_distance_to_unvisited = 0
        score = (weights['distance_to_current'] * distance_matrix[current_node, node] -
                 weights['average_distance_to_unvisited'] * average_distance_to_unvisited +
                 weights['std_dev_distance_to_unvisited'] * std_dev_distance_to_unvisited -
                 weights['distance_to_destination'] * distance_matrix[destination_node, node])
        scores[node] = score
    next_node = min(scores, key=scores.get)
    return int(next_node)
"""

FUNSEARCH_WEIBULL = load_problem("bpp_online").published_heuristic_code("funsearch_weibull")
KP = load_problem("kp_construct")
CVRP = load_problem("cvrp_construct")
KP_SETTINGS = {"train_size": 100, "train_count": 8, "test_sizes": [50, 100, 200], "test_count": 16}
CVRP_SETTINGS = {"train_size": 50, "train_count": 8, "test_sizes": [20, 50, 100], "test_count": 16}

#: case -> (problem, code, reference name, problem settings); the reference is the problem's seed heuristic
#: (nearest neighbour for tsp_construct, Best Fit for bpp_online)
CASES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "tsp/eoh_ael": (
        "tsp_construct",
        EOH_AEL,
        "nearest neighbour",
        {"train_size": 50, "train_count": 8, "test_sizes": [20, 50, 100], "test_count": 16},
    ),
    "tsp/reevo": (
        "tsp_construct",
        REEVO,
        "nearest neighbour",
        {"train_size": 50, "train_count": 8, "test_sizes": [20, 50, 100], "test_count": 16},
    ),
    "bpp/funsearch_weibull": (
        "bpp_online",
        FUNSEARCH_WEIBULL,
        "Best Fit",
        {"train_size": 1000, "train_count": 5, "test_sizes": [5000], "test_count": 5},
    ),
    "kp/mcts_ahd": ("kp_construct", KP.published_heuristic_code("mcts_ahd"), "greedy", KP_SETTINGS),
    "kp/agentic_esopt": ("kp_construct", KP.published_heuristic_code("agentic_esopt"), "greedy", KP_SETTINGS),
    "kp/greedy": ("kp_construct", KP.seed_heuristic_code(), "greedy", KP_SETTINGS),
    "cvrp/eoh": ("cvrp_construct", CVRP.published_heuristic_code("eoh"), "nearest neighbour", CVRP_SETTINGS),
    "cvrp/nearest": ("cvrp_construct", CVRP.seed_heuristic_code(), "nearest neighbour", CVRP_SETTINGS),
}
TEST_SEED = 1234  # the main job's held-out seed; training seeds are the run seeds (disjoint)


def run_case(case: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Tune one published heuristic with one run seed; held-out before / after and the reference."""
    from coevo.ahd.population import Individual
    from coevo.budget import Budget
    from coevo.evolvers.base import RunContext
    from coevo.evolvers.eoh import EoHConfig, EoHEvolver
    from coevo.evolvers.tune import TuneConfig, TuneEvolver
    from coevo.store import TrajectoryStore

    problem, code, ref_name, settings = CASES[case]
    if args.train_count is not None:
        settings = {**settings, "train_count": args.train_count}
    tmp = Path(tempfile.mkdtemp(prefix="tune_published_"))
    store = TrajectoryStore(tmp / "store.sqlite")
    ctx = RunContext(run_id="tune", run_dir=tmp, store=store, budget=Budget(store, "tune"), seed=seed)
    eoh = EoHEvolver(
        "eoh",
        EoHConfig(
            problem=problem,
            train_seed=seed,
            test_seed=TEST_SEED,
            eval_timeout_s=args.timeout,
            eval_workers=args.workers,
            **settings,
        ),
        ctx,
    )
    ctx.evolvers["eoh"] = eoh
    before = eoh.sampler.evaluate([code])[0]
    if not before.valid:
        raise RuntimeError(f"{case}: the published heuristic is invalid here ({before.error_kind}: {before.error})")
    eoh.population = [Individual("published", case, code, before.objective, before.score, "published")]
    tuner = TuneEvolver(
        "tune",
        TuneConfig(elites=1, generations=args.generations, population_size=args.population, sigma=args.sigma),
        ctx,
    )
    ctx.evolvers["tune"] = tuner
    tuner.setup()
    started = time.perf_counter()
    tuner.step(0)
    seconds = time.perf_counter() - started
    rec = next(iter(tuner.tried.values()))
    tuned = next((i for i in eoh.population if i.operator == "tune"), None)
    heldout = {}
    for size in settings["test_sizes"]:
        inst = eoh.problem.generate(size, settings["test_count"], TEST_SEED)
        codes = [code, tuned.code if tuned else code, eoh.problem.seed_heuristic_code()]
        res = eoh.sampler.evaluate(codes, inst, timeout_basis=(settings["train_size"], settings["train_count"]))
        heldout[size] = {
            "published": res[0].objective,
            "tuned": res[1].objective,
            "reference": res[2].objective,
        }
    store.close()
    return {
        "case": case,
        "seed": seed,
        "problem": problem,
        "direction": eoh.problem.direction,
        "train_count": settings["train_count"],
        "reference": ref_name,
        "train_before": before.objective,
        "train_after": tuned.objective if tuned else before.objective,
        "status": rec["status"],
        "constants_before": rec.get("constants_before"),
        "constants_after": rec.get("constants_after") if tuned else rec.get("constants_before"),
        "evaluations": rec["evaluations"],
        "tune_s": round(seconds, 1),
        "heldout": heldout,
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Held-out objective / reference objective, published vs tuned, one panel per (case, size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["case"], size) for r in rows for size in r["heldout"]})
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.4), squeeze=False)
    for ax, (case, size) in zip(axes[0], keys):
        rs = [r for r in rows if r["case"] == case]
        for r in rs:
            h = r["heldout"][size]
            ax.plot(
                [0, 1], [h["published"] / h["reference"], h["tuned"] / h["reference"]], "o-", label=f"seed {r['seed']}"
            )
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label=rs[0]["reference"])
        ax.set_xticks([0, 1], ["published", "tuned"])
        ax.set_title(f"{case}\nheld-out n={size}", fontsize=9)
        better = "lower" if rs[0].get("direction", "minimize") == "minimize" else "higher"
        ax.set_ylabel(f"objective / reference ({better} is better)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {list(CASES)}")
    p.add_argument("--seeds", default="2024,2025,2026", help="run seeds (each draws its own training set)")
    p.add_argument("--generations", type=int, default=8, help="tune generations")
    p.add_argument("--population", type=int, default=8, help="tune variants per generation")
    p.add_argument("--sigma", type=float, default=0.3, help="tune sigma_0 (relative)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per training evaluation")
    p.add_argument("--train-count", type=int, default=None, help="training instances (default: the case's, 8 or 5)")
    p.add_argument("--workers", type=int, default=2, help="evaluations in parallel")
    p.add_argument("--out", default="runs/tune_published", help="output folder")
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    if unknown := set(cases) - set(CASES):
        p.error(f"--cases: unknown {sorted(unknown)}; choose from {list(CASES)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in cases:
        for seed in seeds:
            r = run_case(case, seed, args)
            rows.append(r)
            print(json.dumps({"type": "row", **r}), flush=True)
    table = []
    for r in rows:
        for size, h in r["heldout"].items():
            table.append(
                [
                    r["case"],
                    r["seed"],
                    size,
                    r["train_before"],
                    r["train_after"],
                    h["published"],
                    h["tuned"],
                    h["reference"],
                    round(h["tuned"] / h["reference"], 4),
                    r["evaluations"],
                    r["tune_s"],
                ]
            )
    header = ["case", "seed", "held-out n", "train before", "train after", "held-out published"]
    header += ["held-out tuned", "reference", "tuned / reference", "evaluations", "tune s"]
    text = md_table(header, table)
    print(text)
    metrics = []
    for case in cases:
        for size in sorted({s for r in rows if r["case"] == case for s in r["heldout"]}):
            hs = [r["heldout"][size] for r in rows if r["case"] == case]
            sign = 1 if next(r for r in rows if r["case"] == case)["direction"] == "minimize" else -1
            better = sum(sign * h["tuned"] < sign * h["published"] for h in hs)
            ratio = statistics.fmean(h["tuned"] / h["published"] for h in hs)
            m = {
                "metric": f"tune_heldout_better/{case}/n{size}",
                "value": f"{better}/{len(hs)}",
                "mean_tuned_over_published": round(ratio, 5),
                "goal": "tuned better than published on held-out in most seeds",
                "met": better * 2 > len(hs),
            }
            metrics.append(m)
            print(json.dumps(m))
    (out / "table.md").write_text(text + "\n")
    with open(out / "tune_published.jsonl", "w") as fh:
        fh.writelines(json.dumps({"type": "row", **r}) + "\n" for r in rows)
        fh.writelines(json.dumps({"type": "metric", **m}) + "\n" for m in metrics)
    plot(rows, out / "tune_published.png")
    print(f"# plot: {out / 'tune_published.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

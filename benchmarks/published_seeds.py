"""Published KP and CVRP heuristics (heuristics/<problem>/published/) against their published numbers and the textbook
seed heuristics, through coevo's real sandboxed evaluator (issue 42).

Part 1, the peers' own instance sets, regenerated bit for bit from the peers' generators
(:mod:`coevo.ahd.references`; the MCTS-AHD KP sets' sha256 equal its ``dataset/*.npy`` files,
tests/test_published_seeds.py):

- KP (capacity 12.5 at n = 50, else 25): MCTS-AHD's train100 (64 instances), val50/100/200 (64 each) and
  test50/100/200 (1000 each; the first ``--mcts-count``); greedy (the seed), MCTS-AHD's and the seed paper's
  heuristics, and the exact optimum (coevo's reference). Published: the seed paper's heuristic 40.16268 on
  train100 (its header), MCTS-AHD's OR-Tools optimum 40.187953125 there (``ortools.py``; x 1e4, truncated).
- CVRP: EoH's example set (16 x CVRP50, C = 40); nearest neighbour 13.61078 and EoH's heuristic 13.23735 there.

Part 2, coevo's held-out sets as the main configs draw them (16 instances per size, seed 1234): the seed and each
published heuristic per size, with the gap to the problem's reference (KP: exact optimum; CVRP: OR-Tools GLS 1 s).

Prints Markdown tables; ``--out DIR`` also writes ``DIR/published_seeds.jsonl`` (one JSON object per row:
``{"part", "problem", "instances", "heuristic", "objective", "published", "gap_percent", "wall_s"}``).
Exit code 1 when a published value does not reproduce (within 5e-6, or 0.01 % for the optimum).

Usage: ``python benchmarks/published_seeds.py [--mcts-count 64] [--out DIR]``
(``--mcts-count 1000``: MCTS-AHD's full test sets; MCTS-AHD's heuristic is O(k^2) Python per step, about 1.3 s per
KP200 instance on a 2-core EPYC, so the full test200 set alone takes ~25 min.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coevo.ahd import load_problem
from coevo.ahd.evaluate import evaluate_heuristic
from coevo.ahd.references import PEER_SETS, kp_instance_set, mcts_ahd_kp_sets
from coevo.tables import md_table

TEST_SEED, TEST_COUNT = 1234, 16  # the main configs' held-out instances
SIZES = {"kp_construct": (50, 100, 200), "cvrp_construct": (20, 50, 100)}
#: (peer set, heuristic) -> published value
PUBLISHED = {
    ("MCTS-AHD KP train100", "agentic_esopt"): 40.16268,
    ("MCTS-AHD KP train100", "optimum"): 40.187953125,
    ("EoH CVRP example", "seed"): 13.61078,
    ("EoH CVRP example", "eoh"): 13.23735,
}


def heuristics(problem: str) -> dict[str, str]:
    """The problem's seed heuristic (``"seed"``) and its published ones, by name."""
    p = load_problem(problem)
    return {"seed": p.seed_heuristic_code(), **{n: p.published_heuristic_code(n) for n in p.published_heuristics()}}


def evaluate(problem: str, code: str, inst, with_reference: bool) -> tuple[Any, float]:
    t0 = time.perf_counter()
    res = evaluate_heuristic(problem, code, inst, with_reference=with_reference, timeout_s=7200)
    if not res.valid:
        raise RuntimeError(f"{problem}: invalid on {inst.source}: {res.error_kind}: {res.error}")
    return res, time.perf_counter() - t0


def peer_rows(mcts_count: int) -> list[dict[str, Any]]:
    """Part 1: every heuristic on every peer set (see the module docstring)."""
    sets = mcts_ahd_kp_sets()
    kp_sets = [("MCTS-AHD KP train100", kp_instance_set(sets["train100"], "train100"))]
    kp_sets += [(f"MCTS-AHD KP val{n}", kp_instance_set(sets[f"val{n}"], f"val{n}")) for n in (50, 100, 200)]
    kp_sets += [
        (f"MCTS-AHD KP test{n} (first {mcts_count})", kp_instance_set(sets[f"test{n}"][:mcts_count], f"test{n}"))
        for n in (50, 100, 200)
    ]
    jobs = [("kp_construct", name, inst) for name, inst in kp_sets]
    jobs.append(("cvrp_construct", "EoH CVRP example", PEER_SETS["eoh_cvrp_example"]()))
    rows = []
    for problem, set_name, inst in jobs:
        for i, (name, code) in enumerate(heuristics(problem).items()):
            res, wall = evaluate(problem, code, inst, with_reference=i == 0 and problem == "kp_construct")
            rows.append(row(1, problem, set_name, name, res.objective, wall))
            if i == 0 and problem == "kp_construct":
                rows.append(row(1, problem, set_name, "optimum", res.metrics["reference_mean"], 0.0))
    return rows


def heldout_rows() -> list[dict[str, Any]]:
    """Part 2: seed and published heuristics on coevo's held-out sets, with the gap to the reference."""
    rows = []
    for problem, sizes in SIZES.items():
        prob = load_problem(problem)
        for size in sizes:
            inst = prob.generate(size, TEST_COUNT, TEST_SEED)
            for name, code in heuristics(problem).items():
                res, wall = evaluate(problem, code, inst, with_reference=True)
                r = row(2, problem, f"{problem} n={size} x{TEST_COUNT} seed {TEST_SEED}", name, res.objective, wall)
                rows.append({**r, "gap_percent": res.metrics["gap_percent"]})
    return rows


def row(part: int, problem: str, instances: str, heuristic: str, objective: float, wall: float) -> dict[str, Any]:
    base = instances.split(" (first")[0]
    return {
        "part": part,
        "problem": problem,
        "instances": instances,
        "heuristic": heuristic,
        "objective": objective,
        "published": PUBLISHED.get((base, heuristic)),
        "gap_percent": None,
        "wall_s": round(wall, 1),
    }


def reproduces(r: dict[str, Any]) -> bool | None:
    if r["published"] is None:
        return None
    tol = 1e-4 * r["published"] if r["heuristic"] == "optimum" else 5e-6
    return abs(r["objective"] - r["published"]) <= tol


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mcts-count", type=int, default=64, help="instances of MCTS-AHD's test sets (max 1000)")
    ap.add_argument("--skip-heldout", action="store_true", help="part 1 only")
    ap.add_argument("--out", default=None, help="folder for published_seeds.jsonl")
    args = ap.parse_args(argv)
    rows = peer_rows(min(max(args.mcts_count, 1), 1000))
    print(
        md_table(
            ["instances", "heuristic", "objective", "published", "reproduces", "wall s"],
            [
                [
                    r["instances"],
                    r["heuristic"],
                    f"{r['objective']:.6f}",
                    r["published"] and str(r["published"]),
                    reproduces(r),
                    r["wall_s"],
                ]
                for r in rows
            ],
        )
    )
    if not args.skip_heldout:
        held = heldout_rows()
        print()
        print(
            md_table(
                ["instances", "heuristic", "objective", "gap %", "wall s"],
                [
                    [r["instances"], r["heuristic"], f"{r['objective']:.5f}", r["gap_percent"], r["wall_s"]]
                    for r in held
                ],
            )
        )
        rows += held
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "published_seeds.jsonl", "w") as fh:
            fh.writelines(json.dumps({**r, "reproduces": reproduces(r)}) + "\n" for r in rows)
    return 1 if any(reproduces(r) is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

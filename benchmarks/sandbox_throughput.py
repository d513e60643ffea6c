"""Evaluations per second: the sandbox vs a plain process-per-program evaluator, on the same candidates.

Both evaluators start one fresh interpreter per candidate and evaluate it on the same instances with the
real AHD target (``coevo.ahd.problem:run_target``, tsp_construct, EoH's interface, default 8 instances of
50 nodes, as EoH trains), driven by the same thread pool. The plain evaluator runs the target IN the
candidate's process, as the reference frameworks do (so a candidate can forge its score there). The
sandbox runs the target on the trusted side: the candidate's process, unprivileged and seeing only the
interpreter and its libraries, returns each instance's tour, which is checked and measured here; it saves
start-up time by not importing ``site`` or coevo in the candidate's process (``-S``, import path passed
explicitly) and by pinning BLAS thread pools to one thread. The candidates mix
pure-Python and numpy heuristics with a few failing ones (runtime error, infeasible choice, syntax error),
as a population of LLM samples does. Rounds alternate the order of the evaluators; medians are reported.
The sandbox row is the sandbox as evaluations use it (its default isolation, printed): where the host has
what it needs (root, pidfds, a seccomp table) the zygote mode (:mod:`coevo.sandbox.zygote`: workers forked
from a preloaded zygote onto an empty tmpfs root, no interpreter start, no numpy import per evaluation),
else bubblewrap; both with the seccomp filter, a fresh uid (as root) and a per-evaluation cgroup where the
machine has one, imports restricted to the problem's ``candidate_packages``. The other isolation mode gets
its own row where the host can run it: "sandbox (bwrap)" (``SandboxLimits.isolation = "bwrap"``) or
"sandbox (zygote)"; the zygote's and bubblewrap's ratios to the plain process are printed as
``zygote_vs_plain_throughput`` and ``bwrap_vs_plain_throughput``. Two more rows separate the effects:
"plain (lean start-up)" has the sandbox's start-up without isolation, "sandbox (rlimits only)" the sandbox
without isolation.

Prints a table, then one JSON line per metric:
``{"metric": "sandbox_vs_plain_throughput", "value": X, "goal": ">= 2.0", "met": bool}``.

Usage: ``python benchmarks/sandbox_throughput.py [--evals 32] [--rounds 3] [--workers N] [--n 50]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coevo.ahd import load_problem
from coevo.ahd.evaluate import TARGET, instances_file
from coevo.sandbox import zygote
from coevo.sandbox.isolation import bwrap_status
from coevo.sandbox.plain import PlainEvaluator
from coevo.sandbox.pool import Job, evaluate_many
from coevo.sandbox.runner import Sandbox, SandboxLimits

FN = "select_next_node"
CANDIDATES = [
    # nearest neighbour, pure Python
    (
        "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        "    row = distance_matrix[current_node]\n"
        "    return min(unvisited_nodes, key=lambda n: row[n])\n"
    ),
    # numpy: distance plus a pull towards the destination
    (
        "import numpy as np\n\n"
        "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        "    d = np.asarray(distance_matrix)\n"
        "    u = np.asarray(unvisited_nodes)\n"
        "    score = d[current_node, u] - 0.3 * d[destination_node, u]\n"
        "    return int(u[np.argmin(score)])\n"
    ),
    # one-step look-ahead, pure Python (heavier)
    (
        "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        "    best, best_cost = None, float('inf')\n"
        "    for n in unvisited_nodes:\n"
        "        rest = [m for m in unvisited_nodes if m != n]\n"
        "        nxt = min((distance_matrix[n][m] for m in rest), default=0.0)\n"
        "        cost = distance_matrix[current_node][n] + 0.5 * nxt\n"
        "        if cost < best_cost:\n"
        "            best, best_cost = n, cost\n"
        "    return best\n"
    ),
    # numpy with a neighbourhood-density term
    (
        "import numpy as np\n\n"
        "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        "    d = np.asarray(distance_matrix)\n"
        "    u = np.asarray(unvisited_nodes)\n"
        "    density = d[np.ix_(u, u)].mean(axis=1) if len(u) > 1 else np.zeros(1)\n"
        "    return int(u[np.argmin(d[current_node, u] - 0.1 * density)])\n"
    ),
    # runtime error
    (
        "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        "    return unvisited_nodes[len(unvisited_nodes)]\n"
    ),
    # infeasible: revisits the current node
    (
        "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        "    return current_node\n"
    ),
    # syntax error reaching the worker
    (
        "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        "    return min(unvisited_nodes, key=lambda n: distance_matrix[current_node][n]\n"
    ),
    # farthest insertion flavour, pure Python
    (
        "import math\n\n"
        "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        "    row = distance_matrix[current_node]\n"
        "    return min(unvisited_nodes, key=lambda n: row[n] * (1 + 0.05 * math.log1p(n)))\n"
    ),
]


def signature(result) -> tuple:
    """What must agree between evaluators: validity, failure kind and the objectives."""
    objectives = tuple(round(x, 9) for x in result.metrics.get("objectives", []))
    return result.valid, result.error_kind, objectives


def measure(evaluator, jobs: list[Job], workers: int) -> tuple[float, list]:
    start = time.perf_counter()
    results = evaluate_many(evaluator, jobs, max_workers=workers)
    return len(jobs) / (time.perf_counter() - start), results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--evals", type=int, default=32, help="evaluations per evaluator per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (evaluator order alternates)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="concurrent processes")
    parser.add_argument("--n", type=int, default=50, help="nodes per instance")
    parser.add_argument("--instances", type=int, default=8, help="instances per evaluation")
    args = parser.parse_args(argv)
    for name in ("evals", "rounds", "workers", "n", "instances"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    tsp = load_problem("tsp_construct")
    payload = {
        "problem": str(tsp.root),
        "instances_path": str(instances_file(tsp.generate(args.n, args.instances, seed=2024))),
        "candidate_packages": list(tsp.candidate_packages or ()),  # what coevo.ahd.evaluate passes
    }
    jobs = [Job(CANDIDATES[i % len(CANDIDATES)], FN, TARGET, payload) for i in range(args.evals)]
    limits = SandboxLimits(timeout_s=30.0)
    evaluators = {
        "sandbox": Sandbox(limits),
        "plain": PlainEvaluator(timeout_s=30.0),
        "plain (lean start-up)": PlainEvaluator(timeout_s=30.0, lean_start=True),
    }
    default = evaluators["sandbox"].isolation
    if default != "rlimits":
        evaluators["sandbox (rlimits only)"] = Sandbox(limits, use_bwrap=False)
    if default == "zygote" and bwrap_status()[0]:
        evaluators["sandbox (bwrap)"] = Sandbox(dataclasses.replace(limits, isolation="bwrap"))
    if default == "bwrap" and not zygote.missing():
        evaluators["sandbox (zygote)"] = Sandbox(dataclasses.replace(limits, isolation="zygote"))
    for name in ("sandbox", "sandbox (bwrap)", "sandbox (zygote)"):
        if name in evaluators:  # warm the page cache (bwrap), start the zygote (zygote)
            evaluate_many(evaluators[name], jobs[:2], max_workers=1)
    rates: dict[str, list[float]] = {name: [] for name in evaluators}
    outputs: dict[str, list] = {}
    names = list(evaluators)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            rate, results = measure(evaluators[name], jobs, args.workers)
            rates[name].append(rate)
            outputs[name] = results
    agree = all([signature(x) for x in outputs[name]] == [signature(x) for x in outputs["plain"]] for name in outputs)
    median = {name: statistics.median(v) for name, v in rates.items()}
    valid = {name: sum(x.valid for x in outputs[name]) for name in outputs}
    print(
        f"{args.evals} evaluations x {args.rounds} rounds, {args.workers} workers, "
        f"{args.instances} x {args.n}-node instances, sandbox isolation: {evaluators['sandbox'].isolation}, "
        f"limits: {evaluators['sandbox'].accounting}, seccomp: {evaluators['sandbox'].seccomp is not None}"
    )
    print(f"{'evaluator':<24}{'evals/s (median)':>18}{'ms/eval':>10}{'valid':>8}  rounds")
    for name in evaluators:
        print(
            f"{name:<24}{median[name]:>18.2f}{1000 / median[name]:>10.1f}{valid[name]:>8}  "
            + " ".join(f"{x:.2f}" for x in rates[name])
        )
    print(f"results identical across evaluators: {agree}")
    ratio = median["sandbox"] / median["plain"]
    lines = [
        {"metric": "sandbox_vs_plain_throughput", "value": round(ratio, 3), "goal": ">= 2.0", "met": ratio >= 2.0},
        {"metric": "sandbox_results_match_plain", "value": agree, "goal": "true", "met": agree},
    ]
    for mode in ("zygote", "bwrap"):
        row = "sandbox" if default == mode else f"sandbox ({mode})"
        if row in median:
            mratio = median[row] / median["plain"]
            lines.append(
                {"metric": f"{mode}_vs_plain_throughput", "value": round(mratio, 3), "goal": None, "met": None}
            )
    for name in evaluators:
        key = name.replace(" (rlimits only)", "_rlimits_only").replace(" (lean start-up)", "_lean_startup")
        key = key.replace(" (zygote)", "_zygote").replace(" (bwrap)", "_bwrap")
        lines.append({"metric": f"{key}_evals_per_s", "value": round(median[name], 2), "goal": None, "met": None})
    for line in lines:
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())

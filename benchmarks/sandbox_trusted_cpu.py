"""Trusted-side CPU per evaluation: what a candidate can make the evaluator's own process spend (issue 45).

The trusted process reads and decodes every reply of the candidate's process, outside the evaluation's
cgroup. This benchmark evaluates online bin packing (Weibull, default 3 x 1000 items, one call per item)
through the real sandbox with four candidates and measures the trusted process's CPU time
(``resource.getrusage(RUSAGE_SELF)``, user + system, all its threads) per evaluation, median of rounds:

- ``honest``: Best Fit returning a numpy array;
- ``honest_list``: the same returning a Python list (lists of numbers travel as arrays);
- ``junk``: Best Fit appending ~1 MiB of JSON junk to every reply header (the attack of issue 45: 85.8 s
  of trusted CPU for 3 instances before, against 1.5 s honest);
- ``padded``: a list reply padded with the most expensive JSON that fits under the reply bound.

Prints a table, then one JSON line per metric:
``{"metric": "trusted_cpu_junk_vs_honest", "value": X, "goal": "<= 2.0", "met": bool}``.

Usage: ``python benchmarks/sandbox_trusted_cpu.py [--items 1000] [--instances 3] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coevo.ahd import load_problem
from coevo.ahd.evaluate import evaluate_heuristic
from coevo.sandbox.runner import Sandbox, SandboxLimits

BEST_FIT = "import numpy as np\n\ndef score(item, bins):\n    return -(bins - item).astype(np.float64)\n"
AS_LIST = "def score(item, bins):\n    return [float(item - b) for b in bins]\n"
PATCH = (
    "import sys\n"
    "_w = sys.modules['__main__']\n"
    "_orig = _w._dumps\n"
    "_w._dumps = lambda h: _orig(dict(h, junk=[[] for _ in range({n})]))\n"
)
CANDIDATES = {
    "honest": BEST_FIT,
    "honest_list": AS_LIST,
    "junk": PATCH.format(n=250_000) + BEST_FIT,  # ~1 MiB of JSON per reply
    "padded": PATCH.format(n=60) + AS_LIST,  # just under the 512-byte header bound
}


def trusted_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1000, help="items per instance")
    parser.add_argument("--instances", type=int, default=3, help="instances per evaluation")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians reported)")
    args = parser.parse_args(argv)
    for name in ("items", "instances", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    bpp = load_problem("bpp_online")
    inst = bpp.generate(args.items, args.instances, seed=7)
    sandbox = Sandbox(SandboxLimits(timeout_s=120))
    evaluate_heuristic(bpp, BEST_FIT, inst, sandbox=sandbox, with_reference=False)  # warm up
    cpu: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    wall: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    outcome: dict[str, str] = {}
    for _ in range(args.rounds):
        for name, code in CANDIDATES.items():
            c0, w0 = trusted_cpu_s(), time.perf_counter()
            res = evaluate_heuristic(bpp, code, inst, sandbox=sandbox, with_reference=False)
            cpu[name].append(trusted_cpu_s() - c0)
            wall[name].append(time.perf_counter() - w0)
            outcome[name] = f"valid {res.objective:g} bins" if res.valid else f"{res.error_kind}: {res.error[:60]}"
    med = {name: statistics.median(v) for name, v in cpu.items()}
    print(
        f"bpp_online, {args.instances} x {args.items} Weibull items, {args.rounds} rounds, "
        f"isolation {sandbox.isolation}, limits {sandbox.accounting}"
    )
    print(f"{'candidate':<14}{'trusted CPU s':>15}{'wall s':>9}  outcome")
    for name in CANDIDATES:
        print(f"{name:<14}{med[name]:>15.3f}{statistics.median(wall[name]):>9.2f}  {outcome[name]}")
    lines = []
    for name in ("honest_list", "junk", "padded"):
        ratio = med[name] / med["honest"]
        lines.append(
            {"metric": f"trusted_cpu_{name}_vs_honest", "value": round(ratio, 3), "goal": "<= 2.0", "met": ratio <= 2.0}
        )
    for name in CANDIDATES:
        lines.append({"metric": f"trusted_cpu_s_{name}", "value": round(med[name], 4), "goal": None, "met": None})
    for line in lines:
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Trusted-side CPU per evaluation: what a candidate can make the evaluator's own process spend (issue 45).

The trusted process reads and decodes every reply of the candidate's process, outside the evaluation's
cgroup. This benchmark evaluates online bin packing (Weibull, default 3 x 1000 items, one call per item)
through the real sandbox with four candidates and measures the trusted process's CPU time
(``resource.getrusage(RUSAGE_SELF)``, user + system, all its threads) per evaluation, median of rounds:

- ``honest``: Best Fit returning a numpy array;
- ``honest_list``: the same returning a Python list (lists of numbers travel as arrays);
- ``junk``: Best Fit appending ~1 MiB of JSON junk to every reply header (the attack of issue 45: 85.8 s
  of trusted CPU for 3 instances before, against 1.5 s honest);
- ``padded``: a list reply padded with the most expensive JSON that fits under the 512-byte header bound;
- ``slow``: Best Fit spending about ``--slow-ms`` of CPU per call (the honest reference of the trickles);
- ``trickle``: the same slow heuristic with two child processes writing stdout and stderr one byte at a
  time, each waiting until the trusted side has read the byte (``FIONREAD`` on the pipe): issue 54's attack,
  13.8 CPU-s of the trusted side against 1.0 for ``slow`` before the wake-up rate was bounded;
- ``reply_trickle``: the slow heuristic writing each reply one byte at a time, each waiting to be read.

Prints a table, then one JSON line per metric:
``{"metric": "trusted_cpu_junk_vs_honest", "value": X, "goal": "<= 2.0", "met": bool}``.

Usage: ``python benchmarks/sandbox_trusted_cpu.py [--items 1000] [--instances 3] [--rounds 3] [--slow-ms 2]
[--slow-items 300]``
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
PAD_TO_BOUND = (  # pads each reply's header with empty lists to just under the 512-byte bound
    "import sys\n"
    "_w = sys.modules['__main__']\n"
    "_orig = _w._dumps\n"
    "_size = [0]\n"
    "def _padded(h):\n"
    "    text = _orig(h)\n"
    "    if 'value' not in h:\n"
    "        return text\n"
    "    n = max(0, (_size[0] - len(text) - 12) // 3)\n"
    "    return text[:-1] + ', \"pad\": [' + ','.join(['[]'] * n) + ']}'\n"
    "_w._dumps = _padded\n"
    "def score(item, bins):\n"
    "    _size[0] = 512 - 8\n"
    "    return [float(item - b) for b in bins]\n"
)
SLOW = (
    "import time\nimport numpy as np\n\n"
    "def score(item, bins):\n"
    "    end = time.process_time() + {ms} / 1000\n"
    "    while time.process_time() < end:\n"
    "        pass\n"
    "    return -(bins - item).astype(np.float64)\n"
)
TRICKLE = (  # two children, one per stream, each writing a byte and waiting until it has been read
    "import fcntl, os, struct, termios\n"
    "def _trickle(fd):\n"
    "    buf = bytearray(4)\n"
    "    while True:\n"
    "        os.write(fd, b'x')\n"
    "        while True:\n"
    "            fcntl.ioctl(fd, termios.FIONREAD, buf)\n"
    "            if struct.unpack('i', buf)[0] == 0:\n"
    "                break\n"
    "for _fd in (1, 2):\n"
    "    if os.fork() == 0:\n"
    "        _trickle(_fd)\n"
)
REPLY_TRICKLE = (  # every reply written one byte at a time, each waiting until it has been read
    "import fcntl, os, struct, sys, termios\n"
    "_w = sys.modules['__main__']\n"
    "def _one_by_one(fd, parts):\n"
    "    buf = bytearray(4)\n"
    "    for b in b''.join(parts):\n"
    "        os.write(fd, bytes([b]))\n"
    "        while True:\n"
    "            fcntl.ioctl(fd, termios.FIONREAD, buf)\n"
    "            if struct.unpack('i', buf)[0] == 0:\n"
    "                break\n"
    "_w._write_parts = _one_by_one\n"
)
CANDIDATES = {
    "honest": BEST_FIT,
    "honest_list": AS_LIST,
    "junk": PATCH.format(n=250_000) + BEST_FIT,  # ~1 MiB of JSON per reply
    "padded": PAD_TO_BOUND,  # just under the header bound of each call
}
#: the slow heuristic and its trickling variants (formatted with --slow-ms)
SLOW_CANDIDATES = {"slow": "", "trickle": TRICKLE, "reply_trickle": REPLY_TRICKLE}


def trusted_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1000, help="items per instance")
    parser.add_argument("--instances", type=int, default=3, help="instances per evaluation")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians reported)")
    parser.add_argument("--slow-ms", type=float, default=2.0, help="CPU ms per call of the slow heuristic")
    parser.add_argument("--slow-items", type=int, default=300, help="items per instance for the slow candidates")
    args = parser.parse_args(argv)
    for name in ("items", "instances", "rounds", "slow_items"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    bpp = load_problem("bpp_online")
    inst = bpp.generate(args.items, args.instances, seed=7)
    sandbox = Sandbox(SandboxLimits(timeout_s=120))
    evaluate_heuristic(bpp, BEST_FIT, inst, sandbox=sandbox, with_reference=False)  # warm up
    slow_inst = bpp.generate(args.slow_items, args.instances, seed=8)
    runs = {name: (code, inst) for name, code in CANDIDATES.items()}
    slow = SLOW.format(ms=args.slow_ms)
    runs.update({name: (prefix + slow, slow_inst) for name, prefix in SLOW_CANDIDATES.items()})
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    wall: dict[str, list[float]] = {name: [] for name in runs}
    outcome: dict[str, str] = {}
    for _ in range(args.rounds):
        for name, (code, instances) in runs.items():
            c0, w0 = trusted_cpu_s(), time.perf_counter()
            res = evaluate_heuristic(bpp, code, instances, sandbox=sandbox, with_reference=False)
            cpu[name].append(trusted_cpu_s() - c0)
            wall[name].append(time.perf_counter() - w0)
            outcome[name] = f"valid {res.objective:g} bins" if res.valid else f"{res.error_kind}: {res.error[:60]}"
    med = {name: statistics.median(v) for name, v in cpu.items()}
    print(
        f"bpp_online, {args.instances} x {args.items} Weibull items, {args.rounds} rounds, "
        f"isolation {sandbox.isolation}, limits {sandbox.accounting}; slow candidates: {args.instances} x "
        f"{args.slow_items} items, {args.slow_ms:g} CPU ms per call"
    )
    print(f"{'candidate':<14}{'trusted CPU s':>15}{'wall s':>9}  outcome")
    for name in runs:
        print(f"{name:<14}{med[name]:>15.3f}{statistics.median(wall[name]):>9.2f}  {outcome[name]}")
    lines = []
    for name, ref in (
        ("honest_list", "honest"),
        ("junk", "honest"),
        ("padded", "honest"),
        ("trickle", "slow"),
        ("reply_trickle", "slow"),
    ):
        ratio = med[name] / med[ref]
        lines.append(
            {"metric": f"trusted_cpu_{name}_vs_{ref}", "value": round(ratio, 3), "goal": "<= 2.0", "met": ratio <= 2.0}
        )
    for name in runs:
        lines.append({"metric": f"trusted_cpu_s_{name}", "value": round(med[name], 4), "goal": None, "met": None})
    for line in lines:
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())

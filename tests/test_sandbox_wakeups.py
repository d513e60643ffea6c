"""Issue 54, item 4: the trusted side's work per evaluation is bounded whatever the candidate writes.

Before: the trusted loop woke for every byte on stdout / stderr / the reply pipe. Two children writing one
byte at a time, each waiting until it was read, cost the trusted process 13.8 CPU-s against 1.0 for the same
slow heuristic without output. Now output is read in large chunks at most every 50 ms, small wake-ups lengthen
the following pauses, and a reply arriving in pieces is read again after a growing pause (real sandbox; the
wake-ups are counted at ``os.read`` of the trusted side).
"""

from __future__ import annotations

import os
import resource
import time

import pytest

from coevo.ahd import load_problem
from coevo.ahd.evaluate import evaluate_heuristic
from coevo.sandbox import session
from coevo.sandbox.isolation import bwrap_status
from coevo.sandbox.runner import Sandbox, SandboxLimits

pytestmark = [
    pytest.mark.usefixtures("private_cache"),
    pytest.mark.skipif(not bwrap_status()[0], reason="bubblewrap is not usable here"),
]
SLOW = (
    "import time\nimport numpy as np\n\n"
    "def score(item, bins):\n"
    "    end = time.process_time() + 0.002\n"
    "    while time.process_time() < end:\n"
    "        pass\n"
    "    return -(bins - item).astype(np.float64)\n"
)
WAIT_READ = (
    "import fcntl, os, struct, sys, termios\n"
    "def _wait_read(fd, buf=bytearray(4)):\n"
    "    while True:\n"
    "        fcntl.ioctl(fd, termios.FIONREAD, buf)\n"
    "        if struct.unpack('i', buf)[0] == 0:\n"
    "            return\n"
)
TRICKLE = WAIT_READ + (
    "def _trickle(fd):\n"
    "    while True:\n"
    "        os.write(fd, b'x')\n"
    "        _wait_read(fd)\n"
    "for _fd in (1, 2):\n"
    "    if os.fork() == 0:\n"
    "        _trickle(_fd)\n"
)
REPLY_TRICKLE = WAIT_READ + (
    "_w = sys.modules['__main__']\n"
    "def _one_by_one(fd, parts):\n"
    "    for b in b''.join(parts):\n"
    "        os.write(fd, bytes([b]))\n"
    "        _wait_read(fd)\n"
    "_w._write_parts = _one_by_one\n"
)


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


@pytest.fixture
def counted_reads(monkeypatch):
    """Counts the trusted side's reads of the candidate's pipes (its wake-ups), and the bytes they got."""
    counts = {"reads": 0, "bytes": 0}
    real = os.read

    def read(fd, n):
        data = real(fd, n)
        counts["reads"] += 1
        counts["bytes"] += len(data)
        return data

    monkeypatch.setattr(session.os, "read", read)
    return counts


@pytest.mark.parametrize("attack", ["output", "reply"])
def test_a_one_byte_trickle_costs_the_trusted_side_about_an_honest_evaluation(counted_reads, attack):
    bpp = load_problem("bpp_online")
    instances = bpp.generate(200, 1, seed=4)
    sandbox = Sandbox(SandboxLimits(timeout_s=6, memory_mb=1024))
    evaluate_heuristic(bpp, SLOW, instances, sandbox=sandbox, with_reference=False)  # warm
    c0, w0, r0 = _cpu(), time.perf_counter(), counted_reads["reads"]
    honest = evaluate_heuristic(bpp, SLOW, instances, sandbox=sandbox, with_reference=False)
    honest_cpu, honest_wall, honest_reads = _cpu() - c0, time.perf_counter() - w0, counted_reads["reads"] - r0
    assert honest.valid, honest.error
    c0, r0 = _cpu(), counted_reads["reads"]
    code = (TRICKLE if attack == "output" else REPLY_TRICKLE) + SLOW
    attacked = evaluate_heuristic(bpp, code, instances, sandbox=sandbox, with_reference=False)
    attack_cpu, attack_reads = _cpu() - c0, counted_reads["reads"] - r0
    assert attacked.valid or attacked.error_kind == "timeout", attacked.error
    # wake-ups: a few hundred in the whole evaluation (before: one per byte, tens of thousands in 6 s)
    assert attack_reads <= honest_reads + 600, (attack_reads, honest_reads, honest_wall)
    assert attack_cpu <= 2 * honest_cpu + 0.1, (attack_cpu, honest_cpu)


def test_honest_output_is_kept_whole_and_not_slowed():
    """A heuristic printing on every call: everything it printed is captured (under the cap) and the
    evaluation's score is unchanged; the printing costs it no extra wall time beyond its own writes."""
    bpp = load_problem("bpp_online")
    instances = bpp.generate(200, 2, seed=6)
    sandbox = Sandbox(SandboxLimits(timeout_s=20, memory_mb=1024))
    quiet = "import numpy as np\n\ndef score(item, bins):\n    return -(np.asarray(bins) - item).astype(np.float64)\n"
    loud = quiet.replace("    return", "    print('item', int(item), 'bins', len(bins), flush=True)\n    return")
    assert loud != quiet
    evaluate_heuristic(bpp, quiet, instances, sandbox=sandbox, with_reference=False)  # warm
    t0 = time.perf_counter()
    ref = evaluate_heuristic(bpp, quiet, instances, sandbox=sandbox, with_reference=False)
    quiet_wall = time.perf_counter() - t0
    run = sandbox.execute(
        loud,
        "score",
        "coevo.sandbox.targets:call_cases",
        {"cases": [[5, list(range(40, 60))]] * 300, "candidate_packages": ["numpy"]},
    )
    assert run.result.valid, run.result.error
    lines = run.stdout.splitlines()
    assert len(lines) == 300 and lines[0] == "item 5 bins 20", lines[:2]
    t0 = time.perf_counter()
    res = evaluate_heuristic(bpp, loud, instances, sandbox=sandbox, with_reference=False)
    loud_wall = time.perf_counter() - t0
    assert res.valid and res.objective == ref.objective, res.error
    assert loud_wall <= 3 * quiet_wall + 1.0, (loud_wall, quiet_wall)

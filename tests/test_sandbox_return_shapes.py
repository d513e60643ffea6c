"""Issue 54, item 1: every honest return shape of earlier rounds is scored as before, through the real sandbox.

Before: round two bounded a reply's JSON header at 512 bytes, and a Best Fit returning a list of numpy scalars
(an LLM's ``[np.float64(...) for b in bins]``) was refused as ``return_type`` ("needs a 2123-byte header, more
than the 512 this call accepts"). Now the worker sends lists / tuples of Python or numpy numbers (any real
dtype, nested or not) as arrays, numpy scalars and 0-d arrays as Python numbers, and the trusted side's bound
of the array bytes a reply may carry is sized from the call's arguments; forged and padded replies stay refused
before they are parsed.
"""

from __future__ import annotations

import pytest

from coevo.ahd import load_problem
from coevo.ahd.evaluate import evaluate_heuristic
from coevo.sandbox.isolation import bwrap_status
from coevo.sandbox.runner import Sandbox, SandboxLimits
from coevo.sandbox.session import REPLY_HEADER_BYTES

pytestmark = [
    pytest.mark.usefixtures("private_cache"),
    pytest.mark.skipif(not bwrap_status()[0], reason="bubblewrap is not usable here"),
]
CALL = "coevo.sandbox.targets:call_cases"

#: Best Fit (the canonical BPP seed) returned in each shape an LLM writes
BPP_SHAPES = {
    "list of np.float64": "import numpy as np\ndef score(item, bins):\n    return [np.float64(item - b) for b in bins]\n",
    "list() of a float64 array": "import numpy as np\ndef score(item, bins):\n    return list(-(bins - item).astype(float))\n",
    "list of np.int64": "def score(item, bins):\n    return [item - b for b in bins]\n",
    "tuple of ints": "def score(item, bins):\n    return tuple(int(item - b) for b in bins)\n",
    "np.int32 array": "import numpy as np\ndef score(item, bins):\n    return (item - bins).astype(np.int32)\n",
    "python floats": "def score(item, bins):\n    return [float(item - b) for b in bins]\n",
    "list of np.float32": "import numpy as np\ndef score(item, bins):\n    return [np.float32(item - b) for b in bins]\n",
    "big-endian float64 array": "import numpy as np\ndef score(item, bins):\n    return (item - bins).astype('>f8')\n",
    "longdouble array": "import numpy as np\ndef score(item, bins):\n    return (item - bins).astype(np.longdouble)\n",
    "ints and floats": "def score(item, bins):\n    return [int(item - b) if b % 2 else float(item - b) for b in bins]\n",
    "tolist()": "import numpy as np\ndef score(item, bins):\n    return (-(bins - item)).tolist()\n",
    "list of 0-d arrays": "import numpy as np\ndef score(item, bins):\n    return [np.array(item - b) for b in bins]\n",
}
#: nearest neighbour (the canonical TSP seed) answering the scalar it is asked for as a numpy scalar or 0-d array
TSP_SHAPES = {
    "0-d int64 array": "import numpy as np\ndef select_next_node(c, d, unvisited, dist):\n"
    "    return np.array(unvisited[np.argmin(dist[c, unvisited])])\n",
    "np.int64": "import numpy as np\ndef select_next_node(c, d, unvisited, dist):\n"
    "    return unvisited[np.argmin(dist[c, unvisited])]\n",
    "0-d int32 array": "import numpy as np\ndef select_next_node(c, d, unvisited, dist):\n"
    "    return np.asarray(unvisited[np.argmin(dist[c, unvisited])], dtype=np.int32)\n",
}


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxLimits(timeout_s=30, memory_mb=1024))


@pytest.mark.parametrize(
    ("problem_name", "shapes", "size"), [("bpp_online", BPP_SHAPES, 300), ("tsp_construct", TSP_SHAPES, 30)]
)
def test_every_honest_shape_scores_exactly_like_the_canonical_heuristic(sandbox, problem_name, shapes, size):
    problem = load_problem(problem_name)
    instances = problem.generate(size, 2, seed=5)
    canonical = evaluate_heuristic(
        problem, problem.seed_heuristic_code(), instances, sandbox=sandbox, with_reference=False
    )
    assert canonical.valid, canonical.error
    for name, code in shapes.items():
        res = evaluate_heuristic(problem, code, instances, sandbox=sandbox, with_reference=False)
        assert res.valid, (name, res.error_kind, res.error)
        assert res.objective == canonical.objective, (name, res.objective, canonical.objective)


def test_values_come_back_as_the_numbers_they_were(sandbox):
    """What the trusted side decodes: Python numbers for numpy scalars and 0-d arrays, lists (nested as sent)
    for lists of numbers, arrays for arrays (of the dtype sent, little-endian)."""
    code = (
        "import numpy as np\n"
        "def f(which):\n"
        "    return {\n"
        "        'scalar64': np.float64(2.5), 'scalar0d': np.array(7), 'f0d': np.array(0.25, dtype=np.float32),\n"
        "        'bool_': np.bool_(True), 'u64': np.uint64(2**64 - 1),\n"
        "        'list64': [np.float64(i) / 4 for i in range(10)], 'ints': tuple(np.int16(i) for i in range(9)),\n"
        "        'nested': [[i, i + 1] for i in range(9)], 'bools': [bool(i % 2) for i in range(8)],\n"
        "        'mixed': [1, 2.5] * 5, 'huge': [2**63 + 1] * 8, 'ragged': [[1], [2, 3]], 'flags': [True, 2] * 4,\n"
        "        'i32': np.arange(4, dtype=np.int32), 'be': np.arange(3, dtype='>i4'),\n"
        "    }[which]\n"
    )
    names = [
        "scalar64", "scalar0d", "f0d", "bool_", "u64", "list64", "ints", "nested", "bools", "mixed", "huge",
        "ragged", "flags", "i32", "be",
    ]  # fmt: skip
    res = sandbox.run(code, "f", CALL, {"cases": [[n] for n in names], "candidate_packages": ["numpy"]})
    assert res.valid, res.error
    got = dict(zip(names, res.metrics["values"], strict=True))
    assert got["scalar64"] == 2.5 and type(got["scalar64"]) is float
    assert got["scalar0d"] == 7 and type(got["scalar0d"]) is int
    assert got["f0d"] == 0.25 and type(got["f0d"]) is float
    assert got["bool_"] is True and got["u64"] == 2**64 - 1
    assert got["list64"] == [i / 4 for i in range(10)]
    assert got["ints"] == list(range(9)) and all(type(v) is int for v in got["ints"])
    assert got["nested"] == [[i, i + 1] for i in range(9)]
    assert got["bools"] == [bool(i % 2) for i in range(8)]
    assert got["mixed"] == [1, 2.5] * 5 and got["huge"] == [2**63 + 1] * 8 and got["ragged"] == [[1], [2, 3]]
    assert got["flags"] == [1, 2] * 4 and all(type(v) is int for v in got["flags"])  # as np.asarray reads it
    assert got["i32"] == [0, 1, 2, 3] and got["be"] == [0, 1, 2]  # metrics go through jsonable (tolist)


def test_the_header_bound_is_sized_from_the_call_and_forged_replies_stay_refused(sandbox):
    """A forged reply (the candidate rewrites the worker's encoder so its JSON header carries junk) is parsed
    when it stays within the header bound (512 bytes, whatever the call), and refused as ``sandbox`` before it
    is parsed when it is larger; a reply announcing more array bytes than the call's arguments allow (4096 +
    8 per number sent) is refused too."""
    forge = (
        "import sys\n"
        "import numpy as np\n"
        "_w = sys.modules['__main__']\n"
        "_orig = _w._dumps\n"
        "_size = [0]\n"
        "def _padded(h):\n"
        "    text = _orig(h)\n"
        "    if not _size[0] or 'value' not in h:\n"
        "        return text\n"
        "    return text[:-1] + ', \"pad\": \"' + 'x' * (_size[0] - len(text) - 10) + '\"}'\n"
        "_w._dumps = _padded\n"
        "_w.oversize = lambda parts, bounds: None  # the worker's own check of honest returns, skipped\n"
        "def score(item, bins):\n"
        "    _size[0] = SIZE\n"
        "    return -(bins - item).astype(np.float64)\n"
    )
    problem = load_problem("bpp_online")
    instances = problem.generate(200, 1, seed=2)
    canonical = evaluate_heuristic(
        problem, problem.seed_heuristic_code(), instances, sandbox=sandbox, with_reference=False
    )
    under = forge.replace("SIZE", f"{REPLY_HEADER_BYTES} - 4")
    over = forge.replace("SIZE", f"{REPLY_HEADER_BYTES} + 64")
    res = evaluate_heuristic(problem, under, instances, sandbox=sandbox, with_reference=False)
    assert res.valid and res.objective == canonical.objective, res.error
    res = evaluate_heuristic(problem, over, instances, sandbox=sandbox, with_reference=False)
    assert not res.valid and res.error_kind == "sandbox" and "reply header" in res.error, res.error
    announce = (
        "import sys\nimport numpy as np\n_w = sys.modules['__main__']\n"
        "_head = _w._dumps({'ok': True, 'value': {'__nd__': 0}, 'arrays': [{'dtype': '<f8', 'shape': [10**6]}]})\n"
        "_w.frame_parts = lambda h, b: [_w._LEN.pack(len(_head)), _head.encode()]\n"
        "def score(item, bins):\n    return -(bins - item).astype(np.float64)\n"
    )
    res = evaluate_heuristic(problem, announce, instances, sandbox=sandbox, with_reference=False)
    assert not res.valid and res.error_kind == "sandbox" and "in reply exceeds" in res.error, res.error

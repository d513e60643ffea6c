"""Generic sandbox targets (``"coevo.sandbox.targets:<name>"``), independent of any problem library.

A target receives the candidate's function and the payload and returns a JSON-able metrics dict; it raises
:class:`~coevo.sandbox.errors.InvalidReturn` / :class:`~coevo.sandbox.errors.InfeasibleSolution` to mark
those failures. Problem-specific targets live with the problems (e.g. ``coevo.ahd.problem:run_target``).
"""

from __future__ import annotations

import math
import random
from typing import Any

from coevo.sandbox.errors import InfeasibleSolution, InvalidReturn

_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict}


def call_cases(fn: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Call ``fn(*args)`` once per case and return the values.

    Args:
        fn: the candidate function.
        payload: ``{"cases": [[arg, ...], ...], "expect": "int"|"float"|"number"|"str"|"bool"|"list"|"dict"
            (optional), "allowed": [value, ...] (optional)}``.

    Returns:
        ``{"values": [value per case]}``.

    Raises:
        ValueError: the payload is malformed. InvalidReturn: a value has the wrong type (``number`` = a
        finite int or float, bools excluded). InfeasibleSolution: a value is not in ``allowed``.
    """
    cases = payload.get("cases")
    if not isinstance(cases, list) or not all(isinstance(c, list) for c in cases):
        raise ValueError("payload.cases must be a list of argument lists")
    expect = payload.get("expect")
    if expect is not None and expect not in _TYPES and expect != "number":
        raise ValueError(f"payload.expect must be one of {sorted([*_TYPES, 'number'])}, got {expect!r}")
    values = []
    for args in cases:
        value = fn(*args)
        if expect == "number":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else:
            ok = expect is None or (isinstance(value, _TYPES[expect]) and
                                    not (expect == "int" and isinstance(value, bool)))
        if not ok:
            raise InvalidReturn(f"expected {expect}, got {type(value).__name__} {value!r:.80}")
        if "allowed" in payload and value not in payload["allowed"]:
            raise InfeasibleSolution(f"{value!r:.80} is not one of the allowed values")
        values.append(value)
    return {"values": values}


def random_points(n: int, seed: int) -> list[tuple[float, float]]:
    """``n`` points uniform in the unit square from ``random.Random(seed)``."""
    rng = random.Random(seed)
    return [(rng.random(), rng.random()) for _ in range(n)]


def greedy_route(fn: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """A CPU-bound constructive-routing target (pure Python) for throughput benchmarks and tests.

    For each instance (uniform points, Euclidean distances), a closed route is built from node 0 by calling
    ``fn(current_node, destination_node, unvisited_nodes: list[int], distance_matrix: list[list[float]])
    -> int`` until every node is visited (the interface of the EoH TSP constructive task, field-notes §2).
    Each call gets fresh copies of the inputs, so a candidate mutating them cannot affect the length.

    Args:
        payload: ``{"n": int >= 2, "instances": int >= 1, "seed": int}``.

    Returns:
        ``{"objectives": [route length per instance], "mean_length": float}`` (lower is better).

    Raises:
        ValueError: malformed payload. InvalidReturn: a non-int choice. InfeasibleSolution: a visited or
        unknown node.
    """
    n, count, seed = payload.get("n"), payload.get("instances"), payload.get("seed", 0)
    for field, value, low in (("n", n, 2), ("instances", count, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"payload.{field} must be an int >= {low}, got {value!r}")
    lengths = []
    for k in range(count):
        pts = random_points(n, seed * 100003 + k)
        dist = [[math.dist(p, q) for q in pts] for p in pts]
        unvisited, current, length = set(range(1, n)), 0, 0.0
        while unvisited:
            choice = fn(current, 0, sorted(unvisited), [row[:] for row in dist])
            if isinstance(choice, bool) or not isinstance(choice, int):
                if not (hasattr(choice, "dtype") and getattr(choice.dtype, "kind", "") in "iu"):
                    raise InvalidReturn(f"expected an int node index, got {type(choice).__name__}")
                choice = int(choice)
            if choice not in unvisited:
                raise InfeasibleSolution(f"node {choice} is not an unvisited node")
            length += dist[current][choice]
            unvisited.discard(choice)
            current = choice
        lengths.append(length + dist[current][0])
    return {"objectives": lengths, "mean_length": sum(lengths) / len(lengths)}

"""Generic sandbox targets (``"coevo.sandbox.targets:<name>"``), independent of any problem library.

A target runs on the trusted side. It receives the candidate's function (called through the sandbox,
:class:`~coevo.sandbox.session.RemoteFunction`, or in process for the plain baseline) and the payload,
checks every value the function returns and returns a JSON-able metrics dict it computed itself; it
raises :class:`~coevo.sandbox.errors.InvalidReturn` / :class:`~coevo.sandbox.errors.InfeasibleSolution`
to mark those failures. Problem-specific targets live with the problems (``coevo.ahd.problem:run_target``).
"""

from __future__ import annotations

import math
import operator
import random
from typing import Any

from coevo.sandbox.calls import heuristic_call
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
    fn = heuristic_call(fn)
    if hasattr(fn, "accept_replies"):  # any JSON value may come back, not just what a heuristic returns
        fn.accept_replies(1 << 20, 8 << 20)
    for args in cases:
        value = fn(*args)
        if expect == "number":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else:
            ok = expect is None or (
                isinstance(value, _TYPES[expect]) and not (expect == "int" and isinstance(value, bool))
            )
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
    """A CPU-bound constructive-routing target for throughput benchmarks and tests.

    For each instance (uniform points, Euclidean distances), a closed route is built from node 0 by calling
    ``fn(current_node, destination_node, unvisited_nodes: np.ndarray[int64] (k,), distance_matrix:
    np.ndarray[float64] (n, n)) -> int`` until every node is visited (the interface of the EoH TSP
    constructive task, docs/references.md §2). Each call gets fresh copies of the inputs, so a candidate mutating
    them cannot affect the length, which is computed here from this target's own matrix.

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
    import numpy as np

    fn = heuristic_call(fn)
    lengths = []
    for k in range(count):
        pts = random_points(n, seed * 100003 + k)
        dist = np.array([[math.dist(p, q) for q in pts] for p in pts])
        dist.setflags(write=False)  # unchanged between calls: sent to the candidate once
        unvisited, current, length = set(range(1, n)), 0, 0.0
        while unvisited:
            choice = fn(current, 0, np.array(sorted(unvisited), dtype=np.int64), dist)
            if isinstance(choice, (bool, np.bool_)):
                raise InvalidReturn(f"expected an int node index, got {type(choice).__name__}")
            try:
                choice = operator.index(choice)
            except TypeError:
                raise InvalidReturn(f"expected an int node index, got {type(choice).__name__}") from None
            if choice not in unvisited:
                raise InfeasibleSolution(f"node {choice} is not an unvisited node")
            length += float(dist[current, choice])
            unvisited.discard(choice)
            current = choice
        lengths.append(length + float(dist[current, 0]))
    return {"objectives": lengths, "mean_length": sum(lengths) / len(lengths)}

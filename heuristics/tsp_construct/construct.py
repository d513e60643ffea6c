"""Candidate-side construction loop of tsp_construct: build a tour by calling ``select_next_node``.

Runs in the candidate's sandboxed process (shipped there as source text; numpy and the standard library
only) or in process for tests. Its output is untrusted: :meth:`TSPConstruct.score_solution` checks the tour
and measures it on the evaluator's own matrix. Step errors are raised here so an honest heuristic learns
what it did wrong (classified by the exception's class name).
"""

import operator

import numpy as np

try:  # in process: coevo's classes; in the sandbox (no coevo): same-named ones, classified by name
    from coevo.sandbox.errors import InfeasibleSolution, InvalidReturn
except ImportError:

    class InvalidReturn(Exception):  # the class name is what classifies it
        pass

    class InfeasibleSolution(Exception):
        pass


def as_index(value, what, upper):
    """``value`` as an int index in [0, upper) (numpy ints and 0-d int arrays too); InvalidReturn otherwise."""
    if isinstance(value, (bool, np.bool_)):
        raise InvalidReturn(f"{what} returned a bool ({value!r}); expected an int index")
    try:
        idx = operator.index(value)
    except TypeError:
        raise InvalidReturn(
            f"{what} returned {value!r:.80} of type {type(value).__name__}; expected an int index"
        ) from None
    if not 0 <= idx < upper:
        raise InvalidReturn(f"{what} returned index {idx}, outside [0, {upper})")
    return idx


def construct(fn, distances, name="select_next_node"):
    """The tour ``[0, v1, ..., v_{n-1}]`` chosen by ``fn`` (called n-1 times with fresh writable copies of
    ``unvisited_nodes`` (k,) int64 and ``distances`` (n, n) float64; the tour closes at node 0)."""
    dist = np.asarray(distances, dtype=np.float64)
    n = dist.shape[0]
    unvisited = np.ones(n, dtype=bool)
    unvisited[0] = False
    tour, current = [0], 0
    for _ in range(n - 1):
        nxt = as_index(fn(current, 0, np.flatnonzero(unvisited).astype(np.int64), dist.copy()), name, n)
        if not unvisited[nxt]:
            raise InfeasibleSolution(
                f"{name} returned node {nxt}, which is already visited (current node "
                f"{current}); choose one of unvisited_nodes"
            )
        unvisited[nxt] = False
        tour.append(nxt)
        current = nxt
    return tour

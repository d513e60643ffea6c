"""Candidate-side construction loop of tsp_construct: build a tour by calling ``select_next_node``.

Runs in the candidate's sandboxed process (shipped there as source text; numpy and the standard library
only) or in process for tests. Its output is untrusted: :meth:`TSPConstruct.score_solution` checks the tour
and measures it on the evaluator's own matrix. Step errors are raised here so an honest heuristic learns
what it did wrong (classified by the exception's class name).
"""

import numpy as np

from coevo.ahd.construct_prelude import InfeasibleSolution, as_index


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

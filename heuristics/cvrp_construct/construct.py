"""Candidate-side construction loop of cvrp_construct: build routes by calling ``select_next_node``.

Runs in the candidate's sandboxed process (shipped there as source text; numpy and the standard library
only) or in process for tests. Its output is untrusted: :meth:`CVRPConstruct.score_solution` checks the
routes against the evaluator's own demands and capacity and measures them on its own matrix.
"""

import numpy as np

from coevo.ahd.construct_prelude import InfeasibleSolution, InvalidReturn, as_index


def construct(fn, distances, demands, capacity, name="select_next_node"):
    """The visiting sequence ``[0, c.., 0, c.., 0]`` (depot = 0) chosen by ``fn(current_node, depot,
    unvisited_nodes (k,), rest_capacity, demands (n+1,), distance_matrix (n+1, n+1))`` (fresh copies per
    call). The vehicle returns to the depot without asking when no unvisited customer fits, and at the end."""
    dist = np.asarray(distances, dtype=np.float64)
    demands = np.asarray(demands, dtype=np.int64)
    capacity = int(capacity)
    n = dist.shape[0]
    unvisited = np.ones(n, dtype=bool)
    unvisited[0] = False
    current, rest, seq = 0, capacity, [0]
    while unvisited.any():
        if not (unvisited & (demands <= rest)).any():
            seq.append(0)  # forced return: nothing fits the remaining load
            current, rest = 0, capacity
            continue
        value = fn(current, 0, np.flatnonzero(unvisited).astype(np.int64), rest, demands.copy(), dist.copy())
        nxt = as_index(value, name, n)
        if nxt == 0:
            if current == 0:
                raise InvalidReturn(f"{name} returned the depot while at the depot (an empty route); choose a customer")
            seq.append(0)
            current, rest = 0, capacity
            continue
        if not unvisited[nxt]:
            raise InfeasibleSolution(f"{name} returned customer {nxt}, already served")
        if demands[nxt] > rest:
            raise InfeasibleSolution(
                f"{name} returned customer {nxt} with demand {demands[nxt]} > rest_capacity {rest}: capacity violated"
            )
        unvisited[nxt] = False
        seq.append(nxt)
        current, rest = nxt, rest - int(demands[nxt])
    if seq[-1] != 0:
        seq.append(0)
    return seq

"""Candidate-side construction loop of kp_construct: fill the knapsack by calling ``select_next_item``.

Runs in the candidate's sandboxed process (shipped there as source text; numpy and the standard library
only) or in process for tests. Its output is untrusted: :meth:`KPConstruct.score_solution` checks the
chosen items against the evaluator's own weights and capacity and sums the values itself.
"""

import numpy as np

from coevo.ahd.construct_prelude import InfeasibleSolution, as_index


def construct(fn, weights, values, capacity, name="select_next_item"):
    """Original indices of the items ``fn`` packs, in packing order. ``fn(remaining_capacity, weights (k,),
    values (k,))`` sees the items not taken yet (fresh copies, original order) and returns an index into
    them, or -1 / None to stop; it is called only while some remaining item fits."""
    weights = np.asarray(weights, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    rest = float(capacity)
    remaining = np.arange(weights.shape[0])
    chosen = []
    while remaining.size and (weights[remaining] <= rest).any():
        choice = fn(rest, weights[remaining], values[remaining])
        if choice is None or (
            isinstance(choice, (int, np.integer)) and not isinstance(choice, (bool, np.bool_)) and choice == -1
        ):
            break
        k = as_index(choice, name, remaining.size)
        item = int(remaining[k])
        if weights[item] > rest:
            raise InfeasibleSolution(
                f"{name} chose item {k} of weight {weights[item]:.6g}, which exceeds the remaining capacity {rest:.6g}"
            )
        rest -= weights[item]
        chosen.append(item)
        remaining = np.delete(remaining, k)
    return chosen

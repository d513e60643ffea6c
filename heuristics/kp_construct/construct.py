"""Candidate-side construction loop of kp_construct: fill the knapsack by calling ``select_next_item``.

Runs in the candidate's sandboxed process (shipped there as source text; numpy and the standard library
only) or in process for tests. Its output is untrusted: :meth:`KPConstruct.score_solution` checks the
chosen items against the evaluator's own weights and capacity and sums the values itself.
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
        if isinstance(choice, (bool, np.bool_)):
            raise InvalidReturn(f"{name} returned a bool ({choice!r}); expected an int index")
        try:
            k = operator.index(choice)
        except TypeError:
            raise InvalidReturn(
                f"{name} returned {choice!r:.80} of type {type(choice).__name__}; expected an int index"
            ) from None
        if not 0 <= k < remaining.size:
            raise InvalidReturn(f"{name} returned index {k}, outside [0, {remaining.size})")
        item = int(remaining[k])
        if weights[item] > rest:
            raise InfeasibleSolution(
                f"{name} chose item {k} of weight {weights[item]:.6g}, which exceeds the remaining capacity {rest:.6g}"
            )
        rest -= weights[item]
        chosen.append(item)
        remaining = np.delete(remaining, k)
    return chosen

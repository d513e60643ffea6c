import numpy as np


def select_next_item(remaining_capacity, weights, values):
    """Greedy by value density: among the remaining items that fit, take the one with the highest
    value / weight.

    Args:
        remaining_capacity: float, capacity left in the knapsack.
        weights: np.ndarray (k,) float64, weights of the items not taken yet (a fresh copy per call).
        values: np.ndarray (k,) float64, their values (a fresh copy per call).

    Returns:
        int, an index into ``weights`` / ``values`` of an item that fits, or -1 to stop packing.
    """
    fits = np.flatnonzero(weights <= remaining_capacity)
    if fits.size == 0:
        return -1
    return int(fits[np.argmax(values[fits] / weights[fits])])

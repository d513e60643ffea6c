import numpy as np


def select_next_item(remaining_capacity, weights, values):
    """Choose the next item to pack (template: takes the first remaining item that fits).

    Args:
        remaining_capacity: float, capacity left in the knapsack.
        weights: np.ndarray (k,) float64, weights of the items not taken yet (a fresh copy per call).
        values: np.ndarray (k,) float64, their values (a fresh copy per call).

    Returns:
        int, an index into ``weights`` / ``values`` of an item that fits, or -1 to stop packing.
    """
    fits = np.flatnonzero(weights <= remaining_capacity)
    return int(fits[0]) if len(fits) else -1

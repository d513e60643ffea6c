import numpy as np


def select_next_item(remaining_capacity, weights, values):
    """Capacity-aware blend: score each item that fits by density plus a bonus for value that grows as the knapsack
    fills up (while it is empty, density rules; near the end, the item that uses the last room best).

    A variant of greedy by density (sampler-test parent, coevo).
    """
    fits = np.flatnonzero(weights <= remaining_capacity)
    if fits.size == 0:
        return -1
    density = values[fits] / weights[fits]
    fill = weights[fits] / remaining_capacity
    full = 1.0 - remaining_capacity / (remaining_capacity + weights.sum())
    return int(fits[np.argmax(density / density.max() + full * values[fits] * fill / values[fits].max())])

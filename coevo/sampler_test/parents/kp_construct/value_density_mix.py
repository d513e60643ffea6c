import numpy as np


def select_next_item(remaining_capacity, weights, values):
    """Value and density mix: among the items that fit, take the best half-and-half mix of the item's value and its
    value / weight, each scaled to [0, 1] over the items that fit.

    A variant of greedy by density (sampler-test parent, coevo).
    """
    fits = np.flatnonzero(weights <= remaining_capacity)
    if fits.size == 0:
        return -1
    v = values[fits] / values[fits].max()
    d = values[fits] / weights[fits]
    return int(fits[np.argmax(0.5 * v + 0.5 * d / d.max())])

import numpy as np


def select_next_item(remaining_capacity, weights, values):
    """Greedy by value: among the items that fit, take the most valuable one (a textbook rule, weaker than
    greedy by density).

    Sampler-test parent (coevo).
    """
    fits = np.flatnonzero(weights <= remaining_capacity)
    if fits.size == 0:
        return -1
    return int(fits[np.argmax(values[fits])])

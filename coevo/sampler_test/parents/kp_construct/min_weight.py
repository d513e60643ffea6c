import numpy as np


def select_next_item(remaining_capacity, weights, values):
    """Lightest first: among the items that fit, take the lightest one, so that as many items as possible go in
    (a textbook rule that ignores the values).

    Sampler-test parent (coevo).
    """
    fits = np.flatnonzero(weights <= remaining_capacity)
    if fits.size == 0:
        return -1
    return int(fits[np.argmin(weights[fits])])

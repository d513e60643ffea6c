import numpy as np


def select_next_item(remaining_capacity, weights, values):
    """Square-root density: among the items that fit, take the one with the highest value / sqrt(weight), which
    favours valuable heavy items more than value / weight does.

    A variant of greedy by density (sampler-test parent, coevo).
    """
    fits = np.flatnonzero(weights <= remaining_capacity)
    if fits.size == 0:
        return -1
    return int(fits[np.argmax(values[fits] / np.sqrt(weights[fits]))])

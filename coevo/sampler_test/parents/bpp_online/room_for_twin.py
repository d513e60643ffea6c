import numpy as np


def score(item, bins):
    """Room for a twin: prefer the bin whose room left after the item is closest to the item's own size, so that
    another item like it can still go in; a bin the item fills exactly comes first.

    A variant of Best Fit (sampler-test parent, coevo).
    """
    left = (bins - item).astype(np.float64)
    priority = -np.abs(left - item)
    priority[left == 0] = np.inf
    return priority

import numpy as np


def score(item, bins):
    """Exact fit first: a bin the item fills completely wins; otherwise Best Fit, except that a bin left with a
    sliver of room smaller than the item is penalised (such slivers are rarely filled later).

    A variant of Best Fit (sampler-test parent, coevo).
    """
    left = (bins - item).astype(np.float64)
    priority = -left
    priority[(left > 0) & (left < 0.5 * item)] -= item
    priority[left == 0] = np.inf
    return priority

import numpy as np


def score(item, bins):
    """Worst Fit: put the item into the open bin with the most room left after it; open a new bin only when no
    open bin fits (a textbook rule, weaker than Best Fit). The empty bins are those with the most room.

    Sampler-test parent (coevo).
    """
    left = (bins - item).astype(np.float64)
    empty = bins == bins.max()
    if empty.all():
        return -np.arange(bins.size, dtype=np.float64)
    return np.where(empty, -np.inf, left)

import numpy as np


def score(item, bins):
    """Best Fit: prefer the bin that the item fills most tightly.

    Args:
        item: int, size of the arriving item.
        bins: np.ndarray (k,) int64, remaining capacities of the bins the item fits in (a fresh copy per call);
            it includes empty bins (remaining capacity == bin capacity).

    Returns:
        np.ndarray (k,) float, one priority per bin; the item goes to the bin with the highest priority.
    """
    return -(bins - item).astype(np.float64)

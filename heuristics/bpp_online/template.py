import numpy as np


def score(item, bins):
    """Priority of each bin for the arriving item (template: First Fit, the earliest bin wins).

    Args:
        item: int, size of the arriving item.
        bins: np.ndarray (k,) int64, remaining capacities of the bins the item fits in (a fresh copy per call);
            it includes empty bins (remaining capacity == bin capacity).

    Returns:
        np.ndarray (k,) float, one priority per bin; the item goes to the bin with the highest priority.
    """
    return -np.arange(len(bins), dtype=float)

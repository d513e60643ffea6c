import numpy as np


def score(item, bins):
    """Close nearly full bins, else First Fit: a bin the item leaves with less than 5 % of the capacity free comes
    first (the fuller the better); otherwise the earliest opened bin that fits (the bin with the most room is
    taken as empty, its room as the capacity).

    A mix of Best Fit and First Fit (sampler-test parent, coevo).
    """
    left = (bins - item).astype(np.float64)
    capacity = float(bins.max())
    return np.where(left <= 0.05 * capacity, 1e6 - left, -np.arange(bins.size, dtype=np.float64))

import numpy as np


def score(item, bins):
    """First Fit: put the item into the earliest opened bin it fits in (bins are listed in opening order).

    A textbook online bin-packing rule (sampler-test parent, coevo).
    """
    return -np.arange(bins.size, dtype=np.float64)

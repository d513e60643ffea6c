"""95 % intervals of the sampler test's rates and of its tokens-per-hit ratio.

* :func:`wilson_interval`: the Wilson score interval of a binomial proportion (Wilson 1927; Brown, Cai and
  DasGupta, "Interval estimation for a binomial proportion", Statistical Science 2001, recommend it over the
  normal interval for small n and for rates near 0 or 1);
* :func:`bootstrap_ratio_interval`: the percentile bootstrap (Efron and Tibshirani 1993, ch. 13) of
  ``sum(tokens) / sum(hits)`` over prompts resampled with replacement (a fixed RNG seed: the same data give the
  same interval).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: two-sided 95 % normal quantile
Z95 = 1.959963984540054


def wilson_interval(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of ``hits`` successes in ``n`` trials, as fractions in [0, 1].

    Raises:
        ValueError: ``n < 1`` or ``hits`` outside ``[0, n]``.
    """
    if n < 1 or not 0 <= hits <= n:
        raise ValueError(f"wilson_interval needs 0 <= hits <= n and n >= 1, got hits={hits}, n={n}")
    p = hits / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_ratio_interval(
    tokens: Sequence[float], hits: Sequence[int], *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of ``sum(tokens) / sum(hits)`` (e.g. completion tokens per valid-and-new
    answer), resampling the prompts (pairs ``(tokens[i], hits[i])``) with replacement.

    A resample without a hit has an infinite ratio; an upper bound that is infinite is returned as None
    (unbounded), and both bounds are None without a hit in the data.

    Raises:
        ValueError: sequences of different lengths, or empty.
    """
    import numpy as np

    t = np.asarray(tokens, dtype=np.float64)
    h = np.asarray(hits, dtype=np.float64)
    if t.shape != h.shape or t.size == 0:
        raise ValueError(f"bootstrap_ratio_interval needs two equal, non-empty sequences, got {t.size} and {h.size}")
    if h.sum() == 0:
        return None, None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, t.size, size=(resamples, t.size))
    num, den = t[idx].sum(axis=1), h[idx].sum(axis=1)
    ratio = np.where(den > 0, num / np.maximum(den, 1), np.inf)
    lo, hi = np.quantile(ratio, [(1 - level) / 2, 1 - (1 - level) / 2], method="inverted_cdf")
    return float(lo), (float(hi) if math.isfinite(hi) else None)

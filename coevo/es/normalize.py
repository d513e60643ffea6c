"""Fitness shaping: raw member rewards -> update coefficients.

Methods:
  * ``"zscore"`` (Agentic-ESOpt default, docs/references.md §1 step 4): ``z_i = (R_i - mean R) / (std R + eps)``
    with the population standard deviation (ddof 0). All-equal rewards give exact zeros.
  * ``"centered_rank"`` (Salimans et al. 2017, "Evolution Strategies as a Scalable Alternative to
    Reinforcement Learning", §2.2 fitness shaping): ranks ``0..n-1`` scaled to ``[-0.5, 0.5]`` as
    ``rank / (n - 1) - 0.5``. Tied rewards share their average rank (OpenAI's code breaks ties by
    position), so that equal rewards get equal coefficients and an antithetic pair with equal rewards
    cancels exactly. A single member gets 0.
  * ``"none"``: the raw rewards.

Antithetic pairs need no separate "pairwise" form: ``coevo.es.update.es_update`` folds members sharing a
seed into one coefficient ``sum_i sign_i * c_i``, i.e. ``c(+) - c(-)`` per pair, which is the mirrored
sampling estimator of Salimans et al. 2017 (§2.2) with the chosen shaping applied over all 2P members.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

METHODS = ("zscore", "centered_rank", "none")


def centered_ranks(rewards: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions) scaled to ``[-0.5, 0.5]``.

    Args:
        rewards: float array of shape ``(n,)``.

    Returns:
        float64 array of shape ``(n,)``; the lowest reward gets -0.5, the highest +0.5.
    """
    n = rewards.shape[0]
    if n == 1:
        return np.zeros(1)
    order = np.argsort(rewards, kind="stable")
    sorted_r = rewards[order]
    ranks = np.empty(n, dtype=np.float64)
    start = 0
    for stop in range(1, n + 1):
        if stop == n or sorted_r[stop] != sorted_r[start]:
            ranks[order[start:stop]] = (start + stop - 1) / 2.0  # mean of positions start..stop-1
            start = stop
    return ranks / (n - 1) - 0.5


def normalize_rewards(rewards: Sequence[float] | np.ndarray, method: str = "zscore", eps: float = 1e-8) -> np.ndarray:
    """Shape the rewards of one generation (higher is better) into update coefficients.

    Args:
        rewards: shape ``(n,)``, n >= 1, finite floats.
        method: ``"zscore"``, ``"centered_rank"`` or ``"none"`` (module docstring).
        eps: added to the standard deviation in ``zscore`` (> 0).

    Returns:
        float64 array of shape ``(n,)``.

    Raises:
        ValueError: unknown method, empty / non-1-D / non-finite rewards, eps <= 0.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"rewards must be a non-empty 1-D sequence, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError(f"rewards must be finite (score invalid samples before shaping), got {r.tolist()}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if method == "zscore":
        if np.all(r == r[0]):  # exact zeros (r - mean(r) can be 1 ulp off for equal rewards)
            return np.zeros_like(r)
        return (r - r.mean()) / (r.std(ddof=0) + eps)
    if method == "centered_rank":
        return centered_ranks(r)
    return r.copy()

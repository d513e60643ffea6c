"""Schedules for sigma (and optionally alpha) over ES generations ``t = 0 .. total - 1``.

Kinds, for the decay phase ``u = t - warmup`` of length ``T = total - 1 - warmup``:
  * ``constant``: ``start``;
  * ``linear``:   ``start + (end - start) * u / T``;
  * ``cosine``:   ``end + (start - end) * (1 + cos(pi * u / T)) / 2`` (Agentic-ESOpt, docs/references.md §1 step 1;
    the SGDR annealing of Loshchilov & Hutter 2017, eq. 5).
Both decays give exactly ``start`` at the first decay step and exactly ``end`` at the last (``t = total-1``).
When ``T == 0`` (a single decay step) the value is ``start``.

Warm-up (optional, ``warmup`` steps before the decay): a linear ramp from 0 that never reaches 0 itself,
``start * (t + 1) / (warmup + 1)`` for ``t < warmup``; the decay phase then begins at ``start``. (A ramp
value of 0 would make that generation's update a no-op, see ``coevo.es.update``.)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

KINDS = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class Schedule:
    """A scalar schedule over ``total`` generations.

    Attributes:
        kind: ``"constant"``, ``"linear"`` or ``"cosine"``.
        start: value at the first decay step (>= 0, finite).
        end: value at the last step (>= 0, finite); ignored by ``constant`` (defaults to ``start``).
        total: number of generations (>= 1).
        warmup: warm-up steps (0 <= warmup < total).

    Raises:
        ValueError: on construction, for any field out of range (the message names it).
    """

    kind: str = "cosine"
    start: float = 1e-3
    end: float | None = None
    total: int = 1
    warmup: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        end = self.start if self.end is None else self.end
        for fname, v in (("start", self.start), ("end", end)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{fname} must be a finite number >= 0, got {v!r}")
        object.__setattr__(self, "end", float(end))
        object.__setattr__(self, "start", float(self.start))
        if not isinstance(self.total, int) or self.total < 1:
            raise ValueError(f"total must be an int >= 1, got {self.total!r}")
        if not isinstance(self.warmup, int) or not 0 <= self.warmup < self.total:
            raise ValueError(f"warmup must be an int with 0 <= warmup < total={self.total}, got {self.warmup!r}")

    def __call__(self, t: int) -> float:
        """Value at generation ``t`` (0 <= t < total). Raises ValueError outside that range."""
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.total:
            raise ValueError(f"generation t must be an int in [0, {self.total}), got {t!r}")
        if t < self.warmup:
            return self.start * (t + 1) / (self.warmup + 1)
        u, span = t - self.warmup, self.total - 1 - self.warmup
        if self.kind == "constant" or span == 0 or u == 0:
            return self.start
        if u == span:
            return self.end
        if self.kind == "linear":
            return self.start + (self.end - self.start) * u / span
        return self.end + (self.start - self.end) * (1.0 + math.cos(math.pi * u / span)) / 2.0

    def values(self) -> list[float]:
        """``[self(t) for t in range(total)]``."""
        return [self(t) for t in range(self.total)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schedule:
        unknown = set(d) - {"kind", "start", "end", "total", "warmup"}
        if unknown:
            raise ValueError(f"unknown schedule keys {sorted(unknown)}")
        return cls(**d)

"""Run budgets: LLM samples, rounds, wall clock.

The sample count is never kept in a separate counter: it is the sum of ``llm_calls`` over the run's
trajectories in the store. Every LLM call, valid or failed or unparsable, is recorded as (part of) a
trajectory, so the count is exact after a crash and a resume cannot reset it (the failure kind in
docs/references.md §2 where a budget ignoring failed samples let a run make 75k calls).

The wall clock is checked by the loop before every step and, through the run context
(:meth:`coevo.evolvers.base.RunContext.sample_boundary`), before every LLM call inside a step; inside a call,
the backends stop decoding at :meth:`Budget.deadline` (the loop enters
:func:`coevo.backends.base.decode_deadline` around every step), so a batch that would run past ``max_wall_s``
is cut there instead of finishing. A cut batch is not charged to the sample budget (no trajectory holds it);
the loop records it as cut (artifact ``step_cut``) and the step re-runs, drawing the batch again with the same
seeds, on resume. The wall time of a cut session is charged: a resumed run starts from the later of its
checkpoint's and its last cut's wall time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coevo.store import TrajectoryStore


@dataclass
class Budget:
    """Budget state of one run.

    Attributes:
        max_samples: LLM samples allowed over the run (None = unlimited).
        max_rounds: loop rounds allowed.
        max_wall_s: wall-clock seconds allowed, summed over resumed sessions (None = unlimited).
        wall_used_s: wall seconds used by earlier sessions of this run (restored from the checkpoint, or from the
            last cut step when it is later: module docstring).
    """

    store: TrajectoryStore
    run_id: str
    max_samples: int | None = None
    max_rounds: int | None = None
    max_wall_s: float | None = None
    wall_used_s: float = 0.0
    _session_start: float = field(default_factory=time.monotonic)

    def samples_used(self) -> int:
        """LLM samples consumed so far (from the store; failed samples included)."""
        return self.store.count_llm_calls(self.run_id)

    def text_calls_used(self) -> int:
        """Of :meth:`samples_used`, the free-text calls (reflections, critiques: :func:`coevo.types.is_text`)."""
        from coevo.types import is_text

        return sum(t.llm_calls for t in self.store.query(run_id=self.run_id, with_steps=False) if is_text(t))

    def remaining(self) -> int | None:
        """Samples left (>= 0), or None when unlimited."""
        if self.max_samples is None:
            return None
        return max(0, self.max_samples - self.samples_used())

    def allow(self, n: int) -> int:
        """How many of ``n`` requested samples may be drawn now (0 when exhausted)."""
        rem = self.remaining()
        return n if rem is None else min(n, rem)

    def wall_elapsed(self) -> float:
        """Wall seconds used by the run so far, over all sessions."""
        return self.wall_used_s + (time.monotonic() - self._session_start)

    def deadline(self) -> float | None:
        """When the wall-clock budget runs out, in this session's ``time.monotonic()`` seconds (None: unlimited);
        may be in the past."""
        if self.max_wall_s is None:
            return None
        return self._session_start + (self.max_wall_s - self.wall_used_s)

    def wall_exhausted(self) -> str | None:
        """The reason the wall-clock budget stops the run, or None (unlimited or time left)."""
        if self.max_wall_s is not None and self.wall_elapsed() >= self.max_wall_s:
            return self.wall_reason()
        return None

    def wall_reason(self) -> str:
        """``wall-clock budget reached (903 s of budget.max_wall_s = 900 s)``: the stop line's budget part."""
        return f"wall-clock budget reached ({self.wall_elapsed():.0f} s of budget.max_wall_s = {self.max_wall_s:.0f} s)"

    def sample_exhausted(self) -> str | None:
        """The reason the sample budget stops the LLM steps of the run, or None (unlimited or samples left)."""
        if self.max_samples is not None and self.samples_used() >= self.max_samples:
            return f"sample budget reached ({self.samples_used()}/{self.max_samples} LLM samples)"
        return None

    def exhausted(self, next_round: int | None = None) -> str | None:
        """The reason the run must stop, or None.

        Args:
            next_round: index of the round about to start (checked against ``max_rounds``).
        """
        samples = self.sample_exhausted()
        if samples:
            return samples
        wall = self.wall_exhausted()
        if wall:
            return wall
        if next_round is not None and self.max_rounds is not None and next_round >= self.max_rounds:
            return f"round budget reached ({self.max_rounds} rounds)"
        return None

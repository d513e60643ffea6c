"""The run context: what a run shares with its evolvers and rollouts.

One :class:`RunContext` per run, built by the loop (:class:`coevo.loop.CoEvolutionLoop`) and handed to every
evolver (``Evolver(name, config, ctx)``) and rollout (``Rollout(config, ctx)``). It sits below both, so
rollouts need not import the evolvers package. See :mod:`coevo.evolvers.base` for the resume contract
(deterministic keys, :meth:`RunContext.cached`).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.types import Trajectory

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.budget import Budget
    from coevo.store import TrajectoryStore


@dataclass
class RunContext:
    """Everything an evolver may use, shared by all evolvers of a run.

    Attributes:
        run_id: id of the run (the run folder's name).
        run_dir: the run folder.
        store: the shared trajectory store (single writer: the loop's process).
        budget: the run's sample budget; evolvers call ``budget.remaining()`` before sampling.
        policy_factory: returns the run's policy (created once, lazily); ``None`` when the run has none.
        shared: small JSON-serialisable board for cross-evolver state, saved with checkpoints
            (e.g. ``shared["skill_version"]`` published by a skill evolver and read by ES rollouts).
        evolvers: the run's evolvers (:class:`coevo.evolvers.Evolver`) by name, for evolvers and rollouts
            that cooperate (e.g. ES members writing EoH children through EoH's sampler).
        seed: the run's base seed.
        round: the current round (set by the loop).
        sampling: the run's default decoding settings (``coevo.config.SamplingConfig``), see
            :meth:`sampling_params`.
        progress: called as ``progress(kind, n)`` on progress inside a step (set by the loop, may be None):
            ``"sampling"`` (n LLM samples about to be drawn), ``"samples"`` (n drawn) and ``"trajectories"``
            (n new trajectories recorded, e.g. evaluated candidates). See :meth:`report_progress`.
        stop_requested: why the run should stop at the next sample boundary (set by :meth:`request_stop`,
            e.g. on SIGINT), or None.

    Sample boundaries: the policy returned by :attr:`policy` (and any policy passed through
    :meth:`observe`) calls :meth:`sample_boundary` before each ``generate`` / ``logprob`` call and reports
    the samples it drew; evolvers that draw samples another way call :meth:`sample_boundary` themselves.
    """

    run_id: str
    run_dir: Path
    store: TrajectoryStore
    budget: Budget
    policy_factory: Callable[[], Policy] | None = None
    shared: dict[str, Any] = field(default_factory=dict)
    evolvers: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    round: int = 0
    sampling: Any = None
    progress: Callable[[str, int], None] | None = None
    stop_requested: tuple[str, int] | None = None
    _policy: Policy | None = None

    @property
    def policy(self) -> Policy:
        """The run's policy, created on first use and observed (:meth:`observe`).

        Raises:
            ConfigError: when the run config has no model.
        """
        if self._policy is None:
            if self.policy_factory is None:
                from coevo.errors import ConfigError

                raise ConfigError("this run has no model configured (config field `model`)")
            self._policy = self.observe(self.policy_factory())
        return self._policy

    @property
    def policy_loaded(self) -> bool:
        """Whether the run's policy has been created (first use of :attr:`policy`)."""
        return self._policy is not None

    def close_policy(self) -> None:
        """Release the run's policy if it was created (engines, clients); a later use creates it again."""
        if self._policy is not None:
            policy, self._policy = self._policy, None
            policy.close()

    def observe(self, policy: Policy) -> Policy:
        """Make ``policy`` call :meth:`sample_boundary` before, and :meth:`report_progress` after, each
        ``generate(conversations, ...)`` and ``logprob(conversations, ...)`` call (one sample per
        conversation). The methods are wrapped on the instance, so ``isinstance`` checks and every other
        attribute are unchanged; observing twice is a no-op, and a policy observed by another (earlier) run
        context is re-wrapped from its original methods, never wrapped twice. Returns ``policy``."""
        if getattr(policy, "_observed_by", None) is self:
            return policy
        originals = policy.__dict__.get("_unobserved")  # a policy shared with an earlier run context
        if originals is None:
            originals = {n: getattr(policy, n) for n in ("generate", "logprob") if callable(getattr(policy, n, None))}
            policy._unobserved = originals  # type: ignore[attr-defined]
        for name, inner in originals.items():
            setattr(policy, name, self._observed(inner))
        policy._observed_by = self  # type: ignore[attr-defined]
        return policy

    def _observed(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(inner)
        def call(conversations, *args: Any, **kwargs: Any):
            n = len(conversations)
            self.sample_boundary(n)
            out = inner(conversations, *args, **kwargs)
            self.report_progress("samples", n)
            return out

        return call

    def request_stop(self, reason: str, signum: int = 0) -> None:
        """Ask the run to stop: the next :meth:`sample_boundary` raises :class:`~coevo.errors.RunInterrupted`,
        and the loop stops before the next step (e.g. from a SIGINT handler)."""
        if self.stop_requested is None:
            self.stop_requested = (reason, signum)

    def sample_boundary(self, n: int = 1) -> None:
        """Called before drawing ``n`` LLM samples inside a step: a safe point to end the step.

        Raises:
            RunInterrupted: a stop was requested (:meth:`request_stop`).
            BudgetExhausted: the wall-clock budget is spent (the sample budget is enforced by
                ``budget.allow`` instead, which evolvers call before sampling).
        """
        from coevo.errors import BudgetExhausted, RunInterrupted

        if self.stop_requested is not None:
            raise RunInterrupted(*self.stop_requested)
        wall = self.budget.wall_exhausted()
        if wall:
            raise BudgetExhausted(wall)
        self.report_progress("sampling", n)

    def report_progress(self, kind: str, n: int = 1) -> None:
        """Tell the progress display that ``n`` things of ``kind`` happened ("sampling", "samples",
        "trajectories"); a no-op without a display."""
        if self.progress is not None and n:
            self.progress(kind, n)

    def sampling_params(self, **overrides: Any):
        """The run's decoding settings as :class:`~coevo.backends.base.SamplingParams`, with overrides."""
        from coevo.backends.base import SamplingParams

        base = self.sampling.model_dump() if self.sampling is not None else {}
        base.update({k: v for k, v in overrides.items() if v is not None})
        if "stop" in base:
            base["stop"] = tuple(base["stop"])
        return SamplingParams(**base)

    def cached(self, key: str) -> Trajectory | None:
        """The stored trajectory with this idempotency key, or None (resume contract: :mod:`coevo.evolvers.base`)."""
        return self.store.get_by_key(key)

    def record(self, trajectory: Trajectory) -> Trajectory:
        """Store a trajectory (idempotent); its ``llm_calls`` count against the budget once.

        Returns the stored trajectory (the earlier copy if the key already existed).
        """
        stored, inserted = self.store.add_trajectory(trajectory)
        if inserted:
            self.report_progress("trajectories", 1)
        return stored

    def traj_key(self, evolver: str, *parts: object) -> str:
        """Deterministic idempotency key: ``run/evolver/part/part/...``."""
        return "/".join([self.run_id, evolver, *map(str, parts)])

    def rng(self, *parts: object) -> random.Random:
        """A deterministic RNG keyed by the run seed and ``parts`` (stable across resumes)."""
        return random.Random("/".join([str(self.seed), *map(str, parts)]))

"""The run context: what a run shares with its evolvers and rollouts.

One :class:`RunContext` per run, built by the loop (:class:`coevo.loop.CoEvolutionLoop`) and handed to every
evolver (``Evolver(name, config, ctx)``) and rollout (``Rollout(config, ctx)``). It sits below both, so
rollouts need not import the evolvers package. See :mod:`coevo.evolvers.base` for the resume contract
(deterministic keys, :meth:`RunContext.cached`).
"""

from __future__ import annotations

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
    _policy: Policy | None = None

    @property
    def policy(self) -> Policy:
        """The run's policy, created on first use.

        Raises:
            RuntimeError: when the run config has no model.
        """
        if self._policy is None:
            if self.policy_factory is None:
                raise RuntimeError("this run has no model configured (config field `model`)")
            self._policy = self.policy_factory()
        return self._policy

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
        stored, _inserted = self.store.add_trajectory(trajectory)
        return stored

    def traj_key(self, evolver: str, *parts: object) -> str:
        """Deterministic idempotency key: ``run/evolver/part/part/...``."""
        return "/".join([self.run_id, evolver, *map(str, parts)])

    def rng(self, *parts: object) -> random.Random:
        """A deterministic RNG keyed by the run seed and ``parts`` (stable across resumes)."""
        return random.Random("/".join([str(self.seed), *map(str, parts)]))

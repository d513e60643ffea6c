"""The evolver API: a small base class and an explicit registry.

An evolver owns one space ("parameter" or "context"). The :class:`~coevo.loop.CoEvolutionLoop` calls
:meth:`Evolver.step` once per scheduled slot; a step reads pooled trajectories from the shared store and
writes new ones. Evolvers are registered by name (``@register_evolver("eoh")``) so that a run config can
say ``type: eoh``; users register their own with the decorator, with a ``coevo.evolvers`` entry point, or
by giving a dotted path (``type: mypkg.mod:MyEvolver``) in the config.

Resume contract: after every step the loop saves :meth:`Evolver.state_dict` (JSON) and calls
:meth:`Evolver.save_checkpoint` (large state such as weights). A step that was interrupted is re-run from
the last checkpoint; trajectories carry deterministic keys, and :meth:`RunContext.cached` returns the
stored trajectory for a key that exists, so a re-run neither loses nor duplicates samples nor re-charges
the budget.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from coevo.registry import Registry
from coevo.types import Space, Trajectory

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.budget import Budget
    from coevo.store import TrajectoryStore


class EvolverConfig(BaseModel):
    """Base of every evolver's config. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class StepReport:
    """What one evolver step did (shown in progress bars and the run report).

    Attributes:
        samples: LLM samples consumed by this step (valid or not).
        trajectories: trajectories written.
        best_reward: best reward seen in this step (higher is better), or None.
        metrics: scalar metrics to plot (e.g. {"mean_reward": .., "best_objective": ..}).
        stop: the evolver asks the loop to stop (e.g. search converged or cannot continue); ``stop_reason``
            says why.
    """

    samples: int = 0
    trajectories: int = 0
    best_reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    stop: bool = False
    stop_reason: str | None = None


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
        evolvers: the run's evolvers by name, for evolvers that cooperate (e.g. ES generating EoH children).
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
    evolvers: dict[str, Evolver] = field(default_factory=dict)
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
        """The stored trajectory with this idempotency key, or None (see the module's resume contract)."""
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


class Evolver(ABC):
    """Base class of all evolvers.

    Subclasses set ``space`` and ``Config`` (a subclass of :class:`EvolverConfig`) and implement
    :meth:`step`. Constructed by the loop as ``cls(name, config, ctx)``.
    """

    space: ClassVar[Space]
    Config: ClassVar[type[EvolverConfig]] = EvolverConfig
    #: registry name, set by :func:`register_evolver`
    type_name: ClassVar[str] = ""

    def __init__(self, name: str, config: EvolverConfig, ctx: RunContext):
        self.name = name
        self.config = config
        self.ctx = ctx

    @abstractmethod
    def step(self, round_index: int) -> StepReport:
        """Run one step: read pooled trajectories from ``self.ctx.store``, write new ones.

        Must be safe to re-run after a crash (use deterministic keys and ``ctx.cached``).
        """

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state needed to resume (default: none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def save_checkpoint(self, directory: Path) -> None:
        """Write large state (e.g. weights) into ``directory`` (default: nothing)."""

    def load_checkpoint(self, directory: Path) -> None:
        """Read what :meth:`save_checkpoint` wrote."""

    def report_markdown(self) -> str | None:
        """A Markdown section for the run report (tables of this evolver's results), or None."""
        return None

    def close(self) -> None:
        """Release resources at the end of the run."""


EVOLVERS: Registry[Evolver] = Registry(
    "evolver type", Evolver, package="coevo.evolvers", entry_point_group="coevo.evolvers", name_attr="type_name"
)


def register_evolver(name: str) -> Callable[[type[Evolver]], type[Evolver]]:
    """Class decorator registering an evolver under ``name`` (the config's ``type``).

    Raises:
        ValueError: if another class is already registered under ``name``.
        TypeError: the class does not subclass :class:`Evolver`.
    """
    return EVOLVERS.register(name)


def registered_evolvers() -> dict[str, type[Evolver]]:
    """All evolver types: built-ins (every module of :mod:`coevo.evolvers`), classes registered by imported
    code, then ``coevo.evolvers`` entry points (loaded lazily, errors raised)."""
    return EVOLVERS.items()


def resolve_evolver(type_name: str) -> type[Evolver]:
    """Find the evolver class for a config's ``type``: a registered name, an entry point or ``pkg.module:Class``.

    Raises:
        ValueError: unknown name (the message lists the known ones) or a dotted path that does not name
            an Evolver subclass.
    """
    return EVOLVERS.resolve(type_name)

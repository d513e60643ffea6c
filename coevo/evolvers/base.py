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

import functools
import importlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

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
    evolvers: dict[str, Evolver] = field(default_factory=dict)
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
        """The stored trajectory with this idempotency key, or None (see the module's resume contract)."""
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


_REGISTRY: dict[str, type[Evolver]] = {}
ENTRY_POINT_GROUP = "coevo.evolvers"


def register_evolver(name: str) -> Callable[[type[Evolver]], type[Evolver]]:
    """Class decorator registering an evolver under ``name`` (the config's ``type``).

    Raises:
        ValueError: if another class is already registered under ``name``.
    """

    def deco(cls: type[Evolver]) -> type[Evolver]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"evolver type {name!r} already registered by {_REGISTRY[name].__qualname__}")
        if not issubclass(cls, Evolver):
            raise TypeError(f"{cls!r} must subclass coevo.evolvers.Evolver")
        cls.type_name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def registered_evolvers() -> dict[str, type[Evolver]]:
    """All evolver types: built-ins, then ``coevo.evolvers`` entry points (loaded lazily, errors raised)."""
    _load_builtins()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _REGISTRY:
            cls = ep.load()
            register_evolver(ep.name)(cls)
    return dict(_REGISTRY)


def resolve_evolver(type_name: str) -> type[Evolver]:
    """Find the evolver class for a config's ``type``: a registered name or ``pkg.module:Class``.

    Raises:
        ValueError: unknown name (the message lists the known ones) or a dotted path that does not name
            an Evolver subclass.
    """
    if ":" in type_name or (type_name.count(".") >= 1 and type_name not in _REGISTRY):
        mod_name, _, attr = type_name.replace(":", ".").rpartition(".")
        try:
            cls = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"evolver type {type_name!r}: cannot import it ({exc})") from exc
        if not (isinstance(cls, type) and issubclass(cls, Evolver)):
            raise ValueError(f"evolver type {type_name!r} is not a subclass of coevo.evolvers.Evolver")
        return cls
    known = registered_evolvers()
    if type_name not in known:
        raise ValueError(f"unknown evolver type {type_name!r}; known types: {sorted(known)}")
    return known[type_name]


_BUILTIN_MODULES = (
    "coevo.evolvers.es",
    "coevo.evolvers.eoh",
    "coevo.evolvers.sampling",
    "coevo.evolvers.trace2skill",
)


def _load_builtins() -> None:
    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)

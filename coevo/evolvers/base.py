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
the budget. (:class:`~coevo.context.RunContext` lives in :mod:`coevo.context`, below the rollouts that use
it too; it is re-exported here.)

Report sections: at the end of a run the loop calls :func:`record_report_sections`, which stores each
evolver's :meth:`Evolver.report_markdown` in the run's store; the run report (:mod:`coevo.report`) only
reads the store, so ``coevo runs show RUN --report`` rebuilds the same report later.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from coevo.artifacts import REPORT_SECTION
from coevo.context import RunContext
from coevo.registry import Registry
from coevo.types import Space

if TYPE_CHECKING:
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
        reward_unit: what ``best_reward`` measures, with its unit (e.g. ``"heuristic score: -tour length"``);
            None lets the report name it by the evolver's space (parameter space: the ES member reward).
        metrics: scalar metrics to plot (e.g. {"mean_reward": .., "best_objective": ..}).
        stop: the evolver asks the loop to stop (e.g. search converged or cannot continue); ``stop_reason``
            says why.
    """

    samples: int = 0
    trajectories: int = 0
    best_reward: float | None = None
    reward_unit: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    stop: bool = False
    stop_reason: str | None = None


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


def record_report_sections(store: TrajectoryStore, run_id: str, evolvers: dict[str, Evolver]) -> int:
    """Store each evolver's report section (``kind="report_section"``, name ``<run id>/<evolver>``) when it
    differs from the stored one; returns how many were written."""
    written = 0
    for name, ev in evolvers.items():
        section = ev.report_markdown()
        if not section:
            continue
        latest = store.get_artifact(REPORT_SECTION, f"{run_id}/{name}")
        if latest is None or latest.content.get("markdown") != section:
            store.put_artifact(run_id, REPORT_SECTION, f"{run_id}/{name}", {"evolver": name, "markdown": section})
            written += 1
    return written

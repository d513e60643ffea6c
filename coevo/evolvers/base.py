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

Wiring: the loop constructs every evolver (``ctx.evolvers`` is empty inside ``__init__``), then calls each
evolver's :meth:`Evolver.setup` once all exist (check and look up cooperating evolvers there), then restores
checkpoints. Cross-evolver checks that need only the config belong in :meth:`EvolverConfig.link`, which
:func:`coevo.config.parse_config` calls for every evolver before anything is built.

Scoring a candidate context: :func:`score_context` rolls a policy out under a candidate context (pinned on the
rollout) and records the trajectories once, cached by key for resume; ``ESEvolver.score_context`` calls it
with the ES centre.

Plug-ins: for an evolver class defined outside coevo (:func:`plugin_label`), the loop turns an exception from its
constructor, ``setup``, ``step``, ``state_dict`` / ``load_state_dict`` or checkpoint methods, a malformed step
report (:func:`step_report_problem`) or a state that is not JSON into one :class:`~coevo.errors.PluginError` line
naming the evolver, the class, its file and the method; states are taken before a checkpoint is begun, so the
last checkpoint and the store stay as they were.

Report sections: at the end of a run the loop calls :func:`record_report_sections`, which stores each
evolver's :meth:`Evolver.report_markdown` in the run's store; the run report (:mod:`coevo.report`) only
reads the store, so ``coevo runs show RUN --report`` rebuilds the same report later.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ConfigDict

from coevo.artifacts import CONTEXT_SCORE, REPORT_SECTION
from coevo.context import ContextValue, RunContext
from coevo.registry import Registry
from coevo.schema import ConfigModel
from coevo.types import Space, Trajectory

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.rollouts.base import Rollout
    from coevo.store import TrajectoryStore


class EvolverConfig(ConfigModel):
    """Base of every evolver's config. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    def link(self, name: str, run_config: Any) -> list[str]:
        """Cross-evolver checks against the whole run config (``coevo.config.RunConfig``, every evolver's params
        validated), called by :func:`coevo.config.parse_config` before anything is built; may fill in derived
        fields. Returns field-named errors (``evolvers.<name>.<field>: ...``); default none."""
        return []


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


def step_report_problem(report: Any) -> str | None:
    """What is wrong with ``report`` as an :class:`StepReport` returned by a step (its type, a count that is not
    an int >= 0, a reward or metric that is not a number, a stop flag that is not a bool), or None when it is
    well-formed. The loop stores reports as JSON and sums their counts, so it checks every step's."""
    if not isinstance(report, StepReport):
        return f"returned {type(report).__name__}, not a StepReport"

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    for name in ("samples", "trajectories"):
        v = getattr(report, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return f"returned a StepReport whose {name} is {v!r}, not an int >= 0"
    if report.best_reward is not None and not number(report.best_reward):
        return f"returned a StepReport whose best_reward is {report.best_reward!r}, not a number or None"
    if not isinstance(report.metrics, dict):
        return f"returned a StepReport whose metrics is {type(report.metrics).__name__}, not a dict"
    for k, v in report.metrics.items():
        if not isinstance(k, str) or not isinstance(v, (int, float)):  # bool too: a flag plots as 0 / 1
            return f"returned a StepReport whose metrics[{k!r}] is {v!r}, not a number"
    if not isinstance(report.stop, bool):
        return f"returned a StepReport whose stop is {report.stop!r}, not a bool"
    for name in ("reward_unit", "stop_reason"):
        v = getattr(report, name)
        if v is not None and not isinstance(v, str):
            return f"returned a StepReport whose {name} is {v!r}, not a string or None"
    return None


def plugin_label(cls: type) -> str | None:
    """``module:Class (file)`` of an evolver class defined outside the coevo package (a user's plugin), or None
    for coevo's own classes."""
    import sys

    mod = cls.__module__
    if mod == "coevo" or mod.startswith("coevo."):
        return None
    file = getattr(sys.modules.get(mod), "__file__", None)
    return f"{mod}:{cls.__qualname__}" + (f" ({file})" if file else "")


class Evolver(ABC):
    """Base class of all evolvers.

    Subclasses set ``space`` and ``Config`` (a subclass of :class:`EvolverConfig`) and implement
    :meth:`step`. Constructed by the loop as ``cls(name, config, ctx)``.
    """

    space: ClassVar[Space]
    Config: ClassVar[type[EvolverConfig]] = EvolverConfig
    #: registry name, set by :func:`register_evolver`
    type_name: ClassVar[str] = ""
    #: whether a step may draw LLM samples; a token-free evolver (False, e.g. ``tune``) still runs its steps
    #: due in the round in which the sample budget ran out (the loop then stops)
    uses_llm: ClassVar[bool] = True

    def __init__(self, name: str, config: EvolverConfig, ctx: RunContext):
        self.name = name
        self.config = config
        self.ctx = ctx

    def setup(self) -> None:
        """Called once by the loop after every evolver of the run exists (``ctx.evolvers`` filled), before
        checkpoints are restored and before the first step: look up and check cooperating evolvers here.

        Raises:
            ConfigError: a wiring the run cannot work with (named by field), so it fails before any step.
        """

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

    def release(self) -> None:
        """Stop the processes this evolver started (engines, Ray actors) without writing anything; the loop calls
        it on every exit of a run (finished, interrupted or failed), after :meth:`close` on a finished one."""


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


@dataclass
class ContextScore:
    """What :func:`score_context` measured: ``score`` (the rollout's member reward under the candidate
    context) and the recorded ``trajectories``."""

    score: float
    trajectories: list[Trajectory]


def score_context(
    ctx: RunContext,
    rollout: Rollout,
    values: Mapping[str, Any],
    *,
    evolver: str,
    key_prefix: str,
    split: str = "train",
    generation: int = 0,
    round_index: int | None = None,
    policy: Policy | None = None,
) -> ContextScore | None:
    """Roll ``policy`` (default ``ctx.policy``) out with ``values`` pinned on ``rollout`` and record the result
    once: a call with a ``key_prefix`` already scored returns the stored trajectories and score (a
    ``context_score`` artifact under that prefix) without sampling.

    Args:
        values: context key -> candidate value (recorded with version -1: not published) or a
            :class:`~coevo.context.ContextValue` (e.g. the current one, to score it too); keys the rollout
            does not declare are ignored, undeclared ones keep their current published versions.
        evolver: the calling evolver (owner of the trajectories, its space).
        key_prefix: unique per candidate and case set (build it with ``ctx.traj_key``).
        split, generation: which cases (the rollout's ``run`` arguments).

    Returns:
        The score and the trajectories, or None when the sample budget cannot pay for ``rollout.n_cases``.
    """
    art = ctx.store.get_artifact(CONTEXT_SCORE, key_prefix)
    if art is not None:
        stored = [ctx.cached(k) for k in art.content["keys"]]
        if all(t is not None for t in stored):
            return ContextScore(float(art.content["score"]), stored)  # type: ignore[arg-type]
    need = rollout.n_cases(split) or 1
    if ctx.budget.allow(need) < need:
        return None
    declared = rollout.declared_context()
    pinned = {
        k: v if isinstance(v, ContextValue) else ContextValue(k, -1, v) for k, v in values.items() if k in declared
    }
    with rollout.pinned_context(pinned):
        versions = dict(rollout.current_context().versions)
        trajs = rollout.run(
            policy if policy is not None else ctx.policy,
            generation=generation,
            member=None,
            key_prefix=key_prefix,
            split=split,
            evolver=evolver,
            round_index=ctx.round if round_index is None else round_index,
        )
    for t in trajs:
        t.run_id = t.run_id or ctx.run_id
    stored = [ctx.record(t) for t in trajs]
    score = float(rollout.member_reward(stored))
    ctx.store.put_artifact(
        ctx.run_id,
        CONTEXT_SCORE,
        key_prefix,
        {
            "keys": [t.key for t in stored],
            "score": score,
            "versions": versions,
            "split": split,
            "generation": generation,
        },
        key=f"{CONTEXT_SCORE}/{key_prefix}",
    )
    return ContextScore(score, stored)

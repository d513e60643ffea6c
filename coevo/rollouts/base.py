"""The rollout API used by the ES evolver (and by held-out evaluation).

A rollout runs the policy on a batch of task cases and returns one :class:`~coevo.types.Trajectory` per
case (or per episode); :meth:`Rollout.member_reward` reduces a member's trajectories to the scalar R_i that
ES normalises (Agentic ESOpt, docs/references.md §1 step 3: the mean task reward over the member's batch).

Rollouts do not write to the store: the caller records what they return. They build deterministic keys with
the ``key_prefix`` they are given, and a caller that resumes may skip cases whose key is already stored.

Context: a rollout declares the context slots it reads (:attr:`Rollout.context_slots`, e.g. ``system_prompt``);
each slot reads the published context key of the same name (``ctx.publish(key, value)``, :mod:`coevo.context`)
unless the config's ``context_keys`` maps it to another key. :meth:`Rollout.current_context` resolves them:
a pinned value (:meth:`Rollout.pinned_context`: what a Ray job carries, or a candidate being scored), else the
run context's current version, else the rollout's own default (version 0). Every trajectory records the
versions it ran under (``Trajectory.context.versions``).
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationError

from coevo.context import ContextValue
from coevo.errors import unknown_field_message
from coevo.registry import Registry
from coevo.schema import ConfigModel
from coevo.types import ContextRef, ESMember, Space, Trajectory

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.context import RunContext
    from coevo.es.replica import Population

Split = Literal["train", "test"]


class RolloutConfig(ConfigModel):
    """Base of every rollout's config (``type`` plus the rollout's own fields). Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")
    type: str
    context_keys: dict[str, str] = Field(
        default_factory=dict,
        description="context slot -> the published context key it reads (default: the slot's own name)",
    )


@dataclass(frozen=True)
class RolloutContext:
    """The context of one rollout call.

    Attributes:
        values: slot -> value (the published one, or the rollout's default at version 0).
        versions: published context key -> version read (0 = nothing published, the default was used).
    """

    values: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)

    def ref(self, **fields: Any) -> ContextRef:
        """A :class:`ContextRef` with these versions, the ``system_prompt`` slot's text (when non-empty) as
        ``prompt``, and ``fields`` (skill_name, ...)."""
        fields.setdefault("prompt", self.values.get("system_prompt") or None)
        return ContextRef(versions=dict(self.versions), **fields)


@dataclass(frozen=True)
class RolloutCall:
    """Provenance shared by the trajectories of one rollout call (for :meth:`Rollout.case_trajectory`).

    ``space`` is the calling evolver's space; ``context`` what the call runs under."""

    generation: int
    member: ESMember | None
    key_prefix: str
    split: Split
    evolver: str
    round_index: int
    space: Space
    context: RolloutContext


class Rollout(ABC):
    """Evaluates a policy on task cases.

    Constructed as ``cls(config, ctx)``; ``ctx`` is the run's :class:`~coevo.context.RunContext`
    (for the run id, rng, the published context and cooperating evolvers) and may be ``None`` inside Ray actors,
    where the context of each job is pinned instead (:meth:`pinned_context`).
    """

    Config: ClassVar[type[RolloutConfig]] = RolloutConfig
    type_name: ClassVar[str] = ""
    #: context slots this rollout reads: slot -> what it holds (documented per rollout)
    context_slots: ClassVar[dict[str, str]] = {}

    def __init__(self, config: RolloutConfig, ctx: RunContext | None):
        self.config = config
        self.ctx = ctx
        self._pinned: dict[str, ContextValue] | None = None

    @classmethod
    def check_ready(cls, config: RolloutConfig) -> None:
        """Check what this rollout needs outside the config (system packages, a browser, ...) before any
        model loads; called by ``coevo run`` and ``coevo run --check`` (:func:`coevo.loop.check_runnable`).
        Default: nothing to check.

        Raises:
            coevo.errors.UserError: a missing piece, one line naming the command that fixes it.
        """

    # ------------------------------------------------------------------ context
    def context_defaults(self) -> dict[str, Any]:
        """Slot -> the value used while nothing is published (version 0); default: None for every slot."""
        return dict.fromkeys(self.context_slots)

    def context_key(self, slot: str) -> str:
        """The published context key slot ``slot`` reads (``config.context_keys``, default the slot name)."""
        return self.config.context_keys.get(slot, slot)

    def declared_context(self) -> list[str]:
        """The published context keys this rollout reads (what a Ray job must carry)."""
        return [self.context_key(s) for s in self.context_slots]

    @contextmanager
    def pinned_context(self, values: Mapping[str, ContextValue] | None) -> Iterator[Rollout]:
        """``with rollout.pinned_context({key: ContextValue}):`` calls inside read these values for the given
        keys (instead of the run context's current ones); restored on exit."""
        old = self._pinned
        self._pinned = {**(old or {}), **(values or {})}
        try:
            yield self
        finally:
            self._pinned = old

    def current_context(self) -> RolloutContext:
        """The context of the next call: per slot, the pinned value, else the run context's current version,
        else :meth:`context_defaults` (version 0; a version without a value, e.g. nothing published, also
        reads the default)."""
        defaults = self.context_defaults()
        values: dict[str, Any] = {}
        versions: dict[str, int] = {}
        for slot in self.context_slots:
            key = self.context_key(slot)
            if self._pinned is not None and key in self._pinned:
                cv = self._pinned[key]
            elif self.ctx is not None:
                cv = self.ctx.context(key)
            else:
                cv = ContextValue(key, 0, None)
            values[slot] = defaults.get(slot) if cv.value is None else cv.value
            versions[key] = cv.version
        return RolloutContext(values, versions)

    def space_of(self, evolver: str) -> Space:
        """The space of the calling evolver ``evolver`` (from the run context; "parameter" when unknown, e.g.
        inside a Ray actor, where only ES members run)."""
        ev = self.ctx.evolvers.get(evolver) if self.ctx is not None else None
        return getattr(ev, "space", None) or "parameter"

    def call(
        self,
        *,
        generation: int,
        member: ESMember | None,
        key_prefix: str,
        split: Split = "train",
        evolver: str = "es",
        round_index: int = 0,
    ) -> RolloutCall:
        """The provenance of one call (the calling evolver's space, the current context)."""
        return RolloutCall(
            generation=generation,
            member=member if isinstance(member, ESMember) else None,
            key_prefix=key_prefix,
            split=split,
            evolver=evolver,
            round_index=round_index,
            space=self.space_of(evolver),
            context=self.current_context(),
        )

    def run(
        self,
        policy: Policy,
        *,
        generation: int,
        member: ESMember | None,
        key_prefix: str,
        split: Split = "train",
        evolver: str = "es",
        round_index: int = 0,
    ) -> list[Trajectory]:
        """Roll the policy out on this generation's cases (train) or on the held-out cases (test).

        The default builds the call's provenance (:meth:`call`) and runs :meth:`run_call`; a rollout overrides
        :meth:`run_call` (or, to see the raw arguments, this method).

        Args:
            policy: the (possibly perturbed) policy.
            generation: ES generation; train cases may change per generation (seeded by it).
            member: the ES member the policy is perturbed with, recorded in each trajectory (None = centre).
            key_prefix: prefix of the trajectories' idempotency keys (unique per member and generation).
            split: "train" cases or the fixed held-out "test" cases.

        Returns:
            Trajectories with ``reward`` set (higher is better) and ``llm_calls`` counted.
        """
        return self.run_call(
            policy,
            self.call(
                generation=generation,
                member=member,
                key_prefix=key_prefix,
                split=split,
                evolver=evolver,
                round_index=round_index,
            ),
        )

    def run_call(self, policy: Policy, call: RolloutCall) -> list[Trajectory]:
        """Roll ``policy`` out for one call (its generation, member, key prefix, split, calling evolver, round
        and context: :class:`RolloutCall`); returns what :meth:`run` returns.

        Raises:
            NotImplementedError: the rollout overrides neither this method nor :meth:`run`.
        """
        raise NotImplementedError(f"{type(self).__name__} overrides neither run_call nor run")

    def member_calls(
        self,
        members: list[ESMember],
        key_prefixes: list[str],
        *,
        generation: int,
        split: Split = "train",
        evolver: str = "es",
        round_index: int = 0,
    ) -> list[RolloutCall]:
        """One :meth:`call` per member of a population call, member ``i`` keyed by ``key_prefixes[i]``.

        Raises:
            ValueError: ``members`` and ``key_prefixes`` differ in length.
        """
        common = {"generation": generation, "split": split, "evolver": evolver, "round_index": round_index}
        return [self.call(member=m, key_prefix=kp, **common) for m, kp in zip(members, key_prefixes, strict=True)]

    def run_population(
        self,
        population: Population,
        members: list[ESMember],
        *,
        generation: int,
        key_prefixes: list[str],
        split: Split = "train",
        evolver: str = "es",
        round_index: int = 0,
    ) -> list[list[Trajectory]]:
        """Roll out every member of a low-rank population (``coevo.es.replica.Population``); one trajectory list
        per member, in order, each as :meth:`run` would return it for that member.

        Rollouts that can put different members' requests into one batch override this with
        ``population.generate`` / ``population.logprob`` over ``(member, conversation)`` rows. The default runs
        the members one after another through ``population.member_policy(member)``: the same math, still
        without any weight pass (for agents that drive the policy themselves, e.g. web episodes).
        """
        common = {"generation": generation, "split": split, "evolver": evolver, "round_index": round_index}
        return [
            self.run(population.member_policy(m), member=m, key_prefix=kp, **common)
            for m, kp in zip(members, key_prefixes, strict=True)
        ]

    def case_trajectory(self, call: RolloutCall, index: int, **fields: Any) -> Trajectory:
        """The trajectory of case ``index`` of ``call``: key ``{key_prefix}/{split}/{index}``, run id, the calling
        evolver and its space, round, generation, member, ``meta["split"]`` and the call's context (unless
        ``fields`` gives ``context``); ``fields`` are the remaining :class:`~coevo.types.Trajectory` fields."""
        fields.setdefault("context", call.context.ref())
        fields["meta"] = {"split": call.split, **fields.get("meta", {})}
        return Trajectory(
            key=f"{call.key_prefix}/{call.split}/{index}",
            run_id=self.ctx.run_id if self.ctx is not None else "",
            evolver=call.evolver,
            space=call.space,
            round=call.round_index,
            generation=call.generation,
            member=call.member,
            **fields,
        )

    def member_reward(self, trajectories: list[Trajectory]) -> float:
        """R_i for one member: the mean reward over its trajectories (invalid ones count as 0.0)."""
        if not trajectories:
            return 0.0
        return sum((t.reward if t.valid and t.reward is not None else 0.0) for t in trajectories) / len(trajectories)

    def population_rewards(self, members: list[list[Trajectory]]) -> list[float]:
        """R_i for every member of a generation, in order.

        The ES evolver calls this (not :meth:`member_reward` directly) so that rollouts whose reward of a
        failed member depends on the rest of the population can define it, e.g. the AHD sampling rule
        "invalid child -> min(valid) - std(valid)" (docs/references.md §2). Default: ``member_reward`` per member.
        """
        return [self.member_reward(ts) for ts in members]

    def n_cases(self, split: Split = "train") -> int | None:
        """Number of trajectories :meth:`run` returns per call, when known in advance (for budgeting)."""
        return None

    def close(self) -> None:
        """Release what the rollout holds (browsers, worker pools); called by its owner at the end."""

    def describe(self) -> dict[str, Any]:
        return self.config.model_dump()


ROLLOUTS: Registry[Rollout] = Registry(
    "rollout type", Rollout, package="coevo.rollouts", entry_point_group="coevo.rollouts", name_attr="type_name"
)


def register_rollout(name: str) -> Callable[[type[Rollout]], type[Rollout]]:
    """Class decorator registering a rollout type under ``name``.

    Raises:
        ValueError: another class is registered under ``name``. TypeError: not a :class:`Rollout` subclass.
    """
    return ROLLOUTS.register(name)


def registered_rollouts() -> dict[str, type[Rollout]]:
    """Every rollout type: the modules of :mod:`coevo.rollouts`, classes registered by imported code and
    ``coevo.rollouts`` entry points."""
    return ROLLOUTS.items()


def resolve_rollout(type_name: str) -> type[Rollout]:
    """The rollout class for a config's ``type``: a registered name, an entry point or ``pkg.module:Class``.

    Raises:
        ValueError: unknown type (the message lists the known ones), or a dotted path naming no Rollout.
    """
    return ROLLOUTS.resolve(type_name)


def validate_rollout_spec(spec: Any, where: str = "rollout") -> dict[str, Any]:
    """A ``rollout:`` mapping validated by its type's Config (defaults filled in), wherever it appears in a run
    config (an ES evolver's ``rollout``, a skill gate's ``rollout``, a user evolver's).

    Raises:
        ValueError: naming ``where`` and the field: not a mapping, no or unknown ``type``, an invalid field, a
            ``context_keys`` slot the rollout does not declare.
    """
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str) or not spec["type"]:
        raise ValueError(f"{where}.type is required (a registered rollout, e.g. target_logprob, countdown)")
    try:
        cls = resolve_rollout(spec["type"])
    except ValueError as exc:
        raise ValueError(f"{where}.type: {exc}") from None
    try:
        cfg = cls.Config.model_validate(spec)
    except ValidationError as exc:
        raise ValueError("; ".join(_field_error(where, cls.Config, e) for e in exc.errors())) from None
    _check_slots(cls, cfg, where)
    return cfg.model_dump()


def _field_error(where: str, config: type, err: dict[str, Any]) -> str:
    """``where.field: message`` of one pydantic error; an unknown top-level field gets the nearest allowed name."""
    loc = [str(p) for p in err["loc"]]
    msg = err["msg"].removeprefix("Value error, ") if err["type"] == "value_error" else err["msg"]
    if err["type"] == "extra_forbidden" and len(loc) == 1:
        msg = unknown_field_message(loc[0], list(config.model_fields))
    return f"{'.'.join([where, *loc])}: {msg}"


def _check_slots(cls: type[Rollout], cfg: RolloutConfig, where: str) -> None:
    unknown = sorted(set(cfg.context_keys) - set(cls.context_slots))
    if unknown:
        raise ValueError(
            f"{where}.context_keys: {unknown} are not context slots of rollout {cfg.type!r} "
            f"(its slots: {sorted(cls.context_slots)})"
        )


def build_rollout(spec: dict[str, Any], ctx: RunContext | None) -> Rollout:
    """Validate a ``rollout:`` config mapping and instantiate it (checks as :func:`validate_rollout_spec`).

    Raises:
        pydantic.ValidationError: invalid fields. ValueError: unknown type, unknown ``context_keys`` slots.
    """
    cls = resolve_rollout(str(spec.get("type", "")))
    cfg = cls.Config.model_validate(spec)
    _check_slots(cls, cfg, "rollout")
    return cls(cfg, ctx)

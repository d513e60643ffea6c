"""The rollout API used by the ES evolver (and by held-out evaluation).

A rollout runs the policy on a batch of task cases and returns one :class:`~coevo.types.Trajectory` per
case (or per episode); :meth:`Rollout.member_reward` reduces a member's trajectories to the scalar R_i that
ES normalises (Agentic ESOpt, docs/references.md §1 step 3: the mean task reward over the member's batch).

Rollouts do not write to the store: the caller records what they return. They build deterministic keys with
the ``key_prefix`` they are given, and a caller that resumes may skip cases whose key is already stored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from coevo.registry import Registry
from coevo.types import ESMember, Trajectory

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.context import RunContext
    from coevo.es.replica import Population

Split = Literal["train", "test"]


class RolloutConfig(BaseModel):
    """Base of every rollout's config (``type`` plus the rollout's own fields). Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")
    type: str


class Rollout(ABC):
    """Evaluates a policy on task cases.

    Constructed as ``cls(config, ctx)``; ``ctx`` is the run's :class:`~coevo.context.RunContext`
    (for the run id, rng, the shared board and cooperating evolvers) and may be ``None`` inside Ray actors.
    """

    Config: ClassVar[type[RolloutConfig]] = RolloutConfig
    type_name: ClassVar[str] = ""

    def __init__(self, config: RolloutConfig, ctx: RunContext | None):
        self.config = config
        self.ctx = ctx

    @abstractmethod
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

        Args:
            policy: the (possibly perturbed) policy.
            generation: ES generation; train cases may change per generation (seeded by it).
            member: the ES member the policy is perturbed with, recorded in each trajectory (None = centre).
            key_prefix: prefix of the trajectories' idempotency keys (unique per member and generation).
            split: "train" cases or the fixed held-out "test" cases.

        Returns:
            Trajectories with ``reward`` set (higher is better) and ``llm_calls`` counted.
        """

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
        return [
            self.run(
                population.member_policy(m),
                generation=generation,
                member=m,
                key_prefix=kp,
                split=split,
                evolver=evolver,
                round_index=round_index,
            )
            for m, kp in zip(members, key_prefixes, strict=True)
        ]

    def case_trajectory(
        self,
        *,
        key_prefix: str,
        split: Split,
        index: int,
        generation: int,
        member: ESMember | None,
        evolver: str,
        round_index: int,
        **fields: Any,
    ) -> Trajectory:
        """A parameter-space trajectory for case ``index`` of ``split`` with this rollout's provenance filled in
        (key ``{key_prefix}/{split}/{index}``, run id, evolver, round, generation, member); ``fields`` are the
        remaining :class:`~coevo.types.Trajectory` fields."""
        return Trajectory(
            key=f"{key_prefix}/{split}/{index}",
            run_id=self.ctx.run_id if self.ctx is not None else "",
            evolver=evolver,
            space="parameter",
            round=round_index,
            generation=generation,
            member=member if isinstance(member, ESMember) else None,
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


def build_rollout(spec: dict[str, Any], ctx: RunContext | None) -> Rollout:
    """Validate a ``rollout:`` config mapping and instantiate it.

    Raises:
        ValueError / pydantic.ValidationError: unknown type or invalid fields.
    """
    cls = resolve_rollout(str(spec.get("type", "")))
    return cls(cls.Config.model_validate(spec), ctx)

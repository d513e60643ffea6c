"""The placement interface: where a run's model replicas live, and the in-process placement.

A parameter-space evolver (ES today; GRPO / DPO beside it) evolves the weights of the run's policy. *Where* the
copies of those weights live is decided once per run, from the config (:func:`coevo.placement.choose_placement`),
and is one :class:`Placement` object the loop builds and hands to every evolver as ``ctx.placement``:

* :class:`InProcess` (``workers: 0``): the run's policy in this process; members are rolled out one after
  another (full rank) or together (low rank) on it;
* :class:`coevo.placement.ray.RayHF` (``workers >= 1``, ``model.backend: hf``): the driver keeps its in-process
  replica and ``workers`` HF replicas on Ray actors roll the members out; every update runs on all of them with
  their weight hashes checked equal;
* :class:`coevo.placement.ray.RayVLLM` (``workers >= 1``, ``model.backend: vllm``): one vLLM engine per Ray actor
  (a GPU each, or a slice of cores on vLLM's CPU build) and none in the driver; the run's policy is the centre
  served by engine 0.

What a placement offers (the interface every parameter-space evolver uses):

* :meth:`Placement.policy` - the run's policy (the loop's run context builds ``ctx.policy`` through it, once);
* :meth:`Placement.replica` - the weight replica of every copy at once (:class:`coevo.es.replica.ESReplica`:
  ``apply`` updates all copies and checks their hashes, ``perturbed`` / ``population`` for members, snapshots,
  ``rebuild`` on resume);
* :meth:`Placement.evaluate_members`, :meth:`Placement.evaluate_centre`, :meth:`Placement.evaluate_population`
  - roll jobs (:class:`RolloutJob`) out wherever the copies live; trajectories come back to the caller, which
  stores them (replicas never write the store);
* :meth:`Placement.check` - what the machine cannot give, one line naming the field, before any engine starts;
* :meth:`Placement.close` - stop what the placement started (actors, engines); idempotent.

The placement's settings are fields of the evolver that owns the weights (:class:`PlacementFields`:
``workers``, ``worker_num_cpus``, ``worker_num_gpus``), so configs keep them under the evolver.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from coevo.errors import ConfigError
from coevo.schema import ConfigModel
from coevo.types import ESMember, Trajectory

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.es import ScopeSpec
    from coevo.es.replica import ESReplica
    from coevo.rollouts.base import Rollout


@dataclass(frozen=True)
class ReplicaSpec:
    """What every copy of the weights holds besides the model: the ES parameters and the rollout.

    Attributes:
        scope: the tensors in scope (:class:`coevo.es.ScopeSpec`).
        master_weights: float32 masters of bf16 / fp16 weights.
        restore_mode: ``"exact"`` or ``"inference"`` (how a full-rank perturbation is undone).
        rollout: the rollout's config mapping (``{type: ..., ...}``); Ray actors build it with ``ctx=None``.
        lora: ``(max_loras, max_rank)`` when members are low-rank LoRA adapters on vLLM (a low-rank population:
            population size, rank), else None.
    """

    scope: ScopeSpec
    master_weights: bool
    restore_mode: str
    rollout: dict[str, Any]
    lora: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plain-data part of a Ray actor's spec (``scope``, ``master_weights``, ``restore_mode``,
        ``rollout``; :class:`coevo.placement.ray_pool.ReplicaWorker`)."""
        return {
            "rollout": self.rollout,
            "scope": self.scope.to_dict(),
            "master_weights": self.master_weights,
            "restore_mode": self.restore_mode,
        }


@dataclass(frozen=True)
class RolloutJob:
    """One rollout of a member (perturbed weights, split ``train``) or of the centre (``member`` None).

    Attributes:
        member: the ES member, or None for the unperturbed centre.
        generation, round_index: recorded in the trajectories.
        key_prefix: the trajectories' key prefix (deterministic, for resume).
        evolver: the evolver the trajectories belong to.
        split: ``"train"`` or ``"test"`` (held-out).
        context: ``{context key: ContextValue.to_dict()}`` the rollout runs under where there is no run context
            (Ray actors); in-process rollouts read the live run context instead.
    """

    member: ESMember | None
    generation: int
    key_prefix: str
    evolver: str
    round_index: int
    split: str = "train"
    context: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a Ray actor (``member`` as a dict or None)."""
        return asdict(self)

    def run(self, rollout: Rollout, policy: Any) -> list[Trajectory]:
        """Roll this job out in this process with ``policy`` (already perturbed for a member)."""
        return rollout.run(
            policy,
            generation=self.generation,
            member=self.member,
            split=self.split,  # type: ignore[arg-type]
            evolver=self.evolver,
            key_prefix=self.key_prefix,
            round_index=self.round_index,
        )


class PlacementFields(ConfigModel):
    """The placement settings of an evolver that owns the run's weights (mixed into its config, e.g.
    ``ESConfig``); :func:`coevo.placement.choose_placement` reads them once per run."""

    workers: int = Field(
        0,
        ge=0,
        description="0 = in-process; >= 1 = Ray actors evaluating members (model.backend vllm: one vLLM engine per "
        "actor, each in its own placement group, and no engine in the driver)",
    )
    worker_num_cpus: float = Field(
        1.0, gt=0, description="Ray CPUs per actor (vLLM's CPU build: the whole cores its engine computes on)"
    )
    worker_num_gpus: float = Field(
        0.0, ge=0, description="Ray GPUs per actor (> 0 runs actors on cuda; vLLM's CUDA build: 1 per engine)"
    )

    @abstractmethod
    def replica_spec(self) -> ReplicaSpec:
        """What each copy of the weights holds (:class:`ReplicaSpec`), from the evolver's settings."""


class Placement(ABC):
    """Where the run's model replicas live (module docstring). One per run, built by
    :func:`coevo.placement.choose_placement`; evolvers reach it as ``ctx.placement``.

    Attributes:
        kind: ``"in-process"``, ``"ray-hf"`` or ``"ray-vllm"``.
        workers: copies on Ray actors (0 in-process); recorded in the ES history.
        policy_factory: builds the run's policy (the loop's run context calls it once), or None without a model.
    """

    kind: ClassVar[str]
    workers: int = 0
    policy_factory: Callable[[], Policy] | None = None

    def policy(self) -> Policy:
        """A new instance of the run's policy (``ctx.policy`` holds the one the run uses).

        Raises:
            ConfigError: the run has no model.
        """
        if self.policy_factory is None:
            raise ConfigError("this run has no model configured (config field `model`)")
        return self.policy_factory()

    @abstractmethod
    def replica(self, spec: ReplicaSpec, centre: Policy) -> ESReplica:
        """The ES replica of every copy of the weights (``centre``: the run's policy, ``ctx.policy``).

        Raises:
            TypeError: the placement cannot hold this policy's weights (e.g. Ray HF replicas of a non-HF policy).
        """

    @abstractmethod
    def evaluate_members(
        self, rollout: Rollout, replica: ESReplica, jobs: Sequence[RolloutJob], between: Callable[[], None] | None
    ) -> Iterator[tuple[int, list[Trajectory]]]:
        """Roll out member jobs (each under its member's full-rank perturbation, restored after); yields
        ``(job index, trajectories)`` as jobs finish, so the caller can store each member at once. ``between()``
        (e.g. the run context's sample boundary) is called while waiting on remote jobs.

        Raises:
            EngineLostError: a Ray actor died (one line; the members yielded before are the caller's).
        """

    @abstractmethod
    def evaluate_centre(self, rollout: Rollout, replica: ESReplica, job: RolloutJob) -> list[Trajectory]:
        """Roll out the unperturbed centre (``job.member`` None, e.g. the held-out evaluation)."""

    @abstractmethod
    def evaluate_population(
        self, rollout: Rollout, replica: ESReplica, members: Sequence[ESMember], jobs: Sequence[RolloutJob], rank: int
    ) -> list[list[Trajectory]]:
        """Roll a low-rank population out together (``replica.population`` + ``rollout.run_population``; on Ray
        one contiguous group of members per actor); ``jobs[i]`` names member ``i``'s keys. Returns the
        trajectories per member, in order."""

    def close(self) -> None:
        """Stop what the placement started (Ray actors, their engines); idempotent. Nothing in-process."""


class InProcess(Placement):
    """Every copy of the weights is the run's policy in this process (``workers: 0``)."""

    kind = "in-process"

    def __init__(self, policy_factory: Callable[[], Policy] | None) -> None:
        self.policy_factory = policy_factory

    def replica(self, spec: ReplicaSpec, centre: Policy) -> ESReplica:
        return centre.es_replica(spec.scope, master_weights=spec.master_weights, restore_mode=spec.restore_mode)

    def evaluate_members(self, rollout, replica, jobs, between=None):
        for i, job in enumerate(jobs):
            with replica.perturbed(job.member) as policy:
                trajs = job.run(rollout, policy)
            yield i, trajs  # restored before the caller stores them

    def evaluate_centre(self, rollout, replica, job):
        return job.run(rollout, replica.policy)

    def evaluate_population(self, rollout, replica, members, jobs, rank):
        first = jobs[0]
        with replica.population(members, rank) as pop:
            return rollout.run_population(
                pop,
                members,
                generation=first.generation,
                key_prefixes=[j.key_prefix for j in jobs],
                split="train",
                evolver=first.evolver,
                round_index=first.round_index,
            )

"""The Ray placements: ES replicas on Ray actors, HF replicas beside the driver's, or vLLM engines instead of it.

* :class:`RayHF` (``workers >= 1``, ``model.backend: hf``): the driver keeps its own in-process replica (the run's
  policy: held-out evaluation, snapshots, the other evolvers), and ``workers`` HF replicas on Ray actors
  (:class:`~coevo.placement.ray_pool.RayReplicaPool`) roll the members out. :class:`MirroredReplica` applies
  every update on the driver and on every actor and checks their hashes equal; the actors start, the first time
  they are needed, from the driver's weights (the base model plus the history the driver was rebuilt from).
* :class:`RayVLLM` (``workers >= 1``, ``model.backend: vllm``): one vLLM engine per actor and none in the driver
  (N engines, not N + 1). The run's policy is the centre served by engine 0 (:class:`RemotePolicy`), which also
  runs the held-out evaluation and writes the snapshots; :class:`PoolReplica` runs every weight operation on
  every engine (hashes checked equal).

Members are rolled out where the replicas are: full rank, each job on the next free actor; low rank, one
contiguous group of members per actor (:meth:`RayReplicaPool.evaluate_population`). Rollouts run in the actors
without a run context (``ctx=None``); each job carries the current value of every context key the rollout
declares (:class:`~coevo.placement.base.RolloutJob`), so rollouts that call cooperating evolvers (EoH children)
need ``workers: 0`` (``coevo.config`` refuses the combination).
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.backends.base import Policy
from coevo.es import GenerationRecord, UpdateStats
from coevo.es.checkpoint import rebuild_plan
from coevo.placement.base import Placement, ReplicaSpec
from coevo.placement.ray_pool import RayReplicaPool
from coevo.types import ESMember

if TYPE_CHECKING:
    from coevo.backends.spec import ModelConfig


class _RayPlacement(Placement):
    """What both Ray placements share: the pool (started on first use), remote member and population rollouts."""

    def __init__(self, where: str, settings: Any, spec: ReplicaSpec) -> None:
        self.where, self.spec = where, spec
        self.workers = int(settings.workers)
        self.num_cpus, self.num_gpus = float(settings.worker_num_cpus), float(settings.worker_num_gpus)
        self._pool: RayReplicaPool | None = None

    def _check_spec(self, spec: ReplicaSpec) -> None:
        if spec != self.spec:
            raise ValueError(f"{self.where}: this run's Ray replicas were placed for another replica spec")

    @abstractmethod
    def _model(self) -> dict[str, Any]:
        """The actors' ``model`` (and ``lora``) spec entries."""

    def _started(self, pool: RayReplicaPool) -> None:
        """Called once the pool is up (the HF placement brings the actors to the driver's weights)."""

    @property
    def pool(self) -> RayReplicaPool:
        """The Ray actors, started (and brought to the run's weights) on first use."""
        if self._pool is None:
            spec = {**self._model(), **self.spec.to_dict()}
            self._pool = RayReplicaPool(spec, self.workers, self.num_cpus, self.num_gpus, self.where)
            self._started(self._pool)
        return self._pool

    @property
    def started(self) -> bool:
        """Whether the actors run (they start on first use)."""
        return self._pool is not None

    def evaluate_members(self, rollout, replica, jobs, between=None):
        what = f"generation {jobs[0].generation}'s members" if jobs else "a generation"
        yield from self.pool.evaluate_iter([j.to_dict() for j in jobs], what, between=between)

    def evaluate_population(self, rollout, replica, members, jobs, rank):
        first = jobs[0]
        return self.pool.evaluate_population(
            members,
            [j.key_prefix for j in jobs],
            rank=rank,
            generation=first.generation,
            evolver=first.evolver,
            round_index=first.round_index,
            context=first.context,
        )

    def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()


class RayHF(_RayPlacement):
    """HF replicas on ``workers`` Ray actors beside the driver's in-process one (module docstring).

    Args:
        where: the evolver's config section (``evolvers.<name>``), named in errors.
        settings: its :class:`~coevo.placement.base.PlacementFields` (workers, CPUs and GPUs per actor).
        spec: what each replica holds. policy_factory: builds the driver's policy (an ``HFPolicy``).
    """

    kind = "ray-hf"

    def __init__(self, where: str, settings: Any, spec: ReplicaSpec, policy_factory: Callable[[], Policy]) -> None:
        super().__init__(where, settings, spec)
        self.policy_factory = policy_factory
        self._mirror: MirroredReplica | None = None

    def replica(self, spec, centre):
        from coevo.backends.hf import HFPolicy

        self._check_spec(spec)
        if not isinstance(centre, HFPolicy):
            raise TypeError(
                f"{self.where}.workers >= 1 needs the hf backend, the run's policy is {type(centre).__name__}"
            )
        driver = centre.es_replica(spec.scope, master_weights=spec.master_weights, restore_mode=spec.restore_mode)
        self._mirror = MirroredReplica(driver, self)
        return self._mirror

    def _model(self) -> dict[str, Any]:
        if self._mirror is None:
            raise RuntimeError("the HF actors start from the driver's replica: call replica() first")
        policy = self._mirror.policy
        model = {
            "name": policy.model_id,
            "backend": "hf",
            "dtype": str(policy.dtype).removeprefix("torch."),
            "device": str(policy.device),
            "batch_size": policy.batch_size,
            "cpu_linear": policy.cpu_linear,
        }
        return {"model": model}

    def _started(self, pool: RayReplicaPool) -> None:
        if self._mirror is not None:
            self._mirror.sync(pool)

    def evaluate_centre(self, rollout, replica, job):
        return job.run(rollout, replica.policy)  # the driver holds the centre


class MirroredReplica:
    """The driver's in-process replica mirrored on a :class:`RayHF` placement's actors: weight changes run on
    both (the actors' hashes checked against the driver's); ``perturbed`` / ``population`` / snapshots are the
    driver's (delegated). Attributes: ``driver`` (the in-process replica), ``placement``."""

    def __init__(self, driver: Any, placement: RayHF) -> None:
        self.driver, self.placement = driver, placement
        #: how the driver reached its weights before the actors started: None (the base model),
        #: ("rebuild", run_dir, rows, generation) or ("load", snapshot, records)
        self._origin: tuple | None = None

    def __getattr__(self, name: str) -> Any:
        """Everything but the weight changes is the driver's (``policy``, ``active``, ``params``, ``perturbed``,
        ``population``, ``weights_hash``, ``noise_hash``, ``save_snapshot``)."""
        return getattr(self.driver, name)

    def sync(self, pool: RayReplicaPool) -> None:
        """Bring freshly started actors to the driver's weights (checked equal)."""
        expected = self.driver.weights_hash()
        if self._origin is None:
            RayReplicaPool.check(pool.start_hashes, expected, "start")
        elif self._origin[0] == "rebuild":
            snap, records = rebuild_plan(*self._origin[1:])
            pool.load(snap[1] if snap else None, records, expected=expected)
        else:
            pool.load(self._origin[1], self._origin[2], expected=expected)

    def apply(self, record: GenerationRecord) -> tuple[UpdateStats, str]:
        pool = self.placement.pool  # started and synchronised before the driver's weights change
        stats, after = self.driver.apply(record)
        pool.apply(record, expected=after)
        return stats, after

    def load(self, snapshot: str | Path | None, records: Sequence[GenerationRecord]) -> str:
        digest = self.driver.load(snapshot, records)
        if self.placement.started:
            self.placement.pool.load(snapshot, records, expected=digest)
        else:
            self._origin = ("load", snapshot, list(records))
        return digest

    def rebuild(self, run_dir: str | Path, rows: Sequence[dict[str, Any]], generation: int) -> tuple[str, int | None]:
        digest, snap = self.driver.rebuild(run_dir, rows, generation)
        if self.placement.started:
            RayReplicaPool.check([self.placement.pool.rebuild(run_dir, rows, generation)[0]], digest, "resume")
        else:
            self._origin = ("rebuild", run_dir, list(rows), generation)
        return digest, snap


class RayVLLM(_RayPlacement):
    """One vLLM engine per Ray actor and none in the driver (module docstring).

    Args:
        where, settings, spec: as :class:`RayHF`.
        model: the run's model section (``backend: vllm``); ``spec.lora`` starts the engines with multi-LoRA.
    """

    kind = "ray-vllm"

    def __init__(self, where: str, settings: Any, spec: ReplicaSpec, model: ModelConfig) -> None:
        super().__init__(where, settings, spec)
        self.model = model
        self.policy_factory = lambda: RemotePolicy(self.pool, self.model.model_dump(), 0)

    def _model(self) -> dict[str, Any]:
        return {"model": self.model.model_dump(), "lora": self.spec.lora}

    def replica(self, spec, centre):
        self._check_spec(spec)
        return PoolReplica(self.pool, centre)

    def evaluate_centre(self, rollout, replica, job):
        return self.pool.evaluate_on(0, job.to_dict(), "the centre's evaluation")  # engine 0 serves the centre


class RemotePolicy(Policy):
    """The centre served by actor ``index`` of a pool: ``generate`` / ``logprob`` run there (the run's policy
    when the ES evolver's vLLM engines live in the pool and the driver holds none); the tokenizer is loaded
    here from the model folder.

    Attributes: pool, index, model_id, dtype, tokenizer; the flags of the backend (vLLM's).
    """

    def __init__(self, pool: RayReplicaPool, model: dict[str, Any], index: int = 0) -> None:
        from coevo.backends.base import torch_dtype
        from coevo.backends.models import load_tokenizer, resolve_model

        self.pool, self.index = pool, index
        self.model_id = str(model["name"])
        self.dtype = torch_dtype(model.get("dtype", "bfloat16"))
        self.tokenizer = load_tokenizer(resolve_model(self.model_id))
        vllm = model.get("backend") == "vllm"
        self.can_continue_final_message = vllm
        self.can_constrain = vllm

    def generate(self, conversations, params):
        actor = self.pool.actors[self.index]
        return self.pool._get(actor.generate.remote(conversations, params), "a generation of the centre")

    def logprob(self, conversations, targets):
        actor = self.pool.actors[self.index]
        return self.pool._get(actor.logprob.remote(conversations, targets), "a log-probability of the centre")


class PoolReplica:
    """The :class:`coevo.es.replica.ESReplica` of a pool whose actors hold the only engines (the driver none):
    every weight operation runs on all actors with their hashes checked equal; ``perturbed`` perturbs actor 0
    (which also serves ``policy``, a :class:`RemotePolicy`); members are evaluated through the pool."""

    def __init__(self, pool: RayReplicaPool, policy: RemotePolicy) -> None:
        self.pool, self.policy = pool, policy
        self._active = False

    @property
    def active(self) -> bool:
        return self._active

    @contextlib.contextmanager
    def perturbed(self, member: ESMember) -> Iterator[Any]:
        actor = self.pool.actors[self.policy.index]
        self.pool._get(actor.perturb.remote(asdict(member)), "a perturbation")
        self._active = True
        try:
            yield self.policy
        finally:
            self._active = False
            self.pool._get(actor.restore.remote(), "a restore")

    def population(self, members: Sequence[ESMember], rank: int) -> Any:
        raise NotImplementedError(
            "a low-rank population of a Ray engine pool is rolled out on the actors (RayReplicaPool.evaluate_population)"
        )

    def weights_hash(self) -> str:
        return self.pool.weights_hash()

    def noise_hash(self, member: ESMember) -> str:
        return self.pool.check(self.pool.noise_hashes(member), None, "a noise check")[0]

    def apply(self, record: GenerationRecord) -> tuple[UpdateStats, str]:
        return self.pool.update(record)

    def load(self, snapshot: str | Path | None, records: Sequence[GenerationRecord]) -> str:
        return self.pool.load(snapshot, records)

    def save_snapshot(self, path: str | Path, meta: dict[str, Any] | None = None) -> str:
        return self.pool.save_snapshot(path, meta)

    def rebuild(self, run_dir: str | Path, rows: Sequence[dict[str, Any]], generation: int) -> tuple[str, int | None]:
        return self.pool.rebuild(run_dir, rows, generation)


__all__ = ["MirroredReplica", "PoolReplica", "RayHF", "RayVLLM", "RemotePolicy"]

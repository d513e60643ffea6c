"""A pool of ES replicas on Ray actors.

:class:`RayReplicaPool` holds ``workers`` :class:`~coevo.backends.hf_replica.HFReplica` copies on Ray actors, each built from the same model reference
(as in OpenAI ES, Salimans et al. 2017 §2.1, and Agentic-ESOpt's multi-engine setup): the driver sends
member seeds and history records, the actors return the members' trajectories as plain dicts (the driver
writes them to the store; actors never write) and their weight hashes, which the driver checks equal after
every update (:class:`ReplicaDivergenceError` otherwise). Noise is drawn on the CPU from (seed, name,
chunk) and updates are device independent (``coevo.es.update``), so every replica stays bit-identical.

Low rank (``perturbation: lowrank``): :meth:`RayReplicaPool.evaluate_population` cuts the population into one
contiguous group of members per actor, and each actor rolls its group out together through
``HFReplica.population`` (the same factors, hooks and batches as in-process). The actors' trajectories are
bit-identical to those groups rolled out in-process; against the whole population in one in-process call they
agree to the float tolerance of a different batch composition (rows share model batches with other members),
so a ``workers: k`` run is reproducible for the same ``k`` (also across a resume), not bit-identical to a
``workers: 0`` run. The update is applied from the recorded coefficients, so the driver, every actor and a
replay hold the same weights bit for bit.

Ray cluster: :func:`ensure_ray` reuses an initialised Ray; else it connects to ``address="auto"`` when
``RAY_ADDRESS`` is set (a cluster started with ``ray start``), else starts a local one. Actors resolve the
model reference themselves, so on a multi-node cluster the model (and, to resume, the run folder's weight
snapshots) must be reachable under the same paths on every node.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from coevo.es import GenerationRecord, ScopeSpec
from coevo.types import ESMember, Trajectory


class ReplicaDivergenceError(RuntimeError):
    """Policy replicas hold different weights after the same update (different torch build, CPU, or a bug)."""


class ReplicaWorker:
    """The object a Ray actor holds (wrapped with ``ray.remote`` by :class:`RayReplicaPool`); plain-data API.

    ``spec`` keys: ``model`` (reference for ``HFPolicy``), ``dtype``, ``device``, ``batch_size``, ``rollout``
    (rollout config mapping, built with ``ctx=None``), ``scope`` (``ScopeSpec`` dict), ``master_weights``,
    ``restore_mode``, optional ``torch_threads``.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        from coevo.backends.hf import HFPolicy
        from coevo.rollouts.base import build_rollout

        if spec.get("torch_threads"):
            torch.set_num_threads(int(spec["torch_threads"]))
        policy = HFPolicy(
            spec["model"],
            dtype=spec["dtype"],
            device=spec["device"],
            batch_size=spec["batch_size"],
            cpu_linear=spec.get("cpu_linear", "auto"),
        )
        self.replica = policy.es_replica(
            ScopeSpec.from_dict(spec["scope"]), master_weights=spec["master_weights"], restore_mode=spec["restore_mode"]
        )
        self.rollout = build_rollout(spec["rollout"], None)
        self.pid = os.getpid()

    def _context(self, job: dict[str, Any]):
        """The job's context (``{key: ContextValue dict}``) pinned on the rollout for the job's duration."""
        from coevo.context import ContextValue

        return self.rollout.pinned_context(
            {k: ContextValue.from_dict(v) for k, v in (job.get("context") or {}).items()}
        )

    def evaluate(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Evaluate one member job ``{member, generation, key_prefix, evolver, round_index, context}`` (perturb,
        roll out on the train split under the job's context, restore)."""
        member = ESMember(**job["member"])
        with self._context(job), self.replica.perturbed(member) as policy:
            trajs = self.rollout.run(
                policy,
                generation=job["generation"],
                member=member,
                split="train",
                key_prefix=job["key_prefix"],
                evolver=job["evolver"],
                round_index=job["round_index"],
            )
        return self._plain(trajs)

    def evaluate_population(self, job: dict[str, Any]) -> list[list[dict[str, Any]]]:
        """Roll out a group of low-rank members together ``{members, key_prefixes, rank, generation, evolver,
        round_index, context}`` (``HFReplica.population`` + ``rollout.run_population``); one trajectory list per
        member."""
        members = [ESMember(**m) for m in job["members"]]
        with self._context(job), self.replica.population(members, int(job["rank"])) as pop:
            groups = self.rollout.run_population(
                pop,
                members,
                generation=job["generation"],
                split="train",
                key_prefixes=job["key_prefixes"],
                evolver=job["evolver"],
                round_index=job["round_index"],
            )
        return [self._plain(trajs) for trajs in groups]

    def _plain(self, trajs: list[Trajectory]) -> list[dict[str, Any]]:
        """The trajectories as plain dicts, ``meta.worker_pid`` set to this actor's process id."""
        out = []
        for t in trajs:
            d = t.to_dict()
            d["meta"] = {**d["meta"], "worker_pid": self.pid}
            out.append(d)
        return out

    def apply(self, record: dict[str, Any]) -> str:
        return self.replica.apply(GenerationRecord.from_dict(record))[1]

    def load(self, snapshot: str | None, records: list[dict[str, Any]]) -> str:
        return self.replica.load(snapshot, [GenerationRecord.from_dict(r) for r in records])

    def weights_hash(self) -> str:
        return self.replica.weights_hash()

    def noise_hash(self, member: dict[str, Any]) -> str:
        return self.replica.noise_hash(ESMember(**member))


def ensure_ray(num_cpus: int) -> bool:
    """Make sure Ray is initialised; returns True when this call started it (so the caller shuts it down).

    Reuses an initialised Ray; connects to the cluster when ``RAY_ADDRESS`` is set; else starts a local
    cluster with ``num_cpus`` CPUs and no dashboard.
    """
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", include_dashboard=False, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return True


class RayReplicaPool:
    """``workers`` :class:`~coevo.backends.hf_replica.HFReplica` copies on Ray actors; the weight side of
    :class:`coevo.es.replica.WeightReplica` for all of them at once (hashes checked equal), plus remote
    member evaluation.

    Args:
        spec: the actors' spec (:class:`ReplicaWorker`), plain data.
        workers: number of actors (>= 1).
        num_cpus, num_gpus: Ray resources per actor (a GPU actor runs its model on ``cuda``).

    Raises:
        ValueError: workers < 1. ReplicaDivergenceError: the actors start from different weights.
    """

    def __init__(self, spec: dict[str, Any], workers: int, num_cpus: float = 1.0, num_gpus: float = 0.0) -> None:
        import ray

        if workers < 1:
            raise ValueError(f"workers must be >= 1 for a Ray pool, got {workers}")
        self._started = ensure_ray(max(1, math.ceil(workers * num_cpus)))
        spec = {**spec, "device": "cuda" if num_gpus > 0 else spec.get("device", "cpu")}
        spec.setdefault("torch_threads", max(1, int(num_cpus)))
        actor_cls = ray.remote(ReplicaWorker).options(num_cpus=num_cpus, num_gpus=num_gpus)
        self.actors = [actor_cls.remote(spec) for _ in range(workers)]
        self.start_hashes = self.check(ray.get([a.weights_hash.remote() for a in self.actors]), None, "start")

    @staticmethod
    def check(hashes: list[str], expected: str | None, what: str) -> list[str]:
        """Raise ``ReplicaDivergenceError`` unless all ``hashes`` (and ``expected``, if given) are equal."""
        allh = list(hashes) + ([expected] if expected is not None else [])
        if len(set(allh)) > 1:
            listing = ", ".join(f"actor {i}: {h[:16]}" for i, h in enumerate(hashes))
            exp = f"; driver: {expected[:16]}" if expected is not None else ""
            raise ReplicaDivergenceError(f"replica weights diverged at {what}: {listing}{exp}")
        return list(hashes)

    def evaluate(self, jobs: list[dict[str, Any]]) -> list[list[Trajectory]]:
        """Evaluate member jobs on the actors (load-balanced); returns trajectories in job order."""
        from ray.util import ActorPool

        pool = ActorPool(self.actors)
        results = pool.map(lambda actor, job: actor.evaluate.remote(job), jobs)
        return [[Trajectory.from_dict(d) for d in ds] for ds in results]

    def evaluate_population(
        self,
        members: Sequence[ESMember],
        key_prefixes: Sequence[str],
        *,
        rank: int,
        generation: int,
        evolver: str,
        round_index: int,
        context: dict[str, dict[str, Any]] | None = None,
    ) -> list[list[Trajectory]]:
        """Roll out a low-rank population on the actors: the members are cut into ``len(actors)`` contiguous
        groups (sizes differ by at most one; always the same groups for the same population), each rolled out
        together on one actor under ``context`` (context key -> ``ContextValue.to_dict()``). Returns the
        trajectories per member, in order."""
        import ray

        k = len(self.actors)
        bounds = [len(members) * i // k for i in range(k + 1)]
        futures = []
        for actor, lo, hi in zip(self.actors, bounds[:-1], bounds[1:], strict=True):
            if hi > lo:
                job = {
                    "members": [asdict(m) for m in members[lo:hi]],
                    "key_prefixes": list(key_prefixes[lo:hi]),
                    "rank": rank,
                    "generation": generation,
                    "evolver": evolver,
                    "round_index": round_index,
                    "context": context or {},
                }
                futures.append(actor.evaluate_population.remote(job))
        return [[Trajectory.from_dict(d) for d in ds] for group in ray.get(futures) for ds in group]

    def weights_hash(self) -> str:
        """The actors' common weights hash (``ReplicaDivergenceError`` when they differ)."""
        import ray

        return self.check(ray.get([a.weights_hash.remote() for a in self.actors]), None, "a hash check")[0]

    def apply(self, record: GenerationRecord, expected: str | None = None) -> tuple[None, str]:
        """Apply a record on every actor; checks their hashes agree (and equal ``expected``); returns
        ``(None, hash)`` (the actors' update stats stay in the actors)."""
        import ray

        rec = record.to_dict()
        hashes = ray.get([a.apply.remote(rec) for a in self.actors])
        return None, self.check(hashes, expected, f"generation {record.generation}")[0]

    def load(
        self, snapshot: str | Path | None, records: Sequence[GenerationRecord], expected: str | None = None
    ) -> str:
        """Load a snapshot and re-apply records on every actor; checks the hashes; returns the common hash."""
        import ray

        recs = [r.to_dict() for r in records]
        snap = None if snapshot is None else str(snapshot)
        return self.check(ray.get([a.load.remote(snap, recs) for a in self.actors]), expected, "resume")[0]

    def noise_hashes(self, member: ESMember) -> list[str]:
        """Each actor's :meth:`HFReplica.noise_hash` for ``member``."""
        import ray

        return ray.get([a.noise_hash.remote(asdict(member)) for a in self.actors])

    def close(self) -> None:
        """Kill the actors; shut Ray down if this pool started it."""
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []
        if self._started and ray.is_initialized():
            ray.shutdown()

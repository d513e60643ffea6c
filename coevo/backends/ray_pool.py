"""ES policy replicas: one in-process :class:`ESReplica`, and a pool of them on Ray actors.

An :class:`ESReplica` is a parameter-space policy plus its ES parameters (``coevo.es.ESParams``, scope and
optional float32 masters) and a rollout. It evaluates population members (perturb, roll out, restore:
exception safe, ``coevo.es.perturb``), applies recorded updates, and saves / loads weight snapshots.

:class:`RayReplicaPool` holds ``workers`` replicas on Ray actors, each built from the same model reference
(as in OpenAI ES, Salimans et al. 2017 §2.1, and Agentic-ESOpt's multi-engine setup): the driver sends
member seeds and history records, the actors return the members' trajectories as plain dicts (the driver
writes them to the store; actors never write) and their weight hashes, which the driver checks equal after
every update (:class:`ReplicaDivergenceError` otherwise). Noise is drawn on the CPU from (seed, name,
chunk) and updates are device independent (``coevo.es.update``), so every replica stays bit-identical.

Ray cluster: :func:`ensure_ray` reuses an initialised Ray; else it connects to ``address="auto"`` when
``RAY_ADDRESS`` is set (a cluster started with ``ray start``), else starts a local one. Actors resolve the
model reference themselves, so on a multi-node cluster the model (and, to resume, the run folder's weight
snapshots) must be reachable under the same paths on every node.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from coevo.es import (
    ESParams,
    GenerationRecord,
    ScopeSpec,
    UpdateStats,
    perturb,
    select_params,
)
from coevo.es.checkpoint import apply_records, load_snapshot, rebuild, save_snapshot
from coevo.rollouts.base import Rollout, Split, build_rollout
from coevo.types import ESMember, Trajectory


class ReplicaDivergenceError(RuntimeError):
    """Policy replicas hold different weights after the same update (different torch build, CPU, or a bug)."""


class ESReplica:
    """A policy with its ES parameters and rollout.

    Args:
        policy: a policy with a parameter space (``policy.has_parameters``), e.g. ``HFPolicy``.
        rollout: how a (perturbed) policy is scored.
        scope: the tensors ES perturbs and updates.
        master_weights: keep float32 masters of bf16/fp16 tensors (``coevo.es.params``).
        restore_mode: ``"exact"`` (bit-identical restores) or ``"inference"`` (``coevo.es.perturb``).

    Raises:
        TypeError: the policy has no parameter space. ValueError: the scope selects no tensor.
    """

    def __init__(self, policy, rollout: Rollout, scope: ScopeSpec, master_weights: bool = True,
                 restore_mode: str = "exact") -> None:  # fmt: skip
        if not getattr(policy, "has_parameters", False):
            raise TypeError(f"ES needs a policy with a parameter space (hf backend), got {type(policy).__name__}")
        self.policy = policy
        self.rollout = rollout
        self.scope = scope
        self.restore_mode = restore_mode
        self.params = ESParams(select_params(policy.named_parameters(), scope),
                               master_dtype=torch.float32 if master_weights else None)  # fmt: skip

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> ESReplica:
        """Build a replica from a plain-dict spec (what :class:`RayReplicaPool` sends to its actors).

        Keys: ``model`` (reference for ``HFPolicy``), ``dtype``, ``device``, ``batch_size``, ``rollout``
        (rollout config mapping, built with ``ctx=None``), ``scope`` (``ScopeSpec`` dict), ``master_weights``,
        ``restore_mode``.
        """
        from coevo.backends.hf import HFPolicy

        policy = HFPolicy(spec["model"], dtype=spec["dtype"], device=spec["device"], batch_size=spec["batch_size"])
        return cls(policy, build_rollout(spec["rollout"], None), ScopeSpec.from_dict(spec["scope"]),
                   spec["master_weights"], spec["restore_mode"])  # fmt: skip

    # ------------------------------------------------------------------ evaluation
    @contextmanager
    def perturbed(self, member: ESMember) -> Iterator[Any]:
        """``with replica.perturbed(member) as policy:`` the policy at ``theta + sign * sigma * eps(seed)``;
        restored on exit, also when the body raises."""
        with perturb(self.params, member.seed, member.sigma, member.sign, self.restore_mode):
            yield self.policy

    def evaluate_member(self, member: ESMember, *, generation: int, key_prefix: str, evolver: str,
                        round_index: int, rollout: Rollout | None = None) -> list[Trajectory]:  # fmt: skip
        """Roll out the member's perturbed policy on the train split; the weights are restored after."""
        ro = rollout or self.rollout
        with self.perturbed(member) as policy:
            return ro.run(policy, generation=generation, member=member, key_prefix=key_prefix, split="train",
                          evolver=evolver, round_index=round_index)  # fmt: skip

    def evaluate_centre(self, *, generation: int, key_prefix: str, evolver: str, round_index: int,
                        split: Split = "test") -> list[Trajectory]:  # fmt: skip
        """Roll out the unperturbed policy (member None) on ``split``."""
        if self.params.active is not None:
            raise RuntimeError("a perturbation is active: the centre cannot be evaluated now")
        return self.rollout.run(self.policy, generation=generation, member=None, key_prefix=key_prefix,
                                split=split, evolver=evolver, round_index=round_index)  # fmt: skip

    # ------------------------------------------------------------------ weights
    def weights_hash(self) -> str:
        """``weights_hash`` of the tensors in scope (64 hex chars)."""
        return self.params.weights_hash()

    def noise_hash(self, member: ESMember) -> str:
        """``weights_hash`` of the tensors in scope while perturbed by ``member`` (restored after): equal
        across replicas iff they hold the same weights and draw the same noise."""
        with self.perturbed(member):
            return self.params.weights_hash()

    def apply(self, record: GenerationRecord) -> tuple[UpdateStats, str]:
        """Apply one generation's update (skipped records apply nothing); returns (stats, hash after)."""
        stats = record.apply(self.params)
        return stats, self.params.weights_hash()

    def save_snapshot(self, path: str | Path, meta: dict[str, Any] | None = None) -> str:
        """Write the scope's weights (and masters) to ``path``; returns their hash (``coevo.es.checkpoint``)."""
        return save_snapshot(path, self.params, meta)

    def load(self, snapshot: str | Path | None, records: list[GenerationRecord]) -> str:
        """Load ``snapshot`` (None: keep the current weights), then re-apply ``records`` checking their
        hashes; returns the final hash."""
        if snapshot is not None:
            load_snapshot(snapshot, self.params)
        return apply_records(self.params, records)

    def rebuild(self, run_dir: str | Path, rows: list[dict[str, Any]], generation: int):
        """Weights after ``generation`` from the newest snapshot plus history ``rows`` (``coevo.es.checkpoint``)."""
        return rebuild(self.params, run_dir, rows, generation)


class ReplicaWorker:
    """The object a Ray actor holds (wrapped with ``ray.remote`` by :class:`RayReplicaPool`); plain-data API."""

    def __init__(self, spec: dict[str, Any]) -> None:
        if spec.get("torch_threads"):
            torch.set_num_threads(int(spec["torch_threads"]))
        self.replica = ESReplica.from_spec(spec)
        self.pid = os.getpid()

    def evaluate(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Evaluate one member job ``{member, generation, key_prefix, evolver, round_index}``."""
        member = ESMember(**job["member"])
        trajs = self.replica.evaluate_member(member, generation=job["generation"], key_prefix=job["key_prefix"],
                                             evolver=job["evolver"], round_index=job["round_index"])  # fmt: skip
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
    """``workers`` :class:`ESReplica` copies on Ray actors.

    Args:
        spec: the replica spec (:meth:`ESReplica.from_spec`), plain data.
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

    def apply(self, record: GenerationRecord, expected: str | None = None) -> list[str]:
        """Apply a record on every actor; checks their hashes agree (and equal ``expected``)."""
        import ray

        rec = record.to_dict()
        hashes = ray.get([a.apply.remote(rec) for a in self.actors])
        return self.check(hashes, expected, f"generation {record.generation}")

    def load(self, snapshot: str | Path | None, records: list[GenerationRecord], expected: str | None = None) -> list[str]:
        """Load a snapshot and re-apply records on every actor; checks the hashes."""
        import ray

        recs = [r.to_dict() for r in records]
        snap = None if snapshot is None else str(snapshot)
        return self.check(ray.get([a.load.remote(snap, recs) for a in self.actors]), expected, "resume")

    def noise_hashes(self, member: ESMember) -> list[str]:
        """Each actor's :meth:`ESReplica.noise_hash` for ``member``."""
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

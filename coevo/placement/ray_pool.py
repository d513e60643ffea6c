"""A pool of ES replicas on Ray actors: HF replicas, or one vLLM engine per actor (what the Ray placements of
:mod:`coevo.placement` hold).

:class:`RayReplicaPool` holds ``workers`` replicas on Ray actors, each built from the same model section through
the backend factory (:func:`coevo.backends.factory.make_policy`), so the same pool serves
:class:`~coevo.backends.hf_replica.HFReplica` and :class:`~coevo.backends.vllm_engine.VLLMReplica` (as in OpenAI ES,
Salimans et al. 2017 §2.1, Agentic-ESOpt's multi-engine setup, and Qiu et al.'s ES at scale: one vLLM engine per
GPU as a Ray actor in its own placement group). The driver sends member seeds and history records, the actors
return the members' trajectories as plain dicts (the driver writes them to the store; actors never write) and
their weight hashes, which the driver checks equal after every update (:class:`ReplicaDivergenceError`
otherwise). Noise is drawn on the CPU from (seed, name, chunk) and updates are device independent
(``coevo.es.update``), so every replica stays bit-identical, on either backend.

Placement: every actor gets its own placement group (one bundle: ``num_cpus`` CPUs and ``num_gpus`` GPUs,
``STRICT_PACK``), and the engine's own processes (vLLM's engine core and worker) inherit the actor's GPU
(``CUDA_VISIBLE_DEVICES``, set by Ray). A vLLM engine on vLLM's CPU build computes on a slice of cores of its
own: actor ``i`` of a pool with ``k = num_cpus`` cores per actor computes on cores ``i*k .. i*k+k-1`` of the
cores its process may use (:func:`coevo.backends.vllm_env.cpu_slice` / ``bind_cpu_slice``), so two engines on
two cores never share one.

Before any engine starts (:func:`preflight`), one small Ray task per placement group checks the node it lands
on: the model folder exists there, vLLM imports there (vllm backend), and the pool fits (``workers`` x
``num_gpus`` GPUs, or for vLLM's CPU build ``workers`` x ``num_cpus`` cores of this machine). What is missing
is one :class:`~coevo.errors.ConfigError` line naming it.

Faults: an actor that dies (killed, out of memory, its engine crashed) raises :class:`EngineLostError`, one line
naming the actor and what it was doing; the members finished before are already with the driver, and a
resumed run re-runs the others with the same seeds. :meth:`RayReplicaPool.close` asks every live actor to shut
its engine down, kills the actors, then kills any engine process of theirs still alive on this node (an actor
killed with SIGKILL leaves its engine-core process behind otherwise).

Low rank (``perturbation: lowrank``): :meth:`RayReplicaPool.evaluate_population` cuts the population into one
contiguous group of members per actor, and each actor rolls its group out together through
``replica.population`` (HF: the same factors, hooks and batches as in-process; vLLM: one LoRA adapter per
member). The actors' trajectories are bit-identical to those groups rolled out in-process; against the whole
population in one in-process call they agree to the float tolerance of a different batch composition, so a
``workers: k`` run is reproducible for the same ``k`` (also across a resume), not bit-identical to a
``workers: 0`` run. The update is applied from the recorded coefficients, so the driver, every actor and a
replay hold the same weights bit for bit.

Ray cluster: :func:`ensure_ray` reuses an initialised Ray; else it connects to ``address="auto"`` when
``RAY_ADDRESS`` is set (a cluster started with ``ray start``), else starts a local one. Actors resolve the
model reference themselves, so on a multi-node cluster the model (and, to resume, the run folder's weight
snapshots) must be reachable under the same paths on every node.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from coevo.errors import ConfigError, UserError
from coevo.es import GenerationRecord, ScopeSpec, UpdateStats
from coevo.types import ESMember, Trajectory

#: seconds :func:`RayReplicaPool.close` waits for an actor to shut its engine down before killing it
CLOSE_TIMEOUT_S = 60.0
#: seconds a placement group may take to be placed before the pool gives up (the resources check ran first)
PLACEMENT_TIMEOUT_S = 120.0
#: seconds :func:`preflight` waits for Ray's view of free CPUs to show a just-closed pool's as free (removing
#: a placement group is asynchronous) before it refuses
RESOURCE_SETTLE_S = 5.0


class ReplicaDivergenceError(RuntimeError):
    """Policy replicas hold different weights after the same update (different torch build, CPU, or a bug)."""


class EngineLostError(UserError):
    """A replica's Ray actor (and its engine) died; the message names it and what it was doing (one line)."""


class ReplicaWorker:
    """The object a Ray actor holds (wrapped with ``ray.remote`` by :class:`RayReplicaPool`); plain-data API.

    ``spec`` keys: ``model`` (a ``ModelConfig`` mapping, any backend), optional ``lora`` (``(max_loras, max_rank)`` of a low-rank population on vLLM),
    ``rollout`` (rollout config mapping, built with ``ctx=None``), ``scope`` (``ScopeSpec`` dict),
    ``master_weights``, ``restore_mode``, optional ``torch_threads``, ``index`` (the actor's place in the
    pool) and ``cores_per_actor`` (vLLM's CPU build: the size of its core slice,
    :func:`coevo.backends.vllm_env.cpu_slice`).
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        from coevo.backends.factory import make_policy
        from coevo.backends.spec import ModelConfig
        from coevo.rollouts.base import build_rollout

        model = ModelConfig.model_validate(spec["model"])
        self.pid = os.getpid()
        self.cores: list[int] = []
        if model.backend == "vllm" and spec.get("cores_per_actor"):
            from coevo.backends.vllm_env import bind_cpu_slice, cpu_slice

            self.cores = cpu_slice(int(spec.get("index", 0)), int(spec["cores_per_actor"]), os.sched_getaffinity(0))
            bind_cpu_slice(self.cores)
        if spec.get("torch_threads"):
            torch.set_num_threads(int(spec["torch_threads"]))
        before = _children()
        lora = spec.get("lora")
        self.policy = make_policy(model, lora=tuple(lora) if lora else None)
        self.engine_pids = sorted(_children() - before)
        self.replica = self.policy.es_replica(
            ScopeSpec.from_dict(spec["scope"]), master_weights=spec["master_weights"], restore_mode=spec["restore_mode"]
        )
        self.rollout = build_rollout(spec["rollout"], None)
        self._held: Any = None

    def info(self) -> dict[str, Any]:
        """``{pid, engine_pids, node, cores}``: this actor's process, its engine's processes (vLLM's engine core
        and worker; none for HF), its Ray node id and its core slice (vLLM-CPU)."""
        import ray

        return {
            "pid": self.pid,
            "engine_pids": self.engine_pids,
            "node": ray.get_runtime_context().get_node_id(),
            "cores": self.cores,
        }

    def _context(self, job: dict[str, Any]):
        """The job's context (``{key: ContextValue dict}``) pinned on the rollout for the job's duration."""
        from coevo.context import ContextValue

        return self.rollout.pinned_context(
            {k: ContextValue.from_dict(v) for k, v in (job.get("context") or {}).items()}
        )

    def evaluate(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Evaluate one job ``{member, generation, key_prefix, evolver, round_index, context, split}``: a member
        (perturb, roll out under the job's context, restore; split ``train`` by default) or, with ``member``
        None, the centre (no perturbation; the held-out evaluation)."""
        member = ESMember(**job["member"]) if job.get("member") else None
        weights = self.replica.perturbed(member) if member else contextlib.nullcontext(self.policy)
        with self._context(job), weights as policy:
            trajs = self.rollout.run(
                policy,
                generation=job["generation"],
                member=member,
                split=job.get("split", "train"),
                key_prefix=job["key_prefix"],
                evolver=job["evolver"],
                round_index=job["round_index"],
            )
        return self._plain(trajs)

    def evaluate_population(self, job: dict[str, Any]) -> list[list[dict[str, Any]]]:
        """Roll out a group of low-rank members together ``{members, key_prefixes, rank, generation, evolver,
        round_index, context}`` (``replica.population`` + ``rollout.run_population``); one trajectory list per
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

    # ------------------------------------------------------------------ weights
    def apply(self, record: dict[str, Any]) -> str:
        return self.replica.apply(GenerationRecord.from_dict(record))[1]

    def update(self, record: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """:meth:`apply` with the update statistics: ``(UpdateStats dict, hash)``."""
        stats, digest = self.replica.apply(GenerationRecord.from_dict(record))
        return stats.to_dict(), digest

    def load(self, snapshot: str | None, records: list[dict[str, Any]]) -> str:
        return self.replica.load(snapshot, [GenerationRecord.from_dict(r) for r in records])

    def rebuild(self, run_dir: str, rows: list[dict[str, Any]], generation: int) -> tuple[str, int | None]:
        return self.replica.rebuild(run_dir, rows, generation)

    def save_snapshot(self, path: str, meta: dict[str, Any] | None) -> str:
        return self.replica.save_snapshot(path, meta)

    def weights_hash(self) -> str:
        return self.replica.weights_hash()

    def noise_hash(self, member: dict[str, Any]) -> str:
        return self.replica.noise_hash(ESMember(**member))

    def perturb(self, member: dict[str, Any]) -> None:
        """Enter ``replica.perturbed(member)`` until :meth:`restore` (a driver-side ``perturbed`` block)."""
        if self._held is not None:
            raise RuntimeError("a perturbation is already active on this actor; restore it first")
        held = self.replica.perturbed(ESMember(**member))
        held.__enter__()
        self._held = held

    def restore(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.__exit__(None, None, None)

    # ------------------------------------------------------------------ the centre as a policy
    def generate(self, conversations: list, params: Any) -> list[Any]:
        return self.policy.generate(conversations, params)

    def logprob(self, conversations: list, targets: list[str]) -> torch.Tensor:
        return self.policy.logprob(conversations, targets)

    def close(self) -> None:
        """Shut the engine down (its processes exit); the actor is killed after."""
        self.policy.close()


def _children() -> set[int]:
    """Pids of this process's live descendants (psutil comes with Ray and vLLM)."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


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


def _node_problem(model: dict[str, Any], need_gpus: float) -> str | None:
    """Run on a placement group's node by :func:`preflight`: what this node lacks for one replica, or None."""
    import socket

    host = socket.gethostname()
    name = str(model.get("name", ""))
    if not name.startswith("tiny:") and os.path.isabs(name) and not os.path.isdir(name):
        return f"the model folder {name} is missing on node {host}: copy it there (same path) or share it"
    if model.get("backend") == "vllm" and importlib.util.find_spec("vllm") is None:
        return (
            f"vLLM is not installed on node {host} (model.backend vllm): install it there (scripts/install.sh --vllm)"
        )
    if need_gpus > 0:
        try:
            visible = torch.cuda.device_count()
        except Exception:  # noqa: BLE001 - a broken CUDA counts as none
            visible = 0
        if visible < math.ceil(need_gpus):
            return f"node {host} gives the actor {visible} CUDA GPU(s), it needs {need_gpus:g} (worker_num_gpus)"
    return None


def machine_problem(backend: str | None, workers: int, num_cpus: float, num_gpus: float, where: str) -> str | None:
    """What this machine cannot give a pool, read without Ray (``coevo run --check`` and :func:`preflight`): for
    vLLM's CPU build (``backend`` vllm, no GPU per actor) ``workers`` x ``num_cpus`` whole cores of this machine
    (the engines' core slices must not overlap), and without a cluster (no ``RAY_ADDRESS``) ``workers`` x
    ``num_gpus`` CUDA GPUs visible here. Returns one line naming the field (``where``: ``evolvers.<name>``), or
    None."""
    local = not os.environ.get("RAY_ADDRESS")
    if backend == "vllm" and num_gpus == 0:
        if num_cpus != int(num_cpus):
            return f"{where}.worker_num_cpus: a vLLM-CPU engine needs whole cores, got {num_cpus:g}"
        cores = len(os.sched_getaffinity(0))
        if local and workers * int(num_cpus) > cores:
            return (
                f"{where}.workers: {workers} vLLM-CPU engines x {int(num_cpus)} core(s) need "
                f"{workers * int(num_cpus)} cores, this machine gives the run {cores}: lower workers or worker_num_cpus"
            )
    if local and num_gpus > 0:
        try:
            have = torch.cuda.device_count()
        except Exception:  # noqa: BLE001 - a broken CUDA counts as none
            have = 0
        if workers * num_gpus > have:
            return (
                f"{where}.workers: {workers} engines x {num_gpus:g} GPU need {workers * num_gpus:g} GPUs, this "
                f"machine has {have}: lower workers, or start on a machine / cluster (RAY_ADDRESS) with more"
            )
    return None


def preflight(
    model: dict[str, Any], workers: int, num_cpus: float, num_gpus: float, vllm_cpu: bool, where: str = "evolvers.es"
) -> None:
    """Refuse a pool that cannot start, before any placement group or engine (one ``ConfigError`` line naming
    ``where``'s field).

    Checks ``workers`` x ``num_gpus`` against the Ray cluster's GPUs, and for vLLM's CPU build ``workers`` x
    ``num_cpus`` whole cores against this machine's (a local cluster: the engines' core slices must not overlap).
    """
    import ray

    if vllm_cpu and (problem := machine_problem("vllm", workers, num_cpus, 0.0, where)):
        raise ConfigError(problem)
    if num_gpus > 0:
        have = ray.cluster_resources().get("GPU", 0.0)
        if workers * num_gpus > have:
            raise ConfigError(
                f"{where}.workers: {workers} engines x {num_gpus:g} GPU need {workers * num_gpus:g} GPUs, "
                f"the Ray cluster has {have:g}: lower workers, or start on a machine / cluster (RAY_ADDRESS) with more"
            )
    elif model.get("backend") == "vllm" and not vllm_cpu:
        raise ConfigError(f"{where}.worker_num_gpus: vLLM's CUDA build needs worker_num_gpus >= 1 per engine")
    # what is free now, after what the cluster has at all (another pool of this process may hold CPUs). Ray's
    # view of free resources lags a closed pool's placement-group removal, so a short wait before refusing.
    deadline = time.monotonic() + RESOURCE_SETTLE_S
    free = ray.available_resources().get("CPU", 0.0)
    while workers * num_cpus > free and time.monotonic() < deadline:
        time.sleep(0.25)
        free = ray.available_resources().get("CPU", 0.0)
    if workers * num_cpus > free:
        raise ConfigError(
            f"{where}.workers: {workers} actors x {num_cpus:g} CPU need {workers * num_cpus:g} Ray CPUs, the Ray "
            f"cluster has {free:g} free: lower workers or worker_num_cpus"
        )


class RayReplicaPool:
    """``workers`` replicas on Ray actors, one placement group each; the weight side of
    :class:`coevo.es.replica.WeightReplica` for all of them at once (hashes checked equal), plus remote
    member evaluation.

    Args:
        spec: the actors' spec (:class:`ReplicaWorker`), plain data.
        workers: number of actors (>= 1).
        num_cpus, num_gpus: Ray resources per actor (a GPU actor runs its model on ``cuda``).
        where: the config section the pool's settings come from, named in errors (``evolvers.<name>``).

    Raises:
        ValueError: workers < 1. ConfigError: the pool cannot start here (:func:`preflight`, or a node lacks
        the model folder / vLLM). EngineLostError: an actor died while starting. PolicyError: an engine failed
        to start (its one line). ReplicaDivergenceError: the actors start from different weights.
    """

    def __init__(
        self,
        spec: dict[str, Any],
        workers: int,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        where: str = "evolvers.es",
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if workers < 1:
            raise ValueError(f"workers must be >= 1 for a Ray pool, got {workers}")
        self.actors: list[Any] = []
        self.groups: list[Any] = []
        self.infos: list[dict[str, Any]] = []
        model = dict(spec["model"])
        vllm_cpu = model.get("backend") == "vllm" and num_gpus == 0
        self._started = ensure_ray(max(1, math.ceil(workers * num_cpus)))
        try:
            preflight(model, workers, num_cpus, num_gpus, vllm_cpu, where)
            bundle = {"CPU": float(num_cpus), **({"GPU": float(num_gpus)} if num_gpus > 0 else {})}
            self.groups = [placement_group([bundle], strategy="STRICT_PACK") for _ in range(workers)]
            ready, _ = ray.wait([g.ready() for g in self.groups], num_returns=workers, timeout=PLACEMENT_TIMEOUT_S)
            if len(ready) < workers:
                raise ConfigError(
                    f"{where}.workers: only {len(ready)} of {workers} placement groups ({bundle}) could be "
                    f"placed in {PLACEMENT_TIMEOUT_S:.0f} s: the Ray cluster lacks the resources"
                )
            strategies = [
                PlacementGroupSchedulingStrategy(g, placement_group_capture_child_tasks=True) for g in self.groups
            ]
            check = ray.remote(_node_problem)
            problems = ray.get(
                [check.options(num_cpus=0, scheduling_strategy=s).remote(model, num_gpus) for s in strategies]
            )
            if problem := next((p for p in problems if p), None):
                raise ConfigError(f"{where}.workers: {problem}")
            base = dict(spec)
            if num_gpus > 0 and model.get("backend") == "hf":  # a GPU actor runs its HF replica on cuda
                base["model"] = {**model, "device": "cuda"}
            base.setdefault("torch_threads", max(1, int(num_cpus)))
            if vllm_cpu:
                base["cores_per_actor"] = int(num_cpus)
            actor_cls = ray.remote(ReplicaWorker)
            self.actors = [
                actor_cls.options(num_cpus=num_cpus, num_gpus=num_gpus, scheduling_strategy=s, max_restarts=0).remote(
                    {**base, "index": i}
                )
                for i, s in enumerate(strategies)
            ]
            self.infos = self._get([a.info.remote() for a in self.actors], "the engines' start")
            self.start_hashes = self.check(
                self._get([a.weights_hash.remote() for a in self.actors], "the start"), None, "start"
            )
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ calls and faults
    def _lost(self, err: Exception, what: str) -> EngineLostError:
        """The one-line error for an actor that died during ``what``."""
        actor = getattr(err, "actor_id", None)
        index = next((i for i, a in enumerate(self.actors) if actor and a._actor_id.hex() == actor), None)
        who = f"actor {index}" if index is not None else "an actor"
        if index is not None and index < len(self.infos):
            who += f" (pid {self.infos[index]['pid']})"
        cause = (str(getattr(err, "error_msg", "") or err).strip().splitlines() or ["died"])[0]
        return EngineLostError(
            f"the ES engine pool lost {who} during {what}: {cause[:300]}; the members finished before are stored "
            "and a resumed run (coevo run --resume RUN) re-runs the others with the same seeds"
        )

    def _get(self, futures: Any, what: str, timeout: float | None = None) -> Any:
        """``ray.get`` with the pool's errors: a dead actor is :class:`EngineLostError` (one line); an exception
        inside an actor method is re-raised as its own type when it is a user error (e.g. ``PolicyError``: an
        engine that failed to start), else as the Ray task error."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return ray.get(futures, timeout=timeout)
        except RayActorError as e:
            if (user := _user_cause(e)) is not None:  # the actor's __init__ raised: the engine did not start
                raise user from None
            raise self._lost(e, what) from None
        except RayTaskError as e:
            if (user := _user_cause(e)) is not None:
                raise user from None
            raise

    @staticmethod
    def check(hashes: list[str], expected: str | None, what: str) -> list[str]:
        """Raise ``ReplicaDivergenceError`` unless all ``hashes`` (and ``expected``, if given) are equal."""
        allh = list(hashes) + ([expected] if expected is not None else [])
        if len(set(allh)) > 1:
            listing = ", ".join(f"actor {i}: {h[:16]}" for i, h in enumerate(hashes))
            exp = f"; driver: {expected[:16]}" if expected is not None else ""
            raise ReplicaDivergenceError(f"replica weights diverged at {what}: {listing}{exp}")
        return list(hashes)

    # ------------------------------------------------------------------ evaluation
    def evaluate_iter(
        self, jobs: list[dict[str, Any]], what: str = "a generation", between: Any = None
    ) -> Iterator[tuple[int, list[Trajectory]]]:
        """Evaluate member jobs on the actors (each actor takes the next job when it is free); yields
        ``(job index, trajectories)`` as jobs finish, so the caller can store each member at once.
        ``between()`` (e.g. the run context's sample boundary) is called about every second while waiting."""
        import ray

        free = list(range(len(self.actors)))
        running: dict[Any, tuple[int, int]] = {}
        todo = list(range(len(jobs)))
        while todo or running:
            while todo and free:
                i, a = todo.pop(0), free.pop(0)
                running[self.actors[a].evaluate.remote(jobs[i])] = (i, a)
            done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            if not done:
                if between is not None:
                    between()
                continue
            i, a = running.pop(done[0])
            free.append(a)
            yield i, [Trajectory.from_dict(d) for d in self._get(done[0], what)]

    def evaluate(self, jobs: list[dict[str, Any]]) -> list[list[Trajectory]]:
        """Evaluate member jobs on the actors (load-balanced); returns trajectories in job order."""
        out: list[list[Trajectory]] = [[] for _ in jobs]
        for i, ts in self.evaluate_iter(jobs):
            out[i] = ts
        return out

    def evaluate_on(self, index: int, job: dict[str, Any], what: str = "an evaluation") -> list[Trajectory]:
        """One job on actor ``index`` (e.g. the centre's held-out evaluation, ``member`` None)."""
        return [Trajectory.from_dict(d) for d in self._get(self.actors[index].evaluate.remote(job), what)]

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
        groups = self._get(futures, f"generation {generation}'s low-rank population")
        return [[Trajectory.from_dict(d) for d in ds] for group in groups for ds in group]

    # ------------------------------------------------------------------ weights
    def weights_hash(self) -> str:
        """The actors' common weights hash (``ReplicaDivergenceError`` when they differ)."""
        return self.check(
            self._get([a.weights_hash.remote() for a in self.actors], "a hash check"), None, "a hash check"
        )[0]

    def apply(self, record: GenerationRecord, expected: str | None = None) -> tuple[None, str]:
        """Apply a record on every actor; checks their hashes agree (and equal ``expected``); returns
        ``(None, hash)`` (the actors' update stats stay in the actors)."""
        rec = record.to_dict()
        what = f"generation {record.generation}'s update"
        hashes = self._get([a.apply.remote(rec) for a in self.actors], what)
        return None, self.check(hashes, expected, f"generation {record.generation}")[0]

    def update(self, record: GenerationRecord) -> tuple[UpdateStats, str]:
        """Apply a record on every actor; returns actor 0's update statistics and the common hash (checked)."""
        rec = record.to_dict()
        out = self._get([a.update.remote(rec) for a in self.actors], f"generation {record.generation}'s update")
        digest = self.check([h for _, h in out], None, f"generation {record.generation}")[0]
        return UpdateStats(**out[0][0]), digest

    def load(
        self, snapshot: str | Path | None, records: Sequence[GenerationRecord], expected: str | None = None
    ) -> str:
        """Load a snapshot and re-apply records on every actor; checks the hashes; returns the common hash."""
        recs = [r.to_dict() for r in records]
        snap = None if snapshot is None else str(Path(snapshot).resolve())
        return self.check(self._get([a.load.remote(snap, recs) for a in self.actors], "resume"), expected, "resume")[0]

    def rebuild(self, run_dir: str | Path, rows: Sequence[dict[str, Any]], generation: int) -> tuple[str, int | None]:
        """``coevo.es.checkpoint.rebuild`` on every actor (newest snapshot + history); hashes checked."""
        out = self._get(
            [a.rebuild.remote(str(Path(run_dir).resolve()), list(rows), generation) for a in self.actors], "resume"
        )
        return self.check([h for h, _ in out], None, "resume")[0], out[0][1]

    def save_snapshot(self, path: str | Path, meta: dict[str, Any] | None = None) -> str:
        """Actor 0 writes the snapshot (a multi-node cluster needs the run folder shared); returns its hash."""
        return self._get(self.actors[0].save_snapshot.remote(str(Path(path).resolve()), meta), "a weight snapshot")

    def noise_hashes(self, member: ESMember) -> list[str]:
        """Each actor's ``replica.noise_hash`` for ``member``."""
        return self._get([a.noise_hash.remote(asdict(member)) for a in self.actors], "a noise check")

    def engine_pids(self) -> list[int]:
        """Pids of the actors and of their engines' processes, as the actors reported them at start."""
        return sorted({p for info in self.infos for p in [info["pid"], *info["engine_pids"]]})

    def close(self) -> None:
        """Shut every live actor's engine down, kill the actors and remove their placement groups; kill any of
        their processes still alive on this node; shut Ray down if this pool started it. Idempotent."""
        import ray

        if not ray.is_initialized():
            self.actors, self.groups = [], []
            return
        pids = self.engine_pids()
        if self.actors:
            closing = [a.close.remote() for a in self.actors]
            with contextlib.suppress(Exception):
                ray.wait(closing, num_returns=len(closing), timeout=CLOSE_TIMEOUT_S)
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        self.actors = []
        from ray.util.placement_group import remove_placement_group

        for g in self.groups:
            with contextlib.suppress(Exception):
                remove_placement_group(g)
        self.groups = []
        _kill_leftovers(pids)
        self.infos = []
        if self._started and ray.is_initialized():
            ray.shutdown()
            self._started = False


def _user_cause(err: BaseException) -> UserError | None:
    """The user error (e.g. ``PolicyError``, ``ConfigError``) an actor raised, found along Ray's wrappers
    (``RayTaskError.cause``, ``ActorDiedError``'s creation-task error), or None."""
    seen = 0
    while err is not None and seen < 5:
        if isinstance(err, UserError) and "ray" not in type(err).__module__:
            return err
        err = getattr(err, "cause", None) or err.__cause__
        seen += 1
    return None


def _kill_leftovers(pids: Sequence[int], timeout_s: float = 10.0) -> None:
    """SIGKILL the processes among ``pids`` still alive on this node after their actors were killed (an actor
    killed with SIGKILL cannot stop its engine's processes)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    alive = [p for p in pids if psutil.pid_exists(p)]
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if alive:
            time.sleep(0.2)
    for p in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


__all__ = [
    "EngineLostError",
    "RayReplicaPool",
    "ReplicaDivergenceError",
    "ReplicaWorker",
    "ensure_ray",
    "machine_problem",
    "preflight",
]

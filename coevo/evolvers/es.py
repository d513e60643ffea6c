"""ESEvolver (``type: es``): Agentic-ESOpt evolution strategies in parameter space, one generation per step.

Per generation t (Agentic-ESOpt, arXiv 2608.17310, docs/references.md §1; Salimans et al. 2017, Algorithm 2):

1. ``sigma_t`` from the schedule (constant / linear / cosine from ``sigma`` to ``sigma_final`` over
   ``total_generations``, optional warm-up; ``coevo.es.schedule``); alpha is constant.
2. Seeds from the recorded stream ``ctx.rng(evolver name, t)`` (63-bit, ``0 <= seed < 2**63``); with
   ``antithetic`` each seed gives a mirrored pair (+1, -1).
3. Each member is rolled out under ``theta + sign * sigma_t * eps(seed)`` by the configured rollout
   (any registered ``rollout: {type: ...}``; it gets the run context, so it may call cooperating evolvers such
   as EoH through ``ctx.evolvers``); its trajectories go to the store tagged with the member (seed, sign,
   sigma, index). ``R_i = rollout.population_rewards(...)``. With ``perturbation: lowrank`` (EGGROLL, arXiv
   2511.16652, ``coevo.es.lowrank``) member i instead adds ``sign * sigma_t * A_i B_i^T / sqrt(rank)`` to every
   matrix through forward hooks, and all members are rolled out together in batched calls
   (``rollout.run_population``); the weights are not touched until the update.
4. The weights are restored exactly (float32 masters or backups; ``coevo.es.perturb``), the rewards shaped
   (``normalization``: zscore / centered_rank / none) and the update applied:
   ``theta += alpha / N * sum_i c_i * sign_i * eps_i`` (``coevo.es.update``; low rank: ``E_i`` for ``eps_i``,
   one fixed-order product per matrix, stochastic rounding of bf16 weights without masters). At ``sigma_t == 0`` (the last
   generation of a test-time schedule decaying to 0) nothing is applied: every member equals the centre, so
   the update would be noise; ES then only evaluates and the centre is kept (unlike the reference code).
   With ``alpha: 0`` no generation updates (the noise-only control: the children still come from perturbed
   weights; the seed paper's ablation attributes most of its TSP50 gain to that noise, docs/field-notes §8).
5. A history row (``store.add_es_history``): ``GenerationRecord`` fields (seeds, signs, raw rewards,
   coefficients, sigma, alpha, scope, options, weight hash after) plus model id, dtype and metrics: enough to
   replay the weights without rollouts (``coevo es replay``).

Held-out evaluation: every ``eval_every`` generations (and after the last), the centre is rolled out on
``split="test"`` (trajectories with ``member=None``, generation = number of updates applied), reported as
metric ``test_reward``. Budget: a generation starts only if the sample budget covers the whole population
(and its evaluation); otherwise the step asks the loop to stop.

Resume: members whose trajectories are stored (a per-member ``es_member`` artifact lists their keys) are
not rolled out again. Weight snapshots are written every ``checkpoint_every`` generations and at
``close()``; :meth:`ESEvolver.load_checkpoint` loads the newest snapshot <= the checkpointed generation and
replays the history rows after it, checking the weight hash, so the weights are bit-identical to an
uninterrupted run.

Where the replicas live (``workers``, ``worker_num_cpus``, ``worker_num_gpus``: in-process, HF replicas on Ray,
or vLLM engines on Ray) is the run's placement (:mod:`coevo.placement`), chosen once by the loop and reached as
``ctx.placement``: ES asks it for the replica of every copy of the weights (:meth:`Placement.replica`) and to
roll members and the centre out (``evaluate_members`` / ``evaluate_population`` / ``evaluate_centre``), the same
calls for every placement. Each job carries the current value of every context key the rollout declares
(:mod:`coevo.context`), so a published prompt or skill reaches Ray actors. Members are stored as they come
back, so an engine lost mid-generation (:class:`~coevo.placement.ray_pool.EngineLostError`, one line) costs
only the unfinished ones.

Public for other evolvers (between steps): :attr:`ESEvolver.generation` (generations completed = updates
applied), :attr:`ESEvolver.rollout`, ``ctx.policy`` (the centre: no perturbation is active between steps),
:meth:`ESEvolver.members`, :meth:`ESEvolver.key_prefix`, :meth:`ESEvolver.perturbed` and
:meth:`ESEvolver.score_context` (score a candidate context under the centre, cached for resume).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from coevo.artifacts import ES_MEMBER as MEMBER_KIND
from coevo.es import GenerationRecord, Schedule, ScopeSpec, normalize_rewards
from coevo.es.checkpoint import (
    replays_exactly,
    snapshot_mode,
    snapshot_nbytes,
    snapshot_path,
)
from coevo.es.replica import ESReplica
from coevo.evolvers.base import ContextScore, Evolver, EvolverConfig, StepReport, register_evolver, score_context
from coevo.placement import InProcess, PlacementFields, ReplicaSpec, RolloutJob
from coevo.rollouts.base import Rollout, Split, build_rollout, validate_rollout_spec
from coevo.tables import mean
from coevo.types import ESMember, Trajectory

#: artifact kind of the per-member resume markers (content: the member's trajectory keys)
POINTER_FILE = "es.json"


class ESConfig(EvolverConfig, PlacementFields):
    """Settings of the ES evolver (defaults: the Agentic-ESOpt reference values, docs/references.md §1); the
    placement fields (``workers``, ``worker_num_cpus``, ``worker_num_gpus``) come from
    :class:`coevo.placement.PlacementFields`."""

    population_size: int = Field(8, ge=1, description="N: members per generation (even when antithetic)")
    antithetic: bool = Field(True, description="mirrored pairs (seed, +1) / (seed, -1)")
    sigma: float = Field(1e-3, ge=0, description="sigma_0: perturbation scale at the first generation")
    sigma_final: float | None = Field(None, ge=0, description="sigma_T at the last generation (default sigma)")
    schedule: Literal["constant", "linear", "cosine"] = Field("cosine", description="sigma schedule")
    warmup: int = Field(0, ge=0, description="generations of linear sigma warm-up")
    total_generations: int = Field(25, ge=1, description="T: generations of the sigma schedule; ES stops after")
    alpha: float = Field(
        5e-4,
        ge=0,
        description="learning rate (1/sigma folded in unless divide_by_sigma); 0: the noise-only control, members "
        "perturbed and rolled out as usual but no update (history rows recorded as skipped, replay exact)",
    )
    normalization: Literal["zscore", "centered_rank", "none"] = Field("zscore", description="fitness shaping")
    divide_by_sigma: bool = Field(False, description="step alpha/(N sigma) sum c_i eps_i instead of alpha/N")
    weight_decay: float = Field(0.0, ge=0, description="L2 coefficient (Salimans et al. 2017)")
    scope: Literal["full", "all_linear"] = Field("all_linear", description="tensors ES perturbs")
    include: list[str] = Field(default_factory=list, description="glob / re: patterns a name must match")
    exclude: list[str] = Field(default_factory=list, description="glob / re: patterns that drop a name")
    perturbation: Literal["full", "lowrank"] = Field(
        "full",
        description="full: eps of every weight, members one after another, in place (Agentic-ESOpt); "
        "lowrank: EGGROLL rank-r factors, all members in batched rollouts, weights untouched (scope all_linear)",
    )
    rank: int = Field(1, ge=1, description="lowrank: rank r of each member's perturbation A B^T / sqrt(r)")
    restore_mode: Literal["exact", "inference"] = Field(
        "exact", description="full: how perturbations are undone; 'inference' without masters drifts (no exact replay)"
    )
    master_weights: bool | None = Field(
        None,
        description="float32 masters of bf16/fp16 weights (default: on for full; off for lowrank, whose "
        "updates round stochastically instead)",
    )
    rollout: dict[str, Any] = Field(
        default_factory=lambda: {"type": "target_logprob"}, description="rollout spec {type: <registered rollout>, ...}"
    )
    eval_every: int = Field(5, ge=0, description="held-out evaluation of the centre every k generations (0 = off)")
    checkpoint_every: int = Field(
        10, ge=1, description="K: with weight_snapshots full, a weight snapshot every K generations (and at the end)"
    )
    weight_snapshots: Literal["auto", "replay", "full"] = Field(
        "auto",
        description="what ES keeps of its weights (coevo.es.checkpoint): 'replay' no weight file (the base model and "
        "the ES history in store.sqlite rebuild them exactly, for resume and `coevo es export`); 'full' a safetensors "
        "snapshot of the ES scope every checkpoint_every generations and at the end (4 bytes per float32 weight in "
        "scope: 1.4 GB for the 0.5B model); 'auto' (default) replay, or full for a run whose weights drift from its "
        "history (restore_mode inference without master_weights)",
    )

    @field_validator("rollout")
    @classmethod
    def _rollout(cls, v: dict[str, Any]) -> dict[str, Any]:
        return validate_rollout_spec(v)

    @model_validator(mode="after")
    def _check(self) -> ESConfig:
        if self.antithetic and self.population_size % 2:
            raise ValueError(f"population_size must be even when antithetic, got {self.population_size}")
        if self.warmup >= self.total_generations:
            raise ValueError(f"warmup ({self.warmup}) must be < total_generations ({self.total_generations})")
        if self.alpha * self.weight_decay >= 1:
            raise ValueError(f"alpha * weight_decay must be < 1, got {self.alpha} * {self.weight_decay}")
        if self.perturbation == "lowrank" and self.scope != "all_linear":
            raise ValueError("perturbation 'lowrank' perturbs matrices of linear layers only: use scope all_linear")
        if self.master_weights is None:
            self.master_weights = self.perturbation == "full"
        self.weight_snapshots = snapshot_mode(
            self.weight_snapshots, replays_exactly(self.perturbation, self.restore_mode, self.master_weights)
        )
        self.scope_spec()
        self.sigma_schedule()
        return self

    def replica_spec(self) -> ReplicaSpec:
        """What each copy of the weights holds (:class:`coevo.placement.ReplicaSpec`); a low-rank population
        needs ``population_size`` LoRA adapters of rank ``rank`` on vLLM."""
        lora = (self.population_size, self.rank) if self.perturbation == "lowrank" else None
        return ReplicaSpec(self.scope_spec(), bool(self.master_weights), self.restore_mode, self.rollout, lora)

    def scope_spec(self) -> ScopeSpec:
        return ScopeSpec(self.scope, tuple(self.include), tuple(self.exclude))

    def sigma_schedule(self) -> Schedule:
        end = self.sigma if self.sigma_final is None else self.sigma_final
        return Schedule(self.schedule, self.sigma, end, self.total_generations, self.warmup)


def _finite_rewards(rewards: list[float]) -> tuple[list[float], int]:
    """Replace non-finite member rewards by the worst finite one (0.0 if none); returns (rewards, count)."""
    finite = [r for r in rewards if math.isfinite(r)]
    worst = min(finite) if finite else 0.0
    return [r if math.isfinite(r) else worst for r in rewards], len(rewards) - len(finite)


@register_evolver("es")
class ESEvolver(Evolver):
    """Parameter-space ES over the run's policy (module docstring). One :meth:`step` = one generation."""

    space = "parameter"
    Config = ESConfig

    def __init__(self, name: str, config: ESConfig, ctx) -> None:
        super().__init__(name, config, ctx)
        self.generation = 0  # generations completed = updates applied
        self.schedule = config.sigma_schedule()
        self.rollout = build_rollout(config.rollout, ctx)
        self.weights_hash: str | None = None
        self.last_snapshot: dict[str, Any] | None = None
        self._replica: ESReplica | None = None
        #: where the replicas live (:mod:`coevo.placement`); a context built outside the loop has none: in-process
        self.placement = ctx.placement if ctx.placement is not None else InProcess(ctx.policy_factory)

    # ------------------------------------------------------------------ replicas
    @property
    def replica(self) -> ESReplica:
        """The ES replica of every copy of the run's weights (created on first use by the placement,
        :meth:`coevo.placement.Placement.replica`): :class:`coevo.es.replica.ESReplica`, whose ``policy`` is
        ``ctx.policy``."""
        if self._replica is None:
            self._replica = self.placement.replica(self.config.replica_spec(), self.ctx.policy)
            if self.weights_hash is None:
                self.weights_hash = self._replica.weights_hash()
        return self._replica

    # ------------------------------------------------------------------ public hooks
    def members(self, generation: int) -> list[ESMember]:
        """The population of ``generation``: seeds from ``ctx.rng(name, generation)``, sigma from the schedule."""
        cfg = self.config
        rng = self.ctx.rng(self.name, generation)
        sigma = self.schedule(generation)
        if cfg.antithetic:
            seeds = [rng.getrandbits(63) for _ in range(cfg.population_size // 2)]
            pairs = [(s, sign) for s in seeds for sign in (1, -1)]
        else:
            pairs = [(rng.getrandbits(63), 1) for _ in range(cfg.population_size)]
        return [ESMember(seed=s, sigma=sigma, sign=sign, index=i) for i, (s, sign) in enumerate(pairs)]

    def key_prefix(self, generation: int, member: ESMember | None) -> str:
        """Trajectory key prefix of a member (``.../g00003/m002``) or of the centre (``.../g00003/centre``)."""
        who = "centre" if member is None else f"m{member.index:03d}"
        return self.ctx.traj_key(self.name, f"g{generation:05d}", who)

    def perturbed(self, member: ESMember) -> AbstractContextManager:
        """``with es.perturbed(member) as policy:`` the run's policy under the member's perturbation,
        restored on exit (for evolvers that score members their own way)."""
        return self.replica.perturbed(member)

    def evaluate_members(self, generation: int, members: list[ESMember], round_index: int) -> list[list[Trajectory]]:
        """Trajectories of each member (stored ones reused, the rest rolled out and recorded), in order.

        ``perturbation: lowrank`` rolls the whole population out together (``replica.population`` and
        ``rollout.run_population``; on Ray, one contiguous group of members per actor) whenever a member is
        missing, so every member always shares its batches with the same members, as in an uninterrupted run
        (stored members keep their stored trajectories)."""
        out: list[list[Trajectory] | None] = [self._cached(self.key_prefix(generation, m)) for m in members]
        todo = [i for i, ts in enumerate(out) if ts is None]
        if not todo:
            return out  # type: ignore[return-value]
        context = self._job_context()
        jobs = [
            RolloutJob(m, generation, self.key_prefix(generation, m), self.name, round_index, "train", context)
            for m in members
        ]
        if self.config.perturbation == "lowrank":
            fresh = self.placement.evaluate_population(self.rollout, self.replica, members, jobs, self.config.rank)
            for i in todo:
                out[i] = self._record(jobs[i].key_prefix, fresh[i], members[i])
        else:
            # each member is stored as soon as it is back: a replica lost mid-generation leaves the finished ones
            between = functools.partial(self.ctx.sample_boundary, 0)
            for j, ts in self.placement.evaluate_members(self.rollout, self.replica, [jobs[i] for i in todo], between):
                out[todo[j]] = self._record(jobs[todo[j]].key_prefix, ts, members[todo[j]])
        return out  # type: ignore[return-value]

    def _job_context(self) -> dict[str, dict[str, Any]]:
        """The current value of every context key the rollout declares, as plain data for a Ray job."""
        return {k: self.ctx.context(k).to_dict() for k in self.rollout.declared_context()}

    def score_context(
        self,
        values: Mapping[str, Any],
        *,
        evolver: str,
        label: str,
        split: Split = "train",
        generation: int | None = None,
        round_index: int | None = None,
        rollout: Rollout | None = None,
    ) -> ContextScore | None:
        """Score a candidate context under the unperturbed centre: the ES rollout (or ``rollout``) with
        ``values`` pinned (context key -> value) on a generation's cases (:func:`coevo.evolvers.base.score_context`).

        Cached by key: the trajectories are recorded under ``evolver`` (the calling evolver, in its space) with
        keys ``<run>/<evolver>/score/<this ES>/g<generation>/<label>/...``; calling again with the same
        ``evolver``, ``label``, ``split`` and ``generation`` (e.g. a step re-run after a resume) returns the stored
        score without sampling. Give each distinct candidate its own ``label``.

        Args:
            values: the candidate context (plain values: version -1 in the trajectories' ``ContextRef``).
            evolver: the calling evolver's name (owner of the trajectories and their samples).
            label: names the candidate in the keys (e.g. ``"r3-c1"``).
            split: ``"train"`` (default: the generation's training cases) or ``"test"`` (held-out).
            generation: whose train cases (default: the last completed generation's, ``generation - 1``: the
                cases its members ran on; 0 before any).
            round_index: recorded round (default: ``ctx.round``).
            rollout: score with this rollout instead of the ES rollout (e.g. a gate's variant of it).

        Returns:
            The score and trajectories, or None when the sample budget cannot pay for the cases.

        Raises:
            RuntimeError: called while a perturbation is active (inside a member's rollout).
        """
        if self._replica is not None and self._replica.active:
            raise RuntimeError("a perturbation is active: a context cannot be scored under the centre now")
        g = max(0, self.generation - 1) if generation is None else generation
        return score_context(
            self.ctx,
            rollout or self.rollout,
            values,
            evolver=evolver,
            key_prefix=self.ctx.traj_key(evolver, "score", self.name, f"g{g:05d}", label),
            split=split,
            generation=g,
            round_index=round_index,
        )

    def evaluate_centre(self, generation: int, round_index: int) -> tuple[list[Trajectory], float]:
        """Held-out evaluation of the current centre (cached by key); returns (trajectories, test reward)."""
        prefix = self.key_prefix(generation, None)
        ts = self._cached(prefix)
        if ts is None:
            if self.replica.active:
                raise RuntimeError("a perturbation is active: the centre cannot be evaluated now")
            job = RolloutJob(None, generation, prefix, self.name, round_index, "test", self._job_context())
            ts = self._record(prefix, self.placement.evaluate_centre(self.rollout, self.replica, job), None)
        return ts, self.rollout.member_reward(ts)

    def _cached(self, prefix: str) -> list[Trajectory] | None:
        art = self.ctx.store.get_artifact(MEMBER_KIND, prefix)
        if art is None:
            return None
        ts = [self.ctx.cached(k) for k in art.content["keys"]]
        return None if any(t is None for t in ts) else ts

    def _record(self, prefix: str, trajs: list[Trajectory], member: ESMember | None) -> list[Trajectory]:
        for t in trajs:
            t.run_id = t.run_id or self.ctx.run_id
            if member is not None and t.member is None:
                t.member = member
        stored = [s for s, _ in self.ctx.store.add_trajectories(trajs)] if trajs else []
        content = {"keys": [t.key for t in stored], "member": asdict(member) if member else None}
        self.ctx.store.put_artifact(self.ctx.run_id, MEMBER_KIND, prefix, content, key=prefix)
        return stored

    # ------------------------------------------------------------------ one generation
    def _evals_due(self, generation: int) -> tuple[bool, bool]:
        """(evaluate the centre before this generation's update, evaluate it after): every ``eval_every``
        generations before the update, and after the last generation's update."""
        k = self.config.eval_every
        return k > 0 and generation % k == 0, k > 0 and generation == self.config.total_generations - 1

    def _budget_needed(self, generation: int, members: list[ESMember]) -> int:
        """Samples this generation still needs: uncached members x train cases + uncached evaluations."""
        per_member = self.rollout.n_cases("train") or 1
        need = per_member * sum(self._cached(self.key_prefix(generation, m)) is None for m in members)
        for due, g in zip(self._evals_due(generation), (generation, generation + 1), strict=True):
            if due and self._cached(self.key_prefix(g, None)) is None:
                need += self.rollout.n_cases("test") or 1
        return need

    def step(self, round_index: int) -> StepReport:
        """One ES generation: draw seeds, evaluate the members under perturbed weights, normalise their
        rewards, update the centre (no update at sigma = 0), record the history row, and evaluate the centre
        on the held-out split every ``eval_every`` generations. Stops the run after ``total_generations``."""
        cfg, g = self.config, self.generation
        if g >= cfg.total_generations:
            return StepReport(stop=True, stop_reason=f"ES completed its {cfg.total_generations} generations")
        members = self.members(g)
        need = self._budget_needed(g, members)
        if need and self.ctx.budget.allow(need) < need:
            return StepReport(
                stop=True,
                stop_reason=(
                    f"the sample budget left ({self.ctx.budget.remaining()}) cannot cover ES generation {g} "
                    f"({need} samples: {len(members)} members x {self.rollout.n_cases('train') or 1} cases + evaluation)"
                ),
            )
        eval_before, eval_after = self._evals_due(g)
        rep = StepReport()
        if eval_before:
            ts, test_before = self.evaluate_centre(g, round_index)
            rep.metrics["test_reward"] = test_before
            rep.samples += sum(t.llm_calls for t in ts)
        trajs = self.evaluate_members(g, members, round_index)
        rewards, n_bad = _finite_rewards([float(r) for r in self.rollout.population_rewards(trajs)])
        coeffs = normalize_rewards(rewards, cfg.normalization).tolist()
        sigma = members[0].sigma
        record = GenerationRecord(
            generation=g,
            seeds=[m.seed for m in members],
            signs=[m.sign for m in members],
            rewards=rewards,
            coeffs=coeffs,
            sigma=sigma,
            alpha=cfg.alpha,
            normalization=cfg.normalization,
            scope=cfg.scope_spec().to_dict(),
            divide_by_sigma=cfg.divide_by_sigma,
            weight_decay=cfg.weight_decay,
            skipped=sigma == 0.0 or cfg.alpha == 0.0,
            master_dtype="float32" if cfg.master_weights else None,
            perturbation=cfg.perturbation,
            rank=cfg.rank if cfg.perturbation == "lowrank" else None,
        )
        before = self.replica.weights_hash() if self.weights_hash is None else self.weights_hash
        stats, after = self.replica.apply(record)  # on every copy of the weights, hashes checked equal
        record.weight_hash_after = after
        self._write_history(record, before, stats.to_dict(), rep.metrics.get("test_reward"), round_index)
        self.generation, self.weights_hash = g + 1, after
        if self.generation % cfg.checkpoint_every == 0:
            self.snapshot()
        if eval_after:
            ts, test_after = self.evaluate_centre(self.generation, round_index)
            rep.metrics["test_reward"] = test_after
            rep.samples += sum(t.llm_calls for t in ts)
        flat = [t for ts in trajs for t in ts]
        rep.samples += sum(t.llm_calls for t in flat)
        rep.trajectories = len(flat)
        rep.best_reward = max(rewards)
        rep.metrics.update(
            generation=float(g),
            sigma=sigma,
            alpha=cfg.alpha,
            mean_reward=mean(rewards),
            max_reward=max(rewards),
            min_reward=min(rewards),
            update_norm=stats.update_norm,
            changed_fraction=stats.changed_fraction,
            skipped=float(stats.skipped),
            nonfinite_rewards=float(n_bad),
        )
        return rep

    def _write_history(
        self, record: GenerationRecord, before: str, update: dict, test_reward, round_index: int
    ) -> None:
        policy = self.replica.policy
        row = {
            **record.to_dict(),
            "model_id": policy.model_id,
            "dtype": str(getattr(policy, "dtype", "")),
            "restore_mode": self.config.restore_mode,
            "antithetic": self.config.antithetic,
            "weight_hash_before": before,
            "update": update,
            "test_reward_before": test_reward,
            "round": round_index,
            "workers": self.placement.workers,
        }
        if not self.ctx.store.add_es_history(self.ctx.run_id, self.name, record.generation, row):
            stored = {r["generation"]: r for r in self.ctx.store.es_history(self.ctx.run_id, self.name)}
            old = stored[record.generation]["weight_hash_after"]
            if old != record.weight_hash_after:
                raise RuntimeError(
                    f"ES generation {record.generation} re-run after a resume gives weights "
                    f"{record.weight_hash_after[:16]}… but the stored history says {old[:16]}…"
                )

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self) -> str:
        """Write ``<run_dir>/weights/gen-XXXXX.safetensors`` for the current generation; returns its hash.

        Nothing is written with ``weight_snapshots: replay`` (the default: the base model plus the history
        rebuild the weights exactly) or while no generation has changed the weights (every update skipped at
        sigma = 0 or all coefficients zero, no weight decay); a snapshot of a 0.5B model with float32 masters
        takes about 2 GB.
        """
        if self.config.weight_snapshots == "replay":
            return self.replica.weights_hash()
        rows = self.ctx.store.es_history(self.ctx.run_id, self.name)
        if all(r.get("skipped") or (not any(r.get("coeffs", [])) and not r.get("weight_decay")) for r in rows):
            return self.replica.weights_hash()
        path = snapshot_path(self.ctx.run_dir, self.generation)
        digest = self.replica.save_snapshot(
            path,
            {
                "generation": self.generation,
                "model_id": self.replica.policy.model_id,
                "evolver": self.name,
                "run_id": self.ctx.run_id,
            },
        )
        self.last_snapshot = {
            "generation": self.generation,
            "path": str(path.relative_to(self.ctx.run_dir)),
            "weights_hash": digest,
        }
        return digest

    def _history(self) -> list[dict[str, Any]]:
        return self.ctx.store.es_history(self.ctx.run_id, self.name)

    def state_dict(self) -> dict[str, Any]:
        return {"generation": self.generation, "weights_hash": self.weights_hash}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generation = int(state.get("generation", 0))

    def save_checkpoint(self, directory: Path) -> None:
        """Write ``es.json``: generations done, current weights hash, last snapshot (path, hash)."""
        pointer = {"generation": self.generation, "weights_hash": self.weights_hash, "snapshot": self.last_snapshot}
        (Path(directory) / POINTER_FILE).write_text(json.dumps(pointer, indent=1))

    def load_checkpoint(self, directory: Path) -> None:
        """Rebuild the weights of the checkpointed generation (newest snapshot + history replay, no rollouts).

        Raises:
            ValueError: missing history rows. SnapshotError / ReplayMismatchError / RuntimeError: the rebuilt
                weights' hash differs from the checkpointed one.
        """
        pointer = json.loads((Path(directory) / POINTER_FILE).read_text())
        self.generation = int(pointer["generation"])
        if self.generation == 0:
            return
        digest, _ = self.replica.rebuild(self.ctx.run_dir, self._history(), self.generation)
        if pointer.get("weights_hash") and digest != pointer["weights_hash"]:
            raise RuntimeError(f"resumed ES weights hash {digest} != checkpointed {pointer['weights_hash']}")
        self.weights_hash, self.last_snapshot = digest, pointer.get("snapshot")

    def close(self) -> None:
        """Write the final weight snapshot (if not written yet); the loop closes the placement after."""
        if (
            self._replica is not None
            and self.generation > 0
            and (self.last_snapshot is None or self.last_snapshot["generation"] != self.generation)
        ):
            self.snapshot()
        self.rollout.close()

    def _kept_weights(self) -> str:
        """The report's sentence on what the run keeps of its weights (``weight_snapshots``) and how to get them."""
        params = getattr(self._replica, "params", None)  # in-process replicas: the size of one snapshot
        size = f" of about {snapshot_nbytes(params) / 1e9:.3g} GB each" if params is not None else ""
        if self.config.weight_snapshots == "replay":
            return (
                "Weights: no weight file is kept (`weight_snapshots: replay`): the base model and this run's ES "
                "history in `store.sqlite` rebuild them exactly; `coevo es export RUN_DIR OUT` writes them as a "
                f"transformers folder. Set `weight_snapshots: full` for snapshot files{size}."
            )
        return (
            f"Weights: snapshot files in `weights/` (`weight_snapshots: full`: every {self.config.checkpoint_every} "
            f"generations and at the end of the run{',' + size if size else ''}); `coevo es export "
            "RUN_DIR OUT` starts from the newest."
        )

    def report_markdown(self) -> str | None:
        """A table of the ES generations (sigma, rewards, update size, held-out reward) from the history."""
        from coevo.tables import md_table

        rows = self.ctx.store.es_history(self.ctx.run_id, self.name)
        if not rows:
            return None
        table = [
            [
                r["generation"],
                r["sigma"],
                mean(r["rewards"]),  # correctly rounded: rewards that cancel give 0, not -6.9e-18
                max(r["rewards"]),
                r.get("update", {}).get("update_norm"),
                r.get("test_reward_before"),
                ("skipped (alpha 0: noise only)" if r.get("alpha") == 0 else "skipped (sigma 0)")
                if r["skipped"]
                else "applied",
            ]
            for r in rows
        ]
        final = self._cached(self.key_prefix(len(rows), None))
        tail = (
            f"\n\nHeld-out reward after generation {len(rows) - 1}: {self.rollout.member_reward(final):.4g}"
            if final
            else ""
        )
        total = self.config.total_generations
        ran = f"{len(rows)} of its {total} generations ran" + (
            " (the run stopped first: see the stop reason at the top)" if len(rows) < total else ""
        )
        if self.config.eval_every == 0:
            tail += "\n\nNo held-out evaluation of the centre: `eval_every` is 0 in this config (`test R` stays empty)."
        head = (
            f"### ES `{self.name}`\n\n{ran}. N={self.config.population_size}, antithetic={self.config.antithetic}, "
            f"scope={self.config.scope}, perturbation={self.config.perturbation}"
            f"{f' (rank {self.config.rank})' if self.config.perturbation == 'lowrank' else ''}, "
            f"rollout={self.config.rollout['type']}; weights hash "
            f"`{(self.weights_hash or '')[:16]}`; replay with `coevo es replay RUN_DIR --check`. {self._kept_weights()}\n\n"
        )
        return (
            head
            + md_table(
                [
                    "gen",
                    "sigma",
                    "mean member reward R",
                    "max member reward R",
                    "‖update‖",
                    "test R (before)",
                    "update",
                ],
                table,
            )
            + tail
        )

"""Shared machinery of the heuristic-design evolvers (:mod:`coevo.evolvers.eoh`, :mod:`coevo.evolvers.sampling`).

One LLM call is one trajectory. :meth:`AHDEvolver.sample` turns a batch of prompts into recorded
trajectories: cached ones (deterministic keys, resume) are reused, the rest are cut to the sample budget,
generated in one batched ``policy.generate`` call, parsed (thought in braces + code of the problem's
function), evaluated in parallel in the sandbox on the training instances, and recorded valid or not
(failed samples count against the budget). Reward is the evaluator's score (``-objective`` for minimisation
problems, higher is better); the raw objective, code and thought go to ``Trajectory.meta``.

The base class also keeps the best heuristic found (``kind="heuristic"`` artifacts,
``run_dir/best_heuristic.py``) and writes the report section comparing it with the problem's seed heuristic
on held-out test instances, with the gap to the problem's named reference.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from pydantic import Field, field_validator

from coevo.ahd.evaluate import evaluate_heuristic, evaluate_many
from coevo.ahd.problem import HeuristicProblem, load_problem
from coevo.evolvers.base import Evolver, EvolverConfig, RunContext
from coevo.report.writer import md_table
from coevo.sandbox import pool
from coevo.sandbox.extract import extract_code
from coevo.sandbox.runner import Sandbox, SandboxLimits
from coevo.types import ContextRef, ESMember, EvalResult, Step, Trajectory

ARTIFACT_KIND = "heuristic"


@dataclass
class Individual:
    """A heuristic in a population: EoH's (thought, code, objective) plus provenance.

    Attributes:
        id: unique id (the trajectory key without the run id, or ``"seed"``).
        thought: the one-sentence idea. code: source defining the problem's function.
        objective: mean objective on the training instances (problem units). reward: the evaluator's score
            (higher is better). operator: the EoH operator that made it. generation: when it was made.
        parents: ids of its parents. source: the evolver that produced it.
    """

    id: str
    thought: str
    code: str
    objective: float
    reward: float
    operator: str = "i1"
    generation: int = 0
    parents: list[str] = field(default_factory=list)
    source: str = ""

    @property
    def code_hash(self) -> str:
        """sha256 of the code with surrounding and trailing-line whitespace removed (hex, 16 chars)."""
        norm = "\n".join(line.rstrip() for line in self.code.strip().splitlines())
        return hashlib.sha256(norm.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Individual:
        return cls(**d)

    @classmethod
    def from_trajectory(cls, t: Trajectory) -> Individual:
        """The individual a valid heuristic trajectory holds (its meta has code, thought, objective)."""
        m = t.meta
        return cls(
            id=t.key.split("/", 1)[-1], thought=m.get("thought") or "", code=m["code"],
            objective=float(m["objective"]), reward=float(t.reward), operator=m.get("operator", "i1"),
            generation=t.generation, parents=list(m.get("parent_ids") or []), source=t.evolver,
        )  # fmt: skip


@dataclass
class SampleJob:
    """One LLM call to make: the prompt, its operator and parents, and its deterministic key and seed."""

    key: str
    operator: str
    messages: list[dict[str, str]]
    seed: int
    parents: list[Individual] = field(default_factory=list)
    extra_meta: dict[str, Any] = field(default_factory=dict)


class AHDConfig(EvolverConfig):
    """Settings shared by the heuristic-design evolvers."""

    problem: str = Field(description="heuristic problem: a folder name under heuristics/ (e.g. tsp_construct)")
    train_size: int | None = Field(None, ge=1, description="training instance size (default: the problem's)")
    train_count: int = Field(8, ge=1, description="training instances (EoH: 8 x TSP50)")
    train_seed: int = Field(2024, ge=0, description="seed of the training instances")
    test_sizes: list[int] | None = Field(
        None, description="held-out test sizes for the report (default: the problem's first three sizes)"
    )
    test_count: int = Field(16, ge=1, description="held-out instances per test size")
    test_seed: int = Field(1234, ge=0, description="seed of the held-out instances (keep != train_seed)")
    eval_timeout_s: float = Field(30.0, gt=0, description="wall-clock limit of one evaluation (s)")
    eval_memory_mb: int = Field(2048, ge=64, description="address-space limit of one evaluation (MiB)")
    eval_workers: int = Field(2, ge=1, description="evaluations run in parallel")
    temperature: float | None = Field(None, ge=0, description="overrides the run's sampling.temperature")
    top_p: float | None = Field(None, gt=0, le=1, description="overrides the run's sampling.top_p")
    top_k: int | None = Field(None, ge=0, description="overrides the run's sampling.top_k")
    max_new_tokens: int | None = Field(None, ge=1, description="overrides the run's sampling.max_new_tokens")

    @field_validator("problem")
    @classmethod
    def _known_problem(cls, v: str) -> str:
        from pathlib import Path

        from coevo.ahd.problem import available_problems

        if v in available_problems() or (Path(v) / "problem.py").is_file():
            return v
        raise ValueError(f"unknown problem {v!r}; available: {available_problems()} or a folder with a problem.py")

    @field_validator("test_sizes")
    @classmethod
    def _sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(s < 1 for s in v)):
            raise ValueError("test_sizes must be a non-empty list of sizes >= 1")
        return v


@dataclass
class ParallelSandbox:
    """A :class:`~coevo.sandbox.runner.Sandbox` whose batch evaluation (used by
    :func:`coevo.ahd.evaluate.evaluate_many`) runs ``workers`` isolated processes at a time
    (:func:`coevo.sandbox.pool.evaluate_many`)."""

    sandbox: Sandbox
    workers: int

    def run(self, code: str, function_name: str, target: str, payload: dict[str, Any]) -> EvalResult:
        return self.sandbox.run(code, function_name, target, payload)

    def evaluate_many(self, requests: list[dict[str, Any]]) -> list[EvalResult]:
        return pool.evaluate_many(self.sandbox, requests, max_workers=self.workers)


def _messages_text(messages: list[dict[str, str]]) -> str:
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


class AHDEvolver(Evolver):
    """Base of the heuristic-design evolvers: sampling, evaluation, recording, best tracking, report.

    Raises:
        ValueError: ``problem`` names no problem (the message lists the available ones).
    """

    space: ClassVar[str] = "context"
    Config: ClassVar[type[EvolverConfig]] = AHDConfig

    def __init__(self, name: str, config: AHDConfig, ctx: RunContext):
        super().__init__(name, config, ctx)
        try:
            self.problem: HeuristicProblem = load_problem(config.problem)
        except ValueError as exc:
            raise ValueError(f"evolvers.{name}.problem: {exc}") from None
        self.train_size = config.train_size or self.problem.default_size
        self.train_tag = f"{self.problem.name}/n{self.train_size}x{config.train_count}/s{config.train_seed}"
        self._train = None
        self._sandbox = None
        self.best: Individual | None = None
        self._test_cache: dict[tuple[str, int], EvalResult] = {}

    # ------------------------------------------------------------------ instances and evaluation
    @property
    def train_instances(self):
        """The training :class:`~coevo.ahd.instances.InstanceSet` (generated once, deterministic)."""
        if self._train is None:
            c = self.config
            self._train = self.problem.generate(self.train_size, c.train_count, c.train_seed)
        return self._train

    def sampling_params(self):
        """The run's decoding settings with this evolver's overrides."""
        c = self.config
        return self.ctx.sampling_params(
            temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, max_new_tokens=c.max_new_tokens
        )

    @property
    def sandbox(self) -> ParallelSandbox:
        """The sandbox evaluations run in (limits ``eval_timeout_s`` / ``eval_memory_mb``, ``eval_workers``
        processes at a time); created on first use."""
        if self._sandbox is None:
            c = self.config
            limits = SandboxLimits(timeout_s=c.eval_timeout_s, memory_mb=c.eval_memory_mb)
            self._sandbox = ParallelSandbox(Sandbox(limits), c.eval_workers)
        return self._sandbox

    def evaluate(self, codes: list[str], instances=None) -> list[EvalResult]:
        """Evaluate heuristics in parallel in the sandbox (default: on the training instances); one
        :class:`~coevo.types.EvalResult` per code, in order, invalid ones never raising."""
        if not codes:
            return []
        return evaluate_many(
            self.problem, codes, self.train_instances if instances is None else instances, sandbox=self.sandbox
        )

    # ------------------------------------------------------------------ sampling
    def sample(
        self,
        jobs: list[SampleJob],
        *,
        policy=None,
        round_index: int,
        generation: int,
        evolver: str | None = None,
        member: ESMember | None = None,
    ) -> list[Trajectory]:
        """Run ``jobs`` as LLM calls and return their trajectories (in job order).

        Jobs whose key is stored are reused without a call. The rest are cut to ``ctx.budget.allow(n)``
        (so the returned list may be shorter than ``jobs``), generated in one ``policy.generate`` call
        seeded with the first pending job's seed, parsed, evaluated and recorded. Every call is recorded,
        valid or not (failure kinds ``llm_error``, ``parse`` or the evaluator's).

        Args:
            policy: the model (default the run's). evolver: name recorded on the trajectories (default
            this evolver). member: the ES member the policy is perturbed with (recorded; ``space`` then
            becomes "parameter").

        Raises:
            PolicyError: the backend cannot serve the request at all (not a bad sample).
        """
        found = [(job, self.ctx.cached(job.key)) for job in jobs]
        pending = [job for job, t in found if t is None]
        pending = pending[: self.ctx.budget.allow(len(pending))]
        made: dict[str, Trajectory] = {}
        if pending:
            policy = policy or self.ctx.policy
            params = self.sampling_params().with_seed(pending[0].seed)
            started = time.time()
            completions = policy.generate([job.messages for job in pending], params)
            extractions = [
                extract_code(c.text, self.problem.function_name) if c.error is None else None for c in completions
            ]
            to_eval = [i for i, e in enumerate(extractions) if e is not None and e.code is not None]
            results = dict(zip(to_eval, self.evaluate([extractions[i].code for i in to_eval])))
            for i, (job, comp) in enumerate(zip(pending, completions)):
                t = self._trajectory(job, comp, extractions[i], results.get(i), round_index, generation,
                                     evolver or self.name, member, started, params.seed)  # fmt: skip
                made[job.key] = self.ctx.record(t)
        return [t if t is not None else made[job.key] for job, t in found if t is not None or job.key in made]

    def _trajectory(self, job, comp, extraction, result, round_index, generation, evolver, member, started, seed):
        meta: dict[str, Any] = {
            "problem": self.problem.name, "operator": job.operator, "instances": self.train_tag,
            "parent_ids": [p.id for p in job.parents], "parent_objectives": [p.objective for p in job.parents],
            "parent_objective": self._best_objective(job.parents), "seed": job.seed, "batch_seed": seed,
            "finish_reason": comp.finish_reason, "code": None, "thought": None, "objective": None,
            **job.extra_meta,
        }  # fmt: skip
        failure = detail = feedback = None
        if comp.error is not None:
            failure, detail = "llm_error", comp.error
        elif extraction.code is None:
            failure, detail = extraction.error or "parse", extraction.detail
            meta["thought"] = extraction.thought
        else:
            meta.update(code=extraction.code, thought=extraction.thought or "")
            feedback = result.feedback
            if result.valid:
                meta.update(objective=result.objective, metrics=result.metrics)
            else:
                failure, detail = result.error_kind or "other", result.error
        reward = result.score if failure is None else None
        step = Step(
            observation=_messages_text(job.messages), model_output=comp.text,
            action=None if extraction is None else extraction.code, tool_result=feedback or detail, reward=reward,
        )  # fmt: skip
        return Trajectory(
            key=job.key, run_id=self.ctx.run_id, evolver=evolver, space="parameter" if member else self.space,
            round=round_index, generation=generation, task_id=self.train_tag, steps=[step], reward=reward,
            valid=failure is None, failure=failure, failure_detail=detail, member=member,
            context=ContextRef(heuristic_id=",".join(meta["parent_ids"]) or None, prompt=job.operator),
            llm_calls=1, prompt_tokens=comp.prompt_tokens, completion_tokens=comp.completion_tokens,
            started_at=started, duration_s=time.time() - started, meta=meta,
        )  # fmt: skip

    def _best_objective(self, parents: list[Individual]) -> float | None:
        if not parents:
            return None
        return max(parents, key=lambda p: p.reward).objective

    # ------------------------------------------------------------------ best heuristic
    def note_best(self, candidates: list[Individual]) -> bool:
        """Make the best of ``candidates`` the run's best if it beats the current one (higher reward).

        A new best is stored as a ``kind="heuristic"`` artifact (idempotent on its id) and written to
        ``run_dir/best_heuristic.py``. Returns whether the best changed.
        """
        finite = [c for c in candidates if math.isfinite(c.reward)]
        if not finite:
            return False
        top = max(finite, key=lambda c: c.reward)
        if self.best is not None and top.reward <= self.best.reward:
            return False
        self.best = top
        self.ctx.store.put_artifact(
            self.ctx.run_id, ARTIFACT_KIND, f"{self.problem.name}/{self.name}",
            {**top.to_dict(), "problem": self.problem.name, "instances": self.train_tag},
            key=f"{self.ctx.run_id}/{self.name}/best/{top.id}", meta={"evolver": self.name},
        )  # fmt: skip
        self.write_best_file()
        return True

    def write_best_file(self) -> None:
        """Write ``run_dir/best_heuristic.py`` (the best code under a header naming its origin)."""
        if self.best is None:
            return
        b = self.best
        thought = " ".join(b.thought.split())
        header = (
            f"# Best heuristic for {self.problem.name} found by evolver {self.name!r} (run {self.ctx.run_id}).\n"
            f"# Idea: {thought}\n# Training objective ({self.problem.objective_name}, {self.problem.direction}): "
            f"{b.objective:.6g} on {self.train_tag}; id {b.id}.\n\n"
        )
        (self.ctx.run_dir / "best_heuristic.py").write_text(header + b.code.strip() + "\n")

    # ------------------------------------------------------------------ report
    def test_sizes(self) -> list[int]:
        return list(self.config.test_sizes or self.problem.sizes[:3] or [self.train_size])

    def _test_result(self, code: str, size: int) -> EvalResult:
        key = (hashlib.sha256(code.encode()).hexdigest(), size)
        if key not in self._test_cache:
            inst = self.problem.generate(size, self.config.test_count, self.config.test_seed)
            self._test_cache[key] = evaluate_heuristic(self.problem, code, inst, sandbox=self.sandbox, timeout_basis=(self.train_size, self.config.train_count))
        return self._test_cache[key]

    def comparison_rows(self) -> list[list[Any]]:
        """Per test size: [size, instances, seed mean objective, seed gap %, best mean objective, best gap %,
        reference]. Invalid results show as ``None``."""
        seed = self.problem.seed_heuristic_code()
        rows = []
        for size in self.test_sizes():
            rs = self._test_result(seed, size)
            rb = self._test_result(self.best.code, size) if self.best else None
            ref = rs.metrics.get("reference") or (rb.metrics.get("reference") if rb else None)
            rows.append([
                size, self.config.test_count, rs.objective, rs.metrics.get("gap_percent"),
                rb.objective if rb else None, rb.metrics.get("gap_percent") if rb else None, ref,
            ])  # fmt: skip
        return rows

    def report_markdown(self) -> str:
        """Seed heuristic vs best evolved heuristic on held-out instances (mean objective, gap %)."""
        p = self.problem
        lines = [
            (
                f"Problem `{p.name}` ({p.objective_name}, {p.direction}); training set {self.train_tag}; "
                f"held-out instances: {self.config.test_count} per size, seed {self.config.test_seed}. Gaps are "
                "measured against the reference named in the last column."
            ),
            "",
            md_table(
                ["size", "instances", "seed objective", "seed gap %", "best objective", "best gap %", "reference"],
                self.comparison_rows(),
            ),
        ]
        if self.best is not None:
            b = self.best
            summary = f"Best heuristic `{b.id}` (training objective {b.objective:.6g}): {{{b.thought}}}."
            lines += ["", summary + " Code: `best_heuristic.py`."]
        else:
            lines += ["", "No valid heuristic was found."]
        return "\n".join(lines)

    def close(self) -> None:
        """Write ``best_heuristic.py`` a last time."""
        self.write_best_file()

    def _base_state(self) -> dict[str, Any]:
        return {"best": self.best.to_dict() if self.best else None}

    def _load_base_state(self, state: dict[str, Any]) -> None:
        self.best = Individual.from_dict(state["best"]) if state.get("best") else None

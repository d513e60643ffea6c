"""EoH: Evolution of Heuristics as a context-space evolver (type ``eoh``).

Liu et al., "Evolution of Heuristics: Towards Efficient Automatic Algorithm Design Using Large Language
Model", ICML 2024, Section 3 (Algorithm 1). A population of N heuristics (thought + code + objective)
evolves with LLM operators (prompts in :mod:`coevo.ahd.prompts`):

- initialisation (the first step): 2N ``i1`` calls; when no valid heuristic comes back, up to
  ``init_retries`` further rounds of 2N calls, then the evolver stops the run with a clear reason;
- each later step is one generation: every configured operator gets ``offspring_per_operator`` slots
  (default N), each used with probability equal to the operator's weight (EoH's operator weights);
  parents are drawn from the population by rank, ``p(rank) ~ 1 / (rank + 1 + N)`` (rank 0 = best);
- survivors (EoH population management): drop invalid heuristics, deduplicate by objective and by code
  hash, keep the N best.

Pooled trajectories: at the start of a step, valid heuristic trajectories for the same problem and the
same training instances written by *other* evolvers of the run (e.g. ES generating EoH children under
perturbed weights via :meth:`EoHEvolver.generate_children`) join the population. Deviation from EoH: the
problem's seed heuristic can be added to the initial population (``include_seed_heuristic``, off by
default as in EoH).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from pydantic import Field, field_validator

from coevo.ahd.prompts import OPERATORS, build_messages, parents_needed
from coevo.evolvers.ahd_common import AHDConfig, AHDEvolver, Individual, SampleJob
from coevo.evolvers.base import StepReport, register_evolver
from coevo.report.writer import md_table
from coevo.types import ESMember, Trajectory

DEFAULT_OPERATORS = {"e1": 1.0, "e2": 1.0, "m1": 1.0, "m2": 1.0, "m3": 0.5}


def rank_weights(n_population: int) -> list[float]:
    """EoH's parent-selection weights ``1 / (rank + 1 + N)`` for ranks 0..N-1 (rank 0 = best), unnormalised."""
    return [1.0 / (rank + 1 + n_population) for rank in range(n_population)]


def select_parents(population: Sequence[Individual], m: int, rng: random.Random) -> list[Individual]:
    """Draw ``min(m, len(population))`` distinct parents by rank (EoH, Section 3.2).

    Args:
        population: ranked best first (as :func:`survivors` returns it).
        m: parents wanted (>= 1).
        rng: the random stream (consumed deterministically).

    Raises:
        ValueError: empty population or ``m < 1``.
    """
    if not population:
        raise ValueError("population is empty: no parents to select")
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    idx = list(range(len(population)))
    weights = rank_weights(len(population))
    chosen: list[int] = []
    for _ in range(min(m, len(idx))):
        i = rng.choices(range(len(idx)), weights=weights)[0]
        chosen.append(idx.pop(i))
        weights.pop(i)
    return [population[i] for i in chosen]


def survivors(individuals: Sequence[Individual], n: int) -> list[Individual]:
    """EoH population management: drop non-finite, rank by reward (best first; ties by id), drop later
    duplicates of an objective value or of a code hash, keep the ``n`` best."""
    ranked = sorted((i for i in individuals if math.isfinite(i.reward) and math.isfinite(i.objective)),
                    key=lambda i: (-i.reward, i.id))  # fmt: skip
    seen_obj: set[float] = set()
    seen_code: set[str] = set()
    out: list[Individual] = []
    for ind in ranked:
        if ind.objective in seen_obj or ind.code_hash in seen_code:
            continue
        seen_obj.add(ind.objective)
        seen_code.add(ind.code_hash)
        out.append(ind)
        if len(out) == n:
            break
    return out


class EoHConfig(AHDConfig):
    """Settings of the EoH evolver (defaults sized for CPU runs; EoH's code uses N=5-10)."""

    population_size: int = Field(4, ge=1, description="N: heuristics kept per generation")
    operators: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_OPERATORS),
        description="operator -> probability of using each of its offspring slots (EoH operator weights)",
    )
    offspring_per_operator: int | None = Field(None, ge=1, description="slots per operator (default N)")
    parents_m: int = Field(2, ge=1, description="parents of e1/e2")
    init_retries: int = Field(2, ge=0, description="extra 2N-call rounds when the initial population is empty")
    include_seed_heuristic: bool = Field(False, description="add the problem's seed heuristic at initialisation")
    pool_other_evolvers: bool = Field(True, description="fold in valid heuristics other evolvers recorded")

    @field_validator("operators")
    @classmethod
    def _ops(cls, v: dict[str, float]) -> dict[str, float]:
        for op, w in v.items():
            if op not in OPERATORS:
                raise ValueError(f"unknown operator {op!r}; known: {', '.join(OPERATORS)}")
            if not 0.0 <= w <= 1.0:
                raise ValueError(f"operator {op}: weight {w} must be a probability in [0, 1]")
        if not v:
            raise ValueError("at least one operator is needed")
        return v


@register_evolver("eoh")
class EoHEvolver(AHDEvolver):
    """EoH over the run's policy; one step = initialisation or one generation (see the module docstring)."""

    Config = EoHConfig

    def __init__(self, name: str, config: EoHConfig, ctx):
        super().__init__(name, config, ctx)
        self.population: list[Individual] = []
        self.generation = 0  # generations completed (0 = not initialised)
        self.init_attempts = 0
        self.pool_cursor = 0  # largest trajectory id already considered for pooling

    # ------------------------------------------------------------------ pooling
    def fold_pooled(self) -> int:
        """Add the valid heuristics recorded since this evolver's last step (by other evolvers, or through
        :meth:`generate_children`) for the same problem and training set to the population.

        The cursor (largest trajectory id considered) moves past this evolver's own samples at the end of
        every step (:meth:`_advance_cursor`), so only trajectories written between its steps are folded.
        Returns the number of heuristics folded in (before survivor selection).
        """
        if not self.config.pool_other_evolvers:
            return 0
        pooled = [
            Individual.from_trajectory(t)
            for t in self.ctx.store.query(run_id=self.ctx.run_id, valid=True, with_steps=False)
            if t.id > self.pool_cursor and t.reward is not None and t.meta.get("problem") == self.problem.name
            and t.meta.get("instances") == self.train_tag and t.meta.get("code") and t.meta.get("objective") is not None
        ]  # fmt: skip
        if pooled:
            self.population = survivors(self.population + pooled, self.config.population_size)
        return len(pooled)

    def _advance_cursor(self) -> None:
        last = self.ctx.store.query(run_id=self.ctx.run_id, order_by="id", descending=True, limit=1,
                                    with_steps=False)  # fmt: skip
        if last:
            self.pool_cursor = max(self.pool_cursor, last[0].id)

    # ------------------------------------------------------------------ jobs
    def _jobs(
        self,
        operators: Sequence[str],
        n: int,
        rng: random.Random,
        key_parts: Sequence[Any],
        weights: dict[str, float] | None = None,
        extra_meta: dict[str, Any] | None = None,
    ) -> list[SampleJob]:
        """Build the jobs of ``n`` slots per operator. The RNG is drawn for every slot (coin, parents, seed)
        before any cache lookup, so a resumed step sees the same stream."""
        spec = self.problem.prompt_spec()
        worst = self.population[-1].objective if self.population else None
        jobs = []
        for op in operators:
            need = parents_needed(op, self.config.parents_m)
            if need and not self.population:
                raise RuntimeError(
                    f"{self.name}: operator {op} needs parents but the population is empty "
                    "(run an initialisation step first)"
                )
            for j in range(n):
                use = rng.random() < (1.0 if weights is None else weights[op])
                parents = select_parents(self.population, need, rng) if need else []
                seed = rng.getrandbits(63)
                if use:
                    meta = {"worst_objective": worst, "population_size": len(self.population), **(extra_meta or {})}
                    jobs.append(SampleJob(key=self.ctx.traj_key(*key_parts, op, j), operator=op,
                                          messages=build_messages(op, spec, parents), seed=seed,
                                          parents=parents, extra_meta=meta))  # fmt: skip
        return jobs

    def _children(self, trajectories: list[Trajectory]) -> list[Individual]:
        return [Individual.from_trajectory(t) for t in trajectories if t.valid and t.reward is not None]

    # ------------------------------------------------------------------ steps
    def _initialise(self, round_index: int, report: StepReport) -> None:
        cfg, n_init = self.config, 2 * self.config.population_size
        if cfg.include_seed_heuristic and self.init_attempts == 0:
            self._add_seed_heuristic()
        # the first round always runs (the seed heuristic alone is no LLM initialisation); retries only
        # while the population is still empty
        while self.init_attempts <= cfg.init_retries and (self.init_attempts == 0 or not self.population):
            rng = self.ctx.rng(self.name, "init", self.init_attempts)
            jobs = self._jobs(["i1"], n_init, rng, (self.name, round_index, f"init{self.init_attempts}"))
            trajs = self.sample(jobs, round_index=round_index, generation=0)
            self._tally(report, trajs)
            self.population = survivors(self.population + self._children(trajs), cfg.population_size)
            if len(trajs) < len(jobs) and not self.population:
                return  # sample budget exhausted: the loop stops the run with that reason
            self.init_attempts += 1
        if not self.population:
            report.stop = True
            report.stop_reason = (
                f"EoH initialisation produced no valid heuristic for {self.problem.name} in "
                f"{self.init_attempts} round(s) of {n_init} i1 samples (init_retries={cfg.init_retries}); "
                "see the failure kinds of this run's trajectories"
            )
            return
        self.generation = 1

    def _add_seed_heuristic(self) -> None:
        code = self.problem.seed_heuristic_code()
        res = self.evaluate([code])[0]
        if not res.valid:
            raise RuntimeError(f"{self.problem.name}: the seed heuristic is invalid ({res.error_kind}: {res.error})")
        seed = Individual(id="seed", thought="the problem's seed heuristic", code=code, objective=res.objective,
                          reward=res.score, operator="seed", source="seed")  # fmt: skip
        self.population = survivors(self.population + [seed], self.config.population_size)

    def _generation(self, round_index: int, report: StepReport) -> None:
        cfg = self.config
        rng = self.ctx.rng(self.name, "generation", self.generation)
        n = cfg.offspring_per_operator or cfg.population_size
        ops = list(cfg.operators)
        jobs = self._jobs(ops, n, rng, (self.name, round_index, f"g{self.generation}"), weights=cfg.operators)
        trajs = self.sample(jobs, round_index=round_index, generation=self.generation)
        self._tally(report, trajs)
        self.population = survivors(self.population + self._children(trajs), cfg.population_size)
        self.generation += 1

    def _tally(self, report: StepReport, trajs: list[Trajectory]) -> None:
        report.samples += sum(t.llm_calls for t in trajs)
        report.trajectories += len(trajs)
        report.metrics["valid_samples"] = report.metrics.get("valid_samples", 0.0) + sum(t.valid for t in trajs)
        for t in trajs:
            if t.valid and t.reward is not None:
                report.best_reward = t.reward if report.best_reward is None else max(report.best_reward, t.reward)

    def step(self, round_index: int) -> StepReport:
        """Initialise (first step) or run one EoH generation; see the module docstring."""
        report = StepReport()
        pooled = self.fold_pooled()
        if self.generation == 0:
            self._initialise(round_index, report)
        else:
            self._generation(round_index, report)
        self._advance_cursor()
        self.note_best(self.population)
        report.metrics.update(generation=float(self.generation), population=float(len(self.population)),
                              pooled=float(pooled))  # fmt: skip
        if self.population:
            report.metrics["best_objective"] = self.population[0].objective
        return report

    # ------------------------------------------------------------------ API for other evolvers (ES)
    def generate_children(
        self,
        operators: Sequence[str],
        n: int,
        policy,
        member: ESMember | None = None,
        key_prefix: str | Sequence[Any] = (),
        *,
        evolver: str | None = None,
        round_index: int | None = None,
    ) -> list[Trajectory]:
        """Generate and record ``n`` children per operator with ``policy`` (e.g. under ES-perturbed weights).

        Parents come from the current population by rank. Each child is a recorded trajectory (one LLM
        call, counted against the budget; cut to the budget, so fewer may come back) whose meta holds
        ``problem``, ``operator``, ``code``, ``thought``, ``objective`` (None when invalid),
        ``parent_objective`` (best parent; None for i1), ``parent_objectives``, ``worst_objective`` (the
        population's worst), so ES can compute the reward ``parent - child``. The EoH evolver folds the
        valid ones into its population at its next step.

        Args:
            operators: EoH operators (e.g. ``["m1", "m2"]``). n: children per operator.
            policy: the (perturbed) policy. member: the ES member, recorded on each trajectory.
            key_prefix: deterministic key parts (e.g. ``(es_name, generation, member_index)``); the RNG is
                keyed by them too, so a re-run gives the same prompts and finds its stored children.
            evolver: the name recorded on the trajectories (default this evolver's).
            round_index: the loop round (default ``ctx.round``).

        Raises:
            ValueError: unknown operator. RuntimeError: a parent operator with an empty population.
        """
        parts = (key_prefix,) if isinstance(key_prefix, str) else tuple(key_prefix)
        if not parts:
            raise ValueError("key_prefix must name the caller (e.g. (es_name, generation, member_index))")
        rng = self.ctx.rng(*parts, "children")
        jobs = self._jobs(list(operators), n, rng, parts, extra_meta={"eoh_generation": self.generation})
        round_index = self.ctx.round if round_index is None else round_index
        return self.sample(jobs, policy=policy, round_index=round_index, generation=self.generation,
                           evolver=evolver or self.name, member=member)  # fmt: skip

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            **self._base_state(), "population": [i.to_dict() for i in self.population],
            "generation": self.generation, "init_attempts": self.init_attempts, "pool_cursor": self.pool_cursor,
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_base_state(state)
        self.population = [Individual.from_dict(d) for d in state.get("population", [])]
        self.generation = state.get("generation", 0)
        self.init_attempts = state.get("init_attempts", 0)
        self.pool_cursor = state.get("pool_cursor", 0)

    def report_markdown(self) -> str:
        rows = [[i.id, i.operator, i.source, i.objective, i.thought[:100]] for i in self.population]
        pop = md_table(["id", "operator", "from", "objective", "thought"], rows) if rows else "(empty population)"
        return f"{super().report_markdown()}\n\nFinal population (generation {self.generation}):\n\n{pop}"

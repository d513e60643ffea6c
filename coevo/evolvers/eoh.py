"""EoH: Evolution of Heuristics as a context-space evolver (type ``eoh``).

Liu et al., "Evolution of Heuristics: Towards Efficient Automatic Algorithm Design Using Large Language
Model", ICML 2024, Section 3 (Algorithm 1). A population of N heuristics (thought + code + objective)
evolves with LLM operators (prompts in :mod:`coevo.ahd.prompts`):

Calls are made, parsed, evaluated and recorded by the evolver's sampler service
(:class:`coevo.ahd.sampler.HeuristicSampler`); parent selection and survivors are
:mod:`coevo.ahd.population`.

- initialisation (the first step): 2N ``i1`` calls; when no valid heuristic comes back, up to
  ``init_retries`` further rounds of 2N calls, then the evolver stops the run with a clear reason;
- each later step is one generation: every configured operator gets ``offspring_per_operator`` slots
  (default N), each used with probability equal to the operator's weight (EoH's operator weights);
  parents are drawn from the population by rank, ``p(rank) ~ 1 / (rank + 1 + N)`` (rank 0 = best);
- with ``reflection`` (off by default), one extra LLM call per generation first reflects on why the best
  heuristic beats the worst (ReEvo, Ye et al., NeurIPS 2024, Section 3.2) and its answer goes into the
  generation's parent-operator prompts (:mod:`coevo.ahd.prompts`); per-operator sampling temperatures are
  ``operator_temperature`` (:class:`coevo.evolvers.ahd_common.AHDConfig`);
- survivors (EoH population management): drop invalid heuristics, deduplicate by objective and by code
  hash, keep the N best.

Pooled trajectories: at the start of a step, valid heuristic trajectories for the same problem and the
same training instances written by *other* evolvers of the run (e.g. ES members writing EoH children
under perturbed weights through this evolver's sampler, :mod:`coevo.rollouts.eoh_children`) join the
population. Deviation from EoH: the problem's seed heuristic can be added to the initial population
(``include_seed_heuristic``, off by default as in EoH).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from coevo.ahd.population import Individual, survivors
from coevo.ahd.prompts import OPERATORS
from coevo.evolvers.ahd_common import AHDConfig, AHDEvolver
from coevo.evolvers.base import StepReport, register_evolver
from coevo.report.ahd import population_lines
from coevo.types import Trajectory

DEFAULT_OPERATORS = {"e1": 1.0, "e2": 1.0, "m1": 1.0, "m2": 1.0, "m3": 0.5}


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
    pool_other_evolvers: bool = Field(True, description="fold in valid heuristics other evolvers recorded")
    reflection: bool = Field(
        False,
        description="before each generation, one LLM call reflects on why the population's best heuristic beats "
        "its worst (ReEvo's short-term reflection); the answer goes into that generation's parent-operator prompts. "
        "The call counts against budget.max_samples",
    )
    reflection_tokens: int = Field(96, ge=8, description="max new tokens of a reflection call")

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
    #: ES members write m1 / m2 children of the population (Agentic ESOpt's AHD setting)
    member_operators = ("m1", "m2")

    def __init__(self, name: str, config: EoHConfig, ctx):
        super().__init__(name, config, ctx)
        self.parents_m = config.parents_m
        self.generation = 0  # generations completed (0 = not initialised)
        self.init_attempts = 0

    # ------------------------------------------------------------------ pooling
    def fold_pooled(self) -> int:
        """Add the valid heuristics recorded since this evolver's last step (by other evolvers, or by ES
        members through this evolver's sampler) for the same problem and training set to the population
        (:meth:`~coevo.evolvers.ahd_common.AHDEvolver.collect_pooled`). Returns the number of heuristics folded
        in (before survivor selection).
        """
        if not self.config.pool_other_evolvers:
            return 0
        pooled = self.collect_pooled()
        if pooled:
            self.population = survivors(self.population + pooled, self.config.population_size)
        return len(pooled)

    def _jobs(self, operators, n, rng, key_parts, weights=None, reflection=None):
        return self.sampler.operator_jobs(
            operators,
            n,
            rng,
            key_parts,
            population=self.population,
            parents_m=self.config.parents_m,
            weights=weights,
            reflection=reflection,
        )

    def _reflection_key(self, round_index: int) -> str:
        return self.sampler.key(self.name, round_index, f"g{self.generation}", "reflection")

    def _reflection(self, round_index: int, rng) -> str | None:
        """This generation's reflection (``reflection``): why the population's best beats its worst, or None
        (off, fewer than two heuristics with different objectives, empty answer, or a budget that would leave no
        sample for a child after it)."""
        pop = self.population
        seed = rng.getrandbits(63)
        if not self.config.reflection or len(pop) < 2 or pop[0].objective == pop[-1].objective:
            return None
        if (
            self.sampler.budget.allow(2) < 2
            and self.sampler.store.get_by_key(self._reflection_key(round_index)) is None
        ):
            return None
        return self.sampler.reflect(
            pop[0],
            pop[-1],
            key=self._reflection_key(round_index),
            seed=seed,
            round_index=round_index,
            generation=self.generation,
            max_new_tokens=self.config.reflection_tokens,
        )

    def _children(self, trajectories: list[Trajectory]) -> list[Individual]:
        return [Individual.from_trajectory(t) for t in trajectories if t.valid and t.reward is not None]

    # ------------------------------------------------------------------ steps
    def _initialise(self, round_index: int, report: StepReport) -> None:
        cfg, n_init = self.config, 2 * self.config.population_size
        if self.init_attempts == 0:
            self.add_seed_heuristics()
        # the first round always runs (the seed heuristic alone is no LLM initialisation); retries only
        # while the population is still empty
        while self.init_attempts <= cfg.init_retries and (self.init_attempts == 0 or not self.population):
            rng = self.ctx.rng(self.name, "init", self.init_attempts)
            jobs = self._jobs(["i1"], n_init, rng, (self.name, round_index, f"init{self.init_attempts}"))
            trajs = self.sampler.sample(jobs, round_index=round_index, generation=0, existing=self.population)
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

    def _generation(self, round_index: int, report: StepReport) -> None:
        cfg = self.config
        rng = self.ctx.rng(self.name, "generation", self.generation)
        n = cfg.offspring_per_operator or cfg.population_size
        ops = list(cfg.operators)
        used = self.sampler.budget.samples_used()
        reflection = self._reflection(round_index, rng) if cfg.reflection else None
        report.samples += self.sampler.budget.samples_used() - used  # the reflection call, when one was made
        jobs = self._jobs(
            ops, n, rng, (self.name, round_index, f"g{self.generation}"), weights=cfg.operators, reflection=reflection
        )
        trajs = self.sampler.sample(jobs, round_index=round_index, generation=self.generation, existing=self.population)
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
        report = StepReport(reward_unit=f"best child's {self.sampler.reward_unit}")
        pooled = self.fold_pooled()
        if self.generation == 0:
            self._initialise(round_index, report)
        else:
            self._generation(round_index, report)
        self.publish_best()
        report.metrics.update(
            generation=float(self.generation), population=float(len(self.population)), pooled=float(pooled)
        )
        if self.population:
            report.metrics["best_objective"] = self.population[0].objective
        return report

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "generation": self.generation, "init_attempts": self.init_attempts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.generation = state.get("generation", 0)
        self.init_attempts = state.get("init_attempts", 0)

    def report_markdown(self) -> str:
        """The base section (:func:`coevo.report.ahd.ahd_section`) and the final population."""
        return "\n".join([super().report_markdown(), *population_lines(self, self.generation)])

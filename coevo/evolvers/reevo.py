"""ReEvo: reflective evolution of heuristics (type ``reevo``).

Ye et al., "ReEvo: Large Language Models as Hyper-Heuristics with Reflective Evolution", NeurIPS 2024; the loop
and the prompts follow the authors' code (github.com/ai4co/reevo, ``reevo.py`` and ``prompts/common/*.txt``).
Written on the public API of :class:`~coevo.evolvers.ahd_common.AHDEvolver` only (``sampler.job`` with an
instruction and a labelled reflection, ``sampler.texts`` for the reflections, ``ctx.publish``, the report hook):
docs/extending.md walks through it as the example of free-text calls.

One step is one ReEvo iteration of ``ReEvo.evolve``:

1. **Selection** (``random_select``): ``population_size`` pairs of valid heuristics drawn uniformly from the
   population and the elitist, the two of a pair with different objectives (at most 1000 draws).
2. **Short-term reflection**: one text call per pair (``user_reflector_st``): the worse and the better code, in
   that order (ranked by fitness), and "hints for designing better heuristics ... less than 20 words".
3. **Crossover**: one heuristic call per pair (``crossover``): the worse and the better heuristic, the pair's
   short-term reflection, "write an improved function according to the reflection". The valid children replace
   the population, as ReEvo's ``self.population = crossed_population``; the elitist (the best heuristic seen)
   is kept apart and updated.
4. **Long-term reflection**: one text call (``user_reflector_lt``): the prior long-term reflection and this
   iteration's short-term ones, "constructive hints ... less than 50 words". It replaces the prior one and is
   published on the context channel as ``<name>/long_term_reflection`` (report and export list every version).
5. **Elitist mutation** (``mutate``): ``population_size x mutation_rate`` heuristic calls improving the elitist,
   guided by the long-term reflection; the valid children join the population; the elitist is updated.

The first step is the initialisation (``init_population``): the problem's seed heuristic, evaluated, is the
first elitist and the example of ``init_population_size`` calls that ask for a very creative new heuristic.

Budget: every LLM response counts against ``budget.max_samples``, the reflections too: one iteration costs
``2 x population_size + 1 + population_size x mutation_rate`` samples (the paper's 10 pairs at rate 0.5:
10 + 10 + 1 + 5 = 26; the defaults here: 4 + 4 + 1 + 2 = 11). The calls are cut to what is left, in the order
above.

Where this differs from the paper's code, and why:

* Budget: ReEvo's ``max_fe`` counts heuristic evaluations only (its reflections are free); coevo counts every
  LLM call, so methods are compared per LLM sample. On the same ``max_samples`` ReEvo evaluates fewer heuristics
  than EoH or the hill climber (6 of an iteration's 11 calls with the default sizes).
* Prompts: ReEvo's structure and wording for the reflections (system prompt, worse-then-better code, word
  limits); the heuristic calls keep coevo's task text and answer format (``answer_format``: a one-line idea and
  the function under its own name, not ``<name>_v2`` code only), so every arm of a comparison reads and
  evaluates answers the same way. Parents are shown with their objectives, as in every coevo prompt; ReEvo shows
  the code and says which is better. The mutation prompt puts the reflection after the code (ReEvo: before).
* The initial population is sampled at the run's temperature (ReEvo adds 0.3); ``external_knowledge`` (ReEvo's
  per-problem hint, e.g. "Try look-ahead mechanisms." for TSP) is empty by default, so no arm gets a
  hand-written hint.
* When no pair can be drawn (fewer than two valid heuristics with different objectives, common on a small
  model) ReEvo raises "Selection failed"; here the iteration skips selection, reflections and crossover and
  mutates the elitist, so the run goes on.
* A reflection that fails, is empty or is cut by the budget is recorded as such (``llm_error``, ``parse``; a cut
  one is not made) and the crossover goes on without it; a long-term reflection that is not made keeps the prior
  one. A reflection longer than ``short_reflection_chars`` / ``long_reflection_chars`` is cut there (its record
  says from how many characters).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from coevo.ahd.population import Individual, survivors
from coevo.ahd.prompts import task_text
from coevo.ahd.sampler import TextCall
from coevo.evolvers.ahd_common import AHDConfig, AHDEvolver
from coevo.evolvers.base import StepReport, register_evolver
from coevo.sandbox.extract import strip_docstrings
from coevo.tables import md_table

#: ReEvo's ``system_reflector.txt``
REFLECTOR_SYSTEM = (
    "You are an expert in the domain of optimization heuristics. Your task is to give hints to design better "
    "heuristics."
)
#: ReEvo's ``user_reflector_st.txt`` (its problem and function description: coevo's task text)
SHORT_TERM = (
    "Below are two {func_name} functions for this problem.\n{problem}\n\nYou are provided with two code versions "
    "below, where the second version performs better than the first one.\n\n[Worse code]\n{worse}\n\n"
    "[Better code]\n{better}\n\nYou respond with some hints for designing better heuristics, based on the two "
    "code versions and using less than 20 words."
)
#: ReEvo's ``user_reflector_lt.txt``
LONG_TERM = (
    "Below is your prior long-term reflection on designing heuristics for this problem.\n{problem}\n\n"
    "Prior reflection:\n{prior}\n\nBelow are some newly gained insights.\n{new}\n\nWrite constructive hints for "
    "designing better heuristics, based on prior reflections and new insights and using less than 50 words."
)
#: what the crossover, mutation and initialisation calls ask (ReEvo's ``crossover.txt``, ``mutation.txt``,
#: ``seed.txt``), after coevo's task text and the parents
CROSSOVER = (
    "[Improved code] Heuristic 2 performs better than heuristic 1. Write an improved heuristic, according to the "
    "reflection."
)
MUTATION = "[Improved code] Write a mutated heuristic of the one above, according to the reflection."
INIT = "Above is a trivial design for this problem. Refer to its format, be very creative and write a new heuristic."


class ReEvoConfig(AHDConfig):
    """Settings of the ReEvo evolver (ReEvo's ``cfg/config.yaml``: pop_size 10, init_pop_size 30,
    mutation_rate 0.5; smaller defaults for CPU runs)."""

    population_size: int = Field(4, ge=1, description="pop_size: crossover pairs (and children) per iteration")
    init_population_size: int = Field(8, ge=1, description="init_pop_size: heuristics asked at initialisation")
    mutation_rate: float = Field(
        0.5, gt=0, le=4, description="elitist mutations per iteration = population_size x mutation_rate"
    )
    short_reflection_tokens: int = Field(64, ge=8, description="max new tokens of a short-term reflection")
    long_reflection_tokens: int = Field(128, ge=8, description="max new tokens of the long-term reflection")
    short_reflection_chars: int = Field(
        300, ge=20, description="longest short-term reflection passed to a crossover prompt (characters)"
    )
    long_reflection_chars: int = Field(600, ge=20, description="longest long-term reflection passed on (characters)")
    external_knowledge: str = Field(
        "", description="ReEvo's per-problem hint that starts the long-term reflection (default none)"
    )


@register_evolver("reevo")
class ReEvoEvolver(AHDEvolver):
    """ReEvo over the run's policy; one step = initialisation or one ReEvo iteration (module docstring)."""

    Config = ReEvoConfig
    member_operators = ("m1",)  # what ES members write: improved variants drawn from the population

    def __init__(self, name: str, config: ReEvoConfig, ctx):
        super().__init__(name, config, ctx)
        self.iteration = 0  # iterations completed (0: not initialised)
        self.elitist: Individual | None = None
        self.long_term = config.external_knowledge.strip()
        #: (iteration, long-term reflection) of every iteration that made one, for the report
        self.long_term_history: list[tuple[int, str]] = []

    @property
    def context_key(self) -> str:
        """The context key the long-term reflection is published under."""
        return f"{self.name}/long_term_reflection"

    # ------------------------------------------------------------------ helpers
    def _sample(self, jobs, round_index: int) -> list[Individual]:
        trajs = self.sampler.sample(jobs, round_index=round_index, generation=self.iteration, existing=self._pool())
        return [Individual.from_trajectory(t) for t in trajs if t.valid and t.reward is not None]

    def _pool(self) -> list[Individual]:
        """The valid heuristics selection draws from: the population and the elitist."""
        pool = list(self.population)
        if self.elitist is not None and all(i.id != self.elitist.id for i in pool):
            pool.append(self.elitist)
        return pool

    def _update_elitist(self, candidates: list[Individual]) -> None:
        for c in candidates:  # strictly better only: of equals the earliest stays
            if self.elitist is None or c.reward > self.elitist.reward:
                self.elitist = c

    def _select(self, rng) -> list[tuple[Individual, Individual]] | None:
        """ReEvo's ``random_select``: ``population_size`` pairs of different objectives, or None."""
        pool = self._pool()
        if len(pool) < 2:
            return None
        pairs: list[tuple[Individual, Individual]] = []
        for _ in range(1000):
            a, b = rng.sample(pool, 2)
            if a.objective != b.objective:
                pairs.append((a, b))
                if len(pairs) == self.config.population_size:
                    return pairs
        return None

    def _problem_text(self) -> str:
        return task_text(self.problem.prompt_spec())

    def _short_term_call(self, key: str, worse: Individual, better: Individual) -> TextCall:
        user = SHORT_TERM.format(
            func_name=self.problem.function_name,
            problem=self._problem_text(),
            worse=strip_docstrings(worse.code) or worse.code,
            better=strip_docstrings(better.code) or better.code,
        )
        return TextCall(
            key=key,
            messages=[{"role": "system", "content": REFLECTOR_SYSTEM}, {"role": "user", "content": user}],
            kind="short_term_reflection",
            max_new_tokens=self.config.short_reflection_tokens,
            max_chars=self.config.short_reflection_chars,
            meta={"parent_ids": [worse.id, better.id]},
        )

    # ------------------------------------------------------------------ steps
    def _initialise(self, round_index: int) -> None:
        self.add_seed_heuristics()
        seed = self.sampler.seed_individual()
        self._update_elitist([seed, *self.population])
        rng = self.ctx.rng(self.name, "init")
        jobs = [
            self.sampler.job(
                "init",
                key=self.sampler.key(self.name, round_index, "init", i),
                seed=rng.getrandbits(63),
                parents=[seed],
                instruction=INIT,
                reflection=self.long_term or None,
                reflection_label="[Prior reflection]",
            )
            for i in range(self.config.init_population_size)
        ]
        children = self._sample(jobs, round_index)
        self.population = survivors(self.population + children, len(self.population) + len(children))
        self._update_elitist(self.population)

    def _iterate(self, round_index: int) -> None:
        cfg, tag = self.config, f"g{self.iteration}"
        rng = self.ctx.rng(self.name, "iteration", self.iteration)
        pairs = self._select(rng)
        seeds = [rng.getrandbits(63) for _ in range(cfg.population_size)]
        children: list[Individual] = []
        short: list[str] = []
        if pairs is not None:
            ordered = [(a, b) if a.reward < b.reward else (b, a) for a, b in pairs]  # (worse, better)
            calls = [
                self._short_term_call(self.sampler.key(self.name, round_index, tag, "st", i), w, b)
                for i, (w, b) in enumerate(ordered)
            ]
            notes = self.sampler.texts(calls, round_index=round_index, generation=self.iteration)
            short = [n for n in notes if n]
            jobs = [
                self.sampler.job(
                    "crossover",
                    key=self.sampler.key(self.name, round_index, tag, "crossover", i),
                    seed=seeds[i],
                    parents=[w, b],
                    instruction=CROSSOVER,
                    reflection=note,
                    reflection_label="[Reflection]",
                )
                for i, ((w, b), note) in enumerate(zip(ordered, notes))
            ]
            children = self._sample(jobs, round_index)
            self.population = survivors(children, len(children))  # ReEvo: the children replace the population
            self._update_elitist(children)
        if short:
            prior = self.long_term or "(none yet)"
            user = LONG_TERM.format(problem=self._problem_text(), prior=prior, new="\n".join(short))
            text = self.sampler.text(
                [{"role": "system", "content": REFLECTOR_SYSTEM}, {"role": "user", "content": user}],
                key=self.sampler.key(self.name, round_index, tag, "lt"),
                kind="long_term_reflection",
                round_index=round_index,
                generation=self.iteration,
                max_new_tokens=cfg.long_reflection_tokens,
                max_chars=cfg.long_reflection_chars,
            )
            if text:
                self.long_term = text
                self.long_term_history.append((self.iteration, text))
                self.ctx.publish(self.context_key, text, evolver=self.name, round_index=round_index)
        if self.elitist is not None:
            n = max(1, int(cfg.population_size * cfg.mutation_rate))
            jobs = [
                self.sampler.job(
                    "mutation",
                    key=self.sampler.key(self.name, round_index, tag, "mutation", i),
                    seed=rng.getrandbits(63),
                    parents=[self.elitist],
                    instruction=MUTATION,
                    reflection=self.long_term or None,
                    reflection_label="[Prior reflection]",
                )
                for i in range(n)
            ]
            mutants = self._sample(jobs, round_index)
            self.population = survivors(self.population + mutants, len(self.population) + len(mutants))
            self._update_elitist(mutants)

    def step(self, round_index: int) -> StepReport:
        """Initialise (first step) or run one ReEvo iteration (module docstring)."""
        used = self.sampler.budget.samples_used()
        pooled = self.collect_pooled()  # children ES members wrote for this search join the population
        if pooled:
            self.population = survivors(self.population + pooled, len(self.population) + len(pooled))
            self._update_elitist(self.population)
        if self.iteration == 0:
            self._initialise(round_index)
        else:
            self._iterate(round_index)
        self.iteration += 1
        self.publish_best()
        report = StepReport(
            samples=self.sampler.budget.samples_used() - used,
            trajectories=0,
            reward_unit=f"elitist's {self.sampler.reward_unit}",
            best_reward=self.elitist.reward if self.elitist is not None else None,
            metrics={"iteration": float(self.iteration), "population": float(len(self.population))},
        )
        report.trajectories = report.samples
        if self.elitist is not None:
            report.metrics["elitist_objective"] = self.elitist.objective
        return report

    # ------------------------------------------------------------------ state and report
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "iteration": self.iteration,
            "elitist": self.elitist.to_dict() if self.elitist is not None else None,
            "long_term": self.long_term,
            "long_term_history": [list(h) for h in self.long_term_history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.iteration = int(state.get("iteration", 0))
        self.elitist = Individual.from_dict(state["elitist"]) if state.get("elitist") else None
        self.long_term = state.get("long_term", self.config.external_knowledge.strip())
        self.long_term_history = [(int(i), str(t)) for i, t in state.get("long_term_history") or []]

    def report_markdown(self) -> str:
        """The base section and ReEvo's own: the elitist and the long-term reflection of every iteration."""
        lines = [super().report_markdown(), ""]
        if self.elitist is not None:
            lines.append(
                f"Elitist after {self.iteration} step(s): `{self.elitist.id}` (objective {self.elitist.objective:.6g})."
            )
        rows = [[i, " ".join(t.split())] for i, t in self.long_term_history]
        lines += ["", "Long-term reflections (each replaces the one before):", ""]
        lines.append(md_table(["iteration", "long-term reflection"], rows) if rows else "(none was made)")
        return "\n".join(lines)

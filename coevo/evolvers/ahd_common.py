"""The public base of heuristic-design evolvers: :class:`AHDEvolver` and its config :class:`AHDConfig`.

Subclass :class:`AHDEvolver` to write an automatic-heuristic-design (AHD) search of your own: it gives you the
problem (:attr:`AHDEvolver.problem`), the sampler service (:attr:`AHDEvolver.sampler`: prompt -> sample ->
extract -> evaluate -> record, free-text calls; :class:`coevo.ahd.sampler.HeuristicSampler`), the best-heuristic
tracking, the held-out measurement behind the report section (rendered by :mod:`coevo.report.ahd`) and resume;
you write :meth:`~coevo.evolvers.base.Evolver.step`. docs/extending.md shows a
complete one, the (1+1)-EPS hill climber (:mod:`coevo.evolvers.hillclimb`); ``eoh``, ``sample`` and ``reevo`` are built
on it too. What a subclass may use and override:

* :attr:`~AHDEvolver.population` (a property, ranked best first): the heuristics parent operators draw from,
  here and in ES members' children. The default is a list the base keeps and saves; override the property
  to expose your own (e.g. one incumbent).
* :meth:`~AHDEvolver.state_dict` / :meth:`~AHDEvolver.load_state_dict`: a subclass returns
  ``{**super().state_dict(), ...}`` and calls ``super().load_state_dict(state)``, so the base state (the best,
  the validation cache, rejected candidates, the default population, the pooling cursor) resumes exactly; a
  subclass that leaves ``super()`` out raises ``TypeError`` naming the method.
* :meth:`~AHDEvolver.collect_pooled`: the valid heuristics other parts of the run recorded for this search
  since the last call (the children ES members wrote through this sampler, other evolvers' samples).
* :attr:`~AHDEvolver.member_operators` / :meth:`~AHDEvolver.member_jobs`: what ES members write for this
  search under perturbed weights (the ES rollout ``eoh_children`` asks :meth:`~AHDEvolver.member_jobs`).

The best heuristic is the best (highest reward) of the valid heuristics recorded through this evolver's
sampler (its own samples and the children ES members wrote for it) and of its population that is also valid
on a few validation instances of each held-out size (``validation_count``, their own seed: neither training
nor held-out instances); of equal heuristics the earliest (the seed, then in recording order) stays the best,
and the report says how many tie with it. It is published at the end of every step, before the report and
at the end of the run. The report section compares it with the problem's seed heuristic on held-out test
instances, with the gap to the problem's named reference.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from coevo.ahd.population import Individual, survivors
from coevo.ahd.problem import HeuristicProblem, load_problem
from coevo.ahd.prompts import parents_needed
from coevo.ahd.sampler import HeuristicSampler, SampleJob, SamplerSettings
from coevo.ahd.seeds import check_instance_key, run_instance_seed
from coevo.artifacts import HEURISTIC
from coevo.errors import ConfigError
from coevo.evolvers.base import Evolver, EvolverConfig, RunContext
from coevo.report.ahd import failure_text
from coevo.types import EvalResult

log = logging.getLogger(__name__)


class AHDConfig(EvolverConfig):
    """Settings shared by the heuristic-design evolvers."""

    problem: str = Field(description="heuristic problem: a folder name under heuristics/ (e.g. tsp_construct)")
    train_size: int | None = Field(None, ge=1, description="training instance size (default: the problem's)")
    train_count: int = Field(8, ge=1, description="training instances (EoH: 8 x TSP50)")
    train_seed: int | None = Field(
        None,
        ge=0,
        description="seed of the training instances; default (null): drawn at random when the run starts and "
        "kept in the run folder (coevo.ahd.seeds), so no candidate can regenerate its instances; an explicit "
        "seed is knowable by whoever reads the config",
    )
    test_sizes: list[int] | None = Field(
        None, description="held-out test sizes for the report (default: the problem's first three sizes)"
    )
    test_count: int = Field(16, ge=1, description="held-out instances per test size")
    test_seed: int | None = Field(
        None,
        ge=0,
        description="seed of the held-out instances (keep != train_seed); default (null): drawn per run like "
        "train_seed",
    )
    include_seed_heuristic: bool = Field(
        False,
        description="add the problem's seed heuristic (the textbook rule: nearest neighbour, greedy, Best Fit), "
        "evaluated, to the initial population (the best heuristic is then never worse than the seed on the "
        "training instances); off by default as in EoH, on in every shipped config. The report says when the "
        "seed was not in the population",
    )
    seed_heuristics: list[str] = Field(
        default_factory=list,
        description="published heuristics that start the population, by name: files "
        "<problem folder>/published/<name>.py (e.g. eoh_ael for tsp_construct); ReEvo and HSEvo start their "
        "search from such a seed function. Held-out reports compare the best heuristic with each of them. One "
        "that is invalid on the training instances is left out with one warning line (the run goes on)",
    )
    validation_count: int = Field(
        16,
        ge=0,
        description="instances per held-out size on which a heuristic must be valid before it becomes the run's "
        "best (0: no check). A heuristic scored only on the training instances can hide a branch those "
        "instances never take (e.g. a threshold tune moved) that fails on others; the best valid one on the "
        "training set that passes becomes the best. Drawn from validation_seed, never the held-out instances. "
        "16 (as many as test_count): a branch failing on 7.5 % of TSP50 instances passes 16 with probability "
        "0.29 (4: 0.73); the check costs about 7 s per candidate best on TSP20/50/100 "
        "(benchmarks/validation_check.py)",
    )
    validation_seed: int | None = Field(
        None,
        ge=0,
        description="seed of the validation instances; default (null): drawn per run like train_seed (a value "
        "equal to the held-out seed is moved by one)",
    )
    eval_timeout_s: float = Field(30.0, gt=0, description="wall-clock limit of one evaluation (s)")
    eval_memory_mb: int = Field(2048, ge=64, description="address-space limit of one evaluation (MiB)")
    eval_workers: int = Field(2, ge=1, description="evaluations run in parallel")
    temperature: float | None = Field(None, ge=0, description="overrides the run's sampling.temperature")
    top_p: float | None = Field(None, gt=0, le=1, description="overrides the run's sampling.top_p")
    top_k: int | None = Field(None, ge=0, description="overrides the run's sampling.top_k")
    max_new_tokens: int | None = Field(None, ge=1, description="overrides the run's sampling.max_new_tokens")
    operator_temperature: dict[str, float] = Field(
        default_factory=dict,
        description="operator -> sampling temperature of its calls, e.g. {m1: 0.7, m2: 0.7} (the others use "
        "temperature, else sampling.temperature); calls of different temperatures are decoded in separate batches",
    )
    reject_duplicates: bool = Field(
        True,
        description="record a sample whose code copies an existing heuristic (up to formatting, comments, "
        "docstrings and local variable names) as failure kind `duplicate` without evaluating it",
    )
    reject_same_behaviour: bool = Field(
        True,
        description="record a valid sample whose objective on every training instance equals an existing "
        "heuristic's as failure kind `behavioural_duplicate` (objective kept in its meta): other code, no new "
        "heuristic (coevo.ahd.sampler)",
    )
    repair: bool = Field(
        False,
        description="send a sample that failed with a syntax, runtime or return-type error back to the model once "
        "with the one-line error (operator `repair`, ReEvo / OpenEvolve style; the failed sample's ES member, if "
        "any, writes the repair too); every repair call counts against budget.max_samples",
    )
    duplicate_retries: int = Field(
        0,
        ge=0,
        description="ask again (same prompt, new seed) a call whose code copies an existing heuristic, before "
        "evaluating it, at most this many times; every call counts against budget.max_samples",
    )
    answer_format: Literal["prefill", "free"] = Field(
        "prefill",
        description="prefill: the model continues an answer that already holds the code fence, the template's "
        "imports, the function's def line and '# idea:' (its thought), and stops at the function's end; free: "
        "EoH's braced thought then a code block. A backend that cannot continue a message (an OpenAI endpoint "
        "that is not vLLM's server) gets free, with one line saying so (coevo.ahd.answer; docs/ahd.md)",
    )
    answer_grammar: bool = Field(
        False,
        description="constrain prefilled answers to a function body's layout (coevo.ahd.answer.BODY_REGEX) with "
        "vLLM's structured outputs; needs the vllm backend (or model.vllm_server)",
    )
    change_marks: bool = Field(
        False,
        description="under prefill, open m1/m2/m3 answers with the change the variant makes ('# change:', "
        "'# new parameter values:', '# simplified:') instead of '# idea:' (coevo.ahd.answer.CHANGE_MARKS)",
    )
    parse_retries: int = Field(
        0,
        ge=0,
        description="ask again (same prompt, new seed) a call whose answer defines no heuristic function, at "
        "most this many times, as EoH does (up to 4); every call counts against budget.max_samples",
    )

    @field_validator("problem")
    @classmethod
    def _known_problem(cls, v: str) -> str:
        from pathlib import Path

        from coevo.ahd.problem import available_problems

        if v in available_problems() or (Path(v) / "problem.py").is_file():
            return v
        raise ValueError(f"unknown problem {v!r}; available: {available_problems()} or a folder with a problem.py")

    @field_validator("operator_temperature")
    @classmethod
    def _op_temperature(cls, v: dict[str, float]) -> dict[str, float]:
        from coevo.ahd.prompts import OPERATORS

        for op, temp in v.items():
            if op not in OPERATORS:
                raise ValueError(f"unknown operator {op!r}; known: {', '.join(OPERATORS)}")
            if not (math.isfinite(temp) and temp >= 0):
                raise ValueError(f"{op}: temperature {temp} must be a finite number >= 0")
        return v

    @model_validator(mode="after")
    def _grammar_needs_prefill(self) -> AHDConfig:
        if self.answer_grammar and self.answer_format != "prefill":
            raise ValueError("answer_grammar constrains prefilled answers only: set answer_format to prefill")
        return self

    @model_validator(mode="after")
    def _fits_the_problem(self) -> AHDConfig:
        """What needs the problem itself: the published seeds it has, the smallest size it generates (before
        any model loads, so that ``coevo run --check`` says it; the evolver checks the same when built)."""
        try:
            problem = load_problem(self.problem)
        except Exception as exc:  # noqa: BLE001 - a broken problem.py is the config's problem, said in one line
            raise ValueError(f"problem {self.problem!r} cannot be loaded: {type(exc).__name__}: {exc}") from None
        if why := problem_mismatch(self, problem):
            raise ValueError(why)
        return self

    @field_validator("test_sizes")
    @classmethod
    def _sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(s < 1 for s in v)):
            raise ValueError("test_sizes must be a non-empty list of sizes >= 1")
        return v


def problem_mismatch(config: AHDConfig, problem: HeuristicProblem, prefix: str = "") -> str | None:
    """Why ``config`` does not fit ``problem`` (an unknown published seed, a size below the problem's
    ``min_size``), naming the field after ``prefix`` (e.g. ``"evolvers.eoh."``), or None."""
    unknown = [s for s in config.seed_heuristics if s not in problem.published_heuristics()]
    if unknown:
        known = ", ".join(problem.published_heuristics()) or "none"
        return f"{prefix}seed_heuristics: {problem.name} has no published heuristic {unknown[0]!r} (published: {known})"
    low = problem.min_size
    if config.train_size is not None and config.train_size < low:
        return f"{prefix}train_size: {problem.name} instances have at least {low} elements, got {config.train_size}"
    small = [s for s in config.test_sizes or () if s < low]
    if small:
        return f"{prefix}test_sizes: {problem.name} instances have at least {low} elements, got {small[0]}"
    return None


#: the keys :meth:`AHDEvolver.state_dict` saves (a subclass's state must hold them: it calls ``super()``)
BASE_STATE_KEYS = ("best", "validation", "rejected_best", "population", "pool_cursor", "seeds")


class AHDEvolver(Evolver):
    """Public base of heuristic-design evolvers (module docstring): the problem, the sampler service, the
    population hook, best tracking, the report section and resumable state. Subclasses implement
    :meth:`~coevo.evolvers.base.Evolver.step`; a config subclasses :class:`AHDConfig`.

    Implements :class:`coevo.ahd.sampler.HeuristicSearch` (``sampler``, ``population``, ``member_jobs``), the
    interface the ES rollout ``eoh_children`` and the ``tune`` evolver use.

    Attributes:
        problem: the :class:`~coevo.ahd.problem.HeuristicProblem` (``name``, ``direction`` ``"minimize"`` or
            ``"maximize"``, ``objective_name``, ``function_name``, ``seed_heuristic_code()``).
        sampler: the :class:`~coevo.ahd.sampler.HeuristicSampler` of this search: ``sampler.job(operator,
            key=, seed=, parents=)`` builds one LLM call of an EoH operator (``i1``, ``e1``, ``e2``, ``m1``,
            ``m2``, ``m3``; :mod:`coevo.ahd.prompts`), ``sampler.key(*parts)`` a trajectory key,
            ``sampler.sample(jobs, round_index=, generation=, existing=)`` samples, evaluates and records them
            (one :class:`~coevo.types.Trajectory` per job, valid or not; cut to the sample budget; cached by key
            on a re-run), ``sampler.seed_individual()`` the problem's seed heuristic, evaluated;
            ``sampler.reward_unit`` what a reward is (``-objective`` when minimising: higher is better).
        best: the run's best heuristic so far (:class:`~coevo.ahd.population.Individual`), or None.
        train_size, train_seed, test_seed, validation_seed: the instance sets' size and seeds.

    Raises:
        ValueError: ``problem`` names no problem (the message lists the available ones).
    """

    space: ClassVar[str] = "context"
    Config: ClassVar[type[EvolverConfig]] = AHDConfig
    #: the operators an ES member writes for this search by default (rollout ``eoh_children`` without
    #: ``operators``); see :meth:`member_jobs`
    member_operators: ClassVar[tuple[str, ...]] = ("i1",)
    #: whether this search keeps a population parent operators can draw from (False: e.g. ``sample``, whose ES
    #: members can only write i1 samples)
    keeps_population: ClassVar[bool] = True
    #: parents of the e1/e2 operators when :meth:`member_jobs` draws them (EoH sets its ``parents_m``)
    parents_m: int = 2

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap a subclass's own ``state_dict`` / ``load_state_dict`` so that leaving out ``super()`` (which
        would lose the base state on resume) raises ``TypeError`` naming the method."""
        super().__init_subclass__(**kwargs)
        save, load = cls.__dict__.get("state_dict"), cls.__dict__.get("load_state_dict")
        if save is not None and not getattr(save, "_keeps_base", False):
            cls.state_dict = _checked_save(save)  # type: ignore[method-assign]
        if load is not None and not getattr(load, "_keeps_base", False):
            cls.load_state_dict = _checked_load(load)  # type: ignore[method-assign]

    def __init__(self, name: str, config: AHDConfig, ctx: RunContext):
        super().__init__(name, config, ctx)
        try:
            self.problem: HeuristicProblem = load_problem(config.problem)
        except ValueError as exc:
            raise ConfigError(f"evolvers.{name}.problem: {exc}") from None
        if why := problem_mismatch(config, self.problem, prefix=f"evolvers.{name}."):
            raise ConfigError(why)
        self.train_size = config.train_size or self.problem.default_size
        c = config
        self.train_seed = run_instance_seed(ctx.run_dir, name, "train", c.train_seed)
        self.test_seed = run_instance_seed(ctx.run_dir, name, "test", c.test_seed)
        self.validation_seed = run_instance_seed(ctx.run_dir, name, "validation", c.validation_seed)
        check_instance_key(ctx.run_dir)  # keyed instances (online BPP) are those of the run's installation
        if self.validation_seed == self.test_seed:
            self.validation_seed += 1
        self.sampler = HeuristicSampler(
            self.problem,
            SamplerSettings.of(c, train_size=self.train_size, train_seed=self.train_seed),
            owner=name,
            run_id=ctx.run_id,
            store=ctx.store,
            budget=ctx.budget,
            sampling=ctx.sampling_params(
                temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, max_new_tokens=c.max_new_tokens
            ),
            default_policy=lambda: ctx.policy,
            progress=ctx.report_progress,
        )
        self.train_tag = self.sampler.train_tag
        self._population: list[Individual] = []
        #: id -> every seed heuristic (operator ``seed``) the population has held: candidates for the best even
        #: after the population dropped them (e.g. for a later twin of equal objective)
        self._seeds: dict[str, Individual] = {}
        #: largest trajectory id :meth:`collect_pooled` has looked at
        self.pool_cursor = 0
        self.best: Individual | None = None
        self._test_cache: dict[tuple[str, int], EvalResult] = {}
        #: wall seconds spent on held-out evaluations in this session (instances generated and evaluated)
        self.heldout_s = 0.0
        #: code hash -> None (valid on the validation instances) or why not; see :meth:`publish_best`
        self.validation: dict[str, str | None] = {}
        #: candidates that would have been the best but failed validation: id, training objective, reason
        self.rejected_best: list[dict[str, Any]] = []
        #: held-out size -> its validation instances (generated once)
        self._validation_sets: dict[int, Any] = {}
        #: published seed heuristics left out of the population: name -> why (invalid on the training set)
        self.skipped_seeds: dict[str, str] = {}

    def add_seed_heuristics(self) -> None:
        """The problem's seed heuristic (``include_seed_heuristic``) and the published ones (``seed_heuristics``),
        evaluated on the training instances, into :attr:`population` (EoH survivors when the config has a
        ``population_size``). A published heuristic that is invalid there (it no longer loads, or fails on this
        instance size) is left out with one warning line naming it, and recorded in :attr:`skipped_seeds` for
        the report; the run goes on without it.

        Raises:
            RuntimeError: the problem's own seed heuristic is invalid (a broken problem folder).
        """
        seeds = [self.sampler.seed_individual()] if self.config.include_seed_heuristic else []
        for name in self.config.seed_heuristics:
            try:
                seeds.append(self.sampler.seed_individual(name))
            except RuntimeError as exc:
                why = " ".join(str(exc).split())[:300]
                self.skipped_seeds[name] = why
                log.warning("evolvers.%s.seed_heuristics: %s left out of the population: %s", self.name, name, why)
        if seeds:
            size = getattr(self.config, "population_size", None) or len(self.population) + len(seeds)
            self.population = survivors(self.population + seeds, size)

    @property
    def train_instances(self):
        """The training :class:`~coevo.ahd.instances.InstanceSet` (the sampler's)."""
        return self.sampler.train_instances

    # ------------------------------------------------------------------ the search's hooks
    @property
    def population(self) -> list[Individual]:
        """The heuristics of this search, ranked best first: parent operators draw from them (here and in
        :meth:`member_jobs`), they join the best-heuristic candidates, and the sampler's duplicate check knows
        them. Default: a list the base keeps and saves in :meth:`state_dict` (empty at first); override the
        property (a getter alone is enough) to expose what your search keeps, e.g. ``[self.incumbent]``."""
        return self._population

    @population.setter
    def population(self, value: list[Individual]) -> None:
        self._population = list(value)
        self._remember_seeds(self._population)

    def _remember_seeds(self, individuals: Sequence[Individual]) -> None:
        for ind in individuals:
            if ind.operator == "seed":
                self._seeds.setdefault(ind.id, ind)

    def collect_pooled(self) -> list[Individual]:
        """The valid heuristics recorded for this problem and training set since the last call, by anyone but
        this evolver: the children ES members wrote through :attr:`sampler` (rollout ``eoh_children``), samples
        of other evolvers of the run. Oldest first. The cursor (:attr:`pool_cursor`: the largest trajectory id
        returned) is part of :meth:`state_dict`, so a step re-run after a crash collects the same heuristics
        again and ends in the same state."""
        pooled = [t for t in self.sampler.recorded(since_id=self.pool_cursor) if t.evolver != self.name]
        self.pool_cursor = max([self.pool_cursor, *(t.id for t in pooled)])
        return [Individual.from_trajectory(t) for t in pooled]

    def member_jobs(self, key: str, n: int, operators: Sequence[str] | None = None) -> list[SampleJob]:
        """The LLM calls one ES member makes for this search under its perturbed weights: the ES rollout
        ``eoh_children`` asks for them once per member and ES generation, samples them through :attr:`sampler`
        and records them for the ES evolver (they reach this search through :meth:`collect_pooled`).

        Default: ``n`` calls of each operator, parents drawn by rank from :attr:`population`
        (:meth:`~coevo.ahd.sampler.HeuristicSampler.operator_jobs`; ``parents_m`` parents for e1/e2); with an
        empty population (e.g. before the first step) ``n`` fresh ``i1`` calls per operator instead. Override
        it to give ES members your own prompts (build each call with ``self.sampler.job`` or a
        :class:`~coevo.ahd.sampler.SampleJob` of your own messages), making ``n x len(operators)`` calls: the
        ES evolver sizes its sample budget by that count (the rollout's ``n_cases``).

        Args:
            key: the member's key without the run id, unique per ES generation and member. Keys of the calls:
                ``<run id>/<key>/<operator>/<slot>``; random draws come from ``self.ctx.rng(key, ...)``, so a
                re-run makes the same calls.
            n: calls per operator (the rollout's ``children_per_operator``).
            operators: the rollout's ``operators``, or None for :attr:`member_operators`.

        Returns:
            The calls, each with ``meta`` ``parent_score`` / ``worst_score`` for the rollout's rewards.

        Raises:
            ConfigError: a parent operator asked of a search that keeps no population (:attr:`keeps_population`).
        """
        ops = list(self.member_operators if operators is None else operators)
        parented = any(parents_needed(op, self.parents_m) for op in ops)
        if parented and not self.keeps_population:
            raise ConfigError(
                f"rollout.operators: {ops} need parents, but evolver {self.name!r} ({self.type_name}) keeps no "
                "population; use [i1]"
            )
        if parented and self.population:
            return self.sampler.operator_jobs(
                ops, n, self.ctx.rng(key, "children"), (key,), population=self.population, parents_m=self.parents_m
            )
        rng = self.ctx.rng(key, "i1")
        return [
            self.sampler.job("i1", key=self.sampler.key(key, "i1", j), seed=rng.getrandbits(63))
            for j in range(n * len(ops))
        ]

    # ------------------------------------------------------------------ best heuristic
    def best_candidates(self) -> list[Individual]:
        """The candidates for the best heuristic, best training reward first; of equal rewards the earliest first:
        the seed heuristics the population has held (also those it dropped since), then this search's recorded
        heuristics (its own samples and the
        children ES members wrote for it) in recording order, then the rest of the population. One entry per id;
        only finite rewards."""
        own = [Individual.from_trajectory(t) for t in self.sampler.recorded() if t.meta.get("sampler") == self.name]
        pop = list(self.population)
        self._remember_seeds(pop)
        ordered = list(self._seeds.values()) + own + pop
        unique: dict[str, Individual] = {}
        for c in ordered:
            if math.isfinite(c.reward):
                unique.setdefault(c.id, c)
        return sorted(unique.values(), key=lambda c: -c.reward)  # stable: the earliest of equal rewards first

    def publish_best(self) -> bool:
        """Make the best candidate (:meth:`best_candidates`) the run's best if it strictly beats the current one
        (a tie keeps the current best: the earliest of equal heuristics).

        Candidates are taken best training reward first; each must also be valid on the validation instances
        (:meth:`validation_failure`), else it is recorded in :attr:`rejected_best` and the next one is tried.
        A new best is stored as a ``kind="heuristic"`` artifact (idempotent on its id) and written to
        ``run_dir/best_heuristic.py``. Returns whether the best changed.
        """
        finite = self.best_candidates()
        top = None
        for cand in finite:
            if self.best is not None and cand.reward <= self.best.reward:
                return False
            known = cand.code_hash in self.validation
            why = self.validation_failure(cand)
            if why is None:
                top = cand
                break
            if not known:
                self.rejected_best.append({"id": cand.id, "objective": cand.objective, "reason": why})
        if top is None:
            return False
        self.best = top
        self.ctx.store.put_artifact(
            self.ctx.run_id,
            HEURISTIC,
            f"{self.problem.name}/{self.name}",
            {**top.to_dict(), "problem": self.problem.name, "instances": self.train_tag},
            key=f"{self.ctx.run_id}/{self.name}/best/{top.id}",
            meta={"evolver": self.name},
        )
        self.write_best_file()
        return True

    def write_best_file(self) -> None:
        """Write ``run_dir/best_heuristic.py`` (the best code under a header naming its origin)."""
        if self.best is None:
            return
        b = self.best
        thought = " ".join(b.thought.split())
        header = (
            f"# Best heuristic for {self.problem.name} of evolver {self.name!r}'s search (run {self.ctx.run_id}).\n"
            f"# Made by {b.provenance()}.\n"
            f"# Idea: {thought}\n# Training objective ({self.problem.objective_name}, {self.problem.direction}): "
            f"{b.objective:.6g} on {self.train_tag}; id {b.id}.\n\n"
        )
        (self.ctx.run_dir / "best_heuristic.py").write_text(header + b.code.strip() + "\n")

    def validation_failure(self, ind: Individual) -> str | None:
        """Why ``ind`` fails on the validation instances (``validation_count`` per held-out size, seed
        ``validation_seed``: neither training nor held-out instances), or None when it is valid on all of them
        (or the check is off). Evaluated once per code (cached by :attr:`Individual.code_hash`)."""
        if self.config.validation_count == 0:
            return None
        key = ind.code_hash
        if key not in self.validation:
            why = None
            for size in self.test_sizes():
                if size not in self._validation_sets:
                    self._validation_sets[size] = self.problem.generate(
                        size, self.config.validation_count, self.validation_seed
                    )
                r = self.sampler.evaluate(
                    [ind.code],
                    self._validation_sets[size],
                    with_reference=False,  # validity only: no reference solver runs on the validation instances
                    timeout_basis=(self.train_size, self.config.train_count),
                )[0]
                if not r.valid:
                    why = f"n={size}: {failure_text(r, 160)}"
                    break
            self.validation[key] = why
        return self.validation[key]

    # ------------------------------------------------------------------ held-out measurement (the report's)
    def test_sizes(self) -> list[int]:
        """The held-out sizes: ``test_sizes``, else the problem's first three sizes."""
        return list(self.config.test_sizes or self.problem.sizes[:3] or [self.train_size])

    def heldout_result(self, code: str, size: int) -> EvalResult:
        """``code`` evaluated on the held-out instances of ``size`` (``test_count``, seed :attr:`test_seed`),
        once per (code, size); the time spent is added to :attr:`heldout_s`."""
        key = (hashlib.sha256(code.encode()).hexdigest(), size)
        if key not in self._test_cache:
            t0 = time.perf_counter()
            inst = self.problem.generate(size, self.config.test_count, self.test_seed)
            self._test_cache[key] = self.sampler.evaluate(
                [code], inst, timeout_basis=(self.train_size, self.config.train_count)
            )[0]
            self.heldout_s += time.perf_counter() - t0
        return self._test_cache[key]

    def heldout_results(self) -> list[tuple[int, EvalResult, EvalResult | None]]:
        """Per test size: (size, the seed heuristic's result, the best heuristic's result or None when there is
        no best). Evaluated once per (code, size) (:meth:`heldout_result` caches)."""
        seed = self.problem.seed_heuristic_code()
        return [
            (size, self.heldout_result(seed, size), self.heldout_result(self.best.code, size) if self.best else None)
            for size in self.test_sizes()
        ]

    def peer_result(self, code: str, key: str) -> EvalResult:
        """``code`` evaluated on the peer instance set ``key`` (:data:`coevo.ahd.references.PEER_SETS`), cached."""
        from coevo.ahd.references import PEER_SETS

        cache_key = (hashlib.sha256(code.encode()).hexdigest(), key)
        if cache_key not in self._test_cache:
            t0 = time.perf_counter()
            inst = PEER_SETS[key]()
            self._test_cache[cache_key] = self.sampler.evaluate(
                [code], inst, with_reference=False, timeout_basis=(self.train_size, self.config.train_count)
            )[0]
            self.heldout_s += time.perf_counter() - t0
        return self._test_cache[cache_key]

    def report_markdown(self) -> str:
        """The report section (:func:`coevo.report.ahd.ahd_section`): seed vs best heuristic on held-out instances
        (mean objective, gap %), the best's provenance and ties, and the children ES members wrote for this
        search per ES generation. A subclass adds a section of its own with
        ``super().report_markdown() + "\n\n" + ...`` (docs/extending.md)."""
        from coevo.report.ahd import ahd_section

        self.publish_best()
        return ahd_section(self)

    def close(self) -> None:
        """Publish the best heuristic a last time and write ``best_heuristic.py``."""
        self.publish_best()
        self.write_best_file()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The base state (keys :data:`BASE_STATE_KEYS`): the best heuristic, the validation cache, the rejected
        candidates, the default population, the pooling cursor and the seed heuristics held. A subclass returns
        ``{**super().state_dict(), ...its own keys}`` (JSON-serialisable)."""
        return {
            "best": self.best.to_dict() if self.best else None,
            "validation": dict(self.validation),
            "rejected_best": list(self.rejected_best),
            "skipped_seeds": dict(self.skipped_seeds),
            "population": [i.to_dict() for i in self._population],
            "pool_cursor": self.pool_cursor,
            "seeds": [i.to_dict() for i in self._seeds.values()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; a subclass calls ``super().load_state_dict(state)`` first."""
        self.best = Individual.from_dict(state["best"]) if state.get("best") else None
        self.validation = dict(state.get("validation") or {})
        self.rejected_best = list(state.get("rejected_best") or [])
        self.skipped_seeds = dict(state.get("skipped_seeds") or {})
        self._population = [Individual.from_dict(d) for d in state.get("population") or []]
        self.pool_cursor = int(state.get("pool_cursor") or 0)
        self._seeds = {d["id"]: Individual.from_dict(d) for d in state.get("seeds") or []}
        self._remember_seeds(self._population)
        self._base_loaded = True


def _checked_save(method):
    """``method`` (a subclass's ``state_dict``), raising ``TypeError`` when its result lacks the base state."""

    @functools.wraps(method)
    def state_dict(self):
        state = method(self)
        missing = [k for k in BASE_STATE_KEYS if k not in state] if isinstance(state, dict) else list(BASE_STATE_KEYS)
        if missing:
            raise TypeError(
                f"{type(self).__qualname__}.state_dict() must return {{**super().state_dict(), ...}} "
                f"(missing: {', '.join(missing)}): without it the best heuristic is lost on resume"
            )
        return state

    state_dict._keeps_base = True  # type: ignore[attr-defined]
    return state_dict


def _checked_load(method):
    """``method`` (a subclass's ``load_state_dict``), raising ``TypeError`` when it skips the base's."""

    @functools.wraps(method)
    def load_state_dict(self, state):
        self._base_loaded = False
        method(self, state)
        if not self._base_loaded:
            raise TypeError(
                f"{type(self).__qualname__}.load_state_dict() must call super().load_state_dict(state): without "
                "it the best heuristic is lost on resume"
            )

    load_state_dict._keeps_base = True  # type: ignore[attr-defined]
    return load_state_dict

"""The sampler service of heuristic design: prompt -> sample -> extract -> evaluate -> record.

One :class:`HeuristicSampler` serves one problem and one training set of a run. Every heuristic-design
component goes through it: the ``eoh`` and ``sample`` evolvers (:mod:`coevo.evolvers.eoh`,
:mod:`coevo.evolvers.sampling`) and the ES rollout ``eoh_children`` (:mod:`coevo.rollouts.eoh_children`),
which writes children of an evolver's population under perturbed weights with that evolver's sampler.

* prompt: :meth:`HeuristicSampler.job` builds one LLM call of an EoH operator (:mod:`coevo.ahd.prompts`);
  :meth:`HeuristicSampler.operator_jobs` builds a generation's calls, drawing parents from a population by
  rank (:func:`coevo.ahd.population.select_parents`);
* sample: :meth:`HeuristicSampler.sample` reuses the jobs whose key is stored (resume), cuts the rest to
  the sample budget and generates them in one batched ``policy.generate`` call (one per sampling temperature
  when ``operator_temperature`` sets different ones);
  :meth:`HeuristicSampler.sample_population` does the same for the jobs of every member of a low-rank ES
  population in one ``population.generate`` call;
* answer format (:mod:`coevo.ahd.answer`, ``answer_format``): ``prefill`` (default) ends every prompt with an
  assistant turn that already holds the code fence, the template's imports, the function's ``def`` line and
  ``# idea:``; the policy continues it (``Policy.can_continue_final_message``: the HF and vLLM backends, vLLM's
  server), decoding stops at the first line at column 0 after the body (stop strings), and the prefix is glued
  back before extraction. A policy that cannot continue a message gets today's ``free`` prompt instead (one
  logged line, once per sampler). ``answer_grammar`` also constrains the continuation to
  :data:`coevo.ahd.answer.BODY_REGEX` (vLLM's structured outputs);
* extract: the thought and the code of the problem's function, stripped of docstrings and comments
  (:func:`coevo.ahd.answer.read_answer`; failure kinds ``parse``, ``syntax``, ``truncated``, ``no_code``,
  ``empty_body``); with ``parse_retries`` > 0, a call whose answer defines no such function (failure kind
  ``parse``, ``no_code`` or ``empty_body``, e.g. the thought alone) is asked again with the same prompt and a
  new seed, at most that many times, as EoH's ``_get_alg`` re-queries an answer without code (Liu et al., ICML
  2024; its code retries up to 4 times).
  Every call counts against the sample budget (the budget counts LLM calls; LLM4AD's samplers do not retry,
  so the default is 0). With ``duplicate_retries`` > 0, an answer whose code copies an existing heuristic
  (below) is asked again the same way before anything is evaluated, so the slot yields a new sample; the
  trajectory records the last answer, ``llm_calls`` and the summed tokens of all
  its calls, and ``meta["retried_outputs"]`` the answers it replaced;
* evaluate: :func:`coevo.ahd.evaluate.evaluate_many` on the training instances, ``workers`` sandboxed
  processes at a time;
* duplicates: with ``reject_duplicates``, a sample whose code is the same (up to formatting, comments,
  docstrings and local variable names, :func:`coevo.ahd.population.code_key`) as an existing individual's is
  not evaluated but recorded as invalid with failure kind ``duplicate``. Existing individuals: every valid
  heuristic already recorded in the run for this problem and training set, the caller's population (e.g. the
  seed heuristic) and the earlier samples of the same batch;
* behavioural duplicates: with ``reject_same_behaviour``, a sample that is valid but scores exactly the same
  objective on every training instance as an existing individual (the same list of per-instance objectives,
  ``metrics["objectives"]``) is recorded as invalid with failure kind ``behavioural_duplicate``, its objective
  and metrics kept in ``meta`` and ``meta["same_behaviour_as"]`` naming the individual it matches. A code
  fingerprint cannot catch these: on the 0.5B model, 8 of 11 valid answers scored exactly nearest
  neighbour's objective with different code (docs/field-notes §8). EoH's survivors already keep one
  heuristic per mean objective (:func:`coevo.ahd.population.survivors`); this check makes such samples count
  as what they are (no new heuristic) in the budget's tally, the ES rewards and the reports;
* repair: with ``repair``, a sample that failed with a syntax, runtime or return-type error goes back to the
  model once, in one batched call after its batch, with its own conversation, its answer and the one-line error
  (:func:`coevo.ahd.prompts.repair_messages`; ReEvo / OpenEvolve PR #443 style error feedback). The repair is an
  operator of its own (``repair``): a trajectory of its own keyed ``<failed key>/repair``, counted in the sample
  budget, with the failed sample's parents, ``meta["repair_of"]`` (the failed sample's id),
  ``meta["repaired_failure"]`` / ``meta["repaired_error"]`` and ``meta["repeats_failure"]`` (its own failure
  has the failed sample's kind). It is evaluated and recorded like any sample (a repair that fails again is a
  recorded invalid sample; repairs are not repaired) and returned after the sample it repairs;
* free text: :meth:`HeuristicSampler.text` / :meth:`HeuristicSampler.texts` make LLM calls with the evolver's own
  messages (reflections, critiques, plans; :class:`TextCall`), keyed for resume, counted against the sample
  budget like any call, recorded as text (``meta["output"] = "text"``, :data:`coevo.types.TEXT_OUTPUT`), which
  reports count apart from heuristics; :meth:`HeuristicSampler.reflect` is one of them (ReEvo's short-term
  reflection on a better and a worse heuristic);
* record: one trajectory per call, valid or not (failure kinds ``llm_error``, ``parse``, ``duplicate`` or
  the evaluator's), counted against the budget. Reward is the evaluator's score (``-objective`` for minimisation
  problems, higher is better); the raw objective, code, thought and parents go to ``Trajectory.meta``, with
  ``meta["sampler"]`` naming the sampler's owner (the evolver whose training set and search it serves) and
  the best parent's ``parent_objective`` and ``parent_score`` (its reward, in the same score space).

:class:`HeuristicSearch` is what other parts of a run may use of a heuristic-design evolver: its sampler,
its population and the calls its ES members make.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import Field

from coevo.ahd.answer import (
    ANSWER_FORMATS,
    BODY_REGEX,
    NO_FUNCTION_KINDS,
    answer_stops,
    read_answer,
)
from coevo.ahd.evaluate import evaluate_many
from coevo.ahd.population import Individual, code_key, select_parents
from coevo.ahd.prompts import (
    OPERATORS,
    REPAIR,
    build_messages,
    free_format_messages,
    parents_needed,
    reflection_messages,
    repair_messages,
)
from coevo.backends.base import continues_final_message, request_seed
from coevo.errors import ConfigError, DeadlineReached
from coevo.sandbox import pool
from coevo.sandbox.runner import Sandbox, SandboxLimits
from coevo.types import TEXT_OUTPUT, ContextRef, ESMember, EvalResult, Trajectory, is_text

if TYPE_CHECKING:
    from coevo.ahd.instances import InstanceSet
    from coevo.ahd.problem import HeuristicProblem
    from coevo.backends.base import Policy, SamplingParams
    from coevo.budget import Budget
    from coevo.es.replica import Population
    from coevo.store import TrajectoryStore

log = logging.getLogger(__name__)


#: failure kinds a repair call is made for (``repair``): the model wrote the function but it does not run
REPAIRABLE = ("syntax", "runtime", "return_type")
#: ``request_seed`` index of the repair calls (the parse and duplicate retries use -1, -2, ...)
REPAIR_SEED_INDEX = -(1 << 20)


def repair_key(key: str) -> str:
    """The trajectory key of the repair of the sample keyed ``key``."""
    return f"{key}/{REPAIR}"


def one_line(text: str | None, limit: int = 300) -> str:
    """``text`` on one line (white space folded), cut to ``limit`` characters."""
    return " ".join((text or "").split())[:limit]


def behaviour_key(objectives: Sequence[float] | None) -> str | None:
    """A 16-hex-digit key of a heuristic's per-instance objectives on the training set (exact floats, in
    instance order), or None without them: equal keys mean the same behaviour on every training instance."""
    if not objectives:
        return None
    return hashlib.sha256(json.dumps([float(o) for o in objectives]).encode()).hexdigest()[:16]


@dataclass
class SampleJob:
    """One LLM call to make: the prompt, its operator and parents, and its deterministic key and seed."""

    key: str
    operator: str
    messages: list[dict[str, str]]
    seed: int
    parents: list[Individual] = field(default_factory=list)
    extra_meta: dict[str, Any] = field(default_factory=dict)


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


def prose(text: str) -> str:
    """``text`` as prose for a prompt: fenced code dropped, white space folded to single spaces."""
    return " ".join(re.sub(r"```.*?(```|$)", " ", text, flags=re.DOTALL).split())


#: the ``kind`` of a text call may not be one of these: they name heuristic samples (EoH's operators, ``repair``,
#: ``seed``, ``tune``), which reports count as heuristics, not text
HEURISTIC_KINDS = (*OPERATORS, REPAIR, "seed", "tune", "heuristic")
#: longest text (characters) :meth:`HeuristicSampler.reflect` passes on
REFLECTION_CHARS = 600


@dataclass
class TextCall:
    """One free-text LLM call with the evolver's own messages (:meth:`HeuristicSampler.texts`).

    Attributes:
        key: the trajectory key (deterministic, from the evolver's own parts: ``sampler.key(name, round, ...)``);
            a stored one is reused without a call (resume).
        messages: the chat messages (``[{"role": ..., "content": ...}, ...]``).
        kind: what the text is (``"reflection"``, ``"long_term_reflection"``, ``"critique"``, ...), recorded as
            ``meta["kind"]`` and in the task id ``<training tag>/<kind>``; not a heuristic kind
            (:data:`HEURISTIC_KINDS`).
        seed: the sampling seed (default: from the key, so the same call samples the same way on every re-run).
        max_new_tokens: the call's token cap (default the sampler's ``max_new_tokens``).
        max_chars: the longest text passed on (characters); a longer answer is cut there and recorded with
            ``meta["cut_from_chars"]`` (its full length; the full answer stays in the step's ``model_output``).
        prose: drop fenced code and fold white space (:func:`prose`) before cutting; False: the answer stripped.
        meta: extra ``Trajectory.meta`` (JSON), e.g. the ids of the heuristics the text is about.
    """

    key: str
    messages: list[dict[str, str]]
    kind: str = "text"
    seed: int | None = None
    max_new_tokens: int | None = None
    max_chars: int | None = None
    prose: bool = True
    meta: dict[str, Any] = field(default_factory=dict)

    def call_seed(self) -> int:
        """:attr:`seed`, or a 63-bit seed derived from :attr:`key`."""
        if self.seed is not None:
            return self.seed
        return int.from_bytes(hashlib.sha256(self.key.encode()).digest()[:8], "big") >> 1


def _messages_text(messages: list[dict[str, str]]) -> str:
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


@dataclass(frozen=True)
class SamplerSettings:
    """How a :class:`HeuristicSampler` draws, checks and evaluates: the sampler's fields of
    :class:`coevo.evolvers.ahd_common.AHDConfig`, by the same names (:meth:`of` reads them from it).

    Attributes:
        train_size, train_count, train_seed: the training instances (generated once, deterministically).
        eval_timeout_s: wall-clock limit of one sandboxed evaluation (s). eval_memory_mb: its address-space limit
            (MiB). eval_workers: evaluations run in parallel.
        reject_duplicates: record copies of existing individuals as ``duplicate`` without evaluating them.
        parse_retries: further calls for an answer without the problem's function (module docstring);
            retry ``r`` of a batch seeded ``s`` is seeded ``request_seed(s, -r)``.
        duplicate_retries: further calls for an answer that copies an existing heuristic (found before it is
            evaluated; the slot is spent on a new sample instead), seeded as the parse retries.
        operator_temperature: operator -> sampling temperature of its calls (others: ``sampling.temperature``).
            Calls of different temperatures are generated in separate batches (one per temperature, each seeded
            with the batch's seed), so a generation with two temperatures costs two decode passes.
        repair: ask once more, with the one-line error, for each sample that failed with a syntax, runtime or
            return-type error (module docstring); the repair calls count against the sample budget.
        reject_same_behaviour: record valid samples whose per-instance training objectives equal an existing
            individual's as ``behavioural_duplicate`` (module docstring).
        answer_format: ``"prefill"`` or ``"free"`` (module docstring, :mod:`coevo.ahd.answer`).
        answer_grammar: constrain prefilled answers to :data:`coevo.ahd.answer.BODY_REGEX` (needs a policy with
            ``can_constrain``: the vLLM engine or vLLM's server).
        change_marks: open prefilled m1 / m2 / m3 answers with the operator's change mark
            (:data:`coevo.ahd.answer.CHANGE_MARKS`) instead of ``# idea:``; its line is the child's thought.

    Raises:
        ValueError: a negative retry count, an operator temperature that is not a finite number >= 0, an unknown
            answer format, or ``answer_grammar`` with the free format.
    """

    train_size: int
    train_count: int
    train_seed: int
    eval_timeout_s: float = 30.0
    eval_memory_mb: int = 2048
    eval_workers: int = 2
    reject_duplicates: bool = True
    parse_retries: int = 0
    duplicate_retries: int = 0
    operator_temperature: dict[str, float] = field(default_factory=dict)
    repair: bool = False
    reject_same_behaviour: bool = True
    answer_format: str = "prefill"
    answer_grammar: bool = False
    change_marks: bool = False

    def __post_init__(self) -> None:
        for name in ("parse_retries", "duplicate_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for op, temp in self.operator_temperature.items():
            if not (isinstance(temp, (int, float)) and math.isfinite(temp) and temp >= 0):
                raise ValueError(f"operator_temperature.{op}: must be a finite number >= 0, got {temp!r}")
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {self.answer_format!r}")
        if self.answer_grammar and self.answer_format != "prefill":
            raise ValueError("answer_grammar constrains prefilled answers only: set answer_format to prefill")

    @classmethod
    def of(cls, config: Any, **given: Any) -> SamplerSettings:
        """The settings of ``config`` (any object, e.g. an ``AHDConfig``): each field read from the attribute of
        the same name where it has one, ``given`` (e.g. ``train_size=``, ``train_seed=`` once resolved) taking
        precedence. Raises ``TypeError`` when a field without a default is in neither."""
        values = {f.name: getattr(config, f.name) for f in fields(cls) if getattr(config, f.name, None) is not None}
        return cls(**{**values, **given})

    @property
    def limits(self) -> SandboxLimits:
        """The limits of one sandboxed evaluation."""
        return SandboxLimits(timeout_s=self.eval_timeout_s, memory_mb=self.eval_memory_mb)


@dataclass
class _Batch:
    """How one batch of calls is made and recorded: ``generate(pending, params)`` (a policy's or an ES
    population's), the batch seed (None: the first pending job's), the round and generation recorded, the
    author recorded (None: the owner) and the individuals a sample must not copy."""

    generate: Callable[[list[tuple[SampleJob, ESMember | None, int]], SamplingParams], list[Any]]
    seed: int | None
    round_index: int
    generation: int
    evolver: str | None
    existing: Sequence[Individual]


class HeuristicSampler:
    """prompt -> sample -> extract -> evaluate -> record for one problem and training set (module docstring).

    Args:
        problem: the heuristic problem.
        settings: the training set, the evaluation limits and the sampling options (:class:`SamplerSettings`).
        owner: name of the evolver this sampler serves (recorded as ``meta["sampler"]``).
        run_id: the run's id. store: the run's trajectory store. budget: the run's sample budget.
        sampling: decoding settings of every call (the per-call seed is set from the job).
        default_policy: returns the policy used when :meth:`sample` gets none (called only when a call is
            actually made, so a fully cached re-run never loads a model).
        progress: called as ``progress(kind, n)`` when trajectories are recorded: ``"trajectories"`` (n new ones),
            and ``"text"`` (n of them free-text calls); the run context's ``report_progress``.
    """

    def __init__(
        self,
        problem: HeuristicProblem,
        settings: SamplerSettings,
        *,
        owner: str,
        run_id: str,
        store: TrajectoryStore,
        budget: Budget,
        sampling: SamplingParams,
        default_policy: Callable[[], Policy] | None = None,
        progress: Callable[[str, int], None] | None = None,
    ) -> None:
        self.problem = problem
        self.settings = settings
        self.owner = owner
        self.run_id = run_id
        self.store = store
        self.budget = budget
        self.sampling = sampling
        self.train_size, self.train_count, self.train_seed = (
            settings.train_size,
            settings.train_count,
            settings.train_seed,
        )
        self.train_tag = f"{problem.name}/n{self.train_size}x{self.train_count}/s{self.train_seed}"
        self.sandbox = ParallelSandbox(Sandbox(settings.limits), settings.eval_workers)
        self.default_policy = default_policy
        self.progress = progress
        self._told_free = False  # the line saying a policy cannot continue a message was logged
        sign = "-" if problem.direction == "minimize" else "+"
        #: what a trajectory's reward is (recorded as ``meta["reward_unit"]``)
        self.reward_unit = f"heuristic score = {sign}{problem.objective_name or 'objective'} (higher is better)"
        self._train: InstanceSet | None = None
        self._known: dict[str, str] = {}  # code_key -> id of a valid recorded heuristic
        self._known_cursor = 0  # largest trajectory id folded into _known
        self._behaviours: dict[str, str] = {}  # behaviour_key -> id of a valid recorded heuristic
        self._behaviour_cursor = 0  # largest trajectory id folded into _behaviours
        self._seed_behaviours: dict[str, str | None] = {}  # code_key of a seed individual -> its behaviour_key

    # ------------------------------------------------------------------ instances and evaluation
    @property
    def train_instances(self) -> InstanceSet:
        """The training :class:`~coevo.ahd.instances.InstanceSet` (generated once, deterministic)."""
        if self._train is None:
            self._train = self.problem.generate(self.train_size, self.train_count, self.train_seed)
        return self._train

    def evaluate(
        self,
        codes: Sequence[str],
        instances: InstanceSet | None = None,
        with_reference: bool = True,
        timeout_basis: InstanceSet | tuple[int, int] | None = None,
    ) -> list[EvalResult]:
        """Evaluate heuristics in parallel in the sandbox (default: on the training instances); one
        :class:`~coevo.types.EvalResult` per code, in order, invalid ones never raising. ``timeout_basis``
        (``(size, count)`` or an InstanceSet) scales the sandbox's time limit from that workload to these
        instances (:func:`coevo.ahd.evaluate.evaluate_many`)."""
        if not codes:
            return []
        inst = self.train_instances if instances is None else instances
        return evaluate_many(
            self.problem,
            list(codes),
            inst,
            sandbox=self.sandbox,
            with_reference=with_reference,
            timeout_basis=timeout_basis,
        )

    def seed_individual(self, published: str | None = None) -> Individual:
        """The problem's seed heuristic (``published`` None) or one of its published heuristics
        (:meth:`coevo.ahd.problem.HeuristicProblem.published_heuristic_code`), evaluated on the training
        instances, as individual ``"seed"`` or ``"seed:<published>"`` (operator ``seed``).

        Raises:
            ValueError: no published heuristic of that name (the message lists the known ones).
            RuntimeError: the heuristic is invalid (a broken problem folder, not a bad sample).
        """
        if published is None:
            code, ident, thought = self.problem.seed_heuristic_code(), "seed", "the problem's seed heuristic"
        else:
            code = self.problem.published_heuristic_code(published)
            ident, thought = f"seed:{published}", f"published seed heuristic {published}"
        thought = self.problem.heuristic_idea(code) or thought  # what the heuristic does, for the prompts
        res = self.evaluate([code])[0]
        if not res.valid:
            raise RuntimeError(f"{self.problem.name}: the {thought} is invalid ({res.error_kind}: {res.error})")
        self._seed_behaviours[code_key(code)] = behaviour_key(res.metrics.get("objectives"))
        return Individual(
            id=ident,
            thought=thought,
            code=code,
            objective=res.objective,
            reward=res.score,
            operator="seed",
            source="seed",
        )

    # ------------------------------------------------------------------ prompts
    def key(self, *parts: object) -> str:
        """Deterministic trajectory key ``run/part/part/...``."""
        return "/".join([self.run_id, *map(str, parts)])

    def job(
        self,
        operator: str,
        *,
        key: str,
        seed: int,
        parents: Sequence[Individual] = (),
        extra_meta: dict[str, Any] | None = None,
        reflection: str | None = None,
        reflection_label: str | None = None,
        instruction: str | None = None,
    ) -> SampleJob:
        """One heuristic call of ``operator`` on ``parents`` (prompt from :func:`coevo.ahd.prompts.build_messages`).

        Args:
            operator: an EoH operator (``i1``, ``e1``, ``e2``, ``m1``, ``m2``, ``m3``), or with ``instruction`` a
                name of your own (recorded as the sample's operator, e.g. ``"crossover"``).
            key: the trajectory key (:meth:`key`); a stored one is reused (resume). seed: the sampling seed.
            parents: the parent heuristics, shown in order with their objectives (EoH's counts per operator; any
                number with ``instruction``).
            extra_meta: extra ``Trajectory.meta`` of the sample.
            reflection: a text to pass on after the parents (e.g. from :meth:`reflect` or :meth:`text`).
            reflection_label: the line introducing it; default "A note from comparing a better and a worse
                heuristic of the current population (use it where it helps):" (:data:`coevo.ahd.prompts.
                REFLECTION_LABEL`), which fits :meth:`reflect`'s answers only: name what your text is.
            instruction: what the model is asked to write, replacing the operator's own instruction.

        Raises:
            ValueError: unknown operator (without ``instruction``) or a parent count it cannot take.
        """
        messages = build_messages(
            operator,
            self.problem.prompt_spec(),
            list(parents),
            reflection=reflection,
            answer=self.settings.answer_format,
            change_marks=self.settings.change_marks,
            reflection_label=reflection_label,
            instruction=instruction,
        )
        return SampleJob(
            key=key,
            operator=operator,
            messages=messages,
            seed=seed,
            parents=list(parents),
            extra_meta=dict(extra_meta or {}),
        )

    def operator_jobs(
        self,
        operators: Sequence[str],
        n: int,
        rng: random.Random,
        key_parts: Sequence[Any],
        *,
        population: Sequence[Individual],
        parents_m: int,
        weights: dict[str, float] | None = None,
        extra_meta: dict[str, Any] | None = None,
        reflection: str | None = None,
    ) -> list[SampleJob]:
        """The calls of ``n`` slots per operator, parents drawn from ``population`` (ranked best first).

        A slot is used with probability ``weights[op]`` (all used when ``weights`` is None). The RNG is drawn
        for every slot (coin, parents, seed) before any cache lookup, so a resumed step sees the same
        stream. Keys are ``run/<key_parts>/<op>/<slot>``; ``meta`` gets ``worst_objective`` and
        ``worst_score`` (the population's worst: objective, and score = reward, higher is better) and
        ``population_size``. A ``reflection`` (:meth:`reflect`) goes into the prompts of the parent operators.

        Raises:
            RuntimeError: a parent operator with an empty population. ValueError: unknown operator.
        """
        worst = population[-1] if population else None
        jobs = []
        for op in operators:
            need = parents_needed(op, parents_m)
            if need and not population:
                raise RuntimeError(
                    f"{self.owner}: operator {op} needs parents but the population is empty "
                    "(run an initialisation step first)"
                )
            for j in range(n):
                use = rng.random() < (1.0 if weights is None else weights[op])
                parents = select_parents(population, need, rng) if need else []
                seed = rng.getrandbits(63)
                if use:
                    meta = {
                        "worst_objective": worst.objective if worst else None,
                        "worst_score": worst.reward if worst else None,
                        "population_size": len(population),
                        **(extra_meta or {}),
                    }
                    jobs.append(
                        self.job(
                            op,
                            key=self.key(*key_parts, op, j),
                            seed=seed,
                            parents=parents,
                            extra_meta=meta,
                            reflection=reflection if need else None,
                        )
                    )
        return jobs

    # ------------------------------------------------------------------ sampling and recording
    def sample(
        self,
        jobs: Sequence[SampleJob],
        *,
        round_index: int,
        generation: int,
        evolver: str | None = None,
        member: ESMember | None = None,
        policy: Policy | None = None,
        existing: Sequence[Individual] = (),
    ) -> list[Trajectory]:
        """Run ``jobs`` as LLM calls and return their trajectories (in job order, each followed by its repair
        when ``repair`` made one).

        Jobs whose key is stored are reused without a call. The rest are cut to ``budget.allow(n)`` (so the
        returned list may be shorter than ``jobs``), generated in one ``policy.generate`` call (one per
        temperature, :meth:`_generate`) seeded with the first pending job's seed, parsed, evaluated and recorded. Every call is recorded, valid or not.

        Args:
            round_index, generation: recorded on the trajectories.
            evolver: the evolver recorded as the trajectories' author (default the owner).
            member: the ES member the policy is perturbed with (recorded; ``space`` is then "parameter").
            policy: the model (default ``default_policy()``).
            existing: individuals a sample must not copy besides the recorded ones (e.g. the population,
                with the seed heuristic).

        Raises:
            PolicyError: the backend cannot serve the request at all (not a bad sample).
            RuntimeError: calls are due but there is no policy.
        """

        def generate(pending: list[tuple[SampleJob, ESMember | None, int]], params: SamplingParams):
            target = policy if policy is not None else self._default()
            jobs = [job for job, _, _ in pending]
            params = self._answer_params(jobs, target, params)
            return self._glue_prefix(jobs, target.generate([job.messages for job in jobs], params))

        entries = [(job, member, k) for k, job in enumerate(jobs)]
        made = self._sample_entries(entries, _Batch(generate, None, round_index, generation, evolver, existing))
        return self._in_job_order(jobs, made)

    def sample_population(
        self,
        groups: Sequence[tuple[ESMember, Sequence[SampleJob]]],
        *,
        population: Population,
        seed: int,
        round_index: int,
        generation: int,
        evolver: str | None = None,
        existing: Sequence[Individual] = (),
    ) -> list[list[Trajectory]]:
        """:meth:`sample` for the jobs of several ES members of a low-rank population, in one batched
        ``population.generate`` call (rows ``(member, job.messages)``), then evaluated together.

        Sampling seeds: job ``k`` of every member samples with ``request_seed(seed, k)`` (common random
        numbers across the members: they differ by their perturbation and their prompts only). The seed of a
        job does not depend on which jobs are stored, so a partly recorded call re-run after a kill samples the
        missing jobs as the full call did. The budget cut keeps the jobs in member order.

        Returns:
            one trajectory list per group, in job order (shorter where the budget cut it), each followed by its
            repair when ``repair`` made one (under the same member).

        Raises:
            PolicyError: the backend cannot serve the request at all (not a bad sample).
        """
        entries = [(job, member, k) for member, jobs in groups for k, job in enumerate(jobs)]

        def generate(pending: list[tuple[SampleJob, ESMember | None, int]], params: SamplingParams):
            jobs = [job for job, _, _ in pending]
            params = self._answer_params(jobs, population, params)
            rows = [(member, job.messages) for job, member, _ in pending]
            return self._glue_prefix(jobs, population.generate(rows, params, seed_indices=[k for _, _, k in pending]))

        made = self._sample_entries(entries, _Batch(generate, seed, round_index, generation, evolver, existing))
        return [self._in_job_order(jobs, made) for _, jobs in groups]

    def _default(self) -> Policy:
        if self.default_policy is None:
            raise RuntimeError(f"{self.owner}: no policy to sample heuristics with")
        return self.default_policy()

    def _sample_entries(
        self,
        entries: list[tuple[SampleJob, ESMember | None, int]],
        batch: _Batch,
    ) -> dict[str, Trajectory]:
        """Stored or freshly sampled trajectories of ``entries`` ``(job, member, seed index)``: the pending ones
        cut to the budget, generated in one ``batch.generate(pending, params)`` call (``params.seed``:
        ``batch.seed``, or the first pending job's seed), parsed, checked for copies, evaluated together, checked for behavioural
        copies and recorded; then the failed ones are repaired (:meth:`_repairs`). Returns job key -> trajectory
        for every entry that has one (entries the budget cut have none) and for their repairs."""
        found = [(entry, self.store.get_by_key(entry[0].key)) for entry in entries]
        pending = [entry for entry, t in found if t is None]
        pending = pending[: self.budget.allow(len(pending))]
        made: dict[str, Trajectory] = {entry[0].key: t for entry, t in found if t is not None}
        if pending:
            params = self.sampling.with_seed(pending[0][0].seed if batch.seed is None else batch.seed)
            started = time.time()
            completions = self._generate(batch.generate, pending, params)
            jobs = [job for job, _, _ in pending]
            extractions = [self._extract(c) for c in completions]
            calls = self._retry_unparsed(pending, batch.generate, params, completions, extractions, batch.existing)
            coded = [i for i, e in enumerate(extractions) if e is not None and e.code is not None]
            copies = self._duplicates(jobs, [extractions[i].code for i in coded], coded, batch.existing)
            to_eval = [i for i in coded if i not in copies]
            results = dict(zip(to_eval, self.evaluate([extractions[i].code for i in to_eval])))
            same = self._same_behaviour(jobs, results, batch.existing)
            for i, (job, member, _) in enumerate(pending):
                t = self._trajectory(
                    job, calls[i], extractions[i], results.get(i), batch, member, started, params.seed, copies.get(i)
                )
                t = self._checked(t, job, same.get(i))
                made[job.key] = self._record(t)
        made.update(self._repairs(entries, made, batch))
        return made

    # ------------------------------------------------------------------ behavioural duplicates and repair
    def _in_job_order(self, jobs: Sequence[SampleJob], made: dict[str, Trajectory]) -> list[Trajectory]:
        """The trajectories of ``jobs`` in job order, each followed by its repair when one was made."""
        return [made[k] for job in jobs for k in (job.key, repair_key(job.key)) if k in made]

    def _same_behaviour(
        self, jobs: Sequence[SampleJob], results: dict[int, EvalResult], existing: Sequence[Individual]
    ) -> dict[int, str]:
        """Batch position -> id of the individual whose per-instance training objectives the valid sample at
        that position repeats exactly (``reject_same_behaviour``). Existing: the valid recorded heuristics of
        this problem and training set, the seed individuals in ``existing`` (evaluated once when this sampler
        has not seen them: a resumed run) and the earlier valid samples of the batch."""
        if not self.settings.reject_same_behaviour or not any(r.valid for r in results.values()):
            return {}
        for t in self.recorded(since_id=self._behaviour_cursor):
            k = behaviour_key((t.meta.get("metrics") or {}).get("objectives"))
            if k is not None:
                self._behaviours.setdefault(k, t.key.split("/", 1)[-1])
            self._behaviour_cursor = max(self._behaviour_cursor, t.id)
        known = dict(self._behaviours)
        for ind in existing:
            if ind.operator != "seed":
                continue  # a sampled or tuned individual is a recorded trajectory (folded above)
            ck = ind.code_hash
            if ck not in self._seed_behaviours:
                res = self.evaluate([ind.code])[0]
                self._seed_behaviours[ck] = behaviour_key(res.metrics.get("objectives")) if res.valid else None
            if self._seed_behaviours[ck] is not None:
                known.setdefault(self._seed_behaviours[ck], ind.id)
        same: dict[int, str] = {}
        for i in sorted(results):
            k = behaviour_key(results[i].metrics.get("objectives")) if results[i].valid else None
            if k is None:
                continue
            if k in known:
                same[i] = known[k]
            else:
                known[k] = jobs[i].key.split("/", 1)[-1]
        return same

    def _checked(self, t: Trajectory, job: SampleJob, same_as: str | None) -> Trajectory:
        """``t`` as it is recorded: a behavioural duplicate of ``same_as`` (when set) as such, and a repair with
        ``meta["repeats_failure"]``."""
        if same_as is not None:
            t = self._as_behavioural_duplicate(t, same_as)
        if job.operator == REPAIR:
            t.meta["repeats_failure"] = t.failure == job.extra_meta.get("repaired_failure")
        return t

    def _as_behavioural_duplicate(self, t: Trajectory, same_as: str) -> Trajectory:
        """``t`` (a valid sample) recorded as failure ``behavioural_duplicate`` of ``same_as``: no reward, its
        objective and metrics kept in ``meta``."""
        detail = (
            f"the same objective on every training instance as {same_as} "
            f"({t.meta.get('objective'):.6g} on average) with other code"
        )
        t.meta["same_behaviour_as"] = same_as
        t.steps[0].reward = None
        return replace(t, valid=False, reward=None, failure="behavioural_duplicate", failure_detail=detail)

    def _repairs(
        self,
        entries: list[tuple[SampleJob, ESMember | None, int]],
        made: dict[str, Trajectory],
        batch: _Batch,
    ) -> dict[str, Trajectory]:
        """With ``repair``: one repair call (:func:`coevo.ahd.prompts.repair_messages`) per entry whose recorded
        sample failed with a :data:`REPAIRABLE` kind, under the same ES member, all in one batched call (seeded
        ``request_seed(seed, REPAIR_SEED_INDEX)``, or from the first repair's seed) cut to the sample budget;
        stored repairs are reused (resume). Repairs are not repaired. Returns repair key -> trajectory."""
        if not self.settings.repair:
            return {}
        todo = []
        for job, member, k in entries:
            t = made.get(job.key)
            if t is None or job.operator == REPAIR or t.failure not in REPAIRABLE:
                continue
            todo.append((self._repair_job(job, t), member, k))
        if not todo:
            return {}
        seed = None if batch.seed is None else request_seed(batch.seed, REPAIR_SEED_INDEX)
        return self._sample_entries(todo, replace(batch, seed=seed))

    def _repair_job(self, job: SampleJob, failed: Trajectory) -> SampleJob:
        """The repair call of ``job``, whose recorded trajectory ``failed`` failed (parents and meta kept)."""
        error = one_line(f"{failed.failure_detail or failed.failure}")
        answer = failed.steps[0].model_output if failed.steps else ""
        return SampleJob(
            key=repair_key(job.key),
            operator=REPAIR,
            messages=repair_messages(job.messages, answer, error, self.problem.prompt_spec()),
            seed=request_seed(job.seed, REPAIR_SEED_INDEX),
            parents=list(job.parents),
            extra_meta={
                **job.extra_meta,
                "repair_of": failed.key.split("/", 1)[-1],
                "repaired_operator": job.operator,
                "repaired_failure": failed.failure,
                "repaired_error": error,
            },
        )

    def _retry_unparsed(
        self,
        pending: list[tuple[SampleJob, ESMember | None, int]],
        generate: Callable[[list[tuple[SampleJob, ESMember | None, int]], SamplingParams], list[Any]],
        params: SamplingParams,
        completions: list[Any],
        extractions: list[Any],
        existing: Sequence[Individual] = (),
    ) -> list[list[Any]]:
        """Ask again, in place, the calls whose answer defines no problem function (``parse_retries`` rounds) or
        copies an existing heuristic (``duplicate_retries`` rounds, checked before anything is evaluated): one
        batched ``generate`` per round, each cut to the sample budget left after the calls in flight.
        Returns every position's completions, oldest first (the last one is in ``completions``)."""
        calls = [[c] for c in completions]
        rounds = max(self.settings.parse_retries, self.settings.duplicate_retries)
        if not rounds:
            return calls
        jobs = [job for job, _, _ in pending]
        left = self.budget.remaining()
        left = None if left is None else left - len(pending)
        for attempt in range(1, rounds + 1):
            redo = []
            if attempt <= self.settings.parse_retries:
                redo = [
                    i
                    for i, (c, e) in enumerate(zip(completions, extractions))
                    if c.error is None and e is not None and e.code is None and e.error in NO_FUNCTION_KINDS
                ]
            if attempt <= self.settings.duplicate_retries and self.settings.reject_duplicates:
                coded = [i for i, e in enumerate(extractions) if e is not None and e.code is not None]
                copies = self._duplicates(jobs, [extractions[i].code for i in coded], coded, existing)
                redo = sorted(set(redo) | set(copies))
            if left is not None:
                redo = redo[: max(0, left)]
                left -= len(redo)
            if not redo:
                break
            try:
                again = self._generate(
                    generate, [pending[i] for i in redo], params.with_seed(request_seed(params.seed, -attempt))
                )
            except DeadlineReached:
                # the wall budget ran out during a retry: keep the batch's answers (they are recorded now; only
                # the retry is lost) and let the next sample boundary stop the run
                break
            for i, c in zip(redo, again):
                completions[i] = c
                extractions[i] = self._extract(c)
                calls[i].append(c)
        return calls

    def _generate(
        self,
        generate: Callable[[list[tuple[SampleJob, ESMember | None, int]], SamplingParams], list[Any]],
        entries: list[tuple[SampleJob, ESMember | None, int]],
        params: SamplingParams,
    ) -> list[Any]:
        """``generate(entries, params)``, split into one call per sampling temperature when
        ``operator_temperature`` gives the entries' operators different ones; completions in entry order."""
        groups: dict[float, list[int]] = {}
        for i, (job, _, _) in enumerate(entries):
            groups.setdefault(
                float(self.settings.operator_temperature.get(job.operator, params.temperature)), []
            ).append(i)
        out: list[Any] = [None] * len(entries)
        for temperature, index in groups.items():
            for i, comp in zip(index, generate([entries[i] for i in index], replace(params, temperature=temperature))):
                out[i] = comp
        return out

    # ------------------------------------------------------------------ free-text calls
    def text(
        self,
        messages: list[dict[str, str]],
        *,
        key: str,
        round_index: int,
        generation: int,
        kind: str = "text",
        seed: int | None = None,
        max_new_tokens: int | None = None,
        max_chars: int | None = None,
        prose: bool = True,
        meta: dict[str, Any] | None = None,
        policy: Policy | None = None,
    ) -> str | None:
        """One free-text LLM call with your own ``messages`` (a reflection, a critique, a plan): :meth:`texts` for
        one :class:`TextCall` of these fields. Returns its text, or None (budget spent, failed or empty call)."""
        call = TextCall(key, messages, kind, seed, max_new_tokens, max_chars, prose, dict(meta or {}))
        return self.texts([call], round_index=round_index, generation=generation, policy=policy)[0]

    def texts(
        self,
        calls: Sequence[TextCall],
        *,
        round_index: int,
        generation: int,
        evolver: str | None = None,
        policy: Policy | None = None,
    ) -> list[str | None]:
        """Free-text LLM calls with the evolver's own messages, made in one batched ``generate`` (one per token cap).

        Each call is one LLM sample: it is recorded as one trajectory (``llm_calls`` 1, its tokens; task
        ``<training tag>/<kind>``, ``meta["output"] = "text"`` (:data:`coevo.types.TEXT_OUTPUT`), ``meta["kind"]``,
        ``meta["text"]``; no reward) and counts against ``budget.max_samples`` like a heuristic sample, valid or
        not. A call whose key is stored is not made again (resume: the stored text is returned). Calls beyond the
        samples left are not made and not recorded: their text is None, with one warning line naming the
        evolver and the first key cut. An answer that failed is recorded as ``llm_error``, an empty one as
        ``parse`` (detail "empty answer"); both return None and the run goes on. An answer longer than the call's
        ``max_chars`` is cut there (``meta["cut_from_chars"]``: its length before).

        Args:
            calls: the calls (:class:`TextCall`), keys unique.
            round_index, generation: recorded on the trajectories.
            evolver: the author recorded (default the sampler's owner).
            policy: the model (default ``default_policy()``).

        Returns:
            per call, in order: its text, or None.

        Raises:
            ValueError: a call's ``kind`` names a heuristic (:data:`HEURISTIC_KINDS`): reports would count the text
                as a heuristic sample; the message names the evolver.
        """
        author = evolver or self.owner
        for call in calls:
            if call.kind in HEURISTIC_KINDS or not call.kind:
                raise ValueError(
                    f"evolver {author!r}: text call {call.key!r} has kind {call.kind!r}, a heuristic kind "
                    f"({', '.join(HEURISTIC_KINDS)}); a text call records text, not a heuristic: name what the text "
                    "is (e.g. 'reflection', 'critique')"
                )
        found = {call.key: self.store.get_by_key(call.key) for call in calls}
        pending = [call for call in calls if found[call.key] is None]
        allowed = self.budget.allow(len(pending))
        if allowed < len(pending):
            log.warning(
                "%s: the sample budget is spent (budget.max_samples = %s): %d text call(s) not made, the first %s",
                author,
                self.budget.max_samples,
                len(pending) - allowed,
                pending[allowed].key,
            )
        groups: dict[int, list[TextCall]] = {}
        for call in pending[:allowed]:
            groups.setdefault(call.max_new_tokens or self.sampling.max_new_tokens, []).append(call)
        for max_new, group in groups.items():
            params = replace(self.sampling, max_new_tokens=max_new, stop=(), regex=None)
            params = params.with_seed(group[0].call_seed())
            started = time.time()
            completions = (policy or self._default()).generate([c.messages for c in group], params)
            for call, comp in zip(group, completions, strict=True):
                found[call.key] = self._record(
                    self._text_trajectory(call, comp, round_index, generation, author, started)
                )
        return [(t.meta.get("text") or None) if t is not None else None for t in (found[c.key] for c in calls)]

    def _record(self, t: Trajectory) -> Trajectory:
        """Store ``t`` (idempotent on its key) and tell :attr:`progress` when it is new."""
        stored, inserted = self.store.add_trajectory(t)
        if inserted and self.progress is not None:
            self.progress("trajectories", 1)
            if is_text(stored):
                self.progress("text", stored.llm_calls)
        return stored

    def _text_trajectory(
        self, call: TextCall, comp: Any, round_index: int, generation: int, evolver: str, started: float
    ) -> Trajectory:
        """The trajectory of one text call (:meth:`texts`)."""
        text = "" if comp.error is not None else prose(comp.text) if call.prose else comp.text.strip()
        meta: dict[str, Any] = {
            **call.meta,
            "output": TEXT_OUTPUT,
            "kind": call.kind,
            "problem": self.problem.name,
            "sampler": self.owner,
            "seed": call.call_seed(),
            "finish_reason": comp.finish_reason,
        }
        if call.max_chars is not None and len(text) > call.max_chars:
            meta["cut_from_chars"] = len(text)
            text = text[: call.max_chars].rstrip()
        meta["text"] = text
        parents = ",".join(meta.get("parent_ids") or []) or None
        return Trajectory.from_completion(
            comp,
            key=call.key,
            run_id=self.run_id,
            evolver=evolver,
            space="context",
            prompt=_messages_text(call.messages),
            action=text or None,
            failure=None if text or comp.error is not None else "parse",
            failure_detail=None if text or comp.error is not None else "empty answer",
            round=round_index,
            generation=generation,
            task_id=f"{self.train_tag}/{call.kind}",
            context=ContextRef(heuristic_id=parents, prompt=call.kind),
            started_at=started,
            meta=meta,
        )

    def reflect(
        self,
        better: Individual,
        worse: Individual,
        *,
        key: str,
        seed: int,
        round_index: int,
        generation: int,
        max_new_tokens: int,
        policy: Policy | None = None,
    ) -> str | None:
        """One reflection call (:func:`coevo.ahd.prompts.reflection_messages`): why ``better`` beats ``worse``, in
        at most two sentences: a :meth:`text` call of kind ``"reflection"`` (``meta["parent_ids"]``: the two ids).

        Pass the answer on with ``job(..., reflection=answer)``: the block's default label says it compares a
        better and a worse heuristic. Returns the reflection's text (code fences dropped, at most
        :data:`REFLECTION_CHARS` characters), or None (budget spent, failed or empty call).
        """
        return self.text(
            reflection_messages(self.problem.prompt_spec(), better, worse),
            key=key,
            seed=seed,
            round_index=round_index,
            generation=generation,
            kind="reflection",
            max_new_tokens=max_new_tokens,
            max_chars=REFLECTION_CHARS,
            meta={"parent_ids": [better.id, worse.id]},
            policy=policy,
        )

    def _extract(self, comp: Any) -> Any:
        """The :class:`~coevo.sandbox.extract.Extraction` of a completion (:func:`coevo.ahd.answer.read_answer`;
        ``comp.meta["prefill"]``: the prefix its text starts with), None for a failed LLM call."""
        if comp.error is not None:
            return None
        prefix = comp.meta.get("prefill") or ""
        return read_answer(
            comp.text[len(prefix) :], self.problem.function_name, prefix=prefix, finish_reason=comp.finish_reason
        )

    # ------------------------------------------------------------------ answer format (coevo.ahd.answer)
    def _answer_params(self, jobs: Sequence[SampleJob], target: Any, params: SamplingParams) -> SamplingParams:
        """Fit ``jobs`` to the policy (or population) ``target`` and return the decoding settings of their call.

        A prefilled job (its messages end with an assistant turn) goes to a target that cannot continue a
        message (``can_continue_final_message`` False) as the free format's messages instead (the job's
        ``messages`` are replaced, so the record shows what was sent; one logged line per sampler). For
        prefilled jobs the stop strings get :data:`~coevo.ahd.answer.FUNCTION_END_STOPS` and
        :data:`~coevo.ahd.answer.MARK_REPEAT_STOPS`, most useful first (:func:`~coevo.ahd.answer.answer_stops`: a
        server that takes only a few per request gets those) and, with
        ``answer_grammar``, the regex :data:`~coevo.ahd.answer.BODY_REGEX`.

        Raises:
            ConfigError: ``answer_grammar`` on a target that cannot constrain decoding.
        """
        prefilled = [job for job in jobs if continues_final_message(job.messages)]
        if prefilled and not getattr(target, "can_continue_final_message", False):
            if not self._told_free:
                log.warning(
                    "%s: answer_format prefill needs a backend that continues an assistant message; %s cannot, "
                    "so its prompts use the free answer format",
                    self.owner,
                    type(target).__name__,
                )
                self._told_free = True
            spec = self.problem.prompt_spec()
            for job in prefilled:
                job.messages = free_format_messages(job.messages, spec)
            return params
        if not prefilled:
            return params
        if self.settings.answer_grammar and not getattr(target, "can_constrain", False):
            raise ConfigError(
                f"evolvers.{self.owner}.answer_grammar: {type(target).__name__} cannot constrain decoding "
                "(the vllm backend or model.vllm_server can)"
            )
        stop = answer_stops([job.messages[-1]["content"] for job in prefilled], params.stop)
        return replace(params, stop=stop, regex=BODY_REGEX if self.settings.answer_grammar else params.regex)

    @staticmethod
    def _glue_prefix(jobs: Sequence[SampleJob], completions: list[Any]) -> list[Any]:
        """Completions of prefilled jobs with the prefix put back in front of the text (``meta["prefill"]``
        holds it; the token counts stay those of the continuation)."""
        out = []
        for job, comp in zip(jobs, completions, strict=True):
            if comp is not None and comp.error is None and continues_final_message(job.messages):
                prefix = job.messages[-1]["content"]
                comp = replace(comp, text=prefix + comp.text, meta={**comp.meta, "prefill": prefix})
            out.append(comp)
        return out

    def _duplicates(
        self, jobs: Sequence[SampleJob], codes: list[str], index: list[int], existing: Sequence[Individual]
    ) -> dict[int, str]:
        """Batch position -> id of the individual it copies, for the samples ``codes`` (at ``index``)."""
        if not self.settings.reject_duplicates:
            return {}
        for t in self.recorded(since_id=self._known_cursor):
            self._known.setdefault(code_key(t.meta["code"]), t.key.split("/", 1)[-1])
            self._known_cursor = max(self._known_cursor, t.id)
        known = {**{code_key(i.code): i.id for i in existing}, **self._known}
        copies: dict[int, str] = {}
        for i, code in zip(index, codes):
            k = code_key(code)
            if k in known:
                copies[i] = known[k]
            else:
                known[k] = jobs[i].key.split("/", 1)[-1]  # a later sample of this batch copying it is a duplicate
        return copies

    def _trajectory(self, job, calls, extraction, result, batch: _Batch, member, started, seed, copy_of=None):
        comp = calls[-1]  # ``calls``: every completion of this call (parse retries), the answer recorded last
        best = max(job.parents, key=lambda p: p.reward) if job.parents else None  # the child's best parent
        meta: dict[str, Any] = {
            "problem": self.problem.name,
            "sampler": self.owner,
            "reward_unit": self.reward_unit,
            "operator": job.operator,
            "instances": self.train_tag,
            "parent_ids": [p.id for p in job.parents],
            "parent_objectives": [p.objective for p in job.parents],
            "parent_objective": best.objective if best else None,
            "parent_score": best.reward if best else None,
            "seed": job.seed,
            "batch_seed": seed,
            "finish_reason": comp.finish_reason,
            "answer_format": "prefill" if comp.meta.get("prefill") else "free",
            "code": None,
            "thought": None,
            "objective": None,
            **job.extra_meta,
        }
        if len(calls) > 1:
            meta["retried_outputs"] = [c.text[:2000] for c in calls[:-1]]
        if extraction is not None and extraction.repairs:
            meta["repairs"] = list(extraction.repairs)  # import lines added to the model's code (extract step 5)
        failure = detail = feedback = None
        if comp.error is not None:
            failure, detail = "llm_error", comp.error
        elif extraction.code is None:
            failure, detail = extraction.error or "parse", extraction.detail
            meta["thought"] = extraction.thought
        elif copy_of is not None:
            meta.update(code=extraction.code, thought=extraction.thought or "", duplicate_of=copy_of)
            failure = "duplicate"
            detail = f"the same code as {copy_of} up to formatting, comments and docstrings (not evaluated)"
        else:
            meta.update(code=extraction.code, thought=extraction.thought or "")
            feedback = result.feedback
            if result.valid:
                meta.update(objective=result.objective, metrics=result.metrics)
            else:
                failure, detail = result.error_kind or "other", result.error
        reward = result.score if failure is None else None
        return Trajectory.from_completion(
            comp,
            earlier=calls[:-1],
            key=job.key,
            run_id=self.run_id,
            evolver=batch.evolver or self.owner,
            # an ES member's child, or an answer a weight-training evolver asked for (meta "space": grpo_ahd, dpo_ahd)
            space="parameter" if member or job.extra_meta.get("space") == "parameter" else "context",
            prompt=_messages_text(job.messages),
            action=None if extraction is None else extraction.code,
            tool_result=feedback or detail,
            reward=reward,
            failure=failure,
            failure_detail=detail,
            round=batch.round_index,
            generation=batch.generation,
            task_id=self.train_tag,
            member=member,
            context=ContextRef(heuristic_id=",".join(meta["parent_ids"]) or None, prompt=job.operator),
            started_at=started,
            meta=meta,
        )

    # ------------------------------------------------------------------ what was recorded
    def recorded(self, since_id: int = 0) -> list[Trajectory]:
        """Valid heuristic trajectories of this run for this problem and training set (by any evolver, any
        sampler), with trajectory id > ``since_id``, in id order (steps not loaded)."""
        return [
            t
            for t in self.store.query(run_id=self.run_id, task_id=self.train_tag, valid=True, with_steps=False)
            if t.id > since_id
            and t.reward is not None
            and t.meta.get("problem") == self.problem.name
            and t.meta.get("code")
            and t.meta.get("objective") is not None
        ]

    def last_id(self) -> int:
        """The largest trajectory id of the run so far (0 when empty)."""
        last = self.store.query(run_id=self.run_id, order_by="id", descending=True, limit=1, with_steps=False)
        return last[0].id if last else 0


@runtime_checkable
class HeuristicSearch(Protocol):
    """What other parts of a run (the ES rollout ``eoh_children``, the ``tune`` evolver) may use of a
    heuristic-design evolver (:class:`coevo.evolvers.ahd_common.AHDEvolver` implements it).

    Attributes:
        sampler: its :class:`HeuristicSampler` (problem, training set, budget, store).
        population: its current population, ranked best first (empty when it keeps none, e.g. random
            sampling, or before initialisation).
        member_operators: the operators an ES member writes for it by default.
        member_jobs: ``member_jobs(key, n, operators=None) -> list[SampleJob]``, the calls one ES member makes
            for it (``key``: the member's key without the run id; ``n`` calls per operator).
    """

    sampler: HeuristicSampler
    population: list[Individual]
    member_operators: tuple[str, ...]

    def member_jobs(self, key: str, n: int, operators: Sequence[str] | None = None) -> list[SampleJob]: ...


#: the EoH operators a config may list (``operators`` of ``eoh_children`` and of the sampler-training evolvers)
OperatorName = Literal["i1", "e1", "e2", "m1", "m2", "m3"]


def operators_field(description: str) -> Any:
    """The pydantic field of an optional, non-empty ``operators: list[OperatorName] | None`` setting."""
    return Field(None, min_length=1, description=description)


def heuristic_search(evolvers: Mapping[str, Any], name: str, option: str) -> HeuristicSearch:
    """The run's evolver ``name`` (out of ``evolvers``) as a :class:`HeuristicSearch`.

    Raises:
        ConfigError: it is none (named by ``option``, the setting that names it, e.g. ``evolvers.tune.evolver``).
    """
    target = evolvers.get(name)
    if not isinstance(target, HeuristicSearch):
        raise ConfigError(
            f"{option}: {name!r} is not a heuristic-design evolver of this run (evolvers: {sorted(evolvers)})"
        )
    return target

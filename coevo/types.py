"""Record types shared by every part of coevo.

One objective direction holds across the framework: **reward, higher is better**. Problems that minimise
(tour length, bins used) convert once at their boundary (``reward = -objective``) and keep the raw
objective beside it in ``EvalResult.objective`` / ``Trajectory.meta``.

These are plain dataclasses so that workers (sandbox processes, Ray actors) can build and return them
without touching the store; only the loop's process writes to the store.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Space = Literal["parameter", "context"]

#: Failure kinds an evaluation or a sample can end with (``None`` means valid).
FAILURE_KINDS = (
    "parse",  # no code / no JSON / no action could be extracted from the model output
    "syntax",  # extracted code does not compile
    "truncated",  # the answer reached the token cap before its code ended, and what was written does not compile
    "no_code",  # a thought (EoH's idea sentence) but no code: no function, or a body without a statement
    "empty_body",  # neither a thought nor a statement: an empty answer or function body
    "import",  # import of a forbidden or missing module, or import-time failure
    "timeout",  # wall-clock or CPU limit reached
    "memory",  # address-space limit reached
    "runtime",  # an exception while running
    "return_type",  # wrong return type / shape / NaN
    "infeasible",  # solution violates a constraint
    "duplicate",  # the same code as an existing heuristic (up to formatting, comments, docstrings, local names): not run
    "behavioural_duplicate",  # other code, but the same objective on every training instance as an existing heuristic
    "llm_error",  # the model call itself failed
    "sandbox",  # the sandbox could not start or died without a result
    "other",
)


#: ``Trajectory.meta["output"]`` of a free-text LLM call (a reflection, a critique, a plan;
#: :meth:`coevo.ahd.sampler.HeuristicSampler.text`): its text is what it made, nothing was scored. Reports count
#: such trajectories apart from the samples that make candidates (heuristics, answers).
TEXT_OUTPUT = "text"


def is_text(t: Trajectory) -> bool:
    """Whether ``t`` is a free-text call (:data:`TEXT_OUTPUT`; also the reflections recorded before that mark,
    ``meta["kind"] == "reflection"``)."""
    return t.meta.get("output") == TEXT_OUTPUT or t.meta.get("kind") == "reflection"


@dataclass
class Step:
    """One step of a trajectory (one model call and what followed it).

    Attributes:
        observation: what the agent saw before acting (text), or the prompt for one-shot tasks.
        model_output: raw text the model produced.
        action: the parsed action (web action string, extracted code, ...), ``None`` if unparsable.
        tool_result: environment / evaluator feedback after the action (text).
        reward: per-step reward (higher is better), ``None`` when the task only has a final reward.
        meta: free JSON-serialisable metadata.
    """

    observation: str | None = None
    model_output: str | None = None
    action: str | None = None
    tool_result: str | None = None
    reward: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class ESMember:
    """The ES population member a trajectory was produced under.

    Attributes:
        seed: the member's noise seed (int, 0 <= seed < 2**63).
        sigma: perturbation scale used (float, units of the weights).
        sign: +1, or -1 for the mirrored (antithetic) half of a pair.
        index: position of the member in its generation's population.
    """

    seed: int
    sigma: float
    sign: int = 1
    index: int = 0


@dataclass
class ContextRef:
    """The context a trajectory ran under (all optional).

    Attributes:
        skill_name, skill_version: the Agent Skill the agent ran with (version 0: the initial folder).
        heuristic_id: the heuristic a trajectory evaluated or was derived from.
        prompt: the system prompt the policy was given (text), when the rollout had one.
        versions: published context key -> version the rollout read (``coevo.context``: 0 = the rollout's
            default, nothing published; ``k >= 1``: the k-th value published under that key; -1: a candidate
            value being scored, not published, e.g. by ``ESEvolver.score_context``).
    """

    skill_name: str | None = None
    skill_version: int | None = None
    heuristic_id: str | None = None
    prompt: str | None = None
    versions: dict[str, int] = field(default_factory=dict)


@dataclass
class Trajectory:
    """A complete rollout: what the store records atomically.

    Attributes:
        key: idempotency key, unique within the store; writing a trajectory whose key exists is a no-op.
            Evolvers build it deterministically from (run, evolver, round, generation, member, index) so
            that a step re-run after a crash finds its earlier trajectories instead of duplicating them.
        run_id, evolver, space, round, generation: provenance.
        task_id: task or instance id (``None`` for tasks without one).
        steps: ordered steps.
        reward: final reward (higher is better); ``None`` when invalid and not scored.
        valid: whether the rollout produced a valid, scorable result.
        failure: failure kind (one of ``FAILURE_KINDS``) when ``valid`` is False.
        failure_detail: human-readable reason.
        member: the ES member, or ``None`` when produced by the unperturbed model.
        context: the context version used.
        llm_calls: number of LLM samples this trajectory consumed (counts against the sample budget,
            valid or not).
        prompt_tokens, completion_tokens: token counts summed over the trajectory's model calls.
        started_at: UNIX time (s); duration_s: wall time (s).
        meta: free JSON-serialisable metadata (objective, code, thought, operator, ...).
        id: row id assigned by the store (``None`` until stored).
    """

    key: str
    run_id: str
    evolver: str
    space: Space
    round: int = 0
    generation: int = 0
    task_id: str | None = None
    steps: list[Step] = field(default_factory=list)
    reward: float | None = None
    valid: bool = True
    failure: str | None = None
    failure_detail: str | None = None
    member: ESMember | None = None
    context: ContextRef = field(default_factory=ContextRef)
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started_at: float = field(default_factory=time.time)
    duration_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_completion(
        cls,
        completion: Any,
        *,
        key: str,
        run_id: str,
        evolver: str,
        space: Space,
        prompt: str | None,
        action: str | None = None,
        tool_result: str | None = None,
        reward: float | None = None,
        failure: str | None = None,
        failure_detail: str | None = None,
        earlier: Sequence[Any] = (),
        started_at: float | None = None,
        **fields: Any,
    ) -> Trajectory:
        """The trajectory of one LLM call: one :class:`Step` (``prompt`` -> the completion's text, ``action``,
        ``tool_result``, ``reward``), the call's tokens, ``llm_calls`` 1.

        Args:
            completion: the call's answer (:class:`coevo.backends.base.Completion`: ``text``, ``prompt_tokens``,
                ``completion_tokens``, ``error``).
            key, run_id, evolver, space: as :class:`Trajectory`. prompt: the conversation as text (the step's
                observation).
            action, tool_result, reward: the step's (``reward`` is also the trajectory's).
            failure, failure_detail: the failure kind (:data:`FAILURE_KINDS`) and its reason; when ``failure`` is
                None and the completion has an ``error``, the call is recorded as ``llm_error`` with that error.
                ``valid`` is ``failure is None``.
            earlier: answers this call replaced (re-asks of the same prompt: parse or duplicate retries); each
                counts one more LLM call and its tokens are added.
            started_at: UNIX time (s) the call started (default now); ``duration_s`` runs from it to now.
            fields: the other :class:`Trajectory` fields (``round``, ``generation``, ``task_id``, ``member``,
                ``context``, ``meta``, ...).
        """
        if failure is None and getattr(completion, "error", None) is not None:
            failure, failure_detail = "llm_error", failure_detail or completion.error
        calls = [*earlier, completion]
        now = time.time()
        start = now if started_at is None else started_at
        step = Step(
            observation=prompt, model_output=completion.text, action=action, tool_result=tool_result, reward=reward
        )
        return cls(
            key=key,
            run_id=run_id,
            evolver=evolver,
            space=space,
            steps=[step],
            reward=reward,
            valid=failure is None,
            failure=failure,
            failure_detail=failure_detail,
            llm_calls=len(calls),
            prompt_tokens=sum(c.prompt_tokens for c in calls),
            completion_tokens=sum(c.completion_tokens for c in calls),
            started_at=start,
            duration_s=now - start,
            **fields,
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["steps"] = [Step(**s) for s in d.get("steps") or []]
        d["member"] = ESMember(**d["member"]) if d.get("member") else None
        d["context"] = ContextRef(**(d.get("context") or {}))
        return cls(**d)


@dataclass
class EvalResult:
    """Typed result of evaluating one candidate (heuristic program, answer, ...). Never a bare None.

    Attributes:
        valid: True when the candidate ran and every solution was feasible.
        objective: problem objective as the problem defines it (e.g. mean tour length; lower is better for
            minimisation problems), ``None`` when invalid.
        score: the same result as a reward (higher is better), ``None`` when invalid.
        metrics: extra numbers (per-instance objectives, gap_percent, ...).
        feedback: short text for the model / the user.
        error_kind: one of ``FAILURE_KINDS`` when invalid.
        error: detail of the failure.
        duration_s: wall time of the evaluation (s).
    """

    valid: bool
    objective: float | None = None
    score: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    feedback: str = ""
    error_kind: str | None = None
    error: str | None = None
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

"""The web agent: a LangGraph loop model -> action -> observation over BrowserGym environments.

Graph (``langgraph.graph.StateGraph``)::

    START -> model -> act -> (any episode running? model : END)

``model`` sends one chat per running episode to the :class:`~coevo.backends.base.Policy` in a single
``generate`` call (so several environments share one batched forward pass); ``act`` parses one action per
output (:func:`coevo.agents.actions.parse_action`) and executes it: browser actions in the episode's
:class:`~coevo.envs.web.WebEnv`, skill actions (``load_skill`` / ``read_skill_file``) in the skill library.
An episode ends when the task reports done, after an *accepted* ``send_msg_to_user`` / ``report_infeasible``
(stop), at ``max_steps`` model calls, or on a model / browser / evaluator failure.

One action set per episode: the system prompt, the parser and the malformed-output feedback use the env's
:attr:`~coevo.envs.web.WebEnv.action_names`, which are the actions the env executes. An action the env
rejects (its ``last_action_error`` is set) is fed back and never ends the episode as a stop.

Malformed output never raises: the step is recorded with ``action=None`` and the parse error as
``tool_result``, counts against ``max_steps``, and the error is fed back to the model in the next prompt. An
output with several actions runs the first valid one; the feedback names it and the ones not run (also in
the step's ``meta["ignored_actions"]``).

Examples come from the episode, not from fixed text: the system prompt is built after the first observation,
and its element line and ids are the page's (:class:`~coevo.agents.prompts.PageExample`); the skill actions'
examples name a skill (and a file) of the attached library. A page without a clickable element gets a note
under its tree.

Skills: a loaded skill (``load_skill``) is shown once, under ``# Loaded skill`` in every later prompt of the
episode, whole (followed by the list of its files), or cut at ``max_skill_chars`` with a note naming
``read_skill_file``; the step's feedback only says it was loaded. An unknown skill or file is a feedback
message naming what exists. The trajectory's meta records ``skill_load_calls`` (load_skill actions run),
``skills_loaded`` (skills loaded, a count) and ``skills_loaded_names``. Failures: ``failure="llm_error"`` (model), ``"runtime"`` (browser) and
``"evaluation"`` (the task's evaluator raised, e.g. an LLM judge without its key:
:class:`~coevo.envs.web.TaskEvaluationError`); such trajectories are invalid and carry no reward.

Every episode returns a :class:`~coevo.types.Trajectory` (one :class:`~coevo.types.Step` per model call);
the first step's ``meta["system_prompt"]`` holds the episode's system prompt (action space, skill catalog or
preloaded skill), so a reader sees what the agent saw. The agent does not write to the store.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

from coevo.agents.actions import (
    STOP_ACTIONS,
    ActionParseError,
    ParsedAction,
    parse_action,
)
from coevo.agents.prompts import HistoryItem, PageExample, describe_actions, system_prompt, user_message
from coevo.backends.base import Completion, Policy, PolicyError, SamplingParams
from coevo.envs.web import TaskEvaluationError, WebEnv, WebEnvError
from coevo.types import ContextRef, ESMember, Space, Step, Trajectory


class SkillSource(Protocol):
    """What the agent needs from a skill library (``coevo.skills.SkillLibrary`` provides it): the catalog, a
    skill's body, one of its files, and the names and file lists the prompt's examples are taken from."""

    def catalog_prompt(self) -> str: ...
    def activate(self, name: str) -> str: ...
    def read_reference(self, name: str, path: str) -> str: ...
    def names(self) -> list[str]: ...
    def files(self, name: str) -> list[str]: ...


@dataclass(frozen=True)
class Provenance:
    """Where trajectories come from (copied into each :class:`Trajectory`)."""

    run_id: str = ""
    evolver: str = "web_agent"
    round: int = 0
    generation: int = 0
    space: Space | None = None  # default: "parameter" under an ES member, else "context"
    context: ContextRef = field(default_factory=ContextRef)


def episode_key(prov: Provenance, member: ESMember | None, task_id: str) -> str:
    """Deterministic idempotency key ``web/<run>/<evolver>/r<round>/g<gen>/<member>/<task>:<seed>``."""
    who = "base" if member is None else f"m{member.index}{'+' if member.sign >= 0 else '-'}s{member.seed}"
    return f"web/{prov.run_id}/{prov.evolver}/r{prov.round}/g{prov.generation}/{who}/{task_id}"


@dataclass
class _Episode:
    """Mutable state of one running episode."""

    env: WebEnv
    task: str
    seed: int
    key: str
    member: ESMember | None
    system: str = ""
    actions: tuple[str, ...] = ()
    prompt: str = ""
    obs: dict[str, Any] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    history: list[HistoryItem] = field(default_factory=list)
    skill_texts: dict[str, str] = field(default_factory=dict)  # loaded skill name -> text shown
    skill_load_calls: int = 0  # load_skill actions run, whatever their outcome
    reward: float = 0.0
    end: str | None = None
    failure: str | None = None
    failure_detail: str | None = None
    pending: Completion | None = None
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)

    @property
    def task_id(self) -> str:
        return f"{self.task}:{self.seed}"


class _State(TypedDict):
    episodes: list[_Episode]
    turn: int


class WebAgent:
    """Runs web episodes with a policy.

    Args:
        policy: any coevo :class:`~coevo.backends.base.Policy`.
        sampling: decoding settings; when ``sampling.seed`` is set, turn ``t`` (0-based) of a batch uses seed
            ``sampling.seed + t`` so that a rerun reproduces the same completions.
        max_steps: model calls per episode (>= 1).
        skills: optional skill library (:class:`SkillSource`); enables the two skill actions.
        skill_catalog: catalog text for the system prompt (default ``skills.catalog_prompt()``).
        max_obs_chars: accessibility tree / feedback clip (characters, >= 200).
        history_len: previous actions shown per prompt (>= 0).
        max_skill_chars: cut a loaded skill's text at this many characters, with a note saying how to read the
            rest (``None``: show it whole).

    Raises:
        TypeError / ValueError: naming the bad argument.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        sampling: SamplingParams,
        max_steps: int = 15,
        skills: SkillSource | None = None,
        skill_catalog: str | None = None,
        max_obs_chars: int = 8000,
        history_len: int = 8,
        max_skill_chars: int | None = None,
    ) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a coevo Policy, got {type(policy).__name__}")
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be SamplingParams, got {type(sampling).__name__}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
        if max_obs_chars < 200:
            raise ValueError(f"max_obs_chars must be >= 200, got {max_obs_chars}")
        if history_len < 0:
            raise ValueError(f"history_len must be >= 0, got {history_len}")
        if max_skill_chars is not None and max_skill_chars < 200:
            raise ValueError(f"max_skill_chars must be >= 200 or None, got {max_skill_chars}")
        for method in ("catalog_prompt", "activate", "read_reference", "names", "files") if skills is not None else ():
            if not callable(getattr(skills, method, None)):
                raise TypeError(f"skills must provide {method}(); got {type(skills).__name__}")
        self.policy = policy
        self.sampling = sampling
        self.max_steps = max_steps
        self.skills = skills
        self.skill_catalog = (
            skill_catalog if skill_catalog is not None else (skills.catalog_prompt() if skills is not None else None)
        )
        self.max_obs_chars = max_obs_chars
        self.history_len = history_len
        self.max_skill_chars = max_skill_chars
        self.graph = self._build_graph()

    # -- graph -----------------------------------------------------------------------------------------
    def _build_graph(self) -> Any:
        from langgraph.graph import END, START, StateGraph

        graph = StateGraph(_State)
        graph.add_node("model", self._model_node)
        graph.add_node("act", self._act_node)
        graph.add_edge(START, "model")
        graph.add_edge("model", "act")
        graph.add_conditional_edges("act", self._route, {"model": "model", END: END})
        return graph.compile()

    @staticmethod
    def _route(state: _State) -> str:
        from langgraph.graph import END

        return "model" if any(e.end is None for e in state["episodes"]) else END

    def _model_node(self, state: _State) -> dict[str, Any]:
        active = [e for e in state["episodes"] if e.end is None]
        conversations = [
            [{"role": "system", "content": e.system}, {"role": "user", "content": e.prompt}] for e in active
        ]
        params = (
            self.sampling if self.sampling.seed is None else self.sampling.with_seed(self.sampling.seed + state["turn"])
        )
        completions = self.policy.generate(conversations, params)
        if len(completions) != len(active):
            raise PolicyError(f"policy returned {len(completions)} completions for {len(active)} conversations")
        for episode, completion in zip(active, completions):
            episode.pending = completion
        return {"episodes": state["episodes"]}

    def _act_node(self, state: _State) -> dict[str, Any]:
        for episode in state["episodes"]:
            if episode.end is None and episode.pending is not None:
                self._act(episode)
        return {"episodes": state["episodes"], "turn": state["turn"] + 1}

    # -- one step --------------------------------------------------------------------------------------
    def _act(self, e: _Episode) -> None:
        c, e.pending = e.pending, None
        e.llm_calls += 1
        e.prompt_tokens += c.prompt_tokens
        e.completion_tokens += c.completion_tokens
        meta: dict[str, Any] = {"finish_reason": c.finish_reason}
        if not e.steps:
            meta["system_prompt"] = e.system
        if c.finish_reason == "error" or c.error:
            e.steps.append(
                Step(
                    observation=e.prompt,
                    model_output=c.text,
                    tool_result=f"model error: {c.error}",
                    meta={**meta, "kind": "llm_error"},
                )
            )
            e.end, e.failure, e.failure_detail = "llm_error", "llm_error", str(c.error)
            return
        action: ParsedAction | None = None
        reward: float | None = None
        bid = next(iter(e.obs.get("clickable") or ()), None)
        try:
            action = parse_action(c.text, allow_skills=self.skills is not None, actions=e.actions, bid=bid)
        except ActionParseError as exc:
            feedback, meta["kind"] = f"Malformed output: {exc}", "parse_error"
        else:
            if action.is_skill:
                feedback, meta["kind"] = self._run_skill(e, action), "skill"
            else:
                meta["kind"] = "env"
                try:
                    e.obs, reward, done, _info = e.env.step(action.text)
                except (WebEnvError, TaskEvaluationError) as exc:
                    e.steps.append(
                        Step(
                            observation=e.prompt,
                            model_output=c.text,
                            action=action.text,
                            tool_result=str(exc),
                            meta=meta,
                        )
                    )
                    evaluation = isinstance(exc, TaskEvaluationError)
                    e.end = "eval_error" if evaluation else "env_error"
                    e.failure, e.failure_detail = ("evaluation" if evaluation else "runtime"), str(exc)
                    return
                e.reward = reward
                feedback = e.obs["last_action_error"]
                if done:
                    e.end = "done"
                elif action.name in STOP_ACTIONS and not feedback:
                    e.end = "stop"  # only an action the env accepted ends the episode
            if action.ignored:
                meta["ignored_actions"] = list(action.ignored)
                feedback = "\n".join(p for p in (action.ignored_note(), feedback) if p)
        meta["url"] = e.obs.get("url", "")
        e.steps.append(
            Step(
                observation=e.prompt,
                model_output=c.text,
                action=action.text if action else None,
                tool_result=feedback,
                reward=reward,
                meta=meta,
            )
        )
        e.history.append(HistoryItem(action.text if action else None, feedback.split("\n", 1)[0]))
        if e.end is None and len(e.steps) >= self.max_steps:
            e.end = "max_steps"
        if e.end is None:
            e.prompt = self._prompt(e, feedback)

    def _run_skill(self, e: _Episode, action: ParsedAction) -> str:
        """Route a skill action to the library; its errors (unknown skill, missing file) become feedback."""
        name = action.args[0]
        e.skill_load_calls += action.name == "load_skill"
        try:
            if action.name == "load_skill":
                text = str(self.skills.activate(name))
                files = list(self.skills.files(name))
                if files:
                    text = text.rstrip() + (
                        f"\n\nFiles of this skill (read one with read_skill_file({name!r}, PATH)): {', '.join(files)}"
                    )
            else:
                text = str(self.skills.read_reference(name, action.args[1]))
        except Exception as exc:  # noqa: BLE001 - any library error is shown to the model, never a crash
            return f"{action.text} failed: {type(exc).__name__}: {exc}"
        if action.name != "load_skill":
            return text
        if name in e.skill_texts:
            return f"Skill {name!r} is already loaded (its text is shown in every prompt of this episode)."
        limit = self.max_skill_chars
        if limit is not None and len(text) > limit:
            text = (
                text[:limit] + f"\n[truncated: {len(text) - limit} of {len(text)} characters not shown; read "
                f"the rest with read_skill_file({name!r}, 'SKILL.md')]"
            )
        e.skill_texts[name] = text
        return f"Skill {name!r} loaded (its text is now shown in every prompt of this episode)."

    def _prompt(self, e: _Episode, feedback: str) -> str:
        return user_message(
            goal=e.obs["goal"],
            url=e.obs["url"],
            axtree=e.obs["axtree"],
            feedback=feedback,
            step=len(e.steps) + 1,
            max_steps=self.max_steps,
            history=e.history,
            skill_texts=e.skill_texts,
            max_obs_chars=self.max_obs_chars,
            history_len=self.history_len,
            clickable=e.obs.get("clickable"),
        )

    # -- episodes --------------------------------------------------------------------------------------
    def _start(self, e: _Episode) -> None:
        e.actions = tuple(e.env.action_names)
        try:
            e.obs = e.env.reset(e.task, e.seed)
        except WebEnvError as exc:
            e.end, e.failure, e.failure_detail = "env_error", "runtime", str(exc)
            return
        page = PageExample.from_tree(e.obs["axtree"], e.obs.get("clickable") or ())
        e.system = system_prompt(
            describe_actions(e.env.action_set, page),
            self.skill_catalog if self.skills is not None else None,
            actions=e.actions,
            page=page,
            skill_example=self._skill_example(),
        )
        e.prompt = self._prompt(e, e.obs["last_action_error"])

    def _skill_example(self) -> tuple[str, str | None] | None:
        """``(name, file)`` for the prompt's skill-action examples: the library's first skill, or the first one
        with a file (with that file); ``None`` without a library or skills."""
        if self.skills is None:
            return None
        names = list(self.skills.names())
        if not names:
            return None
        with_file = next(((n, f[0]) for n in names if (f := list(self.skills.files(n)))), None)
        return with_file or (names[0], None)

    def _trajectory(self, e: _Episode, prov: Provenance) -> Trajectory:
        valid = e.failure is None
        return Trajectory(
            key=e.key,
            run_id=prov.run_id,
            evolver=prov.evolver,
            space=prov.space or ("parameter" if e.member is not None else "context"),
            round=prov.round,
            generation=prov.generation,
            task_id=e.task_id,
            steps=e.steps,
            reward=float(e.reward) if valid else None,
            valid=valid,
            failure=e.failure,
            failure_detail=e.failure_detail,
            member=e.member,
            context=prov.context,
            llm_calls=e.llm_calls,
            prompt_tokens=e.prompt_tokens,
            completion_tokens=e.completion_tokens,
            started_at=e.started_at,
            duration_s=time.perf_counter() - e.t0,
            meta={
                "benchmark": e.env.benchmark,
                "task": e.task,
                "seed": e.seed,
                "end": e.end,
                "max_steps": self.max_steps,
                "final_url": e.obs.get("url", ""),
                "skills_loaded": len(e.skill_texts),
                "skills_loaded_names": list(e.skill_texts),
                "skill_load_calls": e.skill_load_calls,
            },
        )

    def run_batch(
        self,
        envs: Sequence[WebEnv],
        episodes: Sequence[tuple[str, int]],
        *,
        member: ESMember | None = None,
        keys: Sequence[str] | None = None,
        provenance: Provenance | None = None,
    ) -> list[Trajectory]:
        """Run ``episodes`` (``(task, seed)`` pairs) in waves of ``len(envs)``, one env per running episode.

        Returns one trajectory per episode, in order.

        Raises:
            ValueError: no envs, the same env listed twice, ``keys`` of the wrong length, bad task / seed.
            PolicyError: the backend cannot serve at all (a per-sample error only invalidates its episode).
        """
        if not envs:
            raise ValueError("envs is empty")
        if len({id(env) for env in envs}) != len(envs):
            raise ValueError("envs: each environment may appear once (one browser runs one episode at a time)")
        if keys is not None and len(keys) != len(episodes):
            raise ValueError(f"keys has {len(keys)} entries for {len(episodes)} episodes")
        prov = provenance or Provenance()
        out: list[Trajectory] = []
        for start in range(0, len(episodes), len(envs)):
            wave = []
            for j, (task, seed) in enumerate(episodes[start : start + len(envs)]):
                key = keys[start + j] if keys is not None else episode_key(prov, member, f"{task}:{seed}")
                wave.append(_Episode(env=envs[j], task=str(task), seed=seed, key=key, member=member))
            for e in wave:
                self._start(e)
            if any(e.end is None for e in wave):
                self.graph.invoke({"episodes": wave, "turn": 0}, config={"recursion_limit": 2 * self.max_steps + 4})
            out.extend(self._trajectory(e, prov) for e in wave)
        return out


def run_episode(
    policy: Policy,
    env: WebEnv,
    task: str,
    seed: int,
    *,
    sampling: SamplingParams,
    max_steps: int = 15,
    skills: SkillSource | None = None,
    member: ESMember | None = None,
    key: str | None = None,
    provenance: Provenance | None = None,
    **agent_kwargs: Any,
) -> Trajectory:
    """Run one episode of ``task`` (e.g. ``"click-button"``) with instance ``seed`` and return its trajectory.

    ``task_id`` is ``"<task>:<seed>"``; ``reward`` the environment's final reward (MiniWoB++: 1.0 on
    success, else 0.0); ``key`` defaults to :func:`episode_key`. Other keyword arguments go to
    :class:`WebAgent` (``skill_catalog``, ``max_obs_chars``, ``history_len``).
    """
    agent = WebAgent(policy, sampling=sampling, max_steps=max_steps, skills=skills, **agent_kwargs)
    return agent.run_batch(
        [env], [(task, seed)], member=member, keys=None if key is None else [key], provenance=provenance
    )[0]


def run_episodes(
    policy: Policy,
    envs: Sequence[WebEnv],
    episodes: Sequence[tuple[str, int]],
    *,
    sampling: SamplingParams,
    max_steps: int = 15,
    skills: SkillSource | None = None,
    member: ESMember | None = None,
    keys: Sequence[str] | None = None,
    provenance: Provenance | None = None,
    **agent_kwargs: Any,
) -> list[Trajectory]:
    """Batched :func:`run_episode`: ``len(envs)`` episodes at a time, one ``policy.generate`` call per turn."""
    agent = WebAgent(policy, sampling=sampling, max_steps=max_steps, skills=skills, **agent_kwargs)
    return agent.run_batch(envs, episodes, member=member, keys=keys, provenance=provenance)

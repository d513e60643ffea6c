"""The ``web`` rollout: an ES population member (or the centre) runs the web agent on browser episodes.

Agentic ESOpt (arXiv 2608.17310, docs/references.md §1 step 3) scores member i by the mean task reward over a batch
of cases; here a case is one web episode ``(task, seed)``: MiniWoB++ (Shi et al. 2017, offline),
WebArena-Lite (Liu et al. 2024, the user's deployment; the paper's setting: G=8, 8 tasks per generation) or
any site (``benchmark: openended``: a start URL, a goal and a reward rule, :mod:`coevo.envs.openended`).

* Train episodes are drawn per generation from the train seeds (MiniWoB++ task sets,
  :data:`coevo.envs.miniwob.MINIWOB_TASKSETS`) or the train tasks (WebArena-Lite), deterministically from
  ``(seed, generation)``; every member of a generation gets the same episodes unless
  ``same_episodes_for_all_members`` is off (then the draw is salted with the member's noise seed, so both
  halves of an antithetic pair still share them). Held-out (``split="test"``) episodes are fixed.
* Reward per episode: 1.0 when the environment's final reward is > 0, else 0.0 (MiniWoB++'s success
  criterion); the raw value is kept in ``meta["raw_reward"]``. :meth:`WebRollout.member_reward` averages
  over the episodes whose browser and evaluator worked: an episode that failed because the *browser* failed
  (``failure == "runtime"``) or its *evaluator* failed (``failure == "evaluation"``, e.g. an LLM judge without
  its key) says nothing about the weights and is left out; a model failure counts 0.
* Skills (``use_skills``): the agent runs under the CURRENT skill published by a skill evolver on the context
  channel, key ``skill`` (context slot ``skill``, value ``{"name", "version", "path", "source"}``;
  ``ctx.publish("skill", ...)``, done by Trace2Skill, :mod:`coevo.evolvers.trace2skill`), or under the
  configured initial skill folders (version 0) when nothing is published. ``skill_mode: preload``
  puts the current skill's body into the system prompt (a small model rarely chooses to load a skill);
  ``catalog`` only lists names and descriptions and lets the agent call ``load_skill`` (progressive
  disclosure). Each trajectory records ``context=ContextRef(skill_name, skill_version)`` (the evolving skill;
  in catalog mode the agent sees the whole library, whose names are in ``meta["skills_listed"]``, and the
  report labels such episodes by the library) and the agent's ``skill_load_calls`` / ``skills_loaded``.
  ``skill_dirs`` entries
  are skill folders or folders of skill folders, checked with the validator of ``coevo skills validate`` when
  the config is validated; skill settings without ``use_skills: true`` are errors.
* Validation (when the run config is read, before any model loads): WebArena-Lite's ``WA_*`` site variables
  for the selected tasks, NLTK's ``punkt_tab`` (``NLTK_DATA``) and, for tasks with an LLM-judged evaluator,
  ``OPENAI_API_KEY`` (``judge_tasks: require``) or the tasks are left out with a warning
  (``judge_tasks: skip``).
* Before a run loads its model (``coevo run``, ``coevo run --check``): Chromium, playwright and BrowserGym are
  checked (:meth:`WebRollout.check_ready`); a missing one is one line naming the command that fixes it, exit 2.
* Browser environments are created lazily, once per rollout object, reused across generations and closed by
  :meth:`WebRollout.close`. All calls must come from one thread (Playwright's sync API).
"""

from __future__ import annotations

import logging
import os
import random
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from coevo.agents.web_agent import Provenance, WebAgent
from coevo.backends.base import SamplingParams
from coevo.envs.openended import OpenEndedSpec
from coevo.envs.web import WEB_ACTION_NAMES, WebEnv
from coevo.resources import shipped_root
from coevo.rollouts.base import Rollout, RolloutCall, RolloutConfig, RolloutContext, Split, register_rollout
from coevo.schema import ConfigModel
from coevo.types import ContextRef, ESMember, Trajectory

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.context import RunContext
    from coevo.skills import SkillLibrary

#: the shipped skills the agent starts from when ``skill_dirs`` is not given (relative to
#: :func:`coevo.resources.shipped_root`: the repository, or the shipped copy in an installed wheel)
DEFAULT_SKILL_DIRS = ("skills/web-navigation", "skills/miniwob-forms")
#: seeds of open-ended episodes (they only label episodes and sampling streams: the page is the user's)
OPENENDED_TRAIN_SEEDS = tuple(range(64))
OPENENDED_HELDOUT_SEEDS = tuple(range(10_000, 10_032))
#: settings that only matter with use_skills: true (an error when given without it)
SKILL_SETTINGS = ("skill_dirs", "skill_name", "max_skill_chars")
_warned: set[str] = set()

log = logging.getLogger(__name__)


def _warn_once(message: str) -> None:
    """Log a validation warning once per process (a config is validated more than once)."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


class WebSampling(ConfigModel):
    """Decoding overrides for the agent; ``None`` fields take the run's ``sampling`` section."""

    model_config = ConfigDict(extra="forbid")
    max_new_tokens: int | None = Field(None, ge=1, description="tokens per agent step")
    temperature: float | None = Field(None, ge=0, description="0 = greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)


class WebRolloutConfig(RolloutConfig):
    """Settings of the ``web`` rollout (see the module docstring)."""

    type: str = "web"
    benchmark: Literal["miniwob", "webarena_lite", "openended"] = Field(
        "miniwob", description="which BrowserGym benchmark; openended = any site (see `openended`)"
    )
    taskset: str = Field("miniwob_smoke", description="miniwob: a name in coevo.envs.miniwob.MINIWOB_TASKSETS")
    tasks: list[str] | None = Field(None, description="miniwob: keep only these tasks of the task set")
    task_ids: list[int] | None = Field(None, description="webarena_lite: WebArena task ids (default: all 165)")
    sites: list[str] | None = Field(None, description="webarena_lite: keep tasks whose sites are all listed")
    test_task_ids: list[int] | None = Field(
        None, description="webarena_lite: held-out task ids (default: test_episodes tasks drawn from the selection)"
    )
    judge_tasks: Literal["require", "skip"] = Field(
        "require",
        description="webarena_lite: tasks with an LLM-judged evaluator need OPENAI_API_KEY (require) "
        "or are left out with a warning (skip)",
    )
    openended: OpenEndedSpec | None = Field(
        None, description="openended: {start_url, goal, reward: {answer_contains|url_contains|page_contains|judge}}"
    )
    episodes_per_member: int = Field(4, ge=1, description="train episodes per member and generation")
    test_episodes: int = Field(8, ge=1, description="held-out episodes (fixed)")
    same_episodes_for_all_members: bool = Field(True, description="every member of a generation gets the same episodes")
    seed: int = Field(0, description="seed of the episode draws and of the agent's sampling")
    max_steps: int = Field(5, ge=1, description="model calls per episode")
    n_envs: int = Field(2, ge=1, description="browser environments run side by side (one batched model call)")
    sampling: WebSampling = Field(default_factory=WebSampling, description="decoding overrides")
    actions: list[str] | None = Field(
        None, description=f"browser actions offered to the agent (subset of {list(WEB_ACTION_NAMES)}; None = all)"
    )
    max_obs_chars: int = Field(4000, ge=200, description="accessibility-tree clip per prompt (characters)")
    history_len: int = Field(4, ge=0, description="previous actions shown per prompt")
    max_skill_chars: int | None = Field(
        None, ge=200, description="catalog mode: cut a loaded skill at this many characters, with a note (None = whole)"
    )
    timeout_ms: int | None = Field(None, gt=0, description="Playwright timeout per browser action (ms)")
    use_skills: bool = Field(False, description="run the agent under the current skill (context 'skill')")
    skill_mode: Literal["preload", "catalog"] = Field(
        "preload", description="preload: current skill's body in the system prompt; catalog: names only"
    )
    skill_dirs: list[str] | None = Field(
        None,
        description=f"initial skill folders or folders of skill folders (version 0; default "
        f"{list(DEFAULT_SKILL_DIRS)})",
    )
    skill_name: str | None = Field(
        None,
        description="the evolving skill recorded in ContextRef (default: the published one, else the last "
        "initial folder's skill)",
    )

    @model_validator(mode="after")
    def _check(self) -> WebRolloutConfig:
        if self.actions is not None:
            unknown = sorted(set(self.actions) - set(WEB_ACTION_NAMES))
            if unknown or not self.actions:
                raise ValueError(f"actions: unknown {unknown}; allowed: {list(WEB_ACTION_NAMES)}")
        self._check_skills()
        if (self.benchmark == "openended") != (self.openended is not None):
            raise ValueError(
                "openended: give `openended: {start_url, goal, reward}` exactly when benchmark is openended"
            )
        if self.benchmark != "webarena_lite":
            for name in ("task_ids", "sites", "test_task_ids"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only used with benchmark webarena_lite")
        if self.benchmark == "webarena_lite":
            self.webarena_tasks()
        if self.benchmark == "miniwob":
            from coevo.envs.miniwob import MINIWOB_TASKSETS

            if self.taskset not in MINIWOB_TASKSETS:
                raise ValueError(
                    f"taskset: unknown MiniWoB++ task set {self.taskset!r}; known: {sorted(MINIWOB_TASKSETS)}"
                )
            known = MINIWOB_TASKSETS[self.taskset].tasks
            bad = [t for t in self.tasks or () if t not in known]
            if bad or self.tasks == []:
                raise ValueError(f"tasks: {bad or 'empty list'} not in task set {self.taskset!r} {list(known)}")
        elif self.tasks is not None:
            raise ValueError("tasks: only used with benchmark miniwob")
        return self

    def _check_skills(self) -> None:
        """Skill settings need use_skills; the attached skills must pass the spec validator."""
        if not self.use_skills:
            given = [n for n in SKILL_SETTINGS if getattr(self, n) is not None]
            if self.skill_mode != "preload":
                given.append("skill_mode")
            if given:
                raise ValueError(
                    f"{', '.join(given)}: set but use_skills is false (the agent would ignore "
                    f"{'them' if len(given) > 1 else 'it'}); set use_skills: true or drop "
                    f"{'them' if len(given) > 1 else 'it'}"
                )
            return
        if self.skill_dirs == []:
            raise ValueError("skill_dirs: empty list; give skill folders or drop skill_dirs for the defaults")
        self.skill_folders()

    def skill_folders(self) -> dict[str, Path]:
        """Skill name -> folder of the attached skills (``skill_dirs`` expanded; {} without use_skills).

        Raises:
            ValueError: a missing folder or a skill violating the spec (see
                :func:`coevo.skills.validate.attached_skill_dirs`).
        """
        from coevo.skills.spec import read_skill_document
        from coevo.skills.validate import attached_skill_dirs

        if not self.use_skills:
            return {}
        dirs = attached_skill_dirs(self.skill_dirs or DEFAULT_SKILL_DIRS, root=shipped_root())
        return {read_skill_document(d).name: d for d in dirs}

    def webarena_tasks(self) -> tuple[list[int], list[int]]:
        """WebArena-Lite ``(train ids, held-out ids)`` of this config, after the deployment checks.

        Checks, in order: the selection (``task_ids`` / ``sites`` / ``test_task_ids``); LLM-judged tasks
        (``judge_tasks``: without ``OPENAI_API_KEY``, ``require`` is an error naming the tasks, ``skip``
        leaves them out with a warning and a count); the ``WA_*`` variable of every site the remaining tasks
        visit; NLTK's ``punkt_tab``. No network, no BrowserGym import.

        Raises:
            ValueError: naming the setting, variable or data that is missing (and the tasks needing it).
        """
        from coevo.envs.webarena_lite import (
            JUDGE_KEY_ENV,
            WebArenaConfigError,
            check_nltk_data,
            check_webarena_config,
            select_webarena_lite_tasks,
        )

        try:
            pool = select_webarena_lite_tasks(self.task_ids, self.sites)
        except ValueError as exc:
            raise ValueError(f"task_ids/sites: {exc}") from None
        problems: list[str] = []
        judged = [t.task_id for t in pool if t.needs_judge]
        if judged and not os.environ.get(JUDGE_KEY_ENV, "").strip():
            what = (
                f"{len(judged)} of the {len(pool)} selected WebArena-Lite tasks use an LLM-judged evaluator "
                f"({JUDGE_KEY_ENV} is not set): {judged[:12]}{' ...' if len(judged) > 12 else ''}"
            )
            if self.judge_tasks == "require":
                problems.append(
                    f"judge_tasks: {what}; set {JUDGE_KEY_ENV}, or set judge_tasks: skip to leave them "
                    "out, or choose task_ids without them"
                )
            else:
                _warn_once(f"rollout (web, webarena_lite): {what}; leaving them out (judge_tasks: skip)")
                pool = [t for t in pool if not t.needs_judge]
        ids = [t.task_id for t in pool]
        if self.test_task_ids is not None:
            unknown = sorted(set(self.test_task_ids) - set(ids))
            if unknown:
                raise ValueError(f"test_task_ids: {unknown} are not in the selected tasks")
            test = list(dict.fromkeys(self.test_task_ids))
        else:
            shuffled = sorted(ids)
            random.Random(_seed_of(self.seed, "webarena-split")).shuffle(shuffled)
            test = sorted(shuffled[: min(self.test_episodes, len(ids) - 1)])
        train = [t for t in ids if t not in set(test)]
        if not train or not test:
            raise ValueError(f"task_ids/sites: {len(ids)} selected task(s) cannot be split into train and held-out")
        for check in (lambda: check_webarena_config(pool), check_nltk_data):
            try:
                check()
            except WebArenaConfigError as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("benchmark webarena_lite is not ready to run:\n" + "\n".join(problems))
        return train, test


def _seed_of(*parts: object) -> int:
    """A 31-bit seed from a string key (stable across processes, unlike ``hash``)."""
    return zlib.crc32("/".join(map(str, parts)).encode()) & 0x7FFFFFFF


@register_rollout("web")
class WebRollout(Rollout):
    """Web episodes for ES members (module docstring). Construct with ``build_rollout({"type": "web", ...}, ctx)``.

    Raises:
        ValueError / pydantic.ValidationError: invalid config fields (named); for webarena_lite, unknown task
            ids or sites (checked at construction; site URLs are checked when the browser starts).
    """

    Config = WebRolloutConfig
    context_slots: ClassVar[dict[str, str]] = {
        "skill": "the current skill {name, version, path, source} (None: the initial folders)"
    }
    #: fields that choose the tasks, the held-out split and the skills: a skill gate over this rollout keeps them
    selection_keys = (
        "benchmark",
        "taskset",
        "tasks",
        "task_ids",
        "sites",
        "test_task_ids",
        "judge_tasks",
        "openended",
        "test_episodes",
        "seed",
        "use_skills",
        "skill_dirs",
        "skill_name",
    )

    @classmethod
    def check_ready(cls, config: WebRolloutConfig) -> None:
        """Chromium, playwright and BrowserGym (with the benchmark's packages) are installed
        (:func:`coevo.envs.browser.check_browser_ready`), before the model loads.

        Raises:
            coevo.envs.browser.BrowserSetupError: one line naming what is missing and the command that fixes it.
        """
        from coevo.envs.browser import check_browser_ready

        check_browser_ready(config.benchmark)

    def __init__(self, config: WebRolloutConfig, ctx: RunContext | None):
        super().__init__(config, ctx)
        self._envs: list[WebEnv] = []
        self._library: tuple[tuple[str, ...], SkillLibrary] | None = None
        if config.benchmark == "miniwob":
            from coevo.envs.miniwob import get_taskset

            ts = get_taskset(config.taskset)
            self.tasks = list(config.tasks or ts.tasks)
            self.train_seeds, self.heldout_seeds = list(ts.train_seeds), list(ts.heldout_seeds)
        elif config.benchmark == "openended":
            from coevo.envs.openended import TASK_NAME

            self.tasks = [TASK_NAME]
            self.train_seeds, self.heldout_seeds = list(OPENENDED_TRAIN_SEEDS), list(OPENENDED_HELDOUT_SEEDS)
        else:
            train, test = config.webarena_tasks()
            self.tasks, self.test_tasks = [str(t) for t in train], [str(t) for t in test]
        if config.use_skills:
            self.initial_skill_dirs = list(config.skill_folders().values())

    # ------------------------------------------------------------------ episodes
    def episodes(self, split: Split, generation: int = 0, member: ESMember | None = None) -> list[tuple[str, int]]:
        """The ``(task, seed)`` episodes of a call, in order.

        Train (``split="train"``): ``episodes_per_member`` episodes drawn with ``random.Random`` keyed by
        ``(seed, generation)`` (plus the member's noise seed when ``same_episodes_for_all_members`` is off).
        MiniWoB++ draws are stratified: tasks in a shuffled cycle, each with a train seed not yet used in the
        draw. Test: the first ``test_episodes`` of the fixed held-out list (tasks cycled, held-out seeds in
        order; WebArena-Lite: the held-out tasks, seed 0).
        """
        cfg = self.config
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if cfg.benchmark == "webarena_lite":
            if split == "test":
                return [(t, 0) for t in self.test_tasks[: cfg.test_episodes]]
            rng = random.Random(self._draw_key(generation, member))
            order: list[str] = []
            while len(order) < cfg.episodes_per_member:
                order += rng.sample(self.tasks, len(self.tasks))
            return [(t, 0) for t in order[: cfg.episodes_per_member]]
        n_tasks = len(self.tasks)
        if split == "test":
            total = n_tasks * len(self.heldout_seeds)
            return [
                (self.tasks[i % n_tasks], self.heldout_seeds[(i // n_tasks) % len(self.heldout_seeds)])
                for i in range(min(cfg.test_episodes, total))
            ]
        rng = random.Random(self._draw_key(generation, member))
        used: dict[str, set[int]] = {t: set() for t in self.tasks}
        out: list[tuple[str, int]] = []
        cycle: list[str] = []
        for _ in range(cfg.episodes_per_member):
            if not cycle:
                cycle = rng.sample(self.tasks, n_tasks)
            task = cycle.pop()
            free = [s for s in self.train_seeds if s not in used[task]] or list(self.train_seeds)
            seed = rng.choice(free)
            used[task].add(seed)
            out.append((task, seed))
        return out

    def _draw_key(self, generation: int, member: ESMember | None) -> str:
        cfg = self.config
        salt = "" if cfg.same_episodes_for_all_members else f"/{member.seed if member else 'centre'}"
        return f"{cfg.seed}/train/{generation}{salt}"

    # ------------------------------------------------------------------ environments
    def envs(self, n: int) -> list[WebEnv]:
        """The first ``n`` browser environments (created on first use, then reused)."""
        cfg = self.config
        while len(self._envs) < n:
            if cfg.benchmark == "miniwob":
                from coevo.envs.miniwob import MiniWoBEnv

                env: WebEnv = MiniWoBEnv(timeout_ms=cfg.timeout_ms, actions=cfg.actions)
            elif cfg.benchmark == "openended":
                from coevo.envs.openended import OpenEndedEnv

                env = OpenEndedEnv(cfg.openended, timeout_ms=cfg.timeout_ms, actions=cfg.actions)
            else:
                from coevo.envs.webarena_lite import WebArenaLiteEnv

                ids = [int(t) for t in self.tasks + self.test_tasks]
                env = WebArenaLiteEnv(task_ids=ids, timeout_ms=cfg.timeout_ms, actions=cfg.actions)
            self._envs.append(env)
        return self._envs[:n]

    def close(self) -> None:
        """Close every browser this rollout started (idempotent)."""
        envs, self._envs = self._envs, []
        for env in envs:
            env.close()

    # ------------------------------------------------------------------ skills
    def skill_context(
        self, context: RolloutContext | None = None
    ) -> tuple[SkillLibrary | None, str | None, ContextRef, dict[str, Any]]:
        """The skills for the next episodes: ``(library, system-prompt skill text, context, meta)``.

        The library holds the initial folders with the published skill's folder (slot ``skill`` of ``context``,
        default :meth:`current_context`) in place of the initial one of the same name.
        ``(None, None, ContextRef(versions), {})`` when ``use_skills`` is off.
        """
        from coevo.skills import SkillLibrary
        from coevo.skills.spec import read_skill_document

        cfg = self.config
        context = context or self.current_context()
        if not cfg.use_skills:
            return None, None, context.ref(), {}
        published = context.values.get("skill") or None
        dirs = {read_skill_document(d).name: d for d in self.initial_skill_dirs}
        if published:
            source = published.get("source")
            mine = dirs.get(published["name"])
            if source and mine is not None and Path(source).resolve() != mine:
                raise ValueError(
                    f"skill {published['name']!r}: the skill evolver evolves {source} but this rollout's "
                    f"skill_dirs names {mine}; give one folder (the rollout's skill_dirs is enough)"
                )
            dirs[published["name"]] = Path(published["path"])
        name = cfg.skill_name or (published["name"] if published else list(dirs)[-1])
        version = int(published["version"]) if published and published["name"] == name else 0
        key = tuple(str(d) for d in dirs.values()) + (str(version),)
        if self._library is None or self._library[0] != key:
            self._library = (key, SkillLibrary(list(dirs.values())))
        library = self._library[1]
        if name not in library.skills:
            raise ValueError(f"skill_name: {name!r} is not among the agent's skills {library.names()}")
        text = library.catalog_prompt()
        if cfg.skill_mode == "preload":
            text += f"\n\n## Skill {name} (already loaded)\n{library.activate(name).strip()}"
        meta = {"skill_path": str(dirs[name]), "skill_mode": cfg.skill_mode, "skills_listed": library.names()}
        if published and published["name"] == name and published.get("source"):
            meta["skill_source"] = str(published["source"])
        return library, text, context.ref(skill_name=name, skill_version=version), meta

    # ------------------------------------------------------------------ rollout API
    def sampling_params(self, split: Split, generation: int) -> SamplingParams:
        """Decoding settings: the run's ``sampling`` with this rollout's overrides. The sampling seed is the same
        for every member of a generation (train: keyed by ``(seed, generation)``) and for every held-out
        evaluation (test: keyed by ``seed`` only), so that rewards differ by the weights and the skill, not by
        the sampler's random numbers (common random numbers)."""
        over = self.config.sampling.model_dump()
        seed = _seed_of(self.config.seed, "sampling", split, generation if split == "train" else "fixed")
        if self.ctx is not None and self.ctx.sampling is not None:
            return self.ctx.sampling_params(**over, seed=seed)
        return SamplingParams(**{k: v for k, v in over.items() if v is not None}, seed=seed)

    def run(
        self, policy: Policy, *, episodes: Sequence[tuple[str, int]] | None = None, **call: Any
    ) -> list[Trajectory]:
        """:meth:`Rollout.run` (same keyword arguments, ``call``), optionally on a subset of the call's episodes.

        ``episodes``: run only these ``(task, seed)`` pairs of the call's episodes, in the order given (e.g. to
        resume an interrupted evaluation); each keeps the key of its position ``i`` in :meth:`episodes`, and
        the sampling is the call's. ``None`` runs them all; an empty list runs nothing.

        Raises:
            ValueError: ``episodes`` names a pair that is not among the call's episodes, or a pair twice.
            PolicyError, WebArenaConfigError: as :meth:`run_call`.
        """
        return self.run_call(policy, self.call(**call), episodes=episodes)

    def run_call(
        self, policy: Policy, call: RolloutCall, episodes: Sequence[tuple[str, int]] | None = None
    ) -> list[Trajectory]:
        """Run this call's episodes (:meth:`episodes`; or the subset ``episodes``, see :meth:`run`) with
        ``policy``; one trajectory per episode, keyed ``<key_prefix>/<split>/<i>``, tagged with the call's member
        and the skill context, reward 1.0 / 0.0.

        Raises:
            ValueError: ``episodes`` names a pair that is not among the call's episodes, or a pair twice.
            PolicyError: the backend cannot serve at all. WebArenaConfigError: site URLs not configured.
        """
        cfg = self.config
        split, generation, member = call.split, call.generation, call.member
        planned = self.episodes(split, generation, member)
        if episodes is None:
            index = list(range(len(planned)))
        else:
            position = {ep: i for i, ep in reversed(list(enumerate(planned)))}
            wanted = [(str(t), int(s)) for t, s in episodes]
            unknown = [ep for ep in wanted if ep not in position]
            if unknown:
                raise ValueError(
                    f"episodes: {unknown[:5]} are not among this call's {len(planned)} {split} episodes "
                    f"(see WebRollout.episodes)"
                )
            if len(set(wanted)) != len(wanted):
                raise ValueError(f"episodes: each (task, seed) may appear once, got {wanted}")
            index = [position[ep] for ep in wanted]
        if not index:
            return []
        library, skill_text, context, skill_meta = self.skill_context(call.context)
        agent = WebAgent(
            policy,
            sampling=self.sampling_params(split, generation),
            max_steps=cfg.max_steps,
            skills=library,
            skill_catalog=skill_text,
            max_obs_chars=cfg.max_obs_chars,
            history_len=cfg.history_len,
            max_skill_chars=cfg.max_skill_chars,
        )
        prov = Provenance(
            run_id=self.ctx.run_id if self.ctx is not None else "",
            evolver=call.evolver,
            round=call.round_index,
            generation=generation,
            space=call.space,
            context=context,
        )
        chosen = [planned[i] for i in index]
        keys = [f"{call.key_prefix}/{split}/{i}" for i in index]
        trajs = agent.run_batch(
            self.envs(min(cfg.n_envs, len(chosen))), chosen, member=member, keys=keys, provenance=prov
        )
        for t in trajs:
            raw = t.reward
            if t.valid:
                t.reward = 1.0 if (raw or 0.0) > 0 else 0.0
            t.meta.update(split=split, rollout="web", raw_reward=raw, **skill_meta)
        return trajs

    def member_reward(self, trajectories: list[Trajectory]) -> float:
        """Mean success over the member's episodes, leaving out browser and evaluator failures (``failure`` in
        ``runtime``, ``evaluation``: they say nothing about the policy); model failures count 0.0. 0.0 when no
        episode ran."""
        ran = [t for t in trajectories if t.failure not in ("runtime", "evaluation")]
        if not ran:
            return 0.0
        return sum(t.reward if t.valid and t.reward is not None else 0.0 for t in ran) / len(ran)

    def n_cases(self, split: Split = "train") -> int:
        if split == "train":
            return self.config.episodes_per_member
        return len(self.episodes("test"))

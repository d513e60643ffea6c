"""The ``web`` rollout: an ES population member (or the centre) runs the web agent on browser episodes.

Agentic ESOpt (arXiv 2608.17310, field notes §1 step 3) scores member i by the mean task reward over a batch
of cases; here a case is one web episode ``(task, seed)``: MiniWoB++ (Shi et al. 2017, offline) or
WebArena-Lite (Liu et al. 2024, the user's deployment; the paper's setting: G=8, 8 tasks per generation).

* Train episodes are drawn per generation from the train seeds (MiniWoB++ task sets,
  :data:`coevo.envs.miniwob.MINIWOB_TASKSETS`) or the train tasks (WebArena-Lite), deterministically from
  ``(seed, generation)``; every member of a generation gets the same episodes unless
  ``same_episodes_for_all_members`` is off (then the draw is salted with the member's noise seed, so both
  halves of an antithetic pair still share them). Held-out (``split="test"``) episodes are fixed.
* Reward per episode: 1.0 when the environment's final reward is > 0, else 0.0 (MiniWoB++'s success
  criterion); the raw value is kept in ``meta["raw_reward"]``. :meth:`WebRollout.member_reward` averages
  over the episodes whose browser worked: an episode that failed because the *browser* failed
  (``failure == "runtime"``) says nothing about the weights and is left out; a model failure counts 0.
* Skills (``use_skills``): the agent runs under the CURRENT skill published by a skill evolver on
  ``ctx.shared["skill"] = {"name", "version", "path"}`` (Trace2Skill, :mod:`coevo.evolvers.trace2skill`), or
  under the configured initial skill folders (version 0) when nothing is published. ``skill_mode: preload``
  puts the current skill's body into the system prompt (a small model rarely chooses to load a skill);
  ``catalog`` only lists names and descriptions and lets the agent call ``load_skill`` (progressive
  disclosure). Each trajectory records ``context=ContextRef(skill_name, skill_version)``.
* Browser environments are created lazily, once per rollout object, reused across generations and closed by
  :meth:`WebRollout.close`. All calls must come from one thread (Playwright's sync API).
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coevo.agents.web_agent import Provenance, WebAgent
from coevo.backends.base import SamplingParams
from coevo.envs.web import WEB_ACTION_NAMES, WebEnv
from coevo.rollouts.base import Rollout, RolloutConfig, Split, register_rollout
from coevo.types import ContextRef, ESMember, Trajectory

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.context import RunContext
    from coevo.skills import SkillLibrary

#: the shipped skills the agent starts from when ``skill_dirs`` is not given (relative to the repository)
DEFAULT_SKILL_DIRS = ("skills/web-navigation", "skills/miniwob-forms")
REPO_ROOT = Path(__file__).resolve().parents[2]


class WebSampling(BaseModel):
    """Decoding overrides for the agent; ``None`` fields take the run's ``sampling`` section."""

    model_config = ConfigDict(extra="forbid")
    max_new_tokens: int | None = Field(None, ge=1, description="tokens per agent step")
    temperature: float | None = Field(None, ge=0, description="0 = greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)


class WebRolloutConfig(RolloutConfig):
    """Settings of the ``web`` rollout (see the module docstring)."""

    type: str = "web"
    benchmark: Literal["miniwob", "webarena_lite"] = Field("miniwob", description="which BrowserGym benchmark")
    taskset: str = Field("miniwob_smoke", description="miniwob: a name in coevo.envs.miniwob.MINIWOB_TASKSETS")
    tasks: list[str] | None = Field(None, description="miniwob: keep only these tasks of the task set")
    task_ids: list[int] | None = Field(None, description="webarena_lite: WebArena task ids (default: all 165)")
    sites: list[str] | None = Field(None, description="webarena_lite: keep tasks whose sites are all listed")
    test_task_ids: list[int] | None = Field(
        None, description="webarena_lite: held-out task ids (default: test_episodes tasks drawn from the selection)")
    episodes_per_member: int = Field(4, ge=1, description="train episodes per member and generation")
    test_episodes: int = Field(8, ge=1, description="held-out episodes (fixed)")
    same_episodes_for_all_members: bool = Field(True, description="every member of a generation gets the same episodes")
    seed: int = Field(0, description="seed of the episode draws and of the agent's sampling")
    max_steps: int = Field(5, ge=1, description="model calls per episode")
    n_envs: int = Field(2, ge=1, description="browser environments run side by side (one batched model call)")
    sampling: WebSampling = Field(default_factory=WebSampling, description="decoding overrides")
    actions: list[str] | None = Field(
        None, description=f"browser actions offered to the agent (subset of {list(WEB_ACTION_NAMES)}; None = all)")
    max_obs_chars: int = Field(4000, ge=200, description="accessibility-tree clip per prompt (characters)")
    history_len: int = Field(4, ge=0, description="previous actions shown per prompt")
    timeout_ms: int | None = Field(None, gt=0, description="Playwright timeout per browser action (ms)")
    use_skills: bool = Field(False, description="run the agent under the current skill (ctx.shared['skill'])")
    skill_mode: Literal["preload", "catalog"] = Field(
        "preload", description="preload: current skill's body in the system prompt; catalog: names only")
    skill_dirs: list[str] | None = Field(
        None, description=f"initial skill folders (version 0; default {list(DEFAULT_SKILL_DIRS)})")
    skill_name: str | None = Field(
        None, description="the evolving skill recorded in ContextRef (default: the published one, else the last "
                          "initial folder's skill)")

    @model_validator(mode="after")
    def _check(self) -> WebRolloutConfig:
        if self.actions is not None:
            unknown = sorted(set(self.actions) - set(WEB_ACTION_NAMES))
            if unknown or not self.actions:
                raise ValueError(f"actions: unknown {unknown}; allowed: {list(WEB_ACTION_NAMES)}")
        if self.benchmark == "miniwob":
            from coevo.envs.miniwob import MINIWOB_TASKSETS

            if self.taskset not in MINIWOB_TASKSETS:
                raise ValueError(f"taskset: unknown MiniWoB++ task set {self.taskset!r}; known: {sorted(MINIWOB_TASKSETS)}")
            known = MINIWOB_TASKSETS[self.taskset].tasks
            bad = [t for t in self.tasks or () if t not in known]
            if bad or self.tasks == []:
                raise ValueError(f"tasks: {bad or 'empty list'} not in task set {self.taskset!r} {list(known)}")
            for name in ("task_ids", "sites", "test_task_ids"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only used with benchmark webarena_lite")
        return self


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

    def __init__(self, config: WebRolloutConfig, ctx: RunContext | None):
        super().__init__(config, ctx)
        self._envs: list[WebEnv] = []
        self._library: tuple[tuple[str, ...], SkillLibrary] | None = None
        if config.benchmark == "miniwob":
            from coevo.envs.miniwob import get_taskset

            ts = get_taskset(config.taskset)
            self.tasks = list(config.tasks or ts.tasks)
            self.train_seeds, self.heldout_seeds = list(ts.train_seeds), list(ts.heldout_seeds)
        else:
            self._split_webarena()
        if config.use_skills:
            self.initial_skill_dirs = [self._resolve_dir(d) for d in (config.skill_dirs or DEFAULT_SKILL_DIRS)]

    # ------------------------------------------------------------------ episodes
    def _split_webarena(self) -> None:
        from coevo.envs.webarena_lite import select_webarena_lite_tasks

        cfg = self.config
        try:
            pool = [t.task_id for t in select_webarena_lite_tasks(cfg.task_ids, cfg.sites)]
        except ValueError as exc:
            raise ValueError(f"rollout (web, webarena_lite): {exc}") from None
        if cfg.test_task_ids is not None:
            unknown = sorted(set(cfg.test_task_ids) - set(pool))
            if unknown:
                raise ValueError(f"test_task_ids: {unknown} are not in the selected tasks")
            test = list(dict.fromkeys(cfg.test_task_ids))
        else:
            shuffled = sorted(pool)
            random.Random(_seed_of(cfg.seed, "webarena-split")).shuffle(shuffled)
            test = sorted(shuffled[: min(cfg.test_episodes, len(pool) - 1)])
        train = [t for t in pool if t not in set(test)]
        if not train or not test:
            raise ValueError(f"task_ids/sites: {len(pool)} selected task(s) cannot be split into train and held-out")
        self.tasks, self.test_tasks = [str(t) for t in train], [str(t) for t in test]

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
            return [(self.tasks[i % n_tasks], self.heldout_seeds[(i // n_tasks) % len(self.heldout_seeds)])
                    for i in range(min(cfg.test_episodes, total))]  # fmt: skip
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

                env: WebEnv = MiniWoBEnv(timeout_ms=cfg.timeout_ms)
            else:
                from coevo.envs.webarena_lite import WebArenaLiteEnv

                ids = [int(t) for t in self.tasks + self.test_tasks]
                env = WebArenaLiteEnv(task_ids=ids, timeout_ms=cfg.timeout_ms)
            if cfg.actions is not None:
                from browsergym.core.action import functions
                from browsergym.core.action.highlevel import HighLevelActionSet

                custom = [getattr(functions, a) for a in cfg.actions if a != "noop"]
                env.action_set = HighLevelActionSet(subsets=["custom"], custom_actions=custom, multiaction=False,
                                                    strict=False)  # fmt: skip
            self._envs.append(env)
        return self._envs[:n]

    def close(self) -> None:
        """Close every browser this rollout started (idempotent)."""
        envs, self._envs = self._envs, []
        for env in envs:
            env.close()

    # ------------------------------------------------------------------ skills
    @staticmethod
    def _resolve_dir(path: str) -> Path:
        """A skill folder path as given, else relative to the repository root.

        Raises:
            ValueError: naming ``skill_dirs`` when the folder has no SKILL.md.
        """
        for cand in (Path(path).expanduser(), REPO_ROOT / path):
            if (cand / "SKILL.md").is_file():
                return cand.resolve()
        raise ValueError(f"skill_dirs: no skill folder (with SKILL.md) at {path!r}")

    def skill_context(self) -> tuple[SkillLibrary | None, str | None, ContextRef, dict[str, Any]]:
        """The skills for the next episodes: ``(library, system-prompt skill text, context, meta)``.

        The library holds the initial folders with the published skill's folder in place of the initial one
        of the same name. ``(None, None, ContextRef(), {})`` when ``use_skills`` is off.
        """
        from coevo.skills import SkillLibrary
        from coevo.skills.spec import read_skill_document

        cfg = self.config
        if not cfg.use_skills:
            return None, None, ContextRef(), {}
        published = (self.ctx.shared.get("skill") if self.ctx is not None else None) or None
        dirs = {read_skill_document(d).name: d for d in self.initial_skill_dirs}
        if published:
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
        return library, text, ContextRef(skill_name=name, skill_version=version), {
            "skill_path": str(dirs[name]), "skill_mode": cfg.skill_mode}

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
        self,
        policy: Policy,
        *,
        generation: int,
        member: ESMember | None,
        key_prefix: str,
        split: Split = "train",
        evolver: str = "es",
        round_index: int = 0,
    ) -> list[Trajectory]:
        """Run this call's episodes (:meth:`episodes`) with ``policy``; one trajectory per episode, keyed
        ``<key_prefix>/<split>/<i>``, tagged with ``member`` and the skill context, reward 1.0 / 0.0.

        Raises:
            PolicyError: the backend cannot serve at all. WebArenaConfigError: site URLs not configured.
        """
        cfg = self.config
        episodes = self.episodes(split, generation, member)
        library, skill_text, context, skill_meta = self.skill_context()
        agent = WebAgent(policy, sampling=self.sampling_params(split, generation), max_steps=cfg.max_steps,
                         skills=library, skill_catalog=skill_text, max_obs_chars=cfg.max_obs_chars,
                         history_len=cfg.history_len)  # fmt: skip
        run_id = self.ctx.run_id if self.ctx is not None else ""
        space = None
        if self.ctx is not None and evolver in self.ctx.evolvers:
            space = self.ctx.evolvers[evolver].space
        prov = Provenance(run_id=run_id, evolver=evolver, round=round_index, generation=generation,
                          space=space or ("parameter" if member is not None else "context"), context=context)
        keys = [f"{key_prefix}/{split}/{i}" for i in range(len(episodes))]
        trajs = agent.run_batch(self.envs(min(cfg.n_envs, len(episodes))), episodes, member=member, keys=keys,
                                provenance=prov)  # fmt: skip
        for t in trajs:
            raw = t.reward
            if t.valid:
                t.reward = 1.0 if (raw or 0.0) > 0 else 0.0
            t.meta.update(split=split, rollout="web", raw_reward=raw, **skill_meta)
        return trajs

    def member_reward(self, trajectories: list[Trajectory]) -> float:
        """Mean success over the member's episodes, leaving out browser failures (``failure == "runtime"``);
        model failures count 0.0. 0.0 when no episode ran."""
        ran = [t for t in trajectories if t.failure != "runtime"]
        if not ran:
            return 0.0
        return sum(t.reward if t.valid and t.reward is not None else 0.0 for t in ran) / len(ran)

    def n_cases(self, split: Split = "train") -> int:
        if split == "train":
            return self.config.episodes_per_member
        return len(self.episodes("test"))

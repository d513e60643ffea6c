"""The ``react_math`` rollout: ReAct tool-use episodes on generated math problems (:mod:`coevo.envs.react_math`).

Each turn, every unfinished episode of the member goes to the policy in one batched ``generate`` call
(:func:`coevo.envs.multiturn.drive`, ``history`` context: the agent sees its earlier code and observations);
tool calls run one sandboxed process each. Generation ``g`` draws ``problems_per_member`` problems from a pool
of ``train_pool`` train problems (every member of a generation gets the same problems and sampling seeds);
the held-out split plays each of ``test_problems`` problems ``samples_per_problem`` (k) times, and
:meth:`ReactMathRollout.metrics` gives Mean@k and Pass@k. Reward per episode: exact answer 1.0, else 0.0;
``R_i`` = mean over the member's episodes.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import Field, field_validator

from coevo.envs.react_math import FAMILIES, MathEpisode, Problem, PythonTool, mean_and_pass_at_k, problems
from coevo.rollouts.base import RolloutConfig, Split, register_rollout
from coevo.rollouts.batched import EpisodeRollout
from coevo.types import Trajectory


class ReactMathConfig(RolloutConfig):
    """Settings of the ``react_math`` rollout."""

    type: str = "react_math"
    families: list[str] = Field(default_factory=lambda: list(FAMILIES), description="problem families used")
    problems_per_member: int = Field(8, ge=1, description="train problems per member and generation")
    train_pool: int = Field(256, ge=1, description="train problems the generations draw from")
    test_problems: int = Field(16, ge=1, description="held-out problems")
    samples_per_problem: int = Field(4, ge=1, description="k: held-out episodes per problem (Mean@k, Pass@k)")
    seed: int = Field(0, description="seed of the problem generator and the sampling")
    max_turns: int = Field(4, ge=1, description="turns per episode (tool calls + the answer)")
    max_new_tokens: int = Field(256, ge=1, description="tokens per turn")
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.8, gt=0, le=1)
    top_k: int = Field(20, ge=0)
    stop: list[str] = Field(
        default_factory=lambda: ["Observation:"],
        description="a reply is cut here (the model must not write the tool's output)",
    )
    tool_timeout_s: float = Field(10.0, gt=0, description="wall-clock limit of one tool call (s)")
    tool_memory_mb: int = Field(1024, ge=64, description="address-space limit of one tool call (MiB)")
    tool_output_chars: int = Field(2000, ge=1, description="characters of tool output shown to the agent")
    use_bwrap: bool | None = Field(None, description="bubblewrap: None = when usable, True = required, False = off")

    @field_validator("families")
    @classmethod
    def _families(cls, v: list[str]) -> list[str]:
        bad = [f for f in v if f not in FAMILIES]
        if not v or bad:
            raise ValueError(f"families must be a non-empty subset of {list(FAMILIES)}; unknown: {bad}")
        return v


@register_rollout("react_math")
class ReactMathRollout(EpisodeRollout):
    """ReAct math episodes with a sandboxed Python tool and exact answer checking (module docstring); context slot
    ``system_prompt`` (:class:`~coevo.rollouts.batched.EpisodeRollout`)."""

    Config = ReactMathConfig

    def __init__(self, config: ReactMathConfig, ctx) -> None:
        super().__init__(config, ctx)
        self._tool: PythonTool | None = None

    @property
    def tool(self) -> PythonTool:
        if self._tool is None:
            cfg = self.config
            self._tool = PythonTool(cfg.tool_timeout_s, cfg.tool_memory_mb, cfg.tool_output_chars, cfg.use_bwrap)
        return self._tool

    def pool(self, split: Split) -> list[Problem]:
        """Every problem of a split: the train pool, or the held-out problems (once each)."""
        cfg = self.config
        n = cfg.test_problems if split == "test" else cfg.train_pool
        return problems(split, n, cfg.seed, tuple(cfg.families))

    def episode(self, problem: Problem) -> MathEpisode:
        """A fresh episode on ``problem`` (sharing this rollout's sandboxed tool)."""
        return MathEpisode(problem, self.tool, self.config.max_turns)

    def task_id(self, episode: MathEpisode) -> str:
        return f"react_math:{episode.problem.problem_id}"

    def episodes(self, split: Split, generation: int = 0) -> list[MathEpisode]:
        """Fresh episodes: this generation's draw from the train pool, or each held-out problem k times."""
        cfg = self.config
        pool = self.pool(split)
        if split == "test":
            chosen = [p for p in pool for _ in range(cfg.samples_per_problem)]
        else:
            chosen = self.draw(pool, min(cfg.problems_per_member, cfg.train_pool), generation)
        return [self.episode(p) for p in chosen]

    def episode_meta(self, episode: MathEpisode) -> dict:
        return {"question": episode.problem.question, **episode.summary()}

    def metrics(self, trajectories: list[Trajectory], k: int | None = None) -> dict[str, float]:
        """Mean@k and Pass@k over held-out trajectories grouped by problem (k defaults to samples_per_problem)."""
        by_problem: dict[str, list[bool]] = defaultdict(list)
        for t in trajectories:
            by_problem[t.task_id or ""].append(bool(t.valid and t.reward == 1.0))
        k = k or self.config.samples_per_problem
        return mean_and_pass_at_k({p: v for p, v in by_problem.items() if len(v) >= k}, k)

    def n_cases(self, split: Split = "train") -> int:
        cfg = self.config
        return (
            min(cfg.problems_per_member, cfg.train_pool)
            if split == "train"
            else cfg.test_problems * cfg.samples_per_problem
        )

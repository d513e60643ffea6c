"""The ``sudoku`` rollout: horizon-controlled Sudoku episodes (:mod:`coevo.envs.sudoku`) for ES and evaluation.

One call runs every episode of a member together: each turn, the current conversations of all unfinished
episodes go to the policy in **one** batched ``generate`` call (:func:`coevo.envs.multiturn.drive`), so a
member's cost is (turns of its longest episode) batched calls rather than (episodes x turns) calls. Under
low-rank ES (``perturbation: lowrank``) every member's episodes step together the same way
(:meth:`~coevo.rollouts.batched.EpisodeRollout.run_population`): a generation costs (longest episode) batched
calls of N x ``puzzles_per_member`` rows, with no weight pass.

Cases (Agentic ESOpt, docs/references.md §6): a pool of ``train_pool`` train puzzles and ``test_puzzles`` held-out
puzzles per (grid size, H*), from disjoint seed streams; generation ``g`` draws ``puzzles_per_member`` train
puzzles from the pool (seeded by ``g``; every member of a generation sees the same puzzles and the same
sampling seed, i.e. common random numbers); the held-out split plays every test puzzle ``test_repeats``
times. Decoding defaults are the reference's (T 0.7, top-p 0.8, top-k 20, 64 tokens per turn). Reward: the
environment's terminal 0/1; ``R_i`` = mean over the member's episodes (success rate).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from coevo.envs.sudoku import BOX, Puzzle, SudokuEpisode, puzzles
from coevo.rollouts.base import RolloutConfig, Split, register_rollout
from coevo.rollouts.batched import EpisodeRollout


class SudokuConfig(RolloutConfig):
    """Settings of the ``sudoku`` rollout (defaults: a small 4x4 CPU setting; see configs/longhorizon/)."""

    type: str = "sudoku"
    size: Literal[4, 9] = Field(4, description="grid size n (4: 2x2 boxes, 9: 3x3 boxes as in the paper)")
    horizon: int = Field(2, ge=1, description="H*: blanks per puzzle = minimum successful moves")
    max_turns: int | None = Field(None, ge=1, description="turn limit (default 3 x H*, the reference's)")
    puzzles_per_member: int = Field(8, ge=1, description="train puzzles per member and generation")
    train_pool: int = Field(128, ge=1, description="train puzzles per (size, H*) the generations draw from")
    test_puzzles: int = Field(32, ge=1, description="held-out puzzles")
    test_repeats: int = Field(1, ge=1, description="episodes per held-out puzzle (the reference: 3)")
    seed: int = Field(0, description="seed of the puzzle generator and of the sampling")
    context: Literal["board", "history"] = Field(
        "board", description="board: system + current board each turn (the reference); history: the whole chat"
    )
    list_empty: bool = Field(True, description="the observation lists the empty cells' coordinates")
    hints: bool = Field(False, description="the observation lists each empty cell's candidate digits (assisted)")
    max_new_tokens: int = Field(64, ge=1, description="tokens per turn (the reference: 64)")
    temperature: float = Field(0.7, ge=0, description="0 = greedy")
    top_p: float = Field(0.8, gt=0, le=1)
    top_k: int = Field(20, ge=0)

    @model_validator(mode="after")
    def _check(self) -> SudokuConfig:
        if self.horizon > self.size * self.size:
            raise ValueError(f"horizon {self.horizon} exceeds the {self.size * self.size} cells of the grid")
        if self.puzzles_per_member > self.train_pool:
            raise ValueError(f"puzzles_per_member ({self.puzzles_per_member}) > train_pool ({self.train_pool})")
        if self.size not in BOX:
            raise ValueError(f"size must be one of {sorted(BOX)}")
        return self


@register_rollout("sudoku")
class SudokuRollout(EpisodeRollout):
    """Sudoku episodes with terminal 0/1 reward (module docstring); context slot ``system_prompt``
    (:class:`~coevo.rollouts.batched.EpisodeRollout`)."""

    Config = SudokuConfig

    def pool(self, split: Split) -> list[Puzzle]:
        """Every puzzle of a split: the train pool, or the held-out puzzles (once each)."""
        cfg = self.config
        n = cfg.test_puzzles if split == "test" else cfg.train_pool
        return puzzles(cfg.size, cfg.horizon, split, n, cfg.seed)

    def episode(self, puzzle: Puzzle) -> SudokuEpisode:
        """A fresh episode on ``puzzle`` with this rollout's turn limit and observation settings."""
        return SudokuEpisode(puzzle, self.config.max_turns, self.config.list_empty, self.config.hints)

    def task_id(self, episode: SudokuEpisode) -> str:
        return f"sudoku{self.config.size}:h{self.config.horizon}:{episode.puzzle.puzzle_id}"

    def episodes(self, split: Split, generation: int = 0) -> list[SudokuEpisode]:
        """Fresh episodes of a split: this generation's draw from the train pool, or every held-out puzzle x
        ``test_repeats``."""
        cfg = self.config
        pool = self.pool(split)
        if split == "test":
            chosen = pool * cfg.test_repeats
        else:
            chosen = self.draw(pool, cfg.puzzles_per_member, generation)
        return [self.episode(p) for p in chosen]

    def turn_context(self) -> str:
        return self.config.context

    def episode_meta(self, episode: SudokuEpisode) -> dict:
        return {"context": self.config.context, **episode.summary()}

    def n_cases(self, split: Split = "train") -> int:
        cfg = self.config
        return cfg.puzzles_per_member if split == "train" else cfg.test_puzzles * cfg.test_repeats

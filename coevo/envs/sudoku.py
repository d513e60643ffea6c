"""Horizon-controlled Sudoku: a multi-turn environment whose minimum number of successful steps is a setting.

The long-horizon task of Agentic ESOpt (arXiv 2608.17310; reference environment in the authors' code, field
notes §6): a puzzle is a solved grid with exactly ``H*`` cells blanked, so a perfect agent needs exactly ``H*``
moves (H* = "minimum successful steps"). Each turn the agent emits one move, ``set r c v`` (row, column, value,
all 1-based); the environment

* rejects moves on a given or an already filled cell (the move is not applied, the feedback says why),
* counts a malformed or out-of-range move as a turn with feedback (never an exception),
* re-renders the board in every observation,
* ends on a full board or after the turn limit (``3 x H*`` as in the reference),
* pays a sparse terminal reward: 1.0 if the final board keeps every given and is a valid solution, else 0.0.

Solved grids are built as in the reference, from the pattern solution ``(b (r mod b) + r div b + c) mod n``
(box side ``b``, ``n = b^2``) shuffled by a seeded random relabelling of digits, row/column permutations within
bands/stacks, band/stack permutations and an optional transpose, all of which preserve validity. Train and
held-out puzzles come from disjoint seed streams (``split`` is part of the seed), so they are reproducible and
do not depend on how many puzzles of the other split were drawn.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from coevo.envs.multiturn import TurnEpisode

Grid = list[list[int]]  # n x n, 0 = empty, values 1..n

#: grid sizes and their box side (n = b * b)
BOX = {4: 2, 9: 3}

MOVE_FORMAT = "set r c v"
_MOVE = re.compile(r"\bset\s*\(?\s*(-?\d+)\s*[,\s]\s*(-?\d+)\s*[,\s]\s*(-?\d+)", re.IGNORECASE)


def solved_grid(n: int, rng: random.Random) -> Grid:
    """A uniformly shuffled valid n x n Sudoku solution from the pattern solution (see module docstring).

    Raises:
        ValueError: ``n`` not in :data:`BOX`.
    """
    if n not in BOX:
        raise ValueError(f"grid size must be one of {sorted(BOX)}, got {n!r}")
    b = BOX[n]

    def shuffled(seq):
        seq = list(seq)
        rng.shuffle(seq)
        return seq

    rows = [g * b + r for g in shuffled(range(b)) for r in shuffled(range(b))]
    cols = [g * b + c for g in shuffled(range(b)) for c in shuffled(range(b))]
    digits = shuffled(range(1, n + 1))
    grid = [[digits[(b * (r % b) + r // b + c) % n] for c in cols] for r in rows]
    if rng.random() < 0.5:
        grid = [list(col) for col in zip(*grid)]
    return grid


def is_valid_solution(grid: Grid) -> bool:
    """Whether every row, column and box of a full grid holds each of 1..n exactly once."""
    n = len(grid)
    b = BOX.get(n)
    if b is None or any(len(row) != n for row in grid):
        return False
    want = set(range(1, n + 1))
    units = [set(row) for row in grid] + [{grid[r][c] for r in range(n)} for c in range(n)]
    units += [
        {grid[br + r][bc + c] for r in range(b) for c in range(b)} for br in range(0, n, b) for bc in range(0, n, b)
    ]
    return all(u == want for u in units)


@dataclass(frozen=True)
class Puzzle:
    """A puzzle: ``givens`` (0 = blank) and the solution it was made from.

    Attributes:
        puzzle_id: ``"{split}/{index}"`` within its generator.
        givens: n x n grid, exactly ``horizon`` zeros.
        solution: the solved grid the blanks were taken from (a valid completion; others may exist).
        horizon: H*, the number of blanks = minimum successful moves.
    """

    puzzle_id: str
    givens: tuple[tuple[int, ...], ...]
    solution: tuple[tuple[int, ...], ...]
    horizon: int

    @property
    def size(self) -> int:
        return len(self.givens)

    def blanks(self) -> list[tuple[int, int]]:
        """0-based (row, col) of the blank cells, row-major."""
        return [(r, c) for r, row in enumerate(self.givens) for c, v in enumerate(row) if v == 0]


def make_puzzle(n: int, horizon: int, rng: random.Random, puzzle_id: str = "") -> Puzzle:
    """Blank exactly ``horizon`` cells (uniformly without replacement) of a fresh solved grid.

    Raises:
        ValueError: bad ``n`` or ``horizon`` outside 1..n*n.
    """
    if not isinstance(horizon, int) or not 1 <= horizon <= n * n:
        raise ValueError(f"horizon must be an int in 1..{n * n}, got {horizon!r}")
    solution = solved_grid(n, rng)
    givens = [row[:] for row in solution]
    for cell in rng.sample(range(n * n), horizon):
        givens[cell // n][cell % n] = 0
    return Puzzle(puzzle_id, tuple(map(tuple, givens)), tuple(map(tuple, solution)), horizon)


def puzzles(n: int, horizon: int, split: str, count: int, seed: int, offset: int = 0) -> list[Puzzle]:
    """Puzzles ``offset .. offset+count-1`` of a split; puzzle ``i`` depends only on (n, horizon, split, seed, i)."""
    return [
        make_puzzle(n, horizon, random.Random(f"sudoku/{n}/{horizon}/{split}/{seed}/{i}"), f"{split}/{i}")
        for i in range(offset, offset + count)
    ]


@dataclass(frozen=True)
class Move:
    """A parsed move (1-based row, column, value as written)."""

    row: int
    col: int
    value: int


def parse_move(text: str) -> Move | None:
    """The first ``set r c v`` in ``text`` (also ``set(r, c, v)`` / ``set r,c,v``; case-insensitive), else None."""
    m = _MOVE.search(text or "")
    return Move(*(int(g) for g in m.groups())) if m else None


def render(grid: Grid) -> str:
    """The board as text: a column header, ``.`` for blanks, ``|`` and ``-`` between boxes, 1-based labels."""
    n = len(grid)
    b = BOX[n]
    head = "    " + " | ".join(" ".join(str(c + 1) for c in range(s, s + b)) for s in range(0, n, b))
    rule = "   " + "+".join("-" * (2 * b + 1) for _ in range(b))
    lines = [head, rule]
    for r, row in enumerate(grid):
        cells = [str(v) if v else "." for v in row]
        lines.append(f"{r + 1:>2}  " + " | ".join(" ".join(cells[s : s + b]) for s in range(0, n, b)))
        if (r + 1) % b == 0 and r + 1 < n:
            lines.append(rule)
    return "\n".join(lines)


@dataclass(eq=False)
class SudokuEpisode(TurnEpisode):
    """One episode on one puzzle (the environment state); a :class:`~coevo.envs.multiturn.TurnEpisode`.

    Args:
        puzzle: the puzzle.
        max_turns: turn limit (default ``3 * puzzle.horizon``, the reference's).
        list_empty: the observation also lists the empty cells' coordinates.
        hints: the observation also lists each empty cell's candidates (digits not yet in its row, column or
            box): an easier, assisted variant for small models (off in the reference setting).

    Attributes:
        board: current grid (givens plus accepted moves). turns: turns taken (every :meth:`step` counts).
        done: full board or turn limit reached. feedback: the last move's feedback (``""`` before the first).
        counts: {"accepted", "rejected", "malformed"} move counts.
    """

    puzzle: Puzzle
    max_turns: int | None = None
    list_empty: bool = True
    hints: bool = False
    board: Grid = field(init=False)
    turns: int = field(init=False, default=0)
    feedback: str = field(init=False, default="")
    counts: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        if self.max_turns is None:
            self.max_turns = 3 * self.puzzle.horizon
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        self.board = [list(row) for row in self.puzzle.givens]
        self.counts = {"accepted": 0, "rejected": 0, "malformed": 0}
        self.system = rules(self.puzzle.size)

    @property
    def full(self) -> bool:
        return all(v for row in self.board for v in row)

    @property
    def done(self) -> bool:
        return self.full or self.turns >= self.max_turns

    def empty_cells(self) -> list[tuple[int, int]]:
        """1-based (row, col) of the empty cells, row-major."""
        return [(r + 1, c + 1) for r, row in enumerate(self.board) for c, v in enumerate(row) if v == 0]

    def candidates(self, row: int, col: int) -> list[int]:
        """Digits not yet in the row, column or box of the 1-based cell (row, col)."""
        n, b = self.puzzle.size, BOX[self.puzzle.size]
        r, c = row - 1, col - 1
        used = set(self.board[r]) | {self.board[i][c] for i in range(n)}
        used |= {self.board[i][j] for i in range(r // b * b, r // b * b + b) for j in range(c // b * b, c // b * b + b)}
        return [v for v in range(1, n + 1) if v not in used]

    def observation(self) -> str:
        """What the agent sees this turn: last feedback, the re-rendered board, empty cells, turns left."""
        parts = [f"Feedback: {self.feedback}"] if self.feedback else []
        parts.append("Board:\n" + render(self.board))
        empty = self.empty_cells()
        if self.list_empty:
            parts.append(f"Empty cells (row col): {', '.join(f'{r} {c}' for r, c in empty)}")
        if self.hints:
            parts.append(
                "Candidates (row col: digits): "
                + "; ".join(f"{r} {c}: {' '.join(map(str, self.candidates(r, c)))}" for r, c in empty)
            )
        parts.append(f"Turns left: {self.max_turns - self.turns}. Reply with one move: {MOVE_FORMAT}")
        return "\n".join(parts)

    def step(self, text: str) -> tuple[str | None, str]:
        """Apply the move written in ``text``; returns (the move as ``"set r c v"`` or None when none was found,
        feedback). Never raises on bad text.

        Raises:
            RuntimeError: the episode is already done.
        """
        if self.done:
            raise RuntimeError("episode is done")
        self.turns += 1
        move = parse_move(text)
        n = self.puzzle.size
        if move is None:
            self.counts["malformed"] += 1
            self.feedback = f"no move found; write exactly '{MOVE_FORMAT}' (e.g. 'set 1 2 {n}')."
        elif not all(1 <= x <= n for x in (move.row, move.col, move.value)):
            self.counts["malformed"] += 1
            self.feedback = (
                f"'set {move.row} {move.col} {move.value}' is out of range: row, column and value are 1..{n}."
            )
        elif self.puzzle.givens[move.row - 1][move.col - 1]:
            self.counts["rejected"] += 1
            self.feedback = f"rejected: cell ({move.row}, {move.col}) is a given and cannot be changed."
        elif self.board[move.row - 1][move.col - 1]:
            self.counts["rejected"] += 1
            self.feedback = f"rejected: cell ({move.row}, {move.col}) is already filled."
        else:
            self.counts["accepted"] += 1
            self.board[move.row - 1][move.col - 1] = move.value
            self.feedback = f"placed {move.value} at ({move.row}, {move.col})."
        if self.done:
            self.feedback += " The board is full." if self.full else " Turn limit reached."
        return (None if move is None else f"set {move.row} {move.col} {move.value}"), self.feedback

    def keeps_givens(self) -> bool:
        g = self.puzzle.givens
        return all(self.board[r][c] == g[r][c] for r in range(len(g)) for c in range(len(g)) if g[r][c])

    def reward(self) -> float:
        """Terminal reward: 1.0 if the board keeps every given and is a valid solution, else 0.0 (also mid-episode)."""
        return 1.0 if self.full and self.keeps_givens() and is_valid_solution(self.board) else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "puzzle_id": self.puzzle.puzzle_id,
            "size": self.puzzle.size,
            "horizon": self.puzzle.horizon,
            "turns": self.turns,
            "max_turns": self.max_turns,
            "solved": self.reward() == 1.0,
            "filled": sum(v != 0 for row in self.board for v in row)
            - sum(v != 0 for row in self.puzzle.givens for v in row),
            **self.counts,
            "board": [row[:] for row in self.board],
        }


def rules(n: int) -> str:
    """The task statement shown once at the start of an episode."""
    b = BOX[n]
    return (
        f"You are solving a {n}x{n} Sudoku. Fill every empty cell (shown as '.') so that each row, each column "
        f"and each {b}x{b} box contains every digit 1-{n} exactly once. Given digits cannot be changed and a filled "
        f"cell cannot be overwritten. Each turn, reply with exactly one move in the form '{MOVE_FORMAT}' "
        f"(row r, column c, value v, all 1-based), for example 'set 1 2 {n}'."
    )

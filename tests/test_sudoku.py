"""Horizon-controlled Sudoku: puzzle generation, move parsing, rules, terminal reward, the batched multi-turn
driver, the ``sudoku`` rollout with a scripted policy, and one ES generation on a tiny random Qwen2."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch
import yaml

from coevo.backends.base import Completion, Policy
from coevo.config import parse_config
from coevo.envs.multiturn import conversation, drive
from coevo.envs.sudoku import (
    SudokuEpisode,
    is_valid_solution,
    make_puzzle,
    parse_move,
    puzzles,
    render,
    solved_grid,
)
from coevo.loop import CoEvolutionLoop
from coevo.rollouts.base import build_rollout
from coevo.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- generation
@pytest.mark.parametrize("n", [4, 9])
def test_solved_grids_are_valid_and_varied(n):
    grids = [solved_grid(n, random.Random(i)) for i in range(100)]
    assert all(is_valid_solution(g) for g in grids)
    assert len({str(g) for g in grids}) > 50  # the shuffles really shuffle


@pytest.mark.parametrize(("n", "h"), [(4, 1), (4, 6), (4, 16), (9, 5), (9, 10), (9, 15)])
def test_puzzles_have_exactly_h_blanks_and_a_valid_completion(n, h):
    for p in puzzles(n, h, "train", 20, seed=3):
        blanks = p.blanks()
        assert len(blanks) == h == p.horizon
        assert is_valid_solution([list(r) for r in p.solution])
        assert all(p.givens[r][c] in (0, p.solution[r][c]) for r in range(n) for c in range(n))
        ep = SudokuEpisode(p)  # the solution really completes it through the environment, in exactly H* moves
        for r, c in blanks:
            ep.step(f"set {r + 1} {c + 1} {p.solution[r][c]}")
        assert ep.done and ep.turns == h and ep.reward() == 1.0


def test_splits_are_seeded_disjoint_and_prefix_stable():
    a = puzzles(4, 3, "train", 10, seed=1)
    assert a == puzzles(4, 3, "train", 10, seed=1)
    assert a[:4] == puzzles(4, 3, "train", 4, seed=1)  # puzzle i does not depend on the count
    assert a != puzzles(4, 3, "test", 10, seed=1) and a != puzzles(4, 3, "train", 10, seed=2)
    with pytest.raises(ValueError, match="horizon"):
        make_puzzle(4, 17, random.Random(0))
    with pytest.raises(ValueError, match="grid size"):
        solved_grid(5, random.Random(0))


def test_invalid_boards_are_not_solutions():
    g = solved_grid(4, random.Random(0))
    g[0][0], g[0][1] = g[0][1], g[0][0]  # rows still permutations, columns broken
    assert not is_valid_solution(g)
    assert not is_valid_solution([[1, 2], [2, 1]])


# ----------------------------------------------------------------------------------------------- moves
@pytest.mark.parametrize(
    ("text", "move"),
    [
        ("set 1 2 3", (1, 2, 3)),
        ("SET(4, 1, 2)", (4, 1, 2)),
        ("I think set 2,3,4 works", (2, 3, 4)),
        ("set 1 2 3\nset 4 4 4", (1, 2, 3)),
        ("set 10 2 3", (10, 2, 3)),
    ],
)
def test_parse_good_moves(text, move):
    m = parse_move(text)
    assert (m.row, m.col, m.value) == move


@pytest.mark.parametrize("text", ["", "put 1 2 3", "set 1 2", "set a b c", "reset", "offset 1 2 3", None])
def test_parse_malformed_moves(text):
    assert parse_move(text) is None


def _episode(h=3, seed=0):
    return SudokuEpisode(puzzles(4, h, "test", 1, seed)[0])


def test_malformed_and_out_of_range_moves_are_counted_turns_with_feedback():
    ep = _episode()
    before = [r[:] for r in ep.board]
    assert ep.step("I am not sure") == (None, ep.feedback) and "set r c v" in ep.feedback
    action, fb = ep.step("set 5 1 1")
    assert action == "set 5 1 1" and "out of range" in fb
    ep.step("set 1 1 0")
    assert ep.turns == 3 and ep.counts["malformed"] == 3 and ep.board == before and not ep.done


def test_illegal_moves_are_rejected_and_not_applied():
    ep = _episode()
    (gr, gc) = next((r, c) for r in range(4) for c in range(4) if ep.puzzle.givens[r][c])
    before = [r[:] for r in ep.board]
    _, fb = ep.step(f"set {gr + 1} {gc + 1} {ep.puzzle.givens[gr][gc] % 4 + 1}")
    assert "given" in fb and ep.board == before
    r, c = ep.puzzle.blanks()[0]
    ep.step(f"set {r + 1} {c + 1} 1")
    _, fb = ep.step(f"set {r + 1} {c + 1} 2")
    assert "already filled" in fb and ep.board[r][c] == 1
    assert ep.counts == {"accepted": 1, "rejected": 2, "malformed": 0} and ep.turns == 3


def test_turn_limit_is_three_times_horizon_and_reward_is_terminal():
    ep = _episode(h=2)
    assert ep.max_turns == 6
    for _ in range(6):
        assert ep.reward() == 0.0
        ep.step("nothing")
    assert ep.done and not ep.full and ep.reward() == 0.0 and "Turn limit" in ep.feedback
    with pytest.raises(RuntimeError, match="done"):
        ep.step("set 1 1 1")


def test_full_but_wrong_board_gets_zero():
    ep = _episode(h=3)
    for k, (r, c) in enumerate(ep.puzzle.blanks()):  # the first move is wrong, the others right
        v = ep.puzzle.solution[r][c] % 4 + 1 if k == 0 else ep.puzzle.solution[r][c]
        ep.step(f"set {r + 1} {c + 1} {v}")
    assert ep.full and ep.done and ep.keeps_givens() and ep.reward() == 0.0 and "full" in ep.feedback


def test_observation_rerenders_board_and_lists_empty_cells():
    ep = _episode(h=2)
    r, c = ep.puzzle.blanks()[0]
    ep.step(f"set {r + 1} {c + 1} {ep.puzzle.solution[r][c]}")
    obs = ep.observation()
    assert render(ep.board) in obs and f"placed {ep.puzzle.solution[r][c]}" in obs
    ((r2, c2),) = [(a + 1, b + 1) for a, b in ep.puzzle.blanks()[1:]]
    assert render(ep.board).count(".") == 1 and f"Empty cells (row col): {r2} {c2}" in obs and "Turns left: 5" in obs


def test_hints_list_each_empty_cells_candidates():
    p = puzzles(4, 1, "test", 1, 0)[0]
    ((r, c),) = p.blanks()
    ep = SudokuEpisode(p, hints=True)
    assert ep.candidates(r + 1, c + 1) == [p.solution[r][c]]  # one blank: its candidate is the solution
    assert f"Candidates (row col: digits): {r + 1} {c + 1}: {p.solution[r][c]}" in ep.observation()
    assert "Candidates" not in SudokuEpisode(p).observation()


# ----------------------------------------------------------------------------------------------- scripted agent
def read_board(text: str) -> list[list[int]]:
    """Parse the rendered board of an observation back into a grid."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\s*\d+  (.*)$", line)
        if m:
            rows.append([0 if t == "." else int(t) for t in m.group(1).split() if t != "|"])
    return rows


def solve(grid):
    """Backtracking completion of a 4x4 / 9x9 grid (None if impossible)."""
    n = len(grid)
    b = int(n**0.5)
    for r in range(n):
        for c in range(n):
            if grid[r][c] == 0:
                for v in range(1, n + 1):
                    box = {
                        grid[br][bc]
                        for br in range(r // b * b, r // b * b + b)
                        for bc in range(c // b * b, c // b * b + b)
                    }
                    if v not in grid[r] and v not in {grid[i][c] for i in range(n)} and v not in box:
                        grid[r][c] = v
                        if solve(grid):
                            return grid
                        grid[r][c] = 0
                return None
    return grid


class SolverPolicy(Policy):
    """A scripted policy: reads the board from the last message and plays a correct move; every ``junk_every``-th
    call per conversation length answers junk instead. Records every batch it was asked."""

    def __init__(self, junk: bool = False):
        self.calls: list[list[list[dict]]] = []
        self.junk = junk

    def generate(self, conversations, params):
        self.calls.append(conversations)
        out = []
        for conv in conversations:
            if self.junk:
                out.append(Completion(text="hmm", prompt_tokens=3, completion_tokens=1))
                continue
            grid = read_board(conv[-1]["content"])
            solved = solve([row[:] for row in grid])
            r, c = next((r, c) for r in range(len(grid)) for c in range(len(grid)) if grid[r][c] == 0)
            out.append(
                Completion(text=f"Move: set {r + 1} {c + 1} {solved[r][c]}", prompt_tokens=5, completion_tokens=7)
            )
        return out


def test_drive_steps_all_episodes_in_one_batch_per_turn():
    eps = [SudokuEpisode(p) for p in puzzles(4, 3, "train", 3, 0)] + [SudokuEpisode(puzzles(4, 1, "train", 1, 0)[0])]
    calls = []

    def generate(convs, turn):
        calls.append(len(convs))
        return SolverPolicy().generate(convs, None)

    turns = drive(eps, generate, "board")
    assert calls == [4, 3, 3]  # the H*=1 episode ends after turn 0; one batched call per turn
    assert [len(t) for t in turns] == [3, 3, 3, 1] and all(ep.reward() == 1.0 for ep in eps)
    assert turns[0][1].observation == turns[0][1].observation and "placed" in turns[0][1].observation


def test_history_context_keeps_the_chat_and_board_context_does_not():
    ep = _episode(h=2)
    turns = drive([ep], lambda convs, t: [Completion(text="no idea")] * len(convs), "history")
    conv_h = conversation(ep, turns[0][:2], "history")
    conv_b = conversation(ep, turns[0][:2], "board")
    assert [m["role"] for m in conv_h] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m["role"] for m in conv_b] == ["system", "user"] and conv_b[-1] == conv_h[-1]
    with pytest.raises(ValueError, match="context"):
        conversation(ep, [], "nope")


@pytest.mark.parametrize("context", ["board", "history"])
def test_sudoku_rollout_with_scripted_policies(context):
    spec = {
        "type": "sudoku",
        "size": 4,
        "horizon": 3,
        "puzzles_per_member": 5,
        "train_pool": 20,
        "test_puzzles": 3,
        "test_repeats": 2,
        "context": context,
    }
    ro = build_rollout(spec, None)
    good = SolverPolicy()
    ts = ro.run(good, generation=4, member=None, key_prefix="p")
    assert len(ts) == ro.n_cases("train") == 5 and all(t.reward == 1.0 and t.llm_calls == 3 for t in ts)
    assert [len(c) for c in good.calls] == [5, 5, 5]
    assert ts[0].key == "p/train/0" and ts[0].task_id.startswith("sudoku4:h3:train/") and ts[0].meta["solved"]
    assert ts[0].steps[0].action.startswith("set ") and ts[0].completion_tokens == 21
    assert ro.member_reward(ts) == 1.0
    bad = ro.run(SolverPolicy(junk=True), generation=0, member=None, key_prefix="q", split="test")
    assert len(bad) == 6 and all(t.reward == 0.0 and t.llm_calls == 9 and t.meta["malformed"] == 9 for t in bad)
    # generations draw different puzzles from the pool; all members of one generation get the same ones
    ids = lambda g: [e.puzzle.puzzle_id for e in ro.episodes("train", g)]
    assert ids(4) == ids(4) and ids(4) != ids(5)


def test_config_errors():
    with pytest.raises(Exception, match="exceeds"):
        build_rollout({"type": "sudoku", "size": 4, "horizon": 17}, None)
    with pytest.raises(Exception, match="train_pool"):
        build_rollout({"type": "sudoku", "puzzles_per_member": 9, "train_pool": 8}, None)
    with pytest.raises(Exception, match="size"):
        build_rollout({"type": "sudoku", "size": 6}, None)


# ----------------------------------------------------------------------------------------------- ES end to end
def test_one_es_generation_on_tiny_qwen2(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    data = yaml.safe_load((ROOT / "configs/longhorizon/sudoku_es_tiny.yaml").read_text())
    data["model"]["name"] = str(tiny_model_dir)
    data["budget"]["max_rounds"] = 1
    es = data["evolvers"][0]
    es.update(total_generations=1, eval_every=1)
    es["rollout"].update(puzzles_per_member=2, test_puzzles=2, max_new_tokens=4, context="history")
    loop = CoEvolutionLoop(parse_config(data), tmp_path, raw_config=data, progress=False)
    loop.run()
    with TrajectoryStore(tmp_path / "store.sqlite", readonly=True) as store:
        trajs = list(store.iter_trajectories())
        hist = store.es_history(trajs[0].run_id, "es")
    members = [t for t in trajs if t.member is not None]
    centre = [t for t in trajs if t.member is None]
    assert len(members) == 4 * 2 and {t.member.index for t in members} == {0, 1, 2, 3}
    assert len(centre) == 2 * 2  # held-out before and after the generation
    assert all(t.llm_calls == 6 and len(t.steps) == 6 and t.reward == 0.0 for t in trajs)  # random model: 3 x H*
    assert all(t.meta["context"] == "history" and t.task_id.startswith("sudoku4:h2:") for t in trajs)
    assert len(hist) == 1 and hist[0]["generation"] == 0


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs/longhorizon").glob("*es*.yaml")))
def test_longhorizon_es_configs_validate(name):
    cfg = parse_config(yaml.safe_load((ROOT / "configs/longhorizon" / name).read_text()), name)
    assert cfg.evolvers[0].params.rollout["type"] in ("sudoku", "react_math")


def test_heldout_sampling_seeds_are_the_same_at_every_evaluation():
    """Held-out evaluations at any generation (and another method's on the same rollout) draw the same random
    numbers, so base vs final differ by the weights only; train seeds change with the generation."""
    r = build_rollout({"type": "sudoku", "size": 4, "horizon": 2, "seed": 3}, None)
    for turn in (0, 2):
        assert r.sampling("test", 0, turn).seed == r.sampling("test", 7, turn).seed
        assert r.sampling("train", 0, turn).seed != r.sampling("train", 7, turn).seed
        assert r.sampling("test", 0, turn).seed != r.sampling("train", 0, turn).seed
    assert r.sampling("test", 0, 0).seed != r.sampling("test", 0, 1).seed

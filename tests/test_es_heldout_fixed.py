"""ES held-out evaluations measure the weights only (issue 26 item 4).

A real ES run (``CoEvolutionLoop``, tiny random Qwen2) with ``alpha: 0`` changes no weight, so its held-out
evaluations of the centre (``eval_every: 1``: before generations 0 and 1, and after the last one) must be equal
to the last token: same cases or episodes, same sampling seeds, same completions and rewards. Checked for every
built-in rollout with a held-out split that samples (countdown with temperature > 0, sudoku and react_math
episodes) or scores (target_logprob), under full-rank and low-rank perturbations (low rank also in bfloat16,
whose updates round stochastically).
"""

from __future__ import annotations

import pytest
from test_es_evolver import es_config, history, run_loop

from coevo.store import TrajectoryStore

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROLLOUTS = {
    "countdown": {
        "type": "countdown",
        "task": "arithmetic",
        "cases_per_member": 2,
        "test_cases": 3,
        "max_new_tokens": 12,
        "temperature": 0.8,
    },
    "sudoku": {
        "type": "sudoku",
        "size": 4,
        "horizon": 2,
        "puzzles_per_member": 2,
        "train_pool": 4,
        "test_puzzles": 2,
        "max_new_tokens": 8,
    },
    "react_math": {
        "type": "react_math",
        "problems_per_member": 2,
        "test_problems": 2,
        "samples_per_problem": 2,
        "max_turns": 2,
        "max_new_tokens": 16,
        "tool_timeout_s": 5,
    },
    "target_logprob": {"type": "target_logprob"},
}


def _heldout(run_dir) -> dict[int, list[tuple]]:
    """Generation -> the centre's held-out trajectories as (task id, reward, valid, model outputs), in key order."""
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        ts = [t for t in s.query(run_id=run_dir.name, evolver="es", split="test") if t.member is None]
    out: dict[int, list[tuple]] = {}
    for t in sorted(ts, key=lambda t: t.key):
        out.setdefault(t.generation, []).append(
            (t.task_id, t.reward, t.valid, tuple(step.model_output for step in t.steps))
        )
    return out


@pytest.mark.parametrize(
    ("perturbation", "dtype"), [("full", "float32"), ("lowrank", "float32"), ("lowrank", "bfloat16")]
)
@pytest.mark.parametrize("rollout", sorted(ROLLOUTS))
def test_heldout_evaluations_of_unchanged_weights_are_identical(tiny_model_dir, tmp_path, rollout, perturbation, dtype):
    es = {
        "population_size": 2,
        "total_generations": 2,
        "eval_every": 1,
        "alpha": 0.0,  # members are perturbed and rewarded, but the centre never moves
        "sigma": 0.05,
        "sigma_final": 0.05,
        "perturbation": perturbation,
        "scope": "all_linear",
        "rollout": ROLLOUTS[rollout],
    }
    if perturbation == "lowrank":
        es["rank"] = 1
    run_dir = tmp_path / "run"
    _, summary = run_loop(run_dir, es_config(tiny_model_dir, dtype=dtype, max_rounds=3, **es))
    assert "completed its 2 generations" in summary.stop_reason, summary.stop_reason
    rows = history(run_dir)
    assert len({r["weight_hash_before"] for r in rows} | {r["weight_hash_after"] for r in rows}) == 1
    evals = _heldout(run_dir)
    assert sorted(evals) == [0, 1, 2]  # before generations 0 and 1, after the last
    assert len(evals[0]) == {"countdown": 3, "sudoku": 2, "react_math": 4, "target_logprob": 1}[rollout]
    assert evals[1] == evals[0] and evals[2] == evals[0]  # equal weights give equal held-out numbers

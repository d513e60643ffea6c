"""The run report: rebuilt from the store alone, which it only reads; each reward named with its unit and
evolver (ES member reward vs heuristic scores); no table with an unnamed column."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import coevo
from coevo.artifacts import LOOP_STEP, REPORT_SECTION
from coevo.report import write_report
from coevo.store import TrajectoryStore
from coevo.tables import md_table
from coevo.types import ESMember, Step, Trajectory

UNIT = "heuristic score = -tour length (higher is better)"


def _traj(key: str, evolver: str, space: str, reward: float | None, member: ESMember | None = None) -> Trajectory:
    return Trajectory(
        key=key,
        run_id="run",
        evolver=evolver,
        space=space,
        round=0,
        generation=0,
        task_id="tsp",
        steps=[Step(observation="prompt", model_output="answer")],
        reward=reward,
        valid=reward is not None,
        failure=None if reward is not None else "parse",
        member=member,
        llm_calls=1,
        meta={"reward_unit": UNIT},
    )


def _step(evolver: str, space: str, best: float, unit: str | None) -> dict:
    return {
        "samples": 2,
        "trajectories": 2,
        "best_reward": best,
        "reward_unit": unit,
        "metrics": {},
        "stop": False,
        "stop_reason": None,
        "round": 0,
        "evolver": evolver,
        "space": space,
        "samples_total": 2,
        "wall_s": 1.0,
    }


def test_report_names_reward_units_and_only_reads_the_store(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with TrajectoryStore(run / "store.sqlite") as store:
        store.add_trajectories(
            [
                _traj("run/eoh/0", "eoh", "context", -17.31),
                _traj("run/eoh/1", "eoh", "context", None),
                _traj("run/es/g0/m0", "es", "parameter", -18.0, ESMember(1, 1e-3, 1, 0)),
            ]
        )
        store.put_artifact("run", LOOP_STEP, "eoh", _step("eoh", "context", -17.31, f"best child's {UNIT}"), key="a")
        store.put_artifact("run", LOOP_STEP, "es", _step("es", "parameter", 0.2112, None), key="b")
        store.put_artifact("run", REPORT_SECTION, "run/eoh", {"evolver": "eoh", "markdown": "EoH section text"})
    before = hashlib.sha256((run / "store.sqlite").read_bytes()).hexdigest()
    with TrajectoryStore(run / "store.sqlite") as store:
        n_art = len(store.list_artifacts(run_id="run"))
        report = write_report(run, store, "run", plots=False).read_text()
        assert len(store.list_artifacts(run_id="run")) == n_art
    assert hashlib.sha256((run / "store.sqlite").read_bytes()).hexdigest() == before  # nothing written
    assert (
        "| evolver | space | trajectories | LLM samples | valid | text calls | text tokens | mean trajectory reward "
        "| best trajectory reward | trajectory reward unit |" in report
    )
    assert f"| es | parameter | 1 | 1 | 100.0% | 0 | 0 | -18 | -18 | {UNIT} |" in report  # ES rows: child scores
    assert f"| 0 | eoh | context | 2 | 2 | -17.31 | best child's {UNIT} |" in report
    assert "| 0 | es | parameter | 2 | 2 | 0.2112 | best ES member reward R_i of the generation |" in report
    assert "## eoh" in report and "EoH section text" in report


def test_no_report_table_has_an_unnamed_column():
    """Every md_table call in the package with literal headers names every column."""
    root = Path(coevo.__file__).resolve().parent
    unnamed = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "md_table"
                and node.args
                and isinstance(node.args[0], ast.List)
            ):
                for h in node.args[0].elts:
                    if isinstance(h, ast.Constant) and not str(h.value).strip():
                        unnamed.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not unnamed, f"tables with an unnamed column: {unnamed}"


def test_md_table_escapes_cells():
    assert md_table(["a", "b"], [["x|y", "line\nbreak"], [None, 1.23456]]) == (
        "| a | b |\n|---|---|\n| x\\|y | line break |\n| – | 1.235 |"
    )

"""CoEvolutionLoop: alternation order, pooled trajectories, budgets, checkpoints and resume after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from coevo.config import parse_config
from coevo.errors import RunFolderError
from coevo.loop import CoEvolutionLoop
from coevo.report.writer import step_records
from coevo.store import SchemaError, TrajectoryStore

TESTS = Path(__file__).parent


def _cfg(**budget):
    return {
        "run": {"name": "t", "seed": 7},
        # ParamCounter is a parameter-space evolver, which needs a model with weights; it never loads it
        "model": {"name": "tiny:micro", "backend": "hf", "dtype": "float32"},
        "budget": {"max_rounds": 4, **budget},
        "evolvers": [
            {"name": "es", "type": "toy_evolvers:ParamCounter", "samples_per_step": 2},
            {"name": "ctx", "type": "toy_evolvers:Counter", "samples_per_step": 3},
        ],
        "schedule": [{"evolver": "es", "every": 1}, {"evolver": "ctx", "every": 2, "start": 1}],
    }


def _run(tmp_path, data, name="run"):
    cfg = parse_config(data)
    loop = CoEvolutionLoop(cfg, tmp_path / name, raw_config=data, progress=False)
    return loop, loop.run()


def test_alternation_order_and_pooled_trajectories(tmp_path):
    (tmp_path / "run").mkdir()
    _, summary = _run(tmp_path, _cfg())
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        steps = step_records(store, "run")
        order = [(s["round"], s["evolver"]) for s in steps]
        assert order == [(0, "es"), (1, "es"), (1, "ctx"), (2, "es"), (3, "es"), (3, "ctx")]
        assert [s["space"] for s in steps[:3]] == ["parameter", "parameter", "context"]
        # the context evolver saw the parameter evolver's trajectories of rounds 0-1 (pooled store)
        assert steps[2]["metrics"]["pool"] == 4.0
        assert steps[5]["metrics"]["pool"] == 2 * 4 + 3
        assert len(store.query(run_id="run")) == 4 * 2 + 2 * 3
    assert summary.rounds_completed == 4
    assert "round budget" in summary.stop_reason
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| es | parameter |" in report and "| ctx | context |" in report
    assert (tmp_path / "run" / "plots" / "reward_vs_samples.png").stat().st_size > 1000


def test_sample_budget_counts_failed_samples(tmp_path):
    data = _cfg(max_samples=7)
    data["budget"]["max_rounds"] = 100
    data["evolvers"][0]["invalid_every"] = 2  # half of the samples fail
    (tmp_path / "run").mkdir()
    _, summary = _run(tmp_path, data)
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        ts = store.query(run_id="run")
        assert sum(t.llm_calls for t in ts) == 7  # the budget is exact, failures included
        assert any(not t.valid for t in ts)
    assert "sample budget" in summary.stop_reason


def test_wall_clock_budget(tmp_path):
    data = _cfg(max_wall_s=0.5)
    data["budget"]["max_rounds"] = 10_000
    data["evolvers"][0]["sleep_s"] = 0.05
    (tmp_path / "run").mkdir()
    t0 = time.time()
    _, summary = _run(tmp_path, data)
    assert "wall-clock" in summary.stop_reason
    assert time.time() - t0 < 10


def _spawn(args, env):
    return subprocess.Popen(
        [sys.executable, "-m", "coevo.cli", "run", "--no-progress", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_resume_after_kill_9_loses_and_duplicates_nothing(tmp_path):
    data = _cfg()
    data["budget"]["max_rounds"] = 6
    data["evolvers"][0]["sleep_s"] = 0.08
    data["evolvers"][1]["sleep_s"] = 0.08
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    # reference: uninterrupted run
    ref = _spawn([str(cfg_path), "--out", str(tmp_path / "ref")], env)
    assert ref.wait(120) == 0, ref.stdout.read().decode()

    # interrupted run: kill -9 twice at arbitrary moments, then resume to the end
    run_dir = tmp_path / "killed"
    proc = _spawn([str(cfg_path), "--out", str(run_dir)], env)
    db = run_dir / "store.sqlite"
    kills = 0
    for wait_for in (3, 9):
        deadline = time.time() + 60
        while time.time() < deadline:
            if db.exists():
                try:
                    with TrajectoryStore(db, readonly=True) as s:
                        if len(s.query(run_id="killed")) >= wait_for:
                            break
                except SchemaError:  # the writer has created the file but not yet its schema
                    pass
            time.sleep(0.02)
        time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        kills += 1
        proc = _spawn(["--resume", str(run_dir)], env)
    assert proc.wait(120) == 0, proc.stdout.read().decode()
    assert kills == 2

    with TrajectoryStore(tmp_path / "ref" / "store.sqlite") as a, TrajectoryStore(db) as b:
        ta = {t.key.split("/", 1)[1]: t for t in a.query(run_id="ref")}
        tb = {t.key.split("/", 1)[1]: t for t in b.query(run_id="killed")}
        assert sorted(ta) == sorted(tb)  # nothing lost, nothing extra
        assert len(tb) == len(b.query(run_id="killed"))  # no duplicates
        assert all(ta[k].reward == tb[k].reward for k in ta)  # same deterministic streams
        assert len({t.meta["pid"] for t in tb.values()}) >= 2  # really produced by several processes
        assert a.count_llm_calls("ref") == b.count_llm_calls("killed")
    sa, sb = (yaml.safe_load((d / "summary.json").read_text()) for d in (tmp_path / "ref", run_dir))
    assert sa["rounds_completed"] == sb["rounds_completed"] == 6
    with TrajectoryStore(tmp_path / "ref" / "store.sqlite") as a, TrajectoryStore(db) as b:
        tot_a = [s["metrics"]["total"] for s in step_records(a, "ref")]
        tot_b = [s["metrics"]["total"] for s in step_records(b, "killed")]
    assert tot_a[-1] == pytest.approx(tot_b[-1], abs=0)  # evolver state restored exactly


def test_resume_requires_a_run(tmp_path):
    with pytest.raises(RunFolderError, match="no run to resume"):
        CoEvolutionLoop(parse_config(_cfg()), tmp_path, resume=True, progress=False)


def test_coevo_run_refuses_a_parameter_space_evolver_without_a_model(tmp_path, capsys):
    from coevo.cli import main

    data = _cfg()
    del data["model"]
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    assert main(["run", str(cfg_path), "--out", str(tmp_path / "run")]) == 2
    assert (
        "evolvers.es.type: a parameter-space evolver evolves the model's weights, but the config has no "
        "`model` section" in capsys.readouterr().err
    )
    assert not (tmp_path / "run").exists()


def test_a_run_stopped_right_after_a_rounds_last_step_completed_that_round(tmp_path):
    """The sample budget ends the run right after round 1's last step: rounds 0 and 1 completed (the report
    said 1 with both rounds' steps in its table, a new user's pass)."""
    data = _cfg(max_samples=7)  # es 2 (round 0), es 2 + ctx 3 (round 1): spent at the end of round 1
    (tmp_path / "run").mkdir()
    _, summary = _run(tmp_path, data)
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        rounds = sorted({s["round"] for s in step_records(store, "run")})
    assert rounds == [0, 1] and summary.rounds_completed == 2, (rounds, summary)

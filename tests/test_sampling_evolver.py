"""Random-sampling evolver (type ``sample``): batches of i1 samples, best kept, budget, report, resume.

Uses the scripted policy of ``test_eoh`` (a test double for the model only; see that module) and the real
tiny random Qwen2 model for the failure path.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from test_eoh import SMALL, ScriptedPolicy, _ctx, make_loop

from coevo.ahd.answer import ANSWER_FAILURE_KINDS
from coevo.ahd.evaluate import evaluate_heuristic
from coevo.evolvers.base import resolve_evolver
from coevo.evolvers.sampling import RandomSamplingConfig, RandomSamplingEvolver
from coevo.store import TrajectoryStore

pytestmark = pytest.mark.usefixtures("private_cache")


def test_registered_as_sample():
    assert resolve_evolver("sample") is RandomSamplingEvolver


def test_scripted_sampling_run_keeps_best(tmp_path):
    data = {
        "run": {"name": "s", "seed": 2},
        "budget": {"max_rounds": 2},
        "evolvers": [{"name": "sample", "type": "sample", **SMALL, "batch": 4}],
        "report": {"plots": False},
    }
    policy = ScriptedPolicy()
    loop = make_loop(tmp_path, data, lambda: policy)
    ev = loop.evolvers["sample"]
    loop.run()
    assert policy.calls == 8 and policy.generate_calls == 2
    assert all("Invent a new heuristic" in p for p in policy.prompts)  # i1 only
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        trajs = store.query(run_id="run")
        assert len(trajs) == 8 and {t.meta["operator"] for t in trajs} == {"i1"}
        # the garbage reply, the float-returning heuristic, the second copy of nearest neighbour and nearest
        # neighbour written with min() (other code, the same objectives)
        assert Counter(t.failure for t in trajs if not t.valid) == {
            "parse": 1,
            "return_type": 1,
            "duplicate": 1,
            "behavioural_duplicate": 1,
        }
        top = store.top_k(1, run_id="run")[0]
        assert ev.best.reward == top.reward and ev.best.code == top.meta["code"]
        assert store.get_artifact("heuristic", "tsp_construct/sample").content["id"] == ev.best.id
    code = (tmp_path / "run" / "best_heuristic.py").read_text()
    assert evaluate_heuristic(ev.problem, code, ev.train_instances).objective == pytest.approx(ev.best.objective)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## sample" in report and "| 10 | 2 |" in report and "best gap %" in report


def test_state_round_trip_and_rerun_from_cache(tmp_path):
    policy = ScriptedPolicy()
    ctx = _ctx(tmp_path, policy=policy)
    cfg = RandomSamplingConfig(**SMALL, batch=3)
    ev = RandomSamplingEvolver("sample", cfg, ctx)
    saved = json.loads(json.dumps(ev.state_dict()))
    ev.step(0)
    after = ev.state_dict()
    again = RandomSamplingEvolver("sample", cfg, ctx)
    again.load_state_dict(saved)
    again.step(0)  # re-run of an interrupted step: all samples come from the store
    assert policy.calls == 3 and again.state_dict() == after
    restored = RandomSamplingEvolver("sample", cfg, ctx)
    restored.load_state_dict(json.loads(json.dumps(after)))
    assert restored.best == ev.best and restored.steps_done == 1


def test_tiny_model_budget_is_exact(tmp_path, tiny_model_dir):
    data = {
        "run": {"name": "t", "seed": 0},
        "model": {"name": str(tiny_model_dir), "dtype": "float32"},
        "budget": {"max_rounds": 10, "max_samples": 5},
        "evolvers": [{"name": "sample", "type": "sample", **SMALL, "batch": 3, "max_new_tokens": 16}],
        "report": {"plots": False},
    }
    summary = make_loop(tmp_path, data).run()
    assert "sample budget" in summary.stop_reason and summary.samples == 5
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        trajs = store.query(run_id="run")
        assert len(trajs) == 5 and not any(t.valid for t in trajs)
        assert {t.failure for t in trajs} <= set(ANSWER_FAILURE_KINDS)  # random model, prefilled answers
    assert "No valid heuristic was found" in (tmp_path / "run" / "report.md").read_text()

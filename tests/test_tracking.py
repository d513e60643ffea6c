"""The ``tracking:`` config section: the loop's metrics mirrored to TensorBoard event files and an MLflow
file store, read back with TensorBoard's own event reader and MLflow's client; failing trackers warn once
and the run goes on.

Runs are real :class:`~coevo.loop.CoEvolutionLoop` runs of ``configs/es/tiny.yaml`` (tiny random Qwen2,
2 generations of 4 members); expected values come from the run's store.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from coevo.config import ConfigError, load_config
from coevo.loop import CoEvolutionLoop, new_run_dir
from coevo.report.writer import step_records
from coevo.store import TrajectoryStore
from coevo.tracking import RunTracker, TrackingConfig

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "evolvers.es.total_generations=2",
    "evolvers.es.population_size=4",
    "evolvers.es.eval_every=1",
    "report.plots=false",
]


pytestmark = pytest.mark.usefixtures("private_cache")


def run_tiny(tmp_path: Path, *sets: str):
    cfg, raw = load_config(ROOT / "configs" / "es" / "tiny.yaml", [*SMALL, *sets])
    loop = CoEvolutionLoop(cfg, new_run_dir(cfg, tmp_path / "run"), raw_config=raw, progress=False)
    return loop.run()


def test_off_by_default_and_strict():
    cfg, _ = load_config(ROOT / "configs" / "es" / "tiny.yaml")
    assert cfg.tracking == TrackingConfig() and not cfg.tracking.enabled
    with pytest.raises(ConfigError, match="tracking.tensorbord: unknown field"):
        load_config(ROOT / "configs" / "es" / "tiny.yaml", ["tracking.tensorbord=true"])


def test_guide_tracking_section_is_a_valid_config():
    import re

    import yaml

    line = re.search(r"^tracking: .*$", (ROOT / "docs" / "guide.md").read_text(), re.MULTILINE).group(0)
    cfg = TrackingConfig.model_validate(yaml.safe_load(line.split("#")[0])["tracking"])
    assert cfg.tensorboard and cfg.mlflow and not cfg.wandb


def test_tensorboard_and_mlflow_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary = run_tiny(tmp_path, "tracking.tensorboard=true", "tracking.mlflow=true")
    run_dir = summary.run_dir
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as store:
        hist = store.es_history("run", "es")
        steps = step_records(store, "run")
    assert len(hist) == 2 and len(steps) == 3  # 2 generations, then the step that stops ES

    events = EventAccumulator(str(run_dir / "tracking" / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    tags = events.Tags()
    sigma = events.Scalars("es/generation/sigma")
    assert [e.step for e in sigma] == [0, 1]
    assert [e.value for e in sigma] == pytest.approx([h["sigma"] for h in hist])
    norm = events.Scalars("es/generation/update_norm")
    assert [e.value for e in norm] == pytest.approx([h["update"]["update_norm"] for h in hist])
    mean = events.Scalars("es/generation/reward_mean")
    assert [e.value for e in mean] == pytest.approx([sum(h["rewards"]) / len(h["rewards"]) for h in hist])
    per_step = events.Scalars("es/step/mean_reward")
    assert [e.step for e in per_step] == [0, 1]
    assert [e.value for e in per_step] == pytest.approx([s["metrics"]["mean_reward"] for s in steps[:2]])
    assert [e.value for e in events.Scalars("run/samples_total")] == [s["samples_total"] for s in steps]
    best = events.Scalars("run/best_reward/es")
    assert best[-1].value == pytest.approx(max(s["best_reward"] for s in steps if s["best_reward"] is not None))
    assert "es/generation/member_rewards" in tags["histograms"]
    rewards_hist = events.Histograms("es/generation/member_rewards")
    assert [h.step for h in rewards_hist] == [0, 1] and rewards_hist[0].histogram_value.num == 4
    assert rewards_hist[0].histogram_value.min == pytest.approx(min(hist[0]["rewards"]))

    client = MlflowClient(tracking_uri=(run_dir / "tracking" / "mlruns").resolve().as_uri())
    mlflow_id = (run_dir / "tracking" / "mlflow_run_id").read_text().strip()
    run = client.get_run(mlflow_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["evolvers.es.population_size"] == "4" and run.data.params["model.name"] == "tiny:micro"
    assert run.data.tags["coevo.stop_reason"] == summary.stop_reason
    coeff = client.get_metric_history(mlflow_id, "es/generation/update_norm")
    assert sorted((m.step, m.value) for m in coeff) == [
        (h["generation"], pytest.approx(h["update"]["update_norm"])) for h in hist
    ]
    test_reward = client.get_metric_history(mlflow_id, "es/step/test_reward")
    assert [m.value for m in sorted(test_reward, key=lambda m: m.step)] == pytest.approx(
        [s["metrics"]["test_reward"] for s in steps if "test_reward" in s["metrics"]]
    )
    assert client.get_experiment(run.info.experiment_id).name == "es-tiny"  # run.name of the config


def test_a_tracker_that_cannot_start_warns_once_and_the_run_goes_on(tmp_path, caplog):
    pytest.importorskip("tensorboard")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the tracking folder should be")
    with caplog.at_level(logging.WARNING, logger="coevo.tracking"):
        summary = run_tiny(tmp_path, "tracking.tensorboard=true", f"tracking.dir={blocker}")
    warnings = [r for r in caplog.records if r.name == "coevo.tracking"]
    assert len(warnings) == 1 and "tensorboard is off for this run" in warnings[0].getMessage()
    assert "ES completed its 2 generations" in summary.stop_reason and summary.steps == 3


def test_a_tracker_failing_mid_run_warns_once(tmp_path, caplog):
    pytest.importorskip("mlflow")
    with TrajectoryStore(tmp_path / "store.sqlite") as store:
        tracker = RunTracker(TrackingConfig(mlflow=True), tmp_path, "r1", "demo", {"run": {"seed": 1}}, store)
        assert tracker.active == ["mlflow"]
        record = {
            "evolver": "e",
            "space": "context",
            "samples": 2,
            "best_reward": 1.5,
            "metrics": {"m": 0.5},
            "samples_total": 2,
            "round": 0,
            "wall_s": 0.1,
        }
        tracker.on_step(record, 0)
        shutil.rmtree(tmp_path / "tracking" / "mlruns")  # the store vanishes under the tracker
        with caplog.at_level(logging.WARNING, logger="coevo.tracking"):
            tracker.on_step({**record, "round": 1}, 1)
            tracker.on_step({**record, "round": 2}, 2)
            tracker.close({"stop_reason": "done"})
    warnings = [r.getMessage() for r in caplog.records if r.name == "coevo.tracking"]
    assert len(warnings) == 1 and "mlflow failed in log and is off for the rest of the run" in warnings[0]
    assert tracker.active == []


def test_wandb_offline_or_one_warning_when_missing(tmp_path, caplog):
    try:
        import wandb  # noqa: F401
    except ImportError:
        with caplog.at_level(logging.WARNING, logger="coevo.tracking"):
            tracker = RunTracker(TrackingConfig(wandb=True), tmp_path, "r1", "demo", {})
        assert tracker.active == []
        (msg,) = [r.getMessage() for r in caplog.records if r.name == "coevo.tracking"]
        assert "wandb is off for this run" in msg and "pip install wandb" in msg
        return
    tracker = RunTracker(TrackingConfig(wandb=True), tmp_path, "r1", "demo", {"run": {"seed": 1}})
    assert tracker.active == ["wandb"]
    tracker.on_step(
        {
            "evolver": "e",
            "space": "context",
            "samples": 1,
            "best_reward": 2.0,
            "metrics": {},
            "samples_total": 1,
            "round": 0,
            "wall_s": 0.1,
        },
        0,
    )
    tracker.close({"stop_reason": "done"})
    runs = list((tmp_path / "tracking" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0

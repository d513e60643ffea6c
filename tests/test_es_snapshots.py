"""What an ES run keeps of its weights (issue 29 item 5): by default no weight file, since the base model and the
ES history rebuild the weights exactly (resume, ``coevo es replay``, ``coevo es export``); ``weight_snapshots:
full`` for snapshot files. Real runs of ``configs/es/tiny.yaml`` (tiny random Qwen2) through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from coevo.cli import main
from coevo.es.checkpoint import list_snapshots, replays_exactly, snapshot_mode
from coevo.evolvers.es import ESConfig
from coevo.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "es" / "tiny.yaml")
SMALL = ["--set", "evolvers.es.total_generations=3", "--set", "report.plots=false", "--set", "budget.max_rounds=4"]

pytestmark = pytest.mark.usefixtures("one_torch_thread", "private_cache")


def _hashes(run: Path) -> list[str]:
    with TrajectoryStore(run / "store.sqlite", readonly=True) as s:
        return [r["weight_hash_after"] for r in s.es_history(run.name, "es")]


def test_the_default_keeps_no_weight_file_and_the_history_rebuilds_the_weights(tmp_path, capsys):
    ref = tmp_path / "ref"
    assert main(["run", TINY, *SMALL, "--out", str(ref), "--quiet"]) == 0
    assert list_snapshots(ref) == [] and not (ref / "weights").exists()
    report = (ref / "report.md").read_text()
    assert "Weights: no weight file is kept (`weight_snapshots: replay`)" in report
    assert "Set `weight_snapshots: full` for snapshot files of about " in report
    hashes = _hashes(ref)
    assert len(hashes) == 3
    capsys.readouterr()
    assert main(["es", "replay", str(ref), "--check"]) == 0
    assert "check: OK" in capsys.readouterr().out
    assert main(["es", "export", str(ref), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert capsys.readouterr().out.strip().endswith(f"(ES weights hash {hashes[-1]})")

    # a run stopped after one generation and resumed rebuilds its weights from the base model and the history
    cut = tmp_path / "cut"
    assert main(["run", TINY, *SMALL[:-2], "--set", "budget.max_rounds=1", "--out", str(cut), "--quiet"]) == 0
    data = yaml.safe_load((cut / "config.yaml").read_text())
    data["budget"]["max_rounds"] = 4
    (cut / "config.yaml").write_text(yaml.safe_dump(data))
    capsys.readouterr()
    assert main(["run", "--resume", str(cut)]) == 0
    assert _hashes(cut) == hashes and list_snapshots(cut) == []
    err = capsys.readouterr().err  # the model loads before the first progress line: said at once
    assert (
        "resuming: restoring the checkpoint (ES weights after a generation are rebuilt first: model tiny:micro" in err
    )


def test_full_snapshots_on_request(tmp_path):
    run = tmp_path / "full"
    assert main(["run", TINY, *SMALL, "--set", "evolvers.es.weight_snapshots=full", "--out", str(run), "--quiet"]) == 0
    assert [g for g, _ in list_snapshots(run)] == [3]  # checkpoint_every 5: the one at the end
    report = (run / "report.md").read_text()
    assert (
        "Weights: snapshot files in `weights/` (`weight_snapshots: full`: every 5 generations and at the end" in report
    )


def test_a_run_that_drifts_from_its_history_keeps_full_snapshots(tmp_path, capsys):
    drifting = {"perturbation": "full", "restore_mode": "inference", "master_weights": False}
    assert not replays_exactly(**drifting) and replays_exactly("lowrank", "inference", False)
    assert ESConfig(**drifting).weight_snapshots == "full"  # auto
    assert ESConfig().weight_snapshots == "replay"
    with pytest.raises(ValueError, match="weight_snapshots 'replay' keeps no weight file"):
        snapshot_mode("replay", exact_replay=False)
    sets = [f"evolvers.es.{k}={str(v).lower()}" for k, v in drifting.items()] + ["evolvers.es.weight_snapshots=replay"]
    assert main(["run", "--check", TINY, *[a for s in sets for a in ("--set", s)]]) == 2
    assert "use weight_snapshots: full (or auto)" in capsys.readouterr().err

"""benchmarks/es_learning.py without runs: the summary over seeds, the Markdown table, the PNG, reuse markers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from support import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "es_learning.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(SCRIPT, "es_learning")


def _run(name, rewards, walls, generations):
    points = [
        {"generation": g, "wall_s": w, "reward": r, "exact": None} for g, (r, w) in enumerate(zip(rewards, walls))
    ]
    return {"run": name, "generations": generations, "points": points}


RESULTS = {
    "full": [_run("full-s0", [-2.0, -1.8], [10, 70], 2), _run("full-s1", [-2.2, -2.1], [12, 62], 2)],
    "lowrank": [_run("lowrank-s0", [-2.0, -1.6, -1.2], [5, 30, 55], 5), _run("lowrank-s1", [-2.2, -1.4], [6, 66], 4)],
}


def test_summary_is_mean_and_std_over_seeds(bench):
    full, low = bench.summarise(RESULTS)
    assert full["perturbation"] == "full" and full["seeds"] == 2 and full["generations"] == 2
    assert full["reward_gen0"] == pytest.approx(-2.1) and full["reward_last"] == pytest.approx(-1.95)
    assert full["gain_mean"] == pytest.approx(0.15) and full["gain_std"] == pytest.approx(0.0707107, rel=1e-5)
    assert full["gain_per_minute"] == pytest.approx((60 * 0.2 / 70 + 60 * 0.1 / 62) / 2)
    assert low["gain_mean"] == pytest.approx(0.8) and low["last_wall_s"] == pytest.approx(60.5)
    text = bench.markdown_table([full, low])
    lines = text.splitlines()
    assert len(lines) == 4 and all(ln.count("|") == 9 for ln in lines)
    assert lines[2].startswith("| full | 2 | 2.0 | -2.1000 | -1.9500 | +0.1500 +- 0.0707 |")
    assert lines[3].startswith("| lowrank | 2 | 4.5 |")


def test_plot_writes_a_png(bench, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "curves.png"
    bench.plot(RESULTS, path, "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_finished_runs_of_the_same_settings_are_reused(bench, tmp_path):
    args = argparse.Namespace(wall=5.0, eval_every=1, rank=1, threads=1, set=["model.name=tiny:micro"])
    config = tmp_path / "c.yaml"
    run_dir = tmp_path / "full-s0"
    run_dir.mkdir()
    settings = {
        "config": str(config.resolve()),
        "set": [
            "run.seed=0",
            "budget.max_wall_s=5.0",
            "evolvers.es.perturbation=full",
            "evolvers.es.eval_every=1",
            "report.plots=false",
            "model.name=tiny:micro",
        ],
    }
    (run_dir / "es_learning.json").write_text(json.dumps(settings))
    assert bench.run_one(config, tmp_path, "full", 0, args) == run_dir  # no coevo run started

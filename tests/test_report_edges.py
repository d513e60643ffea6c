"""What the report and the dashboard say about the main job's run (issue 29 item 3), on one real run of the
shipped main config (``configs/ahd/tsp_construct.yaml``: EoH + low-rank ES, ``eval_every: 0``) at test size
on the tiny random Qwen2 model with scripted replies (real weights, real sandbox, real SQLite store):
the EoH initialisation's 8 samples are unparsable, then every sample is a rewrite of the seed heuristic
(nearest neighbour), so the seed stays the best while a twin of it takes its place in the population, and
ES runs 2 of its 4 generations before the sample budget (40) ends the run."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_ahd_coevo import GARBAGE, ScriptedTinyQwen, make_loop, reply, shipped

from coevo.dashboard.app import es_panel, heldout_note, heuristic_count
from coevo.dashboard.figures import es_generations
from coevo.dashboard.reader import open_run
from coevo.report.writer import metric_keys, step_records
from coevo.store import TrajectoryStore
from coevo.tables import mean

ROOT = Path(__file__).resolve().parents[1]
TWIN = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    row = distance_matrix[current_node]
    return int(unvisited_nodes[int(np.argmin(row[unvisited_nodes]))])
"""

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir) -> Path:
    tmp = tmp_path_factory.mktemp("report_edges")
    policy = ScriptedTinyQwen(tiny_model_dir, [GARBAGE] * 8 + [reply(TWIN, "the nearest node, written again")])
    over = {"budget.max_samples": 40, "evolvers.eoh.reject_duplicates": "false", "evolvers.eoh.parse_retries": 0}
    # the twin is a behavioural duplicate of the seed: kept valid here so that it can take the seed's place
    over["evolvers.eoh.reject_same_behaviour"] = "false"
    over["evolvers.eoh.seed_heuristics"] = "[]"  # this run's story: nearest neighbour is the only seed and stays best
    sets = shipped("eoh", str(tiny_model_dir), **over)
    sets = [s for s in sets if s != "report.plots=false"]  # the metric plots are under test too
    loop = make_loop(tmp, "tsp_construct.yaml", sets, policy)
    summary = loop.run()
    assert "sample budget reached (40/40" in summary.stop_reason
    return tmp / "run"


def _section(report: str, title: str) -> str:
    return report.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_best_seed_heuristic_is_named_and_its_absence_from_the_population_explained(run):
    report = (run / "report.md").read_text()
    eoh = _section(report, "eoh")
    assert "{the problem's seed heuristic}" not in report
    assert (
        "Best heuristic `seed` (training objective 2.92893) is the problem's seed heuristic (Nearest neighbour: go "
        "to the closest node not yet visited): no sampled heuristic beat it on the training set." in eoh
    )
    table = eoh.split("Final population", 1)[1]
    assert "| seed |" not in table  # a twin (same objective, lower id) took its place
    assert "The best heuristic `seed` is not in this table: `" in table
    assert "has the same training objective (2.92893) and took its place" in table


def test_es_section_says_applied_how_many_generations_and_why_no_held_out(run):
    report = (run / "report.md").read_text()
    head = report.split("\n## Evolvers", 1)[0]
    assert "- ES `es`: 2 of its 4 generations ran" in head
    assert "- wall clock: " in head and "(no wall-clock budget)" in head
    es = _section(report, "es")
    assert "2 of its 4 generations ran (the run stopped first: see the stop reason at the top)" in es
    rows = [line for line in es.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
    assert len(rows) == 2 and all(line.endswith("| applied |") for line in rows), rows
    assert "No held-out evaluation of the centre: `eval_every` is 0 in this config" in es


def test_constant_metrics_are_named_not_plotted(run):
    with TrajectoryStore(run / "store.sqlite", readonly=True) as store:
        es_steps = [s for s in step_records(store, "run") if s["evolver"] == "es"]
    varying, constant = metric_keys(es_steps)
    assert constant["alpha"] == 5e-4 and constant["skipped"] == 0.0 and "alpha" not in varying
    assert "generation" in varying and "sigma" in varying
    report = (run / "report.md").read_text()
    assert "Not plotted, one value over every step:" in report and "- es: alpha=0.0005," in report
    assert (run / "plots" / "metrics_es.png").is_file()


def test_mean_of_rewards_that_cancel_is_zero():
    rewards = [1 / 6, 0.5, -0.5, -1 / 6]  # centred ranks of 4 members, in the order of a generation
    assert sum(rewards) / len(rewards) == pytest.approx(-6.939e-18, rel=1e-3)  # what the report showed
    assert mean(rewards) == 0.0
    # member rewards of a main job (means of its children's centred ranks, k/14 - 1/2): each is rounded to a
    # float, so even fsum leaves -2.776e-17 (a new user's report); within the inputs' rounding, 0 it is
    members = [-0.2142857142857143, -0.07142857142857145, -0.07142857142857145, 0.3571428571428571]  # its gen 0
    assert math.fsum(members) / len(members) == pytest.approx(-2.776e-17, rel=1e-3)
    assert mean(members) == 0.0
    assert mean([1e-3, 0.0]) == 5e-4 and mean([-2.0, 1.0]) == -0.5  # real means stay as they are


def test_wall_budget_overrun_is_said(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    data = yaml.safe_load((copy / "config.yaml").read_text())
    data["budget"]["max_wall_s"] = 30
    (copy / "config.yaml").write_text(yaml.safe_dump(data))
    summary = json.loads((copy / "summary.json").read_text())
    summary["wall_s"] = 90.4  # a batch that ran past the budget (the tiny run itself may end within a second)
    (copy / "summary.json").write_text(json.dumps(summary))
    proc = subprocess.run(
        [sys.executable, "-m", "coevo.cli", "runs", "show", str(copy), "--report"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("- wall clock: "))
    assert line == "- wall clock: 90 s of the 30 s budget (60 s over it)", line


def test_dashboard_counts_the_seed_and_says_why_held_out_is_empty(run):
    reader = open_run(run)
    try:
        rows = reader.heuristics()
        samples = [r for r in rows if r["trajectory_id"] is not None]
        assert len(rows) == len(samples) + 1  # the seed heuristic is no sample
        n_valid = sum(r["valid"] for r in samples)
        assert heuristic_count(rows) == (
            f"{len(rows)} heuristics ({n_valid + 1} valid): {len(samples)} LLM samples ({n_valid} valid) and the "
            "problem's seed heuristic"
        )
        note = heldout_note(reader, "es")
        assert note == "no held-out evaluation of the centre: eval_every is 0 in this run's config"
        panel = es_panel(reader, "es")
        assert any(getattr(c, "id", None) == "es-heldout-note" for c in panel)
        fig = es_generations("es", reader.es_generations("es"), heldout_note=note)
        assert note in [a.text for a in fig.layout.annotations]
        gens = reader.es_generations("es")
        assert [g["skipped"] for g in gens] == [False, False]
    finally:
        reader.close()


def test_run_log_step_lines_are_words(run):
    log = (run / "run.log").read_text()
    assert "StepReport(" not in log
    line = next(x for x in log.splitlines() if " round 1 es: " in x)
    assert "round 1 es: 8 samples, 8 trajectories, best reward " in line and "; metrics: generation=0, " in line

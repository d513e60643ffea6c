"""ES that trains the sampler (``configs/ahd/sampler_es.yaml``) and the arms benchmark
(``benchmarks/sampler_train.py``), end to end on the suite's tiny random Qwen2.

Real parts: the shipped config (shrunk with ``--set`` to test size only), ``coevo run`` / ``coevo es replay
--check`` / ``coevo heuristics sampler-test`` as subprocesses, the sandbox, SQLite stores. The tiny model writes
no valid heuristic: what is checked is that the arm trains, replays bit for bit, is tested from its run folder
(weights rebuilt from the history), resumes without redoing a step, and reports its numbers.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from coevo.config import load_config

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("private_cache")


#: the training configs shrunk to test size (tiny model, 8-token answers, TSP8 instances); each test adds its arm's
TINY_SETS = [
    "model.dtype=float32",
    "sampling.max_new_tokens=8",
    "budget.max_wall_s=null",
    "budget.max_samples=40",
    "report.plots=false",
    "evolvers.eoh.train_size=8",
    "evolvers.eoh.train_count=2",
    "evolvers.eoh.test_sizes=[8]",
    "evolvers.eoh.test_count=2",
    "evolvers.eoh.validation_count=0",
]


def _argv(arms: str, tiny_model_dir: Path, out: Path, sets: list[str]) -> list[str]:
    argv = ["--arms", arms, "--prompts", "8", "--problems", "tsp_construct", "--base", str(tiny_model_dir)]
    return argv + ["--out", str(out), *[x for s in [*TINY_SETS, *sets] for x in ("--set", s)]]


def _bench():
    spec = importlib.util.spec_from_file_location("sampler_train", ROOT / "benchmarks" / "sampler_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sampler_es_config_is_the_documented_plan():
    cfg, _ = load_config(ROOT / "configs/ahd/sampler_es.yaml")
    es = next(e.params for e in cfg.evolvers if e.type == "es")
    assert (es.sigma, es.alpha, es.schedule, es.population_size) == (1e-3, 5e-4, "constant", 4)
    assert es.rollout["reward"] == "rank" and es.rollout["evolver"] == "eoh"
    assert len(es.rollout["operators"]) * es.rollout["children_per_operator"] == 4  # children per member
    assert es.restore_mode == "exact" and es.master_weights
    # the budget covers EoH's initialisation, every ES generation and every 4th round's EoH generation
    eoh = next(e.params for e in cfg.evolvers if e.type == "eoh")
    per_eoh = len(eoh.operators) * eoh.offspring_per_operator
    need = (
        2 * eoh.population_size + es.total_generations * 4 * es.population_size + (es.total_generations // 4) * per_eoh
    )
    assert cfg.budget.max_samples == need
    # the training population is the main job's, never the sampler test's parents
    raw = yaml.safe_load((ROOT / "configs/ahd/sampler_es.yaml").read_text())
    assert raw["evolvers"][0]["seed_heuristics"] == ["eoh_ael"]


@pytest.mark.heavy  # 300-390 s on 2 cores (three ES generations, replay and two sampler tests): pytest -m heavy (CI runs it)
def test_es_arm_trains_replays_and_is_tested_from_its_run(tmp_path, tiny_model_dir):
    bench = _bench()
    argv = _argv(
        "frozen,es", tiny_model_dir, tmp_path / "bench", ["evolvers.es.total_generations=2", "evolvers.es.sigma=0.05"]
    )
    assert bench.main(argv) == 0
    rows = {
        json.loads(line)["arm"]: json.loads(line)
        for line in (tmp_path / "bench/results.jsonl").read_text().splitlines()
    }
    es, frozen = rows["es"], rows["frozen"]
    assert frozen["train"] is None and frozen["after"] == frozen["before"]
    t = es["train"]
    assert t["es_generations"] == 2 and t["replay_check"] is True and t["llm_samples"] > 0
    # what the members wrote during training, by round: 2 generations x 4 members x 4 children
    assert t["children"]["n"] == 32 and [r[1] for r in t["children"]["by_round"]] == [16, 16]
    assert t["children"]["valid_new"] + sum(t["children"]["failures"].values()) == 32
    assert t["wall_s"] > 0 and t["peak_rss_mb"] > 0
    assert es["before"] == frozen["before"]  # the base model's test is shared, not redone
    model = json.loads((tmp_path / "bench/tests/es-after/model.json").read_text())
    assert model["kind"] == "run" and model["weights_hash"] == t["weights_hash"] and model["generations"] == 2
    assert es["after"]["overall"]["prompts"] == 8
    assert (tmp_path / "bench/sampler_train.png").stat().st_size > 0
    # a rerun does nothing again: every step is recorded as done
    log_size = (tmp_path / "bench/steps.log").stat().st_size
    assert bench.main(argv) == 0
    assert (tmp_path / "bench/steps.log").stat().st_size == log_size


@pytest.mark.heavy  # 208-240 s on 2 cores (a GRPO run of one update and two sampler tests, tiny model): pytest -m heavy
def test_grpo_arm_is_tested_from_its_last_adapter(tmp_path, tiny_model_dir):
    """The GRPO arm: the shipped GRPO config shrunk to test size, then the after-test of the run's last adapter
    (``<run>/adapters/grpo/round-RRRRR``), its update's cost in the row; no ES replay for an adapter arm."""
    bench = _bench()
    argv = _argv(
        "grpo", tiny_model_dir, tmp_path / "bench", ["evolvers.grpo.total_updates=1", "evolvers.grpo.micro_batch=4"]
    )
    assert bench.main(argv) == 0
    row = json.loads((tmp_path / "bench/results.jsonl").read_text().splitlines()[0])
    t = row["train"]
    assert row["arm"] == "grpo" and t["es_generations"] == 0 and t["replay_check"] is None
    assert t["adapter"].endswith(("round-00001", "round-00002")) and "adapters/grpo/" in t["adapter"]
    assert len(t["update_wall_s"]) == t["adapter_updates"] <= 1
    assert t["children"]["n"] == 8  # one update: 2 prompts x 4 answers
    model = json.loads((tmp_path / "bench/tests/grpo-after/model.json").read_text())
    assert model["kind"] == "adapter" and model["adapter"] == t["adapter"]
    assert row["after"]["overall"]["prompts"] == 8
    assert "replay" not in (tmp_path / "bench/steps.log").read_text()

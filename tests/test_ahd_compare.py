"""benchmarks/ahd_compare.py end to end on a tiny random Qwen2: real runs, the Markdown and JSON-lines table,
finished runs skipped and an interrupted one resumed when the same command runs again."""

from __future__ import annotations

import json

import pytest
from support import load_script

# two real tiny-model runs, then the same grid twice more (about 40 s of CPU)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("private_cache")]


BENCH = load_script("benchmarks/ahd_compare.py", "ahd_compare_e2e")


def test_parse_sizes_per_problem_or_for_all():
    assert BENCH.parse_sizes("50,100") == {"*": [50, 100]}
    assert BENCH.parse_sizes("tsp_construct=50,bpp_online=5000,bpp_online=1000") == {
        "tsp_construct": [50],
        "bpp_online": [5000, 1000],
    }
    with pytest.raises(ValueError):
        BENCH.parse_sizes("tsp_construct=fifty")


def _result(method: str, seed: int, best: float | None, samples: int = 16, stop: str = "done") -> object:
    row = {"seed_objective": 7.0, "seed_gap": 20.0, "best_objective": best, "best_gap": None, "reference": "LKH"}
    return BENCH.RunResult("tsp_construct", method, seed, 16, samples, 1, 1.0, stop, {50: row})


def test_settings_compare_only_the_seeds_both_methods_ran():
    # a partial grid: eoh finished seeds 1-3, eoh_es only seeds 1-2. On seeds 1-2 eoh_es is better (6.5 vs 6.9)
    # though eoh's mean over all three seeds (6.3) is lower; seed 3 must not enter the comparison.
    results = [
        _result("eoh", 1, 6.9),
        _result("eoh", 2, 6.9),
        _result("eoh", 3, 5.1),
        _result("eoh_es", 1, 6.4),
        _result("eoh_es", 2, 6.6),
    ]
    table, settings = BENCH.summarise(results, {"tsp_construct": "minimize"})
    (s,) = settings
    assert s["seeds"] == [1, 2] and s["win"] is True
    assert s["variant_found"] == "2/2" and s["baseline_found"] == "2/2"
    assert s["variant_mean"] == pytest.approx(6.5) and s["baseline_mean"] == pytest.approx(6.9)
    # the table still shows every finished run of each method
    assert [row[3] for row in table] == ["3/3", "2/2"]
    # a run without a valid heuristic is a loss on a paired seed
    results[3] = _result("eoh_es", 1, None)
    (s,) = BENCH.summarise(results, {"tsp_construct": "minimize"})[1]
    assert s["win"] is False and s["variant_found"] == "1/2"
    # a run the wall-clock safety stop cut before its sample budget is not compared (its seed drops out)
    results[3] = _result("eoh_es", 1, 6.0, samples=14, stop="wall-clock budget reached (767/660 s)")
    (s,) = BENCH.summarise(results, {"tsp_construct": "minimize"})[1]
    assert s["seeds"] == [2] and s["variant_found"] == "1/1"
    assert BENCH.cut_by_wall(results[3]) and not BENCH.cut_by_wall(results[4])
    # no seed in common: no setting
    only = [_result("eoh", 1, 6.9), _result("eoh_es", 2, 6.4)]
    assert BENCH.summarise(only, {"tsp_construct": "minimize"})[1] == []


def test_noise_only_arm_is_the_es_config_with_alpha_0_and_is_compared_with_es():
    """eoh_es_noise: configs/ahd/eoh_es/<problem>.yaml with evolvers.es.alpha=0 (no config file of its own), the same
    budget and ES generations as eoh_es; the table compares eoh_es with it, outside the paper's win count."""
    import argparse

    args = argparse.Namespace(
        model="tiny:micro", max_samples=16, set=[], ahd_set=[], seed_heuristic=False, population_size=2, sizes={}
    )
    path, sets = BENCH.run_settings("tsp_construct", "eoh_es_noise", 7, args)
    es_path, es_sets = BENCH.run_settings("tsp_construct", "eoh_es", 7, args)
    assert path == es_path and path.parent.name == "eoh_es"
    assert sets == ["evolvers.es.alpha=0", *es_sets]
    results = [_result("eoh_es", 1, 6.4), _result("eoh_es_noise", 1, 6.6), _result("eoh", 1, 6.9)]
    settings = BENCH.summarise(results, {"tsp_construct": "minimize"})[1]
    pairs = {(s["variant"], s["baseline"]): s["win"] for s in settings}
    assert pairs == {("eoh_es", "eoh"): True, ("eoh_es", "eoh_es_noise"): True, ("eoh_es_noise", "eoh"): True}


def test_plot_draws_every_run_against_the_seed_heuristic(tmp_path):
    # seeds 1-2 of eoh and eoh_es, one run without a valid heuristic and one cut by the wall-clock stop
    results = [
        _result("eoh", 1, 6.9),
        _result("eoh", 2, None),
        _result("eoh_es", 1, 6.4),
        _result("eoh_es", 2, 6.0, samples=14, stop="wall-clock budget reached (767/660 s)"),
    ]
    png = BENCH.plot(results, {"tsp_construct": "minimize"}, tmp_path / "plots" / "cmp.png")
    assert png == tmp_path / "plots" / "cmp.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    # no held-out rows (every run interrupted before its evaluation): nothing to draw, no file
    bare = [BENCH.RunResult("tsp_construct", "eoh", 1, 16, 3, 0, 1.0, "interrupted")]
    assert BENCH.plot(bare, {"tsp_construct": "minimize"}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_grid_runs_writes_tables_then_skips_finished_and_resumes_interrupted(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "cmp"
    argv = [
        "--problems",
        "tsp_construct",
        "--methods",
        "eoh,eoh_es",
        "--seeds",
        "7",
        "--max-samples",
        "16",
        "--population-size",
        "2",
        "--sizes",
        "tsp_construct=8",
        "--ahd-set",
        "train_size=8",
        "--ahd-set",
        "train_count=2",
        "--ahd-set",
        "test_count=2",
        "--ahd-set",
        "eval_timeout_s=20",
        "--set",
        "sampling.max_new_tokens=4",
        "--set",
        "model.dtype=float32",
        "--model",
        str(tiny_model_dir),
        "--seed-heuristic",
        "--out",
        str(out),
    ]
    assert BENCH.main(argv) == 0
    first = capsys.readouterr()
    results = {
        m: json.loads((out / "tsp_construct" / m / "seed7" / "result.json").read_text()) for m in ("eoh", "eoh_es")
    }
    # matched budgets; N = 2 leaves room for 2 ES generations (init 4, ES 4, EoH 4, ES 4 = 16 samples)
    assert all(r["max_samples"] == 16 and r["samples"] <= 16 for r in results.values())
    assert "evolvers.eoh.population_size=2" in results["eoh"]["settings"]
    assert "evolvers.es.total_generations=2" in results["eoh_es"]["settings"]
    assert all(r["heldout_s"] > 0 and set(r["rows"]) == {"8"} for r in results.values())
    # the seed heuristic is in the population: the best heuristic is valid and never worse than the seed
    for r in results.values():
        row = r["rows"]["8"]
        assert row["best_objective"] is not None and row["best_objective"] <= row["seed_objective"] + 1e-12
    table = (out / "table.md").read_text()
    assert (out / "ahd_compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert table in first.out and "| tsp_construct | 8 | eoh | 1/1 |" in table and "| eoh_es |" in table
    assert "ES variant beats its matched baseline in" in table
    records = [json.loads(line) for line in (out / "table.jsonl").read_text().splitlines()]
    assert [r["method"] for r in records if r["type"] == "row"] == ["eoh", "eoh_es"]
    (setting,) = [r for r in records if r["type"] == "setting"]
    assert (setting["variant"], setting["baseline"], setting["size"]) == ("eoh_es", "eoh", 8)
    assert {"ahd_es_wins", "ahd_matched_budgets", "ahd_heldout_eval_s"} <= {
        r["metric"] for r in records if r["type"] == "metric"
    }

    # the same command again: both runs finished, nothing is rerun, the same table comes out
    assert BENCH.main(argv) == 0
    again = capsys.readouterr()
    assert again.err.count("finished before, skipped") == 2
    assert (out / "table.md").read_text() == table

    # an interrupted run (its folder holds a run but no result.json) is resumed, not restarted
    (out / "tsp_construct" / "eoh_es" / "seed7" / "result.json").unlink()
    assert BENCH.main(argv) == 0
    resumed = capsys.readouterr()
    assert "eoh seed 7: finished before, skipped" in resumed.err
    assert "eoh_es seed 7: resuming the interrupted run" in resumed.err
    redo = json.loads((out / "tsp_construct" / "eoh_es" / "seed7" / "result.json").read_text())
    assert redo["rows"] == results["eoh_es"]["rows"] and redo["samples"] == results["eoh_es"]["samples"]

    # other settings in the same folder are refused
    assert BENCH.main([*argv[:-2], "--out", str(out), "--max-samples", "20"]) == 2
    assert "holds a run of other settings" in capsys.readouterr().err

    # a run folder another process is working on (its run.lock held): one line, exit 2, no traceback
    from coevo.lock import RunLock

    seed_dir = out / "tsp_construct" / "eoh" / "seed7"
    (seed_dir / "result.json").unlink()  # so the benchmark resumes that run
    lock = RunLock(seed_dir).acquire()
    try:
        assert BENCH.main(argv) == 2
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert "ahd_compare: " in err and "is in use by process" in err and "Traceback" not in err


def test_tune_arm_reuses_the_finished_run_and_spends_no_samples(tmp_path, tiny_model_dir, capsys):
    """``--tune``: an ``eoh+tune`` arm per run, from the run's own elites (the tiny model writes no valid heuristic,
    so the elites are the seed heuristic, which has no constants: tune records that and changes nothing)."""
    out = tmp_path / "cmp"
    argv = ["--problems", "tsp_construct", "--methods", "eoh", "--seeds", "7", "--max-samples", "4"]
    argv += ["--population-size", "2", "--sizes", "tsp_construct=8", "--ahd-set", "train_size=8"]
    argv += ["--ahd-set", "train_count=2", "--ahd-set", "test_count=2", "--set", "sampling.max_new_tokens=4"]
    argv += ["--set", "model.dtype=float32", "--model", str(tiny_model_dir), "--seed-heuristic", "--tune"]
    argv += ["--out", str(out)]
    assert BENCH.main(argv) == 0
    base = json.loads((out / "tsp_construct" / "eoh" / "seed7" / "result.json").read_text())
    tuned = json.loads((out / "tsp_construct" / "eoh+tune" / "seed7" / "result.json").read_text())
    assert (
        tuned["samples"] == base["samples"]
        and tuned["rows"]["8"]["best_objective"] == base["rows"]["8"]["best_objective"]
    )
    assert "then tune: 0 evaluations, 0 of 1 elites improved" in tuned["stop_reason"]
    table = (out / "table.md").read_text()
    assert "| eoh+tune |" in table and "tune arm beats the same run without tune in 0 of 1 settings" in table
    records = [json.loads(line) for line in (out / "table.jsonl").read_text().splitlines()]
    assert ("eoh+tune", "eoh") in {(r["variant"], r["baseline"]) for r in records if r["type"] == "setting"}
    # a second call skips both finished arms
    capsys.readouterr()
    assert BENCH.main(argv) == 0
    assert capsys.readouterr().err.count("finished before, skipped") == 2


@pytest.mark.parametrize(
    ("method", "settings"),
    [("hillclimb", ["batch=2"]), ("reevo", ["init_population_size=2", "population_size=2"])],
)
def test_the_hillclimb_and_reevo_arms_run_from_their_shipped_configs(
    method, settings, tmp_path, tiny_model_dir, capsys
):
    """``--methods hillclimb`` / ``--methods reevo``: configs/ahd/<method>/<problem>.yaml at the shared budget, with
    the method's own ``--ahd-set`` ``settings`` recorded. The hillclimb incumbent starts at the seed heuristic; the
    tiny random model's answers are garbage, so reevo can draw no pair and each iteration mutates the seed elitist:
    either way the best is never worse than the seed."""
    out = tmp_path / "cmp"
    argv = ["--problems", "tsp_construct", "--methods", method, "--seeds", "7", "--max-samples", "4"]
    argv += ["--sizes", "tsp_construct=8", "--ahd-set", "train_size=8", "--ahd-set", "train_count=2"]
    argv += ["--ahd-set", "test_count=2", *[a for s in settings for a in ("--ahd-set", s)]]
    argv += ["--set", "sampling.max_new_tokens=4", "--set", "model.dtype=float32", "--model", str(tiny_model_dir)]
    argv += ["--out", str(out)]
    assert BENCH.main(argv) == 0
    result = json.loads((out / "tsp_construct" / method / "seed7" / "result.json").read_text())
    assert result["samples"] == 4 and f"evolvers.{method}.{settings[0]}" in result["settings"]
    row = result["rows"]["8"]
    assert row["best_objective"] is not None and row["best_objective"] <= row["seed_objective"] + 1e-12
    assert f"| tsp_construct | 8 | {method} | 1/1 |" in capsys.readouterr().out

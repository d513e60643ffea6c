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

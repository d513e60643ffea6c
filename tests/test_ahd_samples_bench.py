"""benchmarks/ahd_samples.py: runs arms resumably and reads what each run's store says about its samples.

Two real runs: the benchmark's own grid on the tiny random Qwen2 (the point is the flow: runs made, reused on a
second call, summarised; its samples are garbage), and a run of EoH + tune with ``ScriptedPolicy`` (test_eoh: a
test double for the model's outputs only, so the counts are known) whose folder the benchmark summarises
(real sandbox, real store, real tune).
"""

from __future__ import annotations

import json

import pytest
from support import load_script
from test_eoh import (
    FARTHEST,
    FIRST_INDEX,
    NN_SAME_OBJECTIVE,
    RETURNS_FLOAT,
    SMALL,
    TOWARD_HOME,
    ScriptedPolicy,
    make_loop,
    reply,
)

from coevo.store import TrajectoryStore

pytestmark = pytest.mark.usefixtures("private_cache")

SCRIPT = [
    reply("farthest", FARTHEST),
    reply("nearest with min()", NN_SAME_OBJECTIVE),  # the seed's objectives: valid, not novel
    reply("a fraction", RETURNS_FLOAT),  # repaired by the next reply
    reply("toward home", TOWARD_HOME),
    reply("index order, fixed", FIRST_INDEX),  # the repair
    reply("toward home, more", TOWARD_HOME.replace("0.3", "0.2")),  # the m1 child of round 1
]


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/ahd_samples.py", "ahd_samples")


def test_summary_of_a_scripted_run_counts_samples_children_repairs_and_splits_the_gain(tmp_path, bench):
    data = {
        "run": {"name": "s", "seed": 2},
        "budget": {"max_rounds": 2},
        "evolvers": [
            {
                "name": "eoh",
                "type": "eoh",
                **SMALL,
                "population_size": 2,
                "include_seed_heuristic": True,
                "repair": True,
                "operators": {"m1": 1.0},
                "offspring_per_operator": 1,
            },
            {"name": "tune", "type": "tune", "evolver": "eoh", "elites": 1, "population_size": 4, "generations": 2},
        ],
        "report": {"plots": False},
    }
    policy = ScriptedPolicy(script=SCRIPT)
    make_loop(tmp_path, data, lambda: policy).run()
    run = tmp_path / "run"
    assert policy.calls == 6
    out = tmp_path / "summary"
    assert bench.main(["--summarise", str(run), "--out", str(out)]) == 0
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    (row,) = [x for x in lines if x["type"] == "run"]
    assert row["arm"] == "s" and row["problem"] == "tsp_construct" and row["llm_calls"] == 6
    with TrajectoryStore(run / "store.sqlite", readonly=True) as store:
        trajs = {t.key.split("/", 1)[1]: t for t in store.query(run_id="run")}
    init = [trajs[f"eoh/0/init0/i1/{j}"].failure for j in range(4)]
    assert init == [None, "behavioural_duplicate", "return_type", None]
    assert trajs["eoh/0/init0/i1/2/repair"].valid
    child = trajs["eoh/1/g1/m1/0"]
    evaluated = 5 if child.meta.get("objective") is not None else 4
    assert row["valid"] == evaluated and row["valid_percent"] == pytest.approx(100 * evaluated / 6)
    # novel: farthest, toward home, its repair (and the child when it is new); not the seed's twin
    assert row["valid_novel"] == evaluated - 1 - (child.failure == "behavioural_duplicate")
    assert row["completion_tokens"] == 6 * 40 and row["tokens_per_valid"] == pytest.approx(240 / evaluated)
    assert row["repairs"] == 1 and row["repairs_valid"] == 1 and row["repairs_repeating_failure"] == 0
    assert row["repairs_valid_novel"] == 1 and row["repair_completion_tokens"] == 40
    better = child.meta.get("objective") is not None and child.meta["objective"] < child.meta["parent_objective"]
    assert row["children"] == (1 if evaluated == 5 else 0) + 1  # the repair is an LLM child of its i1's parents
    assert row["children_better_than_parent"] == int(better)
    assert row["seed_id"] == "seed" and row["failures"]["return_type"] == 1
    # the gain of the best over the seed, split along its provenance
    g = row["gain"]
    assert g["llm"] + g["tune"] + g["start"] == pytest.approx(g["total"])
    assert g["total"] == pytest.approx(row["seed_objective"] - row["best_objective"])
    assert g["path"][0] == row["best_id"] and (g["path"][-1] in ("seed",) or trajs[g["path"][-1]].meta["operator"])
    best = trajs.get(row["best_id"])
    if best is not None and best.meta["operator"] == "tune":
        assert g["tune"] > 0
    assert set(row["heldout"]) == {"8", "10"} and row["heldout"]["8"]["best_objective"] is not None
    (arm,) = [x for x in lines if x["type"] == "arm"]
    assert arm["valid_percent"] == pytest.approx(row["valid_percent"]) and arm["seeds"] == [2]
    metrics = {x["metric"]: x for x in lines if x["type"] == "metric"}
    assert metrics["samples_valid_percent/tsp_construct/s"]["met"] == (row["valid_percent"] >= 60)
    assert (out / "samples.md").read_text().startswith("| problem | arm |") and (out / "ahd_samples.png").is_file()
    # a second summary evaluates nothing on the held-out sets (cached)
    cache = json.loads((out / "heldout_cache.json").read_text())
    assert len(cache) == 1


def test_novelty_is_counted_from_the_store_against_the_problems_seed(tmp_path, bench):
    """A `sample` run (no seed heuristic in its search, so the sampler records nearest neighbour written with
    min() as valid): the benchmark still counts it as valid but not novel (the problem's seed heuristic has
    its objectives)."""
    data = {
        "run": {"name": "s", "seed": 2},
        "budget": {"max_rounds": 1},
        "evolvers": [{"name": "sample", "type": "sample", **SMALL, "batch": 4}],
        "report": {"plots": False},
    }
    script = [reply("min", NN_SAME_OBJECTIVE), reply("far", FARTHEST), "no code", reply("index", FIRST_INDEX)]
    make_loop(tmp_path, data, lambda: ScriptedPolicy(script=script)).run()
    assert bench.main(["--summarise", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if r["type"] == "run"]
    assert (row["llm_calls"], row["valid"], row["valid_novel"]) == (4, 3, 2)
    assert row["failures"] == {"valid": 3, "parse": 1} and row["seed_id"] == "seed"


def test_tiny_model_grid_runs_reuses_and_summarises(tmp_path, bench, capsys):
    argv = ["--problems", "tsp_construct", "--seeds", "1", "--arms", "eoh,eoh+repair", "--model", "tiny:micro"]
    argv += ["--max-samples", "4", "--ahd-set", "population_size=2", "--ahd-set", "train_count=2"]
    argv += ["--ahd-set", "test_count=2", "--ahd-set", "test_sizes=[10]", "--set", "sampling.max_new_tokens=8"]
    argv += ["--out", str(tmp_path / "grid")]
    assert bench.main(argv) == 0
    err = capsys.readouterr().err
    assert "tsp_construct eoh seed 1: 4 samples" in err and "tsp_construct eoh+repair seed 1: 4 samples" in err
    done = tmp_path / "grid" / "tsp_construct" / "eoh+repair" / "seed1" / "samples_run.json"
    assert "evolvers.eoh.repair=true" in json.loads(done.read_text())["settings"]
    assert bench.main(argv) == 0  # finished runs are reused, nothing runs again
    assert capsys.readouterr().err.count("finished before, reused") == 2
    rows = [json.loads(x) for x in (tmp_path / "grid" / "samples.jsonl").read_text().splitlines()]
    runs = [r for r in rows if r["type"] == "run"]
    assert sorted(r["arm"] for r in runs) == ["eoh", "eoh+repair"] and all(r["llm_calls"] == 4 for r in runs)
    # summarise mode over the grid's folder finds the same runs and arms
    assert bench.main(["--summarise", str(tmp_path / "grid"), "--out", str(tmp_path / "again")]) == 0
    again = [json.loads(x) for x in (tmp_path / "again" / "samples.jsonl").read_text().splitlines()]
    assert sorted(r["arm"] for r in again if r["type"] == "run") == ["eoh", "eoh+repair"]
    # a changed setting for the same folder is refused with one line
    assert bench.main([*argv[:-2], "--set", "sampling.max_new_tokens=9", "--out", str(tmp_path / "grid")]) == 2
    assert "holds a run of other settings" in capsys.readouterr().err


def test_bad_input_is_one_line(bench, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--arms", "nope", "--out", str(tmp_path)])
    assert e.value.code == 2 and "--arms: unknown arm 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--arm", "broken", "--out", str(tmp_path)])
    assert "--arm: expected NAME=FAMILY" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--summarise", str(tmp_path / "none"), "--out", str(tmp_path)])
    assert "--summarise: no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--max-samples", "0", "--out", str(tmp_path)])
    assert "--max-samples: must be >= 1" in capsys.readouterr().err

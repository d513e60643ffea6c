"""The constants evolver ``tune``: finding and rewriting literals, ES over them against the real sandbox on real
TSP instances, its population entry and provenance, its own evaluation budget, bad inputs, and the loop.

The only test double is ``ScriptedPolicy`` (from test_eoh): the model's replies. Evaluation runs in the real
sandbox; the store is a real SQLite file.
"""

from __future__ import annotations

import math

import pytest

from coevo.ahd.constants import find_constants, with_constants
from coevo.ahd.population import Individual
from coevo.config import ConfigError, parse_config
from coevo.evolvers.eoh import EoHConfig, EoHEvolver
from coevo.evolvers.tune import TuneConfig, TuneEvolver
from coevo.sandbox.extract import CandidateParseError
from tests.test_eoh import NN, SMALL, TOWARD_HOME, ScriptedPolicy, _ctx, make_loop, reply

pytestmark = pytest.mark.usefixtures("private_cache")

MANY = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix, depth=3):
    d = distance_matrix[current_node, unvisited_nodes]
    far = distance_matrix[destination_node, unvisited_nodes] ** 2
    top = np.argsort(d)[:5]
    for _ in range(4):
        pass
    w = np.sum(d, axis=0) * -0.25 + 1.5e-3
    flag = True
    score = d - 0.3 * far + w * 0.0 + 7 * np.zeros(len(d))[0]
    return int(unvisited_nodes[np.argmin(score)])
"""

# a heuristic that is honest at its constant and invalid (raises) or endless above 0.35
RAISES_ABOVE = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    w = 0.3
    if w > 0.35:
        raise ValueError("too far")
    score = distance_matrix[current_node, unvisited_nodes] - w * distance_matrix[destination_node, unvisited_nodes]
    return int(unvisited_nodes[np.argmin(score)])
"""
LOOPS_ABOVE = RAISES_ABOVE.replace('raise ValueError("too far")', "while True:\n            pass")


def test_constants_found_in_source_order_and_structural_ints_left_alone():
    consts = find_constants(MANY)
    # ** 2 (operand), -0.25 folded with its sign, 1.5e-3, 0.3, 7; never: depth=3 (signature default), [:5] (slice),
    # range(4), axis=0, 0.0, True, the [0] index
    assert [(c.value, c.kind) for c in consts] == [
        (2, "int"),
        (-0.25, "float"),
        (1.5e-3, "float"),
        (0.3, "float"),
        (7, "int"),
    ]
    assert [c.line for c in consts] == [5, 9, 9, 11, 11]
    assert find_constants(MANY, limit=2) == consts[:2]
    out = with_constants(MANY, [3.4, 0.5, 2e-3, -0.7, 6.6])
    assert [c.value for c in find_constants(out)] == [3, 0.5, 0.002, -0.7, 7]  # ints rounded, signs written back
    assert "depth=3" in out and "[:5]" in out and "range(4)" in out and "axis=0" in out
    compile(out, "<tuned>", "exec")
    with pytest.raises(ValueError, match="2 values for 1 constants"):
        with_constants(TOWARD_HOME, [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        with_constants(TOWARD_HOME, [math.nan])
    assert find_constants(NN) == []


def test_constants_of_hostile_code_are_refused_not_raised():
    deep = "def select_next_node(a, b, c, d):\n    return " + "(" * 3000 + "1" + ")" * 3000 + "\n"
    with pytest.raises(CandidateParseError, match="nested deeper"):
        find_constants(deep)
    chain = "def select_next_node(a, b, c, d):\n    return " + "-" * 3000 + "1\n"
    with pytest.raises(CandidateParseError):
        find_constants(chain)


def _setup(tmp_path, population, eoh_settings=None, **tune):
    ctx = _ctx(tmp_path)
    eoh = EoHEvolver("eoh", EoHConfig(**{**SMALL, "train_size": 20, "train_count": 3, **(eoh_settings or {})}), ctx)
    ctx.evolvers["eoh"] = eoh
    codes = [code for _, code in population]
    results = eoh.sampler.evaluate(codes)
    eoh.population = [
        Individual(name, name, code, r.objective, r.score, "i1") for (name, code), r in zip(population, results)
    ]
    ev = TuneEvolver("tune", TuneConfig(**{"generations": 3, "population_size": 4, **tune}), ctx)
    ctx.evolvers["tune"] = ev
    ev.setup()
    return ctx, eoh, ev


def test_tune_improves_an_elite_on_training_only_and_enters_the_population(tmp_path):
    ctx, eoh, ev = _setup(tmp_path, [("home", TOWARD_HOME), ("nn", NN)], elites=2)
    generated, evaluated = [], []
    real_generate, real_evaluate = eoh.problem.generate, eoh.sampler.evaluate
    eoh.problem.generate = lambda size, count, seed: (
        generated.append((size, count, seed)) or real_generate(size, count, seed)
    )
    eoh.sampler.evaluate = lambda codes, instances=None, **kw: (
        evaluated.append(instances) or real_evaluate(codes, instances, **kw)
    )
    before = {i.id: i.objective for i in eoh.population}
    report = ev.step(1)
    # held-out instances are never generated nor evaluated while tuning: only the (cached) training set is used
    assert generated == [] and evaluated and all(inst is None for inst in evaluated)
    recs = {r["parent"]: r for r in ev.tried.values()}
    assert recs["nn"]["status"] == "no_constants" and recs["nn"]["evaluations"] == 0
    home = recs["home"]
    assert home["evaluations"] == 3 * 4 + 1 == ev.evaluations == report.metrics["evaluations"]
    assert home["constants_before"] == [0.3]
    if home["status"] == "improved":
        assert home["objective_after"] < before["home"] and home["constants_after"] != [0.3]
        child = next(i for i in eoh.population if i.operator == "tune")
        assert child.parents == ["home"] and child.source == "tune" and child.objective == home["objective_after"]
        stored = ctx.cached(ctx.traj_key("tune", "r1", "home"))
        assert stored.llm_calls == 0 and stored.meta["constants_before"] == [0.3]
        assert stored.meta["constants_after"] == home["constants_after"] and stored.meta["evaluations"] == 13
        assert stored.meta["sampler"] == "eoh" and stored.task_id == eoh.sampler.train_tag
        assert eoh.best is not None and eoh.best.objective <= home["objective_after"]
    else:  # no better variant: nothing enters
        assert home["status"] == "no_gain" and all(i.operator != "tune" for i in eoh.population)
    assert ctx.budget.samples_used() == 0  # no LLM call, and nothing charged to the sample budget
    # each code is tuned once: a second step has nothing left to tune (the child is made by tune itself)
    again = ev.step(2)
    assert again.metrics["tuned"] == 0 and ev.evaluations == 13
    assert "home" in ev.report_markdown() and "no_constants" in ev.report_markdown()


def test_tune_finds_a_better_constant_than_the_llm_guess(tmp_path):
    """On TSP20 x 3 the home-pull weight 0.3 is not the best one: ES moves it and gains on training."""
    _, _, ev = _setup(tmp_path, [("home", TOWARD_HOME)], generations=6, population_size=8)
    ev.step(1)
    rec = next(iter(ev.tried.values()))
    assert rec["status"] == "improved", rec
    assert rec["objective_after"] < rec["objective_before"]


@pytest.mark.parametrize("code,kind", [(RAISES_ABOVE, "runtime"), (LOOPS_ABOVE, "timeout")])
def test_variants_that_fail_are_recorded_and_the_search_goes_on(tmp_path, code, kind):
    limits = {"eval_timeout_s": 2.0} if kind == "timeout" else {}
    _, _, ev = _setup(tmp_path, [("fragile", code)], limits, sigma=1.0, sigma_final=1.0, generations=1)
    ev.step(1)
    rec = next(iter(ev.tried.values()))
    assert rec["evaluations"] == 5 and rec["invalid"].get(kind, 0) >= 1, rec
    assert rec["status"] in ("improved", "no_gain")


def test_own_evaluation_budget(tmp_path):
    _, _, ev = _setup(tmp_path, [("home", TOWARD_HOME)], max_evaluations=5)
    ev.step(1)
    rec = next(iter(ev.tried.values()))
    assert rec["status"] == "budget" and ev.evaluations == 0 and "13" in rec["detail"]


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("population_size", 3, "even"),
        ("sigma", -1.0, "sigma"),
        ("sigma_final", 5.0, "sigma_final"),
        ("normalization", "softmax", "normalization"),
        ("schedule", "step", "kind"),
        ("evolver", "nope", "evolvers.tune.evolver"),
        ("max_constants", 0, "max_constants"),
    ],
)
def test_settings_out_of_range_name_the_field(field, value, match):
    data = {
        "evolvers": [{"name": "eoh", "type": "eoh", **SMALL}, {"name": "tune", "type": "tune", field: value}],
    }
    with pytest.raises(ConfigError, match=match) as err:
        parse_config(data)
    assert "\n" not in str(err.value).strip() or "tune" in str(err.value)


def test_tune_in_the_loop_after_eoh(tmp_path):
    script = [reply("Nearest city, but prefer cities near home.", TOWARD_HOME)] + [reply("Nearest.", NN)] * 3
    data = {
        "run": {"name": "t", "seed": 1},
        "budget": {"max_samples": 4, "max_rounds": 2},
        "evolvers": [
            {"name": "eoh", "type": "eoh", **SMALL, "population_size": 2, "operators": {"m1": 1.0}},
            {"name": "tune", "type": "tune", "generations": 2, "population_size": 4},
        ],
        "schedule": [{"evolver": "eoh", "every": 1}, {"evolver": "tune", "every": 1}],
    }
    policy = ScriptedPolicy(script)
    loop = make_loop(tmp_path, data, policy_factory=lambda: policy)
    loop.run()
    tune = loop.evolvers["tune"]
    assert tune.evaluations == 9 and any(r["parent"] for r in tune.tried.values())
    report = (loop.run_dir / "report.md").read_text()
    assert "Constants tuning" in report

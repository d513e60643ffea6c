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
from coevo.evolvers.tune import TUNED_MARK, TuneConfig, TuneEvolver, tuned_thought
from coevo.report.ahd import published_seed_lines
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
    # held-out instances are never generated nor evaluated while tuning: tune uses the (cached) training set;
    # the only other instances are the validation ones a new best must pass (their own seed, not the held-out)
    assert all(seed == eoh.validation_seed != eoh.test_seed for _, _, seed in generated)
    validation_sets = [eoh._validation_sets[size] for size, _, _ in generated]
    assert evaluated and all(inst is None or any(inst is v for v in validation_sets) for inst in evaluated)
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
    # the check of the term weight on `w * distance...` at 1.0, 4 variants, the final centre
    assert rec["evaluations"] == 1 + 4 + 1 and rec["invalid"].get(kind, 0) >= 1, rec
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


# no literal at all: nearest neighbour plus the distance back home, unweighted (worse than nearest neighbour)
SUM_NO_LITERALS = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    score = distance_matrix[current_node, unvisited_nodes] + distance_matrix[destination_node, unvisited_nodes]
    return int(unvisited_nodes[np.argmin(score)])
"""
# one weightable term is an int index (a weight 1.0 makes it a float and the heuristic raises): it is dropped
SUM_WITH_INDEX = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    score = distance_matrix[current_node, unvisited_nodes] + distance_matrix[destination_node, unvisited_nodes]
    shift = len(unvisited_nodes) - len(unvisited_nodes)
    pos = np.argmin(score) + shift
    return int(unvisited_nodes[pos])
"""


def test_term_weights_go_on_additive_terms_only():
    from coevo.ahd.constants import lift_term_weights

    code = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    d = distance_matrix[current_node, unvisited_nodes]
    h = distance_matrix[destination_node, unvisited_nodes]
    m = np.mean(distance_matrix[unvisited_nodes][:, unvisited_nodes], axis=1)
    i = len(d) - 1
    j = unvisited_nodes[i + current_node - 1]
    for k in range(i + j):
        pass
    name = "a" + "b"
    score = d + h - m + 0.5 * h - 2
    return int(unvisited_nodes[np.argmin(score)])
"""
    lifted, n = lift_term_weights(code)
    # d + h - m: h and m get weights; 0.5 * h is weighted already; "- 2", "len(d) - 1", the index and range() sums,
    # and the string sum are left alone
    assert n == 2 and "d + 1.0 * h - 1.0 * m + 0.5 * h - 2" in lifted
    assert "i + current_node - 1]" in lifted and "range(i + j)" in lifted and "'a' + 'b'" in lifted
    assert [c.value for c in find_constants(lifted)] == [1.0, 1.0, 0.5, 2]
    assert lift_term_weights(code, select=[1])[0].count("1.0 *") == 1
    assert lift_term_weights(NN) == (with_constants(NN, []), 0)
    # the weighted code computes what the code did
    ns_a, ns_b = {}, {}
    exec(compile(code, "<a>", "exec"), ns_a)  # noqa: S102 (the test's own code)
    exec(compile(lifted, "<b>", "exec"), ns_b)  # noqa: S102
    import numpy as np

    dist = np.random.default_rng(0).random((9, 9))
    unv = np.arange(1, 9)
    assert ns_a["select_next_node"](0, 0, unv, dist) == ns_b["select_next_node"](0, 0, unv, dist)


def test_tune_weights_a_heuristic_that_has_no_literal(tmp_path):
    """An elite without a numeric literal gets a term weight (checked at 1.0), and ES re-balances it: on the
    training set the unweighted pull toward home is worse than a tuned one."""
    _, eoh, ev = _setup(tmp_path, [("sum", SUM_NO_LITERALS)], generations=6, population_size=8)
    ev.step(1)
    rec = next(iter(ev.tried.values()))
    assert rec["term_weights"] == [1, 1] and rec["constants_before"] == [1.0]
    assert "| 1 (1 of 1 term weights) |" in ev.report_markdown()
    assert rec["evaluations"] == 1 + 6 * 8 + 1  # the check at 1.0, the ES generations, the final centre
    assert rec["status"] == "improved", rec
    assert rec["objective_after"] < rec["objective_before"] and rec["constants_after"] != [1.0]
    child = next(i for i in eoh.population if i.operator == "tune")
    assert "1.0 * distance_matrix" not in child.code and "* distance_matrix[destination_node" in child.code


def test_term_weight_that_changes_the_heuristic_is_dropped(tmp_path):
    _, _, ev = _setup(tmp_path, [("idx", SUM_WITH_INDEX)], generations=1, population_size=2)
    ev.step(1)
    rec = next(iter(ev.tried.values()))
    # three terms: the feature sum keeps its weight, the two sums that make an index do not (the check of all
    # weights at 1.0 failed, then each weight alone: 1 + 3 evaluations; then 2 variants and the final centre)
    assert rec["term_weights"] == [1, 3], rec
    assert rec["evaluations"] == 1 + 3 + 2 + 1
    assert rec["constants_before"] == [1.0]


def test_term_weights_off(tmp_path):
    _, _, ev = _setup(tmp_path, [("sum", SUM_NO_LITERALS)], term_weights=False)
    ev.step(1)
    rec = next(iter(ev.tried.values()))
    assert rec["status"] == "no_constants" and rec["evaluations"] == 0 and "term_weights" not in rec


def test_published_seed_heuristic_starts_the_population_and_tune_searches_it(tmp_path):
    """``seed_heuristics: [eoh_ael]``: EoH's published heuristic (ReEvo's seed function) enters the initial
    population beside nearest neighbour, evaluated on the training set; tune then searches its constants."""
    ctx = _ctx(tmp_path)
    cfg = EoHConfig(
        **{**SMALL, "train_size": 20, "train_count": 3, "include_seed_heuristic": True, "seed_heuristics": ["eoh_ael"]}
    )
    eoh = EoHEvolver("eoh", cfg, ctx)
    eoh.add_seed_heuristics()
    ids = sorted(i.id for i in eoh.population)
    assert ids == ["seed", "seed:eoh_ael"]
    ael = next(i for i in eoh.population if i.id == "seed:eoh_ael")
    assert ael.operator == "seed" and ael.objective is not None and "threshold = 0.7" in ael.code
    ctx.evolvers["eoh"] = eoh
    ev = TuneEvolver("tune", TuneConfig(generations=2, population_size=4, elites=2), ctx)
    ctx.evolvers["tune"] = ev
    ev.setup()
    ev.step(0)
    rec = next(r for r in ev.tried.values() if r["parent"] == "seed:eoh_ael")
    eoh.publish_best()
    lines = "\n".join(published_seed_lines(eoh))
    assert "| published seed | size | seed objective | best objective | best beats it |" in lines
    assert lines.count("| eoh_ael |") == len(eoh.test_sizes()) == 2
    assert rec["constants_before"] == [0.7, 0.4, 0.3, 0.2, 0.1] and rec["status"] in ("improved", "no_gain")


def test_unknown_published_seed_names_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"seed_heuristics: .*'nope' \(published: eoh_ael\)"):
        EoHConfig(**{**SMALL, "seed_heuristics": ["nope"]})  # the config says it, before any model loads
    unchecked = EoHConfig.model_construct(**{**EoHConfig(**SMALL).model_dump(), "seed_heuristics": ["nope"]})
    with pytest.raises(ConfigError, match=r"evolvers.eoh.seed_heuristics: .*'nope' \(published: eoh_ael\)"):
        EoHEvolver("eoh", unchecked, _ctx(tmp_path))  # and the evolver, for a config built without validation


#: better than nearest neighbour on TSP8 training instances (it is TOWARD_HOME), infeasible once 9+ nodes are left
HIDDEN_BRANCH = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    if len(unvisited_nodes) > 8:
        return current_node
    score = distance_matrix[current_node, unvisited_nodes] - 0.3 * distance_matrix[destination_node, unvisited_nodes]
    return int(unvisited_nodes[np.argmin(score)])
"""


def _individual(eoh, ident, code):
    res = eoh.sampler.evaluate([code], eoh.train_instances)[0]
    assert res.valid
    return Individual(id=ident, thought="", code=code, objective=res.objective, reward=res.score, operator="e1")


@pytest.mark.parametrize("validation_count", [2, 0])
def test_best_must_be_valid_on_validation_instances(tmp_path, validation_count):
    """A heuristic better on the training set (TSP8) but infeasible on larger instances is not the best: the
    next valid one is, and the report names the rejected one and why; validation_count 0 turns the check off.
    The validation instances are neither training nor held-out instances (their own seed)."""
    ctx = _ctx(tmp_path)
    eoh = EoHEvolver("eoh", EoHConfig(**{**SMALL, "validation_count": validation_count}), ctx)
    hidden, toward = _individual(eoh, "hidden", HIDDEN_BRANCH), _individual(eoh, "toward", TOWARD_HOME)
    nn = _individual(eoh, "nn", NN)
    assert hidden.reward == toward.reward > nn.reward  # the branch never runs on the training set
    eoh.population = [hidden, nn]
    assert eoh.publish_best()
    assert eoh.validation_seed not in (eoh.test_seed, eoh.train_seed)
    if validation_count == 0:
        assert eoh.best.id == "hidden" and not eoh.rejected_best
        return
    assert eoh.best.id == "nn"
    assert [r["id"] for r in eoh.rejected_best] == ["hidden"] and "n=10: infeasible" in eoh.rejected_best[0]["reason"]
    report = eoh.report_markdown()
    assert "invalid on the validation instances" in report and "| hidden |" in report
    eoh.population.append(toward)  # a valid heuristic with the same training objective now wins
    assert eoh.publish_best() and eoh.best.id == "toward"
    assert len(eoh.rejected_best) == 1  # evaluated once per code
    state = eoh.state_dict()
    eoh2 = EoHEvolver("eoh", EoHConfig(**{**SMALL, "validation_count": validation_count}), ctx)
    eoh2.load_state_dict(state)
    assert eoh2.rejected_best == eoh.rejected_best and eoh2.validation == eoh.validation


def test_a_tuned_thought_names_the_changed_constants_once():
    """A tuned heuristic's thought names numbers from before tuning; the note says what changed. A child of a
    tuned parent often copies the parent's thought, note included: tuning it again replaces the note (a main
    job's report showed '... (constants tuned by ES) (constants tuned by ES)' under a thought whose 0.7 was 1.018
    in the code)."""
    thought = "go to the nearest node unless every score is above the threshold 0.7"
    once = tuned_thought(thought, [0.7, 0.4], [1.01837, 0.4])
    assert once == f"{thought} {TUNED_MARK}: 0.7 -> 1.018)"
    twice = tuned_thought(once + " (constants tuned by ES)", [1.018, 0.4], [0.9, 0.35])
    assert twice == f"{thought} {TUNED_MARK}: 1.018 -> 0.9, 0.4 -> 0.35)" and twice.count(TUNED_MARK) == 1
    assert tuned_thought("", [1.0], [1.0]) == f"{TUNED_MARK})"


def test_a_stop_request_ends_the_tune_step_without_keeping_a_shortened_search(tmp_path):
    """SIGINT while `tune` runs: the step used to stop its ES early and keep the shortened search as done (40
    evaluations where the uninterrupted step makes 65), so a resumed run differed from an uninterrupted one. Now
    the step raises RunInterrupted at its next generation and re-runs whole on resume (the loop keeps nothing
    of an interrupted step); the same step, uninterrupted, ends as before."""
    from coevo.errors import RunInterrupted

    ctx, eoh, ev = _setup(tmp_path, [("home", TOWARD_HOME)], elites=1)
    real_evaluate = eoh.sampler.evaluate
    calls = []

    def evaluate(codes, instances=None, **kw):
        calls.append(len(codes))
        if len(calls) == 2:  # during the search's first generation: the signal handler's request
            ctx.request_stop("interrupted by SIGINT", 2)
        return real_evaluate(codes, instances, **kw)

    eoh.sampler.evaluate = evaluate
    with pytest.raises(RunInterrupted):
        ev.step(1)
    assert len(calls) == 2  # it stopped at the next generation, not after the whole search

    _, _, whole = _setup(tmp_path / "again", [("home", TOWARD_HOME)], elites=1)
    assert whole.step(1).metrics["evaluations"] == 3 * 4 + 1

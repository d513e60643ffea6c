"""Samples that count: the normalised code fingerprint, behavioural duplicates, one repair per failed sample and
the noise-only ES control (alpha 0).

The scripted policies are test doubles for the model's *outputs only* (``ScriptedPolicy`` of test_eoh: a real
``Policy``; ``ScriptedTinyQwen`` of test_ahd_coevo: the real tiny Qwen2 weights, which ES perturbs, with
fixed replies): the point of these tests is the flow (what is repaired, recorded, counted, reused on resume), so
the replies must be known. Code extraction, sandboxed evaluation on real TSP instances, the SQLite store, ES and
the loop run for real. The noise-only control runs the real tiny random Qwen2.
"""

from __future__ import annotations

import pytest
from test_ahd_coevo import GARBAGE, SECOND_NEAREST, SYNTAX, ScriptedTinyQwen, es_children, make_loop, shipped
from test_ahd_coevo import reply as code_reply
from test_eoh import (
    FARTHEST,
    FIRST_INDEX,
    NN,
    NN_SAME_OBJECTIVE,
    RETURNS_FLOAT,
    SMALL,
    TOWARD_HOME,
    ScriptedPolicy,
    _ctx,
    reply,
)
from test_es_evolver import history, run_loop
from test_es_lowrank_evolver import lowrank_config

from coevo.ahd.population import code_key, normalised_code
from coevo.cli import main as coevo_main
from coevo.config import ConfigError, parse_config
from coevo.evolvers.eoh import EoHConfig, EoHEvolver
from coevo.store import TrajectoryStore

pytestmark = pytest.mark.usefixtures("private_cache")

NN_RENAMED = '''import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    """Nearest city."""
    dists = distance_matrix[current_node, unvisited_nodes]  # distances from here
    pick = np.argmin(dists)
    return int(unvisited_nodes[pick])
'''
NN_LOCALS = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    d = distance_matrix[current_node, unvisited_nodes]
    i = np.argmin(d)
    return int(unvisited_nodes[i])
"""
DIVIDES_BY_ZERO = """def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    scale = 0
    return int(unvisited_nodes[int(1 / scale)])
"""


def test_code_key_ignores_local_names_but_not_parameters_or_structure():
    """The fingerprint: formatting, comments, docstrings and local variable names (renamed in order of
    appearance) do not count; parameters, module names, attributes and the order of uses do."""
    assert code_key(NN_RENAMED) == code_key(NN_LOCALS)
    assert "_l0 = distance_matrix[current_node, unvisited_nodes]" in normalised_code(NN_LOCALS)
    swapped = NN_LOCALS.replace("i = np.argmin(d)", "i = np.argmin(d)\n    d = i")  # one more statement
    assert code_key(swapped) != code_key(NN_LOCALS)
    params = NN_LOCALS.replace("distance_matrix[current_node,", "distance_matrix[destination_node,")
    assert code_key(params) != code_key(NN_LOCALS)  # another parameter read: another heuristic
    assert code_key(NN_LOCALS.replace("np.argmin", "np.argmax")) != code_key(NN_LOCALS)
    # the comprehension variable and a name that shadows a module are locals too; globals stay
    a = "import math\ndef f(x):\n    y = [v * 2 for v in x]\n    return math.fsum(y)\n"
    b = "import math\ndef f(x):\n    out = [w * 2 for w in x]\n    return math.fsum(out)\n"
    assert code_key(a) == code_key(b) and "math.fsum(_l0)" in normalised_code(a)
    assert code_key("def f(:\n  pass") == code_key("def f(:\n    pass  ")  # unparsable: stripped lines


def test_behavioural_duplicates_are_recorded_after_evaluation(tmp_path):
    """A valid sample whose per-instance training objectives equal the seed's (other code) or an earlier
    sample's is recorded as `behavioural_duplicate`, objective kept, no reward; a later sampler on the same
    store (a resumed run, the seed not re-added) still knows the seed's behaviour and the recorded ones."""
    script = [reply("nearest with min()", NN_SAME_OBJECTIVE), reply("toward home", TOWARD_HOME)]
    script += [reply("toward home, renamed", TOWARD_HOME.replace("score", "s")), reply("farthest", FARTHEST)]
    policy = ScriptedPolicy(script=script)
    ctx = _ctx(tmp_path, policy=policy)
    eoh = EoHEvolver("eoh", EoHConfig(**SMALL, population_size=2, include_seed_heuristic=True), ctx)
    eoh.step(0)
    trajs = ctx.store.query(run_id="r")
    assert [t.failure for t in trajs] == ["behavioural_duplicate", None, "duplicate", None]
    same = trajs[0]
    assert same.meta["same_behaviour_as"] == "seed" and same.reward is None and not same.valid
    assert same.meta["metrics"]["objectives"] and "same objective on every training instance as seed" in (
        same.failure_detail
    )
    seed = next(i for i in eoh.population if i.id == "seed")
    assert same.meta["objective"] == seed.objective
    # a fresh evolver on the same store (as after a restart): the population holds the seed, whose behaviour
    # this sampler has not seen; the recorded TOWARD_HOME is folded from the store
    again = EoHEvolver("eoh", EoHConfig(**SMALL, population_size=2), ctx)
    again.population = list(eoh.population)
    policy.script, policy.calls = [reply("nearest, again", NN), reply("toward home with a copy", TOWARD_HOME + "\n")], 0
    jobs = [again.sampler.job("i1", key=f"r/x/{j}", seed=j) for j in range(2)]
    kids = again.sampler.sample(jobs, round_index=1, generation=1, existing=again.population)
    assert [t.failure for t in kids] == ["behavioural_duplicate", "duplicate"]
    assert kids[0].meta["same_behaviour_as"] == "seed"
    # off: the same sample is valid
    off = EoHEvolver("eoh3", EoHConfig(**SMALL, population_size=2, reject_same_behaviour=False), ctx)
    off.population = list(eoh.population)
    policy.script, policy.calls = [reply("nearest", NN_SAME_OBJECTIVE)], 0
    assert off.sampler.sample([off.sampler.job("i1", key="r/y/0", seed=1)], round_index=1, generation=1)[0].valid


def test_repair_sends_each_failed_sample_back_once_with_its_error(tmp_path):
    """`repair`: the syntax, runtime and return-type failures of a batch go back to the model in one batched call
    (their conversation, their answer, the one-line error); each repair is a trajectory of its own (operator
    `repair`, key `<failed key>/repair`, the failed sample's parents and id), counted in the budget, returned
    after the sample it repairs; a repair that fails the same way is a recorded invalid sample and is not
    repaired again; parse failures and duplicates are not repaired; a re-run step reuses everything."""
    broken = "{A broken idea.}\n```python\ndef select_next_node(current_node:\n    return\n```\n"
    script = [reply("a fraction", RETURNS_FLOAT), "no code at all", broken, reply("divide", DIVIDES_BY_ZERO)]
    script += [reply("fixed: nearest in index order", FIRST_INDEX), broken, reply("fixed: farthest", FARTHEST)]
    policy = ScriptedPolicy(script=script)
    ctx = _ctx(tmp_path, policy=policy)
    cfg = EoHConfig(**SMALL, population_size=2, repair=True)
    eoh = EoHEvolver("eoh", cfg, ctx)
    rep = eoh.step(0)  # 4 i1 calls, then 3 repairs in one call
    assert policy.generate_calls == 2 and policy.calls == 7 and ctx.budget.samples_used() == 7 == rep.samples
    trajs = ctx.store.query(run_id="r")
    by_key = {t.key: t for t in trajs}
    assert [t.failure for t in trajs[:4]] == ["return_type", "parse", "syntax", "runtime"]
    repairs = [by_key[f"r/eoh/0/init0/i1/{j}/repair"] for j in (0, 2, 3)]
    assert [t.failure for t in repairs] == [None, "syntax", None]
    for j, t in zip((0, 2, 3), repairs):
        assert t.meta["operator"] == "repair" and t.meta["repair_of"] == f"eoh/0/init0/i1/{j}"
        assert t.meta["repaired_operator"] == "i1" and t.llm_calls == 1
        assert t.meta["repeats_failure"] == (j == 2)
        assert t.meta["repaired_failure"] == trajs[j].failure and t.meta["repaired_error"] in trajs[j].failure_detail
    # the repair prompt: the failed conversation, its answer as the assistant turn, then the error
    assert "InvalidReturn: select_next_node returned 0.5" in policy.prompts[4]
    assert "Fix this error" in policy.prompts[4] and "SyntaxError" in policy.prompts[5]
    obs = repairs[0].steps[0].observation
    assert obs.index("[assistant]") > obs.index("[user]") and script[0].strip() in obs
    # the sampler returns each repair right after its failed sample; valid repairs join the population
    assert {i.id for i in eoh.population} <= {"eoh/0/init0/i1/0/repair", "eoh/0/init0/i1/3/repair"}
    assert len(eoh.population) == 2
    # resume: the same step again makes no call
    again = EoHEvolver("eoh", cfg, ctx)
    again.step(0)
    assert policy.calls == 7

    # the budget cuts the repairs: 5 samples allow the 4 calls and one repair
    policy2 = ScriptedPolicy(script=script)
    ctx2 = _ctx(tmp_path / "b", max_samples=5, policy=policy2)
    EoHEvolver("eoh", cfg, ctx2).step(0)
    assert (
        ctx2.budget.samples_used() == 5 and [t.meta["operator"] for t in ctx2.store.query(run_id="r")][-1] == "repair"
    )
    # off by default
    assert EoHConfig(**SMALL).repair is False


def test_repair_under_low_rank_es_members_in_the_main_job(tmp_path, tiny_model_dir):
    """The main job (low-rank ES members writing EoH children in one population call) with `repair`: a child
    that failed is repaired under the same member's perturbation, in a second population call, recorded with
    that member; the repairs count in the budget; ES's history still replays."""
    init = [code_reply(NN), GARBAGE, code_reply(FARTHEST), SYNTAX]
    init += [code_reply(TOWARD_HOME), code_reply(RETURNS_FLOAT), code_reply(FIRST_INDEX), GARBAGE]
    init_repairs = [code_reply(TOWARD_HOME.replace("0.3", "0.9")), SYNTAX]
    es_g0 = [GARBAGE, GARBAGE, code_reply(RETURNS_FLOAT)] + [GARBAGE] * 5
    es_repair = [code_reply(SECOND_NEAREST)]
    policy = ScriptedTinyQwen(tiny_model_dir, init + init_repairs + es_g0 + es_repair + [GARBAGE])
    over = {
        "evolvers.eoh.repair": "true",
        "evolvers.eoh.parse_retries": 0,
        "evolvers.eoh.duplicate_retries": 0,
        "evolvers.tune.max_evaluations": 1,
        "budget.max_samples": 19,
    }
    loop = make_loop(tmp_path, "tsp_construct.yaml", shipped("eoh", str(tiny_model_dir), **over), policy)
    summary = loop.run()
    assert "sample budget reached (19/19" in summary.stop_reason and policy.calls == 19
    assert [n for n, _ in policy.batches] == [8, 2, 8, 1]
    assert policy.kinds == ["policy", "policy", "population", "population"]
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        trajs = store.query(run_id="run")
        assert len(trajs) == 19 == store.count_llm_calls("run")
        init_t = [t for t in trajs if t.meta.get("operator") == "i1"]
        assert init_t[0].failure == "behavioural_duplicate"  # NN: the seed heuristic's tours, other code
        assert init_t[0].meta["same_behaviour_as"] == "seed"
        hist = store.es_history("run", "es")
        kids = es_children(store, "run", hist)[0]
        failed = next(t for t in kids if t.failure == "return_type")
        fixed = store.get_by_key(f"{failed.key}/repair")
        assert fixed.valid and fixed.member == failed.member and fixed.space == "parameter"
        assert fixed.meta["repair_of"] == failed.key.split("/", 1)[1]
        assert fixed.meta["parent_ids"] == failed.meta["parent_ids"]
    assert coevo_main(["es", "replay", str(tmp_path / "run"), "--check"]) == 0


def test_noise_only_es_perturbs_but_never_updates_and_replays(tmp_path, tiny_model_dir, capsys):
    """alpha 0: the noise-only control. Members are perturbed (their rewards differ), no generation updates
    (history rows skipped, the weights' hash never moves) and `coevo es replay --check` passes."""
    run_dir = tmp_path / "run"
    data = lowrank_config(tiny_model_dir, alpha=0.0, total_generations=3, population_size=4, eval_every=0)
    _, summary = run_loop(run_dir, data)
    assert "ES completed its 3 generations" in summary.stop_reason
    rows = history(run_dir)
    assert len(rows) == 3 and all(r["skipped"] and r["alpha"] == 0.0 for r in rows)
    assert [r["sigma"] > 0 for r in rows] == [True, True, False]  # cosine to 0
    assert all(len(set(r["rewards"])) > 1 for r in rows[:2])  # the members really were perturbed
    assert len({r["weight_hash_before"] for r in rows} | {r["weight_hash_after"] for r in rows}) == 1
    assert coevo_main(["es", "replay", str(run_dir), "--check"]) == 0
    assert "check: OK" in capsys.readouterr().out
    report = (run_dir / "report.md").read_text()
    assert "skipped (alpha 0: noise only)" in report


def test_out_of_range_settings_name_the_field():
    with pytest.raises(ConfigError, match=r"evolvers\.eoh\.repair"):
        parse_config({"evolvers": [{"name": "eoh", "type": "eoh", "problem": "tsp_construct", "repair": "often"}]})
    with pytest.raises(ConfigError, match=r"evolvers\.es\.alpha"):
        parse_config({"evolvers": [{"name": "es", "type": "es", "alpha": -1.0}]})


def test_a_prefilled_call_gets_a_prefilled_repair():
    """A failed prefilled answer (the prefix included) replaces the opened assistant turn, and the repair's messages
    end with the same opening, so the repair is code-first too; a free-format call's repair stays free."""
    from coevo.ahd.answer import answer_prefix
    from coevo.ahd.problem import load_problem
    from coevo.ahd.prompts import build_messages, repair_messages

    spec = load_problem("tsp_construct").prompt_spec()
    prefix = answer_prefix(spec)
    failed = prefix + " nearest.\n    return 1 / 0\n```"
    msgs = repair_messages(build_messages("i1", spec, answer="prefill"), failed, "ZeroDivisionError", spec)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[2]["content"] == failed and msgs[-1]["content"] == prefix
    assert "ZeroDivisionError" in msgs[3]["content"] and "already started" in msgs[3]["content"]
    free = repair_messages(build_messages("i1", spec), failed, "ZeroDivisionError", spec)
    assert [m["role"] for m in free] == ["system", "user", "assistant", "user"]

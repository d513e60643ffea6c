"""EoH evolver: prompts, parent selection, survivors, budget, init retries, pooling, report and resume.

The "scripted" policy below is a test double for the *model only*: a real ``Policy`` subclass that answers
each call with the next of a fixed list of EoH-style replies (valid heuristics and garbage), so that the
rest of the pipeline (prompting, code extraction, sandboxed evaluation on real TSP instances, the SQLite
store, the loop, the report) runs for real with a known mix of valid and invalid samples. The failure
tests use the real tiny random Qwen2 model, whose output is garbage.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from coevo.ahd.answer import ANSWER_FAILURE_KINDS
from coevo.ahd.evaluate import evaluate_heuristic
from coevo.ahd.population import Individual, code_key, rank_weights, select_parents, survivors
from coevo.ahd.problem import load_problem
from coevo.ahd.prompts import OPERATORS, build_messages, parents_needed
from coevo.ahd.sampler import HeuristicSearch
from coevo.backends.base import Completion, Policy
from coevo.budget import Budget
from coevo.config import ConfigError, parse_config
from coevo.evolvers.base import RunContext
from coevo.evolvers.eoh import EoHConfig, EoHEvolver
from coevo.loop import CoEvolutionLoop, new_run_dir
from coevo.sandbox.extract import strip_docstrings
from coevo.store import TrajectoryStore
from coevo.types import ESMember

NN = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    return int(unvisited_nodes[np.argmin(distance_matrix[current_node, unvisited_nodes])])
"""
NN_SAME_OBJECTIVE = """def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    best = min(unvisited_nodes, key=lambda n: distance_matrix[current_node][n])
    return int(best)
"""
TOWARD_HOME = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    score = distance_matrix[current_node, unvisited_nodes] - 0.3 * distance_matrix[destination_node, unvisited_nodes]
    return int(unvisited_nodes[np.argmin(score)])
"""
FIRST_INDEX = """def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    return int(unvisited_nodes[0])
"""
FARTHEST = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    return int(unvisited_nodes[np.argmax(distance_matrix[current_node, unvisited_nodes])])
"""
RETURNS_FLOAT = """def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    return 0.5
"""


def reply(thought: str, code: str) -> str:
    return f"{{{thought}}}\n```python\n{code}```\n"


SCRIPT = [
    reply("Go to the nearest city.", NN),
    "I am sorry, I cannot write code today.",
    reply("Go to the nearest city.", NN),  # same code as the first: deduplicated by code hash
    reply("Nearest city written with min().", NN_SAME_OBJECTIVE),  # same objective as the first
    reply("Nearest city, but prefer cities near home.", TOWARD_HOME),
    reply("Visit cities in index order.", FIRST_INDEX),
    reply("Return a fraction.", RETURNS_FLOAT),  # invalid: return type
    reply("Go to the farthest city.", FARTHEST),
]


class ScriptedPolicy(Policy):
    """Test double for the model: returns SCRIPT replies in order (cycling) and logs every prompt."""

    model_id = "scripted"

    def __init__(self, script=SCRIPT):
        self.script = list(script)
        self.calls = 0
        self.prompts: list[str] = []
        self.generate_calls = 0

    def generate(self, conversations, params):
        self.generate_calls += 1
        self.params = params
        out = []
        for conv in conversations:
            self.prompts.append(conv[-1]["content"])
            out.append(Completion(text=self.script[self.calls % len(self.script)], completion_tokens=40))
            self.calls += 1
        return out


SMALL = {
    "problem": "tsp_construct",
    "train_size": 8,
    "train_count": 2,
    "train_seed": 2024,  # fixed: these tests rank heuristics on known instances (runs draw theirs, coevo.ahd.seeds)
    "test_seed": 1234,
    "test_sizes": [8, 10],
    "test_count": 2,
    "eval_timeout_s": 10,
    "eval_memory_mb": 1024,
    "eval_workers": 2,
}


pytestmark = pytest.mark.usefixtures("private_cache")


def _ctx(tmp_path, max_samples=None, policy=None):
    store = TrajectoryStore(tmp_path / "store.sqlite")
    return RunContext(
        run_id="r",
        run_dir=tmp_path,
        store=store,
        budget=Budget(store, "r", max_samples),
        policy_factory=(lambda: policy) if policy else None,
        seed=3,
    )


def make_loop(tmp_path, data, policy_factory=None):
    """A real CoEvolutionLoop over a fresh run folder ``tmp_path/run`` (run id "run")."""
    cfg = parse_config(data)
    return CoEvolutionLoop(
        cfg, new_run_dir(cfg, tmp_path / "run"), raw_config=data, progress=False, policy_factory=policy_factory
    )


def _ind(i, objective, code=None):
    return Individual(
        id=f"x{i}", thought=f"t{i}", code=code or f"def f():\n    return {i}\n", objective=objective, reward=-objective
    )


# ---------------------------------------------------------------------------------------------- prompts
def test_prompts_for_every_operator():
    spec = load_problem("tsp_construct").prompt_spec()
    parents = [_ind(0, 5.0, NN), _ind(1, 6.0, FARTHEST)]
    texts = {}
    for op in OPERATORS:
        n = parents_needed(op, 2)
        msgs = build_messages(op, spec, parents[:n])
        assert [m["role"] for m in msgs] == ["system", "user"]
        user = msgs[1]["content"]
        assert "select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix)" in user
        assert "braces" in user and "```python" in user
        assert all(p.code.strip() in user for p in parents[:n]) and (n == 2) == (FARTHEST.strip() in user)
        texts[op] = user
    assert len(set(texts.values())) == len(OPERATORS)  # every operator asks for something different
    with pytest.raises(ValueError, match="parents"):
        build_messages("m1", spec, parents)
    with pytest.raises(ValueError, match="unknown EoH operator"):
        build_messages("x9", spec)


def test_prompts_show_code_without_docstrings():
    """The template's docstring is described in prose, not shown in its code block, and parents' code is shown
    without docstrings and comments: the 0.5B model copied a shown docstring verbatim into ~130 of its 256
    tokens. The reply is asked to carry none either."""
    spec = load_problem("tsp_construct").prompt_spec()
    documented = (
        "import numpy as np\n\n\ndef select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        '    """Nearest neighbour, documented at length."""\n'
        "    # the closest unvisited node\n"
        "    return int(unvisited_nodes[np.argmin(distance_matrix[current_node][unvisited_nodes])])\n"
    )
    user = build_messages("m1", spec, [_ind(0, 7.0, documented)])[1]["content"]
    blocks = user.split("```python\n")[1:]
    assert len(blocks) == 2 and all('"""' not in b.split("```")[0] for b in blocks)
    assert "documented at length" not in user and "the closest unvisited node" not in user
    assert "np.argmin(distance_matrix[current_node][unvisited_nodes])" in blocks[1]
    assert "unvisited_nodes: np.ndarray (k,) int64" in user.split("```python")[0]  # the template's Args, in prose
    assert "Write no docstring and no comments" in user


# ------------------------------------------------------------------------------- selection, survivors
def test_parent_selection_follows_rank_weights():
    pop = [_ind(i, 1.0 + i) for i in range(4)]
    rng = random.Random(0)
    counts = Counter(select_parents(pop, 1, rng)[0].id for _ in range(20000))
    w = rank_weights(4)
    for i in range(4):
        assert counts[f"x{i}"] / 20000 == pytest.approx(w[i] / sum(w), abs=0.015)
    assert counts["x0"] > counts["x1"] > counts["x2"] > counts["x3"]
    pair = select_parents(pop, 2, random.Random(1))
    assert len({p.id for p in pair}) == 2  # distinct parents
    assert len(select_parents(pop[:1], 2, rng)) == 1
    with pytest.raises(ValueError, match="empty"):
        select_parents([], 1, rng)


def test_survivors_drop_invalid_dedupe_and_keep_best():
    a, b = _ind(0, 3.0), _ind(1, 3.0)  # same objective
    c = _ind(2, 2.0, code=a.code)  # same code as a (other objective: e.g. re-evaluated)
    d, e, f = _ind(3, 4.0), _ind(4, 5.0), _ind(5, float("nan"))
    out = survivors([e, d, a, b, c, f], 3)
    assert [i.id for i in out] == ["x2", "x1", "x3"]  # c best; a dropped (code of c); b kept; then d


# --------------------------------------------------------------------------------- scripted run
def _scripted_config(tmp_path, **over):
    eoh = {
        "name": "eoh",
        "type": "eoh",
        **SMALL,
        "population_size": 3,
        "operators": {"e1": 1.0, "m1": 1.0, "m2": 0.5},
        "offspring_per_operator": 2,
        **over,
    }
    return {
        "run": {"name": "eoh", "seed": 11},
        "budget": {"max_rounds": 3},
        "evolvers": [eoh],
        "report": {"plots": False},
    }


def test_scripted_eoh_run_end_to_end(tmp_path):
    data = _scripted_config(tmp_path)
    policy = ScriptedPolicy()
    loop = make_loop(tmp_path, data, lambda: policy)
    eoh = loop.evolvers["eoh"]
    summary = loop.run()
    assert "round budget" in summary.stop_reason
    assert eoh.generation == 3  # init + 2 generations
    assert policy.generate_calls == 3  # one batched generate call per step
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        trajs = store.query(run_id="run")
        assert len(trajs) == policy.calls == store.count_llm_calls("run")
        init = [t for t in trajs if t.generation == 0]
        assert len(init) == 6  # 2N i1 calls
        kinds = Counter(t.failure for t in trajs)
        assert kinds["parse"] >= 1 and kinds["return_type"] >= 1 and kinds[None] >= 4
        for t in trajs:
            assert t.llm_calls == 1 and len(t.steps) == 1 and "select_next_node" in t.steps[0].observation
            assert (t.reward is not None) == t.valid
            if t.valid:
                assert t.reward == pytest.approx(-t.meta["objective"])
                assert t.steps[0].action == t.meta["code"] and t.meta["thought"]
        children = [t for t in trajs if t.generation > 0]
        assert {t.meta["operator"] for t in children} <= {"e1", "m1", "m2"}
        for t in children:
            assert t.meta["parent_ids"] and t.meta["parent_objective"] is not None
            assert t.meta["parent_objective"] == min(t.meta["parent_objectives"])
            assert t.meta["problem"] == "tsp_construct"
        # survivors: unique objectives and code, best first, at most N
        pop = eoh.population
        assert 1 <= len(pop) <= 3
        assert len({i.objective for i in pop}) == len(pop) and len({i.code_hash for i in pop}) == len(pop)
        assert [i.reward for i in pop] == sorted((i.reward for i in pop), reverse=True)
        valid_objs = [t.meta["objective"] for t in init if t.valid]
        assert len(valid_objs) == len(set(valid_objs))
        # the script's nearest neighbour written with min(): other code, the same objectives as the first sample
        same = [t for t in init if t.failure == "behavioural_duplicate"]
        assert same and all(t.meta["objective"] in valid_objs and t.reward is None for t in same)
        # best heuristic artifact and file
        best = pop[0]
        art = store.get_artifact("heuristic", "tsp_construct/eoh")
        assert art.content["code"] == best.code and art.content["objective"] == best.objective
    code = (tmp_path / "run" / "best_heuristic.py").read_text()
    res = evaluate_heuristic(eoh.problem, code, eoh.train_instances)
    assert res.valid and res.objective == pytest.approx(best.objective)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| size | instances | seed objective | seed gap % | best objective | best gap % | reference |" in report
    assert "| 8 | 2 |" in report and "| 10 | 2 |" in report and "LKH" in report
    assert "Final population" in report
    # per held-out size: seed vs best with gaps to the reference, and whether best beats seed (in the direction)
    for row in [line for line in report.splitlines() if line.startswith(("| 8 | 2 |", "| 10 | 2 |"))]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        seed_obj, best_obj, beats = float(cells[2]), float(cells[4]), cells[7]
        assert beats in ("yes", "no", "tie") and (
            best_obj == seed_obj or beats == ("yes" if best_obj < seed_obj else "no")
        )
    assert "The best heuristic beats the seed heuristic on" in report and "of 2 held-out sizes" in report
    assert code.splitlines()[1].startswith("# Made by evolver 'eoh', operator ")


def test_children_prompts_quote_population_parents(tmp_path):
    policy = ScriptedPolicy()
    ctx = _ctx(tmp_path, policy=policy)
    eoh = EoHEvolver("eoh", EoHConfig(**SMALL, population_size=3, operators={"m1": 1.0}), ctx)
    eoh.step(0)
    before = {i.id: i for i in eoh.population}
    n_prompts = len(policy.prompts)
    eoh.step(1)
    trajs = ctx.store.query(run_id="r", generation=1)
    assert len(trajs) == 3
    for t, prompt in zip(trajs, policy.prompts[n_prompts:]):
        (pid,) = t.meta["parent_ids"]
        assert before[pid].code.strip() in prompt and t.meta["parent_objective"] == before[pid].objective
        assert t.meta["worst_objective"] == max(i.objective for i in before.values())


def test_es_children_through_the_sampler_service_and_pooling(tmp_path):
    """What the ES rollout does: children of the EoH population, written through EoH's sampler under a
    member's (here unperturbed) policy, recorded for ES, cached on a re-run, folded into EoH at its next step."""
    policy = ScriptedPolicy()
    ctx = _ctx(tmp_path, policy=policy)
    eoh = EoHEvolver("eoh", EoHConfig(**SMALL, population_size=2), ctx)
    assert isinstance(eoh, HeuristicSearch) and eoh.parents_m == 2

    def children():
        jobs = eoh.sampler.operator_jobs(
            ["m1", "m2"], 2, random.Random(7), ("es", 0, 0), population=eoh.population, parents_m=eoh.parents_m
        )
        return eoh.sampler.sample(jobs, policy=policy, round_index=0, generation=0, evolver="es", member=member)

    member = ESMember(seed=5, sigma=1e-3, index=0)
    with pytest.raises(RuntimeError, match="population is empty"):
        children()
    eoh.step(0)
    kids = children()
    assert len(kids) == 4 and {k.evolver for k in kids} == {"es"} and {k.space for k in kids} == {"parameter"}
    assert all(k.member == member and k.meta["operator"] in ("m1", "m2") for k in kids)
    assert all(k.meta["parent_objective"] is not None and k.meta["sampler"] == "eoh" for k in kids)
    assert [k.key for k in kids] == [f"r/es/0/0/{op}/{j}" for op in ("m1", "m2") for j in range(2)]
    again = children()
    assert [k.key for k in again] == [k.key for k in kids] and policy.calls == 8  # cached, no new calls
    rep = eoh.step(1)
    assert rep.metrics["pooled"] == sum(k.valid for k in kids)
    rep2 = eoh.step(2)
    assert rep2.metrics["pooled"] == 0  # own children are not folded again


def test_resume_rerun_step_uses_cache_and_state_round_trips(tmp_path):
    policy = ScriptedPolicy()
    ctx = _ctx(tmp_path, policy=policy)
    cfg = EoHConfig(**SMALL, population_size=3, operators={"e1": 1.0, "m1": 0.5})
    eoh = EoHEvolver("eoh", cfg, ctx)
    eoh.step(0)
    saved = json.loads(json.dumps(eoh.state_dict()))
    eoh.step(1)
    after = eoh.state_dict()
    calls = policy.calls
    # a crash after step 1 recorded its samples but before the checkpoint: re-run it from the saved state
    again = EoHEvolver("eoh", cfg, ctx)
    again.load_state_dict(saved)
    assert again.state_dict() == saved
    again.step(1)
    assert policy.calls == calls  # every sample came from the store
    assert again.state_dict() == after
    assert len(ctx.store.query(run_id="r")) == calls


def test_loop_resume_continues_from_checkpointed_state(tmp_path):
    data = _scripted_config(tmp_path)
    data["budget"]["max_rounds"] = 2
    policy = ScriptedPolicy()
    first = make_loop(tmp_path, data, lambda: policy)
    first.run()
    pop_before = [i.id for i in first.evolvers["eoh"].population]
    data["budget"]["max_rounds"] = 3
    resumed = CoEvolutionLoop(
        parse_config(data), tmp_path / "run", resume=True, progress=False, policy_factory=lambda: policy
    )
    eoh = resumed.evolvers["eoh"]
    assert eoh.generation == 2 and [i.id for i in eoh.population] == pop_before and eoh.best is not None
    resumed.run()
    assert eoh.generation == 3
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        keys = [t.key for t in store.query(run_id="run")]
        assert len(keys) == len(set(keys)) == policy.calls == store.count_llm_calls("run")


def test_seed_heuristic_option_keeps_a_run_alive_without_valid_samples(tmp_path):
    policy = ScriptedPolicy(script=["no code here", "{idea}\n```python\ndef select_next_node(:\n```"])
    ctx = _ctx(tmp_path, policy=policy)
    eoh = EoHEvolver("eoh", EoHConfig(**SMALL, population_size=2, include_seed_heuristic=True), ctx)
    rep = eoh.step(0)
    assert not rep.stop and policy.calls == 4  # one round of 2N i1 calls, no retries needed
    assert [i.id for i in eoh.population] == ["seed"] and eoh.best.id == "seed"
    seed_res = evaluate_heuristic(eoh.problem, eoh.problem.seed_heuristic_code(), eoh.train_instances)
    assert eoh.population[0].objective == pytest.approx(seed_res.objective)
    assert Counter(t.failure for t in ctx.store.query(run_id="r")) == {"parse": 2, "syntax": 2}
    eoh.step(1)  # a generation whose parents are the seed heuristic
    kids = ctx.store.query(run_id="r", generation=1)
    assert kids and all(t.meta["parent_ids"] in ([], ["seed"]) for t in kids)


# ------------------------------------------------------------------------------- duplicates, seed, stop
NN_RESTYLED = '''import numpy as np  # nearest neighbour, restyled


def select_next_node(current_node, destination_node,
                     unvisited_nodes, distance_matrix):
    """Go to the closest unvisited city."""
    # the closest one
    return int(unvisited_nodes[np.argmin(distance_matrix[current_node, unvisited_nodes])])
'''


def test_code_key_ignores_formatting_comments_and_docstrings():
    assert code_key(NN) == code_key(NN_RESTYLED) == Individual("a", "", NN_RESTYLED, 1.0, -1.0).code_hash
    assert code_key(NN) != code_key(FARTHEST) and code_key(NN) != code_key(NN.replace("argmin", "argmax"))
    assert code_key("def f(:\n  pass") == code_key("def f(:\n    pass  ")  # unparsable: stripped lines


def test_copies_are_recorded_as_duplicates_without_running(tmp_path, monkeypatch):
    """A copy of the seed heuristic (in the population), a restyled copy of an earlier valid sample and a copy
    within the same batch are recorded as failure kind `duplicate` and never reach the sandbox."""
    seed_code = load_problem("tsp_construct").seed_heuristic_code()
    seed_copy = (
        '"""A docstring the seed does not have."""\n' + seed_code.replace("\n\n", "\n\n\n") + "# trailing note\n"
    )
    policy = ScriptedPolicy(
        script=[
            reply("copy the seed", seed_copy),
            reply("nearest", NN),
            reply("nearest again", NN_RESTYLED),
            reply("farthest", FARTHEST),
        ]
    )
    ctx = _ctx(tmp_path, policy=policy)
    # code copies only: NN (a sample below) scores exactly as the seed heuristic, a behavioural duplicate
    cfg = EoHConfig(**SMALL, population_size=2, include_seed_heuristic=True, reject_same_behaviour=False)
    eoh = EoHEvolver("eoh", cfg, ctx)
    evaluated: list[str] = []
    real = eoh.sampler.evaluate

    def counting(codes, instances=None, with_reference=True, **kw):
        if instances is None:  # training evaluations (a new best is also checked on validation instances)
            evaluated.extend(codes)
        return real(codes, instances, with_reference, **kw)

    monkeypatch.setattr(eoh.sampler, "evaluate", counting)
    eoh.step(0)  # 2N = 4 i1 calls
    trajs = ctx.store.query(run_id="r")
    assert [t.failure for t in trajs] == ["duplicate", None, "duplicate", None]
    assert trajs[0].meta["duplicate_of"] == "seed" and trajs[2].meta["duplicate_of"] == "eoh/0/init0/i1/1"
    assert "up to formatting, comments and docstrings" in trajs[0].failure_detail
    assert code_key(trajs[0].meta["code"]) == code_key(seed_code)  # the copy's code is kept
    assert all(t.reward is None and t.llm_calls == 1 for t in trajs if t.failure == "duplicate")
    assert evaluated[0] == seed_code and sorted(evaluated[1:]) == sorted([NN, FARTHEST])  # copies never ran
    # a later step: copies of anything recorded before are duplicates too (checked against the store)
    policy.script, policy.calls = [reply("nearest once more", NN)], 0
    again = eoh.sampler.sample([eoh.sampler.job("i1", key="r/x/0", seed=1)], round_index=1, generation=1)
    assert again[0].failure == "duplicate" and again[0].meta["duplicate_of"] == "eoh/0/init0/i1/1"
    off = EoHEvolver(
        "eoh2", EoHConfig(**SMALL, population_size=2, reject_duplicates=False, reject_same_behaviour=False), ctx
    )
    assert off.sampler.sample([off.sampler.job("i1", key="r/y/0", seed=1)], round_index=1, generation=1)[0].valid


def test_parse_retries_ask_again_an_answer_without_code_and_count_every_call(tmp_path):
    """EoH's re-query of an answer without code: the thought-only answers of a batch are asked again in one
    batched call per round, with a new seed, until they define the function or ``parse_retries`` runs out;
    every call counts against the budget and the trajectory keeps the answers it replaced."""
    thought_only = "{Prefer nodes that are close now and keep the remaining nodes compact.}"
    script = [thought_only, reply("nearest", NN), thought_only, reply("farthest", FARTHEST)]
    script += [thought_only, reply("toward home", TOWARD_HOME), reply("index order", FIRST_INDEX)]
    policy = ScriptedPolicy(script=script)
    seeds: list[int] = []
    generate = policy.generate

    def recording(conversations, params):
        seeds.append(params.seed)
        return generate(conversations, params)

    policy.generate = recording
    ctx = _ctx(tmp_path, policy=policy)
    eoh = EoHEvolver("eoh", EoHConfig(**SMALL, population_size=2, parse_retries=2), ctx)
    eoh.step(0)  # 2N = 4 i1 calls, then retry rounds of 2 and 1 calls
    assert policy.generate_calls == 3 and len(set(seeds)) == 3
    trajs = ctx.store.query(run_id="r")
    assert [t.llm_calls for t in trajs] == [3, 1, 2, 1] and ctx.budget.samples_used() == 7
    assert [t.valid for t in trajs] == [True, True, True, True]
    assert trajs[0].steps[0].model_output == script[6] and trajs[0].meta["retried_outputs"] == [thought_only] * 2
    assert trajs[2].steps[0].model_output == script[5] and "retried_outputs" not in trajs[1].meta
    assert trajs[0].completion_tokens == 3 * 40 and trajs[1].completion_tokens == 40

    # the budget cuts the retries: 5 samples allow the 4 calls and one retry
    policy2 = ScriptedPolicy(script=[thought_only, thought_only, reply("nearest", NN), thought_only, thought_only])
    ctx2 = _ctx(tmp_path / "b", max_samples=5, policy=policy2)
    eoh2 = EoHEvolver("eoh", EoHConfig(**SMALL, population_size=2, parse_retries=3), ctx2)
    eoh2.step(0)
    trajs2 = ctx2.store.query(run_id="r")
    assert ctx2.budget.samples_used() == 5 and [t.llm_calls for t in trajs2] == [2, 1, 1, 1]
    assert [t.failure for t in trajs2] == ["no_code", "no_code", None, "no_code"]

    # off by default (LLM4AD's samplers do not retry): one call per sample
    assert EoHConfig(**SMALL).parse_retries == 0


def test_duplicate_retries_spend_the_slot_on_a_new_sample_before_evaluating(tmp_path):
    """A child that copies an existing heuristic (here the seed-like NN of the same batch and a recorded one) is
    asked again before anything is evaluated, so the slot yields a new heuristic; every call counts."""
    script = [reply("nearest", NN), reply("nearest again", NN), reply("farthest", FARTHEST), reply("nearest", NN)]
    script += [reply("toward home", TOWARD_HOME), reply("index order", FIRST_INDEX)]
    policy = ScriptedPolicy(script=script)
    ctx = _ctx(tmp_path, policy=policy)
    eoh = EoHEvolver("eoh", EoHConfig(**SMALL, population_size=2, duplicate_retries=1), ctx)
    eoh.step(0)  # 4 i1 calls: positions 1 and 3 copy position 0 and are asked again in one batched call
    assert policy.generate_calls == 2
    trajs = ctx.store.query(run_id="r")
    assert [t.llm_calls for t in trajs] == [1, 2, 1, 2] and ctx.budget.samples_used() == 6
    assert [t.failure for t in trajs] == [None, None, None, None]
    assert trajs[1].meta["retried_outputs"] == [script[1]] and trajs[1].meta["code"].strip() == TOWARD_HOME.strip()
    # without retries the copies are recorded as duplicates (not evaluated)
    ctx2 = _ctx(tmp_path / "b", policy=ScriptedPolicy(script=script))
    EoHEvolver("eoh", EoHConfig(**SMALL, population_size=2), ctx2).step(0)
    assert [t.failure for t in ctx2.store.query(run_id="r")] == [None, "duplicate", None, "duplicate"]


def test_main_job_config_seeds_the_population_and_stops_at_the_closing_fence(tmp_path):
    """configs/ahd/tsp_construct.yaml: the seed heuristic enters the population, so the best heuristic is never
    worse than the seed on the training set; sampling.stop reaches the policy, and an answer cut at the closing
    fence (as the backends cut it) still parses."""
    from coevo.backends import cut_at_stop
    from coevo.config import load_config

    cfg, _raw = load_config("configs/ahd/tsp_construct.yaml", [])
    eoh_spec = next(e for e in cfg.evolvers if e.name == "eoh")
    assert eoh_spec.params.include_seed_heuristic and cfg.sampling.stop == ["\n```\n"]
    answer, stopped = cut_at_stop(reply("Go towards home.", TOWARD_HOME) + "\nThis heuristic is good.\n", ("\n```\n",))
    assert stopped and "good" not in answer and answer.endswith(TOWARD_HOME.rstrip("\n"))
    policy = ScriptedPolicy(script=[answer, reply("worse", FIRST_INDEX)])
    store = TrajectoryStore(tmp_path / "store.sqlite")
    ctx = RunContext(
        run_id="r",
        run_dir=tmp_path,
        store=store,
        budget=Budget(store, "r"),
        seed=1,
        policy_factory=lambda: policy,
        sampling=cfg.sampling,
    )
    eoh = EoHEvolver("eoh", EoHConfig(**{**SMALL, "population_size": 2, "include_seed_heuristic": True}), ctx)
    eoh.step(0)
    assert policy.params.stop == ("\n```\n",)
    trajs = store.query(run_id="r")
    assert trajs[0].valid and trajs[0].meta["code"].strip() == TOWARD_HOME.strip()
    seed = next(i for i in eoh.population if i.id == "seed")
    assert eoh.best.reward >= seed.reward  # never worse than the seed


# ------------------------------------------------------------------------- tiny model: failures
def _tiny_config(model_dir, max_samples, init_retries):
    eoh = {
        "name": "eoh",
        "type": "eoh",
        **SMALL,
        "population_size": 2,
        "init_retries": init_retries,
        "max_new_tokens": 24,
    }
    return {
        "run": {"name": "tiny", "seed": 1},
        "model": {"name": str(model_dir), "dtype": "float32"},
        "budget": {"max_rounds": 5, "max_samples": max_samples},
        "evolvers": [eoh],
        "report": {"plots": False},
    }


def test_tiny_model_budget_counts_failed_samples(tmp_path, tiny_model_dir):
    data = _tiny_config(tiny_model_dir, max_samples=7, init_retries=5)
    summary = make_loop(tmp_path, data).run()
    assert "sample budget" in summary.stop_reason
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        trajs = store.query(run_id="run")
        assert store.count_llm_calls("run") == 7 == len(trajs)  # exact, failures included
        # the prefilled answers of a random model: truncated or broken bodies, or a comment and nothing else
        assert all(not t.valid and t.failure in ANSWER_FAILURE_KINDS and t.reward is None for t in trajs), [
            t.failure for t in trajs
        ]
        assert all(t.steps[0].model_output is not None for t in trajs)


def test_tiny_model_empty_population_stops_after_bounded_retries(tmp_path, tiny_model_dir):
    data = _tiny_config(tiny_model_dir, max_samples=100, init_retries=1)
    summary = make_loop(tmp_path, data).run()
    assert "eoh stopped the run" in summary.stop_reason and "no valid heuristic" in summary.stop_reason
    assert summary.samples == 2 * 2 * 2  # (1 + init_retries) rounds of 2N i1 calls
    assert not (tmp_path / "run" / "best_heuristic.py").exists()
    report = (tmp_path / "run" / "report.md").read_text()
    assert "No valid heuristic was found" in report and "seed objective" in report


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="evolvers.eoh.operators"):
        parse_config(
            {"evolvers": [{"name": "eoh", "type": "eoh", "problem": "tsp_construct", "operators": {"z1": 1.0}}]}
        )
    with pytest.raises(ConfigError, match="evolvers.eoh.population_size"):
        parse_config({"evolvers": [{"name": "eoh", "type": "eoh", "problem": "tsp_construct", "population_size": 0}]})
    data = {"evolvers": [{"name": "eoh", "type": "eoh", "problem": "no_such_problem"}]}
    with pytest.raises(ValueError, match="evolvers.eoh.problem"):
        make_loop(tmp_path, data)


SMALL_ONLY = """def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    if len(unvisited_nodes) > 8:
        raise ValueError("only small instances")
    return int(unvisited_nodes[0])
"""


def test_report_names_why_a_heuristic_is_invalid_on_a_held_out_size(tmp_path):
    # valid on the TSP8 training set (at most 7 unvisited cities), raises on held-out TSP10 (9 unvisited at first);
    # validation_count 0: with the validation check on, it would not become the best (test_tune.py)
    data = _scripted_config(
        tmp_path, population_size=1, operators={"m1": 1.0}, offspring_per_operator=1, validation_count=0
    )
    data["budget"]["max_rounds"] = 1
    policy = ScriptedPolicy([reply("Index order, small instances only.", SMALL_ONLY)])
    loop = make_loop(tmp_path, data, lambda: policy)
    loop.run()
    assert loop.evolvers["eoh"].best.code.strip() == strip_docstrings(SMALL_ONLY).strip()  # evaluated as stripped
    report = (tmp_path / "run" / "report.md").read_text()
    (line,) = [x for x in report.splitlines() if x.startswith("- Held-out n=")]
    assert (
        line.startswith("- Held-out n=10: the best heuristic is invalid (runtime: ") and "only small instances" in line
    )
    assert len(line) <= 260  # the failure detail is cut to one short line
    row = next(x for x in report.splitlines() if x.startswith("| 10 | 2 |"))
    assert [c.strip() for c in row.strip("|").split("|")][4] == "–"


def test_a_retry_cut_by_the_wall_deadline_keeps_the_batch(tmp_path):
    """Measured on the main job (2-core AVX2 CPU): the parse retry of 1 row was cut by the wall deadline after
    402 s and the 8 samples of the batch before it were lost with it. The batch's answers are recorded; only the
    retry is lost (the backend stops decoding at the deadline and raises ``DeadlineReached``)."""
    from coevo.errors import DeadlineReached

    thought_only = "{Prefer nodes that are close now.}"
    policy = ScriptedPolicy(script=[thought_only, reply("nearest", NN), reply("farthest", FARTHEST), thought_only])
    generate = policy.generate

    def cut_on_retry(conversations, params):
        if policy.generate_calls >= 1:
            raise DeadlineReached("wall-clock budget reached", rows=len(conversations))
        return generate(conversations, params)

    policy.generate = cut_on_retry
    ctx = _ctx(tmp_path, policy=policy)
    eoh = EoHEvolver("eoh", EoHConfig(**SMALL, population_size=2, parse_retries=2), ctx)
    eoh.step(0)
    trajs = ctx.store.query(run_id="r")
    assert [t.failure for t in trajs] == ["no_code", None, None, "no_code"] and ctx.budget.samples_used() == 4


class TemperatureEchoPolicy(ScriptedPolicy):
    """Test double for the model (as ScriptedPolicy): each reply is a distinct valid heuristic whose thought names
    the temperature of the generate call that made it, and every call's params are kept."""

    def __init__(self):
        super().__init__()
        self.call_params = []

    def generate(self, conversations, params):
        self.call_params.append(params)
        out = []
        for conv in conversations:
            self.prompts.append(conv[-1]["content"])
            code = TOWARD_HOME.replace("0.3", f"0.{self.calls + 1:03d}")
            out.append(Completion(text=reply(f"temperature {params.temperature}", code), completion_tokens=40))
            self.calls += 1
        return out


def test_operator_temperature_decodes_each_temperature_in_its_own_batch(tmp_path):
    """``operator_temperature``: m1/m2 calls sample at their own temperature, in a batch of their own; the other
    operators keep the run's temperature; trajectories keep their job order and operators."""
    policy = TemperatureEchoPolicy()
    ctx = _ctx(tmp_path, policy=policy)
    cfg = EoHConfig(
        **SMALL,
        population_size=2,
        operators={"e1": 1.0, "m1": 1.0, "m2": 1.0},
        offspring_per_operator=1,
        operator_temperature={"m1": 0.5, "m2": 0.5},
        reject_same_behaviour=False,  # the replies' small weights give nearest neighbour's tours on TSP8
    )
    eoh = EoHEvolver("eoh", cfg, ctx)
    eoh.step(0)  # 4 i1 calls: one batch at the run's temperature
    assert [p.temperature for p in policy.call_params] == [1.0]
    eoh.step(1)
    assert sorted(p.temperature for p in policy.call_params[1:]) == [0.5, 1.0]
    assert len({p.seed for p in policy.call_params[1:]}) == 1  # one batch seed, split by temperature
    trajs = ctx.store.query(run_id="r", generation=1)
    assert [t.meta["operator"] for t in trajs] == ["e1", "m1", "m2"]
    assert [t.meta["thought"] for t in trajs] == ["temperature 1.0", "temperature 0.5", "temperature 0.5"]
    assert all(t.valid for t in trajs)
    # nothing configured: one batch per generation, as before
    plain = TemperatureEchoPolicy()
    ctx2 = _ctx(tmp_path / "b", policy=plain)
    eoh2 = EoHEvolver("eoh", cfg.model_copy(update={"operator_temperature": {}}), ctx2)
    eoh2.step(0)
    eoh2.step(1)
    assert [p.temperature for p in plain.call_params] == [1.0, 1.0]


REFLECTION = "Heuristic 1 weighs the distance back to the start, so it ends tours near home. ```python\nx=1\n```"


class ReflectingPolicy(ScriptedPolicy):
    """Test double for the model (as ScriptedPolicy): answers a reflection prompt with REFLECTION, every other
    prompt from SCRIPT; keeps each call's params."""

    def __init__(self, script=SCRIPT):
        super().__init__(script)
        self.call_params = []

    def generate(self, conversations, params):
        self.call_params.append(params)
        if len(conversations) == 1 and "heuristic 1 achieves a better objective" in conversations[0][-1]["content"]:
            self.prompts.append(conversations[0][-1]["content"])
            return [Completion(text=REFLECTION, prompt_tokens=300, completion_tokens=30)]
        return super().generate(conversations, params)


def test_reflection_is_one_recorded_call_per_generation_passed_to_the_parent_operators(tmp_path):
    """``reflection``: before a generation, one short call compares the population's best and worst heuristic
    (ReEvo's short-term reflection); its answer (code dropped) is in every parent-operator prompt of that
    generation; the call is recorded, counts against the budget, is never a heuristic, and is reused on a re-run."""
    script = [
        reply("nearest", NN),
        reply("farthest", FARTHEST),
        reply("home", TOWARD_HOME),
        reply("first", FIRST_INDEX),
    ]
    policy = ReflectingPolicy(script=script)
    ctx = _ctx(tmp_path, policy=policy)
    cfg = EoHConfig(
        **SMALL, population_size=2, operators={"e1": 1.0, "m1": 1.0}, offspring_per_operator=1, reflection=True
    )
    eoh = EoHEvolver("eoh", cfg, ctx)
    eoh.step(0)
    best, worst = eoh.population[0], eoh.population[-1]
    assert best.objective < worst.objective
    n = len(policy.prompts)
    eoh.step(1)
    asked = policy.prompts[n]
    assert (
        best.code.strip() in asked
        and worst.code.strip() in asked
        and asked.index(best.code.strip()) < asked.index(worst.code.strip())
    )
    assert policy.call_params[1].max_new_tokens == 96 and policy.call_params[1].stop == ()
    note = "Heuristic 1 weighs the distance back to the start, so it ends tours near home."
    children = policy.prompts[n + 1 :]
    assert len(children) == 2 and all(note in p and "x=1" not in p for p in children)
    (refl,) = [t for t in ctx.store.query(run_id="r") if t.meta.get("kind") == "reflection"]
    assert refl.llm_calls == 1 and refl.reward is None and refl.meta["text"] == note and refl.meta["output"] == "text"
    assert refl.meta["parent_ids"] == [best.id, worst.id] and refl.task_id.endswith("/reflection")
    assert ctx.budget.samples_used() == 4 + 1 + 2
    assert all(t.meta.get("kind") != "reflection" for t in eoh.sampler.recorded())
    # a re-run of the step (resume) reuses the stored reflection: no new call
    calls = len(policy.call_params)
    assert (
        eoh.sampler.reflect(best, worst, key=refl.key, seed=1, round_index=1, generation=1, max_new_tokens=96) == note
        and len(policy.call_params) == calls
    )
    # the budget spent: no reflection call, and none without the option
    assert (
        eoh.sampler.reflect(best, worst, key="r/other", seed=1, round_index=1, generation=1, max_new_tokens=96) == note
    )
    ctx2 = _ctx(tmp_path / "b", max_samples=4, policy=ReflectingPolicy(script=script))
    eoh2 = EoHEvolver("eoh", cfg, ctx2)
    eoh2.step(0)
    assert eoh2.sampler.reflect(best, worst, key="r/x", seed=1, round_index=1, generation=1, max_new_tokens=96) is None
    plain = ReflectingPolicy(script=script)
    ctx3 = _ctx(tmp_path / "c", policy=plain)
    eoh3 = EoHEvolver("eoh", cfg.model_copy(update={"reflection": False}), ctx3)
    eoh3.step(0)
    eoh3.step(1)
    assert not any("A note from comparing" in p or "better objective than" in p for p in plain.prompts)


def test_operator_temperature_and_reflection_settings_name_the_field():
    base = {"name": "eoh", "type": "eoh", "problem": "tsp_construct"}
    for bad in ({"z9": 0.5}, {"m1": -0.1}, {"m1": float("nan")}):
        with pytest.raises(ConfigError, match="evolvers.eoh.operator_temperature"):
            parse_config({"evolvers": [{**base, "operator_temperature": bad}]})
    with pytest.raises(ConfigError, match="evolvers.eoh.reflection_tokens"):
        parse_config({"evolvers": [{**base, "reflection": True, "reflection_tokens": 0}]})


def test_tiny_model_runs_reflection_and_operator_temperature(tmp_path, tiny_model_dir):
    """The real backend path: a reflection call and split temperatures on the tiny random model (garbage out, so
    the population is the seed heuristic and the run is bounded by its budget); every call is counted."""
    data = _tiny_config(tiny_model_dir, max_samples=9, init_retries=0)
    data["evolvers"][0].update(
        include_seed_heuristic=True,
        seed_heuristics=["eoh_ael"],
        reflection=True,
        reflection_tokens=12,
        operator_temperature={"m1": 0.5, "m2": 0.5},
        operators={"e1": 1.0, "m1": 1.0, "m2": 1.0},
        offspring_per_operator=1,
    )
    summary = make_loop(tmp_path, data).run()
    assert "sample budget" in summary.stop_reason
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        trajs = store.query(run_id="run")
        assert store.count_llm_calls("run") == 9 == len(trajs)
        kinds = Counter(t.meta.get("kind", t.meta.get("operator")) for t in trajs)
        assert kinds["i1"] == 4 and kinds["reflection"] == 1 and kinds["e1"] + kinds["m1"] + kinds["m2"] == 4
        child = next(t for t in trajs if t.meta.get("operator") == "m1")
        refl = next(t for t in trajs if t.meta.get("kind") == "reflection")
        assert not refl.meta["text"] or refl.meta["text"] in child.steps[0].observation

"""AHD co-evolution end to end: ES members writing EoH children (``eoh_es``) or i1 samples (``sample_es``)
under perturbed weights, through the real :class:`~coevo.loop.CoEvolutionLoop` and the shipped configs.

Two models:

* the real tiny random Qwen2 (fixture ``tiny_model_dir``): its outputs are garbage, so every child is an
  invalid sample, which must be recorded, counted in the budget and rewarded by the paper's invalid rule;
* :class:`ScriptedTinyQwen`, a test double for the model's *outputs only*: a real
  :class:`~coevo.backends.hf.HFPolicy` over the tiny Qwen2 weights (which ES really perturbs, restores and
  updates) whose ``generate`` returns fixed EoH-style replies, valid code for some calls and garbage for
  others, in call order. Everything else (prompts, code extraction, sandboxed evaluation on real TSP
  instances, the SQLite store, ES, EoH, the loop, the report) runs for real.

Member rewards (docs/references.md §2): EoH child ``parent - child``; invalid or worse than the population's worst
``max(parent - worst, -1)``; sampling ``-child``, invalid ``min(valid) - std(valid)`` over the generation.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import Counter
from pathlib import Path

import pytest
from support import one_step_trajectory
from test_eoh import FARTHEST, FIRST_INDEX, NN, RETURNS_FLOAT, TOWARD_HOME

from coevo.ahd.evaluate import evaluate_heuristic
from coevo.ahd.problem import load_problem
from coevo.artifacts import LOOP_STEP
from coevo.backends.hf import HFPolicy
from coevo.config import load_config
from coevo.loop import CoEvolutionLoop, new_run_dir
from coevo.rollouts.eoh_children import EoHChildrenConfig, EoHChildrenRollout
from coevo.store import TrajectoryStore
from coevo.tables import fmt
from coevo.types import Trajectory

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "ahd"

TOWARD_HOME_2 = TOWARD_HOME.replace("0.3", "0.6")
SECOND_NEAREST = """import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    order = np.argsort(distance_matrix[current_node, unvisited_nodes])
    return int(unvisited_nodes[order[min(1, len(order) - 1)]])
"""
GARBAGE = "I would like to help, but here is no code."
SYNTAX = "{A broken idea.}\n```python\ndef select_next_node(current_node:\n    return\n```\n"


def reply(code: str, thought: str = "a heuristic") -> str:
    return f"{{{thought}}}\n```python\n{code}```\n"


class ScriptedTinyQwen(HFPolicy):
    """Test double for the model's outputs: real tiny Qwen2 weights (ES perturbs them), scripted replies.

    ``generate`` answers each conversation with the next reply of ``script`` (the last one repeats) and
    records, per call, the batch size and a sha256 of one in-scope weight tensor, so a test can tell
    perturbed from centre weights. Its replies are in EoH's free answer format, so it continues no prefilled
    answer (the sampler sends it the free format's prompts).
    """

    can_continue_final_message = False

    def __init__(self, model_dir: Path, script: list[str]):
        super().__init__(model_dir, dtype="float32", batch_size=8)
        self.script = list(script)
        self.calls = 0
        self.batches: list[tuple[int, str]] = []
        self.kinds: list[str] = []  # per call: "policy" (generate) or "population" (generate_rows)

    def fingerprint(self) -> str:
        w = self.model.model.layers[0].mlp.down_proj.weight
        return hashlib.sha256(w.detach().cpu().numpy().tobytes()).hexdigest()

    def generate(self, conversations, params):
        from coevo.backends.base import Completion

        self.batches.append((len(conversations), self.fingerprint()))
        self.kinds.append("policy")
        out = []
        for _ in conversations:
            text = self.script[min(self.calls, len(self.script) - 1)]
            out.append(Completion(text=text, completion_tokens=len(text.split()), prompt_tokens=100))
            self.calls += 1
        return out

    def generate_rows(self, conversations, params, *, row_seeds=None, batch_hook=None, row_groups=None):
        """A low-rank population's call (``HFPopulation.generate``): scripted like :meth:`generate`, recorded
        as kind ``"population"``."""
        out = self.generate(conversations, params)
        self.kinds[-1] = "population"
        return out


SMALL_AHD = {
    "train_size": 8,
    "train_count": 2,
    "test_sizes": [8, 10],
    "test_count": 2,
    "eval_timeout_s": 10,
    "eval_memory_mb": 1024,
}


pytestmark = pytest.mark.usefixtures("private_cache")


def shipped(ahd: str, model: str, **over) -> list[str]:
    """--set overrides shrinking a shipped config (configs/ahd/...) to test size."""
    sets = [
        f"model.name={model}",
        "model.dtype=float32",
        "sampling.max_new_tokens=4",
        "report.plots=false",
        "budget.max_wall_s=null",
    ]
    sets += [f"evolvers.{ahd}.{k}={v}" for k, v in SMALL_AHD.items()]
    sets += [f"{k}={v}" for k, v in over.items()]
    return sets


def make_loop(tmp_path: Path, config: str, sets: list[str], policy=None) -> CoEvolutionLoop:
    cfg, raw = load_config(CONFIGS / config, sets)
    factory = (lambda: policy) if policy is not None else None
    return CoEvolutionLoop(
        cfg, new_run_dir(cfg, tmp_path / "run"), raw_config=raw, progress=False, policy_factory=factory
    )


def es_first_eoh_loop(tmp_path: Path, model_dir: Path, **over) -> CoEvolutionLoop:
    """The shipped EoH + ES config (``eoh_es/tsp_construct.yaml``) at test size on the model in ``model_dir``, ES
    first in round 0 (the EoH population is still empty, so members fall back to i1 samples), the seed heuristic
    included, 4 ES members, 28 samples; ``over`` are further ``--set`` overrides."""
    sets = {
        "evolvers.eoh.include_seed_heuristic": True,
        "schedule": "[{evolver: es}, {evolver: eoh}]",
        "evolvers.es.population_size": 4,
        "budget.max_samples": 28,
    }
    return make_loop(tmp_path, "eoh_es/tsp_construct.yaml", shipped("eoh", str(model_dir), **sets, **over))


def sample_es_loop(tmp_path: Path, model_dir: Path, policy=None, **over) -> CoEvolutionLoop:
    """The shipped random-sampling + ES config (``sample_es/tsp_construct.yaml``) at test size on the model in
    ``model_dir`` (or on ``policy``): 2 ES generations of 4 members, one child per operator; ``over`` are further
    ``--set`` overrides."""
    sets = {
        "evolvers.es.total_generations": 2,
        "evolvers.es.rollout.children_per_operator": 1,
        "evolvers.es.population_size": 4,
    }
    return make_loop(
        tmp_path, "sample_es/tsp_construct.yaml", shipped("sample", str(model_dir), **sets, **over), policy
    )


def objectives(problem, instances, codes: dict[str, str]) -> dict[str, float]:
    """Reply text -> mean objective of its code on ``instances`` (evaluated independently of the run)."""
    out = {}
    for text, code in codes.items():
        res = evaluate_heuristic(problem, code, instances, with_reference=False)
        assert res.valid, res.error
        out[text] = res.objective
    return out


def paper_rewards(children: list[list[dict]]) -> list[float]:
    """The paper's member rewards, written out independently of coevo (docs/references.md §2).

    ``children[i]`` lists member i's children as dicts {objective (None = invalid), parent, worst}.
    """
    sampled = [c["objective"] for cs in children for c in cs if c["parent"] is None and c["objective"] is not None]
    fill = (
        min(-o for o in sampled) - (statistics.pstdev([-o for o in sampled]) if len(sampled) > 1 else 0.0)
        if sampled
        else 0.0
    )
    rewards = []
    for cs in children:
        rs = []
        for c in cs:
            if c["parent"] is None:
                rs.append(fill if c["objective"] is None else -c["objective"])
            elif c["objective"] is None or c["objective"] > c["worst"]:
                rs.append(max(c["parent"] - c["worst"], -1.0))
            else:
                rs.append(c["parent"] - c["objective"])
        rewards.append(sum(rs) / len(rs))
    return rewards


def es_children(store: TrajectoryStore, run_id: str, history: list[dict]) -> dict[int, list[Trajectory]]:
    """ES trajectories grouped by the ES generation (history row) whose seeds tagged them, in id order."""
    out: dict[int, list[Trajectory]] = {}
    for t in store.query(run_id=run_id, evolver="es", order_by="id"):
        g = next((i for i, h in enumerate(history) if t.member.seed in h["seeds"]), -1)
        out.setdefault(g, []).append(t)
    return out


# ------------------------------------------------------------------------------------ reward rule
def _child(objective, parent=None, worst=None, valid=True, sign=-1.0) -> Trajectory:
    """A recorded child of a minimisation problem (``sign=-1``: score = -objective) or of a maximisation one
    (``sign=+1``), with its best parent's and the population's worst objective and score."""
    meta = {
        "objective": objective if valid else None,
        "parent_objective": parent,
        "worst_objective": worst,
        "parent_score": None if parent is None else sign * parent,
        "worst_score": None if worst is None else sign * worst,
    }
    return one_step_trajectory(
        key=f"k{objective}{parent}{valid}", reward=None if not valid else sign * objective, valid=valid, meta=meta
    )


def test_member_rewards_follow_the_paper_rule_on_a_constructed_case():
    ro = EoHChildrenRollout(EoHChildrenConfig(), None)
    members = [
        [_child(4.0, 5.0, 7.0), _child(6.0, 5.0, 7.0)],  # 5-4 = 1, 5-6 = -1       -> 0.0
        [_child(8.0, 5.0, 7.0), _child(None, 6.5, 7.0, valid=False)],  # worse than worst: max(5-7,-1) = -1;
        # invalid: max(6.5-7, -1) = -0.5                                           -> -0.75
        [_child(3.0, 9.0, 20.0), _child(None, 2.0, 9.0, valid=False)],  # 6; max(-7, -1) = -1 -> 2.5
    ]
    assert ro.population_rewards(members) == pytest.approx([0.0, -0.75, 2.5])
    # sampling: R = -child; invalid -> min(valid R) - pstd(valid R) over the whole generation
    samples = [[_child(3.0), _child(None, valid=False)], [_child(5.0), _child(4.0)]]
    fill = -5.0 - statistics.pstdev([-3.0, -5.0, -4.0])
    assert ro.population_rewards(samples) == pytest.approx([(-3.0 + fill) / 2, -4.5])
    assert ro.population_rewards([[_child(None, valid=False)]] * 2) == [0.0, 0.0]  # nothing valid: all equal
    zero = EoHChildrenRollout(EoHChildrenConfig(invalid="zero"), None)
    assert zero.population_rewards([[_child(None, 5.0, 7.0, valid=False)], samples[0]]) == [0.0, -1.5]


def test_member_rewards_are_in_score_space_for_a_maximising_problem():
    """Knapsack value is maximised: a child worth 120 from a parent worth 100 must be rewarded +20, not -20."""
    ro = EoHChildrenRollout(EoHChildrenConfig(), None)
    better, worse_than_worst = _child(120.0, 100.0, 90.0, sign=1.0), _child(80.0, 100.0, 90.0, sign=1.0)
    invalid = _child(None, 100.0, 90.0, valid=False, sign=1.0)
    assert ro.population_rewards([[better], [worse_than_worst], [invalid]]) == pytest.approx([20.0, -1.0, -1.0])
    assert ro.population_rewards([[_child(70.0, sign=1.0)], [_child(50.0, sign=1.0)]]) == [70.0, 50.0]  # i1


def _failed(kind: str) -> Trajectory:
    t = _child(None, 5.0, 7.0, valid=False)
    t.failure, t.key = kind, f"k{kind}"
    return t


def test_rank_rewards_separate_members_whose_children_are_all_invalid():
    """reward: rank -- how far a child got orders invalid children (no code < syntax < runtime < wrong answer <
    duplicate) below every valid one, and valid ones by the paper's reward; the paper's rule gives these
    members equal rewards, so ES would apply no update."""
    ro = EoHChildrenRollout(EoHChildrenConfig(reward="rank"), None)
    paper = EoHChildrenRollout(EoHChildrenConfig(), None)
    invalid = [
        [_failed("parse")],
        [_failed("syntax")],
        [_failed("runtime")],
        [_failed("return_type")],
        [_failed("duplicate")],
    ]
    assert len(set(paper.population_rewards(invalid))) == 1
    assert ro.population_rewards(invalid) == pytest.approx([-0.5, -0.25, 0.0, 0.25, 0.5])
    mixed = [
        [_child(6.0, 5.0, 7.0), _failed("parse")],
        [_child(4.0, 5.0, 7.0), _failed("parse")],
        [_failed("syntax"), _failed("parse")],
    ]  # rewards of the valid ones: -1 and +1 (parent - child)
    r = ro.population_rewards(mixed)  # ranks of the 6 children: parse x3 share 1.0, syntax 3, -1: 4, +1: 5
    assert r == pytest.approx(
        [(4 / 5 - 0.5 + 1 / 5 - 0.5) / 2, (1 - 0.5 + 1 / 5 - 0.5) / 2, (3 / 5 - 0.5 + 1 / 5 - 0.5) / 2]
    )
    assert r[1] > r[0] > r[2]
    assert ro.population_rewards([[_failed("parse")], [_failed("llm_error")]]) == [0.0, 0.0]  # all equal: no signal


def test_kp_construct_children_rewarded_by_value_gained(tmp_path):
    """Through the real pieces on kp_construct (maximising): an EoH population of the first-fit template, ES
    members whose m1 children are the value-density greedy (better) and a lowest-value-first rule (worse);
    member rewards follow the knapsack values the sandbox measured, in score space."""
    from test_eoh import ScriptedPolicy

    from coevo.budget import Budget
    from coevo.context import RunContext
    from coevo.evolvers.eoh import EoHConfig, EoHEvolver

    first_fit = load_problem("kp_construct").template_code()
    density = load_problem("kp_construct").seed_heuristic_code()
    cheapest = first_fit.replace(
        "return int(fits[0]) if len(fits) else -1", "return int(fits[np.argmin(values[fits])]) if len(fits) else -1"
    )
    assert cheapest != first_fit
    store = TrajectoryStore(tmp_path / "store.sqlite")
    policy = ScriptedPolicy([reply(first_fit, "take the first item that fits"), GARBAGE])
    ctx = RunContext(
        run_id="r", run_dir=tmp_path, store=store, budget=Budget(store, "r"), seed=5, policy_factory=lambda: policy
    )
    eoh = EoHEvolver(
        "eoh",
        EoHConfig(
            problem="kp_construct",
            train_size=50,
            train_count=2,
            population_size=1,
            eval_timeout_s=10,
            test_sizes=[50],
            test_count=1,
        ),
        ctx,
    )
    ctx.evolvers = {"eoh": eoh}
    eoh.step(0)
    (parent,) = eoh.population
    ro = EoHChildrenRollout(EoHChildrenConfig(evolver="eoh", operators=["m1"]), ctx)
    members = []
    for index, code in enumerate((density, cheapest)):
        policy.script, policy.calls = [reply(code)], 0
        members.append(ro.run(policy, generation=0, member=None, key_prefix=f"r/es/g00000/m{index:03d}"))
    values = {
        c: evaluate_heuristic(eoh.problem, c, eoh.train_instances, with_reference=False).objective
        for c in (first_fit, density, cheapest)
    }
    assert values[density] > values[first_fit] > values[cheapest]  # more value is better
    assert [ts[0].meta["parent_score"] for ts in members] == [pytest.approx(parent.reward)] * 2
    assert parent.reward == pytest.approx(values[first_fit])
    rewards = ro.population_rewards(members)
    assert rewards[0] == pytest.approx(values[density] - values[first_fit]) and rewards[0] > 0
    assert rewards[1] == pytest.approx(max(values[first_fit] - values[first_fit], -1.0))  # worse than the worst
    store.close()


# ------------------------------------------------------------------------------- scripted eoh_es
EOH_INIT = [
    reply(NN),
    GARBAGE,
    reply(FARTHEST),
    SYNTAX,
    reply(TOWARD_HOME),
    reply(RETURNS_FLOAT),
    reply(FIRST_INDEX),
    GARBAGE,
]
ES_G0 = [
    reply(TOWARD_HOME_2),
    GARBAGE,
    reply(FARTHEST),
    reply(NN),
    SYNTAX,
    reply(RETURNS_FLOAT),
    GARBAGE,
    reply(SECOND_NEAREST),
]
EOH_G1 = [GARBAGE, reply(FIRST_INDEX), GARBAGE, GARBAGE]
ES_G1 = [
    reply(NN),
    GARBAGE,
    reply(SECOND_NEAREST),
    reply(TOWARD_HOME),
    reply(FIRST_INDEX),
    SYNTAX,
    reply(TOWARD_HOME_2),
    reply(FARTHEST),
]
EOH_G2 = [GARBAGE] * 4
CODES = {reply(c): c for c in (NN, TOWARD_HOME, TOWARD_HOME_2, SECOND_NEAREST, FIRST_INDEX, FARTHEST)}


def _parent_rule_case(store, kids: list[Trajectory], obj: dict[str, float]) -> list[list[dict]]:
    """The children of one ES generation (2 per member, m1 then m2) as inputs of :func:`paper_rewards`, after
    checking their recorded parent objective against the parent's own stored trajectory."""
    case = []
    for i in range(0, len(kids), 2):
        member = []
        for t in kids[i : i + 2]:
            parent = store.get_by_key(f"run/{t.meta['parent_ids'][0]}")
            assert parent.valid and t.meta["parent_objective"] == pytest.approx(parent.meta["objective"])
            assert t.meta["worst_objective"] >= t.meta["parent_objective"]
            child = obj.get(t.steps[0].model_output) if t.valid else None
            assert child is None or t.meta["objective"] == pytest.approx(child)
            member.append(
                {"objective": child, "parent": t.meta["parent_objective"], "worst": t.meta["worst_objective"]}
            )
        case.append(member)
    return case


def test_scripted_eoh_es_through_the_loop(tmp_path, tiny_model_dir):
    policy = ScriptedTinyQwen(tiny_model_dir, EOH_INIT + ES_G0 + EOH_G1 + ES_G1 + EOH_G2 + [reply(NN)])
    start = policy.fingerprint()
    # the script repeats codes on purpose and checks the paper's parent rule against stored parents:
    # duplicates are evaluated here and the seed heuristic stays out (both have tests of their own)
    loop = make_loop(
        tmp_path,
        "tsp_construct.yaml",
        shipped(
            "eoh",
            str(tiny_model_dir),
            **{
                "evolvers.eoh.reject_duplicates": "false",
                "evolvers.eoh.reject_same_behaviour": "false",
                "evolvers.eoh.include_seed_heuristic": "false",
                "evolvers.eoh.offspring_per_operator": 1,  # the script's order: 4 EoH children per generation
                "evolvers.eoh.parse_retries": 0,  # retries (tests of their own) would take the script's next replies
                "evolvers.eoh.duplicate_retries": 0,
                "evolvers.tune.max_evaluations": 1,  # tune (tests of its own) would change the parents drawn
                "evolvers.es.perturbation": "full",  # members one after another, as the script is written
                "evolvers.es.rollout.reward": "paper",  # the main job ranks children; this test checks the paper rule
                "budget.max_samples": 40,
                "evolvers.es.total_generations": 3,
                "evolvers.es.sigma": 0.02,
                "evolvers.es.alpha": 0.01,
                "evolvers.es.population_size": 4,
            },
        ),
        policy,
    )
    eoh, es = loop.evolvers["eoh"], loop.evolvers["es"]
    summary = loop.run()
    assert "sample budget reached (40/40" in summary.stop_reason
    run = tmp_path / "run"
    obj = objectives(eoh.problem, eoh.train_instances, CODES)
    with TrajectoryStore(run / "store.sqlite") as store:
        hist = store.es_history("run", "es")
        assert [h["sigma"] for h in hist] == pytest.approx([0.02, 0.01, 0.0])  # cosine 0.02 -> 0
        kids = es_children(store, "run", hist)
        assert sorted(kids) == [0, 1, 2] and [len(kids[g]) for g in range(3)] == [8, 8, 8]
        # children are tagged with their member (seed, sign, sigma, index) of that generation
        for g, h in enumerate(hist):
            for j, t in enumerate(kids[g]):
                m = t.member
                assert (m.index, m.seed, m.sign, m.sigma) == (
                    j // 2,
                    h["seeds"][j // 2],
                    h["signs"][j // 2],
                    h["sigma"],
                )
                assert t.space == "parameter" and t.llm_calls == 1 and t.meta["problem"] == "tsp_construct"
            assert [t.meta["operator"] for t in kids[g]] == ["m1", "m2"] * 4
        assert Counter(t.failure for t in kids[0]) == {None: 4, "parse": 2, "syntax": 1, "return_type": 1}
        # member rewards: parent - child; invalid / worse than the worst: max(parent - worst, -1)
        for g in (0, 1):
            assert hist[g]["rewards"] == pytest.approx(paper_rewards(_parent_rule_case(store, kids[g], obj)))
            assert len(set(hist[g]["rewards"])) > 1
        # pooling: EoH folded the valid ES children in at its next step
        steps = {
            (a.content["round"], a.content["evolver"]): a.content
            for a in store.list_artifacts(kind=LOOP_STEP, run_id="run")
        }
        assert steps[(1, "eoh")]["metrics"]["pooled"] == sum(t.valid for t in kids[0]) == 4
        assert steps[(2, "eoh")]["metrics"]["pooled"] == sum(t.valid for t in kids[1]) == 6
        assert "es" in {i.source for i in eoh.population}
        # every LLM call is one recorded trajectory and counts in the budget
        trajs = store.query(run_id="run")
        assert len(trajs) == policy.calls == store.count_llm_calls("run") == summary.samples == 40
    # weights: members see perturbed weights; updates at sigma > 0; none at the zero-sigma last generation
    assert [n for n, _ in policy.batches] == [8] + [2] * 4 + [4] + [2] * 4 + [4] + [2] * 4
    prints = [f for _, f in policy.batches]
    centre1, centre2 = prints[5], prints[10]
    assert prints[0] == start and len({start, *prints[1:5]}) == 5 and len({centre1, *prints[6:10]}) == 5
    assert len({start, centre1, centre2}) == 3  # two real updates
    assert set(prints[11:]) == {centre2}  # sigma 0: the members hold the centre weights; no update after
    assert hist[2]["skipped"] and hist[2]["weight_hash_before"] == hist[2]["weight_hash_after"] == es.weights_hash
    assert hist[1]["weight_hash_before"] != hist[1]["weight_hash_after"]
    report = (run / "report.md").read_text()
    assert "### ES `es`" in report and "| size | instances | seed objective |" in report
    assert (run / "best_heuristic.py").exists()
    # the AHD section: per ES generation, the valid-child rate and the child objectives of the stored children
    rows = [
        [c.strip() for c in line.strip("|").split("|")] for line in report.splitlines() if line.startswith("| es |")
    ]
    rows = [r for r in rows if r[1].isdigit()]  # not the Evolvers table
    assert len(rows) == 3
    for g, cells in enumerate(rows):
        objs = [t.meta["objective"] for t in kids[g] if t.valid]
        better = sum(t.valid and t.meta["objective"] < t.meta["parent_objective"] for t in kids[g])
        assert cells[:6] == ["es", str(g), fmt(hist[g]["sigma"]), "8", str(len(objs)), f"{100 * len(objs) / 8:.0f}%"]
        assert cells[6:9] == [fmt(min(objs)), fmt(sum(objs) / len(objs)), str(better)]
    assert rows[0][9] == "parse: 2, return_type: 1, syntax: 1"


def test_shipped_headline_config_default_plan(tmp_path, tiny_model_dir):
    """configs/ahd/tsp_construct.yaml as shipped (only sizes and the model shrunk): EoH initialisation (8), then
    per round one low-rank ES generation (two antithetic pairs, m1 + m2 each: 8 children in one population
    call) and one EoH generation (8 children); ES sigma 1e-3, 7.5e-4, 2.5e-4, 0 (updates at generations 0-2,
    generation 3 only searches); 64 samples. Low-rank members never touch the weights: every call before an
    update sees the same weights, and they change only where the history says an update moved them."""
    policy = ScriptedTinyQwen(tiny_model_dir, EOH_INIT + ES_G0[:4] + EOH_G1 + ES_G1[:4])
    # the retries re-ask the script's garbage replies (batch sizes then follow the script): tested on their own
    no_retries = {"evolvers.eoh.parse_retries": 0, "evolvers.eoh.duplicate_retries": 0}
    summary = make_loop(tmp_path, "tsp_construct.yaml", shipped("eoh", str(tiny_model_dir), **no_retries), policy).run()
    assert "sample budget reached (64/64" in summary.stop_reason and policy.calls == 64
    assert [n for n, _ in policy.batches] == [8] * 8
    assert policy.kinds == ["policy"] + ["population", "policy"] * 3 + ["population"]
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        hist = store.es_history("run", "es")
        assert [h["sigma"] for h in hist] == pytest.approx([1e-3, 7.5e-4, 2.5e-4, 0.0])
        assert [h["perturbation"] for h in hist] == ["lowrank"] * 4
        assert [h["signs"] for h in hist] == [[1, -1, 1, -1]] * 4
        assert [h["skipped"] for h in hist] == [False, False, False, True]
        assert hist[3]["weight_hash_before"] == hist[3]["weight_hash_after"]
        kids = es_children(store, "run", hist)
        assert all(t.key.startswith("run/es/g000") and "run/run" not in t.key for ts in kids.values() for t in ts)
        assert [(t.member.index, t.member.sign, t.meta["operator"]) for t in kids[0]] == [
            (i, sign, op) for i, sign in enumerate((1, -1, 1, -1)) for op in ("m1", "m2")
        ]
    prints = [f for _, f in policy.batches]
    # calls: init, ES g0, EoH g1, ES g1, EoH g2, ES g2, EoH g3, ES g3; an ES generation and the EoH generation
    # after it see the weights after the previous update
    assert prints[0] == prints[1]
    for g, (before, after) in enumerate(((1, 2), (3, 4), (5, 6))):
        assert prints[after] == prints[after + 1]
        assert (prints[after] != prints[before]) == (hist[g]["weight_hash_after"] != hist[g]["weight_hash_before"])
    assert any(h["weight_hash_after"] != h["weight_hash_before"] for h in hist[:3])  # ES moved the weights


def test_scripted_eoh_es_budget_counts_every_call(tmp_path, tiny_model_dir):
    policy = ScriptedTinyQwen(tiny_model_dir, EOH_INIT + ES_G0)
    loop = make_loop(
        tmp_path,
        "eoh_es/tsp_construct.yaml",
        shipped("eoh", str(tiny_model_dir), **{"budget.max_samples": 13, "evolvers.es.population_size": 4}),
        policy,
    )
    summary = loop.run()
    assert "cannot cover ES generation 0 (8 samples" in summary.stop_reason  # 5 left after EoH's 8
    assert policy.calls == summary.samples == 8
    policy2 = ScriptedTinyQwen(tiny_model_dir, [GARBAGE])
    loop2 = make_loop(
        tmp_path / "b",
        "eoh/tsp_construct.yaml",
        shipped("eoh", str(tiny_model_dir), **{"budget.max_samples": 13}),
        policy2,
    )
    summary2 = loop2.run()  # garbage only: 8 init calls, then a retry cut to the 5 samples left
    assert "sample budget reached (13/13" in summary2.stop_reason and policy2.calls == 13


# ------------------------------------------------------------------------------ scripted sample_es
def test_scripted_sample_es_through_the_loop(tmp_path, tiny_model_dir):
    es_g0 = [reply(TOWARD_HOME), GARBAGE, reply(FARTHEST), reply(NN)]
    samp = [reply(FIRST_INDEX), GARBAGE, reply(SECOND_NEAREST), SYNTAX]
    es_g1 = [GARBAGE, SYNTAX, reply(FIRST_INDEX), reply(TOWARD_HOME_2)]
    policy = ScriptedTinyQwen(tiny_model_dir, samp + es_g0 + samp + es_g1 + samp + [GARBAGE])
    loop = sample_es_loop(
        tmp_path,
        tiny_model_dir,
        policy,
        **{
            "evolvers.sample.reject_duplicates": "false",  # the script repeats codes on purpose
            "evolvers.sample.include_seed_heuristic": "false",  # the best comes from the samples only
            "evolvers.sample.reject_same_behaviour": "false",
            "budget.max_samples": 20,
            "evolvers.es.sigma": 0.02,
        },
    )
    sample = loop.evolvers["sample"]
    summary = loop.run()
    assert "sample budget reached (20/20" in summary.stop_reason
    obj = objectives(sample.problem, sample.train_instances, CODES)
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        hist = store.es_history("run", "es")
        kids = es_children(store, "run", hist)
        for g in (0, 1):
            assert [t.member.index for t in kids[g]] == [0, 1, 2, 3]
            assert {t.meta["operator"] for t in kids[g]} == {"i1"}
            case = [
                [{"objective": obj.get(t.steps[0].model_output) if t.valid else None, "parent": None, "worst": None}]
                for t in kids[g]
            ]
            assert hist[g]["rewards"] == pytest.approx(paper_rewards(case))
        assert hist[1]["rewards"][0] == hist[1]["rewards"][1] < hist[1]["rewards"][2]  # invalid fill below valid
        assert hist[1]["skipped"] and hist[1]["weight_hash_before"] == hist[1]["weight_hash_after"]
        assert policy.calls == store.count_llm_calls("run") == 4 + 4 + 4 + 4 + 4  # sample first in round 0
    # the sampling evolver's best considers the ES members' samples (TOWARD_HOME beats everything sampled)
    best = min((obj[reply(c)], c) for c in (TOWARD_HOME, FIRST_INDEX, SECOND_NEAREST, FARTHEST, NN, TOWARD_HOME_2))
    assert sample.best.objective == pytest.approx(best[0])
    assert best[1] in (TOWARD_HOME, NN, TOWARD_HOME_2) and sample.best.source == "es"
    # best_heuristic.py names the ES member and generation whose perturbed weights wrote it
    made_by = (tmp_path / "run" / "best_heuristic.py").read_text().splitlines()[1]
    m = sample.best.member
    assert (
        made_by.startswith(
            "# Made by evolver 'es', operator i1, written under the perturbed weights of ES member "
            f"{m['index']} (seed {m['seed']}, sign {m['sign']:+d}"
        )
        and "of ES generation" in made_by
    )
    report = (tmp_path / "run" / "report.md").read_text()
    assert "best ES member reward R_i of the generation" in report and "| best beats seed |" in report


# ------------------------------------------------------------------------------- real tiny model
def test_tiny_model_eoh_es_invalid_children(tmp_path, tiny_model_dir):
    # ES first in round 0: the EoH population is still empty, so members fall back to i1 samples
    loop = es_first_eoh_loop(
        tmp_path,
        tiny_model_dir,
        **{
            "evolvers.es.total_generations": 2,
            "evolvers.es.rollout.reward": "paper",  # this test checks the paper's rule on invalid children
        },
    )
    summary = loop.run()
    assert "sample budget reached (28/28" in summary.stop_reason
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        trajs = store.query(run_id="run")
        assert len(trajs) == store.count_llm_calls("run") == summary.samples == 8 + 8 + 8 + 4
        assert all(not t.valid and t.reward is None and t.failure for t in trajs)
        es = [t for t in trajs if t.evolver == "es"]
        assert len(es) == 16 and all(t.member is not None for t in es)
        assert Counter(t.meta["operator"] for t in es) == {"i1": 8, "m1": 4, "m2": 4}
        assert all(t.meta["parent_ids"] == ["seed"] for t in es if t.meta["operator"] != "i1")
        hist = store.es_history("run", "es")
        # all invalid: the sampling fill is 0 (nothing valid), the EoH rule gives max(seed - seed, -1) = 0
        assert [h["rewards"] for h in hist] == [[0.0] * 4, [0.0] * 4]
        assert hist[1]["sigma"] == 0.0 and hist[1]["skipped"]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "### ES `es`" in report and "Best heuristic `seed`" in report


def test_tiny_model_sample_es_invalid_children(tmp_path, tiny_model_dir):
    # no seed heuristic: no valid heuristic at all
    sets = {"evolvers.sample.batch": 2, "evolvers.sample.include_seed_heuristic": "false"}
    loop = sample_es_loop(tmp_path, tiny_model_dir, **sets)
    summary = loop.run()
    assert "ES completed its 2 generations" in summary.stop_reason
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        trajs = store.query(run_id="run")
        assert len(trajs) == store.count_llm_calls("run") == 2 + 4 + 2 + 4 + 2
        assert all(not t.valid and t.failure for t in trajs)
        assert Counter(t.evolver for t in trajs) == {"es": 8, "sample": 6}
        assert [h["rewards"] for h in store.es_history("run", "es")] == [[0.0] * 4, [0.0] * 4]
    assert "No valid heuristic was found" in (tmp_path / "run" / "report.md").read_text()

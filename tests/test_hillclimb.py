"""The heuristic-design example of docs/extending.md, which is the built-in ``hillclimb`` evolver
(coevo/evolvers/hillclimb.py, LLM4AD's (1+1)-EPS): the docs block is the module, under 80 lines; run from the
docs through the real loop it keeps one incumbent replaced only by a strictly better variant, a tie keeps the
earliest and the report says "Tie", and a run stopped and resumed ends where an uninterrupted one does; with ES
(the docs' yaml, the plug-in written as the docs say) the members write m1 variants of the incumbent.

The policies are test doubles for the model's *outputs* only (:class:`test_eoh.ScriptedPolicy`, and
:class:`test_ahd_coevo.ScriptedTinyQwen`, whose tiny Qwen2 weights ES really perturbs): prompting, extraction,
sandboxed evaluation on real TSP instances, the SQLite store, ES, the loop and the report run for real.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from test_ahd_coevo import ScriptedTinyQwen
from test_eoh import FARTHEST, FIRST_INDEX, NN, NN_SAME_OBJECTIVE, SMALL, TOWARD_HOME, ScriptedPolicy, _ctx, reply

from coevo.ahd.population import Individual
from coevo.config import load_config, parse_config
from coevo.evolvers import AHDEvolver, StepReport
from coevo.evolvers.base import EVOLVERS
from coevo.evolvers.eoh import EoHConfig, EoHEvolver
from coevo.evolvers.hillclimb import HillClimbConfig, HillClimbEvolver
from coevo.loop import CoEvolutionLoop
from coevo.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
MODULE = ROOT / "coevo" / "evolvers" / "hillclimb.py"

pytestmark = pytest.mark.usefixtures("private_cache")

GARBAGE = "No code today."
#: two replies per step (batch 2): a tie and a worse one; a better one and garbage; two worse ones
SCRIPT = [
    reply("Nearest city written with min().", NN_SAME_OBJECTIVE),
    reply("Go to the farthest city.", FARTHEST),
    reply("Nearest city, but prefer cities near home.", TOWARD_HOME),
    GARBAGE,
    reply("Visit cities in index order.", FIRST_INDEX),
    reply("Go to the nearest city.", NN),
]


def _docs_blocks() -> tuple[str, dict]:
    text = DOC.read_text()
    start = text.index("<!-- example: hillclimb")
    code = re.search(r"```python\n(.*?)```", text[start:], re.DOTALL).group(1)
    config = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text[start:], re.DOTALL).group(1))
    return code, config


@pytest.fixture
def docs_class():
    """The docs block executed as code (registered as ``hillclimb`` in place of the built-in, restored after)."""
    code, _ = _docs_blocks()
    EVOLVERS.remove("hillclimb")
    namespace: dict = {"__name__": "docs_hillclimb"}
    try:
        exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - the docs example is our own code
        yield namespace["HillClimbEvolver"]
    finally:
        EVOLVERS.remove("hillclimb")
        EVOLVERS.add("hillclimb", HillClimbEvolver)


def test_the_docs_block_is_the_shipped_module_under_80_lines():
    code, _ = _docs_blocks()
    assert code == MODULE.read_text()
    assert len(code.splitlines()) < 80


def _config(rounds: int) -> dict:
    hc = {
        "name": "hc",
        "type": "hillclimb",
        **SMALL,
        "batch": 2,
        "reject_same_behaviour": False,
    }  # the tie is the point: a twin is kept valid
    return {
        "run": {"name": "hc", "seed": 5},
        "budget": {"max_rounds": rounds},
        "evolvers": [hc],
        "report": {"plots": False},
    }


def _run(run_dir: Path, rounds: int, policy, resume: bool = False) -> CoEvolutionLoop:
    data = _config(rounds)
    loop = CoEvolutionLoop(
        parse_config(data), run_dir, raw_config=data, resume=resume, progress=False, policy_factory=lambda: policy
    )
    loop.run()
    return loop


def _trajectories(run_dir: Path) -> list[tuple]:
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        return [(t.key, t.reward, t.failure, t.steps[0].model_output) for t in s.query(run_id="run", order_by="id")]


def test_docs_hillclimb_keeps_one_incumbent_replaced_only_by_a_strictly_better_variant(docs_class, tmp_path):
    policy = ScriptedPolicy(SCRIPT)
    loop = _run(tmp_path / "run", 3, policy)
    hc = loop.evolvers["hc"]
    assert type(hc) is docs_class and hc.population == [hc.incumbent]
    with TrajectoryStore(tmp_path / "run" / "store.sqlite", readonly=True) as s:
        trajs = s.query(run_id="run", order_by="id")
        steps = {a.content["round"]: a.content for a in s.list_artifacts(kind="loop_step", run_id="run")}
    assert [t.meta["operator"] for t in trajs] == ["m1"] * 6 and len(trajs) == policy.calls == 6
    # every call improves the incumbent of its step: the seed (steps 0, 1; the tie did not replace it), then TOWARD
    assert [t.meta["parent_ids"] for t in trajs] == [["seed"]] * 4 + [[trajs[2].key.split("/", 1)[1]]] * 2
    assert "Idea: {Nearest neighbour: go to the closest node not yet visited.}" in policy.prompts[0]
    assert "Idea: {Nearest city, but prefer cities near home.}" in policy.prompts[4]
    tie, worse, better = trajs[0], trajs[1], trajs[2]
    assert tie.reward == pytest.approx(steps[0]["best_reward"]) and worse.reward < tie.reward < better.reward
    assert steps[0]["metrics"]["incumbent_objective"] == pytest.approx(-tie.reward)  # the seed's: a tie keeps it
    assert hc.incumbent.id == better.key.split("/", 1)[1] and hc.best.id == hc.incumbent.id
    assert trajs[3].failure == "parse" and trajs[4].reward < better.reward and trajs[5].reward < better.reward
    assert steps[2]["best_reward"] == pytest.approx(better.reward)


def test_a_stopped_and_resumed_docs_hillclimb_ends_where_an_uninterrupted_one_does(docs_class, tmp_path):
    ref = _run(tmp_path / "ref" / "run", 3, ScriptedPolicy(SCRIPT))
    policy = ScriptedPolicy(SCRIPT)
    _run(tmp_path / "cut" / "run", 2, policy)
    resumed = _run(tmp_path / "cut" / "run", 3, policy, resume=True)
    assert _trajectories(tmp_path / "cut" / "run") == _trajectories(tmp_path / "ref" / "run")
    assert resumed.evolvers["hc"].state_dict() == ref.evolvers["hc"].state_dict()


def test_a_tie_keeps_the_earliest_heuristic_and_the_report_says_tie(tmp_path):
    policy = ScriptedPolicy([SCRIPT[0], SCRIPT[1]])  # a twin of the seed and a worse one
    hc = HillClimbEvolver(
        "hc", HillClimbConfig(**SMALL, batch=2, reject_same_behaviour=False), _ctx(tmp_path, policy=policy)
    )
    hc.step(0)
    twin = hc.ctx.store.query(run_id="r", order_by="id")[0]
    assert twin.valid and twin.reward == hc.incumbent.reward
    assert hc.incumbent.id == hc.best.id == "seed"
    report = hc.report_markdown()
    assert "is the problem's seed heuristic" in report
    assert not SMALL.get("include_seed_heuristic")  # the climber starts from the seed anyway: not said missing
    assert "seed heuristic was not in the population" not in report
    assert "Tie: 1 other heuristic(s) reach the same training objective" in report and twin.key[2:] in report
    # the same in a population (EoH with the seed heuristic): the seed, the earliest, stays the best
    eoh = EoHEvolver("eoh", EoHConfig(**SMALL, include_seed_heuristic=True), _ctx(tmp_path / "e", policy=policy))
    seed, later = eoh.sampler.seed_individual(), Individual.from_trajectory(twin)
    eoh.population = [later, seed]
    assert eoh.publish_best() and eoh.best.id == "seed"
    # also when survivors have since kept the later twin alone (one heuristic per objective): the seed was earlier
    eoh2 = EoHEvolver("eoh", EoHConfig(**SMALL, include_seed_heuristic=True), _ctx(tmp_path / "f", policy=policy))
    eoh2.population = [seed]
    eoh2.population = [later]
    assert eoh2.publish_best() and eoh2.best.id == "seed"


def test_a_subclass_that_leaves_out_super_in_its_state_raises(tmp_path):
    class Forgetful(HillClimbEvolver):
        def state_dict(self):
            return {"steps": self.steps}

        def load_state_dict(self, state):
            self.steps = state["steps"]

    ev = Forgetful("hc", HillClimbConfig(**SMALL), _ctx(tmp_path))
    with pytest.raises(TypeError, match=r"Forgetful.state_dict\(\) must return \{\*\*super\(\).state_dict\(\)"):
        ev.state_dict()
    with pytest.raises(TypeError, match=r"must call super\(\).load_state_dict\(state\)"):
        ev.load_state_dict({"steps": 1})
    assert isinstance(ev, AHDEvolver)


@pytest.mark.usefixtures("one_torch_thread")
def test_the_docs_yaml_runs_the_plugin_beside_es_whose_members_write_its_variants(
    tmp_path, tiny_model_dir, monkeypatch
):
    """The newcomer's path: the docs block saved as ``mymodule.py`` under another name, the docs' yaml run in that
    folder; ES members (no ``operators`` in the rollout) write m1 variants of the climber's incumbent."""
    code, config = _docs_blocks()
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "mymodule.py").write_text(code.replace('@register_evolver("hillclimb")', '@register_evolver("my-climb")'))
    (folder / "climb.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        sets = [f"evolvers.climb.{k}={v}" for k, v in SMALL.items() if k != "problem"]
        sets += ["evolvers.climb.test_sizes=[8]", "budget.max_samples=10", "report.plots=false"]
        cfg, raw = load_config(folder / "climb.yaml", sets)
        # calls in order: climb round 0 (2), climb round 1 (2), ES generation 0 (2 members), climb round 2 (2), ES 1 (2)
        r0, r1, r2 = [reply("a", FARTHEST), reply("b", TOWARD_HOME)], [reply("c", FIRST_INDEX), GARBAGE], [GARBAGE] * 2
        es0, es1 = [reply("d", NN_SAME_OBJECTIVE), GARBAGE], [reply("e", FARTHEST), GARBAGE]  # valid, worse
        policy = ScriptedTinyQwen(tiny_model_dir, r0 + r1 + es0 + r2 + es1)
        loop = CoEvolutionLoop(cfg, folder / "run", raw_config=raw, progress=False, policy_factory=lambda: policy)
        climb = loop.evolvers["climb"]
        assert type(climb).__module__ == "mymodule"
        loop.run()
        with TrajectoryStore(folder / "run" / "store.sqlite", readonly=True) as s:
            kids = s.query(run_id="run", evolver="es", order_by="id")
            own = s.query(run_id="run", evolver="climb", order_by="id")
        assert len(kids) == 4 and {t.meta["operator"] for t in kids} == {"m1"}
        toward = next(t for t in own if t.steps[0].model_output == reply("b", TOWARD_HOME))
        assert all(t.meta["parent_ids"] == [toward.key.split("/", 1)[1]] for t in kids)
        assert all(t.meta["sampler"] == "climb" and t.member is not None for t in kids)
        (pooled,) = [t for t in kids if t.valid and t.generation == 0]
        assert climb.pool_cursor == pooled.id  # round 2's step weighed the ES variant (worse: the incumbent stays)
        assert climb.incumbent.id == toward.key.split("/", 1)[1]
        assert (folder / "run" / "plugins.json").read_text().count(str(folder / "mymodule.py")) == 1
    finally:
        EVOLVERS.remove("my-climb")
        sys.modules.pop("mymodule", None)


class TopThree(AHDEvolver):
    """A search written from docs/extending.md's list alone, on the base's default population (no state of its
    own): i1 until it holds a heuristic, then one e1 call on its two best; keeps the three best."""

    def step(self, round_index):
        """One call; the population keeps the three best valid heuristics."""
        parents = self.population[:2]
        op = "e1" if parents else "i1"
        rng = self.ctx.rng(self.name, round_index)
        job = self.sampler.job(
            op, key=self.sampler.key(self.name, round_index), seed=rng.getrandbits(63), parents=parents
        )
        trajs = self.sampler.sample([job], round_index=round_index, generation=round_index, existing=self.population)
        new = [Individual.from_trajectory(t) for t in trajs if t.valid]
        self.population = sorted(self.population + new, key=lambda i: -i.reward)[:3]
        self.publish_best()
        return StepReport(samples=len(trajs), trajectories=len(trajs))


def test_a_search_on_the_default_population_resumes_without_state_of_its_own(tmp_path):
    script = [reply("a", FARTHEST), GARBAGE, reply("b", TOWARD_HOME), reply("c", FIRST_INDEX), reply("d", NN)]

    def run(run_dir, rounds, policy, resume=False):
        data = {"run": {"name": "t", "seed": 1}, "budget": {"max_rounds": rounds}, "report": {"plots": False}}
        data["evolvers"] = [{"name": "top", "type": f"{__name__}:TopThree", **SMALL}]
        loop = CoEvolutionLoop(
            parse_config(data), run_dir, raw_config=data, resume=resume, progress=False, policy_factory=lambda: policy
        )
        loop.run()
        return loop.evolvers["top"]

    ref = run(tmp_path / "ref" / "run", 5, ScriptedPolicy(script))
    policy = ScriptedPolicy(script)
    run(tmp_path / "cut" / "run", 3, policy)
    again = run(tmp_path / "cut" / "run", 5, policy, resume=True)
    assert [i.id for i in again.population] == [i.id for i in ref.population] and len(ref.population) == 3
    assert again.state_dict() == ref.state_dict() and again.best.id == ref.population[0].id
    assert _trajectories(tmp_path / "cut" / "run") == _trajectories(tmp_path / "ref" / "run")

"""Every registered evolver, rollout and heuristic problem gets a smoke test, and the registry helper they
share keeps one set of rules.

Evolvers: the config rejects unknown keys, and one loop round runs on the real tiny random Qwen2 model with a
minimal config. Rollouts: the same config check, and one ES generation through the loop with each. Problems
(every folder under ``heuristics/``): registered, prompt complete, seed heuristic and template valid. A newly
registered evolver or rollout without an entry in SMOKE / ROLLOUT_SMOKE fails here, and a new problem is
picked up by itself, so none ships untested."""

from __future__ import annotations

import pytest
from support import WEB_SMOKE_ROLLOUT, chromium_missing

from coevo.ahd.problem import available_problems
from coevo.config import parse_config
from coevo.evolvers import registered_evolvers
from coevo.evolvers.base import EvolverConfig
from coevo.loop import CoEvolutionLoop
from coevo.rollouts.base import registered_rollouts
from coevo.store import TrajectoryStore

#: the heuristic-design evolvers' smallest TSP setting (two 20-city training and test instances)
_TSP_SMOKE = {
    "problem": "tsp_construct",
    "train_size": 20,
    "train_count": 2,
    "test_sizes": [20],
    "test_count": 2,
    "max_new_tokens": 16,
    "eval_timeout_s": 10,
}
SMOKE = {
    "es": {"population_size": 2, "total_generations": 1, "eval_every": 0, "rollout": {"type": "target_logprob"}},
    "eoh": {**_TSP_SMOKE, "population_size": 2, "init_retries": 0},
    "sample": {
        "problem": "bpp_online",
        "batch": 2,
        "train_count": 2,
        "test_sizes": [100],
        "test_count": 1,
        "max_new_tokens": 16,
        "eval_timeout_s": 10,
    },
    "hillclimb": {**_TSP_SMOKE, "batch": 2},
    "reevo": {**_TSP_SMOKE, "population_size": 2, "init_population_size": 2},
    "trace2skill": {"skill": "web-navigation", "max_trajectories": 1, "max_new_tokens": 16},
}

BUILTIN = ("es", "eoh", "sample", "hillclimb", "reevo", "trace2skill")


def test_builtins_registered_and_smoke_configs_cover_every_evolver():
    reg = registered_evolvers()
    assert set(BUILTIN) <= set(reg)
    # the README examples, each tested on its own (test_readme_example, test_prompt_example); registered when
    # an earlier test imported them
    # ``tune`` searches another evolver's heuristics, so it has no one-evolver smoke run: tests/test_tune.py runs
    # it through the loop after an eoh evolver (test_tune_in_the_loop_after_eoh); so do ``grpo_ahd`` / ``dpo_ahd``,
    # which train the sampler of another evolver (tests/test_sampler_training.py runs them after eoh)
    missing = set(reg) - set(SMOKE) - {"hill-climb", "prompt-evolver", "tune", "grpo_ahd", "dpo_ahd"}
    assert not missing, f"registered evolvers without a smoke config: {sorted(missing)}"


@pytest.mark.parametrize("type_name", sorted(SMOKE))
def test_evolver_contract(type_name):
    cls = registered_evolvers()[type_name]
    assert cls.space in ("parameter", "context")
    assert issubclass(cls.Config, EvolverConfig) and cls.Config.model_config.get("extra") == "forbid"
    assert cls.__doc__ and cls.step.__doc__
    params = cls.Config.model_validate(SMOKE[type_name])
    with pytest.raises(Exception, match="extra"):
        cls.Config.model_validate({**SMOKE[type_name], "no_such_field": 1})
    assert params is not None


@pytest.mark.parametrize("type_name", sorted(SMOKE))
def test_one_round_on_tiny_model(type_name, tiny_model_dir, tmp_path):
    data = {
        "run": {"name": "smoke", "seed": 1},
        "model": {"name": str(tiny_model_dir), "dtype": "float32", "batch_size": 4},
        "sampling": {"max_new_tokens": 16},
        "budget": {"max_rounds": 1, "max_samples": 40},
        "evolvers": [{"name": "x", "type": type_name, **SMOKE[type_name]}],
    }
    summary = CoEvolutionLoop(parse_config(data), tmp_path / "run", raw_config=data, progress=False).run()
    assert summary.steps == 1
    assert summary.samples <= 40
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        assert store.count_llm_calls("run") == summary.samples
    assert (tmp_path / "run" / "report.md").exists()


# ------------------------------------------------------------------------------ the registry helper
class _Base:
    pass


class _A(_Base):
    pass


class _B(_Base):
    pass


def test_registry_rules_are_the_same_for_every_registry(monkeypatch):
    from importlib.metadata import EntryPoint

    import coevo.registry as registry_mod
    from coevo.registry import Registry

    reg = Registry("thing", _Base, entry_point_group="coevo.test_things", name_attr="type_name")
    assert reg.register("a")(_A) is _A and _A.type_name == "a"
    reg.add("a", _A)  # the same class again (a re-import): no error
    with pytest.raises(ValueError, match="thing 'a' already registered by .*_A"):
        reg.add("a", _B)
    with pytest.raises(TypeError, match="must subclass .*_Base"):
        reg.add("c", int)
    assert reg.resolve("a") is _A
    assert reg.resolve(f"{__name__}:_B") is _B and reg.resolve(f"{__name__}._B") is _B  # dotted paths
    with pytest.raises(ValueError, match="not a subclass"):
        reg.resolve(f"{__name__}:SMOKE")
    with pytest.raises(ValueError, match="cannot import it"):
        reg.resolve("no_such_module_xyz:Thing")
    ep = EntryPoint(name="b", value=f"{__name__}:_B", group="coevo.test_things")
    monkeypatch.setattr(registry_mod, "entry_points", lambda group: [ep] if group == "coevo.test_things" else [])
    assert reg.resolve("b") is _B and reg.names() == ["a", "b"]  # found through the entry point
    with pytest.raises(ValueError, match=r"unknown thing 'zz'; known types: \['a', 'b'\]"):
        reg.resolve("zz")


def test_the_three_registries_use_the_helper():
    from coevo.ahd.problem import PROBLEMS
    from coevo.evolvers.base import EVOLVERS
    from coevo.registry import Registry
    from coevo.rollouts.base import ROLLOUTS

    assert all(isinstance(r, Registry) for r in (EVOLVERS, ROLLOUTS, PROBLEMS))
    with pytest.raises(ValueError, match="already registered"):
        ROLLOUTS.add("countdown", registered_rollouts()["target_logprob"])
    with pytest.raises(TypeError, match="must subclass"):
        EVOLVERS.add("not-an-evolver", dict)


# ------------------------------------------------------------------------------ every rollout
#: per registered rollout: (rollout spec, companion evolvers the rollout needs, what it needs to run or None)
ROLLOUT_SMOKE = {
    "target_logprob": ({"type": "target_logprob", "target": "hi"}, [], None),
    "countdown": ({"type": "countdown", "task": "arithmetic", "cases_per_member": 2, "max_new_tokens": 4}, [], None),
    "eoh_children": (
        {"type": "eoh_children", "evolver": "eoh", "operators": ["m1"]},
        [{"name": "eoh", "type": "eoh", **SMOKE["eoh"]}],
        None,
    ),
    "sudoku": (
        {
            "type": "sudoku",
            "size": 4,
            "horizon": 1,
            "puzzles_per_member": 1,
            "train_pool": 4,
            "test_puzzles": 1,
            "max_new_tokens": 4,
        },
        [],
        None,
    ),
    "react_math": (
        {
            "type": "react_math",
            "problems_per_member": 1,
            "test_problems": 1,
            "samples_per_problem": 1,
            "max_turns": 1,
            "max_new_tokens": 4,
            "tool_timeout_s": 5,
        },
        [],
        None,
    ),
    "web": (WEB_SMOKE_ROLLOUT, [], "chromium"),
}


def test_every_registered_rollout_has_a_smoke_config():
    assert set(registered_rollouts()) == set(ROLLOUT_SMOKE), "a new rollout needs an entry in ROLLOUT_SMOKE"


@pytest.mark.parametrize("type_name", sorted(ROLLOUT_SMOKE))
def test_rollout_contract(type_name):
    from coevo.rollouts.base import RolloutConfig

    cls = registered_rollouts()[type_name]
    assert cls.type_name == type_name and cls.__doc__
    assert issubclass(cls.Config, RolloutConfig) and cls.Config.model_config.get("extra") == "forbid"
    spec = ROLLOUT_SMOKE[type_name][0]
    cls.Config.model_validate(spec)
    with pytest.raises(Exception, match="extra"):
        cls.Config.model_validate({**spec, "no_such_field": 1})


@pytest.mark.parametrize(
    "type_name",  # the web rollout's generation (Chromium, over 10 s on 2 cores) runs in CI's second command
    [pytest.param(t, marks=pytest.mark.heavy) if t == "web" else t for t in sorted(ROLLOUT_SMOKE)],
)
def test_one_es_generation_with_every_rollout(type_name, tiny_model_dir, tmp_path, monkeypatch):
    """One ES generation (an antithetic pair) through the loop on the tiny model with each rollout: every
    member's trajectories are recorded with their member and the generation gets finite rewards."""
    import math

    spec, companions, needs = ROLLOUT_SMOKE[type_name]
    if needs == "chromium" and (why := chromium_missing()):
        pytest.skip(why)
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    es = {
        "name": "es",
        "type": "es",
        "population_size": 2,
        "total_generations": 1,
        "eval_every": 0,
        "workers": 0,
        "rollout": spec,
    }
    data = {
        "run": {"name": "smoke", "seed": 1},
        "model": {"name": str(tiny_model_dir), "dtype": "float32", "batch_size": 4},
        "sampling": {"max_new_tokens": 8},
        "budget": {"max_rounds": 1, "max_samples": 40},
        "evolvers": [es, *companions],
        "schedule": [{"evolver": "es"}],
        "report": {"plots": False},
    }
    summary = CoEvolutionLoop(parse_config(data), tmp_path / "run", raw_config=data, progress=False).run()
    assert summary.steps == 1
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        (gen,) = store.es_history("run", "es")
        trajs = store.query(run_id="run", evolver="es")
    assert len(gen["rewards"]) == 2 and all(math.isfinite(r) for r in gen["rewards"])
    assert trajs and {t.member.index for t in trajs} == {0, 1} and all(t.space == "parameter" for t in trajs)


# ------------------------------------------------------------------------------ every problem
@pytest.mark.parametrize("name", available_problems())
def test_problem_contract(name, tmp_path, monkeypatch):
    """Every shipped problem: registered under its folder name, a complete prompt, and a seed heuristic and
    template that are valid on a few small generated instances, scored in the problem's direction."""
    from coevo.ahd.evaluate import evaluate_many
    from coevo.ahd.problem import PROBLEMS, load_problem

    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    problem = load_problem(name)
    assert PROBLEMS.get(name) is type(problem) and problem.root.name == name
    assert problem.direction in ("minimize", "maximize") and problem.objective_name and problem.function_name
    spec = problem.prompt_spec()
    assert all(spec[k] for k in ("task", "function_name", "inputs", "outputs", "template"))
    instances = problem.generate(min(problem.sizes), 2, 0)
    seed, template = evaluate_many(
        problem, [problem.seed_heuristic_code(), problem.template_code()], instances, with_reference=False
    )
    for res in (seed, template):
        assert res.valid, res.error
        assert res.score == pytest.approx(-res.objective if problem.direction == "minimize" else res.objective)

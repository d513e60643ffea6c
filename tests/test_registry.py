"""Every registered evolver gets a smoke test: its config rejects unknown keys, and one loop round runs on the
real tiny random Qwen2 model with a minimal config. A newly registered evolver without an entry in SMOKE fails
here, so no evolver ships untested."""

from __future__ import annotations

import pytest

from coevo.config import parse_config
from coevo.evolvers import registered_evolvers
from coevo.evolvers.base import EvolverConfig
from coevo.loop import CoEvolutionLoop
from coevo.store import TrajectoryStore

SMOKE = {
    "es": {"population_size": 2, "total_generations": 1, "eval_every": 0, "rollout": {"type": "target_logprob"}},
    "eoh": {"problem": "tsp_construct", "population_size": 2, "train_size": 20, "train_count": 2,
            "test_sizes": [20], "test_count": 2, "max_new_tokens": 16, "eval_timeout_s": 10, "init_retries": 0},
    "sample": {"problem": "bpp_online", "batch": 2, "train_count": 2, "test_sizes": [100], "test_count": 1,
               "max_new_tokens": 16, "eval_timeout_s": 10},
    "trace2skill": {"skill": "web-navigation", "max_trajectories": 1, "max_new_tokens": 16},
}  # fmt: skip

BUILTIN = ("es", "eoh", "sample", "trace2skill")


def test_builtins_registered_and_smoke_configs_cover_every_evolver():
    reg = registered_evolvers()
    assert set(BUILTIN) <= set(reg)
    missing = set(reg) - set(SMOKE) - {"hill-climb"}  # hill-climb: the README example, tested on its own
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

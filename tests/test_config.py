"""Run config validation: errors name the field and the allowed values; --set overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from coevo.config import ConfigError, apply_overrides, load_config, parse_config

ROOT = Path(__file__).resolve().parents[1]


def _base():
    return {
        "run": {"name": "c", "seed": 1},
        "budget": {"max_rounds": 2},
        "evolvers": [{"name": "a", "type": "toy_evolvers:Counter", "samples_per_step": 2}],
    }


def test_valid_config_and_evolver_params():
    cfg = parse_config(_base())
    assert cfg.evolvers[0].params.samples_per_step == 2
    assert [e.evolver for e in cfg.resolved_schedule()] == ["a"]


def test_unknown_top_level_field_is_named():
    data = _base() | {"bugdet": {}}
    with pytest.raises(ConfigError, match=r"bugdet: unknown field"):
        parse_config(data)


def test_choice_error_lists_allowed_values():
    data = _base() | {"model": {"backend": "tgi"}}
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    msg = str(exc.value)
    assert "model.backend" in msg and "'hf'" in msg and "'openai'" in msg and "'vllm'" in msg


def test_evolver_param_errors_are_named_by_evolver():
    data = _base()
    data["evolvers"][0]["samples_per_step"] = "many"
    data["evolvers"][0]["colour"] = "red"
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    msg = str(exc.value)
    assert "evolvers.a.samples_per_step" in msg and "evolvers.a.colour: unknown field" in msg


def test_unknown_evolver_type_lists_known_types():
    data = _base()
    data["evolvers"][0]["type"] = "no_such_evolver"
    with pytest.raises(ConfigError, match=r"evolvers.a.type: unknown evolver type 'no_such_evolver'; known types"):
        parse_config(data)


def test_schedule_must_name_an_evolver():
    data = _base() | {"schedule": [{"evolver": "b"}]}
    with pytest.raises(ConfigError, match="schedule: unknown evolver 'b'"):
        parse_config(data)


def test_negative_budget_rejected():
    data = _base()
    data["budget"]["max_samples"] = -3
    with pytest.raises(ConfigError, match="budget.max_samples"):
        parse_config(data)


@pytest.mark.parametrize(
    "key, value",
    [
        ("budget.max_samples", "true"),  # int | None
        ("budget.max_wall_s", "on"),  # float | None: YAML 1.1 reads on / off / yes / no as booleans
        ("model.batch_size", "yes"),
        ("evolvers.eoh.population_size", "on"),  # an evolver's own Config
        ("evolvers.es.sigma", "true"),
        ("evolvers.es.rollout.children_per_operator", "yes"),  # a rollout's Config inside an evolver
    ],
)
def test_a_boolean_is_never_taken_for_a_number(key, value):
    """Before: pydantic's lax mode read ``true`` / ``on`` / ``yes`` as 1 (``population_size: on`` ran with 1).
    Now the field is named, whatever section it is in; a boolean field still takes one."""
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs/ahd/tsp_construct.yaml", [f"{key}={value}"])
    assert f"{key}: a boolean (True) where a number goes" in str(err.value)
    load_config(ROOT / "configs/ahd/tsp_construct.yaml", ["evolvers.es.antithetic=true", "budget.max_samples=3"])


def test_openai_backend_needs_base_url():
    data = _base() | {"model": {"backend": "openai", "name": "gpt"}}
    with pytest.raises(ConfigError, match="base_url"):
        parse_config(data)


def test_overrides_by_path_index_and_name(tmp_path):
    data = _base()
    out = apply_overrides(data, ["budget.max_rounds=5", "evolvers.a.samples_per_step=4", "run.name=x y"])
    assert out["budget"]["max_rounds"] == 5 and out["evolvers"][0]["samples_per_step"] == 4
    assert out["run"]["name"] == "x y"
    assert data["budget"]["max_rounds"] == 2  # input untouched
    out = apply_overrides(data, ["evolvers.0.sleep_s=0.5"])
    assert out["evolvers"][0]["sleep_s"] == 0.5
    with pytest.raises(ConfigError, match="no list item named 'zz'"):
        apply_overrides(data, ["evolvers.zz.sleep_s=1"])
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        apply_overrides(data, ["budget.max_rounds"])
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    cfg, raw = load_config(p, ["budget.max_rounds=3"])
    assert cfg.budget.max_rounds == 3 and raw["budget"]["max_rounds"] == 3


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("run: {name: x\nbudget: 3\n")  # one line naming the file, line and column (was 8 lines)
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert (
        str(info.value) == f"{bad}:2:7: not valid YAML: while parsing a flow mapping, expected ',' or '}}', but got ':'"
    )
    bad.write_text("run: {name: x}\nbudget: {max_rounds: 2, max_rounds: 5}\n")  # PyYAML would keep 5 silently
    with pytest.raises(ConfigError, match=r":2:25: not valid YAML: the key 'max_rounds' appears twice"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config(lst)


# ------------------------------------------------------------------ combinations that cannot work
def _es(**over):
    es = {
        "name": "es",
        "type": "es",
        "population_size": 2,
        "total_generations": 2,
        "rollout": {"type": "target_logprob"},
    }
    return {**es, **over}


def _combo(model, *evolvers, schedule=None):
    data = {"run": {"name": "c"}, "budget": {"max_rounds": 2}, "evolvers": list(evolvers)}
    if model is not None:
        data["model"] = model
    if schedule:
        data["schedule"] = schedule
    return data


OPENAI = {"name": "gpt-x", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}
TINY = {"name": "tiny:micro", "backend": "hf", "dtype": "float32"}
EOH = {"name": "eoh", "type": "eoh", "problem": "tsp_construct", "population_size": 2}


def _errors(data) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    return str(exc.value)


def test_parameter_space_evolver_needs_a_backend_with_weights():
    msg = _errors(_combo(OPENAI, _es()))
    assert "evolvers.es.type / model.backend: 'es' evolves the model's weights" in msg and "'openai' has none" in msg
    parse_config(_combo(TINY, _es()))  # fine with weights
    parse_config(_combo(OPENAI, EOH))  # context evolution on an API model is fine


def test_references_to_missing_evolvers_are_named():
    ref = _es(rollout={"type": "eoh_children", "evolver": "eho"})
    msg = _errors(_combo(TINY, EOH, ref))
    assert "evolvers.es.rollout.evolver: unknown 'eho'; the evolvers of this config are ['eoh', 'es']" in msg
    self_ref = _es(rollout={"type": "eoh_children", "evolver": "es"})
    assert "evolvers.es.rollout.evolver: 'es' refers to the evolver itself" in _errors(_combo(TINY, EOH, self_ref))
    t2s = {"name": "t2s", "type": "trace2skill", "skill": "web-navigation", "evolvers": ["es", "nope"]}
    assert "evolvers.t2s.evolvers: unknown ['nope']" in _errors(_combo(TINY, _es(), t2s))


def test_workers_with_a_rollout_that_needs_the_run_context_or_a_non_hf_backend():
    es = _es(workers=2, rollout={"type": "eoh_children", "evolver": "eoh"})
    msg = _errors(_combo(TINY, EOH, es))
    assert (
        "evolvers.es.workers / evolvers.es.rollout.evolver: rollout 'eoh_children' with evolver='eoh' calls "
        "another evolver of the run, which the Ray actors of workers=2 cannot reach; set workers: 0" in msg
    )
    openai = {"name": "m", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}
    assert (
        "workers=1 builds HF replicas or vLLM engines on Ray actors and needs model.backend hf or vllm, not "
        "'openai'" in _errors(_combo(openai, _es(workers=1)))
    )
    parse_config(_combo({"name": "tiny:micro", "backend": "vllm"}, _es(workers=2)))  # one vLLM engine per actor
    parse_config(_combo(TINY, _es(workers=1)))  # a rollout without the run context is fine on actors


def test_shipped_configs_pass_the_combination_checks(deployment):  # WebArena-Lite needs its WA_* set-up
    from pathlib import Path

    root = Path(__file__).parents[1] / "configs"
    # run configs only: the GRPO baseline's configs are read by `python -m coevo.rl.grpo`, not `coevo run`
    paths = sorted(p for p in root.rglob("*.yaml") if "grpo" not in p.stem)
    assert len(paths) > 20
    for path in paths:
        load_config(path)


def test_backends_with_weights_match_the_policy_classes():
    from coevo.backends.hf import HFPolicy
    from coevo.backends.openai_api import OpenAIPolicy
    from coevo.backends.vllm_engine import VLLMPolicy
    from coevo.config import BACKENDS_WITH_WEIGHTS

    classes = {"hf": HFPolicy, "openai": OpenAIPolicy, "vllm": VLLMPolicy}
    assert {b for b, cls in classes.items() if cls.has_parameters} == set(BACKENDS_WITH_WEIGHTS)


def test_a_config_folder_is_named_as_a_folder(tmp_path):
    (tmp_path / "x.yaml").write_text("run: {}\n")
    with pytest.raises(
        ConfigError, match=r"is a folder, not a run config file \(give a .yaml file; configs in it: x.yaml\)"
    ):
        load_config(tmp_path)

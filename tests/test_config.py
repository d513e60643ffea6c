"""Run config validation: errors name the field and the allowed values; --set overrides."""

from __future__ import annotations

import pytest
import yaml

from coevo.config import ConfigError, apply_overrides, load_config, parse_config


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
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config(lst)

"""The shipped web run configs parse with the real evolvers and rollouts, and say what is wrong when broken."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevo.config import ConfigError, load_config
from coevo.rollouts.base import build_rollout

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "web"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))


def test_all_four_configs_are_shipped():
    assert {p.stem for p in CONFIGS} >= {"miniwob_coevo", "miniwob_skills_only", "miniwob_es_only", "webarena_lite"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_parses_and_its_rollouts_build(path):
    cfg, _ = load_config(path)
    specs = {s.name: s for s in cfg.evolvers}
    es = specs["es"].params
    rollout = build_rollout(es.rollout, None)  # no browser is started: environments are created lazily
    assert rollout.type_name == "web" and rollout._envs == []
    assert rollout.n_cases("train") == es.rollout["episodes_per_member"]
    assert es.antithetic is False or es.population_size % 2 == 0
    gate = getattr(specs.get("skills"), "params", None)
    if gate is not None and gate.gate is not None:
        assert build_rollout(gate.gate.rollout, None).type_name == "web"
    if path.stem.startswith("miniwob"):
        assert cfg.model.name == "qwen2.5-coder-0.5b-instruct" and cfg.model.dtype == "bfloat16"
        assert es.population_size <= 4 and es.rollout["max_steps"] <= 5 and cfg.sampling.max_new_tokens <= 64
        assert cfg.budget.max_rounds <= 3 and es.rollout["use_skills"]


def test_coevo_config_alternates_es_and_trace2skill_on_the_same_skill():
    cfg, _ = load_config(CONFIG_DIR / "miniwob_coevo.yaml")
    specs = {s.name: s for s in cfg.evolvers}
    assert (specs["es"].type, specs["skills"].type) == ("es", "trace2skill")
    assert specs["es"].params.sigma > 0 and specs["es"].params.alpha > 0
    assert specs["skills"].params.skill == specs["es"].params.rollout["skill_name"]
    assert specs["skills"].params.evolvers == ["es"]
    order = [e.evolver for e in cfg.resolved_schedule()]
    assert order.index("es") < order.index("skills")  # the skill learns from the generation just rolled out


def test_baselines_differ_from_coevo_in_one_space_only():
    coevo, _ = load_config(CONFIG_DIR / "miniwob_coevo.yaml")
    es_only, _ = load_config(CONFIG_DIR / "miniwob_es_only.yaml")
    skills_only, _ = load_config(CONFIG_DIR / "miniwob_skills_only.yaml")
    assert [s.type for s in es_only.evolvers] == ["es"]
    frozen = next(s for s in skills_only.evolvers if s.type == "es").params
    assert frozen.sigma == 0 and frozen.alpha == 0  # weights never change: the es slot only rolls out
    assert any(s.type == "trace2skill" for s in skills_only.evolvers)
    base = next(s for s in coevo.evolvers if s.type == "es").params.rollout
    for other in (es_only, skills_only):
        ro = next(s for s in other.evolvers if s.type == "es").params.rollout
        assert {k: ro[k] for k in ("taskset", "tasks", "test_episodes", "max_steps", "skill_dirs", "seed")} == \
               {k: base[k] for k in ("taskset", "tasks", "test_episodes", "max_steps", "skill_dirs", "seed")}


def test_webarena_config_follows_the_paper_and_needs_the_deployment(monkeypatch):
    from coevo.envs.webarena_lite import WebArenaConfigError

    cfg, _ = load_config(CONFIG_DIR / "webarena_lite.yaml")
    es = next(s for s in cfg.evolvers if s.type == "es").params
    assert (es.population_size, es.sigma, es.alpha, es.rollout["episodes_per_member"]) == (8, 1.5e-3, 2.5e-4, 8)
    rollout = build_rollout(es.rollout, None)
    for var in ("WA_SHOPPING", "WA_SHOPPING_ADMIN", "WA_REDDIT", "WA_GITLAB", "WA_MAP"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(WebArenaConfigError, match="WA_SHOPPING"):
        rollout.envs(1)


def test_a_broken_web_config_names_the_field(tmp_path):
    text = (CONFIG_DIR / "miniwob_coevo.yaml").read_text().replace("taskset: miniwob", "taskst: miniwob", 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match="taskst"):
        load_config(bad)

"""The shipped web run configs parse with the real evolvers and rollouts, and say what is wrong when broken."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coevo.config import ConfigError, load_config
from coevo.rollouts.base import build_rollout

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "web"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
from conftest import SITE_VARS


def test_all_four_configs_are_shipped():
    assert {p.stem for p in CONFIGS} >= {"miniwob_coevo", "miniwob_skills_only", "miniwob_es_only", "webarena_lite"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_parses_and_its_rollouts_build(path, deployment):
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
        assert {k: ro[k] for k in ("taskset", "tasks", "test_episodes", "max_steps", "skill_dirs", "seed")} == {
            k: base[k] for k in ("taskset", "tasks", "test_episodes", "max_steps", "skill_dirs", "seed")
        }


def test_webarena_config_follows_the_paper_and_needs_the_deployment(deployment):
    cfg, _ = load_config(CONFIG_DIR / "webarena_lite.yaml")
    es = next(s for s in cfg.evolvers if s.type == "es").params
    assert (es.population_size, es.sigma, es.alpha, es.rollout["episodes_per_member"]) == (8, 1.5e-3, 2.5e-4, 8)
    gate = next(s for s in cfg.evolvers if s.type == "trace2skill").params.gate
    assert gate.rollout == es.rollout  # the gate inherits es's task selection, held-out split and skills


def test_webarena_setup_errors_come_at_validation_in_one_message(deployment, tmp_path):
    """Issue 14.3/14.4: missing WA_* variables, NLTK data and the judge's key are named when the config is
    validated (before any model or browser), all at once, with the tasks that need each."""
    deployment.delenv("WA_SHOPPING")
    deployment.delenv("OPENAI_API_KEY")
    deployment.setenv("NLTK_DATA", str(tmp_path / "no-nltk-here"))
    with pytest.raises(ConfigError) as err:
        load_config(CONFIG_DIR / "webarena_lite.yaml")
    msg = str(err.value)
    assert "WA_SHOPPING (needed by tasks [" in msg and "WA_GITLAB" not in msg
    assert "NLTK_DATA" in msg and "punkt_tab" in msg and "no-nltk-here" in msg
    assert "judge_tasks: 40 of the 165 selected WebArena-Lite tasks use an LLM-judged evaluator" in msg
    assert "OPENAI_API_KEY" in msg


def test_webarena_judge_tasks_skip_leaves_them_out_with_a_count(deployment, caplog):
    from coevo.envs.webarena_lite import webarena_lite_tasks
    from coevo.rollouts import web as web_rollout

    deployment.setattr(web_rollout, "_warned", set())  # the warning is logged once per process
    deployment.delenv("OPENAI_API_KEY")
    cfg, _ = load_config(CONFIG_DIR / "webarena_lite.yaml", ["evolvers.es.rollout.judge_tasks=skip"])
    ro = build_rollout(next(s for s in cfg.evolvers if s.type == "es").params.rollout, None)
    judged = {str(t.task_id) for t in webarena_lite_tasks() if t.needs_judge}
    assert len(judged) == 40 and not judged & set(ro.tasks + ro.test_tasks)
    assert len(ro.tasks) + len(ro.test_tasks) == 125
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "40 of the 165 selected WebArena-Lite tasks" in warned[0]
    assert "leaving them out (judge_tasks: skip)" in warned[0]


def test_webarena_gate_inherits_the_site_subset(deployment):
    """Issue 14.5: with `sites: [shopping]` only WA_SHOPPING is needed, and the gate draws shopping tasks only."""
    from coevo.envs.webarena_lite import webarena_lite_tasks

    for var in SITE_VARS[1:]:
        deployment.delenv(var)
    cfg, _ = load_config(CONFIG_DIR / "webarena_lite.yaml", ["evolvers.es.rollout.sites=[shopping]"])
    gate = next(s for s in cfg.evolvers if s.type == "trace2skill").params.gate
    assert gate.rollout["sites"] == ["shopping"]
    ro = build_rollout(gate.rollout, None)
    sites = {str(t.task_id): t.sites for t in webarena_lite_tasks()}
    assert ro.episodes("test") and all(sites[t] == ("shopping",) for t, _ in ro.episodes("test"))
    with pytest.raises(ConfigError, match=r"gate\.rollout\.sites: .* differs from evolvers\.es\.rollout\.sites"):
        load_config(
            CONFIG_DIR / "webarena_lite.yaml",
            ["evolvers.es.rollout.sites=[shopping]", "evolvers.skills.gate.rollout={sites: [shopping, reddit]}"],
        )


def test_a_broken_web_config_names_the_field(tmp_path):
    text = (CONFIG_DIR / "miniwob_coevo.yaml").read_text().replace("taskset: miniwob", "taskst: miniwob", 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match="taskst"):
        load_config(bad)


def _coevo(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coevo.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
        **kw,
    )


def test_run_check_validates_without_loading_anything(deployment, tmp_path):
    """`coevo run --check CONFIG`: exit 0 for a valid config, 2 with the named problems; no run folder."""
    ok = _coevo("run", "--check", str(CONFIG_DIR / "webarena_lite.yaml"), "--set", f"run.out_dir={tmp_path}/runs")
    assert ok.returncode == 0 and "config OK" in ok.stdout and "es (es), skills (trace2skill)" in ok.stdout
    env = {k: v for k, v in os.environ.items() if k != "WA_GITLAB"}
    bad = _coevo("run", "--check", str(CONFIG_DIR / "webarena_lite.yaml"), env=env)
    assert bad.returncode == 2 and "WA_GITLAB (needed by tasks [" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "runs").exists()


def test_runs_show_into_head_prints_no_broken_pipe_error(tmp_path):
    from coevo.store import TrajectoryStore

    TrajectoryStore(tmp_path / "store.sqlite").close()
    (tmp_path / "report.md").write_text("# Report\n" + "line of the report\n" * 200_000)
    cmd = f"{sys.executable} -m coevo.cli runs show {tmp_path} | head -n 2"
    out = subprocess.run(
        cmd,
        check=False,
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.stdout == "# Report\nline of the report\n" and out.stderr == ""

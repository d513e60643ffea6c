"""benchmarks/web_skills.py and the rollout hook it uses (``WebRollout.run(..., episodes=...)``).

Real MiniWoB++ pages in real headless Chromium; the model is a tiny random Qwen2 built here (benchmark run) or
:class:`coevo.agents.scripted.ScriptedPolicy`, a test double for the model only (the load_skill count).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from coevo.agents.scripted import ScriptedPolicy
from coevo.envs.browser import BrowserSetupError, find_chromium
from coevo.rollouts.base import build_rollout

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "web_skills.py"
ROW_FIELDS = {
    "condition",
    "episode",
    "task",
    "seed",
    "success",
    "reward",
    "valid",
    "failure",
    "steps",
    "actions",
    "load_skill_steps",
    "read_skill_file_steps",
    "malformed_steps",
    "llm_calls",
    "prompt_tokens",
    "completion_tokens",
    "system_prompt_chars",
    "wall_s",
    "skill_mode",
    "skill_name",
}


def _chromium_missing() -> str | None:
    try:
        find_chromium()
    except BrowserSetupError as exc:
        return f"headless Chromium unavailable: {exc}"
    return None


CHROMIUM_MISSING = _chromium_missing()
needs_chromium = pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("web_skills", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory) -> Path:
    """A tiny random Qwen2 (hidden 32, 2 layers) with the built-in BPE tokenizer."""
    from coevo.backends.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2_web_skills"), tokenizer_from="bpe", seed=0)


def click_button_solver(conversation: list[dict]) -> str:
    """Reads the goal and the axtree of the prompt and clicks the asked-for button."""
    user = conversation[-1]["content"]
    label = re.search(r'Click on the "(.+?)" button', user).group(1)
    bid = re.search(r"\[(\d+)\] button '" + re.escape(label) + "'", user).group(1)
    return f"```\nclick('{bid}')\n```"


def _smoke_rollout(**extra):
    return build_rollout({"type": "web", "taskset": "miniwob_smoke", "test_episodes": 4, "n_envs": 1, **extra}, None)


# -- without a browser -------------------------------------------------------------------------------------
def test_run_episodes_must_be_among_the_calls_episodes():
    ro = _smoke_rollout()
    policy = ScriptedPolicy("noop()")
    assert ro.episodes("test") == [
        ("click-test", 100),
        ("click-button", 100),
        ("click-test", 101),
        ("click-button", 101),
    ]
    with pytest.raises(ValueError, match=r"not among this call's 4 test episodes"):
        ro.run(policy, generation=0, member=None, key_prefix="k", split="test", episodes=[("click-test", 0)])
    with pytest.raises(ValueError, match="appear once"):
        ro.run(policy, generation=0, member=None, key_prefix="k", split="test", episodes=[("click-test", 100)] * 2)
    assert ro.run(policy, generation=0, member=None, key_prefix="k", split="test", episodes=[]) == []
    assert ro._envs == [] and policy.calls == 0  # nothing started


def test_condition_specs_and_summaries(bench):
    args = bench.parse_args(["--tasks", "click-button,focus-text", "--seeds", "3", "--out", "unused"])
    assert args.temperature == 0.7 and args.top_p == 0.9 and args.top_k == 20 and args.seed == 2024  # the config's
    none, catalog, preload = (bench.condition_spec(args.base, c, args) for c in bench.CONDITIONS)
    assert "use_skills" not in none and "skill_dirs" not in none and none["test_episodes"] == 6
    assert (catalog["skill_mode"], preload["skill_mode"], preload["skill_name"]) == (
        "catalog",
        "preload",
        "miniwob-forms",
    )
    assert catalog["skill_dirs"] == preload["skill_dirs"] == ["skills/web-navigation", "skills/miniwob-forms"]
    ro = build_rollout(none, None)
    assert ro.episodes("test") == [(t, s) for s in (10000, 10001, 10002) for t in ("click-button", "focus-text")]

    def row(cond, seed, success, load=0, steps=2):
        return {
            "condition": cond,
            "task": "click-button",
            "seed": seed,
            "success": success,
            "failure": None,
            "steps": steps,
            "load_skill_steps": load,
            "read_skill_file_steps": 0,
            "malformed_steps": 0,
            "llm_calls": steps,
            "prompt_tokens": 100 * steps,
            "completion_tokens": 10 * steps,
            "wall_s": 1.0,
        }

    rows = [row("none", 1, True), row("none", 2, False), row("preload", 1, False, load=1), row("preload", 2, True)]
    rows += [row("preload", 3, True, load=2)]  # not run under none: left out of the pairing
    s = bench.summarise([r for r in rows if r["condition"] == "preload"])
    assert (s["episodes"], s["successes"], s["steps"], s["load_skill_steps"], s["episodes_with_load_skill"]) == (
        3,
        2,
        6,
        3,
        2,
    )
    assert s["load_skill_step_fraction"] == 0.5 and s["prompt_tokens_per_step"] == 100.0 and s["seeds"] == 3
    assert bench.paired(rows, "preload") == {"episodes": 2, "wins": 1, "losses": 1, "both": 0, "neither": 0}
    assert bench.action_name("load_skill('miniwob-forms')") == "load_skill" and bench.action_name(None) is None


def test_user_libraries_are_catalog_conditions_and_skill_use_is_summarised(bench, tmp_path):
    """Issue 48: ``--libraries NAME=DIR`` adds a catalog condition; the summary counts successful loads and
    the episodes solved with and without a loaded skill; the plot is written."""
    args = bench.parse_args(
        ["--tasks", "click-link", "--seeds", "1", "--libraries", "user=benchmarks/web_user_skills", "--out", "x"]
    )
    assert args.conditions == ["none", "catalog", "preload", "user"]
    user = bench.condition_spec(args.base, "user", args)
    assert (user["skill_mode"], user["skill_dirs"]) == ("catalog", ["benchmarks/web_user_skills"])
    assert build_rollout(user, None).skill_context()[0].names() == ["click-target", "fill-and-submit"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--tasks", "click-link", "--libraries", "catalog=skills", "--out", "x"])

    def row(success, loaded, calls):
        return {"condition": "user", "task": "click-link", "seed": 1, "success": success, "failure": None}  | {
            "steps": 2, "load_skill_steps": calls, "read_skill_file_steps": 0, "malformed_steps": 0, "llm_calls": 2,
            "prompt_tokens": 300, "completion_tokens": 20, "wall_s": 1.0, "skills_loaded": loaded,
        }  # fmt: skip

    s = bench.summarise([row(True, 1, 1), row(True, 1, 2), row(False, 0, 1), row(True, 0, 0)])
    assert (s["successful_loads"], s["episodes_with_loaded_skill"], s["solved_with_loaded_skill"]) == (2, 2, 2)
    assert (s["episodes_without_loaded_skill"], s["solved_without_loaded_skill"]) == (2, 1)
    assert s["tokens_per_episode"] == 320.0 and s["load_skill_steps"] == 4
    png = bench.plot({"none": bench.summarise([row(False, 0, 0)]), "user": s}, tmp_path / "p.png", "title")
    assert png.stat().st_size > 1000


# -- in Chromium -------------------------------------------------------------------------------------------
@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@needs_chromium
def test_run_subset_keeps_keys_and_counts_load_skill(bench):
    """The hook runs one held-out episode under its own key; episode_row counts the recorded load_skill."""
    ro = _smoke_rollout(use_skills=True, skill_mode="catalog", max_steps=2, actions=["click"])
    policy = ScriptedPolicy(["```\nload_skill('miniwob-forms')\n```", click_button_solver])
    try:
        (t,) = ro.run(policy, generation=0, member=None, key_prefix="k", split="test", episodes=[("click-button", 101)])
    finally:
        ro.close()
    assert t.key == "k/test/3" and t.task_id == "click-button:101" and t.valid and t.reward == 1.0
    r = bench.episode_row("catalog", 3, t, 2.0)
    assert r["actions"] == ["load_skill", "click"] and r["load_skill_steps"] == 1 and r["skills_loaded"] == 1
    assert r["skill_load_calls"] == 1 and r["skills_loaded_names"] == ["miniwob-forms"]
    assert r["skills_listed"] == ["web-navigation", "miniwob-forms"]
    assert r["success"] and r["steps"] == 2 and r["skill_mode"] == "catalog" and r["failure"] is None
    s = bench.summarise([r])
    assert s["load_skill_step_fraction"] == 0.5 and s["episodes_with_load_skill"] == 1


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@needs_chromium
def test_benchmark_three_conditions_on_tiny_model_and_resume(bench, tiny_qwen, tmp_path, capsys):
    out = tmp_path / "ws"
    argv = ["--model", str(tiny_qwen), "--tasks", "click-button", "--seeds", "1", "--max-steps", "1"]
    argv += ["--n-envs", "1", "--max-new-tokens", "12", "--out", str(out)]

    def metrics() -> dict[str, dict]:
        lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"metric"')]
        for m in lines:
            assert set(m) == {"metric", "value", "goal", "met"} and isinstance(m["met"], bool)
        return {m["metric"]: m for m in lines}

    # first two conditions, then all three: only the missing condition runs
    assert bench.main([*argv, "--conditions", "none,catalog"]) == 0
    first = metrics()
    assert first["web_skills_new_episodes"]["value"] == 2 and "web_skills_episodes/preload" not in first
    assert bench.main(argv) == 0
    m = metrics()
    assert m["web_skills_new_episodes"]["value"] == 1 and m["web_skills_same_episodes"]["value"] is True

    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["condition"] for r in rows] == ["none", "catalog", "preload"]
    by = {r["condition"]: r for r in rows}
    for c, r in by.items():
        assert ROW_FIELDS <= set(r) and (r["task"], r["seed"], r["episode"]) == ("click-button", 10000, 0)
        assert r["steps"] == len(r["actions"]) == r["llm_calls"] == 1  # max_steps 1
        assert r["load_skill_steps"] + r["read_skill_file_steps"] <= r["steps"]
        assert r["failure"] in (None, "runtime", "evaluation", "model") and r["success"] == (r["reward"] == 1.0)
        assert r["prompt_tokens"] > 0 and 0 < r["completion_tokens"] <= 12
        ep = m[f"web_skills_episodes/{c}"]
        assert ep["value"] == 1 and ep["met"]
        frac = m[f"web_skills_load_skill_step_fraction/{c}"]["value"]
        assert frac == r["load_skill_steps"] / r["steps"]
        assert m[f"web_skills_episodes_with_load_skill/{c}"]["value"] == int(r["load_skill_steps"] > 0)
        assert m[f"web_skills_success_rate/{c}"]["value"] == float(r["success"])
        assert set(m[f"web_skills_failures/{c}"]["value"]) == {"runtime", "evaluation", "model"}
    # the conditions really differ: no skills < catalog < catalog + preloaded body
    assert by["none"]["system_prompt_chars"] < by["catalog"]["system_prompt_chars"]
    assert by["catalog"]["system_prompt_chars"] < by["preload"]["system_prompt_chars"]
    assert by["none"]["prompt_tokens"] < by["catalog"]["prompt_tokens"] < by["preload"]["prompt_tokens"]
    assert (by["none"]["skill_mode"], by["catalog"]["skill_mode"], by["preload"]["skill_mode"]) == (
        None,
        "catalog",
        "preload",
    )
    assert by["preload"]["skill_name"] == "miniwob-forms" and by["none"]["skill_name"] is None
    delta = m["web_skills_success_delta/preload_vs_none"]["value"]
    assert delta == float(by["preload"]["success"]) - float(by["none"]["success"])
    table = (out / "table.md").read_text()
    assert "| preload | click-button | 1 |" in table and "| none | all | 1 |" in table
    assert "- catalog: skills listed 2 (miniwob-forms, web-navigation); load_skill calls" in table
    assert (out / "web_skills.png").stat().st_size > 1000

    # resume: nothing missing, so nothing runs (and no model loads); other settings are refused
    assert bench.main(argv) == 0
    assert metrics()["web_skills_new_episodes"]["value"] == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == 3
    assert bench.main([*argv, "--max-steps", "2"]) == 2
    assert "other settings (max_steps" in capsys.readouterr().err

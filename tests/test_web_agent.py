"""The LangGraph web agent on real MiniWoB++ pages in real headless Chromium.

The model is replaced by :class:`coevo.agents.scripted.ScriptedPolicy` (a test double for the model only)
except in the tiny-Qwen2 test; the environment, the browser and the graph are real.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from support import chromium_missing

from coevo.agents.actions import ActionParseError, parse_action
from coevo.agents.prompts import system_prompt
from coevo.agents.scripted import ScriptedPolicy
from coevo.agents.web_agent import (
    Provenance,
    WebAgent,
    episode_key,
    run_episode,
    run_episodes,
)
from coevo.backends.base import Completion, Policy, PolicyError, SamplingParams
from coevo.envs.browser import ensure_browser_env
from coevo.envs.miniwob import MiniWoBEnv
from coevo.types import ESMember

CHROMIUM_MISSING = chromium_missing()
SAMPLING = SamplingParams(max_new_tokens=32, temperature=0.0)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if not os.environ.get("PLAYWRIGHT_BROWSERS_PATH"):
        ensure_browser_env(tmp_path_factory.mktemp("pw"))
    e = MiniWoBEnv()
    yield e
    e.close()


def click_button_solver(conversation: list[dict]) -> str:
    """Reads the goal and the axtree of the prompt, answers with the bid of the asked-for button."""
    user = conversation[-1]["content"]
    label = re.search(r'Click on the "(.+?)" button', user).group(1)
    bid = re.search(r"\[(\d+)\] button '" + re.escape(label) + "'", user).group(1)
    return f"The goal asks for \"{label}\"; it is element {bid}.\n```\nclick('{bid}')\n```"


# -- parsing (no browser) --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("output", "action"),
    [
        ("I click it.\n```python\nclick('13')\n```\nDone.", "click('13')"),
        ("```\nnoop()\n```\nthen\n```\nfill('19', 'Myron')\n```", "noop()"),  # the first valid call runs
        ("I would click('3').\n```\nclick('4')\n```", "click('4')"),  # a fenced call beats the prose
        ("Reasoning...\nclick(13)", "click('13')"),
        ('send_msg_to_user("It is 42.")', "send_msg_to_user('It is 42.')"),
        ('load_skill("web-forms")', "load_skill('web-forms')"),
        ("click('7', button='right')", "click('7', button='right')"),
        ("click('1\x00') ((( '", "click('1')"),  # NUL bytes are dropped, never a crash
    ],
)
def test_parse_action_picks_the_single_action(output, action):
    assert parse_action(output).text == action


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("", "empty output"),
        ("I think I should click the button", "no action found"),
        ("type('12', 'x')", "unknown action"),
        ("load_skill()", "load_skill takes 1"),
        ("read_skill_file('a')", 'read_skill_file\\("name", "path"\\)'),
    ],
)
def test_parse_action_errors_are_feedback(output, message):
    with pytest.raises(ActionParseError, match=message):
        parse_action(output)


def test_several_actions_run_the_first_valid_one_and_name_the_others():
    issue_output = 'load_skill("click-target")\nread_skill_file("click-target", "references/details.md")'
    action = parse_action(issue_output)
    assert action.text == "load_skill('click-target')"
    assert action.ignored == ("read_skill_file('click-target', 'references/details.md')",)
    assert action.ignored_note() == (
        "Your output held 2 actions; only load_skill('click-target') ran (one action per step). "
        "Not run: read_skill_file('click-target', 'references/details.md')."
    )
    skipped = parse_action("```\nload_skill()\nclick('5')\n```")  # a malformed call is passed over, and named
    assert skipped.text == "click('5')" and skipped.ignored == ("load_skill(...) (malformed)",)
    assert parse_action("click('9')").ignored == () and parse_action("click('9')").ignored_note() == ""
    # a call outside the code block did not run either, and is named (an output of the 0.5B model)
    echoed = parse_action("load_skill('click-target')\n```\nclick('13')\n```")
    assert echoed.text == "click('13')" and echoed.ignored == ("load_skill('click-target')",)


def test_prompt_examples_come_from_the_page_and_the_library():
    from coevo.agents.prompts import PageExample, describe_actions
    from coevo.envs.web import web_action_set

    actions = web_action_set(["click", "fill"])
    tree = (
        "RootWebArea 'Form'\n\t[9] generic\n\t\t[13] generic, clickable\n\t\t\tStaticText 'ornare'\n\t[21] textbox ''"
    )
    page = PageExample.from_tree(tree, ["13", "21"])
    assert (page.line, page.bid, page.field) == ("[13] generic, clickable", "13", "21")
    text = system_prompt(
        describe_actions(actions, page),
        "- click-target: Click the element the goal names.",
        list(actions.action_set),
        page=page,
        skill_example=("click-target", "references/ids.md"),
    )
    assert "b534" not in text and "'a51'" not in text  # BrowserGym's example ids are not on this page
    assert "e.g. `[13] generic, clickable`" in text and "Example: click('13')" in text
    assert "Example: fill('21', " in text
    assert 'load_skill("click-target")' in text and 'read_skill_file("click-target", "references/ids.md")' in text
    # a library whose skills have no files: no read_skill_file example path at all
    bare = system_prompt(
        "click(bid)", "- click-target: Click.", ["click"], page=page, skill_example=("click-target", None)
    )
    assert "read_skill_file(" not in bare and "references/" not in bare
    # a page without ids: no id is named anywhere
    empty = system_prompt(describe_actions(actions, PageExample()), None, list(actions.action_set))
    assert not re.search(r"click\('\w+'\)", empty) and "<id from the tree>" in empty


def test_skill_actions_unknown_without_a_library_and_catalog_only_with_one():
    with pytest.raises(ActionParseError, match="unknown action"):
        parse_action('load_skill("x")', allow_skills=False)
    assert "# Skills" not in system_prompt("click(bid)", None)
    assert "my-skill: does things" in system_prompt("click(bid)", "- my-skill: does things")


def test_scripted_policy_runs_out_loudly():
    policy = ScriptedPolicy(["a", "b"])
    assert [c.text for c in policy.generate([[{"role": "user", "content": "x y"}]] * 2, SAMPLING)] == ["a", "b"]
    with pytest.raises(PolicyError, match="used up"):
        policy.generate([[{"role": "user", "content": "x"}]], SAMPLING)


def test_agent_rejects_bad_arguments_by_name():
    with pytest.raises(ValueError, match="max_steps"):
        WebAgent(ScriptedPolicy("noop()"), sampling=SAMPLING, max_steps=0)
    with pytest.raises(TypeError, match="sampling"):
        WebAgent(ScriptedPolicy("noop()"), sampling={"temperature": 0})
    with pytest.raises(TypeError, match="skills must provide catalog_prompt"):
        WebAgent(ScriptedPolicy("noop()"), sampling=SAMPLING, skills=object())


# -- episodes in the browser -----------------------------------------------------------------------------
@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
def test_agent_solves_click_button_and_records_the_trajectory(env):
    policy = ScriptedPolicy(click_button_solver)
    member = ESMember(seed=123, sigma=1e-3, sign=-1, index=2)
    prov = Provenance(run_id="run1", evolver="es", round=1, generation=4)
    traj = run_episode(policy, env, "click-button", 7, sampling=SAMPLING, max_steps=5, member=member, provenance=prov)
    assert (traj.reward, traj.valid, traj.failure) == (1.0, True, None)
    assert traj.task_id == "click-button:7" and traj.meta["end"] == "done"
    assert traj.key == episode_key(prov, member, "click-button:7") == "web/run1/es/r1/g4/m2-s123/click-button:7"
    assert (traj.space, traj.member, traj.generation) == ("parameter", member, 4)
    assert len(traj.steps) == traj.llm_calls == 1
    step = traj.steps[0]
    system, user = policy.conversations[0]
    assert system["role"] == "system" and "click(bid" in system["content"]
    assert step.observation == user["content"]
    assert "# Goal\nClick on the" in step.observation and "] button '" in step.observation
    assert re.fullmatch(r"click\('\d+'\)", step.action) and f"[{step.action[7:-2]}] button" in step.observation
    assert (step.reward, step.tool_result, step.meta["kind"]) == (1.0, "", "env")
    assert traj.prompt_tokens > 50 and traj.completion_tokens > 3 and traj.duration_s > 0


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
def test_malformed_outputs_are_fed_back_and_counted(env):
    policy = ScriptedPolicy(["I am not sure what to do.", "```\ntype('1', 'x')\n```", click_button_solver])
    traj = run_episode(policy, env, "click-button", 3, sampling=SAMPLING, max_steps=5)
    assert traj.valid and traj.reward == 1.0 and traj.llm_calls == 3
    assert [s.action is None for s in traj.steps] == [True, True, False]
    assert [s.meta["kind"] for s in traj.steps] == ["parse_error", "parse_error", "env"]
    assert "no action found" in traj.steps[0].tool_result and "unknown action" in traj.steps[1].tool_result
    second_prompt = policy.conversations[1][1]["content"]
    assert "# Feedback on your last action\nMalformed output: no action found" in second_prompt
    assert "Step 2 of at most 5" in second_prompt and "1. (no valid action)" in second_prompt


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
def test_max_steps_is_respected(env):
    traj = run_episode(ScriptedPolicy("```\nnoop()\n```"), env, "click-button", 4, sampling=SAMPLING, max_steps=2)
    assert len(traj.steps) == traj.llm_calls == 2
    assert traj.meta["end"] == "max_steps" and traj.valid and traj.reward == 0.0
    assert all(s.action == "noop()" and s.reward == 0.0 for s in traj.steps)


class FolderSkills:
    """A minimal folder-backed skill library (``<root>/<name>/SKILL.md`` plus reference files)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def catalog_prompt(self) -> str:
        return "\n".join(
            f"- {p.name}: {(p / 'SKILL.md').read_text().splitlines()[0]}" for p in sorted(self.root.iterdir())
        )

    def activate(self, name: str) -> str:
        path = self.root / name / "SKILL.md"
        if not path.is_file():
            raise KeyError(f"no skill named {name!r}")
        return path.read_text()

    def read_reference(self, name: str, path: str) -> str:
        return (self.root / name / path).read_text()

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir())

    def files(self, name: str) -> list[str]:
        folder = self.root / name
        if not folder.is_dir():
            raise KeyError(f"no skill named {name!r}")
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != "SKILL.md")


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
def test_skill_actions_are_routed_to_the_library(env, tmp_path):
    skill = tmp_path / "click-buttons"
    (skill / "references").mkdir(parents=True)
    (skill / "SKILL.md").write_text("Find the button by its label.\nClick the bid whose label matches the goal.\n")
    (skill / "references" / "tips.md").write_text("Bids are the numbers in brackets.\n")
    policy = ScriptedPolicy(
        [
            'load_skill("click-buttons")',
            'read_skill_file("click-buttons", "references/tips.md")',
            'load_skill("missing")',
            click_button_solver,
        ]
    )
    traj = run_episode(policy, env, "click-button", 5, sampling=SAMPLING, max_steps=6, skills=FolderSkills(tmp_path))
    assert traj.reward == 1.0 and len(traj.steps) == 4 and traj.meta["skills_loaded"] == 1
    kinds = [s.meta["kind"] for s in traj.steps]
    assert kinds == ["skill", "skill", "skill", "env"]
    assert (
        traj.steps[0].tool_result
        == "Skill 'click-buttons' loaded (its text is now shown in every prompt of this episode)."
    )
    assert traj.steps[1].tool_result == "Bids are the numbers in brackets.\n"
    assert "failed: KeyError" in traj.steps[2].tool_result and "missing" in traj.steps[2].tool_result
    assert all(s.reward is None for s in traj.steps[:3])  # the browser was not touched
    assert "- click-buttons: Find the button by its label." in policy.conversations[0][0]["content"]
    for later in policy.conversations[1:4]:  # the body is shown once per prompt, under its heading
        assert later[1]["content"].count("Find the button by its label.") == 1
        assert "# Loaded skill: click-buttons\nFind the button" in later[1]["content"]


class FailingPolicy(Policy):
    """A model whose samples all fail (as a backend reports a per-sample error)."""

    def generate(self, conversations, params):
        return [Completion(text="", finish_reason="error", error="CUDA error: device lost") for _ in conversations]


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
def test_model_error_gives_an_invalid_trajectory(env):
    traj = run_episode(FailingPolicy(), env, "click-test", 0, sampling=SAMPLING, max_steps=4)
    assert (traj.valid, traj.failure, traj.reward, traj.llm_calls) == (False, "llm_error", None, 1)
    assert "device lost" in traj.failure_detail and traj.steps[0].meta["kind"] == "llm_error"


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
def test_batched_episodes_share_model_calls(env):
    second = MiniWoBEnv()
    try:
        policy = ScriptedPolicy(click_button_solver)
        trajs = run_episodes(
            policy,
            [env, second],
            [("click-button", 11), ("click-button", 12)],
            sampling=SAMPLING,
            max_steps=3,
            keys=["a", "b"],
        )
    finally:
        second.close()
    assert [t.key for t in trajs] == ["a", "b"]
    assert [t.task_id for t in trajs] == ["click-button:11", "click-button:12"]
    assert [t.reward for t in trajs] == [1.0, 1.0]
    assert policy.calls == 2 and len(policy.conversations) == 2  # one generate call, batch of two
    with pytest.raises(ValueError, match="once"):
        run_episodes(policy, [env, env], [("click-button", 1)], sampling=SAMPLING)


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
def test_tiny_random_qwen2_episode_handles_its_garbage(env, tiny_model_dir):
    from coevo.backends.hf import HFPolicy

    policy = HFPolicy(tiny_model_dir)
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0, seed=0)
    traj = run_episode(policy, env, "click-button", 1, sampling=sampling, max_steps=3)
    assert traj.valid and traj.reward in (0.0, 1.0) and traj.llm_calls == len(traj.steps) >= 1
    assert traj.prompt_tokens > 100 and traj.completion_tokens > 0
    for step in traj.steps:
        assert step.model_output is not None and step.meta["kind"] in {"parse_error", "env"}
        assert (step.action is None) == (step.meta["kind"] == "parse_error")
        if step.action is None:
            assert step.tool_result.startswith("Malformed output:")

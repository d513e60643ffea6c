"""Every element an action can target is in the web observation (issue 48, item 1).

Real MiniWoB++ pages and local ``file://`` pages in real headless Chromium through BrowserGym; the model is
:class:`coevo.agents.scripted.ScriptedPolicy` (a test double for the model only) where an agent runs.
"""

from __future__ import annotations

import os
import re

import pytest
from support import chromium_missing

from coevo.agents.scripted import ScriptedPolicy
from coevo.agents.web_agent import run_episode
from coevo.backends.base import SamplingParams
from coevo.envs.browser import ensure_browser_env
from coevo.envs.miniwob import MiniWoBEnv
from coevo.envs.openended import OpenEndedEnv

CHROMIUM_MISSING = chromium_missing()
pytestmark = [
    pytest.mark.heavy,  # real engines / browsers, minutes per module on 2 cores: CI's second command (docs/guide.md, Tests)
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or ""),
]
SAMPLING = SamplingParams(max_new_tokens=32, temperature=0.0)

#: two clickable spans, one inside the other, each with its own handler (the inner one stops the event)
NESTED = """<!doctype html><html><head><title>Nested</title></head><body>
<div><span id="outer" onclick="document.getElementById('log').textContent = 'clicked outer'">Outer words
<span id="inner" onclick="event.stopPropagation(); document.getElementById('log').textContent = 'clicked inner'"
>Inner words</span></span></div><p id="log">nothing yet</p></body></html>"""
PLAIN = """<!doctype html><html><head><title>Plain</title></head><body><p>Nothing to click here.</p></body></html>"""


@pytest.fixture(scope="module")
def browser_env(tmp_path_factory):
    if not os.environ.get("PLAYWRIGHT_BROWSERS_PATH"):
        ensure_browser_env(tmp_path_factory.mktemp("pw"))


def link_clicker(conversation: list[dict]) -> str:
    """Reads the goal's link text and clicks the clickable element right above that text in the tree."""
    user = conversation[-1]["content"]
    word = re.search(r'Click on the link "(.+?)"', user).group(1)
    bid = re.search(r"\[(\d+)\] generic, clickable\n\s*StaticText '" + re.escape(word) + "'", user).group(1)
    return f"```\nclick('{bid}')\n```"


def test_click_link_has_its_links_and_is_solvable(browser_env):
    env = MiniWoBEnv()
    try:
        obs = env.reset("click-link", 10000)
        word = re.search(r'"(.+?)"', obs["goal"]).group(1)
        # the link is a clickable element with an id, its text right below it
        assert re.search(r"\[\d+\] generic, clickable\n\s*StaticText '" + re.escape(word) + "'", obs["axtree"])
        assert obs["clickable"] and all(f"[{b}] " in obs["axtree"] for b in obs["clickable"])
        solved = [
            run_episode(ScriptedPolicy(link_clicker), env, "click-link", seed, sampling=SAMPLING, max_steps=2)
            for seed in (10000, 10001, 10002)
        ]
    finally:
        env.close()
    assert [t.reward for t in solved] == [1.0, 1.0, 1.0]


def test_nested_clickable_spans_each_have_an_id_and_the_inner_one_can_be_clicked(browser_env, tmp_path):
    page = tmp_path / "nested.html"
    page.write_text(NESTED)
    spec = {"start_url": page.as_uri(), "goal": "Click the inner words.", "reward": {"page_contains": "clicked inner"}}
    env = OpenEndedEnv(spec)
    try:
        obs = env.reset("openended", 0)
        outer = re.search(r"\[(\w+)\] generic, clickable\n\s*StaticText 'Outer words'", obs["axtree"])
        inner = re.search(r"\[(\w+)\] generic, clickable\n\s*StaticText 'Inner words'", obs["axtree"])
        assert outer and inner, obs["axtree"]
        assert {outer.group(1), inner.group(1)} <= set(obs["clickable"])
        # the inner span sits below the outer one in the tree (deeper indentation)
        depth = {m.group(2): len(m.group(1)) for m in re.finditer(r"^(\t*)\[(\w+)\]", obs["axtree"], re.MULTILINE)}
        assert depth[inner.group(1)] > depth[outer.group(1)]
        obs, reward, done, _ = env.step(f"click('{inner.group(1)}')")
    finally:
        env.close()
    assert (reward, done, obs["last_action_error"]) == (1.0, True, "")


def test_a_page_without_a_clickable_element_is_a_note_and_the_episode_goes_on(browser_env, tmp_path):
    page = tmp_path / "plain.html"
    page.write_text(PLAIN)
    spec = {"start_url": page.as_uri(), "goal": "Click the button.", "reward": {"page_contains": "never there"}}
    env = OpenEndedEnv(spec, actions=["click"])
    try:
        assert env.reset("openended", 0)["clickable"] == []
        policy = ScriptedPolicy(["```\nclick('7')\n```", "no idea"])
        traj = run_episode(policy, env, "openended", 0, sampling=SAMPLING, max_steps=2)
    finally:
        env.close()
    assert traj.valid and traj.reward == 0.0 and traj.meta["end"] == "max_steps" and len(traj.steps) == 2
    first_prompt = policy.conversations[0][1]["content"]
    assert "Note: no element on this page is marked clickable" in first_prompt
    system = policy.conversations[0][0]["content"]
    shown = re.findall(r"click\('(\w+)'\)", system)
    assert shown and all(f"[{b}] " in first_prompt for b in shown)  # only ids the page has
    assert traj.steps[0].action == "click('7')" and traj.steps[0].tool_result  # the browser's error, fed back
    assert traj.steps[1].meta["kind"] == "parse_error"

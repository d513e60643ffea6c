"""Any site (issue 14.8): the ``openended`` web rollout on a local http.server site in real headless Chromium,
with the scripted test-double model (model only; BrowserGym, Chromium, the pages and the agent are real).

Also on this site: one action set for prompt, parser and env (14.2), a judge failure recorded as an evaluation
error (14.4) and the system prompt stored on the first step (14.9).
"""

from __future__ import annotations

import functools
import http.server
import re
import threading

import pytest
from pydantic import ValidationError
from support import chromium_missing

from coevo.agents.scripted import ScriptedPolicy
from coevo.rollouts.base import build_rollout

pytestmark = (
    pytest.mark.heavy
)  # Chromium and tiny-model episodes, minutes per module on 2 cores: CI's second command (docs/guide.md, Tests)

CHROMIUM_MISSING = chromium_missing()
browser = pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")

INDEX = """<!doctype html><html><head><title>Corner shop</title></head><body>
<h1>Corner shop newsletter</h1><p>The tea set costs 42 EUR.</p>
<a href="thanks.html">Subscribe</a></body></html>"""
THANKS = """<!doctype html><html><head><title>Thanks</title></head><body><p>Thanks for subscribing!</p></body></html>"""


def broken_judge(page, chat_messages, goal):
    """Stand-in for WebArena's LLM judge (``llm_fuzzy_match``) without OPENAI_API_KEY: it raises the same error
    ``webarena.llms.providers.openai_utils.get_openai_client`` raises. Referenced as ``test_web_openended:broken_judge``."""
    raise ValueError("OPENAI_API_KEY environment variable must be set when using OpenAI API.")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "index.html").write_text(INDEX)
    (root / "thanks.html").write_text(THANKS)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def spec(site: str, reward: dict, **extra) -> dict:
    return {
        "type": "web",
        "benchmark": "openended",
        "max_steps": 3,
        "test_episodes": 1,
        "n_envs": 1,
        "openended": {"start_url": f"{site}/index.html", "goal": "Subscribe to the newsletter.", "reward": reward},
        **extra,
    }


def click_subscribe(conversation: list[dict]) -> str:
    """Reads the axtree of the prompt and clicks the Subscribe link."""
    bid = re.search(r"\[(\w+)\] link 'Subscribe'", conversation[-1]["content"]).group(1)
    return f"```\nclick('{bid}')\n```"


def test_openended_config_is_validated_by_name():
    with pytest.raises(ValidationError, match="exactly one of"):
        build_rollout(spec("http://x", {"url_contains": "a", "page_contains": "b"}), None)
    with pytest.raises(ValidationError, match="start_url"):
        build_rollout(
            {
                **spec("http://x", {"url_contains": "a"}),
                "openended": {"start_url": "x.html", "goal": "g", "reward": {"url_contains": "a"}},
            },
            None,
        )
    with pytest.raises(ValidationError, match="judge: cannot import"):
        build_rollout(spec("http://x", {"judge": "no_such_module:fn"}), None)
    with pytest.raises(ValidationError, match="exactly when benchmark is openended"):
        build_rollout({"type": "web", "benchmark": "openended"}, None)


@browser
def test_any_site_with_a_url_reward_and_the_recorded_system_prompt(site):
    ro = build_rollout(spec(site, {"url_contains": "thanks.html"}), None)
    try:
        policy = ScriptedPolicy([click_subscribe])
        [traj] = ro.run(policy, generation=0, member=None, key_prefix="oe", split="test")
        assert (traj.valid, traj.reward, traj.meta["end"], len(traj.steps)) == (True, 1.0, "done", 1)
        assert traj.meta["final_url"].endswith("/thanks.html") and traj.task_id == "openended:10000"
        assert "Subscribe to the newsletter." in traj.steps[0].observation
        system = traj.steps[0].meta["system_prompt"]  # 14.9: what the agent saw, stored with the first step
        assert system == policy.conversations[0][0]["content"] and "goto(" in system
        assert 'Use send_msg_to_user("...")' in system  # offered (full action set), so the prompt may say so
    finally:
        ro.close()


@browser
def test_answer_reward_and_a_rejected_stop_action_does_not_end_the_episode(site):
    ro = build_rollout(spec(site, {"answer_contains": "42 EUR"}), None)
    try:
        # send_msg_to_user() without its argument: the parser accepts the name, BrowserGym rejects the call.
        policy = ScriptedPolicy(["```\nsend_msg_to_user()\n```", "```\nsend_msg_to_user('It costs 42 eur.')\n```"])
        [traj] = ro.run(policy, generation=0, member=None, key_prefix="oe", split="test")
        assert "TypeError" in traj.steps[0].tool_result  # rejected: fed back, the episode goes on
        assert (traj.reward, traj.meta["end"], len(traj.steps)) == (1.0, "done", 2)
        wrong = ro.run(
            ScriptedPolicy(["send_msg_to_user('It is free.')"]),
            generation=0,
            member=None,
            key_prefix="oe2",
            split="test",
        )[0]
        assert (wrong.valid, wrong.reward, wrong.meta["end"], len(wrong.steps)) == (True, 0.0, "done", 1)
    finally:
        ro.close()


@browser
def test_restricted_actions_agree_in_prompt_parser_feedback_and_env(site):
    """14.2: with actions [click, fill], the prompt offers neither send_msg_to_user nor goto, the feedback of
    a send_msg_to_user answer lists only click and fill (+ noop), and the episode is not ended by it."""
    ro = build_rollout(spec(site, {"url_contains": "thanks.html"}, actions=["click", "fill"]), None)
    try:
        policy = ScriptedPolicy(["```\nsend_msg_to_user('done')\n```", click_subscribe])
        [traj] = ro.run(policy, generation=0, member=None, key_prefix="oe", split="test")
        system = policy.conversations[0][0]["content"]
        for absent in ("send_msg_to_user", "goto(", "press(", "scroll("):
            assert absent not in system
        assert traj.steps[0].action is None and traj.steps[0].meta["kind"] == "parse_error"
        assert (
            traj.steps[0].tool_result
            == "Malformed output: unknown action(s) send_msg_to_user; allowed: click, fill, noop"
        )
        assert "allowed: click, fill, noop" in policy.conversations[1][1]["content"]
        assert (traj.reward, traj.meta["end"], len(traj.steps)) == (1.0, "done", 2)
    finally:
        ro.close()


@browser
def test_a_failing_judge_is_an_evaluation_error_of_the_episode_not_a_crash(site):
    """14.4 with a stand-in judge that raises (WebArena's LLM judge cannot run here: no sites, no key)."""
    ro = build_rollout(spec(site, {"judge": "test_web_openended:broken_judge"}), None)
    ok = build_rollout(spec(site, {"url_contains": "thanks.html"}), None)
    try:
        [traj] = ro.run(ScriptedPolicy([click_subscribe]), generation=0, member=None, key_prefix="j", split="test")
        assert (traj.valid, traj.reward, traj.failure, traj.meta["end"]) == (False, None, "evaluation", "eval_error")
        assert "evaluator failed: ValueError: OPENAI_API_KEY" in traj.failure_detail
        [good] = ok.run(ScriptedPolicy([click_subscribe]), generation=0, member=None, key_prefix="g", split="test")
        # ES sees the mean over episodes whose evaluator worked: the judge failure is left out, never -1 or 0
        assert ro.member_reward([traj, good]) == 1.0 and ro.member_reward([traj]) == 0.0
    finally:
        ro.close()
        ok.close()

"""ReAct math: generated problems with exact answers, exact answer checking, Mean@k / Pass@k, the sandboxed Python
tool (a call that loops, forks or opens a socket is contained), the episode protocol and the rollout."""

from __future__ import annotations

import math
import os
import re
import socket
import time
import uuid

import pytest
from support import pids_with_cmdline

from coevo.backends.base import Completion, Policy
from coevo.envs.react_math import (
    FAMILIES,
    MathEpisode,
    Problem,
    PythonTool,
    answers_match,
    extract_code,
    extract_final,
    mean_and_pass_at_k,
    parse_number,
    pass_at_k,
    problems,
)
from coevo.rollouts.base import build_rollout
from coevo.sandbox.isolation import bwrap_status

needs_bwrap = pytest.mark.skipif(not bwrap_status()[0], reason="bubblewrap is not usable here")


# ----------------------------------------------------------------------------------------------- problems
def _recompute(p: Problem):
    """The answer recomputed independently from the question text."""
    nums = [int(x) for x in re.findall(r"\d+", p.question)]
    if p.family == "arith":
        return nums[0] * nums[1] - nums[2]
    if p.family == "modpow":
        return pow(nums[0], nums[1], nums[2])
    if p.family == "primes":
        ps = [k for k in range(2, nums[0]) if all(k % d for d in range(2, math.isqrt(k) + 1))]
        return sum(ps) if "sum" in p.question else len(ps)
    if p.family == "gcdlcm":
        return math.gcd(*nums) if "greatest" in p.question else math.lcm(*nums)
    if p.family == "digitsum":
        return sum(map(int, str(nums[0] ** nums[1])))
    if p.family == "binomial":
        return math.comb(nums[1], nums[0])
    return None


def test_problem_answers_are_exact():
    ps = problems("train", 200, seed=5)
    assert {p.family for p in ps} == set(FAMILIES)
    checked = 0
    for p in ps:
        want = _recompute(p)
        if want is not None:
            assert parse_number(p.answer) == want, p
            checked += 1
        elif p.family == "fraction":
            a, b, op, c, d = re.match(r"Compute (\d+)/(\d+) ([-+*]) (\d+)/(\d+)", p.question).groups()
            from fractions import Fraction as F

            v = {
                "+": F(int(a), int(b)) + F(int(c), int(d)),
                "-": F(int(a), int(b)) - F(int(c), int(d)),
                "*": F(int(a), int(b)) * F(int(c), int(d)),
            }[op]
            assert parse_number(p.answer) == v
        else:  # shopping: q1 * p1 + q2 * p2 paid, change
            q1, p1, q2, p2, paid = re.match(
                r"Sam buys (\d+) notebooks at \$([\d.]+) each and (\d+) pens at \$([\d.]+) "
                r"each, and pays with \$(\d+)",
                p.question,
            ).groups()
            from fractions import Fraction as F

            assert parse_number(p.answer) == int(paid) - int(q1) * F(p1) - int(q2) * F(p2) > 0
    assert checked > 100
    assert problems("test", 5, 1) == problems("test", 5, 1) != problems("train", 5, 1)


# ----------------------------------------------------------------------------------------------- answers
@pytest.mark.parametrize(
    ("given", "expected", "ok"),
    [
        ("1,234", "1234", True),
        ("$44.75", "44.75", True),
        ("44.750", "44.75", True),
        (r"\frac{13}{21}", "13/21", True),
        ("26/42", "13/21", True),
        ("0.5", "1/2", True),
        ("42 dollars.", "42", True),
        (r"\boxed{7}", "7", True),
        ("-3", "-3", True),
        ("1e3", "1000", True),
        ("3.14", "22/7", False),
        ("43", "42", False),
        ("", "0", False),
        ("forty-two", "42", False),
        ("Paris", "paris.", True),
        (None, "1", False),
        ("1/0", "1", False),
    ],
)
def test_answers_are_checked_exactly(given, expected, ok):
    assert answers_match(given, expected) is ok


def test_extraction():
    assert extract_final("Thought: easy.\nAnswer: 12 apples") == ("12 apples", 15)
    assert extract_final("so <answer> 3/4 </answer>")[0] == "3/4"
    assert extract_final(r"the result is \boxed{\frac{1}{2}}")[0] == r"\frac{1}{2}"
    assert extract_final("no final") == (None, -1)
    code, at = extract_code("Let me compute.\n```python\nprint(2**10)\n```\n")
    assert code == "print(2**10)\n" and at == 16
    assert extract_code("<python>x = 1</python>")[0] == "x = 1"
    assert extract_code("```\nprint(1)\n```")[0] == "print(1)\n"


def test_pass_and_mean_at_k():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2) and pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    assert pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    m = mean_and_pass_at_k({"a": [True, False, False, False], "b": [False] * 4}, 2)
    assert m == {"mean@2": pytest.approx(0.125), "pass@2": pytest.approx(0.25)}


# ----------------------------------------------------------------------------------------------- the tool
@pytest.fixture(scope="module")
def tool():
    return PythonTool(timeout_s=4, memory_mb=512)


def test_tool_runs_code_and_reports_errors(tool):
    r = tool("x = 6 * 7\nx")
    assert r.stdout.strip() == "42" and r.error == "" and r.error_kind is None
    r = tool("print('partial')\n1 / 0")
    assert r.stdout.strip() == "partial" and "ZeroDivisionError" in r.error and "line 2" in r.error
    r = tool("def f(:\n  pass")
    assert r.error_kind == "syntax" and "SyntaxError" in r.error
    r = tool("print('x' * 10000)")
    assert len(r.stdout) == 2000


def test_tool_loop_is_stopped_by_the_timeout(tool):
    t0 = time.time()
    r = tool("print('start', flush=True)\nwhile True:\n    pass")
    assert r.error_kind == "timeout" and time.time() - t0 < 10
    assert "start" in r.stdout  # output printed before the kill survives


def test_tool_forks_do_not_survive_the_call(tool):
    marker = f"coevo-sleeper-{uuid.uuid4().hex[:12]}"  # a unique argument of the sleeping grandchildren
    code = (  # the sandbox has no `sleep` binary (issue 45): its own interpreter sleeps
        "import os, sys\nfor _ in range(5):\n    if os.fork() == 0:\n        os.setsid()\n"
        "        os.execv(sys.executable, [sys.executable, '-S', '-c', 'import time; time.sleep(100)', "
        f"'{marker}'])\nprint('parent done')"
    )
    r = tool(code)
    assert r.stdout.strip() == "parent done"
    time.sleep(0.3)
    assert pids_with_cmdline(marker) == []  # setsid'ed grandchildren are gone too


@needs_bwrap
def test_tool_has_no_network(tool):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        r = tool(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
        assert "connected" not in r.stdout and ("ConnectionRefused" in r.error or "unreachable" in r.error.lower())
        with pytest.raises(TimeoutError):
            server.accept()  # nothing reached the host
    finally:
        server.close()
    assert tool("import socket\nsocket.getaddrinfo('pypi.org', 443)").error_kind == "runtime"


@needs_bwrap
def test_tool_cannot_write_the_project(tool, tmp_path):
    target = os.path.join(os.path.dirname(__file__), f"pwned-{uuid.uuid4().hex}")
    r = tool(f"open({target!r}, 'w').write('x')")
    # the checkout is not even visible in the sandbox (only the interpreter and a private /tmp are)
    assert ("Read-only file system" in r.error or "No such file or directory" in r.error) and not os.path.exists(target)


# ----------------------------------------------------------------------------------------------- episodes
def _problem():
    return Problem("t/0", "What is 123456789 * 987654321?", str(123456789 * 987654321), "arith")


def test_episode_tool_then_answer(tool):
    ep = MathEpisode(_problem(), tool, max_turns=3)
    assert ep.observation().startswith("Problem: What is 123456789")
    action, fb = ep.step("Thought: big.\n```python\nprint(123456789 * 987654321)\n```")
    assert action.startswith("python:") and fb.startswith("Observation:\n121932631112635269") and not ep.done
    assert "turns left: 2" in ep.observation()
    ep.step("Answer: 121,932,631,112,635,269")
    assert ep.done and ep.reward() == 1.0 and ep.summary()["tool_calls"] == 1


def test_episode_wrong_malformed_and_turn_limit(tool):
    ep = MathEpisode(_problem(), tool, max_turns=2)
    action, fb = ep.step("I don't know")
    assert action is None and "No tool call" in fb and ep.turns == 1 and not ep.done
    ep.step("Answer: 5")
    assert ep.done and ep.reward() == 0.0
    ep = MathEpisode(_problem(), tool, max_turns=1)
    ep.step("just chatting")
    assert ep.done and ep.answer is None and ep.reward() == 0.0
    with pytest.raises(RuntimeError):
        ep.step("Answer: 1")
    ep = MathEpisode(_problem(), tool, max_turns=2)
    ep.step("Answer: 7\n```python\nprint(1)\n```")  # the answer comes first: no tool call
    assert ep.done and ep.tool_calls == 0


class ReActScript(Policy):
    """First turn: compute the question's product with the tool; second turn: answer the observed value."""

    def __init__(self):
        self.batches = []

    def generate(self, conversations, params):
        self.batches.append(len(conversations))
        out = []
        for conv in conversations:
            last = conv[-1]["content"]
            if last.startswith("Problem:"):
                a, b, c = (int(x) for x in re.findall(r"\d+", last)[:3])
                out.append(Completion(text=f"```python\nprint({a} * {b} - {c})\n```"))
            else:
                out.append(Completion(text="Answer: " + last.split("\n")[1]))
        return out


def test_react_math_rollout_with_a_scripted_agent():
    ro = build_rollout(
        {
            "type": "react_math",
            "families": ["arith"],
            "problems_per_member": 3,
            "test_problems": 2,
            "samples_per_problem": 3,
            "tool_timeout_s": 5,
        },
        None,
    )
    pol = ReActScript()
    ts = ro.run(pol, generation=0, member=None, key_prefix="m", split="test")
    assert len(ts) == ro.n_cases("test") == 6 and pol.batches == [6, 6]  # one batched call per turn
    assert all(t.reward == 1.0 and t.llm_calls == 2 and t.meta["tool_calls"] == 1 for t in ts)
    assert ts[0].steps[0].tool_result.startswith("Observation:") and ts[0].task_id == "react_math:test/0"
    assert ro.metrics(ts) == {"mean@3": 1.0, "pass@3": 1.0}
    assert ro.metrics(ts, k=1) == {"mean@1": 1.0, "pass@1": 1.0}
    with pytest.raises(Exception, match="families"):
        build_rollout({"type": "react_math", "families": ["calculus"]}, None)


def test_react_math_rollout_on_tiny_qwen2(tiny_model_dir):
    from coevo.backends.hf import HFPolicy

    ro = build_rollout({"type": "react_math", "problems_per_member": 2, "max_turns": 2, "max_new_tokens": 8}, None)
    ts = ro.run(HFPolicy(tiny_model_dir, batch_size=4), generation=0, member=None, key_prefix="k")
    assert len(ts) == 2 and all(t.reward == 0.0 and 1 <= t.llm_calls <= 2 for t in ts)


def test_tool_code_never_runs_in_the_callers_process(tool):
    """The agent's code runs in the sandboxed process only: a module it changes stays unchanged here."""
    import json

    r = tool("import json\njson._coevo_tool_was_here = True\nprint('done')")
    assert r.stdout.strip() == "done" and r.error == ""
    assert not hasattr(json, "_coevo_tool_was_here")

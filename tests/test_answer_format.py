"""The answer format of heuristic design (coevo.ahd.answer): the prefilled, code-first answer on the real HF path
(tiny random Qwen2), the stop rule at the function's end, read-back with docstrings and comments stripped, the
failure kinds of bad answers, and the fallback to the free format for a backend that cannot continue a message.

``ContinuingPolicy`` below is a test double for the *model only* (a fixed continuation per call, so that the
sampler's glue, extraction, stripping and sandboxed evaluation run on known text); the HF tests use the real
tiny model.
"""

from __future__ import annotations

import re

import pytest
from support import tsp_sampler

from coevo.ahd.answer import (
    BODY_REGEX,
    CHANGE_MARKS,
    FUNCTION_END_STOPS,
    IDEA_MARK,
    MARK_REPEAT_STOPS,
    answer_prefix,
    answer_stops,
    cut_after_function,
    read_answer,
)
from coevo.ahd.problem import load_problem
from coevo.ahd.prompts import answer_format, build_messages, free_format_messages, prefill_format, repair_messages
from coevo.ahd.sampler import SamplerSettings
from coevo.backends import cut_at_stop
from coevo.backends.base import Completion, Policy, SamplingParams, render_chat
from coevo.config import ConfigError, parse_config
from coevo.store import TrajectoryStore

PROBLEMS = ("tsp_construct", "kp_construct", "cvrp_construct", "bpp_online")
TSP = "select_next_node"
TSP_SPEC = None


def tsp_spec():
    global TSP_SPEC
    if TSP_SPEC is None:
        TSP_SPEC = load_problem("tsp_construct").prompt_spec()
    return TSP_SPEC


GOOD = (
    " {Go to the nearest unvisited node.}\n"
    '    """Nearest neighbour."""\n'
    "    # distances from here\n"
    "    d = distance_matrix[current_node, unvisited_nodes]\n"
    "\n"
    "    return int(unvisited_nodes[np.argmin(d)])  # the closest\n"
)


@pytest.mark.parametrize("name", PROBLEMS)
def test_prefix_holds_fence_imports_exact_def_line_and_idea_comment(name):
    spec = load_problem(name).prompt_spec()
    prefix = answer_prefix(spec)
    lines = prefix.split("\n")
    assert lines[0] == "```python" and "import numpy as np" in lines
    assert lines[-1] == f"    {IDEA_MARK}"
    sig = f"def {spec['function_name']}({', '.join(spec['inputs'])}):"
    assert lines[-2] == sig  # the template's exact signature, nothing of its docstring or body
    assert '"""' not in prefix


def test_prefilled_answer_is_glued_stripped_and_its_thought_read():
    prefix = answer_prefix(tsp_spec())
    ex = read_answer(GOOD + "```\nThis heuristic picks the nearest node.\n", TSP, prefix=prefix)
    assert ex.error is None and ex.thought == "Go to the nearest unvisited node."
    assert ex.code == (
        "import numpy as np\n\ndef select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        "    d = distance_matrix[current_node, unvisited_nodes]\n"
        "    return int(unvisited_nodes[np.argmin(d)])\n"
    )  # docstring and comments gone, the prose after the fence never kept
    compile(ex.code, "<t>", "exec")


def test_the_answer_ends_where_the_function_ends():
    # everything from the first line at column 0 on is cut: a second def, a test call, prose
    body, cut = cut_after_function(GOOD + "print(select_next_node(0, 0, [1], None))\ndef helper():\n    pass\n")
    assert cut and body == GOOD.rstrip("\n")
    assert cut_after_function(" idea\n    x = 1\n\n    return x") == (" idea\n    x = 1\n\n    return x", False)
    # the stop strings: a newline then any printable non-blank character, never a blank or indented line
    assert "\n`" in FUNCTION_END_STOPS and "\nd" in FUNCTION_END_STOPS and "\n#" in FUNCTION_END_STOPS
    assert all(s[0] == "\n" and len(s) == 2 and not s[1].isspace() for s in FUNCTION_END_STOPS)
    ex = read_answer(
        GOOD + "if __name__ == '__main__':\n    raise SystemExit(1)\n", TSP, prefix=answer_prefix(tsp_spec())
    )
    assert ex.error is None and "__main__" not in ex.code


def test_answer_stops_put_the_most_useful_first_for_a_server_that_takes_few():
    """vLLM's server takes 4 stop strings by default: the fence, the first comment line again (a comment loop), a
    second def and a column-0 comment; the rest of the rule and the config's own stops follow, none twice."""
    spec = tsp_spec()
    idea, change = answer_prefix(spec), answer_prefix(spec, CHANGE_MARKS["m1"])
    stops = answer_stops([idea, idea], ("\n```\n",))
    assert stops[:4] == ("\n`", "\n    # idea:", "\nd", "\n#") and stops[6] == "\n```\n"
    assert set(stops) == {*FUNCTION_END_STOPS, *MARK_REPEAT_STOPS, "\n```\n"} and len(set(stops)) == len(stops)
    assert answer_stops([change, idea])[:3] == ("\n`", "\n    # idea:", "\n    # change:")
    # the cut afterwards at all of them gives the same text as a server that stopped at the first one
    text = " x\n    return 1\nprint(1)\n```\nprose"
    assert cut_at_stop(text, stops) == cut_at_stop(text, FUNCTION_END_STOPS) == (" x\n    return 1", True)


@pytest.mark.parametrize(
    ("continuation", "finish", "kind"),
    [
        ("", "stop", "empty_body"),  # nothing at all
        ("   \n\n", "stop", "empty_body"),
        (" Prefer close nodes.", "stop", "no_code"),  # a thought, then the fence
        (" Prefer close nodes.\n    # and nothing else\n", "stop", "no_code"),
        (" Prefer close nodes.\n    pass\n", "stop", "no_code"),  # a body without a statement
        (
            " x\n    d = distance_matrix[current_node, unvisited_nodes]\n    return int(np.argmin(d",
            "length",
            "truncated",
        ),
        (" x\n    d = distance_matrix[current_node, unvisited_nodes]\n    return int(np.argmin(d", "stop", "syntax"),
    ],
)
def test_bad_prefilled_answers_get_their_own_failure_kind(continuation, finish, kind):
    ex = read_answer(continuation, TSP, prefix=answer_prefix(tsp_spec()), finish_reason=finish)
    assert ex.code is None and ex.error == kind and ex.detail


def test_free_format_thought_only_and_docstrings():
    ex = read_answer("{Prefer close nodes.}", TSP)
    assert ex.code is None and ex.error == "no_code" and ex.thought == "Prefer close nodes."
    assert read_answer("I cannot help.", TSP).error == "parse"
    code = '{t}\n```python\ndef select_next_node(a, b, c, d):\n    """doc"""\n    return int(c[0])  # first\n```'
    ex = read_answer(code, TSP)
    assert ex.code == "def select_next_node(a, b, c, d):\n    return int(c[0])\n" and ex.thought == "t"


def test_body_regex_takes_a_body_and_refuses_prose_comments_and_docstrings():
    assert re.fullmatch(BODY_REGEX, " idea\n    d = 1\n\n    if d:\n        return 2\n    return 3\n```")
    assert not re.fullmatch(BODY_REGEX, " idea\n    return 1\nThis is prose\n```")
    assert not re.fullmatch(BODY_REGEX, " idea\n    # a comment\n    return 1\n```")
    assert not re.fullmatch(BODY_REGEX, ' idea\n    """doc"""\n    return 1\n```')
    assert not re.fullmatch(BODY_REGEX, " idea\n   return 1\n```")  # 3 spaces


def test_prefill_messages_and_their_free_form():
    spec = tsp_spec()
    parent = load_problem("tsp_construct")
    seed = type("P", (), {"thought": "nearest", "code": parent.seed_heuristic_code(), "objective": 6.5})()
    pre = build_messages("m1", spec, [seed], answer="prefill")
    assert [m["role"] for m in pre] == ["system", "user", "assistant"]
    assert pre[-1]["content"] == answer_prefix(spec) and pre[1]["content"].endswith(prefill_format(spec))
    assert free_format_messages(pre, spec) == build_messages("m1", spec, [seed], answer="free")
    assert build_messages("m1", spec, [seed])[-1]["content"].endswith(answer_format(spec))
    with pytest.raises(ValueError, match="answer_format"):
        build_messages("i1", spec, answer="json")


# ---------------------------------------------------------------------------------------------- real HF path
@pytest.fixture(scope="module")
def hf_policy(tiny_model_dir):
    from coevo.backends.hf import HFPolicy

    return HFPolicy(tiny_model_dir, batch_size=4)


def test_hf_prompt_ends_with_the_prefix_and_returns_the_continuation(hf_policy):
    spec = tsp_spec()
    conv = build_messages("i1", spec, answer="prefill")
    (prompt,) = hf_policy._prompts([conv])
    assert prompt.endswith(answer_prefix(spec))  # no end-of-turn, no new assistant header after the prefix
    assert prompt == render_chat(hf_policy.tokenizer, conv)
    opened = render_chat(hf_policy.tokenizer, conv[:2])  # a conversation ending with the user: a new turn opens
    assert prompt.startswith(opened) and prompt[len(opened) :] == answer_prefix(spec)
    (c,) = hf_policy.generate([conv], SamplingParams(max_new_tokens=12, temperature=0))
    assert not c.text.startswith("```python") and c.completion_tokens >= 1


def test_sampler_on_hf_prefills_glues_and_records(tmp_path, hf_policy, private_cache):
    store = TrajectoryStore(tmp_path / "s.sqlite")
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0, seed=1)
    settings = {"train_size": 6, "train_count": 1, "train_seed": 1, "eval_timeout_s": 10, "eval_memory_mb": 1024}
    sampler = tsp_sampler(store, "r", sampling, **settings, eval_workers=1)
    jobs = [sampler.job("i1", key=sampler.key("i1", k), seed=5) for k in range(2)]
    trajs = sampler.sample(jobs, round_index=0, generation=0, policy=hf_policy)
    prefix = answer_prefix(tsp_spec())
    for t in trajs:
        assert t.meta["answer_format"] == "prefill" and t.steps[0].model_output.startswith(prefix)
        assert t.steps[0].observation.endswith(prefix)  # the assistant turn is part of what was sent
        assert not t.valid and t.failure is not None  # a random model: recorded as invalid, the run goes on
    store.close()


# ---------------------------------------------------------------------------------------------- sampler glue
class ContinuingPolicy(Policy):
    """Test double for the model: continues a prefilled answer with the next scripted continuation."""

    model_id = "continuing"
    can_continue_final_message = True

    def __init__(self, script):
        self.script, self.seen, self.params = list(script), [], None

    def generate(self, conversations, params):
        self.params = params
        out = []
        for conv in conversations:
            self.seen.append(conv)
            text = self.script[(len(self.seen) - 1) % len(self.script)]
            out.append(Completion(text=text, completion_tokens=len(text.split()), finish_reason="stop"))
        return out


class FreeOnlyPolicy(ContinuingPolicy):
    can_continue_final_message = False


def _sampler(tmp_path, **kw):
    store = TrajectoryStore(tmp_path / "s.sqlite")
    settings = {"train_size": 6, "train_count": 2, "train_seed": 1, "eval_timeout_s": 10, "eval_memory_mb": 1024}
    return tsp_sampler(
        store, "r", SamplingParams(max_new_tokens=64, stop=("\n```\n",)), **settings, eval_workers=1, **kw
    )


def test_sampler_prefill_stops_evaluates_stripped_code_and_records_kinds(tmp_path, private_cache):
    sampler = _sampler(tmp_path)
    policy = ContinuingPolicy([GOOD, " Only an idea.", ""])
    jobs = [sampler.job("i1", key=sampler.key("i1", k), seed=5) for k in range(3)]
    good, thought_only, empty = sampler.sample(jobs, round_index=0, generation=0, policy=policy)
    assert policy.seen[0][-1]["role"] == "assistant"
    assert set(FUNCTION_END_STOPS) <= set(policy.params.stop) and "\n```\n" in policy.params.stop
    assert set(MARK_REPEAT_STOPS) <= set(policy.params.stop)  # a second "# idea:" line is a comment loop: stop
    assert policy.params.regex is None
    assert good.valid and good.meta["thought"] == "Go to the nearest unvisited node."
    assert "#" not in good.meta["code"] and '"""' not in good.meta["code"]
    assert (thought_only.failure, empty.failure) == ("no_code", "empty_body")
    assert thought_only.meta["thought"] == "Only an idea."


def test_change_marks_open_m_answers_with_the_change_and_read_it_as_the_thought(tmp_path, private_cache):
    """``change_marks``: m1/m2/m3 answers start with the change they make (not an idea copied from the parent);
    e1/e2/i1 keep ``# idea:``; the free form and the repair keep the mark's ask; the line is the child's thought."""
    spec = tsp_spec()
    seed = type(
        "P", (), {"thought": "nearest", "code": load_problem("tsp_construct").seed_heuristic_code(), "objective": 6.5}
    )()
    for op, mark in CHANGE_MARKS.items():
        pre = build_messages(op, spec, [seed], answer="prefill", change_marks=True)
        assert pre[-1]["content"] == answer_prefix(spec, mark) and pre[-1]["content"].endswith("\n    " + mark)
        assert pre[1]["content"].endswith(prefill_format(spec, mark)) and mark in pre[1]["content"]
        assert free_format_messages(pre, spec) == build_messages(op, spec, [seed], answer="free")
        fix = repair_messages(pre, pre[-1]["content"] + " x\n    return 1", "TypeError: bad", spec)
        assert fix[-1]["content"] == pre[-1]["content"] and fix[-2]["content"].endswith(prefill_format(spec, mark))
    for op in ("e1", "e2"):
        assert build_messages(op, spec, [seed], answer="prefill", change_marks=True)[-1]["content"].endswith("# idea:")
    assert build_messages("m1", spec, [seed], answer="prefill")[-1]["content"].endswith("# idea:")  # off: as before

    sampler = _sampler(tmp_path, change_marks=True)
    parent = sampler.seed_individual()
    body = " avoid far nodes\n    d = distance_matrix[current_node, unvisited_nodes]\n    return int(unvisited_nodes[np.argmin(d)])\n```"
    policy = ContinuingPolicy([body])
    (child,) = sampler.sample(
        [sampler.job("m1", key=sampler.key("m1", 0), seed=5, parents=[parent])],
        round_index=0,
        generation=0,
        policy=policy,
    )
    assert policy.seen[0][-1]["content"].endswith("# change:")
    assert child.meta["thought"] == "avoid far nodes" and child.valid and child.meta["operator"] == "m1"


def test_backend_that_cannot_continue_gets_the_free_format_once_told(tmp_path, private_cache, caplog):
    sampler = _sampler(tmp_path)
    free_answer = "{Nearest.}\n```python\n" + "def select_next_node(a, b, c, d):\n    return int(c[0])\n```\n"
    policy = FreeOnlyPolicy([free_answer])
    jobs = [sampler.job("i1", key=sampler.key("i1", k), seed=5) for k in range(2)]
    with caplog.at_level("WARNING"):
        trajs = sampler.sample(jobs, round_index=0, generation=0, policy=policy)
    assert [m["role"] for m in policy.seen[0]] == ["system", "user"]
    assert policy.seen[0][-1]["content"].endswith(answer_format(tsp_spec()))
    assert set(FUNCTION_END_STOPS).isdisjoint(policy.params.stop)
    assert all(t.meta["answer_format"] == "free" for t in trajs)
    assert trajs[0].valid and trajs[1].failure == "duplicate"  # the same answer twice
    assert sum("cannot" in r.message for r in caplog.records) == 1


def test_grammar_needs_a_backend_that_constrains(tmp_path, private_cache):
    sampler = _sampler(tmp_path, answer_grammar=True)
    jobs = [sampler.job("i1", key=sampler.key("i1", 0), seed=5)]
    with pytest.raises(ConfigError, match="evolvers.eoh.answer_grammar"):
        sampler.sample(jobs, round_index=0, generation=0, policy=ContinuingPolicy([GOOD]))

    class Constraining(ContinuingPolicy):
        can_constrain = True

    policy = Constraining([GOOD])
    (t,) = sampler.sample(
        [sampler.job("i1", key=sampler.key("i1", 1), seed=5)], round_index=0, generation=0, policy=policy
    )
    assert policy.params.regex == BODY_REGEX and t.valid


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"answer_format": "json"}, "evolvers.eoh.answer_format"),
        ({"answer_format": "free", "answer_grammar": True}, "answer_grammar"),
    ],
)
def test_answer_settings_out_of_range_name_the_field(fields, needle):
    data = {
        "run": {"name": "x"},
        "evolvers": [{"name": "eoh", "type": "eoh", "problem": "tsp_construct", **fields}],
    }
    with pytest.raises(ConfigError, match=needle) as info:
        parse_config(data)
    assert sum(needle in line for line in str(info.value).splitlines()) == 1  # one line names the field


def test_sampler_settings_read_the_config_by_field_name_and_check_once():
    """``SamplerSettings.of``: every sampler field of an AHD config by its name (resolved sizes and seeds given),
    the checks in one place."""
    from coevo.evolvers.eoh import EoHConfig

    cfg = EoHConfig(
        problem="tsp_construct", train_count=3, parse_retries=2, repair=True, operator_temperature={"m1": 0.5}
    )
    s = SamplerSettings.of(cfg, train_size=20, train_seed=9)
    assert (s.train_size, s.train_count, s.train_seed, s.parse_retries, s.repair) == (20, 3, 9, 2, True)
    assert s.operator_temperature == {"m1": 0.5} and s.limits.timeout_s == cfg.eval_timeout_s
    for bad, field in (({"parse_retries": -1}, "parse_retries"), ({"answer_format": "json"}, "answer_format")):
        with pytest.raises(ValueError, match=field):
            SamplerSettings(train_size=5, train_count=1, train_seed=0, **bad)
    with pytest.raises(ValueError, match="answer_grammar"):
        SamplerSettings(train_size=5, train_count=1, train_seed=0, answer_format="free", answer_grammar=True)

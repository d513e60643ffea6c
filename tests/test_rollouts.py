"""Rollouts: exact checkers of the verifiable tasks, and both rollouts on a real tiny model."""

from __future__ import annotations

import random

import pytest

from coevo.backends.hf import HFPolicy
from coevo.rollouts.base import build_rollout, resolve_rollout
from coevo.rollouts.countdown import check_countdown, extract_answer, make_case, score_case
from coevo.types import ESMember


def test_countdown_checker():
    assert check_countdown("(3 + 5) * 2", [2, 3, 5], 16) == (True, True)
    assert check_countdown("3 * 5 + 2", [2, 3, 5], 16) == (True, False)  # wrong value
    assert check_countdown("5 * 5 - 9", [5, 9, 2], 16) == (True, False)  # 5 used twice
    assert check_countdown("7 + 9", [2, 3, 5], 16) == (True, False)  # numbers not given
    assert check_countdown("(3 + 5", [2, 3, 5], 8) == (False, False)  # syntax
    assert check_countdown("__import__('os').system('id')", [1], 1) == (False, False)  # never evaluated
    assert check_countdown("10 / (5 - 5)", [10, 5, 5], 1) == (False, False)
    assert check_countdown("6 / 4 * 2", [6, 4, 2], 3) == (True, True)  # exact fractions


def test_extract_and_score():
    assert extract_answer("thinking...\n<answer> 2*3 </answer> done") == "2*3"
    assert extract_answer("a\n\n b \n") == "b"
    case = {"prompt": "", "answer": 42}
    assert score_case("arithmetic", case, "The answer is 42.")[0] == 1.0
    assert score_case("arithmetic", case, "41")[0] == 0.0
    assert score_case("arithmetic", case, "no idea")[1] == "no integer in the answer"
    cd = {"numbers": [2, 3, 5], "target": 16}
    assert score_case("countdown", cd, "<answer>(3+5)*2</answer>")[0] == 1.0
    assert score_case("countdown", cd, "<answer>3+5</answer>")[0] == 0.1
    assert score_case("countdown", cd, "<answer>three</answer>")[0] == 0.0


def test_generated_cases_are_solvable_and_deterministic():
    for task in ("arithmetic", "countdown"):
        a = [make_case(task, random.Random(5), 20, 3) for _ in range(3)]
        b = [make_case(task, random.Random(5), 20, 3) for _ in range(3)]
        assert a == b
    rng = random.Random(0)
    for _ in range(50):
        c = make_case("countdown", rng, 20, 4)
        assert c["target"] > 0 and len(c["numbers"]) == 4


def test_unknown_rollout_type_lists_known():
    with pytest.raises(ValueError, match="known types: .*countdown.*target_logprob"):
        resolve_rollout("nope")


def test_rollouts_on_tiny_model(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir, batch_size=4)
    member = ESMember(seed=11, sigma=1e-3, sign=-1, index=2)
    lp = build_rollout({"type": "target_logprob", "target": "hello"}, None)
    ts = lp.run(policy, generation=0, member=member, key_prefix="k")
    assert [t.key for t in ts] == ["k/train/0", "k/train/1", "k/train/2"]
    assert all(t.reward < 0 and t.member == member and t.llm_calls == 1 for t in ts)
    assert lp.member_reward(ts) == pytest.approx(sum(t.reward for t in ts) / 3)
    cd = build_rollout({"type": "countdown", "task": "arithmetic", "cases_per_member": 3, "max_new_tokens": 4}, None)
    ts = cd.run(policy, generation=1, member=None, key_prefix="c", split="test")
    assert len(ts) == cd.n_cases("test") == 32
    assert all(t.reward in (0.0, 1.0) and t.steps[0].model_output is not None for t in ts)
    with pytest.raises(Exception, match="cases_per_member"):
        build_rollout({"type": "countdown", "cases_per_member": 0}, None)


def test_answer_logprob_reward_is_dense_and_test_split_records_exact_match(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir, batch_size=4)
    spec = {
        "type": "countdown",
        "reward": "answer_logprob",
        "cases_per_member": 3,
        "test_cases": 2,
        "max_new_tokens": 4,
    }
    ro = build_rollout(spec, None)
    train = ro.run(policy, generation=0, member=None, key_prefix="k")
    answers = [str(t.meta["case"]["answer"]) for t in train]
    convs = [[{"role": "user", "content": t.meta["case"]["prompt"]}] for t in train]
    lp = policy.logprob(convs, answers)
    n_tok = [len(policy.tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers]
    assert [t.reward for t in train] == pytest.approx([v / n for v, n in zip(lp.tolist(), n_tok)])
    assert all(t.meta["exact"] is None for t in train)  # no sampling on the train split
    test = ro.run(policy, generation=0, member=None, key_prefix="k", split="test")
    assert all(t.meta["exact"] in (0.0, 1.0) and t.reward < 0 for t in test)
    with pytest.raises(Exception, match="needs task 'arithmetic'"):
        build_rollout({"type": "countdown", "task": "countdown", "reward": "answer_logprob"}, None)

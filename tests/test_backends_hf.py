"""HFPolicy on a real tiny random Qwen2 model (see the ``tiny_model_dir`` fixture)."""

from __future__ import annotations

import pytest
import torch

from coevo.backends.base import PolicyError, SamplingParams
from coevo.backends.hf import HFPolicy

CONVS = [
    [{"role": "user", "content": "Write a Python function that adds two numbers."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}],
    [{"role": "user", "content": "def score(item, bins):"}],
    [
        {"role": "user", "content": "click('13')"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "Solve the task step by step: set 1 2 3"},
    ],
    [{"role": "user", "content": "a"}],
]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return HFPolicy(tiny_model_dir, batch_size=2)


def _templated_ids(policy, conv):
    return policy.tokenizer.apply_chat_template(conv, tokenize=True, add_generation_prompt=True, return_dict=False)


def test_batch_generate_counts_and_split(policy):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=0)
    out = policy.generate(CONVS, params)  # 5 conversations in batches of 2, 2, 1
    assert len(out) == len(CONVS)
    for conv, c in zip(CONVS, out):
        assert c.prompt_tokens == len(_templated_ids(policy, conv))
        assert 1 <= c.completion_tokens <= 8
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "length":
            assert c.completion_tokens == 8
        assert c.duration_s > 0 and c.error is None
    assert policy.generate([], params) == []


def test_seeded_sampling_is_reproducible(policy):
    a = policy.generate(CONVS, SamplingParams(max_new_tokens=12, seed=7))
    b = policy.generate(CONVS, SamplingParams(max_new_tokens=12, seed=7))
    c = policy.generate(CONVS, SamplingParams(max_new_tokens=12, seed=8))
    assert [x.text for x in a] == [x.text for x in b]
    assert [x.completion_tokens for x in a] == [x.completion_tokens for x in b]
    assert [x.text for x in a] != [x.text for x in c]


def test_seeded_generate_leaves_global_rng_untouched(policy):
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    policy.generate(CONVS[:2], SamplingParams(max_new_tokens=6, seed=5))
    assert torch.equal(torch.rand(4), expected)


def test_greedy_first_token_follows_chat_template(policy):
    """Greedy decoding in a left-padded batch picks the argmax of an unpadded forward pass on the templated
    prompt: the chat template is applied and padding does not leak into the result."""
    out = policy.generate(CONVS, SamplingParams(max_new_tokens=1, temperature=0))
    for conv, c in zip(CONVS, out):
        ids = torch.tensor([_templated_ids(policy, conv)])
        with torch.no_grad():
            first = int(policy.model(input_ids=ids).logits[0, -1].argmax())
        expected = policy.tokenizer.decode([first], skip_special_tokens=True)
        assert c.text == expected
    again = policy.generate(CONVS, SamplingParams(max_new_tokens=1, temperature=0))
    assert [c.text for c in again] == [c.text for c in out]


def test_stop_string_cuts_completion(policy):
    conv = [CONVS[0]]
    full = policy.generate(conv, SamplingParams(max_new_tokens=32, seed=3, top_k=50))[0]
    starts = [i for i, ch in enumerate(full.text) if not ch.isspace()]
    assert len(starts) > 12, "the random model should emit visible text"
    stop = full.text[starts[6] : starts[6] + 2]
    stopped = policy.generate(conv, SamplingParams(max_new_tokens=32, seed=3, top_k=50, stop=(stop,)))[0]
    assert stopped.text == full.text[: full.text.find(stop)]
    assert stopped.finish_reason == "stop"
    assert stopped.completion_tokens <= full.completion_tokens


def test_named_parameters_are_hf_names_once(policy):
    names = [n for n, _ in policy.named_parameters()]
    assert policy.has_parameters is True
    assert names == [n for n, _ in policy.model.named_parameters()]
    assert names[0] == "model.embed_tokens.weight"
    assert "model.layers.1.mlp.down_proj.weight" in names and "model.norm.weight" in names
    assert "lm_head.weight" not in names  # tied to the embedding, listed once
    assert len(names) == len(set(names))
    assert all(p.dtype == torch.float32 for _, p in policy.named_parameters())


def test_logprob_shape_finiteness_and_batch_consistency(policy):
    targets = ["def add(a, b):\n    return a + b", "hello", "x", "", "The answer is 42."]
    lp = policy.logprob(CONVS, targets)
    assert lp.shape == (5,) and lp.dtype == torch.float32
    assert torch.isfinite(lp).all()
    assert lp[3] == 0.0 and (lp[[0, 1, 2, 4]] < 0).all()
    singles = torch.cat([policy.logprob([c], [t]) for c, t in zip(CONVS, targets)])
    torch.testing.assert_close(lp, singles, atol=1e-4, rtol=1e-5)


def test_logprob_matches_manual_sum(policy):
    conv, target = CONVS[1], "set 4 5 6"
    prompt = _templated_ids(policy, conv)
    tgt = policy.tokenizer(target, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + tgt])
    with torch.no_grad():
        logp = torch.log_softmax(policy.model(input_ids=ids).logits[0].float(), dim=-1)
    manual = sum(float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(tgt))
    assert float(policy.logprob([conv], [target])[0]) == pytest.approx(manual, abs=1e-4)


def test_perturbing_named_parameters_changes_logprob(policy):
    conv, target = [CONVS[0]], ["def add(a, b):"]
    base = policy.logprob(conv, target)
    _, weight = next(iter(policy.named_parameters()))
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.add_(0.05 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    try:
        assert not torch.allclose(policy.logprob(conv, target), base)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert torch.equal(policy.logprob(conv, target), base)


def test_bfloat16_dtype(tiny_model_dir):
    p = HFPolicy(tiny_model_dir, dtype="bfloat16")
    assert all(t.dtype == torch.bfloat16 for _, t in p.named_parameters())
    out = p.generate(CONVS[:2], SamplingParams(max_new_tokens=4, seed=1))
    assert len(out) == 2 and all(c.completion_tokens >= 1 for c in out)
    assert p.logprob(CONVS[:1], ["hi"]).dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"dtype": "float8"}, "dtype"), ({"batch_size": 0}, "batch_size"), ({"device": "tpu"}, "device")],
)
def test_bad_constructor_arguments_name_the_field(tiny_model_dir, kwargs, field):
    with pytest.raises(ValueError, match=field):
        HFPolicy(tiny_model_dir, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available on this machine")
def test_cuda_unavailable_is_a_policy_error(tiny_model_dir):
    with pytest.raises(PolicyError, match="CUDA"):
        HFPolicy(tiny_model_dir, device="cuda")


@pytest.mark.parametrize(
    ("convs", "params", "field"),
    [
        ([[{"role": "bot", "content": "x"}]], SamplingParams(), r"conversations\[0\]\[0\]\['role'\]"),
        ([[{"role": "user", "content": 3}]], SamplingParams(), r"\['content'\]"),
        ([[]], SamplingParams(), r"conversations\[0\]"),
        ([CONVS[0]], SamplingParams(max_new_tokens=0), "max_new_tokens"),
        ([CONVS[0]], SamplingParams(temperature=-1.0), "temperature"),
        ([CONVS[0]], SamplingParams(top_p=0.0), "top_p"),
        ([CONVS[0]], SamplingParams(stop="ab"), "stop"),
    ],
)
def test_bad_generate_input_names_the_field(policy, convs, params, field):
    with pytest.raises((ValueError, TypeError), match=field):
        policy.generate(convs, params)


def test_logprob_length_mismatch(policy):
    with pytest.raises(ValueError, match="targets"):
        policy.logprob(CONVS[:2], ["a"])


def test_shared_prefix_is_prefilled_once_with_the_same_outputs(tiny_model_dir, monkeypatch):
    """Rows sharing a long token prefix (an EoH generation's system message and task) prefill it once and
    repeat its KV cache; every row's completion and prompt count equal those of the unshared batch."""
    from coevo.backends import hf

    system = {"role": "system", "content": "You design heuristics for routing problems. " * 4}
    convs = [[system, {"role": "user", "content": q}] for q in ("count to five", "a much longer question here", "x")]
    shared, plain = HFPolicy(tiny_model_dir), HFPolicy(tiny_model_dir)
    plain.min_shared_prefix = 10**9
    ids = [shared.tokenizer(p, add_special_tokens=False)["input_ids"] for p in shared._prompts(convs)]
    assert hf.shared_prefix_len(ids) >= 40 and hf.shared_prefix_len([[1, 2, 3], [1, 2], [1, 5]]) == 1
    prefilled: list[int] = []
    real = HFPolicy._prefix_cache

    def counted(self, input_ids, prefix, *groups):
        prefilled.append(prefix)
        return real(self, input_ids, prefix, *groups)

    monkeypatch.setattr(HFPolicy, "_prefix_cache", counted)
    for params in (
        SamplingParams(max_new_tokens=10, temperature=1.0, seed=3),
        SamplingParams(max_new_tokens=6, temperature=0),
    ):
        got, want = shared.generate(convs, params), plain.generate(convs, params)
        assert [c.text for c in got] == [c.text for c in want]
        assert [c.prompt_tokens for c in got] == [c.prompt_tokens for c in want] == [len(i) for i in ids]
        assert [c.completion_tokens for c in got] == [c.completion_tokens for c in want]
    assert prefilled == [hf.shared_prefix_len(ids)] * 2  # the plain policy never shares
    one = shared.generate(convs[:1] * 3, SamplingParams(max_new_tokens=4, temperature=0))  # all but 1 token shared
    assert prefilled[-1] == len(ids[0]) - 1 and len({c.text for c in one}) == 1

"""The ES update (exact arithmetic, sigma = 0, antithetic cancellation, masters) and record replay."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from test_es_models import lm_loss, tiny_qwen2

from coevo.es import (
    ESParams,
    GenerationRecord,
    ReplayMismatchError,
    Schedule,
    ScopeSpec,
    apply_records,
    es_update,
    generate_noise,
    normalize_rewards,
    perturb,
    replay,
    select_params,
)
from coevo.es.update import pairwise_sum_

TOKENS = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(5))


def test_update_equals_the_documented_float32_arithmetic():
    w = torch.randn(300, 70, generator=torch.Generator().manual_seed(1))
    orig = w.clone()
    seeds, signs, coeffs, alpha = [11, 12, 13], [1, -1, 1], [0.7, -0.2, 1.5], 3e-3
    stats = es_update([("l.weight", w)], seeds, signs, coeffs, alpha=alpha, sigma=1e-3)
    acc = torch.zeros(300 * 70)
    for seed, sign, c in zip(seeds, signs, coeffs, strict=True):
        acc += generate_noise(seed, "l.weight", (300 * 70,)) * (alpha * sign * c / 3)
    expected = orig + acc.view(300, 70)
    assert torch.equal(w, expected)
    assert not stats.skipped and stats.n_noise_streams == 3 and stats.changed_fraction > 0.99
    delta = (expected - orig).double().reshape(-1).tolist()
    assert stats.update_norm == pytest.approx(math.sqrt(math.fsum(d * d for d in delta)), rel=1e-12)


def test_pairwise_sum_is_the_fixed_tree_and_close_to_the_exact_sum():
    values = torch.randn(1001, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert pairwise_sum_(values.clone()) == pytest.approx(math.fsum(values.tolist()), rel=1e-14)
    tree = [1.0, 2.0, 4.0, 8.0, 16.0]  # n 5 -> h 3: [1+8, 2+16, 4] -> h 2: [9+4, 18] -> 31
    assert pairwise_sum_(torch.tensor(tree, dtype=torch.float64)) == 31.0
    assert pairwise_sum_(torch.empty(0, dtype=torch.float64)) == 0.0


def test_update_does_not_depend_on_the_thread_count():
    """weights and statistics are bit-equal on 1 and 2 torch threads (a float32 torch.dot norm differed: vLLM's
    worker on two OpenMP threads against HF on one, docs/vllm.md); a tensor of more than one noise chunk."""
    old = torch.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            w = torch.zeros(2**22 + 4099, dtype=torch.bfloat16)
            p = ESParams([("w", w)], master_dtype=torch.float32)
            stats = es_update(p, [1, 2, 3], [1, -1, 1], [0.5, -1.25, 2.0], alpha=1e-2, sigma=1e-2)
            out.append((p.weights_hash(), stats.update_norm, stats.max_abs_update, stats.changed_fraction))
    finally:
        torch.set_num_threads(old)
    assert out[0] == out[1] and out[0][1] > 0


def test_no_update_at_sigma_zero():
    model = tiny_qwen2()
    params = ESParams(select_params(model, "full"))
    before = params.weights_hash()
    stats = es_update(params, [1, 2], [1, 1], [1.0, -1.0], alpha=1.0, sigma=0.0)
    assert stats.skipped and "sigma == 0" in stats.reason and stats.update_norm == 0.0
    assert params.weights_hash() == before


def test_antithetic_pair_with_equal_rewards_cancels_exactly():
    def run(seeds, signs, rewards, alpha):
        w = torch.randn(64, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
        p = ESParams([("w", w)], master_dtype=torch.float32)
        stats = es_update(p, seeds, signs, list(normalize_rewards(rewards)), alpha=alpha, sigma=1e-2)
        return p.entries[0].master.clone(), stats

    both, stats = run([5, 5, 7, 7], [1, -1, 1, -1], [3.0, 3.0, 0.0, 2.0], alpha=1e-2)
    assert stats.n_noise_streams == 1  # seed 5's mirrored pair folded to exactly 0
    z = normalize_rewards([3.0, 3.0, 0.0, 2.0])
    w7 = torch.randn(64, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    p7 = ESParams([("w", w7)], master_dtype=torch.float32)
    es_update(p7, [7], [1], [z[2] - z[3]], alpha=1e-2 / 4, sigma=1e-2)  # the same step: alpha/N * (z+ - z-)
    assert torch.equal(both, p7.entries[0].master)
    equal, stats_eq = run([1, 1, 2, 2], [1, -1, 1, -1], [0.5, 0.5, 0.5, 0.5], alpha=1.0)
    start = torch.randn(64, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).float()
    assert torch.equal(equal.view(64, 64), start) and stats_eq.update_norm == 0.0


def test_fp32_masters_follow_the_float32_model_exactly():
    """A bf16 model with float32 masters takes exactly the steps a float32 copy takes; without masters
    most small bf16 steps are lost."""
    bf = tiny_qwen2(torch.bfloat16)
    f32 = tiny_qwen2(torch.bfloat16).float()
    plain = tiny_qwen2(torch.bfloat16)
    p_bf = ESParams(select_params(bf, "all_linear"), master_dtype=torch.float32)
    p_32 = ESParams(select_params(f32, "all_linear"))
    p_plain = ESParams(select_params(plain, "all_linear"))
    assert p_bf.master_bytes == p_bf.numel * 4 and p_32.master_bytes == 0
    fractions = []
    for g in range(5):
        args = ([10 * g + i for i in range(4)], [1, -1, 1, -1], [1.0, -0.5, 0.25, 2.0])
        s_bf, s_32 = (
            es_update(p_bf, *args, alpha=2e-5, sigma=1e-3),
            es_update(p_32, *args, alpha=2e-5, sigma=1e-3),
        )
        fractions.append(es_update(p_plain, *args, alpha=2e-5, sigma=1e-3).changed_fraction)
        assert s_bf.update_norm == s_32.update_norm
    for e_bf, (_, t32) in zip(p_bf.entries, p_32.items(), strict=True):
        assert torch.equal(e_bf.master, t32.reshape(-1))
        assert torch.equal(e_bf.tensor, t32.to(torch.bfloat16))
    assert max(fractions) < 0.2  # plain bf16 loses most 2e-5-sized steps (docs/references.md §1: ~90 %)


def test_weight_decay_and_divide_by_sigma():
    w = torch.randn(1000, generator=torch.Generator().manual_seed(4))
    orig = w.clone()
    es_update([("w", w)], [1, 1], [1, -1], [0.5, 0.5], alpha=0.1, sigma=1e-2, weight_decay=0.5)
    assert torch.equal(w, orig * (1 - 0.1 * 0.5))  # the pair folds to 0: pure decay
    a, b = orig.clone(), orig.clone()
    es_update([("w", a)], [3], [1], [1.0], alpha=1e-3, sigma=0.5, divide_by_sigma=True)
    es_update([("w", b)], [3], [1], [1.0], alpha=2e-3, sigma=0.5)
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"signs": [1]}, "signs"),
        ({"signs": [1, 0]}, "signs"),
        ({"coeffs": [1.0, float("nan")]}, "coeffs"),
        ({"alpha": -1.0}, "alpha"),
        ({"sigma": float("inf")}, "sigma"),
        ({"seeds": [1, -5]}, "seeds"),
        ({"weight_decay": 20.0}, "weight_decay"),
    ],
)
def test_update_rejects_bad_input_naming_the_field(kwargs, field):
    args = {"seeds": [1, 2], "signs": [1, 1], "coeffs": [1.0, 2.0], "alpha": 0.1, "sigma": 0.1} | kwargs
    with pytest.raises(ValueError, match=field):
        es_update([("w", torch.zeros(3))], **args)


def _es_run(model, generations: int, master: bool, population: int = 4) -> list[dict]:
    """A real ES loop on a tiny Qwen2: reward = -LM loss of the perturbed model on fixed tokens."""
    scope = ScopeSpec("all_linear", exclude=("*.v_proj.weight",))
    params = ESParams(select_params(model, scope), master_dtype=torch.float32 if master else None)
    sigmas = Schedule("cosine", 2e-2, 0.0, total=generations)
    rng = np.random.default_rng(2024)
    records = []
    for t in range(generations):
        sigma = sigmas(t)
        base = [int(s) for s in rng.integers(0, 2**63 - 1, population // 2)]
        seeds, signs = [s for s in base for _ in (0, 1)], [1, -1] * (population // 2)
        rewards = []
        for seed, sign in zip(seeds, signs, strict=True):
            with perturb(params, seed, sigma, sign):
                rewards.append(-lm_loss(model, TOKENS))
        coeffs = normalize_rewards(rewards, "centered_rank")
        stats = es_update(params, seeds, signs, list(coeffs), alpha=5e-3, sigma=sigma)
        records.append(
            GenerationRecord(
                t,
                seeds,
                signs,
                rewards,
                list(coeffs),
                sigma,
                5e-3,
                "centered_rank",
                scope.to_dict(),
                skipped=stats.skipped,
                weight_hash_after=params.weights_hash(),
                master_dtype="float32" if master else None,
            ).to_dict()
        )
    return records


@pytest.mark.parametrize(("dtype", "master"), [(torch.bfloat16, True), (torch.float32, False)])
def test_replay_reproduces_the_trained_weights(dtype, master):
    model = tiny_qwen2(dtype, seed=7)
    records = json.loads(json.dumps(_es_run(model, generations=4, master=master)))
    assert records[-1]["skipped"] and records[-1]["sigma"] == 0.0  # last test-time step only evaluates
    assert not records[0]["skipped"]
    assert records[-2]["weight_hash_after"] == records[-1]["weight_hash_after"]
    fresh = tiny_qwen2(dtype, seed=7)
    params = replay(fresh, records)
    assert params.weights_hash() == records[-1]["weight_hash_after"]
    assert lm_loss(fresh, TOKENS) == lm_loss(model, TOKENS)
    assert GenerationRecord.from_dict(records[1]).to_dict() == records[1]


def test_replay_detects_a_different_history():
    model = tiny_qwen2(seed=8)
    records = _es_run(model, generations=3, master=False)
    records[1]["coeffs"][0] += 1e-3
    with pytest.raises(ReplayMismatchError, match="generation 1"):
        replay(tiny_qwen2(seed=8), records)
    # the one replay loop in "report" mode: keeps applying, names the first mismatching generation
    params = ESParams(select_params(tiny_qwen2(seed=8), ScopeSpec("all_linear", exclude=("*.v_proj.weight",))))
    report = apply_records(params, [GenerationRecord.from_dict(r) for r in records], on_mismatch="report")
    assert (report.applied, report.first_mismatch, len(report.stats)) == (3, 1, 3) and not report.ok
    assert report.expected == records[1]["weight_hash_after"] != report.got
    assert report.weights_hash == params.weights_hash() != records[-1]["weight_hash_after"]
    with pytest.raises(ValueError, match="increasing generation"):
        replay(tiny_qwen2(seed=8), [records[1], records[0]])
    with pytest.raises(ValueError, match="unknown GenerationRecord keys"):
        GenerationRecord.from_dict(records[0] | {"sigma_t": 1.0})
    with pytest.raises(ValueError, match="equally long"):
        GenerationRecord.from_dict(records[0] | {"signs": [1]})

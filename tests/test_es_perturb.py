"""Perturb / restore: exactness, exception safety, the double-perturb guard and inference-mode drift."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch
from test_es_models import lm_loss, tiny_qwen2

from coevo.es import (
    NOISE_CHUNK_NUMEL,
    ESParams,
    es_update,
    generate_noise,
    perturb,
    select_params,
    weights_hash,
)

TOKENS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))


def _snapshot(pairs):
    return [(n, t.detach().clone()) for n, t in pairs]


def _identical(pairs, snap) -> bool:
    return all(
        torch.equal(t.view(torch.uint8), s.view(torch.uint8)) for (_, t), (_, s) in zip(pairs, snap, strict=True)
    )


@pytest.mark.parametrize(
    ("dtype", "mode", "master"),
    [
        (torch.float32, "exact", False),
        (torch.bfloat16, "exact", False),
        (torch.bfloat16, "exact", True),
        (torch.float16, "exact", True),
        (torch.bfloat16, "inference", True),  # inference mode restores tensors that have a master from it
    ],
)
def test_restore_is_bit_identical(dtype, mode, master):
    model = tiny_qwen2(dtype)
    params = ESParams(select_params(model, "full"), master_dtype=torch.float32 if master else None)
    before, loss0 = params.weights_hash(), lm_loss(model, TOKENS)
    for sign in (1, -1):
        with perturb(params, seed=11, sigma=1e-2, sign=sign, mode=mode) as p:
            assert p.active and params.active is p
            assert params.weights_hash() != before
            assert lm_loss(model, TOKENS) != loss0
        assert not p.active and params.active is None
        assert params.weights_hash() == before
    assert lm_loss(model, TOKENS) == loss0


def test_perturbed_values_follow_the_formula():
    w = torch.linspace(-1, 1, 3000).reshape(60, 50)
    orig = w.clone()
    eps = generate_noise(5, "layer.weight", (60, 50))
    with perturb([("layer.weight", w)], 5, 0.125, sign=-1):
        assert torch.equal(w, orig + (-0.125 * eps))
    with perturb([("layer.weight", w)], 5, 0.0):
        assert torch.equal(w, orig)  # sigma 0 changes nothing
    wb = orig.to(torch.bfloat16)
    with perturb([("layer.weight", wb)], 5, 0.125):
        assert torch.equal(wb, (orig.to(torch.bfloat16).float() + 0.125 * eps).to(torch.bfloat16))


def test_exception_in_rollout_restores_and_propagates():
    model = tiny_qwen2(torch.bfloat16)
    params = ESParams(select_params(model, "all_linear"))
    before = params.weights_hash()
    with pytest.raises(ZeroDivisionError), perturb(params, 1, 1e-2):
        _ = 1 / 0
    assert params.weights_hash() == before and params.active is None


def _interrupt_nth_call(func_name: str, n: int) -> Callable:
    """A sys.settrace tracer raising KeyboardInterrupt when the n-th call of ``func_name`` starts
    (an asynchronous interrupt delivered at an exact point; the tracer unsets itself after raising)."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "call" and frame.f_code.co_name == func_name:
            count += 1
            if count == n:
                raise KeyboardInterrupt(f"injected at call {n} of {func_name}")

    return tracer


def _three_tensors(dtype):
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(10, 10, generator=g).to(dtype)),
        ("b.weight", torch.randn(NOISE_CHUNK_NUMEL + 1000, generator=g).to(dtype)),  # two chunks
        ("c.weight", torch.randn(7, generator=g).to(dtype)),
    ]


@pytest.mark.parametrize("mode", ["exact", "inference"])
def test_interrupt_in_the_middle_of_perturb_leaves_weights_restored(mode):
    pairs = _three_tensors(torch.float32)
    snap = _snapshot(pairs)
    params = ESParams(pairs)
    sys.settrace(_interrupt_nth_call("fill", 3))  # fills: a, b chunk 0, b chunk 1 <- interrupted
    try:
        with pytest.raises(KeyboardInterrupt, match="call 3 of fill"):
            perturb(params, 7, 1e-2, mode=mode)
    finally:
        sys.settrace(None)
    assert params.active is None
    if mode == "exact":
        assert _identical(pairs, snap)
    else:  # restored by subtraction: within float32 rounding, untouched tail exactly equal
        for (_, t), (_, s) in zip(pairs, snap, strict=True):
            assert torch.allclose(t, s, rtol=0, atol=1e-6)
        assert torch.equal(pairs[1][1][NOISE_CHUNK_NUMEL:], snap[1][1][NOISE_CHUNK_NUMEL:])
        assert torch.equal(pairs[2][1], snap[2][1])
    with perturb(params, 7, 1e-2):  # usable again
        pass


def test_failed_restore_restores_the_rest_and_can_be_retried():
    pairs = _three_tensors(torch.bfloat16)
    snap = _snapshot(pairs)
    params = ESParams(pairs)
    p = perturb(params, 9, 1e-2)
    sys.settrace(_interrupt_nth_call("_restore_entry", 2))  # fails on b.weight
    try:
        with pytest.raises(KeyboardInterrupt):
            p.restore()
    finally:
        sys.settrace(None)
    assert p.active and params.active is p
    assert torch.equal(pairs[0][1], snap[0][1]) and torch.equal(pairs[2][1], snap[2][1])
    assert not torch.equal(pairs[1][1], snap[1][1])
    p.restore()
    assert _identical(pairs, snap) and params.active is None


def test_second_perturb_while_active_is_refused():
    model = tiny_qwen2()
    params = ESParams(select_params(model, "all_linear"))
    before = params.weights_hash()
    with perturb(params, 1, 1e-2):
        perturbed = params.weights_hash()
        with pytest.raises(RuntimeError, match="already active"):
            perturb(params, 2, 1e-2)
        other_holder = select_params(model, {"scope": "full", "include": ["*.q_proj.weight"]})
        with pytest.raises(RuntimeError, match="already perturbed"):
            perturb(other_holder, 2, 1e-2)
        with pytest.raises(RuntimeError, match="restore it first"):
            es_update(params, [1], [1], [1.0], alpha=1e-3, sigma=1e-2)
        assert params.weights_hash() == perturbed
    assert params.weights_hash() == before
    with perturb(other_holder, 2, 1e-2):
        pass
    assert params.weights_hash() == before


def test_bad_arguments_name_the_field():
    pairs = [("w", torch.zeros(4))]
    for kwargs, field in (
        ({"sigma": -1.0}, "sigma"),
        ({"sigma": float("nan")}, "sigma"),
        ({"sign": 2}, "sign"),
        ({"mode": "fast"}, "mode"),
    ):
        args = {"seed": 1, "sigma": 0.1} | kwargs
        with pytest.raises(ValueError, match=field):
            perturb(pairs, **args)
    with pytest.raises(ValueError, match="contiguous"):
        ESParams([("w", torch.zeros(4, 4).t())])
    with pytest.raises(ValueError, match="floating-point"):
        ESParams([("w", torch.zeros(4, dtype=torch.int64))])
    with pytest.raises(ValueError, match="shares storage"):
        t = torch.zeros(4)
        ESParams([("a", t), ("b", t)])


def _drift(model_dtype: torch.dtype, mode: str, cycles: int) -> tuple[float, float]:
    model = tiny_qwen2(model_dtype)
    pairs = select_params(model, "full")
    snap = _snapshot(pairs)
    params = ESParams(pairs)
    for k in range(cycles):
        with perturb(params, 1000 + k, 1e-3, sign=1 if k % 2 else -1, mode=mode):
            pass
    diff = torch.cat([(t.detach().float() - s.float()).reshape(-1) for (_, t), (_, s) in zip(pairs, snap, strict=True)])
    return float(diff.square().mean().sqrt()), float((diff != 0).float().mean())


def test_inference_mode_drifts_and_exact_mode_does_not():
    cycles = 50
    rms_bf16, frac_bf16 = _drift(torch.bfloat16, "inference", cycles)
    rms_fp32, frac_fp32 = _drift(torch.float32, "inference", cycles)
    print(
        f"\ninference-mode drift after {cycles} cycles at sigma 1e-3: "
        f"bf16 RMS {rms_bf16:.2e} changed {frac_bf16:.1%}; fp32 RMS {rms_fp32:.2e} changed {frac_fp32:.1%}"
    )
    assert rms_bf16 > 0 and frac_bf16 > 0.01
    assert rms_fp32 < rms_bf16 / 100
    assert _drift(torch.bfloat16, "exact", cycles) == (0.0, 0.0)
    assert _drift(torch.float32, "exact", cycles) == (0.0, 0.0)


def test_inference_mode_without_masters_leaves_params_usable():
    model = tiny_qwen2(torch.bfloat16)
    params = ESParams(select_params(model, "all_linear"))
    with perturb(params, 3, 1e-3, mode="inference"):
        pass
    assert weights_hash(params.items()) == params.weights_hash()
    assert params.active is None

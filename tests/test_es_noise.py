"""Noise keyed by (seed, tensor name, chunk), fused (vLLM-layout) noise, and layout checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_es_models import tiny_qwen2

from coevo.es import (
    NOISE_CHUNK_NUMEL,
    ESParams,
    chunk_seed,
    es_update,
    fused_noise,
    generate_noise,
    noise_layout,
    perturb,
)


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(np.corrcoef(a.double().numpy(), b.double().numpy())[0, 1])


def test_chunk_seed_is_63_bit_and_distinct():
    seeds = {chunk_seed(s, n, c) for s in (0, 1, 2**63 - 1) for n in ("a.weight", "b.weight") for c in (0, 1)}
    assert len(seeds) == 12
    assert all(0 <= s < 2**63 for s in seeds)
    assert chunk_seed(7, "x", 0) == chunk_seed(7, "x", 0)


def test_noise_is_standard_normal_float32_and_deterministic():
    eps = generate_noise(123, "model.layers.0.mlp.up_proj.weight", (400, 250))
    assert eps.dtype == torch.float32 and eps.shape == (400, 250)
    assert abs(float(eps.mean())) < 0.01 and abs(float(eps.std()) - 1.0) < 0.01
    assert torch.equal(eps, generate_noise(123, "model.layers.0.mlp.up_proj.weight", (400, 250)))
    bf = generate_noise(123, "model.layers.0.mlp.up_proj.weight", (400, 250), dtype=torch.bfloat16)
    assert torch.equal(bf, eps.to(torch.bfloat16))


def test_different_tensors_seeds_and_chunks_are_uncorrelated():
    n = 100_000
    a = generate_noise(5, "model.layers.0.self_attn.q_proj.weight", (n,))
    b = generate_noise(5, "model.layers.1.self_attn.q_proj.weight", (n,))
    c = generate_noise(6, "model.layers.0.self_attn.q_proj.weight", (n,))
    assert abs(_corr(a, b)) < 0.05 and abs(_corr(a, c)) < 0.05
    big = generate_noise(5, "big", (NOISE_CHUNK_NUMEL + n,))  # chunk 1 must not repeat chunk 0
    assert abs(_corr(big[:n], big[NOISE_CHUNK_NUMEL:])) < 0.05
    assert torch.equal(big[NOISE_CHUNK_NUMEL:], generate_noise(5, "big", (NOISE_CHUNK_NUMEL + n,))[-n:])


def test_layout_covers_tensor_in_chunks():
    segs = noise_layout("w", 2 * NOISE_CHUNK_NUMEL + 5)
    assert [(s.start, s.stop, s.chunk) for s in segs] == [
        (0, NOISE_CHUNK_NUMEL, 0),
        (NOISE_CHUNK_NUMEL, 2 * NOISE_CHUNK_NUMEL, 1),
        (2 * NOISE_CHUNK_NUMEL, 2 * NOISE_CHUNK_NUMEL + 5, 2),
    ]
    assert noise_layout("w", 0) == []
    with pytest.raises(ValueError, match="fused parts of 'qkv'"):
        noise_layout("qkv", 10, [("q", (2, 2)), ("k", (1, 2))])


def test_bad_seed_and_name_are_rejected():
    with pytest.raises(ValueError, match="seed"):
        chunk_seed(-1, "w", 0)
    with pytest.raises(ValueError, match="seed"):
        chunk_seed(2**63, "w", 0)
    with pytest.raises(TypeError, match="seed"):
        chunk_seed(1.5, "w", 0)
    with pytest.raises(ValueError, match="name"):
        chunk_seed(1, "", 0)


def _qkv_parts(model, layer: int):
    pre = f"model.layers.{layer}.self_attn."
    named = dict(model.named_parameters())
    return [(pre + p, tuple(named[pre + p].shape)) for p in ("q_proj.weight", "k_proj.weight", "v_proj.weight")]


def test_fused_noise_equals_concatenated_hf_noise():
    model = tiny_qwen2()
    parts = _qkv_parts(model, 1)
    fused = fused_noise(99, parts)
    assert fused.shape == (32 + 16 + 16, 32)
    assert torch.equal(fused, torch.cat([generate_noise(99, n, s) for n, s in parts], 0))
    with pytest.raises(ValueError, match="beyond dim 0"):
        fused_noise(1, [("a", (2, 3)), ("b", (2, 4))])


def _fuse(model, layer: int) -> dict[str, tuple[torch.Tensor, list]]:
    """Build vLLM-style fused qkv_proj and gate_up_proj weights of one layer (copies)."""
    named = dict(model.named_parameters())
    pre = f"model.layers.{layer}."
    qkv = _qkv_parts(model, layer)
    gate_up = [(pre + f"mlp.{p}.weight", tuple(named[pre + f"mlp.{p}.weight"].shape)) for p in ("gate_proj", "up_proj")]
    out = {}
    for fused_name, parts in (
        (pre + "self_attn.qkv_proj.weight", qkv),
        (pre + "mlp.gate_up_proj.weight", gate_up),
    ):
        out[fused_name] = (torch.cat([named[n].detach() for n, _ in parts], 0).clone(), parts)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layout_perturbs_and_updates_like_hf_layout(dtype):
    model = tiny_qwen2(dtype)
    fused = _fuse(model, 0)
    hf_names = [n for _, parts in fused.values() for n, _ in parts]
    named = dict(model.named_parameters())
    hf = ESParams([(n, named[n]) for n in hf_names], master_dtype=torch.float32)
    vl = ESParams(
        [(n, t) for n, (t, _) in fused.items()],
        master_dtype=torch.float32,
        fused={n: parts for n, (_, parts) in fused.items()},
    )

    def fused_from_hf():
        return {f: torch.cat([named[n].detach() for n, _ in parts], 0) for f, (_, parts) in fused.items()}

    with perturb(hf, 42, 1e-2, sign=-1), perturb(vl, 42, 1e-2, sign=-1):
        for f, t in fused_from_hf().items():
            assert torch.equal(t, fused[f][0])
            assert not torch.equal(t, _fuse(tiny_qwen2(dtype), 0)[f][0])
    for seeds in ([3, 4, 3], [8, 9, 10]):
        s_hf = es_update(hf, seeds, [1, 1, -1], [0.5, -1.25, 2.0], alpha=1e-2, sigma=1e-2)
        s_vl = es_update(vl, seeds, [1, 1, -1], [0.5, -1.25, 2.0], alpha=1e-2, sigma=1e-2)
        assert s_hf.update_norm == s_vl.update_norm > 0
        for f, t in fused_from_hf().items():
            assert torch.equal(t, fused[f][0])

"""Small real models for the ES math tests (imported by the other tests/test_es_*.py files).

``tiny_qwen2``: a randomly initialised Qwen2 causal LM from transformers' ``Qwen2Config`` (hidden 32,
2 layers, 4 heads / 2 KV heads, vocabulary 256 unless given), built in-process; no download.
"""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(
    dtype: torch.dtype = torch.float32, seed: int = 0, tie: bool = False, vocab: int = 256
) -> Qwen2ForCausalLM:
    """A random tiny Qwen2 (same weights for the same seed), in ``dtype``, eval mode, on the CPU, with ``vocab``
    tokens; seeds torch's global RNG with ``seed``."""
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).to(dtype).eval()


def lm_loss(model: Qwen2ForCausalLM, tokens: torch.Tensor) -> float:
    """Mean next-token cross-entropy (nats) of ``tokens`` (int64, shape (batch, length))."""
    with torch.no_grad():
        return float(model(input_ids=tokens, labels=tokens).loss)


def test_tiny_qwen2_is_a_working_causal_lm():
    model = tiny_qwen2()
    tokens = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    assert logits.shape == (2, 8, 256)
    assert 4.0 < lm_loss(model, tokens) < 7.0  # about ln(256) = 5.55 for a random model
    names = dict(model.named_parameters())
    assert names["model.layers.0.self_attn.k_proj.weight"].shape == (16, 32)
    assert torch.equal(tiny_qwen2(seed=0).lm_head.weight, model.lm_head.weight)

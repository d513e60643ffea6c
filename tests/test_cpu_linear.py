"""float32 CPU linear layers through oneDNN (coevo.backends.cpu_linear) on a real tiny Qwen2."""

from __future__ import annotations

import pytest
import torch

from coevo.backends.base import PolicyError, SamplingParams
from coevo.backends.cpu_linear import onednn_available, use_onednn_linear, use_torch_linear
from coevo.backends.hf import HFPolicy
from coevo.config import ConfigError, parse_config

pytestmark = pytest.mark.skipif(not onednn_available(), reason="torch's oneDNN linear op is unavailable here")

CONVS = [[{"role": "user", "content": "count to five"}], [{"role": "user", "content": "a longer question here"}]]


def _logits(policy: HFPolicy) -> torch.Tensor:
    ids = policy.tokenizer(policy._prompts(CONVS[:1]), return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        return policy.model(**ids).logits


def test_auto_uses_onednn_and_matches_torch(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir)
    assert policy.cpu_linear == "onednn"
    fast = _logits(policy)
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    fast_text = [c.text for c in policy.generate(CONVS, greedy)]
    assert use_torch_linear(policy.model) == sum(isinstance(m, torch.nn.Linear) for m in policy.model.modules())
    assert torch.allclose(fast, _logits(policy), atol=1e-4, rtol=1e-4)
    assert [c.text for c in policy.generate(CONVS, greedy)] == fast_text
    assert HFPolicy(tiny_model_dir, cpu_linear="torch").cpu_linear == "torch"


def test_in_place_weight_changes_are_seen(tiny_model_dir):
    """ES perturbs, restores and updates the dense weights in place; the next forward must see each change."""
    fast, ref = HFPolicy(tiny_model_dir), HFPolicy(tiny_model_dir, cpu_linear="torch")
    with torch.no_grad():
        for p in (fast, ref):
            p.model.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
    assert torch.allclose(_logits(fast), _logits(ref), atol=1e-4, rtol=1e-4)


def test_gradients_fall_back_to_f_linear(tiny_model_dir):
    """With autograd on (the GRPO baseline's training step) the layers run F.linear, so backward works."""
    fast, ref = HFPolicy(tiny_model_dir), HFPolicy(tiny_model_dir, cpu_linear="torch")
    grads = []
    for p in (fast, ref):
        ids = p.tokenizer(p._prompts(CONVS[:1]), return_tensors="pt", add_special_tokens=False)
        p.model.zero_grad()
        p.model(**ids).logits.float().pow(2).mean().backward()
        grads.append(p.model.model.layers[0].self_attn.q_proj.weight.grad.clone())
    assert torch.equal(grads[0], grads[1])


def test_settings_outside_float32_cpu(tiny_model_dir):
    assert HFPolicy(tiny_model_dir, dtype="bfloat16").cpu_linear == "torch"  # auto: not applicable
    with pytest.raises(PolicyError, match="float32 model on cpu"):
        HFPolicy(tiny_model_dir, dtype="bfloat16", cpu_linear="onednn")
    with pytest.raises(ValueError, match="cpu_linear must be one of"):
        HFPolicy(tiny_model_dir, cpu_linear="fast")
    with pytest.raises(ConfigError, match="cpu_linear"):
        parse_config(
            {"model": {"name": "tiny:micro", "cpu_linear": "fast"}, "evolvers": [{"name": "es", "type": "es"}]}
        )
    model = HFPolicy(tiny_model_dir, cpu_linear="torch").model
    assert use_onednn_linear(model) == use_torch_linear(model) > 0

"""The driver side of the vLLM ES backend against vLLM 0.32 / 0.33's API, on CPU.

vLLM cannot run here (no GPU, not installed): ``tests/vllm_standin.py`` stands in for it (engine, worker,
``vllm_config``), around the real ``VLLMPolicy`` / ``VLLMReplica`` / ``ESWorkerExtension`` and ES math and a
tiny random Qwen2. Each test names the vLLM behaviour it stands in for.
"""

from __future__ import annotations

import pytest
import torch
from support import one_member_record
from vllm_standin import EngineHost, WorkerHost, hf_model, lora_wrapped, module_from, vllm_config, vllm_layout

from coevo.backends.base import PolicyError
from coevo.backends.vllm_engine import VLLMPolicy, engine_cache_settings
from coevo.es import ESParams, ReplayMismatchError, ScopeSpec, perturb, select_params
from coevo.es.device_noise import NoiseDeviceError
from coevo.types import ESMember


class Tok:
    chat_template = "{{ messages }}"
    eos_token_id, pad_token_id = 1, 0


def engine(dtype=torch.float32, lora: bool = False, **kw):
    hf = hf_model(dtype)
    vmod = module_from(vllm_layout(dict(hf.named_parameters()), hf.config.vocab_size))
    if lora:
        lora_wrapped(vmod)
    eng = EngineHost(WorkerHost(vmod, hf.config), **kw)
    return hf, vmod, eng, VLLMPolicy.from_engine(eng, Tok(), model_id="tiny")


# ---------------------------------------------------------------------------------------- prefix cache
@pytest.mark.parametrize(
    ("config", "expect"),
    [
        (vllm_config(prefix_caching=False), []),  # engine_kwargs turned caching off: nothing to reset
        (vllm_config(prefix_caching=True), [{"reset_running_requests": False, "reset_connector": False}]),
        (
            vllm_config(prefix_caching=False, kv_connector="OffloadingConnector"),  # CPU offloading: a connector
            [{"reset_running_requests": False, "reset_connector": True}],
        ),
        (None, [{"reset_running_requests": False, "reset_connector": False}]),
    ],  # unreadable config: reset anyway
    ids=["caching-off", "caching-on", "connector", "no-config"],
)
def test_cache_reset_follows_the_engines_real_config(config, expect):
    # stands in for vLLM: LLMEngine.vllm_config.cache_config / kv_transfer_config, LLM.reset_prefix_cache(...)
    _, _, eng, policy = engine(config=config)
    policy.es_setup("all_linear")
    policy.es_perturb(3, 1e-2, 1)
    assert eng.resets == expect
    policy.es_restore()
    assert eng.resets == expect * 2


def test_connector_with_a_reset_that_cannot_reset_it_is_refused():
    # stands in for a vLLM whose reset_prefix_cache() has no reset_connector argument (before 0.11)
    _, _, eng, policy = engine(config=vllm_config(kv_connector="LMCacheConnectorV1"), old_reset_signature=True)
    assert engine_cache_settings(eng) == (True, True)
    policy.es_setup("all_linear")
    with pytest.raises(PolicyError, match="reset_connector"):
        policy.es_perturb(3, 1e-2, 1)
    assert policy.es_active is not None  # recorded although the reset failed ...
    with pytest.raises(PolicyError):
        policy.es_restore()
    assert policy.es_active is None  # ... so the restore happened


def test_failed_reset_keeps_the_active_state_and_the_replica_restores(tiny_model_dir):
    # stands in for LLM.reset_prefix_cache() returning False (requests still running)
    _, vmod, eng, policy = engine(config=vllm_config())
    original = {n: t.clone() for n, t in vmod.named_parameters()}
    rep = policy.es_replica(ScopeSpec("all_linear"))
    eng.reset_result = False
    with pytest.raises(PolicyError, match="could not reset its prefix cache"), rep.perturbed(ESMember(5, 1e-2, 1, 0)):
        pytest.fail("the body must not run when the reset after the perturbation failed")
    assert policy.es_active is None  # perturbed() restored the recorded perturbation
    assert all(torch.equal(t, original[n]) for n, t in vmod.named_parameters())
    eng.reset_result = True
    with pytest.raises(PolicyError):
        eng.reset_result = False
        policy.es_perturb(5, 1e-2, 1)
    assert policy.es_active == {"seed": 5, "sigma": 1e-2, "sign": 1}
    eng.reset_result = True
    policy.es_restore()
    assert all(torch.equal(t, original[n]) for n, t in vmod.named_parameters())


# ---------------------------------------------------------------------------------------- error types
def test_worker_errors_keep_their_coevo_types_across_the_rpc(tmp_path):
    # stands in for vLLM's engine core sending only "Call to collective_rpc method failed: <str(e)>"
    _, _, eng, policy = engine(remote=True)
    with pytest.raises(ValueError, match="restore_mode must be"):
        policy.es_setup("all_linear", restore_mode="nope")
    policy.es_setup("all_linear")
    policy.es_perturb(1, 1e-3, 1)
    with pytest.raises(RuntimeError, match="already active on this vLLM worker") as info:
        policy._rpc("es_perturb", 2, 1e-3, 1)  # past the driver's own guard: the worker's error
    assert type(info.value) is RuntimeError and "coevo-error" not in str(info.value)
    policy.es_restore()
    bad = one_member_record(4, alpha=1e-2, weight_hash_after="0" * 64)
    with pytest.raises(ReplayMismatchError, match="generation 0"):
        policy.es_update(bad, check_hash=True)
    foreign = one_member_record(
        4,
        alpha=1e-2,
        noise_spec="blake2b64(seed:name:chunk)/chunk=2^22/torch-2.13-cuda-philox-randn-fp32/NVIDIA H200/sm_90/132SM/v1",
    )
    with pytest.raises(NoiseDeviceError, match="NVIDIA H200"):
        policy.es_update(foreign)
    eng.worker = None  # the RPC itself fails (no worker): not a coevo error
    with pytest.raises(PolicyError, match="collective_rpc\\('es_state'\\) failed"):
        policy.es_state()


# ---------------------------------------------------------------------------------------- LoRA names
@pytest.mark.parametrize("scope", ["full", "all_linear"])
def test_lora_base_layer_names_map_to_hf_names(scope):
    # stands in for vLLM with enable_lora: linear weights renamed ...qkv_proj.base_layer.weight
    hf, vmod, _, policy = engine(lora=True)
    assert any(".qkv_proj.base_layer.weight" in n for n, _ in vmod.named_parameters())
    state = policy.es_setup(scope)
    hp = ESParams(select_params(hf, scope), master_dtype=torch.float32)
    assert state["n_tensors"] == len(hp) and state["fused_tensors"] == 6
    assert policy.es_weights_hash() == hp.weights_hash()
    with perturb(hp, 9, 1e-2, -1):
        policy.es_perturb(9, 1e-2, -1)
        assert policy.es_weights_hash() == hp.weights_hash()
        policy.es_restore()
    if scope == "all_linear":
        assert policy.es_matrices() == [(n, tuple(t.shape)) for n, t in select_params(hf, "all_linear")]
    else:
        with pytest.raises(ValueError, match="matrices only"):
            policy.es_matrices()


def test_strided_weights_are_refused_with_the_reason():
    # stands in for vLLM 0.33 on ROCm gfx11: maybe_pad_weight_avoid_cache_aliasing pads the row stride
    _, vmod, _, policy = engine()
    w = dict(vmod.named_parameters())["model.layers.0.self_attn.o_proj.weight"]
    padded = torch.nn.functional.pad(w.data, (0, 8))[..., :-8]
    assert padded.shape == w.shape and not padded.is_contiguous()
    w.data = padded
    with pytest.raises(ValueError, match="ROCm gfx11 pads the row stride"):
        policy.es_setup("all_linear")
    assert policy.es_setup({"scope": "all_linear", "exclude": ["*.0.self_attn.o_proj.*"]})["ready"]


# ---------------------------------------------------------------------------------------- shutdown
def test_close_shuts_the_engine_core_down_once():
    # stands in for vLLM's V1 LLMEngine: no shutdown() of its own, engine_core.shutdown() stops the core
    _, _, eng, policy = engine()
    policy.close()
    assert eng.shutdowns == 1 and policy.llm is None
    policy.close()  # idempotent
    assert eng.shutdowns == 1


def test_device_noise_on_a_cpu_worker_is_the_canonical_stream():
    # noise_device "device" on a CPU tensor draws the CPU stream: the same spec, the same weights as HF
    hf, _, eng, _ = engine()
    policy = VLLMPolicy.from_engine(eng, Tok(), model_id="tiny", noise_device="device")
    state = policy.es_setup("all_linear")
    hp = ESParams(select_params(hf, "all_linear"))
    assert state["config"]["noise_device"] == "device" and policy.noise_spec == state["noise_spec"]
    with perturb(hp, 21, 1e-2, 1):
        policy.es_perturb(21, 1e-2, 1)
        assert policy.es_weights_hash() == hp.weights_hash()
        policy.es_restore()


# ---------------------------------------------------------------------------------------- GPU check script
def test_gpu_check_calls_only_methods_the_policy_has():
    """benchmarks/gpu_vllm_check.py once called ``VLLMPolicy.es_compare`` before it existed (the check died at
    its first parity step): every ``vl.<name>`` it uses must be an attribute of ``VLLMPolicy`` or set by it."""
    import ast
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_vllm_check.py").read_text()
    used = {
        n.attr
        for n in ast.walk(ast.parse(src))
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "vl"
    }
    _, _, _, policy = engine()
    assert {"es_compare", "es_update", "es_replica", "close"} <= used
    assert sorted(a for a in used if not hasattr(policy, a)) == []

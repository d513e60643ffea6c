"""LoRA adapter folders as models: a PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``) given
where a model goes (``model.name`` in a run config, a model path on the command line) is its base model with the
adapter merged in.

What the sampler-training evolvers write (``grpo_ahd``, ``dpo_ahd``: :mod:`coevo.training.lora`) is such a folder,
and so is any adapter PEFT saves (``PeftModel.save_pretrained``). Its ``base_model_name_or_path`` names the base
as a model reference coevo resolves (a registry name such as ``qwen2.5-coder-0.5b-instruct``, a local folder, a
``tiny:`` spec, or another adapter folder: a chain is merged base first). Nothing is downloaded: a base that is a
hub id which is not a local folder is an error.

:func:`merge_adapter` loads the adapter with PEFT onto the loaded base and merges it
(``merge_and_unload``), so the policy is a plain ``transformers`` model again (the hf backend's generation, ES,
oneDNN linears all work unchanged); ``W' = W + (alpha / r) B A`` per adapted matrix, in the base's dtype.

Errors are one line naming the folder (:class:`AdapterError`, a :class:`~coevo.errors.UserError`): an adapter whose
tensors do not fit the base (another model's adapter: the first mismatching tensor and both shapes), or whose
``adapter_config.json`` is unreadable or names no base.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coevo.errors import UserError

#: the file PEFT writes beside the adapter weights
ADAPTER_CONFIG = "adapter_config.json"


class AdapterError(UserError, ValueError):
    """An adapter folder that cannot be used with its base model (one line naming the folder and the reason)."""


def is_adapter_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a PEFT ``adapter_config.json``."""
    try:
        return (Path(path).expanduser() / ADAPTER_CONFIG).is_file()
    except (OSError, TypeError):
        return False


def adapter_config(folder: str | Path) -> dict[str, Any]:
    """The parsed ``adapter_config.json`` of ``folder``.

    Raises:
        AdapterError: unreadable or not a JSON object.
    """
    path = Path(folder).expanduser() / ADAPTER_CONFIG
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise AdapterError(f"{path}: not a readable adapter config ({e})") from e
    if not isinstance(data, dict):
        raise AdapterError(f"{path}: not a JSON object")
    return data


def adapter_base(folder: str | Path) -> str:
    """The base model reference an adapter folder names (``base_model_name_or_path``).

    Raises:
        AdapterError: the config names no base.
    """
    base = adapter_config(folder).get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise AdapterError(f"{Path(folder) / ADAPTER_CONFIG}: base_model_name_or_path is missing")
    return base


def adapter_chain(ref: str | Path, resolve) -> tuple[Path, list[Path]]:
    """``(base model folder, [adapter folders, base first])`` of a model reference.

    Args:
        ref: a model reference (an adapter folder or anything ``resolve`` maps to a model folder).
        resolve: ``resolve(ref) -> Path``, the model-name resolution (:func:`coevo.backends.models.resolve_model`).

    Raises:
        AdapterError: a chain that loops (an adapter naming itself, directly or not).
    """
    adapters: list[Path] = []
    path = Path(resolve(ref))
    while is_adapter_folder(path):
        if path.resolve() in [a.resolve() for a in adapters]:
            raise AdapterError(f"{path}: adapter chain loops back to itself")
        adapters.append(path)
        path = Path(resolve(adapter_base(path)))
    return path, adapters[::-1]


def merge_adapter(model, folder: str | Path):
    """Load the PEFT adapter in ``folder`` onto ``model`` (a loaded ``transformers`` model) and merge it in.

    Returns:
        the merged plain model (the same module tree with the adapted weights changed in place).

    Raises:
        AdapterError: the adapter does not fit ``model`` (a tensor's shape, a missing target module): one line
            with the folder and the reason.
    """
    from peft import PeftModel

    try:
        peft_model = PeftModel.from_pretrained(model, str(folder), is_trainable=False)
    except (RuntimeError, ValueError, KeyError) as e:
        raise AdapterError(f"{folder}: adapter does not fit its base model: {first_line(e)}") from e
    return peft_model.merge_and_unload()


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's text, cut to ``limit`` characters."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return (lines[0] if lines else type(error).__name__)[:limit]


#: what :func:`export_merged` writes beside the merged weights (base model, adapters, weights dtype)
MERGE_INFO = "coevo-merge.json"


def export_merged(adapter: str | Path, out: str | Path, dtype: str = "auto") -> Path:
    """Write adapter folder ``adapter`` merged into its base model as a plain Hugging Face folder ``out``
    (``save_pretrained``: config, safetensors weights, tokenizer; :data:`MERGE_INFO` names the base and the
    adapters), which every engine loads like any model folder: vLLM (``model.backend: vllm``, which serves no
    adapter folder), the sampler test's ``--backend vllm``, ``transformers``. A chain of adapters is merged base
    first (:func:`adapter_chain`). The weights are those the hf backend computes with (``dtype``: "auto" =
    float32 on a CPU; ``W' = W + (alpha / r) B A``), so a folder of the 0.5B model is about 2 GB in float32.

    Raises:
        AdapterError: ``adapter`` is not an adapter folder, or does not fit its base (one line).
        FileExistsError: ``out`` exists and is not empty.
        ModelPrepareError: the base is an embedded model whose chunk packages are not installed.
    """
    from coevo.backends.factory import make_policy
    from coevo.backends.spec import ModelConfig
    from coevo.es.checkpoint import export_hf

    if not is_adapter_folder(adapter):
        raise AdapterError(f"{adapter}: not an adapter folder (no {ADAPTER_CONFIG})")
    target = Path(out).expanduser()
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"export folder {target} exists and is not empty")
    policy = make_policy(ModelConfig(name=str(Path(adapter).expanduser()), backend="hf", dtype=dtype))
    try:
        info = {
            "base": str(policy.path),
            "adapters": [str(a) for a in policy.adapters],
            "dtype": str(policy.dtype).replace("torch.", ""),
        }
        path = export_hf(policy.model, policy.tokenizer, target)
    finally:
        policy.close()
    (path / MERGE_INFO).write_text(json.dumps(info, indent=1, sort_keys=True))
    return path

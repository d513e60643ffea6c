"""A LoRA adapter on the run's in-process model, trained by TRL and saved as PEFT folders.

LoRA (Hu et al. 2021, arXiv 2106.09685): every adapted linear layer ``y = x W^T`` becomes
``y = x W^T + (alpha / r) x A^T B^T`` with ``A`` (r x in) and ``B`` (out x r) trainable, ``W`` frozen. ``B``
starts at zero, so an attached adapter leaves the model's outputs unchanged until the first update. PEFT
(:func:`peft.get_peft_model`) injects the layers into the model's own modules, so the policy that samples
(:class:`~coevo.backends.hf.HFPolicy`, whose ``model`` is that module tree) samples with the adapter as soon as it
is trained: no copy, no sync.

Folders: :func:`save_adapter` writes a PEFT folder (``adapter_config.json``, ``adapter_model.safetensors``) whose
``base_model_name_or_path`` is the run's model reference (a registry name, a folder, ``tiny:``), so the folder is a
model reference itself (:mod:`coevo.backends.adapters`: ``model.name: <folder>``). Extra state (the optimizer's)
goes beside it in the same folder; PEFT ignores it. A folder is written under a temporary name and renamed, so a
kill leaves the old folder or the new one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from coevo.backends.adapters import AdapterError, first_line
from coevo.schema import ConfigModel


class LoRASettings(ConfigModel):
    """LoRA settings of a sampler-training evolver (``lora:`` in its config). Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(8, ge=1, le=1024, description="rank r of every adapted matrix (CALM: 32, EvoTune: 64)")
    alpha: float = Field(16.0, gt=0, description="scale numerator: the update is (alpha / r) B A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input (0: exact resume)")
    target_modules: Literal["all-linear"] | list[str] = Field(
        "all-linear",
        description="modules adapted: all-linear (every linear layer but the output head) or names such as "
        "[q_proj, v_proj]",
    )

    def peft_config(self, base_ref: str):
        """The ``peft.LoraConfig`` (causal LM task, no bias), recording ``base_ref`` as the base model."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=base_ref,
        )


def attach_lora(model, settings: LoRASettings, base_ref: str, seed: int = 0):
    """Inject a fresh LoRA adapter into ``model`` (in place) and return the ``peft.PeftModel`` around it.

    ``A`` is drawn by PEFT (Kaiming uniform) from torch's RNG seeded with ``seed`` inside a forked RNG (the global
    state is left as it was), so the same seed gives the same adapter: a run and its resumed copy train the same one.

    Raises:
        AdapterError: PEFT cannot adapt this model with these settings (e.g. no module matches
            ``target_modules``): one line.
    """
    import torch
    from peft import get_peft_model

    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            peft_model = get_peft_model(model, settings.peft_config(base_ref))
    except (ValueError, RuntimeError) as e:
        raise AdapterError(f"lora.target_modules: PEFT cannot adapt this model: {first_line(e)}") from e
    # PEFT renames the base to the loaded model's folder (a machine-local cache path for an embedded model);
    # the saved adapter names base_ref, so it loads wherever that name resolves
    peft_model.peft_config["default"].base_model_name_or_path = base_ref
    return peft_model


def adapter_state(peft_model) -> dict[str, Any]:
    """The adapter's tensors (``peft.get_peft_model_state_dict``: PEFT's key names, as saved)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(peft_model, save_embedding_layers=False)  # as saved: see save_adapter


def adapter_hash(peft_model) -> str:
    """SHA-256 over the adapter's tensors (sorted names, dtype, shape, bytes): equal adapters, equal hashes."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(adapter_state(peft_model).items()):
        arr = t.detach().cpu().contiguous()
        h.update(f"{name}|{arr.dtype}|{tuple(arr.shape)}|".encode())
        h.update(arr.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_adapter(peft_model, folder: str | Path, extra: dict[str, Any] | None = None) -> str:
    """Write the adapter as a PEFT folder at ``folder`` (replaced atomically), with ``extra`` name -> object
    saved beside it by ``torch.save`` (``<name>.pt``, e.g. the optimizer's state). Returns :func:`adapter_hash`."""
    import torch

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # the vocabulary is never resized here, so no full embedding matrices: PEFT's "auto" would look the base name up
    # on the Hugging Face Hub to compare vocabulary sizes (a network call, since the base is a registry name)
    peft_model.save_pretrained(str(tmp), selected_adapters=["default"], save_embedding_layers=False)
    for name, obj in (extra or {}).items():
        torch.save(obj, tmp / f"{name}.pt")
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return adapter_hash(peft_model)


def load_adapter(peft_model, folder: str | Path) -> dict[str, Any]:
    """Load the adapter tensors saved in ``folder`` into ``peft_model`` (same rank and targets), and return the
    extra objects saved beside them (:func:`save_adapter`'s ``extra``, by name).

    Raises:
        AdapterError: no adapter there, or its tensors do not fit this model's adapter (another base model,
            another rank or other target modules): one line naming the first mismatching tensor.
    """
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(folder)
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        raise AdapterError(f"{folder}: no adapter_model.safetensors (not a PEFT adapter folder)")
    saved = load_file(str(weights))
    own = adapter_state(peft_model)
    missing = sorted(set(own) - set(saved))
    unknown = sorted(set(saved) - set(own))
    if unknown or missing:
        name = (unknown or missing)[0]
        why = "is not in this model's adapter" if unknown else "is missing from the folder"
        raise AdapterError(
            f"{folder}: adapter does not fit the model (tensor {name} {why}; {len(unknown)} unknown, "
            f"{len(missing)} missing: another base model or other target modules)"
        )
    for name, t in sorted(saved.items()):
        if tuple(t.shape) != tuple(own[name].shape):
            raise AdapterError(
                f"{folder}: adapter does not fit the model (tensor {name} has shape {tuple(t.shape)}, the model's "
                f"adapter {tuple(own[name].shape)}: another base model or another rank)"
            )
    set_peft_model_state_dict(peft_model, saved)
    return {p.stem: torch.load(p, weights_only=False) for p in sorted(folder.glob("*.pt"))}

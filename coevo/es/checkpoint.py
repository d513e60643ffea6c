"""ES weight snapshots, history replay and Hugging Face export.

Resume and replay rest on one fact (``coevo.es.update``): an ES update is a pure, device-independent
function of the weights and a history row. So the weights after generation ``G`` are

    newest snapshot at generation S <= G   (or the base model, S = 0)
    + the recorded updates of generations S .. G-1, re-applied in order (no rollouts).

Snapshot files (safetensors) live in ``<run_dir>/weights/gen-XXXXX.safetensors``, XXXXX = the number of
generations applied. A snapshot holds only the tensors in the ES scope (the only ones ES changes), under
their canonical HF names, plus their float32 masters under ``__master__.<name>`` when the run keeps masters
(bf16/fp16 models): without the masters a resumed bf16 run would continue from rounded weights and drift
from the uninterrupted run. Metadata: ``weights_hash`` (``coevo.es.hashing.weights_hash`` of the working
tensors in scope), ``generation``, ``model_id``. Files are written to a temporary name and renamed, so a
crash leaves either no snapshot or a complete one.

History rows (``TrajectoryStore.es_history``) are ``GenerationRecord.to_dict()`` plus run metadata
(model id, dtype, restore mode, metrics); :func:`record_from_row` recovers the record.

What a run keeps (:data:`SNAPSHOT_MODES`, the ES setting ``weight_snapshots``): since the history alone
rebuilds the weights exactly, the default (``auto`` -> ``replay``) writes no snapshot file; resume and
``coevo es export`` replay the history from the base model. ``full`` writes a snapshot every
``checkpoint_every`` generations and at the end (:func:`snapshot_nbytes` bytes each: 1.4 GB for the 0.5B
model in float32): a later resume or export starts from it instead of the base model. Runs whose weights
drift from their history (:func:`replays_exactly` is False: full perturbations undone in ``inference`` mode
without float32 masters) need ``full``, which ``auto`` picks for them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from coevo.es.history import GenerationRecord, apply_records
from coevo.es.params import ESParams
from coevo.umask import honour_umask

#: folder of a run holding the weight snapshots
WEIGHTS_DIR = "weights"
#: key prefix of float32 master tensors inside a snapshot
MASTER_PREFIX = "__master__."
_SNAPSHOT_RE = re.compile(r"^gen-(\d{5,})\.safetensors$")


#: ``weight_snapshots`` values: "auto" (replay when the run replays exactly, else full), "replay" (no weight
#: file: base model + history), "full" (safetensors snapshots)
SNAPSHOT_MODES = ("auto", "replay", "full")


def replays_exactly(perturbation: str, restore_mode: str, master_weights: bool) -> bool:
    """Whether the base model plus the history rebuild a run's weights bit for bit: False only for full
    perturbations undone in ``inference`` mode without float32 masters (the undo drifts, ``coevo.es.perturb``)."""
    return not (perturbation == "full" and restore_mode == "inference" and not master_weights)


def snapshot_mode(requested: str, exact_replay: bool) -> str:
    """The snapshot mode a run uses: ``requested`` ("auto", "replay" or "full"), "auto" resolved to "replay"
    when ``exact_replay`` else "full".

    Raises:
        ValueError: an unknown mode, or "replay" for a run that does not replay exactly.
    """
    if requested not in SNAPSHOT_MODES:
        raise ValueError(f"weight_snapshots must be one of {', '.join(SNAPSHOT_MODES)}, got {requested!r}")
    if requested == "auto":
        return "replay" if exact_replay else "full"
    if requested == "replay" and not exact_replay:
        raise ValueError(
            "weight_snapshots 'replay' keeps no weight file, but this run's weights drift from its history "
            "(restore_mode inference without master_weights); use weight_snapshots: full (or auto)"
        )
    return requested


def snapshot_nbytes(params: ESParams) -> int:
    """Bytes of the tensors one snapshot of ``params`` holds (working tensors in scope plus float32 masters)."""
    total = 0
    for e in params.entries:
        total += e.tensor.numel() * e.tensor.element_size()
        if e.master is not None:
            total += e.master.numel() * e.master.element_size()
    return total


class SnapshotError(RuntimeError):
    """A snapshot does not fit the model (names, shapes, dtypes) or its content hash does not match."""


def snapshot_path(run_dir: str | Path, generation: int) -> Path:
    """``<run_dir>/weights/gen-XXXXX.safetensors`` for the weights after ``generation`` updates (>= 0)."""
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise ValueError(f"generation must be an int >= 0, got {generation!r}")
    return Path(run_dir) / WEIGHTS_DIR / f"gen-{generation:05d}.safetensors"


def list_snapshots(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``[(generation, path), ...]`` of the snapshot files of a run, by increasing generation."""
    folder = Path(run_dir) / WEIGHTS_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _SNAPSHOT_RE.match(p.name))]
    return sorted(found)


def newest_snapshot(run_dir: str | Path, max_generation: int) -> tuple[int, Path] | None:
    """The snapshot with the largest generation ``<= max_generation``, or None."""
    older = [s for s in list_snapshots(run_dir) if s[0] <= max_generation]
    return older[-1] if older else None


def save_snapshot(path: str | Path, params: ESParams, meta: dict[str, Any] | None = None) -> str:
    """Write the tensors in scope (and their float32 masters) to a safetensors file, atomically.

    Args:
        path: destination file (its folder is created).
        params: the ES parameters; must not be perturbed.
        meta: extra string-convertible metadata (e.g. ``generation``, ``model_id``).

    Returns:
        The ``weights_hash`` of the working tensors in scope (also stored in the file's metadata).

    Raises:
        RuntimeError: a perturbation of ``params`` is active.
    """
    if params.active is not None:
        raise RuntimeError("cannot snapshot weights while a perturbation is active; restore it first")
    tensors: dict[str, torch.Tensor] = {}
    for e in params.entries:
        tensors[e.name] = e.tensor.detach().cpu().contiguous()
        if e.master is not None:  # float32, flat (numel,) -> stored in the tensor's shape
            tensors[MASTER_PREFIX + e.name] = e.master.detach().cpu().view(e.tensor.shape).contiguous()
    digest = params.weights_hash()
    metadata = {k: str(v) for k, v in (meta or {}).items()}
    metadata["weights_hash"] = digest
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    honour_umask(tmp)  # safetensors writes 0600 whatever the umask
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return digest


def read_snapshot_meta(path: str | Path) -> dict[str, str]:
    """The metadata dict of a snapshot file (``weights_hash``, ``generation``, ...)."""
    with safe_open(str(path), framework="pt") as fh:
        return dict(fh.metadata() or {})


def load_snapshot(path: str | Path, params: ESParams) -> str:
    """Copy a snapshot into ``params`` in place (working tensors, then masters) and verify its hash.

    Masters: taken from the file when it has them; a run with masters loading a file without them
    re-derives the masters from the working tensors (``ESParams.sync_masters``).

    Returns:
        The verified ``weights_hash`` of the tensors in scope.

    Raises:
        FileNotFoundError: no such file. RuntimeError: a perturbation is active.
        SnapshotError: the file's names, shapes or dtypes differ from ``params`` (the message lists them),
            or the loaded weights' hash differs from the file's ``weights_hash``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weight snapshot {path} does not exist")
    if params.active is not None:
        raise RuntimeError("cannot load a snapshot while a perturbation is active; restore it first")
    with safe_open(str(path), framework="pt") as fh:
        meta = dict(fh.metadata() or {})
        keys = set(fh.keys())
        names = {k for k in keys if not k.startswith(MASTER_PREFIX)}
        missing, extra = sorted(set(params.names) - names), sorted(names - set(params.names))
        if missing or extra:
            raise SnapshotError(f"{path}: tensors do not match the ES scope; missing {missing[:5]}, extra {extra[:5]}")
        has_masters = False
        for e in params.entries:
            t = fh.get_tensor(e.name)
            if t.shape != e.tensor.shape or t.dtype != e.tensor.dtype:
                raise SnapshotError(
                    f"{path}: {e.name} is {t.dtype} {tuple(t.shape)}, the model has {e.tensor.dtype} "
                    f"{tuple(e.tensor.shape)} (snapshot from another model or dtype?)"
                )
            e.tensor.copy_(t)
            if e.master is not None and MASTER_PREFIX + e.name in keys:
                e.master.copy_(fh.get_tensor(MASTER_PREFIX + e.name).reshape(-1))
                has_masters = True
    if any(e.master is not None for e in params.entries) and not has_masters:
        params.sync_masters()
    got = params.weights_hash()
    if meta.get("weights_hash") and got != meta["weights_hash"]:
        raise SnapshotError(f"{path}: loaded weights hash {got} != recorded {meta['weights_hash']} (corrupt file?)")
    return got


def record_from_row(row: dict[str, Any]) -> GenerationRecord:
    """The ``GenerationRecord`` inside an ES history row (extra run metadata keys are ignored).

    Raises:
        TypeError: not a dict. ValueError: the row lacks a field of the record or has invalid values (named).
    """
    if not isinstance(row, dict):
        raise TypeError(f"an ES history row must be a dict, got {type(row).__name__}")
    fields = GenerationRecord.__dataclass_fields__
    required = [f for f in ("generation", "seeds", "signs", "rewards", "coeffs", "sigma", "alpha") if f not in row]
    if required:
        raise ValueError(f"ES history row lacks field(s) {required}")
    return GenerationRecord.from_dict({k: v for k, v in row.items() if k in fields})


def records_between(rows: Sequence[dict[str, Any]], start: int, stop: int) -> list[GenerationRecord]:
    """The records of generations ``start .. stop-1`` from history rows, checked to be complete.

    Raises:
        ValueError: a generation in the range has no row (the message lists the missing ones).
    """
    by_gen = {int(r["generation"]): r for r in rows}
    missing = [g for g in range(start, stop) if g not in by_gen]
    if missing:
        raise ValueError(f"ES history lacks the rows of generation(s) {missing[:10]} needed to rebuild the weights")
    return [record_from_row(by_gen[g]) for g in range(start, stop)]


def rebuild_plan(
    run_dir: str | Path, rows: Sequence[dict[str, Any]], generation: int, use_snapshots: bool = True
) -> tuple[tuple[int, Path] | None, list[GenerationRecord]]:
    """How to reach the weights after ``generation`` updates: the newest snapshot ``<= generation`` (when
    ``use_snapshots``; ``(generation, path)`` or None for the base model) and the records after it.

    Raises:
        ValueError: missing history rows.
    """
    snap = newest_snapshot(run_dir, generation) if use_snapshots else None
    return snap, records_between(rows, snap[0] if snap is not None else 0, generation)


def rebuild(
    params: ESParams, run_dir: str | Path, rows: Sequence[dict[str, Any]], generation: int, use_snapshots: bool = True
) -> tuple[str, int | None]:
    """Bring ``params`` (holding the base weights) to the weights after ``generation`` updates.

    Loads the newest snapshot ``<= generation`` (when ``use_snapshots``), then re-applies the history rows
    after it, checking every recorded hash (``coevo.es.history.apply_records``).

    Returns:
        ``(weights_hash, snapshot generation used or None)``.

    Raises:
        ValueError: missing history rows. SnapshotError / ReplayMismatchError: see the callees.
    """
    snap, records = rebuild_plan(run_dir, rows, generation, use_snapshots)
    if snap is not None:
        load_snapshot(snap[1], params)
    report = apply_records(params, records)
    return report.weights_hash, (snap[0] if snap is not None else None)


def export_hf(model: torch.nn.Module, tokenizer: Any, out_dir: str | Path, info: dict[str, Any] | None = None) -> Path:
    """Write a Hugging Face folder (``save_pretrained``: config, safetensors weights, generation config,
    tokenizer) that ``transformers.AutoModelForCausalLM.from_pretrained`` loads; ``info`` is written to
    ``coevo-es.json`` beside it (run, generation, weights hash).

    Raises:
        FileExistsError: ``out_dir`` exists and is not empty.
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"export folder {out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if info is not None:
        (out / "coevo-es.json").write_text(json.dumps(info, indent=1, sort_keys=True))
    honour_umask(out)  # safetensors writes model.safetensors 0600 whatever the umask
    return out

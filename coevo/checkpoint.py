"""Crash-safe checkpoints of a run: loop position, evolver states, shared board, RNG states.

Layout inside a run folder::

    checkpoints/
      000007/            one folder per completed evolver step (seq increases by one each step)
        state.json       loop position, evolver state_dicts, shared board, wall time used
        rng.json         python / numpy / torch global RNG states
        <evolver>/       whatever Evolver.save_checkpoint wrote
      LATEST             the seq of the newest complete checkpoint (replaced atomically)

A checkpoint folder is written completely, fsynced, and only then named in ``LATEST`` by an atomic
rename, so a ``kill -9`` at any moment leaves either the previous or the new checkpoint, never a mix.
Older folders are pruned after ``LATEST`` moves (the last ``keep`` are kept).
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np

LATEST = "LATEST"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file, fsync, rename, fsync of the folder)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def capture_rng() -> dict[str, Any]:
    """Global RNG states (python, numpy, torch CPU) as JSON-serialisable data."""
    import torch

    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    import torch

    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = state["numpy"]
    np.random.set_state((npst[0], np.array(npst[1], dtype=np.uint32), npst[2], npst[3], npst[4]))
    raw = np.frombuffer(base64.b64decode(state["torch"]), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))


class CheckpointDir:
    """The ``checkpoints/`` folder of a run."""

    def __init__(self, root: Path, keep: int = 2):
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)

    def latest_seq(self) -> int | None:
        p = self.root / LATEST
        if not p.exists():
            return None
        return int(p.read_text().strip())

    def latest(self) -> Path | None:
        """Folder of the newest complete checkpoint, or None."""
        seq = self.latest_seq()
        return None if seq is None else self.root / f"{seq:06d}"

    def begin(self) -> Path:
        """A fresh, empty folder for the next checkpoint (not yet visible as LATEST)."""
        seq = (self.latest_seq() or 0) + 1
        path = self.root / f"{seq:06d}"
        if path.exists():  # left over by a crash before commit
            shutil.rmtree(path)
        path.mkdir()
        return path

    def commit(self, path: Path, state: dict[str, Any]) -> None:
        """Write ``state.json`` and ``rng.json`` into ``path``, then make it the LATEST checkpoint."""
        atomic_write_text(path / "state.json", json.dumps(state, indent=1, sort_keys=True))
        atomic_write_text(path / "rng.json", json.dumps(capture_rng()))
        for sub in path.rglob("*"):
            if sub.is_file():
                with open(sub, "rb") as fh:
                    os.fsync(fh.fileno())
        _fsync_dir(path)
        atomic_write_text(self.root / LATEST, path.name)
        self._prune(int(path.name))

    def load(self) -> tuple[Path, dict[str, Any]] | None:
        """(folder, state) of the newest checkpoint, with global RNG states restored; None if none."""
        path = self.latest()
        if path is None:
            return None
        state = json.loads((path / "state.json").read_text())
        rng = path / "rng.json"
        if rng.exists():
            restore_rng(json.loads(rng.read_text()))
        return path, state

    def _prune(self, newest: int) -> None:
        for child in self.root.iterdir():
            if child.is_dir() and child.name.isdigit() and int(child.name) <= newest - self.keep:
                shutil.rmtree(child, ignore_errors=True)

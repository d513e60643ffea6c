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

A damaged folder (``LATEST`` unreadable or naming a missing or incomplete checkpoint, e.g. after a disk
error or a hand edit) does not stop a resume: :meth:`CheckpointDir.load` falls back to the newest intact
checkpoint (``state.json`` and ``rng.json`` readable) and says so in :attr:`Loaded.note`; with none intact
the run restarts from its first step, re-using the trajectories already stored (their keys are
deterministic).
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, NamedTuple

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


class Loaded(NamedTuple):
    """A checkpoint read by :meth:`CheckpointDir.load`.

    Attributes:
        path: its folder. state: the parsed ``state.json``. note: why it is not the one ``LATEST`` names
            (``LATEST`` damaged), else None.
    """

    path: Path
    state: dict[str, Any]
    note: str | None = None


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


class CheckpointDir:
    """The ``checkpoints/`` folder of a run."""

    def __init__(self, root: Path, keep: int = 2):
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)

    def _folders(self) -> list[Path]:
        """Checkpoint folders (complete or not), newest first."""
        return sorted(
            (p for p in self.root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name), reverse=True
        )

    @staticmethod
    def intact(path: Path) -> bool:
        """Whether ``path`` is a complete checkpoint: ``state.json`` (a mapping) and ``rng.json`` readable.
        Both are written before ``LATEST`` names the folder, so a folder a crash left half-written fails."""
        try:
            return isinstance(_read_json(path / "state.json"), dict) and isinstance(_read_json(path / "rng.json"), dict)
        except (OSError, ValueError):
            return False

    def find_latest(self) -> tuple[Path | None, str | None]:
        """(newest usable checkpoint folder or None, a note when ``LATEST`` is damaged and was not followed)."""
        marker = self.root / LATEST
        problem = None
        try:
            text = marker.read_text()
        except FileNotFoundError:
            text = None
        except (OSError, UnicodeDecodeError) as exc:
            text, problem = None, f"cannot be read ({exc})"
        if text is not None:
            try:
                path = self.root / f"{int(text.strip()):06d}"
            except ValueError:
                problem = f"is damaged (holds {text.strip()[:40]!r}, not a checkpoint number)"
            else:
                if self.intact(path):
                    return path, None
                problem = f"names {path.name}, which is {'incomplete' if path.exists() else 'missing'}"
        fallback = next((p for p in self._folders() if self.intact(p)), None)
        if problem is None and fallback is None:
            return None, None  # a run killed before its first checkpoint
        problem = problem or "is missing"
        if fallback is None:
            return None, (
                f"{marker} {problem} and no intact checkpoint is left: the run restarts from its first "
                "step (the trajectories already stored are reused, not sampled again)"
            )
        return fallback, f"{marker} {problem}: resuming from the newest intact checkpoint {fallback}"

    def latest_seq(self) -> int | None:
        """Sequence number of the newest usable checkpoint (see :meth:`find_latest`), or None."""
        path, _ = self.find_latest()
        return None if path is None else int(path.name)

    def latest(self) -> Path | None:
        """Folder of the newest usable checkpoint, or None."""
        return self.find_latest()[0]

    def begin(self) -> Path:
        """A fresh, empty folder for the next checkpoint (not yet visible as LATEST)."""
        seq = (self.latest_seq() or 0) + 1
        path = self.root / f"{seq:06d}"
        if path.exists():  # left over by a crash before commit, or beyond a damaged LATEST
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

    def load(self) -> Loaded | None:
        """The newest usable checkpoint, with global RNG states restored; None if there is none.

        Follows ``LATEST``; when it is damaged, falls back to the newest intact folder and says so in
        ``Loaded.note`` (also when no intact folder is left and None is returned: see :attr:`note`).
        """
        path, self.note = self.find_latest()
        if path is None:
            return None
        state = _read_json(path / "state.json")
        restore_rng(_read_json(path / "rng.json"))
        return Loaded(path, state, self.note)

    #: the note of the last :meth:`load` (None when ``LATEST`` was followed or absent)
    note: str | None = None

    def _prune(self, newest: int) -> None:
        for child in self.root.iterdir():
            if child.is_dir() and child.name.isdigit() and int(child.name) <= newest - self.keep:
                shutil.rmtree(child, ignore_errors=True)

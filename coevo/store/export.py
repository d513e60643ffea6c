"""Export stored trajectories as JSON Lines (one trajectory with its steps per line).

Library use: ``export_jsonl(store_or_path, out_path, run_id=None) -> int``. Command line (``coevo runs
export`` calls :func:`main`, or run ``python -m coevo.store.export STORE OUT [--run-id RUN]``). Each line is
``Trajectory.to_dict()`` (so :meth:`coevo.types.Trajectory.from_dict` reads it back), including the store's
row ``id``; non-finite floats in metadata are written as Python's ``json`` writes them (``NaN``,
``Infinity``). The file is written to a temporary sibling and renamed into place, so a reader never sees a
half-written export. The store is opened read-only when given as a path, so exporting a running run is safe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from coevo.store.store import TrajectoryStore


def export_jsonl(
    store: TrajectoryStore | str | os.PathLike[str], path: str | os.PathLike[str], run_id: str | None = None
) -> int:
    """Write every trajectory (of ``run_id``, or all runs) to ``path`` as JSON Lines, in insertion order.

    Args:
        store: an open store, or the path of a store file (opened read-only for the export).
        path: output file (``.jsonl``); its parent folder is created; an existing file is replaced.
        run_id: only this run's trajectories; ``None`` exports all.

    Returns:
        The number of trajectories (lines) written.

    Raises:
        FileNotFoundError: ``store`` is a path that does not exist.
    """
    if not isinstance(store, TrajectoryStore):
        with TrajectoryStore(store, readonly=True) as opened:
            return export_jsonl(opened, path, run_id=run_id)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for t in store.iter_trajectories(run_id=run_id):
                f.write(json.dumps(t.to_dict(), ensure_ascii=False))
                f.write("\n")
                n += 1
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def context_path(path: str | os.PathLike[str]) -> Path:
    """Where :func:`export_context_jsonl` writes beside a trajectory export ``path``: ``<stem>.context.jsonl``."""
    out = Path(path)
    return out.with_name(f"{out.stem}.context.jsonl")


def export_context_jsonl(store: TrajectoryStore, path: str | os.PathLike[str], run_id: str | None = None) -> int:
    """Write every value published on the context channel (``ctx.publish``; artifacts of kind ``context``, of
    ``run_id`` or all runs) to ``path`` as JSON Lines, oldest first: ``{"run_id", "key", "version", "value",
    "evolver", "round", "meta"}`` per version, the value whole. Written to a temporary sibling and renamed into
    place. Returns the number of lines."""
    from coevo.artifacts import CONTEXT

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    arts = sorted(store.list_artifacts(kind=CONTEXT, run_id=run_id), key=lambda a: a.id)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for a in arts:
                row = {
                    "run_id": a.run_id,
                    "key": a.content.get("key", a.name),
                    "version": a.version,
                    "value": a.content.get("value"),
                    "evolver": a.content.get("evolver"),
                    "round": a.content.get("round"),
                    "meta": a.meta,
                }
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(arts)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Add the export arguments (``store``, ``out``, ``--run-id``) to ``parser`` (a new one if None)."""
    p = parser or argparse.ArgumentParser(
        prog="coevo runs export", description="Export stored trajectories as JSON Lines."
    )
    p.add_argument("store", help="path of the trajectory store (SQLite file)")
    p.add_argument("out", help="output .jsonl file (replaced if it exists)")
    p.add_argument("--run-id", default=None, help="export only this run (default: all runs)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; prints the number of trajectories written. Returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        n = export_jsonl(args.store, args.out, run_id=args.run_id)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {n} trajectories to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

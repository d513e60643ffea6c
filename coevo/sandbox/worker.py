"""The process that runs one candidate program inside the sandbox.

Started by :class:`coevo.sandbox.runner.Sandbox` (and by the plain baseline in
:mod:`coevo.sandbox.plain`) as a *script path*, ``python -s -P -S .../worker.py RESULT_FD``, so that start-up
imports nothing but the standard library: neither ``coevo`` nor ``site`` is imported before the candidate.

Protocol:
    stdin: one JSON object ``{"code": str, "function_name": str, "target": "pkg.mod:func",
    "payload": dict, "limits": {"memory_mb", "cpu_s", "max_procs", "max_file_mb"} | null}``.
    fd RESULT_FD (argv[1]): one JSON object written when the worker finishes, ``{"ok": true, "metrics": {...}}``
    or ``{"ok": false, "error_kind": one of coevo.types.FAILURE_KINDS, "error": short detail}``.
    stdout/stderr belong to the candidate (the parent captures a capped amount of each).

Steps (each failure maps to one error kind): apply rlimits (before any candidate code runs) -> compile
(``syntax``) -> exec in a fresh module ``candidate`` (``import`` for any import-time exception) -> look up
``function_name`` (``parse`` when absent, ``return_type`` when not callable) -> import the target (``sandbox``:
a configuration error, not the candidate's) -> ``target(fn, payload)`` -> a JSON-able dict (``return_type``
otherwise). Exceptions raised while running are classified by :func:`classify`: ``MemoryError`` -> ``memory``;
an exception whose class (or a base class) carries an ``error_kind`` attribute naming a failure kind, or is
named ``InfeasibleSolution`` / ``InvalidReturn`` (see :mod:`coevo.sandbox.errors`) -> that kind; anything
else -> ``runtime``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import types

CANDIDATE_FILENAME = "<candidate>"
KINDS = ("parse", "syntax", "import", "timeout", "memory", "runtime", "return_type", "infeasible", "sandbox")
NAME_KINDS = {"InfeasibleSolution": "infeasible", "InvalidReturn": "return_type"}
MAX_DETAIL = 1500

# Captured before any candidate code runs, so a candidate that rebinds these names cannot break reporting.
_dumps = json.dumps
_write = os.write
_close = os.close
_exit = os._exit


def apply_limits(limits: dict | None) -> None:
    """Set RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NPROC (soft = hard) and RLIMIT_CORE = 0 on this process.

    Units: ``memory_mb`` and ``max_file_mb`` in MiB, ``cpu_s`` in CPU seconds (the hard CPU limit is one
    second above the soft one, so SIGXCPU comes first). ``None`` (the plain baseline) sets nothing.
    """
    if not limits:
        return
    import resource

    mib = 1024 * 1024
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mib,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_mb"] * mib,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_procs"],) * 2)


def classify(exc: BaseException) -> str:
    """Failure kind of an exception raised by candidate or target code (see the module docstring)."""
    if isinstance(exc, MemoryError):
        return "memory"
    for cls in type(exc).__mro__:
        kind = cls.__dict__.get("error_kind")
        if isinstance(kind, str) and kind in KINDS:
            return kind
        if cls.__name__ in NAME_KINDS:
            return NAME_KINDS[cls.__name__]
    return "runtime"


def describe(exc: BaseException) -> str:
    """``Type: message`` plus the innermost candidate line (``line N in func``), cut to MAX_DETAIL chars."""
    text = f"{type(exc).__name__}: {exc}"
    where = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == CANDIDATE_FILENAME]
    if isinstance(exc, SyntaxError) and exc.filename == CANDIDATE_FILENAME:
        text += f" (line {exc.lineno})"
    elif where:
        text += f" (line {where[-1].lineno} in {where[-1].name})"
    return text[:MAX_DETAIL]


def jsonable(value):
    """Convert numpy scalars/arrays and tuples to plain JSON types; raise TypeError for anything else."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalar or array
        return jsonable(value.tolist())
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def evaluate(request: dict) -> dict:
    """Run the request's candidate through its target; return the result object (never raises)."""
    try:
        code_obj = compile(request["code"], CANDIDATE_FILENAME, "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes in the source
        return {"ok": False, "error_kind": "syntax", "error": describe(exc)}
    import linecache

    source = request["code"]
    linecache.cache[CANDIDATE_FILENAME] = (len(source), None, source.splitlines(True), CANDIDATE_FILENAME)
    module = types.ModuleType("candidate")
    module.__file__ = CANDIDATE_FILENAME
    sys.modules["candidate"] = module  # dataclasses and pickling look classes up here
    try:
        exec(code_obj, module.__dict__)  # noqa: S102 - running the candidate is the point
    except MemoryError as exc:
        return {"ok": False, "error_kind": "memory", "error": "at import: " + describe(exc)}
    except BaseException as exc:  # noqa: BLE001 - SystemExit / KeyboardInterrupt from candidate code are failures too
        return {"ok": False, "error_kind": "import", "error": describe(exc)}
    name = request["function_name"]
    fn = module.__dict__.get(name)
    if fn is None:
        return {"ok": False, "error_kind": "parse", "error": f"function {name!r} is not defined by the code"}
    if not callable(fn):
        return {"ok": False, "error_kind": "return_type", "error": f"{name!r} is a {type(fn).__name__}"}
    mod_name, _, func_name = request["target"].partition(":")
    try:
        import importlib

        target = getattr(importlib.import_module(mod_name), func_name)
    except BaseException as exc:  # noqa: BLE001 - any failure to load the target is reported
        return {"ok": False, "error_kind": "sandbox", "error": f"target {request['target']!r}: {describe(exc)}"}
    try:
        metrics = target(fn, request["payload"])
    except BaseException as exc:  # noqa: BLE001 - classified, never re-raised
        return {"ok": False, "error_kind": classify(exc), "error": describe(exc)}
    if not isinstance(metrics, dict):
        return {"ok": False, "error_kind": "return_type",
                "error": f"target returned {type(metrics).__name__}, expected dict"}
    try:
        return {"ok": True, "metrics": jsonable(metrics)}
    except TypeError as exc:
        return {"ok": False, "error_kind": "return_type", "error": f"metrics {exc}"}


def main() -> None:
    result_fd = int(sys.argv[1])
    os.set_inheritable(result_fd, False)  # exec'd grandchildren must not hold the result pipe
    started = time.perf_counter()
    request = json.loads(sys.stdin.buffer.read())
    apply_limits(request.get("limits"))
    try:
        result = evaluate(request)
        result["worker_s"] = time.perf_counter() - started
        data = _dumps(result).encode()
    except BaseException as exc:  # noqa: BLE001 - e.g. MemoryError while encoding a huge metrics dict
        data = _dumps({"ok": False, "error_kind": classify(exc), "error": "reporting: " + describe(exc)}).encode()
    view = memoryview(data)
    while view:
        view = view[_write(result_fd, view):]
    _close(result_fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001, S112 - the candidate may have closed or replaced the stream
            continue
    _exit(0)  # skip interpreter teardown (atexit handlers registered by the candidate do not run)


if __name__ == "__main__":
    main()

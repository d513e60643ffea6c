"""The process that runs one candidate program: a step server inside the sandbox (or, for the plain
baseline only, an in-process evaluator).

Started as a *script path* so that start-up imports nothing but the standard library (neither ``coevo``
nor ``site``; numpy only when an array crosses the pipe). Inside bubblewrap this file is the only file of
the project the candidate's process can see (:mod:`coevo.sandbox.isolation`).

``python -s -P -S worker.py serve REPLY_FD`` (the sandbox, :mod:`coevo.sandbox.session`):
    The trusted side sends frames on stdin; the worker answers on REPLY_FD. It never computes an objective
    and never sees the instance except through the arguments of the calls it is asked to make.

    1. ``{"op": "init", "code", "function_name", "limits": {...} | null, "drop": [uid, gid] | null}``:
       apply rlimits, drop to ``uid``/``gid`` (when started as root), compile and exec the code in a fresh
       module ``candidate`` and look up ``function_name``; reply ``{"ok": true}`` or ``{"ok": false,
       "error_kind", "error"}`` (kinds: ``syntax``, ``import``, ``memory``, ``parse``, ``return_type``,
       ``sandbox``).
    2. ``{"op": "const", "id": k, "value": <array>}``: keep an argument that does not change between calls
       (e.g. a distance matrix); no reply.  ``{"op": "drop", "id": k}``: forget it; no reply.
    3. ``{"op": "call", "args": [...], "reply_bounds": [max_header, max_frame]}``: call the function with FRESH WRITABLE copies of the arguments
       (``{"__nd__": i}`` = the i-th array of the frame, ``{"__const__": k}`` = a copy of constant k),
       reply ``{"ok": true, "value": ...}`` or ``{"ok": false, "error_kind", "error"}`` and wait for the
       next frame (an exception in one call does not end the server). A value whose reply would exceed
       ``reply_bounds`` (bytes) is a ``return_type`` failure instead.
    3b. ``{"op": "driver", "id": k, "source": str, "name": str}``: exec a problem's construction loop
       (numpy + stdlib source, e.g. ``heuristics/tsp_construct/construct.py``); no reply.
       ``{"op": "construct", "driver": k, "args": [...]}``: reply with ``driver(fn, *args, name=...)``, a
       whole solution (a tour, the items, the routes) that the trusted side checks before scoring it.
    4. ``{"op": "exit"}`` or end of stdin: exit at once.

    Frame: 4-byte big-endian length of a UTF-8 JSON header, the header, then the raw bytes of each array
    listed in ``header["arrays"]`` (``[{"dtype": "<f8", "shape": [...]}, ...]``, C order).

``python worker.py local RESULT_FD`` (:mod:`coevo.sandbox.plain` only -- the reference frameworks' way,
kept to measure what the sandbox costs): stdin holds one JSON request ``{"code", "function_name",
"target": "pkg.mod:func", "payload", "limits"}``; the target runs IN this process with the candidate's
function and its metrics are written to RESULT_FD. A candidate can forge those metrics; never use it for
untrusted code.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import traceback
import types

CANDIDATE_FILENAME = "<candidate>"
KINDS = ("parse", "syntax", "import", "timeout", "memory", "runtime", "return_type", "infeasible", "sandbox")
NAME_KINDS = {"InfeasibleSolution": "infeasible", "InvalidReturn": "return_type"}
MAX_DETAIL = 1500
#: Array dtypes that may cross the pipe (anything else is converted to float64 or refused).
DTYPES = ("|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8")
_LEN = struct.Struct(">I")

# Captured before any candidate code runs, so a candidate that rebinds these names cannot break reporting.
_dumps = json.dumps
_loads = json.loads
_write = os.write
_read = os.read
_close = os.close
_exit = os._exit


def apply_limits(limits: dict | None) -> None:
    """Set RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NPROC (soft = hard; none when ``max_procs`` is None),
    RLIMIT_NOFILE (``max_open_files``, when given) and RLIMIT_CORE = 0 on this process.

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
    if limits.get("max_procs") is not None:  # None: the evaluation's cgroup bounds its processes instead
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_procs"],) * 2)
    if limits.get("max_open_files") is not None:  # the host's file table is shared by everyone
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2)


def drop_privileges(ids: list | None) -> None:
    """Become ``uid``/``gid`` (no supplementary groups) for good; raise OSError if that fails or if any
    way back to root remains. ``None`` changes nothing (not started as root)."""
    if not ids:
        return
    uid, gid = int(ids[0]), int(ids[1])
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid or os.getegid() != gid:
        raise OSError(f"privilege drop to {uid}:{gid} did not take effect")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError("could regain uid 0 after dropping privileges")


def classify(exc: BaseException) -> str:
    """Failure kind of an exception raised by candidate or target code (see :mod:`coevo.sandbox.errors`)."""
    if isinstance(exc, MemoryError):
        return "memory"
    kind = getattr(exc, "error_kind", None)
    if isinstance(kind, str) and kind in KINDS:
        return kind
    for cls in type(exc).__mro__:
        if cls.__name__ in NAME_KINDS:
            return NAME_KINDS[cls.__name__]
    return "runtime"


def describe(exc: BaseException) -> str:
    """``Type: message`` plus the innermost candidate line (``line N in func``), cut to MAX_DETAIL chars."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = type(exc).__name__
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


def load_candidate(code: str, name: str):
    """Exec ``code`` in a fresh module ``candidate``; return ``(fn, None)`` or ``(None, failure dict)``."""
    try:
        code_obj = compile(code, CANDIDATE_FILENAME, "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes in the source
        return None, {"ok": False, "error_kind": "syntax", "error": describe(exc)}
    except (RecursionError, MemoryError) as exc:  # nested too deeply for the compiler
        return None, {
            "ok": False,
            "error_kind": "syntax",
            "error": f"code too complex to compile ({type(exc).__name__})",
        }
    import linecache

    linecache.cache[CANDIDATE_FILENAME] = (len(code), None, code.splitlines(True), CANDIDATE_FILENAME)
    module = types.ModuleType("candidate")
    module.__file__ = CANDIDATE_FILENAME
    sys.modules["candidate"] = module  # dataclasses and pickling look classes up here
    try:
        exec(code_obj, module.__dict__)  # noqa: S102 - running the candidate is the point
    except MemoryError as exc:
        return None, {"ok": False, "error_kind": "memory", "error": "at import: " + describe(exc)}
    except BaseException as exc:  # noqa: BLE001 - SystemExit / KeyboardInterrupt from candidate code are failures too
        return None, {"ok": False, "error_kind": "import", "error": describe(exc)}
    fn = module.__dict__.get(name)
    if fn is None:
        return None, {"ok": False, "error_kind": "parse", "error": f"function {name!r} is not defined by the code"}
    if not callable(fn):
        return None, {"ok": False, "error_kind": "return_type", "error": f"{name!r} is a {type(fn).__name__}"}
    return fn, None


# ----------------------------------------------------------------------------------------- serve mode
class _Pipe:
    """Buffered exact reads from a file descriptor."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = bytearray()

    def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = _read(self.fd, max(65536, n - len(self.buf)))
            if not chunk:
                raise EOFError
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def read_frame(pipe: _Pipe):
    """One frame: ``(header dict, [numpy arrays])``; arrays are fresh writable copies."""
    (size,) = _LEN.unpack(pipe.read(4))
    header = _loads(pipe.read(size).decode("utf-8"))
    arrays = []
    specs = header.get("arrays") or []
    if specs:
        import numpy as np

        for spec in specs:
            dtype = np.dtype(spec["dtype"])
            shape = tuple(int(s) for s in spec["shape"])
            count = 1
            for s in shape:
                count *= s
            arrays.append(np.frombuffer(pipe.read(count * dtype.itemsize), dtype=dtype).reshape(shape).copy())
    return header, arrays


#: Lists of at least this many numbers travel as arrays (``{"__list__": i}``), not as JSON.
LIST_AS_ARRAY = 8
_INT64 = (-(1 << 63), (1 << 63) - 1)
#: Integers a float64 holds exactly (a list mixing ints and floats travels as float64 only within them).
_EXACT_INT = 1 << 53
#: Deepest nesting of a list of lists sent as one array (the trusted reader accepts 8 dimensions).
_MAX_NDIM = 8


def _number_kind(v) -> str | None:
    """``"b"``, ``"i"`` or ``"f"`` for a Python or numpy bool / integer / real float (a 0-d array too), else
    None (numpy is looked up in ``sys.modules``: a numpy value exists only once numpy is imported)."""
    t = type(v)
    if t is float:
        return "f"
    if t is int:
        return "i"
    if t is bool:
        return "b"
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.generic):
        if isinstance(v, np.bool_):
            return "b"
        if isinstance(v, np.integer):
            return "i"
        if isinstance(v, np.floating):
            return "f"
    elif np is not None and isinstance(v, np.ndarray) and v.ndim == 0:  # a 0-d array where a number is asked
        return _number_kind(v[()])
    return None


def _flatten(value, shape: list, flat: list, depth: int = 0) -> bool:
    """Append the numbers of ``value`` (a list / tuple, or a rectangular nesting of them) to ``flat`` and
    its dimensions to ``shape``; False when it is ragged, deeper than :data:`_MAX_NDIM`, or holds anything
    but numbers."""
    if depth == len(shape):
        shape.append(len(value))
    elif shape[depth] != len(value):
        return False
    if value and isinstance(value[0], (list, tuple)):
        if depth + 1 >= _MAX_NDIM:
            return False
        return all(isinstance(v, (list, tuple)) and _flatten(v, shape, flat, depth + 1) for v in value)
    if depth + 1 < len(shape):
        return False  # numbers where a deeper level was seen
    flat.extend(value)
    return True


def _list_blob(value):
    """``value`` (a list or tuple of numbers, or a rectangular nesting of such lists) as one array, or None.

    Python and numpy numbers alike (an LLM's heuristic often returns ``[np.float64, ...]``): only bools ->
    ``|b1``; integers (and bools among them, as 0 / 1) -> ``<i8`` (``<u8`` when one is above int64); floats
    with integers of at most 2**53 and bools -> ``<f8`` (float32 / float16 values are exact in it). The
    trusted side's ``tolist()`` gives back the same numbers, nested as sent (a mixed list as numpy would read
    it: ints or floats throughout); huge integers among floats, and anything else, stay JSON (None)."""
    shape: list = []
    flat: list = []
    if not _flatten(value, shape, flat) or not flat:
        return None
    kinds = set()
    for v in flat:
        kind = _number_kind(v)
        if kind is None:
            return None
        kinds.add(kind)
    import array

    if kinds == {"b"}:
        return _Raw("|b1", bytes(bool(v) for v in flat), shape)
    if "f" not in kinds:  # integers, or integers and bools (as numpy reads them: True = 1)
        ints = [int(v) for v in flat]
        if all(_INT64[0] <= v <= _INT64[1] for v in ints):
            return _Raw("<i8", array.array("q", ints).tobytes(), shape)
        if all(0 <= v < (1 << 64) for v in ints):
            return _Raw("<u8", array.array("Q", ints).tobytes(), shape)
        return None
    floats = []
    for v in flat:
        if type(v) is not float and _number_kind(v) == "i":
            v = int(v)
            if not -_EXACT_INT <= v <= _EXACT_INT:
                return None
        floats.append(float(v))
    return _Raw("<f8", array.array("d", floats).tobytes(), shape)


class _Raw:
    """Bytes sent as an array of ``dtype`` and ``shape`` (a list; an int: 1-d) -- no numpy needed here."""

    def __init__(self, dtype: str, data: bytes, shape):
        self.dtype_str, self.data = dtype, data
        self.shape = [shape] if isinstance(shape, int) else list(shape)


def _scalar(value):
    """A numpy scalar as the Python number it stands for (any real dtype: float16 ... longdouble, int8 ...
    uint64, bool_), or TypeError for what cannot come back (complex, datetime, ...)."""
    kind = _number_kind(value)
    if kind == "f":
        return float(value)
    if kind == "i":
        return int(value)
    if kind == "b":
        return bool(value)
    item = value.item()
    if isinstance(item, (str, bytes)) or item is None:
        return item.decode("utf-8", errors="replace") if isinstance(item, bytes) else item
    raise TypeError(f"the function returned a numpy {type(value).__name__}, which cannot be sent back")


def _encode_value(value, blobs: list):
    """JSON-able tree of ``value`` with numpy arrays moved to ``blobs`` as ``{"__nd__": i}`` and lists of
    numbers as ``{"__list__": i}`` (:data:`LIST_AS_ARRAY`, :func:`_list_blob`): the trusted side then reads
    numbers as array bytes, not as JSON, whatever honest shape the heuristic returned. Numpy scalars and
    0-d arrays become Python numbers; arrays of a real dtype outside :data:`DTYPES` (big-endian,
    longdouble) travel in the nearest one."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        return {str(k): _encode_value(v, blobs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if len(value) >= LIST_AS_ARRAY or (value and isinstance(value[0], (list, tuple))):
            raw = _list_blob(value)
            if raw is not None:
                blobs.append(raw)
                return {"__list__": len(blobs) - 1}
        return [_encode_value(v, blobs) for v in value]
    mod = type(value).__module__ or ""
    if mod.startswith("numpy"):
        import numpy as np

        if isinstance(value, np.generic):
            return _encode_value(_scalar(value), blobs)
        if isinstance(value, np.ndarray):
            arr = value
            if arr.ndim == 0:
                return _encode_value(arr[()], blobs)
            if arr.dtype.str not in DTYPES:
                if arr.dtype.kind in "biuf" and arr.dtype.newbyteorder("<").str in DTYPES:
                    arr = arr.astype(arr.dtype.newbyteorder("<"))
                elif arr.dtype.kind in "biuf":
                    arr = arr.astype(np.float64)
                else:
                    return _encode_value(arr.tolist(), blobs)
            arr = np.ascontiguousarray(arr)
            blobs.append(arr)
            return {"__nd__": len(blobs) - 1}
    raise TypeError(f"the function returned a {type(value).__name__}, which cannot be sent back")


def frame_parts(header: dict, blobs: list) -> list:
    """One frame's byte strings (length, header, raw array bytes); ``blobs`` are numpy arrays or :class:`_Raw`."""
    if blobs:
        header["arrays"] = [
            {"dtype": a.dtype_str, "shape": a.shape}
            if isinstance(a, _Raw)
            else {"dtype": a.dtype.str, "shape": list(a.shape)}
            for a in blobs
        ]
    head = _dumps(header).encode("utf-8", errors="replace")
    return [_LEN.pack(len(head)), head, *(a.data if isinstance(a, _Raw) else a.tobytes() for a in blobs)]


def oversize(parts: list, bounds) -> str | None:
    """Why a reply of ``parts`` (:func:`frame_parts`) exceeds the call's ``bounds`` = [largest header, largest
    frame] in bytes, or None. The trusted side enforces the same bounds itself (a longer reply is a
    ``sandbox`` failure there); said here, an honest oversized return is the ``return_type`` failure it is."""
    if not bounds:
        return None
    max_header, max_frame = int(bounds[0]), int(bounds[1])
    if len(parts[1]) > max_header:
        return f"the return value needs a {len(parts[1])}-byte header, more than the {max_header} this call accepts"
    size = sum(len(p) for p in parts)
    if size > max_frame:
        return f"the return value needs {size} bytes, more than the {max_frame} this call accepts"
    return None


def write_frame(fd: int, header: dict, blobs: list) -> None:
    """Write one frame (header + raw array bytes) to ``fd``; ``blobs`` are numpy arrays or :class:`_Raw`."""
    _write_parts(fd, frame_parts(header, blobs))


def _write_parts(fd: int, parts: list) -> None:
    view = memoryview(b"".join(parts))
    while view:
        view = view[_write(fd, view) :]


def write_failure(fd: int, kind: str, text: str) -> None:
    """A failure reply: ``{"ok": false, "error_kind": kind, "error": {"__nd__": 0}}`` with the text's UTF-8
    bytes (at most :data:`MAX_DETAIL` of them) as a uint8 array, so the header stays a few dozen bytes."""
    data = text.encode("utf-8", errors="replace")[:MAX_DETAIL]
    write_frame(fd, {"ok": False, "error_kind": kind, "error": {"__nd__": 0}}, [_Raw("|u1", data, len(data))])


def _decode_args(tree, arrays, consts):
    if isinstance(tree, list):
        return [_decode_args(v, arrays, consts) for v in tree]
    if isinstance(tree, dict):
        if "__nd__" in tree:
            return arrays[tree["__nd__"]]
        if "__const__" in tree:
            return consts[tree["__const__"]].copy()
        return {k: _decode_args(v, arrays, consts) for k, v in tree.items()}
    return tree


def _load_driver(source: str, name: str):
    """The function ``name`` of the module ``source`` (or the exception that loading it raised)."""
    try:
        module = types.ModuleType("coevo_construct")
        exec(compile(source, "<construct>", "exec"), module.__dict__)  # noqa: S102 - the problem's loop
        return module.__dict__[name]
    except BaseException as exc:  # noqa: BLE001 - reported at the first construct call
        return exc


def serve(reply_fd: int, ready: bool = False) -> None:
    """The step server (see the module docstring); never returns. ``ready``: the limits and the uid of the
    init frame are already in force (a worker forked by :mod:`coevo.sandbox.zygote`)."""
    pipe = _Pipe(0)
    try:
        init, _ = read_frame(pipe)
    except (EOFError, ValueError):
        _exit(0)
    try:
        if not ready:
            apply_limits(init.get("limits"))
            drop_privileges(init.get("drop"))
    except BaseException as exc:  # noqa: BLE001 - refuse to run the candidate without its limits
        write_failure(reply_fd, "sandbox", "setup: " + describe(exc))
        _exit(0)
    fn, failure = load_candidate(init["code"], init["function_name"])
    if failure:
        write_failure(reply_fd, failure["error_kind"], failure["error"])
        _exit(0)
    write_frame(reply_fd, {"ok": True}, [])
    consts: dict = {}
    drivers: dict = {}
    while True:
        try:
            header, arrays = read_frame(pipe)
        except EOFError:
            _exit(0)
        op = header.get("op")
        if op == "const":
            consts[header["id"]] = arrays[0]
            continue
        if op == "drop":
            consts.pop(header["id"], None)
            continue
        if op == "driver":
            drivers[header["id"]] = _load_driver(header["source"], header["name"])
            continue
        if op not in ("call", "construct"):
            _exit(0)
        try:
            args = _decode_args(header["args"], arrays, consts)
            if op == "call":
                value = fn(*args)
            else:
                driver = drivers.get(header["driver"])
                if isinstance(driver, BaseException):
                    raise RuntimeError(f"construction loop failed to load: {describe(driver)}")
                value = driver(fn, *args, name=init["function_name"])
            blobs: list = []
            reply = {"ok": True, "value": _encode_value(value, blobs)}
        except BaseException as exc:  # noqa: BLE001 - classified and reported, the server goes on
            write_failure(reply_fd, classify(exc), describe(exc))
            continue
        try:
            parts = frame_parts(reply, blobs)
            del reply, blobs, value
            if why := oversize(parts, header.get("reply_bounds")):
                write_failure(reply_fd, "return_type", why)
            else:
                _write_parts(reply_fd, parts)
        except BaseException as exc:  # noqa: BLE001 - e.g. MemoryError while encoding a huge value
            write_failure(reply_fd, classify(exc), "reply: " + describe(exc))


# ----------------------------------------------------------------------------------------- local mode
def evaluate_local(request: dict) -> dict:
    """Run the request's candidate through its target in this process (plain baseline; never raises)."""
    fn, failure = load_candidate(request["code"], request["function_name"])
    if failure:
        return failure
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
        return {
            "ok": False,
            "error_kind": "return_type",
            "error": f"target returned {type(metrics).__name__}, expected dict",
        }
    try:
        return {"ok": True, "metrics": jsonable(metrics)}
    except TypeError as exc:
        return {"ok": False, "error_kind": "return_type", "error": f"metrics {exc}"}


def local(result_fd: int) -> None:
    """The plain baseline's one-shot evaluation (see the module docstring); never returns."""
    started = time.perf_counter()
    request = json.loads(sys.stdin.buffer.read())
    apply_limits(request.get("limits"))
    try:
        result = evaluate_local(request)
        result["worker_s"] = time.perf_counter() - started
        data = _dumps(result).encode()
    except BaseException as exc:  # noqa: BLE001 - e.g. MemoryError while encoding a huge metrics dict
        data = _dumps({"ok": False, "error_kind": classify(exc), "error": "reporting: " + describe(exc)}).encode()
    view = memoryview(data)
    while view:
        view = view[_write(result_fd, view) :]
    _close(result_fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001, S112 - the candidate may have closed or replaced the stream
            continue
    _exit(0)  # skip interpreter teardown (atexit handlers registered by the candidate do not run)


def main() -> None:
    mode, fd = sys.argv[1], int(sys.argv[2])
    os.set_inheritable(fd, False)  # exec'd grandchildren must not hold the reply pipe
    if mode == "serve":
        serve(fd)
    elif mode == "local":
        local(fd)
    else:
        raise SystemExit(f"unknown worker mode {mode!r}")


if __name__ == "__main__":
    main()

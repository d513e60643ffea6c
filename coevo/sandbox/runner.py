"""Run one LLM-generated program in an isolated, resource-limited process and return an EvalResult.

Generated code is hostile input. Each evaluation is a fresh process of the *running* interpreter
(``sys.executable``) executing :mod:`coevo.sandbox.worker`; nothing is shared between candidates. Isolation:

- bubblewrap when usable (:mod:`coevo.sandbox.isolation`): no network, private PID namespace that dies
  with the sandbox, read-only filesystem except a private temp dir (cwd, ``HOME``, ``TMPDIR``), home folder
  hidden, all capabilities dropped, environment cleared;
- always: ``setsid`` (own process group), rlimits set by the worker before any candidate code runs
  (RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_CORE = 0), a wall-clock deadline, and a
  SIGKILL to the whole process group after every run, timed out or not (:mod:`coevo.sandbox.process`).
  As root RLIMIT_NPROC does not stop forks; the PID namespace and the group kill bound them instead.

The sandbox converts nothing to scores: a valid result carries the target's metrics dict unchanged, and the
caller computes objective and score.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from coevo.sandbox import isolation
from coevo.sandbox.extract import Extraction, extract_code
from coevo.sandbox.process import ProcessOutcome, run_process
from coevo.types import EvalResult

log = logging.getLogger(__name__)
_warn_lock = threading.Lock()
_warned_no_bwrap = False

_TARGET_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one evaluation.

    Attributes:
        timeout_s: wall-clock limit from process start to exit (s), start-up and target import included.
        cpu_s: CPU-time limit (s, RLIMIT_CPU, rounded up); ``None`` = ``ceil(timeout_s) + 1``.
        memory_mb: address-space limit (MiB, RLIMIT_AS).
        max_procs: RLIMIT_NPROC (not enforced by the kernel for root; see the module docstring).
        max_file_mb: largest file the candidate may write (MiB, RLIMIT_FSIZE).
        network: allow network access (only bubblewrap can deny it).
        max_output_kb: bytes kept of each of stdout and stderr (KiB; head and tail).
        max_result_mb: largest metrics JSON accepted from the worker (MiB).
    """

    timeout_s: float = 30.0
    cpu_s: float | None = None
    memory_mb: int = 1024
    max_procs: int = 64
    max_file_mb: int = 16
    network: bool = False
    max_output_kb: int = 64
    max_result_mb: int = 8

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_procs", "max_file_mb", "max_output_kb",
                     "max_result_mb"):
            value = getattr(self, name)
            if value is None and name == "cpu_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                    or not math.isfinite(value):
                raise ValueError(f"SandboxLimits.{name} must be a finite number > 0, got {value!r}")
        if not isinstance(self.network, bool):
            raise TypeError(f"SandboxLimits.network must be a bool, got {self.network!r}")

    @property
    def effective_cpu_s(self) -> int:
        """The RLIMIT_CPU soft limit actually set (whole seconds)."""
        return math.ceil(self.cpu_s) if self.cpu_s is not None else math.ceil(self.timeout_s) + 1


@dataclass
class SandboxRun:
    """An evaluation with what the process printed (for debugging and feedback).

    Attributes:
        result: the EvalResult. stdout, stderr: captured text (capped, decoded with replacement).
        returncode: exit status of the started process (bwrap's when isolated). isolation: "bwrap" or
        "rlimits". worker_s: time the worker measured from its start to its result (s), None without result.
    """

    result: EvalResult
    stdout: str
    stderr: str
    returncode: int
    isolation: str
    worker_s: float | None


class Sandbox:
    """Evaluates candidate programs, one isolated process each (see the module docstring).

    Args:
        limits: resource limits (default :class:`SandboxLimits`).
        use_bwrap: True = require bubblewrap (ValueError when unusable), False = rlimits only, None = auto.
        python_path: extra import folders (problem folders); also bound read-only.
        ro_paths: extra files/folders the target reads (bound read-only under bubblewrap). Existing
            absolute paths among the payload's string values are bound automatically.
        python: interpreter to run (default ``sys.executable``, never a bare ``python``).
        hide_home: hide the home folder under bubblewrap (an empty tmpfs over it).
        hash_seed: PYTHONHASHSEED of the worker (fixed so set iteration order is reproducible).
        site_import: start the worker with ``site`` (slower; only needed for packages relying on ``.pth``
            code rather than folders).
    """

    def __init__(self, limits: SandboxLimits | None = None, *, use_bwrap: bool | None = None,
                 python_path: Iterable[str | os.PathLike] = (), ro_paths: Iterable[str | os.PathLike] = (),
                 python: str | None = None, hide_home: bool = True, hash_seed: int = 0,
                 site_import: bool = False):
        if limits is not None and not isinstance(limits, SandboxLimits):
            raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
        if use_bwrap not in (None, True, False):
            raise ValueError(f"use_bwrap must be True, False or None, got {use_bwrap!r}")
        self.limits = limits or SandboxLimits()
        self.python = python or sys.executable
        if not (os.path.isfile(self.python) and os.access(self.python, os.X_OK)):
            raise ValueError(f"python must be an executable interpreter, got {self.python!r}")
        self.python_path = isolation.child_pythonpath(python_path)
        self.ro_paths = [os.path.abspath(p) for p in (*map(str, python_path), *map(str, ro_paths))]
        self.hide_home = hide_home
        self.hash_seed = int(hash_seed)
        self.site_import = site_import
        usable, how = isolation.bwrap_status() if use_bwrap is not False else (False, "disabled (use_bwrap=False)")
        if use_bwrap and not usable:
            raise ValueError(f"use_bwrap=True but bubblewrap is not usable: {how}")
        self.bwrap = how if usable else None
        if self.bwrap is None:
            _warn_no_isolation(how)

    @property
    def isolation(self) -> str:
        """``"bwrap"`` or ``"rlimits"`` (no network / filesystem isolation)."""
        return "bwrap" if self.bwrap else "rlimits"

    def run(self, code: str, function_name: str, target: str, payload: dict[str, Any]) -> EvalResult:
        """Evaluate ``code``: exec it, then call ``target(code's function_name, payload)`` in the sandbox.

        Args:
            code: Python source (already extracted, e.g. by :func:`coevo.sandbox.extract.extract_code`).
            function_name: the function the code must define.
            target: ``"pkg.mod:func"`` importable in the sandbox; receives ``(fn, payload)`` and returns a
                JSON-able dict (e.g. ``{"objectives": [...]}``); raises
                :class:`~coevo.sandbox.errors.InfeasibleSolution` / :class:`~coevo.sandbox.errors.InvalidReturn`
                to mark those failures.
            payload: JSON-serialisable dict handed to the target.

        Returns:
            EvalResult(valid, metrics=target's dict, error_kind, error, feedback=stderr tail on failure,
            duration_s=wall time). Failures of the candidate never raise.

        Raises:
            TypeError, ValueError: an argument is malformed (the message names it). OSError: the process
            could not start.
        """
        return self.execute(code, function_name, target, payload).result

    def run_response(self, text: str, function_name: str, target: str,
                     payload: dict[str, Any]) -> tuple[EvalResult, Extraction]:
        """Extract the code from an LLM response, then :meth:`run` it; an extraction failure becomes an
        invalid EvalResult with error_kind ``parse`` or ``syntax`` (no process is started)."""
        extraction = extract_code(text, function_name)
        if extraction.code is None:
            return EvalResult(valid=False, error_kind=extraction.error, error=extraction.detail), extraction
        return self.run(extraction.code, function_name, target, payload), extraction

    def execute(self, code: str, function_name: str, target: str, payload: dict[str, Any]) -> SandboxRun:
        """Like :meth:`run`, also returning the captured output and exit status."""
        request = build_request(code, function_name, target, payload, self.limits)
        tmpdir = tempfile.mkdtemp(prefix="coevo-sbx-")
        marker = uuid.uuid4().hex
        try:
            env = isolation.child_env(tmpdir, self.python_path, self.hash_seed, marker)
            cmd = isolation.interpreter_command(self.python, -1, self.site_import)
            prefix: list[str] = []
            if self.bwrap:
                ro = [*self.python_path, *self.ro_paths, *isolation.payload_paths(payload)]
                prefix = isolation.bwrap_command(self.bwrap, tmpdir, ro, self.limits.network, self.hide_home)
            argv = prefix + cmd
            out = run_process(argv, env=env, cwd=tmpdir, stdin_data=request, result_fd_slot=len(argv) - 1,
                              timeout_s=self.limits.timeout_s, output_cap=self.limits.max_output_kb * 1024,
                              result_cap=self.limits.max_result_mb * 1024 * 1024,
                              marker=None if self.bwrap else (isolation.MARKER_VAR, marker))
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        stdout = out.stdout.decode("utf-8", errors="replace")
        stderr = out.stderr.decode("utf-8", errors="replace")
        result, worker_s = interpret(out, stderr, self.limits, isolated=self.bwrap is not None)
        return SandboxRun(result=result, stdout=stdout, stderr=stderr, returncode=out.returncode,
                          isolation=self.isolation, worker_s=worker_s)


def build_request(code: str, function_name: str, target: str, payload: dict[str, Any],
                  limits: SandboxLimits | None) -> bytes:
    """Validate the arguments of an evaluation and encode the worker's JSON request (UTF-8 bytes).

    Raises:
        TypeError: ``code`` is not a str or ``payload`` not a dict. ValueError: a malformed
        ``function_name`` or ``target``, or a payload that is not JSON-serialisable.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if not isinstance(function_name, str) or not function_name.isidentifier():
        raise ValueError(f"function_name must be a Python identifier, got {function_name!r}")
    if not isinstance(target, str) or not _TARGET_RE.match(target):
        raise ValueError(f"target must look like 'package.module:function', got {target!r}")
    if not isinstance(payload, dict):
        raise TypeError(f"payload must be a dict, got {type(payload).__name__}")
    request = {"code": code, "function_name": function_name, "target": target, "payload": payload,
               "limits": None if limits is None else {
                   "memory_mb": int(limits.memory_mb), "cpu_s": limits.effective_cpu_s,
                   "max_procs": int(limits.max_procs), "max_file_mb": int(limits.max_file_mb)}}
    try:
        return json.dumps(request).encode("utf-8", errors="surrogatepass")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"payload must be JSON-serialisable: {exc}") from exc


def interpret(out: ProcessOutcome, stderr: str, limits: SandboxLimits | None, isolated: bool) -> tuple[EvalResult, float | None]:
    """Map a :class:`~coevo.sandbox.process.ProcessOutcome` to an EvalResult and the worker's own time."""
    tail = stderr[-800:]
    if out.result:
        try:
            msg = json.loads(out.result)
        except ValueError:
            msg = None
        if isinstance(msg, dict) and "ok" in msg:
            worker_s = msg.get("worker_s")
            if msg["ok"] and isinstance(msg.get("metrics"), dict):
                return EvalResult(valid=True, metrics=msg["metrics"], duration_s=out.wall_s), worker_s
            kind = msg.get("error_kind") or "sandbox"
            return EvalResult(valid=False, error_kind=kind, error=str(msg.get("error"))[:2000], feedback=tail,
                              duration_s=out.wall_s), worker_s
    if out.timed_out:
        detail = f"wall-clock limit of {limits.timeout_s:g} s reached" if limits else "wall-clock limit reached"
        return EvalResult(valid=False, error_kind="timeout", error=detail, feedback=tail,
                          duration_s=out.wall_s), None
    if out.result_overflow:
        return EvalResult(valid=False, error_kind="sandbox", error="result larger than max_result_mb",
                          feedback=tail, duration_s=out.wall_s), None
    rc = out.returncode
    sig = -rc if rc < 0 else (rc - 128 if isolated and rc > 128 else None)
    if sig == signal.SIGXCPU:
        kind, detail = "timeout", f"CPU limit of {limits.effective_cpu_s if limits else '?'} s reached"
    elif any(s in stderr for s in _MEMORY_SIGNS):
        kind, detail = "memory", f"out of memory (limit {limits.memory_mb if limits else '?'} MiB)"
    else:
        how = f"signal {signal.Signals(sig).name}" if sig and sig in signal.Signals._value2member_map_ \
            else f"exit code {rc}"
        last = next((x for x in reversed(stderr.splitlines()) if x.strip()), "")
        kind, detail = "sandbox", f"worker ended with {how} without a result" + (f": {last[:300]}" if last else "")
        if out.result:
            detail = "worker wrote a malformed result"
    return EvalResult(valid=False, error_kind=kind, error=detail, feedback=tail, duration_s=out.wall_s), None


def _warn_no_isolation(reason: str) -> None:
    global _warned_no_bwrap
    with _warn_lock:
        if _warned_no_bwrap:
            return
        _warned_no_bwrap = True
    log.warning("sandbox without bubblewrap (%s): network and filesystem isolation are OFF; only rlimits, "
                "setsid, process-group kill and the wall-clock timeout apply", reason)

"""Evaluate one LLM-generated program: its function runs in an isolated, unprivileged, resource-limited
process; the evaluation (target) runs here, on the trusted side, and only ever receives the function's
return values.

Generated code is hostile input. Each evaluation starts a fresh process of the *running* interpreter
(``sys.executable``) executing :mod:`coevo.sandbox.worker` as a step server; nothing is shared between
candidates. The target (``"pkg.mod:func"``, imported in THIS process) is called as ``target(fn, payload)``
with ``fn`` a :class:`~coevo.sandbox.session.RemoteFunction`: each call of ``fn`` is answered by the
candidate's process, and the target validates every answer and computes the metrics itself
(:mod:`coevo.sandbox.session` says why that makes scores unforgeable). Isolation of the candidate's process:

- by default, where the host has root, pidfds and a seccomp table: the zygote mode (:mod:`coevo.sandbox.zygote`):
  the worker is forked from a trusted zygote that preloaded the standard-library modules of
  :data:`coevo.sandbox.zygote.STDLIB_PRELOAD` and the allowed packages, onto an empty private tmpfs root (no
  host file reachable, nothing to execute), with fresh namespaces, a fresh uid, the seccomp filter and the
  rlimits below; ``SandboxLimits.isolation = "bwrap"`` (or ``$COEVO_SANDBOX_ISOLATION=bwrap``) selects:
- bubblewrap when usable (:mod:`coevo.sandbox.isolation`): an empty read-only root holding only the
  interpreter, its standard library, the payload's ``candidate_packages`` (all of site-packages when not
  given) and the shared libraries they load, read-only (no /usr/bin, compiler or host Python), stand-ins
  for the /proc files that show the host, and a private tmpfs ``/tmp``; no project checkout, no /etc, no home; no network; private PID, IPC
  and UTS namespaces that die with the sandbox; an unprivileged uid (as root: a fresh one per evaluation);
  a seccomp filter (:mod:`coevo.sandbox.seccomp`: no keyring, namespaces, mounts, ptrace, bpf, ...);
  environment cleared;
- where a cgroup hierarchy is writable: one cgroup per evaluation (:mod:`coevo.sandbox.cgroups`) bounding
  the memory, processes and CPU of all its processes together;
- always: ``setsid`` (own process group), rlimits set by the worker before any candidate code runs
  (RLIMIT_AS, RLIMIT_CPU from the evaluation's wall-clock limit, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_NOFILE,
  RLIMIT_CORE = 0),
  a wall-clock deadline, capped stdout/stderr, a size-bounded reply pipe, host paths scrubbed from failure
  text, and a SIGKILL to everything the evaluation started after every run (its process group under bubblewrap;
  its PID namespace in the zygote mode). Without bubblewrap (a warning is logged
  once) the process runs as the caller's user with rlimits only. What each fallback guarantees:
  ``docs/sandbox.md``.

The sandbox converts nothing to scores: a valid result carries the target's metrics dict unchanged, and the
caller computes objective and score.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
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
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from coevo.sandbox import cgroups, isolation, seccomp, zygote
from coevo.sandbox.errors import CandidateFailure, failure_kind
from coevo.sandbox.extract import Extraction, extract_code
from coevo.sandbox.process import CappedBuffer, ProcessOutcome
from coevo.sandbox.session import CandidateProcess, Launch, RemoteFunction
from coevo.sandbox.wire import encode_frame, reply_text
from coevo.types import EvalResult

log = logging.getLogger(__name__)
_warn_lock = threading.Lock()
_warm_lock = threading.Lock()
_warmed: set[int] = set()  # ids of the worker views whose files were read into the page cache by this process

_TARGET_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


#: the values of :attr:`SandboxLimits.isolation` (None: ``$COEVO_SANDBOX_ISOLATION``, else the zygote where the
#: host has what it needs, else bwrap)
ISOLATION_MODES = (None, "bwrap", "zygote")
#: the isolation used when neither :attr:`SandboxLimits.isolation` nor ``$COEVO_SANDBOX_ISOLATION`` names one
DEFAULT_ISOLATION = "zygote"
#: what a zygote preloads for a payload without ``candidate_packages`` (bubblewrap binds all of
#: site-packages then; a zygote imports only what it is given)
ZYGOTE_DEFAULT_PACKAGES = ("numpy",)


def isolation_mode(limits: SandboxLimits) -> str:
    """The isolation mode ``limits`` ask for (``"bwrap"`` or ``"zygote"``; :data:`DEFAULT_ISOLATION` when
    neither ``limits.isolation`` nor ``$COEVO_SANDBOX_ISOLATION`` names one)."""
    mode = limits.isolation or os.environ.get("COEVO_SANDBOX_ISOLATION", "").strip() or DEFAULT_ISOLATION
    if mode not in ("bwrap", "zygote"):
        raise ValueError(f"COEVO_SANDBOX_ISOLATION must be 'bwrap' or 'zygote', got {mode!r}")
    return mode


def _isolation_named(limits: SandboxLimits) -> bool:
    """Whether ``limits`` or the environment name the isolation mode (rather than the default)."""
    return bool(limits.isolation or os.environ.get("COEVO_SANDBOX_ISOLATION", "").strip())


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one evaluation.

    Attributes:
        timeout_s: wall-clock limit from process start to exit (s), start-up and target import included.
        cpu_s: CPU-time limit (s, RLIMIT_CPU, rounded up); ``None`` = ``ceil(timeout_s) + 1``.
        memory_mb: address-space limit (MiB, RLIMIT_AS).
        max_procs: RLIMIT_NPROC (not enforced by the kernel for root; see the module docstring).
        max_file_mb: largest file the candidate may write (MiB, RLIMIT_FSIZE).
        network: allow network access (denied by a network namespace under bubblewrap and the zygote; the
            rlimits-only fallback cannot deny it).
        max_output_kb: bytes kept of each of stdout and stderr (KiB; head and tail).
        max_result_mb: largest metrics JSON accepted from the worker (MiB).
        max_open_files: RLIMIT_NOFILE of each process of the candidate (the host's file table is shared:
            with the default 256 and ``max_procs`` 64, one evaluation holds at most 16,384 open files).
        isolation: ``"bwrap"`` (each worker a fresh interpreter in a bubblewrap view of host files) or
            ``"zygote"`` (workers forked from a preloaded zygote onto an empty tmpfs root, no host file
            reachable: :mod:`coevo.sandbox.zygote`); None = ``$COEVO_SANDBOX_ISOLATION``, else ``"zygote"`` where
            the host has root, pidfds and a seccomp table (one warning line and ``"bwrap"`` where not).
    """

    timeout_s: float = 30.0
    cpu_s: float | None = None
    memory_mb: int = 1024
    max_procs: int = 64
    max_file_mb: int = 16
    network: bool = False
    max_output_kb: int = 64
    max_result_mb: int = 8
    max_open_files: int = 256
    isolation: str | None = None

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_MODES:
            raise ValueError(f"SandboxLimits.isolation must be one of {ISOLATION_MODES}, got {self.isolation!r}")
        for name in (
            "timeout_s",
            "cpu_s",
            "memory_mb",
            "max_procs",
            "max_file_mb",
            "max_output_kb",
            "max_result_mb",
            "max_open_files",
        ):
            value = getattr(self, name)
            if value is None and name == "cpu_s":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not value > 0
                or not math.isfinite(value)
            ):
                raise ValueError(f"SandboxLimits.{name} must be a finite number > 0, got {value!r}")
        if not isinstance(self.network, bool):
            raise TypeError(f"SandboxLimits.network must be a bool, got {self.network!r}")

    @property
    def effective_cpu_s(self) -> int:
        """The RLIMIT_CPU soft limit of an evaluation run with the default ``timeout_s`` (whole seconds)."""
        return self.cpu_limit(self.timeout_s)

    def cpu_limit(self, timeout_s: float) -> int:
        """RLIMIT_CPU (whole CPU seconds) of an evaluation whose wall-clock limit is ``timeout_s``: ``cpu_s``
        when set, else ``ceil(timeout_s) + 1`` -- never below what one core can spend before the wall clock
        ends the evaluation, so an honest single-threaded heuristic is stopped by its timeout, not by SIGXCPU."""
        return math.ceil(self.cpu_s) if self.cpu_s is not None else math.ceil(timeout_s) + 1


@dataclass
class SandboxRun:
    """An evaluation with what the process printed (for debugging and feedback).

    Attributes:
        result: the EvalResult. stdout, stderr: captured text (capped, decoded with replacement).
        returncode: exit status of the started process (bwrap's when isolated). isolation: "zygote",
        "bwrap" or "rlimits". worker_s: time the worker measured from its start to its result (s), None without result.
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
        use_bwrap: True = require bubblewrap to be usable (ValueError when not; the mode is still
            ``limits.isolation``'s: the zygote by default), False = rlimits only, None = auto.
        python_path: extra import folders for the TRUSTED side (where targets are imported from); the
            candidate's process never sees them.
        ro_paths: extra files/folders the candidate's process may read (bound read-only under bubblewrap);
            nothing else of the host is visible to it.
        python: interpreter to run (default ``sys.executable``, never a bare ``python``).
        hash_seed: PYTHONHASHSEED of the worker (fixed so set iteration order is reproducible).
        site_import: start the worker with ``site`` (slower; only needed for packages relying on ``.pth``
            code rather than folders).
        use_cgroups: True = require per-evaluation cgroups (ValueError when none is writable), False = rlimits
            only, None = use them where the machine has them (:func:`coevo.sandbox.cgroups.detect`).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        use_bwrap: bool | None = None,
        python_path: Iterable[str | os.PathLike] = (),
        ro_paths: Iterable[str | os.PathLike] = (),
        python: str | None = None,
        hash_seed: int = 0,
        site_import: bool = False,
        use_cgroups: bool | None = None,
    ):
        if limits is not None and not isinstance(limits, SandboxLimits):
            raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
        if use_bwrap not in (None, True, False):
            raise ValueError(f"use_bwrap must be True, False or None, got {use_bwrap!r}")
        self.limits = limits or SandboxLimits()
        self.python = python or sys.executable
        if not (os.path.isfile(self.python) and os.access(self.python, os.X_OK)):
            raise ValueError(f"python must be an executable interpreter, got {self.python!r}")
        self.python_path = [os.path.abspath(str(p)) for p in python_path]
        self.candidate_path = isolation.site_dirs()
        self.ro_paths = [os.path.abspath(str(p)) for p in ro_paths]
        self.hash_seed = int(hash_seed)
        self.site_import = site_import
        #: workers are forked by a zygote (:mod:`coevo.sandbox.zygote`) instead of started under bwrap
        self.zygote = False
        if use_bwrap is not False and isolation_mode(self.limits) == "zygote":
            if self.ro_paths and not _isolation_named(self.limits):
                pass  # host files to show and no mode named: bubblewrap, which can bind them, is used
            else:
                lacks = zygote.missing()
                if not seccomp.supported():
                    lacks.append(f"a seccomp table for {os.uname().machine}")
                if self.ro_paths:
                    lacks.append("support for ro_paths (no host file can be shown to a zygote's worker)")
                if lacks:
                    _warn_once("zygote", FALLBACKS["zygote"].format(missing="; ".join(lacks)))
                else:
                    self.zygote = True
        usable, how = isolation.bwrap_status() if use_bwrap is not False else (False, "disabled (use_bwrap=False)")
        if use_bwrap and not usable:
            raise ValueError(f"use_bwrap=True but bubblewrap is not usable: {how}")
        self.bwrap = how if usable and not self.zygote else None
        if self.bwrap is None and not self.zygote:
            _warn_once("bwrap", FALLBACKS["bwrap"].format(reason=how))
        #: the seccomp program handed to bubblewrap (None without bwrap, or on a machine without a table)
        self.seccomp = (
            seccomp.build_filter()
            if self.zygote
            or (self.bwrap and seccomp.supported() and "--seccomp" in isolation.bwrap_features(self.bwrap))
            else None
        )
        #: per-evaluation cgroups (None: rlimits only; see coevo.sandbox.cgroups and docs/sandbox.md)
        self.cgroups = cgroups.detect() if use_cgroups is not False else None
        self.require_cgroups = bool(use_cgroups)
        if use_cgroups and self.cgroups is None:
            raise ValueError("use_cgroups=True but no writable cgroup hierarchy was found")
        if self.bwrap and self.seccomp is None:
            why = f"no table for {os.uname().machine}" if not seccomp.supported() else f"{self.bwrap} has no --seccomp"
            _warn_once("seccomp", FALLBACKS["seccomp"].format(reason=why))
        if self.cgroups is None:
            _warn_once("cgroups", FALLBACKS["cgroups"])
        if self.bwrap and os.geteuid() != 0:
            _warn_once("root", FALLBACKS["root"])
        if self.bwrap and isolation.shared_libraries((os.path.realpath(self.python),)) is None:
            _warn_once("ldd", FALLBACKS["ldd"])
        self._scrub = isolation.path_scrubber([*self.python_path, *self.ro_paths, os.path.dirname(self.python)])

    @property
    def isolation(self) -> str:
        """``"zygote"``, ``"bwrap"`` or ``"rlimits"`` (no network / filesystem isolation)."""
        return "zygote" if self.zygote else "bwrap" if self.bwrap else "rlimits"

    def _zygote(self, packages: Sequence[str] | None) -> zygote.Zygote:
        """The zygote for ``packages`` (None: :data:`ZYGOTE_DEFAULT_PACKAGES`), started on first use."""
        env = isolation.child_env("/tmp", self.candidate_path, self.hash_seed, None)
        wanted = tuple(packages) if packages is not None else ZYGOTE_DEFAULT_PACKAGES
        return zygote.zygote_for(self.python, env, wanted, self.seccomp, self.site_import)

    @property
    def accounting(self) -> str:
        """How one evaluation's memory, processes and CPU are limited: ``"cgroup v2"``, ``"cgroup v1"``
        (the evaluation as a whole) or ``"rlimits"`` (each process; see docs/sandbox.md)."""
        return f"cgroup v{self.cgroups.version}" if self.cgroups else "rlimits"

    def run(
        self, code: str, function_name: str, target: str, payload: dict[str, Any], *, timeout_s: float | None = None
    ) -> EvalResult:
        """Evaluate ``code``: load it in a sandboxed process, then call ``target(fn, payload)`` here.

        Args:
            code: Python source (already extracted, e.g. by :func:`coevo.sandbox.extract.extract_code`).
            function_name: the function the code must define.
            target: ``"pkg.mod:func"`` importable on the trusted side (also from ``python_path``); receives
                ``(fn, payload)`` with ``fn`` a :class:`~coevo.sandbox.session.RemoteFunction` and returns
                a JSON-able dict (e.g. ``{"objectives": [...]}``); raises
                :class:`~coevo.sandbox.errors.InfeasibleSolution` / :class:`~coevo.sandbox.errors.InvalidReturn`
                to mark those failures.
            payload: JSON-serialisable dict handed to the target. Its optional key ``"timeout_s"`` sets the
                wall-clock limit of this evaluation (for callers that only pass a payload through);
                ``"candidate_packages"`` (list of distribution names) limits what the candidate can import
                to those, what they require, and the standard library (bubblewrap; the zygote preloads and allows
                only those and :data:`coevo.sandbox.zygote.STDLIB_PRELOAD`);
                ``"instance_timeout_s"`` bounds each process's start and import of the code as well (a
                module body that never returns ends the evaluation after one such limit).
            timeout_s: wall-clock limit of this evaluation (s); default ``payload["timeout_s"]``, else
                ``limits.timeout_s``.

        Returns:
            EvalResult(valid, metrics=target's dict, error_kind, error, feedback=stderr tail on failure,
            duration_s=wall time). Failures of the candidate never raise.

        Raises:
            TypeError, ValueError: an argument is malformed (the message names it). OSError: the process
            could not start.
        """
        return self.execute(code, function_name, target, payload, timeout_s=timeout_s).result

    def run_response(
        self, text: str, function_name: str, target: str, payload: dict[str, Any]
    ) -> tuple[EvalResult, Extraction]:
        """Extract the code from an LLM response, then :meth:`run` it; an extraction failure becomes an
        invalid EvalResult with error_kind ``parse`` or ``syntax`` (no process is started)."""
        extraction = extract_code(text, function_name)
        if extraction.code is None:
            return EvalResult(valid=False, error_kind=extraction.error, error=extraction.detail), extraction
        return self.run(extraction.code, function_name, target, payload), extraction

    # ------------------------------------------------------------------ the candidate's process
    def _view(self, packages: Sequence[str] | None) -> isolation.WorkerView:
        """What of the host the worker sees with ``packages`` allowed (None: all of site-packages; see
        :func:`coevo.sandbox.isolation.worker_view`); with a package list, its files are read into the
        page cache once per process (:func:`coevo.sandbox.isolation.warm_page_cache`)."""
        view = isolation.worker_view(self.python, self.candidate_path, packages, self.ro_paths)
        if packages is None:  # everything allowed: gigabytes of site-packages, not warmed
            return view
        with _warm_lock:
            if id(view) not in _warmed:  # views are cached for the process's life: ids stay unique
                _warmed.add(id(view))
                isolation.warm_page_cache(view)
        return view

    def launch(
        self,
        code: str,
        function_name: str,
        timeout_s: float,
        tmpdir: str | None,
        cgroup: cgroups.EvaluationCgroup | None = None,
        packages: Sequence[str] | None = None,
    ) -> Launch:
        """How to start a worker for ``code`` (bubblewrap prefix, interpreter, environment, init frame).

        ``timeout_s`` is the evaluation's wall-clock limit (it sets RLIMIT_CPU, :meth:`SandboxLimits.cpu_limit`);
        ``cgroup``: the evaluation's cgroup, joined before bubblewrap starts; ``packages``: the only
        third-party distributions the candidate may import (None: all of site-packages)."""
        limits = self.limits
        marker = uuid.uuid4().hex
        as_root = os.geteuid() == 0
        uid = isolation.evaluation_uid() if (self.bwrap or self.zygote) and as_root else None
        # RLIMIT_NPROC counts every process of the uid: per evaluation only where the uid is the
        # evaluation's own; elsewhere the cgroup's pids.max bounds the evaluation instead when there is one
        nproc = None if (uid is None and cgroup is not None) else int(limits.max_procs)
        init = {
            "op": "init",
            "code": code,
            "function_name": function_name,
            "limits": {
                "memory_mb": int(limits.memory_mb),
                "cpu_s": limits.cpu_limit(timeout_s),
                "max_procs": nproc,
                "max_file_mb": int(limits.max_file_mb),
                "max_open_files": int(limits.max_open_files),
            },
            "drop": [uid, uid] if uid is not None else None,
        }
        seccomp_program, seccomp_slot, spawn = None, None, None
        if self.zygote:
            request = {
                "cgroup": cgroup.procs_files if cgroup is not None else [],
                "uid": uid,
                "limits": init["limits"],
                "network": limits.network,
                "tmp_mb": max(16, 4 * limits.max_file_mb),
                "proc": isolation.proc_stand_in_texts(limits.memory_mb),
                "hostname": isolation.SANDBOX_HOSTNAME,
            }
            spawn = functools.partial(self._zygote(packages).spawn, request)
            argv, env, cwd, mark = [], {}, "/", None
        elif self.bwrap:
            env = isolation.child_env("/tmp", self.candidate_path, self.hash_seed, None)
            cmd = isolation.interpreter_command(self.python, -1, self.site_import, "serve", isolation.WORKER_IN_SANDBOX)
            view = self._view(packages)
            prefix = isolation.bwrap_command(
                self.bwrap,
                view.binds,
                limits.network,
                tmp_mb=max(16, 4 * limits.max_file_mb),
                as_root=as_root,
                seccomp=self.seccomp is not None,
                hidden=view.hidden,
                shown=view.shown,
                proc_files=isolation.proc_stand_ins(limits.memory_mb),
            )
            argv, cwd, mark = cgroups.enter_prefix(cgroup) + prefix + cmd, "/", None
            if self.seccomp is not None:
                seccomp_program, seccomp_slot = self.seccomp, argv.index(isolation.SECCOMP_FD_PLACEHOLDER)
        else:
            env = isolation.child_env(tmpdir, self.candidate_path, self.hash_seed, marker)
            argv = cgroups.enter_prefix(cgroup) + isolation.interpreter_command(
                self.python, -1, self.site_import, "serve"
            )
            cwd, mark = tmpdir, (isolation.MARKER_VAR, marker)
        return Launch(
            argv=argv,
            env=env,
            cwd=cwd,
            reply_slot=len(argv) - 1,
            init=init,
            timeout_s=timeout_s,
            cpu_s=limits.cpu_limit(timeout_s),
            memory_mb=limits.memory_mb,
            isolated=self.bwrap is not None or self.zygote,
            marker=mark,
            max_reply_mb=limits.max_result_mb,
            output_cap=limits.max_output_kb * 1024,
            seccomp=seccomp_program,
            seccomp_slot=seccomp_slot,
            cgroup=cgroup,
            scrub=self._scrub,
            spawn=spawn,
        )

    def start(
        self,
        launch: Launch,
        deadline: float,
        out: CappedBuffer,
        err: CappedBuffer,
        load_deadline: float | None = None,
    ) -> CandidateProcess:
        """Start a worker and load the code; raise CandidateFailure with the load failure (syntax, import,
        parse, ``timeout`` at ``load_deadline`` or ``deadline``, ...) or OSError when the process cannot
        start. ``deadline``: the evaluation's (``perf_counter``); ``load_deadline``: the load's, if earlier."""
        proc = CandidateProcess(launch, deadline, out, err)
        detail = None
        if load_deadline is not None and load_deadline < deadline:
            detail = f"instance time limit of {load_deadline - proc.started:.3g} s reached while loading the code"
        try:
            header, arrays = proc.exchange(encode_frame(launch.init), load_deadline, timeout_detail=detail)
        except BaseException:
            proc.close()
            raise
        if header.get("ok") is not True:
            proc.close()
            kind = header.get("error_kind")
            kind = kind if kind in ("syntax", "import", "memory", "parse", "return_type", "sandbox") else "sandbox"
            raise CandidateFailure(kind, launch.scrub(reply_text(header.get("error"), arrays)))
        proc.load_s = proc.alive_s
        return proc

    def execute(
        self,
        code: str,
        function_name: str,
        target: str,
        payload: dict[str, Any],
        *,
        timeout_s: float | None = None,
        restart: bool = False,
    ) -> SandboxRun:
        """Like :meth:`run`, also returning the captured output and exit status. ``restart``: after a
        call times out or the process dies, the next call starts a fresh process (per-instance accounting)."""
        build_request(code, function_name, target, payload, self.limits)
        if timeout_s is None:
            timeout_s = payload.get("timeout_s")
        limit = float(timeout_s) if timeout_s is not None else self.limits.timeout_s
        if not (limit > 0 and math.isfinite(limit)):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        load_limit = payload.get("instance_timeout_s")
        if load_limit is not None and (
            isinstance(load_limit, bool) or not isinstance(load_limit, (int, float)) or not load_limit > 0
        ):
            raise ValueError(f"payload['instance_timeout_s'] must be a number > 0, got {load_limit!r}")
        packages = payload.get("candidate_packages")
        if packages is not None and (
            not isinstance(packages, (list, tuple)) or not all(isinstance(p, str) and p for p in packages)
        ):
            raise ValueError(f"payload['candidate_packages'] must be a list of package names, got {packages!r}")
        if self.zygote:
            self._zygote(packages)  # started (packages imported) once, before the evaluation's clock starts
        elif self.bwrap:
            self._view(packages)  # listed (and its files warmed) once, before the evaluation's clock starts
        start = time.perf_counter()
        out = CappedBuffer(self.limits.max_output_kb * 1024)
        err = CappedBuffer(self.limits.max_output_kb * 1024)
        try:
            target_fn = resolve_target(target, self.python_path)
        except Exception as exc:  # noqa: BLE001 - a configuration error, reported as the sandbox's
            return SandboxRun(
                EvalResult(
                    valid=False, error_kind="sandbox", error=f"target {target!r}: {type(exc).__name__}: {exc}"[:2000]
                ),
                "",
                "",
                0,
                self.isolation,
                None,
            )
        tmpdir = None if self.bwrap or self.zygote else tempfile.mkdtemp(prefix="coevo-sbx-")
        remote = None
        returncode = 0
        cgroup = None
        try:
            if self.cgroups is not None:
                # bwrap on the host, its PID 1 and the worker come on top of the candidate's processes
                try:
                    cgroup = cgroups.EvaluationCgroup(self.cgroups, self.limits.memory_mb, self.limits.max_procs + 4)
                except OSError as exc:
                    if self.require_cgroups:
                        raise
                    log.warning("no cgroup for this evaluation (%s): its limits are per process", exc)
            launch = self.launch(code, function_name, limit, tmpdir, cgroup, packages)
            deadline = start + limit
            try:  # OSError (the process cannot start) propagates: the caller's problem, not the candidate's
                remote = RemoteFunction(
                    lambda load_by: self.start(launch, deadline, out, err, load_by),
                    deadline,
                    restart=restart,
                    load_timeout_s=load_limit,
                )
            except CandidateFailure as exc:  # the code did not load (syntax, import, ...) or timed out doing so
                result = EvalResult(valid=False, error_kind=exc.error_kind, error=str(exc)[:2000])
            else:
                try:
                    result = _metrics_result(target_fn(remote, payload))
                except CandidateFailure as exc:
                    result = EvalResult(valid=False, error_kind=exc.error_kind, error=str(exc)[:2000])
                except Exception as exc:  # noqa: BLE001 - InvalidReturn / InfeasibleSolution / what the answers caused
                    result = EvalResult(
                        valid=False, error_kind=failure_kind(exc), error=f"{type(exc).__name__}: {exc}"[:2000]
                    )
                finally:
                    remote.close()
                    returncode = remote.proc.returncode if remote.proc and remote.proc.returncode is not None else 0
        finally:
            if cgroup is not None:
                cgroup.close()
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)
        stdout = self._scrub(out.getvalue().decode("utf-8", errors="replace"))
        stderr = self._scrub(err.getvalue().decode("utf-8", errors="replace"))
        result.duration_s = time.perf_counter() - start
        if not result.valid:
            result.feedback = stderr[-800:]
            result.error = self._scrub(result.error) if result.error else result.error
        return SandboxRun(
            result=result,
            stdout=stdout,
            stderr=stderr,
            returncode=returncode,
            isolation=self.isolation,
            worker_s=result.duration_s,
        )


_TARGET_LOCK = threading.Lock()


def resolve_target(target: str, python_path: Iterable[str] = ()) -> Callable[[Any, dict[str, Any]], Any]:
    """Import ``"pkg.mod:func"`` on the trusted side (``python_path`` folders searched first).

    Raises:
        ImportError / AttributeError: the module or function does not exist. TypeError: not callable.
    """
    mod_name, _, func_name = target.partition(":")
    with _TARGET_LOCK:
        extra = [p for p in python_path if p not in sys.path]
        sys.path[:0] = extra
        try:
            module = importlib.import_module(mod_name)
        finally:
            for p in extra:
                with contextlib.suppress(ValueError):
                    sys.path.remove(p)
    fn = getattr(module, func_name)
    if not callable(fn):
        raise TypeError(f"{target} is not callable")
    return fn


def _metrics_result(metrics: Any) -> EvalResult:
    if not isinstance(metrics, dict):
        return EvalResult(
            valid=False, error_kind="return_type", error=f"target returned {type(metrics).__name__}, expected dict"
        )
    from coevo.sandbox.worker import jsonable

    try:
        return EvalResult(valid=True, metrics=jsonable(metrics))
    except TypeError as exc:
        return EvalResult(valid=False, error_kind="return_type", error=f"metrics {exc}")


def build_request(
    code: str, function_name: str, target: str, payload: dict[str, Any], limits: SandboxLimits | None
) -> bytes:
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
    request = {
        "code": code,
        "function_name": function_name,
        "target": target,
        "payload": payload,
        "limits": None
        if limits is None
        else {
            "memory_mb": int(limits.memory_mb),
            "cpu_s": limits.effective_cpu_s,
            "max_procs": int(limits.max_procs),
            "max_file_mb": int(limits.max_file_mb),
        },
    }
    try:
        return json.dumps(request).encode("utf-8", errors="surrogatepass")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"payload must be JSON-serialisable: {exc}") from exc


def interpret(
    out: ProcessOutcome, stderr: str, limits: SandboxLimits | None, isolated: bool
) -> tuple[EvalResult, float | None]:
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
            return EvalResult(
                valid=False, error_kind=kind, error=str(msg.get("error"))[:2000], feedback=tail, duration_s=out.wall_s
            ), worker_s
    if out.timed_out:
        detail = f"wall-clock limit of {limits.timeout_s:g} s reached" if limits else "wall-clock limit reached"
        return EvalResult(valid=False, error_kind="timeout", error=detail, feedback=tail, duration_s=out.wall_s), None
    if out.result_overflow:
        return EvalResult(
            valid=False,
            error_kind="sandbox",
            error="result larger than max_result_mb",
            feedback=tail,
            duration_s=out.wall_s,
        ), None
    rc = out.returncode
    sig = -rc if rc < 0 else (rc - 128 if isolated and rc > 128 else None)
    if sig == signal.SIGXCPU:
        kind, detail = "timeout", f"CPU limit of {limits.effective_cpu_s if limits else '?'} s reached"
    elif any(s in stderr for s in _MEMORY_SIGNS):
        kind, detail = "memory", f"out of memory (limit {limits.memory_mb if limits else '?'} MiB)"
    else:
        how = (
            f"signal {signal.Signals(sig).name}"
            if sig and sig in signal.Signals._value2member_map_
            else f"exit code {rc}"
        )
        last = next((x for x in reversed(stderr.splitlines()) if x.strip()), "")
        kind, detail = "sandbox", f"worker ended with {how} without a result" + (f": {last[:300]}" if last else "")
        if out.result:
            detail = "worker wrote a malformed result"
    return EvalResult(valid=False, error_kind=kind, error=detail, feedback=tail, duration_s=out.wall_s), None


#: The one line logged (once per process) for each isolation measure this host lacks, with what the
#: fallback still guarantees (docs/sandbox.md, "Fallbacks").
FALLBACKS = {
    "bwrap": "sandbox: no usable bubblewrap ({reason}): no filesystem, network, namespace or seccomp "
    "isolation; still rlimits, own process group, marker kill, private temp dir, wall-clock limit, "
    "trusted-side scoring -- use only for code you trust",
    "seccomp": "sandbox: no seccomp filter ({reason}): keyring, namespace, mount, page-cache, Linux AIO, "
    "inotify / fanotify, file-lock, sysinfo and socket-family calls are not refused (concurrent evaluations can "
    "signal each other through locks and watches on the shared view); still namespaces, read-only narrow view, "
    "unprivileged uid, limits, RLIMIT_NOFILE",
    "cgroups": "sandbox: no writable cgroup hierarchy: memory, CPU and process limits are per process "
    "(RLIMIT_AS, RLIMIT_CPU, RLIMIT_NPROC), not per evaluation; the wall-clock limit and the final kill "
    "still end everything an evaluation started",
    "root": "sandbox: not root: every evaluation runs as uid 65534 of a user namespace mapped to this user, "
    "so RLIMIT_NPROC counts this user's processes together; the keyring is refused by seccomp",
    "zygote": "sandbox: zygote isolation (the default) not usable: this host lacks {missing}; using bubblewrap, "
    "whose view binds host files (their dentries, page cache, locks and watches stay shared: docs/sandbox.md, threat model); "
    "every other measure holds",
    "ldd": "sandbox: no ldd: the interpreter's library folders are bound whole instead of the libraries it "
    "loads; still no /usr/bin, compiler or host Python",
}
_warned: set[str] = set()


def _warn_once(key: str, line: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(line)

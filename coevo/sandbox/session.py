"""The trusted side of a candidate's evaluation: drive its step server and treat every reply as data.

:class:`CandidateProcess` is one running worker (:mod:`coevo.sandbox.worker`, ``serve`` mode) with the
candidate's code loaded. One thread drives it with a single ``poll`` loop over the request pipe (stdin),
the reply pipe, stdout, stderr and a pidfd, so writes never block, output is drained while waiting (capped,
head and tail kept), the exit is seen at once, and the wall-clock deadline is exact.
:class:`RemoteFunction` makes it look like the candidate's function to a trusted target: each call sends
the arguments (read-only arrays once, as constants) and returns the decoded reply (:mod:`coevo.sandbox.wire`),
or raises :class:`~coevo.sandbox.errors.CandidateFailure` (timeout, death, malformed reply, or the kind of
the exception the function raised). A reply is read only up to what the called function can return
(:meth:`RemoteFunction.accept_replies`): a padded one fails the candidate before the trusted process parses
it, and an output flood is drained at a bounded rate (:data:`OUTPUT_DRAIN_RATE`), so what the candidate
sends costs the trusted process about what an honest evaluation costs (issue 45). The loop also wakes at a
bounded rate whatever the candidate writes (issue 54): an output stream is read in large chunks at most
once per :data:`OUTPUT_WAKE_S`, a reply that arrives in pieces is read again after a pause that doubles
per piece, and every small wake-up lengthens the following pauses (:data:`SMALL_WAKE_BYTES`), so a process
trickling one byte at a time (and waiting until it is read) gets a few hundred wake-ups in a whole
evaluation instead of one per byte.

Why scores cannot be forged: the objective and every feasibility check run in the trusted process, on its
own copy of the instance; the candidate's process only ever answers "which node / item / bin next" (or
returns a priority vector), and each answer is checked before it is applied. Whatever the candidate does
to its own process (patch numpy or builtins, write anything to any descriptor, exit, fork) changes at
most its own answers, which are validated like any others, or ends its evaluation as invalid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coevo.sandbox.errors import CandidateFailure
from coevo.sandbox.process import DRAIN_S, CappedBuffer, kill_marked, spawn_with_pipe
from coevo.sandbox.seccomp import filter_fd as seccomp_fd
from coevo.sandbox.wire import FrameReader, MalformedFrame, decode_value, encode_frame, reply_text

_CHUNK = 65536
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
#: Read-only array arguments at least this large are sent once and referenced afterwards.
CONST_MIN_BYTES = 1024
#: Constants kept per process (least recently used dropped first).
CONST_SLOTS = 16
#: Bytes of stdout / stderr (each) a process may write at its own pace; beyond them they are drained at
#: :data:`OUTPUT_DRAIN_RATE`: what it writes past the kept output (``Launch.output_cap``) is dropped
#: anyway, and reading an endless flood at the candidate's pace would cost the trusted process CPU in
#: proportion (32 MiB: about 20 ms of it). The candidate's writes block meanwhile, on its own clock.
OUTPUT_FREE_BYTES = 32 << 20
#: Rate (bytes/s) at which a stream is drained past :data:`OUTPUT_FREE_BYTES` (a few ms of CPU per second).
OUTPUT_DRAIN_RATE = 4 << 20
#: Shortest interval between two reads of one output stream (s).
OUTPUT_WAKE_S = 0.05
#: A wake-up that reads fewer bytes than this (from an output stream, or a piece of a reply that does not
#: complete it) is a *small* one: each small wake-up of a process lengthens the next pause of that stream
#: by :data:`SMALL_WAKE_GROWTH` of its base, so a process trickling one byte at a time (and waiting until
#: it is read) gets about ``sqrt(2 * 20 * T / base)`` wake-ups in ``T`` seconds instead of one per byte. An
#: honest writer is never slowed: the pause grows only while less than this arrives between two reads,
#: and the pipe (:data:`PIPE_BYTES`) holds four times as much.
SMALL_WAKE_BYTES = 64 << 10
SMALL_WAKE_GROWTH = 1 / 20
#: Most bytes read from one output stream per wake-up.
OUTPUT_READ_BYTES = 1 << 20
#: Capacity asked for the stdout, stderr and reply pipes (``F_SETPIPE_SZ``; best effort, the kernel's
#: default of 64 KiB where refused).
PIPE_BYTES = 256 << 10
#: Base pause (s) before the reply pipe is read again after a piece that did not complete the reply; it
#: doubles per piece of the same reply up to :data:`OUTPUT_WAKE_S` (grown as above). An honest reply arrives
#: whole in one read (the worker writes it at once) or, larger than the pipe, in pipes' worth read at once.
REPLY_PAUSE_S = 0.0002
_F_SETPIPE_SZ = 1031  # linux/fcntl.h (F_LINUX_SPECIFIC_BASE + 7)
#: Largest JSON header of a reply the trusted side parses (bytes), unless the target accepts more
#: (:meth:`RemoteFunction.accept_replies`): an honest reply's header names a scalar or an array in a few
#: dozen bytes, whatever shape the heuristic returned (the worker sends lists and tuples of Python or numpy
#: numbers, nested or not, and failure texts as arrays), and parsing 512 bytes of the worst JSON (about
#: 40 ns a byte) costs less than the rest of a call. What a reply may carry beyond it is sized from the call's
#: arguments (:data:`REPLY_BYTES_PER_ELEMENT`).
REPLY_HEADER_BYTES = 512
#: Array bytes a reply may carry beyond what the call's arguments allow (a failure text: at most 1500).
REPLY_TEXT_BYTES = 4096
#: Array bytes a reply may carry per element of the call's arguments: a heuristic returns at most one
#: float64 per number it was given (BPP: one priority per bin; a construction loop: a tour shorter than
#: its distance matrix).
REPLY_BYTES_PER_ELEMENT = 8


@dataclass
class Launch:
    """How to start one worker process.

    Attributes:
        argv: the command; ``argv[reply_slot]`` is replaced by the reply pipe's fd number.
        env: complete environment. cwd: working directory (of the launcher, e.g. bwrap).
        init: the init frame's header (code, function_name, limits, drop).
        timeout_s: wall-clock limit named in timeout messages (s). cpu_s: RLIMIT_CPU (s) for messages.
        memory_mb: RLIMIT_AS (MiB) for messages. isolated: bwrap is in front (exit codes above 128 are
        signals). marker: ``(variable, token)`` to find escaped processes (no bwrap).
        max_reply_mb: largest reply frame accepted (MiB). output_cap: bytes kept per stdout / stderr.
        seccomp: the filter program (:mod:`coevo.sandbox.seccomp`) whose fd replaces ``argv[seccomp_slot]``
        at each start, or None. cgroup: the evaluation's :class:`~coevo.sandbox.cgroups.EvaluationCgroup`
        (its OOM count names a memory failure), or None. scrub: removes host paths from failure text.
        spawn: starts the worker instead of ``argv`` (:mod:`coevo.sandbox.zygote`): returns ``(process,
        reply pipe read end, fd readable at its exit)``; the process has ``kill()`` for everything it started.
    """

    argv: list[str]
    env: dict[str, str]
    cwd: str
    reply_slot: int
    init: dict[str, Any]
    timeout_s: float
    cpu_s: int | None = None
    memory_mb: int | None = None
    isolated: bool = False
    marker: tuple[str, str] | None = None
    max_reply_mb: int = 8
    output_cap: int = 65536
    popen_kwargs: dict[str, Any] = field(default_factory=dict)
    seccomp: bytes | None = None
    seccomp_slot: int | None = None
    cgroup: Any = None
    scrub: Callable[[str], str] = field(default=lambda text: text)
    spawn: Callable[[], tuple[Any, int, int]] | None = None


class CandidateProcess:
    """One worker process serving calls of the candidate's function (see the module docstring).

    Args:
        launch: how to start it. deadline: ``time.perf_counter()`` value after which everything times out.
        stdout, stderr: capped buffers the output goes to (shared across restarts).

    Raises:
        OSError: the process could not be started.
    """

    def __init__(self, launch: Launch, deadline: float, stdout: CappedBuffer, stderr: CappedBuffer):
        self.launch = launch
        self.deadline = deadline
        self.out, self.err = stdout, stderr
        self.reader = FrameReader(max_header=REPLY_HEADER_BYTES, max_frame=4 + REPLY_HEADER_BYTES + REPLY_TEXT_BYTES)
        self.returncode: int | None = None
        self.started = time.perf_counter()
        kwargs = dict(launch.popen_kwargs)
        argv, pass_fds, filter_fd = list(launch.argv), tuple(kwargs.pop("pass_fds", ())), None
        if launch.spawn is not None:
            self.proc, self.reply_fd, self.pidfd = launch.spawn()
        elif launch.seccomp is not None:
            filter_fd = seccomp_fd(launch.seccomp)  # bwrap reads it once: a fresh pipe per start
            argv[launch.seccomp_slot] = str(filter_fd)
            pass_fds = (*pass_fds, filter_fd)
        if launch.spawn is None:
            try:
                self.proc, self.reply_fd, self.pidfd = spawn_with_pipe(
                    argv, launch.reply_slot, env=launch.env, cwd=launch.cwd, pass_fds=pass_fds, **kwargs
                )
            finally:
                if filter_fd is not None:
                    os.close(filter_fd)
        #: seconds from the start to the reply to the init frame (start-up and the code's import)
        self.load_s: float | None = None
        self.fd_in, self.fd_out, self.fd_err = (
            self.proc.stdin.fileno(),
            self.proc.stdout.fileno(),
            self.proc.stderr.fileno(),
        )
        for fd in (self.fd_in, self.fd_out, self.fd_err, self.reply_fd):
            os.set_blocking(fd, False)
        for fd in (self.fd_out, self.fd_err, self.reply_fd):
            with contextlib.suppress(OSError):  # refused above /proc/sys/fs/pipe-max-size or the user's pipe quota
                fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
        self.poller = select.poll()
        self.readers = {self.fd_out, self.fd_err, self.reply_fd}
        for fd in (*self.readers, self.pidfd):
            self.poller.register(fd, select.POLLIN)
        self.pending = b""
        self.exited = False
        self.closed = False
        self.writing = False
        self._seen = {self.fd_out: 0, self.fd_err: 0}  # bytes read per output stream
        self._paused: dict[int, float] = {}  # output / reply fd -> perf_counter when it is read again
        self._reply_pieces = 0  # small reads of the reply pipe since the last complete reply
        self._reply_fresh = False  # the reply pipe was read since the reader was last asked for a frame
        self._small = {self.fd_out: 0, self.fd_err: 0, self.reply_fd: 0}  # small wake-ups per pipe

    # ------------------------------------------------------------------ low level
    def _read(self, fd: int) -> None:
        """Read what ``fd`` holds: the reply pipe whole (up to the reader's bound), an output stream up to
        :data:`OUTPUT_READ_BYTES`, after which that stream is left unpolled for :data:`OUTPUT_WAKE_S` (longer
        past :data:`OUTPUT_FREE_BYTES`: :data:`OUTPUT_DRAIN_RATE`)."""
        budget = OUTPUT_READ_BYTES if fd != self.reply_fd else self.reader.max_frame + 4 + _CHUNK
        got = 0
        while got < budget:
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.poller.unregister(fd)
                self.readers.discard(fd)
                self._paused.pop(fd, None)
                return
            got += len(data)
            if fd == self.reply_fd:
                self.reader.feed(data)  # MalformedFrame when it floods
                self._reply_fresh = True
            else:
                (self.out if fd == self.fd_out else self.err).add(data)
                self._seen[fd] += len(data)
            if len(data) < _CHUNK:
                break  # drained
        small = 0 < got < SMALL_WAKE_BYTES
        if fd == self.reply_fd:
            self._reply_pieces += small  # counted as small once it turns out not to complete the reply
        elif got and not self.closed:
            self._small[fd] += small
            pause = self._wake_s(fd)
            if self._seen[fd] > OUTPUT_FREE_BYTES:  # a flood: read it at a bounded rate
                pause = max(pause, got / OUTPUT_DRAIN_RATE)
            self._pause(fd, pause)

    def _wake_s(self, fd: int) -> float:
        """The pause (s) after a read of ``fd``: :data:`OUTPUT_WAKE_S`, grown by its small wake-ups."""
        return OUTPUT_WAKE_S * (1 + SMALL_WAKE_GROWTH * self._small[fd])

    def _pause(self, fd: int, seconds: float) -> None:
        """Leave ``fd`` unpolled for ``seconds`` (:meth:`_resume_output` polls it again)."""
        if fd not in self._paused:
            self.poller.unregister(fd)
        self._paused[fd] = time.perf_counter() + seconds

    def _resume_output(self, now: float) -> float:
        """Poll again the streams whose pause is over; returns the seconds until the next one ends."""
        nearest = 3600.0
        for fd, until in list(self._paused.items()):
            if until <= now or self.closed:
                del self._paused[fd]
                self.poller.register(fd, select.POLLIN)
            else:
                nearest = min(nearest, until - now)
        return nearest

    def _write_pending(self) -> None:
        try:
            n = os.write(self.fd_in, self.pending)
        except BlockingIOError:
            return
        except (BrokenPipeError, OSError):
            n = len(self.pending)  # it closed its stdin: the reply (or its absence) tells the rest
        self.pending = self.pending[n:]

    def _failure_after_exit(self) -> CandidateFailure:
        self._reap()
        rc = self.returncode if self.returncode is not None else -1
        stderr = self.err.getvalue().decode("utf-8", errors="replace")
        sig = -rc if rc < 0 else (rc - 128 if self.launch.isolated and rc > 128 else None)
        if sig == signal.SIGXCPU:
            return CandidateFailure("timeout", f"CPU limit of {self.launch.cpu_s} s reached")
        if any(s in stderr for s in _MEMORY_SIGNS) or (
            self.launch.cgroup is not None and self.launch.cgroup.oom_killed()
        ):
            return CandidateFailure("memory", f"out of memory (limit {self.launch.memory_mb} MiB)")
        how = (
            f"signal {signal.Signals(sig).name}"
            if sig and sig in signal.Signals._value2member_map_
            else f"exit code {rc}"
        )
        last = next((x for x in reversed(stderr.splitlines()) if x.strip()), "")
        return CandidateFailure(
            "sandbox",
            f"worker ended with {how} without a result" + (f": {self.launch.scrub(last)[:300]}" if last else ""),
        )

    def exchange(
        self, data: bytes, deadline: float | None = None, expect_reply: bool = True, timeout_detail: str | None = None
    ) -> tuple[dict[str, Any], list[np.ndarray]] | None:
        """Send ``data`` (after anything queued) and, with ``expect_reply``, return the next reply frame.

        Raises:
            CandidateFailure: ``timeout`` at the deadline (``min(deadline, self.deadline)``; the process is
                killed), ``sandbox`` when the process ended without a (complete) reply or sent a malformed
                one, ``memory`` / ``timeout`` when it died of its memory / CPU limit.
        """
        if self.closed:
            raise CandidateFailure("sandbox", "the candidate's process was already closed")
        self.pending += data
        if not expect_reply:
            if self.pending and not self.exited:
                self._write_pending()
            return None
        end = self.deadline if deadline is None else min(deadline, self.deadline)
        while True:
            if self.exited and self.pending:
                self.pending = b""  # nobody will read it; a reply it wrote before exiting may still be buffered
            if not self.pending:
                try:
                    frame = self.reader.next()
                except MalformedFrame as exc:
                    self.close()
                    raise CandidateFailure("sandbox", f"malformed reply: {exc}") from None
                if frame is not None:
                    self._reply_pieces = 0
                    self._reply_fresh = False
                    return frame
                if self._reply_fresh and self._reply_pieces and self.reply_fd in self.readers:
                    # a small piece of a reply: wait for more before reading again
                    self._reply_fresh = False
                    self._small[self.reply_fd] += 1
                    first = REPLY_PAUSE_S * 2 ** min(self._reply_pieces - 1, 16)
                    self._pause(self.reply_fd, min(first, self._wake_s(self.reply_fd)))
            if self.exited and self.reply_fd not in self.readers:
                raise self._failure_after_exit()
            now = time.perf_counter()
            remaining = end - now
            if remaining <= 0:
                self.close()
                detail = timeout_detail or f"wall-clock limit of {self.launch.timeout_s:g} s reached"
                raise CandidateFailure("timeout", detail)
            if self.pending and not self.writing and not self.exited:
                self.poller.register(self.fd_in, select.POLLOUT)
                self.writing = True
            wake = self._resume_output(now) if self._paused else 3600.0
            for fd, _ev in self.poller.poll(min(remaining, wake, 3600.0) * 1000):
                if fd == self.pidfd:
                    self.exited = True
                    self.poller.unregister(self.pidfd)
                    self._kill()  # its group too: nothing may write replies after it
                    if self.writing:
                        self.poller.unregister(self.fd_in)
                        self.writing = False
                elif fd == self.fd_in:
                    self._write_pending()
                    if not self.pending:
                        self.poller.unregister(self.fd_in)
                        self.writing = False
                elif fd in self.readers:
                    try:
                        self._read(fd)
                    except MalformedFrame as exc:
                        self.close()
                        raise CandidateFailure("sandbox", f"malformed reply: {exc}") from None

    # ------------------------------------------------------------------ teardown
    def _kill(self) -> None:
        if self.launch.spawn is not None:  # a zygote's worker: its PID namespace dies with it
            self.proc.kill()
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # not reaped yet, so its pid still names the group
        except (ProcessLookupError, PermissionError):
            pass
        if self.launch.marker:
            kill_marked(*self.launch.marker)

    def _reap(self) -> None:
        if self.returncode is None:
            self._kill()
            self.returncode = self.proc.wait()

    def close(self) -> None:
        """Kill the process and everything it started, reap it, and drain what its pipes still hold."""
        if self.closed:
            return
        self.closed = True
        self._reap()
        with contextlib.suppress(KeyError, ValueError):
            self.poller.unregister(self.pidfd)
        os.close(self.pidfd)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.readers.discard(self.reply_fd)
        if self._paused.pop(self.reply_fd, None) is None:
            with contextlib.suppress(KeyError, ValueError):
                self.poller.unregister(self.reply_fd)
        self._resume_output(time.perf_counter())  # what the killed process left in its pipes, once
        # Until every writer is gone (EOF) or DRAIN_S: processes of the evaluation may still be dying (a zygote's
        # worker namespace ends a few ms after its child is killed); a pause that doubles after every round
        # that read little keeps a one-byte writer from costing a wake-up per byte meanwhile.
        drain_until = time.perf_counter() + DRAIN_S
        pause = REPLY_PAUSE_S
        while self.readers - {self.reply_fd} and time.perf_counter() < drain_until:
            seen = sum(self._seen.values())
            for fd, _ev in self.poller.poll(max(0.0, drain_until - time.perf_counter()) * 1000):
                if fd in self.readers:
                    self._read(fd)
            if sum(self._seen.values()) - seen < SMALL_WAKE_BYTES and self.readers - {self.reply_fd}:
                time.sleep(max(0.0, min(pause, drain_until - time.perf_counter())))
                pause = min(2 * pause, OUTPUT_WAKE_S)
        self.proc.stdout.close()
        self.proc.stderr.close()
        os.close(self.reply_fd)

    @property
    def alive_s(self) -> float:
        return time.perf_counter() - self.started


class RemoteFunction:
    """The candidate's function as seen by a trusted target: ``fn(*args)`` runs in the candidate's process.

    Arguments may be JSON scalars, lists, dicts and numpy arrays (bool, int, uint, float dtypes). A
    read-only array of at least :data:`CONST_MIN_BYTES` bytes is sent once and referenced afterwards (the
    caller promises it does not change; keep a distance matrix read-only, pass per-step arrays writable).
    The callee gets fresh writable copies of every argument on every call. The return value is decoded
    from the reply: JSON scalars, lists, dicts, and read-only numpy arrays for returned arrays.

    Args:
        spawn: ``spawn(load_deadline)`` starts a new :class:`CandidateProcess` with the code loaded by
            ``load_deadline`` (a ``perf_counter`` value), or raises CandidateFailure with the failure of
            loading it (syntax, import, a ``timeout`` at the load deadline, ...).
        deadline: the evaluation's overall ``perf_counter`` deadline.
        restart: start a fresh process for the next call after a call timed out or the process died
            (per-instance accounting, ``keep_going``); False: every later call fails the same way.
        load_timeout_s: wall-clock limit of each process's start and load (s; the per-instance limit of
            the caller); None: only ``deadline``.
    """

    is_remote_function = True

    def __init__(
        self,
        spawn: Callable[[float], CandidateProcess],
        deadline: float,
        restart: bool = False,
        load_timeout_s: float | None = None,
    ):
        self._spawn = spawn
        self.deadline = deadline
        self.restart = restart
        self.load_timeout_s = load_timeout_s
        self.proc: CandidateProcess | None = spawn(self._load_deadline())
        self._consts: dict[int, tuple[np.ndarray, int]] = {}  # id(array) -> (array kept alive, const id)
        self._next_const = 0
        self._broken: CandidateFailure | None = None
        self._limit_end: float | None = None
        self._limit_s: float | None = None
        self._drivers: dict[str, int] = {}
        self.calls = 0
        self._charged: set[int] = set()
        self._accept: tuple[int, int] | None = None
        self._elements = 0  # numbers in the arguments of the call being encoded

    def accept_replies(self, header_bytes: int, array_bytes: int) -> None:
        """Accept replies of up to ``header_bytes`` of JSON header and ``array_bytes`` of array data, for
        targets whose function returns JSON trees (text, dicts; e.g. :func:`coevo.sandbox.targets.call_cases`).
        By default a reply may hold :data:`REPLY_HEADER_BYTES` of header and :data:`REPLY_TEXT_BYTES` +
        :data:`REPLY_BYTES_PER_ELEMENT` bytes of arrays per number in the call's arguments (arrays counted by
        their size, constants included): what a heuristic can return in any honest shape (the worker sends
        numbers as arrays), at a parsing cost of a few dozen microseconds whatever the reply holds. A larger reply is a ``sandbox`` failure of
        the candidate, refused before it is parsed; the worker, told the bounds, reports an honest oversized
        return as ``return_type`` first."""
        self._accept = (int(header_bytes), int(array_bytes))

    def _reply_bounds(self) -> tuple[int, int]:
        """(largest header, largest array bytes) accepted for the reply to the call just encoded."""
        if self._accept is not None:
            return self._accept
        return REPLY_HEADER_BYTES, REPLY_TEXT_BYTES + REPLY_BYTES_PER_ELEMENT * self._elements

    def _encode(self, value: Any, blobs: list[np.ndarray], prelude: list[bytes]) -> Any:
        self._elements += 1
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, str):
            self._elements += len(value) // REPLY_BYTES_PER_ELEMENT
            return value
        if isinstance(value, np.ndarray):
            self._elements += value.size
            arr = value if value.dtype.kind in "biuf" else value.astype(np.float64)
            if arr.dtype.str not in ("|b1", "|i1", "|u1") and arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            if not value.flags.writeable and value.nbytes >= CONST_MIN_BYTES:
                return {"__const__": self._constant(value, arr, prelude)}
            blobs.append(np.ascontiguousarray(arr))
            return {"__nd__": len(blobs) - 1}
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, dict):
            return {str(k): self._encode(v, blobs, prelude) for k, v in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [
                self._encode(v, blobs, prelude)
                for v in (sorted(value) if isinstance(value, (set, frozenset)) else value)
            ]
        raise TypeError(f"cannot send a {type(value).__name__} to the candidate")

    def _constant(self, value: np.ndarray, arr: np.ndarray, prelude: list[bytes]) -> int:
        key = id(value)
        hit = self._consts.pop(key, None)
        if hit is not None and hit[0] is value:
            self._consts[key] = hit  # most recently used last
            return hit[1]
        cid = self._next_const
        self._next_const += 1
        prelude.append(encode_frame({"op": "const", "id": cid, "value": {"__nd__": 0}}, [np.ascontiguousarray(arr)]))
        self._consts[key] = (value, cid)
        while len(self._consts) > CONST_SLOTS:
            old = next(iter(self._consts))
            _, old_id = self._consts.pop(old)
            prelude.append(encode_frame({"op": "drop", "id": old_id}))
        return cid

    def _ensure_process(self) -> CandidateProcess:
        if self.proc is not None and not self.proc.closed and self._broken is None:
            return self.proc
        if not self.restart and self._broken is not None:
            raise self._broken
        if self.proc is not None:
            self.proc.close()
        if time.perf_counter() >= self.deadline:
            raise CandidateFailure("timeout", "wall-clock limit reached before the next instance")
        self._consts.clear()  # constants and drivers live in a process: a new one starts without them
        self._drivers.clear()
        self._broken = None
        self.proc = self._spawn(self._load_deadline())
        return self.proc

    def _load_deadline(self) -> float:
        """Until when a new process may take to start and load the code: ``load_timeout_s`` from now (the
        per-instance limit: a module body that never returns costs one instance limit), never past the
        evaluation's deadline."""
        if self.load_timeout_s is None:
            return self.deadline
        return min(self.deadline, time.perf_counter() + self.load_timeout_s)

    def take_load_s(self) -> float:
        """Seconds the current process took to start and import the candidate's code, the first time this
        is asked for that process (0.0 afterwards, and for a process that has not loaded): the caller adds
        it to the time of the instance the process serves first, so work done at import time is counted."""
        proc = self.proc
        if proc is None or proc.load_s is None or id(proc) in self._charged:
            return 0.0
        self._charged.add(id(proc))
        return proc.load_s

    def __call__(self, *args: Any) -> Any:
        """``fn(*args)`` answered by the candidate's process (see the class docstring)."""
        return self._request({"op": "call"}, args)

    def construct(self, source: str, *args: Any, entry: str = "construct") -> Any:
        """``entry(fn, *args, name=function_name)`` of the module ``source`` (a problem's construction loop,
        numpy + stdlib), run in the candidate's process: its whole solution, to be checked by the caller."""
        if self.proc is None or self.proc.closed or self._broken is not None:
            self._drivers.clear()
        key = f"{entry}\0{source}"
        prelude = []
        if key not in self._drivers:
            self._drivers[key] = len(self._drivers)
            prelude.append(encode_frame({"op": "driver", "id": self._drivers[key], "source": source, "name": entry}))
        return self._request({"op": "construct", "driver": self._drivers[key]}, args, prelude)

    def _request(self, head: dict[str, Any], args: tuple, prelude: list[bytes] | None = None) -> Any:
        proc = self._ensure_process()
        blobs: list[np.ndarray] = []
        prelude = list(prelude or [])
        self._elements = 0
        tree = [self._encode(a, blobs, prelude) for a in args]
        max_header, max_arrays = self._reply_bounds()
        max_arrays = min(max_arrays, proc.launch.max_reply_mb << 20)
        proc.reader.max_header, proc.reader.max_frame = max_header, 4 + max_header + max_arrays
        # the worker is told the bounds so that an honest oversized return is reported as ``return_type``; the
        # reader above still enforces them on whatever arrives
        bounds = [proc.reader.max_header, proc.reader.max_frame]
        data = b"".join([*prelude, encode_frame({**head, "args": tree, "reply_bounds": bounds}, blobs)])
        detail = None
        if self._limit_end is not None and self._limit_end < proc.deadline:
            detail = f"instance time limit of {self._limit_s:g} s reached"
        self.calls += 1
        try:
            header, arrays = proc.exchange(data, self._limit_end, timeout_detail=detail)
        except CandidateFailure as exc:
            self._broken = exc
            raise
        ok = header.get("ok")
        if ok is True and "value" in header:
            try:
                return decode_value(header["value"], arrays)
            except MalformedFrame as exc:
                self._broken = CandidateFailure("sandbox", f"malformed reply: {exc}")
                proc.close()
                raise self._broken from None
        if ok is False:
            kind = header.get("error_kind")
            kind = kind if kind in ("runtime", "memory", "return_type", "infeasible", "timeout") else "runtime"
            raise CandidateFailure(kind, proc.launch.scrub(reply_text(header.get("error"), arrays)))
        self._broken = CandidateFailure("sandbox", "malformed reply: neither a value nor an error")
        proc.close()
        raise self._broken

    @contextlib.contextmanager
    def limit(self, seconds: float | None) -> Iterator[None]:
        """Within the block, calls are cut off ``seconds`` after entry (CandidateFailure ``timeout``; the
        process is killed, and restarted for the next call when ``restart``). ``None`` = no extra limit.

        With ``restart``, a process that must be replaced (after a timeout or a crash) is started and loads
        the code BEFORE the clock starts: its start-up does not count against the instance's limit (the
        evaluation's own deadline still bounds it; a failure to start is raised here)."""
        if seconds is None:
            yield
            return
        if self.restart:
            self._ensure_process()
        self._limit_end, self._limit_s = time.perf_counter() + float(seconds), float(seconds)
        try:
            yield
        finally:
            self._limit_end = self._limit_s = None

    def close(self) -> None:
        """Kill the candidate's process (idempotent)."""
        if self.proc is not None:
            self.proc.close()

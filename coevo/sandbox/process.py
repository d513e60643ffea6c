"""Drive one worker process: feed stdin, collect capped stdout/stderr and the result pipe, enforce the
wall-clock limit, and kill everything the process started.

One thread drives one process with a single ``poll`` loop over stdin, stdout, stderr, the result pipe and a
pidfd of the child, so the exit is seen the moment it happens (no sleep-polling) and no helper threads are
needed. The child is started with ``start_new_session=True`` (``setsid``: it leads a new process group); once
it has exited or the deadline has passed, the whole group is killed with ``os.killpg(pgid, SIGKILL)`` *before*
the child is reaped, so the group id cannot have been recycled. Processes that left the group (``setsid`` in
the candidate) are found by a marker variable in their environment and killed too (needed only without
bubblewrap; with it, the PID namespace dies with the sandbox).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass

_CHUNK = 65536
#: After the child exits, how long to keep draining pipes that killed grandchildren may still hold (s).
DRAIN_S = 1.0


class CappedBuffer:
    """Keeps the first and last ``cap // 2`` bytes of a stream, counting what was dropped in between."""

    def __init__(self, cap: int):
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.cap - self.cap // 2:
                del self.tail[: len(self.tail) - (self.cap - self.cap // 2)]

    def getvalue(self) -> bytes:
        dropped = self.total - len(self.head) - len(self.tail)
        if dropped <= 0:
            return bytes(self.head + self.tail)
        return bytes(self.head) + f"\n[... {dropped} bytes dropped ...]\n".encode() + bytes(self.tail)


@dataclass
class ProcessOutcome:
    """What a driven process left behind.

    Attributes:
        returncode: the child's exit status as Popen reports it (negative = killed by that signal).
        timed_out: the wall-clock deadline passed and the process group was killed.
        stdout, stderr: captured bytes, at most about ``output_cap`` each (head and tail kept).
        result: bytes read from the result pipe (empty when the worker wrote nothing).
        result_overflow: more than ``result_cap`` bytes arrived on the result pipe (the rest was discarded).
        killed_outside_group: processes found by the marker after the group kill (escaped via setsid).
        wall_s: seconds from spawn to reap.
    """

    returncode: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    result: bytes
    result_overflow: bool = False
    killed_outside_group: int = 0
    wall_s: float = 0.0


def kill_marked(marker_var: str, marker: str, rounds: int = 20) -> int:
    """SIGKILL every process whose environment holds ``marker_var=marker``; repeat until none is left (a
    process forking in a loop can create new ones between scan and kill). Returns how many were killed."""
    needle = f"{marker_var}={marker}".encode()
    killed = 0
    for _ in range(rounds):
        found = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if needle not in fh.read().split(b"\0"):
                        continue
                os.kill(int(name), signal.SIGKILL)
                found += 1
            except (OSError, ValueError):  # gone meanwhile, or not ours to read
                continue
        killed += found
        if not found:
            break
    return killed


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


def spawn_with_pipe(
    cmd: list[str], slot: int, *, env: dict[str, str], cwd: str | None, pass_fds: tuple[int, ...] = (), **popen_kwargs
) -> tuple[subprocess.Popen, int, int]:
    """Start ``cmd`` in a new session with piped stdin / stdout / stderr and the write end of a fresh pipe in
    place of ``cmd[slot]`` (passed to the child along with ``pass_fds``, closed here once it runs).

    Returns:
        ``(proc, read end of the pipe, pidfd of the child)``.

    Raises:
        OSError: the command could not be started (both ends of the pipe are closed then).
    """
    read_fd, write_fd = os.pipe()
    argv = list(cmd)
    argv[slot] = str(write_fd)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(write_fd, *pass_fds),
            env=env,
            cwd=cwd,
            start_new_session=True,
            **popen_kwargs,
        )
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    os.close(write_fd)
    return proc, read_fd, os.pidfd_open(proc.pid)


def run_process(
    cmd: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    stdin_data: bytes,
    result_fd_slot: int,
    timeout_s: float,
    output_cap: int,
    result_cap: int,
    marker: tuple[str, str] | None = None,
) -> ProcessOutcome:
    """Run ``cmd`` (its element ``result_fd_slot`` is replaced by the write end of the result pipe).

    Args:
        cmd: argv; ``cmd[result_fd_slot]`` is a placeholder for the result pipe's fd number.
        env: the complete environment. cwd: working directory.
        stdin_data: bytes written to the child's stdin, which is then closed.
        timeout_s: wall-clock limit (s) from spawn until the child exits.
        output_cap: bytes kept per stdout/stderr stream. result_cap: bytes accepted on the result pipe.
        marker: ``(variable, token)`` set in ``env``; when given, marked processes outside the group are
            killed after the run.

    Raises:
        OSError: the command could not be started (missing executable, fork failure).
    """
    start = time.perf_counter()
    proc, result_r, pidfd = spawn_with_pipe(cmd, result_fd_slot, env=env, cwd=cwd)
    fd_in, fd_out, fd_err = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
    for fd in (fd_in, fd_out, fd_err, result_r):
        os.set_blocking(fd, False)
    buffers = {fd_out: CappedBuffer(output_cap), fd_err: CappedBuffer(output_cap)}
    result = bytearray()
    overflow = False
    poller = select.poll()
    readers = {fd_out, fd_err, result_r}
    for fd in readers | {pidfd}:
        poller.register(fd, select.POLLIN)
    pending = memoryview(stdin_data)
    if pending:
        poller.register(fd_in, select.POLLOUT)
    else:
        proc.stdin.close()

    def read_ready(fd: int) -> None:
        nonlocal overflow
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        if not data:
            poller.unregister(fd)
            readers.discard(fd)
        elif fd == result_r:
            if len(result) + len(data) > result_cap:
                overflow = True
            else:
                result.extend(data)
        else:
            buffers[fd].add(data)

    deadline = start + timeout_s
    timed_out = exited = False
    while not exited:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            timed_out = True
            break
        for fd, _event in poller.poll(remaining * 1000):
            if fd == pidfd:
                exited = True
            elif fd == fd_in:
                try:
                    pending = pending[os.write(fd_in, pending) :]
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    pending = pending[len(pending) :]
                if not pending:
                    poller.unregister(fd_in)
                    proc.stdin.close()
            elif fd in readers:
                read_ready(fd)
    _kill_group(proc.pid)  # the child is not reaped yet, so its pid still names this group
    killed_outside = kill_marked(*marker) if marker else 0
    proc.wait()
    if not proc.stdin.closed:
        proc.stdin.close()
    poller.unregister(pidfd)
    os.close(pidfd)
    drain_until = time.perf_counter() + DRAIN_S
    while readers and time.perf_counter() < drain_until:
        for fd, _event in poller.poll(max(0.0, drain_until - time.perf_counter()) * 1000):
            if fd in readers:
                read_ready(fd)
    proc.stdout.close()
    proc.stderr.close()
    os.close(result_r)
    return ProcessOutcome(
        returncode=proc.returncode,
        timed_out=timed_out,
        stdout=buffers[fd_out].getvalue(),
        stderr=buffers[fd_err].getvalue(),
        result=bytes(result),
        result_overflow=overflow,
        killed_outside_group=killed_outside,
        wall_s=time.perf_counter() - start,
    )

"""One owner per run folder: an exclusive ``flock`` on ``<run>/run.lock`` held for the whole run.

Two processes working on one run folder (a ``--resume`` while the run is still going, two resumes started
together) would sample the same steps twice and race on the checkpoint folder. :class:`RunLock` takes an
exclusive, non-blocking ``fcntl.flock`` on the lock file before the run touches anything, writes the
holder's PID into it, and keeps the descriptor open until the run ends. The kernel drops the lock when the
descriptor is closed, including when the process dies (``kill -9``, OOM), so a crash never leaves a stale
lock: the PID left in the file is informational only. The descriptor is not inherited by child processes
(``O_CLOEXEC``), so a sandbox or worker process outliving the run cannot keep the lock.

Locks are advisory and per host: on a network file system ``flock`` is only as reliable as the file
system's lock support (Linux NFS emulates it with POSIX locks).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from coevo.errors import RunLockedError

LOCK_FILE = "run.lock"


class RunLock:
    """Exclusive ownership of a run folder (module docstring): :meth:`acquire`, then :meth:`release`.

    Args:
        run_dir: the run folder (must exist).
    """

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock or fail at once.

        Raises:
            RunLockedError: another live process holds it; the message names its PID (read from the file).
        """
        if self._fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, host = self._holder(fd)
            os.close(fd)
            who = f"process {pid}" + (f" on {host}" if host and host != socket.gethostname() else "")
            raise RunLockedError(
                f"{self.path.parent} is in use by {who if pid else 'another process'} (lock {self.path}); "
                "wait for it to finish or stop it, then resume",
                str(self.path),
                pid,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    @staticmethod
    def _holder(fd: int, wait_s: float = 1.0) -> tuple[int | None, str | None]:
        """PID and host written by the holder (it writes them right after locking: retry briefly)."""
        deadline = time.monotonic() + wait_s
        while True:
            text = os.pread(fd, 256, 0).decode(errors="replace").split()
            if text and text[0].isdigit():
                return int(text[0]), (text[1] if len(text) > 1 else None)
            if time.monotonic() >= deadline:
                return None, None
            time.sleep(0.02)

    def release(self) -> None:
        """Drop the lock (the file stays; its PID is then stale and ignored)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __del__(self) -> None:  # an abandoned owner (e.g. a loop object dropped without running) lets go
        self.release()

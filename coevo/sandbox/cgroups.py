"""Per-evaluation resource limits with control groups: one cgroup per evaluation holds every process of it.

rlimits are per process (three forks of 500 MiB each hold 1.5 GiB under a 1 GiB RLIMIT_AS) or per user
(RLIMIT_NPROC counts every process of a uid, so concurrent sandboxes share it). A cgroup counts the
evaluation as a whole: memory (resident memory, page cache and the private tmpfs /tmp it writes), the
number of processes and threads, and CPU bandwidth.

Two layouts are handled, whichever this machine writes (:func:`detect`, probed once per process):

- cgroup v2 (``/sys/fs/cgroup`` is a ``cgroup2`` mount): ``<own cgroup>/coevo-<pid>/e<n>`` with
  ``memory.max``, ``memory.swap.max = 0``, ``pids.max`` and ``cpu.max`` (one CPU); the controllers must be
  enabled in the parent's ``cgroup.subtree_control`` (possible when this process's cgroup holds no
  processes other than in leaf children, or is the root of a cgroup namespace);
- cgroup v1 (one hierarchy per controller, e.g. ``/sys/fs/cgroup/memory``): ``<mount>/<own path>/coevo-<pid>-e<n>``
  per controller with ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` when swap is
  accounted), ``pids.max``, and ``cpu.cfs_quota_us = cpu.cfs_period_us`` (one CPU).

The evaluation's first process (a ``/bin/sh`` that then executes bubblewrap) writes itself into the
cgroups before anything else runs (:func:`enter_prefix`), so no process of the evaluation starts outside
them. Where neither layout is writable (no cgroup mount, read-only ``/sys/fs/cgroup`` in a container, not
root and nothing delegated), :func:`detect` returns None and the sandbox falls back to rlimits (see
``docs/sandbox.md``).

A run SIGKILLed mid-evaluation cannot remove its cgroups; the next process's :func:`detect` removes the empty
ones whose owner is gone (:func:`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import re
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_counter = itertools.count()
_lock = threading.Lock()
#: CFS / cpu.max period (µs)
PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupLayout:
    """Where this process may create evaluation cgroups.

    Attributes:
        version: 2 or 1.
        parents: controller -> folder the evaluation cgroups are created in (v2: the single key ``""``).
    """

    version: int
    parents: dict[str, str] = field(default_factory=dict)

    @property
    def description(self) -> str:
        return f"cgroup v{self.version} ({', '.join(sorted(self.parents)) or 'memory, pids, cpu'})"


def _own_paths() -> dict[str, str]:
    """controller (v1 name, or ``""`` for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of each cgroup mount, from /proc/self/mountinfo."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            parts, rparts = left.split(), right.split()
            if len(parts) >= 5 and len(rparts) >= 3 and rparts[0] in ("cgroup", "cgroup2"):
                out.append((parts[4], rparts[0], set(rparts[2].split(","))))
    return out


def _probe(folder: str, files: tuple[str, ...]) -> bool:
    """Whether a child cgroup can be made in ``folder`` and has ``files``."""
    probe = os.path.join(folder, f"coevo-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    try:
        return all(os.path.exists(os.path.join(probe, f)) for f in files)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def _detect_v2(own: dict[str, str], mounts) -> CgroupLayout | None:
    root = next((m for m, t, _ in mounts if t == "cgroup2" and m == "/sys/fs/cgroup"), None)
    if root is None or "" not in own:
        return None
    base = os.path.normpath(root + own[""])
    try:
        available = set(Path(base, "cgroup.controllers").read_text().split())
    except OSError:
        return None
    if not {"memory", "pids", "cpu"} <= available:
        return None
    mine = os.path.join(base, f"coevo-{os.getpid()}")
    try:
        os.makedirs(mine, exist_ok=True)
        enabled = set(Path(base, "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids", "cpu"} <= enabled:
            Path(base, "cgroup.subtree_control").write_text("+memory +pids +cpu")
        Path(mine, "cgroup.subtree_control").write_text("+memory +pids +cpu")
    except OSError as exc:  # EBUSY: this cgroup holds processes; EACCES: not delegated
        log.debug("cgroup v2 at %s not usable: %s", base, exc)
        with contextlib.suppress(OSError):
            os.rmdir(mine)
        return None
    import atexit

    atexit.register(_remove_quietly, mine)  # empty by then: every evaluation removes its own child
    return CgroupLayout(2, {"": mine})


def _remove_quietly(folder: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def _detect_v1(own: dict[str, str], mounts) -> CgroupLayout | None:
    need = {"memory": ("memory.limit_in_bytes",), "pids": ("pids.max",)}
    optional = {"cpu": ("cpu.cfs_quota_us",)}
    parents = {}
    for ctrl, files in {**need, **optional}.items():
        mount = next((m for m, t, opts in mounts if t == "cgroup" and ctrl in opts), None)
        if mount is None or ctrl not in own:
            continue
        folder = os.path.normpath(mount + own[ctrl])
        if _probe(folder, files):
            parents[ctrl] = folder
    if not all(c in parents for c in need):
        return None
    return CgroupLayout(1, parents)


#: a stale cgroup is removed only when older than this (s): :func:`sweep_stale`
STALE_AGE_S = 60.0
#: names of the cgroups this module makes (v2 ``coevo-<pid>``, v1 ``coevo-<pid>-e<n>``, the probe's): owner pid
_OWNED = re.compile(r"coevo-(?:probe-)?(\d+)(?:-e\d+)?")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(parent: str, min_age_s: float = STALE_AGE_S) -> list[str]:
    """Remove the empty cgroups in ``parent`` that an earlier coevo process made and could not remove: its
    owner (the pid in the name) is gone, SIGKILLed mid-evaluation (``close`` and the atexit hook never ran).
    Only empty folders go (``rmdir`` refuses others), nothing is killed (the pids in a name may be another PID
    namespace's), and only folders older than ``min_age_s`` (another process may have just made one and not
    entered it yet); a v2 ``coevo-<pid>`` folder's ``e<n>`` children go before it. Returns the folders removed;
    errors are ignored (a busy cgroup, another sweeper: a later run retries)."""
    import time

    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        m = _OWNED.fullmatch(name)
        if m is None or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        top = os.path.join(parent, name)
        with contextlib.suppress(OSError):
            if now - os.stat(top).st_mtime < min_age_s:
                continue
            children = [os.path.join(top, c) for c in os.listdir(top) if re.fullmatch(r"e\d+", c)]
            for folder in [*children, top]:
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
                    removed.append(folder)
    if removed:
        log.info("removed %d stale evaluation cgroup(s) of processes that are gone: %s", len(removed), removed)
    return removed


@functools.cache
def detect() -> CgroupLayout | None:
    """The cgroup layout evaluations can use here, or None (see the module docstring); probed once."""
    if os.environ.get("COEVO_SANDBOX_CGROUPS", "auto") == "off":
        return None
    own, mounts = _own_paths(), _mounts()
    layout = _detect_v2(own, mounts) or _detect_v1(own, mounts)
    if layout is None:
        log.info("no writable cgroup hierarchy: per-evaluation limits fall back to rlimits")
        return None
    for parent in layout.parents.values():  # what SIGKILLed runs left behind (v2: beside this process's coevo-<pid>)
        sweep_stale(parent if layout.version == 1 else os.path.dirname(parent))
    return layout


class EvaluationCgroup:
    """The cgroup(s) of one evaluation, created with its limits; :meth:`close` kills what is left and
    removes them.

    Args:
        layout: from :func:`detect`.
        memory_mb: memory of the whole evaluation (MiB; swap not allowed where it is accounted).
        max_procs: processes and threads of the whole evaluation (bubblewrap's own included).
        cpus: CPU bandwidth (CPUs; 1.0 = one core's worth per period).

    Raises:
        OSError: a cgroup could not be created or a limit not written (the partial cgroups are removed).
    """

    def __init__(self, layout: CgroupLayout, memory_mb: int, max_procs: int, cpus: float = 1.0):
        self.layout = layout
        with _lock:
            n = next(_counter)
        self.dirs: dict[str, str] = {}
        mem = int(memory_mb) << 20
        quota = max(1000, int(PERIOD_US * cpus))
        try:
            if layout.version == 2:
                d = os.path.join(layout.parents[""], f"e{n}")
                os.mkdir(d)
                self.dirs[""] = d
                self._write(d, "memory.max", mem)
                with contextlib.suppress(OSError):  # absent without swap accounting
                    self._write(d, "memory.swap.max", 0)
                self._write(d, "pids.max", int(max_procs))
                self._write(d, "cpu.max", f"{quota} {PERIOD_US}")
            else:
                for ctrl, parent in layout.parents.items():
                    d = os.path.join(parent, f"coevo-{os.getpid()}-e{n}")
                    os.mkdir(d)
                    self.dirs[ctrl] = d
                self._write(self.dirs["memory"], "memory.limit_in_bytes", mem)
                if os.path.exists(os.path.join(self.dirs["memory"], "memory.memsw.limit_in_bytes")):
                    with contextlib.suppress(OSError):
                        self._write(self.dirs["memory"], "memory.memsw.limit_in_bytes", mem)
                self._write(self.dirs["pids"], "pids.max", int(max_procs))
                if "cpu" in self.dirs:
                    self._write(self.dirs["cpu"], "cpu.cfs_period_us", PERIOD_US)
                    self._write(self.dirs["cpu"], "cpu.cfs_quota_us", quota)
        except OSError:
            self.close()
            raise

    @staticmethod
    def _write(folder: str, name: str, value) -> None:
        with open(os.path.join(folder, name), "w") as fh:
            fh.write(str(value))

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes ``0`` into to join this evaluation."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def oom_killed(self) -> bool:
        """Whether the kernel's memory limit of this cgroup killed or refused something."""
        d = self.dirs.get("" if self.layout.version == 2 else "memory")
        if d is None:
            return False
        try:
            if self.layout.version == 2:
                events = dict(line.split() for line in Path(d, "memory.events").read_text().splitlines())
                return int(events.get("oom_kill", 0)) > 0 or int(events.get("max", 0)) > 0
            control = dict(line.split() for line in Path(d, "memory.oom_control").read_text().splitlines())
            return int(control.get("oom_kill", 0)) > 0 or int(Path(d, "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def peak_memory_mb(self) -> float | None:
        """Largest memory use of the evaluation so far (MiB), or None when not reported."""
        d = self.dirs.get("" if self.layout.version == 2 else "memory")
        name = "memory.peak" if self.layout.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int(Path(d, name).read_text()) / (1 << 20)
        except (OSError, ValueError, TypeError):
            return None

    def pids(self) -> list[int]:
        """Processes still in the evaluation's cgroup(s)."""
        out: set[int] = set()
        for d in self.dirs.values():
            with contextlib.suppress(OSError, ValueError):
                out.update(int(x) for x in Path(d, "cgroup.procs").read_text().split())
        return sorted(out)

    def kill(self) -> None:
        """SIGKILL every process of the evaluation (``cgroup.kill`` where the kernel has it)."""
        d = self.dirs.get("")
        if d is not None and os.path.exists(os.path.join(d, "cgroup.kill")):
            with contextlib.suppress(OSError):
                self._write(d, "cgroup.kill", 1)
                return
        for _ in range(20):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """Kill what is left and remove the cgroup(s) (idempotent; a busy cgroup is retried briefly)."""
        import time

        self.kill()
        for d in list(self.dirs.values()):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self.kill()
                    time.sleep(0.01)
        self.dirs.clear()


#: the script of :func:`enter_prefix`: join each cgroup named before ``--``, then execute the rest
_ENTER = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'


def enter_prefix(cgroup: EvaluationCgroup | None) -> list[str]:
    """Command prefix that moves the evaluation's first process into ``cgroup`` before it executes the
    rest of the command (``/bin/sh -c SCRIPT sh PROCS... -- CMD...``); empty for None. The cgroup paths
    travel as arguments, never in the environment the candidate inherits."""
    if cgroup is None:
        return []
    return ["/bin/sh", "-c", _ENTER, "sh", *cgroup.procs_files, "--"]

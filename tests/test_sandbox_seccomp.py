"""Issue 54, item 3: the system calls no heuristic needs are refused, each route tried by candidate code in the
real sandbox (bubblewrap + the seccomp filter of :mod:`coevo.sandbox.seccomp`), and honest heuristics are
unaffected. What each route did before is said in its test (a fresh red team on round two's head).
"""

from __future__ import annotations

import os
import textwrap

import pytest
from support import ERRNO_OF, ISOLATION_MODES, sandbox_in

from coevo.ahd import load_problem
from coevo.ahd.evaluate import evaluate_heuristic
from coevo.sandbox import seccomp
from coevo.sandbox.isolation import bwrap_features, bwrap_status
from coevo.sandbox.runner import Sandbox, SandboxLimits

HAS_BWRAP, BWRAP = bwrap_status()
pytestmark = [
    pytest.mark.usefixtures("private_cache"),
    pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap is not usable here"),
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="the routes' syscall numbers are x86_64's"),
]
CALL = "coevo.sandbox.targets:call_cases"
EPERM = 1
PRELUDE = """
import ctypes, fcntl, mmap, os, resource, struct, sys
libc = ctypes.CDLL(None, use_errno=True)

def sc(*args):
    '''A raw system call: [return value, errno].'''
    ctypes.set_errno(0)
    return [libc.syscall(*args), ctypes.get_errno()]
"""


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    box = Sandbox(SandboxLimits(timeout_s=20, memory_mb=1024))
    if box.seccomp is None:
        pytest.skip(f"{BWRAP} has no --seccomp ({sorted(bwrap_features(BWRAP))})")
    return box


def _values(sandbox: Sandbox, body: str, *args, prelude: str = "") -> dict:
    """The dict ``f(*args)`` of ``body`` (after ``prelude``) returns, run in the sandbox as a heuristic runs
    (numpy allowed)."""
    code = PRELUDE + ERRNO_OF + prelude + textwrap.dedent(body)
    res = sandbox.run(code, "f", CALL, {"cases": [list(args)], "expect": "dict", "candidate_packages": ["numpy"]})
    assert res.valid, res.error
    return res.metrics["values"][0]


def test_linux_aio_and_io_uring_are_refused(sandbox):
    """Before: io_setup reserved events of the host-wide AIO table (one evaluation took all 65,536, and
    io_setup then failed in the next evaluation and for root on the host), and io_submit with RWF_NOWAIT read
    whether a page of a shared file was cached (the refused preadv2's bit). Now every AIO call is EPERM."""
    values = _values(
        sandbox,
        """
        def f():
            ctx = ctypes.c_ulong(0)
            out = {'io_setup': sc(206, 65536, ctypes.byref(ctx))}
            for name, nr in (('io_destroy', 207), ('io_getevents', 208), ('io_submit', 209), ('io_cancel', 210),
                             ('io_pgetevents', 333), ('io_uring_setup', 425), ('io_uring_enter', 426)):
                out[name] = sc(nr, 0, 0, 0, 0, 0)
            return out
        """,
    )
    for name, got in values.items():
        assert got == [-1, EPERM], (name, got)


def test_inotify_and_fanotify_are_refused(sandbox):
    """Before: inotify on a shared read-only file of the view showed one evaluation every open and read of it
    by another (a channel between concurrent evaluations). Now inotify and fanotify cannot be set up."""
    values = _values(
        sandbox,
        """
        def f():
            return {
                'inotify_init': sc(253), 'inotify_init1': sc(294, 0),
                'inotify_add_watch': sc(254, 0, ctypes.c_char_p(os.__file__.encode()), 1),
                'fanotify_init': sc(300, 0, 0), 'fanotify_mark': sc(301, 0, 0, 0, 0, 0),
            }
        """,
    )
    for name, got in values.items():
        assert got == [-1, EPERM], (name, got)


def _shared_file(sandbox: Sandbox, mode: str) -> tuple[Sandbox, str]:
    """The sandbox of ``mode`` and a file its candidate can open read-only that stands for a file every
    evaluation shares: under bubblewrap a bound host file (``os.__file__``); in the zygote's worker, where no
    host file exists (each test checks that), one the candidate writes to its own /tmp first (``PROBE``):
    the route itself must still be refused there."""
    box = sandbox_in(mode, SandboxLimits(timeout_s=20, memory_mb=1024))
    if box.seccomp is None:
        pytest.skip("no seccomp filter")
    return box, os.__file__ if mode == "bwrap" else "/tmp/shared.py"


#: candidate code: ``probe(path, host_path)``: ``path`` opened read-only, written first (8 KiB) where it is not
#: the host file; and whether the host file exists
PROBE = """
def probe(path, host_path):
    if path != host_path:
        with open(path, 'wb') as fh:
            fh.write(b'# shared\\n' * 1024)
    return os.open(path, os.O_RDONLY), os.path.exists(host_path)
"""


@pytest.mark.parametrize("mode", ISOLATION_MODES)
def test_file_locks_and_leases_are_refused_other_fcntl_commands_work(sandbox, mode):
    """Before: a POSIX byte-range lock on a shared read-only file (os.__file__) was seen by a concurrent
    evaluation through F_GETLK, which returns the other process's lock offset: with eval_workers 2 the keyed
    BPP training instances went across (418.6 bins -> 402.0). Now flock and the lock / lease / notify
    commands of fcntl are EPERM; the commands the interpreter uses (F_GETFL, F_GETFD, F_SETFD, F_DUPFD) work.
    In the zygote's worker no host file exists to lock, and its own file's locks are refused the same."""
    box, path = _shared_file(sandbox, mode)
    values = _values(
        box,
        """
        def f(path, host_path):
            fd, host_file = probe(path, host_path)
            lock = struct.pack('hhqqi', fcntl.F_RDLCK, 0, 0, 1, 0)
            out = {
                'flock': errno_of(lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),
                'lockf': errno_of(lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),
                'F_GETLK': errno_of(lambda: fcntl.fcntl(fd, fcntl.F_GETLK, lock)),
                'F_SETLK': errno_of(lambda: fcntl.fcntl(fd, fcntl.F_SETLK, lock)),
                'F_SETLKW': errno_of(lambda: fcntl.fcntl(fd, fcntl.F_SETLKW, lock)),
                'F_OFD_GETLK': errno_of(lambda: fcntl.fcntl(fd, 36, lock)),
                'F_OFD_SETLK': errno_of(lambda: fcntl.fcntl(fd, 37, lock)),
                'F_OFD_SETLKW': errno_of(lambda: fcntl.fcntl(fd, 38, lock)),
                'F_GETLEASE': errno_of(lambda: fcntl.fcntl(fd, 1025)),
                'F_SETLEASE': errno_of(lambda: fcntl.fcntl(fd, 1024, fcntl.F_RDLCK)),
                'F_NOTIFY': errno_of(lambda: fcntl.fcntl(os.open('/tmp', os.O_RDONLY), 1026, 1)),
            }
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
            dup = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
            out['allowed'] = [flags & os.O_ACCMODE, fcntl.fcntl(fd, fcntl.F_GETFD), dup >= 10, os.read(dup, 3) != b'']
            out['host_file'] = host_file
            return out
        """,
        path,
        os.__file__,
        prelude=PROBE,
    )
    assert values.pop("host_file") is (mode == "bwrap"), values
    allowed = values.pop("allowed")
    for name, got in values.items():
        assert got == EPERM, (name, got)
    assert allowed == [os.O_RDONLY, 1, True, True], allowed


@pytest.mark.parametrize("mode", ISOLATION_MODES)
def test_sysinfo_madvise_that_loads_pages_and_host_facts_are_out_of_reach(sandbox, mode):
    """Before: sysinfo(2) gave the host's uptime, load, RAM and process count past the /proc stand-ins;
    madvise(MADV_WILLNEED) (and MADV_POPULATE_READ / _WRITE) loaded pages of a shared file into the page cache;
    /proc/sys/fs/dentry-state counted every lookup on the host (a channel read back exactly); the host name
    was the host's. Now sysinfo and that advice are EPERM (MADV_DONTNEED on its own mapping still works),
    /proc/sys holds only the stand-ins, and the host name is ``sandbox``. In the zygote's worker no host file
    exists whose pages could be loaded, and the same advice on its own file is refused."""
    box, path = _shared_file(sandbox, mode)
    values = _values(
        box,
        """
        def f(path, host_path):
            info = ctypes.create_string_buffer(256)
            fd, host_file = probe(path, host_path)
            m = mmap.mmap(fd, 8192, access=mmap.ACCESS_COPY)
            anon = mmap.mmap(-1, 8192)
            return {
                'sysinfo': sc(99, info),
                'willneed': errno_of(lambda: m.madvise(mmap.MADV_WILLNEED)),
                'populate_read': errno_of(lambda: m.madvise(22)),
                'populate_write': errno_of(lambda: anon.madvise(23)),
                'dontneed': errno_of(lambda: m.madvise(mmap.MADV_DONTNEED)),
                'normal': errno_of(lambda: m.madvise(mmap.MADV_NORMAL)),
                'dentry_state': os.path.exists('/proc/sys/fs/dentry-state'),
                'proc_sys_fs': sorted(os.listdir('/proc/sys/fs')),
                'osrelease': open('/proc/sys/kernel/osrelease').read().strip(),
                'nodename': os.uname().nodename,
                'host_file': host_file,
            }
        """,
        path,
        os.__file__,
        prelude=PROBE,
    )
    assert values["host_file"] is (mode == "bwrap"), values
    assert values["sysinfo"] == [-1, EPERM], values
    assert values["willneed"] == values["populate_read"] == values["populate_write"] == EPERM, values
    assert values["dontneed"] == values["normal"] == 0, values
    assert values["dentry_state"] is False and set(values["proc_sys_fs"]) <= {"file-nr", "inode-nr"}, values
    assert values["osrelease"] == "0.0.0-sandbox" and values["nodename"] == "sandbox", values


@pytest.mark.parametrize("mode", ISOLATION_MODES)
def test_shared_file_mappings_pipe_resizing_and_sync_are_refused(sandbox, mode):
    """Before: a MAP_SHARED mapping of a read-only library file gave a futex keyed by that file's inode, so
    two concurrent evaluations could wait and wake each other through it (FUTEX_WAKE returns how many it
    woke); F_SETPIPE_SZ grew pipes against a per-user quota the trusted side shares when it is not root;
    sync / syncfs started host-wide writeback. Now each is EPERM; private file mappings (how the loader and
    numpy map files), anonymous shared memory and an ordinary fsync of its own file still work. In the zygote's
    worker no host file exists to map, and a shared mapping of its own read-only file is refused the same."""
    box, path = _shared_file(sandbox, mode)
    values = _values(
        box,
        """
        def f(path, host_path):
            fd, host_file = probe(path, host_path)
            r, w = os.pipe()
            own = os.open('/tmp/own', os.O_CREAT | os.O_RDWR)
            os.write(own, b'x')
            private = mmap.mmap(fd, 4096, access=mmap.ACCESS_COPY)
            anon = mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED)
            anon[:2] = b'ok'
            return {
                'shared_file': errno_of(lambda: mmap.mmap(fd, 4096, access=mmap.ACCESS_READ)),
                'shared_own_file': errno_of(lambda: mmap.mmap(own, 1, flags=mmap.MAP_SHARED)),
                'setpipe_sz': errno_of(lambda: fcntl.fcntl(w, 1031, 1 << 20)),
                'sync': sc(162), 'syncfs': sc(306, fd),
                'allowed': [private[:4] != b'', bytes(anon[:2]).decode(), fcntl.fcntl(w, 1032) > 0, os.fsync(own)],
                'host_file': host_file,
            }
        """,
        path,
        os.__file__,
        prelude=PROBE,
    )
    assert values.pop("host_file") is (mode == "bwrap"), values
    assert values.pop("allowed") == [True, "ok", True, None], values
    assert values["shared_file"] == values["shared_own_file"] == values["setpipe_sz"] == EPERM, values
    assert values["sync"] == values["syncfs"] == [-1, EPERM], values


def test_open_files_are_bounded_per_process(sandbox):
    """Before: RLIMIT_NOFILE 20000 was inherited, so 64 processes of one evaluation could hold 1.27 M of the
    host's file table (two concurrent evaluations would exhaust it). Now each process holds at most 256 and
    cannot raise it."""
    values = _values(
        sandbox,
        """
        def f():
            fds, err = [], 0
            try:
                while len(fds) < 1000:
                    fds.append(os.open('/tmp', os.O_RDONLY))
            except OSError as exc:
                err = exc.errno
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
                raised = True
            except (OSError, ValueError):
                raised = False
            return {'limit': list(resource.getrlimit(resource.RLIMIT_NOFILE)), 'opened': len(fds), 'errno': err,
                    'raised': raised}
        """,
    )
    assert values["limit"] == [256, 256] and values["opened"] < 256, values
    assert values["errno"] == 24 and values["raised"] is False, values  # EMFILE


def test_the_filter_refuses_what_the_module_lists():
    """Each refused call of the tables is in the program (its number as a JEQ constant), on both machines."""
    import struct

    for machine in seccomp.ARCHES:
        program = seccomp.build_filter(machine)
        constants = {struct.unpack_from("<HBBI", program, i)[3] for i in range(0, len(program), 8)}
        for name in ("io_setup", "io_submit", "io_getevents", "inotify_init1", "fanotify_init", "flock", "sysinfo"):
            assert seccomp.denied_numbers(machine)[name] in constants, (machine, name)
        assert set(seccomp.FCNTL_DENIED) <= constants and set(seccomp.MADV_DENIED) <= constants


def test_honest_heuristics_are_unaffected(sandbox):
    """The four problems' seed heuristics, and heuristics using what LLM answers import (numpy, math, heapq,
    itertools, random, functools, collections), evaluate as before."""
    for name, size in (("tsp_construct", 20), ("kp_construct", 50), ("cvrp_construct", 20), ("bpp_online", 100)):
        problem = load_problem(name)
        res = evaluate_heuristic(
            problem, problem.seed_heuristic_code(), problem.generate(size, 2, 3), sandbox=sandbox, with_reference=False
        )
        assert res.valid, (name, res.error)
    bpp = load_problem("bpp_online")
    busy = (
        "import heapq, itertools, math, random, functools, collections\nimport numpy as np\n\n"
        "def score(item, bins):\n"
        "    order = heapq.nsmallest(len(bins), range(len(bins)), key=lambda i: bins[i])\n"
        "    c = collections.Counter(itertools.islice(order, 3))\n"
        "    random.seed(0)\n"
        "    w = functools.reduce(lambda a, b: a + b, [math.log1p(x) for x in bins]) + len(c) * 0\n"
        "    return -(bins - item).astype(np.float64) + 0 * w + 0 * np.linalg.norm(bins)\n"
    )
    instances = bpp.generate(100, 2, 3)
    reference = evaluate_heuristic(bpp, bpp.seed_heuristic_code(), instances, sandbox=sandbox, with_reference=False)
    res = evaluate_heuristic(bpp, busy, instances, sandbox=sandbox, with_reference=False)
    assert res.valid and res.objective == reference.objective, res.error

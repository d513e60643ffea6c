"""The zygote isolation mode: candidates run with no host file system object reachable (issue 54, item 2).

A trusted *zygote* process is started once per (interpreter, allowed packages): it imports the standard
library modules heuristics use (:data:`STDLIB_PRELOAD`), the allowed packages with every public submodule
they would load lazily (numpy 2 imports ``random``, ``fft``, ``polynomial``, ... on first use) and the
worker (:mod:`coevo.sandbox.worker`), then waits. Per evaluation (each start of a worker) the trusted side
sends it the worker's pipes over a Unix socket (``SCM_RIGHTS``); it forks a child that

1. starts a session, joins the evaluation's cgroup, unshares mount, PID, IPC, network, UTS and cgroup
   namespaces and forks the worker as PID 1 of the new PID namespace (the child itself only waits for it
   and reports its exit status; it kills it if the trusted process dies);
2. in the worker: puts the pipes on fds 0-3 and closes every other inherited descriptor, makes an empty
   private tmpfs the root (``pivot_root``; the host's mounts are detached, none is bound), with a private
   tmpfs ``/tmp``, ``/dev/{null,zero,full,random,urandom}`` as fresh device nodes and the ``/proc``
   stand-ins (:func:`coevo.sandbox.isolation.proc_stand_ins`) as plain files (no procfs is mounted), sets
   the host name, brings loopback up, reseeds ``random`` (and numpy's global generator), sets the rlimits,
   drops to the evaluation's fresh uid, installs the seccomp filter (:mod:`coevo.sandbox.seccomp`), makes
   every import outside the preloaded set an ``ImportError`` naming the module and the allowed-list setting,
   and only then runs the step server (:func:`coevo.sandbox.worker.serve`), which reads and compiles the
   candidate's code.

So no dentry, page-cache page, lock or watch of a host file can be touched by a candidate, and each start
skips the interpreter's start-up and numpy's import. The trusted side gets the child's pidfd (to kill it)
and a status pipe (readable when it exited, holding the worker's exit status), and drives the worker with
the same :class:`~coevo.sandbox.session.CandidateProcess` as under bubblewrap (``Launch.spawn``). A zygote
that died (crash, ``kill -9``) is started again at the next start; evaluations already running are not its
children's children in any way that matters: they go on and report as usual.

Needs root (mounts, namespaces, uid changes), ``pidfd_open`` and a seccomp table for the machine
(:func:`missing`); where something is missing the runner logs one line and uses bubblewrap.

This file is also the zygote's script: ``python -s -P -S zygote.py SOCKET_FD`` (standard library only, like
the worker).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import select
import signal
import socket
import subprocess
import sys
import threading
import time

#: Standard-library modules imported by the zygote (a candidate can import these, and what they import, and
#: nothing else of the standard library; a name that is missing from this interpreter is skipped). Not here:
#: asyncio (+3 MiB of every worker's address space), modules for files, mail, the web, GUIs, databases
#: other than sqlite3, and the interpreter's tools (pdb, doctest, pydoc, venv, ...).
STDLIB_PRELOAD = (
    "abc", "argparse", "array", "ast", "base64", "binascii", "bisect", "calendar", "cmath", "codecs",
    "collections", "collections.abc", "colorsys", "concurrent.futures", "contextlib", "copy", "copyreg",
    "csv", "ctypes", "dataclasses", "datetime", "decimal", "difflib", "dis", "enum", "errno", "fractions",
    "functools", "gc", "graphlib", "hashlib", "heapq", "hmac", "inspect", "io", "itertools", "json",
    "keyword", "linecache", "locale", "logging", "math", "multiprocessing", "numbers", "operator", "os",
    "pickle", "platform", "pprint", "queue", "random", "re", "reprlib", "resource", "secrets", "select",
    "shutil", "signal", "socket", "sqlite3", "statistics", "string", "struct", "subprocess", "sys",
    "tempfile", "textwrap", "threading", "time", "timeit", "tokenize", "traceback", "types", "typing",
    "unicodedata", "uuid", "warnings", "weakref", "zlib", "_strptime",
    "atexit", "bz2", "ctypes.util", "faulthandler", "fcntl", "fnmatch", "glob", "gzip", "html",
    "importlib.util", "lzma", "mmap", "pathlib", "pty", "sched", "selectors", "shlex", "termios",
    "tracemalloc", "tty", "urllib.parse", "zipfile",
    "__future__", "contextvars", "cProfile", "getopt", "ipaddress", "optparse", "profile", "pstats", "unittest",
    "encodings.ascii", "encodings.latin_1", "encodings.utf_16", "encodings.utf_32", "encodings.utf_8_sig",
    "encodings.raw_unicode_escape", "encodings.unicode_escape", "encodings.idna", "encodings.cp1252",
    "encodings.hex_codec", "encodings.base64_codec",
)  # fmt: skip
#: Submodules of an allowed package that are not preloaded (tests, build tools, deprecated shims).
SKIP_SUBMODULES = ("tests", "testing", "f2py", "distutils", "conftest", "setup", "core", "matlib", "_pyinstaller")
#: What an import outside the preloaded set says (the module, then the allowed packages).
REFUSED = (
    "import of {name!r} refused: the sandbox (zygote isolation) provides only the standard-library modules "
    "of coevo.sandbox.zygote.STDLIB_PRELOAD and the problem's candidate_packages ({packages})"
)

# linux/sched.h, linux/mount.h, linux/prctl.h, linux/seccomp.h, linux/sockios.h
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, SECCOMP_MODE_FILTER = 1, 22, 38, 2
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1
#: the namespaces every worker gets (and a network namespace unless the evaluation allows network)
WORKER_NAMESPACES = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
#: fd of the reply pipe in the worker (0-2: its stdin, stdout, stderr)
REPLY_FD = 3
#: the worker's ``sys.argv[0]`` (as under bubblewrap: :data:`coevo.sandbox.isolation.WORKER_IN_SANDBOX`)
WORKER_IN_SANDBOX = "/coevo-sandbox/worker.py"
#: ``/proc/1/cmdline`` of the worker (a stand-in: what bubblewrap's worker shows, without host paths)
WORKER_COMMAND = ("python3", "-s", "-P", "-S", WORKER_IN_SANDBOX, "serve", str(REPLY_FD))
#: Largest message between the trusted side and a zygote (bytes): a request holds the ``/proc`` stand-ins, whose
#: cpuinfo grows by 1-2 KB per CPU (a 512-CPU host: about 1 MiB); the socket's send buffer is raised to it
#: (``SO_SNDBUFFORCE``, root), past the kernel's default of about 208 KiB
MESSAGE_BYTES = 4 << 20
SO_SNDBUFFORCE = 32  # asm-generic/socket.h
#: Most files and folders in a worker's ``/tmp`` (its tmpfs's ``nr_inodes``; ``size`` bounds only their data)
TMP_INODES = 16384
_DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9)}


def missing() -> list[str]:
    """What this host lacks for the zygote mode (empty: usable)."""
    out = []
    if os.geteuid() != 0:
        out.append("root (mounts, namespaces and a fresh uid per evaluation need it)")
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        out.append("pidfd_open (Linux >= 5.3, Python >= 3.9)")
    if platform.machine() not in PIVOT_ROOT:
        out.append(f"a pivot_root / seccomp table for {platform.machine()}")
    for ns in ("mnt", "pid", "net", "ipc", "uts", "cgroup"):
        if not os.path.exists(f"/proc/self/ns/{ns}"):
            out.append(f"{ns} namespaces")
    if not out:
        failed = _probe_result()
        if failed:
            out.append(f"what a worker's set-up does ({failed}; root without CAP_SYS_ADMIN, or in a container?)")
    return out


@functools.cache
def _probe_result() -> str:
    """Run :func:`probe` in a fresh interpreter (once per process): '' when the host lets a worker be set up
    (namespaces, mounts, a device node, a uid change), else the step that failed."""
    try:
        proc = subprocess.run(
            [sys.executable, "-s", "-P", "-S", os.path.abspath(__file__), "--probe"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd="/",
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"probe: {exc}"
    return "" if proc.returncode == 0 else (proc.stdout.strip() or proc.stderr.strip()[-300:] or "probe failed")


def probe() -> None:
    """The zygote's set-up steps once, in a throw-away process pair (``zygote.py --probe``): unshare the
    namespaces a worker gets, then, as PID 1 of the new PID namespace, make the mounts private, mount a tmpfs,
    create a device node and change uid. Exits 0, or 1 after printing the step that failed."""
    libc = _libc()
    try:
        _check(libc.unshare(WORKER_NAMESPACES | CLONE_NEWNET), "unshare")
        pid = os.fork()
        if pid == 0:
            try:
                _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
                _check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID, b"size=1m,mode=0755"), "mount tmpfs")
                os.mknod("/tmp/null", 0o666 | 0o020000, os.makedev(*_DEVICES["null"]))
                socket.sethostname("probe")
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
            except OSError as exc:
                print(exc, flush=True)
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status) != 0)
    except OSError as exc:
        print(exc, flush=True)
        sys.exit(1)


# =========================================================================================== trusted side
class ZygoteChild:
    """One worker forked by a zygote, as :class:`~coevo.sandbox.session.CandidateProcess` drives it (the
    part of ``subprocess.Popen`` it uses: ``stdin`` / ``stdout`` / ``stderr``, ``pid``, ``wait``, and
    :meth:`kill` for everything the evaluation started)."""

    def __init__(self, pid: int, pidfd: int, stdin_w: int, stdout_r: int, stderr_r: int, status_r: int):
        self.pid, self._pidfd, self.status_fd = pid, pidfd, status_r
        self.stdin = open(stdin_w, "wb", buffering=0)  # noqa: SIM115 - closed by CandidateProcess
        self.stdout = open(stdout_r, "rb", buffering=0)  # noqa: SIM115
        self.stderr = open(stderr_r, "rb", buffering=0)  # noqa: SIM115
        self.returncode: int | None = None
        self._kill_asked: float | None = None  # time.monotonic() of the first kill()

    #: How long :meth:`wait` gives the child, after :meth:`kill`, to SIGKILL the worker and report (s) before
    #: it SIGKILLs the child itself (the worker then dies of its parent-death signal).
    KILL_GRACE_S = 2.0

    def kill(self) -> None:
        """Ask the child to SIGKILL the worker (SIGTERM: its handler kills the worker, the first process of
        its PID namespace, so the kernel kills every other process of the namespace with it, whatever they
        did to their parent-death signal); :meth:`wait` SIGKILLs the child if it has not reported within
        :data:`KILL_GRACE_S`."""
        self._kill_asked = self._kill_asked or time.monotonic()
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def wait(self) -> int:
        """The worker's exit status as bubblewrap reports it (128 + signal when killed; -9 when the child
        itself was killed before it could report)."""
        if self.returncode is not None:
            return self.returncode
        data = b""
        end = time.monotonic() + 30.0
        watch = select.poll()  # poll, not select: descriptors above 1023 in a busy trusted process
        watch.register(self.status_fd, select.POLLIN)
        child_killed = False
        while time.monotonic() < end:
            grace = end if self._kill_asked is None or child_killed else self._kill_asked + self.KILL_GRACE_S
            if not watch.poll(max(0.0, min(end, grace) - time.monotonic()) * 1000):
                if grace < end:
                    self._signal(signal.SIGKILL)  # the child did not report in time
                    child_killed = True  # then wait for its status pipe to close
                    continue
                break
            chunk = os.read(self.status_fd, 64)
            if not chunk:
                break
            data += chunk
        try:
            self.returncode = int(data.decode())
        except ValueError:
            self.returncode = -signal.SIGKILL
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return self.returncode


class Zygote:
    """A running zygote for one interpreter and package list (see the module docstring).

    Args:
        python: the interpreter. env: its whole environment (``PYTHONPATH`` finds the packages).
        packages: distributions to preload. seccomp: the filter program (a worker refuses to start without it,
        as without a uid). site_import: start with ``site``. start_timeout_s: how long the preloading may take.

    Raises:
        OSError: the zygote could not be started or did not report ready.
    """

    def __init__(
        self,
        python: str,
        env: dict[str, str],
        packages: tuple[str, ...],
        seccomp: bytes | None,
        site_import: bool = False,
        start_timeout_s: float = 120.0,
    ):
        self.python, self.env, self.packages, self.seccomp = python, env, packages, seccomp
        self.site_import, self.start_timeout_s = site_import, start_timeout_s
        self._lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.starts = 0
        self._start()

    def _start(self) -> None:
        from coevo.sandbox.isolation import worker_script

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (ours, theirs):  # a request carries /proc/cpuinfo's stand-in: ~1-2 KB per CPU of the host
            with contextlib.suppress(OSError):
                end.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, MESSAGE_BYTES)
        flags = ["-s", "-P"] + ([] if self.site_import else ["-S"])
        try:
            self.proc = subprocess.Popen(
                [self.python, *flags, os.path.abspath(__file__), str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                env=self.env,
                cwd="/",
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.sock = ours
        config = {"worker": str(worker_script()), "packages": list(self.packages), "stdlib": list(STDLIB_PRELOAD)}
        config["seccomp"] = self.seccomp.hex() if self.seccomp else None
        try:
            ours.sendall(json.dumps(config).encode())
            watch = select.poll()
            watch.register(ours, select.POLLIN)
            reply = ours.recv(1 << 16) if watch.poll(self.start_timeout_s * 1000) else b""
            status = json.loads(reply) if reply else {}
        except (OSError, ValueError) as exc:
            status = {"error": str(exc)}
        if status.get("ready") is not True:
            err = b""
            self.close()
            with contextlib.suppress(Exception):
                err = self.proc.stderr.read()[-2000:]
            raise OSError(f"the sandbox zygote did not start: {status.get('error') or err.decode(errors='replace')}")
        self.proc.stderr.close()
        self.missing = status.get("missing", [])
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.sock is not None

    def spawn(self, request: dict) -> tuple[ZygoteChild, int, int]:
        """Fork a worker for ``request`` (``cgroup``: cgroup.procs files to join, ``uid``, ``limits``,
        ``network``, ``tmp_mb``, ``proc``: stand-in texts); return ``(child, reply pipe read end, status
        pipe read end)`` -- the last is what the caller polls to see the exit. A dead zygote is started
        again (once per call).

        Raises:
            OSError: no worker could be forked.
        """
        ends = [os.pipe() for _ in range(5)]  # stdin, stdout, stderr, reply, status
        theirs = [ends[0][0], ends[1][1], ends[2][1], ends[3][1], ends[4][1]]
        ours = [ends[0][1], ends[1][0], ends[2][0], ends[3][0], ends[4][0]]
        try:
            reply, fds = self._exchange(json.dumps(request).encode(), theirs)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        if "pid" not in reply or len(fds) != 1:
            for fd in (*ours, *fds):
                os.close(fd)
            raise OSError(f"the sandbox zygote could not fork: {reply.get('error', reply)}")
        for fd in ours:
            os.set_inheritable(fd, False)
        child = ZygoteChild(int(reply["pid"]), fds[0], ours[0], ours[1], ours[2], ours[4])
        return child, ours[3], ours[4]

    def _exchange(self, message: bytes, fds: list[int]) -> tuple[dict, list[int]]:
        with self._lock:
            for attempt in (0, 1):
                if not self.alive:
                    self.close()
                    self._start()
                try:
                    socket.send_fds(self.sock, [message], fds)
                except OSError:
                    self.close()  # it died before it got the request: once more with a fresh one
                    continue
                try:
                    data, got, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 1)
                except OSError:
                    data, got = b"", []
                if data:
                    return json.loads(data), got
                for fd in got:
                    os.close(fd)
                self.close()  # it died after it got the request: a worker may hold these pipes, so no second try
                raise OSError("the sandbox zygote died while forking a worker")
        raise OSError("the sandbox zygote died twice before it got a request")

    def close(self) -> None:
        """Stop the zygote (running workers go on)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            self.proc.wait()


_zygotes: dict[tuple, Zygote] = {}
_registry_lock = threading.Lock()


def zygote_for(
    python: str, env: dict[str, str], packages: tuple[str, ...], seccomp: bytes | None, site_import: bool = False
) -> Zygote:
    """The zygote of this interpreter, environment and package list, started on first use (one per
    process; stopped at exit)."""
    key = (python, tuple(sorted(env.items())), tuple(packages), seccomp, site_import)
    with _registry_lock:
        zygote = _zygotes.get(key)
        if zygote is None:
            if not _zygotes:
                import atexit

                atexit.register(_close_all)
            zygote = _zygotes[key] = Zygote(python, env, tuple(packages), seccomp, site_import)
        return zygote


def _close_all() -> None:
    for zygote in list(_zygotes.values()):
        zygote.close()


# =========================================================================================== the zygote
def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _preload(stdlib: list[str], packages: list[str]) -> list[str]:
    """Import ``stdlib`` and ``packages`` with their public submodules (two levels); return what failed."""
    import importlib
    import pkgutil
    import warnings

    failed = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in stdlib:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - e.g. sqlite3 without its library: not offered
                failed.append(name)
        for dist in packages:
            try:
                top = importlib.import_module(dist.replace("-", "_"))
            except Exception:  # noqa: BLE001
                failed.append(dist)
                continue
            queue = [(top, 0)]
            while queue:
                module, depth = queue.pop()
                for info in pkgutil.iter_modules(getattr(module, "__path__", None) or []):
                    if info.name.startswith("_") or info.name in SKIP_SUBMODULES:
                        continue
                    try:
                        sub = importlib.import_module(f"{module.__name__}.{info.name}")
                    except Exception:  # noqa: BLE001, S112 - optional parts (needing absent packages)
                        continue
                    if info.ispkg and depth < 1:
                        queue.append((sub, depth + 1))
    return failed


class _Refuse:
    """The last import finder of a worker: nothing can be found on a file system it does not have."""

    def __init__(self, packages: list[str]):
        self.packages = ", ".join(packages) or "none"

    def find_spec(self, name, path=None, target=None):
        raise ModuleNotFoundError(REFUSED.format(name=name, packages=self.packages), name=name)


def _take_fds(fds: list[int]) -> None:
    """The worker's stdin, stdout, stderr and reply pipe on fds 0-3; every other descriptor closed."""
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds[:4]]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.set_inheritable(REPLY_FD, False)  # exec'd grandchildren must not hold the reply pipe
    os.closerange(REPLY_FD + 1, 1 << 20)  # every inherited host descriptor (socket, pidfds, the others' pipes)


def _worker_setup(req: dict, config: dict, libc) -> None:
    """Everything between the fork and the candidate's code, in the worker (PID 1 of its namespace)."""
    import fcntl

    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    # an empty private tmpfs as the root: nothing of the host is mounted below it
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID, b"size=1m,mode=0755"), "mount tmpfs root")
    os.umask(0o022)
    for folder in ("tmp", "dev", "proc", ".old"):
        os.mkdir(f"/tmp/{folder}", 0o755)
    tmp_opts = f"size={int(req['tmp_mb'])}m,nr_inodes={TMP_INODES},mode=1777".encode()
    _check(libc.mount(b"tmpfs", b"/tmp/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, tmp_opts), "mount tmpfs /tmp")
    for name, (major, minor) in _DEVICES.items():
        os.mknod(f"/tmp/dev/{name}", 0o666 | 0o020000, os.makedev(major, minor))
        os.chmod(f"/tmp/dev/{name}", 0o666)
    proc = {**req.get("proc", {}), "1/cmdline": "\0".join(WORKER_COMMAND) + "\0"}
    for name, text in sorted(proc.items()):
        path = f"/tmp/proc/{name}"
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
        os.chmod(path, 0o444)
    _check(libc.syscall(PIVOT_ROOT[platform.machine()], b"/tmp", b"/tmp/.old"), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.old", MNT_DETACH), "umount the host's root")
    os.rmdir("/.old")
    _check(libc.mount(b"none", b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID, None), "remount / ro")
    os.chdir("/tmp")
    socket.sethostname(req.get("hostname", "sandbox"))
    if not req.get("network"):
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))[:18])[1]
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
    import random

    random.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()
    worker = sys.modules["coevo_worker"]
    worker.apply_limits(req["limits"])
    if req.get("uid") is None or not config.get("seccomp"):  # fail closed: never a root or unfiltered candidate
        raise RuntimeError("a zygote's worker needs the evaluation's uid and the seccomp filter")
    worker.drop_privileges([req["uid"], req["uid"]])
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")  # reset by setuid
    import ctypes

    program = bytes.fromhex(config["seccomp"])

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp filter")
    import importlib.machinery

    sys.meta_path[:] = [
        importlib.machinery.BuiltinImporter,
        importlib.machinery.FrozenImporter,
        _Refuse(config["packages"]),
    ]
    sys.path_importer_cache.clear()
    sys.modules["__main__"] = worker  # as when the worker is started as a script
    sys.argv[:] = [WORKER_IN_SANDBOX, "serve", str(REPLY_FD)]


def _fork_worker(req: dict, fds: list[int], config: dict, trusted: int, sock: socket.socket) -> None:
    """The zygote's child for one worker (see the module docstring); never returns."""
    libc = _libc()
    status_w = fds[4]
    try:
        sock.close()
        os.setsid()
        for procs in req.get("cgroup", []):
            with open(procs, "w") as fh:
                fh.write("0")
        _check(libc.unshare(WORKER_NAMESPACES | (0 if req.get("network") else CLONE_NEWNET)), "unshare")
        # the trusted side's kill (SIGTERM): SIGKILL the worker, PID 1 of its namespace, so that the kernel kills
        # every process of the namespace with it (a candidate may have cleared its parent-death signal before
        # the seccomp filter refused that); before the worker exists, just end
        worker_pid = [0]
        signal.signal(
            signal.SIGTERM, lambda *_: os.kill(worker_pid[0], signal.SIGKILL) if worker_pid[0] else os._exit(1)
        )
        pid = os.fork()
        worker_pid[0] = pid
    except BaseException as exc:  # noqa: BLE001 - reported as the worker's setup failure
        _report_setup_failure(fds[3], exc)
        os.write(status_w, b"1")
        os._exit(1)
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        worker = sys.modules["coevo_worker"]
        try:
            _take_fds(fds)
            _worker_setup(req, config, libc)
        except BaseException as exc:  # noqa: BLE001 - never run a candidate without its isolation
            _report_setup_failure(REPLY_FD, exc)
            os._exit(1)
        worker.serve(REPLY_FD, ready=True)
        os._exit(0)
    for fd in fds[:4]:
        os.close(fd)
    watch = select.poll()
    worker_fd = os.pidfd_open(pid)
    watch.register(worker_fd, select.POLLIN)
    watch.register(trusted, select.POLLIN)
    while True:
        events = dict(watch.poll())
        if worker_fd in events:
            break
        if trusted in events:  # the trusted process is gone: nobody reads this evaluation any more
            os.kill(pid, signal.SIGKILL)
            break
    _, status = os.waitpid(pid, 0)
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    os.write(status_w, str(code).encode())
    os._exit(0)


def _report_setup_failure(fd: int, exc: BaseException) -> None:
    with contextlib.suppress(BaseException):
        sys.modules["coevo_worker"].write_failure(fd, "sandbox", f"zygote setup: {type(exc).__name__}: {exc}")


def main(sock_fd: int) -> None:
    """The zygote (see the module docstring): preload, report ready, fork one worker per request."""
    import importlib.util

    sock = socket.socket(fileno=sock_fd)
    config = json.loads(sock.recv(MESSAGE_BYTES))
    spec = importlib.util.spec_from_file_location("coevo_worker", config["worker"])
    worker = importlib.util.module_from_spec(spec)
    sys.modules["coevo_worker"] = worker
    spec.loader.exec_module(worker)
    failed = _preload(config["stdlib"], config["packages"])
    config["packages"] = [p for p in config["packages"] if p not in failed]
    trusted = os.pidfd_open(os.getppid())
    sock.sendall(json.dumps({"ready": True, "missing": failed}).encode())
    waiting = select.poll()
    waiting.register(sock, select.POLLIN)
    while True:
        if not waiting.poll(1000):
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MESSAGE_BYTES, 5)
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)  # the trusted process closed the socket (or died)
        try:
            req = json.loads(data)
            if len(fds) != 5:
                raise ValueError(f"expected 5 descriptors, got {len(fds)}")
            pid = os.fork()
        except (OSError, ValueError) as exc:
            for fd in fds:
                os.close(fd)
            sock.sendall(json.dumps({"error": str(exc)}).encode())
            continue
        if pid == 0:
            try:
                _fork_worker(req, fds, config, trusted, sock)
            finally:
                os._exit(70)  # never back into the zygote's loop, whatever escaped
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        try:
            socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
        finally:
            os.close(pidfd)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass


if __name__ == "__main__":
    probe() if sys.argv[1] == "--probe" else main(int(sys.argv[1]))

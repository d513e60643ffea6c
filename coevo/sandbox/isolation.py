"""How a sandboxed worker process is isolated: the bubblewrap command line, its environment, its import path.

The candidate sees only what it needs (:func:`bwrap_command`): the interpreter and its libraries read-only,
a private temp dir, no network, its own PID namespace, and it runs as an unprivileged user. Pitfalls
handled here, all checked on this machine: bwrap creates the parents of bind targets with mode 0700, which
an unprivileged process cannot enter, so they are created 0755 first; bwrap's ``--uid`` inside a user
namespace started by root still maps to host root (owner permissions on every root-owned file, e.g. a
0640 /etc/shadow), so as root the worker drops to a real unprivileged uid instead; an interpreter under a
0700 home (pyenv in /root) is unreachable for that uid on the host, but reachable at the same path inside
the sandbox, where its parents are 0755.
"""

from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from coevo.resources import package_parent

#: Thread-count variables pinned to 1: BLAS/OpenMP pools started per process cost start-up time and
#: oversubscribe the cores when many evaluations run in parallel.
THREAD_VARS = (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)

#: Environment variable carrying a per-run token; without bubblewrap it finds processes that left the
#: process group (``setsid``) so they can be killed too.
MARKER_VAR = "COEVO_SANDBOX_RUN"


def project_root() -> Path:
    """The folder holding the ``coevo`` package (the repository root for a source checkout)."""
    return package_parent()


def worker_script() -> Path:
    """Absolute path of :mod:`coevo.sandbox.worker`, run as a script so start-up does not import coevo."""
    return Path(__file__).resolve().with_name("worker.py")


@functools.cache
def bwrap_features(bwrap: str) -> frozenset[str]:
    """Options of this bubblewrap that the sandbox uses when present (``--disable-userns``,
    ``--as-pid-1``, ``--seccomp``), read from its ``--help`` once per process."""
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(opt for opt in ("--disable-userns", "--as-pid-1", "--seccomp") if opt in text)


@functools.cache
def bwrap_status(bwrap: str = "bwrap") -> tuple[bool, str]:
    """Whether bubblewrap can start a sandbox here: ``(usable, reason)``; probed once per process.

    bwrap may be installed yet unusable (no user namespaces in a container), so a real ``true`` is run
    under the same namespace flags the sandbox uses.
    """
    path = shutil.which(bwrap)
    if path is None:
        return False, f"{bwrap!r} not found on PATH"
    cmd = [
        path,
        "--unshare-all",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "true",
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{path} failed to start: {exc}"
    if done.returncode != 0:
        return False, f"{path} exited with {done.returncode}: {done.stderr.decode(errors='replace')[:300]}"
    return True, path


def child_pythonpath(extra: Iterable[str | os.PathLike] = ()) -> list[str]:
    """Import path for a worker started with ``-S`` (no ``site``): the project root, ``extra`` (problem
    folders), then the running interpreter's site-packages folders (including folders added by ``.pth``
    files, which ``-S`` would otherwise skip). Order kept, duplicates and missing folders dropped.
    """
    sites = set(site.getsitepackages()) | {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    stdlib = {os.path.dirname(os.__file__)}
    # a .pth file adds folders directly inside site-packages; deeper entries are a package's own additions at
    # import time (``import ray`` puts ``site-packages/ray/thirdparty_files`` on sys.path), which a candidate does
    # not need and which bwrap cannot bind inside the hidden site-packages tmpfs
    added_by_pth = [
        p for p in sys.path if p and os.path.isabs(p) and p not in stdlib and os.path.dirname(p.rstrip("/")) in sites
    ]
    out: list[str] = []
    for entry in [str(project_root()), *map(str, extra), *sorted(sites), *added_by_pth]:
        entry = os.path.abspath(entry)
        if entry not in out and os.path.isdir(entry):
            out.append(entry)
    return out


def site_dirs() -> list[str]:
    """The running interpreter's site-packages folders (and folders ``.pth`` files add inside them): the
    candidate's import path, without the project checkout. When coevo is installed from a wheel its
    "project root" is a site-packages folder itself, which stays (numpy lives there)."""
    project = os.path.abspath(str(project_root()))
    sites = {os.path.abspath(p) for p in site.getsitepackages()}
    return [p for p in child_pythonpath() if p != project or p in sites]


def child_env(tmpdir: str, pythonpath: Sequence[str], hash_seed: int, marker: str | None) -> dict[str, str]:
    """The worker's whole environment (nothing else is inherited).

    ``PATH`` holds the running interpreter's folder and the system folders; ``HOME`` and ``TMPDIR`` point at
    the private temp dir; thread pools are pinned to one thread (:data:`THREAD_VARS`).
    """
    env = {
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": tmpdir,
        "TMPDIR": tmpdir,
        "PYTHONPATH": os.pathsep.join(pythonpath),
        "PYTHONHASHSEED": str(hash_seed),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "LANG": "C.UTF-8",
        "MPLBACKEND": "Agg",
        **{var: "1" for var in THREAD_VARS},
    }
    if marker is not None:
        env[MARKER_VAR] = marker
    return env


#: The unprivileged identity the candidate sees inside a user namespace (``nobody`` / ``nogroup``).
SANDBOX_UID = 65534
SANDBOX_GID = 65534
#: Started as root, each evaluation runs as its own host uid = gid drawn from
#: ``[EVAL_UID_BASE, EVAL_UID_BASE + EVAL_UID_SPAN)`` (:func:`evaluation_uid`): nothing the kernel keeps
#: per user (keyrings, RLIMIT_NPROC's count, signals to "own" processes) is shared between evaluations.
EVAL_UID_BASE = 1 << 24
EVAL_UID_SPAN = 1 << 30
#: The host name the candidate sees (``uname``; its UTS namespace is its own).
SANDBOX_HOSTNAME = "sandbox"
#: Placeholder of the seccomp program's fd in :func:`bwrap_command` (replaced per process start).
SECCOMP_FD_PLACEHOLDER = "SECCOMP_FD"


def evaluation_uid() -> int:
    """A fresh unprivileged host uid for one evaluation (see :data:`EVAL_UID_BASE`)."""
    import secrets

    return EVAL_UID_BASE + secrets.randbelow(EVAL_UID_SPAN)


#: Where the worker script appears inside the sandbox (the only project file the candidate can see).
WORKER_IN_SANDBOX = "/coevo-sandbox/worker.py"
#: The host's /bin, /lib, ... links into /usr (merged /usr), recreated as links; what they point to is
#: bound only where the worker needs it.
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
#: Folders of the standard library a heuristic never needs, covered by an empty tmpfs (its test suite,
#: IDLE, the pip wheels, the static library, Tk; glob patterns).
STDLIB_HIDDEN = ("test", "idlelib", "ensurepip", "tkinter", "turtledemo", "lib2to3", "config-*")


@dataclass(frozen=True)
class WorkerView:
    """What of the host a sandboxed worker sees (:func:`worker_view`).

    Attributes:
        binds: ``{path inside: host path}`` bound read-only (files or folders).
        hidden: folders (inside ``binds``) covered by an empty read-only tmpfs.
        shown: paths bound again on top of ``hidden`` (the allowed distributions' entries).
        libraries: the shared libraries the worker may load (resolved host paths), or None where they
            could not be listed (``ldd`` missing): then the library folders are bound whole.
        extra: the caller's own paths among ``binds`` (``Sandbox(ro_paths=...)``: data, not warmed).
    """

    binds: dict[str, str]
    hidden: tuple[str, ...]
    shown: tuple[str, ...]
    libraries: tuple[str, ...] | None
    extra: tuple[str, ...] = ()


def _elf_files(folder: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out.extend(os.path.join(root, f) for f in files if ".so" in f and not f.endswith((".py", ".pyc")))
    return out


@functools.cache
def shared_libraries(files: tuple[str, ...]) -> tuple[str, ...] | None:
    """The shared libraries ``files`` (executables, extension modules) load, directly or not, and the
    dynamic loader, as ``ldd`` lists them (one run for all files): host paths as the loader opens them
    (e.g. ``/lib/x86_64-linux-gnu/libc.so.6``). None when ``ldd`` is missing or fails to run."""
    ldd = shutil.which("ldd")
    if ldd is None or not files:
        return None
    try:
        done = subprocess.run([ldd, *files], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out: list[str] = []
    for line in done.stdout.splitlines():
        line = line.strip()
        path = line.split("=>", 1)[1].strip() if "=>" in line else line
        path = path.split(" (0x", 1)[0].strip()
        if path.startswith("/") and os.path.exists(path) and path not in out:
            out.append(path)
    return tuple(out) if out else None


def library_binds(libraries: Iterable[str]) -> dict[str, str]:
    """``{path inside: host file}`` for ``libraries``: each file bound at its own name in its folder's real
    location (``/lib/x86_64-linux-gnu/libz.so.1`` at ``/usr/lib/x86_64-linux-gnu/libz.so.1``, which the
    sandbox's ``/lib`` link reaches), so the loader finds it where ``ld.so.cache`` says it is."""
    return {os.path.join(os.path.realpath(os.path.dirname(lib)), os.path.basename(lib)): lib for lib in libraries}


def worker_view(
    python: str, site_dirs: Sequence[str], packages: Sequence[str] | None, extra: Iterable[str] = ()
) -> WorkerView:
    """What of the host a worker running ``python`` sees: the interpreter (its path, its real file, the
    venv's ``pyvenv.cfg``), its standard library (minus :data:`STDLIB_HIDDEN`), the site-packages entries
    of ``packages`` and of what they require (:func:`package_entries`; None: every folder of
    ``site_dirs``), the shared libraries all of these load (:func:`shared_libraries`, one file each) and
    ``/etc/ld.so.cache``, and ``extra``. Nothing else: no /usr/bin, no compiler, no host Python's
    dist-packages, no /etc, no home, no project checkout (issue 45: every readable host file is page cache
    every evaluation shares). Cached per argument set."""
    return _worker_view(
        python, tuple(site_dirs), None if packages is None else tuple(sorted(set(packages))), tuple(extra)
    )


@functools.cache
def _worker_view(
    python: str, site_dirs: tuple[str, ...], packages: tuple[str, ...] | None, extra: tuple[str, ...]
) -> WorkerView:
    import glob

    stdlib = os.path.dirname(os.__file__)
    binds: dict[str, str] = {}
    for path in (python, os.path.realpath(python), sys.executable, os.path.realpath(sys.executable)):
        binds.setdefault(os.path.abspath(path), path)
    cfg = os.path.join(sys.prefix, "pyvenv.cfg")
    if os.path.isfile(cfg):
        binds[cfg] = cfg
    binds[stdlib] = stdlib
    prefixes = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    hidden = {p for pattern in STDLIB_HIDDEN for p in glob.glob(os.path.join(stdlib, pattern)) if os.path.isdir(p)}
    hidden |= {p for p in site_folders_under(prefixes) if p.startswith(stdlib + os.sep)}
    if packages is None:
        hidden -= set(site_dirs)
    elf = [os.path.realpath(python), *_elf_files(os.path.join(stdlib, "lib-dynload"))]
    elf = [f for f in elf if "_tkinter" not in os.path.basename(f)]  # tkinter is hidden
    if packages is None:
        shown: list[str] = []
        for site_dir in site_dirs:
            binds[site_dir] = site_dir
    else:
        entries = package_entries(site_dirs, packages)
        shown = sorted(p for paths in entries.values() for p in paths)
        for site_dir in site_dirs:  # its parent folders exist; its own content only where shown
            binds[site_dir] = site_dir
            hidden.add(site_dir)
        for entry in shown:
            if os.path.isdir(entry):
                elf += _elf_files(entry)
            elif ".so" in os.path.basename(entry):
                elf.append(entry)
    libraries = shared_libraries(tuple(elf))
    if libraries is None or packages is None:
        # without a list (no ldd), or with every package allowed: the folders the interpreter's own
        # libraries live in, whole (still no /usr/bin, compiler or host Python)
        folders = {os.path.realpath(os.path.dirname(p)) for p in (libraries or ())} or {
            p
            for p in ("/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64")
            if os.path.isdir(p) and not os.path.islink(p)
        }
        for folder in folders:
            binds[folder] = folder
        if libraries is not None:
            binds.update(library_binds(libraries))
    else:
        binds.update(library_binds(libraries))
    if os.path.exists("/etc/ld.so.cache"):
        binds["/etc/ld.so.cache"] = "/etc/ld.so.cache"
    project = str(project_root())
    for path in extra:
        binds[os.path.abspath(path)] = os.path.abspath(path)
    # the project checkout stays out, unless it is the venv's site-packages itself (a wheel install) or named
    binds = {
        dest: src
        for dest, src in binds.items()
        if not (dest == project or dest.startswith(project + os.sep))
        or dest.startswith(os.path.abspath(sys.prefix) + os.sep)
        or dest in map(os.path.abspath, extra)
    }
    # a path below another bound folder is bound already, and one below a hidden folder would be covered
    folders = [d for d in binds if os.path.isdir(binds[d]) and d not in hidden]
    binds = {
        d: s
        for d, s in binds.items()
        if not any(d.startswith(f + os.sep) for f in folders) and not any(d.startswith(h + os.sep) for h in hidden)
    }
    return WorkerView(binds, tuple(sorted(hidden)), tuple(shown), libraries, tuple(os.path.abspath(p) for p in extra))


def warm_page_cache(view: WorkerView, chunk: int = 1 << 20) -> int:
    """Read every file the worker can see once (folders walked, hidden ones skipped), so that no page of
    them is left uncached for a candidate to fault in as a bit another evaluation reads back by timing.
    The caller's extra paths (``view.extra``, possibly large data) are left as they are. Returns the bytes
    read. Files that cannot be read are skipped."""
    hidden = set(view.hidden)
    total = 0
    todo = [src for dest, src in view.binds.items() if dest not in hidden and dest not in view.extra]
    todo += list(view.shown)
    for path in todo:
        files = [path]
        if os.path.isdir(path):
            files = []
            for root, dirs, names in os.walk(path):
                dirs[:] = [d for d in dirs if os.path.join(root, d) not in hidden]
                files.extend(os.path.join(root, n) for n in names)
        for name in files:
            try:
                with open(name, "rb", buffering=0) as fh:
                    while data := fh.read(chunk):
                        total += len(data)
            except OSError:
                continue
    return total


def package_entries(site_dirs: Iterable[str], packages: Iterable[str]) -> dict[str, list[str]]:
    """The top-level entries (package folders, modules, ``*.libs``, ``*.dist-info``) of the distributions
    ``packages`` (distribution or import names, e.g. ``"numpy"``) and of what they require, per site folder.

    Returns:
        ``{site folder: [absolute paths of its entries to expose]}`` for every folder of ``site_dirs`` (an
        empty list where none of the packages lives).
    """
    import importlib.metadata as md
    import re

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    dists: dict[str, tuple[str, object]] = {}  # normalised name / top-level module -> (site dir, dist)
    sites = [os.path.abspath(str(d)) for d in site_dirs]
    for site_dir in sites:
        for dist in md.distributions(path=[site_dir]):
            name = dist.metadata["Name"] or ""
            dists.setdefault(norm(name), (site_dir, dist))
            for mod in (dist.read_text("top_level.txt") or "").split():
                dists.setdefault(norm(mod), (site_dir, dist))
    out: dict[str, list[str]] = {d: [] for d in sites}
    todo, seen = [norm(p) for p in packages], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in dists:
            continue
        seen.add(name)
        site_dir, dist = dists[name]
        for f in dist.files or ():
            top = f.parts[0] if f.parts else ""
            if not top or top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            path = os.path.join(site_dir, top)
            if path not in out[site_dir] and os.path.exists(path):
                out[site_dir].append(path)
        for req in dist.requires or ():
            if "extra ==" not in req:
                match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
                if match:
                    todo.append(norm(match.group(0)))
    return out


def site_folders_under(prefixes: Iterable[str]) -> list[str]:
    """Every ``site-packages`` / ``dist-packages`` folder below ``lib*/python*`` of ``prefixes`` (an
    interpreter's own, which a candidate could put on ``sys.path`` itself)."""
    import glob

    out = []
    for prefix in prefixes:
        for pattern in ("lib*/python*/site-packages", "lib*/python*/dist-packages", "local/lib*/python*/*-packages"):
            for path in sorted(glob.glob(os.path.join(prefix, pattern))):
                if os.path.isdir(path) and path not in out:
                    out.append(path)
    return out


def bwrap_command(
    bwrap: str,
    ro_paths: Iterable[str] | dict[str, str],
    network: bool,
    tmp_mb: int,
    as_root: bool | None = None,
    *,
    seccomp: bool = False,
    hidden: Iterable[str] = (),
    shown: Iterable[str] = (),
    proc_files: dict[str, str] | None = None,
) -> list[str]:
    """The bubblewrap prefix of a worker command (the interpreter command follows it).

    The sandbox's root is an empty read-only tmpfs holding only ``ro_paths`` (read-only binds at the same
    place, or ``{path inside: host path}``; parents created mode 0755), the host's /bin, /lib, ... links into /usr, the worker script at
    :data:`WORKER_IN_SANDBOX`, a private writable tmpfs ``/tmp`` of ``tmp_mb`` MiB (cwd, HOME, TMPDIR),
    a minimal /dev and a /proc of its own PID namespace whose ``/proc/sys`` is an empty tmpfs (host-wide
    kernel counters such as ``fs/dentry-state`` stay out), host name :data:`SANDBOX_HOSTNAME`. Namespaces:
    PID, IPC, UTS, cgroup, and network
    unless ``network``. Identity: as root (``as_root``, default: the current euid is 0), bwrap keeps only
    CAP_SETUID / CAP_SETGID and the worker drops to :data:`SANDBOX_UID` before any candidate code runs (a
    real unprivileged host uid, one per evaluation; no_new_privs is set by bwrap, so setuid binaries
    cannot lift it back); otherwise a user namespace maps the caller to uid/gid 65534, all capabilities are
    dropped and (``--disable-userns``, where bwrap has it) no further user namespace can be made.

    With ``seccomp``, ``--seccomp SECCOMP_FD`` (:data:`SECCOMP_FD_PLACEHOLDER`, replaced by the fd of a
    :mod:`coevo.sandbox.seccomp` program at each start). The worker runs as PID 1 of its namespace
    (``--as-pid-1``, where bwrap has it), so ``/proc/1/cmdline`` is its own command, not bwrap's.
    ``hidden``: folders (bound through ``ro_paths``) covered by an empty read-only tmpfs, on which the paths
    of ``shown`` are bound again (how :func:`package_entries` restricts site-packages). ``proc_files``:
    ``{"/proc/meminfo": host file, ...}`` bound over the sandbox's /proc (:func:`proc_stand_ins`).
    """
    as_root = (os.geteuid() == 0) if as_root is None else as_root
    hidden, shown = list(hidden), list(shown)
    features = bwrap_features(bwrap)
    cmd = [
        bwrap,
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--hostname",
        SANDBOX_HOSTNAME,
        "--unshare-cgroup-try",
        *([] if network else ["--unshare-net"]),
        "--die-with-parent",
        *(["--as-pid-1"] if "--as-pid-1" in features else []),
    ]
    if as_root:
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--cap-drop", "ALL"]
        if "--disable-userns" in features:
            cmd += ["--disable-userns"]
    if seccomp:
        cmd += ["--seccomp", SECCOMP_FD_PLACEHOLDER]
    binds = dict(ro_paths) if isinstance(ro_paths, dict) else {p: p for p in ro_paths}
    paths = sorted(binds)
    parents: set[str] = set()
    for path in [*paths, *hidden, WORKER_IN_SANDBOX]:
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            parents.add(parent)
            parent = os.path.dirname(parent)
    for link in SYSTEM_LINKS:
        if os.path.islink(link):
            target = os.readlink(link)
            cmd += ["--symlink", target, link]
            parents.discard(link)
    # the private /tmp first: an interpreter or venv that lives under /tmp is bound on top of it, not hidden
    cmd += ["--perms", "01777", "--size", str(int(tmp_mb) << 20), "--tmpfs", "/tmp"]
    for parent in sorted(parents - {"/tmp"}, key=lambda p: (p.count("/"), p)):
        cmd += ["--perms", "0755", "--dir", parent]  # bwrap would create them 0700: unreadable as nobody
    for path in paths:
        cmd += ["--ro-bind", binds[path], path]
    for folder in hidden:
        cmd += ["--perms", "0755", "--size", str(1 << 20), "--tmpfs", folder]
    for path in shown:
        cmd += ["--ro-bind", path, path]
    for folder in hidden:
        cmd += ["--remount-ro", folder]
    cmd += [
        "--ro-bind",
        str(worker_script()),
        WORKER_IN_SANDBOX,
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        # /proc/sys shows host-wide kernel state (fs/dentry-state counts every lookup on the host: issue 54):
        # an empty tmpfs, on which the stand-ins of proc_files are bound
        "--perms",
        "0555",
        "--size",
        str(1 << 20),
        "--tmpfs",
        "/proc/sys",
        *(x for folder in _proc_sys_folders(proc_files or {}) for x in ("--perms", "0755", "--dir", folder)),
        *(x for target, src in sorted((proc_files or {}).items()) for x in ("--ro-bind", src, target)),
        "--remount-ro",
        "/proc/sys",
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
    ]
    return cmd


def _proc_sys_folders(proc_files: dict[str, str]) -> list[str]:
    """The folders below /proc/sys that the stand-ins of ``proc_files`` need, parents first (bwrap would
    create them 0700: unreadable for the candidate's uid)."""
    out: set[str] = set()
    for target in proc_files:
        parent = os.path.dirname(target)
        while parent.startswith("/proc/sys/"):
            out.add(parent)
            parent = os.path.dirname(parent)
    return sorted(out, key=lambda p: (p.count("/"), p))


def interpreter_command(
    python: str, result_fd: int, site_import: bool = False, mode: str = "serve", script: str | None = None
) -> list[str]:
    """``python -s -P [-S] worker.py MODE FD``: no user site, no script folder on ``sys.path``, and by
    default no ``site`` import (the import path comes from :func:`child_pythonpath` instead), which cuts
    interpreter start-up roughly in half. ``script`` overrides the worker's path (inside bwrap:
    :data:`WORKER_IN_SANDBOX`)."""
    flags = ["-s", *(["-P"] if sys.version_info >= (3, 11) else []), *([] if site_import else ["-S"])]
    return [python, *flags, script or str(worker_script()), mode, str(result_fd)]


def path_scrubber(extra: Iterable[str | os.PathLike] = ()) -> Callable[[str], str]:
    """A function that replaces host paths in text the candidate's process produced (its exception
    messages, stderr) with neutral names before that text is stored or shown in a later prompt: the project
    checkout (``<project>``), site-packages (``<site-packages>``), the venv (``<venv>``), the interpreter's
    installation (``<python>``), the home folder (``<home>``), cgroup folders (``<cgroup>``) and ``extra``
    (``<host>``), and the host's kernel build string and CPU model (:func:`host_facts`: ``uname`` shows them
    whatever /proc says). Longest paths are replaced first; the sandbox's own ``/tmp`` is left as it is."""
    import re

    named: dict[str, str] = {}

    def add(path: str | os.PathLike | None, label: str) -> None:
        if not path:
            return
        for p in {os.path.abspath(str(path)), os.path.realpath(str(path))}:
            if p not in ("/", "/tmp", "/usr", "/usr/local", "/usr/lib", "/usr/bin") and len(p) > 1:
                named.setdefault(p, label)

    add(os.path.dirname(sys.executable), "<python>/bin")
    for p in extra:
        add(p, "<host>")
    add(str(project_root()), "<project>")
    for p in child_pythonpath():
        add(p, "<site-packages>")
    add(sys.prefix, "<venv>" if sys.prefix != sys.base_prefix else "<python>")
    add(sys.base_prefix, "<python>")
    add(os.path.dirname(os.path.realpath(sys.executable)), "<python>/bin")
    add(os.path.expanduser("~"), "<home>")
    paths = sorted(named, key=len, reverse=True)
    pattern = re.compile(
        "|".join(re.escape(p) + r"(?=[/\s'\":,)\]]|$)" for p in paths) + r"|/sys/fs/cgroup[^\s'\":,)\]]*"
    )

    facts = sorted(host_facts().items(), key=lambda kv: len(kv[0]), reverse=True)

    def scrub(text: str) -> str:
        if not text:
            return text
        for fact, label in facts:
            if fact in text:
                text = text.replace(fact, label)
        if "/" not in text:
            return text
        return pattern.sub(lambda m: named.get(m.group(0), "<cgroup>"), text)

    return scrub


#: ``/proc`` files (relative to /proc) that show host-wide counters or host identity, replaced by an
#: empty file: interrupt and scheduler counters, file locks and cgroup counts (activity channels between
#: concurrent evaluations), disks, zones, partitions, swap, the key counts of every host user, the kernel's
#: command line, configuration and symbols.
PROC_EMPTY = (
    "locks",
    "cgroups",
    "cmdline",
    "config.gz",
    "kallsyms",
    "diskstats",
    "zoneinfo",
    "interrupts",
    "softirqs",
    "schedstat",
    "key-users",
    "buddyinfo",
    "pagetypeinfo",
    "partitions",
    "swaps",
)
#: ``cpuinfo`` fields kept (what code decides features by); the model, stepping, microcode, clock and
#: ids of the host's CPU are left out and ``model name`` reads ``sandbox``.
CPUINFO_FIELDS = (
    "processor",
    "vendor_id",
    "cpu family",
    "fpu",
    "fpu_exception",
    "cpuid level",
    "wp",
    "flags",
    "siblings",
    "cpu cores",
    "clflush size",
    "cache_alignment",
    "Features",
    "CPU architecture",
)
#: the kernel build string the sandbox shows (``/proc/version``, ``/proc/sys/kernel/version``)
KERNEL_STAND_IN = "Linux version 0.0.0-sandbox (coevo) #1"


def host_facts() -> dict[str, str]:
    """Host strings a candidate can read without a file (``uname``) or that name the machine, mapped to
    neutral labels for :func:`path_scrubber`: the kernel build string and release (``<kernel>``) and the
    CPU model (``<cpu>``). Strings shorter than 6 characters are left out (too likely elsewhere)."""
    facts: dict[str, str] = {}
    uname = os.uname()
    for value in (uname.version, uname.release):
        facts[value] = "<kernel>"
    try:
        with open("/proc/version") as fh:
            facts[fh.read().strip()] = "<kernel>"
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    facts[value.strip()] = "<cpu>"
    except OSError:
        pass
    return {k: v for k, v in facts.items() if len(k) >= 6}


def proc_stand_ins(memory_mb: int) -> dict[str, str]:
    """Files bound over the sandbox's ``/proc``, so the candidate reads the evaluation's own facts instead of
    the host's: ``meminfo`` and ``vmstat`` (the evaluation's memory limit, ``memory_mb`` MiB, total and free),
    ``loadavg`` and ``uptime`` (zero), ``stat`` (one zero line per CPU, as many CPUs as the host has: the C
    library counts them there; zero forks, context switches, interrupts), ``pressure/*`` (no stall),
    ``version`` and ``sys/kernel/{version,osrelease}`` (:data:`KERNEL_STAND_IN`), ``cpuinfo``
    (:data:`CPUINFO_FIELDS` only), ``sys/kernel/random/boot_id`` and ``sys/fs/{file-nr,inode-nr}`` (zero),
    and an empty file for each of :data:`PROC_EMPTY`. Only files the host's /proc has are replaced. Written
    once per process and limit into a private temp folder (removed at exit). Returns ``{target in /proc:
    host file}``."""
    return dict(_proc_stand_ins(int(memory_mb)))


def proc_stand_in_texts(memory_mb: int) -> dict[str, str]:
    """The texts of :func:`proc_stand_ins` by name below /proc (``"meminfo"``, ``"sys/kernel/version"``,
    ...): what the zygote mode writes as plain files into the worker's own /proc folder."""
    return dict(_proc_stand_in_texts(int(memory_mb)))


@functools.cache
def _proc_stand_in_texts(memory_mb: int) -> tuple[tuple[str, str], ...]:
    out = []
    for target, path in _proc_stand_ins(memory_mb):
        with open(path) as fh:
            out.append((target[len("/proc/") :], fh.read()))
    return tuple(out)


def _cpuinfo_stand_in() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            text = fh.read()
    except OSError:
        return ""
    blocks = []
    for block in text.strip().split("\n\n"):
        keep = []
        for line in block.splitlines():
            key = line.partition(":")[0].strip()
            if key in CPUINFO_FIELDS:
                keep.append(line)
        if keep:
            keep.insert(1, "model name\t: sandbox")
            blocks.append("\n".join(keep))
    return "\n\n".join(blocks) + "\n\n" if blocks else ""


@functools.cache
def _proc_stand_ins(memory_mb: int) -> tuple[tuple[str, str], ...]:
    import atexit
    import tempfile

    folder = tempfile.mkdtemp(prefix="coevo-proc-")
    atexit.register(shutil.rmtree, folder, True)
    kib = memory_mb * 1024
    cpus = os.cpu_count() or 1
    zeros = " ".join(["0"] * 10)
    stall = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    texts = {
        "meminfo": "".join(
            f"{k}:{v:>16} kB\n"
            for k, v in (("MemTotal", kib), ("MemFree", kib), ("MemAvailable", kib), ("SwapTotal", 0), ("SwapFree", 0))
        ),
        "vmstat": f"nr_free_pages {kib // 4}\nnr_zone_inactive_anon 0\nnr_zone_active_anon 0\npgfault 0\npgmajfault 0\n",
        "loadavg": "0.00 0.00 0.00 1/1 1\n",
        "uptime": "0.00 0.00\n",
        "stat": f"cpu  {zeros}\n"
        + "".join(f"cpu{i} {zeros}\n" for i in range(cpus))
        + "intr 0\nctxt 0\nbtime 0\nprocesses 0\nprocs_running 1\nprocs_blocked 0\nsoftirq 0\n",
        "pressure/cpu": stall,
        "pressure/memory": stall,
        "pressure/io": stall,
        "version": KERNEL_STAND_IN + "\n",
        "sys/kernel/version": "#1\n",
        "sys/kernel/osrelease": "0.0.0-sandbox\n",
        "sys/kernel/random/boot_id": "00000000-0000-0000-0000-000000000000\n",
        "sys/fs/file-nr": "0\t0\t0\n",
        "sys/fs/inode-nr": "0\t0\n",
        "cpuinfo": _cpuinfo_stand_in(),
        **{name: "" for name in PROC_EMPTY},
    }
    out = []
    for name, text in texts.items():
        if not os.path.exists(os.path.join("/proc", name)):
            continue
        path = os.path.join(folder, name.replace("/", "-"))
        with open(path, "w") as fh:
            fh.write(text)
        os.chmod(path, 0o444)
        out.append((f"/proc/{name}", path))
    return tuple(out)

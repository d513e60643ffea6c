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
#: Placeholder of the seccomp program's fd in :func:`bwrap_command` (replaced per process start).
SECCOMP_FD_PLACEHOLDER = "SECCOMP_FD"


def evaluation_uid() -> int:
    """A fresh unprivileged host uid for one evaluation (see :data:`EVAL_UID_BASE`)."""
    import secrets

    return EVAL_UID_BASE + secrets.randbelow(EVAL_UID_SPAN)


#: Where the worker script appears inside the sandbox (the only project file the candidate can see).
WORKER_IN_SANDBOX = "/coevo-sandbox/worker.py"
#: System folders bound read-only: the dynamic loader and the shared libraries the interpreter and
#: compiled extensions link against, and the system executables (``sleep``, ...). Nothing else of the host
#: (no /etc, /home, /root, /work, /srv, /var, /opt, /mnt) is visible.
SYSTEM_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32", "/usr/bin", "/usr/sbin")
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")


def exposed_paths(site_dirs: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """Host paths the candidate's process sees (read-only, at the same place): :data:`SYSTEM_DIRS`, the
    interpreter (``sys.base_prefix``, ``sys.prefix`` -- the venv -- and the real executable's folder),
    ``site_dirs`` (site-packages, for numpy), ``/etc/ld.so.cache`` (library lookup) and ``extra``. The
    project checkout and folders found through it (e.g. ``.pth`` entries pointing into it) are left out."""
    project = str(project_root())
    real_dirs = [p for p in SYSTEM_LINKS if os.path.isdir(p) and not os.path.islink(p)]  # no merged /usr
    want = [
        *SYSTEM_DIRS,
        *real_dirs,
        sys.base_prefix,
        sys.prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *site_dirs,
        "/etc/ld.so.cache",
        *extra,
    ]
    out: list[str] = []
    for path in want:
        path = os.path.abspath(path)
        inside_project = path == project or path.startswith(project + os.sep)
        if inside_project and not (path.startswith(os.path.abspath(sys.prefix)) or path in map(os.path.abspath, extra)):
            continue
        if os.path.exists(path) and path not in out and not any(path.startswith(p + os.sep) for p in out):
            out.append(path)
    return out


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
    ro_paths: Iterable[str],
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
    place, parents created mode 0755), the host's /bin, /lib, ... links into /usr, the worker script at
    :data:`WORKER_IN_SANDBOX`, a private writable tmpfs ``/tmp`` of ``tmp_mb`` MiB (cwd, HOME, TMPDIR),
    a minimal /dev and a /proc of its own PID namespace. Namespaces: PID, IPC, UTS, cgroup, and network
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
    features = bwrap_features(bwrap)
    cmd = [
        bwrap,
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
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
    paths = sorted(set(ro_paths))
    parents: set[str] = set()
    for path in [*paths, WORKER_IN_SANDBOX]:
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
        cmd += ["--ro-bind", path, path]
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
        *(x for target, src in sorted((proc_files or {}).items()) for x in ("--ro-bind", src, target)),
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
    ]
    return cmd


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
    (``<host>``). Longest paths are replaced first; the sandbox's own ``/tmp`` is left as it is."""
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

    def scrub(text: str) -> str:
        if not text or "/" not in text:
            return text
        return pattern.sub(lambda m: named.get(m.group(0), "<cgroup>"), text)

    return scrub


def proc_stand_ins(memory_mb: int) -> dict[str, str]:
    """Files bound over the sandbox's ``/proc/meminfo``, ``/proc/loadavg`` and ``/proc/uptime``, so the
    candidate reads the evaluation's own memory limit (``memory_mb`` MiB total and free), zero load and zero
    uptime instead of the host's. Written once per process and limit into a private temp folder (removed at
    exit). Returns ``{target in /proc: host file}``."""
    return dict(_proc_stand_ins(int(memory_mb)))


@functools.cache
def _proc_stand_ins(memory_mb: int) -> tuple[tuple[str, str], ...]:
    import atexit
    import tempfile

    folder = tempfile.mkdtemp(prefix="coevo-proc-")
    atexit.register(shutil.rmtree, folder, True)
    kib = memory_mb * 1024
    texts = {
        "meminfo": "".join(
            f"{k}:{v:>16} kB\n"
            for k, v in (("MemTotal", kib), ("MemFree", kib), ("MemAvailable", kib), ("SwapTotal", 0), ("SwapFree", 0))
        ),
        "loadavg": "0.00 0.00 0.00 1/1 1\n",
        "uptime": "0.00 0.00\n",
    }
    out = []
    for name, text in texts.items():
        path = os.path.join(folder, name)
        with open(path, "w") as fh:
            fh.write(text)
        os.chmod(path, 0o444)
        out.append((f"/proc/{name}", path))
    return tuple(out)

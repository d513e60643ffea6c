"""How a sandboxed worker process is isolated: the bubblewrap command line, its environment, its import path.

Checked on this machine (field-notes §5): ``bwrap --unshare-all --die-with-parent --ro-bind / / --tmpfs /tmp
--dev /dev --proc /proc`` gives a private network namespace (a connection to the host's 127.0.0.1 is refused),
a private PID namespace (every process in it dies with the sandbox's PID 1), and a read-only root. Two
pitfalls handled here: ``--tmpfs /tmp`` hides interpreters, venvs and projects living under /tmp, so
``sys.prefix``, ``sys.base_prefix``, the project and every import path are bound again read-only; and bwrap
run by root keeps all capabilities inside the sandbox (a candidate could remount ``/`` read-write), so
``--cap-drop ALL`` is always passed.
"""

from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from coevo.resources import package_parent

#: Thread-count variables pinned to 1: BLAS/OpenMP pools started per process cost start-up time and
#: oversubscribe the cores when many evaluations run in parallel.
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS")

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
def bwrap_status(bwrap: str = "bwrap") -> tuple[bool, str]:
    """Whether bubblewrap can start a sandbox here: ``(usable, reason)``; probed once per process.

    bwrap may be installed yet unusable (no user namespaces in a container), so a real ``true`` is run
    under the same namespace flags the sandbox uses.
    """
    path = shutil.which(bwrap)
    if path is None:
        return False, f"{bwrap!r} not found on PATH"
    cmd = [path, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL", "--ro-bind", "/", "/",
           "--dev", "/dev", "--proc", "/proc", "true"]
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
    added_by_pth = [p for p in sys.path if p and os.path.isabs(p) and p not in stdlib and
                    any(p.startswith(s) for s in sites)]
    out: list[str] = []
    for entry in [str(project_root()), *map(str, extra), *sorted(sites), *added_by_pth]:
        entry = os.path.abspath(entry)
        if entry not in out and os.path.isdir(entry):
            out.append(entry)
    return out


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


def payload_paths(payload: object) -> list[str]:
    """Absolute paths of existing files/folders named by string values anywhere in ``payload`` (these are
    bound read-only so that, e.g., an instance file under the hidden /tmp stays readable)."""
    found: list[str] = []
    stack = [payload]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif (isinstance(item, str) and item.startswith("/") and "\n" not in item and len(item) < 4096
              and os.path.exists(item)):
            found.append(os.path.abspath(item))
    return found


def bwrap_command(bwrap: str, tmpdir: str, ro_paths: Iterable[str], network: bool,
                  hide_home: bool) -> list[str]:
    """The bubblewrap prefix of a worker command (the interpreter command follows it).

    Args:
        bwrap: path of the bwrap executable.
        tmpdir: the run's private writable folder (bound read-write, made the working directory).
        ro_paths: folders/files to bind read-only again after /tmp (and the home folder) are hidden.
        network: keep the host network (``--share-net``); False gives an empty network namespace.
        hide_home: mount an empty read-only tmpfs over the parent's home folder (credentials, caches).
    """
    cmd = [bwrap, "--unshare-all", *(["--share-net"] if network else []), "--die-with-parent",
           "--cap-drop", "ALL", "--ro-bind", "/", "/", "--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc"]
    home = os.path.expanduser("~")
    hidden = hide_home and home not in ("/", "") and os.path.isdir(home) and not tmpdir.startswith(home + "/")
    if hidden:
        cmd += ["--tmpfs", home]
    binds = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             str(project_root()), *ro_paths]
    seen: set[str] = set()
    for path in binds:
        path = os.path.abspath(path)
        if path not in seen and os.path.exists(path):
            seen.add(path)
            cmd += ["--ro-bind", path, path]
    if hidden:
        cmd += ["--remount-ro", home]  # after the binds below it were created: an empty, read-only home
    cmd += ["--bind", tmpdir, tmpdir, "--chdir", tmpdir]
    return cmd


def interpreter_command(python: str, result_fd: int, site_import: bool = False) -> list[str]:
    """``python -s -P [-S] worker.py RESULT_FD``: no user site, no script folder on ``sys.path``, and by
    default no ``site`` import (the import path comes from :func:`child_pythonpath` instead), which cuts
    interpreter start-up roughly in half."""
    flags = ["-s", *(["-P"] if sys.version_info >= (3, 11) else []), *([] if site_import else ["-S"])]
    return [python, *flags, str(worker_script()), str(result_fd)]

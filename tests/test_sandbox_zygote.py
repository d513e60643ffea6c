"""Issue 54, item 2: the zygote isolation mode (coevo.sandbox.zygote). A candidate's worker is forked from a
preloaded zygote onto an empty private tmpfs root: no host file system object is reachable, so no dentry,
page-cache page, lock or watch of a host file can carry anything between evaluations."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest
from support import SET_COMM, pids_with_comm

from coevo.ahd import load_problem
from coevo.ahd.evaluate import evaluate_heuristic
from coevo.sandbox import isolation, zygote
from coevo.sandbox.isolation import bwrap_status, project_root
from coevo.sandbox.runner import Sandbox, SandboxLimits

pytestmark = [
    pytest.mark.usefixtures("private_cache"),
    pytest.mark.skipif(bool(zygote.missing()), reason=f"zygote mode not usable here: {zygote.missing()}"),
]
CALL = "coevo.sandbox.targets:call_cases"
HAS_BWRAP = bwrap_status()[0]


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    box = Sandbox(SandboxLimits(timeout_s=30, memory_mb=1024, isolation="zygote"))
    assert box.isolation == "zygote"
    return box


def _call(sandbox: Sandbox, body: str, *args, expect=None, packages=("numpy",)):
    code = "import os, sys\n" + textwrap.dedent(body)
    payload = {"cases": [list(args)], "candidate_packages": list(packages), **({"expect": expect} if expect else {})}
    res = sandbox.run(code, "f", CALL, payload)
    assert res.valid, res.error
    return res.metrics["values"][0]


def test_a_candidate_sees_no_host_path(sandbox):
    """Under bubblewrap the interpreter, its standard library and site-packages were bound read-only; now
    the root holds only /dev (fresh device nodes), /proc (stand-ins as plain files) and a private /tmp."""
    paths = ["/etc/passwd", os.path.dirname(os.__file__), os.__file__, np.__file__, os.path.dirname(np.__file__)]
    paths += [str(project_root()), sys.executable, "/usr/lib", "/proc/self/status", "/sys/fs/cgroup"]
    seen = _call(
        sandbox,
        """
        def f(paths):
            out = {'/': sorted(os.listdir('/')), '/proc': sorted(os.listdir('/proc')), 'uid': os.getuid()}
            for p in paths:
                try:
                    os.stat(p)
                    out[p] = 'reachable'
                except OSError as exc:
                    out[p] = type(exc).__name__
            out['meminfo'] = open('/proc/meminfo').read().split()[:2]
            out['null'] = open('/dev/null', 'w').write('x')
            with open('/tmp/scratch', 'w') as fh:
                out['tmp'] = fh.write('written')
            return out
        """,
        paths,
        expect="dict",
    )
    assert seen.pop("/") == ["dev", "proc", "tmp"]
    assert "meminfo" in seen.pop("/proc") and seen.pop("meminfo") == ["MemTotal:", str(1024 * 1024)]
    assert seen.pop("null") == 1 and seen.pop("tmp") == 7 and seen.pop("uid") != 0
    assert all(v == "FileNotFoundError" for v in seen.values()), seen


def _dentries() -> tuple[int, int]:
    """(dentries, negative dentries) of the host (``/proc/sys/fs/dentry-state``)."""
    with open("/proc/sys/fs/dentry-state") as fh:
        fields = [int(x) for x in fh.read().split()]
    return fields[0], fields[4]


LOOKUPS = 40_000
MISSING_NAMES = f"""
def f(folders, token):
    import os
    for folder in folders:
        for i in range({LOOKUPS} // len(folders)):
            try:
                os.stat(folder + '/coevo-missing-%s-%d' % (token, i))
            except OSError:
                pass
    return 1
"""


def _dentry_growth(box: Sandbox, folders: list[str]) -> int:
    before = _dentries()[1]
    import uuid  # fresh names: a negative dentry of an earlier run would be found, not made

    payload = {"cases": [[folders, uuid.uuid4().hex]], "candidate_packages": ["numpy"]}
    res = box.run(MISSING_NAMES, "f", CALL, payload)
    assert res.valid, res.error
    time.sleep(0.5)  # the evaluation's mount namespace (and its tmpfs) is freed once its last process ended
    return _dentries()[1] - before


def test_missing_name_lookups_leave_no_host_dentry(sandbox):
    """Issue 54's persistent channel: a lookup of a missing name in a bound host folder left a negative
    dentry that outlived the evaluation (read back from dentry-state, or by timing). In the zygote's
    worker every path resolves in its own tmpfs, freed with the evaluation: the host's count does not
    grow by the lookups (bubblewrap, for comparison, grows by about one per lookup)."""
    folders = [os.path.dirname(os.__file__), os.path.dirname(np.__file__), "/tmp", "/"]
    growth = _dentry_growth(sandbox, folders)
    assert growth < LOOKUPS // 4, growth
    if HAS_BWRAP:
        control = _dentry_growth(Sandbox(SandboxLimits(timeout_s=60, isolation="bwrap")), folders[:2])
        assert control > LOOKUPS // 4, (control, growth)  # the measurement sees the route where it exists


def test_an_import_outside_the_preloaded_set_is_an_import_failure_naming_it(sandbox):
    for module in ("mailbox", "elkai", "yaml"):
        res = sandbox.run(f"import {module}\ndef f():\n    return 1\n", "f", CALL, {"cases": [[]]})
        assert not res.valid and res.error_kind == "import", res
        assert repr(module) in res.error and "candidate_packages" in res.error, res.error
    # what numpy 2 loads lazily was preloaded, and the standard library heuristics use is there
    seen = _call(
        sandbox,
        """
        import numpy as np, math, random, heapq, itertools, collections, statistics, functools, json
        def f():
            rng = np.random.default_rng(0)
            m = rng.random((4, 4))
            return [float(np.linalg.det(m)), float(abs(np.fft.fft(m[0]))[0]), float(np.polynomial.Polynomial([1, 2])(3)),
                    float(np.ma.masked_array([1.0, 2.0], [0, 1]).sum()), statistics.mean([1, 2, 3])]
        """,
    )
    assert seen[2] == 7.0 and seen[3] == 1.0 and seen[4] == 2


#: the standard library an honest heuristic may reasonably import (each must work in the zygote's worker)
HEURISTIC_STDLIB = (
    "math", "cmath", "random", "itertools", "functools", "operator", "heapq", "bisect", "collections",
    "collections.abc", "statistics", "copy", "typing", "dataclasses", "enum", "fractions", "decimal", "numbers",
    "string", "re", "array", "time", "sys", "os", "os.path", "warnings", "abc", "contextlib", "types", "weakref",
    "json", "struct", "queue", "threading", "__future__", "contextvars", "concurrent.futures", "datetime",
    "hashlib", "pickle", "textwrap", "pprint", "graphlib", "secrets", "uuid", "io", "gc", "traceback",
    "logging", "inspect", "unittest", "cProfile", "pstats", "timeit", "sched", "numpy", "numpy.random",
    "numpy.linalg", "numpy.fft", "numpy.polynomial", "numpy.ma", "numpy.typing",
)  # fmt: skip


def _heuristic_imports() -> set[str]:
    """The top-level modules imported by the repository's own heuristics (seeds, templates, construction
    loops, published heuristics), coevo's prelude (inlined before the sandbox) left out."""
    import ast

    names = set()
    for path in sorted(project_root().glob("heuristics/*/*.py")) + sorted(
        project_root().glob("heuristics/*/published/*.py")
    ):
        if path.name == "problem.py":  # the trusted side's problem definition, not candidate code
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return {n for n in names if not n.startswith("coevo")}


def test_the_stdlib_heuristics_use_and_the_repositorys_own_heuristics_imports_work(sandbox):
    """The default isolation must not fail an honest heuristic on an import: every module of
    HEURISTIC_STDLIB (and of STDLIB_PRELOAD) and every import of heuristics/ imports in the worker."""
    wanted = sorted(set(HEURISTIC_STDLIB) | set(zygote.STDLIB_PRELOAD) | _heuristic_imports())
    assert "numpy" in _heuristic_imports()
    failed = _call(
        sandbox,
        """
        import importlib
        def f(names):
            out = {}
            for name in names:
                try:
                    importlib.import_module(name)
                except Exception as exc:
                    out[name] = type(exc).__name__ + ': ' + str(exc)[:200]
            return out
        """,
        wanted,
        expect="dict",
    )
    offered = {name for name in zygote.STDLIB_PRELOAD if name != "sqlite3"}  # sqlite3: where its library exists
    assert {k: v for k, v in failed.items() if k in offered or k in HEURISTIC_STDLIB} == {}, failed


@pytest.mark.parametrize("name,size", [("tsp_construct", 20), ("bpp_online", 200)])
def test_honest_heuristics_score_exactly_as_under_bubblewrap(sandbox, name, size):
    problem = load_problem(name)
    instances = problem.generate(size, 2, 7)
    code = problem.seed_heuristic_code()
    res = evaluate_heuristic(problem, code, instances, sandbox=sandbox, with_reference=False)
    assert res.valid, res.error
    if HAS_BWRAP:
        old = evaluate_heuristic(
            problem,
            code,
            instances,
            sandbox=Sandbox(SandboxLimits(timeout_s=60, isolation="bwrap")),
            with_reference=False,
        )
        assert old.valid and old.objective == res.objective
        assert _scores(old.metrics) == _scores(res.metrics)


def _scores(metrics: dict) -> dict:
    """The metrics without the timings."""
    out = {k: v for k, v in metrics.items() if "time" not in k and k != "per_instance"}
    out["per_instance"] = [{k: v for k, v in inst.items() if "time" not in k} for inst in metrics["per_instance"]]
    return out


def test_a_killed_zygote_is_started_again_and_running_evaluations_are_recorded(sandbox):
    """``kill -9`` of the zygote between evaluations: the next one starts a fresh zygote. During one: the
    running worker is not the zygote's to lose; it finishes and its result is recorded (no hang)."""
    first = sandbox._zygote(("numpy",))
    old_pid = first.proc.pid
    os.kill(old_pid, 9)
    first.proc.wait()
    assert _call(sandbox, "def f(x):\n    return x + 1\n", 41) == 42
    assert first.proc.pid != old_pid and first.alive
    slow = "import time\ndef f(x):\n    time.sleep(1.5)\n    return x * 2\n"
    box: dict = {}
    thread = threading.Thread(
        target=lambda: box.update(res=sandbox.run(slow, "f", CALL, {"cases": [[21]], "candidate_packages": ["numpy"]}))
    )
    start = time.perf_counter()
    thread.start()
    time.sleep(0.7)
    os.kill(first.proc.pid, 9)
    thread.join(30)
    assert not thread.is_alive() and time.perf_counter() - start < 20
    assert box["res"].valid and box["res"].metrics["values"] == [42], box["res"]
    assert _call(sandbox, "def f(x):\n    return x - 1\n", 43) == 42  # and the next one gets a fresh zygote


def test_a_host_without_what_the_zygote_needs_says_so_once_and_uses_bubblewrap(monkeypatch, caplog):
    import logging

    from coevo.sandbox import runner

    monkeypatch.setattr(runner, "_warned", set())
    monkeypatch.setattr(zygote, "missing", lambda: ["root (mounts, namespaces and a fresh uid per evaluation need it)"])
    with caplog.at_level(logging.WARNING, logger="coevo.sandbox.runner"):
        box = Sandbox(SandboxLimits(timeout_s=20, isolation="zygote"))
        Sandbox(SandboxLimits(timeout_s=20, isolation="zygote"))
    lines = [r.getMessage() for r in caplog.records if "zygote" in r.getMessage()]
    assert len(lines) == 1 and "root" in lines[0] and "dentries" in lines[0], lines
    assert box.isolation == ("bwrap" if HAS_BWRAP else "rlimits")
    with pytest.raises(ValueError, match="isolation"):
        SandboxLimits(isolation="chroot")


def test_the_filter_rlimits_and_namespaces_hold_in_the_forked_worker(sandbox):
    """The same seccomp filter as under bubblewrap is installed after the uid drop: file locks (here on the
    worker's own /tmp file: no host file exists to lock), new namespaces, mounts are EPERM; RLIMIT_NOFILE is
    the evaluation's; the worker is PID 1 of its own namespace; nothing can be executed (no file to run)."""
    seen = _call(
        sandbox,
        """
        import ctypes, fcntl, resource
        def f():
            libc = ctypes.CDLL(None, use_errno=True)
            out = {'pid': os.getpid(), 'nofile': resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
            fd = os.open('/tmp/lock', os.O_CREAT | os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                out['flock'] = 0
            except OSError as exc:
                out['flock'] = exc.errno
            out['unshare'] = libc.unshare(0x00020000) and ctypes.get_errno()
            out['mount'] = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) and ctypes.get_errno()
            try:
                os.execv('/bin/sh', ['sh'])
            except OSError as exc:
                out['exec'] = type(exc).__name__
            return out
        """,
        expect="dict",
    )
    assert seen == {"pid": 1, "nofile": 256, "flock": 1, "unshare": 1, "mount": 1, "exec": "FileNotFoundError"}


def test_the_zygote_is_the_default_and_bubblewrap_stays_selectable(monkeypatch, caplog, tmp_path):
    """No mode named: the zygote (this host has what it needs). ``isolation="bwrap"`` or
    ``COEVO_SANDBOX_ISOLATION=bwrap``: bubblewrap. A sandbox showing host files (``ro_paths``) and naming no
    mode: bubblewrap, without a warning (it asked for what only bubblewrap can do)."""
    import logging

    from coevo.sandbox import runner

    monkeypatch.delenv("COEVO_SANDBOX_ISOLATION", raising=False)
    monkeypatch.setattr(runner, "_warned", set())
    assert SandboxLimits().isolation is None and Sandbox(SandboxLimits(timeout_s=5)).isolation == "zygote"
    if not HAS_BWRAP:
        return
    assert Sandbox(SandboxLimits(timeout_s=5, isolation="bwrap")).isolation == "bwrap"
    with caplog.at_level(logging.WARNING, logger="coevo.sandbox.runner"):
        assert Sandbox(SandboxLimits(timeout_s=5), ro_paths=[tmp_path]).isolation == "bwrap"
    assert not [r for r in caplog.records if "zygote" in r.getMessage()]
    monkeypatch.setenv("COEVO_SANDBOX_ISOLATION", "bwrap")
    assert Sandbox(SandboxLimits(timeout_s=5)).isolation == "bwrap"
    assert Sandbox(SandboxLimits(timeout_s=5, isolation="zygote")).isolation == "zygote"
    # a host without what the zygote needs: the default falls back to bubblewrap with the one line
    monkeypatch.delenv("COEVO_SANDBOX_ISOLATION")
    monkeypatch.setattr(runner, "_warned", set())
    monkeypatch.setattr(zygote, "missing", lambda: ["pidfd_open (Linux >= 5.3, Python >= 3.9)"])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="coevo.sandbox.runner"):
        assert Sandbox(SandboxLimits(timeout_s=5)).isolation == "bwrap"
    lines = [r.getMessage() for r in caplog.records if "zygote" in r.getMessage()]
    assert len(lines) == 1 and "the default" in lines[0] and "pidfd_open" in lines[0], lines


def test_a_timed_out_worker_that_clears_its_parent_death_signal_leaves_no_process_without_cgroups():
    """The trusted side's kill reaches every process of the evaluation without a cgroup: the zygote's child
    SIGKILLs the worker, PID 1 of its namespace, and the kernel kills the rest with it; a candidate cannot
    clear its parent-death signal (``prctl(PR_SET_PDEATHSIG, 0)`` is refused by the seccomp filter), so the
    child's own death would take the worker too. (A review found the worker surviving the kill once it had
    cleared the signal: only the child was killed.)"""
    sandbox = Sandbox(SandboxLimits(timeout_s=2, memory_mb=1024, isolation="zygote"), use_cgroups=False)
    assert sandbox.cgroups is None
    name = f"pds{uuid.uuid4().hex[:12]}"
    code = (
        "import ctypes, os, time\n" + SET_COMM + "libc = ctypes.CDLL(None, use_errno=True)\n"
        "refused = libc.prctl(1, 0, 0, 0, 0), ctypes.get_errno()\n"
        "def f():\n"
        "    for _ in range(3):\n"
        "        if os.fork() == 0:\n"
        f"            set_comm({name!r})\n"
        "            time.sleep(100)\n"
        "            os._exit(0)\n"
        f"    set_comm({name!r})\n"
        "    time.sleep(100)\n"
        "\ndef g():\n    return list(refused)\n"
    )
    payload = {"cases": [[]], "candidate_packages": ["numpy"]}
    res = sandbox.run(code, "g", CALL, {**payload, "expect": "list"})
    assert res.valid and res.metrics["values"][0] == [-1, 1], res  # -1, EPERM
    start = time.monotonic()
    res = sandbox.run(code, "f", CALL, payload)
    assert res.error_kind == "timeout", res
    assert time.monotonic() - start < 2 + 3.0
    deadline = time.monotonic() + 2.0
    while (left := pids_with_comm(name)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux) to drop a capability")
def test_root_without_cap_sys_admin_falls_back_in_one_line():
    """Root in a container without CAP_SYS_ADMIN cannot set a worker up: the zygote is not chosen (a real
    set-up probe, not only ``euid == 0``), the run says so in one line and uses what the host allows."""
    script = (
        "from coevo.sandbox import zygote\n"
        "from coevo.sandbox.runner import Sandbox, SandboxLimits\n"
        "print(zygote.missing())\nprint(Sandbox(SandboxLimits()).isolation)\n"
    )
    proc = subprocess.run(
        ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=project_root(),
    )
    assert proc.returncode == 0, proc.stderr
    lacks, mode = proc.stdout.strip().splitlines()[-2:]
    assert "unshare: Operation not permitted" in lacks and mode != "zygote"
    assert proc.stderr.count("zygote isolation (the default) not usable") == 1, proc.stderr


def test_a_host_with_hundreds_of_cpus_still_spawns_workers(monkeypatch):
    """A request carries the ``/proc/cpuinfo`` stand-in, 1-2 KB per CPU: on a 300-CPU host (simulated by a
    cpuinfo 300 times this one's) it is past the kernel's default socket buffer (~208 KiB), which made every
    spawn fail (a review found it); the zygote's socket buffer is raised, and the worker reads it whole."""
    real = isolation.proc_stand_in_texts

    def many_cpus(memory_mb):
        texts = real(memory_mb)
        return {**texts, "cpuinfo": texts["cpuinfo"] * 300}

    monkeypatch.setattr(isolation, "proc_stand_in_texts", many_cpus)
    box = Sandbox(SandboxLimits(timeout_s=20, memory_mb=1024, isolation="zygote"))
    want = len(many_cpus(1024)["cpuinfo"])
    assert want > 300_000
    got = _call(box, "def f():\n    return len(open('/proc/cpuinfo').read())\n", expect=None)
    assert got == want

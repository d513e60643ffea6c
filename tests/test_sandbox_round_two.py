"""Issue 45: nothing the host shares is a channel, and the trusted side spends nothing for a candidate. Each
test is one route a hostile candidate took (real sandbox: bubblewrap, the seccomp filter, per-evaluation
cgroups where the machine has them); each failed before the change (what it did then is said in the test).
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import numpy as np
import pytest
from support import BEST_FIT, CALL_CASES, ERRNO_OF, ISOLATION_MODES, sandbox_in

from coevo.ahd import load_problem
from coevo.ahd.evaluate import evaluate_heuristic
from coevo.sandbox.isolation import bwrap_status
from coevo.sandbox.runner import Sandbox, SandboxLimits

HAS_BWRAP = bwrap_status()[0]
pytestmark = [
    pytest.mark.usefixtures("private_cache"),
    pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap is not usable here"),
]
X86 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers of the test are x86_64's")


def _call(sandbox: Sandbox, body: str, *args, expect=None, packages=("numpy",), prelude=""):
    """``f(*args)`` defined by ``body`` after the code ``prelude``, run in the sandbox with ``packages`` importable
    (as problems run)."""
    code = "import os, sys, ctypes, time\n" + prelude + textwrap.dedent(body)
    payload = {"cases": [list(args)], "candidate_packages": list(packages), **({"expect": expect} if expect else {})}
    res = sandbox.run(code, "f", CALL_CASES, payload)
    assert res.valid, res.error
    return res.metrics["values"][0]


# ----------------------------------------------------------------------------- 1: the page cache as a store
#: a file the candidate can open in each isolation mode: a host file of the bubblewrap view (the shared page
#: cache of issue 45), or, in the zygote's worker, where no host file exists, one it writes to its own /tmp
#: (the route itself must still be refused: the filter is the same)
def _probe_file(mode: str) -> str:
    return os.__file__ if mode == "bwrap" else "/tmp/probe.py"


#: candidate code: ``probe(path)``, the path opened read-only, written first (8 KiB) where it is not a host file
PROBE = """
def probe(path, host_path):
    if path != host_path:
        with open(path, 'wb') as fh:
            fh.write(b'# probe\\n' * 1024)
    return os.open(path, os.O_RDONLY)
"""


@X86
@pytest.mark.parametrize("mode", ISOLATION_MODES)
def test_page_cache_state_can_be_neither_set_nor_read(sandbox, mode):
    """Before: posix_fadvise (WILLNEED / DONTNEED) set and cleared whether a page of a bound host file was
    cached, preadv2 with RWF_NOWAIT read that bit back, mincore and cachestat too: one bit per page, shared
    by every evaluation. Now each is refused (EPERM); plain reads and an ordinary preadv still work. In the
    zygote's worker no host file exists at all (checked), and the same calls on its own file are refused."""
    box = sandbox_in(mode, sandbox.limits)
    values = _call(
        box,
        """
        import mmap
        def f(path, host_path):
            out = {'host_file': os.path.exists(host_path)}
            libc = ctypes.CDLL(None, use_errno=True)
            fd = probe(path, host_path)
            out['fadvise_dontneed'] = errno_of(lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))
            out['fadvise_willneed'] = errno_of(lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED))
            buf = bytearray(4096)
            out['preadv_nowait'] = errno_of(lambda: os.preadv(fd, [buf], 0, os.RWF_NOWAIT))
            out['preadv_plain'] = os.preadv(fd, [buf], 0, 0) > 0
            out['readahead'] = [libc.syscall(187, fd, 0, 4096), ctypes.get_errno()]
            m = mmap.mmap(fd, 4096, access=mmap.ACCESS_COPY)
            page = (ctypes.c_char * 4096).from_buffer(m)
            vec = ctypes.create_string_buffer(1)
            out['mincore'] = [libc.syscall(27, ctypes.c_void_p(ctypes.addressof(page)), 4096, vec), ctypes.get_errno()]
            del page
            out['madvise_pageout'] = errno_of(lambda: m.madvise(21))
            out['madvise_cold'] = errno_of(lambda: m.madvise(20))
            out['cachestat'] = [libc.syscall(451, fd, None, None, 0), ctypes.get_errno()]
            out['read'] = len(os.read(fd, 100))
            return out
        """,
        _probe_file(mode),
        os.__file__,
        expect="dict",
        prelude=ERRNO_OF + PROBE,
    )
    assert values["host_file"] is (mode == "bwrap"), values  # zygote: the host's page cache is out of reach
    assert values["fadvise_dontneed"] == values["fadvise_willneed"] == 1, values  # EPERM
    assert values["preadv_nowait"] == 1 and values["preadv_plain"], values
    for name in ("readahead", "mincore", "cachestat"):
        assert values[name] == [-1, 1], (name, values[name])
    assert values["madvise_pageout"] == values["madvise_cold"] == 1, values
    assert values["read"] == 100


@X86
def test_only_local_and_internet_sockets_can_be_made(sandbox):
    """Before: AF_VSOCK (and any other family the kernel has) could be created. Now only the families a
    heuristic could use inside its own network namespace: AF_UNIX, AF_INET, AF_INET6."""
    values = _call(
        sandbox,
        """
        import socket
        def f():
            out = {}
            for name, fam, kind in (('vsock', 40, socket.SOCK_STREAM), ('packet', 17, socket.SOCK_RAW),
                                    ('alg', 38, socket.SOCK_SEQPACKET), ('netlink', 16, socket.SOCK_RAW)):
                try:
                    socket.socket(fam, kind).close()
                    out[name] = 0
                except OSError as exc:
                    out[name] = exc.errno
            a, b = socket.socketpair()
            a.sendall(b'ok')
            out['unix'] = b.recv(2).decode()
            socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
            return out
        """,
        expect="dict",
    )
    assert values["vsock"] == values["packet"] == values["alg"] == values["netlink"] == 1, values  # EPERM
    assert values["unix"] == "ok"


@pytest.mark.parametrize("mode", ISOLATION_MODES)
def test_the_host_system_python_and_compilers_are_not_reachable(sandbox, mode):
    """Before: /usr/lib (3.8 GB), /usr/bin and the system Python's dist-packages were bound: adding
    /usr/lib/python3/dist-packages to sys.path imported the host's yaml / cryptography / apt_pkg, and
    /usr/bin/python3 and gcc ran inside the sandbox. Now only the interpreter, its standard library, the
    allowed packages and the shared libraries they link are there (bubblewrap), or no host file at all
    (the zygote: not even the worker's own interpreter can be executed; os.fork still works)."""
    box = sandbox_in(mode, sandbox.limits)
    values = _call(
        box,
        """
        import subprocess
        def f(interpreters):
            out = {}
            sys.path.append('/usr/lib/python3/dist-packages')
            for mod in ('yaml', 'apt_pkg', 'cryptography'):
                try:
                    __import__(mod)
                    out[mod] = 'imported'
                except ImportError:
                    out[mod] = 'absent'
            for exe in ('/usr/bin/python3', '/usr/bin/gcc', '/usr/bin/cc', 'sh', 'ls'):
                try:
                    out[exe] = subprocess.run([exe, '--version'], capture_output=True).returncode
                except OSError:
                    out[exe] = 'absent'
            out['dist-packages'] = os.path.exists('/usr/lib/python3/dist-packages')
            out['gcc-lib'] = os.path.exists('/usr/lib/gcc')
            for i, exe in enumerate([sys.executable, *interpreters]):
                try:
                    out['interpreter %d' % i] = subprocess.run([exe, '-S', '-c', 'print(1)'],
                                                               capture_output=True).stdout.decode().strip()
                except OSError:
                    out['interpreter %d' % i] = 'absent'
            pid = os.fork()
            if pid == 0:
                os._exit(3)
            out['fork'] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            return out
        """,
        [sys.executable, os.path.realpath(sys.executable), "/bin/sh", "/usr/bin/env"],
        expect="dict",
    )
    assert values["yaml"] == values["apt_pkg"] == values["cryptography"] == "absent", values
    for exe in ("/usr/bin/python3", "/usr/bin/gcc", "/usr/bin/cc", "sh", "ls"):
        assert values[exe] == "absent", (exe, values)
    assert values["dist-packages"] is False and values["gcc-lib"] is False
    assert values["fork"] == 3
    if mode == "bwrap":
        assert values["interpreter 0"] == "1"  # the worker's own interpreter (same allowlist) still runs
    else:  # no host binary exists to execute, the worker's own interpreter included
        assert [values[f"interpreter {i}"] for i in range(5)] == ["absent"] * 5, values


# ----------------------------------------------------------------------------- 2: what the trusted side parses
JUNK_EVERY_REPLY = (
    "import sys\n"
    "_w = sys.modules['__main__']\n"
    "_orig = _w._dumps\n"
    "_w._dumps = lambda h: _orig(dict(h, junk=[[] for _ in range(250_000)]))  # ~1 MiB of JSON per reply\n"
)


def _trusted_cpu(fn) -> tuple[float, object]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def test_a_reply_padded_with_junk_costs_the_trusted_side_nothing(sandbox, bpp):
    """Before: reply headers up to 1 MiB were parsed whole by the trusted process: a candidate appending
    ~1 MiB of junk to every reply cost it 85.8 s of CPU on 3 BPP instances (honest: 1.5 s). Now a reply
    is sized by what the called function can return; an oversize one fails the candidate at once, before
    it is parsed, and the trusted side's CPU stays within 2x an honest evaluation's."""
    inst = bpp.generate(300, 3, seed=11)
    evaluate_heuristic(bpp, BEST_FIT, inst, sandbox=sandbox, with_reference=False)  # warm
    honest_cpu, honest = _trusted_cpu(
        lambda: evaluate_heuristic(bpp, BEST_FIT, inst, sandbox=sandbox, with_reference=False)
    )
    assert honest.valid, honest.error
    junk_cpu, junk = _trusted_cpu(
        lambda: evaluate_heuristic(bpp, JUNK_EVERY_REPLY + BEST_FIT, inst, sandbox=sandbox, with_reference=False)
    )
    assert not junk.valid and junk.error_kind == "sandbox" and "reply" in junk.error, junk.error
    assert junk_cpu <= 2 * honest_cpu, (junk_cpu, honest_cpu)


def test_an_honest_oversized_return_is_a_return_type_failure(sandbox, bpp):
    """A heuristic returning far more numbers than there are bins (an LLM's wrong-shaped priorities) is the
    candidate's wrong return, told by the worker before it writes the reply (it knows the call's bounds), not a
    ``sandbox`` failure of a reply the trusted side refused; it costs the trusted side little."""
    inst = bpp.generate(300, 3, seed=14)
    huge = BEST_FIT.replace("return -(bins - item).astype(np.float64)", "return np.zeros(len(bins) * 100_000)")
    assert huge != BEST_FIT
    evaluate_heuristic(bpp, BEST_FIT, inst, sandbox=sandbox, with_reference=False)  # warm
    honest_cpu, honest = _trusted_cpu(
        lambda: evaluate_heuristic(bpp, BEST_FIT, inst, sandbox=sandbox, with_reference=False)
    )
    big_cpu, big = _trusted_cpu(lambda: evaluate_heuristic(bpp, huge, inst, sandbox=sandbox, with_reference=False))
    assert honest.valid, honest.error
    assert not big.valid and big.error_kind == "return_type", (big.error_kind, big.error)
    assert "bytes, more than the" in big.error and "this call accepts" in big.error, big.error
    assert big_cpu <= 2 * honest_cpu, (big_cpu, honest_cpu)


def test_a_reply_just_under_the_bound_costs_at_most_twice_an_honest_one(sandbox, bpp):
    """The same attack, sized to pass: the heuristic returns its priorities as a Python list (an honest
    LLM heuristic may) padded with the most expensive JSON that still fits. Lists of numbers travel as
    arrays, so an honest list costs what an array costs; the padding stays bounded."""
    inst = bpp.generate(300, 3, seed=12)
    as_list = BEST_FIT.replace("return -(bins - item).astype(np.float64)", "return [float(item - b) for b in bins]")
    pad = (
        "import sys\n"
        "_w = sys.modules['__main__']\n"
        "_orig = _w._dumps\n"
        "_w._dumps = lambda h: _orig(dict(h, junk=[[] for _ in range(60)]))\n"
    )
    evaluate_heuristic(bpp, as_list, inst, sandbox=sandbox, with_reference=False)  # warm
    honest_cpu, honest = _trusted_cpu(
        lambda: evaluate_heuristic(bpp, BEST_FIT, inst, sandbox=sandbox, with_reference=False)
    )
    list_cpu, listed = _trusted_cpu(
        lambda: evaluate_heuristic(bpp, as_list, inst, sandbox=sandbox, with_reference=False)
    )
    padded_cpu, padded = _trusted_cpu(
        lambda: evaluate_heuristic(bpp, pad + as_list, inst, sandbox=sandbox, with_reference=False)
    )
    assert honest.valid and listed.valid, (honest.error, listed.error)
    assert listed.objective == honest.objective
    assert padded.valid or padded.error_kind == "sandbox", padded.error
    assert list_cpu <= 2 * honest_cpu and padded_cpu <= 2 * honest_cpu, (honest_cpu, list_cpu, padded_cpu)


def test_an_output_flood_costs_the_trusted_side_little(bpp):
    """Before: stdout / stderr were drained as fast as the candidate wrote, though only their head and
    tail are kept: Best Fit writing 13 MiB to fd 1 per call cost the trusted process 3.8 s of CPU on
    3 x 300 items (honest: 0.2 s). Now, beyond 32 MiB, they are read at a bounded rate (4 MiB/s) and the
    candidate's writes wait, on its own clock."""
    sandbox = Sandbox(SandboxLimits(timeout_s=8, memory_mb=1024))
    inst = bpp.generate(300, 3, seed=13)
    flood = "import os\n" + BEST_FIT.replace(
        "    return", "    for _ in range(32):\n        os.write(1, b'x' * 65536)\n    return"
    )
    evaluate_heuristic(bpp, BEST_FIT, inst, sandbox=sandbox, with_reference=False)  # warm
    honest_cpu, honest = _trusted_cpu(
        lambda: evaluate_heuristic(bpp, BEST_FIT, inst, sandbox=sandbox, with_reference=False)
    )
    flood_cpu, flooded = _trusted_cpu(
        lambda: evaluate_heuristic(bpp, flood, inst, sandbox=sandbox, with_reference=False)
    )
    assert honest.valid and (flooded.valid or flooded.error_kind == "timeout"), flooded.error
    assert flood_cpu <= 2 * honest_cpu, (flood_cpu, honest_cpu)


# ----------------------------------------------------------------------------- 3: online BPP's future
def test_online_bpp_items_cannot_be_regenerated_from_the_seed(bpp, private_cache):
    """Before: `bpp_online.yaml` names train_seed 2024 / test_seed 1234, and the item stream was
    ``default_rng(seed)``'s: a candidate regenerated it with numpy and planned offline (404.4 bins vs Best
    Fit's 422.0). Now the stream is keyed by a secret drawn once per installation and kept in the cache
    folder (mode 0600, outside the sandbox): the same seed gives the same items here, and items no candidate
    can compute from the seed."""
    inst = bpp.generate(200, 2, seed=2024)
    rng = np.random.default_rng(2024)
    public = np.clip(np.rint(rng.weibull(3.0, 200) * 45.0), 1, 100).astype(np.int64)
    assert not np.array_equal(inst.arrays[0]["items"], public)
    again = bpp.generate(200, 2, seed=2024)
    assert all(np.array_equal(a["items"], b["items"]) for a, b in zip(inst.arrays, again.arrays))
    keys = [p for p in private_cache.rglob("*") if p.is_file() and "key" in p.name]
    assert len(keys) == 1 and (keys[0].stat().st_mode & 0o077) == 0, keys
    # the items still follow FunSearch's Weibull distribution (mean of 45 * Gamma(4/3) ~ 40.2)
    assert 37.0 < float(np.mean(np.concatenate([a["items"] for a in inst.arrays]))) < 43.5


def test_an_instance_key_from_the_environment_reproduces_streams_elsewhere(bpp, monkeypatch):
    """``$COEVO_INSTANCE_KEY`` (64 hex digits) stands for the key file: two installations sharing it draw
    the same items; a malformed value is one error naming the variable."""
    monkeypatch.setenv("COEVO_INSTANCE_KEY", "ab" * 32)
    a = bpp.generate(50, 1, seed=5).arrays[0]["items"]
    monkeypatch.setenv("COEVO_INSTANCE_KEY", "cd" * 32)
    b = bpp.generate(50, 1, seed=5).arrays[0]["items"]
    monkeypatch.setenv("COEVO_INSTANCE_KEY", "ab" * 32)
    assert np.array_equal(a, bpp.generate(50, 1, seed=5).arrays[0]["items"]) and not np.array_equal(a, b)
    monkeypatch.setenv("COEVO_INSTANCE_KEY", "xyz")
    with pytest.raises(ValueError, match="COEVO_INSTANCE_KEY"):
        bpp.generate(50, 1, seed=5)


def test_the_instance_key_is_not_reachable_from_the_sandbox(sandbox, private_cache, bpp):
    bpp.generate(20, 1, seed=1)
    key = next(p for p in private_cache.rglob("*") if p.is_file() and "key" in p.name)
    seen = _call(
        sandbox, f"def f():\n    return [os.path.exists({str(key)!r}), os.path.exists({str(private_cache)!r})]\n"
    )
    assert seen == [False, False]


# ----------------------------------------------------------------------------- 5: host facts in /proc
def test_proc_shows_stand_ins_not_the_host(sandbox, bpp):
    """Before: /proc/stat (the host-wide fork counter: an activity channel between concurrent evaluations),
    /proc/vmstat and /proc/zoneinfo (contradicting the 1 GiB meminfo stand-in), /proc/pressure,
    /proc/diskstats, the kernel build string and the CPU model reached the candidate (and stored failure
    text). Now each is a stand-in, and what ``uname`` still shows is scrubbed from stored failure text."""
    from pathlib import Path

    host_version = Path("/proc/version").read_text().strip()
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    host_model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), None)
    values = _call(
        sandbox,
        """
        def f():
            out = {}
            for name in ('stat', 'vmstat', 'zoneinfo', 'pressure/cpu', 'pressure/memory', 'pressure/io',
                         'diskstats', 'version', 'cpuinfo', 'sys/kernel/version', 'sys/kernel/osrelease',
                         'interrupts', 'softirqs', 'schedstat', 'key-users', 'sys/fs/file-nr', 'locks',
                         'cgroups', 'cmdline'):
                try:
                    out[name] = open('/proc/' + name).read()
                except OSError as exc:
                    out[name] = f'error {exc.errno}'
            out['cpus'] = os.cpu_count()
            return out
        """,
        expect="dict",
    )
    stat = values["stat"]
    assert "processes 0\n" in stat and "ctxt 0\n" in stat, stat[:300]
    assert values["cpus"] == os.cpu_count()
    assert values["version"].strip() != host_version and os.uname().version not in values["sys/kernel/version"]
    assert f"nr_free_pages {1024 * 1024 // 4}\n" in values["vmstat"]  # the 1 GiB of the meminfo stand-in
    assert values["cgroups"] in ("", "error 2") and values["cmdline"] in ("", "error 2")
    if host_model:
        assert host_model not in values["cpuinfo"] and "flags" in values["cpuinfo"]
    for name in ("zoneinfo", "pressure/cpu", "diskstats", "interrupts", "softirqs", "schedstat", "key-users", "locks"):
        text = values[name]
        assert text.startswith("error") or not any(
            ch in "123456789" for ch in text.replace("avg10", "").replace("avg60", "").replace("avg300", "")
        ), (
            name,
            text[:200],
        )
    leak = "import os\n" + BEST_FIT.replace(
        "    return", "    raise RuntimeError(' | '.join([*os.uname(), open('/proc/cpuinfo').read()[:0]]))\n    return"
    )
    res = evaluate_heuristic(bpp, leak, bpp.generate(20, 1, seed=1), sandbox=sandbox, with_reference=False)
    assert not res.valid and "<kernel>" in res.error, res.error
    assert os.uname().version not in res.error and os.uname().release not in res.error


# ----------------------------------------------------------------------------- 6: a hang at import time
def test_a_hang_at_import_time_is_one_instance_limit():
    """Before: a module body looping forever was bounded only by the whole evaluation's limit (start + the
    per-instance limit times the instance count: `coevo heuristics eval ... --instances 8` gave no answer in
    300 s). Now loading the code is bounded by the per-instance limit, and that timeout ends the evaluation."""
    tsp = load_problem("tsp_construct")
    hang = "while True:\n    pass\n\n" + tsp.seed_heuristic_code()
    start = time.perf_counter()
    res = evaluate_heuristic(
        tsp,
        hang,
        tsp.generate(10, 8, seed=1),
        sandbox=Sandbox(SandboxLimits(timeout_s=30)),
        with_reference=False,
        keep_going=True,
        instance_timeout_s=2.0,
    )
    took = time.perf_counter() - start
    assert not res.valid and res.error_kind == "timeout", res.error
    assert took < 2.0 + 4.0, took  # one limit and start-up, not 8 limits


def test_the_hang_counts_once_from_the_cli(tmp_path, capsys):
    from coevo.cli import build_parser, main

    build_parser()  # its imports (torch, ...) happen before the clock starts
    tsp = load_problem("tsp_construct")
    path = tmp_path / "hang.py"
    path.write_text("while True:\n    pass\n\n" + tsp.seed_heuristic_code())
    start = time.perf_counter()
    rc = main(["heuristics", "eval", "tsp_construct", str(path), "--size", "10", "--count", "8", "--timeout", "2"])
    assert rc == 3 and time.perf_counter() - start < 2.0 + 5.0
    assert "timeout" in capsys.readouterr().out


def test_honest_heuristics_are_unchanged(sandbox):
    """The four problems' seed heuristics still evaluate valid through the narrowed sandbox."""
    for name in ("tsp_construct", "kp_construct", "cvrp_construct", "bpp_online"):
        problem = load_problem(name)
        size = {"tsp_construct": 20, "kp_construct": 50, "cvrp_construct": 20, "bpp_online": 100}[name]
        res = evaluate_heuristic(
            problem, problem.seed_heuristic_code(), problem.generate(size, 2, 3), sandbox=sandbox, with_reference=False
        )
        assert res.valid, (name, res.error)
    assert sys.executable  # the tests ran under the project's interpreter


# ----------------------------------------------------------------------------- fallbacks
def test_a_missing_measure_is_one_line_naming_it_and_evaluations_go_on(monkeypatch, caplog):
    """docs/sandbox.md "Fallbacks": a host without a measure says so once, naming what still holds."""
    import logging

    from coevo.sandbox import runner

    monkeypatch.setattr(runner, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="coevo.sandbox.runner"):
        first = Sandbox(SandboxLimits(timeout_s=20), use_cgroups=False)
        Sandbox(SandboxLimits(timeout_s=20), use_cgroups=False)
    lines = [r.getMessage() for r in caplog.records if "cgroup" in r.getMessage()]
    assert len(lines) == 1 and "per process" in lines[0] and "wall-clock limit" in lines[0], lines
    res = first.run("def f(x):\n    return x + 1\n", "f", CALL_CASES, {"cases": [[1]], "candidate_packages": ["numpy"]})
    assert res.valid and res.metrics["values"] == [2]


def test_a_resume_with_another_instance_key_stops_with_one_line(tmp_path, private_cache):
    """The run folder keeps the fingerprint of the key its BPP streams were drawn with: a resume on an
    installation with another key would evaluate on other instances, so it stops naming both files."""
    from coevo.ahd.instances import instance_key_path
    from coevo.ahd.seeds import KEY_FILE, check_instance_key
    from coevo.errors import RunFolderError

    first = check_instance_key(tmp_path / "run")
    assert check_instance_key(tmp_path / "run") == first and (tmp_path / "run" / KEY_FILE).is_file()
    instance_key_path().unlink()  # another installation: a fresh key is drawn
    with pytest.raises(RunFolderError, match="instance key"):
        check_instance_key(tmp_path / "run")


def test_syscall_numbers_match_the_kernel_headers():
    """The seccomp tables against the installed kernel headers (x86_64's unistd_64.h, and asm-generic's
    unistd.h, which is aarch64's numbering): every name a header defines has the table's number."""
    import re
    from pathlib import Path

    from coevo.sandbox import seccomp

    headers = {
        "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        "aarch64": Path("/usr/include/asm-generic/unistd.h"),
    }
    checked = 0
    for machine, header in headers.items():
        if not header.is_file():
            continue
        text = header.read_text()
        numbers = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", text)}
        table = seccomp.ARCHES[machine][2]
        wrong = {n: (v, numbers[n]) for n, v in table.items() if n in numbers and numbers[n] != v}
        assert not wrong, (machine, wrong)
        checked += sum(n in numbers for n in table)
    if not checked:
        pytest.skip("no kernel headers installed")
    assert checked > 40

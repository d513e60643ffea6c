"""The sandbox runner against real hostile programs, in real (bubblewrap-isolated) processes.

Every failure kind is produced by actual code doing the bad thing; the checks look at the host afterwards
(process table, filesystem, a listening socket) rather than trusting the sandbox's own report.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid

import pytest
from support import ISOLATION_MODES, SET_COMM, pids_with_cmdline, pids_with_comm, sandbox_in

from coevo.sandbox import runner
from coevo.sandbox.isolation import bwrap_status
from coevo.sandbox.runner import Sandbox, SandboxLimits
from coevo.sandbox.targets import greedy_route

CALL = "coevo.sandbox.targets:call_cases"
ROUTE = "coevo.sandbox.targets:greedy_route"
HAS_BWRAP = bwrap_status()[0]
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap is not usable here")
FAST = SandboxLimits(timeout_s=2.0, memory_mb=512)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(FAST, use_bwrap=True) if HAS_BWRAP else Sandbox(FAST)


def wait_gone(token: str, within_s: float = 2.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := pids_with_cmdline(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def call(sb: Sandbox, code: str, cases: list | None = None, **payload):
    return sb.execute(code, "f", CALL, {"cases": cases if cases is not None else [[]], **payload})


def test_valid_program_returns_the_targets_metrics(sandbox):
    code = (
        "import math\n\ndef select_next_node(current, destination, unvisited, dist):\n"
        "    return min(unvisited, key=lambda n: dist[current][n])\n"
    )
    payload = {"n": 12, "instances": 3, "seed": 5}
    run = sandbox.execute(code, "select_next_node", ROUTE, payload)
    assert run.result.valid and run.result.error_kind is None
    expected = greedy_route(lambda c, d, u, m: min(u, key=lambda n: m[c][n]), payload)
    assert run.result.metrics["objectives"] == pytest.approx(expected["objectives"], rel=1e-12)
    assert run.result.duration_s > 0 and run.isolation == sandbox.isolation


def test_infinite_loop_times_out(sandbox):
    start = time.monotonic()
    result = call(sandbox, "def f():\n    while True:\n        pass\n").result
    assert result.error_kind == "timeout" and "2 s" in result.error
    assert time.monotonic() - start < FAST.timeout_s + 1.5


def test_sleep_past_timeout(sandbox):
    start = time.monotonic()
    result = call(sandbox, "import time\n\ndef f():\n    time.sleep(30)\n    return 1\n").result
    assert result.error_kind == "timeout"
    assert time.monotonic() - start < FAST.timeout_s + 1.5


def test_import_time_hang(sandbox):
    start = time.monotonic()
    result = call(sandbox, "import time\nwhile True:\n    time.sleep(0.01)\n\ndef f():\n    return 1\n").result
    assert result.error_kind == "timeout"
    assert time.monotonic() - start < FAST.timeout_s + 1.5


def test_memory_bomb(sandbox):
    result = call(
        sandbox, "def f():\n    blocks = []\n    while True:\n        blocks.append(bytes(64 << 20))\n"
    ).result
    assert result.error_kind == "memory" and "MemoryError" in result.error


def wait_comm_gone(name: str, within_s: float = 2.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := pids_with_comm(name)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.parametrize("mode", ISOLATION_MODES)
def test_fork_bomb_leaves_no_process_and_returns_in_time(mode):
    """Under bubblewrap each child executes the worker's interpreter (a command line the host can find); in
    the zygote's worker, where nothing can be executed, each is a fork named by ``prctl(PR_SET_NAME)``."""
    sandbox = sandbox_in(mode, FAST)
    token = f"forkbomb{uuid.uuid4().hex}"
    name = token[:15]
    if mode == "bwrap":
        child = f"os.execv(sys.executable, [sys.executable, '-S', '-c', 'import time; time.sleep(100)', '{token}'])\n"
    else:
        child = f"set_comm({name!r})\n            time.sleep(100)\n            os._exit(0)\n"
    code = (
        "import os, sys, time\n" + SET_COMM + "def f():\n"
        "    for _ in range(40):\n"
        "        if os.fork() == 0:\n"
        f"            {child}"
        "    time.sleep(100)\n"
    )
    start = time.monotonic()
    result = call(sandbox, code).result
    assert result.error_kind == "timeout"
    assert time.monotonic() - start < FAST.timeout_s + 2.0
    assert wait_gone(token) == [] and wait_comm_gone(name) == []


@pytest.mark.parametrize("mode", ISOLATION_MODES)
def test_grandchild_sleep_is_dead_after_a_normal_exit(mode):
    """Two sleepers, one in a new session, outlive nothing after the worker returns normally. Under bubblewrap
    they are the worker's own interpreter (the sandbox has no ``sleep`` binary); in the zygote's worker no
    interpreter can be executed (checked), so they are forks named by ``prctl(PR_SET_NAME)``."""
    sandbox = sandbox_in(mode, FAST)
    token = f"coevo-sleeper-{uuid.uuid4().hex[:12]}"
    name = f"slp{uuid.uuid4().hex[:12]}"
    sleeper = f"[sys.executable, '-S', '-c', 'import time; time.sleep(100)', '{token}']"
    code = (
        "import os, subprocess, sys, time\n" + SET_COMM + "def f():\n"
        "    try:\n"
        f"        subprocess.Popen({sleeper})\n"
        f"        subprocess.Popen({sleeper}, start_new_session=True)\n"
        "        return 7\n"
        "    except OSError:  # nothing to execute: forked sleepers instead\n"
        "        for new_session in (False, True):\n"
        "            if os.fork() == 0:\n"
        "                if new_session:\n"
        "                    os.setsid()\n"
        f"                set_comm({name!r})\n"
        "                time.sleep(100)\n"
        "                os._exit(0)\n"
        "        time.sleep(0.2)\n"
        "        return 8\n"
    )
    run = call(sandbox, code, expect="int")
    assert run.result.valid and run.result.metrics == {"values": [7 if mode == "bwrap" else 8]}, run.result
    assert wait_gone(token) == [] and wait_comm_gone(name) == []


@needs_bwrap
def test_file_writes_outside_the_temp_dir_fail(sandbox, tmp_path):
    outside = [
        f"/work/coevo-sandbox-escape-{uuid.uuid4().hex}",
        "/etc/coevo-sandbox-escape",
        os.path.join(os.path.expanduser("~"), f"coevo-sandbox-escape-{uuid.uuid4().hex}"),
        str(tmp_path / "escape.txt"),
    ]
    code = (
        "import os, tempfile\n"
        "def f(paths):\n"
        "    out = {}\n"
        "    for p in paths:\n"
        "        try:\n"
        "            with open(p, 'w') as fh:\n"
        "                fh.write('x')\n"
        "            out[p] = 'written'\n"
        "        except OSError as exc:\n"
        "            out[p] = type(exc).__name__ + ': ' + str(exc)\n"
        "    inside = os.path.join(tempfile.gettempdir(), 'ok.txt')\n"
        "    with open(inside, 'w') as fh:\n"
        "        fh.write('fine')\n"
        "    out['inside'] = open(inside).read() + ' ' + str(os.getcwd() == tempfile.gettempdir())\n"
        "    return out\n"
    )
    run = call(sandbox, code, [[outside]], expect="dict")
    assert run.result.valid, run.result.error
    written = run.result.metrics["values"][0]
    assert written.pop("inside") == "fine True"
    assert all(v != "written" for v in written.values()), written
    assert not any(os.path.exists(p) for p in outside)


@needs_bwrap
def test_network_connect_to_host_loopback_is_refused(sandbox):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "def f(port):\n"
            "    try:\n"
            "        socket.create_connection(('127.0.0.1', port), timeout=0.5).close()\n"
            "        return 'connected'\n"
            "    except OSError as exc:\n"
            "        return type(exc).__name__\n"
        )
        run = call(sandbox, code, [[port]], expect="str")
        assert run.result.valid, run.result.error
        assert run.result.metrics["values"][0] in ("ConnectionRefusedError", "OSError", "TimeoutError")
        with pytest.raises(BlockingIOError):
            server.accept()


def test_nul_bytes_and_prose_in_llm_output_still_evaluate(sandbox):
    text = (
        "{Return twice the input.}\n\x00Here you go:\r\n"
        "def f(x):\r\n    return\x00 2 * x\r\n\r\nThis doubles x. It's that simple.\n"
    )
    result, extraction = sandbox.run_response(text, "f", CALL, {"cases": [[3], [4]], "expect": "int"})
    assert extraction.thought == "Return twice the input."
    assert result.valid and result.metrics == {"values": [6, 8]}


def test_parse_and_syntax_failures_from_llm_output(sandbox):
    result, _ = sandbox.run_response("I would use a greedy rule.", "f", CALL, {"cases": [[]]})
    assert result.error_kind == "parse" and not result.valid
    result, _ = sandbox.run_response("```python\ndef f(:\n    return 1\n```", "f", CALL, {"cases": [[]]})
    assert result.error_kind == "syntax"


def test_syntax_error_in_code_reaching_the_worker(sandbox):
    result = call(sandbox, "def f():\n    return (1,\n").result
    assert result.error_kind == "syntax" and "line" in result.error


def test_import_error(sandbox):
    result = call(sandbox, "import coevo_no_such_module_xyz\n\ndef f():\n    return 1\n").result
    assert result.error_kind == "import" and "coevo_no_such_module_xyz" in result.error


def test_wrong_return_type_and_infeasible_and_runtime(sandbox):
    wrong = call(sandbox, "def f():\n    return 'node 3'\n", expect="int").result
    assert wrong.error_kind == "return_type" and "InvalidReturn" in wrong.error
    infeasible = call(sandbox, "def f():\n    return 9\n", expect="int", allowed=[1, 2]).result
    assert infeasible.error_kind == "infeasible"
    runtime = call(sandbox, "def f():\n    return 1 / 0\n").result
    assert runtime.error_kind == "runtime" and "ZeroDivisionError" in runtime.error and "line 2" in runtime.error


def test_missing_function_exit_and_output_flood(sandbox):
    assert call(sandbox, "def g():\n    return 1\n").result.error_kind == "parse"
    died = call(sandbox, "import os\n\ndef f():\n    os._exit(3)\n").result
    assert died.error_kind == "sandbox" and "exit code 3" in died.error
    flood = call(sandbox, "import sys\n\ndef f():\n    sys.stdout.write('y' * (8 << 20))\n    return 1\n")
    assert flood.result.valid and len(flood.stdout) < 2 * FAST.max_output_kb * 1024 + 200
    assert "bytes dropped" in flood.stdout
    bad_target = sandbox.run("def f():\n    return 1\n", "f", "coevo.no_such_mod:fn", {})
    assert bad_target.error_kind == "sandbox" and "no_such_mod" in bad_target.error


def test_bad_arguments_are_named(sandbox):
    with pytest.raises(ValueError, match="target"):
        sandbox.run("def f(): return 1", "f", "no-colon", {})
    with pytest.raises(ValueError, match="payload"):
        sandbox.run("def f(): return 1", "f", CALL, {"x": object()})
    with pytest.raises(ValueError, match="function_name"):
        sandbox.run("def f(): return 1", "1f", CALL, {})
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=math.nan)


def test_without_bwrap_limits_apply_and_warning_is_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(runner, "_warned", set())
    limits = SandboxLimits(timeout_s=10.0, cpu_s=1, memory_mb=512)  # wall slack for busy cores
    with caplog.at_level(logging.WARNING, logger="coevo.sandbox.runner"):
        plain = Sandbox(limits, use_bwrap=False)
        Sandbox(limits, use_bwrap=False)
    warnings = [r for r in caplog.records if "no usable bubblewrap" in r.getMessage()]
    assert len(warnings) == 1 and plain.isolation == "rlimits"
    spin = call(plain, "def f():\n    while True:\n        pass\n").result
    assert spin.error_kind == "timeout" and "CPU limit" in spin.error  # RLIMIT_CPU (1 s) before the 10 s wall
    bomb = call(plain, "def f():\n    return len(bytearray(1 << 31))\n").result
    assert bomb.error_kind == "memory"
    token = f"0.{str(uuid.uuid4().int)[:12]}"
    escaped = call(
        plain,
        f"import subprocess\ndef f():\n    subprocess.Popen(['sleep', '100', '{token}'], "
        "start_new_session=True)\n    return 1\n",
    )
    assert escaped.result.valid and wait_gone(token) == []


def test_problem_folder_and_data_under_tmp_stay_visible(tmp_path):
    """``--tmpfs /tmp`` hides the host's /tmp: python_path folders and payload paths are bound back."""
    module = f"coevo_tmp_target_{uuid.uuid4().hex[:8]}"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / f"{module}.py").write_text(
        "def run(fn, payload):\n"
        "    with open(payload['data']) as fh:\n"
        "        numbers = [int(x) for x in fh.read().split()]\n"
        "    return {'total': sum(fn(x) for x in numbers)}\n"
    )
    data = tmp_path / "data" / "numbers.txt"
    data.parent.mkdir()
    data.write_text("1 2 3")
    sb = Sandbox(FAST, python_path=[tmp_path / "pkg"])
    result = sb.run("def f(x):\n    return x * x\n", "f", f"{module}:run", {"data": str(data)})
    assert result.valid, result.error
    assert result.metrics == {"total": 14}

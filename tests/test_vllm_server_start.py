"""Starting vLLM's OpenAI server (``coevo.backends.vllm_server``): what is refused before any process starts.

No vLLM needed: the port check runs before the server's process is made."""

from __future__ import annotations

import socket

import pytest

from coevo.backends.vllm_server import ServerStartError, port_is_free, start_vllm_server


def test_a_port_another_server_listens_on_is_refused_before_starting(tmp_path):
    """Before: a server left running on the port answered the readiness check, so the new one (which then exited
    on the busy port) seemed to start, and its caller measured the old server (benchmarks/llm4ad_peer.py)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert not port_is_free(port)
        with pytest.raises(ServerStartError, match=f"port {port} on 127.0.0.1 is in use"):
            start_vllm_server(tmp_path, "m", tmp_path / "server.log", [], port=port)
        assert not (tmp_path / "server.log").exists()  # nothing was started
    assert port_is_free(port)

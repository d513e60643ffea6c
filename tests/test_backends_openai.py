"""OpenAIPolicy against a real local HTTP server speaking the chat-completions protocol.

The test double here is the remote model itself: a stdlib ``http.server`` on 127.0.0.1 (free port) that
answers ``POST /v1/chat/completions`` with proper ``chat.completion`` JSON (id, choices, finish_reason,
usage). Its "model" writes back a deterministic function of the request (the last user message upper-cased,
the seed and the temperature) so the tests can check what went over the wire. Everything else - the
openai client, HTTP, JSON, threads, retries - is real.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coevo.backends.base import PolicyError, SamplingParams, decode_deadline
from coevo.backends.openai_api import OpenAIPolicy
from coevo.errors import DeadlineReached


class ChatServer(ThreadingHTTPServer):
    """A chat-completions server; ``mode`` selects its behaviour, ``requests`` records every POST body."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ChatHandler)
        self.mode = "ok"
        self.requests: list[dict] = []
        self.failures_left = 0
        self.delay_s = 0.0  # each answer waits this long (or until ``release`` is set)
        self.release = threading.Event()
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class ChatHandler(BaseHTTPRequestHandler):
    server: ChatServer

    def log_message(self, *args) -> None:  # keep test output clean
        return

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        with srv.lock:
            srv.requests.append(body)
            fail = srv.failures_left > 0 or srv.mode == "always_500"
            srv.failures_left = max(0, srv.failures_left - 1)
        if srv.delay_s:
            srv.release.wait(srv.delay_s)
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
        if fail:
            return self._send(500, {"error": {"message": "engine overloaded", "type": "server_error"}})
        if srv.mode == "bad_request" or body["model"] != "tiny-chat":
            code = 400 if srv.mode == "bad_request" else 404
            return self._send(
                code,
                {
                    "error": {
                        "message": "context too long" if code == 400 else "no such model",
                        "type": "invalid_request_error",
                    }
                },
            )
        user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        text = f"{user.upper()} seed={body.get('seed')} t={body['temperature']} END tail"
        words = text.split()
        finish = "length" if len(words) > body["max_tokens"] else "stop"
        text = " ".join(words[: body["max_tokens"]])
        prompt_tokens = sum(len(m["content"].split()) for m in body["messages"])
        self._send(
            200,
            {
                "id": f"chatcmpl-{len(srv.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(text.split()),
                    "total_tokens": prompt_tokens + len(text.split()),
                },
            },
        )


@pytest.fixture
def server():
    srv = ChatServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def _convs(*texts: str) -> list[list[dict]]:
    return [[{"role": "system", "content": "be brief"}, {"role": "user", "content": t}] for t in texts]


def test_batch_completions_in_order_with_usage_and_seed(server):
    policy = OpenAIPolicy("tiny-chat", server.base_url, concurrency=3)
    out = policy.generate(
        _convs("one", "two words", "three", "four"), SamplingParams(max_new_tokens=50, temperature=0.7, seed=10)
    )
    assert [c.text for c in out] == [
        f"{w} seed={10 + i} t=0.7 END tail" for i, w in enumerate(["ONE", "TWO WORDS", "THREE", "FOUR"])
    ]
    assert all(c.finish_reason == "stop" and c.meta["attempts"] == 1 for c in out)
    assert out[1].prompt_tokens == 4 and out[1].completion_tokens == 6
    assert len(server.requests) == 4
    assert all(r["n"] == 1 and r["max_tokens"] == 50 and r["top_p"] == 1.0 for r in server.requests)
    assert "top_k" not in server.requests[0]
    policy.close()


def test_length_stop_strings_and_top_k(server):
    policy = OpenAIPolicy("tiny-chat", server.base_url)
    (short,) = policy.generate(_convs("a b c"), SamplingParams(max_new_tokens=2, temperature=0))
    assert short.text == "A B" and short.finish_reason == "length" and short.meta["finish_reason"] == "length"
    (cut,) = policy.generate(_convs("x"), SamplingParams(max_new_tokens=20, top_k=5, stop=(" END", "zz")))
    assert cut.text == "X seed=None t=1.0" and cut.finish_reason == "stop"
    assert server.requests[-1]["stop"] == [" END", "zz"] and server.requests[-1]["top_k"] == 5
    assert "seed" not in server.requests[-1]


def test_retries_500_twice_then_ok(server):
    server.failures_left = 2
    policy = OpenAIPolicy("tiny-chat", server.base_url, max_retries=3, backoff_s=0.05)
    t0 = time.perf_counter()
    (c,) = policy.generate(_convs("hello"), SamplingParams(max_new_tokens=10, seed=1))
    assert c.text.startswith("HELLO seed=1")
    assert c.meta["attempts"] == 3 and len(server.requests) == 3
    assert time.perf_counter() - t0 >= 0.05 + 0.1  # exponential backoff: 0.05 s, then 0.1 s


def test_persistent_500_raises_policy_error_after_bounded_retries(server):
    server.mode = "always_500"
    policy = OpenAIPolicy("tiny-chat", server.base_url, max_retries=2, backoff_s=0.01)
    with pytest.raises(PolicyError, match=r"127\.0\.0\.1.*3 attempt\(s\).*HTTP 500"):
        policy.generate(_convs("hello"), SamplingParams(max_new_tokens=10))
    assert len(server.requests) == 3


def test_bad_request_becomes_error_completion(server):
    server.mode = "bad_request"
    policy = OpenAIPolicy("tiny-chat", server.base_url, max_retries=3, backoff_s=0.01)
    (c,) = policy.generate(_convs("too long"), SamplingParams(max_new_tokens=10))
    assert c.finish_reason == "error" and c.text == "" and "400" in c.error
    assert len(server.requests) == 1  # not retried


def test_unknown_model_is_policy_error_without_retries(server):
    policy = OpenAIPolicy("no-such-model", server.base_url, max_retries=3, backoff_s=0.01)
    with pytest.raises(PolicyError, match="HTTP 404"):
        policy.generate(_convs("hi"), SamplingParams(max_new_tokens=10))
    assert len(server.requests) == 1


def test_closed_port_gives_clear_policy_error_quickly():
    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    policy = OpenAIPolicy("tiny-chat", url, max_retries=1, backoff_s=0.05, timeout_s=5)
    t0 = time.perf_counter()
    with pytest.raises(PolicyError) as info:
        policy.generate(_convs("hi"), SamplingParams(max_new_tokens=5))
    assert time.perf_counter() - t0 < 5
    msg = str(info.value)
    assert url in msg and "2 attempt(s)" in msg and "APIConnectionError" in msg


def test_api_key_from_environment(server, monkeypatch):
    monkeypatch.setenv("COEVO_TEST_KEY", "sk-local-123")
    policy = OpenAIPolicy("tiny-chat", server.base_url, api_key_env="COEVO_TEST_KEY")
    assert policy.client.api_key == "sk-local-123"
    assert OpenAIPolicy("tiny-chat", server.base_url, api_key_env="COEVO_UNSET_KEY_XYZ").client.api_key == "EMPTY"


def test_no_parameter_space(server):
    policy = OpenAIPolicy("tiny-chat", server.base_url)
    assert policy.has_parameters is False
    with pytest.raises(TypeError, match="no parameter space"):
        policy.named_parameters()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"base_url": "localhost:8000"}, "base_url"),
        ({"max_retries": -1}, "max_retries"),
        ({"concurrency": 0}, "concurrency"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"model": ""}, "model"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    args = {"model": "tiny-chat", "base_url": "http://127.0.0.1:1/v1", **kwargs}
    with pytest.raises(ValueError, match=field):
        OpenAIPolicy(**args)


def test_bad_generate_input_names_the_field(server):
    policy = OpenAIPolicy("tiny-chat", server.base_url)
    with pytest.raises(ValueError, match=r"conversations\[0\]\[0\]\['role'\]"):
        policy.generate([[{"role": "robot", "content": "x"}]], SamplingParams())
    assert server.requests == []


def test_requests_are_bounded_by_the_decode_deadline(server):
    server.delay_s = 30.0  # a busy server: every answer takes 30 s
    policy = OpenAIPolicy("tiny-chat", server.base_url, concurrency=2, timeout_s=120, max_retries=3)
    began = time.monotonic()
    with pytest.raises(DeadlineReached) as cut, decode_deadline(began + 0.5):
        policy.generate(_convs("one", "two"), SamplingParams(max_new_tokens=5))
    assert time.monotonic() - began < 5  # the timeout was the time left, not timeout_s, and nothing was retried
    assert (cut.value.rows, cut.value.backend) == (2, "openai")
    assert len(server.requests) == 2
    with pytest.raises(DeadlineReached), decode_deadline(time.monotonic() - 1):
        policy.generate(_convs("three"), SamplingParams(max_new_tokens=5))
    assert len(server.requests) == 2  # past the deadline: no request is sent
    server.release.set()
    server.delay_s = 0.0
    with decode_deadline(time.monotonic() + 60):  # with time left, requests run as before
        assert policy.generate(_convs("four"), SamplingParams(max_new_tokens=5))[0].text.startswith("FOUR")
    policy.close()


def test_vllm_server_continues_a_prefilled_answer_with_its_request_fields(server):
    prefilled = [*_convs("write f")[0], {"role": "assistant", "content": "```python\ndef f():\n    # idea:"}]
    stops = tuple(f"\n{c}" for c in "abcdef")  # more than the OpenAI API's 4
    policy = OpenAIPolicy("tiny-chat", server.base_url, vllm_server=True)
    assert policy.can_continue_final_message and policy.can_constrain
    policy.generate([prefilled], SamplingParams(max_new_tokens=20, stop=stops, regex="[a-z]+"))
    sent = server.requests[-1]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["messages"][-1] == prefilled[-1] and sent["stop"] == list(stops)
    assert sent["structured_outputs"] == {"regex": "[a-z]+"}
    policy.generate(_convs("plain"), SamplingParams(max_new_tokens=20))  # a plain chat: no continuation fields
    assert "continue_final_message" not in server.requests[-1]


def test_other_endpoints_cannot_continue_or_constrain(server):
    policy = OpenAIPolicy("tiny-chat", server.base_url)
    assert not policy.can_continue_final_message and not policy.can_constrain
    policy.generate(_convs("x"), SamplingParams(max_new_tokens=20, stop=tuple(f"\n{c}" for c in "abcdef")))
    assert len(server.requests[-1]["stop"]) == 4 and "continue_final_message" not in server.requests[-1]
    with pytest.raises(PolicyError, match="answer_grammar"):
        policy.generate(_convs("x"), SamplingParams(max_new_tokens=20, regex="[a-z]+"))

"""OpenAIPolicy against a real local HTTP server speaking the chat-completions protocol.

The test double here is the remote model itself: a stdlib ``http.server`` on 127.0.0.1 (free port) that
answers ``POST /v1/chat/completions`` with proper ``chat.completion`` JSON (id, choices, finish_reason,
usage) and ``GET /v1/models``. Its "model" writes back a deterministic function of the request (the last user
message upper-cased, the seed and the temperature) so the tests can check what went over the wire. Its refusals
are vLLM 0.32's, body and status as its server sends them (``vllm/entrypoints/serve``): the request validation
error for more stop strings than ``VLLM_MAX_STOP_STRINGS``, "The model `x` does not exist." (404),
``{"error": "Unauthorized"}`` (401, ``--api-key``), a prompt past the context (400). Everything else - the
openai client, HTTP, JSON, threads, retries - is real.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from coevo.backends.base import PolicyError, SamplingParams, decode_deadline
from coevo.backends.openai_api import OpenAIPolicy
from coevo.cli import main
from coevo.errors import DeadlineReached, EndpointError
from coevo.store import TrajectoryStore


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
        self.stop_limit: int | None = None  # vLLM's VLLM_MAX_STOP_STRINGS (None: any number)
        self.api_key: str | None = None  # vLLM's --api-key (None: any key)
        self.context = 10**6  # prompt words + max_tokens above this: vLLM's 400 "maximum context length"
        self.reply: str | None = None  # the "model"'s text for every request (default: the echo above)

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

    def _refuse(self, code: int, message: str, param: str | None = None) -> None:
        phrase = {400: "Bad Request", 404: "Not Found"}[code]  # vLLM's ErrorResponse
        self._send(code, {"error": {"message": message, "type": phrase, "param": param, "code": code}})

    def _authorized(self) -> bool:
        key = self.server.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send(401, {"error": "Unauthorized"})  # vLLM's authentication middleware
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path != "/v1/models":
            return self._send(404, {"detail": "Not Found"})
        self._send(200, {"object": "list", "data": [{"id": "tiny-chat", "object": "model", "owned_by": "vllm"}]})

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
            return self._send(404, {"detail": "Not Found"})  # FastAPI's answer for an unknown route
        if not self._authorized():
            return None
        if fail:
            return self._send(500, {"error": {"message": "engine overloaded", "type": "server_error"}})
        stop = body.get("stop") or []
        if srv.stop_limit is not None and len(stop) > srv.stop_limit:
            return self._refuse(
                400,
                "2 validation errors:\n"
                f"  {{'type': 'string_type', 'loc': 'body.stop', 'msg': 'Input should be a valid string', "
                f"'input': '<list of {len(stop)} items>'}}\n"
                f"  {{'type': 'too_long', 'loc': 'body.stop', 'msg': 'List should have at most {srv.stop_limit} "
                f"items after validation, not {len(stop)}', 'input': '<list of {len(stop)} items>', "
                f"'ctx': {{'field_type': 'List', 'max_length': {srv.stop_limit}, 'actual_length': {len(stop)}}}}}",
                "body.stop",
            )
        prompt_tokens = sum(len(m["content"].split()) for m in body["messages"])
        if srv.mode == "bad_request" or prompt_tokens + body["max_tokens"] > srv.context:
            asked = prompt_tokens + body["max_tokens"]
            return self._refuse(
                400,
                f"This model's maximum context length is {srv.context} tokens. However, you requested {asked} "
                f"tokens ({prompt_tokens} in the messages, {body['max_tokens']} in the completion). Please reduce "
                "the length of the messages or completion.",
            )
        if body["model"] != "tiny-chat":
            return self._refuse(404, f"The model `{body['model']}` does not exist.", "model")
        user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        text = srv.reply or f"{user.upper()} seed={body.get('seed')} t={body['temperature']} END tail"
        hits = [i for i in (text.find(s) for s in stop) if i >= 0]  # vLLM: cut at the first stop string sent
        text = text[: min(hits)] if hits else text
        words = text.split()
        finish = "length" if len(words) > body["max_tokens"] else "stop"
        text = text if srv.reply else " ".join(words[: body["max_tokens"]])
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


def test_unknown_model_is_one_line_naming_model_name_without_retries(server):
    policy = OpenAIPolicy("no-such-model", server.base_url, max_retries=3, backoff_s=0.01)
    with pytest.raises(EndpointError) as info:
        policy.generate(_convs("hi"), SamplingParams(max_new_tokens=10))
    assert len(server.requests) == 1
    assert str(info.value) == (
        f"model server {server.base_url} refused the request (HTTP 404: The model `no-such-model` does not exist.); "
        "model.name: the server does not serve 'no-such-model' (it serves: tiny-chat)"
    )


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
    assert time.monotonic() - began < 15  # the time left (0.5 s), not timeout_s (120 s) or the delay (30 s), no retry
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


# ------------------------------------------------------------------------- stop strings a server takes
PREFILLED = [*_convs("write f")[0], {"role": "assistant", "content": "```python\ndef f():\n    # idea:"}]


def test_a_vllm_server_limit_on_stop_strings_is_learned_once_and_the_text_is_cut_at_every_one(server, caplog):
    """vLLM's server started with its defaults takes at most VLLM_MAX_STOP_STRINGS = 4 stop strings: the first
    request offering more is refused with the limit in its message, sent again at once with the first 4, and
    the rest cut the text afterwards (same text as a server that took them all)."""
    server.stop_limit = 4
    stops = tuple(f"\n{c}" for c in "abcdef") + (" END",)  # the one the reply holds comes last (7th)
    policy = OpenAIPolicy("tiny-chat", server.base_url, vllm_server=True, concurrency=1, max_retries=0)
    assert policy.stop_limit is None
    with caplog.at_level("WARNING", logger="coevo.backends.openai_api"):
        out = policy.generate([PREFILLED, PREFILLED], SamplingParams(max_new_tokens=20, stop=stops, seed=1))
    assert [c.text for c in out] == ["WRITE F seed=1 t=1.0", "WRITE F seed=2 t=1.0"]  # cut at " END", not sent
    assert all(c.error is None and c.finish_reason == "stop" and c.meta["attempts"] == 1 for c in out)
    assert [c.meta["stop_strings_sent"] for c in out] == [4, 4] and policy.stop_limit == 4
    assert [len(r["stop"]) for r in server.requests] == [7, 4, 4]  # refused once, then the limit holds
    assert server.requests[1]["stop"] == list(stops[:4]) and server.requests[1]["continue_final_message"] is True
    (line,) = [r.getMessage() for r in caplog.records]
    assert "at most 4 stop strings" in line and "VLLM_MAX_STOP_STRINGS=128" in line


def test_every_stop_string_goes_where_the_server_takes_them_and_max_stop_strings_caps_them(server):
    server.stop_limit = 128  # started with VLLM_MAX_STOP_STRINGS=128
    stops = tuple(f"\n{chr(c)}" for c in range(33, 127))  # 94, the function-end rule's count
    policy = OpenAIPolicy("tiny-chat", server.base_url, vllm_server=True)
    policy.generate([PREFILLED], SamplingParams(max_new_tokens=20, stop=stops))
    assert len(server.requests) == 1 and server.requests[0]["stop"] == list(stops)
    capped = OpenAIPolicy("tiny-chat", server.base_url, vllm_server=True, max_stop_strings=2)
    (c,) = capped.generate([PREFILLED], SamplingParams(max_new_tokens=20, stop=(*stops[:2], " END")))
    assert server.requests[-1]["stop"] == list(stops[:2]) and c.text.endswith("t=1.0")
    with pytest.raises(ValueError, match="max_stop_strings"):
        OpenAIPolicy("tiny-chat", server.base_url, max_stop_strings=-1)


# ------------------------------------------------------------------------------------------ refusals
def test_refusals_in_a_row_raise_one_line_with_the_server_reason_and_the_setting(server):
    """max_refusals requests refused the same way in a row (numbers in the message aside) end the call with
    EndpointError; before that each is an invalid sample; an answer in between starts the count again."""
    server.context = 30
    policy = OpenAIPolicy("tiny-chat", server.base_url, max_refusals=3, max_retries=2, concurrency=1)
    long = SamplingParams(max_new_tokens=40)
    first = policy.generate(_convs("a", "b c"), long)  # 2 refusals (different numbers: the same kind)
    assert [c.finish_reason for c in first] == ["error", "error"] and all("HTTP 400" in c.error for c in first)
    assert first[0].meta == {"attempts": 1, "status": 400}
    assert policy.generate(_convs("ok"), SamplingParams(max_new_tokens=5))[0].error is None  # resets the count
    policy.generate(_convs("a", "b"), long)
    with pytest.raises(EndpointError) as info:
        policy.generate(_convs("c"), long)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"model server {server.base_url} refused 3 requests in a row (HTTP 400: ")
    assert "This model's maximum context length is 30 tokens" in msg and "lower sampling.max_new_tokens" in msg
    assert msg.endswith("the run stops (model.max_refusals: 3)")
    assert len(server.requests) == 6  # a refusal is never retried


def test_a_refused_key_is_one_line_naming_the_env_var(server, monkeypatch):
    server.api_key = "sk-right"
    monkeypatch.setenv("COEVO_TEST_KEY", "sk-wrong")
    policy = OpenAIPolicy("tiny-chat", server.base_url, api_key_env="COEVO_TEST_KEY", max_retries=3)
    with pytest.raises(
        EndpointError,
        match=r"\(HTTP 401: Unauthorized\); check the key: model.api_key_env names "
        r"the environment variable holding it \(\$COEVO_TEST_KEY is set\)",
    ):
        policy.generate(_convs("hi"), SamplingParams(max_new_tokens=5))
    assert len(server.requests) == 1
    unset = OpenAIPolicy("tiny-chat", server.base_url, api_key_env="COEVO_UNSET_KEY_XYZ")
    with pytest.raises(EndpointError, match=r'\$COEVO_UNSET_KEY_XYZ is not set, so "EMPTY" was sent'):
        unset.probe()


# ---------------------------------------------------------------------------------------------- probe
def test_probe_says_what_the_server_serves_and_learns_its_stop_limit(server):
    assert OpenAIPolicy("tiny-chat", server.base_url).probe() == f"model server {server.base_url} serves tiny-chat"
    assert server.requests[-1]["max_tokens"] == 1 and "stop" not in server.requests[-1]
    server.stop_limit = 4
    policy = OpenAIPolicy("tiny-chat", server.base_url, vllm_server=True)
    line = policy.probe()
    assert line.startswith(f"model server {server.base_url} serves tiny-chat (vLLM server: it takes at most 4 stop")
    assert policy.stop_limit == 4 and [len(r.get("stop", [])) for r in server.requests[-2:]] == [128, 4]
    server.stop_limit = None
    line = OpenAIPolicy("tiny-chat", server.base_url, vllm_server=True).probe()
    assert line.endswith("(vLLM server: every stop string is sent)")


def test_probe_names_the_field_of_a_wrong_url_model_or_route(server):
    with pytest.raises(EndpointError, match=r"model.name: the server does not serve 'gpt-x' \(it serves: tiny-chat\)"):
        OpenAIPolicy("gpt-x", server.base_url).probe()
    root = server.base_url.removesuffix("/v1")  # the URL without the API prefix: no such route
    with pytest.raises(EndpointError, match=r"HTTP 404: Not Found\); model.base_url: .* has no chat-completions route"):
        OpenAIPolicy("tiny-chat", root).probe()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(EndpointError) as info:
        OpenAIPolicy("tiny-chat", f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_s=0.05).probe()
    assert time.perf_counter() - t0 < 10
    assert str(info.value) == (
        f"model.base_url: the model server http://127.0.0.1:{port}/v1 did not answer after 2 attempt(s) "
        "(ConnectError: [Errno 111] Connection refused); is it running, and is the URL right?"
    )
    with pytest.raises(EndpointError, match=r"model.base_url: .*no-such-host.invalid.* \(ConnectError: "):
        OpenAIPolicy("tiny-chat", "http://no-such-host.invalid:8000/v1", max_retries=0).probe()


# ------------------------------------------------------------------------------- the run, end to end
#: a prefilled TSP answer's continuation as a model writes it: the body, the closing fence, then text past the
#: function's end that only the cut afterwards removes on a server taking 4 stop strings ("\nprint" is not among them)
ANSWER = (
    " go to the nearest unvisited node.\n"
    "    d = distance_matrix[current_node, unvisited_nodes]\n"
    "    return int(unvisited_nodes[np.argmin(d)])\n"
    "print(select_next_node(0, 1, np.array([2, 3]), np.eye(4)))\n"
    "```\n\nThis heuristic picks the nearest node."
)


def _served_run(tmp_path, server, **model) -> Path:
    """A tiny EoH run config on ``server`` (vLLM's server: prefilled answers), written to a file."""
    data = {
        "run": {"name": "served", "seed": 3},
        "model": {"name": "tiny-chat", "backend": "openai", "base_url": server.base_url, "vllm_server": True, **model},
        "sampling": {"max_new_tokens": 64, "stop": ["\n```\n"]},
        "budget": {"max_rounds": 1, "max_samples": 16},
        "evolvers": [
            {
                "name": "eoh",
                "type": "eoh",
                "problem": "tsp_construct",
                "train_size": 8,
                "train_count": 2,
                "test_sizes": [8],
                "test_count": 2,
                "validation_count": 0,
                "eval_timeout_s": 60,  # a loaded CI machine: the sandbox's start must not time the answer out
                "eval_memory_mb": 1024,
                "eval_workers": 1,
                "population_size": 2,
            }
        ],
        "report": {"plots": False},
    }
    path = tmp_path / "served.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_run_on_a_server_taking_4_stop_strings_finds_the_heuristic(tmp_path, server, private_cache, capsys):
    """`coevo run` on vLLM's server started with its defaults: the probe learns the limit, every request sends
    the 4 most useful stop strings, the text is cut at the function's end afterwards and the answer is valid."""
    server.stop_limit, server.reply = 4, ANSWER
    out = tmp_path / "run"
    assert main(["run", str(_served_run(tmp_path, server)), "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"model server {server.base_url} serves tiny-chat (vLLM server: it takes at most 4 stop strings" in err
    sent = [r["stop"] for r in server.requests if r["max_tokens"] == 64]
    fitting = [s for s in sent if len(s) <= 4]  # the requests the server answered (longer lists got its 400)
    assert fitting and all(s == ["\n`", "\n    # idea:", "\nd", "\n#"] for s in fitting)
    assert sent[-1] == fitting[-1]  # once learned, the limit holds (requests in flight before may arrive late)
    with TrajectoryStore(out / "store.sqlite") as store:
        samples = [t for t in store.query(run_id=out.name) if t.meta.get("operator") == "i1"]
    assert len(samples) == 4 and samples[0].valid and samples[0].steps[0].model_output.endswith("np.argmin(d)])")
    assert {t.failure for t in samples[1:]} == {"duplicate"}  # the same answer again: not evaluated twice


def test_a_run_whose_every_request_is_refused_stops_with_one_line(tmp_path, server, private_cache, capsys):
    """The probe (1 token) passes, every sample's request is refused (prompt + max_tokens past the context):
    after model.max_refusals refusals in a row the run stops with the server's reason, exit 2, in seconds."""
    server.context = 50
    out = tmp_path / "run"
    t0 = time.perf_counter()
    code = main(["run", str(_served_run(tmp_path, server, max_refusals=3)), "--out", str(out), "--no-progress"])
    assert code == 2 and time.perf_counter() - t0 < 30
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(f"coevo run: error: model server {server.base_url} refused 3 requests in a row (")
    assert "HTTP 400: This model's maximum context length is 50 tokens. However, you requested" in lines[-1]
    assert lines[-1].endswith(
        "lower sampling.max_new_tokens, or give the server a longer context (vLLM: "
        "--max-model-len); the run stops (model.max_refusals: 3)"
    )
    assert len([r for r in server.requests if r["max_tokens"] == 64]) <= 4  # 4 in flight at once, then no more
    with TrajectoryStore(out / "store.sqlite") as store:
        assert store.count_llm_calls(out.name) == 0  # the refused batch is not recorded: no 64 failures


def test_run_and_check_probe_the_endpoint_before_any_sample(tmp_path, server, capsys, monkeypatch):
    cfg = _served_run(tmp_path, server)
    assert main(["run", str(cfg), "--check", "--probe-endpoint"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"config OK: {cfg} (eoh (eoh)); model server {server.base_url} serves tiny-chat (vLLM server: every stop "
        "string is sent); nothing else was started"
    )
    assert main(["run", str(cfg), "--check"]) == 0 and len(server.requests) == 1  # --check alone sends nothing
    bad = _served_run(tmp_path, server, name="qwen-7b")
    assert main(["run", str(bad), "--check", "--probe-endpoint"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"coevo run: error: model server {server.base_url} refused the request (HTTP 404: The model `qwen-7b` does "
        "not exist.); model.name: the server does not serve 'qwen-7b' (it serves: tiny-chat)"
    )
    server.api_key = "sk-right"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "(HTTP 401: Unauthorized); check the key: model.api_key_env" in line and "$OPENAI_API_KEY" in line
    assert not out.exists() and len(server.requests) == 3  # no run folder, no sample: the probe only
    assert main(["run", str(cfg), "--probe-endpoint"]) == 2
    assert "--probe-endpoint goes with --check" in capsys.readouterr().err

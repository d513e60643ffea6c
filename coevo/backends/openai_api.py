"""Any OpenAI-compatible chat-completions endpoint as a :class:`~coevo.backends.base.Policy`.

Works with OpenAI, vLLM / SGLang / llama.cpp servers and other servers speaking ``POST
/v1/chat/completions``. The policy has no parameter space (context evolution only). Transient failures
(connection errors, timeouts, HTTP 408/409/429 and 5xx) are retried a bounded number of times with exponential
backoff; when the endpoint stays down, :class:`~coevo.backends.base.PolicyError` names the base URL and the
cause.

Refusals (an HTTP 4xx other than 408/409/429: retrying the same request gets the same answer):

* 401 / 403 (the key), 404 (the model name, or a base URL without the chat route): raise
  :class:`~coevo.errors.EndpointError` at once, one line with the server's message and the config field to change
  (``model.api_key_env``, ``model.name`` with the models the server lists, ``model.base_url``).
* any other (400 / 413 / 422, e.g. a prompt longer than the context) becomes a ``finish_reason="error"``
  completion, so the caller records an invalid sample; ``max_refusals`` of them in a row refused the same way
  (same status, same message up to its numbers) raise :class:`~coevo.errors.EndpointError` (the server's message
  and the setting to change): a run whose every request is refused stops within one batch instead of spending
  its budget on failures.

:meth:`OpenAIPolicy.probe` sends one request of one token: what ``coevo run`` does before the run spends its
budget (and ``coevo run --check --probe-endpoint``), so a wrong base URL, model name or key is one line before
any sample.

Deadline (:func:`coevo.backends.base.decode_deadline`, the run's wall-clock budget): each request's timeout is
``min(timeout_s, time left to the deadline)``, and no request or backoff starts past it; a call whose deadline
passes raises :class:`~coevo.errors.DeadlineReached` and returns nothing (the server may still finish the
requests in flight, their answers are dropped).

vLLM's server (``vllm_server=True``, config ``model.vllm_server``): its extension fields of the chat request are
used: a conversation ending with an assistant message (a prefilled answer) is sent with
``continue_final_message: true, add_generation_prompt: false`` so the model continues that message and the
reply holds only the continuation; a ``SamplingParams.regex`` is sent as ``structured_outputs: {regex}``. Other
endpoints cannot continue a message: callers send them no such conversation (``Policy.can_continue_final_message``
is False) and a regex raises.

Stop strings: a request carries the first ``max_stop_strings`` of ``SamplingParams.stop`` (callers order them most
useful first, :func:`coevo.ahd.answer.answer_stops`), and the reply's text is cut at every one of them afterwards
(:func:`coevo.backends.cut_at_stop`, as for a backend that ignores stop strings), so the text is the same whatever
the server took; what a short list costs is the tokens the server decodes past the first stop it was not sent.
The OpenAI API takes at most 4. vLLM's server takes at most ``VLLM_MAX_STOP_STRINGS`` (an environment variable of
the server, default 4 in vLLM 0.32; its request validation answers HTTP 400 "List should have at most 4 items");
by default (``max_stop_strings=None``) every stop string is sent to it, and the first such 400 sets the limit to
the number it names: the request is sent again at once (not counted as a retry), the limit holds for the
policy's later requests and is logged once (``Completion.meta["stop_strings_sent"]`` says how many went).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

from coevo.backends import check_conversations, check_sampling_params, cut_at_stop
from coevo.backends.base import (
    Completion,
    Message,
    Policy,
    PolicyError,
    SamplingParams,
    continues_final_message,
    current_deadline,
    deadline_passed,
    deadline_reached,
)
from coevo.errors import DeadlineReached, EndpointError

log = logging.getLogger(__name__)

_RETRY_STATUS = (408, 409, 429)  # plus every 5xx: transient, retried with backoff
#: refusals that concern the endpoint, the model or the key, never one request: raised at once
_ENDPOINT_STATUS = (401, 403, 404)
#: the OpenAI API accepts at most 4 stop sequences; further ones are applied to the text afterwards
API_STOP_LIMIT = 4
#: a request validation error naming the most stop strings the server takes: vLLM's server (pydantic) answers
#: "... 'loc': ('body', 'stop'), 'msg': 'List should have at most 4 items after validation, not 99' ..."
_STOP_LIMIT = re.compile(r"\bstop\b.{0,80}?\bat most (\d+) items?\b", re.DOTALL)
#: how many stop strings :meth:`OpenAIPolicy.probe` offers a vLLM server to learn its limit (more than a
#: prefilled answer's 99)
_PROBE_STOPS = 128
#: one error of vLLM's request validation message (pydantic's, ``loc`` joined with dots by vLLM)
_VALIDATION_ITEM = re.compile(r"'loc': '([^']*)', 'msg': '([^']*)'")
#: characters of a server's message quoted in an error line
_QUOTE_CHARS = 300


def server_message(exc: openai.APIStatusError) -> str:
    """The server's own message of an HTTP error, on one line and at most 300 characters: the ``message`` of its
    JSON error body (``{"error": {"message": ...}}``, ``{"error": "..."}``, FastAPI's ``{"detail": ...}``), else the
    client's text; a vLLM request validation message is shortened to its ``loc: msg`` pairs."""
    body = exc.body
    text = body if isinstance(body, str) else None  # vLLM's 401: {"error": "Unauthorized"}
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        text = inner.get("message") or inner.get("detail")
    text = " ".join(str(text or exc.message).split())
    fields = _VALIDATION_ITEM.findall(text)  # vLLM's request validation: "N validation errors: {'loc', 'msg'}..."
    if fields:
        text = "; ".join(dict.fromkeys(f"{loc}: {msg}" for loc, msg in fields))
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."


class OpenAIPolicy(Policy):
    """Chat completions from an OpenAI-compatible server.

    Args:
        model: model name sent with each request.
        base_url: server URL including the API prefix, e.g. ``http://127.0.0.1:8000/v1``.
        api_key: the key; if None, read from the environment variable ``api_key_env``; if that is unset
            too, the placeholder "EMPTY" is sent (local servers ignore it).
        api_key_env: name of the environment variable holding the key.
        max_retries: retries after the first attempt on connection errors, timeouts, 408/409/429 and 5xx (>= 0).
        backoff_s: first backoff (s); attempt k waits ``min(backoff_s * 2**k, backoff_max_s)``.
        backoff_max_s: cap of one backoff (s).
        timeout_s: per-request timeout (s).
        concurrency: requests in flight at once (threads, >= 1).
        vllm_server: the endpoint is vLLM's OpenAI-compatible server (module docstring).
        max_stop_strings: most stop strings per request (>= 0); None: every one on vLLM's server until it
            names a lower limit, 4 on other endpoints (module docstring, "Stop strings").
        max_refusals: requests refused the same way in a row (an HTTP 4xx that retrying does not change) after
            which :meth:`generate` raises :class:`~coevo.errors.EndpointError` (>= 1).

    Raises:
        ValueError: a bad argument (named).
    """

    has_parameters = False

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        max_retries: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        timeout_s: float = 120.0,
        concurrency: int = 4,
        vllm_server: bool = False,
        max_stop_strings: int | None = None,
        max_refusals: int = 8,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty string")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        for name, v in (("backoff_s", backoff_s), ("backoff_max_s", backoff_max_s), ("timeout_s", timeout_s)):
            if not isinstance(v, (int, float)) or v < 0 or (name == "timeout_s" and v == 0):
                raise ValueError(f"{name} must be a number >= 0 (timeout_s > 0), got {v!r}")
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        if max_stop_strings is not None and (not isinstance(max_stop_strings, int) or max_stop_strings < 0):
            raise ValueError(f"max_stop_strings must be None or an int >= 0, got {max_stop_strings!r}")
        if not isinstance(max_refusals, int) or max_refusals < 1:
            raise ValueError(f"max_refusals must be an int >= 1, got {max_refusals!r}")
        self.model_id = model
        self.base_url = base_url
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = float(backoff_max_s)
        self.concurrency = concurrency
        self.timeout_s = float(timeout_s)
        self.vllm_server = bool(vllm_server)
        self.can_continue_final_message = self.vllm_server
        self.can_constrain = self.vllm_server
        self.api_key_env = api_key_env
        self.max_refusals = max_refusals
        #: most stop strings per request; None: all (learned down from the server's answer, module docstring)
        self.stop_limit: int | None = max_stop_strings
        if max_stop_strings is None and not self.vllm_server:
            self.stop_limit = API_STOP_LIMIT
        self._lock = threading.Lock()
        self._told_limit = False  # the line saying stop strings are cut to the server's limit was logged
        self._refusal: tuple[int, str] | None = None  # the last refusal's kind (status, message without numbers)
        self._refusals = 0  # refusals of that kind in a row
        self._key_source = "argument" if api_key is not None else f"${api_key_env}"
        self._key_set = api_key is not None or bool(os.environ.get(api_key_env))
        key = api_key if api_key is not None else os.environ.get(api_key_env) or "EMPTY"
        # retries are ours (bounded, counted); the client makes exactly one attempt per call
        self.client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s)

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        """One chat completion (n=1) per conversation, ``concurrency`` requests at a time.

        With ``params.seed = s``, conversation ``i`` is sent with seed ``s + i`` so that equal prompts in one
        batch give distinct samples (as on :class:`~coevo.backends.hf.HFPolicy`); whether a seed makes
        the output reproducible depends on the server. ``top_k > 0`` is sent as the ``top_k`` extension
        field (vLLM, SGLang, llama.cpp). ``Completion.meta`` holds ``attempts``, the server's ``finish_reason`` and
        ``stop_strings_sent``. The text is cut at every stop string of ``params.stop``, sent or not.

        Raises:
            ValueError, TypeError: malformed conversations or params (field named).
            PolicyError: the endpoint is unreachable or keeps failing after the retries.
            EndpointError: the server refuses the key, the model or the route (HTTP 401/403/404), or refused
                ``max_refusals`` requests in a row the same way (module docstring).
            DeadlineReached: the decode deadline passed (module docstring).
        """
        check_conversations(conversations)
        check_sampling_params(params)
        if params.regex is not None and not self.vllm_server:
            raise PolicyError(
                f"endpoint {self.base_url} cannot constrain decoding to a regex (answer_grammar): only vLLM's "
                "server can (model.vllm_server)"
            )
        if not conversations:
            return []
        began, deadline = time.monotonic(), current_deadline()
        if deadline_passed(deadline):
            raise deadline_reached("openai", len(conversations))
        seeds = [None if params.seed is None else params.seed + i for i in range(len(conversations))]
        try:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
                return list(
                    pool.map(lambda cs: self._complete(cs[0], params, cs[1], deadline), zip(conversations, seeds))
                )
        except DeadlineReached:
            raise deadline_reached("openai", len(conversations), started=began) from None

    def probe(self) -> str:
        """Check the endpoint with one request of one token (``max_tokens: 1``, not a sample of any run) and
        return one line saying what it serves; on vLLM's server the request also offers 128 stop strings, so the
        limit it names (module docstring, "Stop strings") is learned here, before the run's first sample.

        Raises:
            EndpointError: one line naming the config field to change: the base URL does not answer
                (``model.base_url``: connection refused, unknown host, timeouts after the retries), the server
                refuses the key (``model.api_key_env``), does not serve the model (``model.name``) or has no chat
                route there (``model.base_url``), or refuses the request otherwise (its message quoted).
        """
        stop = tuple(f"\n<coevo probe {i}>" for i in range(_PROBE_STOPS)) if self.stop_limit is None else ()
        params = SamplingParams(max_new_tokens=1, temperature=0.0, stop=stop)
        self._told_limit = True  # the returned line says it (the run's own policy logs it once)
        try:
            comp = self._complete([{"role": "user", "content": "Say OK."}], params, None, count_refusal=False)
        except PolicyError as e:
            cause = e.__cause__
            if isinstance(cause, openai.APIStatusError):  # 5xx after the retries
                detail = f"HTTP {cause.status_code}: {server_message(cause)}"
            else:  # the connection: refused, unknown host, timeout
                root = cause.__cause__ if cause is not None and cause.__cause__ is not None else cause
                detail = f"{type(root).__name__}: {' '.join(str(root).split())}" if root is not None else str(e)
            raise EndpointError(
                f"model.base_url: the model server {self.base_url} did not answer after {self.max_retries + 1} "
                f"attempt(s) ({detail}); is it running, and is the URL right?"
            ) from e
        if comp.error is not None:
            raise EndpointError(
                f"model server {self.base_url} refused a first request ({comp.error}); "
                f"{self._what_to_change(comp.meta['status'], comp.error)}"
            )
        line = f"model server {self.base_url} serves {self.model_id}"
        if self.vllm_server:
            sent = "every stop string is sent" if self.stop_limit is None else self._limit_line()
            line += f" (vLLM server: {sent})"
        return line

    def _limit_line(self) -> str:
        return (
            f"it takes at most {self.stop_limit} stop strings per request: the {self.stop_limit} that end most "
            "answers are sent, the text is cut at the others afterwards, and the tokens decoded past them are "
            "wasted; start vLLM's server with VLLM_MAX_STOP_STRINGS=128 to stop at every one (docs/guide.md)"
        )

    def _request(self, conversation: list[Message], params: SamplingParams, seed: int | None) -> dict[str, Any]:
        req: dict[str, Any] = {
            "model": self.model_id,
            "messages": conversation,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": 1,
        }
        if seed is not None:
            req["seed"] = seed
        limit = self.stop_limit
        stop = list(params.stop if limit is None else params.stop[:limit])
        if stop:
            req["stop"] = stop
        extra: dict[str, Any] = {}
        if params.top_k > 0:
            extra["top_k"] = params.top_k
        if self.vllm_server and continues_final_message(conversation):
            extra.update(continue_final_message=True, add_generation_prompt=False)
        if params.regex is not None:
            extra["structured_outputs"] = {"regex": params.regex}
        if extra:
            req["extra_body"] = extra
        return req

    def _timeout(self, deadline: float | None) -> float:
        """This request's timeout (s): ``timeout_s``, bounded by the time left to ``deadline``.

        Raises:
            DeadlineReached: no time is left.
        """
        if deadline is None:
            return self.timeout_s
        left = deadline - time.monotonic()
        if left <= 0:
            raise deadline_reached("openai", 1)
        return min(self.timeout_s, left)

    def _complete(
        self,
        conversation: list[Message],
        params: SamplingParams,
        seed: int | None,
        deadline: float | None = None,
        *,
        count_refusal: bool = True,
    ) -> Completion:
        t0 = time.perf_counter()
        attempt = 0
        while True:
            req = self._request(conversation, params, seed)
            sent = len(req.get("stop", ()))
            try:
                resp = self.client.chat.completions.create(**req, timeout=self._timeout(deadline))
            except openai.APIStatusError as e:
                status = e.status_code
                if status not in _RETRY_STATUS and status < 500:
                    if self._learn_stop_limit(e, sent):
                        continue  # the same request with fewer stop strings at once: not a retry
                    return self._refused(e, attempt + 1, time.perf_counter() - t0, count_refusal)
                cause: Exception = e
            except openai.APIConnectionError as e:  # APITimeoutError included
                if deadline_passed(deadline):
                    raise deadline_reached("openai", 1) from None
                cause = e
            else:
                with self._lock:
                    self._refusal, self._refusals = None, 0
                comp = self._to_completion(resp, params, attempt + 1, time.perf_counter() - t0)
                comp.meta["stop_strings_sent"] = sent
                return comp
            if attempt >= self.max_retries:
                break
            wait = min(self.backoff_s * 2**attempt, self.backoff_max_s)
            if deadline is not None and time.monotonic() + wait >= deadline:
                raise deadline_reached("openai", 1)
            time.sleep(wait)
            attempt += 1
        detail = f"HTTP {cause.status_code}" if isinstance(cause, openai.APIStatusError) else type(cause).__name__
        raise PolicyError(
            f"endpoint {self.base_url} failed after {self.max_retries + 1} attempt(s): {detail}: {cause}"
        ) from cause

    def _learn_stop_limit(self, exc: openai.APIStatusError, sent: int) -> bool:
        """Whether ``exc`` names a stop-string limit below ``sent`` (module docstring); it becomes the limit."""
        m = _STOP_LIMIT.search(str(exc.body) + " " + exc.message)
        if m is None or int(m.group(1)) >= sent:
            return False
        with self._lock:
            if self.stop_limit is None or self.stop_limit > int(m.group(1)):
                self.stop_limit = int(m.group(1))
            if not self._told_limit:
                self._told_limit = True
                log.warning("model server %s: %s", self.base_url, self._limit_line())
        return True

    def _refused(self, exc: openai.APIStatusError, attempts: int, duration: float, count: bool) -> Completion:
        """The completion of a refused request (an invalid sample), or :class:`EndpointError` (module docstring)."""
        status, message = exc.status_code, server_message(exc)
        if status in _ENDPOINT_STATUS:
            raise EndpointError(
                f"model server {self.base_url} refused the request (HTTP {status}: {message}); "
                f"{self._what_to_change(status, message)}"
            ) from exc
        if count:
            kind = (status, re.sub(r"\d+", "#", message))
            with self._lock:
                self._refusals = self._refusals + 1 if kind == self._refusal else 1
                self._refusal, refusals = kind, self._refusals
            if refusals >= self.max_refusals:
                raise EndpointError(
                    f"model server {self.base_url} refused {self.max_refusals} requests in a row (HTTP {status}: "
                    f"{message}); "
                    f"{self._what_to_change(status, message)}; the run stops (model.max_refusals: "
                    f"{self.max_refusals})"
                ) from exc
        return Completion(
            text="",
            finish_reason="error",
            error=f"HTTP {status}: {message}",
            duration_s=duration,
            meta={"attempts": attempts, "status": status},
        )

    def _what_to_change(self, status: int, message: str) -> str:
        """The config field a refusal points at, as a clause for its error line."""
        low = message.lower()
        if status in (401, 403):
            state = "is set" if self._key_set else 'is not set, so "EMPTY" was sent'
            key = "the key given" if self._key_source == "argument" else f"{self._key_source} {state}"
            return f"check the key: model.api_key_env names the environment variable holding it ({key})"
        if status == 404 and "model" in low:
            return f"model.name: the server does not serve {self.model_id!r}{self._served()}"
        if status in (404, 405):
            return f"model.base_url: {self.base_url} has no chat-completions route (such URLs end with /v1)"
        if _STOP_LIMIT.search(message) or re.search(r"\bstop\b", low):
            return "set model.max_stop_strings to the number of stop strings the server takes"
        if "context" in low or "max_tokens" in low or "max_model_len" in low:
            return "lower sampling.max_new_tokens, or give the server a longer context (vLLM: --max-model-len)"
        return "the request is what the config asks for: check the model.* and sampling.* settings"

    def _served(self) -> str:
        """``" (it serves: a, b)"``: the models the server lists (``GET /models``), or "" when it lists none."""
        try:
            names = [m.id for m in self.client.models.list(timeout=min(self.timeout_s, 10.0))]
        except Exception:  # noqa: BLE001 - only a hint in an error line: no listing is no hint
            return ""
        return f" (it serves: {', '.join(names)})" if names else ""

    @staticmethod
    def _to_completion(resp: Any, params: SamplingParams, attempts: int, duration: float) -> Completion:
        usage = getattr(resp, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        meta: dict[str, Any] = {"attempts": attempts, "response_id": getattr(resp, "id", None)}
        choices = getattr(resp, "choices", None) or []
        if not choices:
            return Completion(
                text="",
                prompt_tokens=prompt_tokens,
                finish_reason="error",
                error="response has no choices",
                duration_s=duration,
                meta=meta,
            )
        choice = choices[0]
        text = (choice.message.content if choice.message is not None else None) or ""
        text, stopped = cut_at_stop(text, params.stop)  # every stop string, sent or not (module docstring)
        raw_reason = choice.finish_reason
        meta["finish_reason"] = raw_reason
        reason = "length" if raw_reason == "length" and not stopped else "stop"
        return Completion(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=reason,
            duration_s=duration,
            meta=meta,
        )

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()

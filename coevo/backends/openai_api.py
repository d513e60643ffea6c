"""Any OpenAI-compatible chat-completions endpoint as a :class:`~coevo.backends.base.Policy`.

Works with OpenAI, vLLM / SGLang / llama.cpp servers and other servers speaking ``POST
/v1/chat/completions``. The policy has no parameter space (context evolution only). Transient failures
(connection errors, timeouts, HTTP 408/409/429 and 5xx) are retried a bounded number of times with exponential
backoff; when the endpoint stays down, :class:`~coevo.backends.base.PolicyError` names the base URL and the
cause. A request the server rejects as malformed (HTTP 400/422, e.g. a prompt longer than the context)
becomes a ``finish_reason="error"`` completion, so the caller records an invalid sample.

Deadline (:func:`coevo.backends.base.decode_deadline`, the run's wall-clock budget): each request's timeout is
``min(timeout_s, time left to the deadline)``, and no request or backoff starts past it; a call whose deadline
passes raises :class:`~coevo.errors.DeadlineReached` and returns nothing (the server may still finish the
requests in flight, their answers are dropped).

vLLM's server (``vllm_server=True``, config ``model.vllm_server``): its extension fields of the chat request are
used: a conversation ending with an assistant message (a prefilled answer) is sent with
``continue_final_message: true, add_generation_prompt: false`` so the model continues that message and the
reply holds only the continuation; every stop string is sent (the OpenAI API takes at most 4); a
``SamplingParams.regex`` is sent as ``structured_outputs: {regex}``. Other endpoints cannot continue a message:
callers send them no such conversation (``Policy.can_continue_final_message`` is False) and a regex raises.
"""

from __future__ import annotations

import os
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
from coevo.errors import DeadlineReached

_RETRY_STATUS = (408, 409, 429)  # plus every 5xx: transient, retried with backoff
_MAX_API_STOP = 4  # the OpenAI API accepts at most 4 stop sequences; further ones are applied client-side


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
        key = api_key if api_key is not None else os.environ.get(api_key_env) or "EMPTY"
        # retries are ours (bounded, counted); the client makes exactly one attempt per call
        self.client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s)

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        """One chat completion (n=1) per conversation, ``concurrency`` requests at a time.

        With ``params.seed = s``, conversation ``i`` is sent with seed ``s + i`` so that equal prompts in one
        batch give distinct samples (as on :class:`~coevo.backends.hf.HFPolicy`); whether a seed makes
        the output reproducible depends on the server. ``top_k > 0`` is sent as the ``top_k`` extension
        field (vLLM, SGLang, llama.cpp). ``Completion.meta`` holds ``attempts`` and the server's
        ``finish_reason``.

        Raises:
            ValueError, TypeError: malformed conversations or params (field named).
            PolicyError: the endpoint is unreachable, keeps failing after the retries, or refuses the
                model or key (HTTP 401/403/404).
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
        if params.stop:
            req["stop"] = list(params.stop if self.vllm_server else params.stop[:_MAX_API_STOP])
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
        self, conversation: list[Message], params: SamplingParams, seed: int | None, deadline: float | None = None
    ) -> Completion:
        req = self._request(conversation, params, seed)
        t0 = time.perf_counter()
        for attempt in range(self.max_retries + 1):
            try:
                resp = self.client.chat.completions.create(**req, timeout=self._timeout(deadline))
                return self._to_completion(resp, params, attempt + 1, time.perf_counter() - t0)
            except openai.APIStatusError as e:
                status = e.status_code
                if status in (400, 413, 422):  # the request itself is bad: an invalid sample, not a dead server
                    return Completion(
                        text="",
                        finish_reason="error",
                        error=f"HTTP {status}: {e.message}",
                        duration_s=time.perf_counter() - t0,
                        meta={"attempts": attempt + 1},
                    )
                if status not in _RETRY_STATUS and status < 500:
                    raise PolicyError(
                        f"endpoint {self.base_url} refused the request (HTTP {status}): {e.message}"
                    ) from e
                cause: Exception = e
            except openai.APIConnectionError as e:  # APITimeoutError included
                if deadline_passed(deadline):
                    raise deadline_reached("openai", 1) from None
                cause = e
            if attempt < self.max_retries:
                wait = min(self.backoff_s * 2**attempt, self.backoff_max_s)
                if deadline is not None and time.monotonic() + wait >= deadline:
                    raise deadline_reached("openai", 1)
                time.sleep(wait)
        detail = f"HTTP {cause.status_code}" if isinstance(cause, openai.APIStatusError) else type(cause).__name__
        raise PolicyError(
            f"endpoint {self.base_url} failed after {self.max_retries + 1} attempt(s): {detail}: {cause}"
        ) from cause

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
        text, stopped = cut_at_stop(text, params.stop)
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

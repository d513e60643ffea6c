"""Model backends: the :class:`Policy` protocol and its implementations.

* :class:`~coevo.backends.hf.HFPolicy` - a local transformers model (parameter space for ES).
* :class:`~coevo.backends.openai_api.OpenAIPolicy` - any OpenAI-compatible chat endpoint (context only).
* :mod:`coevo.backends.models` - the embedded default model and :func:`resolve_model`.
* :mod:`coevo.backends.tiny` - tiny random Qwen2 models for tests.

The heavy backends are imported lazily (``from coevo.backends import HFPolicy`` imports torch only then).
This module also holds the input checks every backend applies to ``generate`` arguments, so that bad
input fails with the same clear message whatever the backend.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from coevo.backends.base import Completion, Message, Policy, PolicyError, SamplingParams

if TYPE_CHECKING:
    from coevo.backends.hf import HFPolicy
    from coevo.backends.openai_api import OpenAIPolicy

__all__ = [
    "Completion",
    "HFPolicy",
    "Message",
    "OpenAIPolicy",
    "Policy",
    "PolicyError",
    "SamplingParams",
    "check_conversations",
    "check_sampling_params",
]

_ROLES = ("system", "user", "assistant", "tool")
_LAZY = {"HFPolicy": "coevo.backends.hf", "OpenAIPolicy": "coevo.backends.openai_api"}


def check_conversations(conversations: Any) -> list[list[Message]]:
    """Check a batch of chat conversations and return it unchanged.

    Each conversation is a non-empty list of ``{"role": str, "content": str}`` dicts, role one of
    system/user/assistant/tool.

    Raises:
        TypeError: a conversation, message or content of the wrong type (field named).
        ValueError: an empty conversation or unknown role, naming the field, e.g. ``conversations[2][0]['role']``.
    """
    if not isinstance(conversations, list):
        raise TypeError(f"conversations must be a list of conversations, got {type(conversations).__name__}")
    for i, conv in enumerate(conversations):
        if not isinstance(conv, list) or not conv:
            raise ValueError(f"conversations[{i}] must be a non-empty list of messages")
        for j, msg in enumerate(conv):
            where = f"conversations[{i}][{j}]"
            if not isinstance(msg, dict):
                raise TypeError(f"{where} must be a dict with 'role' and 'content', got {type(msg).__name__}")
            if msg.get("role") not in _ROLES:
                raise ValueError(f"{where}['role'] must be one of {_ROLES}, got {msg.get('role')!r}")
            if not isinstance(msg.get("content"), str):
                raise TypeError(f"{where}['content'] must be a str, got {type(msg.get('content')).__name__}")
    return conversations


def check_sampling_params(params: Any) -> SamplingParams:
    """Check decoding settings and return them unchanged.

    Raises:
        TypeError: ``params`` is not a :class:`SamplingParams`.
        ValueError: naming the field (``max_new_tokens`` >= 1, ``temperature`` >= 0 and finite,
            0 < ``top_p`` <= 1, ``top_k`` >= 0, ``seed`` an int >= 0 or None, ``stop`` non-empty strings,
            ``regex`` None or a non-empty str).
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    if not isinstance(params.max_new_tokens, int) or params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {params.max_new_tokens!r}")
    if (
        not isinstance(params.temperature, (int, float))
        or not math.isfinite(params.temperature)
        or params.temperature < 0
    ):
        raise ValueError(f"temperature must be a finite number >= 0, got {params.temperature!r}")
    if not isinstance(params.top_p, (int, float)) or not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p!r}")
    if not isinstance(params.top_k, int) or params.top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = off), got {params.top_k!r}")
    if params.seed is not None and (not isinstance(params.seed, int) or params.seed < 0):
        raise ValueError(f"seed must be None or an int >= 0, got {params.seed!r}")
    if isinstance(params.stop, str) or not all(isinstance(s, str) and s for s in params.stop):
        raise ValueError(f"stop must be a tuple of non-empty strings, got {params.stop!r}")
    if params.regex is not None and (not isinstance(params.regex, str) or not params.regex):
        raise ValueError(f"regex must be None or a non-empty string, got {params.regex!r}")
    return params


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """Cut ``text`` at the earliest occurrence of any stop string (removed); return (text, found)."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'coevo.backends' has no attribute {name!r}")

"""coevo's error types across vLLM's ``collective_rpc``: tagged in the worker, re-raised in the driver.

vLLM (0.32 / 0.33, V1 engine) runs a ``collective_rpc`` in the engine-core process and, when the worker
method raises, sends back only ``f"Call to {name} method failed: {str(e)}"``; the driver's
``SyncMPClient`` turns it into a plain ``Exception`` (``vllm/v1/engine/core.py``, ``_call_utility``;
``vllm/v1/engine/core_client.py``, ``_process_utility_output``). So a worker's ``ValueError`` (a bad
record), ``RuntimeError`` (a perturbation already active) or ``ReplayMismatchError`` would arrive as
``Exception``. The worker extension therefore re-raises every error of an ``es_*`` method with the same
type and the message prefixed by a tag, ``[coevo-error <module>.<QualName>] <message>`` (:func:`tagged`); the
driver finds the tag in whatever vLLM raised and re-raises the named type with the original message
(:func:`reraise`). Only the types in :data:`ERROR_TYPES` are re-created (no import by name); any other
tagged type, and any untagged failure of the RPC itself, becomes a ``PolicyError`` naming what happened.
In-process callers (vLLM's in-process engine, the test doubles) get the worker's type directly.
"""

from __future__ import annotations

import re

from coevo.backends.base import PolicyError
from coevo.es.checkpoint import SnapshotError
from coevo.es.device_noise import NoiseDeviceError
from coevo.es.history import ReplayMismatchError

_TAG = re.compile(r"\[coevo-error (?P<type>[A-Za-z_][\w.]*)\] ")

#: the error types re-raised driver-side, by ``<module>.<qualname>``
_BUILTIN_TYPES = (
    ValueError,
    TypeError,
    RuntimeError,
    KeyError,
    IndexError,
    NotImplementedError,
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    OSError,
    MemoryError,
)
_COEVO_TYPES = (ReplayMismatchError, SnapshotError, NoiseDeviceError, PolicyError)
ERROR_TYPES: dict[str, type[Exception]] = {f"{t.__module__}.{t.__qualname__}": t for t in _BUILTIN_TYPES + _COEVO_TYPES}


def type_name(exc: BaseException) -> str:
    """``<module>.<qualname>`` of the exception's type, e.g. ``builtins.ValueError``."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _message(exc: BaseException) -> str:
    """The message of ``exc`` (a KeyError's first argument unquoted)."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


def tagged(exc: Exception) -> Exception:
    """An exception of ``exc``'s type whose message carries the type tag (module docstring): ``exc`` itself
    when it is tagged already; a ``RuntimeError`` with the tag when its type cannot be built from one message."""
    message = _message(exc)
    if _TAG.search(message):
        return exc
    text = f"[coevo-error {type_name(exc)}] {message}"
    try:
        new = type(exc)(text)
    except Exception:  # noqa: BLE001 - a type with another constructor: keep the tag, lose the class
        return RuntimeError(text)
    return new if _TAG.search(_message(new)) else RuntimeError(text)


def reraise(exc: BaseException, method: str) -> None:
    """Raise the coevo error that ``exc`` (what ``collective_rpc`` raised) carries (module docstring).

    Raises:
        the tagged type from :data:`ERROR_TYPES` with the worker's message; ``PolicyError`` for another
        tagged type or an untagged failure (the RPC failed in vLLM itself). Always raises.
    """
    text = _message(exc)
    m = _TAG.search(text)
    if m is None:
        raise PolicyError(f"vLLM collective_rpc({method!r}) failed: {type(exc).__name__}: {text}") from exc
    name, message = m.group("type"), text[m.end() :]
    cls = ERROR_TYPES.get(name)
    if cls is None:
        raise PolicyError(f"vLLM worker {method} raised {name}: {message}") from exc
    raise cls(message) from exc

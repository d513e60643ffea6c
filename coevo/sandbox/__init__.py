"""Sandboxed evaluation of LLM-generated code: extraction, an isolated runner, a parallel pool.

Public names are imported lazily so that :mod:`coevo.sandbox.errors` (imported by problem code inside
the sandbox worker) does not pull in the runner's modules.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Extraction": "coevo.sandbox.extract",
    "extract_code": "coevo.sandbox.extract",
    "Sandbox": "coevo.sandbox.runner",
    "SandboxLimits": "coevo.sandbox.runner",
    "SandboxRun": "coevo.sandbox.runner",
    "Job": "coevo.sandbox.pool",
    "evaluate_many": "coevo.sandbox.pool",
    "evaluate_plain": "coevo.sandbox.plain",
    "CandidateError": "coevo.sandbox.errors",
    "InfeasibleSolution": "coevo.sandbox.errors",
    "InvalidReturn": "coevo.sandbox.errors",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'coevo.sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

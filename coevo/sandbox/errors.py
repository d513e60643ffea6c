"""Exceptions that evaluation targets raise to mark a candidate's failure kind.

A target (``"pkg.mod:func"`` receiving ``(fn, payload)``) runs on the trusted side and calls the candidate's
function through the sandbox (:mod:`coevo.sandbox.session`). When it raises, the exception is classified
(:func:`failure_kind`): an ``error_kind`` attribute (of the exception or its class) that names one of
:data:`coevo.types.FAILURE_KINDS` maps to that kind; classes named ``InfeasibleSolution`` /
``InvalidReturn`` map to ``infeasible`` / ``return_type`` even when a problem package defines its own (so
problem code need not import coevo). Any other exception is ``runtime``.
"""

from __future__ import annotations


class CandidateError(Exception):
    """Base of the failures a target attributes to the candidate; ``error_kind`` names the failure kind."""

    error_kind = "runtime"


class InfeasibleSolution(CandidateError):
    """The candidate's solution violates a constraint (capacity exceeded, node visited twice, ...)."""

    error_kind = "infeasible"


class InvalidReturn(CandidateError):
    """The candidate returned the wrong type, shape, or a NaN/inf where a finite number is required."""

    error_kind = "return_type"


class CandidateFailure(CandidateError):
    """The candidate's process failed, seen from the trusted side: it timed out, died, sent a malformed
    reply, or its function raised (``error_kind`` is then the kind the worker reported, e.g. ``runtime``).

    Args:
        kind: one of :data:`coevo.types.FAILURE_KINDS`. detail: what happened (bounded text).
    """

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.error_kind = kind


def failure_kind(exc: BaseException) -> str:
    """Failure kind of an exception seen on the trusted side: ``memory`` for MemoryError, the exception's
    ``error_kind`` (instance or class) when it names a failure kind, ``infeasible`` / ``return_type`` for
    classes named ``InfeasibleSolution`` / ``InvalidReturn``, else ``runtime``."""
    from coevo.sandbox.worker import classify

    return classify(exc)

"""Exceptions that evaluation targets raise to mark a candidate's failure kind.

A target (``"pkg.mod:func"`` receiving ``(fn, payload)``) runs inside the sandbox worker. When it raises, the
worker classifies the exception (:func:`coevo.sandbox.worker.classify`): a class carrying an ``error_kind``
attribute that names one of :data:`coevo.types.FAILURE_KINDS` maps to that kind; classes named
``InfeasibleSolution`` / ``InvalidReturn`` map to ``infeasible`` / ``return_type`` even when a problem
package defines its own (so problem code need not import coevo). Any other exception is ``runtime``.
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

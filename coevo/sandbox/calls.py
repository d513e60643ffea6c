"""How a trusted target calls a candidate heuristic: the same semantics in process and through the sandbox.

A target (e.g. :meth:`coevo.ahd.problem.HeuristicProblem.run_heuristic`) receives the candidate's function
either as a :class:`coevo.sandbox.session.RemoteFunction` (the sandbox: the call runs in the candidate's
process) or as a plain callable (tests, the plain baseline). :func:`heuristic_call` wraps a plain callable
in :class:`LocalFunction` so both behave alike:

- every call gets FRESH WRITABLE copies of its array arguments (and of lists / dicts), as ReEvo's TSP
  evaluator (``distance_matrix.copy()``) and FunSearch's bin packing (``bins[valid_bin_indices]``) hand
  them, so a heuristic may edit its arguments in place and the caller's data never changes;
- ``fn.limit(seconds)`` bounds the wall time of a block of calls (one instance). Remotely the call is cut
  off at the deadline; locally the time is checked when each call returns.

Arrays marked read-only by the caller are promised not to change between calls (the sandbox sends them
once per run, :class:`~coevo.sandbox.session.RemoteFunction`); the callee still gets writable copies.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

from coevo.sandbox.errors import CandidateFailure


def fresh(value: Any) -> Any:
    """A writable deep copy of an argument (numpy arrays copied with ``np.array(copy=True)``; numpy is not
    imported unless an array is passed)."""
    if type(value).__name__ == "ndarray" and type(value).__module__ == "numpy":
        import numpy as np

        return np.array(value, copy=True)
    if isinstance(value, (list, tuple, dict, set)):
        return copy.deepcopy(value)
    return value


class LocalFunction:
    """A plain callable with the calling conventions of the module docstring.

    Args:
        fn: the heuristic. Raises TypeError when it is not callable.
    """

    def __init__(self, fn: Callable[..., Any]):
        if not callable(fn):
            raise TypeError(f"expected a callable heuristic, got {type(fn).__name__}")
        self.fn = fn
        self._deadline: float | None = None
        self._limit_s: float | None = None

    def __call__(self, *args: Any) -> Any:
        value = self.fn(*(fresh(a) for a in args))
        if self._deadline is not None and time.perf_counter() > self._deadline:
            raise CandidateFailure("timeout", f"instance time limit of {self._limit_s:g} s reached")
        return value

    @contextlib.contextmanager
    def limit(self, seconds: float | None) -> Iterator[None]:
        """Within the block, a call that returns after ``seconds`` (from entry) raises CandidateFailure
        (kind ``timeout``); ``None`` = no limit."""
        if seconds is None:
            yield
            return
        self._deadline, self._limit_s = time.perf_counter() + float(seconds), float(seconds)
        try:
            yield
        finally:
            self._deadline = self._limit_s = None


def heuristic_call(fn: Any) -> Any:
    """``fn`` itself when it already follows these conventions (a RemoteFunction or LocalFunction), else
    ``LocalFunction(fn)``."""
    if isinstance(fn, LocalFunction) or getattr(fn, "is_remote_function", False):
        return fn
    return LocalFunction(fn)

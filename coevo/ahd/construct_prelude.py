"""What every candidate-side construction loop (``heuristics/<problem>/construct.py``) shares: the failure
classes and the check of an index a heuristic returns. numpy and the standard library only.

A loop imports these names with ``from coevo.ahd.construct_prelude import ...``. In process (tests, local
callables) that is an ordinary import. The candidate's sandboxed process has no coevo: there
:meth:`coevo.ahd.problem.HeuristicProblem.construct_source` ships the loop with this file's text in place of
that import line, so both sides run the same code. The failure classes are coevo's own in process and
same-named stand-ins in the sandbox, where a failure is classified by its class name
(:data:`coevo.sandbox.worker.NAME_KINDS`).
"""

import operator

import numpy as np

try:  # in process: coevo's classes; in the sandbox (no coevo): same-named ones, classified by name
    from coevo.sandbox.errors import InfeasibleSolution, InvalidReturn
except ImportError:

    class InvalidReturn(Exception):  # the class name is what classifies it
        pass

    class InfeasibleSolution(Exception):
        pass


def as_index(value, what, upper):
    """``value`` as an int index in [0, upper): Python ints, numpy integers and 0-d integer arrays.

    Raises:
        InvalidReturn: a bool, a float, anything else that is not an integer, or an index out of range
            (the message names ``what`` and the value).
    """
    if isinstance(value, (bool, np.bool_)):
        raise InvalidReturn(f"{what} returned a bool ({value!r}); expected an int index")
    try:
        idx = operator.index(value)
    except TypeError:
        raise InvalidReturn(
            f"{what} returned {value!r:.80} of type {type(value).__name__}; expected an int index"
        ) from None
    if not 0 <= idx < upper:
        raise InvalidReturn(f"{what} returned index {idx}, outside [0, {upper})")
    return idx

"""The project's declared exception types: user errors and run stops.

**User errors** (:class:`UserError` and its subclasses) are raised at the boundaries where a person's input
enters the program: config parsing, file and instance loading, model-name resolution, run folders and
command-line argument checks. The ``coevo`` command prints their message as one line and exits with status
2 (``-v`` shows the traceback). Every other exception escaping a command is a bug: Python prints its
traceback and the command exits with status 1. So a ``ValueError`` deep inside the code never masquerades as
bad input.

**Run stops** (:class:`RunStop`) are control flow, not errors: the run context raises them at a sample
boundary inside an evolver step (before the next LLM call) to end the step now, when the wall-clock budget
is spent (:class:`BudgetExhausted`; :class:`DeadlineReached` when a backend stopped decoding at the
deadline) or a stop was requested by SIGINT / SIGTERM (:class:`RunInterrupted`).
They derive from :class:`BaseException`, like :class:`KeyboardInterrupt`, so that evolver code which
catches ``Exception`` to record a failed sample does not swallow them. The loop catches them; the samples
the step finished are already in the store, and a resumed run re-runs the step and finds them by key.
"""

from __future__ import annotations

import difflib
from pathlib import Path

#: exit status of a command whose check ran and failed (``coevo heuristics eval`` on an invalid heuristic):
#: a result, not bad input (2) nor a bug (1, a traceback)
EXIT_CHECK_FAILED = 3


def error_line(prog: str, message: str) -> str:
    """The one line every ``coevo`` command prints for bad input: ``"<prog>: error: <message>"``, e.g.
    ``coevo runs show: error: runs/x does not exist``."""
    return f"{prog}: error: {message}"


def unknown_field_message(name: str, allowed: list[str]) -> str:
    """The message for an unknown config field ``name``: ``unknown field (did you mean 'max_rounds'?)`` (the nearest
    of ``allowed``), else ``unknown field (the fields here: a, b, c)``; no "; " in it, which separates errors."""
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    if close:
        return f"unknown field (did you mean {close[0]!r}?)"
    return f"unknown field (the fields here: {', '.join(allowed)})" if allowed else "unknown field"


class UserError(Exception):
    """Bad input from the user; the CLI prints the message (one line) and exits with status 2."""


class UsageError(UserError):
    """A command-line argument (or a combination of them) cannot be used."""


class ConfigError(UserError, ValueError):
    """A run config is invalid; the message names every offending field."""


class ModelNameError(UserError, ValueError):
    """A model reference is neither a known name, a local folder nor a ``tiny:`` spec."""


class InputFileError(UserError, ValueError):
    """A file or folder given by the user cannot be used (missing, wrong kind, unreadable, malformed)."""


class PluginError(UserError):
    """A user's plugin (an evolver class defined outside coevo, e.g. imported through ``plugins:``) raised, or
    broke its contract (a malformed step report, a state that is not JSON): the message names the plugin, its
    file and the method; the run's store and its last checkpoint are left as they were."""


class EndpointError(UserError):
    """A model server (``model.backend: openai``) cannot be used as configured: its base URL does not answer, it
    does not serve the model, it refuses the key, or it refused the run's requests the same way ``model.max_refusals``
    times in a row (an HTTP 4xx that retrying does not change). The message is one line: the server's own reason and
    the config field to change (``model.base_url``, ``model.name``, ``model.api_key_env``, ...). Raised by the
    check before a run (``coevo run``, ``coevo run --check --probe-endpoint``) and during a run, where it stops the
    run as bad input does: the samples stored so far and the last checkpoint stay, ``--resume`` continues once the
    setting is fixed."""


class RunFolderError(UserError):
    """A run folder cannot be used for this command (holds no run, already holds one, unreadable store)."""


def unreadable_store(db: object, exc: BaseException) -> RunFolderError:
    """The one-line error for a run's ``store.sqlite`` that SQLite cannot read (``sqlite3.DatabaseError``:
    truncated, overwritten, not a database)."""
    return RunFolderError(f"{db} is not a readable trajectory store ({exc})")


class RunLockedError(RunFolderError):
    """Another live process owns the run folder (its exclusive lock is held).

    Attributes:
        path: the lock file. pid: the holder's process id when it could be read, else None.
    """

    def __init__(self, message: str, path: str, pid: int | None):
        super().__init__(message)
        self.path = path
        self.pid = pid


class RunStop(BaseException):
    """End the current evolver step now (raised at a sample boundary); ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class BudgetExhausted(RunStop):
    """The run's wall-clock budget is spent; the step stops before its next LLM call."""


class DeadlineReached(BudgetExhausted):
    """Decoding was stopped at the run's wall-clock deadline (:func:`coevo.backends.base.decode_deadline`): the
    backend discarded the batch it was generating (no completion is returned, so the caller records no sample
    of it) and the loop records the batch as cut (artifact ``step_cut``); a resumed run re-runs the step.

    Attributes:
        rows: samples (conversations) of the cut call. rows_decoded: how many of them had been generated
            (earlier model batches of the call) when it was cut; they are discarded too.
        new_tokens: tokens decoded per row in the model batch that was cut (0: cut before it started).
        decode_s: wall seconds the call ran before it was cut. backend: which backend cut it (``"hf"``, ...).
    """

    def __init__(
        self,
        reason: str,
        *,
        rows: int = 0,
        rows_decoded: int = 0,
        new_tokens: int = 0,
        decode_s: float = 0.0,
        backend: str = "",
    ):
        super().__init__(reason)
        self.rows = rows
        self.rows_decoded = rows_decoded
        self.new_tokens = new_tokens
        self.decode_s = decode_s
        self.backend = backend

    def to_dict(self) -> dict[str, object]:
        """The cut batch as JSON fields (rows, rows_decoded, new_tokens, decode_s, backend)."""
        return {
            "rows": self.rows,
            "rows_decoded": self.rows_decoded,
            "new_tokens": self.new_tokens,
            "decode_s": round(self.decode_s, 3),
            "backend": self.backend,
        }


class RunInterrupted(RunStop):
    """A stop was requested by a signal (SIGINT / SIGTERM).

    Attributes:
        signum: the signal number (``signal.SIGINT`` = 2, ``signal.SIGTERM`` = 15); the CLI exits with
            status ``128 + signum`` (130, 143), as a shell reports a process killed by that signal.
    """

    def __init__(self, reason: str, signum: int):
        super().__init__(reason)
        self.signum = signum


def require_run_folder(path: str | Path, needs: tuple[str, ...] = ("store.sqlite",)) -> Path:
    """``path`` as a run folder that holds the files ``needs`` (names inside it); returns it as a Path.

    Raises:
        RunFolderError: ``path`` does not exist, is not a folder, or lacks one of ``needs`` (each said as such).
    """
    path = Path(path)
    if not path.exists():
        raise RunFolderError(f"{path} does not exist; give a run folder made by `coevo run`")
    if not path.is_dir():
        raise RunFolderError(f"{path} is not a folder; give a run folder made by `coevo run`")
    missing = [n for n in needs if not (path / n).is_file()]
    if missing:
        raise RunFolderError(
            f"{path} is not a run folder (no {' or '.join(missing)} in it); give a run folder made by `coevo run`"
        )
    return path

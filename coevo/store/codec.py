"""Conversion between :class:`~coevo.types.Trajectory` records and rows of the store's tables.

Validation happens here, before anything is written: a bad field raises an error that names it
(``ValueError`` for a bad value, ``TypeError`` for a wrong type), so a caller's bug never becomes a silently
wrong row. JSON columns (``meta``) use :func:`json.dumps` with sorted keys; Python's NaN/Infinity
extension is accepted so that metadata round-trips exactly.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from coevo.types import FAILURE_KINDS, ContextRef, ESMember, Step, Trajectory

#: Columns of ``trajectories`` written by :func:`trajectory_row`, in order.
TRAJECTORY_COLUMNS = (
    "key",
    "run_id",
    "evolver",
    "space",
    "round",
    "generation",
    "task_id",
    "reward",
    "valid",
    "failure",
    "failure_detail",
    "member_seed",
    "member_sigma",
    "member_sign",
    "member_index",
    "skill_name",
    "skill_version",
    "heuristic_id",
    "prompt",
    "context_versions",
    "llm_calls",
    "prompt_tokens",
    "completion_tokens",
    "started_at",
    "duration_s",
    "n_steps",
    "meta",
    "created_at",
)

#: Columns of ``steps`` written by :func:`step_rows`, in order.
STEP_COLUMNS = (
    "trajectory_id",
    "idx",
    "observation",
    "model_output",
    "action",
    "tool_result",
    "reward",
    "meta",
)

SPACES = ("parameter", "context")
_INT64_MAX = 2**63 - 1


def dumps_json(value: Any, field: str) -> str:
    """Serialise ``value`` (a JSON-serialisable object) or raise ``TypeError`` naming ``field``."""
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{field} is not JSON-serialisable: {e}") from e


def loads_json(text: str | None) -> Any:
    """Inverse of :func:`dumps_json`; ``None`` gives ``{}``."""
    return {} if text is None else json.loads(text)


def check_str(value: Any, field: str, *, optional: bool = False) -> str | None:
    """``value`` if it is a non-empty ``str`` (or ``None`` when ``optional``); otherwise raise naming ``field``."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{field} must be a non-empty string")
    return value


def check_int(value: Any, field: str, *, minimum: int | None = 0, optional: bool = False) -> int | None:
    """``value`` if it is an ``int`` (not bool) ``>= minimum`` fitting SQLite's int64; else raise naming ``field``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value}")
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise ValueError(f"{field} must fit in a signed 64-bit integer, got {value}")
    return value


def check_float(value: Any, field: str, *, optional: bool = False) -> float | None:
    """``float(value)`` for a real number that is not NaN (SQLite would store NaN as NULL); else raise."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{field} must be a float, got {type(value).__name__}")
    if math.isnan(value):
        raise ValueError(f"{field} is NaN; record the sample as invalid (valid=False, reward=None) instead")
    return float(value)


def trajectory_row(t: Trajectory, created_at: float) -> tuple[Any, ...]:
    """Validate ``t`` and return its ``trajectories`` row (values in :data:`TRAJECTORY_COLUMNS` order).

    Raises:
        TypeError / ValueError: a field has the wrong type or value; the message names the field.
    """
    if not isinstance(t, Trajectory):
        raise TypeError(f"trajectory must be a coevo.types.Trajectory, got {type(t).__name__}")
    check_str(t.key, "key")
    check_str(t.run_id, "run_id")
    check_str(t.evolver, "evolver")
    if t.space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {t.space!r}")
    if not isinstance(t.valid, bool):
        raise TypeError(f"valid must be a bool, got {type(t.valid).__name__}")
    if t.failure is not None and t.failure not in FAILURE_KINDS:
        raise ValueError(f"failure must be None or one of {FAILURE_KINDS}, got {t.failure!r}")
    if not isinstance(t.steps, list):
        raise TypeError(f"steps must be a list of Step, got {type(t.steps).__name__}")
    m = t.member
    if m is not None:
        if not isinstance(m, ESMember):
            raise TypeError(f"member must be an ESMember or None, got {type(m).__name__}")
        check_int(m.seed, "member.seed")
        check_float(m.sigma, "member.sigma")
        if m.sign not in (1, -1) or isinstance(m.sign, bool):
            raise ValueError(f"member.sign must be +1 or -1, got {m.sign!r}")
        check_int(m.index, "member.index")
    c = t.context if t.context is not None else ContextRef()
    if not isinstance(c, ContextRef):
        raise TypeError(f"context must be a ContextRef, got {type(c).__name__}")
    return (
        t.key,
        t.run_id,
        t.evolver,
        t.space,
        check_int(t.round, "round"),
        check_int(t.generation, "generation"),
        check_str(t.task_id, "task_id", optional=True),
        check_float(t.reward, "reward", optional=True),
        int(t.valid),
        t.failure,
        t.failure_detail if t.failure_detail is None else str(t.failure_detail),
        None if m is None else m.seed,
        None if m is None else float(m.sigma),
        None if m is None else int(m.sign),
        None if m is None else m.index,
        check_str(c.skill_name, "context.skill_name", optional=True),
        check_int(c.skill_version, "context.skill_version", optional=True),
        check_str(c.heuristic_id, "context.heuristic_id", optional=True),
        c.prompt,
        dumps_json(_check_versions(c.versions), "context.versions"),
        check_int(t.llm_calls, "llm_calls"),
        check_int(t.prompt_tokens, "prompt_tokens"),
        check_int(t.completion_tokens, "completion_tokens"),
        check_float(t.started_at, "started_at"),
        check_float(t.duration_s, "duration_s"),
        len(t.steps),
        dumps_json(t.meta if t.meta is not None else {}, "meta"),
        created_at,
    )


def _check_versions(versions: Any) -> dict[str, int]:
    """``versions`` if it maps non-empty str keys to ints >= -1 (-1: a scored candidate, not published); else
    raise naming ``context.versions``."""
    if not isinstance(versions, dict):
        raise TypeError(f"context.versions must be a dict, got {type(versions).__name__}")
    for k, v in versions.items():
        check_str(k, "context.versions key")
        check_int(v, f"context.versions[{k!r}]", minimum=-1)
    return versions


def step_rows(trajectory_id: int, steps: list[Step]) -> Iterator[tuple[Any, ...]]:
    """Yield the ``steps`` rows of one trajectory (values in :data:`STEP_COLUMNS` order), validating each.

    Raises:
        TypeError / ValueError: naming the step, e.g. ``steps[3].meta is not JSON-serialisable``.
    """
    for i, s in enumerate(steps):
        if not isinstance(s, Step):
            raise TypeError(f"steps[{i}] must be a Step, got {type(s).__name__}")
        texts = []
        for name in ("observation", "model_output", "action", "tool_result"):
            v = getattr(s, name)
            if v is not None and not isinstance(v, str):
                raise TypeError(f"steps[{i}].{name} must be a str or None, got {type(v).__name__}")
            texts.append(v)
        reward = check_float(s.reward, f"steps[{i}].reward", optional=True)
        meta = dumps_json(s.meta if s.meta is not None else {}, f"steps[{i}].meta")
        yield (trajectory_id, i, *texts, reward, meta)


def from_columns(row: sqlite3.Row, names: Iterable[str], json_names: Iterable[str] = ()) -> dict[str, Any]:
    """The fields a record takes from the columns of the same name in ``row``: ``{name: row[name]}`` for
    ``names``, ``{name: loads_json(row[name])}`` for ``json_names`` (JSON text columns).

    Raises:
        IndexError: ``row`` has no column of one of the names.
    """
    return {n: row[n] for n in names} | {n: loads_json(row[n]) for n in json_names}


def trajectory_from_row(row: sqlite3.Row, steps: list[Step]) -> Trajectory:
    """Rebuild a :class:`Trajectory` from a ``trajectories`` row (``sqlite3.Row``) and its loaded steps."""
    member = None
    if row["member_seed"] is not None:
        member = ESMember(
            seed=row["member_seed"],
            sigma=row["member_sigma"],
            sign=row["member_sign"],
            index=row["member_index"],
        )
    plain = ("key", "run_id", "evolver", "space", "round", "generation", "task_id", "reward", "failure")
    plain += ("failure_detail", "llm_calls", "prompt_tokens", "completion_tokens", "started_at", "duration_s", "id")
    return Trajectory(
        **from_columns(row, plain, ("meta",)),
        steps=steps,
        valid=bool(row["valid"]),
        member=member,
        context=ContextRef(
            **from_columns(row, ("skill_name", "skill_version", "heuristic_id", "prompt")),
            versions=loads_json(row["context_versions"]) if "context_versions" in row.keys() else {},  # noqa: SIM118 (sqlite3.Row: `in` tests values)
        ),
    )


def step_from_row(row: sqlite3.Row) -> Step:
    """Rebuild a :class:`Step` from a ``steps`` row."""
    return Step(**from_columns(row, ("observation", "model_output", "action", "tool_result", "reward"), ("meta",)))

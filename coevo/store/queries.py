"""Reading trajectories: SQL for :meth:`TrajectoryStore.query`'s filters and ordering, and row loading."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from coevo.store.codec import SPACES, check_float, check_int, check_str, step_from_row, trajectory_from_row
from coevo.types import Step, Trajectory

ORDER_BY = ("id", "reward")
_ID_CHUNK = 500  # ids per "IN (...)" when loading steps (below SQLite's bound-parameter limit)


def order_clause(order_by: str, descending: bool, limit: int | None) -> str:
    """SQL ``ORDER BY ... [LIMIT n]``: by ``"id"`` (insertion order) or ``"reward"`` (NULLs last, ties by id).

    Raises:
        ValueError / TypeError: a bad ``order_by`` or ``limit`` (named).
    """
    if order_by not in ORDER_BY:
        raise ValueError(f"order_by must be one of {ORDER_BY}, got {order_by!r}")
    direction = "DESC" if descending else "ASC"
    order = f"id {direction}" if order_by == "id" else f"reward IS NULL, reward {direction}, id ASC"
    tail = f" ORDER BY {order}"
    if limit is not None:
        tail += f" LIMIT {check_int(limit, 'limit')}"
    return tail


def where_clause(
    run_id: str | None = None,
    evolver: str | None = None,
    space: str | None = None,
    round: int | None = None,
    generation: int | None = None,
    valid: bool | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    task_id: str | None = None,
) -> tuple[str, list[Any]]:
    """SQL ``WHERE`` clause and parameters for :meth:`TrajectoryStore.query`'s filters (validated)."""
    clauses: list[str] = []
    params: list[Any] = []

    def eq(column: str, value: Any) -> None:
        clauses.append(f"{column} = ?")
        params.append(value)

    if run_id is not None:
        eq("run_id", check_str(run_id, "run_id"))
    if evolver is not None:
        eq("evolver", check_str(evolver, "evolver"))
    if space is not None:
        if space not in SPACES:
            raise ValueError(f"space must be one of {SPACES}, got {space!r}")
        eq("space", space)
    if round is not None:
        eq("round", check_int(round, "round"))
    if generation is not None:
        eq("generation", check_int(generation, "generation"))
    if valid is not None:
        if not isinstance(valid, bool):
            raise TypeError(f"valid must be a bool or None, got {type(valid).__name__}")
        eq("valid", int(valid))
    if task_id is not None:
        eq("task_id", check_str(task_id, "task_id"))
    if min_reward is not None:
        clauses.append("reward >= ?")
        params.append(check_float(min_reward, "min_reward"))
    if max_reward is not None:
        clauses.append("reward <= ?")
        params.append(check_float(max_reward, "max_reward"))
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), params


def load_trajectories(conn: sqlite3.Connection, tail: str, params: Sequence[Any], with_steps: bool) -> list[Trajectory]:
    """Run ``SELECT * FROM trajectories {tail}`` and rebuild the rows as trajectories, with their steps.

    Steps are fetched in chunks of ids ordered by ``(trajectory_id, idx)``; call inside one read transaction
    so that rows and steps come from the same snapshot.
    """
    rows = conn.execute(f"SELECT * FROM trajectories {tail}", params).fetchall()
    steps: dict[int, list[Step]] = {r["id"]: [] for r in rows}
    if with_steps and rows:
        ids = list(steps)
        for i in range(0, len(ids), _ID_CHUNK):
            chunk = ids[i : i + _ID_CHUNK]
            for s in conn.execute(
                f"SELECT * FROM steps WHERE trajectory_id IN ({', '.join('?' * len(chunk))}) "
                "ORDER BY trajectory_id, idx",
                chunk,
            ):
                steps[s["trajectory_id"]].append(step_from_row(s))
    return [trajectory_from_row(r, steps[r["id"]]) for r in rows]

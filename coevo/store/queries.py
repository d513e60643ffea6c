"""Reading trajectories: the typed filters of :meth:`TrajectoryStore.query`, their SQL, and row loading."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from coevo.store.codec import SPACES, check_float, check_int, check_str, step_from_row, trajectory_from_row
from coevo.types import Step, Trajectory

ORDER_BY = ("id", "reward")
SPLITS = ("train", "test")
_ID_CHUNK = 500  # ids per "IN (...)" when loading steps (below SQLite's bound-parameter limit)


@dataclass(frozen=True)
class TrajectoryFilter:
    """Filters of :meth:`TrajectoryStore.query` (``None`` = no filter); all must hold.

    Attributes:
        run_id, evolver, space, round, generation, task_id: equality filters.
        valid: ``True`` for valid rollouts only, ``False`` for failures only.
        min_reward, max_reward: inclusive reward bounds (rows with ``reward`` NULL never match).
        split: ``"train"`` or ``"test"``: the rollout split recorded in ``meta["split"]`` (rows without one never
            match). An ES evolver's held-out evaluation of its centre has the same ``generation`` as the
            members' train rollouts; ``split="train"`` keeps it out.
        member: ``True``: trajectories of ES population members only (``member`` set); ``False``: only those
            of an unperturbed policy (the centre, context evolvers' own calls).

    Raises (on construction):
        TypeError / ValueError: a bad value, named.
    """

    run_id: str | None = None
    evolver: str | None = None
    space: str | None = None
    round: int | None = None
    generation: int | None = None
    valid: bool | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    task_id: str | None = None
    split: str | None = None
    member: bool | None = None

    def __post_init__(self) -> None:
        for name in ("run_id", "evolver", "task_id"):
            check_str(getattr(self, name), name, optional=True)
        for name in ("round", "generation"):
            check_int(getattr(self, name), name, optional=True)
        for name in ("min_reward", "max_reward"):
            check_float(getattr(self, name), name, optional=True)
        for name in ("valid", "member"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool or None, got {type(value).__name__}")
        if self.space is not None and self.space not in SPACES:
            raise ValueError(f"space must be one of {SPACES}, got {self.space!r}")
        if self.split is not None and self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")

    @classmethod
    def of(cls, filters: dict[str, Any]) -> TrajectoryFilter:
        """The filter for keyword arguments; an unknown name raises ``TypeError`` listing the known ones."""
        unknown = set(filters) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown trajectory filter(s) {sorted(unknown)}; known: {[f.name for f in fields(cls)]}")
        return cls(**filters)

    def where(self) -> tuple[str, list[Any]]:
        """SQL ``WHERE`` clause (empty when nothing is filtered) and its parameters."""
        clauses: list[str] = []
        params: list[Any] = []
        for column in ("run_id", "evolver", "space", "round", "generation", "task_id"):
            value = getattr(self, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if self.valid is not None:
            clauses.append("valid = ?")
            params.append(int(self.valid))
        for bound, op in (("min_reward", ">="), ("max_reward", "<=")):
            if getattr(self, bound) is not None:
                clauses.append(f"reward {op} ?")
                params.append(float(getattr(self, bound)))
        if self.split is not None:
            clauses.append("json_extract(meta, '$.split') = ?")
            params.append(self.split)
        if self.member is not None:
            clauses.append("member_seed IS NOT NULL" if self.member else "member_seed IS NULL")
        return ("WHERE " + " AND ".join(clauses) if clauses else ""), params


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

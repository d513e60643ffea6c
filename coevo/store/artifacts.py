"""Versioned context artifacts: skill versions, heuristics, prompts.

An artifact is a JSON document identified by ``(kind, name, version)``. Versions count from 1 per
``(kind, name)`` across the whole store (not per run), so a skill evolved over several runs keeps one
lineage; ``run_id`` records which run wrote each version. ``parent_version`` points to the version of the
same ``(kind, name)`` it was derived from (e.g. the skill version a Trace2Skill patch was applied to).
An optional ``key`` makes a write idempotent: writing the same key again returns the stored artifact.

Typical kinds: ``"skill"`` (content: files and diff of a skill version), ``"heuristic"`` (content: code,
thought, objectives). The functions here run on a connection inside a transaction opened by
:class:`~coevo.store.TrajectoryStore`.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

from coevo.store.codec import check_int, check_str, dumps_json, from_columns

_COLUMNS = "id, run_id, kind, name, version, key, content, parent_version, meta, created_at"


@dataclass(frozen=True)
class Artifact:
    """One stored version of a context artifact.

    Attributes:
        id: row id.
        run_id: run that wrote this version.
        kind: artifact kind (``"skill"``, ``"heuristic"``, ...).
        name: artifact name within its kind (skill name, heuristic id, ...).
        version: 1-based version number, counted per ``(kind, name)``.
        content: the JSON document (skill files/diff, heuristic code/thought/objectives, ...).
        parent_version: version of the same ``(kind, name)`` this one derives from, or ``None``.
        meta: free JSON metadata.
        created_at: UNIX time (s) of the write.
        key: idempotency key, or ``None``.
    """

    id: int
    run_id: str
    kind: str
    name: str
    version: int
    content: dict[str, Any]
    parent_version: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    key: str | None = None


def _from_row(row: sqlite3.Row) -> Artifact:
    plain = ("id", "run_id", "kind", "name", "version", "parent_version", "created_at", "key")
    return Artifact(**from_columns(row, plain, ("content", "meta")))


def put_artifact(
    conn: sqlite3.Connection,
    run_id: str,
    kind: str,
    name: str,
    content: dict[str, Any],
    *,
    version: int | None,
    key: str | None,
    parent_version: int | None,
    meta: dict[str, Any] | None,
    created_at: float,
) -> Artifact:
    """Insert one artifact version (call inside a write transaction); see ``TrajectoryStore.put_artifact``.

    Raises:
        TypeError / ValueError: a bad argument (named); an explicit ``version`` that already exists; a
            ``parent_version`` that does not exist for ``(kind, name)``; a ``key`` already used by another
            ``(kind, name)``.
    """
    check_str(run_id, "run_id")
    check_str(kind, "kind")
    check_str(name, "name")
    check_str(key, "key", optional=True)
    check_int(version, "version", minimum=1, optional=True)
    check_int(parent_version, "parent_version", minimum=1, optional=True)
    if not isinstance(content, dict):
        raise TypeError(f"content must be a dict, got {type(content).__name__}")
    if meta is not None and not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict or None, got {type(meta).__name__}")
    content_json = dumps_json(content, "content")
    meta_json = dumps_json(meta or {}, "meta")

    if key is not None:
        row = conn.execute(f"SELECT {_COLUMNS} FROM artifacts WHERE key = ?", (key,)).fetchone()
        if row is not None:
            if (row["kind"], row["name"]) != (kind, name):
                raise ValueError(
                    f"key {key!r} already names artifact ({row['kind']!r}, {row['name']!r}), not ({kind!r}, {name!r})"
                )
            return _from_row(row)
    if parent_version is not None and _get(conn, kind, name, parent_version) is None:
        raise ValueError(f"parent_version {parent_version} does not exist for artifact ({kind!r}, {name!r})")
    if version is None:
        latest = conn.execute(
            "SELECT MAX(version) FROM artifacts WHERE kind = ? AND name = ?", (kind, name)
        ).fetchone()[0]
        version = 1 if latest is None else latest + 1
    elif _get(conn, kind, name, version) is not None:
        raise ValueError(f"version {version} of artifact ({kind!r}, {name!r}) already exists")
    cur = conn.execute(
        "INSERT INTO artifacts (run_id, kind, name, version, key, content, parent_version, meta, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (run_id, kind, name, version, key, content_json, parent_version, meta_json, created_at),
    )
    return _from_row(conn.execute(f"SELECT {_COLUMNS} FROM artifacts WHERE id = ?", (cur.lastrowid,)).fetchone())


def _get(conn: sqlite3.Connection, kind: str, name: str, version: int) -> sqlite3.Row | None:
    return conn.execute(
        f"SELECT {_COLUMNS} FROM artifacts WHERE kind = ? AND name = ? AND version = ?", (kind, name, version)
    ).fetchone()


def get_artifact(conn: sqlite3.Connection, kind: str, name: str, version: int | None) -> Artifact | None:
    """The given version of ``(kind, name)``, the latest when ``version`` is None, or None if absent."""
    check_str(kind, "kind")
    check_str(name, "name")
    check_int(version, "version", minimum=1, optional=True)
    if version is None:
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM artifacts WHERE kind = ? AND name = ? ORDER BY version DESC LIMIT 1",
            (kind, name),
        ).fetchone()
    else:
        row = _get(conn, kind, name, version)
    return None if row is None else _from_row(row)


def list_artifacts(conn: sqlite3.Connection, kind: str | None, name: str | None, run_id: str | None) -> list[Artifact]:
    """All artifact versions matching the given filters, ordered by ``(kind, name, version)``."""
    clauses, params = [], []
    for column, value in (("kind", kind), ("name", name), ("run_id", run_id)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(check_str(value, column))
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM artifacts {where} ORDER BY kind, name, version", params)
    return [_from_row(r) for r in rows]

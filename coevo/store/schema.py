"""SQL schema of the trajectory store, its version, and the migration hook.

Layout (all in one SQLite file):

- ``trajectories``: one row per rollout. Everything a query filters or sorts on is a real, indexed column
  (run_id, evolver, space, round, generation, task_id, reward, valid, member_seed, member_sign,
  skill_version, heuristic_id, llm_calls); free metadata is a JSON text column. ``n_steps`` records how
  many steps the trajectory has, so a reader can check that none are missing.
- ``steps``: the ordered steps of a trajectory, keyed by ``(trajectory_id, idx)``; written in the same
  transaction as their trajectory.
- ``artifacts``: versioned context artifacts (skill versions, heuristics, prompts), version numbers counted
  per ``(kind, name)`` across the store, optional unique idempotency ``key``.
- ``es_history``: one JSON row per ES generation, unique per ``(run_id, evolver, generation)``.
- ``schema_version``: one row per schema version the file was created at or migrated to.

Version 2 adds ``trajectories.context_versions`` (JSON: published context key -> version, see
:class:`coevo.types.ContextRef`); a version-1 file is upgraded in place when opened for writing.

Migrations: :data:`MIGRATIONS` maps a version ``v`` to a function that upgrades a connection's schema from
``v`` to ``v + 1`` (run inside one transaction by :func:`migrate`). A file with a newer version than
:data:`SCHEMA_VERSION` is refused rather than guessed at.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping

from coevo.errors import UserError

#: Schema version written by this code.
SCHEMA_VERSION = 2


def _add_context_versions(conn: sqlite3.Connection) -> None:
    """1 -> 2: the published context versions of each trajectory (``{}`` for older rows)."""
    conn.execute("ALTER TABLE trajectories ADD COLUMN context_versions TEXT NOT NULL DEFAULT '{}'")


#: ``{v: upgrade_from_v_to_v_plus_1(conn)}``; add an entry with every schema change and bump
#: :data:`SCHEMA_VERSION` (a new file is created at version 1 and migrated, so both paths are the same code).
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _add_context_versions}

SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER NOT NULL,
    applied_at REAL    NOT NULL
);

CREATE TABLE IF NOT EXISTS trajectories (
    id                INTEGER PRIMARY KEY,
    key               TEXT    NOT NULL UNIQUE,
    run_id            TEXT    NOT NULL,
    evolver           TEXT    NOT NULL,
    space             TEXT    NOT NULL CHECK (space IN ('parameter', 'context')),
    round             INTEGER NOT NULL CHECK (round >= 0),
    generation        INTEGER NOT NULL CHECK (generation >= 0),
    task_id           TEXT,
    reward            REAL,
    valid             INTEGER NOT NULL CHECK (valid IN (0, 1)),
    failure           TEXT,
    failure_detail    TEXT,
    member_seed       INTEGER,
    member_sigma      REAL,
    member_sign       INTEGER CHECK (member_sign IN (-1, 1)),
    member_index      INTEGER,
    skill_name        TEXT,
    skill_version     INTEGER,
    heuristic_id      TEXT,
    prompt            TEXT,
    llm_calls         INTEGER NOT NULL CHECK (llm_calls >= 0),
    prompt_tokens     INTEGER NOT NULL CHECK (prompt_tokens >= 0),
    completion_tokens INTEGER NOT NULL CHECK (completion_tokens >= 0),
    started_at        REAL    NOT NULL,
    duration_s        REAL    NOT NULL,
    n_steps           INTEGER NOT NULL CHECK (n_steps >= 0),
    meta              TEXT    NOT NULL DEFAULT '{}',
    created_at        REAL    NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_traj_run_evolver_gen ON trajectories (run_id, evolver, generation);
CREATE INDEX IF NOT EXISTS ix_traj_run_round ON trajectories (run_id, round);
CREATE INDEX IF NOT EXISTS ix_traj_run_reward ON trajectories (run_id, valid, reward);
CREATE INDEX IF NOT EXISTS ix_traj_run_llm_calls ON trajectories (run_id, llm_calls);
CREATE INDEX IF NOT EXISTS ix_traj_space ON trajectories (space);
CREATE INDEX IF NOT EXISTS ix_traj_task ON trajectories (task_id);
CREATE INDEX IF NOT EXISTS ix_traj_member ON trajectories (member_seed, member_sign);
CREATE INDEX IF NOT EXISTS ix_traj_skill ON trajectories (skill_name, skill_version);
CREATE INDEX IF NOT EXISTS ix_traj_heuristic ON trajectories (heuristic_id);

CREATE TABLE IF NOT EXISTS steps (
    trajectory_id INTEGER NOT NULL REFERENCES trajectories (id) ON DELETE CASCADE,
    idx           INTEGER NOT NULL CHECK (idx >= 0),
    observation   TEXT,
    model_output  TEXT,
    action        TEXT,
    tool_result   TEXT,
    reward        REAL,
    meta          TEXT    NOT NULL DEFAULT '{}',
    PRIMARY KEY (trajectory_id, idx)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS artifacts (
    id             INTEGER PRIMARY KEY,
    run_id         TEXT    NOT NULL,
    kind           TEXT    NOT NULL,
    name           TEXT    NOT NULL,
    version        INTEGER NOT NULL CHECK (version >= 1),
    key            TEXT    UNIQUE,
    content        TEXT    NOT NULL,
    parent_version INTEGER,
    meta           TEXT    NOT NULL DEFAULT '{}',
    created_at     REAL    NOT NULL,
    UNIQUE (kind, name, version)
);
CREATE INDEX IF NOT EXISTS ix_artifacts_run_kind ON artifacts (run_id, kind);

CREATE TABLE IF NOT EXISTS es_history (
    run_id     TEXT    NOT NULL,
    evolver    TEXT    NOT NULL,
    generation INTEGER NOT NULL CHECK (generation >= 0),
    row        TEXT    NOT NULL,
    created_at REAL    NOT NULL,
    PRIMARY KEY (run_id, evolver, generation)
);
"""


class SchemaError(UserError, RuntimeError):
    """The file's schema cannot be used by this code (newer version, missing migration, read-only and old)."""


def read_version(conn: sqlite3.Connection) -> int | None:
    """Schema version stored in the file, or ``None`` for a file without the coevo schema."""
    has_table = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
    if has_table is None:
        return None
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def migrate(
    conn: sqlite3.Connection,
    target: int = SCHEMA_VERSION,
    migrations: Mapping[int, Callable[[sqlite3.Connection], None]] | None = None,
) -> int:
    """Create the schema in an empty file or upgrade an older one to ``target``, in one transaction.

    Args:
        conn: a writable connection in autocommit mode (``isolation_level=None``).
        target: schema version to reach.
        migrations: ``{v: upgrade v -> v+1}``; defaults to :data:`MIGRATIONS`.

    Returns:
        The version the file had before (0 for a new file).

    Raises:
        SchemaError: the file is newer than ``target``, or a migration step is missing.
    """
    steps = MIGRATIONS if migrations is None else migrations
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = read_version(conn)
        if found is None:
            for statement in _split_sql(SCHEMA_V1):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (1, ?)", (time.time(),))
            current, before = 1, 0
        else:
            current = before = found
        if current > target:
            raise SchemaError(f"store schema_version {current} is newer than this coevo's ({target}); upgrade coevo")
        while current < target:
            if current not in steps:
                raise SchemaError(f"no migration from schema_version {current} to {current + 1}")
            steps[current](conn)
            current += 1
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (current, time.time()))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return before


def check_version(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> None:
    """For read-only connections: raise :class:`SchemaError` unless the file is at version ``target`` or older
    (readers fill columns an older file lacks with their defaults, e.g. ``context_versions`` -> ``{}``)."""
    found = read_version(conn)
    if found is None:
        raise SchemaError("not a coevo trajectory store (no schema_version table)")
    if found > target:
        raise SchemaError(
            f"store schema_version {found} differs from this coevo's ({target}); "
            "open it once without readonly=True to migrate, or upgrade coevo"
        )


def _split_sql(script: str) -> list[str]:
    """Split a DDL script into statements (``executescript`` would commit the open transaction)."""
    return [s.strip() for s in script.split(";") if s.strip()]

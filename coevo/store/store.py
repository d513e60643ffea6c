"""TrajectoryStore: the SQLite file every evolver of a run reads from and the loop writes to.

Storage settings (set on every writable connection):

- ``journal_mode=WAL``: readers (other processes with ``readonly=True``, a progress UI, ``coevo runs
  export``) read a consistent snapshot while the writer appends, and are never blocked by it.
- ``synchronous=FULL``: each commit is fsync'ed to the WAL before ``add_trajectory`` returns, so a
  committed trajectory also survives a power loss or kernel crash, not only a process crash (WAL with
  ``NORMAL`` is safe against process crashes but may drop the last commits on power loss). The loop
  derives its sample budget from :meth:`TrajectoryStore.count_llm_calls`, so a sample that was spent must
  not vanish. One fsync per trajectory is negligible next to the LLM calls that produced it; pass
  ``synchronous="NORMAL"`` for bulk imports.
- ``foreign_keys=ON``, ``busy_timeout`` (default 30 s) so that a reader's checkpoint or a second
  process waits instead of failing with "database is locked".

Single-writer rule: one process writes (the loop's process); workers and Ray actors return
:class:`~coevo.types.Trajectory` records and never write. Other processes open the file with
``TrajectoryStore(path, readonly=True)``. Inside a process one store object may be shared by threads:
sqlite3 connections belong to the thread that made them, so the store's single connection is opened with
``check_same_thread=False`` and every call holds the store's lock (calls are serialised). Each write is one
transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``): a crash at any point leaves either the whole trajectory
with all its steps or nothing.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.store import artifacts as _artifacts
from coevo.store.artifacts import Artifact
from coevo.store.codec import (
    STEP_COLUMNS,
    TRAJECTORY_COLUMNS,
    check_float,
    check_int,
    check_str,
    dumps_json,
    loads_json,
    step_rows,
    trajectory_row,
)
from coevo.store.queries import TrajectoryFilter, load_trajectories, order_clause
from coevo.store.schema import check_version, migrate
from coevo.types import Trajectory

if TYPE_CHECKING:
    from typing_extensions import Self

_INSERT_TRAJECTORY = (
    f"INSERT INTO trajectories ({', '.join(TRAJECTORY_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(TRAJECTORY_COLUMNS))}) ON CONFLICT (key) DO NOTHING"
)
_INSERT_STEP = f"INSERT INTO steps ({', '.join(STEP_COLUMNS)}) VALUES ({', '.join('?' * len(STEP_COLUMNS))})"
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class TrajectoryStore:
    """Append-only store of trajectories, context artifacts and ES history in one SQLite file.

    Args:
        path: the SQLite file (created with its parent folder unless ``readonly``).
        readonly: open for reading only (``mode=ro``); write methods raise ``PermissionError``.
        busy_timeout_s: how long (s) a call waits for a lock held by another connection.
        synchronous: SQLite ``synchronous`` level for writes, ``"FULL"`` (default, see module doc) or
            ``"NORMAL"``/``"EXTRA"``/``"OFF"``.

    Raises:
        FileNotFoundError: ``readonly`` and the file does not exist.
        coevo.store.schema.SchemaError: the file's schema is newer than this code (or older, when readonly).
        ValueError: a bad ``synchronous`` or ``busy_timeout_s``.

    Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        readonly: bool = False,
        busy_timeout_s: float = 30.0,
        synchronous: str = "FULL",
    ) -> None:
        self.path = Path(path)
        self.readonly = bool(readonly)
        sync = str(synchronous).upper()
        if sync not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        if not 0 <= check_float(busy_timeout_s, "busy_timeout_s") < 86_400:
            raise ValueError(f"busy_timeout_s must be in [0, 86400), got {busy_timeout_s}")
        self._lock = threading.RLock()
        if self.readonly:
            if not self.path.is_file():
                raise FileNotFoundError(f"trajectory store {self.path} does not exist (readonly=True)")
            uri = f"{self.path.resolve().as_uri()}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        self._conn: sqlite3.Connection | None = conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            if self.readonly:
                check_version(conn)
            else:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise sqlite3.OperationalError(f"could not switch {self.path} to WAL (journal_mode={mode})")
                conn.execute(f"PRAGMA synchronous = {sync}")
                migrate(conn)
        except BaseException:
            conn.close()
            self._conn = None
            raise

    # ----------------------------------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Close the connection (idempotent). Further calls raise ``sqlite3.ProgrammingError``."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TrajectoryStore({str(self.path)!r}, readonly={self.readonly})"

    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection (for diagnostics such as ``PRAGMA integrity_check``; do not write through it)."""
        if self._conn is None:
            raise sqlite3.ProgrammingError(f"{self!r} is closed")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: ``BEGIN IMMEDIATE`` ... ``COMMIT``, ``ROLLBACK`` on any exception."""
        if self.readonly:
            raise PermissionError(f"{self!r} is read-only")
        with self._lock:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction, so that multi-statement reads see a single snapshot."""
        with self._lock:
            conn = self.conn
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    # ---------------------------------------------------------------------------------------- trajectories
    def add_trajectory(self, t: Trajectory) -> tuple[Trajectory, bool]:
        """Store one trajectory with its steps in one transaction; idempotent on ``t.key``.

        Returns:
            ``(stored, inserted)``: a copy of ``t`` with ``id`` set and ``inserted=True``; or, when a
            trajectory with this key exists, that stored trajectory and ``inserted=False`` (nothing written).

        Raises:
            TypeError / ValueError: a bad field (named in the message); nothing is written.
            PermissionError: the store is read-only.
        """
        return self.add_trajectories([t])[0]

    def add_trajectories(self, ts: Sequence[Trajectory]) -> list[tuple[Trajectory, bool]]:
        """Store several trajectories in one transaction (all or none); idempotent per key.

        A key repeated inside ``ts`` is stored once (the first occurrence); later ones report
        ``inserted=False``. Returns one ``(stored, inserted)`` per input, in order.
        """
        now = time.time()
        rows = [trajectory_row(t, now) for t in ts]
        out: list[tuple[Trajectory, bool]] = []
        with self._write() as conn:
            for t, row in zip(ts, rows):
                cur = conn.execute(_INSERT_TRAJECTORY, row)
                if cur.rowcount == 1:
                    conn.executemany(_INSERT_STEP, step_rows(cur.lastrowid, t.steps))
                    out.append((replace(t, id=cur.lastrowid), True))
                else:
                    stored = load_trajectories(conn, "WHERE key = ?", [t.key], with_steps=True)[0]
                    out.append((stored, False))
        return out

    def get_by_key(self, key: str) -> Trajectory | None:
        """The stored trajectory with this idempotency key (with steps), or ``None``."""
        check_str(key, "key")
        with self._read() as conn:
            found = load_trajectories(conn, "WHERE key = ?", [key], with_steps=True)
        return found[0] if found else None

    def query(
        self,
        *,
        order_by: str = "id",
        descending: bool = False,
        limit: int | None = None,
        with_steps: bool = True,
        **filters: Any,
    ) -> list[Trajectory]:
        """Trajectories matching all given filters.

        Args:
            filters: :class:`~coevo.store.queries.TrajectoryFilter` fields: ``run_id``, ``evolver``, ``space``,
                ``round``, ``generation``, ``task_id`` (equality), ``valid``, ``min_reward`` / ``max_reward``
                (inclusive; NULL rewards never match), ``split`` (``meta["split"]``) and ``member`` (True:
                ES members only, False: unperturbed only).
            order_by: ``"id"`` (insertion order) or ``"reward"`` (NULL rewards last; ties by id).
            descending: reverse the order.
            limit: at most this many rows (``>= 0``).
            with_steps: load each trajectory's steps (``False`` leaves ``steps=[]``, much cheaper).

        Raises:
            TypeError / ValueError: an unknown filter or a bad value (named).
        """
        where, params = TrajectoryFilter.of(filters).where()
        tail = order_clause(order_by, descending, limit)
        with self._read() as conn:
            return load_trajectories(conn, where + tail, params, with_steps=with_steps)

    def top_k(self, k: int, **filters: Any) -> list[Trajectory]:
        """The ``k`` valid trajectories with the highest reward (ties: earliest first), matching ``filters``.

        ``filters`` are :meth:`query`'s filters (``run_id``, ``evolver``, ..., ``with_steps``); ``valid``,
        ``order_by``, ``descending`` and ``limit`` are fixed by top-k and rejected with ``ValueError``.
        """
        check_int(k, "k")
        fixed = {"valid", "order_by", "descending", "limit"} & filters.keys()
        if fixed:
            raise ValueError(f"top_k fixes {sorted(fixed)}; pass only filters such as run_id, evolver, generation")
        # reward >= -inf also drops valid rows without a reward (NULL), which have no rank.
        floor = filters.get("min_reward")
        filters = {**filters, "min_reward": float("-inf") if floor is None else floor}
        return self.query(**filters, valid=True, order_by="reward", descending=True, limit=k)

    def count(self, **filters: Any) -> int:
        """Number of trajectories matching :meth:`query`'s filters (``run_id``, ``valid``, ...)."""
        where, params = TrajectoryFilter.of(filters).where()
        with self._read() as conn:
            return int(conn.execute(f"SELECT COUNT(*) FROM trajectories {where}", params).fetchone()[0])

    def count_llm_calls(self, run_id: str) -> int:
        """Exact sum of ``llm_calls`` over the run's stored trajectories (valid or not); 0 for an unknown run.

        Committed trajectories are the only ones counted, so after a crash this equals the samples whose
        trajectories survived, which are exactly those a resumed run will find by key and not re-sample.
        """
        check_str(run_id, "run_id")
        with self._read() as conn:
            row = conn.execute(
                "SELECT COALESCE(SUM(llm_calls), 0) FROM trajectories WHERE run_id = ?", (run_id,)
            ).fetchone()
        return int(row[0])

    def run_identity(self, folder_name: str | None = None) -> str | None:
        """The id of the run this store belongs to: the one recorded when the run was created (artifact
        ``run_identity``, so a copied or renamed run folder keeps it); for stores written before that, the only
        run id among the trajectories; else ``folder_name`` (None when not given)."""
        from coevo.artifacts import RUN_IDENTITY

        with self._read() as conn:
            art = _artifacts.get_artifact(conn, RUN_IDENTITY, "run", None)
            if art is not None:
                return str(art.content["run_id"])
            ids = [r[0] for r in conn.execute("SELECT DISTINCT run_id FROM trajectories LIMIT 2")]
        return ids[0] if len(ids) == 1 else folder_name

    def run_ids(self) -> list[str]:
        """Distinct run ids with at least one trajectory, sorted."""
        with self._read() as conn:
            return [r[0] for r in conn.execute("SELECT DISTINCT run_id FROM trajectories ORDER BY run_id")]

    def iter_trajectories(self, run_id: str | None = None, batch_size: int = 256) -> Iterator[Trajectory]:
        """Yield stored trajectories (with steps) in insertion order, ``batch_size`` at a time from the file.

        Memory stays bounded by one batch; trajectories committed while iterating may or may not appear.
        """
        check_int(batch_size, "batch_size", minimum=1)
        last_id = 0
        while True:
            where, params = TrajectoryFilter(run_id=run_id).where()
            where = f"{where} AND id > ?" if where else "WHERE id > ?"
            with self._read() as conn:
                batch = load_trajectories(conn, f"{where} ORDER BY id LIMIT {batch_size}", [*params, last_id], True)
            if not batch:
                return
            yield from batch
            last_id = batch[-1].id  # type: ignore[assignment]

    def export_jsonl(self, path: str | os.PathLike[str], run_id: str | None = None) -> int:
        """Write one JSON object per trajectory (``Trajectory.to_dict()``, steps included) to ``path``.

        See :func:`coevo.store.export.export_jsonl`. Returns the number of trajectories written.
        """
        from coevo.store.export import export_jsonl

        return export_jsonl(self, path, run_id=run_id)

    # ------------------------------------------------------------------------------------------ artifacts
    def put_artifact(
        self,
        run_id: str,
        kind: str,
        name: str,
        content: dict[str, Any],
        version: int | None = None,
        key: str | None = None,
        parent_version: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Artifact:
        """Store a new version of the context artifact ``(kind, name)``; see :mod:`coevo.store.artifacts`.

        Args:
            run_id: the run writing it.
            kind, name: the artifact (e.g. ``"skill"``, ``"web-forms"``).
            content: JSON document (skill files/diff, heuristic code/thought/objectives, ...).
            version: ``None`` for the next version (latest + 1, from 1), or an explicit unused version >= 1.
            key: idempotency key; if an artifact with this key exists it is returned and nothing is written.
            parent_version: version of the same ``(kind, name)`` this one derives from (must exist).
            meta: free JSON metadata.

        Raises:
            TypeError / ValueError: a bad argument (named), an existing explicit ``version``, a missing
                ``parent_version``, a ``key`` used by another ``(kind, name)``.
            PermissionError: the store is read-only.
        """
        with self._write() as conn:
            return _artifacts.put_artifact(
                conn,
                run_id,
                kind,
                name,
                content,
                version=version,
                key=key,
                parent_version=parent_version,
                meta=meta,
                created_at=time.time(),
            )

    def get_artifact(self, kind: str, name: str, version: int | None = None) -> Artifact | None:
        """Version ``version`` of ``(kind, name)``, the latest when ``None``; ``None`` if absent."""
        with self._read() as conn:
            return _artifacts.get_artifact(conn, kind, name, version)

    def list_artifacts(
        self, kind: str | None = None, name: str | None = None, run_id: str | None = None
    ) -> list[Artifact]:
        """Artifact versions matching the filters, ordered by ``(kind, name, version)``."""
        with self._read() as conn:
            return _artifacts.list_artifacts(conn, kind, name, run_id)

    # ----------------------------------------------------------------------------------------- ES history
    def add_es_history(self, run_id: str, evolver: str, generation: int, row: dict[str, Any]) -> bool:
        """Record the ES history row of one generation (JSON dict: seeds, rewards, sigma, alpha, ...).

        Idempotent on ``(run_id, evolver, generation)``: returns ``True`` if written, ``False`` if a row for
        that generation exists already (the stored row is kept unchanged).

        Raises:
            TypeError / ValueError: a bad argument (named); PermissionError: the store is read-only.
        """
        check_str(run_id, "run_id")
        check_str(evolver, "evolver")
        check_int(generation, "generation")
        if not isinstance(row, dict):
            raise TypeError(f"row must be a dict, got {type(row).__name__}")
        text = dumps_json(row, "row")
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO es_history (run_id, evolver, generation, row, created_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, evolver, generation) DO NOTHING",
                (run_id, evolver, generation, text, time.time()),
            )
            return cur.rowcount == 1

    def es_history(self, run_id: str, evolver: str) -> list[dict[str, Any]]:
        """The ES history rows of ``(run_id, evolver)``, as stored, ordered by generation."""
        check_str(run_id, "run_id")
        check_str(evolver, "evolver")
        with self._read() as conn:
            rows = conn.execute(
                "SELECT row FROM es_history WHERE run_id = ? AND evolver = ? ORDER BY generation",
                (run_id, evolver),
            ).fetchall()
        return [loads_json(r["row"]) for r in rows]

"""Read-only view of one run folder for the dashboard: opening checks and the rows each panel shows.

:func:`open_run` checks a folder before anything is served and turns every bad input into one
:class:`DashboardError` with a message for the user: not a folder, no ``store.sqlite``, not an SQLite file,
not a coevo store, a schema version other than this coevo's (newer: upgrade coevo; older: the dashboard
never migrates), a database locked by another process.

The store is opened with ``TrajectoryStore(readonly=True)``, i.e. an SQLite ``file:...?mode=ro`` URI
connection to a WAL file: each read below is one short read transaction (a consistent snapshot), and a WAL
reader never blocks the run's writer (it only keeps the writer's checkpoint from passing its snapshot for
the length of one read). Nothing here writes to the store. A run that is still being written is read as it
is at each call, so the panels refresh by calling the methods again (:meth:`RunReader.data_version` tells
whether anything changed).

All methods return plain Python rows (dicts, lists) so that they can be tested without a browser; reward
is higher-is-better everywhere (``coevo.types``), objectives are in the problem's own units.
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from coevo.store import SCHEMA_VERSION, TrajectoryStore
from coevo.store.schema import read_version
from coevo.tables import mean
from coevo.types import Trajectory, is_text

#: artifact kinds written by other parts of coevo (kept as literals so that reading a run imports no
#: evolver, model or sandbox code): the loop's per-step records (``coevo.report.writer.STEP_KIND``), the
#: evolvers' report sections (``SECTION_KIND``), AHD best heuristics (``coevo.evolvers.ahd_common``) and
#: skill versions (``coevo.skills.versions.SKILL_ARTIFACT_KIND``)
STEP_KIND = "loop_step"
SECTION_KIND = "report_section"
HEURISTIC_KIND = "heuristic"
SKILL_KIND = "skill"


class DashboardError(RuntimeError):
    """A run folder the dashboard cannot show; the message says why and what to do."""


def _ro_connect(db: Path, busy_timeout_s: float) -> sqlite3.Connection:
    conn = sqlite3.connect(
        f"{db.resolve().as_uri()}?mode=ro",
        uri=True,
        isolation_level=None,
        timeout=busy_timeout_s,
        check_same_thread=False,
    )
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    return conn


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def open_run(run_dir: str | Path, busy_timeout_s: float = 2.0) -> RunReader:
    """Check ``run_dir`` and open its store read-only.

    Args:
        run_dir: a run folder (``coevo run`` output: ``store.sqlite``, ``config.yaml``, ...).
        busy_timeout_s: how long (s) to wait for a lock held by another process before giving up.

    Raises:
        DashboardError: not a run folder, not a coevo store, a schema of another version, a busy or
            unreadable database (the message names the file and the fix).
    """
    from coevo.errors import RunFolderError, require_run_folder

    try:
        run_dir = require_run_folder(run_dir)
    except RunFolderError as exc:
        raise DashboardError(str(exc)) from None
    db = run_dir / "store.sqlite"
    try:
        conn = _ro_connect(db, busy_timeout_s)
        try:
            found = read_version(conn)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if _is_busy(exc):
            raise DashboardError(
                f"{db} is busy: another process holds an exclusive lock on it ({exc}); try again when it is released"
            ) from None
        raise DashboardError(f"{db} cannot be read as an SQLite database: {exc}") from None
    if found is None:
        raise DashboardError(f"{db} is not a coevo trajectory store (no schema_version table)")
    if found > SCHEMA_VERSION:
        raise DashboardError(
            f"{db} has store schema version {found}, newer than this coevo's ({SCHEMA_VERSION}); upgrade coevo to view it"
        )
    if found < SCHEMA_VERSION:
        raise DashboardError(
            f"{db} has store schema version {found}, older than this coevo's ({SCHEMA_VERSION}); the dashboard "
            "never migrates a store: run `coevo runs show --report RUN_DIR` once (it opens the store for writing, which upgrades the file), then serve it"
        )
    try:
        return RunReader(run_dir, TrajectoryStore(db, readonly=True, busy_timeout_s=busy_timeout_s))
    except sqlite3.Error as exc:  # pragma: no cover - the version read above succeeded moments ago
        raise DashboardError(f"{db} cannot be opened read-only: {exc}") from None


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def member_label(index: int | None, sign: int | None, seed: int | None) -> str:
    """``#3 + seed 123`` for an ES member (index, sign, noise seed); ``–`` for none."""
    return "–" if seed is None else f"#{index} {'+' if (sign or 1) > 0 else '−'} seed {seed}"


def _member_label(t: Trajectory) -> str:
    m = t.member
    return member_label(None, None, None) if m is None else member_label(m.index, m.sign, m.seed)


def heuristic_id(t: Trajectory) -> str:
    """The id EoH gives the heuristic of a trajectory: its key without the run id (``Individual.id``)."""
    return t.key.split("/", 1)[-1]


def is_heuristic(t: Trajectory) -> bool:
    """Whether ``t`` is one LLM sample of a heuristic-design evolver (its meta names problem and operator)."""
    return "problem" in t.meta and "operator" in t.meta and "code" in t.meta


def _locked(method):
    """Run a :class:`RunReader` method under the reader's lock (the web server calls from several threads;
    one read-only connection serves them one at a time, each read being short)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class RunReader:
    """The dashboard's read-only access to one run (see the module doc). Made by :func:`open_run`.

    Attributes:
        run_dir: the run folder. store: the read-only store. run_id: the run shown (the folder's name when
        the store holds trajectories of that run, else its first run id).

    Every public method may raise ``sqlite3.OperationalError`` when the file stays locked longer than the
    busy timeout (a writer in exclusive locking mode); callers show that as "busy" and retry later.
    """

    def __init__(self, run_dir: Path, store: TrajectoryStore) -> None:
        self.run_dir = Path(run_dir)
        self.store = store
        self._lock = threading.RLock()

    def close(self) -> None:
        with self._lock:
            self.store.close()

    def _sql(self, query: str, params: tuple | list = ()) -> list[tuple]:
        """Rows of one read-only SELECT (an implicit read transaction of its own)."""
        with self._lock:
            return [tuple(r) for r in self.store.conn.execute(query, params).fetchall()]

    # ------------------------------------------------------------------------------------------ basics
    @property
    @_locked
    def run_id(self) -> str:
        ids = self.store.run_ids()
        return self.run_dir.name if self.run_dir.name in ids or not ids else ids[0]

    @_locked
    def data_version(self) -> list[Any]:
        """A value that changes whenever the run writes anything (rows, artifacts, ES history, summary)."""
        row = self._sql(
            "SELECT (SELECT MAX(id) FROM trajectories), (SELECT MAX(id) FROM artifacts), "
            "(SELECT COUNT(*) FROM es_history)"
        )[0]
        summary = self.run_dir / "summary.json"
        return [*tuple(row), summary.stat().st_mtime if summary.exists() else None]

    @_locked
    def config(self) -> dict[str, Any]:
        """The run's saved ``config.yaml`` as a mapping ({} when missing or unreadable)."""
        path = self.run_dir / "config.yaml"
        try:
            data = yaml.safe_load(path.read_text()) if path.is_file() else {}
        except (OSError, yaml.YAMLError):
            return {}
        return data if isinstance(data, dict) else {}

    @_locked
    def summary(self) -> dict[str, Any] | None:
        """``summary.json`` (written when the run stops), or ``None`` while it runs or after a crash."""
        path = self.run_dir / "summary.json"
        try:
            return json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError):
            return None

    @_locked
    def trajectories(self, with_steps: bool = False) -> list[Trajectory]:
        """The run's trajectories in insertion order (steps only when asked: they are the bulk of a store)."""
        return self.store.query(run_id=self.run_id, with_steps=with_steps)

    @_locked
    def steps_records(self) -> list[dict[str, Any]]:
        """The loop's per-step records (round, evolver, samples, best_reward, metrics, samples_total, wall_s)."""
        arts = self.store.list_artifacts(kind=STEP_KIND, run_id=self.run_id)
        return [a.content for a in sorted(arts, key=lambda a: a.id)]

    # ---------------------------------------------------------------------------------------- overview
    @_locked
    def overview(self) -> dict[str, Any]:
        """Budget used, rounds, stop reason, wall time and per-evolver totals.

        Returns:
            ``{run_id, name, status, stop_reason, rounds_completed, max_rounds, samples, max_samples,
            wall_s, max_wall_s, trajectories, steps, evolvers: [{evolver, space, trajectories, samples,
            valid_percent, text_calls, mean_reward, best_reward}]}`` (``None`` where unknown; ``valid_percent``
            leaves free-text calls out, ``text_calls`` counts them: :func:`coevo.types.is_text`); ``wall_s`` is the loop's
            summed evolver-step time (s).
        """
        cfg = self.config()
        budget = cfg.get("budget") or {}
        steps = self.steps_records()
        trajs = self.trajectories()
        summary = self.summary()
        per: dict[str, list[Trajectory]] = defaultdict(list)
        for t in trajs:
            per[t.evolver].append(t)
        evolvers = []
        for name, ts in sorted(per.items()):
            rewards = [t.reward for t in ts if t.valid and _finite(t.reward) is not None]
            made = [t for t in ts if not is_text(t)]
            evolvers.append(
                {
                    "evolver": name,
                    "space": ts[0].space,
                    "trajectories": len(ts),
                    "samples": sum(t.llm_calls for t in ts),
                    "valid_percent": 100.0 * sum(t.valid for t in made) / len(made) if made else None,
                    "text_calls": sum(t.llm_calls for t in ts if is_text(t)),
                    "mean_reward": mean(rewards) if rewards else None,
                    "best_reward": max(rewards) if rewards else None,
                }
            )
        rounds = summary["rounds_completed"] if summary else (max(s["round"] for s in steps) + 1 if steps else 0)
        return {
            "run_id": self.run_id,
            "name": (cfg.get("run") or {}).get("name"),
            "status": "stopped" if summary else "running (or stopped without a summary)",
            "stop_reason": summary.get("stop_reason") if summary else None,
            "rounds_completed": rounds,
            "max_rounds": budget.get("max_rounds"),
            "samples": self.store.count_llm_calls(self.run_id),
            "max_samples": budget.get("max_samples"),
            "wall_s": sum(float(s.get("wall_s") or 0.0) for s in steps),
            "max_wall_s": budget.get("max_wall_s"),
            "trajectories": len(trajs),
            "steps": len(steps),
            "evolvers": evolvers,
        }

    @_locked
    def reward_curves(self) -> dict[str, tuple[list[int], list[float]]]:
        """Per evolver: (run's cumulative LLM samples, best reward so far) at each valid trajectory."""
        curves: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
        best: dict[str, float] = {}
        samples = 0
        for t in self.trajectories():
            samples += t.llm_calls
            r = _finite(t.reward)
            if not t.valid or r is None:
                continue
            best[t.evolver] = max(best.get(t.evolver, -math.inf), r)
            curves[t.evolver][0].append(samples)
            curves[t.evolver][1].append(best[t.evolver])
        return dict(curves)

    # -------------------------------------------------------------------------------- heuristic design
    @_locked
    def heuristics(self) -> list[dict[str, Any]]:
        """Every heuristic of the run: each LLM sample of a heuristic-design evolver (valid or not, ES
        members' children included), plus the parents they name that are no sample (the problem's seed
        heuristic), in insertion order.

        Returns:
            rows ``{id, trajectory_id, evolver, space, problem, generation, round, operator, parents, member,
            objective, reward, valid, failure, failure_detail, thought, code, samples_before}``;
            ``samples_before`` is the run's LLM-sample count when the heuristic was written.
        """
        rows: list[dict[str, Any]] = []
        samples = 0
        for t in self.trajectories():
            samples += t.llm_calls
            if not is_heuristic(t):
                continue
            m = t.meta
            rows.append(
                {
                    "id": heuristic_id(t),
                    "trajectory_id": t.id,
                    "evolver": t.evolver,
                    "space": t.space,
                    "problem": m.get("problem"),
                    "generation": t.generation,
                    "round": t.round,
                    "operator": m.get("operator"),
                    "parents": list(m.get("parent_ids") or []),
                    "member": _member_label(t),
                    "objective": _finite(m.get("objective")),
                    "reward": _finite(t.reward),
                    "valid": t.valid,
                    "failure": t.failure,
                    "failure_detail": t.failure_detail,
                    "thought": m.get("thought"),
                    "code": m.get("code"),
                    "samples_before": samples,
                }
            )
        known = {r["id"] for r in rows}
        best = {
            a.content.get("id"): a.content for a in self.store.list_artifacts(kind=HEURISTIC_KIND, run_id=self.run_id)
        }
        for parent in dict.fromkeys(p for r in rows for p in r["parents"]):
            if parent in known:
                continue
            art = best.get(parent, {})
            rows.insert(
                0,
                {
                    "id": parent,
                    "trajectory_id": None,
                    "evolver": art.get("source") or "–",
                    "space": None,
                    "problem": art.get("problem"),
                    "generation": 0,
                    "round": None,
                    "operator": art.get("operator") or "seed",
                    "parents": [],
                    "member": "–",
                    "objective": _finite(art.get("objective")),
                    "reward": _finite(art.get("reward")),
                    "valid": bool(art),
                    "failure": None if art else "not stored",
                    "failure_detail": None,
                    "thought": art.get("thought"),
                    "code": art.get("code"),
                    "samples_before": 0,
                },
            )
            known.add(parent)
        return rows

    @_locked
    def best_heuristics(self) -> list[dict[str, Any]]:
        """The successive bests each heuristic-design evolver kept (``heuristic`` artifacts), oldest first:
        ``{evolver, id, objective, reward, operator, thought, code, created_at}``."""
        out = []
        for a in sorted(self.store.list_artifacts(kind=HEURISTIC_KIND, run_id=self.run_id), key=lambda a: a.id):
            c = a.content
            out.append(
                {
                    "evolver": a.meta.get("evolver") or a.name,
                    "id": c.get("id"),
                    "objective": _finite(c.get("objective")),
                    "reward": _finite(c.get("reward")),
                    "operator": c.get("operator"),
                    "thought": c.get("thought"),
                    "code": c.get("code"),
                    "created_at": a.created_at,
                }
            )
        return out

    @_locked
    def best_so_far(self) -> dict[str, tuple[list[int], list[float]]]:
        """Per heuristic-design evolver: (run's LLM samples, training objective of the best heuristic so far)
        at each valid sample; "best" is the highest reward, so minimised and maximised objectives both work."""
        out: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
        best: dict[str, tuple[float, float]] = {}
        for h in self.heuristics():
            if h["trajectory_id"] is None or not h["valid"] or h["reward"] is None or h["objective"] is None:
                continue
            if h["evolver"] not in best or h["reward"] > best[h["evolver"]][0]:
                best[h["evolver"]] = (h["reward"], h["objective"])
            out[h["evolver"]][0].append(h["samples_before"])
            out[h["evolver"]][1].append(best[h["evolver"]][1])
        return dict(out)

    @_locked
    def report_sections(self) -> dict[str, str]:
        """Per evolver: the latest Markdown section of its report (for AHD evolvers: seed vs best heuristic on
        the held-out sizes), written when the run ends; {} while it runs."""
        latest: dict[str, str] = {}
        arts = self.store.list_artifacts(kind=SECTION_KIND, run_id=self.run_id)
        for art in sorted(arts, key=lambda a: a.version):
            latest[art.content.get("evolver", art.name)] = art.content.get("markdown", "")
        return latest

    # ---------------------------------------------------------------------------------------------- ES
    @_locked
    def es_evolvers(self) -> list[str]:
        """Names of the run's evolvers with ES history rows."""
        rows = self._sql("SELECT DISTINCT evolver FROM es_history WHERE run_id = ? ORDER BY evolver", (self.run_id,))
        return [r[0] for r in rows]

    @_locked
    def es_generations(self, evolver: str) -> list[dict[str, Any]]:
        """One row per ES generation of ``evolver``.

        Returns:
            ``{generation, round, sigma, alpha, n, rewards, coeffs, signs, seeds, mean_reward, max_reward,
            min_reward, update_norm, changed_fraction, skipped, weight_hash_before, weight_hash_after,
            heldout_reward}``; ``coeffs`` are the normalised (shaped) rewards the update used;
            ``heldout_reward`` is the mean reward of the centre's held-out trajectories evaluated at this
            generation (before its update), ``None`` when none ran. A final row with only
            ``heldout_reward`` follows when the centre was evaluated after the last update.
        """
        held: dict[int, list[float]] = defaultdict(list)
        for t in self.store.query(run_id=self.run_id, evolver=evolver, space="parameter", with_steps=False):
            r = _finite(t.reward)
            if t.member is None and t.valid and r is not None:
                held[t.generation].append(r)
        out = []
        for row in self.store.es_history(self.run_id, evolver):
            g = int(row["generation"])
            rewards = [float(r) for r in row.get("rewards") or []]
            update = row.get("update") or {}
            out.append(
                {
                    "generation": g,
                    "round": row.get("round"),
                    "sigma": row.get("sigma"),
                    "alpha": row.get("alpha"),
                    "n": len(rewards),
                    "rewards": rewards,
                    "coeffs": [float(c) for c in row.get("coeffs") or []],
                    "signs": list(row.get("signs") or []),
                    "seeds": list(row.get("seeds") or []),
                    "mean_reward": mean(rewards) if rewards else None,
                    "max_reward": max(rewards) if rewards else None,
                    "min_reward": min(rewards) if rewards else None,
                    "update_norm": _finite(update.get("update_norm")),
                    "changed_fraction": _finite(update.get("changed_fraction")),
                    "skipped": bool(row.get("skipped")),
                    "weight_hash_before": row.get("weight_hash_before"),
                    "weight_hash_after": row.get("weight_hash_after"),
                    "heldout_reward": sum(held[g]) / len(held[g]) if held.get(g) else None,
                }
            )
        done = {r["generation"] for r in out}
        for g in sorted(set(held) - done):
            out.append({"generation": g, "heldout_reward": sum(held[g]) / len(held[g]), "final": True})
        return out

    # ------------------------------------------------------------------------------------ trajectories
    @_locked
    def trajectory_rows(
        self,
        evolver: str | None = None,
        generation: int | None = None,
        member: str | None = None,
        valid: bool | None = None,
        limit: int | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """Trajectories matching the filters, newest first, as table rows; and how many matched in all.

        Args:
            evolver, generation: equality filters (``None`` = any).
            member: ``"none"`` for trajectories without an ES member, a member index as a string
                (``"3"``) for that member of each generation, ``None`` for any.
            valid: ``True`` valid only, ``False`` failures only.
            limit: at most this many rows (the newest).
        """
        where, params = ["run_id = ?"], [self.run_id]
        for column, value in (("evolver", evolver), ("generation", generation)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if valid is not None:
            where.append("valid = ?")
            params.append(int(bool(valid)))
        if member == "none":
            where.append("member_seed IS NULL")
        elif member is not None:
            where.append("member_index = ?")
            params.append(int(member))
        found = self._sql(
            "SELECT id, key, evolver, space, round, generation, member_index, member_sign, member_seed, task_id, "
            f"valid, failure, reward, n_steps, llm_calls FROM trajectories WHERE {' AND '.join(where)} ORDER BY id DESC",
            params,
        )
        rows = [
            {
                "id": r[0],
                "key": r[1],
                "evolver": r[2],
                "space": r[3],
                "round": r[4],
                "generation": r[5],
                "member": member_label(r[6], r[7], r[8]),
                "task": r[9],
                "valid": bool(r[10]),
                "failure": r[11],
                "reward": r[12],
                "steps": r[13],
                "llm_calls": r[14],
            }
            for r in found
        ]
        return (rows if limit is None else rows[:limit]), len(rows)

    @_locked
    def filter_options(self) -> dict[str, list[Any]]:
        """Distinct values for the trajectory filters: ``{evolvers, generations, members}``."""
        run = (self.run_id,)
        ev = [r[0] for r in self._sql("SELECT DISTINCT evolver FROM trajectories WHERE run_id = ? ORDER BY 1", run)]
        gen = [r[0] for r in self._sql("SELECT DISTINCT generation FROM trajectories WHERE run_id = ? ORDER BY 1", run)]
        mem = [
            r[0]
            for r in self._sql(
                "SELECT DISTINCT member_index FROM trajectories WHERE run_id = ? "
                "AND member_index IS NOT NULL ORDER BY 1",
                run,
            )
        ]
        return {"evolvers": ev, "generations": gen, "members": mem}

    @_locked
    def trajectory(self, trajectory_id: int) -> Trajectory | None:
        """The stored trajectory with this id, with its steps (any run of the store), or ``None``."""
        rows = self._sql("SELECT key FROM trajectories WHERE id = ?", (int(trajectory_id),))
        return self.store.get_by_key(rows[0][0]) if rows else None

    # ------------------------------------------------------------------------------------------ skills
    @_locked
    def skill_versions(self) -> list[dict[str, Any]]:
        """Every stored skill version of the run, by skill then version.

        Returns:
            rows ``{name, version, parent_version, diff, files, trajectory_ids, causes, meta, created_at}``;
            ``causes`` summarises each causing trajectory still in the store
            (``{id, evolver, generation, reward, valid, task}``).
        """
        arts = self.store.list_artifacts(kind=SKILL_KIND, run_id=self.run_id)
        ids = sorted({int(i) for a in arts for i in a.content.get("trajectory_ids") or []})
        known: dict[int, dict[str, Any]] = {}
        if ids:
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                for r in self._sql(
                    "SELECT id, evolver, generation, reward, valid, task_id FROM trajectories "
                    f"WHERE id IN ({', '.join('?' * len(chunk))})",
                    chunk,
                ):
                    known[r[0]] = {
                        "id": r[0],
                        "evolver": r[1],
                        "generation": r[2],
                        "reward": r[3],
                        "valid": bool(r[4]),
                        "task": r[5],
                    }
        out = []
        for a in arts:
            tids = [int(i) for i in a.content.get("trajectory_ids") or []]
            out.append(
                {
                    "name": a.name,
                    "version": a.version,
                    "parent_version": a.parent_version,
                    "diff": a.content.get("diff") or "",
                    "files": dict(a.content.get("files") or {}),
                    "trajectory_ids": tids,
                    "causes": [known[i] for i in tids if i in known],
                    "meta": dict(a.meta),
                    "created_at": a.created_at,
                }
            )
        return out

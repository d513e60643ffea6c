"""Tests of coevo.store on real SQLite files, with real child processes for crash and concurrency."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from coevo.store import SCHEMA_VERSION, SchemaError, TrajectoryStore
from coevo.store.export import export_jsonl
from coevo.store.schema import migrate
from coevo.types import ContextRef, ESMember, Step, Trajectory

WRITER = Path(__file__).with_name("helpers_store_writer.py")
sys.path.insert(0, str(WRITER.parent))
from helpers_store_writer import LLM_CALLS_PER_TRAJECTORY, make_trajectory


def traj(key: str, **kw) -> Trajectory:
    base = {"key": key, "run_id": "r1", "evolver": "eoh", "space": "context", "llm_calls": 1, "reward": 0.0}
    base.update(kw)
    return Trajectory(**base)


def full_trajectory() -> Trajectory:
    return Trajectory(
        key="r1/es/0/3/+",
        run_id="r1",
        evolver="es",
        space="parameter",
        round=2,
        generation=7,
        task_id="miniwob.click-button",
        steps=[
            Step(
                observation="page α",
                model_output="I click",
                action="click('b1')",
                tool_result="ok",
                reward=0.5,
                meta={"tokens": 12, "nested": {"a": [1, 2.5, None]}},
            ),
            Step(observation=None, model_output="garbage", action=None, tool_result=None, reward=None, meta={}),
            Step(observation="done", model_output="stop", action="stop()", tool_result="", reward=-1.25),
        ],
        reward=0.75,
        valid=True,
        member=ESMember(seed=2**63 - 1, sigma=1e-3, sign=-1, index=3),
        context=ContextRef(skill_name="web-forms", skill_version=4, heuristic_id="h-17", prompt="Be brief."),
        llm_calls=3,
        prompt_tokens=1234,
        completion_tokens=56,
        started_at=1_700_000_000.125,
        duration_s=4.5,
        meta={"objective": 6.25, "operator": "e1", "code": "def f():\n    return 1\n"},
    )


@pytest.fixture
def store(tmp_path: Path):
    with TrajectoryStore(tmp_path / "run" / "store.db") as s:
        yield s


def check_consistent(db: Path) -> sqlite3.Connection:
    """Assert integrity and that every trajectory has exactly its recorded steps; return the connection."""
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    mismatched = conn.execute(
        "SELECT t.id, t.n_steps, COUNT(s.idx), COALESCE(MAX(s.idx), -1) FROM trajectories t "
        "LEFT JOIN steps s ON s.trajectory_id = t.id GROUP BY t.id "
        "HAVING t.n_steps != COUNT(s.idx) OR COALESCE(MAX(s.idx), -1) != t.n_steps - 1"
    ).fetchall()
    assert mismatched == []
    orphans = conn.execute(
        "SELECT COUNT(*) FROM steps WHERE trajectory_id NOT IN (SELECT id FROM trajectories)"
    ).fetchone()[0]
    assert orphans == 0
    return conn


# ------------------------------------------------------------------------------------------ round trip
def test_round_trip_full_trajectory(store: TrajectoryStore):
    t = full_trajectory()
    stored, inserted = store.add_trajectory(t)
    assert inserted and stored.id is not None and t.id is None
    assert stored == replace(t, id=stored.id)
    got = store.get_by_key(t.key)
    assert got == stored
    assert [s.reward for s in got.steps] == [0.5, None, -1.25]
    assert got.steps[0].meta == {"tokens": 12, "nested": {"a": [1, 2.5, None]}}
    assert got.member == ESMember(seed=2**63 - 1, sigma=1e-3, sign=-1, index=3)
    assert store.query(run_id="r1") == [got]
    assert store.get_by_key("nope") is None


def test_round_trip_minimal_trajectory(store: TrajectoryStore):
    t = traj("k0", reward=None, valid=False, failure="parse", failure_detail="no code block", llm_calls=2)
    stored, _ = store.add_trajectory(t)
    got = store.get_by_key("k0")
    assert got == stored and got.member is None and got.steps == [] and got.context == ContextRef()
    assert (got.valid, got.failure, got.reward) == (False, "parse", None)


def test_pragmas(store: TrajectoryStore):
    c = store.conn
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert c.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert c.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert c.execute("PRAGMA busy_timeout").fetchone()[0] == 30000


# ----------------------------------------------------------------------------------------- idempotency
def test_idempotent_insert_same_key(store: TrajectoryStore):
    first, ins1 = store.add_trajectory(full_trajectory())
    again = replace(full_trajectory(), reward=99.0, llm_calls=50, steps=[Step(observation="other")])
    second, ins2 = store.add_trajectory(again)
    assert (ins1, ins2) == (True, False)
    assert second == first  # the stored copy, not the new one
    assert store.count() == 1 and store.count_llm_calls("r1") == 3
    assert store.conn.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 3


def test_add_trajectories_batch_duplicates_and_atomicity(store: TrajectoryStore):
    out = store.add_trajectories([traj("a"), traj("b"), traj("a", reward=5.0)])
    assert [ins for _, ins in out] == [True, True, False]
    assert out[2][0] == out[0][0]
    bad = traj("d", steps=[Step(observation="ok"), Step(meta={"x": object()})])
    with pytest.raises(TypeError, match=r"steps\[1\]\.meta"):
        store.add_trajectories([traj("c", steps=[Step(observation="s")]), bad])
    assert store.get_by_key("c") is None and store.count() == 2  # whole batch rolled back
    assert store.conn.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 0


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        ({"reward": float("nan")}, "reward is NaN"),
        ({"space": "weights"}, "space must be one of"),
        ({"failure": "oops"}, "failure must be None or one of"),
        ({"member": ESMember(seed=1, sigma=1e-3, sign=0)}, "member.sign"),
        ({"member": ESMember(seed=-1, sigma=1e-3)}, "member.seed"),
        ({"llm_calls": -1}, "llm_calls must be >= 0"),
        ({"generation": 1.5}, "generation must be an int"),
        ({"run_id": ""}, "run_id must be a non-empty string"),
        ({"meta": {"f": lambda: 0}}, "meta is not JSON-serialisable"),
        ({"steps": [Step(observation=3)]}, r"steps\[0\]\.observation"),
    ],
)
def test_bad_fields_are_named_and_nothing_written(store: TrajectoryStore, kw, pattern):
    with pytest.raises((TypeError, ValueError), match=pattern):
        store.add_trajectory(traj("bad", **kw))
    assert store.count() == 0


# ------------------------------------------------------------------------------------- queries, top-k
@pytest.fixture
def population(store: TrajectoryStore) -> TrajectoryStore:
    fields = ("run_id", "evolver", "space", "round", "generation", "task_id", "reward", "valid", "llm_calls")
    rows = [
        # key, run, evolver, space, round, gen, task, reward, valid, llm_calls
        ("a", "r1", "es", "parameter", 0, 0, "t1", 0.5, True, 2),
        ("b", "r1", "es", "parameter", 0, 1, "t2", 0.9, True, 2),
        ("c", "r1", "eoh", "context", 1, 0, "t1", None, False, 1),
        ("d", "r1", "eoh", "context", 1, 1, "t1", -2.0, True, 1),
        ("e", "r2", "es", "parameter", 0, 0, "t1", 3.0, True, 4),
        ("f", "r1", "eoh", "context", 1, 1, "t2", 0.9, True, 1),
        ("g", "r1", "eoh", "context", 1, 1, "t2", 7.0, False, 1),
        ("h", "r1", "eoh", "context", 1, 2, "t2", None, True, 1),
    ]
    for key, *values in rows:
        kw = dict(zip(fields, values, strict=True))
        store.add_trajectory(traj(key, **kw, failure=None if kw["valid"] else "runtime", steps=[Step(action=key)]))
    return store


def keys(ts: list[Trajectory]) -> list[str]:
    return [t.key for t in ts]


def test_query_filters(population: TrajectoryStore):
    q = population.query
    assert keys(q()) == list("abcdefgh")
    assert keys(q(run_id="r1", evolver="es")) == ["a", "b"]
    assert keys(q(run_id="r1", evolver="eoh", generation=1)) == ["d", "f", "g"]
    assert keys(q(space="parameter")) == ["a", "b", "e"]
    assert keys(q(round=1)) == ["c", "d", "f", "g", "h"]
    assert keys(q(valid=False)) == ["c", "g"]
    assert keys(q(valid=True, min_reward=0.9)) == ["b", "e", "f"]
    assert keys(q(max_reward=0.5)) == ["a", "d"]
    assert keys(q(min_reward=0.5, max_reward=0.9)) == ["a", "b", "f"]
    assert keys(q(task_id="t2", run_id="r1")) == ["b", "f", "g", "h"]
    assert keys(q(run_id="nope")) == []
    assert [t.steps[0].action for t in q(run_id="r2")] == ["e"]
    assert all(t.steps == [] for t in q(with_steps=False))
    assert population.count(run_id="r1", valid=True) == 5


def test_query_ordering_and_limit(population: TrajectoryStore):
    q = population.query
    assert keys(q(order_by="reward")) == ["d", "a", "b", "f", "e", "g", "c", "h"]  # NULL rewards last
    assert keys(q(order_by="reward", descending=True)) == ["g", "e", "b", "f", "a", "d", "c", "h"]
    assert keys(q(order_by="id", descending=True, limit=3)) == ["h", "g", "f"]
    assert q(limit=0) == []
    with pytest.raises(ValueError, match="order_by"):
        q(order_by="score")
    with pytest.raises(TypeError, match="valid must be a bool"):
        q(valid=1)
    with pytest.raises(ValueError, match="limit must be >= 0"):
        q(limit=-1)


def test_top_k(population: TrajectoryStore):
    # valid only, reward desc, ties (b, f at 0.9) by insertion order, valid-without-reward (h) excluded
    assert keys(population.top_k(10)) == ["e", "b", "f", "a", "d"]
    assert keys(population.top_k(2, run_id="r1")) == ["b", "f"]
    assert keys(population.top_k(3, run_id="r1", evolver="eoh")) == ["f", "d"]
    assert keys(population.top_k(5, min_reward=0.6)) == ["e", "b", "f"]
    assert population.top_k(0) == []
    with pytest.raises(ValueError, match="top_k fixes"):
        population.top_k(3, valid=False)


def test_count_llm_calls(population: TrajectoryStore):
    assert population.count_llm_calls("r1") == 2 + 2 + 1 + 1 + 1 + 1 + 1  # invalid ones count too
    assert population.count_llm_calls("r2") == 4
    assert population.count_llm_calls("unknown") == 0
    assert population.run_ids() == ["r1", "r2"]


# ----------------------------------------------------------------------------------- artifacts, history
def test_artifact_versioning(store: TrajectoryStore):
    v1 = store.put_artifact("r1", "skill", "web-forms", {"files": {"SKILL.md": "# v1"}}, meta={"seed": 1})
    v2 = store.put_artifact("r2", "skill", "web-forms", {"files": {"SKILL.md": "# v2"}, "diff": "+x"}, parent_version=1)
    h1 = store.put_artifact("r1", "heuristic", "h-1", {"code": "def f(): pass", "thought": "t", "objectives": [5.5]})
    assert (v1.version, v2.version, h1.version) == (1, 2, 1)  # counted per (kind, name), across runs
    assert (v2.run_id, v2.parent_version, v1.meta) == ("r2", 1, {"seed": 1})
    assert store.get_artifact("skill", "web-forms") == v2
    assert store.get_artifact("skill", "web-forms", version=1).content == {"files": {"SKILL.md": "# v1"}}
    assert store.get_artifact("skill", "missing") is None
    assert store.get_artifact("skill", "web-forms", version=9) is None
    v5 = store.put_artifact("r2", "skill", "web-forms", {"x": 5}, version=5)
    assert store.get_artifact("skill", "web-forms").version == 5
    assert store.put_artifact("r2", "skill", "web-forms", {"x": 6}).version == 6
    assert [(a.kind, a.name, a.version) for a in store.list_artifacts()] == [
        ("heuristic", "h-1", 1),
        ("skill", "web-forms", 1),
        ("skill", "web-forms", 2),
        ("skill", "web-forms", 5),
        ("skill", "web-forms", 6),
    ]
    assert [a.version for a in store.list_artifacts(kind="skill", run_id="r2")] == [2, 5, 6]
    assert store.list_artifacts(name="h-1") == [h1]
    with pytest.raises(ValueError, match="version 5 .* already exists"):
        store.put_artifact("r2", "skill", "web-forms", {}, version=5)
    with pytest.raises(ValueError, match="parent_version 3 does not exist"):
        store.put_artifact("r2", "skill", "web-forms", {}, parent_version=3)
    with pytest.raises(TypeError, match="content must be a dict"):
        store.put_artifact("r2", "skill", "web-forms", ["no"])
    v7 = store.put_artifact("r3", "skill", "web-forms", {"x": 7})
    assert v7.version == 7 and store.get_artifact("skill", "web-forms") == v7 != v5


def test_artifact_idempotent_key(store: TrajectoryStore):
    a = store.put_artifact("r1", "skill", "s", {"v": 1}, key="r1/t2s/round0")
    b = store.put_artifact("r1", "skill", "s", {"v": "different"}, key="r1/t2s/round0")
    assert a == b and len(store.list_artifacts()) == 1 and b.key == "r1/t2s/round0"
    with pytest.raises(ValueError, match="already names artifact"):
        store.put_artifact("r1", "skill", "other", {"v": 1}, key="r1/t2s/round0")


def test_es_history_idempotent(store: TrajectoryStore):
    rows = [{"generation": g, "seeds": [g, g + 1], "rewards": [0.1 * g, -0.5], "sigma": 1e-3} for g in range(3)]
    assert [store.add_es_history("r1", "es", g, r) for g, r in enumerate(rows)] == [True] * 3
    assert store.add_es_history("r1", "es", 1, {"generation": 1, "seeds": [99]}) is False
    assert store.add_es_history("r1", "es2", 1, {"generation": 1}) is True
    assert store.es_history("r1", "es") == rows
    assert store.es_history("r1", "es2") == [{"generation": 1}]
    assert store.es_history("r9", "es") == []
    with pytest.raises(ValueError, match="generation must be >= 0"):
        store.add_es_history("r1", "es", -1, {})


# ------------------------------------------------------------------------------------------- export
def test_export_jsonl(population: TrajectoryStore, tmp_path: Path):
    full = population.add_trajectory(replace(full_trajectory(), key="full", run_id="r2"))[0]
    out = tmp_path / "exp" / "r2.jsonl"
    assert population.export_jsonl(out, run_id="r2") == 2
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [Trajectory.from_dict(json.loads(line)) for line in lines] == [population.get_by_key("e"), full]
    assert json.loads(lines[1])["steps"][0]["observation"] == "page α"
    assert export_jsonl(population.path, tmp_path / "all.jsonl") == 9  # from a path: opened read-only
    assert len((tmp_path / "all.jsonl").read_text().splitlines()) == 9
    assert list(tmp_path.glob("exp/.*tmp")) == []


def test_export_cli(population: TrajectoryStore, tmp_path: Path):
    out = tmp_path / "cli.jsonl"
    cmd = [sys.executable, "-m", "coevo.store.export", str(population.path), str(out), "--run-id", "r1"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "exported 7 trajectories" in proc.stdout and proc.stderr == ""
    assert [json.loads(line)["key"] for line in out.read_text().splitlines()] == list("abcdfgh")
    missing = subprocess.run(
        [*cmd[:3], str(tmp_path / "none.db"), str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr


# --------------------------------------------------------------------------------- read-only, schema
def test_readonly_store(store: TrajectoryStore, tmp_path: Path):
    store.add_trajectory(traj("a"))
    with TrajectoryStore(store.path, readonly=True) as ro:
        assert keys(ro.query()) == ["a"]
        store.add_trajectory(traj("b"))
        assert keys(ro.query()) == ["a", "b"]  # sees the writer's later commits
        with pytest.raises(PermissionError, match="read-only"):
            ro.add_trajectory(traj("c"))
        with pytest.raises(PermissionError):
            ro.put_artifact("r1", "skill", "s", {})
        with pytest.raises(PermissionError):
            ro.add_es_history("r1", "es", 0, {})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TrajectoryStore(tmp_path / "missing.db", readonly=True)
    store.close()
    store.close()  # idempotent
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        store.query()


def test_schema_version_and_migration_hook(tmp_path: Path):
    db = tmp_path / "s.db"
    TrajectoryStore(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    nxt = SCHEMA_VERSION + 1

    def add_notes_column(c: sqlite3.Connection) -> None:
        c.execute("ALTER TABLE trajectories ADD COLUMN notes TEXT")

    with pytest.raises(SchemaError, match=f"no migration from schema_version {SCHEMA_VERSION} to {nxt}"):
        migrate(conn, target=nxt, migrations={})
    assert migrate(conn, target=nxt, migrations={SCHEMA_VERSION: add_notes_column}) == SCHEMA_VERSION
    columns = [r[1] for r in conn.execute("PRAGMA table_info(trajectories)")]
    assert "notes" in columns and conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == nxt
    conn.close()
    with pytest.raises(SchemaError, match="newer than this coevo"):
        TrajectoryStore(db)
    with pytest.raises(SchemaError, match="differs from this coevo"):
        TrajectoryStore(db, readonly=True)
    plain = tmp_path / "plain.db"
    sqlite3.connect(plain).execute("CREATE TABLE x (a)").connection.commit()
    with pytest.raises(SchemaError, match="not a coevo trajectory store"):
        TrajectoryStore(plain, readonly=True)


def test_bad_constructor_arguments(tmp_path: Path):
    with pytest.raises(ValueError, match="synchronous must be one of"):
        TrajectoryStore(tmp_path / "a.db", synchronous="SOMETIMES")
    with pytest.raises(ValueError, match=r"busy_timeout_s must be in \[0, 86400\)"):
        TrajectoryStore(tmp_path / "a.db", busy_timeout_s=-1)


def test_threads_share_one_store(store: TrajectoryStore):
    def write(worker: int) -> None:
        for i in range(25):
            store.add_trajectory(traj(f"w{worker}/{i}", llm_calls=1, steps=[Step(action=str(i))] * 3))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert store.count() == 100 and store.count_llm_calls("r1") == 100
    check_consistent(store.path).close()


# ------------------------------------------------------------------------------ crashes, concurrency
def start_writer(db: Path, mode: str, n_steps: int, count: int, marker: Path | None = None) -> subprocess.Popen:
    args = [sys.executable, str(WRITER), str(db), mode, str(n_steps), str(count)]
    if marker is not None:
        args.append(str(marker))
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"writer exited early ({proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the writer")
        time.sleep(0.01)


def test_sigkill_inside_open_transaction(tmp_path: Path):
    db, marker = tmp_path / "crash.db", tmp_path / "paused"
    proc = start_writer(db, "pause", n_steps=400, count=3, marker=marker)
    try:
        wait_for(marker.exists, 60, proc)
        # The writer now holds a write transaction with half of trajectory 3's steps written.
        probe = sqlite3.connect(db, timeout=0, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            probe.execute("BEGIN IMMEDIATE")
        probe.close()
        with TrajectoryStore(db, readonly=True, busy_timeout_s=0) as reader:  # WAL: reader not blocked
            assert keys(reader.query(with_steps=False)) == [f"crash/es/{i}" for i in range(3)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    conn = check_consistent(db)
    assert conn.execute("SELECT COUNT(*) FROM trajectories").fetchone()[0] == 3
    assert conn.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 3 * 400
    conn.close()
    with TrajectoryStore(db) as store:  # usable after the crash; the interrupted key was never stored
        assert store.count_llm_calls("crash") == 3 * LLM_CALLS_PER_TRAJECTORY
        assert store.get_by_key("crash/es/3") is None
        assert store.add_trajectory(make_trajectory(3, 400))[1] is True
        assert [len(t.steps) for t in store.query()] == [400] * 4


def test_sigkill_free_running_writer(tmp_path: Path):
    db = tmp_path / "crash.db"
    proc = start_writer(db, "free", n_steps=3000, count=0)
    done: list[int] = []
    try:
        for line in proc.stdout:  # kill a few milliseconds into writing trajectory 3
            word, i = line.split()
            if word == "done":
                done.append(int(i))
            elif int(i) == 3:
                time.sleep(0.005)
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert done == [0, 1, 2]
    conn = check_consistent(db)
    n = conn.execute("SELECT COUNT(*) FROM trajectories").fetchone()[0]
    assert n in (3, 4)  # trajectory 3 is there completely (commit won the race) or not at all
    conn.close()
    with TrajectoryStore(db) as store:
        assert keys(store.query(with_steps=False)) == [f"crash/es/{i}" for i in range(n)]
        assert store.count_llm_calls("crash") == n * LLM_CALLS_PER_TRAJECTORY
        assert all(len(t.steps) == 3000 for t in store.query())


def test_concurrent_reader_while_writing(tmp_path: Path):
    db, total = tmp_path / "live.db", 40
    TrajectoryStore(db).close()
    proc = start_writer(db, "free", n_steps=300, count=total)
    seen: list[int] = []
    with TrajectoryStore(db, readonly=True, busy_timeout_s=1.0) as reader:
        while True:
            finished = proc.poll() is not None
            ts = reader.query(run_id="crash")  # each trajectory is complete or absent, never partial
            assert all(len(t.steps) == 300 and t.steps[-1].meta == {"j": 299} for t in ts)
            assert keys(ts) == [f"crash/es/{i}" for i in range(len(ts))]
            seen.append(len(ts))
            if finished:
                break
            time.sleep(0.005)
        assert proc.returncode == 0, proc.stderr.read()
        assert seen == sorted(seen) and seen[-1] == total
        assert len(set(seen)) > 2  # the reader observed the store mid-stream, several times
        assert reader.count_llm_calls("crash") == total * LLM_CALLS_PER_TRAJECTORY
    proc.stdout.close()
    proc.stderr.close()

"""Run lifecycle with real processes: SIGINT / SIGTERM on a running `coevo run`, two owners of one run folder,
budgets inside a step, progress when stderr is not a terminal, and damaged run folders."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from coevo.store import SchemaError, TrajectoryStore

TESTS = Path(__file__).parent
ROOT = TESTS.parent
#: one torch thread in the spawned runs (conftest's ``one_torch_thread``: two-thread BLAS on a shared 2-core machine is
#: many times slower for a tiny model; ES results do not depend on the thread count)
ENV = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def _toy(tmp_path: Path, *, rounds=4, samples=3, sleep=0.0, wall=None, name="cfg.yaml") -> Path:
    data = {
        "run": {"name": "t", "seed": 5},
        "budget": {"max_rounds": rounds, **({"max_wall_s": wall} if wall else {})},
        "evolvers": [{"name": "a", "type": "toy_evolvers:Counter", "samples_per_step": samples, "sleep_s": sleep}],
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "coevo.cli", "run", *args],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _count(db: Path, run_id: str) -> int:
    if not db.exists():
        return 0
    try:
        with TrajectoryStore(db, readonly=True) as s:
            return len(s.query(run_id=run_id, with_steps=False))
    except (SchemaError, sqlite3.Error, OSError, ValueError):  # the writer may not have created the schema yet
        return 0


def _wait_for(db: Path, run_id: str, n: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while _count(db, run_id) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, f"fewer than {n} trajectories after {timeout} s"
        time.sleep(0.02)


def _trajs(run_dir: Path) -> dict[str, tuple]:
    """Trajectories keyed without the run id (run folders differ): (reward, valid, llm_calls)."""
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        ts = s.query(run_id=run_dir.name, with_steps=False)
        keys = [t.key for t in ts]
        assert len(keys) == len(set(keys)), "duplicate trajectory keys"
        return {t.key.split("/", 1)[1]: (t.reward, t.valid, t.llm_calls) for t in ts}


def _es_hashes(run_dir: Path) -> list[str]:
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        return [r["weight_hash_after"] for r in s.es_history(run_dir.name, "es")]


# ------------------------------------------------------------------------------------------- signals
@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.slow
def test_sigint_on_a_tiny_model_es_run_then_resume_equals_the_uninterrupted_run(tmp_path):
    cfg = str(ROOT / "configs" / "es" / "tiny.yaml")
    small = ["--set", "evolvers.es.total_generations=6", "--set", "budget.max_rounds=7"]
    rc, out, err = _finish(_spawn(cfg, *small, "--out", str(tmp_path / "ref"), "--quiet"))
    assert rc == 0, err

    run = tmp_path / "cut"
    proc = _spawn(cfg, *small, "--out", str(run), "--quiet")
    _wait_for(run / "store.sqlite", "cut", 40, proc)  # inside generation 1 (25 trajectories per generation)
    proc.send_signal(signal.SIGINT)
    rc, out, err = _finish(proc, 120)
    assert rc == 130, err
    assert out.splitlines()[0] == f"run folder: {run}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, no traceback
    assert "interrupted by SIGINT" in lines[0] and f"resume with: coevo run --resume {run}" in lines[0]
    assert "saved: checkpoint" in lines[0] and not (run / "summary.json").exists()

    rc, out, err = _finish(_spawn("--resume", str(run), "--quiet"))
    assert rc == 0, err
    ref, cut = _trajs(tmp_path / "ref"), _trajs(run)
    assert ref == cut  # same trajectories, same rewards, nothing lost or duplicated
    assert _es_hashes(tmp_path / "ref") == _es_hashes(run)  # bit-identical weights after every generation


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_sigterm_stops_inside_a_step_and_the_resumed_run_matches(tmp_path):
    cfg = _toy(tmp_path, rounds=3, samples=8, sleep=0.15)
    rc, _, err = _finish(_spawn(str(cfg), "--out", str(tmp_path / "ref"), "--no-progress"))
    assert rc == 0, err

    run = tmp_path / "cut"
    proc = _spawn(str(cfg), "--out", str(run), "--progress-interval", "0.2")
    _wait_for(run / "store.sqlite", "cut", 10, proc)  # round 1, mid-step (8 samples per step)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc, _out, err = _finish(proc, 60)
    assert time.monotonic() - sent < 5  # stopped at the next sample boundary, not at the end of the run
    assert rc == 143, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("coevo run: interrupted by SIGTERM during round 1, step a (dropped; it re-runs on resume)")
    assert last.endswith(f"resume with: coevo run --resume {run}")
    assert all(STAMP.match(line) for line in err.strip().splitlines()[:-1])  # only progress lines before it
    n_cut = _count(run / "store.sqlite", "cut")
    assert 10 <= n_cut < 16  # the step was cut between samples

    rc, _, err = _finish(_spawn("--resume", str(run), "--no-progress"))
    assert rc == 0, err
    assert _trajs(tmp_path / "ref") == _trajs(run)
    ref_total, cut_total = (yaml.safe_load((d / "summary.json").read_text()) for d in (tmp_path / "ref", run))
    assert ref_total["samples"] == cut_total["samples"] == 24


def test_a_second_sigint_aborts_a_long_sample_at_once(tmp_path):
    cfg = _toy(tmp_path, rounds=2, samples=2, sleep=60)  # one "sample" takes a minute
    run = tmp_path / "run"
    proc = _spawn(str(cfg), "--out", str(run), "--quiet")
    deadline = time.time() + 120
    while not (run / "run.log").exists() or "session start" not in (run / "run.log").read_text():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    time.sleep(1.0)  # inside the first sample's sleep
    proc.send_signal(signal.SIGINT)  # asks to stop at the next sample boundary (a minute away)
    time.sleep(0.5)
    assert proc.poll() is None
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)  # aborts now
    rc, _, err = _finish(proc, 60)
    assert time.monotonic() - sent < 10
    assert rc == 130 and len(err.strip().splitlines()) == 1, err
    assert "second signal: step aborted" in err and "no checkpoint yet" in err


# ------------------------------------------------------------------------------------- one owner
@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_two_resumes_started_together_one_wins_and_nothing_is_duplicated(tmp_path):
    cfg = _toy(tmp_path, rounds=8, samples=3, sleep=0.5)  # 12 s: time for a second process to start
    ref = _spawn(str(cfg), "--out", str(tmp_path / "ref"), "--no-progress")
    run = tmp_path / "run"
    first = _spawn(str(cfg), "--out", str(run), "--no-progress")
    _wait_for(run / "store.sqlite", "run", 2, first)
    # while it runs, a resume is refused with the holder's PID
    rc, _, err = _finish(_spawn("--resume", str(run), "--no-progress"), 120)
    assert rc == 2 and err.strip() == (
        f"coevo run: error: {run} is in use by process {first.pid} (lock "
        f"{run / 'run.lock'}); wait for it to finish or stop it, then resume"
    )
    first.send_signal(signal.SIGKILL)  # the OS drops the lock with the process
    first.wait(30)

    assert _finish(ref)[0] == 0
    a, b = _spawn("--resume", str(run), "--no-progress"), _spawn("--resume", str(run), "--no-progress")
    (rc_a, _, err_a), (rc_b, _, err_b) = _finish(a), _finish(b)
    assert sorted([rc_a, rc_b]) == [0, 2], (err_a, err_b)
    winner, loser_err = (a, err_b) if rc_a == 0 else (b, err_a)
    assert "Traceback" not in loser_err and len(loser_err.strip().splitlines()) == 1
    assert f"is in use by process {winner.pid}" in loser_err
    assert _trajs(tmp_path / "ref") == _trajs(run)


def test_two_new_runs_into_one_folder_one_wins(tmp_path):
    cfg = _toy(tmp_path, rounds=3, samples=2, sleep=0.05)
    run = tmp_path / "run"
    procs = [_spawn(str(cfg), "--out", str(run), "--no-progress") for _ in range(2)]
    results = [_finish(p) for p in procs]
    assert sorted(r[0] for r in results) == [0, 2], results
    loser = next(r for r in results if r[0] == 2)[2]
    assert "is in use by process" in loser or "already holds a run" in loser
    assert len(_trajs(run)) == 6


# ------------------------------------------------------------------------------------- budgets, progress
@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_wall_budget_cuts_a_step_between_samples_and_the_run_resumes_cleanly(tmp_path):
    cfg = _toy(tmp_path, rounds=2, samples=20, sleep=0.1, wall=1.0)
    run = tmp_path / "run"
    started = time.monotonic()
    rc, _out, err = _finish(_spawn(str(cfg), "--out", str(run), "--no-progress"))
    assert rc == 0, err
    assert "wall-clock budget reached" in err and "inside round 0, step a" in err
    summary = yaml.safe_load((run / "summary.json").read_text())
    assert 5 <= summary["samples"] < 20  # cut inside the first step: ~1 s of 0.1 s samples
    with TrajectoryStore(run / "store.sqlite", readonly=True) as s:
        first, last = (t.started_at for t in (s.query(run_id="run")[0], s.query(run_id="run")[-1]))
    assert last - first < 1.0 + 0.5  # no sample started after the budget ran out (+ one sample, slack)
    assert time.monotonic() - started < 60

    data = yaml.safe_load((run / "config.yaml").read_text())  # the user raises the budget and resumes
    del data["budget"]["max_wall_s"]
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    rc, _, err = _finish(_spawn("--resume", str(run), "--no-progress"))
    assert rc == 0, err
    ref = tmp_path / "ref"
    ref_cfg = _toy(tmp_path, rounds=2, samples=20, name="ref.yaml")
    assert _finish(_spawn(str(ref_cfg), "--out", str(ref), "--no-progress"))[0] == 0
    assert _trajs(ref) == _trajs(run)


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_progress_lines_without_a_terminal_quiet_and_log_files(tmp_path):
    cfg = _toy(tmp_path, rounds=2, samples=10, sleep=0.2)  # steps of 2 s
    run = tmp_path / "run"
    extra = tmp_path / "extra.log"
    started = time.monotonic()
    rc, out, err = _finish(_spawn(str(cfg), "--out", str(run), "--progress-interval", "0.5", "--log-file", str(extra)))
    took = time.monotonic() - started
    assert rc == 0, err
    assert out.splitlines() == [f"run folder: {run}", f"report: {run / 'report.md'}"]
    lines = err.strip().splitlines()
    assert all(STAMP.match(line) for line in lines), err
    progress = [line for line in lines if "this step:" in line]
    assert 4 <= len(progress) <= took / 0.5 + 3  # bounded rate
    counts = [int(m.group(1)) for line in progress if (m := re.search(r"this step: \d+ samples, (\d+) traj", line))]
    assert len(set(counts)) >= 3  # moved inside steps, not once per step
    assert lines[-1].endswith("stopped: round budget reached (2 rounds)")
    log = (run / "run.log").read_text()
    assert (
        "session start" in log and "this step:" in log and "round 1 a: 10 samples, 10 trajectories, best reward" in log
    )
    assert "StepReport(" not in log and "; metrics: total=" in log  # words, not a Python repr
    assert extra.read_text() == log

    rc, out, err = _finish(_spawn(str(cfg), "--out", str(tmp_path / "quiet"), "--quiet"))
    assert rc == 0 and err == "" and out.splitlines()[0] == f"run folder: {tmp_path / 'quiet'}"
    assert "this step:" in (tmp_path / "quiet" / "run.log").read_text()


# ------------------------------------------------------------------------------------- damaged folders
@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_a_damaged_latest_falls_back_to_the_newest_intact_checkpoint(tmp_path):
    cfg = _toy(tmp_path, rounds=6, samples=3)
    rc, _, _ = _finish(_spawn(str(cfg), "--out", str(tmp_path / "ref"), "--no-progress"))
    assert rc == 0
    cfg3 = _toy(tmp_path, rounds=3, samples=3, name="three.yaml")
    run = tmp_path / "run"
    assert _finish(_spawn(str(cfg3), "--out", str(run), "--no-progress"))[0] == 0
    data = yaml.safe_load((run / "config.yaml").read_text())
    data["budget"]["max_rounds"] = 6
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    latest = run / "checkpoints" / "LATEST"
    assert latest.read_text() == "000003"
    latest.write_text("\x00\x17garbage")
    rc, _, err = _finish(_spawn("--resume", str(run)))
    assert rc == 0, err
    assert (
        f"{latest} is damaged (holds '\\x00\\x17garbage', not a checkpoint number): resuming from the newest "
        f"intact checkpoint {run / 'checkpoints' / '000003'}" in err
    )
    assert "Traceback" not in err
    assert _trajs(tmp_path / "ref") == _trajs(run)

    # LATEST names a folder that is gone and the one before is half-written: back to the oldest intact one
    ck = run / "checkpoints"
    seqs = sorted(p.name for p in ck.iterdir() if p.name.isdigit())
    assert seqs == ["000005", "000006"]
    (ck / "000006" / "state.json").write_text("{trunc")
    rc, _, err = _finish(_spawn("--resume", str(run)))
    assert (
        rc == 0
        and f"{ck / 'LATEST'} names 000006, which is incomplete: resuming from the newest intact "
        f"checkpoint {ck / '000005'}"
        in err
    ), err
    assert _trajs(tmp_path / "ref") == _trajs(run)


def test_run_on_a_folder_and_on_a_damaged_store_say_so(tmp_path, capsys):
    from coevo.cli import main

    assert main(["run", str(ROOT / "configs")]) == 2
    err = capsys.readouterr().err
    assert f"{ROOT / 'configs'} is a folder, not a run config file" in err and "es/tiny.yaml" in err
    run = tmp_path / "run"
    assert main(["run", str(_toy(tmp_path)), "--out", str(run), "--quiet"]) == 0
    (run / "store.sqlite").write_bytes(b"this is not sqlite" * 100)
    for sidecar in ("store.sqlite-wal", "store.sqlite-shm"):
        (run / sidecar).unlink(missing_ok=True)
    capsys.readouterr()
    assert main(["run", "--resume", str(run)]) == 2
    assert "is not a readable trajectory store" in capsys.readouterr().err
    assert main(["runs", "export", str(run), str(tmp_path / "x.jsonl")]) == 2
    assert "is not a readable trajectory store" in capsys.readouterr().err

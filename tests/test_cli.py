"""The coevo CLI on bad input: clear errors, no tracebacks, nothing overwritten."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from coevo.cli import main

TESTS = Path(__file__).parent


def _cfg(tmp_path: Path) -> Path:
    data = {
        "run": {"name": "c", "seed": 1},
        "budget": {"max_rounds": 2},
        "evolvers": [{"name": "a", "type": "toy_evolvers:Counter", "samples_per_step": 2}],
    }
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_run_refuses_a_non_empty_folder_that_is_not_a_run(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my notes")
    assert main(["run", str(_cfg(tmp_path)), "--out", str(out), "--no-progress"]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert (out / "report.md").read_text() == "my notes"


def test_export_refuses_links_and_missing_folders_and_runs_show_survives_a_rename(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["run", str(_cfg(tmp_path)), "--out", str(run), "--no-progress"]) == 0
    target = tmp_path / "target.txt"
    target.write_text("keep")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    assert main(["runs", "export", str(run), str(link)]) == 2
    assert target.read_text() == "keep" and link.is_symlink()
    assert main(["runs", "export", str(run), str(tmp_path / "no" / "x.jsonl")]) == 2
    assert not (tmp_path / "no").exists()
    assert main(["runs", "export", str(tmp_path / "nothing"), str(tmp_path / "x.jsonl")]) == 2
    assert main(["runs", "export", str(run), str(tmp_path / "ok.jsonl")]) == 0
    assert len((tmp_path / "ok.jsonl").read_text().splitlines()) == 4
    # an existing file is never replaced silently (a new user once exported onto the run's own store.sqlite)
    store = (run / "store.sqlite").read_bytes()
    for own in ("store.sqlite", "config.yaml"):
        capsys.readouterr()
        assert main(["runs", "export", str(run), str(run / own), "--force"]) == 2
        assert "is a file of the run" in capsys.readouterr().err
    assert (run / "store.sqlite").read_bytes() == store
    assert main(["runs", "export", str(run), str(tmp_path / "ok.jsonl")]) == 2
    assert "--force to overwrite" in capsys.readouterr().err
    assert main(["runs", "export", str(run), str(tmp_path / "ok.jsonl"), "--force"]) == 0
    moved = tmp_path / "renamed"
    shutil.move(run, moved)
    capsys.readouterr()
    assert main(["runs", "show", str(moved), "--report"]) == 0
    assert "| a | context | 4 |" in capsys.readouterr().out  # tables found under the stored run id


def test_bad_model_references_fail_before_a_run_folder_exists(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    for name in ("nonexistent-model-xyz", "tiny:gigantic", 'tiny:{"hidden_size": -4}', "tiny:{bad"):
        out = tmp_path / "r"
        assert main(["run", str(cfg), "--set", f"model.name={name}", "--out", str(out)]) == 2
        assert "model" in capsys.readouterr().err
        assert not out.exists()
    assert main(["model", "prepare", "nonexistent"]) == 2
    assert "unknown model name" in capsys.readouterr().err


def test_user_errors_print_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    for args in (["run", str(bad)], ["runs", "show", str(tmp_path)], ["model", "prepare", "nope"]):
        proc = subprocess.run(
            [sys.executable, "-m", "coevo.cli", *args], capture_output=True, text=True, env=env, check=False
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stderr.strip()


def test_a_plugins_exception_is_one_line_naming_it_and_v_shows_the_traceback(tmp_path):
    """An exception raised in a plug-in evolver's step is the plug-in's bug, not coevo's: one line naming the
    evolver, the class, its file and the method, exit 2; ``-v`` adds the traceback. The run folder stays consistent
    (the step before is checkpointed, the lock is free, a second run of the same folder says the same)."""
    data = {
        "run": {"name": "b"},
        "budget": {"max_rounds": 3},
        "evolvers": [{"name": "bug", "type": "toy_evolvers:Buggy", "fail_at_round": 1}],
    }
    cfg = tmp_path / "bug.yaml"
    cfg.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": str(TESTS)}

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "coevo.cli", *extra, "run", str(cfg), "--out", str(tmp_path / "r"), "--quiet"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=300,
        )

    proc = run()
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert "evolvers.bug" in lines[0] and "toy_evolvers:Buggy" in lines[0] and "step()" in lines[0]
    assert "ValueError: internal inconsistency in Buggy.step" in lines[0]
    # the run folder stayed consistent: the step before the bug is checkpointed and the lock is free
    assert (tmp_path / "r" / "checkpoints" / "LATEST").read_text() == "000001"


def test_es_on_an_api_backend_is_refused_before_any_request(tmp_path, capsys):
    import http.server
    import threading

    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            hits.append(self.path)
            self.send_response(500)
            self.end_headers()

        do_GET = do_POST

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        data = {
            "run": {"name": "x"},
            "budget": {"max_rounds": 2},
            "model": {"name": "m", "backend": "openai", "base_url": f"http://127.0.0.1:{server.server_port}/v1"},
            "evolvers": [{"name": "es", "type": "es", "population_size": 2}],
        }
        cfg = tmp_path / "x.yaml"
        cfg.write_text(yaml.safe_dump(data))
        out = tmp_path / "run"
        assert main(["run", str(cfg), "--out", str(out)]) == 2
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert "evolvers.es.type / model.backend" in err and "'openai' has none" in err
    assert hits == [] and not out.exists()

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
        proc = subprocess.run([sys.executable, "-m", "coevo.cli", *args], capture_output=True, text=True, env=env, check=False)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stderr.strip()

"""The second worked example of docs/extending.md (coevo/examples/prompt_evolver.py): a context evolver that evolves the
ES rollout's system prompt, on the tiny random Qwen2. Run via the Python API, ``coevo run`` (killed with a real
SIGKILL and resumed), an entry point, and ``workers: 2``; every variant must give the same run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from coevo.config import load_config
from coevo.loop import CoEvolutionLoop
from coevo.store import SchemaError, TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "examples" / "prompt_es_tiny.yaml"
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def _api_run(run_dir: Path, overrides: list[str] | None = None) -> Path:
    cfg, raw = load_config(CONFIG, overrides)
    CoEvolutionLoop(cfg, run_dir, raw_config=raw, progress=False).run()
    return run_dir


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> Path:
    return _api_run(tmp_path_factory.mktemp("prompt") / "ref")


def _snapshot(run_dir: Path) -> dict:
    """What must be identical between two runs of the config: every trajectory (key without the run id,
    reward, context versions, text), the ES history (weight hashes) and the published prompts."""
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        run_id = s.run_identity(run_dir.name)
        trajs = {
            t.key.split("/", 1)[1]: (
                t.reward,
                t.context.versions,
                t.context.prompt,
                [st.model_output for st in t.steps],
            )
            for t in s.query(run_id=run_id)
        }
        history = [(r["generation"], r["weight_hash_after"], r["rewards"]) for r in s.es_history(run_id, "es")]
        published = [(a.version, a.content["value"]) for a in s.list_artifacts(kind="context", run_id=run_id)]
        samples = s.count_llm_calls(run_id)
    return {"trajectories": trajs, "history": history, "published": published, "samples": samples}


def test_the_api_run_publishes_prompts_that_later_generations_run_under(ref):
    snap = _snapshot(ref)
    assert len(snap["history"]) == 3 and snap["published"], "the example must publish at least one prompt"
    with TrajectoryStore(ref / "store.sqlite", readonly=True) as s:
        members = s.query(run_id="ref", evolver="es", member=True)
        versions = sorted({(t.generation, t.context.versions["system_prompt"]) for t in members})
        first = min(g for g, v in versions if v > 0)
        assert all(v == 0 for g, v in versions if g < first)  # nothing published before the first prompter step
        published = {a.version: a.content["value"] for a in s.list_artifacts(kind="context", name="system_prompt")}
        assert all(
            t.context.prompt == published[t.context.versions["system_prompt"]]
            for t in members
            if t.context.versions["system_prompt"]
        )
        # the prompter's scoring rollouts are its own (context space), on train cases, under the centre
        scored = s.query(run_id="ref", evolver="prompter", split="train")
        assert scored and all(t.space == "context" and t.member is None for t in scored)
        assert {t.context.versions["system_prompt"] for t in scored} >= {-1}  # candidates, not published
        # the held-out leak: the centre's test evaluation shares generation 3 with nothing but is never pooled
        held = s.query(run_id="ref", evolver="es", split="test")
        assert held and all(t.member is None for t in held)
    assert "prompter" in (ref / "report.md").read_text()


def _spawn(args: list[str], env=ENV) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "coevo.cli", "run", "--no-progress", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _replay_check(run_dir: Path) -> None:
    """``coevo es replay RUN_DIR --check`` (a fresh process) replays the run's ES history hash-exactly."""
    check = subprocess.run(
        [sys.executable, "-m", "coevo.cli", "es", "replay", str(run_dir), "--check"],
        env=ENV,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_coevo_run_killed_with_sigkill_resumes_bit_identically(ref, tmp_path):
    run_dir = tmp_path / "killed"
    proc = _spawn([str(CONFIG), "--out", str(run_dir)])
    db = run_dir / "store.sqlite"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:  # kill in the middle: after ES generation 1 began
        try:
            if db.exists():
                with TrajectoryStore(db, readonly=True) as s:
                    if s.count(run_id="killed", evolver="es", generation=1) >= 2:
                        break
        except (SchemaError, OSError):
            pass
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    resumed = _spawn(["--resume", str(run_dir)])
    out = resumed.communicate(timeout=900)[0].decode()
    assert resumed.returncode == 0, out
    assert "resumed" in out
    assert _snapshot(run_dir) == _snapshot(ref)
    _replay_check(run_dir)


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_a_copied_run_folder_keeps_its_run_id(ref, tmp_path):
    copy = tmp_path / "copy-of-ref"
    shutil.copytree(ref, copy, ignore=shutil.ignore_patterns("run.lock"))
    proc = _spawn(["--resume", str(copy)])
    out = proc.communicate(timeout=600)[0].decode()
    assert proc.returncode == 0, out
    with TrajectoryStore(copy / "store.sqlite", readonly=True) as s:
        assert s.run_ids() == ["ref"] and s.run_identity("copy-of-ref") == "ref"
    _replay_check(copy)


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_workers_2_send_the_published_prompt_to_the_ray_actors(ref, tmp_path):
    pytest.importorskip("ray")
    run_dir = _api_run(tmp_path / "ray", ["evolvers.es.workers=2"])
    a, b = _snapshot(ref), _snapshot(run_dir)
    assert b == a  # the same trajectories, prompts and weights as in-process
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        members = s.query(run_id="ray", evolver="es", member=True)
        assert len({t.meta["worker_pid"] for t in members}) == 2 and os.getpid() not in {
            t.meta["worker_pid"] for t in members
        }
        assert max(t.context.versions["system_prompt"] for t in members) >= 1  # actors ran under a published one


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_an_entry_point_names_the_example(tmp_path):
    """A package that declares ``[project.entry-points."coevo.evolvers"] prompt-evolver = ...`` (an installed
    distribution's metadata on sys.path): the config names the type without plugins or --import."""
    dist = tmp_path / "site" / "my_prompt_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-prompt-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[coevo.evolvers]\nprompt-evolver = coevo.examples.prompt_evolver:PromptEvolver\n"
    )
    data = yaml.safe_load(CONFIG.read_text())
    data.pop("plugins")
    data["budget"]["max_rounds"] = 2
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    env = {**ENV, "PYTHONPATH": f"{ENV['PYTHONPATH']}{os.pathsep}{tmp_path / 'site'}"}
    proc = _spawn([str(cfg_path), "--out", str(tmp_path / "ep")], env)
    out = proc.communicate(timeout=900)[0].decode()
    assert proc.returncode == 0, out
    with TrajectoryStore(tmp_path / "ep" / "store.sqlite", readonly=True) as s:
        assert s.count(run_id="ep", evolver="prompter") > 0
    no_ep = subprocess.run(
        [sys.executable, "-m", "coevo.cli", "run", "--check", str(cfg_path)],
        env=ENV,
        check=False,
        capture_output=True,
        text=True,
    )
    assert no_ep.returncode == 2 and "unknown evolver type 'prompt-evolver'" in no_ep.stderr
    with_import = subprocess.run(
        [
            sys.executable,
            "-m",
            "coevo.cli",
            "run",
            "--check",
            str(cfg_path),
            "--import",
            "coevo.examples.prompt_evolver",
        ],
        env=ENV,
        check=False,
        capture_output=True,
        text=True,
    )
    assert with_import.returncode == 0, with_import.stderr

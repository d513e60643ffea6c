"""User plug-ins (``plugins:``): the run folder records where each module came from, so ``coevo run --resume`` and
``coevo es replay --check`` find it from any folder (real ``coevo`` subprocesses in another working folder); when
they cannot, one error line names the module, its file and the fix. A plug-in that raises in its constructor,
returns a malformed step report or breaks ``state_dict`` stops the run with one line naming the plug-in and the
method, and the run's store and last checkpoint are left intact."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import run_cli

from coevo.config import parse_config
from coevo.errors import PluginError
from coevo.evolvers.base import EVOLVERS
from coevo.lock import RunLock
from coevo.loop import CoEvolutionLoop
from coevo.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]

#: a user's module: a toy climber (the docs' first example, shortened) and three broken variants of it
PLUGIN = '''
from coevo.evolvers import Evolver, EvolverConfig, StepReport, register_evolver
from coevo.types import Trajectory


class Config(EvolverConfig):
    target: float = 3.0
    break_at: int = 1  # the step (0-based) at which a broken variant breaks


@register_evolver("toy-climb")
class ToyClimb(Evolver):
    """One candidate per step, x moves to it when it is closer to the target."""

    space = "context"
    Config = Config

    def __init__(self, name, config, ctx):
        super().__init__(name, config, ctx)
        self.x, self.steps = 0.0, 0

    def step(self, round_index):
        cand = self.x + self.ctx.rng(self.name, round_index).gauss(0.0, 1.0)
        key = self.ctx.traj_key(self.name, round_index)
        reward = -((cand - self.config.target) ** 2)
        t = self.ctx.cached(key) or self.ctx.record(
            Trajectory(key=key, run_id=self.ctx.run_id, evolver=self.name, space="context", round=round_index,
                       reward=reward, llm_calls=1)
        )
        if t.reward > -((self.x - self.config.target) ** 2):
            self.x = cand
        self.steps += 1
        return StepReport(samples=1, trajectories=1, best_reward=t.reward)

    def state_dict(self):
        return {"x": self.x, "steps": self.steps}

    def load_state_dict(self, state):
        self.x, self.steps = state["x"], state["steps"]


@register_evolver("raises-in-init")
class RaisesInInit(ToyClimb):
    def __init__(self, name, config, ctx):
        super().__init__(name, config, ctx)
        raise KeyError("no such setting: 'alpha'")


@register_evolver("bad-report")
class BadReport(ToyClimb):
    def step(self, round_index):
        report = super().step(round_index)
        return {"samples": 1} if self.steps > self.config.break_at else report


@register_evolver("bad-state")
class BadState(ToyClimb):
    def state_dict(self):
        return {**super().state_dict(), "rng": object()} if self.steps > self.config.break_at else super().state_dict()
'''

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A folder holding ``myplug.py`` (:data:`PLUGIN`), the current folder for the test; the module and its
    registrations are removed after."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "myplug.py").write_text(PLUGIN)
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield folder
    sys.modules.pop("myplug", None)
    for name in ("toy-climb", "raises-in-init", "bad-report", "bad-state"):
        EVOLVERS.remove(name)


def _config(evolver_type: str, rounds: int = 3) -> dict:
    return {
        "plugins": ["myplug"],
        "run": {"name": "plug", "seed": 0},
        "budget": {"max_rounds": rounds},
        "report": {"plots": False},
        "evolvers": [{"name": "mine", "type": evolver_type}],
    }


def _store_intact(run_dir: Path) -> list[str]:
    """The keys of the run's trajectories, after checking the SQLite file's integrity."""
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        return [t.key for t in s.query(run_id="run", order_by="id")]


@pytest.mark.parametrize(
    ("evolver_type", "method", "detail", "keys", "checkpoint"),
    [
        ("raises-in-init", "__init__", "raised KeyError: \"no such setting: 'alpha'\"", [], None),
        ("bad-report", "step", "returned dict, not a StepReport", ["run/mine/0", "run/mine/1"], "000001"),
        ("bad-state", "state_dict", "returned a state that is not JSON", ["run/mine/0", "run/mine/1"], "000001"),
    ],
)
def test_a_broken_plugin_stops_the_run_with_one_line_and_leaves_the_store(
    plugin_dir, tmp_path, evolver_type, method, detail, keys, checkpoint
):
    data = _config(evolver_type)
    run_dir = tmp_path / "run"
    with pytest.raises(PluginError) as err:
        CoEvolutionLoop(parse_config(data), run_dir, raw_config=data, progress=False).run()
    msg = str(err.value)
    assert "\n" not in msg
    cls = {"raises-in-init": "RaisesInInit", "bad-report": "BadReport", "bad-state": "BadState"}[evolver_type]
    assert msg.startswith(f"evolvers.mine: plugin myplug:{cls} ({plugin_dir / 'myplug.py'}): {method}() {detail}")
    assert _store_intact(run_dir) == keys  # what the steps recorded is kept
    latest = run_dir / "checkpoints" / "LATEST"
    assert (latest.read_text().strip() if latest.exists() else None) == checkpoint  # no half-written checkpoint
    RunLock(run_dir).acquire().release()  # the run folder is free again (a held lock raises)


def test_a_broken_plugin_is_one_line_from_the_command(plugin_dir, tmp_path):
    (plugin_dir / "bad.yaml").write_text(yaml.safe_dump(_config("bad-report")))
    out = run_cli(
        "run", "bad.yaml", "--out", str(tmp_path / "run"), "--no-progress", cwd=plugin_dir, env=ENV, timeout=300
    )
    assert out.returncode == 2, out.stderr
    (line,) = [x for x in out.stderr.splitlines() if "error" in x]
    assert line.startswith("coevo run: error: evolvers.mine: plugin myplug:BadReport (")
    assert "step() returned dict, not a StepReport (run with -v for the traceback)" in line


def _coevo(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd, env=ENV)


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.slow
def test_resume_and_replay_find_the_plugin_from_another_folder(plugin_dir, tmp_path):
    """A run with ES (tiny model) and the plug-in, made in the plug-in's folder, resumed, checked and replayed from
    another one (the plug-in's folder is not on PYTHONPATH); with the file gone, one line names it and the fix."""
    config = _config("toy-climb", rounds=2)
    config.update(
        model={"name": "tiny:micro", "backend": "hf", "dtype": "float32"},
        sampling={"max_new_tokens": 4},
    )
    config["evolvers"].append(
        {
            "name": "es",
            "type": "es",
            "population_size": 2,
            "total_generations": 2,
            "eval_every": 0,
            "scope": "full",
            "rollout": {"type": "target_logprob", "target": "hi"},
        }
    )
    (plugin_dir / "run.yaml").write_text(yaml.safe_dump(config))
    run_dir, elsewhere = tmp_path / "runs" / "r1", tmp_path / "elsewhere"
    elsewhere.mkdir()
    made = _coevo(["run", "run.yaml", "--out", str(run_dir), "--no-progress"], plugin_dir)
    assert made.returncode == 0, made.stderr
    origins = json.loads((run_dir / "plugins.json").read_text())
    assert origins["myplug"] == {"file": str(plugin_dir / "myplug.py"), "root": str(plugin_dir)}
    for args in (["run", "--check", "--resume", str(run_dir)], ["es", "replay", str(run_dir), "--check"]):
        out = _coevo(args, elsewhere)
        assert out.returncode == 0, (args, out.stderr)
    # raise the round budget and continue the run from the other folder
    cfg_path = run_dir / "config.yaml"
    cfg_path.write_text(cfg_path.read_text().replace("max_rounds: 2", "max_rounds: 3"))
    resumed = _coevo(["run", "--resume", str(run_dir), "--no-progress"], elsewhere)
    assert resumed.returncode == 0, resumed.stderr
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        assert [t.key for t in s.query(run_id="r1", evolver="mine", order_by="id")] == [
            f"r1/mine/{r}" for r in range(3)
        ]
    (plugin_dir / "myplug.py").rename(plugin_dir / "moved.py")
    gone = _coevo(["es", "replay", str(run_dir), "--check"], elsewhere)
    assert gone.returncode == 2
    # the config error's head names the run's config.yaml; its one line for the plug-in names the file and the fix
    head, line = gone.stderr.strip().splitlines()
    assert head == f"coevo es replay: error: invalid run config {run_dir / 'config.yaml'}:"
    assert line.strip().startswith("plugins.0: cannot import 'myplug' (No module named 'myplug'); the run loaded it")
    assert str(plugin_dir / "myplug.py") in line
    assert "no longer exists" in line and "PYTHONPATH" in line


def test_a_plugin_that_cannot_be_imported_names_the_fix(tmp_path, monkeypatch):
    from coevo.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    data = _config("toy-climb")
    data["plugins"] = ["no_such_plugin_xyz"]
    with pytest.raises(ConfigError, match=r"plugins\.0: cannot import 'no_such_plugin_xyz' .*set PYTHONPATH=<that"):
        parse_config(data)
    data = {**_config("no_such_plugin_xyz:Climb"), "plugins": []}
    recorded = {"no_such_plugin_xyz": {"file": str(tmp_path / "gone" / "no_such_plugin_xyz.py"), "root": "x"}}
    with pytest.raises(ConfigError, match=r"evolvers\.mine\.type: .*the run loaded it from .*gone/no_such_plugin_xyz"):
        parse_config(data, origins=recorded)


def test_a_module_class_type_is_found_in_the_current_folder(plugin_dir):
    """`type: myplug:ToyClimb` with myplug.py in the current folder and no `plugins:` key: the error said 'run
    from the folder that holds myplug.py', from that very folder (a new user's pass); `plugins:` and `--import`
    found it. Now the type is found there as well."""
    sys.modules.pop("myplug", None)
    EVOLVERS.remove("toy-climb")  # the module registers it again on import
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
    data = _config("myplug:ToyClimb")
    del data["plugins"]
    cfg = parse_config(data)
    assert type(cfg.evolvers[0].params).__module__ == "myplug"

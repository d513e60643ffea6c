"""The edges a new user meets on the command line (issue 29 item 4), each through the real CLI (``coevo.cli.main``
or a ``python -m coevo.cli`` process) on real run folders (SQLite store, lock file) made by toy runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coevo.cli import main
from coevo.errors import EXIT_CHECK_FAILED, RunFolderError
from coevo.lock import RunLock

TESTS = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _toy(tmp_path: Path, rounds: int = 2, **counter) -> Path:
    data = {
        "run": {"name": "t", "seed": 1},
        "budget": {"max_rounds": rounds},
        "report": {"plots": False},
        "evolvers": [{"name": "a", "type": "toy_evolvers:Counter", "samples_per_step": 2, **counter}],
    }
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def toy_run(tmp_path) -> Path:
    run = tmp_path / "run"
    assert main(["run", str(_toy(tmp_path)), "--out", str(run), "--quiet"]) == 0
    return run


def _one_error_line(err: str, prog: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


def test_verbose_is_accepted_after_the_sub_command(tmp_path, capsys):
    cfg = _toy(tmp_path)
    assert main(["run", "-v", "--check", str(cfg)]) == 0
    assert main(["run", "--check", str(cfg), "--verbose"]) == 0
    assert main(["-v", "run", "--check", str(cfg)]) == 0
    with pytest.raises(RunFolderError):  # -v shows the traceback of a user error: it is raised
        main(["runs", "show", str(tmp_path / "nowhere"), "-v"])
    proc = subprocess.run(
        [sys.executable, "-m", "coevo.cli", "runs", "show", str(tmp_path / "nowhere"), "-v"],
        capture_output=True,
        text=True,
        env=ENV,
        check=False,
    )
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "RunFolderError" in proc.stderr


def test_a_bad_set_value_names_the_set_item_not_the_file(tmp_path, capsys):
    cfg = _toy(tmp_path)
    assert main(["run", "--check", str(cfg), "--set", "budget.max_rounds=abc"]) == 2
    err = capsys.readouterr().err
    assert f"coevo run: error: invalid --set value for run config {cfg}:" in err
    assert "budget.max_rounds: Input should be a valid integer" in err and "(from --set budget.max_rounds=abc)" in err
    # an error of the file itself is still the file's, beside a --set one
    bad = tmp_path / "bad.yaml"
    bad.write_text(cfg.read_text().replace("max_rounds: 2", "max_rounds: 0"))
    assert main(["run", "--check", str(bad), "--set", "evolvers.0.samples_per_step=-"]) == 2
    err = capsys.readouterr().err
    assert f"invalid run config {bad}:" in err and "budget.max_rounds: Input should be greater" in err
    assert "(from --set evolvers.0.samples_per_step=-)" in err  # index named by the evolver: evolvers.a....
    assert main(["run", "--check", str(cfg), "--set", "run.seed=[1, 2"]) == 2
    line = _one_error_line(capsys.readouterr().err, "coevo run")
    assert "--set 'run.seed=[1, 2': the value is not valid YAML" in line


def test_unknown_keys_get_a_did_you_mean(tmp_path, capsys):
    cfg = _toy(tmp_path)
    for item, expected in (
        ("budget.max_round=3", "budget.max_round: unknown field (did you mean 'max_rounds'?)"),
        (
            "evolvers.a.samples_per_stpe=3",
            "evolvers.a.samples_per_stpe: unknown field (did you mean 'samples_per_step'?)",
        ),
        ("schedule=[{evolver: a, evry: 2}]", "schedule.0.evry: unknown field (did you mean 'every'?)"),
        ("budget.zzz=1", "budget.zzz: unknown field (the fields here: max_samples, max_rounds, max_wall_s)"),
    ):
        assert main(["run", "--check", str(cfg), "--set", item]) == 2
        assert expected in capsys.readouterr().err, item
    tiny = str(Path(__file__).resolve().parents[1] / "configs" / "es" / "tiny.yaml")
    assert main(["run", "--check", tiny, "--set", "evolvers.es.rollout.targt=hi"]) == 2  # a nested rollout spec
    assert "evolvers.es.rollout.targt: unknown field (did you mean 'target'?)" in capsys.readouterr().err
    typo = tmp_path / "typo.yaml"
    typo.write_text(cfg.read_text().replace("report:", "reprot:"))
    assert main(["run", "--check", str(typo)]) == 2
    assert "reprot: unknown field (did you mean 'report'?)" in capsys.readouterr().err


def test_a_missing_or_wrong_run_folder_is_named_as_such(tmp_path, toy_run, capsys):
    missing, a_file = tmp_path / "nowhere", tmp_path / "toy.yaml"
    cases = [
        (["runs", "show", str(missing)], "coevo runs show", f"{missing} does not exist"),
        (["runs", "show", str(a_file)], "coevo runs show", f"{a_file} is not a folder"),
        (["runs", "show", str(tmp_path)], "coevo runs show", f"{tmp_path} is not a run folder (no store.sqlite in it)"),
        (["runs", "export", str(missing), str(tmp_path / "x.jsonl")], "coevo runs export", "does not exist"),
        (["run", "--resume", str(missing)], "coevo run", f"{missing} does not exist"),
        (["run", "--check", "--resume", str(missing)], "coevo run", f"{missing} does not exist"),
        (["es", "replay", str(missing)], "coevo es replay", f"{missing} does not exist"),
        (["es", "replay", str(toy_run)], "coevo es replay", "the run config has no model"),
        (["es", "export", str(missing), str(tmp_path / "o")], "coevo es export", f"{missing} does not exist"),
        (["runs", "serve", str(missing), "--port", "0"], "coevo runs serve", f"{missing} does not exist"),
    ]
    for argv, prog, expected in cases:
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert expected in _one_error_line(err, prog) and out == "", argv
        assert "run with -v" not in err  # the message says it all


def test_a_second_resume_on_a_locked_run_refuses_before_naming_the_folder(toy_run, capsys):
    owner = RunLock(toy_run).acquire()  # a live owner (flock: another descriptor conflicts, in this process too)
    try:
        assert main(["run", "--resume", str(toy_run), "--quiet"]) == 2
    finally:
        owner.release()
    out, err = capsys.readouterr()
    assert out == "" and f"is in use by process {os.getpid()}" in _one_error_line(err, "coevo run")


def test_a_busy_port_says_so_and_how_to_pick_another(toy_run, capsys):
    pytest.importorskip("dash")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["runs", "serve", str(toy_run), "--port", str(port)]) == 2
    line = _one_error_line(capsys.readouterr().err, "coevo runs serve")
    assert f"cannot listen on 127.0.0.1:{port}: port {port} is in use by another program" in line
    assert "--port 0 picks a free one" in line


def test_an_invalid_heuristic_is_exit_3_not_1(tmp_path, capsys, private_cache):
    broken = tmp_path / "broken.py"
    broken.write_text(
        "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix)\n    return 0\n"
    )
    argv = ["heuristics", "eval", "tsp_construct", str(broken), "--size", "8", "--count", "2", "--no-reference"]
    assert main(argv) == EXIT_CHECK_FAILED == 3
    out = capsys.readouterr().out
    assert "invalid: 2 of 2" in out and "verdict: invalid heuristic (exit status 3)" in out
    assert main([*argv, "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["valid"] is False


def test_resuming_a_finished_run_keeps_its_stop_reason(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = _toy(tmp_path, rounds=4, stop_at_round=1)
    assert main(["run", str(cfg), "--out", str(run), "--quiet"]) == 0
    reason = json.loads((run / "summary.json").read_text())["stop_reason"]
    assert reason == "a stopped the run: the counter reached round 1"
    capsys.readouterr()
    # budgets raised or not, a resume that runs no step keeps the reason the run stopped for
    data = yaml.safe_load((run / "config.yaml").read_text())
    data["budget"]["max_rounds"] = 2
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    assert main(["run", "--resume", str(run)]) == 0
    err = capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["stop_reason"] == reason
    assert f"stopped: {reason}" in err and "no step ran now (round budget reached (2 rounds))" in err
    assert f"- stop reason: {reason}" in (run / "report.md").read_text()


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ("evolvers.hillclimb.train_size=1", "evolvers.hillclimb: train_size: tsp_construct instances have at least 3"),
        (
            "evolvers.hillclimb.test_sizes=[2]",
            "evolvers.hillclimb: test_sizes: tsp_construct instances have at least 3",
        ),
        (
            "evolvers.hillclimb.seed_heuristics=[nope]",
            "seed_heuristics: tsp_construct has no published heuristic 'nope'",
        ),
    ],
)
def test_what_only_the_problem_knows_is_checked_with_the_config(item, said, capsys):
    """A new user's sizes below the problem's smallest and an unknown published seed were tracebacks after
    `--check` said OK (the held-out size one at the end of the run); now `--check` and the run say one line."""
    cfg = str(Path(__file__).parents[1] / "configs" / "ahd" / "hillclimb" / "tsp_construct.yaml")
    for check in (["--check"], []):
        assert main(["run", *check, cfg, "--set", "model.name=tiny:micro", "--set", item]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err


def test_ray_workers_without_ray_installed_is_one_line(monkeypatch, capsys):
    """`workers: 2` (docs/extending's third way to run the prompt example) where Ray is not installed (the
    README's first command installs no Ray) was a ModuleNotFoundError traceback. Ray is installed in the test
    environment, so its absence is simulated: ``find_spec('ray')`` answers None, as it does without Ray."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    cfg = str(Path(__file__).parents[1] / "configs" / "examples" / "prompt_es_tiny.yaml")
    assert main(["run", "--check", cfg, "--set", "evolvers.es.workers=2"]) == 2
    line = _one_error_line(capsys.readouterr().err, "coevo run")
    assert "evolvers.es.workers: 2 Ray actors need Ray, which is not installed" in line, line


@pytest.mark.parametrize(
    ("config", "item", "said"),
    [
        (
            "vllm_ray_tiny.yaml",
            "evolvers.es.workers=64",
            "evolvers.es.workers: 64 vLLM-CPU engines x 1 core(s) need 64",
        ),
        (
            "vllm_ray_tiny.yaml",
            "evolvers.es.worker_num_cpus=1.5",
            "evolvers.es.worker_num_cpus: a vLLM-CPU engine needs",
        ),
        ("vllm_ray_gpu.yaml", "evolvers.es.workers=64", "evolvers.es.workers: 64 engines x 1 GPU need 64 GPUs, this"),
    ],
)
def test_a_placement_this_machine_cannot_give_is_one_line_at_check(config, item, said, monkeypatch, capsys):
    """More vLLM-CPU engines than cores, a fraction of a core, more GPUs than this machine has: refused by
    `coevo run --check` (coevo.placement.check_placement), before any engine or Ray starts."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = str(Path(__file__).parents[1] / "configs" / "es" / config)
    assert main(["run", "--check", cfg, "--set", item]) == 2
    line = _one_error_line(capsys.readouterr().err, "coevo run")
    assert said in line, line


@pytest.mark.parametrize("command", [["es", "replay"], ["es", "export"]])
def test_es_commands_on_a_damaged_store_say_one_line(command, tmp_path, capsys):
    """A run folder whose store.sqlite was cut short: `runs show` and `run --resume` said one line, `es replay`
    and `es export` printed sqlite3's traceback (a new user's report)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text((Path(__file__).parents[1] / "configs/examples/prompt_es_tiny.yaml").read_text())
    (run / "store.sqlite").write_bytes(b"SQLite format 3\x00" + b"\x07" * 5000)
    extra = [str(tmp_path / "out")] if command[1] == "export" else []
    assert main([*command, str(run), *extra]) == 2
    line = _one_error_line(capsys.readouterr().err, f"coevo {' '.join(command)}")
    assert "store.sqlite is not a readable trajectory store" in line, line


def test_a_section_check_naming_a_set_field_blames_the_set_item(capsys):
    """`--set evolvers.es.population_size=3` fails a check of the whole ES section ('evolvers.es: population_size
    must be even'); it blamed the file, though the --set item caused it (a new user's pass)."""
    cfg = str(Path(__file__).parents[1] / "configs" / "ahd" / "tsp_construct.yaml")
    assert main(["run", "--check", cfg, "--set", "evolvers.es.population_size=3"]) == 2
    err = capsys.readouterr().err
    assert f"invalid --set value for run config {cfg}:" in err, err
    assert "population_size must be even" in err and "(from --set evolvers.es.population_size=3)" in err, err
    # a section error that does not name the field set stays the file's
    assert main(["run", "--check", cfg, "--set", "evolvers.es.population_size=3", "--set", "run.seed=5"]) == 2
    assert "(from --set run.seed=5)" not in capsys.readouterr().err


def test_an_empty_folder_as_the_model_is_refused_by_check_before_any_run_folder(tmp_path, capsys):
    """A new user's empty folder as ``model.name`` passed `--check`; the run then made its folder and stopped
    with a tokenizer hint (install sentencepiece) that did not apply. Now `--check` and the run say one line
    naming the folder, and no run folder is left behind."""
    cfg = str(Path(__file__).parents[1] / "configs" / "ahd" / "hillclimb" / "tsp_construct.yaml")
    empty = tmp_path / "my-model"
    empty.mkdir()
    out = tmp_path / "run"
    for check in (["--check"], ["--out", str(out), "--no-progress"]):
        assert main(["run", *check, cfg, "--set", f"model.name={empty}"]) == 2
        err = capsys.readouterr().err
        assert f"model folder {empty} holds no model: no config.json" in err and "Traceback" not in err, err
    assert not out.exists()


def test_ctrl_c_while_the_commands_load_is_one_line_and_130(monkeypatch, capsys):
    """Ctrl-C in the first seconds (while the parser imports every command's module) printed a 50-line
    KeyboardInterrupt traceback to a new user; it is the same one line as Ctrl-C later."""
    from coevo import cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["runs", "show", "x"]) == 130
    assert capsys.readouterr().err == "coevo: interrupted\n"


def test_check_refuses_the_flags_the_run_refuses(tmp_path, capsys):
    """`--check` said "config OK" for `--progress-interval -3`, which the run then refused (a new user's find)."""
    cfg = str(Path(__file__).parents[1] / "configs" / "ahd" / "hillclimb" / "tsp_construct.yaml")
    cases = [
        (["--progress-interval", "-3"], "--progress-interval must be > 0 seconds"),
        (["--log-file", str(tmp_path)], "is a folder"),
    ]
    for flags, said in cases:
        for check in (["--check"], []):
            assert main(["run", *check, cfg, "--set", "model.name=tiny:micro", *flags]) == 2
            assert said in capsys.readouterr().err


def test_a_grpo_baseline_config_given_to_coevo_run_says_how_to_run_it(capsys):
    """`coevo run --check configs/longhorizon/sudoku_grpo_tiny.yaml` (a new user checking every shipped tiny
    config) listed missing and unknown fields; it is the GRPO baseline's config, and the line says how to run it."""
    cfg = str(Path(__file__).parents[1] / "configs" / "longhorizon" / "sudoku_grpo_tiny.yaml")
    assert main(["run", "--check", cfg]) == 2
    err = capsys.readouterr().err
    assert "not of `coevo run`; run it with: python -m coevo.rl.grpo" in err and len(err.strip().splitlines()) == 1

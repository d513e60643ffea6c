"""ESEvolver with ``perturbation: lowrank`` on a tiny random Qwen2: learning, history rows, replay / export CLI,
resume after kill -9 in the middle of a generation, and the Ray pool (actors apply the same update)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import Field
from test_es_evolver import es_config, history, run_loop

from coevo.cli import main as coevo_main
from coevo.config import ConfigError, parse_config
from coevo.es import ScopeSpec
from coevo.es.lowrank import LOWRANK_SPEC
from coevo.rollouts.logprob import LogProbConfig, TargetLogProbRollout
from coevo.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]


class KillConfig(LogProbConfig):
    type: str = "test_es_lowrank_evolver:KillingLogProbRollout"
    kill_at: int | None = Field(None, description="generation whose population rollout is killed (once)")
    marker: str = Field("", description="file written just before the kill (so the resumed run goes on)")
    hold: bool = Field(False, description="instead of SIGKILLing its own process, wait there for a kill from outside")


class KillingLogProbRollout(TargetLogProbRollout):
    """target_logprob whose population rollout is killed once, mid-generation: it SIGKILLs its own process
    (in-process ES), or, with ``hold`` (inside a Ray actor), writes the marker and waits for the test to SIGKILL
    the driver."""

    Config = KillConfig

    def run_population(self, population, members, **kw):
        cfg = self.config
        if cfg.kill_at == kw["generation"] and cfg.marker and not Path(cfg.marker).exists():
            population.logprob([(members[0], [{"role": "user", "content": "Say hello."}])], ["Hello"])  # hooks run
            Path(cfg.marker).write_text("killed")
            if cfg.hold:
                time.sleep(600)  # the actor dies with the driver's Ray cluster
            os.kill(os.getpid(), signal.SIGKILL)
        return super().run_population(population, members, **kw)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def lowrank_config(model_dir, **es):
    base = {
        "perturbation": "lowrank",
        "rank": 2,
        "scope": "all_linear",
        "population_size": 8,
        "sigma": 0.05,
        "sigma_final": 0.0,
        "alpha": 0.06,
        "total_generations": 8,
        "eval_every": 4,
        "checkpoint_every": 3,
    }
    return es_config(model_dir, **{**base, **es})


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lowrank") / "run"
    _, summary = run_loop(run_dir, lowrank_config(tiny_model_dir, dtype="bfloat16"))
    return run_dir, summary


def test_lowrank_es_raises_held_out_reward_and_records_kind_and_rank(trained):
    run_dir, _ = trained
    rows = history(run_dir)
    assert [r["generation"] for r in rows] == list(range(8))
    assert all(r["perturbation"] == "lowrank" and r["rank"] == 2 and r["noise_spec"] == LOWRANK_SPEC for r in rows)
    assert all(r["master_dtype"] is None for r in rows)  # lowrank default: no float32 masters, stochastic rounding
    assert all(r["update"]["changed_fraction"] > 0 for r in rows[:-1]) and rows[-1]["skipped"]
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        evals: dict[int, list[float]] = {}
        for t in s.query(run_id="run", evolver="es"):
            if t.member is None:
                evals.setdefault(t.generation, []).append(t.reward)
    before, after = (sum(evals[g]) / len(evals[g]) for g in (0, 8))
    assert after > before + 0.08, (before, after)  # measured +0.12 (full rank on the same scope: +0.06 at sigma 0.05)


def test_lowrank_replay_check_and_export(trained, tmp_path, capsys):
    run_dir, _ = trained
    rows = history(run_dir)
    assert coevo_main(["es", "replay", str(run_dir), "--check"]) == 0
    assert "check: OK" in capsys.readouterr().out
    out = tmp_path / "export"
    assert coevo_main(["es", "export", str(run_dir), str(out), "--replay"]) == 0
    from transformers import AutoModelForCausalLM

    from coevo.es import select_params, weights_hash

    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.bfloat16)
    assert weights_hash(select_params(model, "all_linear")) == rows[-1]["weight_hash_after"]


def test_lowrank_config_errors(tiny_model_dir):
    with pytest.raises(ConfigError, match="use scope all_linear"):
        parse_config(lowrank_config(tiny_model_dir, scope="full"))
    with pytest.raises(ConfigError, match="rank"):
        parse_config(lowrank_config(tiny_model_dir, rank=0))


def _kill_config(model_dir, marker: Path, kill_at, hold: bool = False, **es):
    rollout = {"type": "test_es_lowrank_evolver:KillingLogProbRollout", "kill_at": kill_at, "marker": str(marker)}
    base = {
        "dtype": "bfloat16",
        "population_size": 4,
        "total_generations": 5,
        "sigma": 0.02,
        "sigma_final": 0.01,
        "alpha": 0.05,
        "checkpoint_every": 2,
        "eval_every": 2,
        "rollout": {**rollout, "hold": hold},
    }
    return lowrank_config(model_dir, **{**base, **es})


def _start_run(run_dir: Path, data: dict, cwd: Path) -> subprocess.Popen:
    """``coevo run`` of ``data`` into ``run_dir`` in a child process (this checkout and tests/ importable), in a
    session of its own: ``os.killpg(proc.pid, SIGKILL)`` kills it with every process it started (its Ray cluster)."""
    run_dir.parent.mkdir(parents=True)
    (run_dir.parent / "config.yaml").write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray cluster of its own
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
    cmd = [sys.executable, "-m", "coevo.cli", "run", str(run_dir.parent / "config.yaml"), "--out", str(run_dir)]
    return subprocess.Popen(
        [*cmd, "--no-progress"],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_resume_after_kill_9_mid_generation_equals_uninterrupted(tiny_model_dir, tmp_path):
    ref_dir = tmp_path / "ref" / "run"
    run_loop(ref_dir, _kill_config(tiny_model_dir, tmp_path / "unused", None))
    ref = history(ref_dir)
    assert len(ref) == 5

    run_dir, marker = tmp_path / "killed" / "run", tmp_path / "killed.marker"
    data = _kill_config(tiny_model_dir, marker, 3)
    proc = _start_run(run_dir, data, tmp_path)
    assert proc.wait(timeout=600) == -signal.SIGKILL, proc.stderr.read()[-2000:]
    assert marker.exists() and [r["generation"] for r in history(run_dir)] == [0, 1, 2]

    run_loop(run_dir, data, resume=True)
    got = history(run_dir)
    assert [r["weight_hash_after"] for r in got] == [r["weight_hash_after"] for r in ref]
    assert [r["rewards"] for r in got] == [r["rewards"] for r in ref]
    assert coevo_main(["es", "replay", str(run_dir), "--check"]) == 0


@pytest.mark.heavy  # three runs, two local Ray clusters and a killed driver: minutes on 2 cores; `pytest -m heavy`
def test_ray_lowrank_generations_and_resume_after_kill_9_of_the_driver(tiny_model_dir, tmp_path):
    """workers: 2 on a local Ray cluster: each actor rolls out a group of members together and applies the same
    low-rank update (hashes compared by the driver); rewards equal the in-process population's up to the batch
    composition's float tolerance. A driver (a ``coevo run`` process with a local Ray cluster of its own)
    SIGKILLed with that cluster while its actors are inside generation 1 resumes with fresh actors (rebuilt from the base model + history) to the
    uninterrupted run's rewards and hashes, bit for bit."""
    ray = pytest.importorskip("ray")
    es = {"population_size": 4, "total_generations": 3, "eval_every": 1, "checkpoint_every": 1}
    started = not ray.is_initialized()
    if started:  # the actors import this test module (the killing rollout)
        path = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
        for attempt in range(3):  # Ray waits a fixed 30 s for its raylet: a starved machine can miss it
            try:
                ray.init(
                    num_cpus=2,
                    include_dashboard=False,
                    log_to_driver=False,
                    runtime_env={"env_vars": {"PYTHONPATH": path}},
                )
                break
            except Exception:
                ray.shutdown()
                if attempt == 2:
                    raise
    try:
        inproc_dir, ref_dir = tmp_path / "inproc" / "run", tmp_path / "ref" / "run"
        run_loop(inproc_dir, _kill_config(tiny_model_dir, tmp_path / "unused", None, **es))
        run_loop(ref_dir, _kill_config(tiny_model_dir, tmp_path / "unused", None, workers=2, **es))
        inproc, ref = history(inproc_dir), history(ref_dir)
        assert len(ref) == 3 and all(r["perturbation"] == "lowrank" and r["workers"] == 2 for r in ref)
        for a, b in zip(inproc, ref, strict=True):
            assert a["rewards"] == pytest.approx(b["rewards"], abs=1e-4)
        with TrajectoryStore(ref_dir / "store.sqlite", readonly=True) as s:
            members = [t for t in s.query(run_id="run", evolver="es") if t.member is not None]
        assert len(members) == 3 * 4 * 3 and os.getpid() not in {t.meta["worker_pid"] for t in members}
        assert coevo_main(["es", "replay", str(ref_dir), "--check"]) == 0  # driver == actors == replay (hashes)

        run_dir, marker = tmp_path / "killed" / "run", tmp_path / "killed.marker"
        data = _kill_config(tiny_model_dir, marker, 1, hold=True, workers=2, **es)
        proc = _start_run(run_dir, data, tmp_path)
        try:
            deadline = time.time() + 600
            while not marker.exists() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.5)
            assert marker.exists(), proc.stderr.read()[-2000:] if proc.poll() is not None else "no marker in 600 s"
            os.killpg(proc.pid, signal.SIGKILL)  # driver and its Ray cluster die while the actors are in generation 1
            assert proc.wait(timeout=60) == -signal.SIGKILL
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        assert [r["generation"] for r in history(run_dir)] == [0]
        (run_dir / "weights" / "gen-00001.safetensors").unlink()  # fresh actors rebuild from base + history
        run_loop(run_dir, data, resume=True)
        got = history(run_dir)
        assert [r["rewards"] for r in got] == [r["rewards"] for r in ref]
        assert [r["weight_hash_after"] for r in got] == [r["weight_hash_after"] for r in ref]
        assert coevo_main(["es", "replay", str(run_dir), "--check"]) == 0
    finally:
        if started:
            ray.shutdown()


def test_eoh_children_under_lowrank_members(tmp_path, tiny_model_dir):
    """The AHD co-evolution config with perturbation lowrank: each member's children are sampled through its
    population view (no weight pass), recorded with the member, and the history rows are low-rank."""
    from test_ahd_coevo import es_first_eoh_loop

    from coevo.ahd.answer import answer_prefix

    loop = es_first_eoh_loop(tmp_path, tiny_model_dir, **{"evolvers.es.perturbation": "lowrank"})
    start = loop.ctx.policy.es_replica(ScopeSpec("all_linear")).weights_hash()
    summary = loop.run()
    assert "sample budget reached (28/28" in summary.stop_reason
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        es = [t for t in store.query(run_id="run") if t.evolver == "es"]
        assert len(es) == 16 and all(t.member is not None and t.space == "parameter" for t in es)
        # the members' children continue the prefilled answer (coevo.ahd.answer) on the population path too
        prefix = answer_prefix(loop.evolvers["eoh"].problem.prompt_spec())
        es_steps = [store.get_by_key(t.key) for t in es]
        assert all(t.meta["answer_format"] == "prefill" for t in es)
        assert all(
            t.steps[0].observation.endswith(prefix) and t.steps[0].model_output.startswith(prefix) for t in es_steps
        )
        hist = store.es_history("run", "es")
        assert [h["perturbation"] for h in hist] == ["lowrank"] * 2 and hist[0]["weight_hash_before"] == start


def test_countdown_population_rows_equal_members_alone(tiny_model_dir):
    from coevo.backends.hf import HFPolicy
    from coevo.rollouts.base import build_rollout
    from coevo.types import ESMember

    policy = HFPolicy(tiny_model_dir, batch_size=5)
    replica = policy.es_replica(ScopeSpec("all_linear"), master_weights=False)
    members = [ESMember(seed=3, sigma=0.2, sign=s, index=i) for i, s in enumerate((1, -1))]
    for reward in ("exact", "answer_logprob"):
        ro = build_rollout({"type": "countdown", "cases_per_member": 4, "max_new_tokens": 4, "reward": reward}, None)
        with replica.population(members, 1) as pop:
            batched = ro.run_population(pop, members, generation=2, key_prefixes=["a", "b"])
            alone = [
                ro.run(pop.member_policy(m), generation=2, member=m, key_prefix=p)
                for m, p in zip(members, ["a", "b"], strict=True)
            ]
        for got, want in zip(batched, alone, strict=True):
            assert [t.key for t in got] == [t.key for t in want] and len(got) == 4
            assert [t.steps[0].model_output for t in got] == [t.steps[0].model_output for t in want]
            assert [t.reward for t in got] == pytest.approx([t.reward for t in want], abs=1e-5)
            assert all(t.member in members for t in got)


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "sudoku", "size": 4, "horizon": 2, "puzzles_per_member": 3, "max_new_tokens": 4, "context": "history"},
        {"type": "react_math", "problems_per_member": 2, "max_turns": 2, "max_new_tokens": 6},
    ],
    ids=["sudoku", "react_math"],
)
def test_episode_population_steps_every_members_episodes_together(tiny_model_dir, spec):
    """Multi-turn episodes under low rank: one population.generate per turn for all members' episodes, and each
    member's trajectories equal that member run alone (same sampled text, seeds per member)."""
    from coevo.backends.hf import HFPolicy
    from coevo.rollouts.base import build_rollout
    from coevo.types import ESMember

    policy = HFPolicy(tiny_model_dir, batch_size=16)
    replica = policy.es_replica(ScopeSpec("all_linear"), master_weights=False)
    members = [ESMember(seed=5, sigma=0.2, sign=s, index=i) for i, s in enumerate((1, -1))]
    ro = build_rollout(spec, None)
    with replica.population(members, 1) as pop:
        calls = []
        generate = pop.generate
        pop.generate = lambda rows, params, **kw: (
            calls.append([m.index for m, _ in rows]) or generate(rows, params, **kw)
        )
        batched = ro.run_population(pop, members, generation=1, key_prefixes=["a", "b"])
        pop.generate = generate
        alone = [
            ro.run(pop.member_policy(m), generation=1, member=m, key_prefix=p)
            for m, p in zip(members, ["a", "b"], strict=True)
        ]
    n = ro.n_cases("train")
    assert calls and set(calls[0]) == {0, 1} and len(calls[0]) == 2 * n  # turn 0: every episode of both members
    assert len(calls) == max(t.llm_calls for ts in batched for t in ts)  # one call per turn
    for member, got, want in zip(members, batched, alone, strict=True):
        assert len(got) == n and [t.key for t in got] == [t.key for t in want]
        assert all(t.member == member for t in got)
        assert [[s.model_output for s in t.steps] for t in got] == [[s.model_output for s in t.steps] for t in want]
        assert [t.reward for t in got] == [t.reward for t in want]


def test_eoh_children_members_share_one_batched_generate(tmp_path, tiny_model_dir, monkeypatch):
    """Low-rank ES on AHD: all members' children go through one batched ``population.generate`` call (rows of
    different members in the same model batches), and each member's children equal those of the member sampled
    alone (same prompts, same per-job seeds). A spy counts the real population calls; nothing is replaced."""
    from test_ahd_coevo import es_first_eoh_loop

    from coevo.backends.hf_replica import HFPopulation

    calls: list[int] = []
    real = HFPopulation.generate

    def counted(self, rows, params, seed_indices=None):
        calls.append(len(rows))
        return real(self, rows, params, seed_indices)

    monkeypatch.setattr(HFPopulation, "generate", counted)

    def children(folder: str, alone: bool) -> list[list]:
        loop = es_first_eoh_loop(tmp_path / folder, tiny_model_dir, **{"evolvers.es.perturbation": "lowrank"})
        es = loop.evolvers["es"]
        members = es.members(0)
        prefixes = [es.key_prefix(0, m) for m in members]
        with es.replica.population(members, 1) as pop:
            if not alone:
                return es.rollout.run_population(pop, members, generation=0, key_prefixes=prefixes)
            return [
                es.rollout.run_population(pop, [m], generation=0, key_prefixes=[p])[0]
                for m, p in zip(members, prefixes, strict=True)
            ]

    batched = children("batched", alone=False)
    assert calls == [8]  # 4 members x 2 children in one call
    alone = children("alone", alone=True)
    assert calls[1:] == [2, 2, 2, 2]
    for got, want in zip(batched, alone, strict=True):
        assert [t.key for t in got] == [t.key for t in want] and len(got) == 2
        assert [t.steps[0].model_output for t in got] == [t.steps[0].model_output for t in want]
        assert [t.meta["seed"] for t in got] == [t.meta["seed"] for t in want]
        assert all(t.member == got[0].member == want[0].member for t in got)
    assert [ts[0].member.index for ts in batched] == [0, 1, 2, 3]
    # common random numbers: job k of every member samples with the same seed
    assert len({t.meta["batch_seed"] for ts in batched for t in ts}) == 1

"""ES on two vLLM engines on Ray (issue 47): vLLM's CPU build, a tiny random Qwen2 (head dim 32), float32, a local
2-CPU Ray cluster, one engine per actor and placement group, each on one core of its own.

What runs for real: Ray actors each starting a ``vllm.LLM`` engine (engine core and worker processes) with coevo's
worker extension, their weights hashes after perturb / restore / update (full rank and low rank) against HF's,
members' trajectories from two engines against the same members on one engine, an actor killed mid-generation
(one line), no process left after close, and ``coevo run`` of ``configs/es/vllm_ray_tiny.yaml`` with a killed
engine, a resume and ``coevo es replay --check``. At most two engines are alive at any time (the module's pool
is closed before the run starts its own). No GPU here: the GPU config is checked by parsing only.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from support import antithetic_record, lowrank_record, vllm_cpu_missing

ray = pytest.importorskip("ray")

from coevo.backends.spec import ModelConfig
from coevo.errors import ConfigError
from coevo.es import ScopeSpec
from coevo.placement.ray_pool import EngineLostError, RayReplicaPool, preflight
from coevo.types import ESMember

# two engines start twice (the pool, then the run and its resume): minutes on 2 cores
pytestmark = [
    pytest.mark.heavy,  # real engines / browsers, minutes per module on 2 cores: CI's second command (docs/guide.md, Tests)
    pytest.mark.skipif(vllm_cpu_missing() is not None, reason=str(vllm_cpu_missing())),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two engines need two cores"),
    pytest.mark.slow,
    pytest.mark.usefixtures("one_torch_thread"),
]

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ScopeSpec("all_linear")
ROLLOUT = {
    "type": "target_logprob",
    "target": "Hello, world!",
    "prompts": ["Say hello.", "Greet the user.", "Write a greeting."],
    "test_prompts": ["Please say hello."],
}


def _spec(vllm_tiny_dir) -> dict:
    model = ModelConfig(name=str(vllm_tiny_dir), backend="vllm", dtype="float32", kv_cache_gib=0.25)
    return {
        "model": model.model_dump(),
        "lora": (4, 2),  # low-rank members as LoRA adapters, as a lowrank run starts its engines
        "rollout": ROLLOUT,
        "scope": SCOPE.to_dict(),
        "master_weights": True,
        "restore_mode": "exact",
    }


#: the module's pools still open (the heavy run test closes them: two engines at a time on 2 cores)
OPEN_POOLS: list[RayReplicaPool] = []


@pytest.fixture(scope="module")
def pool(vllm_tiny_dir):
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    p = RayReplicaPool(_spec(vllm_tiny_dir), workers=2, num_cpus=1)
    p.start_s = time.perf_counter() - t0
    OPEN_POOLS.append(p)
    yield p
    p.close()
    if started:
        ray.shutdown()


def _alive(pids) -> list[int]:
    import psutil

    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _content(trajs):
    """A member's trajectories without the wall-clock fields and the actor's pid."""
    out = []
    for t in trajs:
        d = t.to_dict()
        d["meta"] = {k: v for k, v in d["meta"].items() if k != "worker_pid"}
        out.append({k: v for k, v in d.items() if k not in ("started_at", "duration_s")})
    return out


def test_two_engines_each_on_its_core_hold_hf_weights_after_perturb_restore_update(pool, vllm_tiny_hf):
    infos = pool.infos
    assert [i["cores"] for i in infos] == [[0], [1]] or sorted(c for i in infos for c in i["cores"]) == sorted(
        os.sched_getaffinity(0)
    )[:2]
    assert len({i["pid"] for i in infos}) == 2 and all(i["engine_pids"] for i in infos)  # engine core + worker
    assert os.getpid() not in {i["pid"] for i in infos}
    hr = vllm_tiny_hf.es_replica(SCOPE)
    assert pool.start_hashes == [hr.weights_hash()] * 2
    for member in (ESMember(seed=7, sigma=0.05, sign=-1), ESMember(seed=2**62 + 5, sigma=0.02, sign=1)):
        expected = hr.noise_hash(member)  # perturb, hash, restore in each engine
        assert expected != hr.weights_hash() and pool.noise_hashes(member) == [expected, expected]
    assert pool.weights_hash() == hr.weights_hash()  # restored exactly
    record = antithetic_record(4, sigma=0.05, alpha=0.05)
    stats_h, after = hr.apply(record)
    stats_v, after_v = pool.update(record)
    assert after_v == after and stats_v.update_norm == stats_h.update_norm > 0
    lowrank = lowrank_record(sigma=0.05, alpha=0.05)
    _, after_lr = hr.apply(lowrank)
    assert after_lr != after and pool.apply(lowrank, expected=after_lr) == (None, after_lr)


def test_members_on_two_engines_equal_the_same_members_on_one(pool, vllm_tiny_hf):
    """Full rank: the jobs spread over both engines give the trajectories engine 0 gives for every member alone,
    and rewards within 1e-4 nats of HF's; low rank: each engine's contiguous group equals that group rolled out on
    engine 0."""
    members = [
        ESMember(seed=s, sigma=0.05, sign=g, index=2 * i + (g < 0)) for i, s in enumerate((3, 8)) for g in (1, -1)
    ]
    kw = {"generation": 0, "round_index": 0, "evolver": "es", "context": {}}
    jobs = [{"member": asdict(m), "key_prefix": f"es/g0/m{m.index}", **kw} for m in members]
    dict(pool.evaluate_iter(jobs))  # both engines warm (their first batch is slow)
    t0 = time.perf_counter()
    alone = [pool.evaluate_on(0, job) for job in jobs]
    one_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    spread = dict(pool.evaluate_iter(jobs))
    two_s = time.perf_counter() - t0
    print(f"\n{len(members)} full-rank members (a generation): one engine {one_s:.2f} s, two engines {two_s:.2f} s")
    assert {t.meta["worker_pid"] for i in spread for t in spread[i]} == {i["pid"] for i in pool.infos}
    assert [_content(spread[i]) for i in range(len(jobs))] == [_content(ts) for ts in alone]

    from coevo.rollouts.base import build_rollout

    rollout = build_rollout(ROLLOUT, None)
    hr = vllm_tiny_hf.es_replica(SCOPE)
    for m, ts in zip(members, alone, strict=True):
        with hr.perturbed(m) as p:
            ref = rollout.run(p, generation=0, member=m, key_prefix="x", split="train", evolver="es")
        assert [t.reward for t in ts] == pytest.approx([t.reward for t in ref], abs=1e-4)

    prefixes = [j["key_prefix"] for j in jobs]
    lr_members = [ESMember(m.seed, m.sigma, m.sign, m.index) for m in members]
    remote = pool.evaluate_population(lr_members, prefixes, rank=2, generation=0, evolver="es", round_index=0)
    for lo, hi in ((0, 2), (2, 4)):  # the pool's groups, each rolled out on engine 0 alone
        job = {"members": [asdict(m) for m in lr_members[lo:hi]], "key_prefixes": prefixes[lo:hi], "rank": 2, **kw}
        from coevo.types import Trajectory

        groups = ray.get(pool.actors[0].evaluate_population.remote(job))
        assert [_content(ts) for ts in remote[lo:hi]] == [
            _content([Trajectory.from_dict(d) for d in g]) for g in groups
        ]
    assert pool.weights_hash() == hr.weights_hash()  # a low-rank population leaves the weights alone


def test_a_killed_engine_actor_is_one_line_and_close_leaves_no_process(pool):
    pids = pool.engine_pids()
    assert len(pids) >= 6  # two actors, each with an engine core and a worker
    members = [ESMember(seed=s, sigma=0.05, sign=1, index=s) for s in range(8)]
    jobs = [
        {"member": asdict(m), "key_prefix": f"k/m{m.index}", "generation": 0, "round_index": 0, "evolver": "es"}
        for m in members
    ]
    victim = pool.infos[1]["pid"]
    threading.Timer(1.0, lambda: os.kill(victim, signal.SIGKILL)).start()
    done = []
    with pytest.raises(EngineLostError) as err:
        for i, ts in pool.evaluate_iter(jobs, "generation 0's members"):
            done.append(i)
            time.sleep(0.3)  # the kill lands while members are still out
    line = str(err.value)
    assert "\n" not in line and "actor 1" in line and f"pid {victim}" in line and "--resume" in line, line
    pool.close()
    pool.close()  # idempotent
    assert _alive(pids) == []


def test_bad_input_is_one_line_before_any_engine_starts(vllm_tiny_dir):
    """workers beyond the cores (vLLM-CPU) or the GPUs; a model folder missing on a node; vLLM missing there."""
    model = ModelConfig(name=str(vllm_tiny_dir), backend="vllm", dtype="float32").model_dump()
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match=rf"{cores + 1} vLLM-CPU engines x 1 core\(s\) need {cores + 1} cores"):
        preflight(model, cores + 1, 1.0, 0.0, vllm_cpu=True)
    for p in OPEN_POOLS:  # the module's engines go first: their actors hold the Ray CPUs this pool asks for
        p.close()
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with pytest.raises(ConfigError, match="2 engines x 1 GPU need 2 GPUs, the Ray cluster has 0"):
            preflight(model, 2, 1.0, 1.0, vllm_cpu=False)
        before = set(os.listdir("/proc"))
        missing = {**model, "name": str(vllm_tiny_dir / "not-there")}
        with pytest.raises(ConfigError, match=r"model folder .*not-there is missing on node") as err:
            RayReplicaPool({"model": missing, "rollout": ROLLOUT, "scope": SCOPE.to_dict(), "master_weights": True,
                            "restore_mode": "exact"}, workers=2, num_cpus=1)  # fmt: skip
        assert "\n" not in str(err.value)
        assert not [p for p in set(os.listdir("/proc")) - before if p.isdigit() and "EngineCore" in _cmd(p)]
    finally:
        if started:
            ray.shutdown()


def _cmd(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def test_vllm_missing_on_a_node_is_named(monkeypatch):
    """The node check (run in each placement group before the engines start) on a node where vLLM does not import:
    stood for here by ``find_spec`` finding no vllm (the only stand-in of this module)."""
    import importlib.util

    from coevo.placement import ray_pool

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    problem = ray_pool._node_problem({"name": "tiny:micro", "backend": "vllm"}, 0.0)
    assert problem is not None and problem.startswith("vLLM is not installed on node"), problem


def test_gpu_config_parses():
    from coevo.config import load_config

    cfg, _ = load_config(ROOT / "configs/es/vllm_ray_gpu.yaml")
    es = next(e for e in cfg.evolvers if e.type == "es")
    assert cfg.model.backend == "vllm" and es.params.workers >= 2 and es.params.worker_num_gpus == 1


@pytest.mark.heavy  # four engine starts and a two-generation run: 5-10 min on 2 cores; `pytest -m heavy` runs it
def test_coevo_run_two_engines_killed_engine_resume_and_replay(tmp_path, monkeypatch):
    """configs/es/vllm_ray_tiny.yaml as ``coevo run`` runs it, with engine 1 killed in generation 1: the step ends
    with one line, no process is left; ``--resume`` re-runs the cut generation (the members stored before are
    kept), and ``coevo es replay --check`` rebuilds every generation's weights on HF, bit for bit."""
    import subprocess
    import sys

    from coevo.backends.vllm_engine import child_pids, wait_gone
    from coevo.config import load_config
    from coevo.evolvers.es import ESEvolver
    from coevo.loop import CoEvolutionLoop
    from coevo.store import TrajectoryStore

    for p in OPEN_POOLS:  # at most two engines at a time: the module's go first, and the run starts its own Ray
        p.close()
    ray.shutdown()
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    config = ROOT / "configs/es/vllm_ray_tiny.yaml"
    run_dir = tmp_path / "run"
    cfg, raw = load_config(config)
    original = ESEvolver._record
    killed: list[int] = []

    def record_then_kill(self, prefix, trajs, member):  # engine 1 dies once generation 1 has a member stored
        out = original(self, prefix, trajs, member)
        if member is not None and "/g00001/" in prefix and not killed:
            killed.append(self.placement.pool.infos[1]["pid"])
            os.kill(killed[0], signal.SIGKILL)
        return out

    monkeypatch.setattr(ESEvolver, "_record", record_then_kill)
    before = child_pids()
    loop = CoEvolutionLoop(cfg, run_dir, raw_config=raw, progress=False)
    pids: list[int] = []
    real_close = RayReplicaPool.close

    def note_pids(self):
        pids.extend(self.engine_pids())
        real_close(self)

    monkeypatch.setattr(RayReplicaPool, "close", note_pids)
    with pytest.raises(EngineLostError) as err:
        loop.run()
    assert "\n" not in str(err.value) and "actor 1" in str(err.value)
    assert pids and _alive(pids) == [] and wait_gone(child_pids() - before) == set()
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        kept = {t.key: t.reward for t in s.query(run_id="run", evolver="es") if t.generation == 1 and t.member}
        assert kept and len(s.es_history("run", "es")) == 1
    monkeypatch.setattr(ESEvolver, "_record", original)
    summary = CoEvolutionLoop(cfg, run_dir, raw_config=raw, resume=True, progress=False).run()
    assert "completed its 2 generations" in summary.stop_reason
    assert _alive(pids) == [] and wait_gone(child_pids() - before) == set()
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        history = s.es_history("run", "es")
        members = [t for t in s.query(run_id="run", evolver="es") if t.member is not None]
        again = {t.key: t.reward for t in members if t.generation == 1}
    assert len(history) == 2 and len(members) == 2 * 4 * 3
    assert all(again[k] == r for k, r in kept.items())  # stored before the kill, not re-run
    assert len({t.meta["worker_pid"] for t in members}) >= 3  # two engines, then two fresh ones after the resume
    proc = subprocess.run(
        [sys.executable, "-m", "coevo.cli", "es", "replay", str(run_dir), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "COEVO_CACHE": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    _ = torch  # the module pins torch to one thread (one_torch_thread)

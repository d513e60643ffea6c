"""ES population on Ray actors (local 2-CPU cluster, 2 actors, tiny model): same noise as in-process, same
weights after a distributed generation (full rank and low rank), low-rank population rows evaluated on the
actors with the in-process math, divergence detected."""

from __future__ import annotations

import contextlib
import os

import pytest
from support import antithetic_record, lowrank_record

ray = pytest.importorskip("ray")

from test_es_evolver import es_config, history, run_loop

from coevo.backends.hf import HFPolicy
from coevo.es import ScopeSpec
from coevo.placement.ray_pool import RayReplicaPool, ReplicaDivergenceError
from coevo.store import TrajectoryStore
from coevo.types import ESMember

# Ray start-up plus actors importing torch: ~30 s on 2 busy cores
pytestmark = [
    pytest.mark.heavy,
    pytest.mark.slow,
    pytest.mark.usefixtures("one_torch_thread"),
]  # Ray actors, minutes per module on 2 cores: CI's second command (docs/guide.md, Tests)


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def _spec(model_dir):
    return {
        "model": {"name": str(model_dir), "backend": "hf", "dtype": "bfloat16", "device": "cpu", "batch_size": 8},
        "rollout": {"type": "target_logprob"},
        "scope": ScopeSpec("all_linear").to_dict(),
        "master_weights": True,
        "restore_mode": "exact",
    }


def test_actor_noise_equals_in_process_and_divergence_is_detected(local_ray, tiny_model_dir):
    spec = _spec(tiny_model_dir)
    local = HFPolicy(tiny_model_dir, dtype="bfloat16").es_replica(ScopeSpec.from_dict(spec["scope"]))
    pool = RayReplicaPool(spec, workers=2)
    try:
        assert pool.start_hashes == [local.weights_hash()] * 2
        for member in (ESMember(seed=2**63 - 1, sigma=1e-2, sign=1), ESMember(seed=12345, sigma=3e-3, sign=-1)):
            expected = local.noise_hash(member)
            assert expected != local.weights_hash()  # the perturbation changes the weights...
            assert pool.noise_hashes(member) == [expected, expected]  # ...identically in every process
        assert not local.active and pool.start_hashes[0] == local.weights_hash()

        record = antithetic_record(7, sigma=1e-2, master_dtype="float32")
        _, after = local.apply(record)
        assert pool.apply(record, expected=after) == (None, after) and pool.weights_hash() == after
        lowrank = lowrank_record()
        _, after_lr = local.apply(lowrank)
        assert after_lr != after and pool.apply(lowrank, expected=after_lr) == (None, after_lr)
        ray.get(pool.actors[0].apply.remote(record.to_dict()))  # one replica applies an update twice
        with pytest.raises(ReplicaDivergenceError, match="diverged at resume"):
            pool.load(None, [], expected=after_lr)
    finally:
        pool.close()


def test_actors_evaluate_lowrank_population_rows_with_the_in_process_math(local_ray, tiny_model_dir):
    """Each actor rolls out one contiguous group of members together; its trajectories are bit-identical to the
    same group rolled out in-process (same factors, hooks, batches), and match the whole population in one
    in-process batch up to the float tolerance of a different batch composition."""
    from coevo.rollouts.base import build_rollout

    spec = {**_spec(tiny_model_dir), "master_weights": False}
    local = HFPolicy(tiny_model_dir, dtype="bfloat16", batch_size=8).es_replica(
        ScopeSpec.from_dict(spec["scope"]), master_weights=False
    )
    members = [
        ESMember(seed=s, sigma=0.05, sign=g, index=2 * i + (g < 0)) for i, s in enumerate((5, 2**40)) for g in (1, -1)
    ]
    members.append(ESMember(seed=77, sigma=0.05, sign=1, index=4))  # odd size: groups of 2 and 3
    prefixes = [f"g/m{m.index}" for m in members]
    kw = {"generation": 3, "evolver": "es", "round_index": 0}
    rollout = build_rollout(spec["rollout"], None)

    def in_process(lo, hi):
        with local.population(members[lo:hi], 2) as pop:
            return rollout.run_population(pop, members[lo:hi], key_prefixes=prefixes[lo:hi], split="train", **kw)

    pool = RayReplicaPool(spec, workers=2)
    try:
        remote = pool.evaluate_population(members, prefixes, rank=2, **kw)
        pids = [{t.meta.pop("worker_pid") for t in ts} for ts in remote]
    finally:
        pool.close()
    assert pids[0] == pids[1] != pids[2] == pids[3] == pids[4] and os.getpid() not in pids[0] | pids[2]

    def content(groups):  # everything but the wall-clock fields
        return [
            [{k: v for k, v in t.to_dict().items() if k not in ("started_at", "duration_s")} for t in ts]
            for ts in groups
        ]

    grouped = in_process(0, 2) + in_process(2, 5)
    assert content(remote) == content(grouped)
    whole = in_process(0, 5)
    assert [t.key for ts in remote for t in ts] == [t.key for ts in whole for t in ts]
    got, want = ([t.reward for ts in g for t in ts] for g in (remote, whole))
    assert got == pytest.approx(want, abs=1e-4) and len(set(got)) > 5  # members differ from each other


def test_two_actor_generations_equal_in_process_also_after_resume(local_ray, tiny_model_dir, tmp_path):
    es = {
        "population_size": 4,
        "total_generations": 2,
        "sigma": 0.02,
        "sigma_final": 0.01,
        "alpha": 0.05,
        "scope": "all_linear",
        "eval_every": 1,
        "checkpoint_every": 1,
    }
    run_loop(tmp_path / "inproc", es_config(tiny_model_dir, dtype="bfloat16", **es))
    ray_dir = tmp_path / "ray"
    run_loop(ray_dir, es_config(tiny_model_dir, dtype="bfloat16", workers=2, max_rounds=1, **es))
    # resume with fresh actors; without the gen-1 snapshot they rebuild the weights from the base model + history
    (ray_dir / "weights" / "gen-00001.safetensors").unlink()
    run_loop(ray_dir, es_config(tiny_model_dir, dtype="bfloat16", workers=2, max_rounds=2, **es), resume=True)
    a, b = history(tmp_path / "inproc"), history(ray_dir)
    assert len(a) == len(b) == 2
    assert [r["rewards"] for r in a] == [r["rewards"] for r in b]
    assert [r["weight_hash_after"] for r in a] == [r["weight_hash_after"] for r in b]
    with TrajectoryStore(ray_dir / "store.sqlite", readonly=True) as s:
        members = [t for t in s.query(run_id="ray", evolver="es") if t.member is not None]
    assert len(members) == 2 * 4 * 3
    pids = {t.meta["worker_pid"] for t in members}
    assert os.getpid() not in pids and 1 <= len(pids) <= 4  # rolled out in the actors, stored by the driver


def test_preflight_waits_for_a_just_removed_placement_group_and_refuses_a_held_one(local_ray, tiny_model_dir):
    """Removing a placement group is asynchronous in Ray: a pool started right after another's close must not be
    refused for CPUs that are about to be free (CI saw 'has 0 free' right after a close); CPUs still held are
    refused, as one line, after the short wait."""
    import threading

    from ray.util.placement_group import placement_group, remove_placement_group

    from coevo.errors import ConfigError
    from coevo.placement.ray_pool import preflight

    model = {"name": str(tiny_model_dir), "backend": "hf"}
    held = placement_group([{"CPU": 2.0}], strategy="STRICT_PACK")
    ray.get(held.ready(), timeout=60)
    try:
        with pytest.raises(ConfigError, match=r"^evolvers\.es\.workers: 2 actors x 1 CPU need 2 Ray CPUs.*0 free"):
            preflight(model, 2, 1.0, 0.0, vllm_cpu=False)
        threading.Timer(1.0, remove_placement_group, args=(held,)).start()
        preflight(model, 2, 1.0, 0.0, vllm_cpu=False)  # waits for the removal instead of refusing
        assert ray.available_resources().get("CPU", 0.0) >= 2.0
    finally:
        with contextlib.suppress(Exception):
            remove_placement_group(held)

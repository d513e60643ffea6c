"""Where the model replicas live, decided once (coevo.placement): the choice from the config, what it refuses, and
the in-process placement under the ES evolver. Nothing here starts Ray or an engine (a Ray placement starts its
actors on first use; tests/test_es_ray.py and tests/test_es_vllm_ray.py run them)."""

from __future__ import annotations

import pytest

from coevo.backends.factory import PolicyFactory
from coevo.config import ConfigError, parse_config
from coevo.placement import InProcess, RolloutJob, choose_placement, lora_needs
from coevo.placement.ray import RayHF, RayVLLM
from coevo.types import ESMember

TINY = {"name": "tiny:micro", "backend": "hf", "dtype": "float32"}


def _config(model=TINY, **es):
    data = {
        "run": {"name": "p"},
        "budget": {"max_rounds": 2},
        "evolvers": [
            {"name": "es", "type": "es", "population_size": 2, "total_generations": 2, **es},
        ],
    }
    if model is not None:
        data["model"] = model
    return parse_config(data)


@pytest.mark.parametrize(
    ("model", "workers", "kind", "cls"),
    [
        (TINY, 0, "in-process", InProcess),
        ({**TINY, "backend": "vllm"}, 0, "in-process", InProcess),
        (TINY, 2, "ray-hf", RayHF),
        ({**TINY, "backend": "vllm"}, 2, "ray-vllm", RayVLLM),
    ],
)
def test_the_placement_is_chosen_once_from_workers_and_the_backend(model, workers, kind, cls):
    cfg = _config(model, workers=workers, worker_num_cpus=1)
    placement = choose_placement(cfg.evolvers, cfg.model)
    assert isinstance(placement, cls) and placement.kind == kind and placement.workers == workers
    assert isinstance(placement.policy_factory, PolicyFactory) or kind == "ray-vllm"
    if kind != "in-process":
        assert not placement.started  # no actor before first use
        assert placement.spec == cfg.evolvers[0].params.replica_spec()
        placement.close()  # idempotent, nothing to stop


def test_a_policy_passed_in_code_gets_hf_replicas_on_ray():
    cfg = _config(None, workers=2)

    def factory():
        raise AssertionError("not built by the choice")

    placement = choose_placement(cfg.evolvers, None, factory)
    assert isinstance(placement, RayHF) and placement.policy_factory is factory


def test_lowrank_populations_ask_for_lora_slots_of_every_member():
    cfg = _config(perturbation="lowrank", rank=3, scope="all_linear", population_size=4)
    assert lora_needs(cfg.evolvers) == (4, 3) == cfg.evolvers[0].params.replica_spec().lora
    placement = choose_placement(cfg.evolvers, cfg.model)
    assert placement.policy_factory.lora == (4, 3)
    assert lora_needs(_config().evolvers) is None


def test_one_evolver_owns_the_weights_when_they_live_on_ray():
    data = {
        "run": {"name": "p"},
        "model": TINY,
        "budget": {"max_rounds": 2},
        "evolvers": [
            {"name": "es", "type": "es", "population_size": 2, "total_generations": 2, "workers": 2},
            {"name": "es2", "type": "es", "population_size": 2, "total_generations": 2},
        ],
    }
    with pytest.raises(ConfigError, match=r"evolvers\.es\.workers: one evolver of a run owns .*\['es2'\]"):
        parse_config(data)


def test_in_process_members_are_rolled_out_perturbed_and_restored(tiny_model_dir):
    """The in-process placement under the ES evolver's calls: each member under its perturbation (restored
    before the caller gets the trajectories), the centre unperturbed."""
    from coevo.backends.hf import HFPolicy
    from coevo.rollouts.base import build_rollout

    cfg = _config({**TINY, "name": str(tiny_model_dir)}, rollout={"type": "target_logprob"})
    spec = cfg.evolvers[0].params.replica_spec()
    placement = choose_placement(cfg.evolvers, cfg.model)
    policy = placement.policy()
    assert isinstance(policy, HFPolicy)
    replica = placement.replica(spec, policy)
    rollout = build_rollout(spec.rollout, None)
    base = replica.weights_hash()
    members = [ESMember(seed=5, sigma=0.05, sign=s, index=i) for i, s in enumerate((1, -1))]
    jobs = [RolloutJob(m, 0, f"es/g0/m{m.index}", "es", 0) for m in members]
    out = []
    for i, trajs in placement.evaluate_members(rollout, replica, jobs, None):
        assert not replica.active and replica.weights_hash() == base  # restored before they reach the caller
        out.append((i, [t.reward for t in trajs]))
    assert [i for i, _ in out] == [0, 1] and out[0][1] != out[1][1]  # the two signs differ
    centre = placement.evaluate_centre(rollout, replica, RolloutJob(None, 0, "es/g0/centre", "es", 0, "test"))
    assert centre and all(t.member is None for t in centre)
    policy.close()

"""The one place a run decides where its model replicas live (:func:`choose_placement`), and checks that it can.

The decision reads the run's ``model`` section and the placement fields of the evolver that owns the weights
(:class:`~coevo.placement.base.PlacementFields`, today ES's ``workers`` / ``worker_num_cpus`` /
``worker_num_gpus``):

==========================  ==========================  ===============================================
``workers``                 ``model.backend``           placement
==========================  ==========================  ===============================================
0 (every evolver)           any                         :class:`~coevo.placement.base.InProcess`
>= 1 (one evolver)          hf                          :class:`~coevo.placement.ray.RayHF`
>= 1 (one evolver)          vllm                        :class:`~coevo.placement.ray.RayVLLM`
==========================  ==========================  ===============================================

Checks, each one line naming the field, all before any engine starts: :func:`placement_errors` (config
combinations, from :func:`coevo.config.check_combinations`: a rollout that calls another evolver cannot run on
actors; Ray replicas need backend hf or vllm; one evolver per run places replicas on Ray), and
:func:`check_placement` (what this machine cannot give, from ``coevo run --check`` and the loop: Ray missing,
not enough cores for vLLM-CPU engines, not enough GPUs). What only the Ray cluster can say (free CPUs, a node
without the model folder) is checked when the actors start (:func:`coevo.placement.ray_pool.preflight`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from coevo.errors import ConfigError
from coevo.placement.base import InProcess, Placement, PlacementFields

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.backends.spec import ModelConfig

#: rollout fields whose (truthy) value means the rollout calls other evolvers through the run context
#: (``ctx.evolvers``), which Ray actors do not have (published context travels with each job)
CONTEXT_FIELDS = ("evolver", "evolvers")


def _placed(evolvers: Sequence[Any]) -> list[tuple[str, PlacementFields]]:
    """``(name, params)`` of the evolvers whose config carries placement fields (``spec.name``, ``spec.params``)."""
    return [(s.name, s.params) for s in evolvers if isinstance(s.params, PlacementFields)]


def lora_needs(evolvers: Sequence[Any]) -> tuple[int, int] | None:
    """``(max_loras, max_rank)`` over the placed evolvers' low-rank populations (one LoRA adapter per member on
    the vllm backend), or None when none has one."""
    needs = [lora for _, p in _placed(evolvers) if (lora := p.replica_spec().lora) is not None]
    return (max(n for n, _ in needs), max(r for _, r in needs)) if needs else None


def placement_errors(evolvers: Sequence[Any], backend: str | None) -> list[str]:
    """Config combinations no placement can run (module docstring), each one line naming its fields; ``[]`` when
    fine. ``evolvers``: the run config's evolver specs (validated params); ``backend``: ``model.backend`` or None."""
    errors: list[str] = []
    placed = _placed(evolvers)
    on_ray = [(n, p) for n, p in placed if p.workers >= 1]
    for name, params in on_ray:
        where, workers = f"evolvers.{name}", params.workers
        rollout = params.replica_spec().rollout
        needs = [k for k in CONTEXT_FIELDS if rollout.get(k)]
        if needs:
            errors.append(
                f"{where}.workers / {where}.rollout.{needs[0]}: rollout {rollout.get('type')!r} with "
                f"{needs[0]}={rollout[needs[0]]!r} calls another evolver of the run, which the Ray actors "
                f"of workers={workers} cannot reach; set workers: 0"
            )
        if backend is not None and backend not in ("hf", "vllm", "auto"):
            errors.append(
                f"{where}.workers / model.backend: workers={workers} builds HF replicas or vLLM engines on Ray "
                f"actors and needs model.backend hf or vllm, not {backend!r}; set workers: 0"
            )
    if on_ray and len(placed) > 1:
        name = on_ray[0][0]
        others = [n for n, _ in placed if n != name]
        errors.append(
            f"evolvers.{name}.workers: one evolver of a run owns the model's weights when they live on Ray "
            f"actors, but {others} evolve them too; set workers: 0 (or run them separately)"
        )
    return errors


def check_placement(evolvers: Sequence[Any], model: ModelConfig | None) -> None:
    """What this machine cannot give the run's placement, before any engine starts (``coevo run --check``).

    Raises:
        ConfigError: Ray is not installed; vLLM-CPU engines need more (whole) cores than this machine gives; the
            actors need more CUDA GPUs than this machine has (without a Ray cluster, ``RAY_ADDRESS``).
    """
    for name, params in _placed(evolvers):
        if params.workers < 1:
            continue
        where = f"evolvers.{name}"
        if importlib.util.find_spec("ray") is None:
            raise ConfigError(
                f"{where}.workers: {params.workers} Ray actors need Ray, which is not installed here: "
                "install it (bash scripts/install.sh --dev, or pip install -e '.[dist]') or set workers: 0"
            )
        from coevo.placement.ray_pool import machine_problem

        backend = model.backend if model is not None else None
        problem = machine_problem(backend, params.workers, params.worker_num_cpus, params.worker_num_gpus, where)
        if problem:
            raise ConfigError(problem)


def choose_placement(
    evolvers: Sequence[Any], model: ModelConfig | None, policy_factory: Callable[[], Policy] | None = None
) -> Placement:
    """The run's placement (module docstring's table), decided once.

    Args:
        evolvers: the run config's evolver specs (``name``, validated ``params``).
        model: the run's model section with ``backend`` resolved (not ``auto``), or None.
        policy_factory: builds the run's policy instead of ``model`` (tests, code); its replicas on Ray are HF
            replicas built from the policy it returns.

    Raises:
        ConfigError: the combinations of :func:`placement_errors`.
    """
    if errors := placement_errors(evolvers, model.backend if model is not None else None):
        raise ConfigError(errors[0])
    from coevo.backends.factory import PolicyFactory

    if policy_factory is None and model is not None:
        policy_factory = PolicyFactory(model, lora_needs(evolvers))
    on_ray = [(n, p) for n, p in _placed(evolvers) if p.workers >= 1]
    if not on_ray:
        return InProcess(policy_factory)
    from coevo.placement.ray import RayHF, RayVLLM

    name, params = on_ray[0]
    if isinstance(policy_factory, PolicyFactory) and policy_factory.model.backend == "vllm":
        return RayVLLM(f"evolvers.{name}", params, params.replica_spec(), policy_factory.model)
    return RayHF(f"evolvers.{name}", params, params.replica_spec(), policy_factory)


def replay_model(model: ModelConfig) -> ModelConfig:
    """The model section to rebuild a run's weights in this process (``coevo es replay`` / ``export``): HF,
    whatever engine the run sampled with (the ES math and the noise are the same on both,
    tests/test_vllm_cpu.py), in the run's dtype (``config.yaml``)."""
    return model.model_copy(update={"backend": "hf"}) if model.backend in ("vllm", "auto") else model

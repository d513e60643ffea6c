"""Rollouts: how a policy is evaluated on a task, producing scored trajectories.

The ES evolver perturbs the policy's weights, asks its rollout for trajectories, and turns them into one
scalar reward per population member. Rollouts are registered by name (``rollout: {type: countdown}``); every
module of this package is a built-in rollout: ``target_logprob`` (:mod:`.logprob`), ``countdown`` /
arithmetic (:mod:`.countdown`), ``eoh_children`` (:mod:`.eoh_children`, heuristic design) and ``web``
(:mod:`.web`, browser episodes).
"""

from coevo.rollouts.base import (
    Rollout,
    RolloutConfig,
    build_rollout,
    register_rollout,
    registered_rollouts,
    resolve_rollout,
)

__all__ = ["Rollout", "RolloutConfig", "build_rollout", "register_rollout", "registered_rollouts", "resolve_rollout"]

"""Rollouts: how a policy is evaluated on a task, producing scored trajectories.

The ES evolver perturbs the policy's weights, asks its rollout for trajectories, and turns them into one
scalar reward per population member. Rollouts are registered by name (``rollout: {type: countdown}``).
"""

from coevo.rollouts.base import Rollout, RolloutConfig, register_rollout, resolve_rollout

__all__ = ["Rollout", "RolloutConfig", "register_rollout", "resolve_rollout"]

"""Placement: where a run's model replicas live (in-process; HF replicas on Ray; vLLM engines on Ray), decided
once per run by :func:`choose_placement` and handed to the evolvers as ``ctx.placement``. The interface is
:class:`Placement` (:mod:`coevo.placement.base`); docs/es.md ("Placement") and docs/extending.md show it in use.
"""

from coevo.placement.base import InProcess, Placement, PlacementFields, ReplicaSpec, RolloutJob
from coevo.placement.choice import check_placement, choose_placement, lora_needs, placement_errors, replay_model

__all__ = [
    "InProcess",
    "Placement",
    "PlacementFields",
    "ReplicaSpec",
    "RolloutJob",
    "check_placement",
    "choose_placement",
    "lora_needs",
    "placement_errors",
    "replay_model",
]

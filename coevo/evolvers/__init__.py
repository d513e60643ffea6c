"""Evolvers: the base class, the registry and the built-in evolvers (es, grpo_ahd, dpo_ahd, eoh, sample, hillclimb,
reevo, tune, trace2skill).

:class:`AHDEvolver` / :class:`AHDConfig` (the public base of heuristic-design evolvers,
:mod:`coevo.evolvers.ahd_common`) are imported on first use, so ``import coevo.evolvers`` stays light.
"""

from typing import Any

from coevo.evolvers.base import (
    Evolver,
    EvolverConfig,
    RunContext,
    StepReport,
    record_report_sections,
    register_evolver,
    registered_evolvers,
    resolve_evolver,
)

__all__ = [
    "AHDConfig",
    "AHDEvolver",
    "Evolver",
    "EvolverConfig",
    "RunContext",
    "StepReport",
    "record_report_sections",
    "register_evolver",
    "registered_evolvers",
    "resolve_evolver",
]


def __getattr__(name: str) -> Any:
    if name in ("AHDEvolver", "AHDConfig"):
        from coevo.evolvers import ahd_common

        return getattr(ahd_common, name)
    raise AttributeError(f"module 'coevo.evolvers' has no attribute {name!r}")

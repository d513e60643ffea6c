"""Evolvers: the base class, the registry and the built-in evolvers (es, eoh, sample, trace2skill)."""

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
    "Evolver",
    "EvolverConfig",
    "RunContext",
    "StepReport",
    "record_report_sections",
    "register_evolver",
    "registered_evolvers",
    "resolve_evolver",
]

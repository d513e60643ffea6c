"""Automatic heuristic design (AHD) problems: interfaces, instances, references and evaluation.

Problems live in ``heuristics/<name>/problem.py`` and are loaded with :func:`load_problem`.
"""

from coevo.ahd.instances import (
    InstanceSet,
    load_bpp_json,
    load_cvrplib,
    load_eoh_tsp_npz,
    load_tsplib,
)
from coevo.ahd.problem import (
    HeuristicProblem,
    available_problems,
    heuristics_root,
    load_problem,
    register_problem,
    run_target,
)
from coevo.ahd.references import gap_percent

__all__ = [
    "HeuristicProblem",
    "InstanceSet",
    "available_problems",
    "gap_percent",
    "heuristics_root",
    "load_bpp_json",
    "load_cvrplib",
    "load_eoh_tsp_npz",
    "load_problem",
    "load_tsplib",
    "register_problem",
    "run_target",
]

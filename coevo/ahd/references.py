"""Reference solvers for the optimality gap, and their on-disk cache.

Every gap coevo reports names its reference, so a user can tell what it is measured against:

- TSP: LKH (Helsgaun 2000, 2017) through ``elkai`` -- near-optimal; on small instances it is the optimum in
  practice. Distances are scaled by :data:`TSP_SCALE` (less when the largest scaled distance would pass
  :data:`LKH_MAX_COST`, LKH's costs being C ints multiplied by its PRECISION 100) and rounded to integers
  for LKH; the tour it returns is measured on the original float matrix.
- KP: exact 0-1 knapsack with OR-Tools' branch-and-bound knapsack solver on values and weights scaled by
  :data:`KP_SCALE`: values rounded, weights rounded *up* and the capacity rounded *down*, so the returned
  set is always feasible for the float instance and optimal up to that 1e-6 rounding. The reference value
  is the float value of the returned set.
- CVRP: OR-Tools routing with guided local search under a time limit -- a strong heuristic, not an optimum.
- BPP: the L1 lower bound ``ceil(sum(items) / C)`` (Martello and Toth 1990), as FunSearch's reports.

References are cached as JSON in ``$COEVO_CACHE/references/<problem>/<key>.json`` (default
``~/.cache/coevo``), keyed by the instance set's content hash and the solver settings, since LKH on 64 x
TSP200 or GLS on 64 x CVRP100 takes minutes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from coevo.ahd.instances import InstanceSet

TSP_SCALE = 1e6
LKH_MAX_COST = 1e7
KP_SCALE = 1e6
CVRP_SCALE = 1e4


def cache_dir() -> Path:
    """``$COEVO_CACHE/references`` (default ``~/.cache/coevo/references``)."""
    root = os.environ.get("COEVO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "coevo")
    return Path(root) / "references"


def cached_reference(
    instances: InstanceSet, solver_id: str, solve_one: Callable[[dict[str, np.ndarray]], float]
) -> np.ndarray:
    """Per-instance reference objectives, computed once per (instances, solver) and cached on disk.

    Args:
        instances: the instance set.
        solver_id: a string naming the solver and every setting that changes its output
            (e.g. ``"lkh-runs10"``); part of the cache key.
        solve_one: maps one instance's arrays to its reference objective (float).

    Returns:
        float64 array of shape (len(instances),).
    """
    path = cache_dir() / instances.problem / f"{solver_id}-{instances.content_hash()[:32]}.json"
    if path.is_file():
        try:
            values = json.loads(path.read_text())["values"]
            if len(values) == len(instances):
                return np.asarray(values, dtype=np.float64)
        except (ValueError, KeyError):
            pass  # a torn or foreign file: recompute and overwrite it below
    values = [float(solve_one(inst)) for inst in instances]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"solver": solver_id, "names": instances.names, "values": values}))
    os.replace(tmp, path)
    return np.asarray(values, dtype=np.float64)


def tour_length(distances: np.ndarray, tour: list[int] | np.ndarray) -> float:
    """Length of a closed tour. distances (n, n); tour: node order, closed or not (closed automatically)."""
    t = np.asarray(tour, dtype=np.int64)
    if t[0] != t[-1]:
        t = np.append(t, t[0])
    return float(distances[t[:-1], t[1:]].sum())


def lkh_tour_length(distances: np.ndarray, runs: int = 10) -> float:
    """Tour length of LKH's tour (elkai) on a symmetric distance matrix (n, n), n >= 3.

    Distances are multiplied by :data:`TSP_SCALE` (capped by :data:`LKH_MAX_COST`) and rounded for LKH's
    integer costs; the length is measured on the given float matrix.
    """
    import elkai

    n = distances.shape[0]
    if n < 3:
        return tour_length(distances, list(range(n)) + [0]) if n else 0.0
    distances = np.asarray(distances, dtype=np.float64)
    scale = min(TSP_SCALE, LKH_MAX_COST / max(float(distances.max()), 1e-12))
    scaled = np.rint(distances * scale).astype(np.int64)
    tour = elkai.DistanceMatrix(scaled.tolist()).solve_tsp(runs=runs)
    return tour_length(distances, tour)


def knapsack_optimum(weights: np.ndarray, values: np.ndarray, capacity: float) -> float:
    """Exact 0-1 knapsack value (OR-Tools branch and bound on the :data:`KP_SCALE`-scaled instance).

    Args:
        weights, values: (n,) float, positive.
        capacity: float.

    Returns:
        Total float value of the optimal (scaled) item set, which is feasible for the float instance.
    """
    from ortools.algorithms.python import knapsack_solver

    w = np.ceil(np.asarray(weights, dtype=np.float64) * KP_SCALE).astype(np.int64)
    v = np.rint(np.asarray(values, dtype=np.float64) * KP_SCALE).astype(np.int64)
    cap = math.floor(float(capacity) * KP_SCALE)
    solver = knapsack_solver.KnapsackSolver(
        knapsack_solver.SolverType.KNAPSACK_MULTIDIMENSION_BRANCH_AND_BOUND_SOLVER, "kp_reference"
    )
    solver.init(v.tolist(), [w.tolist()], [cap])
    solver.solve()
    chosen = [i for i in range(len(v)) if solver.best_solution_contains(i)]
    if np.asarray(weights)[chosen].sum() > capacity + 1e-9:
        raise RuntimeError("knapsack reference returned an infeasible set (scaling error)")
    return float(np.asarray(values, dtype=np.float64)[chosen].sum())


def cvrp_ortools_cost(distances: np.ndarray, demands: np.ndarray, capacity: int, time_limit_s: float = 1.0) -> float:
    """Total route length of OR-Tools routing (path-cheapest-arc start, guided local search, time limit).

    Args:
        distances: (n+1, n+1) float, node 0 is the depot.
        demands: (n+1,) int, demands[0] == 0.
        capacity: vehicle capacity (int); one vehicle per customer is available.
        time_limit_s: search time limit (s).

    Returns:
        Total float length of the routes found. Raises RuntimeError if no solution was found.
    """
    from ortools.constraint_solver import pywrapcp, routing_enums_pb2

    n = distances.shape[0]
    scaled = np.rint(np.asarray(distances, dtype=np.float64) * CVRP_SCALE).astype(np.int64)
    demand_list = [int(d) for d in demands]
    vehicles = max(1, n - 1)
    manager = pywrapcp.RoutingIndexManager(n, vehicles, 0)
    routing = pywrapcp.RoutingModel(manager)

    def arc(i: int, j: int) -> int:
        return int(scaled[manager.IndexToNode(i), manager.IndexToNode(j)])

    transit = routing.RegisterTransitCallback(arc)
    routing.SetArcCostEvaluatorOfAllVehicles(transit)
    demand_cb = routing.RegisterUnaryTransitCallback(lambda i: demand_list[manager.IndexToNode(i)])
    routing.AddDimensionWithVehicleCapacity(demand_cb, 0, [int(capacity)] * vehicles, True, "load")
    params = pywrapcp.DefaultRoutingSearchParameters()
    params.first_solution_strategy = routing_enums_pb2.FirstSolutionStrategy.PATH_CHEAPEST_ARC
    params.local_search_metaheuristic = routing_enums_pb2.LocalSearchMetaheuristic.GUIDED_LOCAL_SEARCH
    params.time_limit.FromMilliseconds(int(time_limit_s * 1000))
    solution = routing.SolveWithParameters(params)
    if solution is None:
        raise RuntimeError("OR-Tools routing found no CVRP solution")
    total = 0.0
    for v in range(vehicles):
        idx = routing.Start(v)
        route = [0]
        while not routing.IsEnd(idx):
            idx = solution.Value(routing.NextVar(idx))
            route.append(manager.IndexToNode(idx))
        total += float(distances[route[:-1], route[1:]].sum())
    return total


def bpp_l1_bound(items: np.ndarray, capacity: int) -> float:
    """L1 lower bound on the number of bins: ceil(sum(items) / capacity) (integer sizes; exact ceil)."""
    total = int(np.asarray(items, dtype=np.int64).sum())
    return float(-(-total // int(capacity)))


def gap_percent(mean_objective: float, mean_reference: float, direction: str) -> float:
    """Gap to the reference in percent; positive means worse than the reference.

    minimize: (mean_obj - mean_ref) / mean_ref * 100; maximize: (mean_ref - mean_obj) / mean_ref * 100.
    For online BPP with the L1 bound this is the "excess bins" percentage of FunSearch / EoH.

    Raises:
        ValueError: unknown ``direction`` or a zero reference.
    """
    if mean_reference == 0:
        raise ValueError("mean_reference is 0: the gap is undefined")
    if direction == "minimize":
        return (mean_objective - mean_reference) / abs(mean_reference) * 100.0
    if direction == "maximize":
        return (mean_reference - mean_objective) / abs(mean_reference) * 100.0
    raise ValueError(f"direction must be 'minimize' or 'maximize', got {direction!r}")

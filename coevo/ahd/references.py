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

Besides the solvers, :data:`PUBLISHED_VALUES` lists what the peers (EoH, ReEvo, MCTS-AHD, CALM, FunSearch, the
seed paper) published per problem, each with the instance set it was measured on, for the report's
"published values" table (:func:`published_values`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
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
        time_limit_s: search time limit (s, wall clock); when no solution is found in it (seen on a 2-core machine
            under a load of 20+), the search runs once more with 10x the limit.

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
    solution = None
    for limit_s in (time_limit_s, 10 * time_limit_s):  # a loaded machine can miss the first solution in time
        params.time_limit.FromMilliseconds(int(limit_s * 1000))
        solution = routing.SolveWithParameters(params)
        if solution is not None:
            break
    if solution is None:
        raise RuntimeError(f"OR-Tools routing found no CVRP solution in {10 * time_limit_s:g} s")
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


@dataclass(frozen=True)
class PublishedValue:
    """A value a peer published for a heuristic (or a method's best heuristic) on a named instance set.

    Attributes:
        problem: coevo's problem name (``tsp_construct``, ``kp_construct``, ``cvrp_construct``, ``bpp_online``).
        method: what was measured (a heuristic or a method's best heuristic, with its LLM where published).
        instances: the instance set, named so that a reader can find it (repository, file or generator, seed).
        size: items / nodes / customers per instance.
        value: the published number, in ``unit``.
        unit: what ``value`` is (the problem's objective, or a gap in percent).
        source: where the number is printed (paper table or repository file).
        comparable: how coevo's own instances of that size compare with ``instances`` (same distribution and
            capacity, or how they differ): a published value is never on a run's own instances.
        peer_set: a key of :data:`PEER_SETS` when coevo regenerates ``instances`` exactly from the peer's own
            generator (the report then evaluates the run's seed and best heuristics on them), else None.
    """

    problem: str
    method: str
    instances: str
    size: int
    value: float
    unit: str
    source: str
    comparable: str
    peer_set: str | None = None


def mcts_ahd_kp_sets() -> dict[str, np.ndarray]:
    """MCTS-AHD's KP data sets, regenerated with its ``problems/kp_constructive/gen_inst.py`` (zz1358m/MCTS-AHD-master
    at ee9c4f4: ``np.random.seed(3333)``, then ``rand(64, n, 2)`` for train100 and val50/100/200, ``rand(1000, n, 2)``
    for test50/100/200), each ``(instances, n, 2)`` float64 with column 0 the weights and column 1 the values.
    Bit for bit the published ``dataset/*.npy`` files: :data:`MCTS_AHD_KP_SHA256` holds their checksums
    (test500, generated last, is left out: the repository's copy is not stored)."""
    rng = np.random.RandomState(3333)  # the legacy global generator np.random.seed seeds
    sets = {"train100": rng.rand(64, 100, 2)}
    for n in (50, 100, 200):
        sets[f"val{n}"] = rng.rand(64, n, 2)
    for n in (50, 100, 200):
        sets[f"test{n}"] = rng.rand(1000, n, 2)
    return sets


#: sha256 of MCTS-AHD's ``problems/kp_constructive/dataset/<name>_dataset.npy`` (commit ee9c4f4)
MCTS_AHD_KP_SHA256 = {
    "train100": "5d322c52542fc643d88c2e163f54384d66062713e248cf093c7258a2a6a11b6b",
    "val50": "757b02e5e7ed55bc5b29441cfa0cca9302eeb055ed55b2ca79a00500f60fc901",
    "val100": "4c7ea3539f4420350a8c3fb84f8edea57f1bc7b8a6df3389c3184c17d53523b1",
    "val200": "03d2d9c956e0e3058d2b8273a157b9f921bfd933c0a69838fb10cab93165d5df",
    "test50": "554c4d0856b022ee98d8e0021f9327e6c2cf53f6256aa0f2ce6cfb2bc246fed9",
    "test100": "196567c13f06acaa5b59e9b3b832bdc9aaee2f36d8bbae347a1ac7bfded071ed",
    "test200": "794f65ed506a281fdc5151a8b5487452defbfd4b2c3e59a3c17f3f09b962ac09",
}


def kp_instance_set(data: np.ndarray, name: str) -> InstanceSet:
    """An MCTS-AHD-layout KP array ``(count, n, 2)`` (weights, values) as a ``kp_construct`` InstanceSet with
    MCTS-AHD's capacity (12.5 for n = 50, else 25)."""
    n = data.shape[1]
    cap = np.array(12.5 if n == 50 else 25.0)
    arrays = [{"weights": x[:, 0].copy(), "values": x[:, 1].copy(), "capacity": cap} for x in data]
    return InstanceSet("kp_construct", [f"{name}_{i}" for i in range(len(data))], arrays, f"MCTS-AHD KP {name}")


def eoh_cvrp_example_set(count: int = 16) -> InstanceSet:
    """EoH's CVRP example instances (FeiLiu36/EoH ``examples/cvrp_construct/get_instance.py`` at 64b1a49:
    ``np.random.seed(2024)``; per instance ``rand(51, 2)`` coordinates, ``randint(1, 10, 51)`` demands with the
    depot's set to 0, capacity 40) as a ``cvrp_construct`` InstanceSet; ``count`` 16 is its training set."""
    rng = np.random.RandomState(2024)
    arrays = []
    for _ in range(count):
        coords = rng.rand(51, 2)
        demands = rng.randint(1, 10, size=51).astype(np.int64)
        demands[0] = 0
        dist = np.linalg.norm(coords[:, np.newaxis] - coords, axis=2)
        arrays.append({"coords": coords, "demands": demands, "distances": dist, "capacity": np.array(40, np.int64)})
    return InstanceSet(
        "cvrp_construct", [f"eoh_cvrp50_{i}" for i in range(count)], arrays, "EoH cvrp_construct example"
    )


#: peer instance sets coevo regenerates exactly: key -> builder of the InstanceSet
PEER_SETS: dict[str, Callable[[], InstanceSet]] = {
    "mcts_ahd_kp_train100": lambda: kp_instance_set(mcts_ahd_kp_sets()["train100"], "train100"),
    "eoh_cvrp_example": eoh_cvrp_example_set,
}


_KP_SET = "MCTS-AHD KP train100: 64 instances, w, v ~ U(0,1), C = 25, np.random.seed(3333) (gen_inst.py)"
_KP_SAME = "same distribution and capacity as coevo's KP100; other instances"
_EOH_CVRP = "EoH cvrp_construct example: 16 instances, 50 customers, C = 40, np.random.seed(2024) (get_instance.py)"
_CVRP_SAME = "same distribution (Kool et al.) and capacity 40 as coevo's CVRP50; other instances"
_REEVO_TSP = "ReEvo's TSP test sets (64 instances per size, uniform [0,1]^2)"
_TSP_SAME = "same distribution as coevo's TSP instances; other instances"

#: The peers' published values per problem; docs/references.md §2 and heuristics/<problem>/published/ cite
#: the same sources. Values marked "reproduced" in ``source`` were recomputed by coevo's evaluator on the
#: peer's own instances (benchmarks/published_values.py for BPP, benchmarks/published_seeds.py for KP and CVRP).
PUBLISHED_VALUES: tuple[PublishedValue, ...] = (
    *(
        PublishedValue("tsp_construct", m, _REEVO_TSP, n, v, "mean tour length", src, _TSP_SAME)
        for m, src, vals in (
            (
                "nearest neighbour",
                "ReEvo stored test results (ai4co/reevo, NeurIPS 2024)",
                (4.4466, 6.8919, 9.6508, 13.4248),
            ),
            (
                "ReEvo's best heuristic",
                "ReEvo, NeurIPS 2024, Table 1 / stored test results",
                (4.0906, 6.2269, 8.5676, 12.0927),
            ),
        )
        for n, v in zip((20, 50, 100, 200), vals)
    ),
    *(
        PublishedValue("tsp_construct", m, "MCTS-AHD's TSP test sets", n, v, "gap % to the optimum", src, _TSP_SAME)
        for m, src, vals in (
            (
                "MCTS-AHD's best heuristic (GPT-4o-mini)",
                "as quoted by CALM (ICLR 2026); secondary source",
                (9.69, 11.79, 13.71),
            ),
            (
                "CALM's best heuristic (Qwen2.5-7B, GRPO)",
                "CALM, ICLR 2026 (arXiv 2505.12285); secondary source",
                (10.04, 11.58, 13.41),
            ),
        )
        for n, v in zip((50, 100, 200), vals)
    ),
    PublishedValue(
        "tsp_construct",
        "EoH + full-parameter ES (Llama-3.1-8B), mean of 20 runs; EoH alone: 6.5517",
        "the seed paper's TSP50 training set (zz1358m/Agentic-ESOpt data/ahd/datasets/tsp_constructive)",
        50,
        6.5007,
        "mean tour length",
        "Agentic ESOpt (arXiv 2608.17310), AHD results",
        _TSP_SAME,
    ),
    PublishedValue(
        "kp_construct",
        "EoH + full-parameter ES (Llama-3.1-8B); EoH alone: 40.1562",
        _KP_SET,
        100,
        40.1578,
        "mean total value",
        "Agentic ESOpt (arXiv 2608.17310), AHD results",
        _KP_SAME,
        "mcts_ahd_kp_train100",
    ),
    PublishedValue(
        "kp_construct",
        "the seed paper's best KP heuristic (published/agentic_esopt.py)",
        _KP_SET,
        100,
        40.16268,
        "mean total value",
        "zz1358m/Agentic-ESOpt results/EoH+AgenticESOpt2000/KP_construct (header); reproduced: 40.16268",
        _KP_SAME,
        "mcts_ahd_kp_train100",
    ),
    PublishedValue(
        "kp_construct",
        "optimum (OR-Tools knapsack B&B, values and weights x 1e4, truncated)",
        _KP_SET,
        100,
        40.187953125,
        "mean total value",
        "zz1358m/MCTS-AHD-master problems/kp_constructive/ortools.py (comment)",
        _KP_SAME,
        "mcts_ahd_kp_train100",
    ),
    PublishedValue(
        "cvrp_construct",
        "nearest feasible neighbour",
        _EOH_CVRP,
        50,
        13.61078,
        "mean total route length",
        "FeiLiu36/EoH examples/cvrp_construct/results/run_log.txt; reproduced: 13.61078",
        _CVRP_SAME,
        "eoh_cvrp_example",
    ),
    PublishedValue(
        "cvrp_construct",
        "EoH's best heuristic (DeepSeek-chat, 20 generations; published/eoh.py)",
        _EOH_CVRP,
        50,
        13.23735,
        "mean total route length",
        "FeiLiu36/EoH examples/cvrp_construct/results (run_log.txt, pops_best); reproduced: 13.23735",
        _CVRP_SAME,
        "eoh_cvrp_example",
    ),
    *(
        PublishedValue("bpp_online", m, inst, n, v, "excess bins % over the L1 bound", src, cmp)
        for m, inst, n, v, src, cmp in (
            (
                "Best Fit",
                "OR3 (20 x 500 items, C = 150)",
                500,
                5.37,
                "FunSearch bin_packing.ipynb; reproduced: 5.37",
                "other distribution (OR-Library u500) and capacity than coevo's Weibull instances",
            ),
            (
                "FunSearch's heuristic (OR3)",
                "OR3 (20 x 500 items, C = 150)",
                500,
                3.11,
                "FunSearch, Nature 2024",
                "other distribution (OR-Library u500) and capacity than coevo's Weibull instances",
            ),
            (
                "Best Fit",
                "Weibull 5k (5 x 5000 items, C = 100)",
                5000,
                3.98,
                "FunSearch bin_packing.ipynb; reproduced: 3.98",
                "same distribution and capacity as coevo's bpp_online instances; other instances",
            ),
            (
                "FunSearch's heuristic (Weibull; published/funsearch_weibull.py)",
                "Weibull 5k (5 x 5000 items, C = 100)",
                5000,
                0.68,
                "FunSearch, Nature 2024",
                "same distribution and capacity as coevo's bpp_online instances; other instances",
            ),
        )
    ),
)


def published_values(problem: str) -> list[PublishedValue]:
    """The entries of :data:`PUBLISHED_VALUES` for ``problem`` (empty for a problem no peer published)."""
    return [v for v in PUBLISHED_VALUES if v.problem == problem]

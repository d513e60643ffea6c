"""TSP, constructive: build a tour node by node with ``select_next_node`` (EoH / ReEvo interface).

Interface (EoH, Liu et al. ICML 2024; numpy arrays as EoH passes them)::

    select_next_node(current_node: int, destination_node: int,
                     unvisited_nodes: np.ndarray[int64] (k,), distance_matrix: np.ndarray[float64] (n, n)) -> int

The tour starts at node 0, the heuristic is called n-1 times (also when one node is left), and the tour
closes back at node 0 (``destination_node``). Each call gets fresh writable copies of ``unvisited_nodes``
and ``distance_matrix`` (ReEvo's ``eval.py`` passes ``distance_matrix=dist_mat.copy()``; EoH passes the same
array every step), and the length is computed from the evaluator's own matrix. Returning an int outside [0, n) or a non-int is an
InvalidReturn; returning a node already visited (or the current node) is an InfeasibleSolution.

Instances: n nodes uniform in [0, 1]^2, Euclidean distances (EoH; ReEvo's TSP20/50/100/200 test sizes).
Reference: LKH via elkai (10 runs), or the TSPLIB optimum for TSPLIB files listed in tsplib_optima.json.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from coevo.ahd.instances import InstanceSet, euclidean_matrix, load_tsplib
from coevo.ahd.problem import HeuristicProblem, int_sequence, read_only, register_problem
from coevo.ahd.references import lkh_tour_length, tour_length
from coevo.sandbox.errors import InfeasibleSolution

HERE = Path(__file__).resolve().parent


@register_problem
class TSPConstruct(HeuristicProblem):
    """Constructive TSP (minimise the closed tour length, same units as the distance matrix)."""

    name = "tsp_construct"
    function_name = "select_next_node"
    direction = "minimize"
    objective_name = "tour length"
    task_description = (
        "Given n cities and the distances between them, find a shortest closed tour that visits every city "
        "exactly once and returns to the start city. The tour is built one step at a time: at each step, "
        "from the current city, choose which unvisited city to visit next. Design a novel rule for choosing "
        "the next city."
    )
    func_inputs = ("current_node", "destination_node", "unvisited_nodes", "distance_matrix")
    func_outputs = ("next_node",)
    sizes = (20, 50, 100, 200)
    default_size = 50
    min_size = 3
    default_count = 64
    reference_name = "LKH (elkai, 10 runs)"
    instance_fields = ("distances",)
    lkh_runs = 10

    def generate(self, size: int, count: int, seed: int) -> InstanceSet:
        """``count`` instances of ``size`` nodes uniform in [0, 1]^2 (``np.random.default_rng(seed)``)."""
        self.check_args(size, count, seed, cells_per_instance=size * size)
        coords = np.random.default_rng(seed).random((count, size, 2))
        arrays = [{"coords": c, "distances": euclidean_matrix(c)} for c in coords]
        names = [f"tsp{size}_s{seed}_{i}" for i in range(count)]
        return InstanceSet(self.name, names, arrays, f"uniform[0,1]^2 n={size} seed={seed}")

    construct_file = "construct.py"

    def construct_args(self, arrays):
        return (read_only(np.asarray(arrays["distances"], dtype=np.float64)),)

    def score_solution(self, arrays, solution):
        """The tour's closed length on the evaluator's matrix; InfeasibleSolution unless it is a permutation
        of the n nodes starting at node 0."""
        dist = np.asarray(arrays["distances"], dtype=np.float64)
        n = dist.shape[0]
        tour = int_sequence(solution, "tour", n, n)
        if len(tour) != n or tour[0] != 0 or len(set(tour)) != n:
            raise InfeasibleSolution(
                f"the tour is not a permutation of the {n} nodes starting at node 0 "
                f"(length {len(tour)}, {len(set(tour))} distinct)"
            )
        return tour_length(dist, tour + [0])

    def reference_one(self, arrays):
        return lkh_tour_length(np.asarray(arrays["distances"], dtype=np.float64), runs=self.lkh_runs)

    def reference_solver_id(self) -> str:
        return f"lkh-runs{self.lkh_runs}"

    def load_instances(self, path: str | os.PathLike) -> InstanceSet:
        """An InstanceSet / EoH ``.npz``, a TSPLIB ``.tsp`` file, or a folder of ``.tsp`` files (optima
        from this folder's ``tsplib_optima.json`` or ``$COEVO_TSPLIB_OPTIMA``)."""
        path = Path(path)
        optima = os.environ.get("COEVO_TSPLIB_OPTIMA") or HERE / "tsplib_optima.json"
        if path.is_dir():
            files = sorted(path.glob("*.tsp"))
            if not files:
                raise ValueError(f"no .tsp files in {path}")
            return load_tsplib(files, optima)
        if path.suffix == ".tsp":
            return load_tsplib([path], optima)
        return super().load_instances(path)

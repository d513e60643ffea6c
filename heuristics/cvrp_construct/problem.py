"""CVRP, constructive: build routes node by node with ``select_next_node`` (LLM4AD / ReEvo interface).

Interface::

    select_next_node(current_node: int, depot: int, unvisited_nodes: np.ndarray[int64] (k,),
                     rest_capacity: int, demands: np.ndarray[int64] (n+1,),
                     distance_matrix: np.ndarray[float64] (n+1, n+1)) -> int

Node 0 is the depot (demand 0); customers are 1..n. ``unvisited_nodes`` lists ALL customers not yet served,
including those whose demand exceeds ``rest_capacity``: respecting the capacity is the heuristic's job and
is checked (the reference frameworks never checked it, so a heuristic ignoring capacity "won").

Rules: a route starts at the depot with the full capacity. The heuristic returns an unvisited customer
whose demand fits ``rest_capacity`` (visit it) or the depot (close the route; not allowed while already at
the depot). When no unvisited customer fits, the vehicle returns to the depot without asking the
heuristic; when all customers are served, it returns to the depot and the solution is complete. So the
heuristic is called at most 2n times. A non-int, an index out of range, or the depot while at the depot is
an InvalidReturn; a served customer or a demand above the remaining load is an InfeasibleSolution.

Each call gets fresh writable copies of the arrays; the route length is computed from the evaluator's own.

Objective: total route length (minimise). Instances: Kool et al. 2019 ("Attention, learn to solve routing
problems!", ICLR), also used by LLM4AD / ReEvo: depot and n customers uniform in [0, 1]^2, demands
uniform in {1..9}, capacity 30 / 40 / 50 for n = 20 / 50 / 100 (LLM4AD uses 40 at n = 50, ReEvo 50).
Reference: OR-Tools routing, guided local search, 1 s per instance -- a strong heuristic, not an optimum.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np

from coevo.ahd.instances import InstanceSet, euclidean_matrix, load_cvrplib
from coevo.ahd.problem import HeuristicProblem, int_sequence, read_only, register_problem
from coevo.ahd.references import cvrp_ortools_cost
from coevo.sandbox.errors import InfeasibleSolution

CAPACITY_BY_SIZE = {20: 30, 50: 40, 100: 50}


@register_problem
class CVRPConstruct(HeuristicProblem):
    """Constructive capacitated vehicle routing (minimise the total length of all routes)."""

    name = "cvrp_construct"
    function_name = "select_next_node"
    direction = "minimize"
    objective_name = "total route length"
    task_description = (
        "Vehicles with a limited capacity start and end at a depot and must serve every customer exactly "
        "once; each customer has a demand, and the demands served on one route must not exceed the capacity. "
        "Find routes of minimum total length. Routes are built one step at a time: from the current node, "
        "with the remaining load, choose the next customer to serve (its demand must fit) or return to the "
        "depot to start a new route. Design a novel rule for choosing the next node."
    )
    func_inputs = ("current_node", "depot", "unvisited_nodes", "rest_capacity", "demands", "distance_matrix")
    func_outputs = ("next_node",)
    sizes = (20, 50, 100)
    default_size = 50
    default_count = 64
    reference_name = "OR-Tools routing GLS 1 s (heuristic reference, not optimal)"
    reference_time_limit_s = 1.0
    instance_fields = ("distances", "demands", "capacity")

    def generate(self, size: int, count: int, seed: int, capacity: int | None = None) -> InstanceSet:
        """``count`` instances with ``size`` customers (``default_rng(seed)``); ``capacity`` defaults to
        :data:`CAPACITY_BY_SIZE` (ValueError for another size without one)."""
        self.check_args(size, count, seed, cells_per_instance=(size + 1) ** 2)
        if capacity is None:
            if size not in CAPACITY_BY_SIZE:
                raise ValueError(
                    f"cvrp_construct: size {size} has no standard capacity ({CAPACITY_BY_SIZE}); pass capacity="
                )
            capacity = CAPACITY_BY_SIZE[size]
        if capacity < 9:
            raise ValueError(f"cvrp_construct: capacity must be >= 9 (the largest demand), got {capacity}")
        rng = np.random.default_rng(seed)
        arrays = []
        for _ in range(count):
            coords = rng.random((size + 1, 2))
            demands = np.concatenate([[0], rng.integers(1, 10, size)]).astype(np.int64)
            arrays.append(
                {
                    "coords": coords,
                    "demands": demands,
                    "distances": euclidean_matrix(coords),
                    "capacity": np.array(capacity, dtype=np.int64),
                }
            )
        names = [f"cvrp{size}_s{seed}_{i}" for i in range(count)]
        return InstanceSet(self.name, names, arrays, f"Kool2019 n={size} C={capacity} seed={seed}")

    construct_file = "construct.py"

    def construct_args(self, arrays):
        dist = np.asarray(arrays["distances"], dtype=np.float64)
        demands = np.asarray(arrays["demands"], dtype=np.int64)
        capacity = int(arrays["capacity"])
        if demands[1:].max(initial=0) > capacity:
            raise ValueError(f"instance has a demand above the capacity {capacity}")
        return read_only(dist), read_only(demands), capacity

    def score_solution(self, arrays, solution):
        """Total length of the routes on the evaluator's matrix; InfeasibleSolution unless the sequence
        starts and ends at the depot, serves every customer exactly once, has no empty route and no
        route whose demand exceeds the capacity."""
        dist = np.asarray(arrays["distances"], dtype=np.float64)
        demands = np.asarray(arrays["demands"], dtype=np.int64)
        capacity = int(arrays["capacity"])
        n = dist.shape[0]
        seq = int_sequence(solution, "routes", n, 2 * n + 1)
        customers = [v for v in seq if v != 0]
        if len(seq) < 2 or seq[0] != 0 or seq[-1] != 0 or sorted(customers) != list(range(1, n)):
            raise InfeasibleSolution(
                f"the routes must start and end at the depot and serve each of the {n - 1} customers exactly once"
            )
        total, load = 0.0, 0
        for a, b in itertools.pairwise(seq):  # the same order of float additions as the construction loop
            if a == 0 and b == 0:
                raise InfeasibleSolution("an empty route (depot to depot)")
            load = 0 if b == 0 else load + int(demands[b])
            if load > capacity:
                raise InfeasibleSolution(f"a route carries {load} > capacity {capacity}: capacity violated")
            total += dist[a, b]
        return total

    def reference_one(self, arrays):
        return cvrp_ortools_cost(
            np.asarray(arrays["distances"], dtype=np.float64),
            arrays["demands"],
            int(arrays["capacity"]),
            self.reference_time_limit_s,
        )

    def reference_solver_id(self) -> str:
        return f"ortools-gls-{self.reference_time_limit_s:g}s"

    def load_instances(self, path: str | os.PathLike) -> InstanceSet:
        """An InstanceSet ``.npz``, a CVRPLIB ``.vrp`` file, or a folder of ``.vrp`` files."""
        path = Path(path)
        if path.is_dir():
            files = sorted(path.glob("*.vrp"))
            if not files:
                raise ValueError(f"no .vrp files in {path}")
            return load_cvrplib(files)
        if path.suffix == ".vrp":
            return load_cvrplib([path])
        return super().load_instances(path)

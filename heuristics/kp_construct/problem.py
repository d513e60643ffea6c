"""0-1 knapsack, constructive: add items one at a time with ``select_next_item`` (MCTS-AHD interface).

Interface (MCTS-AHD form, chosen over LLM4AD's list-of-tuples form because it is vectorisable)::

    select_next_item(remaining_capacity: float, weights: np.ndarray[float64] (k,),
                     values: np.ndarray[float64] (k,)) -> int

``weights`` and ``values`` hold the k items NOT YET TAKEN, in their original order (taken items are
removed); the return value indexes into these arrays. Returning ``-1`` or ``None`` stops packing (a valid
solution: the items taken so far). The heuristic is called only while at least one remaining item fits,
and at most n times; it may edit its (copied) arrays in place. A non-int or an index outside [0, k) is an InvalidReturn; an item heavier than the
remaining capacity is an InfeasibleSolution.

Objective: total value, MAXIMISED (so an empty knapsack scores 0 and always loses to greedy -- the sign bug
of the reference frameworks cannot occur). Instances (MCTS-AHD, following the DeepACO / ReEvo KP sets):
weights and values ~ U(0, 1), capacity 12.5 for n = 50 and 25 for n = 100, 200.
Reference: exact optimum (OR-Tools knapsack branch and bound, see coevo.ahd.references).
"""

from __future__ import annotations

import numpy as np

from coevo.ahd.instances import InstanceSet
from coevo.ahd.problem import HeuristicProblem, int_sequence, read_only, register_problem
from coevo.ahd.references import knapsack_optimum
from coevo.sandbox.errors import InfeasibleSolution

CAPACITY_BY_SIZE = {50: 12.5, 100: 25.0, 200: 25.0}


@register_problem
class KPConstruct(HeuristicProblem):
    """Constructive 0-1 knapsack (maximise the total value of the packed items)."""

    name = "kp_construct"
    function_name = "select_next_item"
    direction = "maximize"
    objective_name = "total value"
    task_description = (
        "Given items with weights and values and a knapsack of limited capacity, choose items so that their "
        "total weight fits the capacity and their total value is as large as possible. Items are added one "
        "at a time: at each step you see the remaining capacity and the weights and values of the items not "
        "taken yet, and return the index of the next item to add (one that fits), or -1 to stop. Design a "
        "novel rule for choosing the next item."
    )
    func_inputs = ("remaining_capacity", "weights", "values")
    func_outputs = ("next_item",)
    sizes = (50, 100, 200)
    default_size = 100
    default_count = 64
    reference_name = "exact optimum (OR-Tools knapsack B&B, 1e-6 scaling)"
    instance_fields = ("weights", "values", "capacity")
    time_exponent = 2.0  # n steps over at most n remaining items

    def generate(self, size: int, count: int, seed: int, capacity: float | None = None) -> InstanceSet:
        """``count`` instances with ``size`` items, weights and values ~ U(0, 1) (``default_rng(seed)``).

        ``capacity`` defaults to :data:`CAPACITY_BY_SIZE`; ValueError for another size without one.
        """
        self.check_args(size, count, seed, cells_per_instance=2 * size)
        if capacity is None:
            if size not in CAPACITY_BY_SIZE:
                raise ValueError(
                    f"kp_construct: size {size} has no standard capacity ({CAPACITY_BY_SIZE}); pass capacity="
                )
            capacity = CAPACITY_BY_SIZE[size]
        if not capacity > 0:
            raise ValueError(f"kp_construct: capacity must be > 0, got {capacity!r}")
        rng = np.random.default_rng(seed)
        arrays = []
        for _ in range(count):
            wv = rng.random((2, size))
            arrays.append({"weights": wv[0], "values": wv[1], "capacity": np.array(float(capacity))})
        names = [f"kp{size}_s{seed}_{i}" for i in range(count)]
        return InstanceSet(self.name, names, arrays, f"U(0,1) n={size} C={capacity} seed={seed}")

    construct_file = "construct.py"

    def construct_args(self, arrays):
        return (
            read_only(np.asarray(arrays["weights"], dtype=np.float64)),
            read_only(np.asarray(arrays["values"], dtype=np.float64)),
            float(arrays["capacity"]),
        )

    def score_solution(self, arrays, solution):
        """Total value of the chosen items, packed in the given order on the evaluator's weights;
        InfeasibleSolution for a repeated item or one that does not fit the remaining capacity."""
        weights = np.asarray(arrays["weights"], dtype=np.float64)
        values = np.asarray(arrays["values"], dtype=np.float64)
        n = weights.shape[0]
        items = int_sequence(solution, "chosen items", n, n)
        if len(set(items)) != len(items):
            raise InfeasibleSolution("an item is packed twice")
        rest, total = float(arrays["capacity"]), 0.0
        for item in items:  # the same order of float operations as the construction loop
            if weights[item] > rest:
                raise InfeasibleSolution(
                    f"item {item} of weight {weights[item]:.6g} exceeds the remaining capacity {rest:.6g}"
                )
            rest -= weights[item]
            total += values[item]
        return total

    def reference_one(self, arrays):
        return knapsack_optimum(arrays["weights"], arrays["values"], float(arrays["capacity"]))

    def reference_solver_id(self) -> str:
        return "ortools-kp-bb-scale1e6"

"""EoH's constructive CVRP heuristic, as published (DeepSeek-chat-written; the best of its example run).

Source: FeiLiu36/EoH ``examples/cvrp_construct/results/pops_best/population_generation_20.json`` at commit
64b1a49948622767e37e7026918636d9ee7e96dc (the best individual after 20 generations, objective 13.23735: mean
total route length on the example's 16 training instances, 50 customers, capacity 40, ``np.random.seed(2024)``;
nearest feasible neighbour scores 13.61078 there, ``results/run_log.txt``); Liu et al., "Evolution of
Heuristics", ICML 2024. Its thought: "selects the next customer by maximizing the product of the squared
distance from the depot and the inverse of the distance from the current node, weighted by the cube of the
remaining capacity fraction". Used by ``seed_heuristics: [eoh]``.

Interface adaptation (the one line marked below): EoH's example loop (``examples/cvrp_construct/prob.py``)
passes as ``unvisited_nodes`` only the unvisited customers whose demand fits the remaining load; coevo passes
every unvisited customer and leaves the capacity to the heuristic (heuristics/cvrp_construct/README.md). The
added first line filters them as EoH's loop does, so the heuristic sees what it saw upstream; both loops call
it only while some customer fits and return to the depot by themselves otherwise. The rest is upstream's.

Idea (the thought a prompt shows with this heuristic: EoH's own, quoted):
Selects the next customer by maximizing the product of the squared distance from the depot and the inverse
of the distance from the current node, weighted by the cube of the remaining capacity fraction.
"""
import numpy as np


def select_next_node(current_node: int, depot: int, unvisited_nodes: np.ndarray,
                     rest_capacity: float, demands: np.ndarray,
                     distance_matrix: np.ndarray) -> int:
    unvisited_nodes = unvisited_nodes[demands[unvisited_nodes] <= rest_capacity]  # coevo: EoH's feasible set
    if len(unvisited_nodes) == 0:
        return depot
    dist_current = distance_matrix[current_node][unvisited_nodes]
    dist_depot = distance_matrix[depot][unvisited_nodes]
    capacity_ratio = (rest_capacity / (np.max(demands[unvisited_nodes]) + 1e-10)) ** 3
    score = ((dist_depot ** 2) / (dist_current + 1e-10)) * capacity_ratio
    return unvisited_nodes[np.argmax(score)]

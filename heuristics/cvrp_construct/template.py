import numpy as np


def select_next_node(current_node, depot, unvisited_nodes, rest_capacity, demands, distance_matrix):
    """Choose the next node of the route (template: the first unvisited customer whose demand fits).

    Args:
        current_node: int, where the vehicle is.
        depot: int, the depot node (0).
        unvisited_nodes: np.ndarray (k,) int64, customers not yet served (a fresh copy per call).
        rest_capacity: int, load the vehicle can still take.
        demands: np.ndarray (n+1,) int64, demand per node, demands[depot] == 0 (a fresh copy per call).
        distance_matrix: np.ndarray (n+1, n+1) float64 (a fresh copy per call).

    Returns:
        int, an unvisited customer with demand <= rest_capacity, or ``depot`` to start a new route.
    """
    fits = unvisited_nodes[demands[unvisited_nodes] <= rest_capacity]
    return int(fits[0]) if len(fits) else depot

import numpy as np


def select_next_node(current_node, depot, unvisited_nodes, rest_capacity, demands, distance_matrix):
    """Largest demand first: among the customers that fit, serve the one with the largest demand (ties: the
    nearest); back to the depot when none fits.

    A textbook bin-packing-style rule for routing (sampler-test parent, coevo).
    """
    feasible = unvisited_nodes[demands[unvisited_nodes] <= rest_capacity]
    if feasible.size == 0:
        return depot
    order = np.lexsort((distance_matrix[current_node, feasible], -demands[feasible]))
    return int(feasible[order[0]])

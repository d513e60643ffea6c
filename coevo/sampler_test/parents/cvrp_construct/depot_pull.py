import numpy as np


def select_next_node(current_node, depot, unvisited_nodes, rest_capacity, demands, distance_matrix):
    """Depot pull: among the customers that fit, take the nearest, but as the load runs low prefer customers close
    to the depot, so the way back is short; back to the depot when none fits.

    A variant of capacity-aware nearest neighbour (sampler-test parent, coevo).
    """
    feasible = unvisited_nodes[demands[unvisited_nodes] <= rest_capacity]
    if feasible.size == 0:
        return depot
    full = 1.0 - rest_capacity / max(rest_capacity, demands.max() * 4)
    cost = distance_matrix[current_node, feasible] + 0.5 * full * distance_matrix[depot, feasible]
    return int(feasible[np.argmin(cost)])

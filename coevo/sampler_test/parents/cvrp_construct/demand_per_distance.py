import numpy as np


def select_next_node(current_node, depot, unvisited_nodes, rest_capacity, demands, distance_matrix):
    """Demand per distance: among the customers that fit, serve the one with the most demand per unit of distance
    from here; back to the depot when none fits.

    A savings-style variant of nearest neighbour (sampler-test parent, coevo).
    """
    feasible = unvisited_nodes[demands[unvisited_nodes] <= rest_capacity]
    if feasible.size == 0:
        return depot
    ratio = demands[feasible] / (distance_matrix[current_node, feasible] + 1e-9)
    return int(feasible[np.argmax(ratio)])

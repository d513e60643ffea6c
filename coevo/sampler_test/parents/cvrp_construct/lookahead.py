import numpy as np


def select_next_node(current_node, depot, unvisited_nodes, rest_capacity, demands, distance_matrix):
    """One-step lookahead: among the customers that fit, take the one minimising the distance to it plus the
    distance from it to its nearest other unvisited customer; back to the depot when none fits.

    A textbook variant of nearest neighbour (sampler-test parent, coevo).
    """
    feasible = unvisited_nodes[demands[unvisited_nodes] <= rest_capacity]
    if feasible.size == 0:
        return depot
    if unvisited_nodes.size == 1:
        return int(feasible[0])
    sub = distance_matrix[np.ix_(feasible, unvisited_nodes)].copy()
    sub[sub == 0] = np.inf
    onward = np.where(np.isfinite(sub.min(axis=1)), sub.min(axis=1), 0.0)
    return int(feasible[np.argmin(distance_matrix[current_node, feasible] + onward)])

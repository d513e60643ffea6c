import numpy as np


def select_next_node(current_node, depot, unvisited_nodes, rest_capacity, demands, distance_matrix):
    """Tight fill: among the customers that fit, trade distance against how well the demand uses the remaining
    load (a customer that empties the vehicle exactly ends the route with no wasted capacity); back to the
    depot when none fits.

    A variant of capacity-aware nearest neighbour (sampler-test parent, coevo).
    """
    feasible = unvisited_nodes[demands[unvisited_nodes] <= rest_capacity]
    if feasible.size == 0:
        return depot
    dist = distance_matrix[current_node, feasible]
    waste = (rest_capacity - demands[feasible]) / max(rest_capacity, 1)
    return int(feasible[np.argmin(dist / (dist.max() + 1e-9) + 0.3 * waste)])

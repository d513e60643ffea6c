import numpy as np


def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    """One-step lookahead: go to the node that minimises the distance to it plus the distance from it to its own
    nearest other unvisited node.

    A textbook variant of nearest neighbour (sampler-test parent, coevo).
    """
    if unvisited_nodes.size == 1:
        return int(unvisited_nodes[0])
    sub = distance_matrix[np.ix_(unvisited_nodes, unvisited_nodes)].copy()
    np.fill_diagonal(sub, np.inf)
    onward = sub.min(axis=1)
    return int(unvisited_nodes[np.argmin(distance_matrix[current_node, unvisited_nodes] + onward)])

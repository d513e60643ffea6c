import numpy as np


def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    """Regret nearest neighbour: among the three nearest unvisited nodes take the one whose second-best way in
    (its distance to its nearest other unvisited node) is longest: the node that is most costly to skip now.

    A regret rule as in regret insertion (sampler-test parent, coevo).
    """
    dist = distance_matrix[current_node, unvisited_nodes]
    if unvisited_nodes.size <= 2:
        return int(unvisited_nodes[np.argmin(dist)])
    near = np.argsort(dist)[:3]
    sub = distance_matrix[np.ix_(unvisited_nodes, unvisited_nodes)].copy()
    np.fill_diagonal(sub, np.inf)
    regret = sub[near].min(axis=1) - dist[near]
    return int(unvisited_nodes[near[np.argmax(regret)]])

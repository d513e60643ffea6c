import numpy as np


def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    """Outliers first: among close nodes prefer isolated ones (far, on average, from the other unvisited nodes),
    so that no remote node is left for the end.

    A textbook variant of nearest neighbour (sampler-test parent, coevo).
    """
    isolation = distance_matrix[np.ix_(unvisited_nodes, unvisited_nodes)].mean(axis=1)
    cost = distance_matrix[current_node, unvisited_nodes] - 0.3 * isolation
    return int(unvisited_nodes[np.argmin(cost)])

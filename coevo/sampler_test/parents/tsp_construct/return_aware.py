import numpy as np


def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    """Return-aware nearest neighbour: prefer close nodes, and late in the tour nodes close to the destination,
    so the tour does not end far from where it must close.

    A textbook variant of nearest neighbour (sampler-test parent, coevo).
    """
    n = distance_matrix.shape[0]
    progress = 1.0 - unvisited_nodes.size / n
    cost = (
        distance_matrix[current_node, unvisited_nodes]
        + 0.5 * progress * distance_matrix[destination_node, unvisited_nodes]
    )
    return int(unvisited_nodes[np.argmin(cost)])

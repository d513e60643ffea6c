import numpy as np


def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    """Choose the next node of the tour (template: takes the first unvisited node).

    Args:
        current_node: int, the node the tour is at.
        destination_node: int, where the tour must end (node 0, the start).
        unvisited_nodes: np.ndarray (k,) int64, the nodes not yet visited (a fresh copy per call).
        distance_matrix: np.ndarray (n, n) float64, pairwise distances (a fresh copy per call).

    Returns:
        int, the next node: one of ``unvisited_nodes``.
    """
    return int(unvisited_nodes[0])

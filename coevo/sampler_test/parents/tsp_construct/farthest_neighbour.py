import numpy as np


def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    """Farthest neighbour: go to the unvisited node farthest from the current one (a deliberately weak textbook
    rule, the mirror of nearest neighbour).

    Sampler-test parent (coevo).
    """
    return int(unvisited_nodes[np.argmax(distance_matrix[current_node, unvisited_nodes])])

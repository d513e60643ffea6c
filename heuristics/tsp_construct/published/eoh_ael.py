"""EoH's example heuristic for constructive TSP, as published (AEL's, GPT-3.5-written): four weights and a threshold.

Source: FeiLiu36/EoH ``examples/tsp_construct/evaluation/heuristic.py`` (Liu et al., "Evolution of Heuristics",
ICML 2024); the same heuristic is AEL's in ai4co/reevo ``problems/tsp_constructive/test/test_synthetic.ipynb``
and, as ``select_next_node_v1``, ReEvo's seed function for constructive TSP
(``prompts/tsp_constructive/seed_func.txt``; Ye et al., "ReEvo", NeurIPS 2024), from which ReEvo and HSEvo
start their searches. Used by ``seed_heuristics: [eoh_ael]`` and ``benchmarks/tune_published.py``.

Idea (the thought a prompt shows with this heuristic; coevo's summary unless marked):
Score each unvisited node by 0.4 x its distance from the current node - 0.3 x its mean distance to the
other unvisited nodes + 0.2 x the standard deviation of those distances - 0.1 x its distance to the destination,
and go to the lowest score; when every score is above the threshold 0.7, go to the nearest node instead.
"""
import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    threshold = 0.7
    scores = {}
    for node in unvisited_nodes:
        all_distances = [distance_matrix[node][i] for i in unvisited_nodes if i != node]
        average_distance_to_unvisited = np.mean(all_distances) if len(all_distances) > 0 else 0.0
        std_dev_distance_to_unvisited = np.std(all_distances) if len(all_distances) > 0 else 0.0
        score = (0.4 * distance_matrix[current_node][node]
                 - 0.3 * average_distance_to_unvisited
                 + 0.2 * std_dev_distance_to_unvisited
                 - 0.1 * distance_matrix[destination_node][node])
        scores[node] = score
    if min(scores.values()) > threshold:
        next_node = min(unvisited_nodes, key=lambda node: distance_matrix[current_node][node])
    else:
        next_node = min(scores, key=scores.get)
    return int(next_node)

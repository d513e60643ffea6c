"""MCTS-AHD's constructive 0-1 knapsack heuristic, as published (GPT-4o-mini-written; three constants).

Source: zz1358m/MCTS-AHD-master ``problems/kp_constructive/gpt.py`` at commit
ee9c4f424503c65a5fd2b899e6620ce86079fedb ("a leading heuristic function designed by MCTS-AHD", its README);
Zheng, Xie, Wang & Hooi, "Monte Carlo Tree Search for Comprehensive Exploration in LLM-Based Automatic
Heuristic Design", ICML 2025 (arXiv 2501.08603). Used by ``seed_heuristics: [mcts_ahd]``.

Interface: MCTS-AHD's ``select_next_item(remaining_capacity, weights, values)`` is coevo's (the arrays hold
the items not taken yet, in their original order; the index returned points into them), so the code below is
upstream's, unchanged. Two differences of the loop around it, neither of which this heuristic reaches on
coevo's instances or MCTS-AHD's: MCTS-AHD's ``eval.py`` accepts an item up to 1e-3 over the remaining capacity
(``eval-test.py``: 1e-6) and calls the heuristic while such an item exists, where coevo calls it only while an
item fits exactly; and upstream reads a returned -1 as ``weights[-1]`` (the last item), coevo as "stop".
The heuristic only returns -1 when no item fits, which coevo never asks.

Idea (the thought a prompt shows with this heuristic; coevo's summary unless marked):
Score each item that fits by its value plus 5 x its value density, less a penalty for weight above 0.3 of
the remaining capacity, then take the item that leads the best greedy look-ahead fill of the remaining capacity.
"""
import numpy as np


def select_next_item(remaining_capacity, weights, values):
    capacity_threshold = 0.3
    value_weight_ratios = values / weights
    sorted_indices = np.argsort(-value_weight_ratios)

    eligible_items = []
    for i in sorted_indices:
        if weights[i] <= remaining_capacity:
            score = values[i] + (values[i] / weights[i] * 5)
            if weights[i] > remaining_capacity * capacity_threshold:
                score -= (weights[i] - remaining_capacity * capacity_threshold) * 0.1
            eligible_items.append((i, score))

    if not eligible_items:
        return -1

    eligible_items.sort(key=lambda x: -x[1])
    best_combination_value = -float('inf')
    result = -1

    for i, score in eligible_items:
        current_value = values[i]
        current_weight = weights[i]

        for j in eligible_items:
            if j[0] != i and current_weight + weights[j[0]] <= remaining_capacity:
                current_value += values[j[0]]
                current_weight += weights[j[0]]

        if current_value > best_combination_value:
            best_combination_value = current_value
            result = i

    return result

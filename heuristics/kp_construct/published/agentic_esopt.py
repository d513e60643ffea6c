"""The seed paper's best constructive 0-1 knapsack heuristic (EoH + Agentic ESOpt, Llama-3.1-8B), as published.

Source: zz1358m/Agentic-ESOpt ``ahd-test-time/results/EoH+AgenticESOpt2000/KP_construct/
construct_kp_k3_rep1_final_best_code.py`` at commit 8c0839364f500c4026a5e1aeaa745675dc307020 (its header:
train objective -40.16268, i.e. a mean total value of 40.16268 on the 64 KP100 training instances of
MCTS-AHD, capacity 25); the paper (arXiv 2608.17310) reports KP n=100 40.1562 (EoH) -> 40.1578 (EoH + ES),
means over its runs on that set. Used by ``seed_heuristics: [agentic_esopt]``.

Interface: the seed paper's KP evaluator (``methods/eoh/.../kp_constructive/run.py``) calls
``select_next_item(remaining_capacity, weights, values)`` on the items not taken yet, as coevo does, so the
code below is upstream's, unchanged. Its loop accepts an item up to 1e-12 over the remaining capacity and
calls the heuristic while one is within that tolerance; coevo calls it only while an item fits exactly. The
heuristic returns -1 only when no item fits, which coevo never asks.

Idea (the thought a prompt shows with this heuristic; coevo's summary unless marked):
Among the items that fit, take the one with the highest value / (weight + 0.1) plus small bonuses for a
light item, a large share of the total weight and a large remaining capacity.
"""
import numpy as np

def select_next_item(remaining_capacity, weights, values):
    # Calculate the fraction of the total capacity that each item occupies
    occupation_factors = weights / np.sum(weights)
    
    # Initialize the best item index and score
    next_item = -1
    best_score = 0
    
    # Iterate through the items, giving preference to items with lower weights first and higher values
    for i in np.argsort(values)[::-1]:
        item_weight = weights[i]
        item_value = values[i]
        # Check if the item can be selected
        if item_weight <= remaining_capacity:
            # Calculate the score with a downward priority based on remaining capacity
            if np.log2(item_weight + 1) > 0:
                score = (item_value / (item_weight + 0.1)) + 0.3 * (1 / (item_weight + 1)) + 0.3 * occupation_factors[i] + 0.3 * remaining_capacity / (np.sum(weights) - item_weight) ** 0.2
            else:
                score = (item_value / (item_weight + 0.1)) + 0.3 * occupation_factors[i] + 0.3 * remaining_capacity / (np.sum(weights) - item_weight) ** 0.2
            # Update the best item and score if necessary
            if score > best_score:
                next_item = i
                best_score = score

    return next_item

"""FunSearch's heuristic for online bin packing on Weibull instances, as published (integer exponents).

Source: google-deepmind/funsearch ``bin_packing/bin_packing.ipynb`` (Romera-Paredes et al., "Mathematical
discoveries from program search with large language models", Nature 2024); the same heuristic, renamed
``priority_v1(item, bins_remain_cap)``, is ReEvo's seed function for online bin packing (ai4co/reevo
``prompts/bpp_online/seed_func.txt``; Ye et al., "ReEvo", NeurIPS 2024), from which ReEvo starts its search.
Used by ``seed_heuristics: [funsearch_weibull]`` and ``benchmarks/tune_published.py``.

Idea (the thought a prompt shows with this heuristic; coevo's summary unless marked):
Score each bin by (r - r_max)^2 / item + r^2 / item^2 + r^2 / item^3 of its remaining capacity r, negate the
score of bins with more room than the item, and take differences between neighbouring bins' scores.
"""
import numpy as np

def score(item, bins):
    max_bin_cap = max(bins)
    score = (bins - max_bin_cap)**2 / item + bins**2 / (item**2)
    score += bins**2 / item**3
    score[bins > item] = -score[bins > item]
    score[1:] -= score[:-1]
    return score

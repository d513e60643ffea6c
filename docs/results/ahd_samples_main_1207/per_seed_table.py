"""Per problem and seed: valid/novel %, child > parent, best operator, held-out textbook seed vs best (mid size)."""

import json
import sys
from collections import defaultdict

PUBLISHED = {  # held-out objective of the problem's published seed at the middle size (same instances, seed 1234)
    "tsp_construct": ("EoH AEL", "50", 6.4498),
    "kp_construct": ("MCTS-AHD", "100", 40.5212),
    "cvrp_construct": ("EoH", "50", 13.5872),
    "bpp_online": ("FunSearch", None, None),
}
rows = [json.loads(line) for line in open(sys.argv[1])]
runs = defaultdict(list)
for r in rows:
    if r.get("type") == "run":
        runs[(r["problem"], r["arm"])].append(r)
print(
    "| problem | arm | seed | valid % | valid+novel % | tokens/valid | LLM child > parent | best from | held-out sizes: textbook seed -> best (gap %) |"
)
print("|---|---|---|---|---|---|---|---|---|")
for (p, arm), rs in sorted(runs.items()):
    for r in sorted(rs, key=lambda r: r["seed"]):
        ho = r.get("heldout") or {}
        cells = ", ".join(
            f"{k}: {v['seed_objective']:.4f} -> {v['best_objective']:.4f}"
            + (f" ({v['best_gap']:.2f})" if v.get("best_gap") is not None else "")
            for k, v in ho.items()
        )
        print(
            f"| {p} | {arm} | {r['seed']} | {r['valid_percent']:.1f} | {r['valid_novel_percent']:.1f} | "
            f"{r['tokens_per_valid']:.0f} | {r['children_better_than_parent']}/{r['children']} | "
            f"{r['best_operator']} ({r['best_id']}) | {cells} |"
        )

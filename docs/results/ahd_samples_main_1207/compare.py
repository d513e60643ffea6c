"""Side by side per problem: the 2026-12-06 grid (ahd_samples_main) and this one, seeds run in both.

Usage: python compare.py OLD/samples.jsonl NEW/samples.jsonl
"""

import json
import sys
from collections import defaultdict


def runs(path):
    out = defaultdict(dict)
    for line in open(path):
        r = json.loads(line)
        if r.get("type") == "run":
            out[(r["problem"], r["arm"])][r["seed"]] = r
    return out


def agg(rs):
    calls = sum(r["llm_calls"] for r in rs)
    valid = sum(r["valid"] for r in rs)
    novel = sum(r["valid_novel"] for r in rs)
    tokens = sum(r["completion_tokens"] for r in rs)
    better = sum(r["children_better_than_parent"] > 0 for r in rs)
    return calls, 100 * valid / calls, 100 * novel / calls, tokens / valid if valid else float("nan"), better


old, new = runs(sys.argv[1]), runs(sys.argv[2])
print("| problem | arm | seeds | valid % before -> now | valid+novel % | tokens/valid | runs with LLM child > parent |")
print("|---|---|---|---|---|---|---|")
for key in sorted(new):
    seeds = sorted(set(new[key]) & set(old.get((key[0], "main"), {})))
    if not seeds:
        continue
    b = agg([old[(key[0], "main")][s] for s in seeds])
    a = agg([new[key][s] for s in seeds])
    print(
        f"| {key[0]} | {key[1]} | {','.join(map(str, seeds))} | {b[1]:.1f} -> {a[1]:.1f} | {b[2]:.1f} -> {a[2]:.1f} "
        f"| {b[3]:.0f} -> {a[3]:.0f} | {b[4]}/{len(seeds)} -> {a[4]}/{len(seeds)} |"
    )

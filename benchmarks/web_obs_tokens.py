"""What keeping every clickable element in the web observation costs (issue 48, item 1).

The same MiniWoB++ pages (real task pages in real headless Chromium, first observation after ``reset``) are
flattened twice from one raw BrowserGym observation:

* ``before``: BrowserGym's defaults as coevo used them until issue 48 (``skip_generic=True``, no clickable tag):
  generic nodes without properties are dropped, so click-link's links (clickable ``<span>``) lose their ids;
* ``after``: :data:`coevo.envs.web.AXTREE_OPTIONS` (``skip_generic=False, with_clickable=True`` with the
  page's ``extra_element_properties``), what :class:`coevo.envs.web.WebEnv` now shows the agent.

Per page and setting: characters and tokens of the tree (the embedded model's tokenizer, ``--model``), the
clickable elements of the page (BrowserGym's ``clickable`` property, elements present in the accessibility tree),
how many of them have their id in the text, and whether the text fits the ``max_obs_chars`` clip of
``--clip`` (the web rollout's ``max_obs_chars``). Output: a Markdown table (``OUT/table.md``), one JSON line per
page in ``OUT/pages.jsonl`` and one JSON line per metric on stdout ``{"metric", "value", "goal", "met"}``.

Usage::

    .venv/bin/python benchmarks/web_obs_tokens.py --seeds 2 --out runs/web_obs_tokens
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coevo.envs.miniwob import MINIWOB10_TASKS, MiniWoBEnv
from coevo.envs.web import IGNORED_ROLES, flatten_observation
from coevo.tables import md_table

#: the flatten options compared: name -> flatten_axtree_to_str keyword arguments (None = coevo's current ones)
SETTINGS = {"before": {"skip_generic": True, "with_clickable": False}, "after": None}


def page_row(task: str, seed: int, raw: dict, tokenizer, clip: int) -> dict:
    """One ``pages.jsonl`` line: per setting, chars, tokens, clickable ids shown / on the page, fits the clip."""
    props = raw.get("extra_element_properties") or {}
    in_tree = {str(n.get("browsergym_id")) for n in raw["axtree_object"]["nodes"] if n.get("browsergym_id")}
    clickable = sorted(b for b in in_tree if (props.get(b) or {}).get("clickable"))
    row: dict = {"task": task, "seed": seed, "clickable_on_page": len(clickable)}
    for name, options in SETTINGS.items():
        text = flatten_observation(raw, IGNORED_ROLES, options)["axtree"]
        shown = {b for b in clickable if f"[{b}]" in text}
        row[name] = {
            "chars": len(text),
            "tokens": len(tokenizer(text)["input_ids"]),
            "clickable_shown": len(shown),
            "fits_clip": len(text) <= clip,
        }
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=",".join(MINIWOB10_TASKS), help="comma-separated MiniWoB++ tasks")
    p.add_argument("--seeds", type=int, default=2, help="held-out seeds 10000.. per task")
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="model whose tokenizer counts tokens")
    p.add_argument("--clip", type=int, default=1500, help="max_obs_chars of the rollout (configs/web: 1500)")
    p.add_argument("--out", default="runs/web_obs_tokens")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    from coevo.backends.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(args.model)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    env = MiniWoBEnv()
    try:
        for task in [t for t in args.tasks.split(",") if t]:
            for seed in range(10_000, 10_000 + args.seeds):
                env.reset(task, seed)
                rows.append(page_row(task, seed, env.raw_obs, tokenizer, args.clip))
    finally:
        env.close()
    (out / "pages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = [
        [
            f"{r['task']}:{r['seed']}",
            r["clickable_on_page"],
            *(r[s][k] for s in SETTINGS for k in ("clickable_shown", "chars", "tokens")),
            round(r["after"]["tokens"] / max(1, r["before"]["tokens"]), 2),
        ]
        for r in rows
    ]
    header = ["page", "clickable on page"]
    header += [f"{s}: {k}" for s in SETTINGS for k in ("clickable shown", "chars", "tokens")]
    text = md_table([*header, "tokens after / before"], table)
    print(text)
    (out / "table.md").write_text(text + "\n")

    def total(setting: str, key: str) -> int:
        return sum(r[setting][key] for r in rows)

    on_page = sum(r["clickable_on_page"] for r in rows)
    ratios = [r["after"]["tokens"] / max(1, r["before"]["tokens"]) for r in rows]
    metrics = [
        ("web_obs_clickable_shown/before", total("before", "clickable_shown"), f"of {on_page} clickable", True),
        (
            "web_obs_clickable_shown/after",
            total("after", "clickable_shown"),
            f"= {on_page}: every clickable element has its id",
            total("after", "clickable_shown") == on_page,
        ),
        ("web_obs_tokens_mean/before", round(total("before", "tokens") / len(rows), 1), "informational", True),
        ("web_obs_tokens_mean/after", round(total("after", "tokens") / len(rows), 1), "informational", True),
        ("web_obs_tokens_ratio_median", round(statistics.median(ratios), 3), "informational: after / before", True),
        ("web_obs_tokens_ratio_max", round(max(ratios), 3), "informational: after / before", True),
        (
            "web_obs_fits_clip/after",
            sum(r["after"]["fits_clip"] for r in rows),
            f"= {len(rows)} pages within max_obs_chars {args.clip}",
            all(r["after"]["fits_clip"] for r in rows),
        ),
    ]
    for name, value, goal, met in metrics:
        print(json.dumps({"metric": name, "value": value, "goal": goal, "met": bool(met)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

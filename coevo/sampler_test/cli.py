"""``coevo heuristics sampler-test MODEL``: the held-out sampler test from the command line.

    coevo heuristics sampler-test MODEL [--prompts N] [--problems P,P] [--out DIR] [--backend auto|hf|vllm]
        [--version V] [--json]

Prints one progress line per batch of 8 prompts on stderr, then the table (per problem and overall: valid %,
valid-and-new %, better-than-its-best-parent %, each with its Wilson 95 % interval, and completion tokens per
valid-and-new answer with a bootstrap 95 % interval) and the output folder; ``--json`` prints the summary lines
instead of the table. The folder holds ``answers.jsonl`` (every answer), ``summary.jsonl`` and ``model.json``.
A rerun with the same ``--out`` resumes (the batches done are not asked again).

Exit status: 0 the test ran (a model that writes nothing valid is a result); 2 bad input (MODEL that is not a
registered name, model folder, run or adapter; a run without ES history; a chunk package not installed;
``--prompts`` out of range), one line naming it and the fix.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from coevo.sampler_test.promptset import PROBLEMS, PROMPT_SET_VERSION


def _cmd(args: argparse.Namespace) -> int:
    from coevo.sampler_test.run import sampler_test, table

    # SIGTERM ends the test through the finally that closes the engine (vLLM's EngineCore would outlive it)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    problems = [p.strip() for p in args.problems.split(",") if p.strip()]
    summaries, out = sampler_test(
        args.model,
        out=args.out,
        prompts=args.prompts,
        problems=problems,
        version=args.version,
        backend=args.backend,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if args.json:
        for s in summaries:
            print(json.dumps(s))
        return 0
    n = summaries[0]["prompts_per_problem"]
    print(f"sampler test {summaries[0]['version']}: {args.model}, {n} prompts per problem", end="")
    print(" (the full test has 128)" if n < 128 else "")
    print(table(summaries))
    print(f"answers and summary: {out}")
    return 0


def add_parser(sub: Any) -> None:
    """Register ``sampler-test`` on the ``coevo heuristics`` sub-parsers."""
    st = sub.add_parser(
        "sampler-test",
        help="held-out test of a model as heuristic sampler: valid, new and better-than-parent rates with 95 % "
        "intervals",
    )
    st.add_argument(
        "model",
        help="a registered model name (coevo model list), a model folder, an ES run folder (weights rebuilt from "
        "its history) or a PEFT adapter folder",
    )
    st.add_argument("--prompts", type=int, default=None, help="prompts per problem (default: all 128)")
    st.add_argument("--problems", default=",".join(PROBLEMS), help="comma-separated (default: all four)")
    st.add_argument("--out", default=None, help="output folder (default sampler-test/<model>-<version>); resumes")
    st.add_argument("--backend", default="auto", choices=["auto", "hf", "vllm"], help="engine of a name or folder")
    st.add_argument("--version", default=PROMPT_SET_VERSION, help="prompt set version")
    st.add_argument("--json", action="store_true", help="print the summary lines (JSON) instead of the table")
    st.set_defaults(func=_cmd)

"""Decoding throughput of a float32 model on CPU: torch's ``F.linear`` vs oneDNN linear layers, side by side.

One process, one model, the same prompts and greedy decoding: the model generates ``--batch`` rows of
``--max-new-tokens`` tokens first with every linear layer on ``F.linear`` (``model.cpu_linear: torch``), then
on oneDNN (``coevo.backends.cpu_linear``, the ``auto`` default on CPU), each ``--repeats`` times, alternating,
and also the ``lm_head`` logits of one prefill to compare the two kernels' numbers. Prints a table, then JSON
lines ``{"metric", "value", "goal", "met"}``:

- ``cpu_linear_decode_speedup``: oneDNN tok/s / torch tok/s (goal >= 1.5 on this project's 2-core AMD
  machine, where MKL's small-row sgemm is slow; informational elsewhere);
- ``cpu_linear_max_logit_diff``: largest |logit difference| of the prefill (float32 summation order only;
  goal <= 1e-2);
- ``cpu_linear_same_greedy_tokens``: the fraction of generated tokens identical under both kernels.

Example (0.5B, a few minutes here)::

    python benchmarks/cpu_linear.py --model qwen2.5-coder-0.5b-instruct --batch 8 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences what a hash map is.",
    "What is 17 * 23? Answer with the number only.",
    "Name three sorting algorithms and their time complexity.",
    "Write a haiku about the sea.",
    "Give a regular expression that matches an email address.",
    "What does the Python keyword `yield` do?",
    "Translate 'good morning' into French, German and Spanish.",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="registry name, HF folder or tiny:<preset>")
    ap.add_argument("--batch", type=int, default=8, help="rows per generate call")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="timed generate calls per kernel (alternating)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args(argv)

    import torch

    from coevo.backends.base import SamplingParams
    from coevo.backends.cpu_linear import onednn_available, use_onednn_linear, use_torch_linear
    from coevo.backends.hf import HFPolicy
    from coevo.tables import md_table

    if args.threads:
        torch.set_num_threads(args.threads)
    if not onednn_available():
        print("torch's oneDNN linear op is not available here: nothing to compare", file=sys.stderr)
        return 2
    policy = HFPolicy(args.model, dtype="float32", batch_size=args.batch, cpu_linear="torch")
    convs = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(args.batch)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    kernels = {"torch": lambda: use_torch_linear(policy.model), "onednn": lambda: use_onednn_linear(policy.model)}

    def logits() -> torch.Tensor:
        ids = policy.tokenizer(policy._prompts(convs[:1]), return_tensors="pt", add_special_tokens=False)
        with torch.inference_mode():
            return policy.model(**ids).logits.float()

    seconds = {k: 0.0 for k in kernels}
    tokens = {k: 0 for k in kernels}
    texts: dict[str, list[list[int]]] = {}
    prefill: dict[str, torch.Tensor] = {}
    for k, switch in kernels.items():  # warm-up + the numbers to compare
        switch()
        prefill[k] = logits()
        out = policy.generate(convs, params)
        texts[k] = [policy.tokenizer(c.text, add_special_tokens=False)["input_ids"] for c in out]
    for _ in range(args.repeats):
        for k, switch in kernels.items():
            switch()
            t0 = time.perf_counter()
            out = policy.generate(convs, params)
            seconds[k] += time.perf_counter() - t0
            tokens[k] += sum(c.completion_tokens for c in out)
    rate = {k: tokens[k] / seconds[k] for k in kernels}
    diff = float((prefill["onednn"] - prefill["torch"]).abs().max())
    same = total = 0
    for a, b in zip(texts["torch"], texts["onednn"], strict=True):
        total += max(len(a), len(b))
        same += sum(x == y for x, y in zip(a, b))
    print(
        f"model {args.model} (float32), batch {args.batch}, {args.max_new_tokens} new tokens, greedy, "
        f"{args.repeats} timed calls per kernel, torch threads {torch.get_num_threads()}"
    )
    rows = [[k, tokens[k], f"{seconds[k]:.2f}", f"{rate[k]:.2f}"] for k in kernels]
    print(md_table(["kernel", "tokens", "seconds", "tok/s"], rows))
    speedup = rate["onednn"] / rate["torch"]
    for metric in (
        {"metric": "cpu_linear_decode_speedup", "value": round(speedup, 3), "goal": ">= 1.5", "met": speedup >= 1.5},
        {"metric": "cpu_linear_max_logit_diff", "value": diff, "goal": "<= 1e-2", "met": diff <= 1e-2},
        {
            "metric": "cpu_linear_same_greedy_tokens",
            "value": round(same / max(1, total), 4),
            "goal": "informational: float32 summation order may flip a near-tie",
            "met": True,
        },
    ):
        print(json.dumps(metric))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""ES overhead on one model: generation throughput and peak memory of ES vs plain inference vs backprop.

Measured side by side on the same model, dtype, prompts and decoding (greedy, ``--max-new-tokens``):

(a) throughput: tokens/s of ES member evaluations (perturb ``theta + sign * sigma * eps(seed)``, generate the
    batch, restore; Agentic-ESOpt's per-member loop, docs/references.md §1 steps 2-4) divided by tokens/s of plain
    generation of the same batch. Plain and perturbed generations alternate in one process (a plain call before
    even members, after odd ones, after one untimed warm-up call), so a change of machine load hits both alike. Goal >= 0.95 (EGGROLL, arXiv 2511.16652,
    reaches 0.91 of pure batch inference with batched low-rank perturbations; here perturbations are full-rank
    and sequential). A second ratio amortises the generation's ES update (``coevo.es.es_update`` over the
    members' seeds) over the members' tokens.
(b) peak memory of an ES generation (members + update) / peak memory of plain inference of the same
    generations, in the inference-level mode (``restore_mode="inference"``, no float32 masters: extra memory
    is the 16 MiB noise chunk and chunk-sized temporaries of restore and update, ~0.1 GiB measured) - goal <= 1.05 - and, beside it, the exact mode
    (float32 masters of bf16/fp16 weights: +4 bytes per parameter in scope; a float32 model gets a backup copy
    of each tensor while it is perturbed instead).
(c) ES peak memory / peak memory of one backprop + AdamW step (``torch.optim.AdamW``, states in the
    parameters' dtype) on the same model and batch: the batch is generated first, as a GRPO step would, then
    the prompt + completion sequences are trained with the token cross-entropy of the completion; the
    trainable tensors are the ES scope (``--scope``), the rest frozen. Goal <= 0.15 (Agentic-ESOpt reports
    8.41 GB for ES vs 58.88 GB for GRPO on Qwen3.5-4B, a ratio of 0.143).

Peak memory is the peak resident set size (``VmHWM`` of ``/proc/self/status``, else ``ru_maxrss``) of a
fresh interpreter per variant (``subprocess``, no fork). RSS counts every resident page of the process:
the interpreter, torch and transformers libraries (~0.35 GiB here), the tokenizer, the weights, activations,
KV cache, allocator caches, and file pages of memory-mapped weights that were touched. It does not count
pages swapped out (there is no swap here) or memory of other processes. The table's "RSS loaded" is read
right after loading: weights memory-mapped from safetensors become resident only when first touched, so it
can be far below the weights' size. Times are wall-clock seconds on a machine that may be shared.

Low-rank ES (``perturbation: lowrank``, EGGROLL, arXiv 2511.16652; ``coevo.es.lowrank``), variant
``es-lowrank``: the N members x B prompts are generated as population rows (prompt-major, so every model
batch of ``--batch`` rows mixes members) through ``HFReplica.population`` with rank ``--rank``, then one
low-rank update (no float32 masters, stochastic rounding). Beside it, in the same process and alternating,
plain generation of the same N x B rows at the same batch size. Its metrics (issue 9 benchmarks):

(la) low-rank ES generation throughput / plain inference throughput of the same rollouts: goal >= 0.95 (also
     with the update's time amortised over the generation);
(lb) wall-clock speed-up of the low-rank generation (rollouts + update) over today's full-rank sequential
     generation (``es-inference`` variant: perturb, generate, restore per member, then the update): goal >= 3.
     With ``--population-batch R`` the low-rank rows go R to a model batch (e.g. N x B, the whole generation
     in one batch, EGGROLL's point), where the sequential ES can only batch one member's B prompts; (la) then
     compares with plain generation at the same R rows per batch;
(lc) peak RSS of the low-rank generation incl. update / peak RSS of plain inference (``inference``): goal <= 1.05.

Prints a table, then one JSON line per metric: ``{"metric", "value", "goal", "met"}``.

Usage::

    python benchmarks/es_overhead.py [--model qwen2.5-coder-0.5b-instruct] [--dtype float32] [--batch 8]
        [--max-new-tokens 32] [--members 4] [--sigma 1e-3] [--scope all_linear] [--threads 1]
        [--population-batch 0]

The defaults are the configuration docs/measurements.md's numbers were taken with (float32, 4 members x 8
prompts x 32 new tokens, the whole low-rank generation in one 32-row batch, one torch thread per process).
    python benchmarks/es_overhead.py --model tiny:micro --batch 2 --max-new-tokens 4 --members 2   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ("inference", "es-inference", "es-exact", "backprop", "es-lowrank")
#: coding prompts for the coder model: completions run to the token limit, so every call decodes the same length
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Write a Python class for a stack with push, pop and peek, with comments.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Explain, step by step, how binary search works and write it in Python.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case.",
    "Write a Python function that counts word frequencies in a text and returns the top ten.",
    "Write a Python function for the greedy nearest-neighbour tour of a distance matrix.",
    "Write a Python function that parses a CSV line with quoted fields.",
)


def _status_bytes(field: str) -> int | None:
    """A memory line of ``/proc/self/status`` (``VmHWM``, ``VmRSS``: KiB there) in bytes; None without /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """Peak resident set size of this process in bytes: ``VmHWM`` (Linux), else ``ru_maxrss`` (KiB on Linux)."""
    peak = _status_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    """Current resident set size in bytes (``VmRSS``; 0 where /proc is missing)."""
    return _status_bytes("VmRSS") or 0


def conversations(batch: int) -> list[list[dict]]:
    """``batch`` single-turn conversations, cycling :data:`PROMPTS` (a suffix keeps repeats distinct)."""
    return [
        [{"role": "user", "content": PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" (variant {i})")}]
        for i in range(batch)
    ]


def member_seeds(members: int) -> list[tuple[int, int]]:
    """``(seed, sign)`` per member: antithetic pairs of fixed seeds (an odd count ends with an unpaired +1)."""
    return [(1_000_003 * (i // 2 + 1), 1 if i % 2 == 0 else -1) for i in range(members)]


# ---------------------------------------------------------------------------------------------- workers
def _timed_generate(policy, convs, params) -> tuple[int, float]:
    t0 = time.perf_counter()
    outs = policy.generate(convs, params)
    return sum(o.completion_tokens for o in outs), time.perf_counter() - t0


def _es_worker(policy, args, mode: str) -> dict:
    """Alternate plain generation and ES member evaluation (perturb, generate, restore); then one update."""
    import torch

    from coevo.backends.base import SamplingParams
    from coevo.es import ESParams, es_update, normalize_rewards, perturb, select_params

    masters = torch.float32 if mode == "exact" else None
    params = ESParams(select_params(policy.named_parameters(), args.scope), master_dtype=masters)
    convs = conversations(args.batch)
    sp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    plain_tok = plain_s = es_tok = es_s = perturb_s = restore_s = 0.0
    rewards = []
    policy.generate(convs, sp)  # warm-up (first-call allocations, kernel selection), not timed
    for i, (seed, sign) in enumerate(member_seeds(args.members)):
        if i % 2 == 0:  # plain call before even members, after odd ones: load drift hits both sides
            n, dt = _timed_generate(policy, convs, sp)
            plain_tok, plain_s = plain_tok + n, plain_s + dt
        t0 = time.perf_counter()
        with perturb(params, seed, args.sigma, sign, mode):  # restored on exit, also if generate raises
            t1 = time.perf_counter()
            outs = policy.generate(convs, sp)
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        es_tok += sum(o.completion_tokens for o in outs)
        es_s += t3 - t0
        perturb_s, restore_s = perturb_s + t1 - t0, restore_s + t3 - t2
        rewards.append(float(sum(len(o.text) for o in outs)))  # any finite per-member score drives the update
        if i % 2 == 1:
            n, dt = _timed_generate(policy, convs, sp)
            plain_tok, plain_s = plain_tok + n, plain_s + dt
    coeffs = normalize_rewards(rewards, "zscore").tolist()
    seeds = member_seeds(args.members)
    t0 = time.perf_counter()
    es_update(params, [s for s, _ in seeds], [g for _, g in seeds], coeffs, alpha=5e-4, sigma=args.sigma)
    update_s = time.perf_counter() - t0
    return {
        "plain_tokens": plain_tok,
        "plain_s": plain_s,
        "es_tokens": es_tok,
        "es_s": es_s,
        "perturb_s": perturb_s,
        "restore_s": restore_s,
        "update_s": update_s,
        "scope_numel": params.numel,
        "master_bytes": params.master_bytes,
    }


def _lowrank_worker(policy, args) -> dict:
    """Alternate plain generation of the N x B rows and the low-rank population generation; then one update."""
    from coevo.backends.base import SamplingParams
    from coevo.es import ScopeSpec, normalize_rewards
    from coevo.es.lowrank import lowrank_update
    from coevo.types import ESMember

    replica = policy.es_replica(ScopeSpec("all_linear"), master_weights=False)  # low rank: matrices only
    members = [
        ESMember(seed=s, sigma=args.sigma, sign=g, index=i) for i, (s, g) in enumerate(member_seeds(args.members))
    ]
    convs = conversations(args.batch)
    rows = [(m, c) for c in convs for m in members]  # prompt-major: each model batch mixes members
    sp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    # rows per model batch: the population (and its side-by-side plain run) may batch the rows of several
    # members together, which a sequential full-rank ES cannot (one member's batch is its --batch prompts)
    policy.batch_size = args.population_batch or args.members * args.batch
    policy.generate(convs, sp)  # warm-up, not timed
    # plain generation of the same rows in the same model batches (policy.batch_size rows each): the first half
    # of the batches before the population, the rest after (load drift hits both); never a smaller batch
    per = policy.batch_size
    batches = [[c for _, c in rows[i : i + per]] for i in range(0, len(rows), per)]
    half = (len(batches) + 1) // 2
    plain_tok = plain_s = 0.0
    for b in batches[:half]:
        n, dt = _timed_generate(policy, b, sp)
        plain_tok, plain_s = plain_tok + n, plain_s + dt
    t0 = time.perf_counter()
    with replica.population(members, args.rank) as pop:
        outs = pop.generate(rows, sp)
    es_s = time.perf_counter() - t0
    for b in batches[half:]:
        n, dt = _timed_generate(policy, b, sp)
        plain_tok, plain_s = plain_tok + n, plain_s + dt
    rewards = [float(sum(len(o.text) for o, (m, _) in zip(outs, rows) if m is mem)) for mem in members]
    coeffs = normalize_rewards(rewards, "zscore").tolist()
    t0 = time.perf_counter()
    lowrank_update(
        replica.params,
        [m.seed for m in members],
        [m.sign for m in members],
        coeffs,
        alpha=5e-4,
        sigma=args.sigma,
        rank=args.rank,
        generation=0,
    )
    update_s = time.perf_counter() - t0
    return {
        "plain_tokens": plain_tok,
        "plain_s": plain_s,
        "es_tokens": sum(o.completion_tokens for o in outs),
        "es_s": es_s,
        "perturb_s": 0.0,
        "restore_s": 0.0,
        "update_s": update_s,
        "scope_numel": replica.params.numel,
        "master_bytes": replica.params.master_bytes,
    }


def _inference_worker(policy, args) -> dict:
    from coevo.backends.base import SamplingParams

    convs = conversations(args.batch)
    sp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    tok = secs = 0.0
    policy.generate(convs, sp)  # warm-up, not timed (as in the ES workers)
    for _ in range(args.members):
        n, dt = _timed_generate(policy, convs, sp)
        tok, secs = tok + n, secs + dt
    return {"plain_tokens": tok, "plain_s": secs}


def _backprop_worker(policy, args) -> dict:
    """Generate the batch (the rollout), then one forward + backward + AdamW step on prompt + completion."""
    import torch

    from coevo.backends.base import SamplingParams
    from coevo.es import select_params

    convs = conversations(args.batch)
    outs = policy.generate(convs, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0))
    tok, model = policy.tokenizer, policy.model
    rows, labels = [], []
    for conv, out in zip(convs, outs, strict=True):
        p_ids = tok(
            tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True), add_special_tokens=False
        )["input_ids"]
        c_ids = tok(out.text, add_special_tokens=False)["input_ids"] or [tok.pad_token_id]
        rows.append(p_ids + c_ids)
        labels.append([-100] * len(p_ids) + c_ids)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)  # (B, T), left padded
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, width - len(r) :], lab[i, width - len(r) :], mask[i, width - len(r) :] = (
            torch.tensor(r),
            torch.tensor(lb),
            1,
        )
    trainable = [t for _, t in select_params(model.named_parameters(), args.scope)]
    keep = {id(t) for t in trainable}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    opt = torch.optim.AdamW(trainable, lr=1e-6)
    model.train()
    t0 = time.perf_counter()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    loss = model(
        input_ids=ids.to(policy.device),
        attention_mask=mask.to(policy.device),
        position_ids=pos.to(policy.device),
        labels=lab.to(policy.device),
    ).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    step_s = time.perf_counter() - t0
    return {
        "train_tokens": int(mask.sum()),
        "train_step_s": step_s,
        "loss": float(loss),
        "trainable_numel": sum(t.numel() for t in trainable),
    }


def run_worker(args: argparse.Namespace) -> dict:
    """Run one variant in this (fresh) process; returns its measurements and peak RSS."""
    import torch

    from coevo.backends.hf import HFPolicy

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    policy = HFPolicy(args.model, dtype=args.dtype, batch_size=args.batch)
    load_s = time.perf_counter() - t0
    rss_loaded = rss_bytes()
    if args.worker == "inference":
        out = _inference_worker(policy, args)
    elif args.worker == "backprop":
        out = _backprop_worker(policy, args)
    elif args.worker == "es-lowrank":
        out = _lowrank_worker(policy, args)
    else:
        out = _es_worker(policy, args, args.worker.removeprefix("es-"))
    return {
        "variant": args.worker,
        "load_s": load_s,
        "rss_after_load": rss_loaded,
        "peak_rss": peak_rss_bytes(),
        "model_numel": sum(p.numel() for p in policy.model.parameters()),
        **out,
    }


# ---------------------------------------------------------------------------------------------- driver
def spawn(variant: str, args: argparse.Namespace) -> dict:
    """Run ``variant`` in a fresh interpreter and parse its JSON result line (kept in ``--save DIR/<variant>.json``
    when given, and reused from there by a later call with the same settings).

    Raises:
        RuntimeError: the worker failed (its stderr tail is in the message).
    """
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        variant,
        "--model",
        args.model,
        "--dtype",
        args.dtype,
        "--batch",
        str(args.batch),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--members",
        str(args.members),
        "--sigma",
        repr(args.sigma),
        "--scope",
        args.scope,
        "--threads",
        str(args.threads),
        "--rank",
        str(args.rank),
        "--population-batch",
        str(args.population_batch),
    ]
    saved = Path(args.save) / f"{variant}.json" if args.save else None
    if saved is not None and saved.is_file():
        data = json.loads(saved.read_text())
        if data.get("cmd") == cmd[3:]:
            return data["result"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT, timeout=args.worker_timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker {variant!r} failed (rc {proc.returncode}): {proc.stderr[-3000:]}")
    result = json.loads(lines[-1])
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps({"cmd": cmd[3:], "result": result}))
    return result


def metrics(res: dict[str, dict]) -> list[dict]:
    """The JSON metric lines from the variants' results (metrics whose variants were not run are left out)."""
    inf, esi, esx, bp, lr = (res.get(v) for v in VARIANTS)

    def tput(r: dict, update: bool = False) -> float:
        plain = r["plain_tokens"] / r["plain_s"]
        es = r["es_tokens"] / (r["es_s"] + (r["update_s"] if update else 0.0))
        return es / plain

    def mem(r: dict, base: dict) -> float:
        return r["peak_rss"] / base["peak_rss"]

    def seq_s(r: dict) -> float:
        return r["es_s"] + r["update_s"]

    # (metric, the variants it needs, its value, goal: ">=" or "<=" and the limit)
    specs = [
        ("es_throughput_ratio_inference_mode", (esi,), lambda: tput(esi), ">=", 0.95),
        ("es_throughput_ratio_exact_mode", (esx,), lambda: tput(esx), ">=", 0.95),
        ("es_throughput_ratio_with_update_exact_mode", (esx,), lambda: tput(esx, True), ">=", 0.95),
        ("es_peak_memory_ratio_inference_mode", (inf, esi), lambda: mem(esi, inf), "<=", 1.05),
        ("es_peak_memory_ratio_exact_mode", (inf, esx), lambda: mem(esx, inf), "<=", 1.05),
        ("es_vs_backprop_peak_memory_ratio", (esi, bp), lambda: mem(esi, bp), "<=", 0.15),
        ("es_exact_vs_backprop_peak_memory_ratio", (esx, bp), lambda: mem(esx, bp), "<=", 0.15),
        ("lowrank_throughput_ratio", (lr,), lambda: tput(lr), ">=", 0.95),
        ("lowrank_throughput_ratio_with_update", (lr,), lambda: tput(lr, True), ">=", 0.95),
        ("lowrank_vs_full_sequential_speedup", (lr, esi), lambda: seq_s(esi) / seq_s(lr), ">=", 3),
        ("lowrank_peak_memory_ratio", (lr, inf), lambda: mem(lr, inf), "<=", 1.05),
    ]
    out = []
    for name, needs, value, op, limit in specs:
        if all(r is not None for r in needs):
            v = value()
            met = v >= limit if op == ">=" else v <= limit
            out.append({"metric": name, "value": round(v, 4), "goal": f"{op} {limit}", "met": bool(met)})
    return out


def table(res: dict[str, dict]) -> str:
    """Human-readable table of the variants (MiB, seconds, tokens/s)."""
    mib = 1024**2
    head = f"{'variant':<13}{'peak RSS MiB':>14}{'RSS loaded':>12}{'tokens':>8}{'seconds':>9}{'tok/s':>8}  notes"
    lines = [head, "-" * len(head)]
    for v in (v for v in VARIANTS if v in res):
        r = res[v]
        if v == "backprop":
            tok, secs = r["train_tokens"], r["train_step_s"]
            note = f"1 fwd+bwd+AdamW step, {r['trainable_numel']:,} trainable, loss {r['loss']:.3f}"
        elif v == "inference":
            tok, secs, note = r["plain_tokens"], r["plain_s"], "plain generate"
        else:
            tok, secs = r["es_tokens"], r["es_s"]
            note = (
                f"perturb {r['perturb_s']:.2f}s restore {r['restore_s']:.2f}s update {r['update_s']:.2f}s; "
                f"plain in same proc {r['plain_tokens'] / r['plain_s']:.2f} tok/s; masters "
                f"{r['master_bytes'] / mib:.0f} MiB"
            )
        lines.append(
            f"{v:<13}{r['peak_rss'] / mib:>14.1f}{r['rss_after_load'] / mib:>12.1f}{tok:>8.0f}"
            f"{secs:>9.2f}{tok / max(secs, 1e-9):>8.2f}  {note}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="model reference (tiny:micro for smoke)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--batch", type=int, default=8, help="prompts per generate call (one ES member's batch)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per prompt")
    ap.add_argument("--members", type=int, default=4, help="ES population members (= plain generate calls)")
    ap.add_argument("--sigma", type=float, default=1e-3, help="perturbation scale")
    ap.add_argument("--scope", default="all_linear", choices=("all_linear", "full"), help="ES / trainable tensors")
    ap.add_argument("--rank", type=int, default=1, help="rank of the low-rank (EGGROLL) perturbations")
    ap.add_argument(
        "--population-batch",
        type=int,
        default=0,
        help="es-lowrank: rows (member x prompt) per model batch, here and in its side-by-side plain run "
        "(default 0 = --members x --batch: the whole generation in one batch, EGGROLL's point); the full-rank "
        "sequential ES always batches one member's --batch prompts",
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads per worker (default 1, as measured; 0 = torch default)"
    )
    ap.add_argument("--worker-timeout", type=float, default=3600, help="seconds per variant process")
    ap.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="variants to run (default all; the metrics of variants not run are left out)",
    )
    ap.add_argument("--save", help="folder keeping each variant's result (a rerun reuses finished variants)")
    ap.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for field in ("batch", "max_new_tokens", "members", "rank"):
        if getattr(args, field) < 1:
            ap.error(f"--{field.replace('_', '-')} must be >= 1, got {getattr(args, field)}")
    if args.population_batch < 0:
        ap.error(f"--population-batch must be >= 0, got {args.population_batch}")
    if not args.sigma > 0:
        ap.error(f"--sigma must be > 0, got {args.sigma}")

    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args)))
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    res = {v: spawn(v, args) for v in VARIANTS if v in args.variants}
    any_es = next((r for r in res.values() if "scope_numel" in r), None)
    scope_note = f" ({any_es['scope_numel']:,} of {any_es['model_numel']:,} parameters)" if any_es else ""
    print(
        f"model {args.model} ({args.dtype}), batch {args.batch}, {args.max_new_tokens} new tokens, "
        f"{args.members} members, sigma {args.sigma}, scope {args.scope}, rank {args.rank}{scope_note}, "
        f"low-rank rows per model batch {args.population_batch or args.members * args.batch}"
    )
    print(table(res))
    for m in metrics(res):
        print(json.dumps(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())

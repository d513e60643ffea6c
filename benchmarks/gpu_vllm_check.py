"""GPU check of the vLLM ES backend: parity with Hugging Face, restore exactness, and ES throughput.

Loads one model folder twice on the same GPU: in vLLM with the ES worker extension
(``coevo.backends.vllm_engine.VLLMPolicy``, the extension's ``es_*`` methods via ``collective_rpc``) and in
transformers (``HFPolicy`` with ``coevo.es.ESParams`` over its weights, float32 masters). Then:

1. parity: canonical weight hashes equal at the start; after perturbing both with the same (seed, sigma,
   sign) the hashes are equal and the un-fused vLLM weights differ from HF's by 0 (max abs diff, via
   ``es_compare`` on a safetensors dump of the HF weights); restore gives the start hash back on both;
   one ES update (4 seeds, antithetic) gives equal hashes and 0 difference;
2. the engine sees the weights: per-token log-probabilities of fixed targets (vLLM prompt logprobs vs HF
   forward) agree within bf16 kernel noise at the centre and under a perturbation; the perturbation
   changes vLLM's values (no stale CUDA graph or prefix cache); greedy completions after a restore equal
   those before the perturbation;
3. throughput (completion tokens / s): pure batched inference vs ES generations (per member: perturb,
   generate the same batch, restore), plus the time of perturb, restore and update.

Prints a table, then one JSON line per metric ``{"metric", "value", "goal", "met"}`` (goal/met null for
plain measurements). Exit codes: 0 all goals met, 1 some goal missed, 2 CUDA or vLLM missing (nothing run).

Usage: ``python benchmarks/gpu_vllm_check.py [MODEL_DIR] [--dtype bfloat16] [--prompts 64]
[--max-new-tokens 128] [--members 4] [--sigma 1e-3] [--gpu-memory-utilization 0.45] [--json-out FILE]``;
MODEL_DIR defaults to ``resolve_model("qwen2.5-coder-0.5b-instruct")`` (the embedded model).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# vLLM may spawn its workers: they must import coevo.backends.vllm_worker too
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

SEED, SIGNS = 1234567, (1, -1)
TARGET = "def add(a, b):\n    return a + b"


def preflight() -> str | None:
    """Why the check cannot run here (no vLLM / no CUDA), or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install 'coevo[vllm]' on a CUDA machine)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", nargs="?", default=None, help="HF model folder (default: the embedded 0.5B model)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--scope", default="all_linear", choices=["all_linear", "full"])
    ap.add_argument("--prompts", type=int, default=64, help="conversations per generation batch")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--members", type=int, default=4, help="ES members timed (perturb + generate + restore)")
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.45)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--json-out", default=None, help="also write the JSON lines to this file")
    return ap.parse_args(argv)


class Report:
    """Collects metrics; prints the table and JSON lines."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, metric: str, value, goal: str | None = None, met: bool | None = None) -> None:
        self.rows.append({"metric": metric, "value": value, "goal": goal, "met": met})
        print(f"  {metric}: {value}" + (f"  (goal {goal}: {'met' if met else 'MISSED'})" if goal else ""), flush=True)

    def finish(self, json_out: str | None) -> int:
        width = max(len(r["metric"]) for r in self.rows)
        print(f"\n{'metric':<{width}}  {'value':>18}  {'goal':>14}  met")
        for r in self.rows:
            v = f"{r['value']:.6g}" if isinstance(r["value"], float) else str(r["value"])
            print(f"{r['metric']:<{width}}  {v:>18}  {r['goal'] or '':>14}  {'' if r['met'] is None else r['met']}")
        lines = [json.dumps(r) for r in self.rows]
        print("\n".join(lines))
        if json_out:
            Path(json_out).write_text("\n".join(lines) + "\n")
        return 1 if any(r["met"] is False for r in self.rows) else 0


def dump(params, path: Path) -> Path:
    """Write ``{HF name: tensor}`` of an ESParams' working tensors (safetensors) for ``es_compare``."""
    from safetensors.torch import save_file

    save_file({n: t.detach().cpu().contiguous() for n, t in params.items()}, str(path))
    return path


def conversations(n: int) -> list[list[dict]]:
    tasks = ["reverse a string", "sum a list", "check for a prime", "merge two sorted lists", "count vowels",
             "flatten a nested list", "compute a factorial", "parse a CSV line"]  # fmt: skip
    return [[{"role": "user", "content": f"Write a Python function to {tasks[i % len(tasks)]} (variant {i})."}]
            for i in range(n)]  # fmt: skip


def per_token(values, n_tokens: int) -> list[float]:
    return [float(v) / n_tokens for v in values]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = preflight()
    if reason is not None:
        print(f"gpu_vllm_check: cannot run: {reason}. Nothing was measured.", file=sys.stderr)
        return 2
    import torch

    from coevo.backends.base import SamplingParams
    from coevo.backends.hf import HFPolicy
    from coevo.backends.models import DEFAULT_MODEL, resolve_model
    from coevo.backends.vllm_engine import VLLMPolicy
    from coevo.es import ESParams, GenerationRecord, ScopeSpec, perturb, select_params

    path = Path(args.model_dir) if args.model_dir else resolve_model(DEFAULT_MODEL)
    rep = Report()
    scope = ScopeSpec(args.scope)
    print(f"model {path}, dtype {args.dtype}, scope {args.scope}", flush=True)

    t0 = time.perf_counter()  # vLLM first, before this process touches CUDA
    vl = VLLMPolicy(path, dtype=args.dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                    max_model_len=args.max_model_len)  # fmt: skip
    rep.add("vllm_engine_start_s", round(time.perf_counter() - t0, 2))
    print(f"GPU {torch.cuda.get_device_name(0)}", flush=True)
    state = vl.es_setup(scope, master_weights=True, restore_mode="exact")
    rep.add("es_tensors_in_scope", state["n_tensors"])
    hf = HFPolicy(path, dtype=args.dtype, device="cuda", batch_size=args.prompts)
    hp = ESParams(select_params(hf.model, scope), master_dtype=torch.float32)
    tmp = Path(tempfile.mkdtemp(prefix="gpu_vllm_check."))

    # 1. parity -------------------------------------------------------------------------------
    start = hp.weights_hash()
    same = vl.es_weights_hash() == start
    rep.add("start_hash_equal", same, "True", same)
    convs = conversations(8)
    n_tok = len(hf.tokenizer(TARGET, add_special_tokens=False)["input_ids"])
    lp_hf0, lp_vl0 = (
        per_token(hf.logprob(convs, [TARGET] * 8), n_tok),
        per_token(vl.logprob(convs, [TARGET] * 8), n_tok),
    )
    d0 = max(abs(a - b) for a, b in zip(lp_hf0, lp_vl0))
    rep.add("logprob_diff_centre_nats_per_token", d0, "<= 0.05", d0 <= 0.05)

    sp_greedy = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    batch = conversations(args.prompts)
    greedy_before = [c.text for c in vl.generate(batch, sp_greedy)]
    big_sigma = 3 * args.sigma  # large enough to move greedy decoding and logprobs visibly
    with perturb(hp, SEED, big_sigma, sign=1):
        vl.es_perturb(SEED, big_sigma, 1)
        try:
            same = vl.es_weights_hash() == hp.weights_hash()
            rep.add("perturbed_hash_equal", same, "True", same)
            cmp = vl.es_compare(str(dump(hp, tmp / "hf_perturbed.safetensors")))
            rep.add(
                "perturbed_max_abs_diff", cmp["max_abs_diff"], "== 0", cmp["max_abs_diff"] == 0 and not cmp["missing"]
            )
            lp_hf1 = per_token(hf.logprob(convs, [TARGET] * 8), n_tok)
            lp_vl1 = per_token(vl.logprob(convs, [TARGET] * 8), n_tok)
            d1 = max(abs(a - b) for a, b in zip(lp_hf1, lp_vl1))
            rep.add("logprob_diff_perturbed_nats_per_token", d1, "<= 0.05", d1 <= 0.05)
            moved = max(abs(a - b) for a, b in zip(lp_vl0, lp_vl1))
            rep.add("perturbation_moves_vllm_logprob", moved, "> 1e-4", moved > 1e-4)
            effect = max(abs(a - b) for a, b in zip(lp_hf0, lp_hf1))
            # a stale engine (old CUDA graph / prefix cache) would miss HF by about the whole effect
            rep.add("perturbed_diff_over_hf_effect", d1 / max(effect, 1e-12), "<= 0.25", d1 <= 0.25 * effect)
            greedy_perturbed = [c.text for c in vl.generate(batch, sp_greedy)]
            changed = sum(a != b for a, b in zip(greedy_before, greedy_perturbed))
            rep.add("greedy_completions_changed_by_perturbation", changed)
        finally:
            vl.es_restore()
    restored = vl.es_weights_hash()
    rep.add("restore_exact", restored == start and hp.weights_hash() == start, "True",
            restored == start and hp.weights_hash() == start)  # fmt: skip
    greedy_after = [c.text for c in vl.generate(batch, sp_greedy)]
    same_greedy = greedy_after == greedy_before
    rep.add("greedy_after_restore_identical", same_greedy, "True", same_greedy)

    seeds = [SEED + 1, SEED + 1, SEED + 2, SEED + 2]
    record = GenerationRecord(generation=0, seeds=seeds, signs=[1, -1, 1, -1], rewards=[0.9, 0.1, 0.4, 0.6],
                              coeffs=[1.2, -1.2, -0.4, 0.4], sigma=args.sigma, alpha=5e-4,
                              scope=scope.to_dict(), master_dtype="float32")  # fmt: skip
    t0 = time.perf_counter()
    stats_hf = record.apply(hp)
    rep.add("hf_update_s", round(time.perf_counter() - t0, 3))
    record.weight_hash_after = hp.weights_hash()
    t0 = time.perf_counter()
    stats_vl, after = vl.es_update(record, check_hash=False)
    rep.add("vllm_update_s", round(time.perf_counter() - t0, 3))
    rep.add("update_hash_equal", after == record.weight_hash_after, "True", after == record.weight_hash_after)
    cmp = vl.es_compare(str(dump(hp, tmp / "hf_updated.safetensors")))
    rep.add("update_max_abs_diff", cmp["max_abs_diff"], "== 0", cmp["max_abs_diff"] == 0 and not cmp["missing"])
    rep.add("update_changed_fraction", stats_vl.changed_fraction)
    rep.add("update_norm_equal", stats_vl.update_norm == stats_hf.update_norm, "True",
            stats_vl.update_norm == stats_hf.update_norm)  # fmt: skip
    hf.close()
    del hp
    torch.cuda.empty_cache()

    # 3. throughput ---------------------------------------------------------------------------
    sp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.7, top_p=0.8, top_k=20, seed=1)
    vl.generate(batch[:4], sp)  # warm-up
    t0 = time.perf_counter()
    tokens = sum(c.completion_tokens for c in vl.generate(batch, sp))
    pure = tokens / (time.perf_counter() - t0)
    rep.add("pure_inference_tokens_per_s", round(pure, 1))
    es_tokens, t_perturb, t_restore = 0, 0.0, 0.0
    t0 = time.perf_counter()
    for m in range(args.members):
        a = time.perf_counter()
        vl.es_perturb(SEED + 100 + m // 2, args.sigma, SIGNS[m % 2])
        b = time.perf_counter()
        es_tokens += sum(c.completion_tokens for c in vl.generate(batch, sp.with_seed(m)))
        c = time.perf_counter()
        vl.es_restore()
        t_perturb, t_restore = t_perturb + (b - a), t_restore + (time.perf_counter() - c)
    es_tps = es_tokens / (time.perf_counter() - t0)
    rep.add("es_generation_tokens_per_s", round(es_tps, 1))
    rep.add("perturb_s_per_member", round(t_perturb / args.members, 3))
    rep.add("restore_s_per_member", round(t_restore / args.members, 3))
    rep.add("es_over_pure_throughput", round(es_tps / pure, 3), ">= 0.5", es_tps / pure >= 0.5)
    final = vl.es_weights_hash() == after
    rep.add("weights_unchanged_after_es_generations", final, "True", final)
    vl.close()
    return rep.finish(args.json_out)


if __name__ == "__main__":
    sys.exit(main())

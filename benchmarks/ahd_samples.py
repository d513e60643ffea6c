"""Samples that count: per problem and arm, how many LLM samples give valid, novel heuristics, at what token cost,
whether LLM children beat their parents, and where the best heuristic's gain over the seed came from.

Everything is read from each run's ``store.sqlite`` (and its ``config.yaml``); per run:

* ``valid %``: LLM heuristic calls (the sample budget's unit; reflections left out) whose code ran valid on the
  training instances (valid samples and behavioural duplicates: both were evaluated valid), over all calls;
* ``valid-and-novel %``: of those, the ones whose per-instance training objectives (``metrics["objectives"]``)
  differ from every earlier heuristic of the run (the problem's seed heuristic, the run's published seeds and
  every earlier valid or behaviourally duplicate trajectory, LLM or ``tune``, in id order): computed here from
  the store for every run alike, so a run made before the sampler recorded ``behavioural_duplicate`` (or with
  ``reject_same_behaviour: false``) is counted the same way; code duplicates are never evaluated and never novel;
* ``tokens / valid``: completion tokens of every LLM call (reflections and repairs included) per valid heuristic
  (and per valid-and-novel one);
* ``children > parent``: valid LLM children (operators e1, e2, m1-m3, repair) whose training objective beats
  their best parent's (``meta["parent_objective"]``);
* repairs (operator ``repair``): made, valid, valid-and-novel, their completion tokens, repeating the failure they
  repair; per arm, valid heuristics per 1,000 completion tokens of the repairs against that of the other calls
  (a repair pays when its rate is the higher: the same seeds give the same first samples with repair on or off);
* the held-out best: the run's best heuristic (its ``heuristic`` artifact) and the problem's seed heuristic on the
  run's held-out sets (``test_sizes`` x ``test_count``, its ``test_seed``), objective and gap to the reference
  (:func:`ahd_compare.heldout_rows`);
* gain attribution: the best's training objective against the *seed* (the best of the heuristics the run started
  from: ``include_seed_heuristic`` / ``seed_heuristics``, else the problem's seed heuristic). Following the
  provenance in the store from the best to its root (each trajectory's best parent among ``meta["parent_ids"]``,
  a ``tune`` variant's parent, a repair's parents), each step's gain goes to ``tune`` (operator ``tune``) or to
  the LLM (any other operator; an ``i1`` root's gain over the seed too); a root that is a worse seed than the
  seed gives a negative ``start`` term. ``llm + tune + start`` = the best's gain over the seed (in the problem's
  direction: positive is better).

Arms (``--arms``; ``main``: ``configs/ahd/<problem>.yaml``, the main job, EoH + ES + tune; other families:
``configs/ahd/<family>/<problem>.yaml``): :data:`ARMS`, e.g. ``main+repair`` (EoH's ``repair`` on) and
``main_noise`` (the ES noise-only control, ``evolvers.es.alpha=0``). More with ``--arm NAME=FAMILY[:KEY=VALUE;...]``
(``{ahd}`` in a key stands for the run's AHD evolver), e.g. an answer-format setting::

    --arm 'new=main:evolvers.{ahd}.SETTING=VALUE' --arm 'new+repair=main:evolvers.{ahd}.SETTING=VALUE;evolvers.{ahd}.repair=true'

Two modes:

(a) run the arms for problems x seeds, then summarise them (runs go to ``OUT/<problem>/<arm>/seed<S>``; a finished
    run, marked by ``samples_run.json`` with the same settings, is reused; an interrupted one resumes from its last
    completed step; Ctrl-C checkpoints the current run and stops; machinery of :mod:`ahd_compare`)::

        .venv/bin/python benchmarks/ahd_samples.py --problems tsp_construct,kp_construct,cvrp_construct,bpp_online \\
            --seeds 2024,2025,2026 --arms main,main+repair,main_noise --out runs/ahd_samples

(b) summarise existing run folders (a run folder, or a folder holding run folders at any depth; the arm is the
    folder above ``seed<S>``, else the run's ``run.name``)::

        .venv/bin/python benchmarks/ahd_samples.py --summarise runs/ahd_samples runs/main_job --out runs/ahd_samples

Smoke run on the tiny random model (the point is the flow; its samples are garbage)::

    .venv/bin/python benchmarks/ahd_samples.py --problems tsp_construct --seeds 1 --arms eoh,eoh+repair \\
        --model tiny:micro --max-samples 4 --ahd-set population_size=2 --ahd-set train_count=2 \\
        --ahd-set test_count=2 --ahd-set 'test_sizes=[10]' --set sampling.max_new_tokens=16 --out /tmp/ahd_samples

Output: ``OUT/samples.md`` (per problem and arm, means over seeds), ``OUT/samples.jsonl`` (``{"type": "run" |
"arm", ...}`` rows, then one ``{"type": "metric", "metric", "value", "goal", "met"}`` per goal of issue 43:
valid >= 60 %, valid-and-novel >= 40 %, tokens per valid heuristic <= 1/4 of the ``--today`` arm's (TSP today:
9,080 tokens for 5 valid), an LLM child beating its best parent in >= 2 of 3 seeds), the metric lines on stdout,
and ``OUT/ahd_samples.png`` (:func:`plot`). Held-out evaluations are cached in ``OUT/heldout_cache.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import ahd_compare

from coevo.ahd.sampler import behaviour_key
from coevo.config import load_config
from coevo.errors import UserError
from coevo.tables import md_table

#: arm -> (config family: "main" = configs/ahd/<problem>.yaml, else configs/ahd/<family>/<problem>.yaml,
#: overrides; ``{ahd}`` is the run's AHD evolver)
ARMS: dict[str, tuple[str, list[str]]] = {
    "main": ("main", []),
    "main+repair": ("main", ["evolvers.{ahd}.repair=true"]),
    "main_noise": ("main", list(ahd_compare.NOISE_SETS)),
    "eoh": ("eoh", []),
    "eoh+repair": ("eoh", ["evolvers.{ahd}.repair=true"]),
    "eoh_es": ("eoh_es", []),
    "eoh_es+repair": ("eoh_es", ["evolvers.{ahd}.repair=true"]),
    "eoh_es_noise": ("eoh_es", list(ahd_compare.NOISE_SETS)),
    "sample": ("sample", []),
    "sample+repair": ("sample", ["evolvers.{ahd}.repair=true"]),
}
#: TSP main job before issue 43 (fresh clone, seed 2024): 9,080 completion tokens for 5 valid heuristics
TODAY_TSP_TOKENS_PER_VALID = 9080 / 5
#: operators of LLM children (a repair keeps the failed child's parents)
CHILD_OPERATORS = {"e1", "e2", "m1", "m2", "m3", "repair"}
DONE = "samples_run.json"


# ----------------------------------------------------------------------------------------------- running
def config_path(family: str, problem: str) -> Path:
    """The shipped config of an arm's family for ``problem``.

    Raises:
        ValueError: no such config file.
    """
    path = ROOT / "configs" / "ahd" / (f"{problem}.yaml" if family == "main" else f"{family}/{problem}.yaml")
    if not path.is_file():
        raise ValueError(f"--arms: no config {path.relative_to(ROOT)} for family {family!r}")
    return path


def parse_arm(text: str) -> tuple[str, tuple[str, list[str]]]:
    """``NAME=FAMILY[:KEY=VALUE;...]`` -> (name, (family, overrides)).

    Raises:
        ValueError: no ``=`` or an empty name / family.
    """
    name, sep, rest = text.partition("=")
    family, _, sets = rest.partition(":")
    if not sep or not name.strip() or not family.strip():
        raise ValueError(f"--arm: expected NAME=FAMILY[:KEY=VALUE;...], got {text!r}")
    return name.strip(), (family.strip(), [s.strip() for s in sets.split(";") if s.strip()])


def arm_settings(problem: str, arm: str, seed: int, args: argparse.Namespace) -> tuple[Path, list[str]]:
    """The config path and the overrides of one run: the arm's, then the seed, model and command-line ones."""
    family, arm_sets = args.arm_table[arm]
    path = config_path(family, problem)
    cfg, _ = load_config(path)
    ahd = ahd_compare.ahd_spec(cfg).name
    sets = [s.replace("{ahd}", ahd) for s in arm_sets]
    sets += [f"run.seed={seed}", "report.plots=false"]
    if args.model:
        sets.append(f"model.name={args.model}")
        if args.model.startswith("tiny:"):
            sets.append("model.dtype=float32")
    if args.max_samples is not None:
        sets.append(f"budget.max_samples={args.max_samples}")
    sets += [*args.set, *(f"evolvers.{ahd}.{kv}" for kv in args.ahd_set)]
    return path, sets


def run_arm(problem: str, arm: str, seed: int, args: argparse.Namespace) -> Path:
    """Run (or reuse, or resume) one run; returns its folder.

    Raises:
        ValueError: the folder holds a run of other settings. ahd_compare.Interrupted: SIGINT / SIGTERM.
    """
    path, sets = arm_settings(problem, arm, seed, args)
    out = Path(args.out) / problem / arm / f"seed{seed}"
    label = f"{problem} {arm} seed {seed}"
    done = out / DONE
    if done.is_file():
        prev = json.loads(done.read_text())
        if prev["settings"] != sets:
            raise ValueError(f"{out} holds a run of other settings ({prev['settings']}); use another --out")
        print(f"# {label}: finished before, reused", file=sys.stderr)
        return out
    started = time.time()
    loop = ahd_compare.start_loop(path, sets, out, label)
    summary = loop.run(handle_signals=True)
    if summary.interrupted:
        raise ahd_compare.Interrupted(f"{label}: {summary.stop_reason}")
    doc = {"settings": sets, "stop_reason": summary.stop_reason, "wall_s": round(time.time() - started, 1)}
    done.write_text(json.dumps(doc, indent=1))
    print(f"# {label}: {summary.samples} samples, {doc['wall_s']} s; {summary.stop_reason}", file=sys.stderr)
    return out


# ----------------------------------------------------------------------------------------------- reading
def find_runs(roots: list[str]) -> list[Path]:
    """Run folders (``store.sqlite`` beside ``config.yaml``) at or under each root, sorted."""
    found: set[Path] = set()
    for root in map(Path, roots):
        if (root / "store.sqlite").is_file():
            found.add(root)
        found.update(p.parent for p in root.rglob("store.sqlite") if (p.parent / "config.yaml").is_file())
    return sorted(found)


def _evaluated(t) -> bool:
    """Whether a heuristic trajectory's code ran valid on the training instances (a behavioural duplicate did)."""
    return t.valid or t.failure == "behavioural_duplicate"


def _better(a: float, b: float, direction: str) -> bool:
    return a < b if direction == "minimize" else a > b


def _gain(parent: float, child: float, direction: str) -> float:
    """How much better ``child`` is than ``parent`` (positive is better, problem units)."""
    return parent - child if direction == "minimize" else child - parent


class HeldoutCache:
    """Held-out rows per (run folder, best code), kept in a JSON file so a second summary evaluates nothing."""

    def __init__(self, path: Path):
        self.path = path
        self.data = json.loads(path.read_text()) if path.is_file() else {}

    def get(self, key: str, make) -> dict[str, Any]:
        if key not in self.data:
            self.data[key] = {str(k): v for k, v in make().items()}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.data, indent=1))
        return self.data[key]


def read_run(run_dir: Path, arm: str | None, cache: HeldoutCache) -> dict[str, Any] | None:
    """The per-run row of the module docstring, or None when the store holds no heuristic sample."""
    from coevo.ahd.population import Individual
    from coevo.artifacts import HEURISTIC
    from coevo.budget import Budget
    from coevo.evolvers.base import RunContext, resolve_evolver
    from coevo.store import TrajectoryStore

    cfg, _ = load_config(run_dir / "config.yaml")
    spec = ahd_compare.ahd_spec(cfg)
    if arm is None:
        arm = run_dir.parent.name if run_dir.name.startswith("seed") else cfg.run.name
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as store:
        first = store.query(limit=1, with_steps=False)
        if not first:
            return None
        run_id = first[0].run_id
        trajs = store.query(run_id=run_id, order_by="id", with_steps=False)
        ctx = RunContext(run_id=run_id, run_dir=run_dir, store=store, budget=Budget(store, run_id), seed=cfg.run.seed)
        ev = resolve_evolver(spec.type)(spec.name, spec.params, ctx)
        art = store.get_artifact(HEURISTIC, f"{ev.problem.name}/{spec.name}")
        problem, direction = ev.problem, ev.problem.direction
        ours = [t for t in trajs if t.meta.get("sampler") == spec.name and t.meta.get("problem") == problem.name]
        # the seeds: the problem's seed heuristic and the published ones the run starts from
        seeds: dict[str, tuple[float, str | None]] = {}
        names = [None, *spec.params.seed_heuristics]
        for name in names:
            code = problem.seed_heuristic_code() if name is None else problem.published_heuristic_code(name)
            res = ev.sampler.evaluate([code])[0]
            if res.valid:
                seeds["seed" if name is None else f"seed:{name}"] = (
                    res.objective,
                    behaviour_key(res.metrics.get("objectives")),
                )
        with_nn = getattr(spec.params, "include_seed_heuristic", False)  # an EoH setting
        started = [k for k in seeds if k != "seed" or with_nn]
        start_ids = started or ["seed"]
        pick = min if direction == "minimize" else max
        seed_id = pick((k for k in start_ids if k in seeds), key=lambda k: seeds[k][0])
        seed_objective = seeds[seed_id][0]

        llm = [t for t in ours if t.llm_calls > 0]
        heur = [t for t in llm if t.meta.get("kind") != "reflection"]
        calls = sum(t.llm_calls for t in heur)
        seen = {b for _, b in seeds.values() if b is not None}
        novel_ids: set[int] = set()
        for t in ours:  # id order: LLM samples and tune variants alike
            if not _evaluated(t):
                continue
            b = behaviour_key((t.meta.get("metrics") or {}).get("objectives"))
            if b is not None and b not in seen:
                seen.add(b)
                novel_ids.add(t.id)
        valid = [t for t in heur if _evaluated(t)]
        novel = [t for t in valid if t.id in novel_ids]
        tokens = sum(t.completion_tokens for t in llm)
        children = [t for t in valid if t.meta.get("operator") in CHILD_OPERATORS]
        better = [
            t
            for t in children
            if t.meta.get("parent_objective") is not None
            and _better(t.meta["objective"], t.meta["parent_objective"], direction)
        ]
        repairs = [t for t in heur if t.meta.get("operator") == "repair"]
        row: dict[str, Any] = {
            "problem": problem.name,
            "arm": arm,
            "seed": cfg.run.seed,
            "run_dir": str(run_dir),
            "direction": direction,
            "llm_calls": calls,
            "valid": len(valid),
            "valid_novel": len(novel),
            "valid_percent": 100 * len(valid) / calls if calls else None,
            "valid_novel_percent": 100 * len(novel) / calls if calls else None,
            "completion_tokens": tokens,
            "tokens_per_valid": tokens / len(valid) if valid else None,
            "tokens_per_valid_novel": tokens / len(novel) if novel else None,
            "children": len(children),
            "children_better_than_parent": len(better),
            "repairs": len(repairs),
            "repairs_valid": sum(_evaluated(t) for t in repairs),
            "repairs_valid_novel": sum(t.id in novel_ids for t in repairs),
            "repair_completion_tokens": sum(t.completion_tokens for t in repairs),
            "repairs_repeating_failure": sum(bool(t.meta.get("repeats_failure")) for t in repairs),
            "failures": dict(Counter(t.failure or "valid" for t in heur)),
            "seed_id": seed_id,
            "seed_objective": seed_objective,
        }
        if art is None:
            row.update(best_id=None, heldout={}, gain={})
            return row
        best = Individual.from_dict({k: v for k, v in art.content.items() if k not in ("problem", "instances")})
        row.update(best_id=best.id, best_objective=best.objective, best_operator=best.operator)
        row["gain"] = attribute_gain(best, {t.key.split("/", 1)[-1]: t for t in ours}, seeds, seed_id, direction)
        ev.best = best
        key = f"{run_dir.resolve()}|{best.code_hash}"
        row["heldout"] = cache.get(key, lambda: ahd_compare.heldout_rows(ev))
    return row


def attribute_gain(
    best, by_id: dict[str, Any], seeds: dict[str, tuple[float, str | None]], seed_id: str, direction: str
) -> dict[str, Any]:
    """Split the best's training gain over the seed into ``llm``, ``tune`` and ``start`` (module docstring),
    following each individual's best parent; ``path`` lists the ids from the best to its root."""
    seed_obj = seeds[seed_id][0]

    def objective(ident: str) -> float | None:
        if ident in seeds:
            return seeds[ident][0]
        t = by_id.get(ident)
        return None if t is None else t.meta.get("objective")

    out = {"llm": 0.0, "tune": 0.0, "start": 0.0, "path": [best.id]}
    ident, obj = best.id, best.objective
    for _ in range(10_000):  # a provenance chain is finite; the bound guards a corrupt store
        if ident in seeds:
            out["start"] += _gain(seed_obj, obj, direction)
            break
        t = by_id.get(ident)
        parents = [(p, objective(p)) for p in (t.meta.get("parent_ids") or [])] if t is not None else []
        parents = [(p, o) for p, o in parents if o is not None]
        op = t.meta.get("operator") if t is not None else None
        to = "tune" if op == "tune" else "llm"
        if not parents:  # an i1 sample (or a record without parents): its gain over the seed
            out[to] += _gain(seed_obj, obj, direction)
            break
        parent, p_obj = (min if direction == "minimize" else max)(parents, key=lambda po: po[1])
        out[to] += _gain(p_obj, obj, direction)
        ident, obj = parent, p_obj
        out["path"].append(ident)
    out["total"] = _gain(seed_obj, best.objective, direction)
    return out


# ----------------------------------------------------------------------------------------------- summary
def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.fmean(vals) if vals else None


def _per_1k(count: int, tokens: int) -> float | None:
    return 1000 * count / tokens if tokens else None


def arm_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (problem, arm): means over the seeds (tokens per valid pooled: all tokens over all valid)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["problem"], r["arm"]), []).append(r)
    out = []
    for (problem, arm), rs in sorted(groups.items()):
        valid, novel, tokens = (
            sum(r["valid"] for r in rs),
            sum(r["valid_novel"] for r in rs),
            sum(r["completion_tokens"] for r in rs),
        )
        sizes = sorted({int(s) for r in rs for s in r["heldout"]})
        gains = [r["gain"] for r in rs if r["gain"]]
        out.append(
            {
                "problem": problem,
                "arm": arm,
                "seeds": sorted(r["seed"] for r in rs),
                "llm_calls": sum(r["llm_calls"] for r in rs),
                "valid_percent": _mean([r["valid_percent"] for r in rs]),
                "valid_novel_percent": _mean([r["valid_novel_percent"] for r in rs]),
                "tokens_per_valid": tokens / valid if valid else None,
                "tokens_per_valid_novel": tokens / novel if novel else None,
                "runs_child_better_than_parent": sum(r["children_better_than_parent"] > 0 for r in rs),
                "children_better_than_parent": sum(r["children_better_than_parent"] for r in rs),
                "repairs": sum(r["repairs"] for r in rs),
                "repairs_valid": sum(r["repairs_valid"] for r in rs),
                "valid_per_1k_tokens_first": _per_1k(
                    sum(r["valid"] - r["repairs_valid"] for r in rs),
                    sum(r["completion_tokens"] - r["repair_completion_tokens"] for r in rs),
                ),
                "valid_per_1k_tokens_repairs": _per_1k(
                    sum(r["repairs_valid"] for r in rs), sum(r["repair_completion_tokens"] for r in rs)
                ),
                "novel_per_1k_tokens_first": _per_1k(
                    sum(r["valid_novel"] - r["repairs_valid_novel"] for r in rs),
                    sum(r["completion_tokens"] - r["repair_completion_tokens"] for r in rs),
                ),
                "novel_per_1k_tokens_repairs": _per_1k(
                    sum(r["repairs_valid_novel"] for r in rs), sum(r["repair_completion_tokens"] for r in rs)
                ),
                "heldout_best": {
                    size: _mean([(r["heldout"].get(str(size)) or {}).get("best_objective") for r in rs])
                    for size in sizes
                },
                "heldout_gap": {
                    size: _mean([(r["heldout"].get(str(size)) or {}).get("best_gap") for r in rs]) for size in sizes
                },
                "gain_llm": _mean([g["llm"] for g in gains]),
                "gain_tune": _mean([g["tune"] for g in gains]),
                "gain_start": _mean([g["start"] for g in gains]),
                "gain_total": _mean([g["total"] for g in gains]),
            }
        )
    return out


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def table(arms: list[dict[str, Any]]) -> str:
    """The Markdown table of :func:`arm_rows`."""
    head = [
        "problem",
        "arm",
        "seeds",
        "calls",
        "valid %",
        "valid+novel %",
        "tokens/valid",
        "tokens/novel",
        "runs with child > parent",
        "repairs (valid)",
        "valid per 1k tokens: first / repairs",
        "held-out best (gap %)",
        "gain: LLM / tune / start / total",
    ]
    rows = []
    for a in arms:
        held = ", ".join(
            f"n{s} {_fmt(a['heldout_best'][s], 4)} ({_fmt(a['heldout_gap'][s], 2)})" for s in a["heldout_best"]
        )
        gain = " / ".join(_fmt(a[k], 4) for k in ("gain_llm", "gain_tune", "gain_start", "gain_total"))
        rows.append(
            [
                a["problem"],
                a["arm"],
                len(a["seeds"]),
                a["llm_calls"],
                _fmt(a["valid_percent"]),
                _fmt(a["valid_novel_percent"]),
                _fmt(a["tokens_per_valid"], 0),
                _fmt(a["tokens_per_valid_novel"], 0),
                f"{a['runs_child_better_than_parent']}/{len(a['seeds'])}",
                f"{a['repairs']} ({a['repairs_valid']})",
                f"{_fmt(a['valid_per_1k_tokens_first'], 2)} / {_fmt(a['valid_per_1k_tokens_repairs'], 2)}",
                held or "-",
                gain,
            ]
        )
    return md_table(head, rows)


def goal_metrics(arms: list[dict[str, Any]], today: str) -> list[dict[str, Any]]:
    """One metric per goal of issue 43 and (problem, arm)."""
    out = []

    def emit(name: str, value: Any, goal: str, met: bool | None) -> None:
        out.append({"metric": name, "value": value, "goal": goal, "met": met})

    base = {a["problem"]: a for a in arms if a["arm"] == today}
    for a in arms:
        tag = f"{a['problem']}/{a['arm']}"
        v, n = a["valid_percent"], a["valid_novel_percent"]
        emit(f"samples_valid_percent/{tag}", _round(v), ">= 60 % of LLM samples valid", v is not None and v >= 60)
        emit(f"samples_valid_novel_percent/{tag}", _round(n), ">= 40 % valid and novel", n is not None and n >= 40)
        ref = base.get(a["problem"], {}).get("tokens_per_valid")
        if a["problem"] == "tsp_construct" and ref is None:
            ref = TODAY_TSP_TOKENS_PER_VALID
        t = a["tokens_per_valid"]
        emit(
            f"samples_tokens_per_valid/{tag}",
            _round(t),
            f"<= 1/4 of today's ({today!r} arm, TSP before issue 43: 1,816) = {_round(ref / 4) if ref else '-'}",
            None if ref is None else (t is not None and t <= ref / 4),
        )
        k, s = a["runs_child_better_than_parent"], len(a["seeds"])
        emit(
            f"samples_runs_llm_child_beats_parent/{tag}",
            f"{k}/{s}",
            ">= 2 of 3 seeds: an LLM-written child (not tune) beats its best parent on training",
            k >= math.ceil(2 * s / 3),
        )
    return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def plot(runs: list[dict[str, Any]], path: Path) -> Path | None:
    """Write a PNG: one column per problem; top, valid % and valid-and-novel % per arm (bars: means over seeds,
    dots: seeds); bottom, completion tokens per valid heuristic (log scale). None when there are no runs."""
    if not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = sorted({r["problem"] for r in runs})
    fig, axes = plt.subplots(2, len(problems), figsize=(4.8 * len(problems), 6.4), squeeze=False)
    for col, problem in enumerate(problems):
        rs = [r for r in runs if r["problem"] == problem]
        arms = sorted({r["arm"] for r in rs})
        top, bottom = axes[0][col], axes[1][col]
        for x, arm in enumerate(arms):
            ar = [r for r in rs if r["arm"] == arm]
            for dx, key, color, label in (
                (-0.2, "valid_percent", "tab:blue", "valid"),
                (0.2, "valid_novel_percent", "tab:green", "valid and novel"),
            ):
                vals = [r[key] for r in ar if r[key] is not None]
                mean = statistics.fmean(vals) if vals else 0
                top.bar(x + dx, mean, width=0.38, color=color, alpha=0.6, label=label if x == 0 else None)
                top.scatter([x + dx] * len(vals), vals, color=color, s=12, zorder=3)
            tok = [r["tokens_per_valid"] for r in ar if r["tokens_per_valid"] is not None]
            bottom.scatter([x] * len(tok), tok, color="tab:purple", zorder=3)
            if len(tok) < len(ar):
                bottom.scatter([x], [1.0], marker="x", color="tab:red", zorder=3)
        top.axhline(60, color="tab:blue", linestyle="--", linewidth=1)
        top.axhline(40, color="tab:green", linestyle="--", linewidth=1)
        top.set_title(problem)
        top.set_ylabel("% of LLM calls (dashed: goals)")
        top.legend(fontsize=7, loc="upper right")
        top.set_ylim(0, 100)
        bottom.set_yscale("log")
        bottom.set_ylabel("tokens per valid heuristic (x: none)")
        for ax in (top, bottom):
            ax.set_xticks(range(len(arms)), arms, rotation=20, fontsize=8)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--problems", default="tsp_construct,kp_construct,cvrp_construct,bpp_online")
    p.add_argument("--seeds", default="2024,2025,2026", help="comma-separated run seeds")
    p.add_argument("--arms", default="main,main+repair,main_noise", help=f"comma-separated; known: {', '.join(ARMS)}")
    p.add_argument("--arm", action="append", default=[], metavar="NAME=FAMILY[:KEY=VALUE;...]", help="an extra arm")
    p.add_argument("--model", default=None, help="model name, local folder or tiny:<preset> (default: the config's)")
    p.add_argument("--max-samples", type=int, default=None, help="budget.max_samples of every run (default: config's)")
    p.add_argument("--set", action="append", default=[], metavar="A.B=VALUE", help="extra config override")
    p.add_argument("--ahd-set", action="append", default=[], metavar="KEY=VALUE", help="evolvers.<AHD evolver>.KEY")
    p.add_argument("--today", default="main", help="the arm whose tokens per valid heuristic the goal divides by 4")
    p.add_argument("--summarise", nargs="+", metavar="DIR", help="summarise existing run folders; run nothing")
    p.add_argument("--out", default="runs/ahd_samples", help="folder of the runs and the summary")
    args = p.parse_args(argv)
    out = Path(args.out)
    args.arm_table = dict(ARMS)
    try:
        args.arm_table.update(parse_arm(a) for a in args.arm)
    except ValueError as exc:
        p.error(str(exc))
    if args.max_samples is not None and args.max_samples < 1:
        p.error(f"--max-samples: must be >= 1, got {args.max_samples}")

    labels: dict[Path, str | None] = {}
    if args.summarise:
        missing = [d for d in args.summarise if not Path(d).exists()]
        if missing:
            p.error(f"--summarise: no such folder {missing[0]}")
        labels = dict.fromkeys(find_runs(args.summarise))
        if not labels:
            p.error(f"--summarise: no run folder (store.sqlite + config.yaml) under {' '.join(args.summarise)}")
    else:
        arms = [a for a in args.arms.split(",") if a] + [parse_arm(a)[0] for a in args.arm]
        if unknown := [a for a in arms if a not in args.arm_table]:
            p.error(f"--arms: unknown arm {unknown[0]!r}; known: {', '.join(args.arm_table)} (or add one with --arm)")
        try:
            seeds = [int(x) for x in args.seeds.split(",") if x]
        except ValueError:
            p.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
        problems = [x for x in args.problems.split(",") if x]
        for seed in seeds:  # seed-major: a grid stopped part-way has every arm on the seeds it finished
            for problem in problems:
                for arm in dict.fromkeys(arms):
                    try:
                        labels[run_arm(problem, arm, seed, args)] = arm
                    except ahd_compare.Interrupted as exc:
                        print(f"# interrupted: {exc}; run the same command again to continue", file=sys.stderr)
                        return 130
                    except (ValueError, UserError) as exc:
                        print(f"ahd_samples: {exc}", file=sys.stderr)
                        return 2
    cache = HeldoutCache(out / "heldout_cache.json")
    runs = [r for d, arm in labels.items() if (r := read_run(d, arm, cache)) is not None]
    arms_summary = arm_rows(runs)
    text = table(arms_summary)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.md").write_text(text + "\n")
    metrics = goal_metrics(arms_summary, args.today)
    for m in metrics:
        print(json.dumps(m))
    with open(out / "samples.jsonl", "w") as fh:
        fh.writelines(
            json.dumps(rec) + "\n"
            for rec in [
                *({"type": "run", **r} for r in runs),
                *({"type": "arm", **a} for a in arms_summary),
                *({"type": "metric", **m} for m in metrics),
            ]
        )
    if png := plot(runs, out / "ahd_samples.png"):
        print(f"# plot: {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""AHD comparison: EoH, Sample and their ES variants (Agentic ESOpt), the (1+1)-EPS hill climber and ReEvo, at
matched LLM-sample budgets.

For every problem, method (``eoh``, ``sample``, ``eoh_es``, ``sample_es``, ``hillclimb``: LLM4AD's (1+1)-EPS,
Zhang et al., PPSN 2024, one incumbent improved by m1 variants, :mod:`coevo.evolvers.hillclimb`; ``reevo``: ReEvo,
Ye et al., NeurIPS 2024, :mod:`coevo.evolvers.reevo`, whose reflections count against the same budget; the shipped
configs ``configs/ahd/<method>/<problem>.yaml``; and the noise-only controls ``eoh_es_noise``, ``sample_es_noise``:
the ES arm's config with ``evolvers.es.alpha=0``, members perturbed but never updated) and seed, one real run
(:class:`coevo.loop.CoEvolutionLoop`) with ``budget.max_samples`` set to the same ``--max-samples`` for every
method; the ES variants' ``total_generations`` is the largest number of ES generations whose sigma schedule
(cosine 1e-3 -> 0) still reaches its last, zero-sigma generation within that budget (:func:`fit_es_generations`).
Each run's best heuristic is then evaluated on the held-out sizes (``--sizes``, default the config's
``test_sizes``).

A *setting* is (problem, held-out size, baseline method); the ES variant beats its baseline when its mean
best objective over the seeds both ran is better (direction-aware), counting runs without any valid heuristic
as losses: the variant wins if it found a valid heuristic in more of those seeds, or in as many and with a
better mean over them. Runs go seed by seed (every problem and method of one seed, then the next seed), so a
grid stopped part-way still compares every method on the seeds it finished. A run that the config's
wall-clock safety stop (``budget.max_wall_s``) ended before it used its sample budget did not get the matched
budget: the table shows its samples, and no setting compares it (metric ``ahd_runs_cut_by_wall_budget``).
Agentic ESOpt reports wins in 28 of 36 settings (docs/references.md §1).

Output: a Markdown table (per method / problem / size: runs with a best heuristic, mean +- std over seeds
of the best objective and of its gap to the problem's named reference, the seed heuristic's objective,
samples used, valid LLM samples and wall time per run), the win count, then one JSON line per metric
``{"metric", "value", "goal", "met"}``. The same goes to ``OUT/table.md`` and, as JSON lines, to
``OUT/table.jsonl`` (``{"type": "row" | "setting" | "metric", ...}``); ``OUT/results.json`` lists the runs and
``OUT/ahd_compare.png`` plots every run's best held-out objective against the seed heuristic's (:func:`plot`).

Resuming: each finished run writes ``OUT/<problem>/<method>/seed<S>/result.json`` (its settings, held-out
rows, samples, wall time). Running the same command again skips finished runs, resumes an interrupted one
from its last completed step (``CoEvolutionLoop(resume=True)``) and runs the rest; a folder holding a run
of other settings is an error (use a new ``--out``). Ctrl-C stops the current run cleanly (checkpoint) and
the benchmark exits; the next call continues there.

Per-problem options: ``--sizes tsp_construct=50,bpp_online=5000`` (a plain ``50`` applies to every
problem); ``--ahd-set KEY=VALUE`` sets ``evolvers.<AHD evolver>.KEY`` whatever the evolver is named (e.g.
``train_count=4``); ``--population-size N`` sets the EoH population of ``eoh`` and ``eoh_es`` alike (EoH
initialisation = 2N samples, so a smaller N leaves room for two ES generations in a small budget).

Smoke run on a tiny random model (both problems, every method, one seed; a few minutes of CPU)::

    .venv/bin/python benchmarks/ahd_compare.py --problems tsp_construct,bpp_online --seeds 2024 \\
        --max-samples 16 --population-size 2 --sizes tsp_construct=20,bpp_online=500 \\
        --ahd-set train_count=2 --ahd-set test_count=2 --set sampling.max_new_tokens=16 \\
        --model tiny:micro --seed-heuristic --out /tmp/ahd_compare_smoke

On the 0.5B model, TSP50 and Weibull 5k, the 4 EoH / Sample methods x 3 seeds (24 runs; the budget is per run;
``--methods`` left out adds the ``hillclimb`` arm, 30 runs)::

    .venv/bin/python benchmarks/ahd_compare.py --problems tsp_construct,bpp_online --seeds 2024,2025,2026 \\
        --methods eoh,sample,eoh_es,sample_es \\
        --max-samples 16 --population-size 2 --sizes tsp_construct=50,bpp_online=5000 \\
        --set 'sampling.stop=["\\n```\\n"]' --out runs/ahd_compare

16 samples is the smallest budget with two ES generations (EoH: 2N = 4 initial samples, then ES 4, EoH 4,
ES 4; Sample: batches of 4 likewise). Cost of one run: model load + 16 samples x up to 256 new tokens
+ training evaluations (TSP 8 x 50, BPP 5 x 1000 items: about 0.1-1 s each for numpy heuristics) + the
held-out evaluations of the seed and the best heuristic (TSP 16 x 50: under 1 s for nearest neighbour;
Weibull 5 x 5000: 19-49 s measured). Measured on a 2-core CPU with the 0.5B model in float32, two grid
processes side by side (one per problem, ``OMP_NUM_THREADS=1`` each): 7-14 min per run (a batch of 4
samples takes 2-5 min): one seed of both problems (8 runs) took 55 min, so the 24-run grid about 3 h
(one process at a time with both cores is not measured). The configs' ``budget.max_wall_s`` (1080 s for every
method) is a safety stop for hand runs: under heavier load it can cut a run before its 16th sample, and the benchmark
then leaves that seed out of the comparison (see above); on a loaded machine run one process at a time. The
stop string (the TSP configs' own) ends BPP samples at the closing code fence too.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml

from coevo.config import RunConfig, load_config
from coevo.errors import UserError
from coevo.evolvers import registered_evolvers
from coevo.tables import md_table

#: the +tune arms run tune with the main job's settings (configs/ahd/tsp_construct.yaml) over the run's top 4
POSTHOC_ELITES = 4


def main_tune_settings() -> dict[str, Any]:
    """The ``tune`` evolver's settings of the main job's config, with ``elites`` = :data:`POSTHOC_ELITES`."""
    cfg, _ = load_config(ROOT / "configs" / "ahd" / "tsp_construct.yaml")
    spec = next(e for e in cfg.evolvers if e.type == "tune")
    return {**spec.params.model_dump(exclude={"evolver"}), "elites": POSTHOC_ELITES}


METHODS = ("eoh", "sample", "eoh_es", "sample_es", "hillclimb", "reevo", "eoh_es_noise", "sample_es_noise")
#: the heuristic-design evolver types an arm's config may hold
AHD_TYPES = ("eoh", "sample", "hillclimb", "reevo")
BASELINE = {"eoh_es": "eoh", "sample_es": "sample"}
#: the noise-only controls of the ES arms: the ES arm's config with ``evolvers.es.alpha=0`` (members perturbed,
#: never updated; the seed paper's ablation, docs/field-notes §8); no config file of their own
NOISE = {"eoh_es_noise": "eoh_es", "sample_es_noise": "sample_es"}
NOISE_SETS = ["evolvers.es.alpha=0"]
#: ``<method>+tune`` arms (``--tune``): the method's run, then ``tune`` over its elites (:func:`tune_one`)
TUNED = tuple(f"{m}+tune" for m in METHODS)
#: every (variant, baseline) pair the table compares: ES vs none, tune vs none, and ES vs none under tune
COMPARISONS = (
    ("eoh_es", "eoh"),
    ("sample_es", "sample"),
    ("eoh+tune", "eoh"),
    ("sample+tune", "sample"),
    ("eoh_es+tune", "eoh_es"),
    ("sample_es+tune", "sample_es"),
    ("eoh_es+tune", "eoh+tune"),
    ("sample_es+tune", "sample+tune"),
    ("eoh_es", "eoh_es_noise"),
    ("sample_es", "sample_es_noise"),
    ("eoh_es_noise", "eoh"),
    ("sample_es_noise", "sample"),
)
PAPER_WINS, PAPER_SETTINGS = 28, 36
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"


def ahd_spec(cfg: RunConfig):
    """The run's heuristic-design evolver spec (a type of :data:`AHD_TYPES`)."""
    return next(e for e in cfg.evolvers if e.type in AHD_TYPES)


def es_spec(cfg: RunConfig):
    """The run's ES evolver spec, or None."""
    return next((e for e in cfg.evolvers if e.type == "es"), None)


def plan_steps(cfg: RunConfig) -> list[tuple[str, int]]:
    """The (evolver name, LLM samples) of each step the loop will run, until a budget stops it.

    Mirrors the loop: the schedule's due entries in order each round; the sample budget checked before
    every step (an AHD step is cut to what is left); an ES generation only when the budget covers all its
    members; ES stopping the run after ``total_generations``. Assumes every EoH operator
    weight is 1.0 (each offspring slot used), as in the shipped configs.

    Raises:
        ValueError: an EoH operator weight other than 1.0 (the count would be random).
    """
    ahd, es = ahd_spec(cfg), es_spec(cfg)
    if ahd.type == "eoh" and set(ahd.params.operators.values()) != {1.0}:
        raise ValueError(f"evolvers.{ahd.name}.operators: plan_steps needs every weight 1.0")
    budget = cfg.budget.max_samples or 10**9
    steps: list[tuple[str, int]] = []
    used = es_done = ahd_done = 0
    for round_index in range(cfg.budget.max_rounds):
        for entry in cfg.resolved_schedule():
            if not entry.due(round_index):
                continue
            if used >= budget:
                return steps
            if es is not None and entry.evolver == es.name:
                ro = es.params.rollout
                ops = ro.get("operators") or registered_evolvers()[ahd.type].member_operators
                n = es.params.population_size * ro["children_per_operator"] * len(ops)
                if es_done >= es.params.total_generations or n > budget - used:
                    return steps
                es_done += 1
            else:
                p = ahd.params
                if ahd.type in ("sample", "hillclimb"):
                    n = p.batch
                elif ahd.type == "reevo":  # pairs' reflections and crossovers, the long-term one, mutations
                    n = (
                        p.init_population_size
                        if ahd_done == 0
                        else 2 * p.population_size + 1 + max(1, int(p.population_size * p.mutation_rate))
                    )
                else:
                    n = (
                        2 * p.population_size
                        if ahd_done == 0
                        else len(p.operators) * (p.offspring_per_operator or p.population_size)
                    )
                ahd_done += 1
                n = min(n, budget - used)
            steps.append((entry.evolver, n))
            used += n
    return steps


def fit_es_generations(path: Path, overrides: list[str]) -> int:
    """The largest ``total_generations`` (>= 2) whose every ES generation runs within the sample budget.

    Raises:
        ValueError: not even 2 ES generations fit (raise ``--max-samples``).
    """
    best = 0
    for g in range(2, 200):
        cfg, _ = load_config(path, [*overrides, f"evolvers.es.total_generations={g}"])
        if sum(name == es_spec(cfg).name for name, _ in plan_steps(cfg)) < g:
            break
        best = g
    if best < 2:
        raise ValueError(f"{path}: the sample budget does not fit 2 ES generations; raise --max-samples")
    return best


@dataclass
class RunResult:
    problem: str
    method: str
    seed: int
    max_samples: int
    samples: int
    valid_samples: int
    wall_s: float
    stop_reason: str
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # size -> best/seed objective and gap
    settings: list[str] = field(default_factory=list)  # the config overrides the run was made with
    heldout_s: float | None = None  # wall time of the held-out evaluations (seed and best heuristic)

    @classmethod
    def load(cls, path: Path) -> RunResult:
        """A result written by :meth:`save` (JSON object; ``rows`` keys back to ints)."""
        doc = json.loads(path.read_text())
        doc["rows"] = {int(k): v for k, v in doc["rows"].items()}
        return cls(**doc)

    def save(self, path: Path) -> None:
        """Write this result as JSON (atomically: a temp file renamed over ``path``)."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=1))
        tmp.replace(path)


class Interrupted(Exception):
    """A run stopped on SIGINT / SIGTERM (checkpointed); the benchmark stops and can be rerun to continue."""


def run_settings(problem: str, method: str, seed: int, args: argparse.Namespace) -> tuple[Path, list[str]]:
    """The config path and the overrides of one run of the grid (the same budget for every method; a noise-only
    arm is its ES arm's config with :data:`NOISE_SETS`)."""
    path = ROOT / "configs" / "ahd" / NOISE.get(method, method) / f"{problem}.yaml"
    cfg, _ = load_config(path)
    ahd = ahd_spec(cfg)
    sets = [
        *(NOISE_SETS if method in NOISE else []),
        f"run.seed={seed}",
        f"model.name={args.model}",
        f"budget.max_samples={args.max_samples}",
        f"budget.max_rounds={4 * args.max_samples}",
        "report.plots=false",
        *args.set,
        *(f"evolvers.{ahd.name}.{kv}" for kv in args.ahd_set),
    ]
    if args.model.startswith("tiny:"):
        sets.append("model.dtype=float32")
    if args.seed_heuristic and ahd.type == "eoh":
        sets.append(f"evolvers.{ahd.name}.include_seed_heuristic=true")
    if args.population_size is not None and ahd.type == "eoh":
        sets.append(f"evolvers.{ahd.name}.population_size={args.population_size}")
    sizes = args.sizes.get(problem) or args.sizes.get("*")
    if sizes:
        sets.append(f"evolvers.{ahd.name}.test_sizes={json.dumps(sizes)}")
    if es_spec(cfg) is not None:
        sets.append(f"evolvers.es.total_generations={fit_es_generations(path, sets)}")
    return path, sets


def heldout_rows(ev) -> dict[int, dict[str, Any]]:
    """Held-out size -> the seed's and the best heuristic's objective and gap, and the reference, of an AHD
    evolver (:func:`coevo.report.ahd.comparison_rows`)."""
    from coevo.report.ahd import comparison_rows

    rows = {}
    for size, _n, seed_obj, seed_gap, best_obj, best_gap, ref, _beats in comparison_rows(ev):
        rows[int(size)] = {
            "seed_objective": seed_obj,
            "seed_gap": seed_gap,
            "best_objective": best_obj,
            "best_gap": best_gap,
            "reference": ref,
        }
    return rows


def start_loop(path: Path, sets: list[str], out: Path, label: str):
    """The :class:`~coevo.loop.CoEvolutionLoop` of run folder ``out`` for config ``path`` with overrides ``sets``:
    a new run, or the interrupted run there resumed from its last completed step (``label`` names it in the
    line saying so).

    Raises:
        ValueError: ``out`` holds a run of another config.
    """
    from coevo.loop import CoEvolutionLoop, new_run_dir

    cfg, raw = load_config(path, sets)
    if not (out / "config.yaml").is_file():
        return CoEvolutionLoop(cfg, new_run_dir(cfg, out), raw_config=raw, progress=False)
    from coevo.backends.factory import resolve_engine

    made, _ = load_config(out / "config.yaml")
    # the run's config.yaml holds the engine its `model.backend: auto` resolved to (coevo.backends.factory)
    cfg = cfg.model_copy(update={"model": resolve_engine(cfg.model)})
    if made.model_dump() != cfg.model_dump():
        raise ValueError(f"{out} holds a run of another config; use another --out")
    print(f"# {label}: resuming the interrupted run", file=sys.stderr)
    return CoEvolutionLoop(cfg, out, resume=True, progress=False)


def run_one(problem: str, method: str, seed: int, args: argparse.Namespace) -> RunResult:
    """One real run of ``configs/ahd/<method>/<problem>.yaml`` at the shared budget; returns its results.

    A finished run (``result.json`` with the same settings) is loaded, not rerun; an interrupted one is
    resumed (see the module docstring).

    Raises:
        ValueError: the run folder holds a run made with other settings.
        Interrupted: SIGINT / SIGTERM during the run (it is checkpointed; rerun the benchmark to continue).
    """
    from coevo.store import TrajectoryStore

    path, sets = run_settings(problem, method, seed, args)
    out = Path(args.out) / problem / method / f"seed{seed}"
    done = out / "result.json"
    if done.is_file():
        prev = RunResult.load(done)
        if prev.settings != sets:
            raise ValueError(f"{out} holds a run of other settings ({prev.settings}); use another --out")
        print(f"# {problem} {method} seed {seed}: finished before, skipped", file=sys.stderr)
        return prev
    started = time.time()
    loop = start_loop(path, sets, out, f"{problem} {method} seed {seed}")
    ev = loop.evolvers[ahd_spec(loop.config).name]
    summary = loop.run(handle_signals=True)
    if summary.interrupted:
        raise Interrupted(f"{problem} {method} seed {seed}: {summary.stop_reason}")
    rows = heldout_rows(ev)
    with TrajectoryStore(out / "store.sqlite", readonly=True) as store:
        # valid heuristics (a reflection call, EoH's `reflection`, is a valid LLM call but no heuristic)
        valid = sum(t.reward is not None for t in store.query(run_id=loop.run_id, valid=True, with_steps=False))
    result = RunResult(
        problem,
        method,
        seed,
        args.max_samples,
        summary.samples,
        valid,
        time.time() - started,
        summary.stop_reason,
        rows,
        sets,
        round(ev.heldout_s, 2),
    )
    result.save(done)
    return result


def tune_one(problem: str, method: str, seed: int, args: argparse.Namespace, base: RunResult) -> RunResult:
    """The ``<method>+tune`` arm of one grid cell: ``tune`` (the main job's settings, ``--tune-set`` overrides)
    over the elites of the finished ``<method>`` run, after its LLM budget is spent, then the better of the
    run's best and the tuned variants (training score) evaluated on the held-out sizes.

    This is a paired arm: it reuses the base run's LLM samples exactly (no new tokens), so ``+tune`` vs the
    base isolates what tuning adds. Tuning inside the loop (between rounds, the tuned variants becoming parents of
    later LLM children) is what the main job (``configs/ahd/tsp_construct.yaml``) runs. The base run's store is
    read only; the tuned variants go to ``OUT/<problem>/<method>+tune/seed<S>/store.sqlite``.
    """
    from coevo.ahd.population import Individual, survivors
    from coevo.artifacts import HEURISTIC
    from coevo.budget import Budget
    from coevo.evolvers.base import RunContext, resolve_evolver
    from coevo.evolvers.tune import TuneConfig, TuneEvolver
    from coevo.store import TrajectoryStore

    arm = f"{method}+tune"
    base_dir = Path(args.out) / problem / method / f"seed{seed}"
    out = Path(args.out) / problem / arm / f"seed{seed}"
    done = out / "result.json"
    settings = [*base.settings, *(f"tune.{kv}" for kv in args.tune_set)]
    if done.is_file():
        prev = RunResult.load(done)
        if prev.settings == settings:
            print(f"# {problem} {arm} seed {seed}: finished before, skipped", file=sys.stderr)
            return prev
    out.mkdir(parents=True, exist_ok=True)
    (out / "store.sqlite").unlink(missing_ok=True)
    cfg, _ = load_config(base_dir / "config.yaml")
    spec = ahd_spec(cfg)
    overrides = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.tune_set)}
    tune_cfg = TuneConfig(**{**main_tune_settings(), "evolver": spec.name, **overrides})
    started = time.time()
    with TrajectoryStore(base_dir / "store.sqlite", readonly=True) as src:
        run_id = src.query(limit=1, with_steps=False)[0].run_id
        recorded = [
            Individual.from_trajectory(t)
            for t in src.query(run_id=run_id, valid=True, with_steps=False)
            if t.meta.get("sampler") == spec.name and t.meta.get("code") and t.meta.get("objective") is not None
        ]
        art = src.get_artifact(HEURISTIC, f"{problem}/{spec.name}")
        best = (
            Individual.from_dict({k: v for k, v in art.content.items() if k not in ("problem", "instances")})
            if art
            else None
        )
    store = TrajectoryStore(out / "store.sqlite")
    ctx = RunContext(run_id=run_id, run_dir=out, store=store, budget=Budget(store, run_id), seed=seed)
    ahd = resolve_evolver(spec.type)(spec.name, spec.params, ctx)
    ctx.evolvers[spec.name] = ahd
    pool = recorded + ([best] if best else [])
    ahd.population = survivors(pool, max(len(pool), 1))
    tuner = TuneEvolver("tune", tune_cfg, ctx)
    ctx.evolvers["tune"] = tuner
    tuner.setup()
    tuner.step(0)
    ahd.best = best
    ahd.publish_best()
    rows = heldout_rows(ahd)
    improved = [r for r in tuner.tried.values() if r.get("status") == "improved"]
    result = RunResult(
        problem,
        arm,
        seed,
        base.max_samples,
        base.samples,
        base.valid_samples,
        base.wall_s + (time.time() - started),
        f"{base.stop_reason}; then tune: {tuner.evaluations} evaluations, {len(improved)} of {len(tuner.tried)} elites improved",
        rows,
        settings,
        round(ahd.heldout_s, 2),
    )
    store.close()
    result.save(done)
    return result


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    return statistics.fmean(xs), statistics.pstdev(xs) if len(xs) > 1 else 0.0


def _fmt(m: float | None, s: float | None, digits: int = 4) -> str:
    return "-" if m is None else f"{m:.{digits}f} +- {s:.{digits}f}"


def cut_by_wall(r: RunResult) -> bool:
    """Whether a run's wall-clock safety stop (the config's ``budget.max_wall_s``) ended it before it used its
    sample budget: such a run did not get the matched budget, so no setting compares it."""
    return r.samples < r.max_samples and r.stop_reason.startswith("wall-clock budget")


def summarise(results: list[RunResult], directions: dict[str, str]) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """Table rows per (problem, size, method) and the ES-vs-baseline comparisons per setting (on the seeds
    both methods finished within their sample budget: runs :func:`cut_by_wall` are left out)."""
    table, cells = [], {}
    keys = sorted({(r.problem, size) for r in results for size in r.rows})
    for problem, size in keys:
        for method in METHODS + TUNED:
            runs = [r for r in results if r.problem == problem and r.method == method and size in r.rows]
            if not runs:
                continue
            objs = [r.rows[size]["best_objective"] for r in runs if r.rows[size]["best_objective"] is not None]
            gaps = [r.rows[size]["best_gap"] for r in runs if r.rows[size]["best_gap"] is not None]
            cells[(problem, size, method)] = {
                r.seed: r.rows[size]["best_objective"] for r in runs if not cut_by_wall(r)
            }
            seed_obj = runs[0].rows[size]["seed_objective"]
            table.append(
                [
                    problem,
                    str(size),
                    method,
                    f"{len(objs)}/{len(runs)}",
                    _fmt(*_mean_std(objs)),
                    _fmt(*_mean_std(gaps), digits=2),
                    "-" if seed_obj is None else f"{seed_obj:.4f}",
                    f"{statistics.fmean(r.samples for r in runs):.1f}",
                    f"{statistics.fmean(r.valid_samples for r in runs):.1f}",
                    f"{statistics.fmean(r.wall_s for r in runs):.0f}",
                ]
            )
    settings = []
    for problem, size in keys:
        sign = 1.0 if directions[problem] == "minimize" else -1.0
        for variant, base in COMPARISONS:
            if (problem, size, variant) not in cells or (problem, size, base) not in cells:
                continue
            v_runs, b_runs = cells[(problem, size, variant)], cells[(problem, size, base)]
            paired = sorted(set(v_runs) & set(b_runs))  # a partial grid compares only the seeds both ran
            if not paired:
                continue
            vo = [v_runs[sd] for sd in paired if v_runs[sd] is not None]
            bo = [b_runs[sd] for sd in paired if b_runs[sd] is not None]
            vn = bn = len(paired)
            if len(vo) != len(bo):
                win = len(vo) > len(bo)
            else:
                win = bool(vo) and sign * statistics.fmean(vo) < sign * statistics.fmean(bo)
            settings.append(
                {
                    "problem": problem,
                    "size": size,
                    "variant": variant,
                    "baseline": base,
                    "win": win,
                    "variant_mean": _mean_std(vo)[0],
                    "baseline_mean": _mean_std(bo)[0],
                    "variant_found": f"{len(vo)}/{vn}",
                    "baseline_found": f"{len(bo)}/{bn}",
                    "seeds": paired,
                }
            )
    return table, settings


def plot(results: list[RunResult], directions: dict[str, str], path: Path) -> Path | None:
    """Write a PNG: one panel per (problem, held-out size), the best held-out objective of every run (one
    marker per seed, x = method, each ES variant beside its baseline), the seed heuristic's objective as a
    dashed line, runs without a valid heuristic as red crosses on the panel's top edge ("none"), runs
    :func:`cut_by_wall` hollow.

    Args:
        results: the finished runs (any subset of the grid).
        directions: problem -> "minimize" | "maximize" (shown in the y label).
        path: the PNG file to write (matplotlib Agg backend).

    Returns:
        ``path``, or None when no run has a held-out row (nothing to draw).
    """
    keys = sorted({(r.problem, size) for r in results for size in r.rows})
    if not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = {r.method for r in results}
    arms = [m for m in METHODS + TUNED if m in present]

    def rank(m: str) -> tuple[int, bool, bool, bool]:  # eoh, eoh+tune, eoh_es, eoh_es+tune, eoh_es_noise, ...
        root = m.split("+")[0]
        es = NOISE.get(root, root)
        return METHODS.index(BASELINE.get(es, es)), es in BASELINE, root in NOISE, m.endswith("+tune")

    order = sorted(arms, key=rank)
    seeds = sorted({r.seed for r in results})
    markers = dict(zip(seeds, "osD^v<>p*h" * (len(seeds) // 10 + 1)))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.8), squeeze=False)
    for ax, (problem, size) in zip(axes[0], keys):
        runs = [r for r in results if r.problem == problem and size in r.rows]
        values = [r.rows[size]["best_objective"] for r in runs] + [r.rows[size]["seed_objective"] for r in runs]
        finite = [v for v in values if v is not None]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        pad = max(hi - lo, 1e-3 * max(abs(hi), 1.0)) * 0.15
        top = hi + pad
        for x, method in enumerate(order):
            for k, r in enumerate(sorted((r for r in runs if r.method == method), key=lambda r: r.seed)):
                y = r.rows[size]["best_objective"]
                dx = (k - 1) * 0.08
                if y is None:
                    ax.scatter(x + dx, top, marker="x", color="tab:red", zorder=3)
                    continue
                hollow = cut_by_wall(r)
                ax.scatter(
                    x + dx,
                    y,
                    marker=markers[r.seed],
                    facecolors="none" if hollow else "tab:blue",
                    edgecolors="tab:blue",
                    label=f"seed {r.seed}",
                    zorder=3,
                )
        seed_objs = {r.rows[size]["seed_objective"] for r in runs} - {None}
        for v in seed_objs:
            ax.axhline(v, linestyle="--", color="grey", linewidth=1, label="seed heuristic")
        ax.set_ylim(lo - pad, top + pad)
        ax.set_xticks(range(len(order)), order)
        ax.set_title(f"{problem}, held-out n={size}")
        better = "lower" if directions.get(problem, "minimize") == "minimize" else "higher"
        ax.set_ylabel(f"best objective ({better} is better; x = none valid)")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(sorted(zip(labels, handles), key=lambda kv: (not kv[0].startswith("seed "), kv[0])))
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


HEADER = [
    "problem",
    "size",
    "method",
    "found",
    "best objective (mean +- std)",
    "gap % (mean +- std)",
    "seed heur.",
    "samples",
    "valid samples",
    "wall s per run",
]


def parse_sizes(text: str) -> dict[str, list[int]]:
    """``"50,100"`` -> {"*": [50, 100]}; ``"tsp_construct=50,bpp_online=5000"`` -> per problem ("*": all).

    Raises:
        ValueError: an entry that is not ``SIZE`` or ``PROBLEM=SIZE`` with an integer size.
    """
    out: dict[str, list[int]] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        problem, _, size = item.rpartition("=")
        out.setdefault(problem or "*", []).append(int(size))
    return out


def metric(name: str, value: Any, goal: str, met: bool, sink: list[dict[str, Any]] | None = None) -> None:
    """Print one metric JSON line (and append it to ``sink`` when given)."""
    row = {"metric": name, "value": value, "goal": goal, "met": bool(met)}
    print(json.dumps(row))
    if sink is not None:
        sink.append(row)


def main(argv: list[str] | None = None) -> int:
    from coevo.ahd.problem import load_problem

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--problems",
        default="tsp_construct,kp_construct,cvrp_construct,bpp_online",
        help="comma-separated problem names",
    )
    p.add_argument(
        "--sizes",
        default="",
        help="held-out sizes: SIZE,... for every problem or PROBLEM=SIZE,... (default: each config's test_sizes)",
    )
    p.add_argument("--seeds", default="2024,2025,2026", help="comma-separated run seeds (>= 3 for the std)")
    p.add_argument("--max-samples", type=int, default=36, help="LLM-sample budget of every run (matched)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="model name, local folder, or tiny:<preset> (smoke)")
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated subset of the methods (eoh_es_noise / sample_es_noise: the ES arm with alpha 0)",
    )
    p.add_argument(
        "--seed-heuristic",
        action="store_true",
        help="EoH methods start from the problem's seed heuristic (keeps a tiny-model smoke run going)",
    )
    p.add_argument("--set", action="append", default=[], metavar="A.B=VALUE", help="extra config override")
    p.add_argument(
        "--ahd-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override evolvers.<the AHD evolver>.KEY in every config (e.g. train_count=4)",
    )
    p.add_argument(
        "--population-size", type=int, default=None, help="EoH population N of eoh and eoh_es (init = 2N samples)"
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="add a <method>+tune arm per run: tune over the run's elites after its LLM budget (no new tokens)",
    )
    p.add_argument("--tune-set", action="append", default=[], metavar="KEY=VALUE", help="tune setting override")
    p.add_argument("--out", default="runs/ahd_compare", help="folder of the run folders (must not hold runs)")
    args = p.parse_args(argv)
    problems = [x for x in args.problems.split(",") if x]
    methods = [x for x in args.methods.split(",") if x]
    if unknown := set(methods) - set(METHODS):
        p.error(f"--methods: unknown {sorted(unknown)}; choose from {METHODS}")
    try:
        args.sizes = parse_sizes(args.sizes)
    except ValueError:
        p.error(f"--sizes: expected SIZE,... or PROBLEM=SIZE,..., got {args.sizes!r}")
    seeds = [int(x) for x in args.seeds.split(",") if x]
    directions = {name: load_problem(name).direction for name in problems}

    results, started = [], time.time()
    out = Path(args.out)
    for seed in seeds:  # seed-major: a grid stopped part-way has every method on the seeds it finished
        for problem in problems:
            for method in methods:
                try:
                    r = run_one(problem, method, seed, args)
                except Interrupted as exc:
                    print(f"# interrupted: {exc}; run the same command again to continue", file=sys.stderr)
                    return 130
                except (ValueError, UserError) as exc:  # bad settings, a run folder in use by another process
                    print(f"ahd_compare: {exc}", file=sys.stderr)
                    return 2
                arms = [r]
                if args.tune:
                    arms.append(tune_one(problem, method, seed, args, r))
                for r in arms:
                    results.append(r)
                    print(
                        f"# {problem} {r.method} seed {seed}: {r.samples}/{r.max_samples} samples, {r.valid_samples} "
                        f"valid, {r.wall_s:.0f} s (held-out evaluation {r.heldout_s} s); {r.stop_reason}",
                        file=sys.stderr,
                    )
    (out / "results.json").write_text(json.dumps([r.__dict__ for r in results], indent=1))

    table, all_settings = summarise(results, directions)
    settings = [s for s in all_settings if (s["variant"], s["baseline"]) in BASELINE.items()]
    tune_settings = [s for s in all_settings if s["variant"].endswith("+tune") and not s["baseline"].endswith("+tune")]
    es_tuned = [s for s in all_settings if s["baseline"].endswith("+tune")]
    wins = sum(s["win"] for s in settings)
    lines = [
        f"AHD comparison: {len(seeds)} seeds, {args.max_samples} LLM samples per run, model {args.model}",
        "",
        md_table(HEADER, table),
        "",
        (
            f"ES variant beats its matched baseline in {wins} of {len(settings)} settings "
            f"(paper: {PAPER_WINS} of {PAPER_SETTINGS})"
        ),
        *(
            [
                (
                    f"tune arm beats the same run without tune in {sum(s['win'] for s in tune_settings)} of "
                    f"{len(tune_settings)} settings; ES arm beats its baseline under tune in "
                    f"{sum(s['win'] for s in es_tuned)} of {len(es_tuned)}"
                ),
            ]
            if tune_settings
            else []
        ),
        "",
        *(
            f"- {s['problem']} n={s['size']}: {s['variant']} {s['variant_found']} vs {s['baseline']} "
            f"{s['baseline_found']}: {'win' if s['win'] else 'no win'} "
            f"({_fmt(s['variant_mean'], 0.0)[:-9] if s['variant_mean'] is not None else '-'} vs "
            f"{_fmt(s['baseline_mean'], 0.0)[:-9] if s['baseline_mean'] is not None else '-'})"
            for s in all_settings
        ),
    ]
    text = "\n".join(lines)
    print(text)
    (out / "table.md").write_text(text + "\n")
    if png := plot(results, directions, out / "ahd_compare.png"):
        print(f"# plot: {png}", file=sys.stderr)
    records: list[dict[str, Any]] = [{"type": "row", **dict(zip(HEADER, row))} for row in table]
    records += [{"type": "setting", **s} for s in all_settings]
    metrics: list[dict[str, Any]] = []

    def emit(name: str, value: Any, goal: str, met: bool) -> None:
        metric(name, value, goal, met, metrics)

    budgets = {(r.problem, r.method, r.seed): r.max_samples for r in results}
    matched = all(
        n == budgets[(pr, BASELINE[m], sd)]
        for (pr, m, sd), n in budgets.items()
        if m in BASELINE and (pr, BASELINE[m], sd) in budgets
    )
    frac = wins / len(settings) if settings else 0.0
    emit(
        "ahd_es_win_fraction",
        round(frac, 4),
        f">= {PAPER_WINS}/{PAPER_SETTINGS} = "
        f"{PAPER_WINS / PAPER_SETTINGS:.3f} of settings won by the ES variant (paper)",
        bool(settings) and frac >= PAPER_WINS / PAPER_SETTINGS,
    )
    emit("ahd_es_wins", wins, f"count of the {len(settings)} settings won by the ES variant", wins > 0)
    if tune_settings:
        tw = sum(s["win"] for s in tune_settings)
        emit("ahd_tune_wins", tw, f"count of the {len(tune_settings)} settings won by the +tune arm", tw > 0)
        ew = sum(s["win"] for s in es_tuned)
        emit("ahd_es_wins_under_tune", ew, f"count of the {len(es_tuned)} settings ES+tune beats tune", True)
    over_noise = [s for s in all_settings if (s["variant"], s["baseline"]) in {(es, n) for n, es in NOISE.items()}]
    if over_noise:
        nw = sum(s["win"] for s in over_noise)
        emit(
            "ahd_es_wins_over_noise_only",
            nw,
            f"count of the {len(over_noise)} settings the ES arm beats its noise-only control (alpha 0); the seed "
            "paper's ablation: noise alone 6.484, with updates 6.463 (TSP50)",
            True,
        )
    emit("ahd_matched_budgets", matched, "every ES variant run has its baseline's max_samples", matched)
    cut = [f"{r.problem}/{r.method}/seed{r.seed} ({r.samples}/{r.max_samples})" for r in results if cut_by_wall(r)]
    emit(
        "ahd_runs_cut_by_wall_budget",
        cut,
        "[] (a run its config's budget.max_wall_s stopped before its sample budget is left out of the settings)",
        not cut,
    )
    over = max((r.samples / r.max_samples for r in results), default=0.0)
    emit("ahd_max_budget_use", round(over, 4), "<= 1.0 (no run exceeds its sample budget)", over <= 1.0)
    found = sum(r.valid_samples > 0 for r in results)
    emit("ahd_runs_with_valid_samples", f"{found}/{len(results)}", "> 0 runs drew a valid LLM heuristic", found > 0)
    for method in methods:
        gaps = [
            row["best_gap"]
            for r in results
            if r.method == method
            for row in r.rows.values()
            if row["best_gap"] is not None
        ]
        m = statistics.fmean(gaps) if gaps else math.nan
        emit(
            f"ahd_mean_gap_percent/{method}",
            None if math.isnan(m) else round(m, 3),
            "informational: mean gap of the best heuristic to the reference over problems, sizes, seeds",
            bool(gaps),
        )
    heldout = sum(r.heldout_s or 0.0 for r in results)
    emit("ahd_heldout_eval_s", round(heldout, 1), "informational: held-out evaluation wall time, all runs", True)
    emit("ahd_wall_s", round(time.time() - started, 1), "informational: wall time of this call", True)
    with open(out / "table.jsonl", "w") as fh:
        fh.writelines(json.dumps(rec) + "\n" for rec in [*records, *({"type": "metric", **m} for m in metrics)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

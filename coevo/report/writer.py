"""Writes ``report.md`` and ``plots/*.png`` for a run folder.

The report is rebuilt from the store alone (trajectories, the loop's per-step records and the evolvers'
report sections, :func:`coevo.evolvers.base.record_report_sections`) and only reads it, so it can be
regenerated at any time with ``coevo runs show RUN_DIR --report``. Domain sections computed from the store
(the web agent's, :mod:`coevo.report.web`) are added when a run has their trajectories.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.artifacts import CONTEXT, LOOP_STEP, REPORT_SECTION
from coevo.report.web import web_report
from coevo.tables import fmt, md_table, mean, step_table
from coevo.types import Trajectory, is_text

if TYPE_CHECKING:
    from coevo.store import TrajectoryStore


def step_records(store: TrajectoryStore, run_id: str) -> list[dict[str, Any]]:
    """The loop's per-step records of a run, in order."""
    arts = store.list_artifacts(kind=LOOP_STEP, run_id=run_id)
    return [a.content for a in sorted(arts, key=lambda a: a.id)]


def trajectory_reward_unit(trajectories: list) -> str:
    """What the rewards of these trajectories measure: the ``meta["reward_unit"]`` their writers recorded
    (e.g. heuristic scores), else the rollout's task reward (parameter space) or "reward"."""
    units = sorted({t.meta["reward_unit"] for t in trajectories if t.meta.get("reward_unit")})
    if units:
        return "; ".join(units)
    return "rollout reward of one case" if trajectories and trajectories[0].space == "parameter" else "reward"


def reward_curves(store: TrajectoryStore, run_id: str) -> dict[str, tuple[list[int], list[float]]]:
    """Per evolver: (cumulative LLM samples of the run, best reward so far) at each valid trajectory."""
    curves: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    best: dict[str, float] = {}
    samples = 0
    for t in store.query(run_id=run_id, order_by="id"):
        samples += t.llm_calls
        if not t.valid or t.reward is None:
            continue
        best[t.evolver] = max(best.get(t.evolver, -math.inf), t.reward)
        xs, ys = curves[t.evolver]
        xs.append(samples)
        ys.append(best[t.evolver])
    return dict(curves)


def _plot(run_dir: Path, store: TrajectoryStore, run_id: str, steps: list[dict[str, Any]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = run_dir / "plots"
    plots.mkdir(exist_ok=True)
    written = []
    curves = reward_curves(store, run_id)
    if curves:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, (xs, ys) in sorted(curves.items()):
            ax.step(xs, ys, where="post", label=name)
        ax.set_xlabel("LLM samples (run total)")
        ax.set_ylabel("best reward so far (higher is better)")
        ax.set_title("Best reward vs LLM samples")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = plots / "reward_vs_samples.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    by_evolver: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        by_evolver[s["evolver"]].append(s)
    for name, recs in sorted(by_evolver.items()):
        keys, _constant = metric_keys(recs)
        if not keys:
            continue
        fig, axes = plt.subplots(len(keys), 1, figsize=(6, 2.4 * len(keys)), squeeze=False)
        for ax, key in zip(axes[:, 0], keys):
            pts = [(r["samples_total"], r["metrics"][key]) for r in recs if key in (r.get("metrics") or {})]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
            ax.set_ylabel(key)
            ax.ticklabel_format(axis="y", useOffset=False)  # 0.999997 reads as such, not "1e-7+9.99997e-1"
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("LLM samples (run total)")
        axes[0, 0].set_title(f"{name}: metrics per step")
        fig.tight_layout()
        path = plots / f"metrics_{name}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def metric_keys(recs: list[dict[str, Any]]) -> tuple[list[str], dict[str, float]]:
    """The numeric step metrics of one evolver's step records: ``(names that vary, {name: value} of those
    that keep one value over every step)``, both sorted by name. Only varying metrics are plotted; a
    constant (ES ``alpha``, ``skipped`` 0) is a flat line that says nothing, so the report names its value."""
    values: dict[str, list[float]] = defaultdict(list)
    for r in recs:
        for k, v in (r.get("metrics") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                values[k].append(float(v))
    varying = sorted(k for k, vs in values.items() if len(set(vs)) > 1)
    constant = {k: vs[0] for k, vs in sorted(values.items()) if len(set(vs)) == 1}
    return varying, constant


#: the columns of the report's per-evolver table (:func:`evolver_rows`)
EVOLVER_COLUMNS = [
    "evolver",
    "space",
    "trajectories",
    "LLM samples",
    "valid",
    "text calls",
    "text tokens",
    "mean trajectory reward",
    "best trajectory reward",
    "trajectory reward unit",
]


def evolver_rows(trajectories: list[Trajectory]) -> list[list[Any]]:
    """Per evolver (by name): [evolver, space, trajectories, LLM samples, valid % of its trajectories that are not
    free-text calls (:func:`coevo.types.is_text`; None when it made only text), text calls, their tokens (prompt +
    completion), mean and best reward, reward unit]."""
    per: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        per[t.evolver].append(t)
    rows = []
    for name, ts in sorted(per.items()):
        text = [t for t in ts if is_text(t)]
        made = [t for t in ts if not is_text(t)]
        valid = [t for t in made if t.valid]  # a usable sample, rewarded or not (a skill patch has no reward)
        rewards = [t.reward for t in valid if t.reward is not None]
        rows.append(
            [
                name,
                ts[0].space,
                len(ts),
                sum(t.llm_calls for t in ts),
                f"{100 * len(valid) / len(made):.1f}%" if made else None,
                sum(t.llm_calls for t in text),
                sum(t.prompt_tokens + t.completion_tokens for t in text),
                mean(rewards) if rewards else None,
                max(rewards) if rewards else None,
                trajectory_reward_unit(made or ts),
            ]
        )
    return rows


def context_rows(store: TrajectoryStore, run_id: str) -> list[list[Any]]:
    """Every value published on the context channel (``ctx.publish``), oldest first: [key, version, evolver,
    round, value (on one line, at most 300 characters)]."""
    rows = []
    for art in sorted(store.list_artifacts(kind=CONTEXT, run_id=run_id), key=lambda a: a.id):
        value = art.content.get("value")
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
        text = " ".join(text.split())
        rows.append(
            [
                art.content.get("key", art.name),
                art.version,
                art.content.get("evolver"),
                art.content.get("round"),
                text[:300] + (" ..." if len(text) > 300 else ""),
            ]
        )
    return rows


def _run_facts(run_dir: Path, store: TrajectoryStore, run_id: str, summary: dict[str, Any] | None) -> list[str]:
    """The report's top lines after the stop reason: the wall clock against its budget (and by how much a
    batch ran past it) and, per ES evolver, how many of its generations ran. Read from ``summary.json``,
    the saved ``config.yaml`` and the store's ES history."""
    import yaml

    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    lines = []
    cap = (cfg.get("budget") or {}).get("max_wall_s") if isinstance(cfg.get("budget"), dict) else None
    wall = (summary or {}).get("wall_s")
    if isinstance(wall, (int, float)):
        if isinstance(cap, (int, float)) and cap > 0:
            over = wall - cap
            lines.append(
                f"- wall clock: {wall:.0f} s of the {cap:g} s budget"
                + (f" ({over:.0f} s over it)" if over >= 1 else "")
            )
        else:
            lines.append(f"- wall clock: {wall:.0f} s (no wall-clock budget)")
    for spec in cfg.get("evolvers") or []:
        if not isinstance(spec, dict) or spec.get("type") != "es" or not spec.get("name"):
            continue
        done = len(store.es_history(run_id, spec["name"]))
        total = spec.get("total_generations")
        of = f" of its {total}" if isinstance(total, int) else ""
        lines.append(f"- ES `{spec['name']}`: {done}{of} generations ran")
    return lines


def _evolver_sections(store: TrajectoryStore, run_id: str) -> list[tuple[str, str]]:
    """(evolver name, Markdown) of each evolver's latest stored report section."""
    latest: dict[str, Any] = {}
    for art in sorted(store.list_artifacts(kind=REPORT_SECTION, run_id=run_id), key=lambda a: a.version):
        latest[art.content["evolver"]] = art.content["markdown"]
    return list(latest.items())


def _domain_sections(run_dir: Path, store: TrajectoryStore, run_id: str, plots: bool) -> list[str]:
    """Sections computed from the store by domain reports (each returns None when the run has none of its
    trajectories), e.g. the web agent's success rates per task, ES generation and skill version."""
    return [s for s in (web_report(run_dir, store, run_id, plots=plots),) if s]


def _constant_lines(steps: list[dict[str, Any]]) -> list[str]:
    """``Not plotted, one value over every step: es: alpha=0.0005, skipped=0`` (one line per evolver that has such)."""
    by_evolver: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        by_evolver[s["evolver"]].append(s)
    out = []
    for name, recs in sorted(by_evolver.items()):
        _, constant = metric_keys(recs)
        if constant and len(recs) > 1:
            out.append(f"- {name}: " + ", ".join(f"{k}={fmt(v)}" for k, v in constant.items()))
    return ["", "Not plotted, one value over every step:", "", *out] if out else []


def write_report(run_dir: Path, store: TrajectoryStore, run_id: str, plots: bool = True) -> Path:
    """Write ``report.md`` (and plots) into ``run_dir`` from what ``store`` holds for ``run_id`` (read only);
    returns the report's path."""
    run_dir = Path(run_dir)
    steps = step_records(store, run_id)
    lines = [f"# Run report: {run_id}", ""]
    summary_path = run_dir / "summary.json"
    s = json.loads(summary_path.read_text()) if summary_path.exists() else None
    trajs = store.query(run_id=run_id, with_steps=False)
    text_calls = sum(t.llm_calls for t in trajs if is_text(t))
    if s is not None:
        lines += [
            f"- stop reason: {s['stop_reason']}",
            f"- rounds completed: {s['rounds_completed']}, evolver steps: {s['steps']}, LLM samples: {s['samples']}"
            + (f" ({text_calls} of them free-text calls)" if text_calls else ""),
        ]
    facts = _run_facts(run_dir, store, run_id, s)
    lines += [*facts, ""] if s is not None or facts else []
    lines += ["## Evolvers", ""]
    lines += [
        (
            "Rewards of the evolver's trajectories (one per LLM sample or episode; higher is better), in the "
            "unit named in the last column; `valid`: the share of its trajectories that were usable, free-text "
            "calls left out (a skill evolver's analyses and patches have no reward, they count when valid); "
            "`text calls`: its free-text LLM calls (reflections, critiques: `meta.output = text`), with their "
            "tokens (prompt + completion), counted apart; `LLM samples` counts both, as the sample budget does."
        ),
        "",
    ]
    lines += [md_table(EVOLVER_COLUMNS, evolver_rows(trajs))]
    lines += ["", "## Steps", ""]
    lines += [
        (
            "`best reward` is what each step reports, in the unit of its `reward unit` column: parameter-space "
            "(ES) steps report the best ES member reward R_i of the generation, context-space steps the best "
            "reward of their samples."
        ),
        "",
    ]
    lines += [md_table(*step_table(steps))]
    published = context_rows(store, run_id)
    if published:
        lines += ["", "## Published context", ""]
        lines += [
            (
                "Values evolvers published on the context channel (`ctx.publish`), every version, oldest first "
                "(values on one line, cut at 300 characters; `coevo runs export` writes them whole)."
            ),
            "",
            md_table(["key", "version", "evolver", "round", "value"], published),
        ]
    for name, section in _evolver_sections(store, run_id):
        lines += ["", f"## {name}", "", section]
    for section in _domain_sections(run_dir, store, run_id, plots):
        lines += ["", section]
    if plots:
        written = _plot(run_dir, store, run_id, steps)
        if written:
            lines += ["", "## Plots", ""]
            lines += [f"![{p.stem}](plots/{p.name})" for p in written]
            lines += _constant_lines(steps)
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path

"""The web-agent section of a run report: success rates per ES generation, per task, per skill version, with
plots and the skill diffs, rebuilt from the store alone.

Inputs are the trajectories the ``web`` rollout (:mod:`coevo.rollouts.web`) wrote (``meta["rollout"] ==
"web"``) and the ``skill`` artifacts a skill evolver stored (:mod:`coevo.skills.versions`). An episode succeeds
when it is valid with reward 1.0 (> 0); rates leave out episodes whose *browser* failed (``failure ==
"runtime"``), as :meth:`~coevo.rollouts.web.WebRollout.member_reward` does, and count them separately.

* train: episodes of ES members (``split == "train"``), grouped by (evolver, generation);
* held-out: the centre's episodes on the fixed held-out seeds (``split == "test"``), grouped by (evolver,
  generation = number of ES updates applied before the evaluation);
* gate: Trace2Skill's held-out gate episodes (``meta["t2s_role"] == "gate"``), per skill version only;
* skill use: per condition (evolver, episode kind and the skills attached: none, one preloaded skill, or a
  library the agent loads from, labelled by :func:`skills_label`): skills listed, ``load_skill`` calls,
  successful loads (the agent's ``meta["skill_load_calls"]`` / ``meta["skills_loaded"]``) and episodes solved
  with and without a loaded skill, so the report answers "were the skills used, and did the episodes that
  used them succeed more often?".

The run report (:mod:`coevo.report.writer`) adds this section to every run that has web trajectories.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coevo.artifacts import SKILL
from coevo.tables import md_table
from coevo.types import Trajectory

if TYPE_CHECKING:
    from coevo.store import TrajectoryStore

PLOT_NAMES = ("web_success_per_generation.png", "web_success_per_skill_version.png", "web_task_before_after.png")


@dataclass(frozen=True)
class Rate:
    """Success count over the episodes that ran (browser failures left out)."""

    successes: int
    episodes: int
    browser_failures: int = 0

    @property
    def value(self) -> float | None:
        """successes / episodes in [0, 1], ``None`` when no episode ran."""
        return self.successes / self.episodes if self.episodes else None

    def __str__(self) -> str:
        if not self.episodes:
            return "–"
        tail = f", {self.browser_failures} browser failures" if self.browser_failures else ""
        return f"{100 * self.successes / self.episodes:.0f}% ({self.successes}/{self.episodes}{tail})"


def success_rate(trajectories: Iterable[Trajectory]) -> Rate:
    """:class:`Rate` of a group of web trajectories."""
    ts = list(trajectories)
    ran = [t for t in ts if t.failure != "runtime"]
    wins = sum(1 for t in ran if t.valid and t.reward is not None and t.reward > 0)
    return Rate(wins, len(ran), len(ts) - len(ran))


def web_trajectories(store: TrajectoryStore, run_id: str) -> list[Trajectory]:
    """The run's trajectories written by the web rollout, in insertion order (steps not loaded)."""
    return [t for t in store.query(run_id=run_id, with_steps=False) if t.meta.get("rollout") == "web"]


def _kind(t: Trajectory) -> str:
    if t.meta.get("t2s_role") == "gate":
        return "gate"
    return "test" if t.meta.get("split") == "test" else "train"


def _task(t: Trajectory) -> str:
    return str(t.meta.get("task") or (t.task_id or "?").rsplit(":", 1)[0])


def _versions(ts: Iterable[Trajectory]) -> str:
    vs = sorted({t.context.skill_version for t in ts if t.context.skill_version is not None})
    return ", ".join(f"v{v}" for v in vs) or "–"


def _by(ts: Iterable[Trajectory], key) -> dict:
    groups: dict = defaultdict(list)
    for t in ts:
        groups[key(t)].append(t)
    return dict(sorted(groups.items(), key=lambda kv: _order(kv[0])))


def _order(key: object) -> tuple:
    """Sort key of a group key (a value or a tuple of values; ``None`` last)."""
    return tuple((p is None, p) for p in (key if isinstance(key, tuple) else (key,)))


def _ends(groups: dict) -> tuple[tuple, tuple]:
    """The first and the last ``(key, group)`` of an ordered grouping."""
    items = list(groups.items())
    return items[0], items[-1]


def _pct(rate: Rate) -> float | None:
    return None if rate.value is None else 100 * rate.value


def _generation_table(train: list[Trajectory]) -> list[str]:
    rows = []
    for (ev, gen), ts in _by(train, lambda t: (t.evolver, t.generation)).items():
        members = _by(ts, lambda t: t.member.index if t.member else -1)
        member_rates = [success_rate(m).value for m in members.values()]
        member_rates = [r for r in member_rates if r is not None]
        rows.append(
            [
                ev,
                gen,
                min(t.round for t in ts),
                _versions(ts),
                str(success_rate(ts)),
                len(members),
                max(member_rates) if member_rates else None,
                min(member_rates) if member_rates else None,
            ]
        )
    return [
        "### Train success per ES generation",
        "",
        md_table(
            ["evolver", "generation", "round", "skill", "success", "members", "best member", "worst member"], rows
        ),
    ]


def _updates_applied(store: TrajectoryStore, run_id: str, evolver: str, generation: int) -> str:
    """Weight updates that changed the weights in the generations before ``generation`` (from the ES history:
    weight hash before != after); ``"none"`` when the weights stayed frozen (sigma or alpha 0)."""
    rows = [r for r in store.es_history(run_id, evolver) if r.get("generation", 0) < generation]
    n = sum(1 for r in rows if r.get("weight_hash_after") != r.get("weight_hash_before"))
    return str(n) if n else "none"


def _heldout_table(test: list[Trajectory], store: TrajectoryStore, run_id: str) -> list[str]:
    groups = _by(test, lambda t: (t.evolver, t.generation))
    rows = [
        [
            ev,
            gen,
            _updates_applied(store, run_id, ev, gen),
            min(t.round for t in ts),
            _versions(ts),
            str(success_rate(ts)),
        ]
        for (ev, gen), ts in groups.items()
    ]
    out = [
        "### Held-out success of the centre",
        "",
        md_table(["evolver", "after ES generations", "weight updates applied", "round", "skill", "success"], rows),
    ]
    if len(groups) >= 2:
        (first_key, first), (last_key, last) = _ends(groups)
        out += [
            "",
            (
                f"Held-out before → after: {success_rate(first)} (generation {first_key[1]}, skill "
                f"{_versions(first)}) → {success_rate(last)} (generation {last_key[1]}, skill "
                f"{_versions(last)})."
            ),
        ]
    return out


def _task_table(title: str, first: list[Trajectory], last: list[Trajectory], labels: tuple[str, str]) -> list[str]:
    tasks = sorted({_task(t) for t in first + last})
    rows = []
    for task in tasks:
        a = success_rate(t for t in first if _task(t) == task)
        b = success_rate(t for t in last if _task(t) == task)
        delta = None if a.value is None or b.value is None else 100 * (b.value - a.value)
        rows.append([task, str(a), str(b), None if delta is None else f"{delta:+.0f} pts"])
    return [f"### {title}", "", md_table(["task", labels[0], labels[1], "change"], rows)]


def skills_label(t: Trajectory) -> str:
    """What skills an episode ran with: ``"no skills"``; ``"NAME vK (preloaded)"``; or, in catalog mode, where the
    agent sees every attached skill and loads what it chooses, ``"library (N skills: a, b; NAME vK evolving)"``
    (``NAME`` is the skill a skill evolver evolves, recorded in the trajectory's context)."""
    name, version = t.context.skill_name, t.context.skill_version
    if name is None and not t.meta.get("skill_mode"):
        return "no skills"
    listed = [str(n) for n in t.meta.get("skills_listed") or ()]
    if t.meta.get("skill_mode") == "catalog":
        names = f"{len(listed)} skills: {', '.join(listed)}; " if listed else ""
        return f"library ({names}{name} v{version or 0} evolving)"
    return f"{name} v{version or 0} (preloaded)"


@dataclass(frozen=True)
class SkillUse:
    """Skill use of a group of web episodes (episodes whose browser failed are left out, as in :class:`Rate`).

    Attributes:
        listed: names of the skills the agent was shown (catalog) or given (preload), sorted.
        load_calls: ``load_skill`` actions the agent ran. loads: skills it loaded (successful calls, a skill
            counted once per episode).
        with_loaded: :class:`Rate` of the episodes with at least one loaded skill. without: of the others.
    """

    listed: tuple[str, ...]
    load_calls: int
    loads: int
    with_loaded: Rate
    without: Rate

    @classmethod
    def of(cls, trajectories: Iterable[Trajectory]) -> SkillUse:
        ran = [t for t in trajectories if t.failure != "runtime"]
        loaded = [t for t in ran if int(t.meta.get("skills_loaded") or 0) > 0]
        loaded_ids = {id(t) for t in loaded}
        return cls(
            listed=tuple(sorted({str(n) for t in ran for n in t.meta.get("skills_listed") or ()})),
            load_calls=sum(int(t.meta.get("skill_load_calls") or 0) for t in ran),
            loads=sum(int(t.meta.get("skills_loaded") or 0) for t in ran),
            with_loaded=success_rate(loaded),
            without=success_rate(t for t in ran if id(t) not in loaded_ids),
        )


def _skill_use_table(web: list[Trajectory]) -> list[str]:
    """The skill-use table per condition and one sentence per condition with skills answering the question."""
    groups = _by(web, lambda t: (t.evolver, _kind(t), skills_label(t)))
    rows, answers = [], []
    for (ev, kind, label), ts in groups.items():
        use = SkillUse.of(ts)
        rows.append(
            [
                ev,
                kind,
                label,
                str(success_rate(ts)),
                len(use.listed),
                use.load_calls,
                use.loads,
                str(use.with_loaded),
                str(use.without),
            ]
        )
        if label != "no skills":
            n = use.with_loaded.episodes + use.without.episodes
            answers.append(
                f"- {ev}, {kind}, {label}: a skill was loaded in {use.with_loaded.episodes} of {n} episodes "
                f"({use.loads} successful loads of {use.load_calls} load_skill calls); those episodes succeeded "
                f"{use.with_loaded}, the others {use.without}."
            )
    return [
        "### Skill use per condition",
        "",
        md_table(
            [
                "evolver",
                "episodes",
                "skills",
                "success",
                "skills listed",
                "load_skill calls",
                "successful loads",
                "solved with a loaded skill",
                "solved without",
            ],
            rows,
        ),
        *([""] + answers if answers else []),
    ]


def _skill_version_table(web: list[Trajectory]) -> list[str]:
    with_skill = [t for t in web if t.context.skill_name is not None]
    if not with_skill:
        return []
    rows = []
    groups = _by(with_skill, lambda t: (t.context.skill_name, t.context.skill_version, t.meta.get("skill_mode")))
    for (name, version, mode), ts in groups.items():
        kinds = {k: [t for t in ts if _kind(t) == k] for k in ("train", "test", "gate")}
        attached = "in a library (catalog)" if mode == "catalog" else "preloaded"
        rows.append([name, f"v{version}", attached] + [str(success_rate(kinds[k])) for k in ("train", "test", "gate")])
    return [
        "### Success per skill version",
        "",
        (
            "In catalog mode an episode ran with the whole library: its success is the library's with this "
            "version of the evolving skill in it, not this skill's (see the skill-use table for what was loaded)."
        ),
        "",
        md_table(
            ["skill", "version", "attached", "train (ES members)", "held-out (centre)", "gate (Trace2Skill)"], rows
        ),
    ]


def skill_diff_markdown(store: TrajectoryStore, run_id: str, max_diff_lines: int = 80) -> list[str]:
    """Markdown lines listing the run's stored skill versions (changelog, parent, causing trajectories) and each
    version's unified diff from its parent, cut to ``max_diff_lines`` lines."""
    arts = store.list_artifacts(kind=SKILL, run_id=run_id)
    if not arts:
        return []
    out = ["### Skill versions", ""]
    out.append(
        md_table(
            ["skill", "version", "parent", "round", "trajectories analysed", "changelog"],
            [
                [
                    a.name,
                    a.version,
                    a.parent_version if a.parent_version is not None else 0,
                    a.meta.get("round"),
                    len(a.content.get("trajectory_ids") or []),
                    " ".join(str(a.meta.get("changelog") or "").split())[:160],
                ]
                for a in arts
            ],
        )
    )
    for a in arts:
        diff = str(a.content.get("diff") or "").splitlines()
        cut = [f"... ({len(diff) - max_diff_lines} more lines)"] if len(diff) > max_diff_lines else []
        out += [
            "",
            f"Diff of `{a.name}` v{a.version} (from v{a.parent_version or 0}):",
            "",
            "```diff",
            *diff[:max_diff_lines],
            *cut,
            "```",
        ]
    return out


def _bars(
    plt,
    path: Path,
    labels: list[str],
    series: list[tuple[str, list[float | None]]],
    ylabel: str,
    title: str,
    figsize: tuple[float, float],
    rotation: int,
) -> Path:
    """A grouped bar chart (one group per label, one bar per series; None plotted as 0) saved to ``path``."""
    fig, ax = plt.subplots(figsize=figsize)
    width = 0.8 / len(series)
    for j, (name, vals) in enumerate(series):
        offset = width * (j - (len(series) - 1) / 2)
        ax.bar([i + offset for i in range(len(labels))], [v or 0 for v in vals], width=width, label=name)
    if rotation:
        ax.set_xticks(range(len(labels)), labels, rotation=rotation, ha="right", fontsize=8)
    else:
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot(
    plots_dir: Path,
    train: list[Trajectory],
    test: list[Trajectory],
    web: list[Trajectory],
    first: list[Trajectory],
    last: list[Trajectory],
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for ev, ts in _by(train, lambda t: t.evolver).items():
        pts = [(g, _pct(success_rate(g_ts))) for g, g_ts in _by(ts, lambda t: t.generation).items()]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{ev}: train (members)")
    for ev, ts in _by(test, lambda t: t.evolver).items():
        pts = [(g, _pct(success_rate(g_ts))) for g, g_ts in _by(ts, lambda t: t.generation).items()]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", linestyle="--", label=f"{ev}: held-out (centre)")
    ax.set_xlabel("ES generation (held-out: updates applied)")
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(-5, 105)
    ax.set_title("Web agent success per ES generation")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(plots_dir / PLOT_NAMES[0])
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    versions = _by(
        [t for t in web if t.context.skill_version is not None],
        lambda t: (t.context.skill_name, t.context.skill_version),
    )
    if versions:
        series = [
            (kind, [_pct(success_rate(t for t in ts if _kind(t) == kind)) for ts in versions.values()])
            for kind in ("train", "test", "gate")
        ]
        written.append(
            _bars(
                plt,
                plots_dir / PLOT_NAMES[1],
                [f"{n}\nv{v}" for n, v in versions],
                series,
                "success rate (%)",
                "Success per skill version",
                (6, 3.6),
                rotation=0,
            )
        )

    tasks = sorted({_task(t) for t in first + last})
    if tasks:
        series = [
            (label, [_pct(success_rate(t for t in group if _task(t) == task)) for task in tasks])
            for label, group in (("first generation", first), ("last generation", last))
        ]
        written.append(
            _bars(
                plt,
                plots_dir / PLOT_NAMES[2],
                tasks,
                series,
                "train success rate (%)",
                "Per task: first vs last ES generation",
                (max(6, 0.9 * len(tasks)), 3.6),
                rotation=30,
            )
        )
    return written


def web_report(
    run_dir: Path | str, store: TrajectoryStore, run_id: str, *, plots: bool = True, max_diff_lines: int = 80
) -> str | None:
    """The web-agent report section (Markdown, headed ``## Web agent``), or ``None`` when the run has no web
    trajectories.

    Args:
        run_dir: the run folder; plots go to ``run_dir/plots/`` (PNG, linked relative to ``run_dir``).
        store: the run's store. run_id: the run.
        plots: write the PNG plots (:data:`PLOT_NAMES`, matplotlib Agg backend).
        max_diff_lines: lines of each skill diff shown.
    """
    web = web_trajectories(store, run_id)
    if not web:
        return None
    train = [t for t in web if _kind(t) == "train"]
    test = [t for t in web if _kind(t) == "test"]
    gens = sorted({t.generation for t in train})
    first = [t for t in train if gens and t.generation == gens[0]]
    last = [t for t in train if gens and t.generation == gens[-1]]
    benchmarks = sorted({str(t.meta.get("benchmark")) for t in web})
    lines = [
        "## Web agent",
        "",
        (
            f"Benchmark: {', '.join(benchmarks)}; {len(train)} train episodes (ES members), {len(test)} held-out "
            f"episodes (centre), {len(web) - len(train) - len(test)} gate episodes; overall train success "
            f"{success_rate(train)}, held-out {success_rate(test)}."
        ),
        "",
    ]
    if train:
        lines += [*_generation_table(train), ""]
        if len(gens) >= 2:
            lines += [
                *_task_table(
                    f"Train success per task: generation {gens[0]} vs {gens[-1]}",
                    first,
                    last,
                    (f"generation {gens[0]}", f"generation {gens[-1]}"),
                ),
                "",
            ]
    if test:
        lines += [*_heldout_table(test, store, run_id), ""]
        evals = _by(test, lambda t: (t.evolver, t.generation))
        if len(evals) >= 2:
            (k0, t0), (k1, t1) = _ends(evals)
            lines += [
                *_task_table(
                    "Held-out success per task: before vs after", t0, t1, (f"generation {k0[1]}", f"generation {k1[1]}")
                ),
                "",
            ]
    lines += [*_skill_use_table(web), ""]
    lines += _skill_version_table(web)
    diff = skill_diff_markdown(store, run_id, max_diff_lines)
    if diff:
        lines += ["", *diff]
    if plots:
        written = _plot(Path(run_dir) / "plots", train, test, web, first, last)
        lines += ["", "### Plots", "", *[f"![{p.stem}](plots/{p.name})" for p in written]]
    return "\n".join(lines).rstrip() + "\n"

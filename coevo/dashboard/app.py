"""The Dash app of ``coevo runs serve``: pages over one run, refreshed while the run writes.

Pages (paths): ``/`` overview (budget used, rounds, stop reason, wall time, best reward per evolver vs LLM
samples, per-evolver totals, the loop's steps); ``/heuristics`` (lineage of every heuristic, best-so-far
curve, code and thought of the selected one, seed vs best on the held-out sizes); ``/es`` (per-generation
table and plots of each ES evolver); ``/trajectories`` (filter by evolver, generation, ES member, validity)
and ``/trajectory/<id>`` (its steps); ``/skills`` (skill versions, their diffs and causing trajectories).

Live refresh: a ``dcc.Interval`` polls :meth:`RunReader.data_version` every ``refresh_s`` seconds; the
panels re-render only when it changed, so a page follows a running loop without a reload and keeps its
filters. A database that stays locked longer than the busy timeout shows a banner and is retried at the
next poll. Every asset (React, Dash components, plotly.js) is served by this server (``serve_locally``):
the page loads nothing from the internet.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from typing import Any
from urllib.parse import parse_qs, urlencode

from dash import Dash, Input, Output, State, dcc, html, no_update

from coevo.dashboard import figures
from coevo.dashboard.reader import RunReader
from coevo.tables import step_table

PAGES = (
    ("/", "Overview"),
    ("/heuristics", "Heuristic design"),
    ("/es", "ES"),
    ("/trajectories", "Trajectories"),
    ("/skills", "Skills"),
)

_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 0; color: #222; background: #fafafa; }
header { background: #243447; color: #fff; padding: 8px 20px; display: flex; gap: 24px; align-items: center; flex-wrap: wrap; }
header a { color: #cfe3ff; text-decoration: none; font-weight: 500; }
header a.active { color: #fff; border-bottom: 2px solid #fff; }
header .run { font-weight: 700; margin-right: 12px; }
header .live { margin-left: auto; font-size: 0.85em; color: #cfe3ff; }
main { padding: 12px 20px 40px; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 8px 0 16px; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; min-width: 150px; }
.card .label { font-size: 0.8em; color: #666; } .card .value { font-size: 1.25em; font-weight: 600; }
table.grid { border-collapse: collapse; background: #fff; font-size: 0.88em; margin: 6px 0 18px; }
table.grid th, table.grid td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
table.grid th { background: #eef2f6; }
table.grid tr.invalid td { color: #8a1c1c; } table.grid tr.selected td { background: #fff3c4; }
pre { background: #fff; border: 1px solid #ddd; padding: 8px; overflow-x: auto; white-space: pre-wrap; font-size: 0.85em; }
.diff .add { color: #116329; background: #e6ffec; display: block; } .diff .del { color: #82071e; background: #ffebe9; display: block; }
.diff .hunk { color: #6639ba; display: block; } .diff span { display: block; }
.banner { background: #fff3c4; border: 1px solid #e0c36a; padding: 6px 12px; margin: 8px 20px; }
.filters { display: flex; gap: 16px; flex-wrap: wrap; align-items: end; margin: 8px 0; }
.filters > div { min-width: 180px; } .muted { color: #777; }
.md table { border-collapse: collapse; background: #fff; font-size: 0.88em; }
.md th, .md td { border: 1px solid #ddd; padding: 3px 8px; } .md th { background: #eef2f6; }
.step { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 6px 12px; margin: 10px 0; }
"""

_INDEX = (
    """<!DOCTYPE html>
<html><head>{%metas%}<title>{%title%}</title>{%favicon%}{%css%}<style>"""
    + _CSS
    + """</style></head>
<body>{%app_entry%}<footer>{%config%}{%scripts%}{%renderer%}</footer></body></html>"""
)


# --------------------------------------------------------------------------------------------- helpers
def fmt(x: Any) -> str:
    """A table cell's text: floats to 4 significant digits, None as an en dash."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def table(
    headers: list[str],
    rows: list[list[Any]],
    table_id: str | None = None,
    row_ids: list[str] | None = None,
    row_classes: list[str] | None = None,
) -> html.Table:
    """An HTML table; cells may be components (links) or values (formatted with :func:`fmt`).
    ``row_ids`` become each row's ``data-id`` attribute."""
    body = []
    for i, row in enumerate(rows):
        attrs = {}
        if row_ids is not None:
            attrs["data-id"] = row_ids[i]
        cells = [html.Td(c if isinstance(c, (html.A, dcc.Link, html.Span, html.Code)) else fmt(c)) for c in row]
        body.append(html.Tr(cells, className=row_classes[i] if row_classes else None, **attrs))
    kwargs = {"id": table_id} if table_id else {}
    return html.Table(
        [html.Thead(html.Tr([html.Th(h) for h in headers])), html.Tbody(body)], className="grid", **kwargs
    )


def card(label: str, value: Any, card_id: str) -> html.Div:
    return html.Div(
        [html.Div(label, className="label"), html.Div(fmt(value), className="value", id=card_id)], className="card"
    )


def graph(fig, graph_id: str) -> dcc.Graph:
    return dcc.Graph(id=graph_id, figure=fig, config={"displaylogo": False})


def traj_link(tid: int | None) -> Any:
    return "–" if tid is None else dcc.Link(str(tid), href=f"/trajectory/{tid}")


def _busy_guard(render):
    """Turn a locked database into a notice in the panel instead of a failed callback."""

    def wrapper(*args):
        try:
            return render(*args)
        except sqlite3.OperationalError as exc:
            return html.Div(f"the store is busy ({exc}); retrying at the next refresh", className="banner")

    wrapper.__name__ = render.__name__
    return wrapper


def _no_images(markdown: str) -> str:
    """Markdown with image syntax escaped: report sections quote model output, and an image link in it
    would make the browser fetch from the internet (raw HTML is never rendered by ``dcc.Markdown``)."""
    return re.sub(r"!\[", r"\\![", markdown)


def _search_param(search: str | None, name: str) -> str | None:
    values = parse_qs((search or "").lstrip("?")).get(name)
    return values[0] if values else None


# --------------------------------------------------------------------------------------------- pages
def overview_panel(reader: RunReader) -> list[Any]:
    o = reader.overview()

    def of(used, cap, unit=""):
        return f"{fmt(used)}{unit} / {fmt(cap)}{unit}" if cap is not None else f"{fmt(used)}{unit}"

    cards = html.Div(
        [
            card("status", o["status"], "ov-status"),
            card("LLM samples used / budget", of(o["samples"], o["max_samples"]), "ov-samples"),
            card("rounds completed / max", of(o["rounds_completed"], o["max_rounds"]), "ov-rounds"),
            card("evolver steps", o["steps"], "ov-steps"),
            card("trajectories", o["trajectories"], "ov-trajectories"),
            card("wall time (evolver steps)", of(round(o["wall_s"], 1), o["max_wall_s"], " s"), "ov-wall"),
        ],
        className="cards",
    )
    stop = html.P(["stop reason: ", html.B(fmt(o["stop_reason"]), id="ov-stop")])
    ev_rows = [
        [
            e["evolver"],
            e["space"],
            e["trajectories"],
            e["samples"],
            f"{e['valid_percent']:.1f}%" if e["valid_percent"] is not None else None,
            e["text_calls"],
            e["mean_reward"],
            e["best_reward"],
        ]
        for e in o["evolvers"]
    ]
    step_headers, step_rows = step_table(reader.steps_records(), reward_unit=False, fmt=fmt)
    return [
        html.H2(f"Run {o['run_id']}" + (f" ({o['name']})" if o["name"] else "")),
        cards,
        stop,
        graph(figures.reward_vs_samples(reader.reward_curves()), "ov-reward-graph"),
        html.H3("Evolvers"),
        table(
            ["evolver", "space", "trajectories", "LLM samples", "valid", "text calls", "mean reward", "best reward"],
            ev_rows,
            "ov-evolvers",
        ),
        html.H3("Evolver steps"),
        table(
            step_headers,
            step_rows,
            "ov-steps-table",
        ),
    ]


def heuristics_panel(reader: RunReader, selected: str | None) -> tuple[list[Any], list[Any]]:
    """(top: title, count, lineage graph; bottom: best-so-far, held-out comparison, lineage table); the
    selected heuristic's code goes between them."""
    rows = reader.heuristics()
    if not rows:
        return [
            html.H2("Heuristic design"),
            html.P("This run has no heuristic-design evolver samples.", id="h-none"),
        ], []
    ids = [r["id"] for r in rows]
    table_rows = [
        [
            dcc.Link(r["id"], href="/heuristics?" + urlencode({"h": r["id"]})),
            r["evolver"],
            r["operator"],
            r["generation"],
            ", ".join(r["parents"]) or "–",
            r["member"],
            r["objective"],
            "valid" if r["valid"] else (r["failure"] or "invalid"),
            traj_link(r["trajectory_id"]),
        ]
        for r in rows
    ]
    classes = [("selected " if r["id"] == selected else "") + ("" if r["valid"] else "invalid") for r in rows]
    best = reader.best_heuristics()
    sections = reader.report_sections()
    heldout: list[Any] = []
    for name in sorted({r["evolver"] for r in rows if r["space"] == "context"}):  # the AHD evolvers, not ES
        if name in sections:
            heldout += [html.H4(name), dcc.Markdown(_no_images(sections[name]), className="md")]
    if not heldout:
        heldout = [
            html.P(
                "The held-out comparison (seed vs best on the test sizes) is written when the run ends.",
                className="muted",
            )
        ]
    top = [
        html.H2("Heuristic design"),
        html.P(heuristic_count(rows) + "; click one for its code and thought.", id="h-count"),
        graph(figures.lineage(rows, selected), "lineage-graph"),
    ]
    return top, [
        graph(figures.best_so_far(reader.best_so_far()), "best-graph"),
        html.H3("Seed vs best on held-out sizes"),
        html.Div(heldout, id="h-heldout"),
        html.H3("Best heuristic over time"),
        table(
            ["evolver", "id", "operator", "objective", "thought"],
            [[b["evolver"], b["id"], b["operator"], b["objective"], b["thought"]] for b in best],
            "h-best",
        ),
        html.H3("Lineage (every heuristic)"),
        table(
            [
                "id",
                "evolver",
                "operator",
                "generation",
                "parents",
                "ES member",
                "objective",
                "valid / failure",
                "trajectory",
            ],
            table_rows,
            "lineage-table",
            row_ids=ids,
            row_classes=classes,
        ),
    ]


def heuristic_count(rows: list[dict[str, Any]]) -> str:
    """``33 heuristics (9 valid): 32 LLM samples (8 valid) and the problem's seed heuristic``: the lineage's
    count split into samples (what the report's tables count) and the parents that are no sample."""
    samples = [r for r in rows if r["trajectory_id"] is not None]
    others = [r for r in rows if r["trajectory_id"] is None]
    text = f"{len(rows)} heuristics ({sum(r['valid'] for r in rows)} valid)"
    if not others:
        return text
    seeds = sum(r["operator"] == "seed" for r in others)
    extra = []
    if seeds:
        extra.append("the problem's seed heuristic" if seeds == 1 else f"{seeds} seed heuristics")
    if len(others) > seeds:
        extra.append(f"{len(others) - seeds} parent(s) that are no sample of this run")
    return f"{text}: {len(samples)} LLM samples ({sum(r['valid'] for r in samples)} valid) and " + " and ".join(extra)


def heldout_note(reader: RunReader, evolver: str) -> str | None:
    """Why an ES evolver's held-out panel is empty (``eval_every: 0`` in the run's config), or None."""
    for spec in reader.config().get("evolvers") or []:
        if isinstance(spec, dict) and spec.get("name") == evolver and spec.get("eval_every") == 0:
            return "no held-out evaluation of the centre: eval_every is 0 in this run's config"
    return None


def heuristic_detail(reader: RunReader, selected: str | None) -> list[Any]:
    if not selected:
        return [html.P("Select a heuristic in the lineage to see its code and thought.", className="muted")]
    found = [r for r in reader.heuristics() if r["id"] == selected]
    if not found:
        return [html.P(f"no heuristic {selected!r} in this run")]
    r = found[0]
    status = "valid" if r["valid"] else f"invalid ({r['failure']}): {r['failure_detail'] or ''}"
    return [
        html.H3(["Heuristic ", html.Code(r["id"])]),
        html.P(
            f"{r['evolver']} · operator {r['operator']} · generation {r['generation']} · parents "
            f"{', '.join(r['parents']) or '–'} · member {r['member']} · objective {fmt(r['objective'])} · {status}"
        ),
        html.H4("Thought"),
        html.Pre(r["thought"] or "–", id="h-thought"),
        html.H4("Code"),
        html.Pre(r["code"] or "– (no code could be extracted)", id="h-code"),
    ]


def es_panel(reader: RunReader, evolver: str | None) -> list[Any]:
    names = reader.es_evolvers()
    if not names:
        return [html.P("This run has no ES history.", id="es-none")]
    evolver = evolver if evolver in names else names[0]
    gens = reader.es_generations(evolver)
    rows = []
    for g in gens:
        if g.get("final"):
            rows.append([g["generation"], "–", "–", "–", "–", "–", "–", "–", "–", "–", g["heldout_reward"]])
            continue
        coeffs = " ".join(f"{c:+.2f}" for c in g["coeffs"])
        rows.append(
            [
                g["generation"],
                g["sigma"],
                g["n"],
                g["mean_reward"],
                g["max_reward"],
                g["min_reward"],
                coeffs,
                g["update_norm"],
                "skipped" if g["skipped"] else "applied",
                html.Code((g["weight_hash_after"] or "")[:16]),
                g["heldout_reward"],
            ]
        )
    note = heldout_note(reader, evolver) if not any(g.get("heldout_reward") is not None for g in gens) else None
    return [
        html.H3(f"ES evolver {evolver}"),
        table(
            [
                "generation",
                "sigma",
                "N",
                "mean R",
                "max R",
                "min R",
                "normalised coefficients",
                "‖update‖",
                "update",
                "weight hash after",
                "held-out R",
            ],
            rows,
            "es-table",
        ),
        html.P(f"Held-out R: {note}.", className="muted", id="es-heldout-note") if note else None,
        graph(figures.es_generations(evolver, gens, heldout_note=note), "es-graph"),
    ]


def trajectory_table(reader: RunReader, evolver, generation, member, validity, limit) -> list[Any]:
    valid = {"valid": True, "invalid": False}.get(validity or "all")
    rows, total = reader.trajectory_rows(
        evolver=evolver or None, generation=generation, member=member or None, valid=valid, limit=int(limit or 200)
    )
    body = [
        [
            traj_link(r["id"]),
            r["key"],
            r["evolver"],
            r["space"],
            r["round"],
            r["generation"],
            r["member"],
            r["task"],
            "valid" if r["valid"] else (r["failure"] or "invalid"),
            r["reward"],
            r["steps"],
            r["llm_calls"],
        ]
        for r in rows
    ]
    return [
        html.P(f"{total} trajectories match; showing the newest {len(rows)}.", id="t-count"),
        table(
            [
                "id",
                "key",
                "evolver",
                "space",
                "round",
                "generation",
                "ES member",
                "task",
                "valid / failure",
                "reward",
                "steps",
                "LLM calls",
            ],
            body,
            "traj-table",
            row_ids=[str(r["id"]) for r in rows],
            row_classes=["" if r["valid"] else "invalid" for r in rows],
        ),
    ]


def trajectory_page(reader: RunReader, tid: int) -> list[Any]:
    t = reader.trajectory(tid)
    if t is None:
        return [html.H2(f"Trajectory {tid}"), html.P("no trajectory with this id in the store", id="t-missing")]
    m, c = t.member, t.context
    fields = [
        ["key", t.key],
        ["run", t.run_id],
        ["evolver / space", f"{t.evolver} / {t.space}"],
        ["round / generation", f"{t.round} / {t.generation}"],
        ["task", t.task_id],
        ["ES member", "–" if m is None else f"#{m.index}, sign {m.sign:+d}, seed {m.seed}, sigma {m.sigma:g}"],
        [
            "context",
            ", ".join(
                f"{k}={v}"
                for k, v in (
                    ("skill", c.skill_name),
                    ("skill version", c.skill_version),
                    ("heuristic", c.heuristic_id),
                    ("prompt", c.prompt),
                )
                if v is not None
            )
            or "–",
        ],
        ["reward", t.reward],
        ["valid", t.valid],
        ["failure", f"{t.failure}: {t.failure_detail or ''}" if t.failure else "–"],
        ["LLM calls / tokens (prompt, completion)", f"{t.llm_calls} / {t.prompt_tokens}, {t.completion_tokens}"],
        [
            "started / duration",
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t.started_at))} / {t.duration_s:.3g} s",
        ],
    ]
    steps = []
    for i, s in enumerate(t.steps):
        parts: list[Any] = [html.H4(f"Step {i}" + (f" · reward {fmt(s.reward)}" if s.reward is not None else ""))]
        for label, text in (
            ("observation", s.observation),
            ("action", s.action),
            ("model output", s.model_output),
            ("tool result", s.tool_result),
        ):
            if text is not None:
                parts += [
                    html.Div(label, className="muted"),
                    html.Pre(text, className=f"step-{label.replace(' ', '-')}"),
                ]
        if s.meta:
            parts += [html.Div("meta", className="muted"), html.Pre(json.dumps(s.meta, indent=1, default=str))]
        steps.append(html.Div(parts, className="step", **{"data-step": str(i)}))
    return [
        html.H2(f"Trajectory {t.id}"),
        table(["field", "value"], fields, "t-fields"),
        html.Details([html.Summary("meta"), html.Pre(json.dumps(t.meta, indent=1, default=str))]),
        html.H3(f"{len(t.steps)} steps", id="t-steps-count"),
        html.Div(steps, id="t-steps"),
    ]


def _diff_view(diff: str) -> html.Pre:
    lines = []
    for line in diff.splitlines():
        cls = (
            "add"
            if line.startswith("+") and not line.startswith("+++")
            else "del"
            if line.startswith("-") and not line.startswith("---")
            else "hunk"
            if line.startswith("@@")
            else None
        )
        lines.append(html.Span(line or " ", className=cls))
    return html.Pre(lines or "(no change)", className="diff")


def skills_panel(reader: RunReader) -> list[Any]:
    versions = reader.skill_versions()
    if not versions:
        return [html.H2("Skills"), html.P("This run stored no skill version.", id="s-none")]
    out: list[Any] = [html.H2("Skills"), html.P(f"{len(versions)} skill versions", id="s-count")]
    for v in versions:
        meta = v["meta"]
        causes = [
            [traj_link(c["id"]), c["evolver"], c["generation"], c["task"], c["valid"], c["reward"]] for c in v["causes"]
        ]
        missing = sorted(set(v["trajectory_ids"]) - {c["id"] for c in v["causes"]})
        info = ", ".join(
            f"{k}={fmt(meta.get(k))}"
            for k in ("evolver", "round", "gate_current", "gate_candidate", "edits", "rejected")
            if k in meta
        )
        out.append(
            html.Div(
                [
                    html.H3(
                        f"{v['name']} v{v['version']}"
                        + (f" (from v{v['parent_version']})" if v["parent_version"] else "")
                    ),
                    html.P(info or "–", className="muted"),
                    html.P(["changelog: ", meta.get("changelog") or "–"]),
                    html.H4("Diff"),
                    _diff_view(v["diff"]),
                    html.H4(f"Trajectories that caused it ({len(v['trajectory_ids'])})"),
                    table(["trajectory", "evolver", "generation", "task", "valid", "reward"], causes),
                    html.P(f"not in this store: {missing}", className="muted") if missing else None,
                    html.Details(
                        [html.Summary(f"files ({len(v['files'])})")]
                        + [html.Div([html.Code(name), html.Pre(text)]) for name, text in sorted(v["files"].items())]
                    ),
                ],
                className="skill-version",
                **{"data-skill": v["name"], "data-version": str(v["version"])},
            )
        )
    return out


# ----------------------------------------------------------------------------------------------- app
def create_app(reader: RunReader, refresh_s: float = 2.0) -> Dash:
    """The Dash app over ``reader``'s run, polling for new rows every ``refresh_s`` seconds (> 0)."""
    if not refresh_s > 0:
        raise ValueError(f"refresh_s must be > 0, got {refresh_s}")
    run_id = reader.run_id
    app = Dash(
        __name__,
        title=f"coevo · {run_id}",
        serve_locally=True,
        suppress_callback_exceptions=True,
        update_title=None,
        index_string=_INDEX,
    )
    nav = [dcc.Link(label, href=path, id=f"nav-{label.split()[0].lower()}") for path, label in PAGES]
    app.layout = html.Div(
        [
            dcc.Location(id="url", refresh=False),
            dcc.Interval(id="tick", interval=int(refresh_s * 1000)),
            dcc.Store(id="version"),
            dcc.Store(id="route"),
            html.Header(
                [html.Span(f"coevo · {run_id}", className="run"), *nav, html.Span("", id="live", className="live")]
            ),
            html.Div(id="banner"),
            html.Main(id="page"),
        ]
    )

    @app.callback(
        Output("version", "data"),
        Output("live", "children"),
        Output("banner", "children"),
        Input("tick", "n_intervals"),
        State("version", "data"),
    )
    def poll(_n, old):
        try:
            new = reader.data_version()
        except sqlite3.OperationalError as exc:
            return no_update, "store busy", html.Div(f"the store is busy ({exc}); retrying", className="banner")
        stamp = f"read-only · live, checked {time.strftime('%H:%M:%S')}"
        return (no_update if new == old else new), stamp, None

    @app.callback(Output("page", "children"), Output("route", "data"), Input("url", "pathname"), State("route", "data"))
    def route(path, current):
        path = path or "/"
        if path == current:
            return no_update, no_update
        if path.startswith("/trajectory/"):
            tail = path.rsplit("/", 1)[-1]
            shell = [html.Div(id="traj-page", **{"data-id": tail})]
        elif path == "/heuristics":
            shell = [html.Div(id="heur-panel"), html.Div(id="heur-detail"), html.Div(id="heur-bottom")]
        elif path == "/es":
            shell = [
                html.H2("ES"),
                dcc.Dropdown(id="es-evolver", placeholder="ES evolver", clearable=False, style={"maxWidth": "300px"}),
                html.Div(id="es-panel"),
            ]
        elif path == "/trajectories":
            shell = [
                html.H2("Trajectories"),
                html.Div(
                    [
                        html.Div([html.Label("evolver"), dcc.Dropdown(id="f-evolver", placeholder="any")]),
                        html.Div([html.Label("generation"), dcc.Dropdown(id="f-generation", placeholder="any")]),
                        html.Div([html.Label("ES member"), dcc.Dropdown(id="f-member", placeholder="any")]),
                        html.Div(
                            [
                                html.Label("validity"),
                                dcc.RadioItems(
                                    id="f-valid", value="all", inline=True, options=["all", "valid", "invalid"]
                                ),
                            ]
                        ),
                        html.Div(
                            [
                                html.Label("rows"),
                                dcc.Dropdown(id="f-limit", value=200, clearable=False, options=[50, 200, 1000, 10000]),
                            ]
                        ),
                    ],
                    className="filters",
                ),
                html.Div(id="traj-panel"),
            ]
        elif path == "/skills":
            shell = [html.Div(id="skills-panel")]
        elif path == "/":
            shell = [html.Div(id="ov-panel")]
        else:
            shell = [html.H2("Not found"), html.P(f"no page {path}; see the links above")]
        return shell, path

    @app.callback(Output("ov-panel", "children"), Input("version", "data"), Input("route", "data"))
    @_busy_guard
    def _overview(_v, _r):
        return overview_panel(reader)

    @app.callback(
        Output("heur-panel", "children"),
        Output("heur-bottom", "children"),
        Input("version", "data"),
        Input("route", "data"),
        Input("url", "search"),
    )
    def _heuristics(_v, _r, search):
        try:
            return heuristics_panel(reader, _search_param(search, "h"))
        except sqlite3.OperationalError as exc:
            return html.Div(f"the store is busy ({exc}); retrying at the next refresh", className="banner"), []

    @app.callback(Output("heur-detail", "children"), Input("url", "search"), Input("route", "data"))
    @_busy_guard
    def _heuristic_detail(search, _r):
        return heuristic_detail(reader, _search_param(search, "h"))

    @app.callback(Output("url", "search"), Input("lineage-graph", "clickData"), prevent_initial_call=True)
    def _pick(click):
        point = ((click or {}).get("points") or [{}])[0]
        hid = point.get("customdata")
        return "?" + urlencode({"h": hid}) if isinstance(hid, str) else no_update

    @app.callback(
        Output("es-evolver", "options"),
        Output("es-evolver", "value"),
        Input("version", "data"),
        Input("route", "data"),
        State("es-evolver", "value"),
    )
    def _es_options(_v, _r, value):
        try:
            names = reader.es_evolvers()
        except sqlite3.OperationalError:
            return no_update, no_update
        return names, (value if value in names else (names[0] if names else None))

    @app.callback(Output("es-panel", "children"), Input("version", "data"), Input("es-evolver", "value"))
    @_busy_guard
    def _es(_v, evolver):
        return es_panel(reader, evolver)

    @app.callback(
        Output("f-evolver", "options"),
        Output("f-generation", "options"),
        Output("f-member", "options"),
        Input("version", "data"),
        Input("route", "data"),
    )
    def _filter_options(_v, _r):
        try:
            opts = reader.filter_options()
        except sqlite3.OperationalError:
            return no_update, no_update, no_update
        members = [{"label": "none (no ES member)", "value": "none"}]
        members += [{"label": f"member #{i}", "value": str(i)} for i in opts["members"]]
        return opts["evolvers"], opts["generations"], members

    @app.callback(
        Output("traj-panel", "children"),
        Input("version", "data"),
        Input("f-evolver", "value"),
        Input("f-generation", "value"),
        Input("f-member", "value"),
        Input("f-valid", "value"),
        Input("f-limit", "value"),
    )
    @_busy_guard
    def _trajectories(_v, evolver, generation, member, validity, limit):
        return trajectory_table(reader, evolver, generation, member, validity, limit)

    @app.callback(Output("traj-page", "children"), Input("route", "data"))
    @_busy_guard
    def _trajectory(path):
        tail = (path or "").rsplit("/", 1)[-1]
        if not tail.isdigit():
            return [html.H2("Trajectory"), html.P(f"{tail!r} is not a trajectory id", id="t-missing")]
        return trajectory_page(reader, int(tail))

    @app.callback(Output("skills-panel", "children"), Input("version", "data"), Input("route", "data"))
    @_busy_guard
    def _skills(_v, _r):
        return skills_panel(reader)

    @app.callback(
        *[Output(f"nav-{label.split()[0].lower()}", "className") for _, label in PAGES], Input("url", "pathname")
    )
    def _active(path):
        return ["active" if (path or "/") == p else "" for p, _ in PAGES]

    return app

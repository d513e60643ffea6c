"""Plotly figures of the dashboard, built from :class:`~coevo.dashboard.reader.RunReader` rows.

Every function takes plain rows and returns a ``plotly.graph_objects.Figure``; rewards are higher-is-better,
objectives in the problem's units, x axes in LLM samples (run total) or ES generations.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

_LAYOUT = {
    "template": "plotly_white",
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "height": 360,
    "legend": {"orientation": "h", "y": -0.2},
}


def _empty(title: str, note: str) -> go.Figure:
    fig = go.Figure(layout={**_LAYOUT, "title": title})
    fig.add_annotation(text=note, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _best_vs_samples(
    curves: dict[str, tuple[list[int], list[float]]], title: str, y_title: str, empty: tuple[str, str]
) -> go.Figure:
    """One step line per evolver (sorted by name): best value so far against the run's cumulative LLM samples;
    ``empty`` (title, note) when there is no curve."""
    if not curves:
        return _empty(*empty)
    fig = go.Figure(layout={**_LAYOUT, "title": title})
    for name, (xs, ys) in sorted(curves.items()):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", line_shape="hv", name=name))
    fig.update_xaxes(title="LLM samples (run total)")
    fig.update_yaxes(title=y_title)
    return fig


def reward_vs_samples(curves: dict[str, tuple[list[int], list[float]]]) -> go.Figure:
    """Best reward so far per evolver (step lines) against the run's cumulative LLM samples."""
    title = "Best reward vs LLM samples"
    return _best_vs_samples(curves, title, "best reward so far (higher is better)", (title, "no valid trajectory yet"))


def lineage(rows: list[dict[str, Any]], selected: str | None = None) -> go.Figure:
    """The heuristic lineage: one marker per heuristic at (generation, rank within it), a line from each
    parent to its child; valid heuristics coloured by training objective, failures grey crosses.

    ``customdata`` of each marker is the heuristic's id (the dashboard opens it on click).
    """
    if not rows:
        return _empty("Heuristic lineage", "no heuristic in this run")
    by_gen: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_gen[int(r["generation"] or 0)].append(r)
    pos: dict[str, tuple[float, float]] = {}
    for g, rs in by_gen.items():
        for i, r in enumerate(rs):
            pos.setdefault(r["id"], (g, i - (len(rs) - 1) / 2))
    ex: list[float | None] = []
    ey: list[float | None] = []
    for r in rows:
        for p in r["parents"]:
            if p in pos and r["id"] in pos:
                ex += [pos[p][0], pos[r["id"]][0], None]
                ey += [pos[p][1], pos[r["id"]][1], None]
    fig = go.Figure(layout={**_LAYOUT, "title": "Heuristic lineage (parents → child)", "height": 460})
    fig.add_trace(
        go.Scatter(
            x=ex, y=ey, mode="lines", line={"color": "#bbb", "width": 1}, hoverinfo="skip", name="parent → child"
        )
    )

    def hover(r: dict[str, Any]) -> str:
        status = (
            f"objective {r['objective']:.6g}"
            if r["valid"] and r["objective"] is not None
            else f"invalid: {r['failure']}"
        )
        return (
            f"<b>{r['id']}</b><br>{r['evolver']} · {r['operator']} · gen {r['generation']}<br>{status}"
            f"<br>member {r['member']}<br>parents: {', '.join(r['parents']) or '–'}"
        )

    valid = [r for r in rows if r["valid"] and r["objective"] is not None]
    failed = [r for r in rows if not (r["valid"] and r["objective"] is not None)]

    def nodes(group: list[dict[str, Any]], name: str, marker: dict[str, Any]) -> go.Scatter:
        """The heuristics of ``group`` as one trace of markers at their positions, named ``name``."""
        return go.Scatter(
            x=[pos[r["id"]][0] for r in group],
            y=[pos[r["id"]][1] for r in group],
            mode="markers",
            name=name,
            marker=marker,
            customdata=[r["id"] for r in group],
            hovertext=[hover(r) for r in group],
            hoverinfo="text",
        )

    if valid:
        colour = {"color": [r["objective"] for r in valid], "colorscale": "Viridis", "showscale": True}
        fig.add_trace(
            nodes(
                valid,
                "valid",
                {"size": 13, **colour, "colorbar": {"title": "objective"}, "line": {"width": 1, "color": "#333"}},
            )
        )
    if failed:
        fig.add_trace(nodes(failed, "invalid", {"size": 10, "symbol": "x", "color": "#999"}))
    if selected in pos:
        fig.add_trace(
            go.Scatter(
                x=[pos[selected][0]],
                y=[pos[selected][1]],
                mode="markers",
                name="selected",
                marker={"size": 22, "color": "rgba(0,0,0,0)", "line": {"width": 3, "color": "#d62728"}},
                hoverinfo="skip",
            )
        )
    fig.update_xaxes(title="generation", dtick=1)
    fig.update_yaxes(visible=False)
    return fig


def best_so_far(curves: dict[str, tuple[list[int], list[float]]]) -> go.Figure:
    """Training objective of the best heuristic so far, per heuristic-design evolver, vs LLM samples."""
    return _best_vs_samples(
        curves,
        "Best heuristic so far (training objective)",
        "objective of the best (problem units)",
        ("Best heuristic so far", "no valid heuristic yet"),
    )


def es_generations(evolver: str, gens: list[dict[str, Any]], heldout_note: str | None = None) -> go.Figure:
    """Per ES generation: sigma, member rewards (+ and − halves, mean line), normalised coefficients,
    update norm and held-out reward of the centre, as five stacked panels sharing the generation axis;
    ``heldout_note`` is written in the held-out panel when it has no point (why it is empty)."""
    rows = [g for g in gens if not g.get("final")]
    if not gens:
        return _empty(f"ES {evolver}", "no generation yet")
    fig = make_subplots(
        rows=5,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.04,
        subplot_titles=("sigma", "member rewards", "normalised coefficients", "‖update‖", "held-out reward (centre)"),
    )
    gx = [g["generation"] for g in rows]
    fig.add_trace(go.Scatter(x=gx, y=[g["sigma"] for g in rows], mode="lines+markers", name="sigma"), row=1, col=1)
    for sign, name, color in ((1, "member (+)", "#1f77b4"), (-1, "member (−)", "#ff7f0e")):
        xs, ys, cs, cx = [], [], [], []
        for g in rows:
            for i, r in enumerate(g["rewards"]):
                if (g["signs"][i] if i < len(g["signs"]) else 1) == sign:
                    xs.append(g["generation"])
                    ys.append(r)
                    if i < len(g["coeffs"]):
                        cx.append(g["generation"])
                        cs.append(g["coeffs"][i])
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=name, marker={"color": color}), row=2, col=1)
        fig.add_trace(
            go.Scatter(x=cx, y=cs, mode="markers", name=f"coeff {name[7:]}", marker={"color": color}, showlegend=False),
            row=3,
            col=1,
        )
    fig.add_trace(
        go.Scatter(x=gx, y=[g["mean_reward"] for g in rows], mode="lines", name="mean reward", line={"color": "#333"}),
        row=2,
        col=1,
    )
    fig.add_trace(
        go.Scatter(x=gx, y=[g["update_norm"] for g in rows], mode="lines+markers", name="‖update‖"), row=4, col=1
    )
    held = [g for g in gens if g.get("heldout_reward") is not None]
    fig.add_trace(
        go.Scatter(
            x=[g["generation"] for g in held],
            y=[g["heldout_reward"] for g in held],
            mode="lines+markers",
            name="held-out",
        ),
        row=5,
        col=1,
    )
    if not held:
        fig.add_annotation(
            text=heldout_note or "no held-out evaluation yet",
            showarrow=False,
            xref="x5 domain",
            yref="y5 domain",
            x=0.5,
            y=0.5,
        )
    fig.update_layout(**{**_LAYOUT, "height": 900, "title": f"ES {evolver}: per generation"})
    fig.update_xaxes(title="generation", dtick=1, row=5, col=1)
    return fig

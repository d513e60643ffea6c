"""Markdown tables for reports: one formatter of cells, one table builder, and the loop-step table.

Used by the run report (:mod:`coevo.report`) and by every evolver's report section. Cells are formatted
once (``None`` -> "–", floats to 4 significant digits) and escaped (``|`` and line breaks), so generated text
such as an LLM's thought cannot break a table. :func:`step_table` is the table of the loop's step records that
both the report and the dashboard show.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any


def fmt(x: Any) -> str:
    """A value as report text: ``None`` -> "–", floats with 4 significant digits (``nan`` kept), else ``str``."""
    if x is None:
        return "–"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def cell(x: Any) -> str:
    """A table cell: :func:`fmt`, on one line, with ``|`` escaped so generated text cannot break the table."""
    return fmt(x).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (cells escaped)."""
    out = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def step_reward_unit(step: dict[str, Any]) -> str:
    """What a step record's ``best_reward`` measures (``reward_unit``, else by the evolver's space)."""
    if step.get("reward_unit"):
        return step["reward_unit"]
    return "best ES member reward R_i of the generation" if step.get("space") == "parameter" else "reward"


def step_table(
    steps: list[dict[str, Any]], *, reward_unit: bool = True, fmt: Callable[[Any], str] = fmt
) -> tuple[list[str], list[list[Any]]]:
    """The loop-step table: ``(headers, rows)``, one row per step record (the loop's ``LOOP_STEP`` artifact
    content: round, evolver, space, samples, trajectories, best_reward, samples_total, wall_s in seconds,
    metrics); a missing field is ``None`` (wall time 0.0).

    Args:
        steps: the step records, in order.
        reward_unit: include the "reward unit" column (:func:`step_reward_unit`) after "best reward".
        fmt: how a metric's value is written in the "metrics" cell (``name=value, ...``).
    """
    headers = ["round", "evolver", "space", "samples", "trajectories", "best reward"]
    headers += ["reward unit"] * reward_unit + ["samples total", "wall s", "metrics"]
    rows = [
        [s.get(k) for k in ("round", "evolver", "space", "samples", "trajectories", "best_reward")]
        + [step_reward_unit(s)] * reward_unit
        + [
            s.get("samples_total"),
            round(float(s.get("wall_s") or 0), 1),
            ", ".join(f"{k}={fmt(v)}" for k, v in (s.get("metrics") or {}).items()),
        ]
        for s in steps
    ]
    return headers, rows


def step_line(report: dict[str, Any]) -> str:
    """One evolver step's result as a line for ``run.log`` (a ``StepReport`` as a dict, e.g. ``asdict(report)``):
    ``8 samples, 8 trajectories, best reward 0.5 (unit); metrics: alpha=0.0005, sigma=0.001; stop: why``."""
    parts = [f"{report.get('samples', 0)} samples, {report.get('trajectories', 0)} trajectories"]
    best = report.get("best_reward")
    unit = report.get("reward_unit")
    parts[0] += f", best reward {fmt(best)}" + (f" ({unit})" if unit and best is not None else "")
    metrics = report.get("metrics") or {}
    if metrics:
        parts.append("metrics: " + ", ".join(f"{k}={fmt(v)}" for k, v in metrics.items()))
    if report.get("stop"):
        parts.append(f"stop: {report.get('stop_reason') or 'asked by the evolver'}")
    return "; ".join(parts)


def mean(values: list[float]) -> float:
    """The mean of ``values`` (not empty) with a correctly rounded sum (``math.fsum``), and 0.0 where it is
    within the inputs' own rounding (a few ulps of the largest): rewards that cancel (centred ranks such as
    5/14 - 1/2, antithetic pairs) give 0.0, not -6.9e-18 from the summation order or -2.8e-17 from each rank's
    rounding to a float."""
    m = math.fsum(values) / len(values)
    scale = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    return 0.0 if math.isfinite(m) and abs(m) <= 8 * sys.float_info.epsilon * scale else m

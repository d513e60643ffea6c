"""Markdown tables for reports: one formatter of cells, one table builder.

Used by the run report (:mod:`coevo.report`) and by every evolver's report section. Cells are formatted
once (``None`` -> "–", floats to 4 significant digits) and escaped (``|`` and line breaks), so generated text
such as an LLM's thought cannot break a table.
"""

from __future__ import annotations

import math
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

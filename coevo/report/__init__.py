"""Run reports: ``report.md`` with tables and PNG plots of reward over LLM samples per evolver."""

from coevo.report.writer import write_report

__all__ = ["write_report"]

"""Run many evaluations in parallel, one process each, order preserved, each failure isolated.

Threads only drive subprocesses (they spend their time in ``poll``), so a thread pool is enough: the work
happens in the worker processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from coevo.sandbox.runner import build_request
from coevo.types import EvalResult


@dataclass(frozen=True)
class Job:
    """One evaluation: the arguments of :meth:`coevo.sandbox.runner.Sandbox.run`."""

    code: str
    function_name: str
    target: str
    payload: dict[str, Any] = field(default_factory=dict)


class Evaluator(Protocol):
    """Anything with ``run(code, function_name, target, payload) -> EvalResult`` (Sandbox, PlainEvaluator)."""

    def run(self, code: str, function_name: str, target: str, payload: dict[str, Any]) -> EvalResult: ...


def evaluate_many(
    sandbox: Evaluator, jobs: Iterable[Job | Mapping[str, Any]], max_workers: int | None = None
) -> list[EvalResult]:
    """Evaluate ``jobs`` concurrently with ``sandbox``; ``result[i]`` belongs to ``jobs[i]``.

    Args:
        sandbox: the evaluator (a :class:`~coevo.sandbox.runner.Sandbox`).
        jobs: :class:`Job` objects or mappings with the same keys.
        max_workers: concurrent processes (default ``os.cpu_count()``).

    Returns:
        One EvalResult per job. An exception escaping the evaluator for one job (e.g. the process could
        not start) becomes that job's invalid result with error_kind ``sandbox``; the other jobs go on.

    Raises:
        ValueError: a job is malformed (checked for all jobs before any starts; names the job's index).
    """
    workers = max_workers if max_workers is not None else (os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"max_workers must be an int >= 1, got {max_workers!r}")
    checked: list[Job] = []
    for i, job in enumerate(jobs):
        try:
            job = job if isinstance(job, Job) else Job(**dict(job))
            build_request(job.code, job.function_name, job.target, job.payload, None)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"jobs[{i}]: {exc}") from exc
        checked.append(job)
    if not checked:
        return []

    def one(job: Job) -> EvalResult:
        try:
            return sandbox.run(job.code, job.function_name, job.target, job.payload)
        except Exception as exc:  # noqa: BLE001 - isolate: one broken evaluation must not sink the batch
            return EvalResult(valid=False, error_kind="sandbox", error=f"{type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(max_workers=min(workers, len(checked)), thread_name_prefix="sandbox") as pool:
        return list(pool.map(one, checked))

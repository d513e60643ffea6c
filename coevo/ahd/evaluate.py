"""Evaluate heuristic programs on a problem's instances, through the sandbox, into an :class:`EvalResult`.

The candidate's code runs in the sandbox's worker process (:class:`coevo.sandbox.runner.Sandbox`); the
target :data:`TARGET` = ``coevo.ahd.problem:run_target`` runs on the trusted side with a payload
``{"problem": <problem folder>, "instances_path": <InstanceSet .npz written here>, ...}``: it loads its own
copy of the instances, asks the candidate's process for each step's decision, checks each one and computes
the per-instance objectives. This module then converts to coevo's reward once (``score = -objective`` when
the problem minimises, ``+objective`` when it maximises) and adds the gap to the problem's reference, always
naming the reference (``metrics["reference"]``), so a user can tell what a gap is measured against.

Time limits: by default the sandbox's own wall-clock limit covers one evaluation of the whole set.
``timeout_s`` overrides it; ``instance_timeout_s`` gives every instance its own limit (and the whole set
``START_S + instance_timeout_s * len(instances)``); ``timeout_basis`` scales the sandbox's limit from the
instance set it was chosen for to this one by :meth:`HeuristicProblem.work` (:func:`scaled_timeout`).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coevo.ahd.instances import InstanceSet
from coevo.ahd.problem import HeuristicProblem, load_problem
from coevo.ahd.references import cache_dir, gap_percent
from coevo.types import EvalResult

TARGET = "coevo.ahd.problem:run_target"
#: Seconds allowed for starting the candidate's process and loading its code, on top of per-instance limits.
START_S = 10.0


def instances_file(instances: InstanceSet, folder: str | os.PathLike | None = None) -> Path:
    """Save ``instances`` (once per content hash) to ``<folder>/<problem>-<hash>.npz`` for the worker.

    ``folder`` defaults to ``$COEVO_CACHE/instances``. Returns the path.
    """
    folder = Path(folder) if folder is not None else cache_dir().parent / "instances"
    path = folder / f"{instances.problem}-{instances.content_hash()[:32]}.npz"
    if not path.is_file():
        instances.save(path)
    return path


def _resolve(
    problem: HeuristicProblem | str | os.PathLike, instances: InstanceSet | str | os.PathLike
) -> tuple[HeuristicProblem, InstanceSet]:
    prob = problem if isinstance(problem, HeuristicProblem) else load_problem(problem)
    inst = instances if isinstance(instances, InstanceSet) else prob.load_instances(instances)
    return prob, prob.check_instances(inst)


def summarize(
    problem: HeuristicProblem, instances: InstanceSet, raw: EvalResult, with_reference: bool = True
) -> EvalResult:
    """Turn the sandbox's raw result (``metrics["objectives"]``) into the problem's EvalResult.

    Valid: ``n_invalid`` = 0, ``objective`` = mean objective, ``score`` = -objective (minimise) or
    objective (maximise), ``metrics`` = objectives, n_instances, reference, reference_mean, gap_percent
    (None without reference), per_instance (``[{"name", "objective", "valid", "time_s", "error_kind",
    "error"}]``, also when some instances failed).
    Invalid: the sandbox's failure kind and detail, with ``reference`` named. A valid run whose objectives do
    not match the instances (count, finiteness) becomes invalid with kind ``sandbox``. With per-instance
    ``failures`` (keep_going), the result is invalid (most common kind) and ``metrics`` carries n_invalid,
    invalid_reasons ({"kind: detail": count}) and mean_valid_objective / gap over the instances that ran.
    """
    metrics: dict[str, Any] = {
        "n_instances": len(instances),
        "direction": problem.direction,
        "objective_name": problem.objective_name,
    }
    if not raw.valid:
        metrics["reference"] = instances.known_reference_name or problem.reference_name
        return EvalResult(
            valid=False,
            metrics=metrics,
            feedback=f"invalid ({raw.error_kind}): {raw.error}",
            error_kind=raw.error_kind,
            error=raw.error,
            duration_s=raw.duration_s,
        )
    objectives = (raw.metrics or {}).get("objectives")
    failures = (raw.metrics or {}).get("failures") or [None] * len(instances)
    times = (raw.metrics or {}).get("times_s")
    if (
        not isinstance(objectives, list)
        or len(objectives) != len(instances)
        or len(failures) != len(instances)
        or not all(
            (f is not None and o is None) or (isinstance(o, (int, float)) and math.isfinite(o))
            for o, f in zip(objectives, failures)
        )
    ):
        detail = f"target returned objectives {str(objectives)[:200]!r} for {len(instances)} instances"
        return EvalResult(
            valid=False, metrics=metrics, feedback=detail, error_kind="sandbox", error=detail, duration_s=raw.duration_s
        )
    failed = [f for f in failures if f is not None]
    metrics["per_instance"] = [
        {
            "name": name,
            "objective": None if f is not None else float(o),
            "valid": f is None,
            "time_s": float(times[i])
            if isinstance(times, list) and i < len(times) and isinstance(times[i], (int, float))
            else None,
            "error_kind": None if f is None else f.get("kind"),
            "error": None if f is None else f.get("error"),
        }
        for i, (name, o, f) in enumerate(zip(instances.names, objectives, failures))
    ]
    metrics["n_invalid"] = len(failed)
    metrics["invalid_reasons"] = dict(Counter(f"{f['kind']}: {f['error']}" for f in failed))
    if failed:  # keep_going mode: summarise the instances that did run, and mark the candidate invalid
        keep = [i for i, f in enumerate(failures) if f is None]
        metrics.update(_valid_subset_metrics(problem, instances, objectives, keep, with_reference))
        kind = Counter(f["kind"] for f in failed).most_common(1)[0][0]
        return EvalResult(
            valid=False,
            metrics=metrics,
            error_kind=kind,
            error=failed[0]["error"],
            feedback=f"invalid on {len(failed)} of {len(instances)} instances: {failed[0]['error']}",
            duration_s=raw.duration_s,
        )
    mean = float(np.mean(objectives))
    metrics["objectives"] = [float(o) for o in objectives]
    gap, ref_name, ref_mean = None, None, None
    if with_reference:
        refs, ref_name = problem.references(instances)
        ref_mean = float(np.mean(refs))
        gap = gap_percent(mean, ref_mean, problem.direction)
    metrics.update(reference=ref_name, reference_mean=ref_mean, gap_percent=gap)
    feedback = f"mean {problem.objective_name} {mean:.6g} over {len(instances)} instances"
    if gap is not None:
        feedback += f"; gap {gap:.3f}% vs {ref_name}"
    score = -mean if problem.direction == "minimize" else mean
    return EvalResult(
        valid=True, objective=mean, score=score, metrics=metrics, feedback=feedback, duration_s=raw.duration_s
    )


def _valid_subset_metrics(
    problem: HeuristicProblem, instances: InstanceSet, objectives: list, keep: list[int], with_reference: bool
) -> dict[str, Any]:
    """mean objective and gap over the instances in ``keep`` (those that ran validly)."""
    if not keep:
        return {"mean_valid_objective": None, "reference": None, "reference_mean": None, "gap_percent": None}
    mean = float(np.mean([objectives[i] for i in keep]))
    out: dict[str, Any] = {"mean_valid_objective": mean, "reference": None, "reference_mean": None, "gap_percent": None}
    if with_reference:
        refs, name = problem.references(instances)
        ref_mean = float(np.mean(refs[keep]))
        out.update(reference=name, reference_mean=ref_mean, gap_percent=gap_percent(mean, ref_mean, problem.direction))
    return out


def scaled_timeout(
    problem: HeuristicProblem, instances: InstanceSet, base_timeout_s: float, basis: InstanceSet | tuple[int, int]
) -> float:
    """``base_timeout_s`` (chosen for ``basis``) scaled to ``instances`` by the problem's work measure:
    ``base * max(1, work(instances) / work(basis))`` (:meth:`HeuristicProblem.work`, size **
    ``time_exponent`` summed over instances). ``basis`` is an InstanceSet or ``(size, count)``.

    E.g. TSP (exponent 3) with 30 s for 8 x TSP50: 16 x TSP200 gets 30 * 2 * 64 = 3840 s.
    """
    if isinstance(basis, InstanceSet):
        base_work = problem.work(basis)
    else:
        size, count = basis
        base_work = float(count) * float(size) ** problem.time_exponent
    work = problem.work(instances)
    return float(base_timeout_s) * max(1.0, work / base_work if base_work > 0 else 1.0)


def _sandbox_timeout(sandbox: Any) -> float | None:
    limits = getattr(sandbox, "limits", None) or getattr(getattr(sandbox, "sandbox", None), "limits", None)
    return getattr(limits, "timeout_s", None)


def _time_options(
    problem: HeuristicProblem,
    instances: InstanceSet,
    sandbox: Any,
    timeout_s: float | None,
    instance_timeout_s: float | None,
    timeout_basis: Any,
) -> dict[str, Any]:
    """The payload keys setting this evaluation's limits (see the module docstring)."""
    out: dict[str, Any] = {}
    for name, value in (("timeout_s", timeout_s), ("instance_timeout_s", instance_timeout_s)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value)
        ):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if instance_timeout_s is not None:
        out["instance_timeout_s"] = float(instance_timeout_s)
    if timeout_s is not None:
        out["timeout_s"] = float(timeout_s)
    elif instance_timeout_s is not None:
        out["timeout_s"] = START_S + float(instance_timeout_s) * len(instances)
    elif timeout_basis is not None:
        base = _sandbox_timeout(sandbox)
        if base is not None:
            out["timeout_s"] = scaled_timeout(problem, instances, base, timeout_basis)
    return out


def _package_option(problem: HeuristicProblem) -> dict[str, Any]:
    """The payload key naming the packages the candidate may import (read by the sandbox; absent = all)."""
    packages = problem.candidate_packages
    return {} if packages is None else {"candidate_packages": list(packages)}


def default_sandbox() -> Any:
    """A :class:`coevo.sandbox.runner.Sandbox` with its default limits (imported lazily)."""
    from coevo.sandbox.runner import Sandbox

    return Sandbox()


def evaluate_heuristic(
    problem: HeuristicProblem | str | os.PathLike,
    code: str,
    instances: InstanceSet | str | os.PathLike,
    sandbox: Any = None,
    with_reference: bool = True,
    keep_going: bool = False,
    *,
    timeout_s: float | None = None,
    instance_timeout_s: float | None = None,
    timeout_basis: InstanceSet | tuple[int, int] | None = None,
) -> EvalResult:
    """Evaluate one heuristic program.

    Args:
        problem: a problem, its name, or its folder.
        code: Python source defining ``problem.function_name`` (or an alias, e.g. BPP ``priority``).
        instances: an InstanceSet, or a file the problem can load (``.npz``, ``.tsp``, ``.json``, ``.vrp``).
        sandbox: an object with ``run(code, function_name, target, payload) -> EvalResult`` (default:
            :func:`default_sandbox`).
        with_reference: compute the reference and gap (cached on disk); False skips it (gap None).
        keep_going: run every instance even after failures and report ``n_invalid`` / ``invalid_reasons``
            (diagnosis; the candidate is still invalid if any instance fails).
        timeout_s: wall-clock limit of this whole evaluation (s); default: see ``instance_timeout_s`` and
            ``timeout_basis``, else the sandbox's own limit.
        instance_timeout_s: wall-clock limit of each instance (s); the whole evaluation then gets
            ``START_S + instance_timeout_s * len(instances)`` unless ``timeout_s`` is given.
        timeout_basis: the instance set (or ``(size, count)``) the sandbox's limit was chosen for; the
            limit is scaled to ``instances`` by :func:`scaled_timeout`.

    Returns:
        EvalResult (see :func:`summarize`); invalid candidates give ``valid=False`` with the failure kind,
        never an exception.

    Raises:
        ValueError: unknown problem, instances of another problem, invalid instances (NaN, negative
            distances, missing fields; see ``HeuristicProblem.check_instances``), or a bad time limit --
            caller errors, raised before any heuristic runs, not candidate errors.
    """
    prob, inst = _resolve(problem, instances)
    sandbox = sandbox if sandbox is not None else default_sandbox()
    payload = {
        "problem": str(prob.root),
        "instances_path": str(instances_file(inst)),
        "keep_going": keep_going,
        **_package_option(prob),
        **_time_options(prob, inst, sandbox, timeout_s, instance_timeout_s, timeout_basis),
    }
    raw = sandbox.run(code, prob.resolve_function_name(code), TARGET, payload)
    return summarize(prob, inst, raw, with_reference)


def evaluate_many(
    problem: HeuristicProblem | str | os.PathLike,
    codes: Sequence[str],
    instances: InstanceSet | str | os.PathLike,
    sandbox: Any = None,
    with_reference: bool = True,
    *,
    timeout_s: float | None = None,
    instance_timeout_s: float | None = None,
    timeout_basis: InstanceSet | tuple[int, int] | None = None,
) -> list[EvalResult]:
    """Evaluate several programs on the same instances (one instances file, references computed once).

    Uses the sandbox's ``evaluate_many(requests)`` when it has one (requests are dicts with ``code``,
    ``function_name``, ``target``, ``payload``), else calls ``run`` for each program in turn. The time
    options are those of :func:`evaluate_heuristic`. Returns one EvalResult per program, in order.
    """
    prob, inst = _resolve(problem, instances)
    sandbox = sandbox if sandbox is not None else default_sandbox()
    payload = {
        "problem": str(prob.root),
        "instances_path": str(instances_file(inst)),
        **_package_option(prob),
        **_time_options(prob, inst, sandbox, timeout_s, instance_timeout_s, timeout_basis),
    }
    requests = [
        {"code": c, "function_name": prob.resolve_function_name(c), "target": TARGET, "payload": payload} for c in codes
    ]
    if hasattr(sandbox, "evaluate_many"):
        raws = sandbox.evaluate_many(requests)
    else:
        raws = [sandbox.run(r["code"], r["function_name"], r["target"], r["payload"]) for r in requests]
    return [summarize(prob, inst, raw, with_reference) for raw in raws]

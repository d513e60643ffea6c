"""The report section of a heuristic-design search (:class:`coevo.evolvers.ahd_common.AHDEvolver`).

Rendering only: every number comes from the evolver (its problem, best heuristic, held-out results through
:meth:`~coevo.evolvers.ahd_common.AHDEvolver.heldout_result` and
:meth:`~coevo.evolvers.ahd_common.AHDEvolver.peer_result`, which evaluate and cache) or from the run's store.
:func:`ahd_section` is the whole section; the other functions are its parts, for evolvers that build a section
of their own (docs/extending.md) and for ``benchmarks/ahd_compare.py``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from coevo.tables import md_table

if TYPE_CHECKING:
    from coevo.types import EvalResult


class AHDEvolver(Protocol):
    """What this module reads of a heuristic-design evolver (:class:`coevo.evolvers.ahd_common.AHDEvolver`
    satisfies it). A protocol, not an import: the report package renders and never imports evolver code
    (tests/test_import_graph.py), while evolvers call it for their own sections."""

    name: str
    ctx: Any
    config: Any
    problem: Any
    sampler: Any
    population: Any
    best: Any
    best_candidates: Any
    rejected_best: Any
    skipped_seeds: Any
    train_tag: str
    test_sizes: list[int]
    test_seed: int
    validation_seed: int

    def heldout_result(self, code: str, size: int) -> EvalResult: ...

    def heldout_results(self) -> list[tuple[int, EvalResult, EvalResult | None]]: ...

    def peer_result(self, code: str, key: str) -> EvalResult: ...


def failure_text(r: EvalResult, limit: int) -> str:
    """``kind: detail`` of an invalid result on one line, the detail cut to ``limit`` characters."""
    detail = " ".join((r.error or r.feedback or "").split())[:limit]
    return (r.error_kind or "invalid") + (f": {detail}" if detail else "")


def rejected_best_lines(ev: AHDEvolver) -> list[str]:
    """Report lines: heuristics better on the training set than the best that failed validation."""
    if not ev.rejected_best:
        return []
    rows = [[r["id"], r["objective"], r["reason"]] for r in ev.rejected_best]
    return [
        "",
        (
            f"Better on the training set than the best, but invalid on the validation instances "
            f"({ev.config.validation_count} per held-out size, seed {ev.validation_seed}; not the held-out "
            "ones), so not taken as the best (`validation_count`):"
        ),
        "",
        md_table(["heuristic", "training objective", "why (first failing size)"], rows),
    ]


def comparison_rows(ev: AHDEvolver) -> list[list[Any]]:
    """Per test size: [size, instances, seed mean objective, seed gap %, best mean objective, best gap %,
    reference, best beats seed ("yes" / "no" / "tie", in the problem's direction)]. Invalid results show
    as ``None``."""
    rows = []
    for size, rs, rb in ev.heldout_results():
        ref = rs.metrics.get("reference") or (rb.metrics.get("reference") if rb else None)
        rows.append(
            [
                size,
                ev.config.test_count,
                rs.objective,
                rs.metrics.get("gap_percent"),
                rb.objective if rb else None,
                rb.metrics.get("gap_percent") if rb else None,
                ref,
                beats(ev, rb.objective if rb and rb.valid else None, rs.objective if rs.valid else None),
            ]
        )
    return rows


def invalid_heldout_lines(ev: AHDEvolver) -> list[str]:
    """One line per held-out size where the seed or the best heuristic is invalid, naming the failure kind
    and the start of its detail (one line, at most 200 characters), so a "–" in the table has a reason."""
    out = []
    for size, rs, rb in ev.heldout_results():
        for label, r in (("seed", rs), ("best", rb)):
            if r is None or r.valid:
                continue
            out.append(f"- Held-out n={size}: the {label} heuristic is invalid ({failure_text(r, 200)}).")
    return ["", *out] if out else []


def beats(ev: AHDEvolver, best: float | None, seed: float | None) -> str | None:
    if best is None or seed is None:
        return None
    if best == seed:
        return "tie"
    return "yes" if (best < seed) == (ev.problem.direction == "minimize") else "no"


def seed_population_lines(ev: AHDEvolver) -> list[str]:
    """Report lines: that the problem's seed heuristic was not in the population (``include_seed_heuristic``
    off), and each published seed heuristic left out because it was invalid on the training instances."""
    out = []
    seen = [*ev.population, *([ev.best] if ev.best is not None else [])]
    if not ev.config.include_seed_heuristic and not any(i.id == "seed" for i in seen):
        # (a search of its own may start from the seed anyway, e.g. a hill climber's first incumbent)
        out.append(
            "- The seed heuristic was not in the population (`include_seed_heuristic: false`): the best "
            "heuristic can be worse than it, on the training set too."
        )
    out += [
        f"- The published seed heuristic `{name}` was not in the population: {why}."
        for name, why in ev.skipped_seeds.items()
    ]
    return ["", *out] if out else []


def peer_lines(ev: AHDEvolver) -> list[str]:
    """Report lines: the values peers published for this problem (:func:`coevo.ahd.references.published_values`),
    each with its instance set and how coevo's instances compare; on the peer sets coevo regenerates exactly,
    the run's seed and best heuristics evaluated there too."""
    from coevo.ahd.references import published_values

    values = published_values(ev.problem.name)
    if not values:
        return []
    rows = [[v.method, v.instances, v.size, str(v.value), v.unit, v.source, v.comparable] for v in values]
    lines = [
        "",
        (
            "Published values on comparable instances (the peers' own instance sets, not this run's: compare "
            "with the held-out table above only where the distribution and capacity match):"
        ),
        "",
        md_table(["method", "instances", "size", "value", "unit", "source", "vs coevo's instances"], rows),
    ]
    sets = list(dict.fromkeys(v.peer_set for v in values if v.peer_set))
    if not sets or ev.best is None:
        return lines
    peer_rows = []
    for key in sets:
        named = next(v.instances for v in values if v.peer_set == key)
        for label, code in (("seed", ev.problem.seed_heuristic_code()), ("best", ev.best.code)):
            r = ev.peer_result(code, key)
            peer_rows.append([named, label, f"{r.objective:.5f}" if r.valid else failure_text(r, 120)])
    return lines + [
        "",
        (
            "The same peer instance sets, regenerated here from the peers' generators: this run's seed and best "
            "heuristics on them, to set against the published values above:"
        ),
        "",
        md_table(["instances", "heuristic", "objective"], peer_rows),
    ]


def published_seed_lines(ev: AHDEvolver) -> list[str]:
    """Report lines: each published seed heuristic (``seed_heuristics``) vs the best, on the held-out sets, and
    one line per held-out size where a published seed is invalid."""
    if not ev.config.seed_heuristics or ev.best is None:
        return []
    rows, invalid = [], []
    for name in ev.config.seed_heuristics:
        if name in ev.skipped_seeds:
            continue
        code = ev.problem.published_heuristic_code(name)
        for size in ev.test_sizes():
            rs, rb = ev.heldout_result(code, size), ev.heldout_result(ev.best.code, size)
            if not rs.valid:
                invalid.append(
                    f"- Held-out n={size}: the published seed `{name}` is invalid ({failure_text(rs, 200)})."
                )
            rows.append(
                [
                    name,
                    size,
                    rs.objective,
                    rb.objective,
                    beats(ev, rb.objective if rb.valid else None, rs.objective if rs.valid else None),
                ]
            )
    return [
        "",
        (
            "The search started from published heuristics too (`seed_heuristics`); the best heuristic against "
            "each of them on the same held-out instances:"
        ),
        "",
        md_table(["published seed", "size", "seed objective", "best objective", "best beats it"], rows),
        *(["", *invalid] if invalid else []),
    ]


def best_sentence(ev: AHDEvolver) -> str:
    """The report's sentence on the best heuristic: its id, training objective and who made it, with its
    thought in quotes; the problem's seed heuristic is named as such, with the first line of its docstring."""
    from coevo.sandbox.extract import function_docstring

    b = ev.best
    assert b is not None
    head = f"Best heuristic `{b.id}` (training objective {b.objective:.6g})"
    if b.operator == "seed" and b.id != "seed":
        return (
            f"{head} is the published seed heuristic `{b.id.split(':', 1)[-1]}` (config `seed_heuristics`): no "
            "sampled or tuned heuristic beat it on the training set."
        )
    if b.operator == "seed":
        doc = function_docstring(b.code, ev.problem.function_name) or ""
        what = f" ({doc.splitlines()[0].rstrip('.')})" if doc.strip() else ""
        return f"{head} is the problem's seed heuristic{what}: no sampled heuristic beat it on the training set."
    thought = " ".join(b.thought.split())
    return f"{head}, made by {b.provenance()}" + (f'; its thought: "{thought}".' if thought else ".")


def tie_sentence(ev: AHDEvolver) -> str:
    """The report's sentence on the heuristics that tie with the best (the same training reward, other code),
    or "" when none does: the earliest of equal heuristics stays the best."""
    b = ev.best
    if b is None:
        return ""
    ties = [c for c in ev.best_candidates() if c.reward == b.reward and c.code_hash != b.code_hash]
    if not ties:
        return ""
    names = ", ".join(f"`{c.id}`" for c in ties[:3]) + (f" and {len(ties) - 3} more" if len(ties) > 3 else "")
    return (
        f"Tie: {len(ties)} other heuristic(s) reach the same training objective ({b.objective:.6g}): {names}; "
        f"the earliest, `{b.id}`, stays the best."
    )


def es_children_rows(ev: AHDEvolver) -> list[list[Any]]:
    """Per ES evolver and generation, the children its members wrote for this search (read from the store):
    [ES evolver, generation, sigma, children, valid, valid %, best child objective, mean objective of the
    valid children, valid children better than their best parent, invalid kinds ("kind: count, ...")].
    Objectives are the problem's (training set), best in the problem's direction; None when no child is
    valid. Empty when no ES member wrote children for this search."""
    groups: dict[tuple[str, int], list] = {}
    for t in ev.ctx.store.query(run_id=ev.ctx.run_id, with_steps=False):
        if t.member is not None and t.meta.get("sampler") == ev.name:
            groups.setdefault((t.evolver, t.generation), []).append(t)
    pick = min if ev.problem.direction == "minimize" else max
    rows = []
    for (es_name, gen), ts in sorted(groups.items()):
        objs = [t.meta["objective"] for t in ts if t.valid and t.meta.get("objective") is not None]
        better = sum(
            1
            for t in ts
            if t.valid
            and t.meta.get("objective") is not None
            and t.meta.get("parent_objective") is not None
            and beats(ev, t.meta["objective"], t.meta["parent_objective"]) == "yes"
        )
        kinds = Counter(t.failure or "invalid" for t in ts if not t.valid)
        rows.append(
            [
                es_name,
                gen,
                ts[0].member.sigma,
                len(ts),
                len(objs),
                f"{100 * len(objs) / len(ts):.0f}%",
                pick(objs) if objs else None,
                sum(objs) / len(objs) if objs else None,
                better,
                ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())) or None,
            ]
        )
    return rows


def ahd_section(ev: AHDEvolver) -> str:
    """The Markdown section of a heuristic-design evolver (what :meth:`AHDEvolver.report_markdown` returns): Seed heuristic vs best evolved heuristic on held-out instances (mean objective, gap %), and the
    children ES members wrote for this search per ES generation (valid-child rate, child objective)."""
    p = ev.problem
    rows = comparison_rows(ev)
    better = "lower" if p.direction == "minimize" else "higher"
    lines = [
        (
            f"Problem `{p.name}`: objective = {p.objective_name} ({p.direction}, {better} is better); the "
            f"rewards of this evolver's samples and EoH children in the run tables are the {ev.sampler.reward_unit}. "
            f"Training set {ev.train_tag}; held-out instances: {ev.config.test_count} per size, seed "
            f"{ev.test_seed}. Per held-out size: the seed heuristic vs the best heuristic (mean "
            f"objective), each with its gap to the reference named in the `reference` column."
        ),
        "",
        md_table(
            [
                "size",
                "instances",
                "seed objective",
                "seed gap %",
                "best objective",
                "best gap %",
                "reference",
                "best beats seed",
            ],
            rows,
        ),
    ]
    lines += invalid_heldout_lines(ev)
    lines += seed_population_lines(ev)
    lines += published_seed_lines(ev)
    compared = [r[-1] for r in rows if r[-1] is not None]
    if compared:
        lines += [
            "",
            f"The best heuristic beats the seed heuristic on {compared.count('yes')} of {len(compared)} "
            "held-out sizes" + (f" (ties: {compared.count('tie')})." if "tie" in compared else "."),
        ]
    if ev.best is not None:
        lines += [
            "",
            " ".join(filter(None, [best_sentence(ev), tie_sentence(ev), "Code: `best_heuristic.py`."])),
        ]
    else:
        lines += ["", "No valid heuristic was found."]
    lines += rejected_best_lines(ev)
    es_rows = es_children_rows(ev)
    if es_rows:
        lines += [
            "",
            (
                f"Children ES members wrote for this search, per ES generation (objective: {p.objective_name} "
                f"on the training set, {better} is better; `better than parent`: valid children that beat "
                "their best parent):"
            ),
            "",
            md_table(
                [
                    "ES evolver",
                    "gen",
                    "sigma",
                    "children",
                    "valid",
                    "valid rate",
                    "best child objective",
                    "mean valid child objective",
                    "better than parent",
                    "invalid kinds",
                ],
                es_rows,
            ),
        ]
    lines += peer_lines(ev)
    return "\n".join(lines)


def population_lines(ev: AHDEvolver, generation: int) -> list[str]:
    """The final population as a table (id, operator, who made it, objective, thought), and a sentence when the
    best heuristic is not in it (why it is missing)."""
    rows = [[i.id, i.operator, i.source, i.objective, i.thought[:100]] for i in ev.population]
    table = md_table(["id", "operator", "from", "objective", "thought"], rows) if rows else "(empty population)"
    lines = ["", f"Final population (generation {generation}):", "", table]
    b = ev.best
    if b is None or any(i.id == b.id for i in ev.population):
        return lines
    twin = next((i for i in ev.population if i.objective == b.objective), None)
    why = (
        f"`{twin.id}` has the same training objective ({b.objective:.6g}) and took its place (survivors keep one "
        "heuristic per objective value, the first by id)"
        if twin is not None
        else "the survivors of a later generation did not keep it"
    )
    return [*lines, "", f"The best heuristic `{b.id}` is not in this table: {why}."]

"""Heuristics as population members, and EoH's population management.

An :class:`Individual` is EoH's (thought, code, objective) plus its score and provenance. Two heuristics
hold "the same code" when their code is equal up to formatting, comments, docstrings and the names of local
variables (:func:`code_key`: ``ast.parse`` -> docstrings removed -> locals renamed in order of appearance ->
``ast.unparse``); survivor selection, the sampler's duplicate check (:mod:`coevo.ahd.sampler`), tune's
"each code once" and the validation cache all use that one definition.

Parent selection and survivors follow Liu et al., "Evolution of Heuristics: Towards Efficient Automatic
Algorithm Design Using Large Language Model", ICML 2024, Section 3.2 (population management) and the EoH
reference code: parents are drawn by rank with weights ``1 / (rank + 1 + N)``; survivors drop invalid
heuristics, deduplicate by objective and by code, and keep the N best.
"""

from __future__ import annotations

import ast
import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from coevo.sandbox.extract import CandidateParseError, parse_bounded, strip_docstrings
from coevo.types import Trajectory


class _LocalNames(ast.NodeTransformer):
    """Rename the local variables of every function to ``_l0, _l1, ...`` in order of first appearance.

    Locals: names a function body binds (assignment, loop, ``with ... as``, ``except ... as``, comprehension
    and walrus targets), in the function and the scopes nested in it, except its parameters and names declared
    ``global`` / ``nonlocal``. Parameters, module names, attributes and keyword names stay: the signature and
    every call keep their meaning. The renaming is one bijection per top-level function, so two functions that
    differ only in the names of their locals map to the same code.
    """

    def __init__(self, taken: set[str]):
        self.taken = taken

    def visit_FunctionDef(self, node):  # a top-level (or class-level) function: one renaming for its body
        params = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        fixed = set(params)
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Global, ast.Nonlocal)):
                fixed.update(sub.names)
        bound = [
            n.id
            for sub in node.body
            for n in ast.walk(sub)
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)) and n.id not in fixed
        ]
        order: dict[str, str] = {}
        locals_ = set(bound)
        for sub in node.body:  # first appearance, in the tree's deterministic (source-field) order
            for n in _names_in_order(sub):
                if n.id in locals_ and n.id not in order:
                    new = f"_l{len(order)}"
                    while new in self.taken:
                        new = "_" + new
                    order[n.id] = new
        for sub in node.body:
            for n in ast.walk(sub):
                if isinstance(n, ast.Name) and n.id in order:
                    n.id = order[n.id]
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def _names_in_order(node: ast.AST):
    """The ``ast.Name`` nodes under ``node``, depth first in field order (deterministic for equal trees)."""
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, ast.Name):
            yield cur
        stack.extend(reversed(list(ast.iter_child_nodes(cur))))


def normalised_code(code: str) -> str | None:
    """``code`` without formatting, comments and docstrings, its functions' locals renamed in order of
    appearance (:class:`_LocalNames`), as ``ast.unparse`` writes it; None when ``code`` does not parse (under
    :func:`coevo.sandbox.extract.parse_bounded`'s bound)."""
    stripped = strip_docstrings(code)
    if stripped is None:
        return None
    try:
        tree = parse_bounded(stripped)
    except CandidateParseError:
        return None
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return ast.unparse(_LocalNames(taken).visit(tree))


def code_key(code: str) -> str:
    """A 16-hex-digit sha256 key of ``code`` that ignores formatting, comments, docstrings and the names of
    local variables (:func:`normalised_code`: the fingerprint a duplicate is caught by before evaluation).

    Code that does not parse falls back to its lines with surrounding white space removed.
    """
    norm = normalised_code(code)
    if norm is None:
        norm = "\n".join(line.strip() for line in code.strip().splitlines())
    return hashlib.sha256(norm.encode()).hexdigest()[:16]


@dataclass
class Individual:
    """A heuristic in a population: EoH's (thought, code, objective) plus provenance.

    Attributes:
        id: unique id (the trajectory key without the run id, or ``"seed"``).
        thought: the one-sentence idea. code: source defining the problem's function.
        objective: mean objective on the training instances (problem units, in the problem's direction).
        reward: the evaluator's score (higher is better: ``-objective`` when minimising).
        operator: the EoH operator that made it (``"seed"`` for the problem's seed heuristic).
        generation: the generation of the evolver that recorded it (an EoH generation, or the ES generation
            for a child an ES member wrote). parents: ids of its parents.
        source: the evolver that recorded it (e.g. ``"eoh"``, or ``"es"`` for a child of an ES member).
        member: the ES member whose perturbed weights wrote it (``ESMember`` fields: seed, sigma, sign,
            index), or None.
    """

    id: str
    thought: str
    code: str
    objective: float
    reward: float
    operator: str = "i1"
    generation: int = 0
    parents: list[str] = field(default_factory=list)
    source: str = ""
    member: dict[str, Any] | None = None

    @property
    def code_hash(self) -> str:
        """:func:`code_key` of the code (the same code up to formatting, comments, docstrings and local names)."""
        return code_key(self.code)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Individual:
        return cls(**d)

    @classmethod
    def from_trajectory(cls, t: Trajectory) -> Individual:
        """The individual a valid heuristic trajectory holds (its meta has code, thought, objective)."""
        m = t.meta
        return cls(
            id=t.key.split("/", 1)[-1],
            thought=m.get("thought") or "",
            code=m["code"],
            objective=float(m["objective"]),
            reward=float(t.reward),
            operator=m.get("operator", "i1"),
            generation=t.generation,
            parents=list(m.get("parent_ids") or []),
            source=t.evolver,
            member=asdict(t.member) if t.member is not None else None,
        )

    def provenance(self) -> str:
        """Who made it, in words (e.g. ``evolver 'es' (ES member 1, seed 42, sign -1, generation 0)``)."""
        if self.operator == "seed":
            return "the problem's seed heuristic"
        text = f"evolver {self.source!r}, operator {self.operator}"
        if self.member is not None:
            m = self.member
            text += (
                f", written under the perturbed weights of ES member {m['index']} (seed {m['seed']}, "
                f"sign {m['sign']:+d}, sigma {m['sigma']:.3g}) of ES generation {self.generation}"
            )
        return text


def rank_weights(n_population: int) -> list[float]:
    """EoH's parent-selection weights ``1 / (rank + 1 + N)`` for ranks 0..N-1 (rank 0 = best), unnormalised."""
    return [1.0 / (rank + 1 + n_population) for rank in range(n_population)]


def select_parents(population: Sequence[Individual], m: int, rng: random.Random) -> list[Individual]:
    """Draw ``min(m, len(population))`` distinct parents by rank (EoH, Section 3.2).

    Args:
        population: ranked best first (as :func:`survivors` returns it).
        m: parents wanted (>= 1).
        rng: the random stream (consumed deterministically).

    Raises:
        ValueError: empty population or ``m < 1``.
    """
    if not population:
        raise ValueError("population is empty: no parents to select")
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    idx = list(range(len(population)))
    weights = rank_weights(len(population))
    chosen: list[int] = []
    for _ in range(min(m, len(idx))):
        i = rng.choices(range(len(idx)), weights=weights)[0]
        chosen.append(idx.pop(i))
        weights.pop(i)
    return [population[i] for i in chosen]


def survivors(individuals: Sequence[Individual], n: int) -> list[Individual]:
    """EoH population management: drop non-finite, rank by reward (best first; ties by id), drop later
    duplicates of an objective value or of the code (:func:`code_key`), keep the ``n`` best."""
    ranked = sorted(
        (i for i in individuals if math.isfinite(i.reward) and math.isfinite(i.objective)),
        key=lambda i: (-i.reward, i.id),
    )
    seen_obj: set[float] = set()
    seen_code: set[str] = set()
    out: list[Individual] = []
    for ind in ranked:
        if ind.objective in seen_obj or ind.code_hash in seen_code:
            continue
        seen_obj.add(ind.objective)
        seen_code.add(ind.code_hash)
        out.append(ind)
        if len(out) == n:
            break
    return out

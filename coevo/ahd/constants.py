"""The numeric constants of a heuristic: find them in its code, write them back with new values.

Separating a heuristic's structure (written by the LLM) from its constants (searched without the LLM) is
the idea of LLaMEA-HPO (van Stein, Vermetten & Bäck, "In-the-loop Hyper-Parameter Optimization for LLM-Based
Automated Design of Heuristics", arXiv 2410.16309, 2024, Section 3) and of HSEvo's harmony search over the
parameters of elite heuristics (Dat, Doan & Binh, "HSEvo: Elevating Automatic Heuristic Design with
Diversity-Driven Harmony Search and Genetic Algorithm Using LLMs", AAAI 2025, Section 3.4). Both have the LLM
(or a second prompt) mark the parameters; here they are found in the syntax tree, which costs no tokens:

* every ``float`` literal other than ``0.0``, with a leading unary minus folded in (``-0.3`` is one constant);
* every ``int`` literal with ``|value| >= 2`` that is not an index or a slice bound (inside ``[...]`` of a
  subscript), not an argument of ``range``, ``len``-like shape calls or an ``axis=`` / ``k=`` / ``ndim=``-like
  keyword, and not in a default of the problem function's signature;
* never a ``bool``, a string, a complex number, ``0``, ``1`` or ``-1`` (loop bounds, identities, signs).

A heuristic the LLM wrote without literals (``d_now + d_home``) has no constant to search.
:func:`lift_term_weights` gives it some, still without tokens: every additive term after the first of a sum or
difference of non-literal expressions gets a weight ``1.0 *`` (``d_now + 1.0 * d_home``), which leaves the
heuristic's behaviour unchanged at the start (``1.0 * x == x`` exactly in floating point) and turns its
structure into a weighted score that the constants search can re-balance: the "weighted sum of features"
that the heuristics published by EoH and ReEvo for TSP are made of (e.g. ReEvo's ``c1 * d(cur, n) - c2 *
mean_d(n) + ...``). Terms inside subscripts and structural calls are left alone (index arithmetic); a lifted
weight that changes the heuristic at 1.0 (an int index turned float, a list concatenation) is found by
evaluating it and dropped by the caller (:mod:`coevo.evolvers.tune`).

Constants are numbered in source order (:func:`ast.walk` is breadth first, so the order is by line and
column, sorted). Candidate code is parsed with :func:`coevo.sandbox.extract.parse_bounded` (size and nesting
bound): this module runs on the trusted side.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass

from coevo.sandbox.extract import CandidateParseError, parse_bounded

#: keyword arguments whose int value is structural, never a tunable constant
_STRUCTURAL_KEYWORDS = frozenset({"axis", "axes", "k", "ndim", "ndmin", "n", "size", "shape", "kind", "ord", "dtype"})
#: calls whose int arguments are structural
_STRUCTURAL_CALLS = frozenset({"range", "zeros", "ones", "empty", "full", "reshape", "arange", "eye", "identity"})


@dataclass(frozen=True)
class Constant:
    """One tunable literal of a heuristic.

    Attributes:
        index: position among the heuristic's constants (source order).
        value: its value in the code (sign folded in), a Python float or int.
        kind: ``"float"`` or ``"int"`` (an int constant stays an int when rewritten: rounded).
        line, col: where it starts in the code (1-based line, 0-based column).
    """

    index: int
    value: float | int
    kind: str
    line: int
    col: int


class _Finder(ast.NodeVisitor):
    """Collect tunable literals (module docstring) with the node each one replaces."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.AST, float | int]] = []
        self._structural = 0

    def _structural_visit(self, nodes: Sequence[ast.AST | None]) -> None:
        self._structural += 1
        for n in nodes:
            if n is not None:
                self.visit(n)
        self._structural -= 1

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.visit(node.value)
        self._structural_visit([node.slice])

    def visit_Call(self, node: ast.Call) -> None:
        self.visit(node.func)
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name in _STRUCTURAL_CALLS:
            self._structural_visit(node.args)
        else:
            for a in node.args:
                self.visit(a)
        for kw in node.keywords:
            if kw.arg in _STRUCTURAL_KEYWORDS:
                self._structural_visit([kw.value])
            else:
                self.visit(kw.value)

    def visit_arguments(self, node: ast.arguments) -> None:
        self._structural_visit([*node.defaults, *node.kw_defaults])

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.USub) and _numeric(node.operand):
            self._take(node, -node.operand.value)  # type: ignore[attr-defined]
        else:
            self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if _numeric(node):
            self._take(node, node.value)

    def _take(self, node: ast.AST, value: float) -> None:
        if isinstance(value, float):
            if value != 0.0 and math.isfinite(value):
                self.found.append((node, value))
        elif abs(value) >= 2 and not self._structural:
            self.found.append((node, value))


class _Lifter(_Finder):
    """Find the additive terms a weight can be put on (:func:`lift_term_weights`): the right operand of every
    ``+`` / ``-`` whose operands are both non-literal, outside structural positions (subscripts, ``range``...)."""

    def __init__(self) -> None:
        super().__init__()
        self.terms: list[ast.BinOp] = []

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if (
            isinstance(node.op, (ast.Add, ast.Sub))
            and not self._structural
            and not _literal_like(node.left)
            and not _literal_like(node.right)
        ):
            self.terms.append(node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.generic_visit(node)


def _literal_like(node: ast.AST) -> bool:
    """A literal, a signed literal, a string / bytes / collection display, or already a weighted term."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp, ast.JoinedStr)):
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and _numeric(node.left)


def lift_term_weights(code: str, limit: int | None = None, select: Sequence[int] | None = None) -> tuple[str, int]:
    """``code`` with a weight ``1.0 *`` on the right operand of each sum or difference of non-literal terms
    (module docstring), at most ``limit`` of them (first in source order).

    Args:
        code: the heuristic's source. limit: most weights added. select: indices (source order, after
            ``limit``) of the terms to weight; None weights all of them.

    Returns:
        ``(lifted_code, n_weights)``: the code re-emitted by :func:`ast.unparse` and how many weights were added
        (0: ``lifted_code`` is ``code`` re-emitted unchanged). The weights are ``float`` literals, so
        :func:`find_constants` finds them with the heuristic's own literals, in source order.

    Raises:
        CandidateParseError: ``code`` does not parse under the trusted-side bound.
    """
    tree = parse_bounded(code)
    lifter = _Lifter()
    lifter.visit(tree)
    terms = sorted(lifter.terms, key=lambda b: (b.right.lineno, b.right.col_offset))
    if limit is not None:
        terms = terms[:limit]
    if select is not None:
        chosen = set(select)
        terms = [b for i, b in enumerate(terms) if i in chosen]
    for b in terms:
        b.right = ast.copy_location(ast.BinOp(ast.Constant(1.0), ast.Mult(), b.right), b.right)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n", len(terms)


def _numeric(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


def _scan(code: str) -> tuple[ast.Module, list[tuple[ast.AST, float | int]]]:
    tree = parse_bounded(code)
    finder = _Finder()
    finder.visit(tree)
    found = sorted(finder.found, key=lambda f: (f[0].lineno, f[0].col_offset))
    return tree, found


def find_constants(code: str, limit: int | None = None) -> list[Constant]:
    """The tunable constants of ``code`` (module docstring), in source order, at most ``limit`` of them.

    Raises:
        CandidateParseError: ``code`` does not parse under the trusted-side bound.
    """
    _, found = _scan(code)
    out = [
        Constant(i, v, "float" if isinstance(v, float) else "int", node.lineno, node.col_offset)
        for i, (node, v) in enumerate(found)
    ]
    return out if limit is None else out[:limit]


def _literal(value: float) -> ast.expr:
    """A literal node for ``value`` (negative numbers as unary minus, as the parser writes them)."""
    node: ast.expr = ast.Constant(abs(value))
    return ast.UnaryOp(ast.USub(), node) if value < 0 or (value == 0 and math.copysign(1, value) < 0) else node


def round_constant(value: float, kind: str) -> float | int:
    """``value`` as a literal of ``kind``: an int rounded to the nearest integer, a float to 6 significant digits.

    Raises:
        ValueError: a non-finite value or an unknown kind.
    """
    if not math.isfinite(value):
        raise ValueError(f"constant value must be finite, got {value!r}")
    if kind == "int":
        return round(value)
    if kind == "float":
        return float(f"{value:.6g}")
    raise ValueError(f"kind must be 'int' or 'float', got {kind!r}")


def with_constants(code: str, values: Sequence[float]) -> str:
    """``code`` with its first ``len(values)`` constants (:func:`find_constants` order) replaced.

    Int constants are rounded, floats written with 6 significant digits (:func:`round_constant`); the code is
    re-emitted by :func:`ast.unparse` (comments dropped, docstrings kept).

    Raises:
        CandidateParseError: ``code`` does not parse under the trusted-side bound.
        ValueError: more values than constants, or a non-finite value.
    """
    tree, found = _scan(code)
    if len(values) > len(found):
        raise ValueError(f"{len(values)} values for {len(found)} constants")
    replace = {
        id(node): _literal(round_constant(float(v), "float" if isinstance(old, float) else "int"))
        for (node, old), v in zip(found, values)
    }

    class _Writer(ast.NodeTransformer):
        def visit(self, node: ast.AST) -> ast.AST:
            new = replace.get(id(node))
            if new is not None:
                return ast.copy_location(new, node)
            return super().visit(node)

    return ast.unparse(ast.fix_missing_locations(_Writer().visit(tree))) + "\n"


__all__ = ["CandidateParseError", "Constant", "find_constants", "lift_term_weights", "round_constant", "with_constants"]

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


__all__ = ["CandidateParseError", "Constant", "find_constants", "round_constant", "with_constants"]

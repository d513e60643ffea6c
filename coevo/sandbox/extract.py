"""Extract a Python function (and what it needs) from an LLM answer, parsing with ``ast``, never a greedy regex.

The reference AHD frameworks take ``import.*return`` with a greedy regex (trailing prose is kept), append
the output name after ``return``, crash on NUL bytes, and mark every answer without a code fence or without
``def`` invalid (docs/references.md §2, "Known failure kinds"). Here:

1. The text is cleaned: CRLF/CR -> LF, NUL and other control characters, zero-width characters and BOMs
   removed, no-break spaces -> spaces, closed ``<think>...</think>`` sections dropped.
2. Fenced blocks (```` ``` ````/``~~~``, any info string, an unclosed fence runs to the end) that contain a
   ``def function_name(`` are tried, the last one first (a final answer follows drafts).
3. Otherwise the whole answer is segmented into top-level units: a line at column 0 that starts an import,
   ``def``, ``class``, decorator, assignment or ``try:``, extended over the indented lines below it, then to
   the *smallest* span that parses (a closing bracket or docstring line at column 0), never past the next
   unit start (so the work stays linear in the answer's length). Prose lines start no
   unit and are dropped, so trailing prose is never kept. An answer indented as a whole (a markdown list) is
   dedented first.
4. Of the units, only definitions are kept: imports, functions, classes, assignments (constants) and
   ``try`` blocks of imports; top-level calls, ``if __name__ == "__main__"`` blocks and stray expressions
   (prose that happens to parse, such as ``Done``) are dropped. ``function_name`` must be among them.
5. A module the code uses under its usual name without importing it (``np.argmin`` with no ``import numpy as
   np``; ``math``) is imported at the top (``Extraction.repairs`` says so), as ReEvo's code extraction does
   (``utils.extract_code_from_generator``: ``import numpy as np`` is prepended when the code mentions ``np``):
   small models often drop the import line, and the heuristic is otherwise intact.
6. An EoH thought in braces (``{...}``, brace-balanced) before the code, or else after it, is returned too.

Errors: ``parse`` (no code / no top-level ``def function_name``), ``syntax`` (a ``def function_name`` was
found but no span containing it compiles; the detail quotes the compiler).
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u2060\ufeff]")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`]*)")
_UNIT_START = re.compile(
    r"^(?:@|(?:async[ \t]+)?def[ \t]|class[ \t]|import[ \t]|from[ \t]+[\w.]+[ \t]+import[ \t]|try[ \t]*:"
    r"|[A-Za-z_]\w*[ \t]*(?::[^=\n]+)?=(?!=))"
)
_BLOCK_OPENER = re.compile(
    r"^[ \t]*(?:class|def|async|if|elif|else|for|while|with|try|except|finally|match|case)\b.*:[ \t]*(?:#.*)?$"
)
_KEEP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
_MAX_EXTEND = 60
#: candidate code larger than this (characters) is not parsed on the trusted side
MAX_PARSE_CHARS = 200_000
#: deepest bracket / indentation nesting parsed on the trusted side (CPython's own parser limit is ~200)
MAX_PARSE_DEPTH = 100
#: deepest syntax tree kept (``ast.unparse`` and ``compile`` recurse a few frames per level)
MAX_TREE_DEPTH = 150
_OPEN, _CLOSE = "([{", ")]}"


class CandidateParseError(ValueError):
    """Candidate code that :func:`parse_bounded` refuses: a syntax error, too large or too deeply nested.

    Attributes:
        cause: the name of the parser's exception class (``"SyntaxError"``, ``"IndentationError"``,
            ``"TabError"``, ``"ValueError"``, ``"RecursionError"``, ``"MemoryError"``), or ``"bound"`` when
            the size / depth bound refused the code before the parser ran.
    """

    def __init__(self, message: str, cause: str = "bound"):
        super().__init__(message)
        self.cause = cause


def parse_bounded(code: str, mode: str = "exec") -> ast.Module:
    """``ast.parse(code)`` under a size and nesting bound, for untrusted code parsed in the trusted process.

    ``ast.parse`` and every recursive walk over its tree (``ast.unparse``, ``ast.walk`` in a visitor,
    ``compile``) recurse once per nesting level: a 3000-deep expression of a few dozen tokens raises
    ``RecursionError`` (or worse) in the caller. Here the bracket depth is counted in one linear scan before
    anything recursive runs, and ``RecursionError`` / ``MemoryError`` from the parser are turned into a
    recorded refusal.

    Args:
        code: the candidate source (str). mode: ``"exec"`` or ``"eval"``.

    Returns:
        The parsed tree (nesting depth <= :data:`MAX_PARSE_DEPTH`).

    Raises:
        CandidateParseError: longer than :data:`MAX_PARSE_CHARS`, nested deeper than :data:`MAX_PARSE_DEPTH`
            brackets or indentation levels, or not valid Python (the message says which, without host paths).
    """
    if not isinstance(code, str):
        raise CandidateParseError(f"code must be a str, got {type(code).__name__}")
    if len(code) > MAX_PARSE_CHARS:
        raise CandidateParseError(f"code of {len(code)} characters (at most {MAX_PARSE_CHARS} are parsed)")
    depth = 0
    for ch in code:
        if ch in _OPEN:
            depth += 1
            if depth > MAX_PARSE_DEPTH:
                raise CandidateParseError(f"code nested deeper than {MAX_PARSE_DEPTH} brackets")
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
    indents = [len(line) - len(line.lstrip(" \t")) for line in code.split("\n") if line.strip()]
    if indents and max(indents) > 4 * MAX_PARSE_DEPTH:
        raise CandidateParseError(f"code indented deeper than {4 * MAX_PARSE_DEPTH} columns")
    try:
        tree = ast.parse(code, "<candidate>", mode=mode)
    except (SyntaxError, ValueError) as exc:
        lineno = getattr(exc, "lineno", None)
        msg = getattr(exc, "msg", None) or str(exc)
        raise CandidateParseError(
            f"{type(exc).__name__}: {msg}" + (f" (line {lineno})" if lineno else ""), type(exc).__name__
        ) from None
    except (RecursionError, MemoryError) as exc:
        raise CandidateParseError(f"code too complex to parse ({type(exc).__name__})", type(exc).__name__) from None
    # unary chains (``----1``, ``not not x``) and long operator chains nest without brackets: bound the tree
    stack = [(tree, 0)]
    while stack:
        node, d = stack.pop()
        if d > MAX_TREE_DEPTH:
            raise CandidateParseError(f"code nested deeper than {MAX_TREE_DEPTH} syntax levels")
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(node))
    return tree


@dataclass(frozen=True)
class Extraction:
    """Result of :func:`extract_code`.

    Attributes:
        code: the kept source (imports, helpers, constants, the function), or None on failure.
        thought: the text of the first ``{...}`` around the code (EoH's one-sentence idea), or None.
        error: None, ``"parse"`` or ``"syntax"`` (members of :data:`coevo.types.FAILURE_KINDS`).
        detail: human-readable reason when ``error`` is set.
        repairs: the import lines added to ``code`` (step 5), empty when none.
    """

    code: str | None
    thought: str | None
    error: str | None
    detail: str | None = None
    repairs: tuple[str, ...] = ()


#: usual name -> the import line that binds it (step 5 of the module docstring)
MISSING_IMPORTS = {"np": "import numpy as np", "math": "import math"}


def add_missing_imports(code: str) -> tuple[str, tuple[str, ...]]:
    """``code`` with an import line on top for each name of :data:`MISSING_IMPORTS` that it reads but never
    binds (no import, assignment, argument or definition of that name anywhere in it).

    Returns:
        ``(code, added)``: ``added`` lists the import lines put on top (empty: ``code`` unchanged).

    Raises:
        CandidateParseError: ``code`` does not parse under the trusted-side bound.
    """
    tree = parse_bounded(code)
    read: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    added = tuple(line for name, line in MISSING_IMPORTS.items() if name in read and name not in bound)
    if not added:
        return code, ()
    return "\n".join(added) + "\n" + code, added


def clean_text(text: str) -> str:
    """Normalise line ends and remove control / zero-width characters (see the module docstring, step 1)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u2028", "\n").replace("\u2029", "\n")
    text = text.replace("\u00a0", " ").replace("\u202f", " ")
    text = _CONTROL.sub("", text)
    return _THINK.sub("", text)


def extract_code(text: str, function_name: str) -> Extraction:
    """Extract the code defining ``function_name`` from an LLM answer (algorithm: module docstring).

    Args:
        text: the raw model output.
        function_name: the top-level function the code must define.

    Returns:
        An :class:`Extraction`; failures are reported in it, never raised.

    Raises:
        TypeError: ``text`` is not a str. ValueError: ``function_name`` is not an identifier (caller bugs).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not isinstance(function_name, str) or not function_name.isidentifier():
        raise ValueError(f"function_name must be a Python identifier, got {function_name!r}")
    lines = clean_text(text).split("\n")
    def_re = re.compile(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(function_name)}[ \t]*\(")
    errors: list[str] = []
    regions = [(a, b) for a, b in reversed(_fenced_blocks(lines)) if any(def_re.match(x) for x in lines[a:b])]
    regions.append((0, len(lines)))
    for start, end in regions:
        kept, code, err = _extract_region(textwrap.dedent("\n".join(lines[start:end])).split("\n"), function_name)
        if code is None:
            if err:
                errors.append(err)
            continue
        first, last = start + kept[0], start + kept[-1]
        return _repaired(Extraction(code, _thought(lines[:first], lines[last + 1 :]), None))
    indented = _indented_region(lines, def_re)
    if indented is not None:
        kept, code, err = _extract_region(
            textwrap.dedent("\n".join(lines[indented[0] : indented[1]])).split("\n"), function_name
        )
        if code is not None:
            first, last = indented[0] + kept[0], indented[0] + kept[-1]
            return _repaired(Extraction(code, _thought(lines[:first], lines[last + 1 :]), None))
        if err:
            errors.append(err)
    thought = _thought(lines, [])
    if errors:
        return Extraction(None, thought, "syntax", errors[0])
    what = (
        "no code in the answer"
        if not any(x.strip() for x in lines)
        else f"no top-level definition of {function_name!r} found"
    )
    return Extraction(None, thought, "parse", what)


def _repaired(ex: Extraction) -> Extraction:
    """``ex`` with the missing imports of its code added (step 5); kept code already parsed, so this parses."""
    code, added = add_missing_imports(ex.code or "")
    return Extraction(code, ex.thought, ex.error, ex.detail, added) if added else ex


def _fenced_blocks(lines: list[str]) -> list[tuple[int, int]]:
    """``(first content line, end)`` of every fenced block, in order; an unclosed fence runs to the end."""
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m.group(1)
        j = i + 1
        while j < len(lines):
            s = lines[j].strip()
            if s and s[0] == fence[0] and set(s) == {fence[0]} and len(s) >= len(fence):
                break
            j += 1
        blocks.append((i + 1, j))
        i = j + 1
    return blocks


def _indented_region(lines: list[str], def_re: re.Pattern) -> tuple[int, int] | None:
    """The run of blank-or-indented lines around the first indented ``def function_name`` (markdown lists)."""
    for i, line in enumerate(lines):
        if def_re.match(line) and line[:1] in (" ", "\t"):
            indent = len(line) - len(line.lstrip())

            def inside(x: str, indent: int = indent) -> bool:
                return not x.strip() or len(x) - len(x.lstrip()) >= indent

            a = i
            while a > 0 and inside(lines[a - 1]):
                a -= 1
            opener = next((x for x in reversed(lines[:a]) if x.strip()), "")
            if _BLOCK_OPENER.match(opener):
                return None  # a method or nested function, not an indented answer
            b = i + 1
            while b < len(lines) and inside(lines[b]):
                b += 1
            return a, b
    return None


def _parse(src: str) -> tuple[ast.Module | None, str, str | None]:
    """Parse ``src``; on a tab/indentation error retry with tabs expanded to 4, then 8 columns.

    Returns ``(tree or None, the source variant used, error message or None)``.
    """
    variants = [src] + ([src.expandtabs(4), src.expandtabs(8)] if "\t" in src else [])
    first_error = None
    for variant in variants:
        try:
            return parse_bounded(variant), variant, None
        except CandidateParseError as exc:
            first_error = first_error or str(exc)
            if exc.cause not in ("TabError", "IndentationError"):
                break
    return None, src, first_error


def _kept(tree: ast.Module) -> bool:
    """Whether every statement of a unit is a definition worth keeping (see module docstring, step 4)."""
    for node in tree.body:
        if isinstance(node, ast.Try):
            inner = [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
            if not all(isinstance(s, (*_KEEP, ast.Pass)) for s in inner):
                return False
        elif not isinstance(node, _KEEP):
            return False
    return bool(tree.body)


def _defines(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


def _units_of_parsed(tree: ast.Module, lines: list[str]) -> list[tuple[int, int, str]]:
    """Top-level statements of a region that parses as a whole, as ``(start, end, source)`` line spans."""
    units = []
    for node in tree.body:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
        units.append((start, node.end_lineno, "\n".join(lines[start : node.end_lineno])))
    return units


def _unit_starts(lines: list[str]) -> list[int]:
    """Lines at column 0 that may start a kept unit; decorators are merged with the def they decorate."""
    starts = []
    for i, line in enumerate(lines):
        if _UNIT_START.match(line) and not (starts and starts[-1] == i - 1 and lines[i - 1].startswith("@")):
            starts.append(i)
    return starts


def _segment(lines: list[str]) -> tuple[list[tuple[int, int, str]], dict[int, str]]:
    """Units of a region that does not parse as a whole (module docstring, step 3), and the parse error of
    each unit start that no span could fix."""
    units, failed = [], {}
    starts = _unit_starts(lines)
    for k, s in enumerate(starts):
        if units and s < units[-1][1]:
            continue  # swallowed by the previous unit's extension
        e = s + 1
        while e < len(lines) and (not lines[e].strip() or lines[e][0] in " \t"):
            e += 1
        while e > s + 1 and not lines[e - 1].strip():
            e -= 1
        next_start = starts[k + 1] if k + 1 < len(starts) else len(lines)
        limit = max(e, min(len(lines), e + _MAX_EXTEND, next_start))
        error = None
        for end in range(e, limit + 1):
            if end > e and not lines[end - 1].strip():
                continue
            tree, variant, err = _parse("\n".join(lines[s:end]))
            error = error or err
            if tree is not None:
                units.append((s, end, variant))
                break
        else:
            failed[s] = error or "does not parse"
    return units, failed


def _extract_region(lines: list[str], name: str) -> tuple[list[int], str | None, str | None]:
    """Kept line indices, assembled code (or None) and an error detail (None when nothing defined ``name``)."""
    tree, variant, _err = _parse("\n".join(lines))
    if tree is not None:
        units, failed = _units_of_parsed(tree, variant.split("\n")), {}
    else:
        units, failed = _segment(lines)
    kept_units, defined = [], False
    for start, end, src in units:
        unit_tree, _, _ = _parse(src)
        if unit_tree is not None and _kept(unit_tree):
            kept_units.append((start, end, src))
            defined = defined or _defines(unit_tree, name)
    if not defined:
        def_re = re.compile(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(")
        bad = [
            f"def {name}: {msg}"
            for s, msg in failed.items()
            if def_re.match(lines[s]) or (lines[s].startswith("@") and any(def_re.match(x) for x in lines[s : s + 5]))
        ]
        return [], None, (bad[0] if bad else None)
    pieces, kept_lines, prev_end = [], [], None
    for start, end, src in kept_units:
        if prev_end is not None and any(x.strip() for x in lines[prev_end:start]):
            pieces.append("")  # dropped prose or statements between two kept units
        elif prev_end is not None:
            pieces.extend([""] * (start - prev_end))
        pieces.append(src.rstrip("\n"))
        kept_lines.extend(range(start, end))
        prev_end = end
    code = "\n".join(pieces).strip("\n") + "\n"
    try:
        compile(code, "<candidate>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return [], None, f"{type(exc).__name__}: {exc}"
    return kept_lines, code, None


def _thought(before: list[str], after: list[str]) -> str | None:
    """Inner text of the first brace-balanced ``{...}`` in ``before``, else in ``after``; None if none."""
    for chunk in ("\n".join(before), "\n".join(after)):
        start = chunk.find("{")
        while start != -1:
            depth = 0
            for i in range(start, len(chunk)):
                depth += {"{": 1, "}": -1}.get(chunk[i], 0)
                if depth == 0:
                    inner = chunk[start + 1 : i].strip()
                    if inner:
                        return inner
                    break
            else:
                break  # unbalanced: no thought in this chunk
            start = chunk.find("{", i + 1)
    return None


def _docstring_owner(node: ast.AST) -> bool:
    return isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))


def _has_docstring(node: ast.AST) -> bool:
    body = getattr(node, "body", None)
    return bool(
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )


def strip_docstrings(code: str) -> str | None:
    """``code`` without docstrings (the leading string constant of the module, of each function and of each
    class) and without comments, normalised by ``ast.unparse``; None when ``code`` does not parse."""
    try:
        tree = parse_bounded(code)
    except CandidateParseError:
        return None
    for node in ast.walk(tree):
        if _docstring_owner(node) and _has_docstring(node):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def function_docstring(code: str, function_name: str) -> str | None:
    """The docstring of the top-level function ``function_name`` in ``code`` (cleaned as ``inspect.cleandoc``
    does), or None (no such function, no docstring, or ``code`` does not parse)."""
    try:
        tree = parse_bounded(code)
    except CandidateParseError:
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function_name:
            return ast.get_docstring(node)
    return None

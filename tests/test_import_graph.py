"""Imports between coevo's packages run one way, and artifact kinds come from one module.

The package graph is read from the source with ``ast`` (every ``import``, including those under
``TYPE_CHECKING`` and inside functions): a node is a sub-package (``coevo/ahd``) or a top-level module
(``coevo/loop.py``). Intended order (issue 12, item 4): ``types`` -> ``store`` / ``sandbox`` / ``skills`` /
``es`` -> ``backends`` / ``ahd`` / ``envs`` / ``agents`` -> ``context`` -> ``rollouts`` -> ``placement`` -> ``evolvers`` ->
``config`` -> ``loop`` -> ``cli``; small standalone modules (``registry``, ``tables``,
``artifacts``) sit at the bottom. ``report`` renders: it imports only what sits below the evolvers (store, ahd,
tables, types), so evolvers may call its helpers for their own sections (``coevo.report.ahd``, issue 55) and the
loop and the CLI call its writer; it never imports evolver, rollout, placement, loop or config code.
"""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from pathlib import Path

import coevo
from coevo import artifacts

ROOT = Path(coevo.__file__).resolve().parent

#: back-edges still in the code, each owned by a pending move; remove an entry once its edge is gone (the
#: test fails while a listed edge no longer exists, so this list cannot go stale)
PENDING = {}


def _node(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "coevo":
        return None
    return parts[1] if len(parts) > 1 else "coevo"


def package_graph() -> dict[tuple[str, str], list[str]]:
    """(importing node, imported node) -> ["file:line", ...] over every coevo source file."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        src = rel.parts[0].removesuffix(".py") if len(rel.parts) == 1 else rel.parts[0]
        if src == "__init__":
            src = "coevo"
        package = ["coevo", *rel.parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                targets = [base] if node.module else [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                dst = _node(target)
                if dst is not None and dst != src:
                    edges[(src, dst)].append(f"{rel}:{node.lineno}")
    return edges


def find_cycle(edges) -> list[str] | None:
    """One cycle of the graph as a node list (first node repeated at the end), or None."""
    adj: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        adj[a].add(b)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(adj[n]):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (found := visit(m)):
                return found
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(adj):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_import_cycle_between_packages():
    edges = package_graph()
    stale = [e for e in PENDING if e not in edges]
    assert not stale, f"these pending back-edges are gone; delete them from PENDING: {stale}"
    cycle = find_cycle([e for e in edges if e not in PENDING])
    if cycle:
        where = {f"{a} -> {b}": edges[(a, b)][:3] for a, b in itertools.pairwise(cycle)}
        raise AssertionError(f"import cycle between packages {' -> '.join(cycle)}: {where}")


def test_the_cycle_finder_finds_cycles():
    assert find_cycle([("a", "b"), ("b", "c"), ("c", "a")]) == ["a", "b", "c", "a"]
    assert find_cycle([("a", "b"), ("b", "c"), ("a", "c")]) is None


def test_layers_the_issue_names():
    """The moves of issue 12 item 4: the report imports no evolver, agent, rollout, placement, config or loop code
    (evolvers may call its rendering helpers: issue 55 moved the AHD section there), the loop takes no constant
    from the report writer, rollouts do not import evolvers, heuristic design does not import evolvers or
    rollouts, and ``md_table`` lives in a standalone module."""
    edges = package_graph()
    for src, dst in [
        ("report", "evolvers"),
        ("report", "agents"),
        ("report", "loop"),
        ("rollouts", "evolvers"),
        ("ahd", "evolvers"),
        ("ahd", "rollouts"),
        ("agents", "rollouts"),
        ("agents", "report"),
        ("context", "evolvers"),
        ("report", "rollouts"),
        ("report", "placement"),
        ("report", "config"),
        ("report", "cli"),
        ("placement", "evolvers"),  # where replicas live is decided below the evolvers that use it (issue 55)
        ("rollouts", "placement"),
        ("context", "placement"),
    ]:
        assert (src, dst) not in edges, f"{src} imports {dst}: {edges.get((src, dst))}"
    loop_src = (ROOT / "loop.py").read_text()
    assert "coevo.report.writer" not in loop_src
    assert {dst for (src, dst) in edges if src == "tables"} == set()


def test_artifact_kinds_come_from_one_module():
    """Every kind constant of coevo.artifacts is described there, and no store call in the package spells a
    kind as a string literal."""
    constants = {v for k, v in vars(artifacts).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(artifacts.ARTIFACT_KINDS)
    assert all(a.content and a.written_by and a.name for a in artifacts.ARTIFACT_KINDS.values())
    literal = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name, args = node.func.attr, node.args
            kind = None
            if name == "put_artifact" and len(args) >= 2:
                kind = args[1]
            elif name == "get_artifact" and args:
                kind = args[0]
            elif name == "list_artifacts":
                kind = args[0] if args else next((k.value for k in node.keywords if k.arg == "kind"), None)
            if isinstance(kind, ast.Constant):
                literal.append(f"{path.relative_to(ROOT)}:{node.lineno} ({kind.value!r})")
    assert not literal, f"artifact kinds spelled as literals (use coevo.artifacts): {literal}"

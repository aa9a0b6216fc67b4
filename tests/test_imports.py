"""Import circles in the package, read from the source with `ast` (nothing is imported).

Module-level imports must form no circle anywhere in `llmmem` and `llmmem_lsp`. Imports inside
functions are lazy loads (start-up time) and may reach upward through the command layer, but the
three pairs that once imported each other no longer do, lazily or not: `lint_command` does not
import `cli`, `models.spec` does not import `models.architectures`, and the rule registry
imports none of the rule modules (`rules.catalog` does).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"llmmem": ROOT / "analyzer" / "llmmem", "llmmem_lsp": ROOT / "server" / "llmmem_lsp"}


def _modules() -> dict[str, Path]:
    found = {}
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path, lazy: bool) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = ast.walk(tree) if lazy else iter(tree.body)
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                out.add(name if name in MODULES else node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {name for name in out if name in MODULES}


def _graph(lazy: bool) -> dict[str, set[str]]:
    return {name: _imports(path, lazy) - {name} for name, path in MODULES.items()}


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        here = todo.pop()
        if here == goal:
            return True
        if here not in seen:
            seen.add(here)
            todo.extend(graph[here])
    return False


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_module_level_import_circle() -> None:
    assert len(MODULES) > 100  # the walk found the package
    assert _cycles(_graph(lazy=False)) == []


def test_the_pairs_that_imported_each_other_no_longer_do() -> None:
    graph = _graph(lazy=True)
    for low, high in [
        ("llmmem.lint_command", "llmmem.cli"),
        ("llmmem.models.spec", "llmmem.models.architectures"),
        ("llmmem.rules.registry", "llmmem.rules.fit"),
        ("llmmem.rules.registry", "llmmem.rules.practices"),
        ("llmmem.rules.registry", "llmmem.rules.names"),
        ("llmmem.rules.registry", "llmmem.rules.values"),
    ]:
        assert high not in graph[low], f"{low} imports {high}"
    assert not _reaches(graph, "llmmem.models.spec", "llmmem.models.architectures")

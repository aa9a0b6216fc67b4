"""The package's import graph and module sizes, read from the source with `ast` (nothing is
imported).

An import anywhere in a module counts: at module level, inside a function (a deferred import) and
under `if TYPE_CHECKING:` (a type-only one). Each is a dependency a reader must hold in the head,
so no circle is allowed among them, and no module is over 1,000 lines. The few circles and big
modules that are known and owned by work under way are listed below, each with its reason: the
tests fail on any new one, and on an entry that is no longer needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"llmmem": ROOT / "analyzer" / "llmmem", "llmmem_lsp": ROOT / "server" / "llmmem_lsp"}
MAX_LINES = 1000

# Circles known today, each a group of modules that import each other (directly or through one
# another). A circle found is allowed only inside one of these groups: a module that joins one
# fails the test.
KNOWN_CIRCLES: dict[frozenset[str], str] = {}

# Modules known to be over MAX_LINES, each with why it is not split yet.
KNOWN_BIG_MODULES: dict[str, str] = {}


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


def _absolute(name: str, node: ast.ImportFrom) -> str | None:
    """The module an ImportFrom in module `name` names (relative imports resolved)."""
    if node.level == 0:
        return node.module
    package = name.split(".")
    if MODULES[name].name != "__init__.py":
        package.pop()
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def _imports(name: str, lazy: bool, text: str | None = None) -> set[str]:
    """The package's modules `name` imports: at module level, or anywhere when `lazy`."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8") if text is None else text)
    nodes = ast.walk(tree) if lazy else iter(tree.body)
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            module = _absolute(name, node)
            if module is None:
                continue
            for alias in node.names:
                full = f"{module}.{alias.name}"
                out.add(full if full in MODULES else module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {found for found in out if found in MODULES}


def _graph(lazy: bool) -> dict[str, set[str]]:
    return {name: _imports(name, lazy) - {name} for name in MODULES}


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


def _loop(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """One shortest loop through the group's first module, as the import chain it is."""
    start = group[0]
    inside = set(group)
    before: dict[str, str] = {}
    todo = [start]
    while todo:
        here = todo.pop(0)
        for nxt in sorted(graph[here] & inside):
            if nxt == start:
                chain = [here]
                while chain[-1] != start:
                    chain.append(before[chain[-1]])
                return [start, *reversed(chain[:-1]), start]
            if nxt not in before:
                before[nxt] = here
                todo.append(nxt)
    return group


def _line_counts() -> dict[str, int]:
    return {
        name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()
    }


def test_no_module_level_import_circle() -> None:
    assert len(MODULES) > 100  # the walk found the package
    assert _cycles(_graph(lazy=False)) == []


def test_no_import_circle_counting_deferred_and_type_only_imports() -> None:
    graph = _graph(lazy=True)
    new = [
        group for group in _cycles(graph) if not any(set(group) <= known for known in KNOWN_CIRCLES)
    ]
    assert not new, "import circles (imports inside functions and type-only ones count):\n" + (
        "\n".join(
            f"{len(g)} modules: {', '.join(g)}\n  e.g. {' -> '.join(_loop(graph, g))}" for g in new
        )
    )


def test_each_known_circle_is_still_one() -> None:
    found = _cycles(_graph(lazy=True))
    gone = [sorted(known) for known in KNOWN_CIRCLES if not any(set(g) <= known for g in found)]
    assert not gone, f"no longer a circle, take it out of KNOWN_CIRCLES: {gone}"


def test_no_module_over_a_thousand_lines() -> None:
    counts = _line_counts()
    big = {
        name: lines
        for name, lines in sorted(counts.items())
        if lines > MAX_LINES and name not in KNOWN_BIG_MODULES
    }
    assert not big, f"modules over {MAX_LINES} lines (split them by idea): " + ", ".join(
        f"{name} ({lines} lines)" for name, lines in big.items()
    )


def test_each_known_big_module_is_still_big() -> None:
    counts = _line_counts()
    small = [name for name in KNOWN_BIG_MODULES if counts.get(name, 0) <= MAX_LINES]
    assert not small, f"at most {MAX_LINES} lines now, take them out of KNOWN_BIG_MODULES: {small}"


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


def test_the_preference_budgets_build_on_shared_modules_not_on_each_other() -> None:
    """GRPO's, PPO's and TRL 1.x's fused-head budgets take the preference setup and the shared
    moments from modules of their own, never from the DPO-family budget, which reaches them."""
    graph = _graph(lazy=True)
    for low in ("llmmem.budget.grpo", "llmmem.budget.ppo", "llmmem.budget.fused_head"):
        reaches = _reaches(graph, low, "llmmem.budget.preference")
        assert not reaches, f"{low} reaches llmmem.budget.preference"
    for shared in ("llmmem.budget.preference_setup", "llmmem.budget.preference_moments"):
        for high in ("preference", "grpo", "ppo", "fused_head"):
            reaches = _reaches(graph, shared, f"llmmem.budget.{high}")
            assert not reaches, f"{shared} reaches llmmem.budget.{high}"


def test_deferred_type_only_and_relative_imports_are_read() -> None:
    text = """
from typing import TYPE_CHECKING

from llmmem.budget import result

if TYPE_CHECKING:
    from llmmem.budget.setup import TrainingSetup


def later() -> None:
    from llmmem.budget.grpo import GrpoSetup
    from . import weights
    from ..models import spec
"""
    name = "llmmem.budget.preference"
    assert _imports(name, lazy=False, text=text) == {"llmmem.budget.result"}
    assert _imports(name, lazy=True, text=text) == {
        "llmmem.budget.result",
        "llmmem.budget.setup",
        "llmmem.budget.grpo",
        "llmmem.budget.weights",
        "llmmem.models.spec",
    }

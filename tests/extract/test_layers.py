"""The extraction house is layered: each module imports only the layers below it.

The imports are read from the source with `ast`, not by importing. Module-level imports (those
run when the module is first imported, `if`/`try` blocks and class bodies included) build the
import graph the layering is checked on. Imports written inside a function are lazy loads: they
run when the function is first called, and may reach upward (the shell reader hands a launched
`.py` file to the Python reader; `extract_plan` loads each reader on first use), so they are
checked only for cycles, together with the module-level ones. Imports under
`if TYPE_CHECKING:` are annotations only and are left out of both.

Layers, bottom to top:

    numbers < vocabulary < yaml_positions < builder < pragmas < text < notebook_shell
      < frameworks/*        (each framework's reader and fix spellings)
      < configs             (detects the framework and calls its reader)
      < shell/*, python/*, notebook   (the readers of launchers, scripts and notebooks)
      < extract/__init__    (extract_plan)

Inside one layer the shell, Python and notebook readers do not import one another at module
level, and the `shell` and `python` packages keep their own order (below), lazy loads
included. No module in extract/ is over 1,000 lines, no framework module over 500.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "analyzer" / "llmmem" / "extract"
ROOT = "llmmem.extract"

BASE = [
    "numbers",
    "vocabulary",
    "yaml_positions",
    "builder",
    "pragmas",
    "text",
    "notebook_shell",
]
FRAMEWORKS_LAYER = len(BASE)
CONFIGS_LAYER = FRAMEWORKS_LAYER + 1
READERS_LAYER = CONFIGS_LAYER + 1
TOP_LAYER = READERS_LAYER + 1
READER_GROUPS = ("shell", "python", "notebook")

# inside a reader package, each module imports only those before it; __init__ any of them
PACKAGE_ORDERS = {
    "python": [
        "syntax",
        "source",
        "values",
        "loops",
        "findings",
        "training_evidence",
        "local_modules",
        "imports",
        "token_cuts",
        "libraries",
        "arguments",
        "interpreter",
        "emitter",
    ],
    "shell": ["lexer", "expand", "nested", "launchers", "options", "reader"],
}

# the rest of llmmem that sits above extraction: extract never imports it
ABOVE_EXTRACT = (
    "llmmem.rules",
    "llmmem.check",
    "llmmem.cli",
    "llmmem.budget",
    "llmmem.verify",
    "llmmem.report",
    "llmmem.scenario",
    "llmmem.estimate_command",
    "llmmem.explain_command",
    "llmmem.lint_command",
    "llmmem.verify_command",
    "llmmem.preference_plan",
)

MAX_LINES = 1_000
MAX_FRAMEWORK_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([ROOT, *parts])


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> int:
    """The layer of an extract module (see the module docstring)."""
    parts = module.split(".")[2:]
    if not parts:
        return TOP_LAYER
    if parts[0] in BASE:
        return BASE.index(parts[0])
    if parts[0] == "frameworks":
        return FRAMEWORKS_LAYER
    if parts[0] == "configs":
        return CONFIGS_LAYER
    if parts[0] in READER_GROUPS:
        return READERS_LAYER
    raise AssertionError(f"{module} has no layer: add it to tests/extract/test_layers.py")


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(node: ast.Import | ast.ImportFrom, importer: str) -> list[str]:
    """The llmmem modules an import statement loads: `from llmmem.extract.frameworks import
    verl` names the module `...frameworks.verl`; relative imports are resolved."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.startswith("llmmem")]
    base = node.module or ""
    if node.level:
        package = (
            importer if MODULES[importer].name == "__init__.py" else importer.rsplit(".", 1)[0]
        )
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
    if not base.startswith("llmmem"):
        return []
    submodules = [f"{base}.{alias.name}" for alias in node.names]
    found = [name for name in submodules if name in MODULES]
    return [base, *found] if len(found) < len(submodules) else found


def read_imports(module: str) -> tuple[set[str], set[str]]:
    """(module-level imports, function-level imports) of one module."""
    eager: set[str] = set()
    lazy: set[str] = set()

    def visit(statements: list[ast.stmt], in_function: bool) -> None:
        for statement in statements:
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(statement.body, True)
            elif isinstance(statement, ast.Import | ast.ImportFrom):
                (lazy if in_function else eager).update(imported_modules(statement, module))
            elif isinstance(statement, ast.If) and is_type_checking(statement):
                visit(statement.orelse, in_function)
            else:
                for child in ast.iter_child_nodes(statement):
                    if isinstance(child, ast.stmt):
                        visit([child], in_function)
                    elif isinstance(child, ast.excepthandler):
                        visit(child.body, in_function)

    visit(ast.parse(MODULES[module].read_text(encoding="utf-8")).body, False)
    return eager, lazy


IMPORTS = {module: read_imports(module) for module in MODULES}


def inside(module: str) -> set[str]:
    eager, _ = IMPORTS[module]
    return {name for name in eager if name in MODULES and name != module}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the modules, as the path around it; None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := walk(target)) is not None:
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state and (cycle := walk(module)) is not None:
            return cycle
    return None


def test_every_module_has_a_layer() -> None:
    assert len(MODULES) > 30  # the house was found
    for module in MODULES:
        layer(module)


def test_no_import_cycle_at_module_level() -> None:
    assert find_cycle({module: inside(module) for module in MODULES}) is None


def test_no_import_cycle_with_the_lazy_loads() -> None:
    edges = {
        module: {name for name in eager | lazy if name in MODULES and name != module}
        for module, (eager, lazy) in IMPORTS.items()
    }
    assert find_cycle(edges) is None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_only_the_layers_below_it(module: str) -> None:
    own = layer(module)
    for target in sorted(inside(module)):
        below = layer(target) < own
        same_group = own in (FRAMEWORKS_LAYER, READERS_LAYER) and (
            target.split(".")[2] == module.split(".")[2:3][0]
        )
        assert below or same_group, f"{module} (layer {own}) imports {target} ({layer(target)})"


@pytest.mark.parametrize("package", sorted(PACKAGE_ORDERS))
def test_the_reader_packages_keep_their_own_order(package: str) -> None:
    order = PACKAGE_ORDERS[package]
    prefix = f"{ROOT}.{package}."
    assert sorted(order) == sorted(
        name.removeprefix(prefix) for name in MODULES if name.startswith(prefix)
    ), f"a module was added to extract/{package}/: place it in PACKAGE_ORDERS"
    for position, name in enumerate(order):
        eager, lazy = IMPORTS[prefix + name]
        for target in eager | lazy:  # a lazy load inside a package keeps the order too
            if target.startswith(prefix):
                assert target.removeprefix(prefix) in order[:position], (name, target)


# framework modules that are library knowledge for the Python reader (unsloth is called from a
# script, it has no config file): the Python reader may import these, and they import nothing
# of the extraction house, so loading the Python reader loads no config reader
PYTHON_LIBRARY_FRAMEWORKS = (f"{ROOT}.frameworks.unsloth",)


def test_the_python_reader_needs_no_config_reader() -> None:
    allowed = {f"{ROOT}.frameworks", *PYTHON_LIBRARY_FRAMEWORKS}
    for module in MODULES:
        if module.startswith(f"{ROOT}.python"):
            eager, lazy = IMPORTS[module]
            for target in eager | lazy:
                if target in allowed:
                    continue
                assert not target.startswith((f"{ROOT}.configs", f"{ROOT}.frameworks")), module


@pytest.mark.parametrize("module", PYTHON_LIBRARY_FRAMEWORKS)
def test_the_python_readers_framework_tables_import_no_reader(module: str) -> None:
    assert module in MODULES
    eager, lazy = IMPORTS[module]
    assert not {name for name in eager | lazy if name.startswith(ROOT)}, module


@pytest.mark.parametrize("module", sorted(MODULES))
def test_extraction_never_imports_what_sits_above_it(module: str) -> None:
    eager, lazy = IMPORTS[module]
    for target in eager | lazy:
        assert not target.startswith(ABOVE_EXTRACT), f"{module} imports {target}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_sizes(module: str) -> None:
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    limit = MAX_FRAMEWORK_LINES if ".frameworks." in module else MAX_LINES
    assert lines <= limit, f"{MODULES[module].relative_to(PACKAGE)}: {lines} lines"


# -- the checks themselves ----------------------------------------------------------------------


def test_a_cycle_is_found() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_imports_are_read_as_the_interpreter_runs_them() -> None:
    source = PACKAGE / "shell" / "reader.py"
    eager, lazy = IMPORTS[module_name(source)]
    assert f"{ROOT}.configs" in eager
    assert f"{ROOT}.python" in lazy and f"{ROOT}.python" not in eager
    spelling_eager, _ = IMPORTS[f"{ROOT}.frameworks.spelling"]
    assert not any(name.startswith("llmmem.budget") for name in spelling_eager)

"""Imports as the script reader runs them: a library's names are Symbols (`from transformers
import Trainer` is `transformers.Trainer`); a module of the project (`from config import *`,
`import config as cfg`, `from .helpers import build_trainer`) is read, and its names are what
it binds (see `local_modules`); a name nothing binds is not taken for its own text."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path
from typing import Protocol

from llmmem.extract.python.local_modules import MAX_MODULE_BYTES, LocalModules, display_name
from llmmem.extract.python.source import ORIGIN, Origin, SourceMap, mark_origin, parse_script
from llmmem.extract.python.values import (
    Known,
    NamespaceObject,
    Scope,
    Symbol,
    Unknown,
    Value,
    _ReadingStopped,
)
from llmmem.files import read_file_bytes


class ScriptReader(Protocol):
    """What importing needs of the reader that runs it (`interpreter.ScriptReader`; a project
    module is read by a reader of the same class)."""

    path: Path
    source: SourceMap
    problems: list[str]
    local_modules: LocalModules
    module_scope: Scope
    star_imports: list[str]

    def __init__(self, source: SourceMap, path: Path) -> None: ...

    def exec_block(self, body: list[ast.stmt], scope: Scope) -> object: ...


BUILTIN_NAMES = frozenset(dir(builtins))


def exec_import(reader: ScriptReader, node: ast.Import | ast.ImportFrom, scope: Scope) -> None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            local = (
                local_module(reader, alias.name, 0, node)
                if alias.asname or "." not in alias.name
                else None
            )
            if local is not None:
                scope.bind(alias.asname or alias.name, NamespaceObject(dict(local.names)))
            elif alias.asname:
                scope.bind(alias.asname, Symbol(alias.name))
            else:
                top = alias.name.split(".")[0]
                scope.bind(top, Symbol(top))
        return
    module = node.module or ""
    local = local_module(reader, module, node.level, node)
    for alias in node.names:
        if alias.name == "*":
            if local is not None:
                for name, value in local.names.items():
                    if not name.startswith("_"):
                        scope.bind(name, value)
            else:
                reader.star_imports.append(module)
            continue
        dotted = f"{module}.{alias.name}" if module else alias.name
        found: Value | None = local.names.get(alias.name) if local is not None else None
        if found is None and local is None and node.level:
            found = Unknown(f"`{alias.name}` from `{'.' * node.level}{module}`, not found")
        scope.bind(alias.asname or alias.name, found if found is not None else Symbol(dotted))


def local_module(reader: ScriptReader, module: str, level: int, node: ast.AST) -> Scope | None:
    """The names a module of the project binds, read once per script; None for a module the
    project does not hold (a library, or a file past the bounds)."""
    modules = reader.local_modules
    importer = reader.path
    origin = getattr(node, ORIGIN, None)
    if isinstance(origin, Origin):
        importer = Path(origin.path)
    path = modules.find(module, level, importer)
    if path is None:
        return None
    try:
        if path.resolve() == Path(reader.path).resolve():
            return None
    except OSError:
        return None
    if path in modules.scopes:
        return modules.scopes[path]
    if not modules.can_read(path):
        return None
    modules.scopes[path] = None  # an import back to it gets nothing, as in Python
    scope = read_module_file(reader, path, module or path.stem)
    modules.scopes[path] = scope
    return scope


def read_module_file(reader: ScriptReader, path: Path, name: str) -> Scope | None:
    """Runs a project module's top level in a reader of its own (the objects it builds there
    are not this script's) and returns what it binds; its functions, called from the script,
    run in the script's reader."""
    try:
        text = read_file_bytes(path, MAX_MODULE_BYTES).decode("utf-8-sig", errors="replace")
    except OSError:
        return None
    parsed = parse_script(text)
    if parsed.module is None:
        reader.problems.append(f"{display_name(path)}: not read ({parsed.problem})")
        return None
    mark_origin(parsed.module, Origin(SourceMap(text), display_name(path)))
    module_reader = type(reader)(reader.source, path)
    module_reader.local_modules = reader.local_modules
    module_reader.module_scope.bind("__name__", Known(name, None))
    reader.local_modules.depth += 1
    try:
        module_reader.exec_block(parsed.module.body, module_reader.module_scope)
    except _ReadingStopped:
        pass
    finally:
        reader.local_modules.depth -= 1
    return module_reader.module_scope


def unbound_name(reader: ScriptReader, node: ast.Name) -> Value:
    """A name nothing in the file binds: a builtin (`len`, `print`), a class or function of a
    library star-imported (`from transformers import *`), else a value the file does not hold
    (a constant of `from config import *` whose module is not in the project), never its own
    name as text."""
    name = node.id
    if name in BUILTIN_NAMES:
        return Symbol(name, node)
    if reader.star_imports:
        module = reader.star_imports[-1]
        if name[:1].isupper() and not name.isupper():
            return Symbol(f"{module}.{name}", node)
        return Unknown(f"`{name}`, from `from {module} import *` (not in the project)", node)
    return Unknown(f"`{name}` is not defined before it is used", node)

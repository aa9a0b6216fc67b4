"""Where a setting is in a Python file: the tree (with the syntax of newer Python releases), the
node a range names, the call around it, a conditional expression's branches, and the literal a
value is written as."""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmmem.plan import SourceRange
from llmmem.rules.text_edits import line_starts, node_span, range_of_span, range_span


@dataclass(frozen=True)
class Rescaled:
    """A new integer value that is the old one changed by `rule` (halved, doubled). Where the
    setting is a conditional expression every branch is changed by `rule` (None: a branch it
    does not apply to, and then there is no edit)."""

    value: int
    rule: Callable[[int], int | None]


def assigned_name(tree: ast.AST, value: ast.expr) -> str | None:
    """`name` when `value` is the whole right side of `name = value`."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                return targets[0].id
    return None


def plain_value(value: Any) -> Any:
    """The value written where the setting is one literal (a `Rescaled`'s new value)."""
    return value.value if isinstance(value, Rescaled) else value


def python_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def yaml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def python_tree(text: str) -> ast.Module | None:
    """The module as the reader saw it (syntax of newer Python releases included)."""
    from llmmem.extract.python.source import parse_script

    return parse_script(text).module


def node_range(text: str, node: ast.AST) -> SourceRange:
    """Where a node is written, in the plan's terms (columns in characters)."""
    starts = line_starts(text)
    return range_of_span(text, *node_span(text, node, starts), starts)


def node_at(tree: ast.AST, text: str, where: SourceRange) -> ast.expr | None:
    """The expression written exactly over `where`."""
    starts = line_starts(text)
    wanted = range_span(text, where, starts)
    for node in ast.walk(tree):
        if isinstance(node, ast.expr) and node.lineno - 1 == where.start_line:
            if node_span(text, node, starts) == wanted:
                return node
    return None


def call_at(tree: ast.AST, text: str, where: SourceRange) -> ast.Call | None:
    node = node_at(tree, text, where)
    return node if isinstance(node, ast.Call) else None


def callee_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _branch_parents(tree: ast.AST) -> dict[int, ast.IfExp]:
    """For each branch of a conditional expression (`id` of the node), that expression."""
    return {
        id(branch): node
        for node in ast.walk(tree)
        if isinstance(node, ast.IfExp)
        for branch in (node.body, node.orelse)
    }


def _branches(node: ast.expr) -> list[ast.expr]:
    """The expressions a conditional expression may give (those of nested ones included)."""
    if isinstance(node, ast.IfExp):
        return _branches(node.body) + _branches(node.orelse)
    return [node]


def _single_assignment(tree: ast.AST, name: str) -> ast.expr | None:
    """The value of the one assignment `name = value` in the file (None: none, or several)."""
    values = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and node.value is not None
        and any(
            isinstance(target, ast.Name) and target.id == name
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    return values[0] if len(values) == 1 else None


def reads_of(tree: ast.AST, name: str) -> int:
    return sum(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
        for n in ast.walk(tree)
    )


def conditional_around(
    tree: ast.AST, text: str, where: SourceRange, trainer: SourceRange | None, field: str
) -> ast.IfExp | None:
    """The conditional expression that chooses a setting read from `where`: the one (the
    outermost) `where` is a branch of, else the one the trainer call's `field=` keyword is
    written as, directly or in the variable it names. None where none chooses it."""
    node = node_at(tree, text, where)
    parents = _branch_parents(tree)
    if node is not None and id(node) in parents:
        whole = parents[id(node)]
        while id(whole) in parents:
            whole = parents[id(whole)]
        return whole
    call = call_at(tree, text, trainer) if trainer is not None else None
    written = next((kw.value for kw in call.keywords if kw.arg == field), None) if call else None
    if isinstance(written, ast.Name):
        written = _single_assignment(tree, written.id)
    return written if isinstance(written, ast.IfExp) else None


def branch_writes(
    tree: ast.AST, whole: ast.IfExp, chosen: ast.expr | None, value: Any
) -> list[tuple[ast.expr, int]] | None:
    """Each branch of `whole` and its new value (`value`'s rule applied to its literal), or
    None unless every branch can be changed so: `value` is a `Rescaled`, each branch an
    integer literal the rule applies to, `chosen` (the literal the reader took) one of them,
    and `whole` not in a variable that something else reads too."""
    if not isinstance(value, Rescaled):
        return None
    branches = _branches(whole)
    if chosen is None or not any(branch is chosen for branch in branches):
        return None  # the value read is written elsewhere (a name): not this expression's
    writes: list[tuple[ast.expr, int]] = []
    for branch in branches:
        if not (isinstance(branch, ast.Constant) and type(branch.value) is int):
            return None
        new = value.rule(branch.value)
        if new is None:
            return None
        writes.append((branch, new))
    variable = assigned_name(tree, whole)
    if variable is not None and reads_of(tree, variable) > 1:
        return None
    return writes


ARGUMENT_CLASSES = ("TrainingArguments", "Config")  # TrainingArguments, SFTConfig, DPOConfig...


QLORA_IMPORTS = (
    ("torch", None),
    ("transformers", "BitsAndBytesConfig"),
    ("peft", "prepare_model_for_kbit_training"),
)

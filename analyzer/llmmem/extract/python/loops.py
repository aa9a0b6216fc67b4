"""Loops, run as Python runs them, to a bound: a value is either right or not claimed.

A `for` over values the file states (a list, a dict's items, `range(3)`) runs once per value, in
order, up to MAX_LOOP_RUNS; a `while` runs while its condition is known to hold, up to the same
bound. Where the number of runs is not known (`for batch in loader`, `while step < args.steps`)
or the bound is reached, the body is read once, for what it builds, and every name the body
changes from its own previous value (`B //= 2`, `lr = lr * 0.9`: the names it both reads and
writes) is unknown after the loop, with a note that says why. A plain partial value labelled
explicit would be a wrong number presented as the file's own.

The reader (`interpreter.ScriptReader`) calls `run_for` and `run_while` with itself; this module
imports only the values (the reader is a Protocol here).
"""

from __future__ import annotations

import ast
from typing import Protocol

from llmmem.extract.python.values import (
    CallArgs,
    ConfigObject,
    DataclassInstance,
    DictValue,
    Flow,
    Known,
    ListValue,
    NamespaceObject,
    Scope,
    Unknown,
    Value,
    _truth,
    settle,
)


class ScriptReader(Protocol):
    """What a loop needs of the reader that runs it (`interpreter.ScriptReader`)."""

    def eval(self, node: ast.expr | None, scope: Scope) -> Value: ...

    def assign(self, target: ast.expr, value: Value, scope: Scope) -> None: ...

    def exec_block(self, body: list[ast.stmt], scope: Scope) -> Flow: ...


MAX_LOOP_RUNS = 32  # runs of one loop followed before its changes are called unknown


def loop_items(iterable: Value) -> tuple[list[Value], int] | None:
    """The values a `for` runs over (the first MAX_LOOP_RUNS + 1 at least) and how many there
    are, when the file states them; None when not known."""
    if isinstance(iterable, LongRange):
        return list(iterable.items), iterable.length
    if isinstance(iterable, ListValue):
        return list(iterable.items), len(iterable.items)
    if isinstance(iterable, DictValue) and not iterable.unread:
        return [Known(key, iterable.node) for key in iterable.entries], len(iterable.entries)
    if isinstance(iterable, Known) and isinstance(iterable.value, (list, tuple, str, dict)):
        items: list[Value] = [
            Known(item, iterable.node, iterable.source, iterable.note) for item in iterable.value
        ]
        return items, len(items)
    return None


def changed_from_themselves(body: list[ast.stmt]) -> set[str]:
    """The names a loop body writes from their own previous value: written there (`=`, `+=`,
    a nested `for`'s target) and read there too."""
    written: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            written.add(node.target.id)
            read.add(node.target.id)
        elif isinstance(node, ast.Name):
            (written if isinstance(node.ctx, ast.Store) else read).add(node.id)
    return written & read


def forget_changes(body: list[ast.stmt], scope: Scope, why: str) -> None:
    for name in changed_from_themselves(body):
        if scope.lookup(name) is not None:
            scope.bind(name, Unknown(why))


def run_for(reader: ScriptReader, node: ast.For | ast.AsyncFor, scope: Scope) -> Flow:
    known = loop_items(reader.eval(node.iter, scope))
    line = node.lineno
    if known is None:
        reader.assign(node.target, Unknown("a loop variable"), scope)
        flow = reader.exec_block(node.body, scope)
        forget_changes(
            node.body,
            scope,
            f"changed by each run of the loop at line {line}, which runs a number of times "
            "not known before run time",
        )
        return flow if flow is Flow.RETURN else Flow.NORMAL
    items, count = known
    for item in items[:MAX_LOOP_RUNS]:
        reader.assign(node.target, item, scope)
        flow = reader.exec_block(node.body, scope)
        if flow is Flow.RETURN:
            return flow
        if flow in (Flow.BREAK, Flow.STOP):
            return Flow.NORMAL
    if count > MAX_LOOP_RUNS:
        forget_changes(
            node.body,
            scope,
            f"changed by the loop at line {line}, which runs {count:,} times; llmmem "
            f"follows a loop for {MAX_LOOP_RUNS} runs",
        )
        return Flow.NORMAL
    return reader.exec_block(node.orelse, scope)


def run_while(reader: ScriptReader, node: ast.While, scope: Scope) -> Flow:
    line = node.lineno
    runs = 0
    while True:
        truth = _truth(reader.eval(node.test, scope))
        if truth is False:
            return reader.exec_block(node.orelse, scope)
        if truth is None or runs >= MAX_LOOP_RUNS:
            if runs == 0:  # read the body once, for what it builds
                flow = reader.exec_block(node.body, scope)
                if flow is Flow.RETURN:
                    return flow
            why = (
                f"changed by the loop at line {line}, whose condition is not known before run time"
                if truth is None
                else f"changed by the loop at line {line}, which runs more than "
                f"{MAX_LOOP_RUNS} times (llmmem follows a loop for {MAX_LOOP_RUNS} runs)"
            )
            forget_changes(node.body, scope, why)
            return Flow.NORMAL
        flow = reader.exec_block(node.body, scope)
        runs += 1
        if flow is Flow.RETURN:
            return flow
        if flow in (Flow.BREAK, Flow.STOP):
            return Flow.NORMAL


def counted_range(args: CallArgs) -> Value:
    """`range(...)` of stated whole numbers, as the values a loop runs over (one past the bound
    at most: the loop knows its length from `len`); unknown otherwise."""
    bounds = [settle(value) for value in args.positional]
    if not 1 <= len(bounds) <= 3 or any(
        known is None or not isinstance(known.value, int) or isinstance(known.value, bool)
        for known in bounds
    ):
        return Unknown("range() of values not known", args.node)
    numbers = range(*[int(known.value) for known in bounds])  # type: ignore[union-attr, arg-type]
    if len(numbers) > MAX_LOOP_RUNS + 1:
        shown: list[Value] = [Known(n, args.node) for n in numbers[: MAX_LOOP_RUNS + 1]]
        return LongRange(shown, args.node, len(numbers))
    return ListValue([Known(n, args.node) for n in numbers], args.node)


class LongRange(ListValue):
    """The first runs of a `range` longer than a loop is followed, and its full length."""

    def __init__(self, items: list[Value], node: ast.AST | None, length: int) -> None:
        super().__init__(items, node)
        self.length = length


def forget_fields(owner: Value, why: str) -> None:
    """Every field of a config, namespace or dict: unknown (`setattr(args, name, value)` with
    a name only the run knows may set any of them)."""
    fields = (
        owner.fields
        if isinstance(owner, (ConfigObject, DataclassInstance))
        else owner.attributes
        if isinstance(owner, NamespaceObject)
        else owner.entries
        if isinstance(owner, DictValue)
        else None
    )
    if fields is not None:
        for name in fields:
            fields[name] = Unknown(why)

"""Python fixes as libcst codemods: a change is planned on the concrete syntax tree (which call
gets a keyword, which value is replaced, which statement goes after which), written by one
transformer, and handed back as the smallest text edits between the file before and after.

Everything the tree keeps is kept: comments (a comment after the last argument stays on that
argument's line), trailing commas, the quotes a replaced string was written with, blank lines,
and the file's line endings (a new line gets the file's own: LF, CRLF or CR). A fix that changes
several places (LoRA -> QLoRA: the import lines, `quantization_config=` on the model's
`from_pretrained`, `prepare_model_for_kbit_training` after it) is one codemod and one parse.

libcst takes ~0.15 s to import, so nothing imports this module at start-up: `rules/edits`
imports it inside the functions that write a Python fix, and a lint that shows no fixes never
does (see `edits.preview_python_edits`). The nodes are matched with `isinstance`, not with
`libcst.matchers`, whose import alone takes another 0.35 s.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from llmmem.plan import SourceRange, TrainingPlan
from llmmem.rules.finding import TextEdit
from llmmem.rules.python_nodes import (
    ARGUMENT_CLASSES,
    QLORA_IMPORTS,
    branch_writes,
    conditional_around,
    node_at,
    node_range,
    plain_value,
    python_literal,
    python_tree,
)
from llmmem.rules.text_edits import diff_edits

NO_SPACE = cst.SimpleWhitespace("")


class Source:
    """One parsed text: its module and where each expression is written (the plan's ranges:
    0-based lines, columns in characters)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.module = cst.parse_module(text)
        # libcst drops a CR that ends a CR-only file; put back whatever ends the text so
        self.end = text[len(self.module.code) :]
        if self.module.code + self.end != text:
            raise ValueError("the text does not read back as it was written")
        positions = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)
        self.positions = positions
        self.expressions: dict[tuple[int, int, int, int], cst.BaseExpression] = {}
        for node, where in positions.items():
            if isinstance(node, cst.BaseExpression):
                key = (
                    where.start.line - 1,
                    where.start.column,
                    where.end.line - 1,
                    where.end.column,
                )
                self.expressions.setdefault(key, node)

    def at(self, where: SourceRange | None) -> cst.BaseExpression | None:
        """The expression written exactly over `where` (a range of this file)."""
        if where is None or where.path is not None:
            return None
        return self.expressions.get(
            (where.start_line, where.start_col, where.end_line, where.end_col)
        )

    def call_at(self, where: SourceRange | None) -> cst.Call | None:
        node = self.at(where)
        return node if isinstance(node, cst.Call) else None

    @functools.cached_property
    def assignments(self) -> dict[int, tuple[str, cst.SimpleStatementLine | None]]:
        """For each value assigned to one name (`name = value`, `name: T = value`): the name,
        and the statement line when the assignment is alone on it."""
        found: dict[int, tuple[str, cst.SimpleStatementLine | None]] = {}

        class Finder(cst.CSTVisitor):
            def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> bool:
                self.visit_SimpleStatementLine(node)
                return False

            def visit_SimpleStatementLine(
                self, node: cst.SimpleStatementLine | cst.SimpleStatementSuite
            ) -> bool:
                alone = isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1
                for statement in node.body:
                    if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
                        target, value = statement.targets[0].target, statement.value
                    elif isinstance(statement, cst.AnnAssign) and statement.value is not None:
                        target, value = statement.target, statement.value
                    else:
                        continue
                    if isinstance(target, cst.Name):
                        line = node if alone and isinstance(node, cst.SimpleStatementLine) else None
                        found[id(value)] = (target.value, line)
                return False  # a statement line holds no other statement

        self.module.visit(Finder())
        return found


@functools.lru_cache(maxsize=8)
def parsed(text: str) -> Source | None:
    """The text parsed once for all the fixes asked of it (the tree is never mutated)."""
    try:
        return Source(text)
    except (cst.ParserSyntaxError, RecursionError, ValueError):
        return None


@dataclass
class Change:
    """What one codemod does, keyed by the original nodes (`id`): keywords added to calls,
    expressions replaced, statements inserted before or after a statement."""

    targets: list[cst.CSTNode] = field(default_factory=list)
    keywords: dict[int, list[tuple[str, cst.BaseExpression]]] = field(default_factory=dict)
    replaced: dict[int, cst.BaseExpression] = field(default_factory=dict)
    before: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    after: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)

    def add_keyword(self, call: cst.Call, name: str, value: cst.BaseExpression) -> None:
        self.targets.append(call)
        self.keywords.setdefault(id(call), []).append((name, value))

    def insert_before(self, statement: cst.CSTNode, new: cst.BaseStatement) -> None:
        self.targets.append(statement)
        self.before.setdefault(id(statement), []).append(new)

    def insert_after(self, statement: cst.CSTNode, new: cst.BaseStatement) -> None:
        self.targets.append(statement)
        self.after.setdefault(id(statement), []).append(new)

    def replace(self, node: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if getattr(node, "lpar", None) and hasattr(value, "lpar"):
            value = value.with_changes(lpar=node.lpar, rpar=node.rpar)  # `(8)` stays `(4)`
        self.targets.append(node)
        self.replaced[id(node)] = value

    def empty(self) -> bool:
        return not (self.keywords or self.replaced or self.before or self.after)


class _Codemod(cst.CSTTransformer):
    """Writes a `Change`, descending only into the nodes written around its targets (the
    rest of the tree is kept as it is, not rebuilt)."""

    def __init__(self, source: Source, change: Change) -> None:
        super().__init__()
        self.change = change
        self.positions = source.positions
        self.spans = [_span(source.positions[target]) for target in change.targets]

    def on_visit(self, node: cst.CSTNode) -> bool:
        where = self.positions.get(node)
        if where is not None and not isinstance(node, cst.Module):
            start, end = _span(where)
            if not any(start <= s and e <= end for s, e in self.spans):
                return False
        return super().on_visit(node)

    def on_leave(self, original_node: Any, updated_node: Any) -> Any:
        updated = super().on_leave(original_node, updated_node)
        replaced = self.change.replaced.get(id(original_node))
        if replaced is not None:
            return replaced
        if isinstance(original_node, cst.Call) and isinstance(updated, cst.Call):
            for name, value in self.change.keywords.get(id(original_node), ()):
                updated = with_keyword(updated, name, value)
        return updated

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._spliced(original_node.body, updated_node.body))

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._spliced(original_node.body, updated_node.body))

    def _spliced(self, originals: Sequence[Any], updated: Sequence[Any]) -> list[Any]:
        body: list[Any] = []
        for original, statement in zip(originals, updated, strict=True):
            inserted = list(self.change.before.get(id(original), ()))
            if inserted and isinstance(
                statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)
            ):
                # comments written just above the statement stay above what goes before it
                first = inserted[0].with_changes(leading_lines=statement.leading_lines)
                inserted[0] = first
                statement = statement.with_changes(leading_lines=())
            body += inserted
            body.append(statement)
            body += self.change.after.get(id(original), ())
        return body


def _span(where: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    return (where.start.line, where.start.column), (where.end.line, where.end.column)


def written(source: Source, change: Change) -> list[TextEdit] | None:
    """The codemod's edits: the smallest text changes from the text before to the text after."""
    if change.empty():
        return None
    after = source.module.visit(_Codemod(source, change))
    assert isinstance(after, cst.Module)
    edits = diff_edits(source.text, after.code + source.end)
    return edits or None


# -- the pieces: a keyword in a call, a literal, a statement --------------------------------


def with_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`name=value` as the call's last argument, laid out like the arguments before it: on
    the same line in a one-line call, on a line of its own (with a trailing comma) where the
    closing parenthesis has its own line. A comment after the last argument stays there."""
    new = cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(whitespace_before=NO_SPACE, whitespace_after=NO_SPACE),
    )
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    comma = last.comma if isinstance(last.comma, cst.Comma) else None
    tail = comma.whitespace_after if comma is not None else last.whitespace_after_arg
    # what separates two arguments in this call (a comment there is not copied)
    between: cst.BaseParenthesizableWhitespace = cst.SimpleWhitespace(" ")
    if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
        between = args[-2].comma.whitespace_after
    elif isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        between = call.whitespace_before_args
    if isinstance(between, cst.ParenthesizedWhitespace):
        between = between.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=())
    before_new: cst.BaseParenthesizableWhitespace
    if isinstance(tail, cst.ParenthesizedWhitespace):  # `)` on a line of its own
        closing = cst.ParenthesizedWhitespace(indent=tail.indent, last_line=tail.last_line)
        if isinstance(between, cst.ParenthesizedWhitespace):
            before_new = tail.with_changes(indent=between.indent, last_line=between.last_line)
        elif tail.first_line.comment is None and not tail.empty_lines:
            before_new = between
        else:
            before_new = tail.with_changes(
                last_line=cst.SimpleWhitespace(tail.last_line.value + "    ")
            )
        new = new.with_changes(comma=cst.Comma(whitespace_after=closing))
    else:  # `)` right after the last argument (and its comma, kept as the new one's)
        before_new = between
        new = new.with_changes(
            comma=last.comma,
            whitespace_after_arg=NO_SPACE if comma is not None else last.whitespace_after_arg,
        )
    last = last.with_changes(
        comma=cst.Comma(
            whitespace_before=comma.whitespace_before if comma is not None else NO_SPACE,
            whitespace_after=before_new,
        ),
        whitespace_after_arg=last.whitespace_after_arg if comma is not None else NO_SPACE,
    )
    return call.with_changes(args=[*args[:-1], last, new])


def literal(value: Any, quote: str = '"') -> cst.BaseExpression:
    """A Python literal for `value`; a string in the file's `quote`."""
    if isinstance(value, str) and quote == "'" and "'" not in value:
        return cst.SimpleString(f"'{value}'")
    return cst.parse_expression(python_literal(value))


def _quote_of(nodes: Sequence[cst.CSTNode]) -> str:
    """The quote the first plain string among `nodes` is written with (`"` when none)."""
    for node in nodes:
        if isinstance(node, cst.Arg):
            node = node.value
        if isinstance(node, cst.SimpleString):
            return node.quote[0]
    return '"'


def callee(call: cst.Call) -> str:
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""


def has_keyword(call: cst.Call, name: str) -> bool:
    """The call has `name=` already, or a `**mapping` that may hold it."""
    return any(
        (arg.keyword is not None and arg.keyword.value == name) or arg.star == "**"
        for arg in call.args
    )


def _named(node: cst.CSTNode | None, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _declares(line: cst.CSTNode, field_name: str) -> bool:
    """`field_name: type = ...` (or without a value) on the line."""
    statement = _only(line)
    return isinstance(statement, cst.AnnAssign) and _named(statement.target, field_name)


def _statement(code: str) -> cst.SimpleStatementLine:
    statement = cst.parse_statement(code + "\n")
    assert isinstance(statement, cst.SimpleStatementLine)
    return statement


def _line_holding(
    source: Source, value: cst.BaseExpression
) -> tuple[cst.SimpleStatementLine, str] | None:
    """The statement line `name = <value>` (alone on its line), and the name."""
    name, line = source.assignments.get(id(value), ("", None))
    return (line, name) if line is not None else None


def _assigned_name(source: Source, value: cst.BaseExpression) -> str | None:
    """`name` when `value` is the whole right side of `name = value`."""
    found = source.assignments.get(id(value))
    return found[0] if found is not None else None


def _reads(text: str, name: str) -> int:
    """How many times the file reads the variable `name`."""
    tree = python_tree(text)
    if tree is None:
        return 0
    return sum(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
        for n in ast.walk(tree)
    )


# -- settings: where the value the reader traced is written, or where it would be -----------


def setting_edits(
    plan: TrainingPlan, text: str, settings: Sequence[tuple[str, Any, SourceRange | None]]
) -> list[TextEdit] | None:
    """Edits making a Python file say `field_name = value` for each of `settings`, one codemod
    for all of them, or None unless every one can be written; each comes with where the reader
    found its value written (None: it came from a default).

    - a flag's `add_argument(...)` call: its `default=` is set (added when missing);
    - a variable's literal (`bs = 8`): edited there only when nothing else reads the variable,
      else the trainer call's `field_name=bs` gets the literal instead;
    - any other written value: replaced where it stands, in its own quotes;
    - a value a conditional expression chooses: every branch's literal (`branch_writes`)
      for a `Rescaled` value, else no edit;
    - from a default: a keyword of the TrainingArguments/SFTConfig call, or for
      `HfArgumentParser((...))` a field of its TrainingArguments dataclass (the parser takes
      no such keyword); never a keyword the call has or may get from a `**mapping`."""
    source = parsed(text)
    if source is None:
        return None
    change = Change()
    for field_name, value, where in settings:
        if where is not None:
            if not _plan_value(source, plan, field_name, where, value, change):
                return None
        elif not _plan_insert(source, plan, field_name, value, change):
            return None
    return written(source, change)


def _plan_value(
    source: Source,
    plan: TrainingPlan,
    field_name: str,
    where: SourceRange,
    value: Any,
    change: Change,
) -> bool:
    node = source.at(where)
    if node is None:
        return False
    tree = python_tree(source.text)
    whole = (
        conditional_around(tree, source.text, where, plan.trainer_range, field_name)
        if tree is not None
        else None
    )
    if tree is not None and whole is not None:
        # a conditional expression chooses the value: every branch changes, or no edit
        writes = branch_writes(tree, whole, node_at(tree, source.text, where), value)
        if writes is None:
            return False
        for branch, new_value in writes:
            branch_node = source.at(node_range(source.text, branch))
            if branch_node is None:
                return False
            change.replace(branch_node, literal(new_value))
        return True
    value = plain_value(value)
    if isinstance(node, cst.Call):
        if callee(node) != "add_argument":
            return False
        default = next(
            (a for a in node.args if a.keyword is not None and a.keyword.value == "default"),
            None,
        )
        if default is not None:
            change.replace(default.value, literal(value, _quote_of([default.value])))
        elif not any(arg.star == "**" for arg in node.args):
            change.add_keyword(node, "default", literal(value, _quote_of(node.args)))
        else:
            return False
        return True
    new = literal(value, _quote_of([node]))
    variable = _assigned_name(source, node)
    if variable is None or _reads(source.text, variable) <= 1:
        change.replace(node, new)
        return True
    call = source.call_at(plan.trainer_range)
    if call is None:
        return False
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == field_name:
            if isinstance(arg.value, cst.Name) and arg.value.value == variable:
                change.replace(arg.value, new)
                return True
    return False


def _plan_insert(
    source: Source, plan: TrainingPlan, field_name: str, value: Any, change: Change
) -> bool:
    call = source.call_at(plan.trainer_range)
    if call is None:
        return False
    if callee(call) == "HfArgumentParser":
        return _plan_dataclass_field(source, call, field_name, value, change)
    if not callee(call).endswith(ARGUMENT_CLASSES):
        return False  # not a call known to take the setting as a keyword
    if has_keyword(call, field_name):
        return False
    value = plain_value(value)
    change.add_keyword(call, field_name, literal(value, _quote_of(call.args)))
    return True


def _plan_dataclass_field(
    source: Source, parser: cst.Call, field_name: str, value: Any, change: Change
) -> bool:
    """`field_name: type = value` at the end of the body of the TrainingArguments dataclass
    that `HfArgumentParser((...))` is given."""
    value = plain_value(value)
    listed = parser.args[0].value if parser.args and parser.args[0].keyword is None else None
    elements = (
        [e.value for e in listed.elements]
        if isinstance(listed, (cst.Tuple, cst.List))
        else [listed]
    )
    names = {e.value for e in elements if isinstance(e, cst.Name)}
    for statement in source.module.body:
        if not (isinstance(statement, cst.ClassDef) and statement.name.value in names):
            continue
        bases = [
            b.value.attr.value
            if isinstance(b.value, cst.Attribute)
            else getattr(b.value, "value", "")
            for b in statement.bases
        ]
        if not any(isinstance(base, str) and base.endswith(ARGUMENT_CLASSES) for base in bases):
            continue
        body = statement.body
        if not isinstance(body, cst.IndentedBlock) or not body.body:
            return False  # a one-line class body
        if any(_declares(line, field_name) for line in body.body):
            return False
        kind = type(value).__name__
        field_line = _statement(f"{field_name}: {kind} = {python_literal(value)}")
        change.insert_after(body.body[-1], field_line)
        return True
    return False


def keyword_edits(
    text: str, call_range: SourceRange, name: str, value: Any
) -> list[TextEdit] | None:
    """`name=value` added to the call written over `call_range` (unless it has it)."""
    source = parsed(text)
    call = source.call_at(call_range) if source is not None else None
    if source is None or call is None or has_keyword(call, name):
        return None
    change = Change()
    change.add_keyword(call, name, literal(value, _quote_of(call.args)))
    return written(source, change)


# -- statements after the model is loaded, imports, and LoRA -> QLoRA ---------------------------


def statement_after_edits(
    text: str, call_range: SourceRange, make_line: Callable[[str], str]
) -> list[TextEdit] | None:
    """`make_line(name)` as a statement right after `name = <call>` (the call over
    `call_range`), in the same block."""
    source = parsed(text)
    if source is None:
        return None
    change = Change()
    if not _plan_after_load(source, call_range, make_line, change):
        return None
    return written(source, change)


def _plan_after_load(
    source: Source, call_range: SourceRange, make_line: Callable[[str], str], change: Change
) -> bool:
    call = source.call_at(call_range)
    holding = _line_holding(source, call) if call is not None else None
    if holding is None:
        return False
    line, name = holding
    change.insert_after(line, _statement(make_line(name)))
    return True


def _imported(module: cst.Module, module_name: str, name: str | None) -> bool:
    """The file imports `module_name` (or `name` from it) at its top level."""
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if name is None and isinstance(small, cst.Import):
                if any(module.code_for_node(a.name) == module_name for a in small.names):
                    return True
            if (
                name is not None
                and isinstance(small, cst.ImportFrom)
                and not small.relative
                and small.module is not None
                and module.code_for_node(small.module) == module_name
            ):
                if isinstance(small.names, cst.ImportStar):
                    return True
                if any(_named(alias.name, name) for alias in small.names):
                    return True
    return False


def _only(line: cst.CSTNode) -> cst.BaseSmallStatement | None:
    """The one statement of a line holding one simple statement."""
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line.body[0]
    return None


def _is_future(line: cst.CSTNode) -> bool:
    statement = _only(line)
    return isinstance(statement, cst.ImportFrom) and _named(statement.module, "__future__")


def _is_docstring(line: cst.CSTNode) -> bool:
    statement = _only(line)
    return isinstance(statement, cst.Expr) and isinstance(
        statement.value, (cst.SimpleString, cst.ConcatenatedString)
    )


def _is_import(line: cst.CSTNode) -> bool:
    return isinstance(_only(line), (cst.Import, cst.ImportFrom))


def _plan_import(source: Source, module_name: str, name: str | None, change: Change) -> bool:
    """`from module_name import name` (or `import module_name`) before the file's first
    top-level import (after `from __future__` ones), else after the docstring and
    `__future__` lines, unless the file has it."""
    module = source.module
    if _imported(module, module_name, name):
        return True
    statement = _statement(f"from {module_name} import {name}" if name else f"import {module_name}")
    header: cst.CSTNode | None = None
    for index, line in enumerate(module.body):
        if _is_future(line) or (index == 0 and _is_docstring(line)):
            header = line
        elif _is_import(line):
            change.insert_before(line, statement)
            return True
    if header is not None:
        change.insert_after(header, statement)
    elif module.body:
        change.insert_before(module.body[0], statement)
    else:
        return False
    return True


def import_edits(text: str, module_name: str, name: str | None = None) -> list[TextEdit] | None:
    """The edits adding `from module_name import name` (or `import module_name`), none when
    the file has it."""
    source = parsed(text)
    if source is None:
        return None
    change = Change()
    if not _plan_import(source, module_name, name, change):
        return None
    return written(source, change)


def qlora_edits(text: str, model_range: SourceRange, config_code: str) -> list[TextEdit] | None:
    """LoRA -> QLoRA as one codemod: `quantization_config=<config_code>` on the model's
    `from_pretrained` call, `model = prepare_model_for_kbit_training(model)` right after its
    statement, and the imports they need. None unless every part can be written."""
    source = parsed(text)
    call = source.call_at(model_range) if source is not None else None
    if source is None or call is None or has_keyword(call, "quantization_config"):
        return None
    change = Change()
    change.add_keyword(call, "quantization_config", cst.parse_expression(config_code))
    if not _plan_after_load(
        source,
        model_range,
        lambda name: f"{name} = prepare_model_for_kbit_training({name})",
        change,
    ):
        return None
    for module_name, name in QLORA_IMPORTS:
        if not _plan_import(source, module_name, name, change):
            return None
    return written(source, change)

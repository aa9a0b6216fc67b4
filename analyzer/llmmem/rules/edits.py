"""Text edits that change one setting of a plan in the file it came from, and nothing else.

A setting written explicitly is edited where it stands (its value's range); one that came from a
default is added: as a keyword of the TrainingArguments/SFTConfig call in Python (never into a
call that already has it or a `**mapping` that may hold it; for `HfArgumentParser((...))` as a
field of its TrainingArguments dataclass), as a new top-level key in YAML/JSON (`config_edits`).
A value read through a variable is edited at the variable's literal only when nothing else reads
the variable; otherwise the keyword gets the literal. A flag's `add_argument(...)` gets a
`default=`. Where no safe place exists (no trainer call, a shell launcher without the flag)
there is no edit.

A value chosen by a conditional expression (`16 if BIG else 8`, in the keyword itself or in the
variable it reads) is changed in every branch or not at all: a change relative to the value
(`Rescaled`: the micro-batch halved, the accumulation doubled) is applied to each branch's
integer literal (`8 if BIG else 4`), so each branch keeps what the change keeps (its effective
batch); an absolute value, a branch that is not an integer literal, or one the change does not
apply to exactly (an odd micro-batch) gives no edit. Editing only the branch the reader took would
leave the other branch with, say, the doubled accumulation and its old micro-batch.

A Python fix is written by the libcst codemods of `rules/codemods` (imported only when a fix is
written: libcst's import alone takes longer than a whole lint). A lint that shows no fix still
needs to know which fixes exist and what they give (LLM003-005 are reported only with a fix that
helps; LLM001 says what would fit), and there, inside `preview_python_edits()`, the text writer
of this module (`ast` plus comment-aware text edits) writes them instead.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan
from llmmem.rules.finding import TextEdit
from llmmem.rules.python_nodes import (
    ARGUMENT_CLASSES,
    QLORA_IMPORTS,
    assigned_name,
    branch_writes,
    call_at,
    callee_name,
    conditional_around,
    node_at,
    node_range,
    plain_value,
    python_literal,
    python_tree,
    reads_of,
    yaml_literal,
)
from llmmem.rules.text_edits import (
    line_starts,
    node_span,
    offset,
    point_range,
    position,
    range_of_span,
)

# canonical plan field -> the key each framework's YAML spells it with
YAML_KEYS: dict[str, dict[str, str]] = {
    "per_device_train_batch_size": {"axolotl": "micro_batch_size", "torchtune": "batch_size"},
    "gradient_checkpointing": {"torchtune": "enable_activation_checkpointing"},
    "optim": {"axolotl": "optimizer"},
}


_PREVIEW = contextvars.ContextVar("llmmem_preview_python_edits", default=False)


@contextlib.contextmanager
def preview_python_edits() -> Iterator[None]:
    """Inside it, Python fixes are written by this module's text writer instead of the libcst
    codemods, for a lint whose report shows no fix (libcst is then never imported)."""
    token = _PREVIEW.set(True)
    try:
        yield
    finally:
        _PREVIEW.reset(token)


# libcst reads a file into a tree with every node's position before a codemod can run: about
# 0.8 s of CPU for 3,000 lines, paid again for each text re-analysed. A Python text longer than
# this is edited by the text writer instead (same findings and titles; tested on every fixture)
LARGEST_CODEMOD_TEXT = 32_000


def _codemods(text: str) -> Any:
    """`rules.codemods` (imported here, on the first fix written), or None in a preview and
    for a text too long to parse on every fix."""
    if _PREVIEW.get() or len(text) > LARGEST_CODEMOD_TEXT:
        return None
    from llmmem.rules import codemods

    return codemods


def replace_value(
    sourced: Sourced[Any], new_text: str, notebook: str | None = None
) -> TextEdit | None:
    """The edit replacing a value where it is written: in this file, or in a cell of
    `notebook` (the edit's range then names the cell, as the plan's ranges do)."""
    where = sourced.range
    if where is None:
        return None
    if where.path is not None and not (notebook and where.path.startswith(f"{notebook}#cell=")):
        return None  # another file (a referenced config): not edited from here
    return TextEdit(range=where, new_text=new_text)


def insert_keyword(
    text: str, call: SourceRange, keyword: str, value: Any, *, code: str | None = None
) -> TextEdit | None:
    """`keyword=value` (or `keyword=<code>`, written as given) added as the last argument of
    the call spanning `call`; None where the call already has that keyword or a `**mapping`
    that may hold it, or where the text around its last argument has an unexpected shape. A
    comment after the last argument stays where it is, after that argument's line."""
    tree = python_tree(text)
    node = call_at(tree, text, call) if tree is not None else None
    if node is None or any(kw.arg in (keyword, None) for kw in node.keywords):
        return None
    argument = f"{keyword}={code if code is not None else python_literal(value)}"
    starts = line_starts(text)
    close = node_span(text, node, starts)[1] - 1  # the closing parenthesis
    arguments: list[ast.expr | ast.keyword] = [*node.args, *node.keywords]
    if not arguments:
        return _point_edit(text, close, argument, starts)
    last = max(node_span(text, a, starts)[1] for a in arguments)
    tail = _call_tail(text, last, close)
    if tail is None:
        return None
    after, comma = tail
    between = text[after:close]
    if "\n" not in between:  # the closing parenthesis on the last argument's line
        if "#" in between:
            return None
        if comma is None:
            return _point_edit(text, after, f", {argument}", starts)
        return _point_edit(text, comma + 1, f" {argument}", starts)
    close_line = text.rfind("\n", 0, close) + 1
    indent = _argument_indent(text, arguments, starts)
    if text[close_line:close].strip():  # `value)` closing on the last argument's own line
        if "#" in between:
            return None
        return _point_edit(
            text,
            comma + 1 if comma is not None else after,
            f"{'' if comma is not None else ','}\n{indent}{argument}",
            starts,
        )
    line = f"{indent}{argument},\n"
    if comma is not None and "#" not in between:
        return _point_edit(text, comma + 1, f"\n{indent}{argument},", starts)
    if comma is not None:  # a comment after the comma: the new line goes after it
        return _point_edit(text, close_line, line, starts)
    # no comma after the last argument: one goes right after it, before any comment
    start_line, start_col = position(text, after, starts)
    end_line, end_col = position(text, close_line, starts)
    return TextEdit(
        range=SourceRange(
            start_line=start_line, start_col=start_col, end_line=end_line, end_col=end_col
        ),
        new_text="," + text[after:close_line] + line,
    )


def _point_edit(text: str, at: int, new_text: str, starts: list[int]) -> TextEdit:
    line, col = position(text, at, starts)
    return TextEdit(range=point_range(line, col), new_text=new_text)


def _call_tail(text: str, last: int, close: int) -> tuple[int, int | None] | None:
    """Between a call's last argument (ending at `last`) and its closing parenthesis: where
    the argument really ends (after parentheses around it) and where its comma is, if any.
    None for anything but parentheses, one comma, comments and blank space."""
    after, comma, index = last, None, last
    while index < close:
        char = text[index]
        if char == "#":
            newline = text.find("\n", index, close)
            index = close if newline < 0 else newline
            continue
        if char == ")" and comma is None:
            after = index + 1
        elif char == "," and comma is None:
            comma = index
        elif char == "\\" and text[index + 1 : index + 2] == "\n":
            index += 1
        elif not char.isspace():
            return None
        index += 1
    return after, comma


def _argument_indent(text: str, arguments: Sequence[ast.AST], starts: list[int]) -> str:
    """The indent of the call's last argument written first on its own line, else 4 spaces
    more than the line the call starts on."""
    for argument in reversed(arguments):
        begin = node_span(text, argument, starts)[0]
        line_start = text.rfind("\n", 0, begin) + 1
        if not text[line_start:begin].strip():
            return text[line_start:begin]
    first = node_span(text, arguments[0], starts)[0]
    line_start = text.rfind("\n", 0, first) + 1
    line = text[line_start:first]
    return line[: len(line) - len(line.lstrip())] + "    "


# -- Python structure (ast): which call, which keyword, which variable -----------------------


def _replace_node(text: str, node: ast.AST, new_text: str) -> TextEdit:
    starts = line_starts(text)
    return TextEdit(
        range=range_of_span(text, *node_span(text, node, starts), starts), new_text=new_text
    )


def _python_value_edit(
    plan: TrainingPlan, text: str, field: str, where: SourceRange, value: Any
) -> list[TextEdit] | None:
    """The edits writing `value` for a setting read from `where` in a Python file:
    - a value chosen by a conditional expression: every branch (`branch_writes`), or none;
    - a flag's `add_argument(...)` call: its `default=` is set there;
    - a variable's literal (`bs = 8`): edited there only when nothing else reads the variable,
      else the trainer call's `field=bs` gets the literal instead;
    - any other value: replaced where it stands."""
    tree = python_tree(text)
    if tree is None:
        return None
    node = node_at(tree, text, where)
    if node is None:
        return None
    whole = conditional_around(tree, text, where, plan.trainer_range, field)
    if whole is not None:
        writes = branch_writes(tree, whole, node, value)
        if writes is None:
            return None
        return [_replace_node(text, branch, python_literal(new)) for branch, new in writes]
    value = plain_value(value)
    literal = python_literal(value)
    if isinstance(node, ast.Call):
        if callee_name(node) != "add_argument":
            return None
        default = next((kw for kw in node.keywords if kw.arg == "default"), None)
        if default is not None:
            return [_replace_node(text, default.value, literal)]
        edit = insert_keyword(text, where, "default", value)
        return [edit] if edit is not None else None
    variable = assigned_name(tree, node)
    if variable is None or reads_of(tree, variable) <= 1:
        return [TextEdit(range=where, new_text=literal)]
    call = call_at(tree, text, plan.trainer_range) if plan.trainer_range else None
    if call is None:
        return None
    for kw in call.keywords:
        if kw.arg == field and isinstance(kw.value, ast.Name) and kw.value.id == variable:
            return [_replace_node(text, kw.value, literal)]
    return None


def _insert_python_setting(
    plan: TrainingPlan, text: str, field: str, value: Any
) -> TextEdit | None:
    """A setting that came from a default, written where the trainer's settings are made:
    a keyword of the TrainingArguments/SFTConfig call, or, for `HfArgumentParser((...))`, a
    field of the parser's TrainingArguments dataclass (the parser takes no such keyword)."""
    if plan.trainer_range is None:
        return None
    tree = python_tree(text)
    if tree is None:
        return None
    call = call_at(tree, text, plan.trainer_range)
    if call is None:
        return None
    if callee_name(call) == "HfArgumentParser":
        return _insert_dataclass_field(tree, text, call, field, value)
    if not callee_name(call).endswith(ARGUMENT_CLASSES):
        return None  # not a call known to take the setting as a keyword
    return insert_keyword(text, plan.trainer_range, field, value)


def _insert_dataclass_field(
    tree: ast.Module, text: str, parser: ast.Call, field: str, value: Any
) -> TextEdit | None:
    listed = parser.args[0] if parser.args else None
    names = [
        n.id
        for n in (listed.elts if isinstance(listed, (ast.Tuple, ast.List)) else [listed])
        if isinstance(n, ast.Name)
    ]
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name in names):
            continue
        bases = [
            b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases
        ]
        if not any(base.endswith(ARGUMENT_CLASSES) for base in bases):
            continue
        if any(
            isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == field
            for s in node.body
        ):
            return None
        starts = line_starts(text)
        first = node_span(text, node.body[0], starts)[0]
        indent = text[text.rfind("\n", 0, first) + 1 : first]
        if indent.strip():
            return None  # a one-line class body
        line = node.end_lineno or node.lineno  # the line after the class
        kind = type(value).__name__
        return TextEdit(
            range=point_range(line, 0),
            new_text=f"{indent}{field}: {kind} = {python_literal(value)}\n",
        )
    return None


def keyword_at(text: str, value_range: SourceRange) -> str | None:
    """The keyword (`name=`) or YAML key (`name:`) a value range is written after."""
    start = offset(text, value_range.start_line, value_range.start_col)
    before = text[max(0, start - 200) : start].rstrip()
    if not before or before[-1] not in "=:":
        return None
    head = before[:-1].rstrip()
    name = ""
    for char in reversed(head):
        if not (char.isalnum() or char == "_"):
            break
        name = char + name
    return name or None


def _sourced_for(plan: TrainingPlan, text: str, field: str) -> Sourced[Any] | None:
    """The plan value that `field` is written as: the field itself, or the precision flag
    (`bf16=`, `fp16=`) the plan's precision was read from."""
    sourced = getattr(plan, field, None)
    if isinstance(sourced, Sourced):
        return sourced
    precision = plan.precision
    if precision.range is not None and precision.range.path is None:
        if keyword_at(text, precision.range) == field:
            return precision
    return None


def set_setting(plan: TrainingPlan, text: str, field: str, value: Any) -> list[TextEdit] | None:
    """Edits that make the file say `field = value`, or None where no safe edit exists.
    `value` may be `Rescaled` (see the module's doc)."""
    sourced = _sourced_for(plan, text, field)
    where = _written_at(sourced)
    if plan.kind in ("yaml", "json"):
        from llmmem.rules.config_edits import set_config_value

        if where is not None and where.path is not None:
            return None  # another file (a referenced config): not edited from here
        key = YAML_KEYS.get(field, {}).get(plan.framework, field)
        edit = set_config_value(text, key, plain_value(value), where, json_file=plan.kind == "json")
    elif plan.kind == "python" and (codemods := _codemods(text)) is not None:
        if where is not None and where.path is not None:
            return None  # another file: not edited from here
        return codemods.setting_edits(plan, text, [(field, value, where)])  # type: ignore[no-any-return]
    elif where is not None and plan.kind == "python":
        return _python_value_edit(plan, text, field, where, value)
    elif where is not None and sourced is not None and plan.kind == "notebook":
        return _cell_value_edits(plan, text, field, sourced, value)
    elif where is not None and sourced is not None:
        edit = replace_value(sourced, yaml_literal(plain_value(value)))
    elif plan.kind == "python":
        edit = _insert_python_setting(plan, text, field, plain_value(value))
    elif plan.kind == "notebook" and plan.trainer_range is not None:
        return _insert_in_cell(plan, text, field, plain_value(value))
    else:
        return None
    return [edit] if edit else None


def set_settings(plan: TrainingPlan, text: str, settings: dict[str, Any]) -> list[TextEdit] | None:
    """Edits that make the file say every `field = value` of `settings`, or None unless each
    can be written; in a Python file one codemod writes them all (two keywords added to one
    call are laid out together, not as two edits at one place)."""
    codemods = _codemods(text) if plan.kind == "python" else None
    if codemods is not None:
        writes = []
        for field, value in settings.items():
            where = _written_at(_sourced_for(plan, text, field))
            if where is not None and where.path is not None:
                return None  # another file: not edited from here
            writes.append((field, value, where))
        return codemods.setting_edits(plan, text, writes)  # type: ignore[no-any-return]
    edits: list[TextEdit] = []
    for field, value in settings.items():
        found = set_setting(plan, text, field, value)
        if found is None:
            return None
        edits += found
    return edits


def _written_at(sourced: Sourced[Any] | None) -> SourceRange | None:
    """Where the value is written, if an edit there can change it."""
    if sourced is None or sourced.source not in (
        Provenance.EXPLICIT,
        Provenance.CLI_DEFAULT,
        Provenance.CONFIG,
    ):
        return None
    return sourced.range


def _cell_value_edits(
    plan: TrainingPlan, notebook_text: str, field: str, sourced: Sourced[Any], value: Any
) -> list[TextEdit] | None:
    """`value` written where a notebook cell says the setting: replaced where it stands, or,
    for a value a conditional expression chooses, in every branch (`branch_writes`) or none."""
    from llmmem.extract.notebook import cell_index, code_cell_text, python_lines_of_cell

    where = sourced.range
    index = cell_index(where, plan.path)
    cell_text = code_cell_text(notebook_text, index) if index is not None else None
    lines = python_lines_of_cell(cell_text.split("\n")) if cell_text is not None else None
    tree = python_tree("\n".join(lines)) if lines is not None else None
    if where is not None and lines is not None and tree is not None:
        python_text = "\n".join(lines)  # IPython lines stand in as Python, line for line
        local = replace(where, path=None)
        trainer = plan.trainer_range
        if trainer is not None and cell_index(trainer, plan.path) == index:
            trainer = replace(trainer, path=None)
        else:
            trainer = None
        whole = conditional_around(tree, python_text, local, trainer, field)
        if whole is not None:
            writes = branch_writes(tree, whole, node_at(tree, python_text, local), value)
            if writes is None:
                return None
            return [
                TextEdit(
                    range=replace(node_range(python_text, branch), path=where.path),
                    new_text=python_literal(new),
                )
                for branch, new in writes
            ]
    edit = replace_value(sourced, python_literal(plain_value(value)), plan.path)
    return [edit] if edit else None


def _insert_in_cell(
    plan: TrainingPlan, notebook_text: str, field: str, value: Any
) -> list[TextEdit] | None:
    """`field=value` added to the trainer call in its notebook cell."""
    from llmmem.extract.notebook import cell_index, code_cell_text

    call = plan.trainer_range
    index = cell_index(call, plan.path)
    if call is None or index is None:
        return None
    cell_text = code_cell_text(notebook_text, index)
    if cell_text is None:
        return None
    local = SourceRange(
        start_line=call.start_line,
        start_col=call.start_col,
        end_line=call.end_line,
        end_col=call.end_col,
    )
    # IPython lines (`%pip ...`, `!nvidia-smi`) read as comments of the same length, so the
    # cell parses as Python and every offset stays where it was
    python_text = re.sub(r"(?m)^(\s*)[%!]", r"\1#", cell_text)
    codemods = _codemods(python_text)
    if codemods is not None:
        edits = codemods.keyword_edits(python_text, local, field, value)
    else:
        edit = insert_keyword(python_text, local, field, value)
        edits = [edit] if edit is not None else None
    if not edits:
        return None
    return [
        TextEdit(
            range=SourceRange(
                path=call.path,
                start_line=edit.range.start_line,
                start_col=edit.range.start_col,
                end_line=edit.range.end_line,
                end_col=edit.range.end_col,
            ),
            new_text=edit.new_text,
        )
        for edit in edits
    ]


# -- statements and imports (Python) ----------------------------------------------------------

_ASSIGNED = re.compile(r"^(\s*)([A-Za-z_]\w*)\s*(?::[^=]*)?=[^=]")


def statement_after(text: str, call: SourceRange) -> tuple[str, str, int] | None:
    """For a call written as `name = <call>` (the call ending its statement): the indent, the
    assigned name, and the line just after the statement; None for any other shape."""
    lines = text.splitlines()
    if call.start_line >= len(lines) or call.end_line >= len(lines):
        return None
    match = _ASSIGNED.match(lines[call.start_line])
    if match is None or match.end(2) > call.start_col:
        return None
    rest = lines[call.end_line][call.end_col :].split("#", 1)[0].strip()
    if rest:
        return None
    return match.group(1), match.group(2), call.end_line + 1


def insert_line_after(
    text: str, call: SourceRange, make_line: Callable[[str], str]
) -> TextEdit | None:
    """`make_line(name)` inserted after the statement `name = <call>`, at its indent."""
    found = statement_after(text, call)
    if found is None:
        return None
    indent, name, line = found
    return TextEdit(range=point_range(line, 0), new_text=f"{indent}{make_line(name)}\n")


def statement_after_load(
    text: str, call: SourceRange, make_line: Callable[[str], str]
) -> list[TextEdit] | None:
    """`make_line(name)` as a statement after `name = <call>`."""
    codemods = _codemods(text)
    if codemods is not None:
        return codemods.statement_after_edits(text, call, make_line)  # type: ignore[no-any-return]
    edit = insert_line_after(text, call, make_line)
    return [edit] if edit is not None else None


def qlora_edits(text: str, model: SourceRange, config_code: str) -> list[TextEdit] | None:
    """`quantization_config=<config_code>` on the model's `from_pretrained`,
    `model = prepare_model_for_kbit_training(model)` after it and the imports they need; None
    unless every part can be written."""
    codemods = _codemods(text)
    if codemods is not None:
        return codemods.qlora_edits(text, model, config_code)  # type: ignore[no-any-return]
    keyword = insert_keyword(text, model, "quantization_config", None, code=config_code)
    prepare = insert_line_after(
        text, model, lambda name: f"{name} = prepare_model_for_kbit_training({name})"
    )
    if keyword is None or prepare is None:
        return None
    imports = [ensure_import(text, module, name) for module, name in QLORA_IMPORTS]
    return [edit for edit in imports if edit is not None] + [keyword, prepare]


def ensure_import(text: str, module: str, name: str | None = None) -> TextEdit | None:
    """An edit adding `from module import name` (or `import module`) unless the file has it;
    placed before the first top-level import (after `from __future__` lines)."""
    wanted = f"from {module} import " if name else f"import {module}"
    lines = text.splitlines()
    for line in lines:
        if name and line.startswith(wanted) and re.search(rf"\b{re.escape(name)}\b", line):
            return None
        if not name and re.match(rf"import {re.escape(module)}\b(?!\.)", line):
            return None
    statement = f"{wanted}{name}" if name else wanted
    first = None
    for number, line in enumerate(lines):
        if line.startswith("from __future__"):
            first = number + 1
            continue
        if line.startswith(("import ", "from ")):
            first = number if first is None else first
            break
    return TextEdit(range=point_range(first or 0, 0), new_text=statement + "\n")


def suppression_edit(text: str, line: int, code: str, kind: str) -> TextEdit | None:
    """The edit that silences `code` on `line`: `# llmmem: ignore[CODE]` at the line's end, or
    the code added to an ignore list already there. None for JSON (it has no comments)."""
    if kind not in ("python", "yaml", "shell", "notebook"):
        return None
    lines = text.splitlines()
    if line >= len(lines):
        return None
    current = lines[line]
    existing = re.search(r"llmmem:\s*ignore\[([^\]]*)\]", current)
    if existing is not None:
        codes = [c.strip() for c in existing.group(1).split(",") if c.strip()]
        if code in codes:
            return None
        at = existing.end(1)
        return TextEdit(range=point_range(line, at), new_text=(", " if codes else "") + code)
    if re.search(r"llmmem:\s*ignore(?!\[)", current):
        return None  # a bare ignore already silences everything on the line
    return TextEdit(range=point_range(line, len(current)), new_text=f"  # llmmem: ignore[{code}]")


def keyword_span(
    text: str, value_range: SourceRange, starts: list[int] | None = None
) -> SourceRange:
    """The range of `name=value` / `name: value` around a value's range (the value's own range
    when no keyword is written right before it), so a hover on the keyword finds the value.
    `starts` is `line_starts(text)`, computed once by a caller that asks about many ranges of
    one text: with it, this reads only the text just before the value."""
    starts = starts if starts is not None else line_starts(text)
    if not 0 <= value_range.start_line < len(starts):
        return value_range
    line_start = starts[value_range.start_line]
    at = min(line_start + value_range.start_col, len(text))
    before = text[max(0, at - 200) : at]
    here = SourceRange(start_line=0, start_col=len(before), end_line=0, end_col=len(before))
    name = keyword_at(before, here)  # the 200 characters before are all it reads
    if name is None:
        return value_range
    start = text.rfind(name, line_start, at)
    if start < 0:
        return value_range
    return SourceRange(
        path=value_range.path,
        start_line=value_range.start_line,
        start_col=start - line_start,
        end_line=value_range.end_line,
        end_col=value_range.end_col,
    )

"""Text edits that change one setting of a plan in the file it came from.

A setting written explicitly is edited where it stands (its value's range); one that came from a
default is added: as a keyword of the TrainingArguments/SFTConfig call in Python, as a new
top-level key in YAML. Values read through a variable are edited at the variable's literal.
Where no safe place exists (no trainer call, a shell launcher without the flag) there is no edit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan
from llmmem.rules.finding import TextEdit

# canonical plan field -> the key each framework's YAML spells it with
YAML_KEYS: dict[str, dict[str, str]] = {
    "per_device_train_batch_size": {"axolotl": "micro_batch_size", "torchtune": "batch_size"},
    "gradient_checkpointing": {"torchtune": "enable_activation_checkpointing"},
    "optim": {"axolotl": "optimizer"},
}


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


def line_starts(text: str) -> list[int]:
    starts = [0]
    for index, char in enumerate(text):
        if char == "\n":
            starts.append(index + 1)
    return starts


def offset(text: str, line: int, col: int, starts: list[int] | None = None) -> int:
    starts = starts or line_starts(text)
    if line >= len(starts):
        return len(text)
    return min(starts[line] + col, len(text))


def position(text: str, index: int, starts: list[int] | None = None) -> tuple[int, int]:
    starts = starts or line_starts(text)
    line = max(i for i, start in enumerate(starts) if start <= index)
    return line, index - starts[line]


def _point(line: int, col: int) -> SourceRange:
    return SourceRange(start_line=line, start_col=col, end_line=line, end_col=col)


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
    the call spanning `call`."""
    starts = line_starts(text)
    begin = offset(text, call.start_line, call.start_col, starts)
    close = text.rfind(")", 0, offset(text, call.end_line, call.end_col, starts))
    if close < begin:
        return None
    inside = text[begin:close]
    stripped = inside.rstrip()
    last = begin + len(stripped)  # just after the last argument (or its comma)
    argument = f"{keyword}={code if code is not None else python_literal(value)}"
    if stripped.endswith("("):
        new_text, at = argument, close
    elif "\n" in inside[len(stripped) :]:
        # one argument per line, the closing paren on a line of its own
        comma = "" if stripped.endswith(",") else ","
        new_text, at = f"{comma}\n{_argument_indent(inside)}{argument},", last
    else:
        new_text, at = (" " if stripped.endswith(",") else ", ") + argument, last
    line, col = position(text, at, starts)
    return TextEdit(range=_point(line, col), new_text=new_text)


def _argument_indent(call_text: str) -> str:
    for line in call_text.splitlines()[1:]:
        if line.strip():
            return line[: len(line) - len(line.lstrip())]
    return "    "


def append_yaml_key(text: str, key: str, value: Any) -> TextEdit:
    lines = text.splitlines()
    line = len(lines)
    prefix = "" if not text or text.endswith("\n") else "\n"
    if text.endswith("\n"):
        return TextEdit(range=_point(line, 0), new_text=f"{key}: {yaml_literal(value)}\n")
    return TextEdit(
        range=_point(max(line - 1, 0), len(lines[-1]) if lines else 0),
        new_text=f"{prefix}{key}: {yaml_literal(value)}\n",
    )


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
    """Edits that make the file say `field = value`, or None where no safe edit exists."""
    sourced = _sourced_for(plan, text, field)
    literal = python_literal(value) if plan.kind in ("python", "notebook") else yaml_literal(value)
    if (
        isinstance(sourced, Sourced)
        and sourced.source in (Provenance.EXPLICIT, Provenance.CLI_DEFAULT, Provenance.CONFIG)
        and sourced.range is not None
    ):
        notebook = plan.path if plan.kind == "notebook" else None
        edit = replace_value(sourced, literal, notebook)
        return [edit] if edit else None
    if plan.kind == "python" and plan.trainer_range is not None:
        edit = insert_keyword(text, plan.trainer_range, field, value)
        return [edit] if edit else None
    if plan.kind == "notebook" and plan.trainer_range is not None:
        return _insert_in_cell(plan, text, field, value)
    if plan.kind == "yaml":
        key = YAML_KEYS.get(field, {}).get(plan.framework, field)
        return [append_yaml_key(text, key, value)]
    return None


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
    edit = insert_keyword(cell_text, local, field, value)
    if edit is None:
        return None
    placed = SourceRange(
        path=call.path,
        start_line=edit.range.start_line,
        start_col=edit.range.start_col,
        end_line=edit.range.end_line,
        end_col=edit.range.end_col,
    )
    return [TextEdit(range=placed, new_text=edit.new_text)]


def apply_edits(text: str, edits: list[TextEdit]) -> str:
    """The text with the edits applied (edits must not overlap). Edits of a notebook's cells
    (a range with a path) are for an editor holding the cells, not for the file's text."""
    if any(edit.range.path is not None for edit in edits):
        raise ValueError("edits of notebook cells apply to the cells, not to the file's text")
    starts = line_starts(text)
    spans = sorted(
        (
            (
                offset(text, e.range.start_line, e.range.start_col, starts),
                offset(text, e.range.end_line, e.range.end_col, starts),
                e.new_text,
            )
            for e in edits
        ),
        reverse=True,
    )
    for start, end, new_text in spans:
        text = text[:start] + new_text + text[end:]
    return text


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
    return TextEdit(range=_point(line, 0), new_text=f"{indent}{make_line(name)}\n")


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
    return TextEdit(range=_point(first or 0, 0), new_text=statement + "\n")


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
        return TextEdit(range=_point(line, at), new_text=(", " if codes else "") + code)
    if re.search(r"llmmem:\s*ignore(?!\[)", current):
        return None  # a bare ignore already silences everything on the line
    return TextEdit(range=_point(line, len(current)), new_text=f"  # llmmem: ignore[{code}]")


def keyword_span(text: str, value_range: SourceRange) -> SourceRange:
    """The range of `name=value` / `name: value` around a value's range (the value's own range
    when no keyword is written right before it), so a hover on the keyword finds the value."""
    name = keyword_at(text, value_range)
    if name is None or value_range.start_line >= len(lines := text.splitlines()):
        return value_range
    line = lines[value_range.start_line][: value_range.start_col]
    start = line.rfind(name)
    if start < 0:
        return value_range
    return SourceRange(
        path=value_range.path,
        start_line=value_range.start_line,
        start_col=start,
        end_line=value_range.end_line,
        end_col=value_range.end_col,
    )

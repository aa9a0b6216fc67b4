"""Text edits that change one setting of a plan in the file it came from.

A setting written explicitly is edited where it stands (its value's range); one that came from a
default is added: as a keyword of the TrainingArguments/SFTConfig call in Python, as a new
top-level key in YAML. Values read through a variable are edited at the variable's literal.
Where no safe place exists (no trainer call, a shell launcher without the flag) there is no edit.
"""

from __future__ import annotations

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


def replace_value(sourced: Sourced[Any], new_text: str) -> TextEdit | None:
    if sourced.range is None or sourced.range.path is not None:
        return None  # another file (a referenced config): not edited from here
    return TextEdit(range=sourced.range, new_text=new_text)


def insert_keyword(text: str, call: SourceRange, keyword: str, value: Any) -> TextEdit | None:
    """`keyword=value` added as the last argument of the call spanning `call`."""
    starts = line_starts(text)
    begin = offset(text, call.start_line, call.start_col, starts)
    close = text.rfind(")", 0, offset(text, call.end_line, call.end_col, starts))
    if close < begin:
        return None
    inside = text[begin:close]
    stripped = inside.rstrip()
    last = begin + len(stripped)  # just after the last argument (or its comma)
    argument = f"{keyword}={python_literal(value)}"
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
        edit = replace_value(sourced, literal)
        return [edit] if edit else None
    if plan.kind == "python" and plan.trainer_range is not None:
        edit = insert_keyword(text, plan.trainer_range, field, value)
        return [edit] if edit else None
    if plan.kind == "yaml":
        key = YAML_KEYS.get(field, {}).get(plan.framework, field)
        return [append_yaml_key(text, key, value)]
    return None


def apply_edits(text: str, edits: list[TextEdit]) -> str:
    """The text with the edits applied (edits must not overlap)."""
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

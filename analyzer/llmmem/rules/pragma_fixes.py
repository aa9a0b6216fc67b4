"""A `# llmmem:` pragma offered as a quick fix: one comment line written above the line a
finding points at, where the value it asks for would be read from.

The pragma's value is a placeholder the user fills in (`model=org/name`), so the fix is never
applied by `llmmem-lint --fix`: it is a code action. Python, YAML and shell files take a `#`
comment on any line; a notebook takes it in the cell the finding points at; JSON has no
comments, and a range in another file (a module the script imports) is not edited from here.
"""

from __future__ import annotations

from llmmem.plan import SourceRange, TrainingPlan
from llmmem.rules.finding import Fix, TextEdit

COMMENTED_KINDS = frozenset({"python", "yaml", "shell", "notebook"})


def pragma_fix(plan: TrainingPlan, text: str, where: SourceRange | None, pragma: str) -> Fix | None:
    """`# llmmem: {pragma}` on its own line above `where` (the top of the file when None)."""
    if plan.kind not in COMMENTED_KINDS:
        return None
    edit = _insertion(plan, text, where, f"# llmmem: {pragma}")
    if edit is None:
        return None
    return Fix(title=f"Add `# llmmem: {pragma}` here (fill in the value)", edits=[edit], safe=False)


def _insertion(
    plan: TrainingPlan, text: str, where: SourceRange | None, comment: str
) -> TextEdit | None:
    if where is None:
        if plan.kind == "notebook":
            return None  # which cell is not known
        line = _first_line(text, plan.kind)
        return TextEdit(range=_point(None, line), new_text=comment + "\n")
    if where.path is None:
        if plan.kind == "notebook":
            return None
        lines = text.splitlines()
        current = lines[where.start_line] if where.start_line < len(lines) else ""
        indent = current[: len(current) - len(current.lstrip())] if plan.kind == "python" else ""
        return TextEdit(range=_point(None, where.start_line), new_text=f"{indent}{comment}\n")
    if plan.kind == "notebook" and where.path.startswith(f"{plan.path}#cell="):
        return TextEdit(range=_point(where.path, where.start_line), new_text=comment + "\n")
    return None


def _first_line(text: str, kind: str) -> int:
    """Below a `#!` line, and below a Python coding line."""
    lines = text.splitlines()
    line = 0
    if lines and lines[0].startswith("#!"):
        line = 1
    if kind == "python" and line < len(lines) and "coding" in lines[line][:40]:
        line += 1
    return line


def _point(path: str | None, line: int) -> SourceRange:
    return SourceRange(path=path, start_line=line, start_col=0, end_line=line, end_col=0)

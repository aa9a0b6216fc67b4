"""Where a diagnostic points on the text.

A finding about the whole step is anchored by the rules on the whole trainer call, which can
span a dozen lines, or in a config on the model's value; in an editor that underlines everything,
stacks several squiggles on one value and buries the hover. Here such a finding is narrowed to
the setting that drives it (`max_length=` for the logits, `optim=` for the optimizer states,
...) when the file writes it, else to the call's name on its first line; a finding on a pragma
comment to the value it is about (`gpu=RTX-9999`: `RTX-9999`). The related information a hover
lists under the message is cut to the two values a person changes first (the micro-batch and
the sequence length before the others).

What the analysis could not use (an unknown GPU, a file read only up to a bad line, a model
sized from its name) is reported by the analyzer as a line of text; here each becomes a
diagnostic on the line it is about, or at the top of the file where it names no line.
"""

from __future__ import annotations

import re
from dataclasses import replace

from lsprotocol import types

from llmmem.check import Checked
from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan
from llmmem.rules.finding import Finding
from llmmem_lsp.convert import Lines

# the plan settings a finding is about, most telling first
DRIVING_SETTINGS: dict[str, tuple[str, ...]] = {
    "LLM003": ("max_seq_length", "per_device_train_batch_size"),
    "LLM004": ("gradient_checkpointing", "per_device_train_batch_size", "max_seq_length"),
    "LLM005": ("optim",),
}

_CALLEE = re.compile(r"[A-Za-z_][\w.]*(?=\s*\()")
_WHOLE_CALL = re.compile(r"[A-Za-z_][\w.]*\s*\(.*\)\s*$")
_PRAGMA = re.compile(r"#\s*llmmem\s*:")
_PRAGMA_VALUE = re.compile(r"\w+\s*=\s*([^\s,;]+)")
_QUOTED = re.compile(r"'([^'\n]+)'|`([^`\n]+)`")
# related information kept under a diagnostic's message, the values a person changes first
RELATED_KEPT = 2
RELATED_ORDER = (
    "per_device_train_batch_size",
    "max_seq_length",
    "gradient_checkpointing",
    "optim",
    "precision",
    "model_id",
)
_KEYWORD_BEFORE = re.compile(r"(?:--[\w.-]+[ =]\s*|[A-Za-z_][\w.]*\s*[=:]\s*)[\"']?$")
_LOCATED = re.compile(r"^(?:llmmem pragma \()?line (\d+)(?:, column \d+)?\)?:\s*")
_UNKNOWN_GPU = re.compile(r"^unknown GPU '([^']*)'")


def _setting_span(
    sourced: Sourced[object] | None, lines: Lines, path: str | None
) -> SourceRange | None:
    """`name=value` (or `name: value`, `--name value`) around a setting written in this file."""
    if sourced is None or sourced.source in (Provenance.DEFAULT, Provenance.ASSUMED):
        return None  # not written: a default's range is where it would be added
    where = sourced.range
    if where is None or where.path != path or where.start_line != where.end_line:
        return None
    if where.start_line >= len(lines.lines):
        return None
    before = lines.lines[where.start_line][: where.start_col]
    match = _KEYWORD_BEFORE.search(before)
    start_col = where.start_col
    if match is not None:
        start_col = match.start()
    return replace(where, start_col=start_col)


def _related_rank(message: str) -> int:
    name = message.split(" = ", 1)[0]
    return RELATED_ORDER.index(name) if name in RELATED_ORDER else len(RELATED_ORDER)


def trimmed_related(finding: Finding) -> Finding:
    """The finding with at most `RELATED_KEPT` related values (VS Code lists each under the
    message in the hover, a line each, above the breakdown)."""
    if len(finding.related) <= RELATED_KEPT:
        return finding
    kept = sorted(finding.related, key=lambda item: _related_rank(item.message))[:RELATED_KEPT]
    return replace(finding, related=kept)


def _in_range_text(where: SourceRange, lines: Lines) -> str | None:
    if where.start_line != where.end_line or not 0 <= where.start_line < len(lines.lines):
        return None
    return lines.lines[where.start_line][where.start_col : where.end_col]


def _pragma_value(finding: Finding, where: SourceRange, lines: Lines) -> SourceRange | None:
    """On a `# llmmem: key=value` comment: the value the message names (quoted in it), else
    the first value; None for a range that is no pragma."""
    written = _in_range_text(where, lines)
    if written is None or _PRAGMA.search(written) is None:
        return None
    named = [a or b for a, b in _QUOTED.findall(finding.message)]
    for match in _PRAGMA_VALUE.finditer(written):
        value = match.group(1).strip("'\"")
        if not named or value in named:
            start = where.start_col + match.start(1)
            return replace(where, start_col=start, end_col=start + len(match.group(1)))
    return None


def narrowed(finding: Finding, plan: TrainingPlan, lines: Lines) -> Finding:
    """The finding with the range a diagnostic shows: the setting that drives it where the
    file writes it; a pragma's value; over several lines or over a whole call on one, the
    callee's name (or the first line's text); with its related values trimmed."""
    finding = trimmed_related(finding)
    where = finding.range
    if where is None:
        return finding
    for name in DRIVING_SETTINGS.get(finding.code, ()):
        span = _setting_span(getattr(plan, name, None), lines, where.path)
        if span is not None:
            return replace(finding, range=span)
    value = _pragma_value(finding, where, lines)
    if value is not None:
        return replace(finding, range=value)
    if where.start_line == where.end_line:
        written = _in_range_text(where, lines)
        if written is None or _WHOLE_CALL.match(written) is None:
            return finding
    if where.start_line >= len(lines.lines):
        return finding
    first = lines.lines[where.start_line]
    callee = _CALLEE.match(first, where.start_col)
    end_col = callee.end() if callee is not None else len(first.rstrip())
    if end_col <= where.start_col:
        return finding
    return replace(
        finding,
        range=replace(where, end_line=where.start_line, end_col=end_col),
    )


def _line_range(lines: Lines, line: int) -> types.Range:
    """A line's text, without its indentation."""
    text = lines.lines[line] if 0 <= line < len(lines.lines) else ""
    start_col = len(text) - len(text.lstrip())
    end_col = max(len(text.rstrip()), start_col)
    return types.Range(start=lines.position(line, start_col), end=lines.position(line, end_col))


def _problem_range(lines: Lines, line: int, message: str) -> types.Range:
    r"""Where a problem about line `line` is underlined: the expression its message quotes
    (`could not read \`model_args.dtype\``) or a file it names (`ds_zero3.json`), else the name
    it is about (`dtype: ...`), else the line's first name; never the whole statement."""
    text = lines.lines[line] if 0 <= line < len(lines.lines) else ""
    wanted = [a or b for a, b in _QUOTED.findall(message)]
    wanted += re.findall(r"[\w./-]+\.[A-Za-z]\w*", message)  # a file it names: its value
    head = re.match(r"\s*([A-Za-z_][\w.]*)\s*:", message)
    if head is not None:
        wanted.append(head.group(1))
    for word in wanted:
        at = _find_word(text, word)
        if at is not None:
            return types.Range(
                start=lines.position(line, at), end=lines.position(line, at + len(word))
            )
    first = re.search(r"[A-Za-z_][\w.]*", text)
    if first is None:
        return _line_range(lines, line)
    return types.Range(
        start=lines.position(line, first.start()), end=lines.position(line, first.end())
    )


def _find_word(text: str, word: str) -> int | None:
    """Where `word` stands on its own in `text` (not inside a longer name), or None."""
    for match in re.finditer(re.escape(word), text):
        before = text[match.start() - 1] if match.start() else " "
        after = text[match.end()] if match.end() < len(text) else " "
        if not (before.isalnum() or before in "_.") and not (after.isalnum() or after == "_"):
            return match.start()
    return None


def _top() -> types.Range:
    start = types.Position(line=0, character=0)
    return types.Range(start=start, end=start)


def _problem(where: types.Range, message: str, warning: bool = False) -> types.Diagnostic:
    return types.Diagnostic(
        range=where,
        severity=types.DiagnosticSeverity.Warning
        if warning
        else types.DiagnosticSeverity.Information,
        source="llmmem",
        message=message,
    )


def _gpu_problem(
    checked: Checked, lines: Lines, name: str, setting_gpu: str | None
) -> types.Diagnostic:
    from llmmem.gpus import UnknownGpuError, find_gpu

    try:
        find_gpu(name)
        suggestions: list[str] = []
    except UnknownGpuError as err:
        suggestions = err.suggestions
    matches = (
        f"did you mean {', '.join(suggestions)}?"
        if suggestions
        else "no close match in the catalog"
    )
    tail = (
        f"{matches} A capacity such as 24GiB or 80GB also works; until then there is no fit check"
    )
    plan = checked.analysis.plan
    pragma = plan.gpu
    if pragma is not None and str(pragma.value) == name:
        where = pragma.range
        if where is not None and where.path is None:
            written = _in_range_text(where, lines) or ""
            at = written.find(name)
            if _PRAGMA.search(written) is not None and at >= 0:  # the name, not the comment
                start = where.start_col + at
                where = replace(where, start_col=start, end_col=start + len(name))
            return _problem(
                lines.range(where), f"Unknown GPU '{name}' in the pragma: {tail}", warning=True
            )
        origin = checked.settings.path or "pyproject.toml"
        return _problem(_top(), f"Unknown GPU '{name}' in {origin} [tool.llmmem] gpu: {tail}", True)
    if setting_gpu is not None and setting_gpu == name:
        problem = _problem(_top(), f"Unknown GPU '{name}' in the llmmem.gpu setting: {tail}", True)
        # for an editor that offers the close matches as quick fixes writing its setting (the
        # server cannot write an editor's settings)
        problem.data = {"setting": "llmmem.gpu", "gpu": name, "suggestions": suggestions[:3]}
        return problem
    return _problem(_top(), f"Unknown GPU '{name}': {tail}", warning=True)


def problem_diagnostics(
    checked: Checked, lines: Lines, setting_gpu: str | None = None
) -> list[types.Diagnostic]:
    """The analysis problems as diagnostics on the lines they name (the top of the file for the
    rest), and a model sized by a guess from its name on the model id."""
    analysis = checked.analysis
    taken = {f.range.start_line for f in checked.findings if f.code == "LLM011" and f.range}
    gpu_finding = any(f.code == "LLM014" for f in checked.findings)
    out: list[types.Diagnostic] = []
    for problem in analysis.problems:
        unknown = _UNKNOWN_GPU.match(problem)
        if unknown is not None:
            if not gpu_finding:  # the file's own GPU is already a finding (LLM014)
                out.append(_gpu_problem(checked, lines, unknown.group(1), setting_gpu))
            continue
        located = _LOCATED.match(problem)
        if located is None:
            out.append(_problem(_top(), problem))
            continue
        line = int(located.group(1)) - 1
        if line in taken:
            continue  # already a finding (LLM011) on that line
        message = problem[located.end() :]
        out.append(_problem(_problem_range(lines, line, message), message))
    guess = guess_diagnostic(checked, lines)
    if guess is not None:
        out.append(guess)
    return out


def guess_diagnostic(checked: Checked, lines: Lines) -> types.Diagnostic | None:
    """A model sized by a guess from its name, said on the model id (the top of the file
    where the id is not in it); None for a model whose shapes were read."""
    message = guess_message(checked)
    if message is None:
        return None
    from llmmem.scenario import model_reference

    model = model_reference(checked.analysis.plan)
    where = model.range if model is not None else None
    place = lines.range(where) if where is not None and where.path is None else _top()
    return _problem(place, message)


def guess_message(checked: Checked) -> str | None:
    """What the diagnostic, Explain's problems and the status bar say of a model sized by a
    guess from its name; None for a model whose shapes were read."""
    spec = checked.analysis.spec
    if spec is None or not spec.is_guess:
        return None
    detail = f" ({spec.source_detail})" if spec.source_detail else ""
    return (
        f"The shapes of {spec.model_id} are a guess from its name{detail}: for exact "
        "numbers add `# llmmem: model_config=path/to/config.json` or use a local path"
    )

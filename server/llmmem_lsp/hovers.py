"""`textDocument/hover`: what the cursor is on, and the short Markdown for it.

Targets: the model id and its loading call, the training configuration's call (or a config's
keys), the trainer call's name (`SFTTrainer(`, `Trainer(`, `DPOTrainer(`: the line a reader looks
at first), a setting's `name=value`, the LoRA and quantization configs. The step's hover is the
short one of `llmmem.report.hover` (verdict, band, the three largest terms, the newest local
run, a link to the whole breakdown); a result older than the text is answered marked
(`freshness`), and only where the hovered line still reads as it did.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import TYPE_CHECKING
from urllib.parse import quote

from lsprotocol import types

from llmmem_lsp.convert import Lines
from llmmem_lsp.documents import DocumentState, Result
from llmmem_lsp.freshness import Freshness, freshness, same_line, wait_for

if TYPE_CHECKING:
    from llmmem.check import Checked
    from llmmem.plan import SourceRange
    from llmmem_lsp.language_server import LlmmemServer

# a call whose callee's last name ends in Trainer: `SFTTrainer(`, `trl.DPOTrainer(`, `Trainer (`
TRAINER_CALL = re.compile(r"(?<![\w.])(?:[A-Za-z_]\w*\.)*((?:[A-Za-z_]\w*)?Trainer)\s*\(")


def trainer_call_at(checked: Checked, text_line: str, line: int, col: int, in_path: str | None):
    """The range of a trainer call's name under the cursor on a Python line, else None."""
    from llmmem.plan import SourceRange

    if checked.analysis.plan.kind not in ("python", "notebook"):
        return None
    for match in TRAINER_CALL.finditer(text_line):
        if match.start() <= col < match.end(1):
            return SourceRange(
                path=in_path,
                start_line=line,
                start_col=match.start(),
                end_line=line,
                end_col=match.end(1),
            )
    return None


def hover_target(
    checked: Checked, lines: Lines, text: str, line: int, col: int, in_path: str | None = None
) -> tuple[str, SourceRange] | None:
    """What the cursor is on: ("model" | "budget" | "setting:NAME" | "lora" | "quant", the
    range), the smallest range that contains it winning; a setting's range covers its keyword
    too. Reads only the text around each setting (`lines` has the line starts), whatever the
    file's size."""
    from llmmem.rules.edits import keyword_span

    plan = checked.analysis.plan
    candidates: list[tuple[str, SourceRange | None]] = [
        ("model", plan.model_id.range if plan.model_id else None),
        ("model", plan.model_range),
        ("budget", plan.trainer_range),
        ("lora", plan.lora.range if plan.lora else None),
        ("quant", plan.quantization.range if plan.quantization else None),
    ]
    if 0 <= line < len(lines.lines):
        candidates.append(
            ("budget", trainer_call_at(checked, lines.lines[line], line, col, in_path))
        )
    for name, sourced in plan.sourced_fields().items():
        if name != "model_id" and sourced.range is not None and sourced.range.path == in_path:
            candidates.append((f"setting:{name}", keyword_span(text, sourced.range, lines.starts)))
    if plan.lora is not None:
        for sourced in (plan.lora.r, plan.lora.alpha, plan.lora.target_modules):
            if sourced.range is not None and sourced.range.path == in_path:
                candidates.append(("lora", keyword_span(text, sourced.range, lines.starts)))
    best: tuple[str, SourceRange] | None = None
    for kind, where in candidates:
        if where is None or where.path != in_path:
            continue
        inside = where.contains(line, col) or (
            # a YAML/JSON key and its value share a line: hovering the key counts
            plan.kind in ("yaml", "json", "shell") and where.start_line == line == where.end_line
        )
        if not inside:
            continue
        size = (where.end_line - where.start_line, where.end_col - where.start_col)
        if best is None or size < (
            best[1].end_line - best[1].start_line,
            best[1].end_col - best[1].start_col,
        ):
            best = (kind, where)
    return best


def measured_table(state: DocumentState, result: Result) -> str | None:
    """The verify table while the text is the one it measured; an edit since drops it."""
    if state.measured is None or state.measured_version != result.version:
        return None
    if state.version != result.version:
        return None
    return state.measured


def breakdown_link(command: str | None, uri: str) -> str | None:
    """A `command:` link that opens the whole breakdown of `uri`, where the editor named a
    command for it (VS Code's extension does); None elsewhere."""
    if not command:
        return None
    return f"command:{command}?{quote(json.dumps([uri]))}"


def render(
    result: Result,
    kind: str,
    in_path: str | None,
    measured: str | None,
    link: str | None,
    stale: str | None,
) -> str:
    """The Markdown of a hover on `kind` (as `hover_target` names it); runs off the loop."""
    from llmmem.report import markdown
    from llmmem.report.hover import step_hover
    from llmmem.report.local_runs import latest_run_line

    analysis = result.checked.analysis
    simple = {
        "model": markdown.model_hover,
        "lora": markdown.lora_hover,
        "quant": markdown.quantization_hover,
    }.get(kind)
    if simple is not None:
        shown = simple(analysis)
    elif kind.startswith("setting:"):
        field = kind.split(":", 1)[1]
        shown = markdown.setting_hover(
            analysis, field, in_path=in_path, measured=measured, breakdown_link=link
        )
    else:
        return step_hover(
            analysis,
            measured=measured,
            local_run=latest_run_line(analysis),
            breakdown_link=link,
            stale=stale,
        )
    if shown and stale:
        return f"{stale}\n\n{shown}"
    return shown


async def hover(ls: LlmmemServer, params: types.HoverParams) -> types.Hover | None:
    uri = params.text_document.uri
    cell = ls.cell_of(uri)
    if cell is not None:
        state, index, text = cell
        ls.analyzer.hurry(state)
        await ls.analyzer.wait_current(state, wait_for(state))
        if state.result is None:
            return None
        result = state.result
        from llmmem.extract.notebook import cell_path

        in_path: str | None = cell_path(result.checked.analysis.plan.path, index)
        fresh = freshness(state, result)
    else:
        opened = ls.analyzer.documents.get(uri)
        if opened is None:
            return None
        state = opened
        ls.analyzer.hurry(state)
        await ls.analyzer.wait_current(state, wait_for(state))
        if state.result is None:
            return None
        result = state.result
        text, in_path = result.text, None
        fresh = freshness(state, result)
        if fresh.stale:
            now = ls._text_of(uri)
            if not same_line(text, now[0] if now else None, params.position.line):
                return None  # the line changed: the old ranges say nothing about it
    lines = ls.lines(text)
    line, col = lines.server_position(params.position)
    target = hover_target(result.checked, lines, text, line, col, in_path)
    if target is None:
        return None
    kind, where = target
    shown = await _shown(ls, state, result, kind, in_path, fresh)
    if not shown:
        return None
    if not ls.hover_markdown:
        from llmmem.report import markdown

        return types.Hover(
            contents=types.MarkupContent(
                kind=types.MarkupKind.PlainText, value=markdown.plain_text(shown)
            ),
            range=lines.range(where),
        )
    return types.Hover(
        contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=shown),
        range=lines.range(where),
    )


async def _shown(
    ls: LlmmemServer,
    state: DocumentState,
    result: Result,
    kind: str,
    in_path: str | None,
    fresh: Freshness,
) -> str:
    """The hover's Markdown, rendered once per analysis, target and verify table."""
    measured = measured_table(state, result)
    stale = fresh.hover_line()
    key = (result.serial, kind, in_path, measured, stale)
    if state.hovers and next(iter(state.hovers))[0] != result.serial:
        state.hovers.clear()  # those of an older analysis
    shown = state.hovers.get(key)
    if shown is None:
        link = breakdown_link(ls.breakdown_command, state.uri)
        loop = asyncio.get_running_loop()
        shown = (
            await loop.run_in_executor(None, render, result, kind, in_path, measured, link, stale)
            or ""
        )
        state.hovers[key] = shown
    return shown

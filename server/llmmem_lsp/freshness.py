"""Fresh or marked: what a hover or a lens reads when the text has changed since its analysis.

An analysis runs off the request's path (a worker thread, after the debounce); a long file's
takes seconds (a 10,000-line script about 1.5 to 3 s). A request after an edit waits a short
while for the edited text's analysis (`FRESH_WAIT_S`; the debounce is cut short, the user has
stopped typing) and then answers from the last result it has, saying so: its numbers are of the
text before the edit. Only where the hovered line reads as it did then: another line's ranges
may have moved.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmem_lsp.documents import DocumentState, Result

FIRST_WAIT_S = 1.5  # a document that has no result yet: wait for its first
FRESH_WAIT_S = 0.4  # one that has: wait this long for the edited text's, then answer marked

PENDING_LINE = "_⟳ Estimate of the text before your last edit: the edited text is being analysed._"
UNREADABLE_LINE = (
    "_⟳ Estimate of the last version that parsed: the text does not parse now ({reason})._"
)
LENS_MARK = " · ⟳ before the last edit"


@dataclass(frozen=True)
class Freshness:
    """Whether a result is the analysis of the document's current text, and if not why."""

    stale: bool
    unreadable: str | None = None  # the current text's parse problem, where that is why

    def hover_line(self) -> str | None:
        if not self.stale:
            return None
        if self.unreadable:
            return UNREADABLE_LINE.format(reason=self.unreadable.rstrip("."))
        return PENDING_LINE

    def lens_mark(self) -> str:
        return LENS_MARK if self.stale else ""


def freshness(state: DocumentState, result: Result) -> Freshness:
    """Whether `result` is of the document's current text (a newer version pending, or one
    that does not parse, makes it stale; a re-analysis of the same text does not)."""
    if result.version == state.version:
        return Freshness(stale=False)
    latest = state.latest
    if latest is not None and latest.version == state.version and latest.unreadable:
        return Freshness(stale=True, unreadable=latest.unreadable)
    return Freshness(stale=True)


def wait_for(state: DocumentState) -> float:
    """How long a request waits for the current text's analysis."""
    return FIRST_WAIT_S if state.result is None else FRESH_WAIT_S


def same_line(old_text: str, new_text: str | None, line: int) -> bool:
    """Whether line `line` reads the same in both texts (the new one unknown: no)."""
    if new_text is None:
        return False
    old = _line(old_text, line)
    return old is not None and old == _line(new_text, line)


def _line(text: str, number: int) -> str | None:
    from llmmem_lsp.convert import Lines

    lines = Lines.of(text).lines
    return lines[number] if 0 <= number < len(lines) else None

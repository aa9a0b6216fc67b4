"""Token ids cut by hand: `input_ids = input_ids[:MAX_LENGTH]` in a tokenizing function is the
sequence length the model sees, as a tokenizer's `max_length` with truncation is."""

from __future__ import annotations

import ast
from dataclasses import replace
from typing import Protocol

from llmmem.extract.python.source import SourceMap
from llmmem.extract.python.values import Known, Scope, Value, _combine_notes, settle


class ScriptReader(Protocol):
    """What a token cut needs of the reader (`interpreter.ScriptReader`)."""

    source: SourceMap
    tokenizer_lengths: list[Known]

    def eval(self, node: ast.expr | None, scope: Scope) -> Value: ...


SHORTEST_CUT = 16  # fewer tokens are kept for a look at them, not to train on


def read_token_cut(reader: ScriptReader, node: ast.Subscript, scope: Scope) -> None:
    """Record `X[:N]` where X is named like the model's token ids and N is known."""
    cut = node.slice
    if not isinstance(cut, ast.Slice):
        return
    if cut.lower is not None or cut.step is not None or cut.upper is None:
        return
    if "input_ids" not in reader.source.text_of(node.value, 80):
        return
    known = settle(reader.eval(cut.upper, scope))
    if known is None or isinstance(known.value, bool) or not isinstance(known.value, int):
        return
    if known.value < SHORTEST_CUT:
        return
    note = _combine_notes(known.note, "token ids cut to this length")
    reader.tokenizer_lengths.append(replace(known, note=note))

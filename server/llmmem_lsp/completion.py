"""Completion: what llmmem knows the names of, offered where a name is written.

- after `gpu=` in a `# llmmem:` comment and after `gpu = "` in `[tool.llmmem]` of
  pyproject.toml: the GPU catalog (`llmmem.gpus`); that table's keys and `fail_on` levels, and
  rule codes and their levels in `[tool.llmmem.severity]`;
- in a `# llmmem:` comment: its keys, and rule codes inside `ignore[...]`;
- after `optim=` / `optim:` / `--optim` (and axolotl's `optimizer:`): the optimizer names
  llmmem sizes (`llmmem.budget.optimizers`), after `attn_implementation=`: the attention
  implementations; in a pragma, `optim=` and `precision=` too.

Only the line up to the cursor is read: no analysis is needed, so a completion is answered at
once, whatever the file's size.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from lsprotocol import types

_PRAGMA = re.compile(r"#\s*llmmem\s*:(?P<body>.*)$")
_PRAGMA_VALUE = re.compile(r"(?:^|\s)(?P<key>[A-Za-z_][\w-]*)\s*=\s*[\"']?(?P<prefix>[^\s\"']*)$")
_PRAGMA_IGNORE = re.compile(r"(?:^|\s)ignore\[(?P<done>[^\]]*?,\s*)?(?P<prefix>[\w]*)$")
_PRAGMA_WORD = re.compile(r"(?:^|\s)(?P<prefix>[A-Za-z_][\w-]*)?$")
# `optim="...`, `optim: ...`, `--optim ...`, `"optim": "...`, `optim = "...` (TOML)
_SETTING_VALUE = re.compile(
    r"(?:--(?P<flag>optim|attn_implementation)(?:\s+|=)"
    r"|(?:^|[\s,({\"'])(?P<key>optim|optimizer|attn_implementation)[\"']?\s*[=:]\s*)"
    r"(?P<quote>[\"']?)(?P<prefix>[\w.\-]*)$"
)
_TOML_VALUE = re.compile(r"^\s*(?P<key>[A-Za-z_][\w-]*)\s*=\s*[\"'](?P<prefix>[^\"']*)$")
_TOML_KEY = re.compile(r"^\s*(?P<prefix>[A-Za-z_][\w-]*)?$")
_TOML_TABLE = re.compile(r"^\s*\[\s*(?P<name>[^\]]+?)\s*\]")

TRIGGER_CHARACTERS = ["=", "[", ",", ":", '"', "'", " "]


@lru_cache(maxsize=2)
def key_items(pyproject: bool) -> tuple[tuple[str, str], ...]:
    """The keys of a `# llmmem:` comment, or of `[tool.llmmem]`, with what each takes."""
    from llmmem.schema import PragmaValuesModel, ProjectSettingsModel

    model = ProjectSettingsModel if pyproject else PragmaValuesModel
    return tuple(
        (info.alias or name, info.description or "") for name, info in model.model_fields.items()
    )


@lru_cache(maxsize=1)
def gpu_items() -> tuple[tuple[str, str], ...]:
    from llmmem.gpus import GIB, all_gpus

    return tuple(
        (gpu.name, f"{gpu.capacity_bytes / GIB:g} GiB{'' if gpu.bf16 else ', no bf16'}")
        for gpu in all_gpus()
    )


@lru_cache(maxsize=1)
def optimizer_items() -> tuple[tuple[str, str], ...]:
    from llmmem.budget.optimizers import OPTIMIZERS

    return tuple((name, spec.label) for name, spec in OPTIMIZERS.items())


@lru_cache(maxsize=1)
def attention_items() -> tuple[tuple[str, str], ...]:
    from llmmem.extract.vocabulary import _ATTENTION

    names = sorted(set(_ATTENTION.values()))
    return tuple((name, "attention implementation") for name in names)


@lru_cache(maxsize=1)
def rule_items() -> tuple[tuple[str, str], ...]:
    from llmmem.rules.catalog import all_rules

    return tuple((rule.code, f"{rule.name}: {rule.summary}") for rule in all_rules())


@lru_cache(maxsize=2)
def level_items(fail_on: bool) -> tuple[tuple[str, str], ...]:
    """The levels of `fail_on` (the least severity that fails `llmmem-lint`), or of a rule's
    severity."""
    from llmmem.extract.pragmas import FAIL_ON_LEVELS, SEVERITY_LEVELS

    levels = FAIL_ON_LEVELS if fail_on else SEVERITY_LEVELS
    return tuple((level, "fail_on" if fail_on else "severity") for level in levels)


@lru_cache(maxsize=1)
def precision_items() -> tuple[tuple[str, str], ...]:
    from llmmem.extract.vocabulary import PRECISIONS

    return tuple((name, "precision") for name in PRECISIONS)


def _items(
    names: tuple[tuple[str, str], ...],
    kind: types.CompletionItemKind,
    prefix: str,
    line: int,
    start: int,
    end: int,
    suffix: str = "",
    prefix_text: str = "",
) -> list[types.CompletionItem]:
    """Items whose text replaces `prefix` (columns `start`..`end`, in the client's units)."""
    where = types.Range(
        start=types.Position(line=line, character=start),
        end=types.Position(line=line, character=end),
    )
    lowered = prefix.lower()
    out = []
    for order, (name, detail) in enumerate(names):
        if lowered and lowered not in name.lower():
            continue
        out.append(
            types.CompletionItem(
                label=name,
                kind=kind,
                detail=detail,
                sort_text=f"{order:04d}",
                filter_text=name,
                text_edit=types.TextEdit(range=where, new_text=prefix_text + name + suffix),
            )
        )
    return out


def _toml_table(lines: list[str], line: int) -> str | None:
    """The name of the TOML table `line` is in (`tool.llmmem`), None before the first one."""
    for number in range(line, -1, -1):
        found = _TOML_TABLE.match(lines[number])
        if found is not None:
            return found.group("name").replace(" ", "").replace('"', "")
    return None


def _toml_completions(
    lines: list[str], line: int, before: str, span: Callable[[str], tuple[int, int]]
) -> list[types.CompletionItem] | None:
    """In `[tool.llmmem]`: its keys, GPU names for `gpu`, the levels for `fail_on`; in
    `[tool.llmmem.severity]`: rule codes as keys, severity levels as values."""
    table = _toml_table(lines, line)
    if table not in ("tool.llmmem", "tool.llmmem.severity"):
        return None
    value = _TOML_VALUE.match(before)
    if value is not None:
        key, prefix = value.group("key"), value.group("prefix")
        start, end = span(prefix)
        kind = types.CompletionItemKind.Value
        if table == "tool.llmmem.severity":
            return _items(level_items(False), kind, prefix, line, start, end)
        if key == "gpu":
            return _items(gpu_items(), kind, prefix, line, start, end)
        if key == "fail_on":
            return _items(level_items(True), kind, prefix, line, start, end)
        return None
    bare = _TOML_KEY.match(before)
    if bare is None:
        return None
    prefix = bare.group("prefix") or ""
    start, end = span(prefix)
    if table == "tool.llmmem.severity":
        return _items(
            rule_items(), types.CompletionItemKind.EnumMember, prefix, line, start, end, ' = "'
        )
    return _items(
        key_items(True), types.CompletionItemKind.Property, prefix, line, start, end, " = "
    )


def completions(
    lines: list[str],
    line: int,
    col: int,
    to_client: Callable[[int, int], int],
    is_pyproject: bool,
    quoted_values: bool = False,
) -> list[types.CompletionItem] | None:
    """What fits at (line, col) (code points); `to_client(line, col)` converts a column to the
    client's units; `quoted_values`: a setting's value is a string literal (Python, JSON), so a
    name completed where no quote was typed comes in quotes. None where nothing is completed."""
    if not 0 <= line < len(lines):
        return None
    before = lines[line][:col]

    def edit_range(prefix: str) -> tuple[int, int]:
        return to_client(line, col - len(prefix)), to_client(line, col)

    if is_pyproject:
        return _toml_completions(lines, line, before, edit_range)

    pragma = _PRAGMA.search(before)
    if pragma is not None:
        return _pragma_completions(pragma.group("body"), line, edit_range)
    setting = _SETTING_VALUE.search(before)
    if setting is not None:
        prefix = setting.group("prefix")
        start, end = edit_range(prefix)
        named = setting.group("flag") or setting.group("key")
        table = attention_items() if named == "attn_implementation" else optimizer_items()
        quote = (
            '"'
            if quoted_values and not setting.group("flag") and not setting.group("quote")
            else ""
        )
        return _items(
            table, types.CompletionItemKind.EnumMember, prefix, line, start, end, quote, quote
        )
    return None


def _pragma_completions(
    body: str, line: int, span: Callable[[str], tuple[int, int]]
) -> list[types.CompletionItem]:
    ignore = _PRAGMA_IGNORE.search(body)
    if ignore is not None:
        prefix = ignore.group("prefix")
        done = {code.strip().upper() for code in (ignore.group("done") or "").split(",")}
        codes = tuple(item for item in rule_items() if item[0] not in done)
        start, end = span(prefix)
        return _items(codes, types.CompletionItemKind.EnumMember, prefix, line, start, end)
    value = _PRAGMA_VALUE.search(body)
    if value is not None:
        key = value.group("key").lower().replace("-", "_")
        table = {
            "gpu": gpu_items,
            "optim": optimizer_items,
            "precision": precision_items,
        }.get(key)
        if table is None:
            return []
        prefix = value.group("prefix")
        start, end = span(prefix)
        return _items(table(), types.CompletionItemKind.Value, prefix, line, start, end)
    word = _PRAGMA_WORD.search(body)
    if word is None:
        return []
    prefix = word.group("prefix") or ""
    start, end = span(prefix)
    items = _items(
        key_items(False), types.CompletionItemKind.Property, prefix, line, start, end, "="
    )
    items += _items(
        (("ignore", "silence findings on this line: ignore[LLM001] or every one"),),
        types.CompletionItemKind.Keyword,
        prefix,
        line,
        start,
        end,
        "[",
    )
    return items

"""What the user tells llmmem directly: `# llmmem:` comments and `[tool.llmmem]` in pyproject.toml.

A pragma is a `#` comment (Python, YAML, shell) that starts with `llmmem:` and holds
`key=value` pairs:

    # llmmem: gpu=A100-80GB seq=4096 world_size=8
    # llmmem: model=meta-llama/Llama-3.1-8B batch=4 grad_accum=8 precision=bf16 optim=adamw_8bit

Keys: gpu, seq, batch, grad_accum, world_size, model, model_config, precision, optim. Each
value becomes a Sourced(pragma) whose range is the comment. Pragmas beat everything else in the
file; a later pragma beats an earlier one.

The same comment can silence findings on its line: `# llmmem: ignore[LLM001,LLM003]`, or
`# llmmem: ignore` for every finding on the line (`parse_suppressions`).

`[tool.llmmem]` in the nearest pyproject.toml sets project-wide defaults (`ProjectSettings`):

    [tool.llmmem]
    gpu = "A100-80GB"
    world_size = 8
    hub = false                       # never look models up on the Hugging Face Hub
    [tool.llmmem.local_model_paths]   # model id -> local directory with config.json
    "meta-llama/Llama-3.1-8B" = "/models/llama-3.1-8b"
    [tool.llmmem.severity]            # rule code -> error | warning | info | hint | off
    LLM003 = "warning"

`fail_on = "error" | "warning" | "info"` sets the least severity that makes `llmmem-lint` exit 1
(`--fail-on` wins over it).
"""

from __future__ import annotations

import codecs
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmmem.extract.builder import PlanBuilder
from llmmem.extract.numbers import MAX_COUNT, NumberOutOfRange, parse_count, shown
from llmmem.plan import Provenance, RejectedValue, SourceRange

# pragma key -> (builder key, value type)
PRAGMA_KEYS: dict[str, tuple[str, type]] = {
    "gpu": ("gpu", str),
    "seq": ("max_seq_length", int),
    "batch": ("per_device_train_batch_size", int),
    "grad_accum": ("gradient_accumulation_steps", int),
    "world_size": ("distributed.world_size", int),
    "model": ("model_id", str),
    "model_config": ("model_config", str),
    "precision": ("precision", str),
    "optim": ("optim", str),
}

ALL_CODES = "*"  # in a suppression set: every code on that line
SEVERITY_LEVELS = ("error", "warning", "info", "hint", "off")
FAIL_ON_LEVELS = ("error", "warning", "info")  # the least severity that fails `llmmem-lint`

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_PRAGMA = re.compile(r"#\s*llmmem\s*:(?P<body>.*)$")
_ITEM = re.compile(
    r"""(?P<ignore>ignore(?:\[(?P<codes>[^\]]*)\])?)(?=\s|$)"""
    r"""|(?P<key>[A-Za-z_][\w-]*)\s*=\s*(?P<value>"[^"]*"|'[^']*'|(?![A-Za-z_][\w-]*=)\S+)"""
    r"""|(?P<junk>\S+)"""
)


@dataclass(frozen=True)
class Pragma:
    """One `key=value` of a `# llmmem:` comment."""

    key: str  # the builder key: "max_seq_length" for `seq`
    value: str | int
    range: SourceRange  # the whole comment
    written: str  # the key as written: "seq"


@dataclass(frozen=True)
class PragmaProblem:
    """A part of a `# llmmem:` comment that cannot be used, and where it is written."""

    message: str
    range: SourceRange  # the item (`gpus=A100`, `ignore[LLM001`), not the whole comment


@dataclass
class PragmaReading:
    pragmas: list[Pragma]
    suppressions: dict[int, set[str]]  # 0-based line -> codes ("*" for all)
    problems: list[str]
    rejected: list[RejectedValue] = field(default_factory=list)  # numbers past their bounds
    located: list[PragmaProblem] = field(default_factory=list)  # each problem, with its place
    # 0-based line -> (code, range) of each code an `ignore[...]` names
    ignored_codes: list[tuple[str, SourceRange]] = field(default_factory=list)

    def refuse(self, message: str, where: SourceRange) -> None:
        self.problems.append(message)
        self.located.append(PragmaProblem(message, where))


def split_lines(text: str) -> list[str]:
    """Lines as LSP and Python count them: split at \\r\\n, \\r and \\n only (not at form
    feeds or Unicode separators, which `str.splitlines` also splits at)."""
    return _LINE_BREAK.split(text)


def _comment_start(line: str) -> int | None:
    """Where a `# llmmem:` comment starts on the line: after the first `#` outside quotes (a
    pragma may follow other comment text: `x = 1  # why  # llmmem: ignore`)."""
    if "llmmem" not in line:
        return None
    quote: str | None = None
    index = 0
    while index < len(line):
        char = line[index]
        if quote is not None:
            if char == "\\":
                index += 2
                continue
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#":
            found = _PRAGMA.search(line, index)
            return found.start() if found is not None else None
        index += 1
    return None


def read_pragmas(text: str) -> PragmaReading:
    """Every `# llmmem:` comment of a file: settings, suppressions and what could not be read."""
    reading = PragmaReading(pragmas=[], suppressions={}, problems=[])
    if "llmmem" not in text:
        return reading
    for line_number, line in enumerate(split_lines(text)):
        if "llmmem" not in line:
            continue
        start = _comment_start(line)
        if start is None:
            continue
        match = _PRAGMA.match(line, start)
        if match is None:
            continue
        comment = line[start:].rstrip()
        comment_range = SourceRange(
            start_line=line_number,
            start_col=start,
            end_line=line_number,
            end_col=start + len(comment),
        )
        _read_comment(match.group("body"), match.start("body"), line_number, comment_range, reading)
    return reading


def _read_comment(
    body: str,
    body_col: int,
    line_number: int,
    comment_range: SourceRange,
    reading: PragmaReading,
) -> None:
    where = f"line {line_number + 1}"
    for item in _ITEM.finditer(body):
        item_range = SourceRange(
            start_line=line_number,
            start_col=body_col + item.start(),
            end_line=line_number,
            end_col=body_col + item.end(),
        )
        if item.group("ignore"):
            codes = item.group("codes")
            found = reading.suppressions.setdefault(line_number, set())
            if codes is None or not codes.strip():
                found.add(ALL_CODES)
            else:
                named = [code.strip().upper() for code in codes.split(",") if code.strip()]
                found.update(named)
                reading.ignored_codes += [(code, item_range) for code in named]
            continue
        if item.group("junk"):
            junk = item.group("junk")
            if junk.endswith("=") and junk[:-1].lower().replace("-", "_") in PRAGMA_KEYS:
                message = f"{junk[:-1]} has no value"
            elif junk.lower().startswith("ignore["):
                message = f"cannot read '{shown(junk)}'; close it: `ignore[LLM001,LLM003]`"
            else:
                message = f"cannot read '{shown(junk)}'; write key=value, e.g. `# llmmem: seq=4096`"
            reading.refuse(f"llmmem pragma ({where}): {message}", item_range)
            continue
        written = item.group("key").lower().replace("-", "_")
        raw = item.group("value").strip("\"'")
        if written not in PRAGMA_KEYS:
            known = ", ".join(PRAGMA_KEYS)
            reading.refuse(
                _pragma_problem(written, raw, where, f"unknown key '{written}' (known: {known})"),
                item_range,
            )
            continue
        key, kind = PRAGMA_KEYS[written]
        value: str | int = raw
        if kind is int:
            try:
                value = parse_count(raw)
            except NumberOutOfRange as err:
                reading.problems.append(f"llmmem pragma ({where}): {written}: {err}; not used")
                reading.rejected.append(
                    RejectedValue(key=key, message=f"{written}={err}", range=item_range)
                )
                continue
            except ValueError:
                reading.refuse(
                    _pragma_problem(
                        written,
                        raw,
                        where,
                        f"{written} must be a positive integer, got '{shown(raw)}'",
                    ),
                    item_range,
                )
                continue
        elif not raw:
            reading.refuse(
                _pragma_problem(written, raw, where, f"{written} has no value"), item_range
            )
            continue
        reading.pragmas.append(Pragma(key=key, value=value, range=comment_range, written=written))


def _pragma_problem(written: str, raw: str, where: str, fallback: str) -> str:
    """The line for a pragma value the reader refused, worded by `PragmaValuesModel` (the key
    and the expected type); `fallback` if the model, which reads numbers less strictly than
    `parse_count` (no superscripts, no other scripts' digits), accepts it."""
    from llmmem.schema import PragmaValuesModel, invalid_messages

    prefix = f"llmmem pragma ({where}): "
    messages = invalid_messages(PragmaValuesModel, {written: raw}, prefix)
    return messages[0] if messages else prefix + fallback


def parse_suppressions(text: str) -> dict[int, set[str]]:
    """0-based line -> rule codes silenced on that line; `ALL_CODES` ("*") for a bare `ignore`."""
    return read_pragmas(text).suppressions


def is_suppressed(suppressions: dict[int, set[str]], line: int, code: str) -> bool:
    """Whether a finding with `code` on 0-based `line` is silenced."""
    codes = suppressions.get(line)
    if not codes:
        return False
    return ALL_CODES in codes or code.upper() in codes


def apply_pragmas(builder: PlanBuilder, text: str) -> PragmaReading:
    """Feed the file's pragmas to the builder (provenance `pragma`); returns what was read."""
    reading = read_pragmas(text)
    for pragma in reading.pragmas:
        builder.set(pragma.key, pragma.value, Provenance.PRAGMA, pragma.range, note="")
    builder.problems.extend(reading.problems)
    builder.rejected.extend(reading.rejected)
    return reading


# -- [tool.llmmem] ----------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class ProjectSettings:
    """`[tool.llmmem]` from the nearest pyproject.toml that has one (all optional). What the
    table says is checked in `_settings_from_table`, which turns a bad value into a line of
    `errors` worded by `llmmem.schema.ProjectSettingsModel`; building one with a non-positive
    world_size raises ValueError."""

    gpu: str | None = None
    world_size: int | None = None  # positive
    local_model_paths: dict[str, str] = field(default_factory=dict)
    hub: bool = True  # may llmmem look models up on the Hugging Face Hub
    severity: dict[str, str] = field(default_factory=dict)  # rule code -> level
    fail_on: str | None = None  # one of FAIL_ON_LEVELS; None: the linter's default
    path: str | None = None  # the pyproject.toml read, None when none was found
    ranges: dict[str, SourceRange] = field(default_factory=dict)  # key -> where it is written
    problems: list[str] = field(default_factory=list)
    # the table's values that are refused, one line each (also in `problems`): a command exits 2
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.world_size is not None and (
            isinstance(self.world_size, bool)
            or not isinstance(self.world_size, int)
            or self.world_size <= 0
        ):
            raise ValueError(f"world_size must be a positive whole number, got {self.world_size!r}")


MAX_PYPROJECT_BYTES = 4 * 1024 * 1024
_SETTINGS_CACHE: dict[tuple[str, int, int], ProjectSettings] = {}


def _load_toml(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib.loads(text)


def _key_ranges(text: str, path: str) -> dict[str, SourceRange]:
    """Where each top-level key of `[tool.llmmem]` is written (its value), for hovers."""
    ranges: dict[str, SourceRange] = {}
    inside = False
    for line_number, line in enumerate(split_lines(text)):
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped.replace(" ", "") == "[tool.llmmem]"
            continue
        if not inside:
            continue
        match = re.match(r"\s*([A-Za-z_][\w-]*)\s*=\s*(.*?)\s*(#.*)?$", line)
        if match:
            ranges[match.group(1)] = SourceRange(
                path=path,
                start_line=line_number,
                start_col=match.start(2),
                end_line=line_number,
                end_col=match.end(2),
            )
    return ranges


def read_project_settings(pyproject: Path) -> ProjectSettings | None:
    """`[tool.llmmem]` of one pyproject.toml; None when it has no such table. Never raises:
    what cannot be read becomes a line in `problems`."""
    from llmmem.files import read_file_bytes

    try:
        data = read_file_bytes(pyproject, MAX_PYPROJECT_BYTES)
    except OSError as err:  # it may hold [tool.llmmem]: its settings are not silently dropped
        reason = err.strerror if err.strerror else str(err)
        message = f"cannot read {pyproject} ({reason}): its [tool.llmmem], if any, is not used"
        return ProjectSettings(path=str(pyproject), problems=[message])
    text = data.decode("utf-8", errors="replace")
    if "llmmem" not in text:
        wide = _wide_text(data)
        if wide is not None and "llmmem" in wide:
            message = (
                f"{pyproject} is encoded as UTF-16 or UTF-32; TOML files are UTF-8, so its "
                "[tool.llmmem] cannot be read (save it as UTF-8)"
            )
            return ProjectSettings(path=str(pyproject), problems=[message], errors=[message])
        return None
    try:
        document = _load_toml(text)
    except ImportError:
        return ProjectSettings(
            path=str(pyproject),
            problems=["reading pyproject.toml needs Python 3.11 or the tomli package"],
        )
    except Exception as err:  # it names llmmem: a settings table that cannot be read is an error
        message = f"{pyproject} is not valid TOML ({err}): its [tool.llmmem] cannot be read"
        return ProjectSettings(path=str(pyproject), problems=[message], errors=[message])
    tool = document.get("tool")
    table = tool.get("llmmem") if isinstance(tool, dict) else None
    if table is not None and not isinstance(table, dict):
        written = (
            "[[tool.llmmem]] (an array of tables)"
            if isinstance(table, list)
            else (f"tool.llmmem = {shown(repr(table))}")
        )
        message = (
            f"{pyproject}: {written} cannot be read; llmmem's settings are one table, "
            "`[tool.llmmem]`"
        )
        return ProjectSettings(path=str(pyproject), problems=[message], errors=[message])
    if not isinstance(table, dict):
        return None
    return _settings_from_table(table, str(pyproject), _key_ranges(text, str(pyproject)))


def _wide_text(data: bytes) -> str | None:
    """The text of a UTF-16 or UTF-32 file (a byte-order mark, or NUL bytes between ASCII)."""
    boms = (
        (codecs.BOM_UTF32_LE, "utf-32"),
        (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    )
    for bom, encoding in boms:
        if data.startswith(bom):
            return data.decode(encoding, errors="replace")
    if b"\x00" in data[:64]:
        for encoding in ("utf-16-le", "utf-16-be"):
            text = data.decode(encoding, errors="replace")
            if "tool" in text:
                return text
    return None


def _settings_from_table(
    table: dict[str, Any], path: str, ranges: dict[str, SourceRange]
) -> ProjectSettings:
    """The table's good values; each refused one is a line of `errors`. The check here is by
    hand (pydantic is not imported on a run whose settings are good, see `llmmem.schema`); the
    messages come from `ProjectSettingsModel`, the declared types of the table."""
    settings = ProjectSettings(path=path, ranges=ranges)
    where = f"{path} [tool.llmmem]: "
    refused: list[str] = []  # hand-worded, used only if the model accepted what was refused
    for key, value in table.items():
        if key == "gpu" and isinstance(value, str) and value.strip():
            settings.gpu = value.strip()
        elif (
            key == "world_size"
            and isinstance(value, int)
            and not isinstance(value, bool)
            and 0 < value <= MAX_COUNT
        ):
            settings.world_size = value
        elif key == "hub" and isinstance(value, bool):
            settings.hub = value
        elif (
            key == "local_model_paths"
            and isinstance(value, dict)
            and all(isinstance(local, str) for local in value.values())
        ):
            settings.local_model_paths = {str(model): local for model, local in value.items()}
        elif key == "severity" and isinstance(value, dict):
            for code, level in value.items():
                if isinstance(level, str) and level.lower() in SEVERITY_LEVELS:
                    settings.severity[str(code).upper()] = level.lower()
                else:
                    refused.append(f"{where}severity.{code} is {level!r}")
        elif key == "fail_on" and isinstance(value, str) and value.lower() in FAIL_ON_LEVELS:
            settings.fail_on = value.lower()
        else:
            refused.append(f"{where}{key} is {value!r}")
    if refused:
        from llmmem.schema import ProjectSettingsModel, invalid_messages

        table = ProjectSettingsModel.normalised(table)
        settings.errors = invalid_messages(ProjectSettingsModel, table, where) or refused
        settings.problems.extend(settings.errors)
    return settings


def find_project_settings(path: Path) -> ProjectSettings:
    """`[tool.llmmem]` from the nearest pyproject.toml above `path` that has the table, looking
    no higher than the enclosing git repository. Defaults when there is none; never raises."""
    try:
        start = path if path.is_dir() else path.parent
        start = start.resolve()
    except (OSError, RuntimeError, ValueError):
        return ProjectSettings()
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        try:
            stat = candidate.stat()
        except OSError:
            stat = None
        if stat is not None:
            cache_key = (str(candidate), stat.st_mtime_ns, stat.st_size)
            cached = _SETTINGS_CACHE.get(cache_key)
            if cached is None:
                cached = read_project_settings(candidate) or ProjectSettings()
                _SETTINGS_CACHE[cache_key] = cached
            if cached.path is not None:
                return cached
        try:
            if (directory / ".git").exists():
                break
        except OSError:
            break
    return ProjectSettings()


def apply_project_settings(builder: PlanBuilder, settings: ProjectSettings) -> None:
    """Feed `[tool.llmmem]` gpu and world_size to the builder (provenance `pragma`, ranges in
    pyproject.toml); a `# llmmem:` comment in the file, set later, wins over them."""
    note = f"[tool.llmmem] in {settings.path}" if settings.path else "[tool.llmmem]"
    if settings.gpu:
        builder.set("gpu", settings.gpu, Provenance.PRAGMA, settings.ranges.get("gpu"), note)
    if settings.world_size:
        builder.set(
            "distributed.world_size",
            settings.world_size,
            Provenance.PRAGMA,
            settings.ranges.get("world_size"),
            note,
        )
    builder.problems.extend(settings.problems)
    builder.settings_problems.extend(
        problem for problem in settings.problems if problem not in settings.errors
    )

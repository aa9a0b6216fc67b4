"""What every framework reader shares: settings, value conversions, the document reader.

A reader turns keys into `Setting`s: a plan key (see `llmmem.extract.builder`), the value in the
plan's terms, its provenance and the range of the value's text. `DocumentReader` reads keys of one
positioned YAML/JSON document into a `ConfigReading`; the `as_*` conversions turn a value as
written into the plan's terms or raise `ValueProblem`, which the reader turns into a problem line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmmem.extract.numbers import is_ascii_digits, shown
from llmmem.extract.text import read_text_file
from llmmem.extract.vocabulary import (
    normalize_attn_implementation,
    normalize_quant_storage,
    optim_for_optimizer_class,
)
from llmmem.extract.yaml_positions import (
    KeyPath,
    PositionedYaml,
    SyntaxErrorAt,
    describe_location,
    read_positioned_yaml,
)
from llmmem.plan import Provenance, RejectedValue, SourceRange

# --------------------------------------------------------------------------------------------
# settings


@dataclass(frozen=True)
class Setting:
    """One plan value as a file states it (or as a framework defaults it)."""

    key: str
    value: Any
    source: Provenance
    range: SourceRange | None
    note: str = ""


@dataclass
class ConfigReading:
    """What one config file, and the files it refers to, says about a training run."""

    path: Path
    kind: str  # "yaml" or "json"
    framework: str
    settings: list[Setting] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    referenced_files: list[Path] = field(default_factory=list)
    text: str = ""  # the file's text (its `# llmmem:` pragmas are read from it)
    range_path: str | None = None  # the file in every range; None: the plan's own file
    # plan keys a DeepSpeed file leaves "auto", with where each "auto" is written
    deepspeed_auto_keys: dict[str, KeyPath] = field(default_factory=dict)
    # numbers written that are not numbers the key can take (LLM011), where they are written
    rejected: list[RejectedValue] = field(default_factory=list)
    refused: str | None = None  # why the document was not read at all (see PositionedYaml)
    # the document does not parse (see PositionedYaml.syntax_error)
    syntax_error: SyntaxErrorAt | None = None

    def value_of(self, key: str) -> Any:
        """The last value set for `key`, or None."""
        for setting in reversed(self.settings):
            if setting.key == key:
                return setting.value
        return None

    def has(self, key: str) -> bool:
        return any(setting.key == key for setting in self.settings)

    def setting(self, key: str) -> Setting | None:
        for setting in reversed(self.settings):
            if setting.key == key:
                return setting
        return None


# --------------------------------------------------------------------------------------------
# values in the plan's terms


class ValueProblem(ValueError):
    """A value of the wrong type; the message completes 'KEY ...'."""


class NumberProblem(ValueProblem):
    """A key that takes a number written with something that is not one it can take (`four`,
    `-2` for a count): besides the problem line, the plan rejects it where it is written, as
    the builder rejects a Python script's `per_device_train_batch_size="four"` (LLM011)."""


def as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise NumberProblem(f"must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if is_ascii_digits(text) and len(text) > 4000:
            # past Python's int-from-text limit: a number of the same length stands for it, so
            # the plan reports it as too large ("a 5000-digit number") where it is written
            return 10 ** (len(text.lstrip("0")) - 1)
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = float("nan")
            if number.is_integer():
                return int(number)
    raise NumberProblem(f"must be a whole number, got {shown(repr(value), 40)}")


def as_count(value: Any) -> int:
    number = as_int(value)
    if number < 0:
        raise NumberProblem(f"must be 0 or more, got {value!r}")
    return number


def as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise NumberProblem(f"must be a number, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise NumberProblem(f"must be a number, got {shown(repr(value), 40)}")


TRUE_WORDS = frozenset({"true", "yes", "on", "1", "y"})
FALSE_WORDS = frozenset({"false", "no", "off", "0", "n", "none", "null", ""})


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS | FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise ValueProblem(f"must be true or false, got {value!r}")


def as_text(value: Any) -> str:
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    raise ValueProblem(f"must be text, got {value!r}")


def as_name_list(value: Any) -> list[str]:
    """`[q_proj, v_proj]`, `"q_proj,v_proj"` or `"q_proj v_proj"` as a list of names."""
    if isinstance(value, str):
        text = value.strip().strip("[]")
        return [name.strip().strip("'\"") for name in re.split(r"[,\s]+", text) if name.strip()]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [item.strip() for item in value]
    raise ValueProblem(f"must be a list of module names, got {value!r}")


def lora_targets(value: Any) -> list[str]:
    """LoRA target modules in PEFT's terms: "all"/"all-linear" become ["all-linear"]."""
    names = as_name_list(value)
    if any(name.lower() in ("all", "all-linear", "all_linear") for name in names):
        return ["all-linear"]
    return names


DTYPE_NAMES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "torch.bfloat16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "torch.float16": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "torch.float32": "float32",
    "auto": "auto",
}


def as_dtype(value: Any) -> str:
    text = as_text(value).strip().lower()
    if text in DTYPE_NAMES:
        return DTYPE_NAMES[text]
    raise ValueProblem(f"must be a dtype (bfloat16, float16, float32), got {value!r}")


def as_quant_storage(value: Any) -> str:
    storage = normalize_quant_storage(as_text(value))
    if storage is None:
        raise ValueProblem(f"must be uint8, bfloat16, float16 or float32, got {value!r}")
    return storage


def as_attention(value: Any) -> str:
    attention = normalize_attn_implementation(as_text(value))
    if attention is None and "flash" in str(value).lower():
        attention = "flash_attention_2"
    if attention is None:
        raise ValueProblem(f"must be eager, sdpa or flash_attention_2, got {value!r}")
    return attention


# --------------------------------------------------------------------------------------------
# reading one document


class DocumentReader:
    """Reads keys of one positioned document into settings of a ConfigReading."""

    def __init__(
        self,
        document: PositionedYaml,
        reading: ConfigReading,
        *,
        range_path: str | None,
        file_path: Path,
        search_directories: list[Path] | None = None,
    ) -> None:
        self.document = document
        self.reading = reading
        self.range_path = range_path  # None: the plan's own file
        self.file_path = file_path
        # where files named on a command line laid over this document are looked for
        self.search_directories = search_directories or []

    def found(self, path: KeyPath) -> tuple[bool, Any]:
        return self.document.lookup(path)

    def get(self, path: KeyPath) -> Any:
        return self.document.lookup(path)[1]

    def is_set(self, path: KeyPath) -> bool:
        """Present with a value other than null (axolotl leaves unused keys empty)."""
        found, value = self.document.lookup(path)
        return found and value is not None and value != ""

    def range(self, path: KeyPath) -> SourceRange | None:
        return self.document.range_of(path)

    def where(self, path: KeyPath) -> str:
        located = self.document.range_of(path)
        if located is None:
            return self.range_path or "this file"
        return describe_location(self.range_path, located.start_line, located.start_col)

    def problem(self, path: KeyPath, message: str) -> None:
        self.reading.problems.append(f"{self.where(path)}: {message}")

    def reject(self, path: KeyPath, key: str | None, problem: ValueProblem) -> None:
        """The problem line for a value `path` holds that cannot be converted; a number that
        is not one (NumberProblem) is also rejected where it is written, under the plan's
        `key` (the written name where the value feeds no one key)."""
        written = ".".join(str(step) for step in path)
        self.problem(path, f"{written} {problem}")
        if isinstance(problem, NumberProblem):
            message = f"{written} {problem}" if key not in (None, written) else str(problem)
            self.reading.rejected.append(
                RejectedValue(key=key or written, message=message, range=self.range(path))
            )

    def source_of(self, located: SourceRange | None) -> Provenance:
        """`explicit` for what the plan's own file says, `config` for what a file it refers to
        (or that launches it) says: a document can mix both (a YAML with command-line
        overrides laid over it)."""
        path = located.path if located is not None else self.range_path
        return Provenance.EXPLICIT if path is None else Provenance.CONFIG

    def put(self, key: str, value: Any, path: KeyPath | None, note: str = "") -> None:
        located = self.range(path) if path is not None else None
        self.reading.settings.append(Setting(key, value, self.source_of(located), located, note))

    def take(
        self,
        path: KeyPath,
        key: str,
        convert: Callable[[Any], Any],
        note: str = "",
    ) -> Any:
        """The converted value at `path`, recorded as a setting; None when absent or invalid."""
        if not self.is_set(path):
            return None
        raw = self.get(path)
        try:
            value = convert(raw)
        except ValueProblem as problem:
            self.reject(path, key, problem)
            return None
        self.put(key, value, path, note)
        return value

    def converted(self, path: KeyPath, convert: Callable[[Any], Any]) -> Any:
        """The converted value at `path` without recording it; None when absent or invalid."""
        if not self.is_set(path):
            return None
        try:
            return convert(self.get(path))
        except ValueProblem as problem:
            self.reject(path, None, problem)
            return None

    def default(self, key: str, value: Any, note: str) -> None:
        """A framework default for `key`. Where the file says nothing, it is the value; where
        the file writes one, the default goes first (the file's value wins, and is the last
        the reading holds) and stands in if the plan rejects what is written (`micro_batch_size:
        0` falls back to axolotl's 1, as `four` does)."""
        default = Setting(key, value, Provenance.DEFAULT, None, note)
        stated = [setting.source for setting in self.reading.settings if setting.key == key]
        if not stated:
            self.reading.settings.append(default)
        elif Provenance.DEFAULT not in stated and Provenance.ASSUMED not in stated:
            self.reading.settings.insert(0, default)

    def keep(self, name: str, path: KeyPath) -> None:
        """Keep a framework key the plan has no field for (it lands in `plan.extra`)."""
        if self.is_set(path):
            self.put(name, self.get(path), path)

    def derived(self, name: str, value: Any, note: str) -> None:
        """A framework fact no single key states (it lands in `plan.extra`, labelled default)."""
        self.reading.settings.append(Setting(name, value, Provenance.DEFAULT, None, note))


# --------------------------------------------------------------------------------------------
# optimizer classes


def optimizer_name(dotted_name: str, fused: bool | None = None) -> str:
    """The HF `optim` name for an optimizer class path; torchao's low-bit AdamW classes have
    their own names; an unknown class keeps its path (the budget says it is unknown)."""
    module, _, class_name = dotted_name.rpartition(".")
    if module.startswith("torchao"):
        low_bit = {"adamw8bit": "adamw_torch_8bit", "adamw4bit": "adamw_torch_4bit"}
        if class_name.lower() in low_bit:
            return low_bit[class_name.lower()]
    return optim_for_optimizer_class(dotted_name, fused=bool(fused)) or dotted_name


# --------------------------------------------------------------------------------------------
# a file's document


def parse_config_text(reading: ConfigReading, text: str | None) -> PositionedYaml:
    """The positioned document of `reading.path` (its text read when `text` is None); problems
    (unreadable file, YAML errors) land in the reading."""
    if text is None:
        text = read_text_file(reading.path, reading.problems, reading.range_path)
    document = PositionedYaml(value=None)
    if text is not None:
        reading.text = text
        document = read_positioned_yaml(text, reading.range_path, is_json=reading.kind == "json")
        reading.problems.extend(document.problems)
        reading.refused = document.refused
        reading.syntax_error = document.syntax_error
    return document


def holds_mapping(reading: ConfigReading, document: PositionedYaml) -> bool:
    """Whether the document is a mapping of keys; if not, a problem line says what it is."""
    where = reading.range_path or "this file"
    if document.value is None:
        if reading.text.strip() and not document.problems:
            reading.problems.append(f"{where}: holds no settings")
        return False
    if not isinstance(document.value, dict):
        reading.problems.append(
            f"{where}: a training config is a mapping of keys; "
            f"this file holds a {type(document.value).__name__}"
        )
        return False
    return True


def config_kind(path: Path) -> str:
    """ "json" for a .json file, "yaml" for any other."""
    return "json" if path.suffix.lower() == ".json" else "yaml"

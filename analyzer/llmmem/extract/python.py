"""Reads a Python training script into a TrainingPlan.

The script is not run. It is parsed with the standard library's `ast` (positions with every
node, a C parser that is an order of magnitude faster than a concrete-syntax tree and that turns
absurd nesting into an error instead of a crash) and then walked once, in order, by a small
abstract interpreter, `ScriptReader`:

- names, attributes, literals, arithmetic, f-strings, dicts, `dict(...)`, `**kwargs`, conditional
  expressions, `os.environ.get(..., default)`, argparse and `HfArgumentParser` dataclasses are
  evaluated to `Known` values that remember the expression they came from and its provenance
  (`explicit`, or `cli-default` for a command-line default);
- the calls that matter build objects (`ModelObject` for `from_pretrained`, `ConfigObject` for
  `TrainingArguments`/`SFTConfig`/..., `LoraObject`, `QuantObject`, optimizers, data loaders,
  trainers) that later statements change (`model.gradient_checkpointing_enable()`,
  `get_peft_model(model, config)`, `args.bf16 = True`);
- only what reaches those objects counts: a variable named `gradient_checkpointing` that is
  never passed anywhere changes nothing, code under `if False:` does not run, and where a
  condition is not known before run time the first branch is taken and the value says so.

`PlanEmitter` then feeds the objects that reach the trainer to a `PlanBuilder`.

Ranges are 0-based lines and columns (columns count characters, as Python strings index them).
"""

from __future__ import annotations

import ast
import json
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from llmmem.extract.builder import CONFIG_DEFAULTS, PRECEDENCE, PlanBuilder
from llmmem.extract.pragmas import (
    ProjectSettings,
    apply_pragmas,
    apply_project_settings,
    split_lines,
)
from llmmem.extract.vocabulary import (
    TRAINER_CLASSES,
    TRAINER_CONFIG_CLASSES,
    TRL_CONFIG_CLASSES,
    TRL_TRAINER_CLASSES,
    canonical_key,
    flag_setting,
    lora_key,
    normalize_dtype,
    normalize_fsdp,
    normalize_quant_storage,
    optim_for_optimizer_class,
    sequence_length_names,
)
from llmmem.files import UnreadableFile, read_file_bytes
from llmmem.plan import Provenance, SourceRange, TrainingPlan

MAX_SOURCE_CHARS = 1_000_000  # larger files are not parsed (pragmas are still read)
MAX_CALL_DEPTH = 8  # user functions calling user functions
MAX_FUNCTION_RUNS = 300  # user function bodies walked per file
MAX_DEEPSPEED_CONFIG_BYTES = 1_000_000
MAX_RESULT_BITS = 4096  # integer arithmetic on literals stops here (10**1233)
MAX_SCRIPT_BYTES = 50_000_000  # a script read from disk (the editor's buffer has no cap here)
# bounds on what the reader builds: past one, the value is unknown (with a note), never grown
MAX_STRING_CHARS = 100_000  # a string built by `+`, an f-string or str()
MAX_ITEMS = 10_000  # items of a list, tuple or dict built by the script
MAX_VALUE_UNITS = 200_000  # a nested value read whole: one per item, one per character
MAX_STEPS = 200_000  # statements and expressions evaluated per file (about a second)
MAX_STEPS_VARIABLE = "LLMMEM_MAX_STEPS"  # an environment variable that changes MAX_STEPS

_UNSLOTH_LOADERS = frozenset({"FastLanguageModel", "FastModel", "FastVisionModel"})
_MODEL_CLASS_ENDINGS = (
    "ForCausalLM",
    "LMHeadModel",
    "ForConditionalGeneration",
    "ForSeq2SeqLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMaskedLM",
    "ForImageTextToText",
    "ForVision2Seq",
    "Model",
)
_PEFT_MODEL_CLASSES = frozenset({"PeftModel", "PeftModelForCausalLM", "PeftModelForSeq2SeqLM"})
_EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})
_MODEL_METHODS_RETURNING_THE_MODEL = frozenset(
    {
        "to",
        "cuda",
        "cpu",
        "half",
        "bfloat16",
        "float",
        "train",
        "eval",
        "requires_grad_",
        "gradient_checkpointing_enable",
        "gradient_checkpointing_disable",
        "activation_checkpointing_enable",
        "activation_checkpointing_disable",
        "add_adapter",
        "load_adapter",
    }
)
_SEQUENCE_NAMES = sequence_length_names()

# PEFT's LoraConfig defaults are applied by the builder; unsloth's get_peft_model has its own
_UNSLOTH_LORA_DEFAULTS: dict[str, object] = {
    "lora.r": 16,
    "lora.alpha": 16,
    "lora.dropout": 0.0,
    "lora.target_modules": [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ],
}


# -- values ----------------------------------------------------------------------------------


class Value:
    """What an expression evaluates to, as far as reading the script can tell."""


@dataclass(frozen=True, eq=False)
class Known(Value):
    """A plain value (number, string, bool, None, list, dict) and the expression it came from."""

    value: object
    node: ast.AST | None
    source: Provenance = Provenance.EXPLICIT
    note: str = ""


@dataclass(frozen=True, eq=False)
class Unknown(Value):
    """Something only the running program knows; `reason` says what, `node` where."""

    reason: str = ""
    node: ast.AST | None = None


@dataclass(frozen=True, eq=False)
class Symbol(Value):
    """A module, class or function from outside the file, by its dotted name through imports
    (`AM.from_pretrained` after `from transformers import AutoModelForCausalLM as AM` is
    `transformers.AutoModelForCausalLM.from_pretrained`)."""

    name: str
    node: ast.AST | None = None

    @property
    def leaf(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    @property
    def owner(self) -> str:
        parts = self.name.split(".")
        return parts[-2] if len(parts) > 1 else ""


@dataclass(eq=False)
class ListValue(Value):
    items: list[Value]
    node: ast.AST | None


@dataclass(eq=False)
class DictValue(Value):
    entries: dict[str, Value]
    node: ast.AST | None
    unread: list[str] = field(default_factory=list)  # `**x` parts that could not be read


@dataclass(eq=False)
class CallArgs:
    """A call's arguments after evaluation, `*` and `**` expanded where their values are known."""

    node: ast.Call
    positional: list[Value]
    keywords: dict[str, Value]
    unread: list[str]  # descriptions of `*x`/`**x` that could not be expanded

    def get(self, name: str, index: int | None = None) -> Value | None:
        if name in self.keywords:
            return self.keywords[name]
        if index is not None and index < len(self.positional):
            return self.positional[index]
        return None


@dataclass(eq=False)
class LoraObject(Value):
    """`LoraConfig(...)` or unsloth's `get_peft_model(model, r=...)` keywords."""

    call: ast.Call
    fields: dict[str, Value]
    unread: list[str]
    defaults: dict[str, object] = field(default_factory=dict)
    default_note: str = ""
    used: bool = False


@dataclass(eq=False)
class QuantObject(Value):
    """`BitsAndBytesConfig(...)`."""

    call: ast.Call
    fields: dict[str, Value]
    used: bool = False


@dataclass(eq=False)
class ModelObject(Value):
    """A model loaded by `from_pretrained`/`from_config`, unsloth, `pipeline`, or a trainer."""

    call: ast.Call
    model_id: Value
    keywords: dict[str, Value]
    loader: str = "transformers"  # "unsloth", "pipeline", "peft-adapter"
    checkpointing: Known | None = None
    use_cache: Known | None = None
    dtype: Known | None = None
    attention: Known | None = None
    lora: LoraObject | None = None
    kbit_prepared: ast.Call | None = None


@dataclass(eq=False)
class ModelConfigView(Value):
    """`model.config`, for `model.config.use_cache = False`."""

    model: ModelObject


@dataclass(eq=False)
class PretrainedConfigObject(Value):
    """`AutoConfig.from_pretrained(id)`: a model's architecture, for `from_config`."""

    model_id: Value
    call: ast.Call


@dataclass(eq=False)
class TokenizerObject(Value):
    call: ast.Call | None
    model_max_length: Value | None = None


@dataclass(eq=False)
class ConfigObject(Value):
    """`TrainingArguments(...)`, a TRL config, or a subclass of one defined in the file."""

    class_name: str  # the framework class it is or derives from: "SFTConfig"
    declared_name: str  # as called: "SFTConfig" or the subclass "MyArguments"
    node: ast.AST  # the call (or the argument parser call)
    fields: dict[str, Value]
    unread: list[str] = field(default_factory=list)
    from_command_line: bool = False


@dataclass(eq=False)
class OptimizerObject(Value):
    optim: Known  # the HF optim name, node: the class expression


@dataclass(eq=False)
class DataLoaderObject(Value):
    batch_size: Value


@dataclass(eq=False)
class TrainerObject(Value):
    class_name: str  # the framework trainer it is or derives from: "SFTTrainer"
    args: CallArgs


@dataclass(eq=False)
class ArgParserObject(Value):
    """An `argparse.ArgumentParser`: its arguments' defaults by destination."""

    arguments: dict[str, Value] = field(default_factory=dict)


@dataclass(eq=False)
class NamespaceObject(Value):
    """What `parse_args()` returns: attributes by name."""

    attributes: dict[str, Value]


@dataclass(eq=False)
class DataclassClass(Value):
    """A class defined in the file whose annotated fields have defaults (a dataclass, or a
    subclass of TrainingArguments/TRL config)."""

    name: str
    fields: dict[str, Value]
    config_class: str | None  # the framework config it derives from
    node: ast.ClassDef


@dataclass(eq=False)
class DataclassInstance(Value):
    name: str
    fields: dict[str, Value]


@dataclass(eq=False)
class ArgumentsParserObject(Value):
    """`HfArgumentParser((A, B, TrainingArguments))` or TRL's `TrlParser`."""

    classes: list[Value]
    node: ast.Call


@dataclass(eq=False)
class FunctionValue(Value):
    node: ast.FunctionDef | ast.AsyncFunctionDef
    scope: Scope
    defaults: dict[str, Value]
    command_line: bool = False  # its parameters come from the command line (fire, typer...)
    runs: int = 0


@dataclass(eq=False)
class ClassValue(Value):
    """Any other class defined in the file; `trainer_class` when it derives from a trainer."""

    name: str
    trainer_class: str | None
    config_class: str | None


class Scope:
    """Names bound in a module or function body; lookups fall back to the enclosing scope."""

    def __init__(self, parent: Scope | None = None) -> None:
        self.parent = parent
        self.names: dict[str, Value] = {}

    def lookup(self, name: str) -> Value | None:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        return None

    def bind(self, name: str, value: Value) -> None:
        self.names[name] = value


class Flow(Enum):
    NORMAL = "normal"
    RETURN = "return"
    STOP = "stop"  # raise, exit, break, continue: the rest of the block does not run


# -- positions -------------------------------------------------------------------------------


class SourceMap:
    """0-based LSP ranges for ast nodes (ast counts lines from 1 and columns in UTF-8 bytes)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = split_lines(text)

    def _column(self, line_index: int, byte_column: int) -> int:
        if line_index >= len(self.lines):
            return byte_column
        line = self.lines[line_index]
        if line.isascii():
            return byte_column
        return len(line.encode("utf-8")[:byte_column].decode("utf-8", errors="ignore"))

    def range_of(self, node: ast.AST | None) -> SourceRange | None:
        if node is None or not hasattr(node, "lineno"):
            return None
        start_line = int(node.lineno) - 1
        end_line = int(getattr(node, "end_lineno", None) or node.lineno) - 1
        start_col = self._column(start_line, int(getattr(node, "col_offset", 0)))
        end_col = self._column(end_line, int(getattr(node, "end_col_offset", None) or 0))
        return SourceRange(
            start_line=start_line, start_col=start_col, end_line=end_line, end_col=end_col
        )

    def text_of(self, node: ast.AST | None, limit: int = 60) -> str:
        found = self.range_of(node)
        if found is None:
            return ""
        if found.start_line == found.end_line:
            text = self.lines[found.start_line][found.start_col : found.end_col]
        else:
            text = self.lines[found.start_line][found.start_col :] + " ..."
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


# -- parsing ---------------------------------------------------------------------------------


def parse_script(text: str) -> tuple[ast.Module | None, str | None]:
    """The module, or None and a line for `problems` saying why it cannot be read."""
    if len(text) > MAX_SOURCE_CHARS:
        size = len(text.encode("utf-8", errors="replace")) / 1e6
        return None, (
            f"file is {size:.1f} MB; llmmem reads Python files up to "
            f"{MAX_SOURCE_CHARS / 1e6:.0f} MB (only `# llmmem:` comments were read)"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(text), None
    except SyntaxError as err:
        message = err.msg or "invalid syntax"
        if "null bytes" in message:
            return None, "not Python source: the file contains NUL bytes"
        line = f"line {err.lineno}" if err.lineno else "an unknown line"
        return None, f"syntax error at {line}: {message}"
    except (RecursionError, MemoryError):
        return None, "the file nests expressions too deeply to read"
    except ValueError as err:  # NUL bytes or lone surrogates
        return None, f"not Python source: {err}"


# -- the interpreter -------------------------------------------------------------------------


def _combine_notes(*notes: str) -> str:
    return "; ".join(note for note in dict.fromkeys(notes) if note)


def _weakest(values: Iterable[Known]) -> Provenance:
    sources = [value.source for value in values]
    if not sources:
        return Provenance.EXPLICIT
    return min(sources, key=lambda source: PRECEDENCE[source])


# where `settle` tells the reader that it gave up on a value too large to read whole
_OVERSIZED_NOTES: ContextVar[list[str] | None] = ContextVar("_OVERSIZED_NOTES", default=None)


class _ReadingStopped(Exception):
    """The reader took MAX_STEPS steps, or was told to stop; what it found so far is the plan."""


# asked every 1,024 steps: whether whoever runs the reading no longer wants it (see stop_when)
_STOP_WHEN: ContextVar[Callable[[], bool] | None] = ContextVar("_STOP_WHEN", default=None)


@contextmanager
def stop_when(abandoned: Callable[[], bool]) -> Iterator[None]:
    """Scripts read in this context stop soon after `abandoned()` turns true (the language
    server's timeout per analysis): the plan is what was read so far, with a note."""
    token = _STOP_WHEN.set(abandoned)
    try:
        yield
    finally:
        _STOP_WHEN.reset(token)


def max_steps() -> int:
    """MAX_STEPS, or the positive integer in the LLMMEM_MAX_STEPS environment variable."""
    written = os.environ.get(MAX_STEPS_VARIABLE, "").strip()
    if written.isascii() and written.isdigit() and 0 < len(written) <= 12 and int(written) > 0:
        return int(written)
    return MAX_STEPS


class _SettleBudget:
    """What reading one nested value whole may cost: a list that holds itself, or forty lists
    each holding the one before twice, is not read (it would never end)."""

    def __init__(self) -> None:
        self.units = MAX_VALUE_UNITS
        self.open: set[int] = set()  # containers being read, to see a cycle


def settle(value: Value | None, budget: _SettleBudget | None = None) -> Known | None:
    """A plain Known for a value whose parts are all known (lists and dicts included), else
    None. Symbols become their dotted name (`torch.bfloat16`). A value larger than
    MAX_VALUE_UNITS, or one that contains itself, is not known."""
    if isinstance(value, Known):
        return value
    if isinstance(value, Symbol):
        return Known(value.name, value.node)
    if not isinstance(value, (ListValue, DictValue)):
        return None
    if budget is None:
        budget = _SettleBudget()
        settled = settle(value, budget)
        notes = _OVERSIZED_NOTES.get()
        if budget.units < 0 and notes is not None:
            notes.append(f"a value of more than {MAX_VALUE_UNITS:,} items and characters")
        return settled
    if id(value) in budget.open:
        return None
    budget.open.add(id(value))
    try:
        return _settle_container(value, budget)
    finally:
        budget.open.discard(id(value))


def _settle_part(value: Value, budget: _SettleBudget) -> Known | None:
    budget.units -= 1
    if isinstance(value, Known) and isinstance(value.value, (str, bytes)):
        budget.units -= len(value.value)
    if budget.units < 0:
        return None
    return settle(value, budget)


def _settle_container(value: ListValue | DictValue, budget: _SettleBudget) -> Known | None:
    if isinstance(value, ListValue):
        known: list[Known] = []
        for item in value.items:
            known_item = _settle_part(item, budget)
            if known_item is None:
                return None
            known.append(known_item)
        return Known(
            [item.value for item in known],
            value.node,
            _weakest(known),
            _combine_notes(*(item.note for item in known)),
        )
    if value.unread:
        return None
    known_items: dict[str, Known] = {}
    for key, entry in value.entries.items():
        known_entry = _settle_part(entry, budget)
        if known_entry is None:
            return None
        known_items[key] = known_entry
    return Known(
        {key: item.value for key, item in known_items.items()},
        value.node,
        _weakest(known_items.values()),
    )


def _too_large(value: Value) -> str | None:
    """What is too large about a value the reader built (see the MAX_ bounds), or None."""
    if isinstance(value, Known):
        plain = value.value
        if isinstance(plain, (str, bytes)) and len(plain) > MAX_STRING_CHARS:
            return f"a string of more than {MAX_STRING_CHARS:,} characters"
        if isinstance(plain, int) and plain.bit_length() > MAX_RESULT_BITS:
            return f"an integer of more than {MAX_RESULT_BITS:,} bits"
        if isinstance(plain, (list, tuple, dict, set)) and len(plain) > MAX_ITEMS:
            return f"a collection of more than {MAX_ITEMS:,} items"
    elif isinstance(value, ListValue) and len(value.items) > MAX_ITEMS:
        return f"a list of more than {MAX_ITEMS:,} items"
    elif isinstance(value, DictValue) and len(value.entries) > MAX_ITEMS:
        return f"a dict of more than {MAX_ITEMS:,} items"
    return None


def _truth(value: Value) -> bool | None:
    if isinstance(value, Known):
        try:
            return bool(value.value)
        except Exception:
            return None
    if isinstance(value, (ListValue, DictValue)):
        return bool(value.items if isinstance(value, ListValue) else value.entries)
    if isinstance(
        value,
        (ModelObject, TokenizerObject, ConfigObject, LoraObject, QuantObject, OptimizerObject),
    ):
        return True
    return None


def _safe_binary(op: ast.operator, left: object, right: object) -> object:
    """Arithmetic on literals with limits, so that `2 ** 10 ** 10` cannot stall the editor."""
    if isinstance(left, bool) or isinstance(right, bool):
        raise TypeError("no arithmetic on booleans")
    numbers = (int, float)
    if isinstance(op, ast.Add):
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        if isinstance(left, numbers) and isinstance(right, numbers):
            return left + right
    elif isinstance(op, ast.Sub) and isinstance(left, numbers) and isinstance(right, numbers):
        return left - right
    elif isinstance(op, ast.Mult):
        if isinstance(left, numbers) and isinstance(right, numbers):
            result = left * right
            if isinstance(result, int) and result.bit_length() > MAX_RESULT_BITS:
                raise OverflowError("too large")
            return result
    elif isinstance(op, ast.Div) and isinstance(left, numbers) and isinstance(right, numbers):
        return left / right
    elif isinstance(op, ast.FloorDiv) and isinstance(left, numbers) and isinstance(right, numbers):
        return left // right
    elif isinstance(op, ast.Mod) and isinstance(left, numbers) and isinstance(right, numbers):
        return left % right
    elif isinstance(op, ast.Pow) and isinstance(left, numbers) and isinstance(right, numbers):
        if isinstance(left, int) and isinstance(right, int) and right >= 0:
            # exact, as long as the result stays small enough to compute at once: `10**309`
            # is a number (one the plan then refuses as too large), `2**10**10` is not computed
            if abs(left).bit_length() * right > MAX_RESULT_BITS:
                raise OverflowError("too large")
            return left**right
        if abs(right) > 64 or abs(left) > 2**32:
            raise OverflowError("too large")
        return left**right
    raise TypeError("unsupported operation")


def _compare(op: ast.cmpop, left: object, right: object) -> bool:
    if isinstance(op, ast.Eq):
        return bool(left == right)
    if isinstance(op, ast.NotEq):
        return bool(left != right)
    if isinstance(op, ast.Is):
        return left is right or (left is None and right is None)
    if isinstance(op, ast.IsNot):
        return not (left is right or (left is None and right is None))
    if isinstance(op, ast.In):
        return bool(left in right)  # type: ignore[operator]
    if isinstance(op, ast.NotIn):
        return bool(left not in right)  # type: ignore[operator]
    if isinstance(op, ast.Lt):
        return bool(left < right)  # type: ignore[operator]
    if isinstance(op, ast.LtE):
        return bool(left <= right)  # type: ignore[operator]
    if isinstance(op, ast.Gt):
        return bool(left > right)  # type: ignore[operator]
    if isinstance(op, ast.GtE):
        return bool(left >= right)  # type: ignore[operator]
    raise TypeError("unsupported comparison")


def _chosen_by(chosen: Value, test: Value, condition: str) -> Value:
    """A branch picked by a condition that is itself only a default (`x if args.bf16 else y`)
    is no stronger than that default."""
    decided = settle(test)
    if not isinstance(chosen, (Known, Symbol)) or decided is None:
        return chosen
    if decided.source is Provenance.EXPLICIT:
        return chosen
    known = chosen if isinstance(chosen, Known) else Known(chosen.name, chosen.node)
    if PRECEDENCE[decided.source] >= PRECEDENCE[known.source]:
        return known
    note = f"chosen by `{condition}` = {decided.value!r}"
    return replace(
        known, source=decided.source, note=_combine_notes(known.note, decided.note, note)
    )


def _is_model_class(name: str) -> bool:
    if any(word in name for word in ("Tokenizer", "Processor", "Config", "FeatureExtractor")):
        return False
    if name.startswith("Auto") and "Model" in name:
        return True
    return name.endswith(_MODEL_CLASS_ENDINGS)


def _config_class_of(name: str) -> str | None:
    return name if name in TRAINER_CONFIG_CLASSES else None


def _terminates(body: list[ast.stmt]) -> bool:
    """Whether a block ends by raising or exiting (an error path, not the normal run)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return _dotted_name(last.value.func) in _EXIT_CALLS
    return False


def _dotted_name(node: ast.expr) -> str:
    """`sys.exit` for the expression `sys.exit`; "" for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(node.id)
    return ".".join(reversed(parts))


class ScriptReader:
    """Walks a module in order, evaluating what can be known before run time and recording the
    objects that decide memory (models, training configs, adapters, optimizers, trainers)."""

    def __init__(self, source: SourceMap, path: Path) -> None:
        self.source = source
        self.path = path
        self.module_scope = Scope()
        self.problems: list[str] = []
        self.branch_notes: list[str] = []
        self.call_stack: list[FunctionValue] = []
        self.return_values: list[Value | None] = []
        self.function_runs = 0
        self.steps = 0  # statements and expressions evaluated, up to max_steps()
        self.max_steps = max_steps()
        self.abandoned = _STOP_WHEN.get()
        self.oversized: list[str] = []  # values given up on, for one note each
        self.functions: list[FunctionValue] = []
        # what the script builds, in order
        self.models: list[ModelObject] = []
        self.configs: list[ConfigObject] = []
        self.trainers: list[TrainerObject] = []
        self.loras: list[LoraObject] = []
        self.quants: list[QuantObject] = []
        self.optimizers: list[OptimizerObject] = []
        self.data_loaders: list[DataLoaderObject] = []
        self.tokenizers: list[TokenizerObject] = []
        self.tokenizer_lengths: list[Known] = []
        self.precision_flags: list[tuple[str, Known]] = []  # ("bf16", Known(True)) from autocast
        self.accumulation: list[Known] = []  # Accelerator(gradient_accumulation_steps=...)
        self.kbit_calls: list[ast.Call] = []
        self.command_line_lengths: list[Known] = []  # --block_size and friends
        self.unsloth = False

    # -- notes -------------------------------------------------------------------------------

    def literal(self, value: object, node: ast.AST | None) -> Known:
        note = self.branch_notes[-1] if self.branch_notes else ""
        return Known(value, node, Provenance.EXPLICIT, note)

    def problem(self, node: ast.AST | None, text: str) -> None:
        where = self.source.range_of(node)
        prefix = f"line {where.start_line + 1}: " if where is not None else ""
        self.problems.append(prefix + text)

    # -- statements --------------------------------------------------------------------------

    def run_module(self, module: ast.Module) -> None:
        self.module_scope.bind("__name__", Known("__main__", None))
        try:
            self.exec_block(module.body, self.module_scope)
            # functions nothing in the file calls (entry points for fire/typer/click, callbacks
            # handed to `dataset.map`, helpers of a library module) still describe the run
            for function in list(self.functions):
                if function.runs == 0:
                    self.call_function(function, None, None)
        except _ReadingStopped as stopped:
            self.problems.append(str(stopped))

    def step(self, node: ast.AST) -> None:
        """Count one statement or expression; past MAX_STEPS the reading stops."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise _ReadingStopped(
                f"stopped reading{self._at(node)} after {self.max_steps:,} steps (statements and "
                "expressions, function bodies once per call): the rest of the script was not read"
            )
        if self.steps % 1024 == 0 and self.abandoned is not None and self.abandoned():
            raise _ReadingStopped(f"stopped reading{self._at(node)}: the analysis was abandoned")

    def _at(self, node: ast.AST) -> str:
        where = self.source.range_of(node)
        return f" at line {where.start_line + 1}" if where is not None else ""

    def give_up(self, node: ast.AST | None, what: str) -> Unknown:
        """The unknown that stands for a value past a bound, noted once per kind."""
        if what not in self.oversized:
            self.oversized.append(what)
            self.problem(node, f"{what} was built; llmmem does not read it (treated as unknown)")
        return Unknown(what, node)

    def exec_block(self, body: list[ast.stmt], scope: Scope) -> Flow:
        for statement in body:
            try:
                flow = self.exec_statement(statement, scope)
            except RecursionError:
                self.problem(statement, "nested too deeply to read; skipped")
                flow = Flow.NORMAL
            if flow is not Flow.NORMAL:
                return flow
        return Flow.NORMAL

    def exec_statement(self, node: ast.stmt, scope: Scope) -> Flow:
        self.step(node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self.exec_import(node, scope)
        elif isinstance(node, ast.Assign):
            value = self.eval(node.value, scope)
            for target in node.targets:
                self.assign(target, value, scope)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.assign(node.target, self.eval(node.value, scope), scope)
        elif isinstance(node, ast.AugAssign):
            combined = ast.BinOp(left=_as_load(node.target), op=node.op, right=node.value)
            ast.copy_location(combined, node)
            combined.end_lineno = node.end_lineno
            combined.end_col_offset = node.end_col_offset
            self.assign(node.target, self.eval(combined, scope), scope)
        elif isinstance(node, ast.Expr):
            self.eval(node.value, scope)
            if isinstance(node.value, ast.Call) and _dotted_name(node.value.func) in _EXIT_CALLS:
                return Flow.STOP
        elif isinstance(node, ast.If):
            return self.exec_if(node, scope)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            return self.exec_for(node, scope)
        elif isinstance(node, ast.While):
            if _truth(self.eval(node.test, scope)) is not False:
                self.exec_block(node.body, scope)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                value = self.eval(item.context_expr, scope)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, value, scope)
            return self.exec_block(node.body, scope)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            flow = self.exec_block(getattr(node, "body", []), scope)
            if flow is Flow.NORMAL:
                flow = self.exec_block(getattr(node, "orelse", []), scope)
            self.exec_block(getattr(node, "finalbody", []), scope)
            return flow if flow is Flow.RETURN else Flow.NORMAL
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.define_function(node, scope)
        elif isinstance(node, ast.ClassDef):
            self.define_class(node, scope)
        elif isinstance(node, ast.Return):
            value = self.eval(node.value, scope) if node.value is not None else Known(None, None)
            if self.return_values:
                self.return_values[-1] = value
            return Flow.RETURN
        elif isinstance(node, (ast.Raise, ast.Break, ast.Continue)):
            return Flow.STOP
        return Flow.NORMAL

    def exec_import(self, node: ast.Import | ast.ImportFrom, scope: Scope) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    scope.bind(alias.asname, Symbol(alias.name))
                else:
                    top = alias.name.split(".")[0]
                    scope.bind(top, Symbol(top))
            return
        module = node.module or ""
        for alias in node.names:
            if alias.name == "*":
                continue
            dotted = f"{module}.{alias.name}" if module else alias.name
            scope.bind(alias.asname or alias.name, Symbol(dotted))

    def exec_if(self, node: ast.If, scope: Scope) -> Flow:
        test = self.eval(node.test, scope)
        truth = _truth(test)
        if truth is True:
            return self.exec_block(node.body, scope)
        if truth is False:
            return self.exec_block(node.orelse, scope)
        # not known before run time: take the first branch, unless it is an error exit
        if _terminates(node.body):
            return self.exec_block(node.orelse, scope)
        condition = self.source.text_of(node.test, 50)
        self.branch_notes.append(f"inside `if {condition}`, assumed true")
        try:
            return self.exec_block(node.body, scope)
        finally:
            self.branch_notes.pop()

    def exec_for(self, node: ast.For | ast.AsyncFor, scope: Scope) -> Flow:
        iterable = self.eval(node.iter, scope)
        if isinstance(iterable, ListValue) and not iterable.items:
            return self.exec_block(node.orelse, scope)
        first: Value = Unknown("a loop variable")
        if isinstance(iterable, ListValue):
            first = iterable.items[0]
            if isinstance(first, Known) and len(iterable.items) > 1:
                note = f"first of {len(iterable.items)} values the loop runs over"
                first = replace(first, note=_combine_notes(first.note, note))
        self.assign(node.target, first, scope)
        flow = self.exec_block(node.body, scope)
        if flow is Flow.RETURN:
            return flow
        return self.exec_block(node.orelse, scope)

    def assign(self, target: ast.expr, value: Value, scope: Scope) -> None:
        if isinstance(target, ast.Name):
            scope.bind(target.id, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            has_star = any(isinstance(element, ast.Starred) for element in target.elts)
            items: list[Value] | None = None
            if isinstance(value, ListValue) and len(value.items) == len(target.elts):
                items = value.items
            elif isinstance(value, Known) and isinstance(value.value, (list, tuple)):
                if len(value.value) == len(target.elts):
                    items = [replace(value, value=item) for item in value.value]
            for index, element in enumerate(target.elts):
                if isinstance(element, ast.Starred):
                    self.assign(element.value, Unknown("starred assignment"), scope)
                elif items is not None and not has_star:
                    self.assign(element, items[index], scope)
                else:
                    self.assign(element, Unknown("unpacked from a value not known"), scope)
        elif isinstance(target, ast.Attribute):
            owner = self.eval(target.value, scope)
            self.set_attribute(owner, target.attr, value)
        elif isinstance(target, ast.Subscript):
            owner = self.eval(target.value, scope)
            key = settle(self.eval(target.slice, scope))
            if isinstance(owner, DictValue) and key is not None and isinstance(key.value, str):
                owner.entries[key.value] = value
        elif isinstance(target, ast.Starred):
            self.assign(target.value, Unknown("starred assignment"), scope)

    def set_attribute(self, owner: Value, name: str, value: Value) -> None:
        if isinstance(owner, ConfigObject):
            owner.fields[name] = value
        elif isinstance(owner, NamespaceObject):
            owner.attributes[name] = value
        elif isinstance(owner, DataclassInstance):
            owner.fields[name] = value
        elif isinstance(owner, TokenizerObject) and name == "model_max_length":
            owner.model_max_length = value
        elif isinstance(owner, ModelConfigView):
            known = settle(value)
            if known is None:
                return
            if name == "use_cache":
                owner.model.use_cache = known
            elif name == "gradient_checkpointing":
                owner.model.checkpointing = known
            elif name in ("_attn_implementation", "attn_implementation"):
                owner.model.attention = known

    # -- definitions -------------------------------------------------------------------------

    def define_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, scope: Scope) -> None:
        defaults: dict[str, Value] = {}
        arguments = node.args
        positional = [*arguments.posonlyargs, *arguments.args]
        for parameter, default in zip(
            positional[len(positional) - len(arguments.defaults) :], arguments.defaults, strict=True
        ):
            defaults[parameter.arg] = self.eval(default, scope)
        for parameter, keyword_default in zip(
            arguments.kwonlyargs, arguments.kw_defaults, strict=True
        ):
            if keyword_default is not None:
                defaults[parameter.arg] = self.eval(keyword_default, scope)
        decorators = " ".join(self.source.text_of(item, 200) for item in node.decorator_list)
        command_line = bool(re.search(r"\b(command|main|callback)\b", decorators))
        function = FunctionValue(node, scope, defaults, command_line=command_line)
        self.functions.append(function)
        scope.bind(node.name, function)

    def define_class(self, node: ast.ClassDef, scope: Scope) -> None:
        bases = [self.eval(base, scope) for base in node.bases]
        config_class: str | None = None
        trainer_class: str | None = None
        inherited: dict[str, Value] = {}
        for base in bases:
            if isinstance(base, Symbol):
                config_class = config_class or _config_class_of(base.leaf)
                if base.leaf in TRAINER_CLASSES:
                    trainer_class = trainer_class or base.leaf
            elif isinstance(base, DataclassClass):
                config_class = config_class or base.config_class
                inherited.update(base.fields)
            elif isinstance(base, ClassValue):
                trainer_class = trainer_class or base.trainer_class
                config_class = config_class or base.config_class
        decorators = " ".join(self.source.text_of(item, 200) for item in node.decorator_list)
        is_dataclass = "dataclass" in decorators or config_class is not None
        if not is_dataclass:
            scope.bind(node.name, ClassValue(node.name, trainer_class, config_class))
            return
        fields = dict(inherited)
        class_scope = Scope(scope)
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                if statement.value is None:
                    continue
                value = self._field_default(statement.value, class_scope)
                note = f"default of {node.name}.{statement.target.id}"
                if isinstance(value, Known):
                    value = replace(value, note=_combine_notes(value.note, note))
                fields[statement.target.id] = value
        scope.bind(node.name, DataclassClass(node.name, fields, config_class, node))

    def _field_default(self, expression: ast.expr, scope: Scope) -> Value:
        if isinstance(expression, ast.Call):
            callee = self.eval(expression.func, scope)
            if isinstance(callee, Symbol) and callee.leaf == "field":
                for keyword in expression.keywords:
                    if keyword.arg == "default":
                        return self.eval(keyword.value, scope)
                return Unknown("a dataclass field without a plain default")
        return self.eval(expression, scope)

    # -- expressions -------------------------------------------------------------------------

    def eval(self, node: ast.expr | None, scope: Scope) -> Value:
        if node is not None:
            self.step(node)
        value = self._eval(node, scope)
        if isinstance(value, Unknown):
            if value.node is None and node is not None:
                return Unknown(value.reason, node)
            return value
        too_large = _too_large(value)
        if too_large is not None:
            return self.give_up(node, too_large)
        return value

    def _eval(self, node: ast.expr | None, scope: Scope) -> Value:
        if node is None:
            return Unknown("nothing")
        if isinstance(node, ast.Constant):
            return self.literal(node.value, node)
        if isinstance(node, ast.Name):
            found = scope.lookup(node.id)
            if found is None:
                return Symbol(node.id, node)
            if isinstance(found, Symbol):
                return Symbol(found.name, node)
            return found
        if isinstance(node, ast.Attribute):
            return self.eval_attribute(node, scope)
        if isinstance(node, ast.Call):
            return self.eval_call(node, scope)
        if isinstance(node, ast.Subscript):
            return self.eval_subscript(node, scope)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items: list[Value] = []
            for element in node.elts:
                if isinstance(element, ast.Starred):
                    expanded = self.eval(element.value, scope)
                    if isinstance(expanded, ListValue):
                        items.extend(expanded.items)
                    else:
                        items.append(Unknown("a starred expression"))
                else:
                    items.append(self.eval(element, scope))
            return ListValue(items, node)
        if isinstance(node, ast.Dict):
            return self.eval_dict(node, scope)
        if isinstance(node, ast.JoinedStr):
            return self.eval_fstring(node, scope)
        if isinstance(node, ast.BinOp):
            return self.eval_binary(node, scope)
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand, scope)
            if isinstance(node.op, ast.Not):
                truth = _truth(operand)
                return Unknown("a negated unknown") if truth is None else Known(not truth, node)
            known = settle(operand)
            if known is not None and isinstance(known.value, (int, float)):
                if isinstance(node.op, ast.USub):
                    return Known(-known.value, node, known.source, known.note)
                if isinstance(node.op, ast.UAdd):
                    return Known(+known.value, node, known.source, known.note)
            return Unknown("an operation on a value not known")
        if isinstance(node, ast.BoolOp):
            return self.eval_bool(node, scope)
        if isinstance(node, ast.Compare):
            return self.eval_compare(node, scope)
        if isinstance(node, ast.IfExp):
            return self.eval_conditional(node, scope)
        if isinstance(node, ast.NamedExpr):
            value = self.eval(node.value, scope)
            self.assign(node.target, value, scope)
            return value
        return Unknown(f"a {type(node).__name__} expression")

    def eval_attribute(self, node: ast.Attribute, scope: Scope) -> Value:
        owner = self.eval(node.value, scope)
        name = node.attr
        if isinstance(owner, Unknown):
            return Unknown(owner.reason)
        if isinstance(owner, Symbol):
            return Symbol(f"{owner.name}.{name}", node)
        if isinstance(owner, NamespaceObject):
            return owner.attributes.get(name, Unknown(f"no command-line argument `{name}`"))
        if isinstance(owner, DataclassInstance):
            return owner.fields.get(name, Unknown(f"{owner.name}.{name}"))
        if isinstance(owner, ConfigObject):
            if name in owner.fields:
                return owner.fields[name]
            return self._config_default(owner, name)
        if isinstance(owner, DataclassClass):
            return owner.fields.get(name, Unknown(f"{owner.name}.{name}"))
        if isinstance(owner, ModelObject):
            if name == "config":
                return ModelConfigView(owner)
            return Unknown(f"model.{name}")
        if isinstance(owner, ModelConfigView):
            if name == "use_cache" and owner.model.use_cache is not None:
                return owner.model.use_cache
            return Unknown(f"model.config.{name}")
        if isinstance(owner, TokenizerObject) and name == "model_max_length":
            return owner.model_max_length or Unknown("the tokenizer's model_max_length")
        if isinstance(owner, TrainerObject):
            if name == "model":
                return owner.args.get("model", 0) or Unknown("trainer.model")
            if name == "args":
                return owner.args.get("args", TRAINER_CLASSES[owner.class_name][1]) or Unknown(
                    "trainer.args"
                )
        return Unknown(f"attribute `{name}`")

    def _config_default(self, config: ConfigObject, name: str) -> Value:
        table = CONFIG_DEFAULTS.get(TRAINER_CONFIG_CLASSES.get(config.class_name, ""), {})
        key = canonical_key(name)
        if key is not None and key in table:
            return Known(table[key], None, Provenance.DEFAULT, f"{config.class_name} default")
        if name in ("bf16", "fp16") and "bf16" not in table:
            return Known(False, None, Provenance.DEFAULT, f"{config.class_name} default")
        return Unknown(f"{config.declared_name}.{name}")

    def eval_subscript(self, node: ast.Subscript, scope: Scope) -> Value:
        owner = self.eval(node.value, scope)
        key = settle(self.eval(node.slice, scope))
        if isinstance(owner, Symbol):
            if owner.name == "os.environ" and key is not None:
                return Unknown(f"environment variable {key.value}")
            return Unknown(f"{owner.name}[...]")
        if isinstance(owner, Unknown):
            return Unknown(owner.reason)
        if key is None:
            return Unknown("a subscript not known")
        if isinstance(owner, DictValue) and isinstance(key.value, str):
            return owner.entries.get(key.value, Unknown(f"no key {key.value!r}"))
        if isinstance(owner, ListValue) and isinstance(key.value, int):
            if -len(owner.items) <= key.value < len(owner.items):
                return owner.items[key.value]
            return Unknown("an index out of range")
        if isinstance(owner, Known):
            try:
                return Known(owner.value[key.value], node, owner.source, owner.note)  # type: ignore[index]
            except Exception:
                return Unknown("a subscript not known")
        return Unknown("a subscript not known")

    def eval_dict(self, node: ast.Dict, scope: Scope) -> DictValue:
        result = DictValue({}, node)
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:
                expanded = self.eval(value_node, scope)
                self._merge_into(result, expanded, value_node)
                continue
            key = settle(self.eval(key_node, scope))
            if key is None or not isinstance(key.value, str):
                continue
            result.entries[key.value] = self.eval(value_node, scope)
        return result

    def _merge_into(self, target: DictValue, expanded: Value, node: ast.AST) -> None:
        if isinstance(expanded, DictValue):
            target.entries.update(expanded.entries)
            target.unread.extend(expanded.unread)
        elif isinstance(expanded, Known) and isinstance(expanded.value, dict):
            for key, item in expanded.value.items():
                target.entries[str(key)] = replace(expanded, value=item)
        elif isinstance(expanded, NamespaceObject):
            target.entries.update(expanded.attributes)
        else:
            reason = expanded.reason if isinstance(expanded, Unknown) else "not known"
            target.unread.append(f"`**{self.source.text_of(node)}` ({reason})")

    def eval_fstring(self, node: ast.JoinedStr, scope: Scope) -> Value:
        parts: list[str] = []
        known_parts: list[Known] = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                parts.append(part.value)
            elif (
                isinstance(part, ast.FormattedValue)
                and part.conversion == -1
                and part.format_spec is None
            ):
                known = settle(self.eval(part.value, scope))
                if known is None or not isinstance(known.value, (str, int, float)):
                    return Unknown("an f-string with parts not known")
                parts.append(str(known.value))
                known_parts.append(known)
            else:
                return Unknown("a formatted f-string")
        note = _combine_notes(*(part.note for part in known_parts))
        return Known("".join(parts), node, _weakest(known_parts), note)

    def eval_binary(self, node: ast.BinOp, scope: Scope) -> Value:
        left = self.eval(node.left, scope)
        right = self.eval(node.right, scope)
        if isinstance(node.op, ast.BitOr) and isinstance(left, DictValue):
            merged = DictValue(dict(left.entries), node, list(left.unread))
            self._merge_into(merged, right, node.right)
            return merged
        if isinstance(node.op, ast.Add) and isinstance(left, ListValue):
            if isinstance(right, ListValue):
                return ListValue([*left.items, *right.items], node)
        left_known, right_known = settle(left), settle(right)
        if left_known is None or right_known is None:
            return Unknown("arithmetic on a value not known")
        try:
            result = _safe_binary(node.op, left_known.value, right_known.value)
        except Exception:
            return Unknown("arithmetic llmmem does not evaluate")
        return Known(
            result,
            node,
            _weakest((left_known, right_known)),
            _combine_notes(left_known.note, right_known.note),
        )

    def eval_bool(self, node: ast.BoolOp, scope: Scope) -> Value:
        value: Value = Unknown("nothing")
        for operand in node.values:
            value = self.eval(operand, scope)
            truth = _truth(value)
            if truth is None:
                return value if isinstance(value, Unknown) else Unknown("a condition not known")
            if isinstance(node.op, ast.Or) and truth:
                return value
            if isinstance(node.op, ast.And) and not truth:
                return value
        return value

    def eval_compare(self, node: ast.Compare, scope: Scope) -> Value:
        left = settle(self.eval(node.left, scope))
        result = True
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = settle(self.eval(comparator, scope))
            if left is None or right is None:
                return Unknown("a comparison with a value not known")
            try:
                result = result and _compare(op, left.value, right.value)
            except Exception:
                return Unknown("a comparison llmmem does not evaluate")
            left = right
        return Known(result, node)

    def eval_conditional(self, node: ast.IfExp, scope: Scope) -> Value:
        test = self.eval(node.test, scope)
        truth = _truth(test)
        if truth is not None:
            chosen = self.eval(node.body if truth else node.orelse, scope)
            return _chosen_by(chosen, test, self.source.text_of(node.test, 50))
        chosen = self.eval(node.body, scope)
        condition = self.source.text_of(node.test, 50)
        note = f"first branch of a conditional expression (`{condition}` is known only at run time)"
        if isinstance(chosen, Known):
            return replace(chosen, note=_combine_notes(chosen.note, note))
        if isinstance(chosen, Symbol):
            return Known(chosen.name, chosen.node, Provenance.EXPLICIT, note)
        return chosen

    # -- calls -------------------------------------------------------------------------------

    def eval_arguments(self, node: ast.Call, scope: Scope) -> CallArgs:
        args = CallArgs(node, [], {}, [])
        for argument in node.args:
            if isinstance(argument, ast.Starred):
                expanded = self.eval(argument.value, scope)
                if isinstance(expanded, ListValue):
                    args.positional.extend(expanded.items)
                else:
                    args.unread.append(f"`*{self.source.text_of(argument.value)}`")
                continue
            args.positional.append(self.eval(argument, scope))
        for keyword in node.keywords:
            if keyword.arg is None:
                merged = DictValue({}, keyword.value)
                self._merge_into(merged, self.eval(keyword.value, scope), keyword.value)
                args.keywords.update(merged.entries)
                args.unread.extend(merged.unread)
            else:
                args.keywords[keyword.arg] = self.eval(keyword.value, scope)
        return args

    def eval_call(self, node: ast.Call, scope: Scope) -> Value:
        if isinstance(node.func, ast.Attribute):
            owner = self.eval(node.func.value, scope)
            args = self.eval_arguments(node, scope)
            if isinstance(owner, Symbol):
                return self.call_symbol(Symbol(f"{owner.name}.{node.func.attr}", node.func), args)
            return self.call_method(owner, node.func.attr, args)
        callee = self.eval(node.func, scope)
        args = self.eval_arguments(node, scope)
        if isinstance(callee, Symbol):
            return self.call_symbol(callee, args)
        if isinstance(callee, FunctionValue):
            return self.call_function(callee, args, node)
        if isinstance(callee, DataclassClass):
            return self.instantiate(callee, args)
        if isinstance(callee, ClassValue):
            if callee.trainer_class is not None:
                return self.make_trainer(callee.trainer_class, args)
            return Unknown(f"an instance of {callee.name}")
        if isinstance(callee, TokenizerObject):
            self.read_tokenizer_call(args)
            return Unknown("tokenized text")
        return Unknown("the result of a call")

    def call_function(
        self, function: FunctionValue, args: CallArgs | None, node: ast.Call | None
    ) -> Value:
        function.runs += 1
        if (
            function in self.call_stack
            or len(self.call_stack) >= MAX_CALL_DEPTH
            or self.function_runs >= MAX_FUNCTION_RUNS
        ):
            return Unknown(f"the result of {function.node.name}()")
        self.function_runs += 1
        local = Scope(function.scope)
        self.bind_parameters(function, args, local)
        self.call_stack.append(function)
        self.return_values.append(None)
        try:
            self.exec_block(function.node.body, local)
        finally:
            self.call_stack.pop()
            result = self.return_values.pop()
        return result if result is not None else Unknown(f"the result of {function.node.name}()")

    def bind_parameters(self, function: FunctionValue, args: CallArgs | None, local: Scope) -> None:
        arguments = function.node.args
        positional = [*arguments.posonlyargs, *arguments.args]
        given_positional = list(args.positional) if args is not None else []
        given_keywords = dict(args.keywords) if args is not None else {}
        name = function.node.name
        for index, parameter in enumerate([*positional, *arguments.kwonlyargs]):
            if index < len(positional) and index < len(given_positional):
                local.bind(parameter.arg, given_positional[index])
            elif parameter.arg in given_keywords:
                local.bind(parameter.arg, given_keywords.pop(parameter.arg))
            elif parameter.arg in function.defaults:
                default = function.defaults[parameter.arg]
                if isinstance(default, Known):
                    if function.command_line:
                        note = f"default of --{parameter.arg} of {name}()"
                        default = replace(default, source=Provenance.CLI_DEFAULT, note=note)
                    else:
                        note = f"default of parameter `{parameter.arg}` of {name}()"
                        default = replace(default, note=_combine_notes(default.note, note))
                local.bind(parameter.arg, default)
            else:
                local.bind(parameter.arg, Unknown(f"parameter `{parameter.arg}` of {name}()"))
        if arguments.vararg is not None:
            local.bind(arguments.vararg.arg, ListValue(given_positional[len(positional) :], None))
        if arguments.kwarg is not None:
            local.bind(arguments.kwarg.arg, DictValue(given_keywords, None))

    def instantiate(self, cls: DataclassClass, args: CallArgs) -> Value:
        fields = dict(cls.fields)
        fields.update(args.keywords)
        if cls.config_class is not None:
            config = ConfigObject(cls.config_class, cls.name, args.node, fields, list(args.unread))
            self.configs.append(config)
            return config
        return DataclassInstance(cls.name, fields)

    def call_symbol(self, callee: Symbol, args: CallArgs) -> Value:
        name, leaf, owner = callee.name, callee.leaf, callee.owner
        node = args.node
        if leaf == "from_pretrained":
            return self.load_pretrained(callee, args)
        if leaf == "from_config" and _is_model_class(owner):
            config = args.get("config", 0)
            model_id: Value = Unknown("a model built from a config")
            if isinstance(config, PretrainedConfigObject):
                model_id = config.model_id
            return self.new_model(node, model_id, args.keywords)
        if leaf in TRAINER_CONFIG_CLASSES:
            config = ConfigObject(leaf, leaf, node, dict(args.keywords), list(args.unread))
            self.configs.append(config)
            return config
        if leaf in TRAINER_CLASSES:
            return self.make_trainer(leaf, args)
        if leaf == "LoraConfig":
            lora = LoraObject(node, dict(args.keywords), list(args.unread))
            self.loras.append(lora)
            return lora
        if leaf == "BitsAndBytesConfig":
            quant = QuantObject(node, dict(args.keywords))
            self.quants.append(quant)
            return quant
        if leaf == "get_peft_model":
            return self.attach_adapter(args, unsloth=owner in _UNSLOTH_LOADERS)
        if leaf == "prepare_model_for_kbit_training":
            return self.prepare_kbit(args)
        if leaf == "pipeline":
            return self.load_pipeline(args)
        if leaf == "DataLoader":
            batch = args.get("batch_size", 1)
            if batch is None:
                batch = Known(1, node, Provenance.DEFAULT, "torch DataLoader default")
            loader = DataLoaderObject(batch)
            self.data_loaders.append(loader)
            return loader
        if leaf in ("HfArgumentParser", "TrlParser"):
            classes = args.get("dataclass_types", 0)
            items = (
                classes.items if isinstance(classes, ListValue) else [classes] if classes else []
            )
            return ArgumentsParserObject(list(items), node)
        if name in ("argparse.ArgumentParser", "ArgumentParser"):
            return ArgParserObject()
        if name in ("os.environ.get", "os.getenv", "os.environ.setdefault"):
            return self.environment_default(args)
        if leaf in ("autocast",) and ("torch" in name or "amp" in name):
            self.read_autocast(args, name)
            return Unknown("an autocast context")
        if leaf == "Accelerator":
            self.read_accelerator(args)
            return Unknown("an Accelerator")
        if name in ("fire.Fire", "typer.run") and args.positional:
            target = args.positional[0]
            if isinstance(target, FunctionValue):
                target.command_line = True
                return self.call_function(target, None, None)
            return Unknown("a command-line program")
        builtin = self.call_builtin(name, args)
        if builtin is not None:
            return builtin
        optim = optim_for_optimizer_class(name, fused=self._is_true(args.get("fused")))
        if optim is not None and leaf[:1].isupper():
            optimizer = OptimizerObject(Known(optim, callee.node))
            self.optimizers.append(optimizer)
            return optimizer
        return Unknown(f"the result of {name}()")

    def _is_true(self, value: Value | None) -> bool:
        return value is not None and _truth(value) is True

    def call_builtin(self, name: str, args: CallArgs) -> Value | None:
        first = args.positional[0] if args.positional else None
        if name in ("int", "float", "str", "bool") and first is not None:
            known = settle(first)
            if known is None:
                return Unknown(f"{name}() of a value not known")
            converter: Any = {"int": int, "float": float, "str": str, "bool": bool}[name]
            try:
                return replace(known, value=converter(known.value))
            except Exception:
                return Unknown(f"{name}() of {known.value!r}")
        if name == "dict":
            result = DictValue({}, args.node, list(args.unread))
            if first is not None:
                self._merge_into(result, first, args.node.args[0])
            result.entries.update(args.keywords)
            return result
        if name in ("list", "tuple") and isinstance(first, ListValue):
            return ListValue(list(first.items), args.node)
        if name in ("min", "max") and args.positional:
            values = (
                args.positional[0].items
                if len(args.positional) == 1 and isinstance(args.positional[0], ListValue)
                else args.positional
            )
            candidates = [settle(value) for value in values]
            numbers = [
                item
                for item in candidates
                if item is not None
                and isinstance(item.value, (int, float))
                and not isinstance(item.value, bool)
            ]
            if not numbers or len(numbers) != len(candidates):
                return Unknown(f"{name}() of values not known")
            choose = min if name == "min" else max
            return choose(numbers, key=lambda item: float(item.value))  # type: ignore[arg-type]
        if name == "getattr" and len(args.positional) >= 2:
            attribute = settle(args.positional[1])
            if attribute is not None and isinstance(attribute.value, str):
                owner = args.positional[0]
                found = self._attribute_of(owner, attribute.value)
                if isinstance(found, Unknown) and len(args.positional) >= 3:
                    return args.positional[2]
                return found
        if name == "vars" and isinstance(first, NamespaceObject):
            return DictValue(dict(first.attributes), args.node)
        if name == "len" and isinstance(first, ListValue):
            return Known(len(first.items), args.node)
        return None

    def _attribute_of(self, owner: Value, name: str) -> Value:
        if isinstance(owner, Symbol):
            return Symbol(f"{owner.name}.{name}", owner.node)
        if isinstance(owner, NamespaceObject):
            return owner.attributes.get(name, Unknown(f"no argument {name}"))
        if isinstance(owner, (DataclassInstance, ConfigObject)):
            return owner.fields.get(name, Unknown(name))
        return Unknown(name)

    def environment_default(self, args: CallArgs) -> Value:
        variable = settle(args.get("key", 0))
        label = variable.value if variable is not None else "?"
        default = args.get("default", 1)
        if default is None:
            return Known(
                None, args.node, Provenance.EXPLICIT, f"environment variable {label} unset"
            )
        if isinstance(default, Known):
            # like a command-line default: the launch can change it without editing the file
            note = f"default of environment variable {label}"
            return replace(
                default, source=Provenance.CLI_DEFAULT, note=_combine_notes(default.note, note)
            )
        return default

    def call_method(self, owner: Value, method: str, args: CallArgs) -> Value:
        if isinstance(owner, Unknown):
            return Unknown(owner.reason)
        if isinstance(owner, ModelObject):
            return self.model_method(owner, method, args)
        if isinstance(owner, TokenizerObject):
            if method in (
                "__call__",
                "encode",
                "encode_plus",
                "batch_encode_plus",
                "apply_chat_template",
            ):
                self.read_tokenizer_call(args)
            return Unknown("tokenized text")
        if isinstance(owner, DictValue):
            return self.dict_method(owner, method, args)
        if isinstance(owner, ArgParserObject):
            return self.argparse_method(owner, method, args)
        if isinstance(owner, ArgumentsParserObject):
            return self.dataclass_parser_method(owner, method, args)
        if isinstance(owner, ListValue) and method == "copy":
            return ListValue(list(owner.items), args.node)
        if isinstance(owner, FunctionValue) and method in ("__call__",):
            return self.call_function(owner, args, args.node)
        return Unknown(f"the result of .{method}()")

    def model_method(self, model: ModelObject, method: str, args: CallArgs) -> Value:
        node = args.node
        if method in ("gradient_checkpointing_enable", "activation_checkpointing_enable"):
            model.checkpointing = Known(True, node)
        elif method in ("gradient_checkpointing_disable", "activation_checkpointing_disable"):
            model.checkpointing = Known(False, node)
        elif method in ("half", "bfloat16", "float"):
            dtype = {"half": "float16", "bfloat16": "bfloat16", "float": "float32"}[method]
            model.dtype = Known(dtype, node)
        elif method == "to":
            for value in [*args.positional, args.keywords.get("dtype")]:
                known = settle(value) if value is not None else None
                if known is not None and normalize_dtype(known.value) in (
                    "bfloat16",
                    "float16",
                    "float32",
                ):
                    model.dtype = known
        elif method in ("add_adapter", "load_adapter"):
            adapter = args.get("adapter_config", 0) or args.get("peft_config", 0)
            if isinstance(adapter, LoraObject):
                adapter.used = True
                model.lora = adapter
        elif method not in _MODEL_METHODS_RETURNING_THE_MODEL:
            return Unknown(f"the result of model.{method}()")
        return model

    def dict_method(self, owner: DictValue, method: str, args: CallArgs) -> Value:
        if method == "update":
            for positional, node in zip(args.positional, args.node.args, strict=False):
                self._merge_into(owner, positional, node)
            owner.entries.update(args.keywords)
            return Known(None, args.node)
        if method in ("get", "pop"):
            key = settle(args.positional[0]) if args.positional else None
            if key is not None and isinstance(key.value, str):
                if key.value in owner.entries:
                    found = owner.entries[key.value]
                    if method == "pop":
                        del owner.entries[key.value]
                    return found
                if len(args.positional) > 1:
                    return args.positional[1]
                return Known(None, args.node)
            return Unknown("a key not known")
        if method == "setdefault":
            key = settle(args.positional[0]) if args.positional else None
            if key is not None and isinstance(key.value, str):
                default = args.positional[1] if len(args.positional) > 1 else Known(None, None)
                return owner.entries.setdefault(key.value, default)
        if method == "copy":
            return DictValue(dict(owner.entries), args.node, list(owner.unread))
        return Unknown(f"dict.{method}()")

    # -- argparse and dataclass parsers ------------------------------------------------------

    def argparse_method(self, parser: ArgParserObject, method: str, args: CallArgs) -> Value:
        if method == "add_argument":
            self.add_argument(parser, args)
        elif method in ("add_argument_group", "add_mutually_exclusive_group"):
            return parser
        elif method == "set_defaults":
            for name, value in args.keywords.items():
                if isinstance(value, Known):
                    value = replace(value, source=Provenance.CLI_DEFAULT, note=f"default of {name}")
                parser.arguments[name] = value
        elif method in ("parse_args", "parse_known_args", "parse_intermixed_args"):
            namespace = NamespaceObject(dict(parser.arguments))
            if method == "parse_known_args":
                return ListValue([namespace, Unknown("other arguments")], args.node)
            return namespace
        return Unknown(f"parser.{method}()")

    def add_argument(self, parser: ArgParserObject, args: CallArgs) -> None:
        flags = [settle(value) for value in args.positional]
        names = [flag.value for flag in flags if flag is not None and isinstance(flag.value, str)]
        if not names:
            return
        long_flags = [name for name in names if name.startswith("--")]
        flag = long_flags[0] if long_flags else names[0]
        destination = settle(args.keywords.get("dest")) if "dest" in args.keywords else None
        dest = (
            str(destination.value)
            if destination is not None
            else flag.lstrip("-").replace("-", "_")
        )
        action = settle(args.keywords.get("action")) if "action" in args.keywords else None
        action_name = action.value if action is not None else None
        value: Value
        if "default" in args.keywords:
            value = args.keywords["default"]
            if isinstance(value, Known):
                converted = value.value
                kind = args.keywords.get("type")
                if isinstance(kind, Symbol) and isinstance(converted, str):
                    try:
                        converted = {"int": int, "float": float}.get(kind.name, str)(converted)
                    except ValueError:
                        pass
                value = replace(
                    value,
                    value=converted,
                    source=Provenance.CLI_DEFAULT,
                    note=_combine_notes(value.note, f"default of {flag}"),
                )
        elif action_name in ("store_true", "store_false"):
            value = Known(
                action_name == "store_false",
                args.node,
                Provenance.CLI_DEFAULT,
                f"{flag} not given",
            )
        elif flag.startswith("-"):
            value = Known(None, args.node, Provenance.CLI_DEFAULT, f"{flag} has no default")
        else:
            value = Unknown(f"the command-line argument {flag}")
        parser.arguments[dest] = value
        if dest.lower() in _SEQUENCE_NAMES and isinstance(value, Known):
            if isinstance(value.value, int) and not isinstance(value.value, bool):
                self.command_line_lengths.append(value)

    def dataclass_parser_method(
        self, parser: ArgumentsParserObject, method: str, args: CallArgs
    ) -> Value:
        reading = {
            "parse_args_into_dataclasses": "",
            "parse_args_and_config": "",
            "parse_args": "",
            "parse_yaml_file": "a YAML file",
            "parse_json_file": "a JSON file",
            "parse_dict": "",
        }
        if method not in reading:
            return Unknown(f"parser.{method}()")
        given = args.get("args", 0) if method == "parse_dict" else None
        overrides = given.entries if isinstance(given, DictValue) else {}
        if reading[method]:
            self.problem(
                args.node,
                f"arguments come from {reading[method]} read at run time; llmmem shows the "
                "dataclass defaults",
            )
        instances: list[Value] = []
        for item in parser.classes:
            instances.append(self.parsed_instance(item, parser.node, overrides))
        return ListValue(instances, args.node)

    def parsed_instance(self, item: Value, node: ast.Call, overrides: dict[str, Value]) -> Value:
        owner = item.name if isinstance(item, DataclassClass) else "arguments"

        def command_line(fields: dict[str, Value]) -> dict[str, Value]:
            result: dict[str, Value] = {}
            for name, value in fields.items():
                if isinstance(value, Known) and value.source is Provenance.EXPLICIT:
                    note = f"default of --{name} ({owner}.{name})"
                    value = replace(value, source=Provenance.CLI_DEFAULT, note=note)
                    if name.lower() in _SEQUENCE_NAMES and isinstance(value.value, int):
                        self.command_line_lengths.append(value)
                result[name] = value
            result.update(overrides)
            return result

        if isinstance(item, DataclassClass):
            fields = command_line(item.fields)
            if item.config_class is not None:
                config = ConfigObject(
                    item.config_class, item.name, node, fields, from_command_line=True
                )
                self.configs.append(config)
                return config
            return DataclassInstance(item.name, fields)
        if isinstance(item, Symbol) and item.leaf in TRAINER_CONFIG_CLASSES:
            config = ConfigObject(
                item.leaf, item.leaf, node, dict(overrides), from_command_line=True
            )
            self.configs.append(config)
            return config
        return Unknown("arguments from the command line")

    # -- models, adapters, trainers ----------------------------------------------------------

    def new_model(
        self, node: ast.Call, model_id: Value, keywords: dict[str, Value], loader: str = ""
    ) -> ModelObject:
        model = ModelObject(node, model_id, keywords, loader or "transformers")
        quantization = keywords.get("quantization_config")
        if isinstance(quantization, QuantObject):
            quantization.used = True
        self.models.append(model)
        return model

    def load_pretrained(self, callee: Symbol, args: CallArgs) -> Value:
        owner = callee.owner
        node = args.node
        model_id = args.get("pretrained_model_name_or_path", 0)
        if owner in _UNSLOTH_LOADERS:
            self.unsloth = True
            model_id = args.get("model_name", 0)
            model = self.new_model(
                node, model_id or Unknown("unsloth's default model"), args.keywords, "unsloth"
            )
            return ListValue([model, TokenizerObject(node)], node)
        if owner in _PEFT_MODEL_CLASSES:
            base = args.get("model", 0)
            adapter = LoraObject(
                node,
                {},
                [],
                used=True,
                default_note="a trained adapter: its settings are in adapter_config.json",
            )
            self.loras.append(adapter)
            if isinstance(base, ModelObject):
                base.lora = adapter
                return base
            return Unknown("a PEFT model")
        if owner.startswith("AutoPeftModel"):
            model = self.new_model(
                node, model_id or Unknown("no model id"), args.keywords, "peft-adapter"
            )
            adapter = LoraObject(
                node,
                {},
                [],
                used=True,
                default_note="a trained adapter: its settings are in adapter_config.json",
            )
            self.loras.append(adapter)
            model.lora = adapter
            return model
        if "Tokenizer" in owner or "Processor" in owner:
            tokenizer = TokenizerObject(node, args.keywords.get("model_max_length"))
            self.tokenizers.append(tokenizer)
            return tokenizer
        if owner.endswith("Config"):
            return PretrainedConfigObject(model_id or Unknown("no model id"), node)
        if _is_model_class(owner):
            return self.new_model(node, model_id or Unknown("no model id"), args.keywords)
        return Unknown(f"the result of {callee.name}()")

    def load_pipeline(self, args: CallArgs) -> Value:
        model = args.get("model", 1)
        if isinstance(model, ModelObject):
            return model
        if model is None:
            return Unknown("a pipeline with the task's default model")
        return self.new_model(args.node, model, args.keywords, "pipeline")

    def attach_adapter(self, args: CallArgs, *, unsloth: bool) -> Value:
        model = args.get("model", 0)
        if unsloth:
            lora = LoraObject(
                args.node,
                dict(args.keywords),
                list(args.unread),
                defaults=_UNSLOTH_LORA_DEFAULTS,
                default_note="unsloth get_peft_model default",
                used=True,
            )
            self.loras.append(lora)
            if isinstance(model, ModelObject):
                checkpointing = args.keywords.get("use_gradient_checkpointing")
                if checkpointing is None:
                    model.checkpointing = Known(
                        True,
                        args.node,
                        Provenance.DEFAULT,
                        "unsloth get_peft_model default (use_gradient_checkpointing='unsloth')",
                    )
                else:
                    known = settle(checkpointing)
                    if known is not None:
                        turned_on = known.value is True or known.value == "unsloth"
                        note = (
                            "unsloth's offloaded checkpointing" if known.value == "unsloth" else ""
                        )
                        model.checkpointing = replace(
                            known, value=turned_on, note=_combine_notes(known.note, note)
                        )
        else:
            lora_value = args.get("peft_config", 1)
            if isinstance(lora_value, LoraObject):
                lora = lora_value
            else:
                lora = LoraObject(
                    args.node,
                    {},
                    [],
                    used=True,
                    default_note="the adapter config passed to get_peft_model could not be read",
                )
                self.loras.append(lora)
            lora.used = True
        if isinstance(model, ModelObject):
            model.lora = lora
            return model
        return Unknown("a PEFT model")

    def prepare_kbit(self, args: CallArgs) -> Value:
        model = args.get("model", 0)
        self.kbit_calls.append(args.node)
        if not isinstance(model, ModelObject):
            return Unknown("a prepared model")
        model.kbit_prepared = args.node
        checkpointing = args.get("use_gradient_checkpointing", 1)
        if checkpointing is None:
            model.checkpointing = Known(
                True,
                args.node,
                Provenance.DEFAULT,
                "prepare_model_for_kbit_training enables it (use_gradient_checkpointing=True)",
            )
        else:
            known = settle(checkpointing)
            if known is not None:
                model.checkpointing = known
        return model

    def make_trainer(self, class_name: str, args: CallArgs) -> TrainerObject:
        trainer = TrainerObject(class_name, args)
        self.trainers.append(trainer)
        peft = args.get("peft_config")
        if isinstance(peft, LoraObject):
            peft.used = True
        return trainer

    def read_tokenizer_call(self, args: CallArgs) -> None:
        length = args.keywords.get("max_length")
        known = settle(length) if length is not None else None
        if known is not None and isinstance(known.value, int) and not isinstance(known.value, bool):
            self.tokenizer_lengths.append(
                replace(known, note=_combine_notes(known.note, "tokenizer max_length"))
            )

    def read_autocast(self, args: CallArgs, name: str) -> None:
        enabled = args.keywords.get("enabled")
        if enabled is not None and _truth(enabled) is False:
            return
        dtype_value = args.get("dtype", 1 if name.endswith("torch.autocast") else None)
        if dtype_value is None:
            device = settle(args.get("device_type", 0))
            if device is not None and device.value == "cpu":
                return
            self.precision_flags.append(
                ("fp16", Known(True, args.node, Provenance.DEFAULT, "autocast on CUDA: float16"))
            )
            return
        known = settle(dtype_value)
        dtype = normalize_dtype(known.value) if known is not None else None
        if known is not None and dtype in ("bfloat16", "float16"):
            flag = "bf16" if dtype == "bfloat16" else "fp16"
            self.precision_flags.append((flag, replace(known, value=True, note="autocast")))

    def read_accelerator(self, args: CallArgs) -> None:
        mixed = settle(args.keywords.get("mixed_precision"))
        if mixed is not None and mixed.value in ("bf16", "fp16"):
            self.precision_flags.append((str(mixed.value), replace(mixed, value=True)))
        accumulation = settle(args.keywords.get("gradient_accumulation_steps"))
        if accumulation is not None:
            self.accumulation.append(accumulation)


def _as_load(target: ast.expr) -> ast.expr:
    """The target of `x += 1` read as an expression."""
    if isinstance(target, ast.Name):
        return ast.copy_location(ast.Name(id=target.id, ctx=ast.Load()), target)
    return target


# -- from objects to the plan ----------------------------------------------------------------


class PlanEmitter:
    """Feeds what `ScriptReader` found to a PlanBuilder, choosing the objects that reach the
    trainer: its `args`, its `model`, its `peft_config`, its optimizer."""

    def __init__(self, reader: ScriptReader, builder: PlanBuilder) -> None:
        self.reader = reader
        self.builder = builder
        self.source = reader.source

    def pragma_gives(self, key: str) -> bool:
        found = self.builder.get(key)
        return found is not None and found.source is Provenance.PRAGMA

    def set_known(self, key: str, known: Known, note: str = "") -> None:
        self.builder.set(
            key,
            known.value,
            known.source,
            self.source.range_of(known.node),
            _combine_notes(known.note, note),
        )

    def unread(
        self, label: str, value: Value, node: ast.AST | None = None, key: str | None = None
    ) -> None:
        """A line in `problems` for a value that matters but could not be read, unless a
        pragma already gives it."""
        if key is not None and self.pragma_gives(key):
            return
        reason = value.reason if isinstance(value, Unknown) else "not a plain value"
        where = value.node if isinstance(value, Unknown) and value.node is not None else node
        text = self.source.text_of(where) if where is not None else ""
        written = f"`{text}`" if text else "the value"
        self.reader.problem(where, f"{label}: could not read {written} ({reason})")

    def emit(self) -> tuple[str, str]:
        """Feed the builder; returns (framework, config class for the defaults)."""
        reader = self.reader
        trainer = reader.trainers[0] if reader.trainers else None
        config = self.pick_config(trainer)
        model, model_string = self.pick_model(trainer)

        # sequence-length hints from the tokenizer come first: the config's own values win
        for tokenizer in reader.tokenizers:
            known = settle(tokenizer.model_max_length)
            if known is not None and isinstance(known.value, int) and known.value < 1_000_000:
                self.set_known("max_seq_length", known, "tokenizer model_max_length")
        for length in reader.tokenizer_lengths:
            self.set_known("max_seq_length", length)
        for flag, known in reader.precision_flags:
            self.set_known(flag, known)
        for known in reader.accumulation:
            self.set_known("gradient_accumulation_steps", known)

        if model is not None:
            self.emit_model(model)
        elif model_string is not None:
            self.builder.model_range = self.source.range_of(model_string.node)
            self.set_known("model_id", model_string)
        if trainer is not None:
            self.emit_trainer_keywords(trainer)
        if config is not None:
            self.builder.trainer_range = self.source.range_of(config.node)
            self.emit_config(config, model_loaded_by_trainer=model is None)
        elif trainer is not None:
            self.builder.trainer_range = self.source.range_of(trainer.args.node)
        if model is not None:
            self.emit_model_switches(model)
        self.emit_adapter(trainer, model)
        self.emit_quantization(model)
        self.emit_optimizer(trainer, config)
        if config is None and trainer is None:
            self.emit_plain_loop()
        self.emit_sequence_hints()

        framework = "hf"
        if (trainer is not None and trainer.class_name in TRL_TRAINER_CLASSES) or (
            config is not None and config.class_name in TRL_CONFIG_CLASSES
        ):
            framework = "trl"
        if config is not None:
            config_class = config.class_name
        elif trainer is not None:
            config_class = TRAINER_CLASSES[trainer.class_name][0]
        else:
            config_class = "none"
        if reader.unsloth:
            self.builder.set("unsloth", True, Provenance.EXPLICIT, None)
        if trainer is not None:
            self.builder.set(
                "trainer",
                trainer.class_name,
                Provenance.EXPLICIT,
                self.source.range_of(trainer.args.node),
            )
        return framework, config_class

    # -- choices -----------------------------------------------------------------------------

    def pick_config(self, trainer: TrainerObject | None) -> ConfigObject | None:
        if trainer is not None:
            index = TRAINER_CLASSES[trainer.class_name][1]
            given = trainer.args.get("args", index)
            if isinstance(given, ConfigObject):
                return given
            if given is not None and not (isinstance(given, Known) and given.value is None):
                self.unread(f"{trainer.class_name}(args=...)", given, trainer.args.node)
                return self.reader.configs[0] if self.reader.configs else None
            return None
        return self.reader.configs[0] if self.reader.configs else None

    def pick_model(self, trainer: TrainerObject | None) -> tuple[ModelObject | None, Known | None]:
        reader = self.reader
        if trainer is not None:
            given = trainer.args.get("model", 0)
            if isinstance(given, ModelObject):
                self.note_reference_model(trainer, given)
                return given, None
            known = settle(given) if given is not None else None
            if known is not None and isinstance(known.value, str):
                return None, known
        models = [model for model in reader.models if model.loader != "pipeline"] or reader.models
        if not models:
            return None, None
        if trainer is not None:
            self.note_reference_model(trainer, models[0])
        return models[0], None

    def note_reference_model(self, trainer: TrainerObject, model: ModelObject) -> None:
        reference = trainer.args.get("ref_model", 1 if trainer.class_name == "DPOTrainer" else None)
        if isinstance(reference, ModelObject) and reference is not model:
            known = settle(reference.model_id)
            if known is not None and isinstance(known.value, str):
                self.set_known("ref_model_id", known)

    # -- the model ---------------------------------------------------------------------------

    def emit_model(self, model: ModelObject) -> None:
        builder = self.builder
        builder.model_range = self.source.range_of(model.call)
        known = settle(model.model_id)
        if self.pragma_gives("model_id"):
            pass
        elif known is not None and isinstance(known.value, str):
            note = (
                "a PEFT adapter: the base model is named in its adapter_config.json"
                if model.loader == "peft-adapter"
                else ""
            )
            self.set_known("model_id", known, note)
        else:
            reason = (
                known.note
                if known is not None and known.note
                else model.model_id.reason
                if isinstance(model.model_id, Unknown)
                else "not a string"
            )
            text = self.source.text_of(model.call.args[0] if model.call.args else model.call)
            self.reader.problem(
                model.call,
                f"model id: could not read `{text}` ({reason}); "
                "add `# llmmem: model=<hub id or local path>`",
            )
        self.emit_loading_keywords(model.keywords, model.loader)
        if model.dtype is not None:
            dtype = normalize_dtype(model.dtype.value)
            if dtype is not None:
                self.set_known("torch_dtype", replace(model.dtype, value=dtype))

    def emit_loading_keywords(self, keywords: dict[str, Value], loader: str) -> None:
        for name in ("torch_dtype", "dtype"):
            if name not in keywords:
                continue
            known = settle(keywords[name])
            if known is None:
                self.unread(name, keywords[name])
            elif known.value is None and loader == "unsloth":
                self.set_known(
                    "torch_dtype",
                    replace(known, value="bfloat16", source=Provenance.ASSUMED),
                    "unsloth picks bfloat16 on Ampere or newer GPUs (float16 before)",
                )
            elif normalize_dtype(known.value) is not None:
                self.set_known("torch_dtype", replace(known, value=normalize_dtype(known.value)))
        if loader == "unsloth" and "dtype" not in keywords and "torch_dtype" not in keywords:
            self.builder.set(
                "torch_dtype",
                "bfloat16",
                Provenance.ASSUMED,
                self.builder.model_range,
                "unsloth picks bfloat16 on Ampere or newer GPUs (float16 before)",
            )
        attention = keywords.get("attn_implementation")
        if attention is not None:
            known = settle(attention)
            if known is not None:
                self.set_known("attn_implementation", known)
        flash = keywords.get("use_flash_attention_2")
        if flash is not None and _truth(flash):
            known = settle(flash)
            if known is not None:
                self.set_known("attn_implementation", replace(known, value="flash_attention_2"))
        cache = settle(keywords.get("use_cache")) if "use_cache" in keywords else None
        if cache is not None:
            self.set_known("use_cache", cache)
        if loader == "unsloth":
            length = keywords.get("max_seq_length")
            if length is not None:
                known = settle(length)
                if known is not None:
                    self.set_known("max_seq_length", known)
                else:
                    self.unread("max_seq_length", length)

    def emit_model_switches(self, model: ModelObject) -> None:
        """What later calls on the model turned on; set after the trainer's arguments, because
        `model.gradient_checkpointing_enable()` stays on whatever the arguments say."""
        if model.checkpointing is not None:
            self.set_known("gradient_checkpointing", model.checkpointing)
        if model.use_cache is not None:
            self.set_known("use_cache", model.use_cache)
        if model.attention is not None:
            self.set_known("attn_implementation", model.attention)

    # -- the trainer and its arguments -------------------------------------------------------

    def emit_trainer_keywords(self, trainer: TrainerObject) -> None:
        for name in ("max_seq_length", "max_length"):
            value = trainer.args.keywords.get(name)
            if value is None:
                continue
            known = settle(value)
            if known is not None and known.value is not None:
                self.set_known("max_seq_length", known)

    def emit_config(self, config: ConfigObject, *, model_loaded_by_trainer: bool) -> None:
        for description in config.unread:
            self.reader.problem(
                config.node, f"{config.declared_name}: could not read {description}"
            )
        for name, value in config.fields.items():
            self.emit_config_field(config, name, value, model_loaded_by_trainer)

    def emit_config_field(
        self, config: ConfigObject, name: str, value: Value, model_loaded_by_trainer: bool
    ) -> None:
        if name == "deepspeed":
            self.emit_deepspeed(value)
            return
        if name == "fsdp":
            self.emit_fsdp(value)
            return
        if name == "model_init_kwargs":
            if model_loaded_by_trainer and isinstance(value, DictValue):
                self.emit_loading_keywords(value.entries, "trl")
            return
        if name == "loss_type":
            known = settle(value)
            if known is not None and isinstance(known.value, str):
                loss = "chunked" if "chunk" in known.value else "standard"
                self.set_known("loss", replace(known, value=loss))
            return
        flag = flag_setting(name)
        if flag is not None:
            known = settle(value)
            if known is not None and _truth(known):
                key, meaning = flag
                self.set_known(key, replace(known, value=meaning))
            return
        canonical = canonical_key(name)
        if canonical is None or canonical == "model_id":
            return
        known = settle(value)
        if known is None:
            self.unread(f"{config.declared_name}.{name}", value, config.node, canonical)
            return
        if known.value is None:
            return  # None means "not set" for every key read here
        self.set_known(canonical, known)

    def emit_deepspeed(self, value: Value) -> None:
        known = settle(value)
        if known is None:
            self.unread("deepspeed", value)
            return
        if isinstance(known.value, dict):
            self.builder.set(
                "distributed.deepspeed_config",
                "<inline dict>",
                known.source,
                self.source.range_of(known.node),
                known.note,
            )
            self.emit_deepspeed_settings(known.value, known, "")
            return
        if not isinstance(known.value, str) or not known.value:
            return
        self.set_known("distributed.deepspeed_config", known)
        config_path = Path(known.value)
        if not config_path.is_absolute():
            config_path = self.reader.path.parent / config_path
        try:
            data = read_file_bytes(config_path, MAX_DEEPSPEED_CONFIG_BYTES)
            document = json.loads(data.decode("utf-8", errors="replace"))
        except (OSError, ValueError) as err:
            reason = str(err) if isinstance(err, UnreadableFile) else type(err).__name__
            self.reader.problem(
                known.node,
                f"DeepSpeed config {known.value} could not be read ({reason}); "
                "ZeRO stage unknown, assumed off",
            )
            return
        if isinstance(document, dict):
            config_known = replace(known, source=Provenance.CONFIG)
            self.emit_deepspeed_settings(document, config_known, f"from {known.value}")

    def emit_deepspeed_settings(self, document: dict[Any, Any], origin: Known, note: str) -> None:
        zero = document.get("zero_optimization")
        if not isinstance(zero, dict):
            return
        stage = zero.get("stage")
        if isinstance(stage, int) and not isinstance(stage, bool):
            self.set_known("distributed.zero_stage", replace(origin, value=stage), note)
        for section, key in (
            ("offload_optimizer", "distributed.offload_optimizer"),
            ("offload_param", "distributed.offload_params"),
        ):
            offload = zero.get(section)
            if isinstance(offload, dict):
                device = str(offload.get("device", "none")).lower()
                self.set_known(key, replace(origin, value=device in ("cpu", "nvme")), note)
        for name, key in (
            ("reduce_bucket_size", "reduce_bucket_size"),
            ("overlap_comm", "overlap_comm"),
            ("contiguous_gradients", "contiguous_gradients"),
            ("stage3_max_reuse_distance", "max_reuse_distance"),
            ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
            ("stage3_param_persistence_threshold", "param_persistence_threshold"),
        ):
            if name in zero:
                self.set_known(f"distributed.{key}", replace(origin, value=zero[name]), note)

    def emit_fsdp(self, value: Value) -> None:
        known = settle(value)
        if known is None:
            self.unread("fsdp", value)
            return
        if not known.value:
            return
        sharding, offload = normalize_fsdp(known.value)
        if sharding is None:
            self.reader.problem(known.node, f"fsdp: cannot read {known.value!r}")
            return
        self.set_known("distributed.fsdp", replace(known, value=sharding))
        if offload:
            self.set_known("distributed.offload_params", replace(known, value=True))
            self.set_known("distributed.offload_optimizer", replace(known, value=True))

    # -- adapters, quantization, optimizers, loops --------------------------------------------

    def emit_adapter(self, trainer: TrainerObject | None, model: ModelObject | None) -> None:
        lora: LoraObject | None = None
        note = ""
        if trainer is not None:
            given = trainer.args.get("peft_config")
            if isinstance(given, LoraObject):
                lora = given
        if lora is None and model is not None and model.lora is not None:
            lora = model.lora
        if lora is None:
            unused = [item for item in self.reader.loras if not item.used]
            if len(unused) == 1:
                lora = unused[0]
                note = "this LoraConfig is not passed to anything llmmem follows; assumed used"
        if lora is None:
            return
        builder = self.builder
        builder.lora_range = self.source.range_of(lora.call)
        builder.set(
            "lora.enabled",
            True,
            Provenance.EXPLICIT,
            builder.lora_range,
            _combine_notes(lora.default_note, note),
        )
        for description in lora.unread:
            self.reader.problem(lora.call, f"LoRA settings: could not read {description}")
        for name, value in lora.fields.items():
            key = lora_key(name)
            if key is None:
                continue
            known = settle(value)
            if known is None:
                self.unread(f"LoRA {name}", value, lora.call)
                continue
            if key == "lora.target_modules" and known.value is None:
                continue
            self.set_known(key, known, note)
        for key, default in lora.defaults.items():
            builder.set(key, default, Provenance.DEFAULT, builder.lora_range, lora.default_note)

    def emit_quantization(self, model: ModelObject | None) -> None:
        builder = self.builder
        quant: QuantObject | None = None
        note = ""
        keywords = model.keywords if model is not None else {}
        given = keywords.get("quantization_config")
        if isinstance(given, QuantObject):
            quant = given
        elif given is not None and not (isinstance(given, Known) and given.value is None):
            self.unread("quantization_config", given, model.call if model else None)
        if quant is None and given is None:
            unused = [item for item in self.reader.quants if not item.used]
            if len(unused) == 1:
                quant = unused[0]
                note = "this BitsAndBytesConfig is not passed to anything llmmem follows"
        fields: dict[str, Value] = dict(keywords)
        if quant is not None:
            fields = quant.fields
            builder.quantization_range = self.source.range_of(quant.call)
        for name, value in fields.items():
            flag = flag_setting(name)
            if flag is not None and flag[0] == "quantization.bits":
                known = settle(value)
                if known is not None and known.value is True:
                    self.set_known("quantization.bits", replace(known, value=flag[1]), note)
                    if builder.quantization_range is None:
                        builder.quantization_range = self.source.range_of(known.node)
                continue
            key = canonical_key(name)
            if key is None or not key.startswith("quantization."):
                continue
            known = settle(value)
            if known is None:
                self.unread(name, value)
                continue
            if key == "quantization.compute_dtype":
                dtype = normalize_dtype(known.value)
                if dtype is None:
                    continue
                known = replace(known, value=dtype)
            if key == "quantization.quant_storage":
                storage = normalize_quant_storage(known.value)
                if storage is None:
                    self.unread(name, value)
                    continue
                known = replace(known, value=storage)
            self.set_known(key, known, note)
        if model is not None and model.loader == "unsloth" and builder.has("quantization.bits"):
            where = builder.quantization_range
            unsloth_note = "unsloth's 4-bit loading"
            builder.set("quantization.quant_type", "nf4", Provenance.DEFAULT, where, unsloth_note)
            builder.set("quantization.double_quant", True, Provenance.DEFAULT, where, unsloth_note)
            weights = builder.get("torch_dtype")
            compute = (
                weights.value if weights is not None and weights.value != "auto" else "bfloat16"
            )
            builder.set(
                "quantization.compute_dtype", compute, Provenance.DEFAULT, where, unsloth_note
            )
        kbit = model.kbit_prepared if model is not None else None
        if kbit is None and self.reader.kbit_calls:
            kbit = self.reader.kbit_calls[0]
        if kbit is not None:
            builder.set(
                "quantization.prepare_for_kbit_training",
                True,
                Provenance.EXPLICIT,
                self.source.range_of(kbit),
            )

    def emit_optimizer(self, trainer: TrainerObject | None, config: ConfigObject | None) -> None:
        chosen: OptimizerObject | None = None
        if trainer is not None:
            optimizers = trainer.args.get("optimizers")
            if isinstance(optimizers, ListValue) and optimizers.items:
                first = optimizers.items[0]
                if isinstance(first, OptimizerObject):
                    chosen = first
                elif not (isinstance(first, Known) and first.value is None):
                    self.unread("optimizers", first, trainer.args.node)
            pair = trainer.args.get("optimizer_cls_and_kwargs")
            if isinstance(pair, ListValue) and pair.items and isinstance(pair.items[0], Symbol):
                name = optim_for_optimizer_class(pair.items[0].name)
                if name is not None:
                    chosen = OptimizerObject(Known(name, pair.items[0].node))
        elif config is None and self.reader.optimizers:
            chosen = self.reader.optimizers[0]
        if chosen is not None:
            self.set_known("optim", chosen.optim, "an optimizer built in the script")

    def emit_plain_loop(self) -> None:
        loaders = self.reader.data_loaders
        if loaders:
            batch = loaders[0].batch_size
            known = settle(batch)
            if known is not None:
                self.set_known("per_device_train_batch_size", known)
            else:
                self.unread("DataLoader batch_size", batch)

    def emit_sequence_hints(self) -> None:
        """Where nothing that reaches the model says how long sequences are, a command-line
        argument or dataclass field named like a sequence length is the best guess."""
        if self.builder.has("max_seq_length") or not self.reader.command_line_lengths:
            return
        hint = self.reader.command_line_lengths[0]
        self.set_known(
            "max_seq_length",
            hint,
            "an argument named like a sequence length (where it is used was not traced)",
        )


# -- entry point -----------------------------------------------------------------------------


def extract_python_plan(
    path: Path, text: str | None = None, *, settings: ProjectSettings | None = None
) -> TrainingPlan:
    """The TrainingPlan of a Python script (`text`: the editor's buffer; read from `path` when
    None). Never raises: what cannot be read is a line in `problems` (a syntax error gives a
    plan with nothing but pragmas and that line)."""
    builder = PlanBuilder()
    framework, config_class = "hf", "none"
    try:
        framework, config_class = _read_into(builder, Path(path), text, settings)
    except RecursionError:
        builder.problems.append("the script nests too deeply to read completely")
    except Exception as err:  # a gap in the reader must not take the editor down
        builder.problems.append(f"internal error while reading the script: {err!r}")
    return builder.build(path, "python", framework, config_class=config_class)


def _read_into(
    builder: PlanBuilder, path: Path, text: str | None, settings: ProjectSettings | None
) -> tuple[str, str]:
    """Feed the builder from the script; returns (framework, config class for defaults)."""
    if text is None:
        try:
            text = read_file_bytes(path, MAX_SCRIPT_BYTES).decode("utf-8-sig", errors="replace")
        except OSError as err:
            builder.problems.append(f"cannot read {path}: {err.strerror or err}")
            return "hf", "none"
    if text.startswith("\ufeff"):  # a byte-order mark is not Python (editors drop it too)
        text = text[1:]
    if settings is not None:
        apply_project_settings(builder, settings)
    apply_pragmas(builder, text)
    module, problem = parse_script(text)
    if module is None:
        builder.problems.append(problem or "could not parse the file")
        builder.unreadable = problem or "could not parse the file"
        return "hf", "none"
    reader = ScriptReader(SourceMap(text), path)
    oversized: list[str] = []
    token = _OVERSIZED_NOTES.set(oversized)
    try:
        reader.run_module(module)
        return PlanEmitter(reader, builder).emit()
    finally:
        _OVERSIZED_NOTES.reset(token)
        builder.problems.extend(reader.problems)
        for what in dict.fromkeys(oversized):
            builder.problems.append(
                f"{what} was built; llmmem does not read it (treated as unknown)"
            )

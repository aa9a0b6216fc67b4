"""What the script reader works with: abstract values (`Known`, `Unknown`, `Symbol`, lists,
dicts, and the objects the calls that matter build), scopes, and the bounds on reading."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from enum import Enum

from llmmem.extract.builder import PRECEDENCE
from llmmem.plan import Provenance

MAX_CALL_DEPTH = 8  # user functions calling user functions
MAX_FUNCTION_RUNS = 300  # user function bodies walked per file
MAX_RESULT_BITS = 4096  # integer arithmetic on literals stops here (10**1233)
# bounds on what the reader builds: past one, the value is unknown (with a note), never grown
MAX_STRING_CHARS = 100_000  # a string built by `+`, an f-string or str()
MAX_ITEMS = 10_000  # items of a list, tuple or dict built by the script
MAX_VALUE_UNITS = 200_000  # a nested value read whole: one per item, one per character
MAX_STEPS = 200_000  # statements and expressions evaluated per file (about a second)
MAX_STEPS_VARIABLE = "LLMMEM_MAX_STEPS"  # an environment variable that changes MAX_STEPS

_EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})


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
    """A function or lambda defined in the script: calls to it are followed (see
    ScriptReader.call_function)."""

    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    scope: Scope
    defaults: dict[str, Value]
    command_line: bool = False  # its parameters come from the command line (fire, typer...)
    runs: int = 0

    @property
    def name(self) -> str:
        return "<lambda>" if isinstance(self.node, ast.Lambda) else self.node.name


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
    STOP = "stop"  # raise, exit: the rest of the block does not run
    BREAK = "break"  # the rest of the loop does not run
    CONTINUE = "continue"  # the rest of this run of the loop does not run


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


def _returns_nothing(body: list[ast.stmt]) -> bool:
    """Whether a block ends with a `return` of nothing or of a constant: a guard that gives up
    (`if not torch.cuda.is_available(): print(...); return`), not the run the file describes."""
    if not body:
        return False
    last = body[-1]
    return isinstance(last, ast.Return) and (
        last.value is None or isinstance(last.value, ast.Constant)
    )


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


# -- conditions that ask the file system of the run (`os.path.isdir(path)`,
# `Path(p).exists()`): llmmem reads a script on another machine, before the run, so the folders
# and checkpoints such a test asks about are not there, and what they hold (a merged copy of a
# model, a checkpoint to resume from) is made by a run that has not happened yet. A probe not
# known before run time is read as false: the path the script was given is used as written.

# os.path's and pathlib's questions about a path, by the last part of the call's name
FILE_SYSTEM_PROBES = frozenset(
    {"exists", "isdir", "isfile", "is_dir", "is_file", "lexists", "islink"}
)


def probe_answer(test: ast.expr) -> bool | None:
    """The truth a file-system probe is read with (`os.path.isdir(x)`: False, `not
    Path(x).exists()`: True), or None where `test` is not one."""
    negated = False
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        negated = not negated
        test = test.operand
    if isinstance(test, ast.BoolOp):
        answers = [probe_answer(value) for value in test.values]
        if any(answer is None for answer in answers):
            return None
        joined = all(answers) if isinstance(test.op, ast.And) else any(answers)
        return joined != negated
    if not isinstance(test, ast.Call) or not isinstance(test.func, ast.Attribute):
        return None
    if test.func.attr not in FILE_SYSTEM_PROBES:
        return None
    return negated

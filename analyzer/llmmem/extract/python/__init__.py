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

The package, from the bottom up: `source` (parsing and positions), `values` (the abstract
values and the bounds on reading), `findings` (what the reading found), `libraries` and
`arguments` (tables of what library calls mean), `interpreter` (`ScriptReader`), `emitter`
(`PlanEmitter`), and here the entry point.

Ranges are 0-based lines and columns (columns count characters, as Python strings index them).
"""

from __future__ import annotations

from pathlib import Path

from llmmem.extract.builder import PlanBuilder
from llmmem.extract.pragmas import ProjectSettings, apply_pragmas, apply_project_settings
from llmmem.extract.python.emitter import MAX_DEEPSPEED_CONFIG_BYTES, PlanEmitter
from llmmem.extract.python.findings import Findings
from llmmem.extract.python.interpreter import ScriptReader
from llmmem.extract.python.source import MAX_SOURCE_CHARS, SourceMap, parse_script
from llmmem.extract.python.values import (
    _OVERSIZED_NOTES,
    MAX_CALL_DEPTH,
    MAX_FUNCTION_RUNS,
    MAX_ITEMS,
    MAX_RESULT_BITS,
    MAX_STEPS,
    MAX_STEPS_VARIABLE,
    MAX_STRING_CHARS,
    MAX_VALUE_UNITS,
    CallArgs,
    Known,
    Symbol,
    Unknown,
    Value,
    max_steps,
    settle,
    stop_when,
)
from llmmem.files import read_file_bytes
from llmmem.plan import TrainingPlan

MAX_SCRIPT_BYTES = 50_000_000  # a script read from disk (the editor's buffer has no cap here)

__all__ = [
    "MAX_CALL_DEPTH",
    "MAX_DEEPSPEED_CONFIG_BYTES",
    "MAX_FUNCTION_RUNS",
    "MAX_ITEMS",
    "MAX_RESULT_BITS",
    "MAX_SCRIPT_BYTES",
    "MAX_SOURCE_CHARS",
    "MAX_STEPS",
    "MAX_STEPS_VARIABLE",
    "MAX_STRING_CHARS",
    "MAX_VALUE_UNITS",
    "CallArgs",
    "Findings",
    "Known",
    "PlanEmitter",
    "ScriptReader",
    "SourceMap",
    "Symbol",
    "Unknown",
    "Value",
    "extract_python_plan",
    "max_steps",
    "parse_script",
    "settle",
    "stop_when",
]


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
    parsed = parse_script(text)
    module = parsed.module
    if module is None:
        problem = parsed.problem or "could not parse the file"
        builder.problems.append(problem)
        builder.unreadable = problem
        builder.parse_error_range = parsed.problem_range
        return "hf", "none"
    builder.problems.extend(parsed.notes)
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

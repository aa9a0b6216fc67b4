"""Training configs, YAML and JSON, read into a TrainingPlan.

One reader per framework, chosen from the keys the file uses:

    deepspeed     zero_optimization, train_micro_batch_size_per_gpu, bf16.enabled
    accelerate    distributed_type, num_processes, mixed_precision, fsdp_config, deepspeed_config
    torchtune     model._component_: torchtune.models..., batch_size, dtype, tokenizer.max_seq_len
    litgpt        checkpoint_dir, train.micro_batch_size, precision: bf16-true, quantize: bnb.nf4
    llamafactory  finetuning_type, stage, lora_rank, cutoff_len (and its v1 schema: model,
                  peft_config, quant_config, dist_config, micro_batch_size)
    axolotl       base_model, micro_batch_size, sequence_len, adapter: lora|qlora
    trl / hf      HfArgumentParser / TrlParser keys: model_name_or_path, per_device_train_batch_size

A reader turns keys into `Setting`s: a plan key (see `llmmem.extract.builder`), the value in the
plan's terms, its provenance and the range of the value's text. Values written in the file are
`explicit`; the framework's own defaults, where the file is silent, are `default`; values read from
a file this one refers to (`deepspeed: ds_z3.json`) are `config`, with the range in that file
(`SourceRange.path` set to it). A DeepSpeed value of "auto" is filled in by the trainer, so the
trainer-side value stands and says so in its note; a concrete DeepSpeed value only fills what the
trainer side leaves unsaid.

Nothing here raises on bad input: an unreadable file, a value of the wrong type or a missing
referenced file becomes a problem line and the rest is read.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmmem.extract.builder import PlanBuilder
from llmmem.extract.numbers import is_ascii_digits, shown
from llmmem.extract.pragmas import ProjectSettings, apply_project_settings, read_pragmas
from llmmem.extract.vocabulary import (
    AXOLOTL_RL_OBJECTIVES,
    LLAMAFACTORY_PREF_LOSS_OBJECTIVES,
    LLAMAFACTORY_STAGE_OBJECTIVES,
    normalize_attn_implementation,
    normalize_quant_storage,
    optim_for_optimizer_class,
)
from llmmem.extract.yaml_positions import (
    KeyPath,
    PositionedYaml,
    describe_location,
    read_positioned_yaml,
)
from llmmem.plan import Provenance, SourceRange, TrainingPlan

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


def as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueProblem(f"must be a whole number, got {value!r}")
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
    raise ValueProblem(f"must be a whole number, got {shown(repr(value), 40)}")


def as_count(value: Any) -> int:
    number = as_int(value)
    if number < 0:
        raise ValueProblem(f"must be 0 or more, got {value!r}")
    return number


def as_bucket(value: Any, *, at_least: int = 1) -> int | str:
    """A DeepSpeed bucket size: elements (`5e8` too), or "auto" for the trainer to size."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    number = as_int(value)
    if number < at_least:
        raise ValueProblem(f'must be a number of elements or "auto", got {value!r}')
    return number


def as_elements_or_auto(value: Any) -> int | str:
    """ZeRO-3's prefetch bucket and persistence threshold: elements (0 turns it off), "auto"."""
    return as_bucket(value, at_least=0)


# ZeRO-3's sizes in elements: the config's name, the plan's
STAGE3_SIZES = (
    ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
    ("stage3_param_persistence_threshold", "param_persistence_threshold"),
)


def as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueProblem(f"must be a number, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ValueProblem(f"must be a number, got {value!r}")


MAX_CONFIG_FILE_BYTES = 16 * 1024 * 1024  # a config, a DeepSpeed JSON, a launcher script
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
            self.problem(path, f"{'.'.join(str(step) for step in path)} {problem}")
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
            self.problem(path, f"{'.'.join(str(step) for step in path)} {problem}")
            return None

    def default(self, key: str, value: Any, note: str) -> None:
        """A framework default for a key the file leaves unsaid."""
        if not self.reading.has(key):
            self.reading.settings.append(Setting(key, value, Provenance.DEFAULT, None, note))

    def keep(self, name: str, path: KeyPath) -> None:
        """Keep a framework key the plan has no field for (it lands in `plan.extra`)."""
        if self.is_set(path):
            self.put(name, self.get(path), path)

    def derived(self, name: str, value: Any, note: str) -> None:
        """A framework fact no single key states (it lands in `plan.extra`, labelled default)."""
        self.reading.settings.append(Setting(name, value, Provenance.DEFAULT, None, note))


# --------------------------------------------------------------------------------------------
# which framework


def detect_framework(value: Any) -> str:
    """The framework a config is written for, from its keys; "hf" when nothing else fits."""
    if not isinstance(value, dict):
        return "hf"
    keys = set(value)
    model = value.get("model")
    if keys & {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"} or (
        isinstance(value.get("bf16"), dict) or isinstance(value.get("fp16"), dict)
    ):
        return "deepspeed"
    if keys & {"distributed_type", "compute_environment"} or (
        "num_processes" in keys and "mixed_precision" in keys
    ):
        return "accelerate"
    if (
        isinstance(model, dict)
        and "_component_" in model
        or any(isinstance(item, dict) and "_component_" in item for item in value.values())
    ):
        return "torchtune"
    if "checkpoint_dir" in keys and (
        isinstance(value.get("train"), dict) or keys & {"precision", "quantize", "devices"}
    ):
        return "litgpt"
    if isinstance(model, str) and keys & {
        "peft_config",
        "quant_config",
        "dist_config",
        "model_class",
        "kernel_config",
        "micro_batch_size",
        "global_batch_size",
        "cutoff_len",
    }:
        return "llamafactory"
    if keys & {"finetuning_type", "stage", "cutoff_len", "lora_target", "quantization_bit"}:
        return "llamafactory"
    if keys & {"base_model", "micro_batch_size", "sequence_len", "adapter", "base_model_config"}:
        return "axolotl"
    trl_keys = {
        "max_length",
        "max_seq_length",
        "use_peft",
        "lora_r",
        "dataset_name",
        "packing",
        "load_in_4bit",
        "lora_target_modules",
        "completion_only_loss",
        "assistant_only_loss",
        "beta",
    }
    if keys & trl_keys:
        return "trl"
    return "hf"


# --------------------------------------------------------------------------------------------
# the public entry points


def extract_config_plan(
    path: Path, text: str | None = None, *, settings: ProjectSettings | None = None
) -> TrainingPlan:
    """The TrainingPlan a YAML or JSON training config describes. Never raises."""
    path = Path(path)
    kind = "json" if path.suffix.lower() == ".json" else "yaml"
    try:
        reading = read_config(path, text)
        return build_plan(reading, path, reading.kind, reading.framework, settings=settings)
    except RecursionError:
        return plan_from_problems(path, kind, settings, ["the file nests too deeply to read"])
    except Exception as error:  # a gap in a reader must not take the editor down
        problem = f"internal error while reading the config: {error!r}"
        return plan_from_problems(path, kind, settings, [problem])


def plan_from_problems(
    path: Path,
    kind: str,
    settings: ProjectSettings | None,
    problems: list[str],
    *,
    unreadable: bool = False,
) -> TrainingPlan:
    """The plan of a file that could not be read: llmmem's assumptions and the reasons.
    `unreadable`: the file could not be parsed at all (not merely holds no settings)."""
    builder = PlanBuilder()
    if unreadable and problems:
        builder.unreadable = problems[-1]
    if settings is not None:
        apply_project_settings(builder, settings)
    builder.problems.extend(problems)
    return builder.build(str(path), kind, "hf", config_class="none")


def read_config(
    path: Path,
    text: str | None = None,
    *,
    range_path: str | None = None,
    overrides: list[Override] | None = None,
    framework: str | None = None,
    search_directories: list[Path] | None = None,
) -> ConfigReading:
    """The settings one config states, its framework's defaults and the files it refers to.

    `range_path` names the file in every range (None: the plan is about this file); what the
    file states is `explicit` when the plan is about it and `config` otherwise. `overrides`
    (command-line values, ranges in the plan's file) are laid over the document before it is
    read, so they win and keep their own ranges; `framework` skips detection. Files the config
    names are looked for beside it, then in `search_directories`.
    """
    path = Path(path)
    kind = "json" if path.suffix.lower() == ".json" else "yaml"
    reading = ConfigReading(path=path, kind=kind, framework="hf", range_path=range_path)
    if text is None:
        text = read_text_file(path, reading.problems, range_path)
    document = PositionedYaml(value=None)
    if text is not None:
        reading.text = text
        document = read_positioned_yaml(text, range_path, is_json=kind == "json")
        reading.problems.extend(document.problems)
    if overrides:
        document = overlay_document(document, overrides)
    where = range_path or "this file"
    if document.value is None:
        if text is not None and text.strip() and not document.problems:
            reading.problems.append(f"{where}: holds no settings")
        return reading
    if not isinstance(document.value, dict):
        reading.problems.append(
            f"{where}: a training config is a mapping of keys; "
            f"this file holds a {type(document.value).__name__}"
        )
        return reading
    reading.framework = framework or detect_framework(document.value)
    reader = DocumentReader(
        document,
        reading,
        range_path=range_path,
        file_path=path,
        search_directories=search_directories or [],
    )
    FRAMEWORK_READERS.get(reading.framework, read_hf)(reader)
    return reading


@dataclass(frozen=True)
class Override:
    """A value set on the command line for a config key (`batch_size=4`, `--train.epochs 2`)."""

    path: KeyPath
    value: Any
    range: SourceRange


def overlay_document(document: PositionedYaml, overrides: list[Override]) -> PositionedYaml:
    """The document with `overrides` laid over it: their values win and bring their ranges."""
    value = copy.deepcopy(document.value) if isinstance(document.value, dict) else {}
    ranges = dict(document.ranges)
    for override in overrides:
        if not override.path:
            continue
        current = value
        for step in override.path[:-1]:
            child = current.get(step) if isinstance(step, str) else None
            if not isinstance(child, dict):
                child = {}
                current[step] = child
            current = child
        current[override.path[-1]] = override.value
        prefix_length = len(override.path)
        for existing in [p for p in ranges if p[:prefix_length] == override.path]:
            del ranges[existing]
        ranges[override.path] = override.range
    return PositionedYaml(
        value=value, ranges=ranges, key_ranges=document.key_ranges, problems=document.problems
    )


def read_text_file(path: Path, problems: list[str], range_path: str | None = None) -> str | None:
    """The file's text, or None with a problem line (missing, unreadable, not a regular file,
    larger than MAX_CONFIG_FILE_BYTES, not UTF-8 text)."""
    from llmmem.files import read_file_bytes

    name = range_path or str(path)
    try:
        data = read_file_bytes(path, MAX_CONFIG_FILE_BYTES)
    except FileNotFoundError:
        problems.append(f"{name}: file not found")
        return None
    except OSError as error:
        problems.append(f"{name}: cannot be read ({error.strerror or error})")
        return None
    return decode_text(data, name, problems)


def decode_text(data: bytes, name: str, problems: list[str]) -> str | None:
    if b"\x00" in data[:8192]:
        problems.append(f"{name}: a binary file, not a text config")
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        problems.append(f"{name}: not UTF-8 text (byte {error.start} cannot be decoded)")
        return None


def apply_file_pragmas(builder: PlanBuilder, text: str, range_path: str | None) -> None:
    """The `# llmmem:` comments of a file, with ranges naming it (None: the plan's file)."""
    if "llmmem" not in text:
        return
    reading = read_pragmas(text)
    for pragma in reading.pragmas:
        located = replace(pragma.range, path=range_path)
        builder.set(pragma.key, pragma.value, Provenance.PRAGMA, located)
    prefix = f"{range_path}: " if range_path else ""
    builder.problems.extend(prefix + problem for problem in reading.problems)
    builder.rejected.extend(
        replace(
            rejected, range=replace(rejected.range, path=range_path) if rejected.range else None
        )
        for rejected in reading.rejected
    )


# the builder's table of defaults for what a framework leaves unsaid: the HF Trainer's where
# the framework trains with it; none where it has its own loop (its defaults are set here)
FRAMEWORK_CONFIG_CLASSES = {
    "hf": "TrainingArguments",
    "trl": "SFTConfig",
    "axolotl": "TrainingArguments",
    "llamafactory": "TrainingArguments",
    "torchtune": "none",
    "litgpt": "none",
    "deepspeed": "none",
    "accelerate": "none",
}


def build_plan(
    reading: ConfigReading,
    path: Path,
    kind: str,
    framework: str,
    *,
    settings: ProjectSettings | None = None,
    config_class: str | None = None,
) -> TrainingPlan:
    """Replays a reading's settings into the plan builder, then `[tool.llmmem]` and the file's
    pragmas (which beat what the file says); the builder applies the defaults left."""
    builder = PlanBuilder()
    if settings is not None:
        apply_project_settings(builder, settings)
    for setting in reading.settings:
        builder.set(setting.key, setting.value, setting.source, setting.range, setting.note)
    apply_file_pragmas(builder, reading.text, reading.range_path)
    plan = builder.build(
        str(path),
        kind,
        framework,
        config_class=config_class or FRAMEWORK_CONFIG_CLASSES.get(framework, "TrainingArguments"),
    )
    plan.problems.extend(problem for problem in reading.problems if problem not in plan.problems)
    return plan


# --------------------------------------------------------------------------------------------
# HF Trainer / TRL (HfArgumentParser, TrlParser)


def read_hf(reader: DocumentReader) -> None:
    """Keys of TrainingArguments / SFTConfig / ModelConfig (ScriptArguments are ignored)."""
    reader.take(("model_name_or_path",), "model_id", as_text)
    for key, name in (
        ("per_device_train_batch_size", "per_device_train_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        reader.take((key,), name, as_int)
    for key in ("max_length", "max_seq_length", "model_max_length", "cutoff_len"):
        if reader.take((key,), "max_seq_length", as_int) is not None:
            break
    reader.take(("gradient_checkpointing",), "gradient_checkpointing", as_bool)
    reader.take(("bf16",), "bf16", as_bool)
    reader.take(("fp16",), "fp16", as_bool)
    for dtype_path in (("torch_dtype",), ("dtype",), ("model_init_kwargs", "torch_dtype")):
        if reader.take(dtype_path, "torch_dtype", as_dtype) is not None:
            break
    reader.take(("optim",), "optim", as_text)
    for attention_path in (("attn_implementation",), ("model_init_kwargs", "attn_implementation")):
        if reader.take(attention_path, "attn_implementation", as_attention) is not None:
            break
    if reader.converted(("use_liger_kernel",), as_bool):
        reader.put("loss", "liger", ("use_liger_kernel",), "use_liger_kernel: true")
    reader.take(("use_cache",), "use_cache", as_bool)
    read_hf_peft(reader)
    read_hf_quantization(reader)
    read_hf_distributed(reader)


def read_hf_peft(reader: DocumentReader) -> None:
    """TRL ModelConfig: `use_peft: true` with lora_* keys (whose defaults are TRL's own)."""
    use_peft = reader.converted(("use_peft",), as_bool)
    if not use_peft:
        written = [
            key for key in ("lora_r", "lora_alpha", "lora_target_modules") if reader.is_set((key,))
        ]
        if written:
            reader.problem(
                (written[0],),
                f"{written[0]} is set but use_peft is not: TRL trains every weight, without LoRA",
            )
        return
    reader.put("lora.enabled", True, ("use_peft",))
    reader.take(("lora_r",), "lora.r", as_int)
    reader.take(("lora_alpha",), "lora.alpha", as_float)
    reader.take(("lora_dropout",), "lora.dropout", as_float)
    reader.take(("lora_target_modules",), "lora.target_modules", lora_targets)
    reader.take(("lora_modules_to_save",), "lora.modules_to_save", as_name_list)
    reader.take(("use_dora",), "lora.dora", as_bool)
    for key, value, note in TRL_MODEL_CONFIG_DEFAULTS:
        reader.default(key, value, note)


TRL_MODEL_CONFIG_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("lora.r", 16, "TRL ModelConfig lora_r default"),
    ("lora.alpha", 32.0, "TRL ModelConfig lora_alpha default"),
    ("lora.dropout", 0.05, "TRL ModelConfig lora_dropout default"),
)


def read_hf_quantization(reader: DocumentReader) -> None:
    if reader.converted(("load_in_4bit",), as_bool):
        reader.put("quantization.bits", 4, ("load_in_4bit",))
    elif reader.converted(("load_in_8bit",), as_bool):
        reader.put("quantization.bits", 8, ("load_in_8bit",))
    else:
        return
    reader.take(("bnb_4bit_quant_type",), "quantization.quant_type", as_text)
    reader.take(("use_bnb_nested_quant",), "quantization.double_quant", as_bool)
    reader.take(("bnb_4bit_quant_storage",), "quantization.quant_storage", as_quant_storage)
    reader.default("quantization.quant_type", "nf4", "TRL ModelConfig bnb_4bit_quant_type default")
    for dtype_path in (("bnb_4bit_compute_dtype",), ("torch_dtype",), ("dtype",)):
        if reader.take(dtype_path, "quantization.compute_dtype", as_dtype) is not None:
            break


def read_hf_distributed(reader: DocumentReader) -> None:
    read_deepspeed_reference(reader, ("deepspeed",))
    read_hf_fsdp(reader, ("fsdp",), ("fsdp_config",))


def read_hf_fsdp(reader: DocumentReader, fsdp_path: KeyPath, config_path: KeyPath) -> None:
    """`fsdp: "full_shard auto_wrap offload"` (a string or a list) and `fsdp_config`."""
    if not reader.is_set(fsdp_path):
        return
    raw = reader.get(fsdp_path)
    options = (
        [name.lower() for name in reader.converted(fsdp_path, as_name_list) or []]
        if (isinstance(raw, str | list))
        else []
    )
    if raw is True:
        options = ["full_shard"]
    strategy = next(
        (
            option
            for option in options
            if option in ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")
        ),
        "hybrid_shard" if "hybrid_shard_zero2" in options else None,
    )
    if strategy is None and options:
        strategy = "full_shard"
    if strategy is None:
        return
    reader.put("distributed.fsdp", strategy, fsdp_path)
    if "offload" in options:
        reader.put("distributed.offload_params", True, fsdp_path, "fsdp option 'offload'")
        reader.put("distributed.offload_optimizer", True, fsdp_path, "fsdp option 'offload'")
    read_fsdp_config_block(reader, config_path)


def read_fsdp_config_block(reader: DocumentReader, config_path: KeyPath) -> None:
    """The keys of an fsdp_config mapping, with or without their `fsdp_` prefix."""
    for prefix in ("fsdp_", ""):
        offload_path = (*config_path, f"{prefix}offload_params")
        offload = reader.converted(offload_path, as_bool)
        if offload is not None:
            reader.put("distributed.offload_params", offload, offload_path)
            reader.put(
                "distributed.offload_optimizer",
                offload,
                offload_path,
                "FSDP CPU offload moves the optimizer step to the CPU as well",
            )
        checkpointing_path = (*config_path, f"{prefix}activation_checkpointing")
        if reader.converted(checkpointing_path, as_bool):
            reader.put(
                "gradient_checkpointing",
                True,
                checkpointing_path,
                "FSDP activation checkpointing",
            )


# --------------------------------------------------------------------------------------------
# DeepSpeed


DEEPSPEED_NAME_STAGE = re.compile(r"(?:zero|(?<![a-z])z)[_-]?([0-3])(?![0-9])", re.IGNORECASE)


def read_deepspeed(reader: DocumentReader, prefix: KeyPath = ()) -> dict[str, KeyPath]:
    """A DeepSpeed config's memory settings; returns the plan keys its "auto" values leave to the
    trainer, with where each "auto" is written."""
    auto_keys: dict[str, KeyPath] = {}

    def concrete(path: KeyPath, key: str, convert: Callable[[Any], Any]) -> None:
        full_path = (*prefix, *path)
        if not reader.is_set(full_path):
            return
        if reader.get(full_path) == "auto":
            auto_keys[key] = full_path
            return
        reader.take(full_path, key, convert)

    zero = (*prefix, "zero_optimization")
    concrete(("zero_optimization", "stage"), "distributed.zero_stage", as_int)
    for offload_key, plan_key in (
        ("offload_optimizer", "distributed.offload_optimizer"),
        ("offload_param", "distributed.offload_params"),
    ):
        device_path = (*zero, offload_key, "device")
        device = reader.converted(device_path, as_text)
        if device is not None:
            reader.put(
                plan_key, device.lower() in ("cpu", "nvme"), device_path, f"device: {device}"
            )
    for legacy_key, plan_key in (
        ("cpu_offload", "distributed.offload_optimizer"),
        ("cpu_offload_params", "distributed.offload_params"),
    ):
        reader.take((*zero, legacy_key), plan_key, as_bool)
    reader.take((*zero, "reduce_bucket_size"), "distributed.reduce_bucket_size", as_bucket)
    for flag in ("overlap_comm", "contiguous_gradients"):
        reader.take((*zero, flag), f"distributed.{flag}", as_bool)
    reuse = (*zero, "stage3_max_reuse_distance")
    reader.take(reuse, "distributed.max_reuse_distance", as_count)
    for name, key in STAGE3_SIZES:
        reader.take((*zero, name), f"distributed.{key}", as_elements_or_auto)
    concrete(("train_micro_batch_size_per_gpu",), "per_device_train_batch_size", as_int)
    concrete(("gradient_accumulation_steps",), "gradient_accumulation_steps", as_int)
    for block in ("bf16", "bfloat16"):
        enabled = (*prefix, block, "enabled")
        if reader.is_set(enabled):
            if reader.get(enabled) == "auto":
                auto_keys["precision"] = enabled
            elif reader.converted(enabled, as_bool):
                reader.put("precision", "bf16", enabled, "DeepSpeed bf16: fp32 master weights")
    fp16_enabled = (*prefix, "fp16", "enabled")
    if reader.is_set(fp16_enabled):
        if reader.get(fp16_enabled) == "auto":
            auto_keys.setdefault("precision", fp16_enabled)
        elif reader.converted(fp16_enabled, as_bool):
            reader.put("precision", "fp16", fp16_enabled, "DeepSpeed fp16: fp32 master weights")
    if reader.is_set((*prefix, "optimizer", "type")):
        optimizer = reader.converted((*prefix, "optimizer", "type"), as_text)
        if optimizer is not None:
            reader.put(
                "optim",
                DEEPSPEED_OPTIMIZERS.get(optimizer.lower(), optimizer),
                (*prefix, "optimizer", "type"),
                f"DeepSpeed optimizer {optimizer}",
            )
    reader.keep("deepspeed_activation_checkpointing", (*prefix, "activation_checkpointing"))
    return auto_keys


DEEPSPEED_OPTIMIZERS = {
    "adamw": "adamw_torch",
    "adam": "adamw_torch",
    "fusedadam": "adamw_apex_fused",
    "cpuadam": "adamw_torch",
    "onebitadam": "adamw_torch",
    "lamb": "adamw_torch",
}


def read_deepspeed_reference(reader: DocumentReader, path: KeyPath) -> None:
    """`deepspeed: ds_z3.json` (or an inline mapping): follow it and merge what it says."""
    if not reader.is_set(path):
        return
    raw = reader.get(path)
    if isinstance(raw, dict):
        reader.put("distributed.deepspeed_config", "<inline>", path)
        inline = ConfigReading(
            path=reader.file_path, kind=reader.reading.kind, framework="deepspeed"
        )
        inline_reader = DocumentReader(
            reader.document,
            inline,
            range_path=reader.range_path,
            file_path=reader.file_path,
            search_directories=reader.search_directories,
        )
        auto_keys = read_deepspeed(inline_reader, path)
        merge_deepspeed(reader.reading, inline, auto_keys)
        return
    if not isinstance(raw, str):
        reader.problem(path, f"{path[-1]} must be the path of a DeepSpeed JSON file")
        return
    reader.put("distributed.deepspeed_config", raw, path)
    follow_deepspeed_file(reader, raw, path)


def follow_deepspeed_file(reader: DocumentReader, reference: str, path: KeyPath) -> None:
    target = resolve_reference(reference, reader.file_path, reader.search_directories)
    if target is None:
        stage_note = deepspeed_stage_from_name(reader, reference, path)
        reader.problem(
            path, f"DeepSpeed config '{reference}' not found next to this file{stage_note}"
        )
        return
    if target in reader.reading.referenced_files:
        return
    reader.reading.referenced_files.append(target)
    referenced = read_config(target, range_path=display_path(target))
    reader.reading.problems.extend(referenced.problems)
    if referenced.framework != "deepspeed":
        reader.problem(path, f"'{reference}' does not look like a DeepSpeed config")
        return
    merge_deepspeed(reader.reading, referenced, referenced.deepspeed_auto_keys)


def deepspeed_stage_from_name(reader: DocumentReader, reference: str, path: KeyPath) -> str:
    """axolotl and LLaMA-Factory name their bundled configs by stage (zero3_bf16.json,
    ds_z2_offload_config.json): when the file is not here, its name is still a good guess."""
    match = DEEPSPEED_NAME_STAGE.search(Path(reference).name)
    if match is None:
        return ""
    stage = int(match.group(1))
    note = f"ZeRO stage {stage} assumed from the file name '{Path(reference).name}'"
    located = reader.range(path)
    reader.reading.settings.append(
        Setting("distributed.zero_stage", stage, Provenance.ASSUMED, located, note)
    )
    name = Path(reference).name.lower()
    if "offload" in name:
        reader.reading.settings.append(
            Setting(
                "distributed.offload_optimizer",
                True,
                Provenance.ASSUMED,
                located,
                "optimizer offload assumed from the file name",
            )
        )
        if stage == 3 and ("all" in name or "param" in name):
            reader.reading.settings.append(
                Setting(
                    "distributed.offload_params",
                    True,
                    Provenance.ASSUMED,
                    located,
                    "parameter offload assumed from the file name",
                )
            )
    return f"; {note}"


def merge_deepspeed(
    reading: ConfigReading, deepspeed: ConfigReading, auto_keys: dict[str, KeyPath]
) -> None:
    """DeepSpeed values fill what the trainer side leaves unsaid; "auto" defers to it."""
    for setting in deepspeed.settings:
        existing = reading.setting(setting.key)
        if existing is None or existing.source is Provenance.DEFAULT:
            reading.settings.append(setting)
        elif existing.value != setting.value and setting.key != "precision":
            where = (
                describe_location(
                    setting.range.path, setting.range.start_line, setting.range.start_col
                )
                if setting.range is not None
                else str(deepspeed.path)
            )
            reading.problems.append(
                f"{where}: DeepSpeed says {setting.key} {setting.value!r}, the training config "
                f"says {existing.value!r}; HF Trainer stops on this mismatch, the training "
                "config's value is used"
            )
    for key in auto_keys:
        trainer_side = reading.setting(key)
        if trainer_side is not None:
            note = "DeepSpeed's 'auto' takes this value"
            reading.settings.append(
                Setting(
                    trainer_side.key,
                    trainer_side.value,
                    trainer_side.source,
                    trainer_side.range,
                    f"{trainer_side.note}; {note}" if trainer_side.note else note,
                )
            )


def read_deepspeed_file(reader: DocumentReader) -> None:
    """A DeepSpeed JSON on its own (the plan's file, or one another file refers to)."""
    auto_keys = read_deepspeed(reader)
    reader.reading.deepspeed_auto_keys = auto_keys
    if reader.range_path is None:
        reader.put("distributed.deepspeed_config", str(reader.file_path.name), None)
        for key, path in auto_keys.items():
            reader.problem(path, f"'auto' ({key}) is filled in by the trainer that loads this file")


def resolve_reference(
    reference: str, referring_file: Path, search_directories: list[Path] | None = None
) -> Path | None:
    """A file named in another file: absolute, or relative to the referring file's folder (or
    one of `search_directories`)."""
    candidate = Path(os.path.expanduser(reference))
    folders = [referring_file.parent, *(search_directories or [])]
    candidates = [candidate] if candidate.is_absolute() else [f / candidate for f in folders]
    for option in candidates:
        try:
            if option.is_file():
                return option
        except OSError:
            continue
    return None


def display_path(path: Path) -> str:
    return os.path.normpath(str(path))


# --------------------------------------------------------------------------------------------
# accelerate config (accelerate launch --config_file)


FSDP_STRATEGY_NAMES = {
    "full_shard": "full_shard",
    "1": "full_shard",
    "shard_grad_op": "shard_grad_op",
    "2": "shard_grad_op",
    "no_shard": "no_shard",
    "3": "no_shard",
    "hybrid_shard": "hybrid_shard",
    "4": "hybrid_shard",
    "hybrid_shard_zero2": "hybrid_shard",
    "5": "hybrid_shard",
}


def read_accelerate(reader: DocumentReader) -> None:
    distributed_type = reader.converted(("distributed_type",), as_text)
    kind = (distributed_type or "").upper()
    reader.take(("num_processes",), "distributed.world_size", as_int)
    reader.keep("num_machines", ("num_machines",))
    mixed = reader.converted(("mixed_precision",), as_text)
    if mixed is not None and mixed.lower() in ("bf16", "fp16"):
        # the autocast flag, not the precision itself: weights loaded in bf16 stay pure bf16
        reader.put(
            mixed.lower(),
            True,
            ("mixed_precision",),
            "accelerate mixed_precision: used where the script sets none",
        )
    if kind == "DEEPSPEED" or reader.is_set(("deepspeed_config",)):
        block = ("deepspeed_config",)
        reader.take((*block, "zero_stage"), "distributed.zero_stage", as_int)
        for key, plan_key in (
            ("offload_optimizer_device", "distributed.offload_optimizer"),
            ("offload_param_device", "distributed.offload_params"),
        ):
            device = reader.converted((*block, key), as_text)
            if device is not None:
                reader.put(plan_key, device.lower() in ("cpu", "nvme"), (*block, key))
        reader.take((*block, "gradient_accumulation_steps"), "gradient_accumulation_steps", as_int)
        if reader.is_set((*block, "deepspeed_config_file")):
            reference = reader.converted((*block, "deepspeed_config_file"), as_text)
            if reference is not None:
                reader.put(
                    "distributed.deepspeed_config", reference, (*block, "deepspeed_config_file")
                )
                follow_deepspeed_file(reader, reference, (*block, "deepspeed_config_file"))
    if kind == "FSDP" or reader.is_set(("fsdp_config",)):
        read_accelerate_fsdp(reader, ("fsdp_config",))


def read_accelerate_fsdp(reader: DocumentReader, block: KeyPath) -> None:
    strategy_path = (*block, "fsdp_sharding_strategy")
    version = reader.converted((*block, "fsdp_version"), as_int)
    if reader.is_set(strategy_path):
        raw = str(reader.get(strategy_path)).strip().lower()
        if raw not in FSDP_STRATEGY_NAMES:
            reader.problem(strategy_path, f"unknown fsdp_sharding_strategy '{raw}'")
        elif FSDP_STRATEGY_NAMES[raw] is not None:
            reader.put("distributed.fsdp", FSDP_STRATEGY_NAMES[raw], strategy_path)
    elif version == 2:
        reshard_path = (*block, "fsdp_reshard_after_forward")
        reshard = reader.converted(reshard_path, as_bool)
        strategy = "shard_grad_op" if reshard is False else "full_shard"
        reader.put(
            "distributed.fsdp",
            strategy,
            reshard_path if reshard is not None else (*block, "fsdp_version"),
            "FSDP2: reshard_after_forward decides full or grad-op sharding",
        )
    else:
        reader.put("distributed.fsdp", "full_shard", block, "FULL_SHARD is accelerate's default")
    read_fsdp_config_block(reader, block)


# --------------------------------------------------------------------------------------------
# axolotl


def read_axolotl(reader: DocumentReader) -> None:
    reader.take(("base_model",), "model_id", as_text)
    micro_batch = reader.take(("micro_batch_size",), "per_device_train_batch_size", as_int)
    accumulation = reader.take(
        ("gradient_accumulation_steps",), "gradient_accumulation_steps", as_int
    )
    if accumulation is None and reader.is_set(("batch_size",)):
        batch_size = reader.converted(("batch_size",), as_int)
        if batch_size is not None:
            reader.put(
                "gradient_accumulation_steps",
                max(1, batch_size // (micro_batch or 1)),
                ("batch_size",),
                "batch_size / micro_batch_size",
            )
    reader.take(("sequence_len",), "max_seq_length", as_int)
    for name in ("sample_packing", "pad_to_sequence_len", "sequence_parallel_degree"):
        reader.keep(name, (name,))
    read_axolotl_objective(reader)
    read_axolotl_checkpointing(reader)
    uses_deepspeed = reader.is_set(("deepspeed",))
    read_axolotl_precision(reader, uses_deepspeed)
    reader.take(("optimizer",), "optim", as_text)
    read_axolotl_attention(reader)
    read_axolotl_loss(reader)
    read_axolotl_adapter(reader)
    read_deepspeed_reference(reader, ("deepspeed",))
    read_axolotl_fsdp(reader)
    defaults = AXOLOTL_DEFAULTS
    for key, value, note in defaults:
        reader.default(key, value, note)


AXOLOTL_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("per_device_train_batch_size", 1, "axolotl micro_batch_size default"),
    ("gradient_accumulation_steps", 1, "axolotl gradient_accumulation_steps default"),
    ("max_seq_length", 512, "axolotl sequence_len default"),
    ("gradient_checkpointing", False, "axolotl gradient_checkpointing default"),
    ("precision", "fp32", "axolotl loads float32 weights unless bf16 or fp16 is set"),
    ("optim", "adamw_torch_fused", "axolotl optimizer default"),
    ("attn_implementation", "sdpa", "transformers' default attention (no axolotl flag set)"),
)


def read_axolotl_objective(reader: DocumentReader) -> None:
    """`rl: dpo|ipo|orpo|kto|simpo|grpo`: axolotl trains with TRL's trainer of that name; an
    unknown value is kept, and sized as nothing rather than as SFT."""
    rl = reader.converted(("rl",), as_text)
    if rl is None or not rl.strip() or rl.strip().lower() in ("false", "none"):
        return
    name = rl.strip().lower()
    objective = AXOLOTL_RL_OBJECTIVES.get(name, name)
    note = f"rl: {rl}" + (" (TRL's DPO forward with the IPO loss)" if name == "ipo" else "")
    if name == "simpo":
        note = "rl: simpo (TRL's CPO trainer with loss_type simpo)"
    reader.put("objective", objective, ("rl",), note)
    reader.keep("rl_adapter_ref_model", ("rl_adapter_ref_model",))
    reader.keep("precompute_ref_log_probs", ("precompute_ref_log_probs",))


def read_axolotl_checkpointing(reader: DocumentReader) -> None:
    path = ("gradient_checkpointing",)
    if not reader.is_set(path):
        return
    raw = reader.get(path)
    if isinstance(raw, str) and raw.lower() in ("unsloth", "offload", "offload_disk"):
        reader.put("gradient_checkpointing", True, path, f"gradient_checkpointing: {raw}")
        reader.put("activation_offloading", raw, path)
        return
    reader.take(path, "gradient_checkpointing", as_bool)


def read_axolotl_precision(reader: DocumentReader, uses_deepspeed: bool) -> None:
    """axolotl loads the model in bfloat16 when bf16 is set (torch_dtype follows it), so a full
    fine-tune keeps weights, gradients and AdamW states in bf16 ("bf16-true"); under DeepSpeed
    the ZeRO optimizer keeps fp32 master weights instead ("bf16")."""
    for key, true_precision, amp_precision in (
        ("bf16", "bf16-true", "bf16"),
        ("bfloat16", "bf16-true", "bf16-true"),
        ("fp16", "fp16-true", "fp16"),
        ("float16", "fp16-true", "fp16-true"),
    ):
        path = (key,)
        if not reader.is_set(path):
            continue
        raw = reader.get(path)
        if isinstance(raw, str) and raw.strip().lower() == "auto":
            precision = amp_precision if uses_deepspeed else true_precision
            reader.put("precision", precision, path, f"{key}: auto, where the GPU supports bf16")
            return
        enabled = reader.converted(path, as_bool)
        if enabled:
            precision = amp_precision if uses_deepspeed else true_precision
            note = (
                "DeepSpeed keeps fp32 master weights"
                if uses_deepspeed and precision == amp_precision
                else f"axolotl loads the model in {'bfloat16' if 'bf' in key else 'float16'}"
            )
            reader.put("precision", precision, path, note)
            return
    reader.keep("tf32", ("tf32",))


def read_axolotl_attention(reader: DocumentReader) -> None:
    for key, attention in (
        ("flash_attention", "flash_attention_2"),
        ("sdp_attention", "sdpa"),
        ("flex_attention", "sdpa"),
        ("xformers_attention", "sdpa"),
        ("eager_attention", "eager"),
    ):
        if reader.converted((key,), as_bool):
            note = (
                "xformers: memory-efficient attention, no seq² scores"
                if key.startswith("xformers")
                else ""
            )
            reader.put("attn_implementation", attention, (key,), note)
            return
    reader.take(("attn_implementation",), "attn_implementation", as_attention)


def read_axolotl_loss(reader: DocumentReader) -> None:
    for key, loss, note in (
        ("liger_fused_linear_cross_entropy", "liger", "Liger fused linear cross-entropy"),
        ("cut_cross_entropy", "liger", "Cut Cross-Entropy: logits never materialised whole"),
        ("chunked_cross_entropy", "chunked", "chunked cross-entropy"),
    ):
        if reader.converted((key,), as_bool):
            reader.put("loss", loss, (key,), note)
            return


def read_axolotl_adapter(reader: DocumentReader) -> None:
    adapter = reader.converted(("adapter",), as_text)
    load_in_4bit = reader.converted(("load_in_4bit",), as_bool)
    load_in_8bit = reader.converted(("load_in_8bit",), as_bool)
    if adapter is not None and adapter.lower() in ("lora", "qlora"):
        reader.put("lora.enabled", True, ("adapter",), f"adapter: {adapter}")
        reader.take(("lora_r",), "lora.r", as_int)
        reader.take(("lora_alpha",), "lora.alpha", as_float)
        reader.take(("lora_dropout",), "lora.dropout", as_float)
        if reader.converted(("lora_target_linear",), as_bool):
            reader.put(
                "lora.target_modules",
                ["all-linear"],
                ("lora_target_linear",),
                "lora_target_linear: every linear layer",
            )
        else:
            reader.take(("lora_target_modules",), "lora.target_modules", lora_targets)
        reader.take(("lora_modules_to_save",), "lora.modules_to_save", as_name_list)
        reader.take(("peft_use_dora",), "lora.dora", as_bool)
        if not reader.reading.has("lora.r"):
            reader.reading.settings.append(
                Setting("lora.r", 8, Provenance.ASSUMED, None, "axolotl needs lora_r; assumed 8")
            )
        if not reader.reading.has("lora.alpha"):
            rank = reader.reading.value_of("lora.r") or 8
            reader.reading.settings.append(
                Setting(
                    "lora.alpha",
                    float(rank * 2),
                    Provenance.ASSUMED,
                    None,
                    "axolotl needs lora_alpha; assumed 2 × lora_r",
                )
            )
    elif adapter is not None:
        reader.problem(("adapter",), f"adapter '{adapter}' is not read (lora and qlora are)")
    if load_in_4bit or (adapter is not None and adapter.lower() == "qlora"):
        path = ("load_in_4bit",) if load_in_4bit else ("adapter",)
        reader.put("quantization.bits", 4, path)
        reader.put("quantization.quant_type", "nf4", path, "axolotl QLoRA: nf4")
        reader.put("quantization.double_quant", True, path, "axolotl QLoRA: double quantization")
        reader.put(
            "quantization.prepare_for_kbit_training",
            True,
            path,
            "axolotl calls prepare_model_for_kbit_training for k-bit adapters",
        )
        reader.put(
            "quantization.compute_dtype",
            "bfloat16"
            if reader.reading.value_of("precision") in ("bf16", "bf16-true")
            else (
                "float16"
                if reader.reading.value_of("precision") in ("fp16", "fp16-true")
                else "float32"
            ),
            path,
            "axolotl computes in the model's dtype",
        )
        # axolotl's QLoRA loader stores the packed 4-bit weights in bf16 (FSDP can shard them)
        # unless bnb_config_kwargs says otherwise
        storage_path = ("bnb_config_kwargs", "bnb_4bit_quant_storage")
        if reader.take(storage_path, "quantization.quant_storage", as_quant_storage) is None:
            reader.put(
                "quantization.quant_storage",
                "bfloat16",
                path,
                "axolotl QLoRA: bnb_4bit_quant_storage bfloat16",
            )
    elif load_in_8bit:
        reader.put("quantization.bits", 8, ("load_in_8bit",))
        reader.put("quantization.quant_type", "int8", ("load_in_8bit",))
        reader.put(
            "quantization.prepare_for_kbit_training",
            adapter is not None,
            ("load_in_8bit",),
            "axolotl calls prepare_model_for_kbit_training for k-bit adapters",
        )


def read_axolotl_fsdp(reader: DocumentReader) -> None:
    if reader.is_set(("fsdp",)):
        read_hf_fsdp(reader, ("fsdp",), ("fsdp_config",))
        return
    if not reader.is_set(("fsdp_config",)):
        return
    block = ("fsdp_config",)
    for prefix in ("fsdp_", ""):
        strategy_path = (*block, f"{prefix}sharding_strategy")
        if reader.is_set(strategy_path):
            raw = str(reader.get(strategy_path)).strip().lower()
            strategy = FSDP_STRATEGY_NAMES.get(raw, "full_shard")
            if strategy is not None:
                reader.put("distributed.fsdp", strategy, strategy_path)
            break
        reshard_path = (*block, f"{prefix}reshard_after_forward")
        if reader.is_set(reshard_path):
            reshard = reader.converted(reshard_path, as_bool)
            reader.put(
                "distributed.fsdp",
                "shard_grad_op" if reshard is False else "full_shard",
                reshard_path,
                "reshard_after_forward decides full or grad-op sharding",
            )
            break
    else:
        reader.put("distributed.fsdp", "full_shard", block, "FSDP's default: full sharding")
    read_fsdp_config_block(reader, block)


# --------------------------------------------------------------------------------------------
# LLaMA-Factory


LLAMAFACTORY_ATTENTION = {
    "auto": "sdpa",
    "disabled": "eager",
    "eager": "eager",
    "sdpa": "sdpa",
    "fa2": "flash_attention_2",
    "fa3": "flash_attention_3",
    "flash_attention_2": "flash_attention_2",
}


def read_llamafactory_objective(reader: DocumentReader) -> None:
    """`stage: dpo|kto|rm|ppo` (sft and pt are supervised); inside the dpo stage `pref_loss:
    orpo|simpo` trains without a reference model."""
    stage = (reader.converted(("stage",), as_text) or "").strip().lower()
    objective = LLAMAFACTORY_STAGE_OBJECTIVES.get(stage)
    if objective is None:
        return
    if objective == "dpo":
        loss = (reader.converted(("pref_loss",), as_text) or "").strip().lower()
        if loss in LLAMAFACTORY_PREF_LOSS_OBJECTIVES:
            reader.put(
                "objective",
                LLAMAFACTORY_PREF_LOSS_OBJECTIVES[loss],
                ("pref_loss",),
                f"stage: dpo with pref_loss: {loss}",
            )
            return
    reader.put("objective", objective, ("stage",), f"stage: {stage}")


def read_llamafactory(reader: DocumentReader) -> None:
    if isinstance(reader.get(("model",)), str):
        read_llamafactory_v1(reader)
        return
    reader.take(("model_name_or_path",), "model_id", as_text)
    reader.keep("stage", ("stage",))
    read_llamafactory_objective(reader)
    reader.keep("template", ("template",))
    reader.keep("packing", ("packing",))
    finetuning = (reader.converted(("finetuning_type",), as_text) or "lora").lower()
    if reader.is_set(("finetuning_type",)):
        reader.keep("finetuning_type", ("finetuning_type",))
    else:
        reader.derived("finetuning_type", "lora", "LLaMA-Factory finetuning_type default")
    reader.take(("per_device_train_batch_size",), "per_device_train_batch_size", as_int)
    reader.take(("gradient_accumulation_steps",), "gradient_accumulation_steps", as_int)
    reader.take(("cutoff_len",), "max_seq_length", as_int)
    disable_checkpointing = reader.converted(("disable_gradient_checkpointing",), as_bool)
    if disable_checkpointing is not None:
        reader.put(
            "gradient_checkpointing",
            not disable_checkpointing,
            ("disable_gradient_checkpointing",),
        )
    reader.take(("optim",), "optim", as_text)
    flash = reader.converted(("flash_attn",), as_text)
    if flash is not None:
        attention = LLAMAFACTORY_ATTENTION.get(flash.lower())
        if attention is None:
            reader.problem(("flash_attn",), f"unknown flash_attn '{flash}'")
        else:
            reader.put("attn_implementation", attention, ("flash_attn",), f"flash_attn: {flash}")
    if reader.converted(("enable_liger_kernel",), as_bool):
        reader.put("loss", "liger", ("enable_liger_kernel",), "enable_liger_kernel: true")
    read_llamafactory_precision(reader, finetuning)
    if finetuning == "lora":
        reader.put(
            "lora.enabled",
            True,
            ("finetuning_type",) if reader.is_set(("finetuning_type",)) else None,
            "finetuning_type: lora",
        )
        rank = reader.take(("lora_rank",), "lora.r", as_int)
        alpha = reader.take(("lora_alpha",), "lora.alpha", as_float)
        if alpha is None:
            reader.reading.settings.append(
                Setting(
                    "lora.alpha",
                    float((rank or 8) * 2),
                    Provenance.DEFAULT,
                    reader.range(("lora_rank",)) if rank is not None else None,
                    "LLaMA-Factory: lora_alpha defaults to lora_rank × 2",
                )
            )
        reader.take(("lora_dropout",), "lora.dropout", as_float)
        reader.take(("lora_target",), "lora.target_modules", lora_targets)
        reader.take(("additional_target",), "lora.modules_to_save", as_name_list)
        reader.take(("use_dora",), "lora.dora", as_bool)
        reader.default("lora.r", 8, "LLaMA-Factory lora_rank default")
        reader.default("lora.target_modules", ["all-linear"], "LLaMA-Factory lora_target: all")
        reader.default("lora.dropout", 0.0, "LLaMA-Factory lora_dropout default")
    elif finetuning not in ("full", "freeze"):
        reader.problem(("finetuning_type",), f"finetuning_type '{finetuning}' is read as full")
    bits = reader.take(("quantization_bit",), "quantization.bits", as_int)
    if bits is not None:
        quant_type = reader.converted(("quantization_type",), as_text) or "nf4"
        reader.put(
            "quantization.quant_type",
            "int8" if bits == 8 else quant_type.lower(),
            ("quantization_type",)
            if reader.is_set(("quantization_type",))
            else ("quantization_bit",),
        )
        double = reader.converted(("double_quantization",), as_bool)
        if double is None:
            reader.reading.settings.append(
                Setting(
                    "quantization.double_quant",
                    True,
                    Provenance.DEFAULT,
                    None,
                    "LLaMA-Factory double_quantization default",
                )
            )
        else:
            reader.put("quantization.double_quant", double, ("double_quantization",))
        precision = reader.reading.value_of("precision")
        reader.reading.settings.append(
            Setting(
                "quantization.compute_dtype",
                "float16" if precision in ("fp16", "fp16-true") else "bfloat16",
                Provenance.DEFAULT,
                None,
                "LLaMA-Factory computes in the model's dtype",
            )
        )
        if bits == 4:
            reader.reading.settings.append(
                Setting(
                    "quantization.quant_storage",
                    "float16" if precision in ("fp16", "fp16-true") else "bfloat16",
                    Provenance.DEFAULT,
                    None,
                    "LLaMA-Factory stores the 4-bit weights in the compute dtype",
                )
            )
    read_deepspeed_reference(reader, ("deepspeed",))
    read_hf_fsdp(reader, ("fsdp",), ("fsdp_config",))
    for key, value, note in LLAMAFACTORY_DEFAULTS:
        reader.default(key, value, note)


LLAMAFACTORY_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("per_device_train_batch_size", 8, "TrainingArguments default, as LLaMA-Factory keeps it"),
    ("gradient_accumulation_steps", 1, "TrainingArguments default"),
    ("max_seq_length", 2048, "LLaMA-Factory cutoff_len default"),
    (
        "gradient_checkpointing",
        True,
        "LLaMA-Factory enables it unless disable_gradient_checkpointing is set",
    ),
    ("attn_implementation", "sdpa", "LLaMA-Factory flash_attn: auto"),
)


def read_llamafactory_precision(reader: DocumentReader, finetuning: str) -> None:
    """LLaMA-Factory loads the model in its compute dtype and, unless pure_bf16 is set, upcasts
    trainable weights to fp32: LoRA keeps a bf16 base ("bf16-true", adapters in fp32), a full
    fine-tune trains fp32 weights under bf16 autocast ("bf16")."""
    pure = reader.converted(("pure_bf16",), as_bool)
    bf16 = reader.converted(("bf16",), as_bool)
    fp16 = reader.converted(("fp16",), as_bool)
    if pure:
        reader.put("precision", "bf16-true", ("pure_bf16",), "pure_bf16: no fp32 upcast")
        return
    full = finetuning in ("full", "freeze")
    if bf16:
        reader.put(
            "precision",
            "bf16" if full else "bf16-true",
            ("bf16",),
            "trainable weights upcast to fp32" if full else "bf16 base, fp32 adapters",
        )
    elif fp16:
        reader.put(
            "precision",
            "fp16" if full else "fp16-true",
            ("fp16",),
            "trainable weights upcast to fp32" if full else "fp16 base, fp32 adapters",
        )
    else:
        reader.reading.settings.append(
            Setting(
                "precision",
                "bf16" if full else "bf16-true",
                Provenance.DEFAULT,
                None,
                "LLaMA-Factory infers the compute dtype from the model (bf16 for most)",
            )
        )


def read_llamafactory_v1(reader: DocumentReader) -> None:
    """The v1 schema: model, peft_config, quant_config, dist_config, micro/global batch size."""
    reader.derived("llamafactory_schema", "v1", "model, peft_config, dist_config keys")
    reader.take(("model",), "model_id", as_text)
    reader.keep("template", ("template",))
    micro = reader.take(("micro_batch_size",), "per_device_train_batch_size", as_int)
    global_batch = reader.converted(("global_batch_size",), as_int)
    if global_batch is not None:
        accumulation = max(1, global_batch // (micro or 1))
        reader.put(
            "gradient_accumulation_steps",
            accumulation,
            ("global_batch_size",),
            "global_batch_size / micro_batch_size on one GPU; divided again by the GPU count",
        )
    reader.take(("cutoff_len",), "max_seq_length", as_int)
    reader.take(("enable_activation_checkpointing",), "gradient_checkpointing", as_bool)
    bf16 = reader.converted(("bf16",), as_bool)
    if bf16 is not None:
        reader.put(
            "precision",
            "bf16-true" if bf16 else "fp32",
            ("bf16",),
            "LLaMA-Factory v1 trains in the model's bf16" if bf16 else "",
        )
    flash = reader.converted(("flash_attn",), as_text)
    if flash is not None:
        attention = LLAMAFACTORY_ATTENTION.get(flash.lower())
        if attention is not None:
            reader.put("attn_implementation", attention, ("flash_attn",))
    peft = ("peft_config",)
    if isinstance(reader.get(peft), dict):
        name = (reader.converted((*peft, "name"), as_text) or "lora").lower()
        if name == "lora":
            reader.put(
                "lora.enabled", True, (*peft, "name") if reader.is_set((*peft, "name")) else peft
            )
            reader.take((*peft, "r"), "lora.r", as_int)
            reader.take((*peft, "lora_alpha"), "lora.alpha", as_float)
            reader.take((*peft, "lora_dropout"), "lora.dropout", as_float)
            reader.take((*peft, "target_modules"), "lora.target_modules", lora_targets)
        else:
            reader.problem((*peft, "name"), f"peft_config name '{name}' is read as full")
    quant = ("quant_config",)
    if isinstance(reader.get(quant), dict):
        bits = reader.take((*quant, "quantization_bit"), "quantization.bits", as_int)
        if bits is not None:
            reader.put(
                "quantization.quant_type",
                "int8" if bits == 8 else "nf4",
                (*quant, "quantization_bit"),
            )
    dist = ("dist_config",)
    if isinstance(reader.get(dist), dict):
        name = (reader.converted((*dist, "name"), as_text) or "").lower()
        if name.startswith("fsdp"):
            reader.put("distributed.fsdp", "full_shard", (*dist, "name"), f"dist_config: {name}")
        elif name == "deepspeed":
            reference = reader.converted((*dist, "config_file"), as_text)
            if reference is not None:
                reader.put("distributed.deepspeed_config", reference, (*dist, "config_file"))
                follow_deepspeed_file(reader, reference, (*dist, "config_file"))
    for key, value, note in LLAMAFACTORY_V1_DEFAULTS:
        reader.default(key, value, note)


LLAMAFACTORY_V1_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("per_device_train_batch_size", 1, "LLaMA-Factory v1 micro_batch_size default"),
    ("gradient_accumulation_steps", 1, "LLaMA-Factory v1 global_batch_size default (1)"),
    ("max_seq_length", 2048, "LLaMA-Factory v1 cutoff_len default"),
    # llamafactory/v1/config/training_args.py (0.9.5): enable_activation_checkpointing=True
    ("gradient_checkpointing", True, "LLaMA-Factory v1 enable_activation_checkpointing default"),
    ("precision", "fp32", "LLaMA-Factory v1 bf16 default: false"),
    ("attn_implementation", "sdpa", "LLaMA-Factory v1 flash_attn default"),
)


# --------------------------------------------------------------------------------------------
# torchtune


TORCHTUNE_FAMILIES: dict[str, Callable[[str, str], str]] = {
    "llama2": lambda size, _: f"meta-llama/Llama-2-{size.lower()}-hf",
    "code_llama2": lambda size, _: f"codellama/CodeLlama-{size.lower()}-hf",
    "llama3": lambda size, variant: f"meta-llama/Meta-Llama-3-{size}{variant}",
    "llama3_1": lambda size, variant: f"meta-llama/Llama-3.1-{size}{variant}",
    "llama3_2": lambda size, variant: f"meta-llama/Llama-3.2-{size}{variant}",
    "llama3_3": lambda size, _: f"meta-llama/Llama-3.3-{size}-Instruct",
    "mistral": lambda size, _: f"mistralai/Mistral-{size}-v0.1",
    "gemma": lambda size, variant: f"google/gemma-{size.lower()}{'-it' if variant else ''}",
    "gemma2": lambda size, variant: f"google/gemma-2-{size.lower()}{'-it' if variant else ''}",
    "qwen2": lambda size, variant: f"Qwen/Qwen2-{size}{variant}",
    "qwen2_5": lambda size, variant: f"Qwen/Qwen2.5-{size}{variant}",
    "qwen3": lambda size, _: f"Qwen/Qwen3-{size}",
    "phi4": lambda size, _: "microsoft/phi-4",
}
TORCHTUNE_FIXED_NAMES = {
    "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
    "mistral_7b": "mistralai/Mistral-7B-v0.1",
}
TORCHTUNE_METHODS = {"qlora_": "qlora", "lora_": "lora", "qdora_": "qlora", "dora_": "lora"}
TORCHTUNE_SIZE = re.compile(r"^(?P<size>\d+(?:_\d+)?[bm])(?:_(?P<variant>base|instruct))?$")

# torchtune module names -> the HF names PEFT (and the budget) use
TORCHTUNE_LORA_MODULES = {
    "q_proj": "q_proj",
    "k_proj": "k_proj",
    "v_proj": "v_proj",
    "output_proj": "o_proj",
}


def torchtune_model(component: str) -> tuple[str | None, str]:
    """(hub id or None, method) for a builder path such as
    torchtune.models.llama3_1.qlora_llama3_1_8b -> ("meta-llama/Llama-3.1-8B", "qlora")."""
    builder = component.rsplit(".", 1)[-1]
    method = "full"
    for prefix, prefix_method in TORCHTUNE_METHODS.items():
        if builder.startswith(prefix):
            builder, method = builder.removeprefix(prefix), prefix_method
            break
    if builder in TORCHTUNE_FIXED_NAMES:
        return TORCHTUNE_FIXED_NAMES[builder], method
    # the longest family first: llama3_1_8b is llama3_1 at 8B, not llama3 at 1.8B
    for family in sorted(TORCHTUNE_FAMILIES, key=len, reverse=True):
        if not builder.startswith(family + "_"):
            continue
        match = TORCHTUNE_SIZE.match(builder.removeprefix(family + "_"))
        if match is None:
            continue
        size = match.group("size").replace("_", ".").upper()
        variant = "-Instruct" if match.group("variant") == "instruct" else ""
        return TORCHTUNE_FAMILIES[family](size, variant), method
    return None, method


TORCHTUNE_DTYPES = {"bf16": "bf16-true", "fp32": "fp32", "fp16": "fp16-true"}


def read_torchtune(reader: DocumentReader) -> None:
    component_path = ("model", "_component_")
    component = reader.converted(component_path, as_text)
    method = "full"
    if component is not None:
        model_id, method = torchtune_model(component)
        builder = component.rsplit(".", 1)[-1]
        if model_id is None:
            reader.problem(
                component_path,
                f"torchtune builder '{builder}' has no known hub model; add a "
                "`# llmmem: model=...` pragma",
            )
        else:
            reader.put("model_id", model_id, component_path, f"torchtune builder {builder}")
        if "dora" in builder:
            reader.put("lora.dora", True, component_path, "a DoRA builder")
    reader.take(("batch_size",), "per_device_train_batch_size", as_int)
    reader.take(("gradient_accumulation_steps",), "gradient_accumulation_steps", as_int)
    if reader.found(("tokenizer", "max_seq_len"))[0] and not reader.is_set(
        ("tokenizer", "max_seq_len")
    ):
        reader.problem(
            ("tokenizer", "max_seq_len"),
            "max_seq_len is null: sequences are as long as the data; set it to bound memory",
        )
    reader.take(("tokenizer", "max_seq_len"), "max_seq_length", as_int)
    reader.take(("enable_activation_checkpointing",), "gradient_checkpointing", as_bool)
    reader.keep("activation_offloading", ("enable_activation_offloading",))
    reader.keep("optimizer_in_bwd", ("optimizer_in_bwd",))
    reader.keep("compile", ("compile",))
    reader.keep("packed", ("dataset", "packed"))
    dtype = reader.converted(("dtype",), as_text)
    if dtype is not None:
        precision = TORCHTUNE_DTYPES.get(dtype.lower())
        if precision is None:
            reader.problem(("dtype",), f"dtype '{dtype}' is not one of bf16, fp32")
        else:
            reader.put("precision", precision, ("dtype",), "torchtune keeps everything in dtype")
    read_torchtune_optimizer(reader)
    loss = reader.converted(("loss", "_component_"), as_text)
    if loss is not None:
        loss_name = loss.rsplit(".", 1)[-1]
        if loss_name == "CEWithChunkedOutputLoss":
            reader.put("loss", "chunked", ("loss", "_component_"), loss_name)
        elif loss_name == "LinearCrossEntropyLoss":
            reader.put(
                "loss",
                "liger",
                ("loss", "_component_"),
                "LinearCrossEntropyLoss: logits computed chunk by chunk, never whole",
            )
        else:
            reader.put("loss", "standard", ("loss", "_component_"), loss_name)
    if method in ("lora", "qlora"):
        read_torchtune_lora(reader, method)
    for key, value, note in TORCHTUNE_DEFAULTS:
        reader.default(key, value, note)


TORCHTUNE_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("gradient_accumulation_steps", 1, "torchtune recipes' default"),
    ("gradient_checkpointing", False, "torchtune enable_activation_checkpointing default"),
    ("precision", "fp32", "torchtune: no dtype means float32"),
    ("attn_implementation", "sdpa", "torchtune attention runs on SDPA"),
    ("loss", "standard", "torchtune cross-entropy"),
)


def read_torchtune_optimizer(reader: DocumentReader) -> None:
    path = ("optimizer", "_component_")
    optimizer = reader.converted(path, as_text)
    if optimizer is None:
        return
    fused = reader.converted(("optimizer", "fused"), as_bool)
    reader.put("optim", optimizer_name(optimizer, fused), path, optimizer)


def optimizer_name(dotted_name: str, fused: bool | None = None) -> str:
    """The HF `optim` name for an optimizer class path; torchao's low-bit AdamW classes have
    their own names; an unknown class keeps its path (the budget says it is unknown)."""
    module, _, class_name = dotted_name.rpartition(".")
    if module.startswith("torchao"):
        low_bit = {"adamw8bit": "adamw_torch_8bit", "adamw4bit": "adamw_torch_4bit"}
        if class_name.lower() in low_bit:
            return low_bit[class_name.lower()]
    return optim_for_optimizer_class(dotted_name, fused=bool(fused)) or dotted_name


def read_torchtune_lora(reader: DocumentReader, method: str) -> None:
    model = ("model",)
    reader.put("lora.enabled", True, (*model, "_component_"), f"a {method} builder")
    reader.take((*model, "lora_rank"), "lora.r", as_int)
    reader.take((*model, "lora_alpha"), "lora.alpha", as_float)
    reader.take((*model, "lora_dropout"), "lora.dropout", as_float)
    reader.take((*model, "use_dora"), "lora.dora", as_bool)
    targets: list[str] = []
    attention = reader.converted((*model, "lora_attn_modules"), as_name_list)
    if attention is not None:
        targets.extend(TORCHTUNE_LORA_MODULES.get(name, name) for name in attention)
    if reader.converted((*model, "apply_lora_to_mlp"), as_bool):
        targets.extend(["gate_proj", "up_proj", "down_proj"])
    if reader.converted((*model, "apply_lora_to_output"), as_bool):
        targets.append("lm_head")
    if targets:
        located = (*model, "lora_attn_modules") if attention is not None else model
        reader.put("lora.target_modules", targets, located, "torchtune module names as in HF")
    reader.derived("lora_adapter_dtype", "model dtype", "torchtune keeps LoRA weights in dtype")
    if method == "qlora":
        located = (*model, "_component_")
        reader.put("quantization.bits", 4, located, "torchtune QLoRA: NF4 base weights")
        reader.put("quantization.quant_type", "nf4", located)
        reader.put(
            "quantization.double_quant", True, located, "torchao NF4 quantizes its scales again"
        )
        reader.put(
            "quantization.compute_dtype",
            "float32" if reader.reading.value_of("precision") == "fp32" else "bfloat16",
            located,
            "torchtune computes in dtype",
        )
        reader.put(
            "quantization.prepare_for_kbit_training",
            False,
            located,
            "torchtune does not upcast the frozen weights",
        )


# --------------------------------------------------------------------------------------------
# LitGPT


LITGPT_PRECISIONS = {
    "bf16-true": "bf16-true",
    "bf16-mixed": "bf16",
    "16-true": "fp16-true",
    "16-mixed": "fp16",
    "32-true": "fp32",
    "32": "fp32",
    "bf16": "bf16",
    "16": "fp16",
}
LITGPT_QUANTIZE = {
    "bnb.nf4": (4, "nf4", False),
    "bnb.nf4-dq": (4, "nf4", True),
    "bnb.fp4": (4, "fp4", False),
    "bnb.fp4-dq": (4, "fp4", True),
    "bnb.int8-training": (8, "int8", False),
}
LITGPT_LORA_MODULES = (
    ("lora_query", True, ["q_proj"]),
    ("lora_key", False, ["k_proj"]),
    ("lora_value", True, ["v_proj"]),
    ("lora_projection", False, ["o_proj"]),
    ("lora_mlp", False, ["gate_proj", "up_proj", "down_proj"]),
    ("lora_head", False, ["lm_head"]),
)


def litgpt_model_id(checkpoint_dir: str) -> str:
    """checkpoints/meta-llama/Llama-3.2-3B -> meta-llama/Llama-3.2-3B."""
    parts = [part for part in checkpoint_dir.replace("\\", "/").split("/") if part not in ("", ".")]
    if "checkpoints" in parts:
        parts = parts[parts.index("checkpoints") + 1 :]
    if len(parts) >= 2:
        return "/".join(parts[-2:])
    return checkpoint_dir


def read_litgpt(reader: DocumentReader) -> None:
    checkpoint = reader.converted(("checkpoint_dir",), as_text)
    if checkpoint is not None:
        reader.put("model_id", litgpt_model_id(checkpoint), ("checkpoint_dir",))
    # devices: "auto" or -1 means every GPU of the machine, which the file does not say
    devices = reader.converted(("devices",), as_int) if reader.get(("devices",)) != "auto" else None
    devices = devices if devices is not None and devices > 0 else None
    nodes = max(1, reader.converted(("num_nodes",), as_int) or 1)
    world_size = (devices or 1) * nodes
    if devices is not None:
        reader.put("distributed.world_size", world_size, ("devices",), "devices × num_nodes")
    micro = reader.take(("train", "micro_batch_size"), "per_device_train_batch_size", as_int)
    global_batch = reader.converted(("train", "global_batch_size"), as_int)
    micro = micro or 1
    if global_batch is not None:
        reader.put(
            "gradient_accumulation_steps",
            max(1, global_batch // world_size // micro),
            ("train", "global_batch_size"),
            "global_batch_size / devices / micro_batch_size",
        )
    else:
        reader.default(
            "gradient_accumulation_steps",
            max(1, 16 // world_size // micro),
            "LitGPT global_batch_size default 16 / devices / micro_batch_size",
        )
    if reader.found(("train", "max_seq_length"))[0] and not reader.is_set(
        ("train", "max_seq_length")
    ):
        reader.problem(
            ("train", "max_seq_length"),
            "max_seq_length is null: the longest sequence in the data sets the memory",
        )
    reader.take(("train", "max_seq_length"), "max_seq_length", as_int)
    precision = reader.converted(("precision",), as_text)
    if precision is not None:
        mapped = LITGPT_PRECISIONS.get(precision.lower())
        if mapped is None:
            reader.problem(("precision",), f"precision '{precision}' is not a LitGPT precision")
        else:
            reader.put("precision", mapped, ("precision",), f"precision: {precision}")
    read_litgpt_quantize(reader)
    read_litgpt_optimizer(reader)
    lora_keys = [key for key, _, _ in LITGPT_LORA_MODULES] + ["lora_r", "lora_alpha"]
    if any(reader.is_set((key,)) for key in lora_keys):
        read_litgpt_lora(reader)
    if world_size > 1:
        reader.default(
            "gradient_checkpointing", True, "LitGPT's FSDP strategy checkpoints every block"
        )
        reader.default("distributed.fsdp", "full_shard", "LitGPT shards with FSDP on >1 GPU")
    for key, value, note in LITGPT_DEFAULTS:
        reader.default(key, value, note)


LITGPT_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("per_device_train_batch_size", 1, "LitGPT train.micro_batch_size default"),
    ("gradient_checkpointing", False, "LitGPT checkpoints only under FSDP"),
    ("precision", "bf16", "LitGPT default bf16-mixed on GPUs with bf16"),
    ("optim", "adamw_torch", "LitGPT default optimizer AdamW"),
    ("attn_implementation", "sdpa", "LitGPT attention runs on SDPA"),
    ("loss", "chunked", "LitGPT chunked cross-entropy (lm_head_chunk_size=128)"),
)


def read_litgpt_quantize(reader: DocumentReader) -> None:
    quantize = reader.converted(("quantize",), as_text)
    if quantize is None:
        return
    known = LITGPT_QUANTIZE.get(quantize.lower())
    if known is None:
        reader.problem(("quantize",), f"quantize '{quantize}' is not read")
        return
    bits, quant_type, double_quant = known
    reader.put("quantization.bits", bits, ("quantize",))
    reader.put("quantization.quant_type", quant_type, ("quantize",))
    reader.put("quantization.double_quant", double_quant, ("quantize",))
    precision = reader.reading.value_of("precision") or "bf16-true"
    reader.put(
        "quantization.compute_dtype",
        {"fp16-true": "float16", "fp32": "float32"}.get(precision, "bfloat16"),
        ("quantize",),
        "LitGPT computes in the precision's dtype",
    )
    reader.put(
        "quantization.prepare_for_kbit_training",
        False,
        ("quantize",),
        "LitGPT keeps the frozen weights in the precision's dtype",
    )
    if not reader.is_set(("optimizer",)):
        reader.reading.settings.append(
            Setting(
                "optim",
                "paged_adamw_32bit",
                Provenance.DEFAULT,
                None,
                "LitGPT uses bitsandbytes PagedAdamW with --quantize",
            )
        )


def read_litgpt_optimizer(reader: DocumentReader) -> None:
    path: KeyPath = ("optimizer",)
    raw = reader.get(path)
    if isinstance(raw, dict):
        path = ("optimizer", "class_path")
        raw = reader.get(path)
    if not isinstance(raw, str) or not raw:
        return
    class_name = raw.rsplit(".", 1)[-1].lower()
    quantized = reader.reading.has("quantization.bits")
    name = optimizer_name(raw)
    if quantized and class_name == "adamw":
        name = "paged_adamw_32bit"
    reader.put(
        "optim",
        name,
        path,
        raw
        + (
            " (bitsandbytes PagedAdamW with --quantize)"
            if quantized and class_name == "adamw"
            else ""
        ),
    )


def read_litgpt_lora(reader: DocumentReader) -> None:
    reader.put("lora.enabled", True, ("lora_r",) if reader.is_set(("lora_r",)) else None)
    reader.take(("lora_r",), "lora.r", as_int)
    reader.take(("lora_alpha",), "lora.alpha", as_float)
    reader.take(("lora_dropout",), "lora.dropout", as_float)
    targets: list[str] = []
    first_written: KeyPath | None = None
    for key, default, modules in LITGPT_LORA_MODULES:
        enabled = reader.converted((key,), as_bool)
        if enabled is not None and first_written is None:
            first_written = (key,)
        if enabled if enabled is not None else default:
            targets.extend(modules)
    if first_written is not None:
        reader.put("lora.target_modules", targets, first_written, "lora_query, lora_key, ...")
    for key, value, note in LITGPT_LORA_DEFAULTS:
        reader.default(key, value, note)


LITGPT_LORA_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("lora.r", 8, "LitGPT lora_r default"),
    ("lora.alpha", 16.0, "LitGPT lora_alpha default"),
    ("lora.dropout", 0.05, "LitGPT lora_dropout default"),
    ("lora.target_modules", ["q_proj", "v_proj"], "LitGPT lora_query and lora_value defaults"),
)


FRAMEWORK_READERS: dict[str, Callable[[DocumentReader], None]] = {
    "hf": read_hf,
    "trl": read_hf,
    "axolotl": read_axolotl,
    "llamafactory": read_llamafactory,
    "torchtune": read_torchtune,
    "litgpt": read_litgpt,
    "deepspeed": read_deepspeed_file,
    "accelerate": read_accelerate,
}

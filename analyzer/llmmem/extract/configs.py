"""Training configs, YAML and JSON, read into a TrainingPlan.

This module detects which framework a file is written for, from the keys it uses, and calls that
framework's reader in `llmmem.extract.frameworks`:

    deepspeed     zero_optimization, train_micro_batch_size_per_gpu, bf16.enabled
    accelerate    distributed_type, num_processes, mixed_precision, fsdp_config, deepspeed_config
    torchtune     model._component_: torchtune.models..., batch_size, dtype, tokenizer.max_seq_len
    litgpt        checkpoint_dir, train.micro_batch_size, precision: bf16-true, quantize: bnb.nf4
    llamafactory  finetuning_type, stage, lora_rank, cutoff_len (and its v1 schema: model,
                  peft_config, quant_config, dist_config, micro_batch_size)
    axolotl       base_model, micro_batch_size, sequence_len, adapter: lora|qlora
    verl          actor_rollout_ref (RL), or data.micro_batch_size_per_gpu and
                  model.partial_pretrain (FSDP SFT); trainer.n_gpus_per_node × nnodes GPUs
    trl / hf      HfArgumentParser / TrlParser keys: model_name_or_path, per_device_train_batch_size

A reader turns keys into `Setting`s: a plan key (see `llmmem.extract.builder`), the value in the
plan's terms, its provenance and the range of the value's text. Values written in the file are
`explicit`; the framework's own defaults, where the file is silent, are `default`; values read from
a file this one refers to (`deepspeed: ds_z3.json`) are `config`, with the range in that file
(`SourceRange.path` set to it). The settings are then replayed into the plan builder, with the
project's `[tool.llmmem]` settings and the file's pragmas.

Nothing here raises on bad input: an unreadable file, a value of the wrong type or a missing
referenced file becomes a problem line and the rest is read.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmmem.extract.builder import PlanBuilder
from llmmem.extract.frameworks.accelerate import is_accelerate_config, read_accelerate
from llmmem.extract.frameworks.axolotl import is_axolotl_config, read_axolotl
from llmmem.extract.frameworks.common import (
    ConfigReading,
    DocumentReader,
    config_kind,
    holds_mapping,
    parse_config_text,
)
from llmmem.extract.frameworks.deepspeed import is_deepspeed_config, read_deepspeed_file
from llmmem.extract.frameworks.hf_yaml import is_trl_config, read_hf
from llmmem.extract.frameworks.litgpt import is_litgpt_config, read_litgpt
from llmmem.extract.frameworks.llamafactory import is_llamafactory_config, read_llamafactory
from llmmem.extract.frameworks.run_sections import read_run_sections
from llmmem.extract.frameworks.swift import read_swift
from llmmem.extract.frameworks.torchtune import is_torchtune_config, read_torchtune
from llmmem.extract.frameworks.verl import is_verl_config, read_verl
from llmmem.extract.pragmas import ProjectSettings, apply_project_settings
from llmmem.extract.text import apply_file_pragmas, plan_from_problems
from llmmem.extract.yaml_positions import KeyPath, PositionedYaml
from llmmem.plan import SourceRange, TrainingPlan

__all__ = [
    "FRAMEWORK_CONFIG_CLASSES",
    "FRAMEWORK_READERS",
    "ConfigReading",
    "Override",
    "build_plan",
    "detect_framework",
    "extract_config_plan",
    "overlay_document",
    "read_config",
]

# --------------------------------------------------------------------------------------------
# which framework

# the first test that holds names the framework; "hf" when none does
FRAMEWORK_TESTS: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = (
    ("verl", is_verl_config),
    ("deepspeed", is_deepspeed_config),
    ("accelerate", is_accelerate_config),
    ("torchtune", is_torchtune_config),
    ("litgpt", is_litgpt_config),
    ("llamafactory", is_llamafactory_config),
    ("axolotl", is_axolotl_config),
    ("trl", is_trl_config),
)


def detect_framework(value: Any) -> str:
    """The framework a config is written for, from its keys; "hf" when nothing else fits."""
    if not isinstance(value, dict):
        return "hf"
    for framework, test in FRAMEWORK_TESTS:
        if test(value):
            return framework
    return "hf"


FRAMEWORK_READERS: dict[str, Callable[[DocumentReader], None]] = {
    "hf": read_hf,
    "trl": read_hf,
    "axolotl": read_axolotl,
    "llamafactory": read_llamafactory,
    "torchtune": read_torchtune,
    "litgpt": read_litgpt,
    "deepspeed": read_deepspeed_file,
    "accelerate": read_accelerate,
    "verl": read_verl,
    "swift": read_swift,  # named by its launcher (`swift sft`): its keys are not distinctive
}


# --------------------------------------------------------------------------------------------
# the public entry points


def extract_config_plan(
    path: Path, text: str | None = None, *, settings: ProjectSettings | None = None
) -> TrainingPlan:
    """The TrainingPlan a YAML or JSON training config describes. Never raises."""
    path = Path(path)
    kind = config_kind(path)
    try:
        reading = read_config(path, text)
        return build_plan(reading, path, reading.kind, reading.framework, settings=settings)
    except RecursionError:
        return plan_from_problems(path, kind, settings, ["the file nests too deeply to read"])
    except Exception as error:  # a gap in a reader must not take the editor down
        problem = f"internal error while reading the config: {error!r}"
        return plan_from_problems(path, kind, settings, [problem])


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
    reading = ConfigReading(
        path=path, kind=config_kind(path), framework="hf", range_path=range_path
    )
    document = parse_config_text(reading, text)
    if overrides:
        document = overlay_document(document, overrides)
    if not holds_mapping(reading, document):
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
    if range_path is None and reading.framework in ("hf", "trl", "axolotl"):
        read_run_sections(reader, document.value)  # the file alone, not as a launch's config
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
    laid = [override for override in overrides if override.path]
    for override in laid:
        current = value
        for step in override.path[:-1]:
            child = current.get(step) if isinstance(step, str) else None
            if not isinstance(child, dict):
                child = {}
                current[step] = child
            current = child
        current[override.path[-1]] = override.value
    # a range stays unless a later override replaces its path or a path above it: one pass
    # over the document's ranges and one over the overrides, from the last one back
    overridden = {override.path for override in laid}
    ranges = {
        path: located
        for path, located in document.ranges.items()
        if not _under_any(path, overridden)
    }
    later: set[KeyPath] = set()
    kept: list[Override] = []
    for override in reversed(laid):
        if not _under_any(override.path, later):
            kept.append(override)
        later.add(override.path)
    ranges.update((override.path, override.range) for override in reversed(kept))
    return PositionedYaml(
        value=value, ranges=ranges, key_ranges=document.key_ranges, problems=document.problems
    )


def _under_any(path: KeyPath, prefixes: set[KeyPath]) -> bool:
    """Whether `path` is one of `prefixes` or lies below one of them."""
    return any(path[:length] in prefixes for length in range(1, len(path) + 1))


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
    "verl": "none",
    "swift": "TrainingArguments",
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
    builder.rejected.extend(reading.rejected)
    if reading.refused is not None:
        builder.unreadable = reading.refused
    if reading.syntax_error is not None:  # LLM015 says it where it is: not a problem line too
        builder.parse_error = reading.syntax_error.message
        builder.parse_error_range = reading.syntax_error.range
    apply_file_pragmas(builder, reading.text, reading.range_path)
    plan = builder.build(
        str(path),
        kind,
        framework,
        config_class=config_class or FRAMEWORK_CONFIG_CLASSES.get(framework, "TrainingArguments"),
    )
    told = reading.syntax_error.problem if reading.syntax_error is not None else None
    plan.problems.extend(
        problem for problem in reading.problems if problem not in plan.problems and problem != told
    )
    return plan

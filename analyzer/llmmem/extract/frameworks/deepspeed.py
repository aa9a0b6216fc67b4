"""DeepSpeed JSON: the ZeRO stage, offload, buckets, micro-batch and precision, on its own or
referred to by a training config (`deepspeed: ds_z3.json`, accelerate's deepspeed_config_file).

A DeepSpeed value of "auto" is filled in by the trainer, so the trainer-side value stands and
says so in its note; a concrete DeepSpeed value only fills what the trainer side leaves unsaid.
No DeepSpeed defaults are set here: what the file leaves out is the trainer's to say.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmmem.extract.frameworks.common import (
    ConfigReading,
    DocumentReader,
    NumberProblem,
    Setting,
    as_bool,
    as_count,
    as_int,
    as_text,
    config_kind,
    holds_mapping,
    parse_config_text,
)
from llmmem.extract.frameworks.spelling import (
    KeyWrite,
    Spelling,
    double_accumulation,
    half_batch,
)
from llmmem.extract.text import display_path, resolve_reference
from llmmem.extract.yaml_positions import KeyPath, describe_location
from llmmem.plan import Provenance

DEEPSPEED_KEYS = frozenset(
    {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"}
)


def is_deepspeed_config(value: dict[str, Any]) -> bool:
    """A DeepSpeed JSON: ZeRO or batch keys at the top, or a `bf16`/`fp16` block."""
    return bool(set(value) & DEEPSPEED_KEYS) or (
        isinstance(value.get("bf16"), dict) or isinstance(value.get("fp16"), dict)
    )


def as_bucket(value: Any, *, at_least: int = 1) -> int | str:
    """A DeepSpeed bucket size: elements (`5e8` too), or "auto" for the trainer to size."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    number = as_int(value)
    if number < at_least:
        raise NumberProblem(f'must be a number of elements or "auto", got {value!r}')
    return number


def as_elements_or_auto(value: Any) -> int | str:
    """ZeRO-3's prefetch bucket and persistence threshold: elements (0 turns it off), "auto"."""
    return as_bucket(value, at_least=0)


# ZeRO-3's sizes in elements: the config's name, the plan's
STAGE3_SIZES = (
    ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
    ("stage3_param_persistence_threshold", "param_persistence_threshold"),
)


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
    offloaded_optimizer = False
    for offload_key, plan_key in (
        ("offload_optimizer", "distributed.offload_optimizer"),
        ("offload_param", "distributed.offload_params"),
    ):
        device_path = (*zero, offload_key, "device")
        device = reader.converted(device_path, as_text)
        if device is not None:
            offloaded = device.lower() in ("cpu", "nvme")
            reader.put(plan_key, offloaded, device_path, f"device: {device}")
            if offload_key == "offload_optimizer":
                offloaded_optimizer = offloaded
    for legacy_key, plan_key in (
        ("cpu_offload", "distributed.offload_optimizer"),
        ("cpu_offload_params", "distributed.offload_params"),
    ):
        legacy = reader.take((*zero, legacy_key), plan_key, as_bool)
        if legacy_key == "cpu_offload" and legacy:
            offloaded_optimizer = True
    reader.take((*zero, "reduce_bucket_size"), "distributed.reduce_bucket_size", as_bucket)
    for flag in ("overlap_comm", "contiguous_gradients"):
        reader.take((*zero, flag), f"distributed.{flag}", as_bool)
    reuse = (*zero, "stage3_max_reuse_distance")
    reader.take(reuse, "distributed.max_reuse_distance", as_count)
    for name, key in STAGE3_SIZES:
        reader.take((*zero, name), f"distributed.{key}", as_elements_or_auto)
    reader.take((*zero, "sub_group_size"), "distributed.sub_group_size", as_count)
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
    optimizer_type = (*prefix, "optimizer", "type")
    optimizer = reader.converted(optimizer_type, as_text)
    if optimizer is not None:
        torch_adam = reader.converted((*prefix, "optimizer", "params", "torch_adam"), as_bool)
        name, built = deepspeed_optimizer(optimizer, offloaded_optimizer, bool(torch_adam))
        reader.put("optim", name, optimizer_type, f"DeepSpeed optimizer {optimizer}: {built}")
    reader.keep("deepspeed_activation_checkpointing", (*prefix, "activation_checkpointing"))
    # Ulysses' group in a DeepSpeed config (the HF integration's ALST: sequence_parallel_size)
    reader.keep("deepspeed_sequence_parallel_size", (*prefix, "sequence_parallel_size"))
    return auto_keys


# The class DeepSpeed 0.19.8 builds for a config's `optimizer.type` (runtime/engine.py
# `_configure_basic_optimizer` :2476-2550, `get_optimizer_configuration` :2377-2409): Adam and
# AdamW are FusedAdam, DeepSpeedCPUAdam where the optimizer is offloaded (`zero_use_cpu_optimizer`,
# :1562-1565: offload_optimizer's device cpu or nvme), torch's AdamW with `torch_adam: true`;
# Lion is FusedLion, DeepSpeedCPULion offloaded. Each as (on the GPU, offloaded), by the budget's
# optimizer names (budget.optimizers).
DEEPSPEED_OPTIMIZERS: dict[str, tuple[str, str]] = {
    "adamw": ("deepspeed_fused_adam", "deepspeed_cpu_adam"),
    "adam": ("deepspeed_fused_adam", "deepspeed_cpu_adam"),
    "fusedadam": ("deepspeed_fused_adam", "deepspeed_fused_adam"),
    "cpuadam": ("deepspeed_cpu_adam", "deepspeed_cpu_adam"),
    "lion": ("deepspeed_fused_lion", "deepspeed_cpu_lion"),
    "onebitadam": ("adamw_torch", "adamw_torch"),
    "lamb": ("adamw_torch", "adamw_torch"),
}
DEEPSPEED_OPTIMIZER_CLASSES = {
    "deepspeed_fused_adam": "FusedAdam",
    "deepspeed_cpu_adam": "DeepSpeedCPUAdam",
    "deepspeed_fused_lion": "FusedLion",
    "deepspeed_cpu_lion": "DeepSpeedCPULion",
}


def deepspeed_optimizer(written: str, offloaded: bool, torch_adam: bool) -> tuple[str, str]:
    """The budget's name for the optimizer DeepSpeed builds from `optimizer.type`, and what it
    builds, in words."""
    key = written.strip().lower().replace("_", "")
    if torch_adam and key in ("adam", "adamw"):
        return "adamw_torch", "torch's AdamW (torch_adam: true)"
    on_gpu, on_host = DEEPSPEED_OPTIMIZERS.get(key, (written, written))
    name = on_host if offloaded else on_gpu
    built = DEEPSPEED_OPTIMIZER_CLASSES.get(name)
    if built is None:
        return name, "sized as " + name
    return name, built + (" (the optimizer is offloaded)" if offloaded else "")


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
    referenced = read_referenced_deepspeed(target)
    reader.reading.problems.extend(referenced.problems)
    if referenced.framework != "deepspeed":
        reader.problem(path, f"'{reference}' does not look like a DeepSpeed config")
        return
    merge_deepspeed(reader.reading, referenced, referenced.deepspeed_auto_keys)


# `no_offload`, `nooffload`, `without_offload`, `wo_offload`: a name that says there is none
NO_OFFLOAD_NAME = re.compile(r"(?:no|without|wo|non)[_\-]?offload")


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
    if "offload" in name and not NO_OFFLOAD_NAME.search(name):
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
    reading.rejected.extend(deepspeed.rejected)
    for setting in deepspeed.settings:
        existing = reading.setting(setting.key)
        if existing is None or existing.source is Provenance.DEFAULT:
            reading.settings.append(setting)
        elif setting.key == "optim":
            # an `optimizer` section is what DeepSpeed steps with: the HF trainer hands it a
            # placeholder and never builds its own (transformers 5.24
            # integrations/deepspeed.py `deepspeed_optim_sched`, :576-577)
            note = f"{setting.note}; the trainer's optim {existing.value!r} is not used"
            reading.settings[:] = [kept for kept in reading.settings if kept.key != "optim"]
            reading.settings.append(
                Setting(setting.key, setting.value, setting.source, setting.range, note)
            )
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


def read_referenced_deepspeed(target: Path) -> ConfigReading:
    """The DeepSpeed file another file names, read as DeepSpeed; its framework stays "hf" (and
    nothing is read) when it does not look like one."""
    range_path = display_path(target)
    reading = ConfigReading(
        path=target, kind=config_kind(target), framework="hf", range_path=range_path
    )
    document = parse_config_text(reading, None)
    if holds_mapping(reading, document) and is_deepspeed_config(document.value):
        reading.framework = "deepspeed"
        read_deepspeed_file(
            DocumentReader(document, reading, range_path=range_path, file_path=target)
        )
    return reading


# --------------------------------------------------------------------------------------------
# how a fix is written in this framework's config (`llmmem.extract.frameworks.spelling`)

# DeepSpeed JSON: deepspeed/runtime/config.py (bf16.enabled, train_micro_batch_size_per_gpu,
# gradient_accumulation_steps); its activation_checkpointing block only acts on models that call
# deepspeed.checkpointing, so no checkpointing entry.
FIX_SPELLINGS: dict[str, Spelling] = {
    "bf16": (KeyWrite(("bf16", "enabled"), True, only_if_written=True),),
    "halve-batch": (
        KeyWrite(("train_micro_batch_size_per_gpu",), half_batch, only_if_written=True),
        KeyWrite(("gradient_accumulation_steps",), double_accumulation, only_if_written=True),
    ),
}

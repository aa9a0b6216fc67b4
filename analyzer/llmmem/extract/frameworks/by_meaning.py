"""A project's own config schema, read by what its keys mean.

Projects load their own YAML or JSON (Hydra groups, a dataclass of their own, a dict passed to
TrainingArguments) with keys at any depth: `model: {name: ...}`, `training:
{per_device_train_batch_size: ...}`, `lora: {r: 8, lora_alpha: 16}`, `pretrained_model`,
`per_device_batch_size`, `use_lora: true`. Each key is looked up in the vocabulary of spellings
(`llmmem.extract.vocabulary`, and the project spellings below), inside its section's meaning (a
`lora:` section's `r` is the rank, a `model:` section's `name` the model), and taken with the
path it was found at as its note. What the framework readers already took is not read again.

Sections that describe something other than the training step (generation, evaluation,
inference, logging) are not read. A key found at several places with different values is not
used, with a problem line naming them, unless one spelling or place is plainly the training's
(the exact name, inside a `training:` section). LoRA is read from these keys only where the
document is not one TRL's parser takes (`trl_fields`): there `lora_r` without `use_peft` trains
every weight, and `read_hf_peft` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmmem.extract.frameworks.common import (
    DocumentReader,
    ValueProblem,
    as_bool,
    as_dtype,
    as_float,
    as_int,
    as_text,
    lora_targets,
)
from llmmem.extract.frameworks.trl_fields import HF_TRL_ARGUMENTS
from llmmem.extract.vocabulary import KEY_SYNONYMS, lora_key, objective_of_keys
from llmmem.extract.yaml_positions import KeyPath

MAX_DEPTH = 6
# GRPOConfig's fields the GRPO step is sized from (`preference_plan.grpo_setup`)
GRPO_KEPT = (
    "num_generations",
    "beta",
    "use_vllm",
    "vllm_mode",
    "vllm_gpu_memory_utilization",
    "vllm_enable_sleep_mode",
    "steps_per_generation",
    "num_iterations",
)
SKIPPED_SECTIONS = frozenset(
    {
        "generation",
        "generate",
        "generation_config",
        "eval",
        "evaluation",
        "evaluate",
        "inference",
        "infer",
        "sampling",
        "predict",
        "prediction",
        "test",
        "serving",
        "vllm",
        "judge",
        "wandb",
        "logging",
        "tensorboard",
    }
)
LORA_SECTIONS = frozenset({"lora", "peft", "lora_config", "peft_config", "adapter", "lora_args"})
QUANT_SECTIONS = frozenset(
    {"quantization", "quant", "bnb", "bitsandbytes", "quantization_config", "bnb_config"}
)
MODEL_SECTIONS = frozenset({"model", "model_args", "model_config", "model_arguments"})
TRAINING_SECTIONS = frozenset(
    {"training", "train", "trainer", "training_args", "training_arguments", "args", "hparams"}
)
QUANT_NAMES_IN_SECTION = {
    "quant_type": "quantization.quant_type",
    "compute_dtype": "quantization.compute_dtype",
    "double_quant": "quantization.double_quant",
}
MODEL_NAMES_IN_SECTION = frozenset(
    {"name", "path", "id", "name_or_path", "model_name_or_path", "model_name", "model_id"}
)
# project spellings the frameworks do not use (the frameworks' are in KEY_SYNONYMS)
PROJECT_SPELLINGS: dict[str, str] = {
    "pretrained_model": "model_id",
    "model_path": "model_id",
    "base_model_path": "model_id",
    "base_model_name": "model_id",
    "per_device_batch_size": "per_device_train_batch_size",
    "train_micro_batch_size": "per_device_train_batch_size",
    "optimizer_type": "optim",
    "context_length": "max_seq_length",
    "max_len": "max_seq_length",
}
LORA_SWITCHES = frozenset({"use_lora", "use_peft", "lora", "peft", "enabled", "enable"})
FOUR_BIT_SWITCHES = frozenset({"load_in_4bit", "use_4bit", "4bit"})
EIGHT_BIT_SWITCHES = frozenset({"load_in_8bit", "use_8bit", "8bit"})

CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "model_id": as_text,
    "per_device_train_batch_size": as_int,
    "gradient_accumulation_steps": as_int,
    "max_seq_length": as_int,
    "max_prompt_length": as_int,
    "max_completion_length": as_int,
    "gradient_checkpointing": as_bool,
    "bf16": as_bool,
    "fp16": as_bool,
    "torch_dtype": as_dtype,
    "optim": as_text,
    "lora.r": as_int,
    "lora.alpha": as_float,
    "lora.dropout": as_float,
    "lora.target_modules": lora_targets,
    "quantization.quant_type": as_text,
    "quantization.double_quant": as_bool,
    "quantization.compute_dtype": as_dtype,
    "distributed.world_size": as_int,
}


@dataclass(frozen=True)
class Found:
    key: str
    path: KeyPath
    value: Any
    rank: int  # higher: more plainly the training's own value


def read_by_meaning(reader: DocumentReader) -> None:
    """The plan keys the document states under a project's own names and sections."""
    root = reader.get(())
    if not isinstance(root, dict):
        return
    found: list[Found] = []
    switches: dict[str, tuple[KeyPath, Any]] = {}
    names: dict[str, object] = {}
    _walk(root, (), None, found, switches, names)
    taken = {key for key in _by_key(found) if reader.reading.has(key)}
    for key, candidates in _by_key(found).items():
        if key in taken or key.startswith("lora."):
            continue
        _take(reader, key, candidates)
    _read_lora(reader, found, switches)
    _read_quantization(reader, switches)
    if not reader.reading.has("objective"):
        named = objective_of_keys(names)
        if named is not None:
            objective, name = named
            path = next((f.path for f in found if f.path[-1] == name), None)
            if path is None:
                path = _path_of(root, name)
            reader.put("objective", objective, path, f"`{name}` is a {objective.upper()} key")
            if objective == "grpo":
                for kept in GRPO_KEPT:
                    kept_path = _path_of(root, kept)
                    if kept_path is not None and not reader.reading.has(kept):
                        reader.keep(kept, kept_path)


def _walk(
    node: dict[Any, Any],
    path: KeyPath,
    section: str | None,
    found: list[Found],
    switches: dict[str, tuple[KeyPath, Any]],
    names: dict[str, object],
) -> None:
    if len(path) >= MAX_DEPTH:
        return
    for raw_key, value in node.items():
        if not isinstance(raw_key, str):
            continue
        key = raw_key.strip().lower()
        here = (*path, raw_key)
        if isinstance(value, dict):
            if key in SKIPPED_SECTIONS:
                continue
            _walk(value, here, key, found, switches, names)
            continue
        names.setdefault(key, value)
        meaning = _meaning(key, section)
        if meaning is None:
            if key in LORA_SWITCHES and (section in LORA_SECTIONS or key.startswith("use_")):
                switches.setdefault("lora", (here, value))
            elif key in FOUR_BIT_SWITCHES or key in EIGHT_BIT_SWITCHES:
                switches.setdefault(key, (here, value))
            elif section in QUANT_SECTIONS and key in ("bits", "load_in_bits"):
                switches.setdefault("bits", (here, value))
            continue
        rank = (2 if key == meaning.rsplit(".", 1)[-1] or key == _exact(meaning) else 1) + (
            1 if section in TRAINING_SECTIONS else 0
        )
        found.append(Found(meaning, here, value, rank))


def _meaning(key: str, section: str | None) -> str | None:
    if section in LORA_SECTIONS:
        return lora_key(key)
    if section in MODEL_SECTIONS and key in MODEL_NAMES_IN_SECTION:
        return "model_id"
    if section in QUANT_SECTIONS and key in QUANT_NAMES_IN_SECTION:
        return QUANT_NAMES_IN_SECTION[key]
    meaning = KEY_SYNONYMS.get(key) or PROJECT_SPELLINGS.get(key)
    return meaning if meaning in CONVERTERS else None


def _exact(meaning: str) -> str:
    """The framework's own name for a plan key (`model_name_or_path` for the model)."""
    return {"model_id": "model_name_or_path", "torch_dtype": "torch_dtype"}.get(meaning, meaning)


def _by_key(found: list[Found]) -> dict[str, list[Found]]:
    grouped: dict[str, list[Found]] = {}
    for item in found:
        grouped.setdefault(item.key, []).append(item)
    return grouped


def _take(reader: DocumentReader, key: str, candidates: list[Found]) -> bool:
    """The candidate plainly meant: the best ranked, where every one of that rank agrees."""
    best = max(item.rank for item in candidates)
    top = [item for item in candidates if item.rank == best]
    convert = CONVERTERS[key]
    values = []
    for item in top:
        try:
            values.append(convert(item.value))
        except ValueProblem:
            return False
    if any(value != values[0] for value in values[1:]):
        places = ", ".join(".".join(map(str, item.path)) for item in top)
        reader.problem(top[0].path, f"{key} is written at {places} with different values; not used")
        return False
    chosen = top[0]
    note = f"found at {'.'.join(map(str, chosen.path))}"
    reader.put(key, values[0], chosen.path, note)
    return True


def _read_lora(
    reader: DocumentReader, found: list[Found], switches: dict[str, tuple[KeyPath, Any]]
) -> None:
    """LoRA from a project's keys: a rank or an explicit switch, where nothing turned it off
    and the document is not TRL's (whose `use_peft` decides)."""
    if reader.reading.has("lora.enabled"):
        return
    root = reader.get(())
    if isinstance(root, dict) and ("use_peft" in root or all(k in HF_TRL_ARGUMENTS for k in root)):
        return
    lora = [item for item in found if item.key.startswith("lora.")]
    switch = switches.get("lora")
    if switch is not None:
        try:
            on = as_bool(switch[1])
        except ValueProblem:
            on = None
        if on is False:
            return
    ranks = [item for item in lora if item.key == "lora.r"]
    if not ranks and switch is None:
        return
    where = switch[0] if switch is not None else ranks[0].path
    note = "a LoRA switch of the project's own config" if switch else "a LoRA rank is written"
    reader.put("lora.enabled", True, where, note)
    for key, candidates in _by_key(lora).items():
        _take(reader, key, candidates)


def _read_quantization(reader: DocumentReader, switches: dict[str, tuple[KeyPath, Any]]) -> None:
    if reader.reading.has("quantization.bits"):
        return
    if "bits" in switches:
        path, raw = switches["bits"]
        try:
            bits = as_int(raw)
        except ValueProblem:
            bits = 0
        if bits in (4, 8):
            reader.put("quantization.bits", bits, path, f"found at {'.'.join(map(str, path))}")
            return
    for names, bits in ((FOUR_BIT_SWITCHES, 4), (EIGHT_BIT_SWITCHES, 8)):
        for name in sorted(names):
            if name not in switches:
                continue
            path, raw = switches[name]
            try:
                on = as_bool(raw)
            except ValueProblem:
                continue
            if on:
                reader.put("quantization.bits", bits, path, f"{path[-1]}: true")
                return


def _path_of(node: dict[Any, Any], name: str, path: KeyPath = ()) -> KeyPath | None:
    for key, value in node.items():
        if key == name:
            return (*path, key)
        if isinstance(value, dict) and len(path) < MAX_DEPTH:
            inner = _path_of(value, name, (*path, key))
            if inner is not None:
                return inner
    return None

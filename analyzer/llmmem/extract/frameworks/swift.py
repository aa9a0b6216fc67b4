"""ms-swift (`swift sft`, `swift pt`, `swift rlhf`): its own argument names and defaults.

Read in ms-swift 4.6.0, `swift/arguments/` (BaseArguments, ModelArguments, QuantizeArguments,
TunerArguments, TemplateArguments, SftArguments, RLHFArguments) and `swift/trainers/arguments.py`
(TrainArgumentsMixin); the 3.x spellings it still accepts (`train_type`, `model_id_or_path`) are
read too:

- the model is `--model`; LoRA is the default tuner (`tuner_type`, 3.x `train_type`: lora), with
  lora_rank 8, lora_alpha 32, lora_dropout 0.05 and target_modules all-linear;
- `--torch_dtype` is the weights' dtype, and swift turns mixed precision on from it: bf16 for
  bfloat16, fp16 for float16 and float32 (`ModelArguments._init_mixed_precision`); without it,
  the checkpoint's dtype;
- optim is HF's TrainingArguments' (swift sets none): adamw_torch_fused on current releases;
- per_device_train_batch_size 1, gradient_checkpointing on; gradient_accumulation_steps, when
  not given, is ceil(16 / batch / world size); max_length, when not given, the model's length;
- `--quant_method bnb --quant_bits 4` (nf4 and double quantization by default);
- `--deepspeed zero2|zero3|zero2_offload|zero3_offload` are swift's own files (zero2_offload
  moves the optimizer to the CPU, zero3_offload the parameters too), else a path;
- `swift rlhf --rlhf_type dpo|orpo|simpo|kto|cpo|rm|ppo|grpo|gkd` (default dpo);
- `--lora_dtype bfloat16` keeps the adapters in bf16 (tuners/peft.py `_cast_adapter_dtype_hook`;
  float16 ones are cast to fp32 by pipelines/train/tuner.py :403-407, None leaves peft's fp32);
- no `prepare_model_for_kbit_training` anywhere in swift (outside Megatron-SWIFT): a 4-bit
  model is not prepared (pipelines/train/tuner.py `prepare_model`);
- `--gradient_checkpointing_kwargs '{"use_reentrant": false}'` (a JSON text or a YAML mapping,
  trainers/arguments.py :299-300) says the checkpointing's kind; without it swift picks
  (budget.stacks.swift);
- `--use_liger_kernel true` is Liger's fused loss, as in the HF Trainer.

The plan's framework is "swift", so the budget is ms-swift's stack (budget.stacks.swift).

A launcher passes the flags as overrides of an empty document (see `extract/shell/reader.py`);
a YAML or JSON file given as swift's first argument holds the same keys.
"""

from __future__ import annotations

import json
import math
from typing import Any

from llmmem.extract.frameworks.common import (
    DocumentReader,
    Setting,
    as_attention,
    as_bool,
    as_dtype,
    as_float,
    as_int,
    as_text,
    lora_targets,
)
from llmmem.extract.frameworks.deepspeed import read_deepspeed_reference
from llmmem.plan import Provenance

SWIFT_COMMANDS = frozenset({"sft", "pt", "rlhf"})

# rlhf_type -> the plan's objective (SimPO is TRL's CPO loss; rm trains a reward model)
SWIFT_RLHF_OBJECTIVES = {
    "dpo": "dpo",
    "orpo": "orpo",
    "simpo": "cpo",
    "cpo": "cpo",
    "kto": "kto",
    "rm": "reward",
    "ppo": "ppo",
    "grpo": "grpo",
    "gkd": "gkd",
}

# swift's bundled DeepSpeed files (swift/config/*.json): stage, optimizer and parameters offloaded
SWIFT_DEEPSPEED_FILES: dict[str, tuple[int, bool, bool]] = {
    "zero0": (0, False, False),
    "zero1": (1, False, False),
    "zero2": (2, False, False),
    "zero2_offload": (2, True, False),
    "zero3": (3, False, False),
    "zero3_offload": (3, True, True),
}

# `--lora_dtype` (arguments/tuner_args.py :137)
SWIFT_LORA_DTYPES = ("float16", "bfloat16", "float32", "none")
SWIFT_LORA_DTYPES_TEXT = "float16, bfloat16, float32"

SWIFT_ATTENTION = {"flash_attn": "flash_attention_2", "flash_attention_2": "flash_attention_2"}

SWIFT_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("per_device_train_batch_size", 1, "ms-swift per_device_train_batch_size default"),
    ("gradient_checkpointing", True, "ms-swift gradient_checkpointing default"),
    # swift leaves `optim` to HF's TrainingArguments (trainers/arguments.py sets none): fused
    # AdamW from transformers 4.54 with torch 2.8, torch's foreach AdamW before (the release
    # rule, llmmem.release_defaults); ms-swift 4.6.0 on transformers 5.19 steps adamw_torch_fused
    (
        "optim",
        "adamw_torch_fused",
        "HF TrainingArguments optim, as ms-swift keeps it (fused from transformers 4.54 with "
        "torch 2.8)",
    ),
)
SWIFT_LORA_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("lora.r", 8, "ms-swift lora_rank default"),
    ("lora.alpha", 32.0, "ms-swift lora_alpha default"),
    ("lora.dropout", 0.05, "ms-swift lora_dropout default"),
    ("lora.target_modules", ["all-linear"], "ms-swift target_modules default: all-linear"),
)


def read_swift(reader: DocumentReader) -> None:
    """ms-swift's argument names (flags laid over an empty document, or its YAML)."""
    for path in (("model",), ("model_id_or_path",)):
        if reader.take(path, "model_id", as_text) is not None:
            break
    reader.take(("per_device_train_batch_size",), "per_device_train_batch_size", as_int)
    reader.take(("gradient_accumulation_steps",), "gradient_accumulation_steps", as_int)
    reader.take(("max_length",), "max_seq_length", as_int)
    reader.take(("gradient_checkpointing",), "gradient_checkpointing", as_bool)
    reader.take(("optim",), "optim", as_text)
    read_swift_precision(reader)
    attention = reader.converted(("attn_impl",), as_text)
    if attention is not None:
        name = SWIFT_ATTENTION.get(attention.lower(), attention)
        try:
            reader.put("attn_implementation", as_attention(name), ("attn_impl",))
        except ValueError:
            reader.problem(("attn_impl",), f"unknown attn_impl '{attention}'")
    read_swift_tuner(reader)
    read_swift_quantization(reader)
    read_swift_training_switches(reader)
    read_swift_deepspeed(reader)
    read_swift_objective(reader)
    for key, value, note in SWIFT_DEFAULTS:
        reader.default(key, value, note)


def read_swift_precision(reader: DocumentReader) -> None:
    """`--torch_dtype` loads the weights; swift sets the mixed precision from it unless
    `--bf16`/`--fp16` say otherwise."""
    dtype = reader.take(("torch_dtype",), "torch_dtype", as_dtype)
    bf16 = reader.take(("bf16",), "bf16", as_bool)
    fp16 = reader.take(("fp16",), "fp16", as_bool)
    if dtype is None and bf16 is None and fp16 is None:
        # the checkpoint's own dtype, and the mixed precision swift turns on for it (the
        # analysis reads the checkpoint's dtype: llmmem.scenario._swift_checkpoint_dtype)
        reader.default(
            "precision",
            "bf16-autocast",
            "ms-swift loads the checkpoint's dtype and turns on its mixed precision "
            "(bf16 weights under bf16 autocast for a bf16 checkpoint)",
        )
        return
    if dtype is None or bf16 is not None or fp16 is not None:
        return
    flag = "bf16" if dtype == "bfloat16" else "fp16"
    reader.reading.settings.append(
        Setting(
            flag,
            True,
            Provenance.DEFAULT,
            reader.range(("torch_dtype",)),
            f"ms-swift turns {flag} mixed precision on for torch_dtype {dtype}",
        )
    )


def read_swift_tuner(reader: DocumentReader) -> None:
    tuner = None
    for path in (("tuner_type",), ("train_type",)):
        tuner = reader.converted(path, as_text)
        if tuner is not None:
            tuner_path = path
            break
    if tuner is not None and tuner.lower() not in ("lora", "qlora", "dora"):
        if tuner.lower() != "full":
            reader.problem(tuner_path, f"tuner '{tuner}' is read as full fine-tuning")
        reader.put("lora.enabled", False, tuner_path, f"{tuner_path[0]}: {tuner}")
        return
    reader.put(
        "lora.enabled",
        True,
        tuner_path if tuner is not None else None,
        "ms-swift trains LoRA by default (tuner_type lora)" if tuner is None else "",
    )
    reader.take(("lora_rank",), "lora.r", as_int)
    reader.take(("lora_alpha",), "lora.alpha", as_float)
    reader.take(("lora_dropout",), "lora.dropout", as_float)
    reader.take(("target_modules",), "lora.target_modules", lora_targets)
    dora = reader.take(("use_dora",), "lora.dora", as_bool)
    if dora is None and tuner is not None and tuner.lower() == "dora":
        reader.put("lora.dora", True, tuner_path)
    for key, value, note in SWIFT_LORA_DEFAULTS:
        reader.default(key, value, note)


def read_swift_quantization(reader: DocumentReader) -> None:
    bits = None
    for path in (("quant_bits",), ("quantization_bit",)):
        bits = reader.converted(path, as_int)
        if bits is not None:
            bits_path = path
            break
    method = (reader.converted(("quant_method",), as_text) or "bnb").lower()
    if bits is None or bits not in (4, 8):
        return
    if method != "bnb":
        reader.problem(bits_path, f"quant_method {method} is read as bitsandbytes {bits}-bit")
    reader.put("quantization.bits", bits, bits_path)
    reader.take(("bnb_4bit_quant_type",), "quantization.quant_type", as_text)
    reader.take(("bnb_4bit_use_double_quant",), "quantization.double_quant", as_bool)
    reader.take(("bnb_4bit_compute_dtype",), "quantization.compute_dtype", as_dtype)
    # swift takes bnb_4bit_compute_dtype from the model's dtype: bfloat16 stays, float16 and
    # float32 compute in float32 (arguments/base_args/quant_args.py:116-121 in 4.6.0); without
    # --torch_dtype, the checkpoint's (bfloat16 for the models people fine-tune)
    dtype = reader.converted(("torch_dtype",), as_dtype)
    compute = "float32" if dtype in ("float16", "float32") else "bfloat16"
    given = dtype or "the checkpoint's (bfloat16 assumed)"
    reader.default(
        "quantization.compute_dtype",
        compute,
        f"ms-swift computes a 4-bit model in {compute} for torch_dtype {given}",
    )
    reader.default("quantization.quant_type", "nf4", "ms-swift bnb_4bit_quant_type default")
    reader.default("quantization.double_quant", True, "ms-swift bnb_4bit_use_double_quant")
    reader.default(
        "quantization.prepare_for_kbit_training",
        False,
        "ms-swift does not call peft's prepare_model_for_kbit_training",
    )


def read_swift_training_switches(reader: DocumentReader) -> None:
    """The adapters' dtype, the checkpointing's kind and Liger's loss, as swift takes them."""
    dtype = reader.converted(("lora_dtype",), as_text)
    if dtype is not None:
        name = dtype.strip().lower()
        if name not in SWIFT_LORA_DTYPES:
            reader.problem(("lora_dtype",), f"lora_dtype must be one of {SWIFT_LORA_DTYPES_TEXT}")
        elif name != "none":
            trained = "bfloat16" if name == "bfloat16" else "float32"
            note = "" if trained == name else f"swift trains {name} adapters in fp32"
            reader.put("lora_dtype", trained, ("lora_dtype",), note)
    path = ("gradient_checkpointing_kwargs",)
    raw = reader.get(path) if reader.is_set(path) else None
    if isinstance(raw, str) and raw.strip():
        try:
            raw = json.loads(raw)
        except ValueError:
            reader.problem(path, "gradient_checkpointing_kwargs must be a JSON object")
            raw = None
    if isinstance(raw, dict) and isinstance(raw.get("use_reentrant"), bool):
        reader.put("use_reentrant", raw["use_reentrant"], path)
    if reader.converted(("use_liger_kernel",), as_bool):
        reader.put("loss", "liger", ("use_liger_kernel",), "use_liger_kernel: true")


def read_swift_deepspeed(reader: DocumentReader) -> None:
    raw = reader.get(("deepspeed",))
    name = raw.strip().lower() if isinstance(raw, str) else None
    if name not in SWIFT_DEEPSPEED_FILES:
        read_deepspeed_reference(reader, ("deepspeed",))
        return
    stage, offload_optimizer, offload_params = SWIFT_DEEPSPEED_FILES[name]
    note = f"ms-swift's bundled DeepSpeed config {name}.json"
    reader.put("distributed.deepspeed_config", f"{name}.json", ("deepspeed",), note)
    reader.put("distributed.zero_stage", stage, ("deepspeed",), note)
    reader.put("distributed.offload_optimizer", offload_optimizer, ("deepspeed",), note)
    reader.put("distributed.offload_params", offload_params, ("deepspeed",), note)


def read_swift_objective(reader: DocumentReader) -> None:
    rlhf = reader.converted(("rlhf_type",), as_text)
    if rlhf is None:
        return
    objective = SWIFT_RLHF_OBJECTIVES.get(rlhf.lower())
    if objective is None:
        reader.problem(("rlhf_type",), f"unknown rlhf_type '{rlhf}'")
        return
    reader.put("objective", objective, ("rlhf_type",), f"rlhf_type: {rlhf}")
    if objective == "grpo":
        reader.take(("num_generations",), "num_generations", as_int)
        reader.take(("max_completion_length",), "max_completion_length", as_int)


def swift_accumulation(batch: int, world_size: int) -> int:
    """ms-swift's gradient_accumulation_steps where none is given: ceil(16 / batch / world)
    (`TrainArgumentsMixin.__post_init__`)."""
    return max(1, math.ceil(16 / batch / world_size))

"""HF Trainer / TRL configs (HfArgumentParser, TrlParser YAML): TrainingArguments, SFTConfig
and TRL's ModelConfig keys (ScriptArguments are ignored). The Trainer's own defaults are the
builder's table (`config_class`); only TRL ModelConfig's LoRA and 4-bit defaults are set here.
"""

from __future__ import annotations

from typing import Any

from llmmem.extract.frameworks.accelerate import read_fsdp_config_block
from llmmem.extract.frameworks.by_meaning import read_by_meaning
from llmmem.extract.frameworks.common import (
    DocumentReader,
    as_attention,
    as_bool,
    as_dtype,
    as_float,
    as_int,
    as_name_list,
    as_quant_storage,
    as_text,
    lora_targets,
)
from llmmem.extract.frameworks.deepspeed import read_deepspeed_reference
from llmmem.extract.frameworks.spelling import KeyWrite, Spelling, halve
from llmmem.extract.frameworks.trl_fields import unknown_to_hf_and_trl
from llmmem.extract.vocabulary import KEPT_TRAINING_SWITCHES
from llmmem.extract.yaml_positions import KeyPath

# keys only TRL's parsers (SFTConfig, DPOConfig, ModelConfig) know: the builder then defaults
# what the file leaves out from SFTConfig rather than TrainingArguments
TRL_KEYS = frozenset(
    {
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
)


def is_trl_config(value: dict[str, Any]) -> bool:
    return bool(set(value) & TRL_KEYS)


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
    for name in KEPT_TRAINING_SWITCHES:
        reader.keep(name, (name,))
    read_hf_bf16(reader)
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
    read_by_meaning(reader)  # a project's own keys and sections, and the objective its keys name


def read_hf_bf16(reader: DocumentReader) -> None:
    """`bf16: auto` is axolotl's spelling; TrainingArguments' bf16 is a bool and neither of its
    YAML readers falls back to fp16 on a GPU without bf16: TrlParser (`trl sft --config`) stops
    on it ("Truthy value expected"), HfArgumentParser.parse_yaml_file passes the text through
    and TrainingArguments takes it as true (and stops on a GPU without bf16). Read as true,
    with a problem line saying so."""
    path = ("bf16",)
    raw = reader.get(path)
    if not (isinstance(raw, str) and raw.strip().lower() == "auto"):
        reader.take(path, "bf16", as_bool)
        return
    reader.put(
        "bf16",
        True,
        path,
        "bf16: auto is taken as true by HfArgumentParser.parse_yaml_file; no fp16 fallback",
    )
    reader.problem(
        path,
        "bf16: auto is not a TrainingArguments value: TrlParser (trl sft --config) stops on it, "
        "HfArgumentParser.parse_yaml_file takes it as true, bf16 on every GPU (an error on one "
        "without bf16); write true or false",
    )


def read_hf_peft(reader: DocumentReader) -> None:
    """TRL ModelConfig: `use_peft: true` with lora_* keys (whose defaults are TRL's own)."""
    use_peft = reader.converted(("use_peft",), as_bool)
    if not use_peft:
        written = [
            key for key in ("lora_r", "lora_alpha", "lora_target_modules") if reader.is_set((key,))
        ]
        root = reader.get(())
        if written and isinstance(root, dict) and unknown_to_hf_and_trl(root):
            return  # not TRL's parser: the project's own keys say LoRA (`by_meaning`)
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


# read from TRL 1.9.0, trl/trainer/model_config.py (ModelConfig)
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


# --------------------------------------------------------------------------------------------
# how a fix is written in this framework's config (`llmmem.extract.frameworks.spelling`)

# HF TrainingArguments / TRL SFTConfig + ModelConfig YAML (`trl sft --config`,
# HfArgumentParser.parse_yaml_file): transformers/training_args.py, trl/trainer/model_config.py
FIX_SPELLINGS: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("gradient_checkpointing",), True),),
    "bf16": (KeyWrite(("bf16",), True),),
    "optim-8bit": (KeyWrite(("optim",), "adamw_bnb_8bit"),),
    "optim-paged-8bit": (KeyWrite(("optim",), "paged_adamw_8bit"),),
    "liger": (KeyWrite(("use_liger_kernel",), True),),
    "halve-batch": halve(("per_device_train_batch_size",), ("gradient_accumulation_steps",)),
}

# TRL's ModelConfig adds 4-bit loading (`load_in_4bit`, read with `use_peft`)
TRL_FIX_SPELLINGS: dict[str, Spelling] = {
    **FIX_SPELLINGS,
    "qlora": (KeyWrite(("load_in_4bit",), True),),
}

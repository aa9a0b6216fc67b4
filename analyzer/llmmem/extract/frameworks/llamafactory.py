"""LLaMA-Factory YAML (`llamafactory-cli train`): finetuning_type, stage, lora_rank, cutoff_len,
and its v1 schema (model, peft_config, quant_config, dist_config, micro/global batch size).
"""

from __future__ import annotations

from typing import Any

from llmmem.extract.frameworks.common import (
    DocumentReader,
    Setting,
    as_bool,
    as_float,
    as_int,
    as_name_list,
    as_text,
    lora_targets,
)
from llmmem.extract.frameworks.deepspeed import follow_deepspeed_file, read_deepspeed_reference
from llmmem.extract.frameworks.hf_yaml import read_hf_fsdp
from llmmem.extract.frameworks.spelling import KeyWrite, Spelling, halve, halve_keeping_global
from llmmem.extract.vocabulary import (
    LLAMAFACTORY_PREF_LOSS_OBJECTIVES,
    LLAMAFACTORY_STAGE_OBJECTIVES,
)
from llmmem.plan import Provenance

# the v1 schema names the model with a string `model:` beside one of these
LLAMAFACTORY_V1_KEYS = frozenset(
    {
        "peft_config",
        "quant_config",
        "dist_config",
        "model_class",
        "kernel_config",
        "micro_batch_size",
        "global_batch_size",
        "cutoff_len",
    }
)
LLAMAFACTORY_KEYS = frozenset(
    {"finetuning_type", "stage", "cutoff_len", "lora_target", "quantization_bit"}
)


# and the context parallelism of its sequence-parallel releases (sequence_parallel_mode:
# zigzag-ring, the default, or ulysses)
LLAMAFACTORY_VISION_KEYS = (
    "sequence_parallel_size",
    "sequence_parallel_mode",
    "image_max_pixels",
    "image_min_pixels",
    "freeze_vision_tower",
    "freeze_multi_modal_projector",
    "train_mm_proj_only",
)


def is_llamafactory_config(value: dict[str, Any]) -> bool:
    keys = set(value)
    if isinstance(value.get("model"), str) and keys & LLAMAFACTORY_V1_KEYS:
        return True
    return bool(keys & LLAMAFACTORY_KEYS)


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


# keys only a training run sets: a config with none of them (and no do_train) is one for
# `llamafactory-cli chat`, `webchat`, `api` or `export`, which share model_name_or_path,
# adapter_name_or_path, template and finetuning_type with training
LLAMAFACTORY_TRAINING_KEYS = frozenset(
    {
        "do_train",
        "stage",
        "dataset",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "num_train_epochs",
        "max_steps",
        "learning_rate",
        "cutoff_len",
        "output_dir",
    }
)


def read_llamafactory_do_train(reader: DocumentReader) -> None:
    """LLaMA-Factory trains only under `do_train: true` (0.9.5 train/sft/workflow.py and the
    other stages: `if training_args.do_train: trainer.train(...)`; HF's default is false): a
    config that turns it off evaluates or predicts, and one that sets no training key at all
    is for chat, the API or export. Either trains nothing, and the plan says why."""
    written = reader.converted(("do_train",), as_bool)
    if written is False:
        reader.put(
            "not_training",
            "LLaMA-Factory trains only with do_train: true; this config evaluates or predicts",
            ("do_train",),
        )
        return
    if written is None and not any(reader.is_set((key,)) for key in LLAMAFACTORY_TRAINING_KEYS):
        reader.put(
            "not_training",
            "no training key (do_train, stage, dataset, batch, epochs, learning rate): a "
            "LLaMA-Factory config for chat, the API or export",
            ("model_name_or_path",) if reader.is_set(("model_name_or_path",)) else None,
        )


def read_llamafactory(reader: DocumentReader) -> None:
    if isinstance(reader.get(("model",)), str):
        read_llamafactory_v1(reader)
        return
    reader.take(("model_name_or_path",), "model_id", as_text)
    read_llamafactory_do_train(reader)
    reader.keep("stage", ("stage",))
    read_llamafactory_objective(reader)
    if (reader.converted(("stage",), as_text) or "").strip().lower() == "ppo":
        # stage: ppo's models and lengths (llamafactory 0.9.3 FinetuningArguments,
        # GeneratingArguments): reward_model_type lora (default), full or api
        for key in ("reward_model", "reward_model_type", "ref_model", "max_new_tokens"):
            reader.keep(key, (key,))
    reader.keep("template", ("template",))
    # a vision-language model's images and what of its image side trains (0.9.x
    # ProcessorArguments, FinetuningArguments)
    for key in LLAMAFACTORY_VISION_KEYS:
        reader.keep(key, (key,))
    reader.keep("packing", ("packing",))
    reader.keep("neat_packing", ("neat_packing",))  # samples kept apart in each packed row
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


# read from LLaMA-Factory 0.9.5: hparams/data_args.py (cutoff_len), model_args.py (flash_attn,
# disable_gradient_checkpointing), finetuning_args.py (finetuning_type, lora_rank, lora_alpha,
# lora_dropout, lora_target, set in read_llamafactory)
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
    trainable weights to fp32, and its trainer runs bf16=True under autocast: LoRA keeps a bf16
    base under autocast ("bf16-autocast", adapters in fp32), a full fine-tune trains fp32
    weights under bf16 autocast ("bf16")."""
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
            "bf16" if full else "bf16-autocast",
            ("bf16",),
            "trainable weights upcast to fp32"
            if full
            else "bf16 base, fp32 adapters, under the trainer's bf16 autocast",
        )
    elif fp16:
        reader.put(
            "precision",
            "fp16" if full else "fp16-true",
            ("fp16",),
            "trainable weights upcast to fp32" if full else "fp16 base, fp32 adapters",
        )
    else:
        # without bf16/fp16 the trainer runs no autocast (hparams/parser.py sets compute_dtype
        # only from them); model/patcher.py `patch_config` then infers the load dtype from the
        # model (bf16 for most) and a full fine-tune's trainable weights are upcast to fp32
        # (`cast_trainable_params_to_fp32`): fp32 weights computing in fp32
        reader.reading.settings.append(
            Setting(
                "precision",
                "fp32" if full else "bf16-true",
                Provenance.DEFAULT,
                None,
                "LLaMA-Factory without bf16/fp16: no autocast; trainable weights upcast to fp32"
                if full
                else "LLaMA-Factory infers the load dtype from the model (bf16 for most); no "
                "autocast without bf16/fp16",
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
# how a fix is written in this framework's config (`llmmem.extract.frameworks.spelling`)

# LLaMA-Factory 0.9 (flat keys): llamafactory/hparams/model_args.py (disable_gradient_checkpointing,
# enable_liger_kernel, quantization_bit), the rest are HF Seq2SeqTrainingArguments
FIX_SPELLINGS: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("disable_gradient_checkpointing",), False, only_if_written=True),),
    "bf16": (KeyWrite(("bf16",), True),),
    "optim-8bit": (KeyWrite(("optim",), "adamw_bnb_8bit"),),
    "optim-paged-8bit": (KeyWrite(("optim",), "paged_adamw_8bit"),),
    "liger": (KeyWrite(("enable_liger_kernel",), True),),
    "halve-batch": halve(("per_device_train_batch_size",), ("gradient_accumulation_steps",)),
    "qlora": (KeyWrite(("quantization_bit",), 4),),
}

# LLaMA-Factory v1 (`model:`, `peft_config:`): llamafactory/v1/config/training_args.py
# (enable_activation_checkpointing, bf16, micro_batch_size, global_batch_size). No 8-bit
# optimizer plugin (v1/plugins/trainer_plugins/optimizer.py is empty), and its liger_kernel
# kernel_config keeps the logits while training (v1/core/model_engine.py: require_logits), so
# no optimizer or fused-loss entry.
#
# QLoRA in v1 is the model's `quant_config` plugin: `name: bnb` with `quantization_bit: 4`
# loads the base weights as bitsandbytes NF4 with double quantization (LLaMA-Factory
# src/llamafactory/v1/config/model_args.py `quant_config`, v1/plugins/model_plugins/
# quantization.py BnbParams, at commit 1bc8a836); only with a LoRA `peft_config` (the lever's
# own condition) and never over a `quant_config` already written.
V1_FIX_SPELLINGS: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("enable_activation_checkpointing",), True),),
    "bf16": (KeyWrite(("bf16",), True),),
    "halve-batch": halve_keeping_global(("micro_batch_size",), ("global_batch_size",)),
    "qlora": (
        KeyWrite(
            ("quant_config",),
            lambda _s, current: {"name": "bnb", "quantization_bit": 4} if current is None else None,
        ),
    ),
}

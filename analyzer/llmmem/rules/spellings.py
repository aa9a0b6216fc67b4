"""How each framework's config file spells the levers a fix pulls.

One table per framework, beside its reader in `extract/configs.py`: for each lever (the keys of
`fixes.CANDIDATES`) the key paths and values that framework's own config reader takes, or no
entry where the framework has no such setting (then no fix is offered for that file). Every key
written here is one `extract/configs.py` reads, so the edited file, analysed again, moves.

A value is either the literal to write or a function of the setup and the value written at that
path now (None when absent) that gives the literal, or None when the lever cannot be spelled for
this file (e.g. accumulation that the framework derives from a global batch size).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmmem.budget.setup import TrainingSetup
from llmmem.extract.yaml_positions import KeyPath

ValueOf = Callable[[TrainingSetup, Any], Any]


@dataclass(frozen=True)
class KeyWrite:
    """One key the fix writes: its path in the document and the value (or how to get it)."""

    path: KeyPath
    value: Any | ValueOf
    only_if_written: bool = False  # edit the key where it stands; never add it


Spelling = tuple[KeyWrite, ...]


def _half_batch(setup: TrainingSetup, _current: Any) -> int:
    return setup.batch // 2


def _double_accumulation(setup: TrainingSetup, _current: Any) -> int:
    return setup.grad_accum * 2


def _keep_global_batch(_setup: TrainingSetup, current: Any) -> Any:
    """The global batch stays as written: halving the micro-batch doubles the accumulation
    the framework derives from it. Without a written global batch there is no accumulation
    to double (the global batch follows the micro-batch), so no edit."""
    return current if current is not None else None


def _halve(micro: KeyPath, accumulation: KeyPath) -> Spelling:
    return (KeyWrite(micro, _half_batch), KeyWrite(accumulation, _double_accumulation))


def _halve_keeping_global(micro: KeyPath, global_batch: KeyPath) -> Spelling:
    return (KeyWrite(micro, _half_batch), KeyWrite(global_batch, _keep_global_batch))


# HF TrainingArguments / TRL SFTConfig + ModelConfig YAML (`trl sft --config`,
# HfArgumentParser.parse_yaml_file): transformers/training_args.py, trl/trainer/model_config.py
HF: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("gradient_checkpointing",), True),),
    "bf16": (KeyWrite(("bf16",), True),),
    "optim-8bit": (KeyWrite(("optim",), "adamw_bnb_8bit"),),
    "optim-paged-8bit": (KeyWrite(("optim",), "paged_adamw_8bit"),),
    "liger": (KeyWrite(("use_liger_kernel",), True),),
    "halve-batch": _halve(("per_device_train_batch_size",), ("gradient_accumulation_steps",)),
}

# TRL's ModelConfig adds 4-bit loading (`load_in_4bit`, read with `use_peft`)
TRL: dict[str, Spelling] = {**HF, "qlora": (KeyWrite(("load_in_4bit",), True),)}

# axolotl 0.19: axolotl/utils/schemas/config.py (gradient_checkpointing, bf16),
# axolotl/utils/schemas/training.py (micro_batch_size, gradient_accumulation_steps, optimizer:
# HF `optim` names), axolotl/integrations/liger/args.py (liger_fused_linear_cross_entropy, read
# only with the Liger plugin listed under `plugins`), adapter: qlora with load_in_4bit
AXOLOTL: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("gradient_checkpointing",), True),),
    "bf16": (KeyWrite(("bf16",), True),),
    "optim-8bit": (KeyWrite(("optimizer",), "adamw_bnb_8bit"),),
    "optim-paged-8bit": (KeyWrite(("optimizer",), "paged_adamw_8bit"),),
    "liger": (
        KeyWrite(("plugins",), lambda _s, current: _with_liger_plugin(current)),
        KeyWrite(("liger_fused_linear_cross_entropy",), True),
    ),
    "halve-batch": _halve(("micro_batch_size",), ("gradient_accumulation_steps",)),
    "qlora": (KeyWrite(("adapter",), "qlora"), KeyWrite(("load_in_4bit",), True)),
}

AXOLOTL_LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"


def _with_liger_plugin(current: Any) -> Any:
    """`plugins` with the Liger plugin: a new one-item list; a list that has it, unchanged;
    any other list with the plugin appended (written at its end, in its own block or flow
    style); a `plugins` that is not a list of names is not edited (no fix)."""
    if current is None:
        return [AXOLOTL_LIGER_PLUGIN]
    if not isinstance(current, list) or not all(isinstance(item, str) for item in current):
        return None
    if AXOLOTL_LIGER_PLUGIN in current:
        return current
    return [*current, AXOLOTL_LIGER_PLUGIN]


# LLaMA-Factory 0.9 (flat keys): llamafactory/hparams/model_args.py (disable_gradient_checkpointing,
# enable_liger_kernel, quantization_bit), the rest are HF Seq2SeqTrainingArguments
LLAMAFACTORY: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("disable_gradient_checkpointing",), False, only_if_written=True),),
    "bf16": (KeyWrite(("bf16",), True),),
    "optim-8bit": (KeyWrite(("optim",), "adamw_bnb_8bit"),),
    "optim-paged-8bit": (KeyWrite(("optim",), "paged_adamw_8bit"),),
    "liger": (KeyWrite(("enable_liger_kernel",), True),),
    "halve-batch": _halve(("per_device_train_batch_size",), ("gradient_accumulation_steps",)),
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
LLAMAFACTORY_V1: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("enable_activation_checkpointing",), True),),
    "bf16": (KeyWrite(("bf16",), True),),
    "halve-batch": _halve_keeping_global(("micro_batch_size",), ("global_batch_size",)),
    "qlora": (
        KeyWrite(
            ("quant_config",),
            lambda _s, current: {"name": "bnb", "quantization_bit": 4} if current is None else None,
        ),
    ),
}

# torchtune 0.6.1's QLoRA builders: `qlora_<name>` is `partial(lora_<name>, quantize_base=True)`
# (NF4 base weights, torchtune/models/*/_model_builders.py); a LoRA builder without a QLoRA twin
# (Qwen, for one) has no QLoRA fix.
TORCHTUNE_QLORA_BUILDERS = frozenset(
    {
        "qlora_code_llama2_7b",
        "qlora_code_llama2_13b",
        "qlora_code_llama2_70b",
        "qlora_gemma_2b",
        "qlora_gemma_7b",
        "qlora_gemma2_2b",
        "qlora_gemma2_9b",
        "qlora_gemma2_27b",
        "qlora_llama2_7b",
        "qlora_llama2_13b",
        "qlora_llama2_70b",
        "qlora_llama2_reward_7b",
        "qlora_llama3_8b",
        "qlora_llama3_70b",
        "qlora_llama3_1_8b",
        "qlora_llama3_1_70b",
        "qlora_llama3_1_405b",
        "qlora_llama3_2_1b",
        "qlora_llama3_2_3b",
        "qlora_llama3_2_vision_11b",
        "qlora_llama3_2_vision_90b",
        "qlora_mistral_7b",
        "qlora_mistral_reward_7b",
        "qlora_phi3_mini",
        "qlora_phi4_14b",
    }
)


def torchtune_qlora_builder(_setup: TrainingSetup, current: Any) -> Any:
    """`torchtune.models.llama3_1.lora_llama3_1_8b` -> `...qlora_llama3_1_8b`, where torchtune
    has that builder; None for any other component."""
    if not isinstance(current, str):
        return None
    module, _, builder = current.rpartition(".")
    if not builder.startswith("lora_") or f"q{builder}" not in TORCHTUNE_QLORA_BUILDERS:
        return None
    return f"{module}.q{builder}" if module else f"q{builder}"


# torchtune 0.6: recipes/lora_finetune_single_device.py, full_finetune_*.py
# (enable_activation_checkpointing, dtype, batch_size, gradient_accumulation_steps, optimizer
# instantiated from `_component_`). torchtune 0.6 has no fused linear cross-entropy loss.
# QLoRA: the model's `_component_` becomes the builder's QLoRA twin (above).
TORCHTUNE: dict[str, Spelling] = {
    "qlora": (KeyWrite(("model", "_component_"), torchtune_qlora_builder, True),),
    "grad-ckpt": (KeyWrite(("enable_activation_checkpointing",), True),),
    "bf16": (KeyWrite(("dtype",), "bf16"),),
    "optim-8bit": (KeyWrite(("optimizer", "_component_"), "bitsandbytes.optim.AdamW8bit", True),),
    "optim-paged-8bit": (
        KeyWrite(("optimizer", "_component_"), "bitsandbytes.optim.PagedAdamW8bit", True),
    ),
    "halve-batch": _halve(("batch_size",), ("gradient_accumulation_steps",)),
}

# LitGPT 0.5: litgpt/finetune/lora.py (precision, quantize, train.micro_batch_size with the
# accumulation derived from train.global_batch_size). No gradient checkpointing setting; with
# `quantize` any AdamW becomes bitsandbytes' 32-bit PagedAdamW (litgpt/utils.py
# instantiate_bnb_optimizer), so the 8-bit optimizer only without it; no fused loss.
LITGPT: dict[str, Spelling] = {
    "bf16": (KeyWrite(("precision",), "bf16-true"),),
    "optim-8bit": (KeyWrite(("optimizer", "class_path"), "bitsandbytes.optim.AdamW8bit", True),),
    "halve-batch": _halve_keeping_global(
        ("train", "micro_batch_size"), ("train", "global_batch_size")
    ),
    "qlora": (KeyWrite(("quantize",), "bnb.nf4-dq"),),
}

# DeepSpeed JSON: deepspeed/runtime/config.py (bf16.enabled, train_micro_batch_size_per_gpu,
# gradient_accumulation_steps); its activation_checkpointing block only acts on models that call
# deepspeed.checkpointing, so no checkpointing entry.
DEEPSPEED: dict[str, Spelling] = {
    "bf16": (KeyWrite(("bf16", "enabled"), True, only_if_written=True),),
    "halve-batch": (
        KeyWrite(("train_micro_batch_size_per_gpu",), _half_batch, only_if_written=True),
        KeyWrite(("gradient_accumulation_steps",), _double_accumulation, only_if_written=True),
    ),
}

# accelerate config (accelerate/commands/config/config_args.py): mixed_precision only.
ACCELERATE: dict[str, Spelling] = {
    "bf16": (KeyWrite(("mixed_precision",), "bf16"),),
}

SPELLINGS: dict[str, dict[str, Spelling]] = {
    "hf": HF,
    "trl": TRL,
    "axolotl": AXOLOTL,
    "llamafactory": LLAMAFACTORY,
    "llamafactory-v1": LLAMAFACTORY_V1,
    "torchtune": TORCHTUNE,
    "litgpt": LITGPT,
    "deepspeed": DEEPSPEED,
    "accelerate": ACCELERATE,
}


def spelling(dialect: str, lever: str) -> Spelling | None:
    """The keys `dialect` writes `lever` with; None where it has no such setting."""
    return SPELLINGS.get(dialect, {}).get(lever)

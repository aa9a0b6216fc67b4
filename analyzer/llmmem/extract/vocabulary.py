"""The words frameworks use for the same setting, and how to read their values.

Every extractor (Python scripts, YAML/JSON configs, shell command lines) meets the same settings
under different names: HF `per_device_train_batch_size` is axolotl's `micro_batch_size` and
torchtune's `batch_size`; the sequence length is `max_seq_length`, `max_length`, `block_size`,
`sequence_len`, `cutoff_len`... This module maps those names onto the canonical keys of
`PlanBuilder` and normalises their values (dtypes, attention kernels, FSDP strings, optimizer
classes). It holds data and small pure functions only: no parsing, no I/O.

Canonical keys are the `PlanBuilder` keys: top-level `TrainingPlan` fields (`model_id`,
`per_device_train_batch_size`, ...), the precision inputs `bf16`, `fp16` and `torch_dtype`,
and dotted keys for the nested plans (`lora.r`, `quantization.bits`, `distributed.zero_stage`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# name as written (lower case) -> canonical key, for flat configs and keyword arguments
KEY_SYNONYMS: dict[str, str] = {
    # the model
    "model_id": "model_id",
    "model_name": "model_id",
    "model_name_or_path": "model_id",
    "pretrained_model_name_or_path": "model_id",
    "base_model": "model_id",
    # micro-batch per device
    "per_device_train_batch_size": "per_device_train_batch_size",
    "per_gpu_train_batch_size": "per_device_train_batch_size",
    "micro_batch_size": "per_device_train_batch_size",
    "train_micro_batch_size_per_gpu": "per_device_train_batch_size",
    "batch_size": "per_device_train_batch_size",
    # gradient accumulation
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_accumulation": "gradient_accumulation_steps",
    "grad_accum": "gradient_accumulation_steps",
    "accumulate_grad_batches": "gradient_accumulation_steps",
    # tokens per sequence
    "max_seq_length": "max_seq_length",
    "max_length": "max_seq_length",
    "block_size": "max_seq_length",
    "model_max_length": "max_seq_length",
    "sequence_len": "max_seq_length",
    "sequence_length": "max_seq_length",
    "cutoff_len": "max_seq_length",
    "max_seq_len": "max_seq_length",
    "seq_length": "max_seq_length",
    "seq_len": "max_seq_length",
    # recomputation
    "gradient_checkpointing": "gradient_checkpointing",
    "activation_checkpointing": "gradient_checkpointing",
    "enable_activation_checkpointing": "gradient_checkpointing",
    # precision inputs (the builder derives `precision` from them)
    "bf16": "bf16",
    "fp16": "fp16",
    "torch_dtype": "torch_dtype",
    "dtype": "torch_dtype",
    "precision": "precision",
    # optimizer
    "optim": "optim",
    "optimizer": "optim",
    # attention, cache, loss
    "attn_implementation": "attn_implementation",
    "use_cache": "use_cache",
    # LoRA (flat spellings; inside a LoRA section use `lora_key`)
    "lora_r": "lora.r",
    "lora_rank": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_target_modules": "lora.target_modules",
    "lora_target": "lora.target_modules",
    "lora_dropout": "lora.dropout",
    "use_dora": "lora.dora",
    "lora_modules_to_save": "lora.modules_to_save",
    # bitsandbytes
    "bnb_4bit_quant_type": "quantization.quant_type",
    "quantization_type": "quantization.quant_type",
    "bnb_4bit_use_double_quant": "quantization.double_quant",
    "double_quantization": "quantization.double_quant",
    "bnb_4bit_compute_dtype": "quantization.compute_dtype",
    "bnb_4bit_quant_storage": "quantization.quant_storage",
    "quantization_bit": "quantization.bits",
    # sharding
    "deepspeed": "distributed.deepspeed_config",
    "fsdp": "distributed.fsdp",
    "zero_stage": "distributed.zero_stage",
    "world_size": "distributed.world_size",
    # GRPO/DPO lengths: the builder adds prompt and completion where no total length is given
    "max_prompt_length": "max_prompt_length",
    "max_completion_length": "max_completion_length",
    # preference training: the reference log-probabilities read from the dataset
    "precompute_ref_log_probs": "precompute_ref_log_probs",
    # CPO/SimPO: the weight of the chosen half's NLL (0: no cross-entropy in the step)
    "cpo_alpha": "cpo_alpha",
    # PPO (TRL's PPOConfig): the response length and the rollout's chunk
    "response_length": "response_length",
    "local_rollout_forward_batch_size": "local_rollout_forward_batch_size",
    "num_mini_batches": "num_mini_batches",
}

# the training objective a TRL config or trainer class stands for (SFT: none)
OBJECTIVE_OF_CONFIG: dict[str, str] = {
    "DPOConfig": "dpo",
    "ORPOConfig": "orpo",
    "CPOConfig": "cpo",
    "KTOConfig": "kto",
    "RewardConfig": "reward",
    "GRPOConfig": "grpo",
    "PPOConfig": "ppo",
    # trl.experimental's online DPO: generation, a judge or reward model and DPO's loss in the
    # step, whose memory llmmem does not model (it says so rather than sizing SFT)
    "OnlineDPOConfig": "online_dpo",
}

# keys only one kind of TRL config takes (read in TRL 0.19 to 1.16's configs): a YAML recipe
# or command line naming one is read by that trainer's script (open-r1's GRPO recipes,
# alignment-handbook's DPO ones); checked in this order
OBJECTIVE_KEYS: tuple[tuple[str, frozenset[str]], ...] = (
    ("grpo", frozenset({"num_generations", "reward_funcs", "reward_weights", "scale_rewards"})),
    ("kto", frozenset({"desirable_weight", "undesirable_weight"})),
    ("cpo", frozenset({"cpo_alpha", "simpo_gamma"})),
    (
        "dpo",
        frozenset(
            {
                "rpo_alpha",
                "reference_free",
                "precompute_ref_log_probs",
                "ref_model_init_kwargs",
                "sync_ref_model",
                "ref_adapter_name",
                "force_use_ref_model",
                "f_divergence_type",
                "ld_alpha",
                "label_smoothing",
            }
        ),
    ),
)
# DPOConfig's loss_type values (sigmoid is DPO's own; the others its variants)
DPO_LOSS_TYPES = frozenset(
    {
        "sigmoid",
        "hinge",
        "ipo",
        "exo_pair",
        "nca_pair",
        "robust",
        "bco_pair",
        "sppo_hard",
        "aot",
        "aot_pair",
        "apo_zero",
        "apo_down",
        "discopop",
    }
)


def objective_of_keys(keys: dict[str, object]) -> tuple[str, str] | None:
    """The objective a config's keys name (a TRL config only one trainer takes), and the key
    that says it; None for a supervised config or one that does not say."""
    for objective, names in OBJECTIVE_KEYS:
        for name in sorted(names):
            if name in keys:
                return objective, name
    loss = keys.get("loss_type")
    if isinstance(loss, str) and loss.strip().lower() in ("simpo", "alphapo"):
        return "cpo", "loss_type"
    if isinstance(loss, str) and loss.strip().lower() in DPO_LOSS_TYPES and "beta" in keys:
        return "dpo", "loss_type"
    if "beta" in keys and "max_prompt_length" in keys and "use_vllm" not in keys:
        return "dpo", "beta"  # the offline preference configs; GRPO's generates with vLLM
    return None


# axolotl `rl:` values (IPO is DPO's forward with another loss; SimPO is CPO's)
AXOLOTL_RL_OBJECTIVES: dict[str, str] = {
    "dpo": "dpo",
    "ipo": "dpo",
    "orpo": "orpo",
    "kto": "kto",
    "simpo": "cpo",
    "grpo": "grpo",
}

# LLaMA-Factory `stage:` values; `pref_loss` picks ORPO or SimPO inside the dpo stage
LLAMAFACTORY_STAGE_OBJECTIVES: dict[str, str] = {
    "pt": "pretrain",  # sized as the supervised step it is (next-token loss on every token)
    "dpo": "dpo",
    "kto": "kto",
    "rm": "reward",
    "ppo": "ppo",
}
LLAMAFACTORY_PREF_LOSS_OBJECTIVES: dict[str, str] = {"orpo": "orpo", "simpo": "cpo"}

# boolean flags that stand for a value of another key: `load_in_4bit: true` means 4 bits
FLAG_KEYS: dict[str, tuple[str, object]] = {
    "load_in_4bit": ("quantization.bits", 4),
    "load_in_8bit": ("quantization.bits", 8),
    "flash_attention": ("attn_implementation", "flash_attention_2"),
    "use_flash_attention_2": ("attn_implementation", "flash_attention_2"),
    "sdp_attention": ("attn_implementation", "sdpa"),
    "eager_attention": ("attn_implementation", "eager"),
    "use_liger_kernel": ("loss", "liger"),
    "liger_fused_linear_cross_entropy": ("loss", "liger"),
}

# inside a LoRA section or call (`LoraConfig(r=...)`, `lora: {rank: ...}`)
LORA_KEY_SYNONYMS: dict[str, str] = {
    "r": "lora.r",
    "rank": "lora.r",
    "lora_r": "lora.r",
    "lora_rank": "lora.r",
    "alpha": "lora.alpha",
    "lora_alpha": "lora.alpha",
    "target_modules": "lora.target_modules",
    "lora_target_modules": "lora.target_modules",
    "lora_target": "lora.target_modules",
    "dropout": "lora.dropout",
    "lora_dropout": "lora.dropout",
    "use_dora": "lora.dora",
    "dora": "lora.dora",
    "modules_to_save": "lora.modules_to_save",
    "lora_modules_to_save": "lora.modules_to_save",
}

# TrainingArguments and the TRL configs built on it; the value names the default table
TRAINER_CONFIG_CLASSES: dict[str, str] = {
    "TrainingArguments": "TrainingArguments",
    "Seq2SeqTrainingArguments": "TrainingArguments",
    "SFTConfig": "SFTConfig",
    "DPOConfig": "DPOConfig",
    "ORPOConfig": "ORPOConfig",
    "CPOConfig": "ORPOConfig",
    "KTOConfig": "KTOConfig",
    "GRPOConfig": "GRPOConfig",
    "RewardConfig": "RewardConfig",
    "PPOConfig": "PPOConfig",
    # BaseConfig's defaults as DPOConfig's (bf16, checkpointing); its own lengths are not read
    "OnlineDPOConfig": "DPOConfig",
}

TRL_CONFIG_CLASSES = frozenset(
    name for name, table in TRAINER_CONFIG_CLASSES.items() if table != "TrainingArguments"
)

# trainers: class name -> (config class it builds when `args` is missing, positional index of
# `args`, or None where `args` is keyword-only in practice)
TRAINER_CLASSES: dict[str, tuple[str, int | None]] = {
    "Trainer": ("TrainingArguments", 1),
    "Seq2SeqTrainer": ("Seq2SeqTrainingArguments", 1),
    "SFTTrainer": ("SFTConfig", 1),
    "DPOTrainer": ("DPOConfig", 2),
    "ORPOTrainer": ("ORPOConfig", None),
    "CPOTrainer": ("CPOConfig", None),
    "KTOTrainer": ("KTOConfig", None),
    "GRPOTrainer": ("GRPOConfig", 2),
    "RewardTrainer": ("RewardConfig", None),
    "PPOTrainer": ("PPOConfig", 0),
    "OnlineDPOTrainer": ("OnlineDPOConfig", None),
}

TRL_TRAINER_CLASSES = frozenset(
    name for name in TRAINER_CLASSES if name not in ("Trainer", "Seq2SeqTrainer")
)

# optimizer classes (dotted, as imported) -> HF `optim` name
OPTIMIZER_CLASSES: dict[str, str] = {
    "torch.optim.AdamW": "adamw_torch",
    "torch.optim.Adam": "adam",
    "torch.optim.SGD": "sgd",
    "torch.optim.Adagrad": "adagrad",
    "torch.optim.RMSprop": "rmsprop",
    "transformers.AdamW": "adamw_hf",
    "transformers.optimization.AdamW": "adamw_hf",
    "transformers.Adafactor": "adafactor",
    "transformers.optimization.Adafactor": "adafactor",
    "bitsandbytes.optim.AdamW8bit": "adamw_bnb_8bit",
    "bitsandbytes.optim.Adam8bit": "adamw_bnb_8bit",
    "bitsandbytes.optim.AdamW": "adamw_bnb_32bit",
    "bitsandbytes.optim.AdamW32bit": "adamw_bnb_32bit",
    "bitsandbytes.optim.PagedAdamW": "paged_adamw_32bit",
    "bitsandbytes.optim.PagedAdamW32bit": "paged_adamw_32bit",
    "bitsandbytes.optim.PagedAdamW8bit": "paged_adamw_8bit",
    "bitsandbytes.optim.Lion": "lion_32bit",
    "bitsandbytes.optim.Lion8bit": "lion_8bit",
    "bitsandbytes.optim.PagedLion8bit": "paged_lion_8bit",
}

# the leaf class name alone, for `from bitsandbytes.optim import AdamW8bit` and friends;
# plain `AdamW` is torch's (transformers' own AdamW is gone from recent releases)
_OPTIMIZER_LEAVES: dict[str, str] = {
    "AdamW": "adamw_torch",
    "Adam": "adam",
    "SGD": "sgd",
    "Adagrad": "adagrad",
    "RMSprop": "rmsprop",
    "Adafactor": "adafactor",
    "AdamW8bit": "adamw_bnb_8bit",
    "Adam8bit": "adamw_bnb_8bit",
    "AdamW32bit": "adamw_bnb_32bit",
    "PagedAdamW": "paged_adamw_32bit",
    "PagedAdamW32bit": "paged_adamw_32bit",
    "PagedAdamW8bit": "paged_adamw_8bit",
    "Lion8bit": "lion_8bit",
    "PagedLion8bit": "paged_lion_8bit",
}

_MODULE_ALIASES = {"bnb": "bitsandbytes", "optim": "torch.optim"}

_DTYPES: dict[str, str] = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "auto": "auto",
}

_ATTENTION: dict[str, str] = {
    "eager": "eager",
    "sdpa": "sdpa",
    "flash_attention_2": "flash_attention_2",
    "flash_attention_3": "flash_attention_3",
    "fa2": "flash_attention_2",
    "flash_attn": "flash_attention_2",
    "flash_attention": "flash_attention_2",
    "flex_attention": "flex_attention",
    "disabled": "eager",
}

PRECISIONS = ("fp32", "fp16", "bf16", "bf16-true", "fp16-true", "bf16-autocast")
FSDP_SHARDING = ("full_shard", "hybrid_shard", "shard_grad_op", "no_shard")


def _plain(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def canonical_key(name: str) -> str | None:
    """The canonical key for a setting name as written (`micro_batch_size` ->
    `per_device_train_batch_size`), or None when the name is not one llmmem reads."""
    return KEY_SYNONYMS.get(_plain(name))


def lora_key(name: str) -> str | None:
    """The canonical `lora.*` key for a name inside a LoRA section or `LoraConfig(...)` call."""
    return LORA_KEY_SYNONYMS.get(_plain(name))


def flag_setting(name: str) -> tuple[str, object] | None:
    """For a boolean flag that stands for a value (`load_in_4bit`), the key and value it sets
    when true."""
    return FLAG_KEYS.get(_plain(name))


def sequence_length_names() -> frozenset[str]:
    """Every spelling of the sequence length."""
    return frozenset(name for name, key in KEY_SYNONYMS.items() if key == "max_seq_length")


def optim_for_optimizer_class(dotted_name: str, *, fused: bool = False) -> str | None:
    """The HF `optim` name for an optimizer class as it is called in a script:
    `torch.optim.AdamW` -> `adamw_torch` (`adamw_torch_fused` with `fused=True`),
    `bnb.optim.AdamW8bit` -> `adamw_bnb_8bit`, `PagedAdamW` -> `paged_adamw_32bit`."""
    parts = dotted_name.strip().split(".")
    if parts and parts[0] in _MODULE_ALIASES:
        parts = _MODULE_ALIASES[parts[0]].split(".") + parts[1:]
    full = ".".join(parts)
    optim = OPTIMIZER_CLASSES.get(full)
    if optim is None and len(parts) >= 1:
        optim = _OPTIMIZER_LEAVES.get(parts[-1])
    if optim == "adamw_torch" and fused:
        return "adamw_torch_fused"
    return optim


def normalize_dtype(value: object) -> str | None:
    """`torch.bfloat16`, `"bf16"`, `"bfloat16"` -> `"bfloat16"`; likewise float16, float32 and
    `"auto"`. None for anything else."""
    if not isinstance(value, str):
        return None
    leaf = value.strip().lower().rsplit(".", 1)[-1]
    return _DTYPES.get(leaf)


def normalize_quant_storage(value: object) -> str | None:
    """`bnb_4bit_quant_storage`: `torch.bfloat16`, `"bf16"` -> `"bfloat16"`, likewise float16
    and float32; `torch.uint8`/`"uint8"` (bitsandbytes' default) -> `"uint8"`. None for anything
    else."""
    if isinstance(value, str) and value.strip().lower().rsplit(".", 1)[-1] == "uint8":
        return "uint8"
    dtype = normalize_dtype(value)
    return None if dtype == "auto" else dtype


def normalize_attn_implementation(value: object) -> str | None:
    """An attention kernel name as transformers spells it (`fa2` -> `flash_attention_2`)."""
    if not isinstance(value, str):
        return None
    return _ATTENTION.get(_plain(value))


def normalize_fsdp(value: object) -> tuple[str | None, bool]:
    """HF `fsdp="full_shard auto_wrap offload"` -> (`"full_shard"`, offload=True). A list of
    options is read the same way; `True` means full sharding; unknown strings give None."""
    words: list[str]
    if value is True:
        return "full_shard", False
    if isinstance(value, str):
        words = value.split()
    elif isinstance(value, (list, tuple)):
        words = [str(item) for item in value]
    else:
        return None, False
    words = [_plain(word) for word in words]
    sharding = next((word for word in words if word in FSDP_SHARDING), None)
    if sharding is None and any(word in ("full", "full_shard", "fully_shard") for word in words):
        sharding = "full_shard"
    return sharding, "offload" in words


def split_module_names(value: object) -> list[str] | None:
    """LoRA target modules as a list: `"q_proj,v_proj"` -> `["q_proj", "v_proj"]`,
    `"all-linear"` -> `["all-linear"]`, LLaMA-Factory's `all` -> `["all-linear"]`. None when the
    value does not name modules (PEFT then picks its default for the architecture)."""
    if value is None:
        return None
    items: Iterable[object]
    if isinstance(value, str):
        items = re.split(r"[,\s]+", value.strip())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        return None
    names = [str(item).strip() for item in items if str(item).strip()]
    if not names:
        return None
    if names in (["all"], ["all_linear"]):
        return ["all-linear"]
    return names


# TrainingArguments/SFTConfig switches kept in `plan.extra` as written, for llmmem.scenario to
# read: how samples share a micro-batch (TRL), activation offloading, torch.compile
KEPT_TRAINING_SWITCHES = (
    "packing",
    "padding_free",
    "packing_strategy",
    "activation_offloading",
    "torch_compile",
)

"""accelerate config (`accelerate launch --config_file`): processes, mixed precision, and the
DeepSpeed or FSDP plugin block. The `fsdp_config` block's keys (with or without their `fsdp_`
prefix) are read here for HF's and axolotl's `fsdp_config` too.
"""

from __future__ import annotations

from typing import Any

from llmmem.extract.frameworks.common import (
    DocumentReader,
    Setting,
    as_bool,
    as_int,
    as_text,
)
from llmmem.extract.frameworks.deepspeed import follow_deepspeed_file
from llmmem.extract.frameworks.spelling import KeyWrite, Spelling
from llmmem.extract.yaml_positions import KeyPath
from llmmem.plan import Provenance


def is_accelerate_config(value: dict[str, Any]) -> bool:
    keys = set(value)
    return bool(keys & {"distributed_type", "compute_environment"}) or (
        "num_processes" in keys and "mixed_precision" in keys
    )


# fsdp_sharding_strategy by name or number; FULL_SHARD when unset (accelerate 1.15.0,
# utils/dataclasses.py FullyShardedDataParallelPlugin)
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
    # `distributed_type: NO` reads as YAML 1.1's false: accelerate means no distribution
    if reader.get(("distributed_type",)) is False:
        distributed_type: str | None = "NO"
    else:
        distributed_type = reader.converted(("distributed_type",), as_text)
    kind = (distributed_type or "").upper()
    reader.take(("num_processes",), "distributed.world_size", as_int)
    reader.keep("num_machines", ("num_machines",))
    mixed = reader.converted(("mixed_precision",), as_text)
    if mixed is not None and mixed.lower() == "fp8":
        # FP8 matmuls under bf16 autocast; fp8_config.backend says whose (AO: torchao's float8
        # Linears, TE: TransformerEngine's te.Linear, MSAMP). Named by none, accelerate 1.15.0
        # takes torchao where it is installed, then TransformerEngine, then MS-AMP
        # (accelerator.py:488-498, ACCELERATE_FP8_BACKEND unset reading as NO)
        reader.put("bf16", True, ("mixed_precision",), "accelerate fp8 runs under bf16 autocast")
        backend = reader.converted(("fp8_config", "backend"), as_text)
        reader.put(
            "fp8_backend",
            (backend or "AO").upper(),
            ("fp8_config", "backend") if backend else ("mixed_precision",),
            ""
            if backend
            else "accelerate 1.15.0's first choice where no backend is named: torchao if "
            "installed (else TransformerEngine)",
        )
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
        read_accelerate_deepspeed_defaults(reader, block, kind)
        if reader.is_set((*block, "deepspeed_config_file")):
            reference = reader.converted((*block, "deepspeed_config_file"), as_text)
            if reference is not None:
                reader.put(
                    "distributed.deepspeed_config", reference, (*block, "deepspeed_config_file")
                )
                follow_deepspeed_file(reader, reference, (*block, "deepspeed_config_file"))
    if kind == "FSDP" or reader.is_set(("fsdp_config",)):
        read_accelerate_fsdp(reader, ("fsdp_config",))
    # accelerate 1.10+ ParallelismConfig: torch's context parallelism (cp_size), DeepSpeed's
    # Ulysses (sp_size), tensor parallelism (tp_size)
    for key in ("dp_replicate_size", "dp_shard_size", "cp_size", "sp_size", "tp_size"):
        reader.keep(key, ("parallelism_config", f"parallelism_config_{key}"))


# DeepSpeed's own sections, which accelerate's deepspeed_config does not take
DEEPSPEED_SECTIONS = ("zero_optimization", "bf16", "fp16", "train_micro_batch_size_per_gpu")


def read_accelerate_deepspeed_defaults(reader: DocumentReader, block: KeyPath, kind: str) -> None:
    """accelerate (1.15.0) copies deepspeed_config's keys onto its launch arguments: only its
    own (zero_stage, offload_*_device, gradient_accumulation_steps, ...) reach the
    DeepSpeedPlugin, whose zero_stage is 2 when none is given (ACCELERATE_DEEPSPEED_ZERO_STAGE,
    utils/dataclasses.py); a DeepSpeed config written inside the block is not read by it."""
    nested = [key for key in DEEPSPEED_SECTIONS if reader.is_set((*block, key))]
    if nested:
        reader.problem(
            (*block, nested[0]),
            f"deepspeed_config holds DeepSpeed's own {', '.join(nested)}: accelerate takes "
            "only its flat keys (zero_stage, offload_optimizer_device, ...) and ignores these; "
            "put them in a JSON named by deepspeed_config_file",
        )
    if kind != "DEEPSPEED" or reader.is_set((*block, "zero_stage")):
        return
    if reader.is_set((*block, "deepspeed_config_file")):
        return
    reader.reading.settings.append(
        Setting(
            "distributed.zero_stage",
            2,
            Provenance.DEFAULT,
            reader.range(("distributed_type",)),
            "accelerate's DeepSpeedPlugin zero_stage default",
        )
    )


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
# how a fix is written in this framework's config (`llmmem.extract.frameworks.spelling`)

# accelerate config (accelerate/commands/config/config_args.py): mixed_precision only.
FIX_SPELLINGS: dict[str, Spelling] = {
    "bf16": (KeyWrite(("mixed_precision",), "bf16"),),
}

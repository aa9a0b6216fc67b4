"""LitGPT YAML (`litgpt finetune_lora --config ...`): checkpoint_dir, train.micro_batch_size,
precision: bf16-true, quantize: bnb.nf4, lora_* switches, devices × num_nodes.
"""

from __future__ import annotations

from typing import Any

from llmmem.extract.frameworks.common import (
    DocumentReader,
    Setting,
    as_bool,
    as_float,
    as_int,
    as_text,
    optimizer_name,
)
from llmmem.extract.frameworks.spelling import KeyWrite, Spelling, halve_keeping_global
from llmmem.extract.yaml_positions import KeyPath
from llmmem.plan import Provenance


def is_litgpt_config(value: dict[str, Any]) -> bool:
    keys = set(value)
    return "checkpoint_dir" in keys and (
        isinstance(value.get("train"), dict) or bool(keys & {"precision", "quantize", "devices"})
    )


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


# read from LitGPT 0.5.13: litgpt/finetune/lora.py setup() (train.global_batch_size 16,
# micro_batch_size 1, optimizer AdamW; no precision: bf16-mixed where the GPU has bf16)
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


# read from LitGPT 0.5.13: litgpt/finetune/lora.py setup() (lora_r, lora_alpha, lora_dropout,
# lora_query and lora_value on)
LITGPT_LORA_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("lora.r", 8, "LitGPT lora_r default"),
    ("lora.alpha", 16.0, "LitGPT lora_alpha default"),
    ("lora.dropout", 0.05, "LitGPT lora_dropout default"),
    ("lora.target_modules", ["q_proj", "v_proj"], "LitGPT lora_query and lora_value defaults"),
)

# --------------------------------------------------------------------------------------------
# how a fix is written in this framework's config (`llmmem.extract.frameworks.spelling`)

# LitGPT 0.5: litgpt/finetune/lora.py (precision, quantize, train.micro_batch_size with the
# accumulation derived from train.global_batch_size). No gradient checkpointing setting; with
# `quantize` any AdamW becomes bitsandbytes' 32-bit PagedAdamW (litgpt/utils.py
# instantiate_bnb_optimizer), so the 8-bit optimizer only without it; no fused loss.
FIX_SPELLINGS: dict[str, Spelling] = {
    "bf16": (KeyWrite(("precision",), "bf16-true"),),
    "optim-8bit": (KeyWrite(("optimizer", "class_path"), "bitsandbytes.optim.AdamW8bit", True),),
    "halve-batch": halve_keeping_global(
        ("train", "micro_batch_size"), ("train", "global_batch_size")
    ),
    "qlora": (KeyWrite(("quantize",), "bnb.nf4-dq"),),
}

"""torchtune YAML (`tune run <recipe> --config ...`): the model builder's `_component_` names
the model and the method (lora_, qlora_, dora_), batch_size, dtype, tokenizer.max_seq_len.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from llmmem.extract.frameworks.common import (
    DocumentReader,
    as_bool,
    as_float,
    as_int,
    as_name_list,
    as_text,
    optimizer_name,
)
from llmmem.extract.frameworks.spelling import KeyWrite, Spelling, halve


def is_torchtune_config(value: dict[str, Any]) -> bool:
    """A `_component_` under `model:` or under any top-level block (optimizer, loss, ...)."""
    model = value.get("model")
    return (
        isinstance(model, dict)
        and "_component_" in model
        or any(isinstance(item, dict) and "_component_" in item for item in value.values())
    )


TORCHTUNE_FAMILIES: dict[str, Callable[[str, str], str]] = {
    "llama2": lambda size, _: f"meta-llama/Llama-2-{size.lower()}-hf",
    "code_llama2": lambda size, _: f"codellama/CodeLlama-{size.lower()}-hf",
    "llama3": lambda size, variant: f"meta-llama/Meta-Llama-3-{size}{variant}",
    "llama3_1": lambda size, variant: f"meta-llama/Llama-3.1-{size}{variant}",
    "llama3_2": lambda size, variant: f"meta-llama/Llama-3.2-{size}{variant}",
    "llama3_3": lambda size, _: f"meta-llama/Llama-3.3-{size}-Instruct",
    "mistral": lambda size, _: f"mistralai/Mistral-{size}-v0.1",
    "gemma": lambda size, variant: f"google/gemma-{size.lower()}{'-it' if variant else ''}",
    "gemma2": lambda size, variant: f"google/gemma-2-{size.lower()}{'-it' if variant else ''}",
    "qwen2": lambda size, variant: f"Qwen/Qwen2-{size}{variant}",
    "qwen2_5": lambda size, variant: f"Qwen/Qwen2.5-{size}{variant}",
    "qwen3": lambda size, _: f"Qwen/Qwen3-{size}",
    "phi4": lambda size, _: "microsoft/phi-4",
}
TORCHTUNE_FIXED_NAMES = {
    "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
    "mistral_7b": "mistralai/Mistral-7B-v0.1",
}
TORCHTUNE_METHODS = {"qlora_": "qlora", "lora_": "lora", "qdora_": "qlora", "dora_": "lora"}
# the LoRA of torchtune's LoRA configs (recipes/configs/llama3_1/8B_lora_single_device.yaml, as
# 89 of its 91 LoRA configs: lora_attn_modules q, v and output projections, apply_lora_to_mlp),
# in the module names its models share with transformers'
TORCHTUNE_LORA_TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TORCHTUNE_SIZE = re.compile(r"^(?P<size>\d+(?:_\d+)?[bm])(?:_(?P<variant>base|instruct))?$")

# torchtune module names -> the HF names PEFT (and the budget) use
TORCHTUNE_LORA_MODULES = {
    "q_proj": "q_proj",
    "k_proj": "k_proj",
    "v_proj": "v_proj",
    "output_proj": "o_proj",
}


def torchtune_model(component: str) -> tuple[str | None, str]:
    """(hub id or None, method) for a builder path such as
    torchtune.models.llama3_1.qlora_llama3_1_8b -> ("meta-llama/Llama-3.1-8B", "qlora")."""
    builder = component.rsplit(".", 1)[-1]
    method = "full"
    for prefix, prefix_method in TORCHTUNE_METHODS.items():
        if builder.startswith(prefix):
            builder, method = builder.removeprefix(prefix), prefix_method
            break
    if builder in TORCHTUNE_FIXED_NAMES:
        return TORCHTUNE_FIXED_NAMES[builder], method
    # the longest family first: llama3_1_8b is llama3_1 at 8B, not llama3 at 1.8B
    for family in sorted(TORCHTUNE_FAMILIES, key=len, reverse=True):
        if not builder.startswith(family + "_"):
            continue
        match = TORCHTUNE_SIZE.match(builder.removeprefix(family + "_"))
        if match is None:
            continue
        size = match.group("size").replace("_", ".").upper()
        variant = "-Instruct" if match.group("variant") == "instruct" else ""
        return TORCHTUNE_FAMILIES[family](size, variant), method
    return None, method


TORCHTUNE_DTYPES = {"bf16": "bf16-true", "fp32": "fp32", "fp16": "fp16-true"}


def read_torchtune(reader: DocumentReader) -> None:
    component_path = ("model", "_component_")
    component = reader.converted(component_path, as_text)
    method = "full"
    if component is not None:
        model_id, method = torchtune_model(component)
        builder = component.rsplit(".", 1)[-1]
        if method == "lora" and reader.converted(("model", "quantize_base"), as_bool):
            # a LoRA builder with `quantize_base: True` is what `qlora_*` partials it to
            # (models/*/_model_builders.py: `partial(lora_..., quantize_base=True)`)
            method = "qlora"
        if model_id is None:
            reader.problem(
                component_path,
                f"torchtune builder '{builder}' has no known hub model; add a "
                "`# llmmem: model=...` pragma",
            )
        else:
            reader.put("model_id", model_id, component_path, f"torchtune builder {builder}")
        if "dora" in builder:
            reader.put("lora.dora", True, component_path, "a DoRA builder")
    reader.take(("batch_size",), "per_device_train_batch_size", as_int)
    reader.take(("gradient_accumulation_steps",), "gradient_accumulation_steps", as_int)
    if reader.found(("tokenizer", "max_seq_len"))[0] and not reader.is_set(
        ("tokenizer", "max_seq_len")
    ):
        reader.problem(
            ("tokenizer", "max_seq_len"),
            "max_seq_len is null: sequences are as long as the data; set it to bound memory",
        )
    reader.take(("tokenizer", "max_seq_len"), "max_seq_length", as_int)
    reader.take(("enable_activation_checkpointing",), "gradient_checkpointing", as_bool)
    reader.keep("activation_offloading", ("enable_activation_offloading",))
    reader.keep("optimizer_in_bwd", ("optimizer_in_bwd",))
    reader.keep("compile", ("compile",))
    reader.keep("packed", ("dataset", "packed"))
    dtype = reader.converted(("dtype",), as_text)
    if dtype is not None:
        precision = TORCHTUNE_DTYPES.get(dtype.lower())
        if precision is None:
            reader.problem(("dtype",), f"dtype '{dtype}' is not one of bf16, fp32")
        else:
            reader.put("precision", precision, ("dtype",), "torchtune keeps everything in dtype")
    read_torchtune_optimizer(reader)
    read_torchtune_fsdp(reader)
    loss = reader.converted(("loss", "_component_"), as_text)
    if loss is not None:
        loss_name = loss.rsplit(".", 1)[-1]
        if loss_name == "CEWithChunkedOutputLoss":
            reader.put("loss", "chunked", ("loss", "_component_"), loss_name)
            # the chunks the model's head and the loss split the sequence into (default 8,
            # modules/loss/ce_chunked_output_loss.py:30)
            reader.take(("loss", "num_output_chunks"), "num_output_chunks", as_int)
        elif loss_name == "LinearCrossEntropyLoss":
            reader.put(
                "loss",
                "liger",
                ("loss", "_component_"),
                "LinearCrossEntropyLoss: logits computed chunk by chunk, never whole",
            )
        else:
            reader.put("loss", "standard", ("loss", "_component_"), loss_name)
    if method in ("lora", "qlora"):
        read_torchtune_lora(reader, method)
    for key, value, note in TORCHTUNE_DEFAULTS:
        reader.default(key, value, note)


# read from torchtune 0.6.1: recipes/lora_finetune_single_device.py and full_finetune_*.py
# (enable_activation_checkpointing False), training/precision.py get_dtype (no dtype: float32)
TORCHTUNE_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("gradient_accumulation_steps", 1, "torchtune recipes' default"),
    ("gradient_checkpointing", False, "torchtune enable_activation_checkpointing default"),
    ("precision", "fp32", "torchtune: no dtype means float32"),
    ("attn_implementation", "sdpa", "torchtune attention runs on SDPA"),
    ("loss", "standard", "torchtune cross-entropy"),
)


# the keys only the distributed recipes read (torchtune 0.6.1 recipes/*_distributed.py:
# `cfg.get("fsdp_cpu_offload", False)`, `cfg.get("fsdp_reshard_after_forward", True)`,
# `cfg.get("custom_sharded_layers", None)`), which shard every `layers.i` and then the whole
# model with FSDP2's fully_shard (training/_distributed.py shard_model)
TORCHTUNE_FSDP_KEYS = ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "custom_sharded_layers")


def read_torchtune_fsdp(reader: DocumentReader) -> None:
    """A config with a distributed recipe's keys is sharded with FSDP2: full sharding, or
    sharding of gradients and states only where `fsdp_reshard_after_forward: False` keeps the
    gathered parameters from forward to backward; `fsdp_cpu_offload` keeps parameters,
    gradients and the optimizer step on the host (CPUOffloadPolicy)."""
    present = [key for key in TORCHTUNE_FSDP_KEYS if reader.found((key,))[0]]
    if not present:
        return
    reshard = reader.converted(("fsdp_reshard_after_forward",), as_bool)
    reader.put(
        "distributed.fsdp",
        "shard_grad_op" if reshard is False else "full_shard",
        (present[0],) if reshard is None else ("fsdp_reshard_after_forward",),
        "torchtune's distributed recipes shard with FSDP2"
        + (
            ": reshard_after_forward False keeps the gathered parameters"
            if reshard is False
            else ""
        ),
    )
    offload = reader.converted(("fsdp_cpu_offload",), as_bool)
    if offload is not None:
        for key in ("distributed.offload_params", "distributed.offload_optimizer"):
            reader.put(key, offload, ("fsdp_cpu_offload",), "FSDP2's CPUOffloadPolicy")
    reader.keep("custom_sharded_layers", ("custom_sharded_layers",))


# custom_sharded_layers' names that the budget sizes as units of their own (torchtune's
# TransformerDecoder: `tok_embeddings`, `output`)
TORCHTUNE_OWN_UNITS = {"tok_embeddings": "embeddings", "output": "head"}


def torchtune_own_units(layers: object) -> tuple[str, ...]:
    """The budget's names of the modules `custom_sharded_layers` shards apart."""
    names = as_name_list(layers) if layers else None
    return tuple(TORCHTUNE_OWN_UNITS[name] for name in names or [] if name in TORCHTUNE_OWN_UNITS)


def own_units_note(layers: object) -> str | None:
    """What the budget says of `custom_sharded_layers` names it does not size apart."""
    names = as_name_list(layers) if layers else None
    others = [name for name in names or [] if name not in TORCHTUNE_OWN_UNITS]
    if not others:
        return None
    return (
        f"custom_sharded_layers {others}: torchtune shards these as FSDP units of their own; "
        "llmmem sizes them inside the units that hold them (tok_embeddings and output are "
        "sized apart)"
    )


def read_torchtune_optimizer(reader: DocumentReader) -> None:
    path = ("optimizer", "_component_")
    optimizer = reader.converted(path, as_text)
    if optimizer is None:
        return
    fused = reader.converted(("optimizer", "fused"), as_bool)
    reader.put("optim", optimizer_name(optimizer, fused), path, optimizer)


def read_torchtune_lora(reader: DocumentReader, method: str) -> None:
    model = ("model",)
    reader.put("lora.enabled", True, (*model, "_component_"), f"a {method} builder")
    reader.take((*model, "lora_rank"), "lora.r", as_int)
    reader.take((*model, "lora_alpha"), "lora.alpha", as_float)
    reader.take((*model, "lora_dropout"), "lora.dropout", as_float)
    reader.take((*model, "use_dora"), "lora.dora", as_bool)
    targets: list[str] = []
    attention = reader.converted((*model, "lora_attn_modules"), as_name_list)
    if attention is not None:
        targets.extend(TORCHTUNE_LORA_MODULES.get(name, name) for name in attention)
    if reader.converted((*model, "apply_lora_to_mlp"), as_bool):
        targets.extend(["gate_proj", "up_proj", "down_proj"])
    if reader.converted((*model, "apply_lora_to_output"), as_bool):
        targets.append("lm_head")
    if targets:
        located = (*model, "lora_attn_modules") if attention is not None else model
        reader.put("lora.target_modules", targets, located, "torchtune module names as in HF")
    reader.derived("lora_adapter_dtype", "model dtype", "torchtune keeps LoRA weights in dtype")
    if method == "qlora":
        located = (*model, "_component_")
        reader.put("quantization.bits", 4, located, "torchtune QLoRA: NF4 base weights")
        reader.put("quantization.quant_type", "nf4", located)
        reader.put(
            "quantization.double_quant", True, located, "torchao NF4 quantizes its scales again"
        )
        reader.put(
            "quantization.compute_dtype",
            "float32" if reader.reading.value_of("precision") == "fp32" else "bfloat16",
            located,
            "torchtune computes in dtype",
        )
        reader.put(
            "quantization.prepare_for_kbit_training",
            False,
            located,
            "torchtune does not upcast the frozen weights",
        )


# --------------------------------------------------------------------------------------------
# how a fix is written in this framework's config (`llmmem.extract.frameworks.spelling`)

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


def torchtune_qlora_builder(_setup: Any, current: Any) -> Any:
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
FIX_SPELLINGS: dict[str, Spelling] = {
    "qlora": (KeyWrite(("model", "_component_"), torchtune_qlora_builder, True),),
    "grad-ckpt": (KeyWrite(("enable_activation_checkpointing",), True),),
    "bf16": (KeyWrite(("dtype",), "bf16"),),
    "optim-8bit": (KeyWrite(("optimizer", "_component_"), "bitsandbytes.optim.AdamW8bit", True),),
    "optim-paged-8bit": (
        KeyWrite(("optimizer", "_component_"), "bitsandbytes.optim.PagedAdamW8bit", True),
    ),
    "halve-batch": halve(("batch_size",), ("gradient_accumulation_steps",)),
}

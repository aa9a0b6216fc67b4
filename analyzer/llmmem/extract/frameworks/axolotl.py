"""axolotl YAML: base_model, micro_batch_size, sequence_len, adapter: lora|qlora, rl:, and the
DeepSpeed file or FSDP block it names.
"""

from __future__ import annotations

from typing import Any

from llmmem.extract.frameworks.accelerate import FSDP_STRATEGY_NAMES, read_fsdp_config_block
from llmmem.extract.frameworks.common import (
    DocumentReader,
    Setting,
    as_attention,
    as_bool,
    as_float,
    as_int,
    as_name_list,
    as_quant_storage,
    as_text,
    lora_targets,
)
from llmmem.extract.frameworks.deepspeed import read_deepspeed_reference
from llmmem.extract.frameworks.hf_yaml import read_hf_fsdp
from llmmem.extract.frameworks.spelling import KeyWrite, Spelling, halve
from llmmem.extract.vocabulary import AXOLOTL_RL_OBJECTIVES
from llmmem.extract.yaml_positions import KeyPath
from llmmem.plan import Provenance

AXOLOTL_KEYS = frozenset(
    {"base_model", "micro_batch_size", "sequence_len", "adapter", "base_model_config"}
)


def is_axolotl_config(value: dict[str, Any]) -> bool:
    return bool(set(value) & AXOLOTL_KEYS)


def read_axolotl(reader: DocumentReader) -> None:
    reader.take(("base_model",), "model_id", as_text)
    micro_batch = reader.take(("micro_batch_size",), "per_device_train_batch_size", as_int)
    accumulation = reader.take(
        ("gradient_accumulation_steps",), "gradient_accumulation_steps", as_int
    )
    if accumulation is None and reader.is_set(("batch_size",)):
        batch_size = reader.converted(("batch_size",), as_int)
        if batch_size is not None:
            reader.put(
                "gradient_accumulation_steps",
                max(1, batch_size // (micro_batch or 1)),
                ("batch_size",),
                "batch_size / micro_batch_size",
            )
    reader.take(("sequence_len",), "max_seq_length", as_int)
    # image_size: a multimodal config's images, resized so before the model's processor;
    # context_parallel_size (sequence_parallel_degree before axolotl 0.12), tensor_parallel_size
    for name in (
        "sample_packing",
        "pad_to_sequence_len",
        "sequence_parallel_degree",
        "context_parallel_size",
        "tensor_parallel_size",
        "image_size",
    ):
        reader.keep(name, (name,))
    read_axolotl_objective(reader)
    read_axolotl_checkpointing(reader)
    uses_deepspeed = reader.is_set(("deepspeed",))
    read_axolotl_precision(reader, uses_deepspeed)
    reader.take(("optimizer",), "optim", as_text)
    read_axolotl_attention(reader)
    read_axolotl_loss(reader)
    read_axolotl_adapter(reader)
    read_deepspeed_reference(reader, ("deepspeed",))
    read_axolotl_fsdp(reader)
    defaults = AXOLOTL_DEFAULTS
    for key, value, note in defaults:
        reader.default(key, value, note)


# read from axolotl 0.18.0: utils/schemas/training.py (micro_batch_size,
# gradient_accumulation_steps, optimizer), utils/schemas/config.py (sequence_len,
# gradient_checkpointing); precision (bf16 default auto) is set in read_axolotl_precision
AXOLOTL_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("per_device_train_batch_size", 1, "axolotl micro_batch_size default"),
    ("gradient_accumulation_steps", 1, "axolotl gradient_accumulation_steps default"),
    ("max_seq_length", 512, "axolotl sequence_len default"),
    ("gradient_checkpointing", False, "axolotl gradient_checkpointing default"),
    ("optim", "adamw_torch_fused", "axolotl optimizer default"),
    ("attn_implementation", "sdpa", "transformers' default attention (no axolotl flag set)"),
)


def read_axolotl_objective(reader: DocumentReader) -> None:
    """`rl: dpo|ipo|orpo|kto|simpo|grpo`: axolotl trains with TRL's trainer of that name; an
    unknown value is kept, and the analysis says its step is not sized (the estimate is the
    supervised step's)."""
    rl = reader.converted(("rl",), as_text)
    if rl is None or not rl.strip() or rl.strip().lower() in ("false", "none"):
        return
    name = rl.strip().lower()
    objective = AXOLOTL_RL_OBJECTIVES.get(name, name)
    note = f"rl: {rl}" + (" (TRL's DPO forward with the IPO loss)" if name == "ipo" else "")
    if name == "simpo":
        note = "rl: simpo (TRL's CPO trainer with loss_type simpo)"
    reader.put("objective", objective, ("rl",), note)
    reader.keep("rl_adapter_ref_model", ("rl_adapter_ref_model",))
    reader.keep("precompute_ref_log_probs", ("precompute_ref_log_probs",))
    if objective == "cpo":
        # axolotl passes `cpo_alpha` to TRL's CPOConfig (TRL's default 1.0 where unset)
        reader.keep("cpo_alpha", ("cpo_alpha",))
    if objective == "grpo":
        read_axolotl_grpo(reader)


# axolotl's `trl:` block (utils/schemas/trl.py TRLConfig) passes these to TRL's GRPOConfig
# under the same names (core/trainers/grpo GRPOStrategy.set_training_args_kwargs)
AXOLOTL_GRPO_KEYS = ("num_generations", "max_completion_length", "beta", "num_iterations")


def read_axolotl_grpo(reader: DocumentReader) -> None:
    """`rl: grpo` with its `trl:` block: the GRPOConfig fields the GRPO budget reads, kept
    under TRL's names. `use_vllm: true` generates with vLLM: in a server started by `axolotl
    vllm-serve` on other GPUs (`vllm_mode: server`, TRL's default, and what
    `vllm_server_host` points at), or colocated in the training process (`vllm_mode:
    colocate`), holding `vllm_gpu_memory_utilization` of each GPU (in `trl:`, or the `vllm:`
    block's `gpu_memory_utilization`)."""
    trl: KeyPath = ("trl",)
    if reader.is_set(trl) and not isinstance(reader.get(trl), dict):
        reader.problem(trl, "trl: is not a mapping of GRPO settings; TRL's defaults are used")
        return
    for name in AXOLOTL_GRPO_KEYS:
        reader.keep(name, (*trl, name))
    use_vllm_path = (*trl, "use_vllm")
    use_vllm = reader.converted(use_vllm_path, as_bool)
    if use_vllm is not None:
        reader.put("use_vllm", use_vllm, use_vllm_path)
    if not use_vllm:
        return
    mode_path, host_path = (*trl, "vllm_mode"), (*trl, "vllm_server_host")
    mode = (reader.converted(mode_path, as_text) or "").strip().lower()
    if mode:
        reader.put("vllm_mode", mode, mode_path)
    elif reader.is_set(host_path):
        note = "vllm_server_host: generation in a vLLM server on other GPUs"
        reader.put("vllm_mode", "server", host_path, note)
    else:
        reader.derived("vllm_mode", "server", "TRL's vllm_mode default: a vLLM server")
    for path in ((*trl, "vllm_gpu_memory_utilization"), ("vllm", "gpu_memory_utilization")):
        utilization = reader.converted(path, as_float)
        if utilization is not None:
            reader.put("vllm_gpu_memory_utilization", utilization, path)
            break
    reader.keep("vllm_enable_sleep_mode", (*trl, "vllm_enable_sleep_mode"))


def read_axolotl_checkpointing(reader: DocumentReader) -> None:
    reader.keep("activation_offloading", ("activation_offloading",))  # true | legacy | disk
    reader.keep("torch_compile", ("torch_compile",))
    path = ("gradient_checkpointing",)
    if not reader.is_set(path):
        return
    raw = reader.get(path)
    if isinstance(raw, str) and raw.lower() in ("unsloth", "offload", "offload_disk"):
        reader.put("gradient_checkpointing", True, path, f"gradient_checkpointing: {raw}")
        reader.put("activation_offloading", raw, path)
        return
    reader.take(path, "gradient_checkpointing", as_bool)


def read_axolotl_precision(reader: DocumentReader, uses_deepspeed: bool) -> None:
    """axolotl loads the model in bfloat16 when bf16 is on (torch_dtype follows it) and hands
    bf16=True to the trainer, which autocasts: weights, gradients and AdamW states in bf16
    under bf16 autocast ("bf16-autocast"); `bfloat16: true` is pure bf16 without autocast
    ("bf16-true"); under DeepSpeed the ZeRO optimizer keeps fp32 master weights instead
    ("bf16").

    `bf16: auto`, also what an unset bf16 means (utils/schemas/config.py, axolotl 0.18.0 and
    since 0.10), is resolved on the GPU (utils/config resolve_dtype): bf16 where the GPU has it;
    on an older GPU bf16 is off and fp16 on, unless `fp16: false` leaves float32. `fp16: true`
    beside `auto` wins. fp16, bfloat16 and float16 take true or false only."""
    for key in ("fp16", "bfloat16", "float16"):
        if is_auto(reader, (key,)):
            reader.problem((key,), f"{key} takes true or false; only bf16 takes auto")
    bf16_path = ("bf16",)
    auto = not reader.is_set(bf16_path) or is_auto(reader, bf16_path)
    flags = {
        key: None if is_auto(reader, (key,)) else reader.converted((key,), as_bool)
        for key in ("fp16", "bfloat16", "float16")
    }
    if not auto and reader.converted(bf16_path, as_bool):
        put_axolotl_precision(reader, "bf16", uses_deepspeed)
    elif flags["bfloat16"]:
        put_axolotl_precision(reader, "bfloat16", uses_deepspeed)
    elif flags["fp16"]:
        put_axolotl_precision(reader, "fp16", uses_deepspeed)
    elif auto:
        read_axolotl_bf16_auto(reader, uses_deepspeed, fp16=flags["fp16"])
    elif flags["float16"]:
        put_axolotl_precision(reader, "float16", uses_deepspeed)
    else:
        reader.default("precision", "fp32", "bf16: false and no fp16: axolotl loads float32")
    reader.keep("tf32", ("tf32",))


# key -> (precision without DeepSpeed, with DeepSpeed, the dtype axolotl loads the model in)
AXOLOTL_PRECISIONS = {
    "bf16": ("bf16-autocast", "bf16", "bfloat16"),
    "bfloat16": ("bf16-true", "bf16-true", "bfloat16"),
    "fp16": ("fp16-true", "fp16", "float16"),
    "float16": ("fp16-true", "fp16-true", "float16"),
}


def is_auto(reader: DocumentReader, path: tuple[str, ...]) -> bool:
    raw = reader.get(path)
    return isinstance(raw, str) and raw.strip().lower() == "auto"


def put_axolotl_precision(reader: DocumentReader, key: str, uses_deepspeed: bool) -> None:
    true_precision, deepspeed_precision, dtype = AXOLOTL_PRECISIONS[key]
    precision = deepspeed_precision if uses_deepspeed else true_precision
    note = (
        "DeepSpeed keeps fp32 master weights"
        if uses_deepspeed and precision != true_precision
        else f"axolotl loads the model in {dtype}"
    )
    reader.put("precision", precision, (key,), note)


def read_axolotl_bf16_auto(
    reader: DocumentReader, uses_deepspeed: bool, *, fp16: bool | None
) -> None:
    """bf16 on a GPU that has it (Ampere and newer, the GPUs these configs are written for);
    what an older GPU gets instead is said in the note and kept as `bf16_auto_fallback`."""
    precision = "bf16" if uses_deepspeed else "bf16-autocast"
    fallback = "fp32" if fp16 is False else "fp16"
    older = "float32 (fp16: false)" if fallback == "fp32" else "fp16 (the same bytes per value)"
    meaning = f"bf16 where the GPU supports it (Ampere and newer), else {older}"
    path = ("bf16",)
    if reader.is_set(path):
        reader.put("precision", precision, path, f"bf16: auto: {meaning}")
    else:
        reader.reading.settings.append(
            Setting(
                "precision",
                precision,
                Provenance.DEFAULT,
                None,
                f"axolotl bf16 default auto: {meaning}",
            )
        )
    reader.derived("bf16_auto_fallback", fallback, "what bf16: auto gives on a GPU without bf16")


def read_axolotl_attention(reader: DocumentReader) -> None:
    for key, attention in (
        ("flash_attention", "flash_attention_2"),
        ("sdp_attention", "sdpa"),
        ("flex_attention", "sdpa"),
        ("xformers_attention", "sdpa"),
        ("eager_attention", "eager"),
    ):
        if reader.converted((key,), as_bool):
            note = (
                "xformers: memory-efficient attention, no seq² scores"
                if key.startswith("xformers")
                else ""
            )
            reader.put("attn_implementation", attention, (key,), note)
            return
    reader.take(("attn_implementation",), "attn_implementation", as_attention)


def read_axolotl_loss(reader: DocumentReader) -> None:
    for key, loss, note in (
        ("liger_fused_linear_cross_entropy", "liger", "Liger fused linear cross-entropy"),
        ("cut_cross_entropy", "cce", "Cut Cross-Entropy: no logits materialised"),
        ("chunked_cross_entropy", "chunked", "chunked cross-entropy"),
    ):
        if reader.converted((key,), as_bool):
            reader.put("loss", loss, (key,), note)
            return


def read_axolotl_adapter(reader: DocumentReader) -> None:
    adapter = reader.converted(("adapter",), as_text)
    load_in_4bit = reader.converted(("load_in_4bit",), as_bool)
    load_in_8bit = reader.converted(("load_in_8bit",), as_bool)
    if adapter is not None and adapter.lower() in ("lora", "qlora"):
        reader.put("lora.enabled", True, ("adapter",), f"adapter: {adapter}")
        reader.take(("lora_r",), "lora.r", as_int)
        reader.take(("lora_alpha",), "lora.alpha", as_float)
        reader.take(("lora_dropout",), "lora.dropout", as_float)
        if reader.converted(("lora_target_linear",), as_bool):
            reader.put(
                "lora.target_modules",
                ["all-linear"],
                ("lora_target_linear",),
                "lora_target_linear: every linear layer",
            )
        else:
            reader.take(("lora_target_modules",), "lora.target_modules", lora_targets)
        reader.take(("lora_modules_to_save",), "lora.modules_to_save", as_name_list)
        reader.take(("peft_use_dora",), "lora.dora", as_bool)
        if not reader.reading.has("lora.r"):
            reader.reading.settings.append(
                Setting("lora.r", 8, Provenance.ASSUMED, None, "axolotl needs lora_r; assumed 8")
            )
        if not reader.reading.has("lora.alpha"):
            rank = reader.reading.value_of("lora.r") or 8
            reader.reading.settings.append(
                Setting(
                    "lora.alpha",
                    float(rank * 2),
                    Provenance.ASSUMED,
                    None,
                    "axolotl needs lora_alpha; assumed 2 × lora_r",
                )
            )
    elif adapter is not None:
        reader.problem(("adapter",), f"adapter '{adapter}' is not read (lora and qlora are)")
    if load_in_4bit or (adapter is not None and adapter.lower() == "qlora"):
        path = ("load_in_4bit",) if load_in_4bit else ("adapter",)
        reader.put("quantization.bits", 4, path)
        reader.put("quantization.quant_type", "nf4", path, "axolotl QLoRA: nf4")
        reader.put("quantization.double_quant", True, path, "axolotl QLoRA: double quantization")
        reader.put(
            "quantization.prepare_for_kbit_training",
            True,
            path,
            "axolotl calls prepare_model_for_kbit_training for k-bit adapters",
        )
        reader.put(
            "quantization.compute_dtype",
            "bfloat16"
            if reader.reading.value_of("precision") in ("bf16", "bf16-true", "bf16-autocast")
            else (
                "float16"
                if reader.reading.value_of("precision") in ("fp16", "fp16-true")
                else "float32"
            ),
            path,
            "axolotl computes in the model's dtype",
        )
        # axolotl's QLoRA loader stores the packed 4-bit weights in bf16 (FSDP can shard them)
        # unless bnb_config_kwargs says otherwise
        storage_path = ("bnb_config_kwargs", "bnb_4bit_quant_storage")
        if reader.take(storage_path, "quantization.quant_storage", as_quant_storage) is None:
            reader.put(
                "quantization.quant_storage",
                "bfloat16",
                path,
                "axolotl QLoRA: bnb_4bit_quant_storage bfloat16",
            )
    elif load_in_8bit:
        reader.put("quantization.bits", 8, ("load_in_8bit",))
        reader.put("quantization.quant_type", "int8", ("load_in_8bit",))
        reader.put(
            "quantization.prepare_for_kbit_training",
            adapter is not None,
            ("load_in_8bit",),
            "axolotl calls prepare_model_for_kbit_training for k-bit adapters",
        )


def read_axolotl_fsdp(reader: DocumentReader) -> None:
    if reader.is_set(("fsdp",)):
        read_hf_fsdp(reader, ("fsdp",), ("fsdp_config",))
        return
    if not reader.is_set(("fsdp_config",)):
        return
    block = ("fsdp_config",)
    for prefix in ("fsdp_", ""):
        strategy_path = (*block, f"{prefix}sharding_strategy")
        if reader.is_set(strategy_path):
            raw = str(reader.get(strategy_path)).strip().lower()
            strategy = FSDP_STRATEGY_NAMES.get(raw, "full_shard")
            if strategy is not None:
                reader.put("distributed.fsdp", strategy, strategy_path)
            break
        reshard_path = (*block, f"{prefix}reshard_after_forward")
        if reader.is_set(reshard_path):
            reshard = reader.converted(reshard_path, as_bool)
            reader.put(
                "distributed.fsdp",
                "shard_grad_op" if reshard is False else "full_shard",
                reshard_path,
                "reshard_after_forward decides full or grad-op sharding",
            )
            break
    else:
        reader.put("distributed.fsdp", "full_shard", block, "FSDP's default: full sharding")
    read_fsdp_config_block(reader, block)


# --------------------------------------------------------------------------------------------
# how a fix is written in this framework's config (`llmmem.extract.frameworks.spelling`)

# axolotl 0.19: axolotl/utils/schemas/config.py (gradient_checkpointing, bf16),
# axolotl/utils/schemas/training.py (micro_batch_size, gradient_accumulation_steps, optimizer:
# HF `optim` names), axolotl/integrations/liger/args.py (liger_fused_linear_cross_entropy, read
# only with the Liger plugin listed under `plugins`), adapter: qlora with load_in_4bit
AXOLOTL_LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"


def with_liger_plugin(current: Any) -> Any:
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


FIX_SPELLINGS: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("gradient_checkpointing",), True),),
    "bf16": (KeyWrite(("bf16",), True),),
    "optim-8bit": (KeyWrite(("optimizer",), "adamw_bnb_8bit"),),
    "optim-paged-8bit": (KeyWrite(("optimizer",), "paged_adamw_8bit"),),
    "liger": (
        KeyWrite(("plugins",), lambda _s, current: with_liger_plugin(current)),
        KeyWrite(("liger_fused_linear_cross_entropy",), True),
    ),
    "halve-batch": halve(("micro_batch_size",), ("gradient_accumulation_steps",)),
    "qlora": (KeyWrite(("adapter",), "qlora"), KeyWrite(("load_in_4bit",), True)),
    # `rl: dpo|kto`: passed on to TRL's DPOConfig/KTOConfig (read by `read_axolotl_rl`)
    "precompute-ref": (KeyWrite(("precompute_ref_log_probs",), True),),
    # `rl: grpo` with `trl: {use_vllm: true, vllm_mode: colocate}`; the value is the one the
    # fix computes (rules/fixes.py), written where the file sets the engine's share (`trl:`
    # or the `vllm:` block, both read by `read_axolotl_grpo`)
    "vllm-share": (
        KeyWrite(("trl", "vllm_gpu_memory_utilization"), None, layout_key=True),
        KeyWrite(("vllm", "gpu_memory_utilization"), None, layout_key=True),
    ),
    "vllm-sleep": (KeyWrite(("trl", "vllm_enable_sleep_mode"), True),),
}

"""A plan's setup: each value a reader kept mapped onto the accounting core's TrainingSetup.

`setup_from_plan` is the first step of the one road from a plan to a budget
(`llmmem.sizing`), for a file's plan and for estimate's flags (`llmmem.flag_plan`) alike.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmmem.budget.setup import (
    AttnImpl,
    ContextParallel,
    DistributedSetup,
    Framework,
    FsdpShard,
    LoraSetup,
    LossImpl,
    Method,
    Packing,
    Precision,
    QuantSetup,
    QuantType,
    SetupError,
    TrainingSetup,
    VisionSetup,
)
from llmmem.models.spec import ModelSpec
from llmmem.plan import Provenance, QuantizationPlan, Sourced, TrainingPlan

DTYPE_BYTES = {
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float32": 4,
    "fp32": 4,
    "float": 4,
}
ATTN_NAMES = {
    "eager": AttnImpl.EAGER,
    "sdpa": AttnImpl.SDPA,
    "flash_attention_2": AttnImpl.FLASH_ATTENTION_2,
    "flash_attention_3": AttnImpl.FLASH_ATTENTION_2,
}


def setup_from_plan(plan: TrainingPlan, spec: ModelSpec) -> TrainingSetup:
    """The accounting core's setup for a plan; raises SetupError for an impossible plan."""
    quant = None
    method = Method.FULL
    q = plan.quantization or checkpoint_quantization_plan(spec, plan)
    if q is not None:
        quant_type = (
            QuantType.INT8
            if q.bits.value == 8
            else QuantType(
                str(q.quant_type.value).lower()
                if str(q.quant_type.value).lower() in ("nf4", "fp4")
                else "nf4"
            )
        )
        quant = QuantSetup(
            quant_type=quant_type,
            double_quant=bool(q.double_quant.value),
            compute_dtype_bytes=DTYPE_BYTES.get(str(q.compute_dtype.value).lower(), 2),
            prepare_for_kbit_training=bool(q.prepare_for_kbit_training.value),
            quant_storage=str(q.quant_storage.value),
        )
    lora = None
    if plan.lora is not None:
        lp = plan.lora
        lora = LoraSetup(
            r=int(lp.r.value),
            alpha=float(lp.alpha.value),
            targets=_targets(lp.target_modules.value),
            modules_to_save=list(lp.modules_to_save.value or []),
            dora=bool(lp.dora.value),
            dropout=float(lp.dropout.value or 0.0),
            adapter_bytes=_adapter_bytes(plan),
        )
        method = Method.QLORA if quant is not None and quant.bits == 4 else Method.LORA
    elif quant is not None:
        raise SetupError(
            "the model is loaded in k-bit but no LoRA adapter is configured: full fine-tuning "
            "of a quantized model is not possible (add a LoraConfig / get_peft_model)"
        )
    d = plan.distributed
    fsdp = _fsdp(d.fsdp.value)
    distributed = DistributedSetup(
        world_size=max(1, int(d.world_size.value)),
        zero_stage=int(d.zero_stage.value) if fsdp is None else 0,
        offload_optimizer=bool(d.offload_optimizer.value),
        offload_params=bool(d.offload_params.value)
        and (int(d.zero_stage.value) == 3 or fsdp is not None),
        fsdp=fsdp,
        reduce_bucket_size=_elements_or_auto(d.reduce_bucket_size.value),
        overlap_comm=d.overlap_comm.value,
        contiguous_gradients=bool(d.contiguous_gradients.value),
        max_reuse_distance=int(d.max_reuse_distance.value),
        prefetch_bucket_size=_elements_or_auto(d.prefetch_bucket_size.value),
        param_persistence_threshold=_elements_or_auto(d.param_persistence_threshold.value),
        sub_group_size=int(d.sub_group_size.value),
        fsdp_own_units=_own_units(plan) if fsdp is not None else (),
    )
    distributed = with_context_parallel_of(plan, distributed)
    return TrainingSetup(
        method=method,
        batch=max(1, int(plan.per_device_train_batch_size.value)),
        seq=max(1, int(plan.max_seq_length.value)),
        grad_accum=max(1, int(plan.gradient_accumulation_steps.value)),
        grad_ckpt=bool(plan.gradient_checkpointing.value),
        precision=Precision(plan.precision.value),
        optim=str(plan.optim.value),
        attn=ATTN_NAMES.get(str(plan.attn_implementation.value), AttnImpl.SDPA),
        loss=LossImpl(plan.loss.value)
        if plan.loss is not None
        # litgpt's finetune scripts compute chunked_cross_entropy (128 positions a chunk)
        else LossImpl.CHUNKED
        if plan.framework == "litgpt"
        else LossImpl.STANDARD,
        lora=lora,
        quant=quant,
        distributed=distributed,
        use_cache=bool(plan.use_cache.value) if plan.use_cache is not None else False,
        optimizer_in_backward=extra_flag(plan, "optimizer_in_bwd"),
        packing=packing_of(plan),
        activation_offload=_offloads_activations(plan) or _unsloth_offloads(plan),
        reentrant_checkpointing=_reentrant(plan),
        # TrainingArguments/axolotl `torch_compile`, torchtune `compile`
        compile=extra_flag(plan, "torch_compile") or extra_flag(plan, "compile"),
        framework=Framework.UNSLOTH
        if extra_flag(plan, "unsloth")
        else PLAN_STACKS.get(str(plan.framework), Framework.HF),
        loss_chunks=_whole_extra(plan, "num_output_chunks", 8),
        framework_script=extra_text(plan, "litgpt_script") or None,
        vision=vision_of(plan, spec),
        float8=extra_text(plan, "fp8_backend") == "AO" and lora is None and quant is None,
        float8_te=extra_text(plan, "fp8_backend") == "TE" and lora is None and quant is None,
    )


def _own_units(plan: TrainingPlan) -> tuple[str, ...]:
    """torchtune's `custom_sharded_layers` as the budget's own FSDP units (the reader's module
    is imported only for a plan that has the key: start-up stays free of YAML)."""
    layers = _extra_value(plan, "custom_sharded_layers")
    if not layers:
        return ()
    from llmmem.extract.frameworks.torchtune import torchtune_own_units

    return torchtune_own_units(layers)


def checkpoint_quantization_plan(
    spec: ModelSpec, plan: TrainingPlan | None = None
) -> QuantizationPlan | None:
    """A pre-quantized bitsandbytes checkpoint (its config's `quantization_config`) loads in
    k-bit whether or not the file passes a BitsAndBytesConfig: the plan's quantization where
    the file gives none (prepared for k-bit training where the file calls
    prepare_model_for_kbit_training); None for any other checkpoint."""
    found = spec.checkpoint_quantization
    if found is None or found.method != "bitsandbytes":
        return None

    def said(value: Any) -> Sourced[Any]:
        return Sourced(
            value=value, source=Provenance.CONFIG, note="the checkpoint's quantization_config"
        )

    prepared = plan.extra.get("prepare_for_kbit_training") if plan is not None else None
    return QuantizationPlan(
        bits=said(8 if found.bits == 8 else 4),
        quant_type=said("int8" if found.bits == 8 else found.quant_type or "nf4"),
        double_quant=said(found.double_quant),
        compute_dtype=said("bfloat16"),
        prepare_for_kbit_training=prepared
        if isinstance(prepared, Sourced)
        else Sourced(
            value=False,
            source=Provenance.DEFAULT,
            note="prepare_model_for_kbit_training not called",
        ),
    )


def own_units_note(plan: TrainingPlan) -> str | None:
    layers = _extra_value(plan, "custom_sharded_layers")
    if not layers:
        return None
    from llmmem.extract.frameworks.torchtune import own_units_note

    return own_units_note(layers)


def _extra_value(plan: TrainingPlan, name: str) -> Any:
    kept = plan.extra.get(name)
    return kept.value if isinstance(kept, Sourced) else kept


def extra_text(plan: TrainingPlan, name: str) -> str:
    value = _extra_value(plan, name)
    return str(value) if value is not None else ""


# the keys that divide each sequence over a group of ranks, and how each framework attends
CONTEXT_PARALLEL_KEYS = (
    ("sequence_parallel_degree", ContextParallel.RING_FLASH),  # axolotl: ring-flash-attn
    ("context_parallel_size", ContextParallel.RING_FLASH),  # axolotl 0.12+
    ("cp_size", ContextParallel.RING),  # accelerate ParallelismConfig: torch's
    ("sp_size", ContextParallel.ULYSSES),  # accelerate ParallelismConfig: DeepSpeed's
    ("deepspeed_sequence_parallel_size", ContextParallel.ULYSSES),  # a DeepSpeed config's
    ("sequence_parallel_size", ContextParallel.RING_FLASH),  # LLaMA-Factory: zigzag ring
)


def with_context_parallel_of(plan: TrainingPlan, d: DistributedSetup) -> DistributedSetup:
    """The context- and tensor-parallel groups the plan's framework keys ask for; the world
    grows to hold them where the plan states fewer ranks."""
    tp = max(_whole_extra(plan, "tp_size", 1), _whole_extra(plan, "tensor_parallel_size", 1))
    # accelerate's ParallelismConfig names every dimension: the world is their product
    named = 1
    for key in ("dp_replicate_size", "dp_shard_size", "cp_size", "sp_size", "tp_size"):
        named *= _whole_extra(plan, key, 1)
    if named > d.world_size:
        d = replace(d, world_size=named)
    if tp > 1:
        world = d.world_size if d.world_size % tp == 0 else tp
        d = replace(d, world_size=world, tp_size=tp)
    for key, scheme in CONTEXT_PARALLEL_KEYS:
        size = _whole_extra(plan, key, 1)
        if size <= 1:
            continue
        mode = plan.extra.get("sequence_parallel_mode")
        mode_text = str(mode.value if isinstance(mode, Sourced) else mode or "").lower()
        if key == "sequence_parallel_size" and "ulysses" in mode_text:
            scheme = ContextParallel.ULYSSES
        groups = size * d.tp_size
        world = d.world_size if d.world_size % groups == 0 else groups
        return replace(d, world_size=world, cp_size=size, cp_scheme=scheme)
    return d


# LLaMA-Factory's ProcessorArguments: image_max_pixels 768·768, image_min_pixels 32·32
LLAMAFACTORY_PIXELS = (32 * 32, 768 * 768)
# elsewhere a config names no image size: one image of this side is assumed
ASSUMED_SIDE = 448


def vision_of(plan: TrainingPlan, spec: ModelSpec) -> VisionSetup | None:
    """The images of a vision-language model's plan. No config says how many images a
    sample holds (the dataset does): one is assumed, and said. LLaMA-Factory's images are
    sized at its own bound on their area (`image_max_pixels`), its `freeze_vision_tower` and
    `freeze_multi_modal_projector` (both on by default) freeze the image side and keep LoRA's
    adapters in the language model, its `cutoff_len` counts the image tokens; elsewhere a
    448×448 image whose tokens the maximum length also counts (TRL's `max_length`)."""
    if spec.vision is None:
        return None
    if plan.framework != "llamafactory":
        height, width = _axolotl_image_size(plan) or (ASSUMED_SIDE, ASSUMED_SIDE)
        return VisionSetup(
            images=1,
            height=height,
            width=width,
            seq_includes_images=True,
            assumed="one image a sample assumed, the dataset decides",
        )
    low = _whole_extra(plan, "image_min_pixels", LLAMAFACTORY_PIXELS[0])
    high = _whole_extra(plan, "image_max_pixels", LLAMAFACTORY_PIXELS[1])
    side = max(1, int(high**0.5))
    freeze_tower = _extra_bool(plan, "freeze_vision_tower", True)
    projector_only = _extra_bool(plan, "train_mm_proj_only", False)
    freeze_projector = _extra_bool(plan, "freeze_multi_modal_projector", True)
    return VisionSetup(
        images=1,
        height=side,
        width=side,
        min_pixels=min(low, high),
        max_pixels=high,
        encoder_trains=False if freeze_tower or projector_only else None,
        projector_trains=True if projector_only else (False if freeze_projector else None),
        adapters_reach_vision=not freeze_tower,
        seq_includes_images=True,
        assumed=f"one image a sample of image_max_pixels ({high:,}) assumed, the dataset decides",
    )


def _axolotl_image_size(plan: TrainingPlan) -> tuple[int, int] | None:
    """axolotl's `image_size`: one side for a square, or [height, width]."""
    kept = plan.extra.get("image_size")
    value = kept.value if isinstance(kept, Sourced) else kept
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and 0 < value <= 1 << 16:
        return value, value
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 16 for v in value)
    ):
        return int(value[0]), int(value[1])
    return None


def _extra_bool(plan: TrainingPlan, name: str, default: bool) -> bool:
    kept = plan.extra.get(name)
    value = kept.value if isinstance(kept, Sourced) else kept
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return value if isinstance(value, bool) else default


# the plans whose framework trains with a stack of its own (llmmem.budget.stacks); the rest
# run transformers' models under the HF Trainer or a loop of their own
PLAN_STACKS = {
    "plain": Framework.PLAIN,
    "torchtune": Framework.TORCHTUNE,
    "swift": Framework.SWIFT,
    "litgpt": Framework.LITGPT,
}


def _adapter_bytes(plan: TrainingPlan) -> int:
    """The LoRA weights' bytes: fp32 (peft's autocast_adapter_dtype) unless the reader kept a
    16-bit `lora_dtype` (ms-swift's `--lora_dtype bfloat16`)."""
    kept = plan.extra.get("lora_dtype")
    value = kept.value if isinstance(kept, Sourced) else kept
    return 2 if str(value).lower() in ("bfloat16", "bf16", "float16", "fp16") else 4


def _unsloth_offloads(plan: TrainingPlan) -> bool:
    """unsloth's `use_gradient_checkpointing="unsloth"` (its default): the checkpointed layers'
    inputs wait on the host; the reader says so in the checkpointing's provenance."""
    note = plan.gradient_checkpointing.note or ""
    return (
        extra_flag(plan, "unsloth")
        and bool(plan.gradient_checkpointing.value)
        and "unsloth's offloaded gradient checkpointing" in note
    )


def _whole_extra(plan: TrainingPlan, name: str, default: int) -> int:
    """A whole number a framework's reader kept in `plan.extra` (torchtune's
    `loss.num_output_chunks`), else `default`."""
    kept = plan.extra.get(name)
    value = kept.value if isinstance(kept, Sourced) else kept
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default
    )


def _reentrant(plan: TrainingPlan) -> bool | None:
    """`gradient_checkpointing_kwargs={"use_reentrant": ...}` where the script writes it."""
    kept = plan.extra.get("use_reentrant")
    value = kept.value if isinstance(kept, Sourced) else kept
    return value if isinstance(value, bool) else None


def _offloads_activations(plan: TrainingPlan) -> bool:
    """TRL's `activation_offloading=True`, torchtune's `enable_activation_offloading`, verl's
    `enable_activation_offload`, axolotl's `activation_offloading: true|legacy|disk` or
    `gradient_checkpointing: offload|unsloth|offload_disk` (kept under one name)."""
    kept = plan.extra.get("activation_offloading")
    value = kept.value if isinstance(kept, Sourced) else kept
    if isinstance(value, str):
        return value.strip().lower() in (
            "true",
            "1",
            "yes",
            "offload",
            "unsloth",
            "offload_disk",
            "legacy",
            "disk",
        )
    return bool(value)


def packing_of(plan: TrainingPlan) -> Packing | None:
    """How the plan's framework packs samples, from the keys it kept.

    - TRL (`SFTConfig`): `padding_free=True`, or `packing=True` with the default "bfd"
      strategy (0.29.1: `SFTTrainer.__init__` turns padding-free on for it), flattens the
      micro-batch into one row; "wrapped" packing cuts rows without restarting positions: plain
      causal rows, as unpacked.
    - axolotl `sample_packing`: rows of several samples (position ids restart; flash-attention
      takes the boundaries, SDPA a block-diagonal mask).
    - LLaMA-Factory: `neat_packing` keeps the samples apart in each row; `packing` alone
      concatenates them with no boundary: plain causal rows.
    """
    if plan.framework == "axolotl":
        return Packing.ROWS if extra_flag(plan, "sample_packing") else None
    if plan.framework == "llamafactory":
        return Packing.ROWS if extra_flag(plan, "neat_packing") else None
    if extra_flag(plan, "padding_free"):
        return Packing.FLAT
    if extra_flag(plan, "packing"):
        kept = plan.extra.get("packing_strategy")
        strategy = kept.value if isinstance(kept, Sourced) else kept
        if str(strategy or "bfd").strip().lower() == "bfd":
            return Packing.FLAT
    return None


def extra_flag(plan: TrainingPlan, name: str) -> bool:
    """A framework switch kept in `plan.extra` (torchtune's `optimizer_in_bwd: True`)."""
    kept = plan.extra.get(name)
    value = kept.value if isinstance(kept, Sourced) else kept
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def _elements_or_auto(value: Any) -> int | None:
    """A DeepSpeed size in elements, None for "auto" (sized from the model)."""
    return None if value == "auto" else int(value)


def _targets(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value] if value in ("all-linear",) else [v.strip() for v in value.split(",")]
    return [str(v) for v in value]


def _fsdp(value: Any) -> FsdpShard | None:
    if not value:
        return None
    text = str(value).lower()
    for shard in FsdpShard:
        if shard.value in text:
            return shard
    return FsdpShard.FULL_SHARD


def loaded_dtype_note(plan: TrainingPlan, spec: ModelSpec) -> str | None:
    """transformers 5 loads a checkpoint in its own dtype when `dtype=` is not given: a bf16
    checkpoint trains with bf16 weights (and bf16 optimizer states), autocast or not."""
    if plan.kind not in ("python", "notebook") or "torch_dtype" in plan.extra:
        return None
    if plan.quantization is not None or str(plan.precision.value).endswith("-true"):
        return None
    if checkpoint_quantization_plan(spec) is not None:  # k-bit weights: no dtype to load
        return None
    if spec.torch_dtype not in ("bfloat16", "float16"):
        return None
    if plan.distributed.zero_stage.value:
        return (
            f"no dtype= given: transformers 5 loads the checkpoint's {spec.torch_dtype} "
            "weights; DeepSpeed keeps fp32 master weights and optimizer states beside them"
        )
    return (
        f"no dtype= given: transformers 5 loads the checkpoint's {spec.torch_dtype} "
        "weights, so weights, gradients and AdamW states are 16-bit"
    )

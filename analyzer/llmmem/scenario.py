"""From a TrainingPlan to a fully determined scenario: the model, the setup, the GPU, the budget.

`analyze(plan, ...)` is the one call the linter, `llmmem explain` and the language server make
after extraction: it resolves the model, maps every plan value onto the accounting core's
`TrainingSetup` (keeping the plan's provenance beside it) and runs the estimate. It never raises
for a bad plan: what cannot be determined becomes a problem line and the budget is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmmem.budget.float8_te import te_refusal
from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Budget, GpuTarget
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
from llmmem.plan import Provenance, Sourced, TrainingPlan
from llmmem.release_defaults import with_release_defaults

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


@dataclass
class Analysis:
    """Everything known about one file: the plan, and (when it could be built) the estimate."""

    plan: TrainingPlan
    spec: ModelSpec | None = None
    setup: TrainingSetup | None = None
    gpu: GpuTarget | None = None
    gpu_source: str = "none"  # "plan", "flag", "detected", "none"
    budget: Budget | None = None
    problems: list[str] = field(default_factory=list)
    model_error: str | None = None  # why the model could not be resolved
    # why the setup is not sized: its framework refuses it, or llmmem does not model it
    refusal: str | None = None
    # the releases of the stack the file runs with, each with its source (llmmem.versions)
    versions: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return Path(self.plan.path)


def _sft_trainer_rules(plan: TrainingPlan, analysis: Analysis) -> str | None:
    """A script that hands its model to TRL's SFTTrainer, with the TRL release of its
    environment or lock files known: that release's checkpointing and, over a k-bit model with
    a LoRA config, the preparation and the adapters' dtype as it leaves them
    (llmmem.sft_trainer_rules); a preparation the script calls itself stays as written. The
    k-bit rule's note, if it changed anything."""
    found = analysis.versions.get("trl")
    trainer = plan.extra.get("trainer")
    if (
        analysis.setup is None
        or found is None
        or getattr(trainer, "value", trainer) != "SFTTrainer"
    ):
        return None
    from llmmem.sft_trainer_rules import with_sft_trainer

    q = plan.quantization
    made = with_sft_trainer(
        analysis.setup,
        str(found.version),
        kbit_stated=q is not None and q.prepare_for_kbit_training.source is not Provenance.DEFAULT,
    )
    analysis.setup = made.setup
    return made.kbit_note


def _trl_sft_stack(plan: TrainingPlan, analysis: Analysis) -> None:
    """TRL's SFTTrainer with its release known (the environment's or the lock files'): that
    release's own stack, its loss and metrics (llmmem.budget.stacks.trl). Its other trainers
    are the preference budgets'; unsloth's patched SFTTrainer keeps the HF budget."""
    trainer = plan.extra.get("trainer")
    objective = str(plan.objective.value).lower() if plan.objective is not None else "sft"
    unsloth = plan.extra.get("unsloth")
    if (
        analysis.setup is None
        or "trl" not in analysis.versions
        or plan.framework != "trl"
        or getattr(trainer, "value", trainer) not in (None, "SFTTrainer")
        or objective != "sft"
        or getattr(unsloth, "value", unsloth)
    ):
        return
    analysis.setup = replace(analysis.setup, framework=Framework.TRL)


def setup_from_plan(plan: TrainingPlan, spec: ModelSpec) -> TrainingSetup:
    """The accounting core's setup for a plan; raises SetupError for an impossible plan."""
    quant = None
    method = Method.FULL
    if plan.quantization is not None:
        q = plan.quantization
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
        optimizer_in_backward=_extra_flag(plan, "optimizer_in_bwd"),
        packing=packing_of(plan),
        activation_offload=_offloads_activations(plan) or _unsloth_offloads(plan),
        reentrant_checkpointing=_reentrant(plan),
        # TrainingArguments/axolotl `torch_compile`, torchtune `compile`
        compile=_extra_flag(plan, "torch_compile") or _extra_flag(plan, "compile"),
        framework=Framework.UNSLOTH
        if _extra_flag(plan, "unsloth")
        else PLAN_STACKS.get(str(plan.framework), Framework.HF),
        loss_chunks=_whole_extra(plan, "num_output_chunks", 8),
        framework_script=_extra_text(plan, "litgpt_script") or None,
        vision=vision_of(plan, spec),
        float8=_extra_text(plan, "fp8_backend") == "AO" and lora is None and quant is None,
        float8_te=_extra_text(plan, "fp8_backend") == "TE" and lora is None and quant is None,
    )


def _own_units(plan: TrainingPlan) -> tuple[str, ...]:
    """torchtune's `custom_sharded_layers` as the budget's own FSDP units (the reader's module
    is imported only for a plan that has the key: start-up stays free of YAML)."""
    layers = _extra_value(plan, "custom_sharded_layers")
    if not layers:
        return ()
    from llmmem.extract.frameworks.torchtune import torchtune_own_units

    return torchtune_own_units(layers)


def _own_units_note(plan: TrainingPlan) -> str | None:
    layers = _extra_value(plan, "custom_sharded_layers")
    if not layers:
        return None
    from llmmem.extract.frameworks.torchtune import own_units_note

    return own_units_note(layers)


def _extra_value(plan: TrainingPlan, name: str) -> Any:
    kept = plan.extra.get(name)
    return kept.value if isinstance(kept, Sourced) else kept


def _extra_text(plan: TrainingPlan, name: str) -> str:
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
    "torchtune": Framework.TORCHTUNE,
    "swift": Framework.SWIFT,
    "litgpt": Framework.LITGPT,
}


def _adapter_bytes(plan: TrainingPlan) -> int:
    """The LoRA weights' bytes: fp32 (peft's autocast_adapter_dtype) unless the reader kept a
    16-bit `lora_dtype` (ms-swift's `--lora_dtype bfloat16`)."""
    kept = plan.extra.get("lora_dtype")
    value = kept.value if isinstance(kept, Sourced) else kept
    return 2 if str(value).lower() in ("bfloat16", "bf16") else 4


def _unsloth_offloads(plan: TrainingPlan) -> bool:
    """unsloth's `use_gradient_checkpointing="unsloth"` (its default): the checkpointed layers'
    inputs wait on the host; the reader says so in the checkpointing's provenance."""
    note = plan.gradient_checkpointing.note or ""
    return (
        _extra_flag(plan, "unsloth")
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
        return Packing.ROWS if _extra_flag(plan, "sample_packing") else None
    if plan.framework == "llamafactory":
        return Packing.ROWS if _extra_flag(plan, "neat_packing") else None
    if _extra_flag(plan, "padding_free"):
        return Packing.FLAT
    if _extra_flag(plan, "packing"):
        kept = plan.extra.get("packing_strategy")
        strategy = kept.value if isinstance(kept, Sourced) else kept
        if str(strategy or "bfd").strip().lower() == "bfd":
            return Packing.FLAT
    return None


def _extra_flag(plan: TrainingPlan, name: str) -> bool:
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


def _preference_trainer_on_kbit(
    plan: TrainingPlan, analysis: Analysis, preference: Any
) -> str | None:
    """A k-bit model handed to TRL's preference trainer with a LoRA config: what that trainer
    does to it (llmmem.budget.trl_rules), unless the script prepares the model itself."""
    q = plan.quantization
    if (
        analysis.setup is None
        or preference.trainer != "trl"
        or plan.framework not in ("trl", "hf")
        or (q is not None and q.prepare_for_kbit_training.source is not Provenance.DEFAULT)
    ):
        return None
    from llmmem.budget.trl_rules import preference_trainer_on_kbit

    analysis.setup, note = preference_trainer_on_kbit(analysis.setup, preference.objective.value)
    return note


def _swift_checkpoint_dtype(plan: TrainingPlan, analysis: Analysis) -> str | None:
    """ms-swift without --torch_dtype loads the checkpoint's own dtype and turns on the mixed
    precision that goes with it (ModelArguments._init_mixed_precision, ms-swift 4.6.0): a bf16
    checkpoint trains as bf16 weights under bf16 autocast, an fp32 one under fp16 AMP. The
    note, where this changed the setup."""
    spec, setup = analysis.spec, analysis.setup
    if (
        plan.framework != "swift"
        or spec is None
        or setup is None
        or "torch_dtype" in plan.extra
        or plan.precision.source not in (Provenance.DEFAULT, Provenance.ASSUMED)
        or plan.quantization is not None
    ):
        return None
    if spec.torch_dtype == "bfloat16":
        precision, said = Precision.BF16_AUTOCAST, "bf16 weights under bf16 autocast"
    elif spec.torch_dtype == "float32":
        precision, said = Precision.FP16, "fp32 weights under fp16 autocast"
    else:
        return None
    analysis.setup = replace(setup, precision=precision)
    return (
        f"no --torch_dtype: ms-swift loads the checkpoint's {spec.torch_dtype} and turns on the "
        f"mixed precision that goes with it: {said}"
    )


def resolve_gpu_target(name: str | None) -> tuple[GpuTarget | None, str | None]:
    """A GPU by name, or (None, the error message)."""
    if not name:
        return None, None
    from llmmem.gpus import UnknownGpuError, find_gpu

    try:
        gpu = find_gpu(name)
    except UnknownGpuError as err:
        return None, str(err)
    return GpuTarget(name=gpu.name, capacity_bytes=gpu.capacity_bytes, bf16=gpu.bf16), None


def model_reference(plan: TrainingPlan) -> Sourced[Any] | None:
    """What the model is sized from: a `# llmmem: model_config=path/to/config.json` pragma
    (the shapes, for a model id that cannot be looked up), else the plan's model id."""
    config = plan.extra.get("model_config")
    if isinstance(config, Sourced) and isinstance(config.value, str) and config.value:
        return config
    return plan.model_id


def analyze(
    plan: TrainingPlan,
    *,
    gpu: str | None = None,
    hub: bool = False,
    local_model_paths: dict[str, str] | None = None,
    hub_timeout_s: float = 3.0,
) -> Analysis:
    """Resolve, map and estimate. `gpu` (a flag or setting) wins over the plan's pragma."""
    from llmmem.models.resolve import ModelResolutionError, resolve_model

    analysis = Analysis(plan=plan, problems=list(plan.problems))
    from llmmem.versions import apply_to_setup, find_versions

    try:
        analysis.versions = find_versions(Path(plan.path))
    except OSError:
        analysis.versions = {}
    gpu_name = gpu or (str(plan.gpu.value) if plan.gpu is not None else None)
    analysis.gpu, gpu_error = resolve_gpu_target(gpu_name)
    analysis.gpu_source = ("flag" if gpu else "plan") if analysis.gpu else "none"
    if gpu_error:
        analysis.problems.append(gpu_error)
    model = model_reference(plan)
    if model is None:
        analysis.model_error = "no model found in the file"
        return analysis
    try:
        analysis.spec = resolve_model(
            str(model.value),
            hub=hub,
            hub_timeout_s=hub_timeout_s,
            local_model_paths=local_model_paths,
            base_dir=Path(plan.path).parent,
        )
    except ModelResolutionError as err:
        analysis.spec = _written_in_project(
            str(model.value), plan, hub=hub, hub_timeout_s=hub_timeout_s, error=err
        )
        if analysis.spec is None:
            analysis.model_error = str(err)
            return analysis
    analysis.spec = _with_plan_task_head(plan, analysis.spec, analysis.problems)
    try:
        analysis.setup = setup_from_plan(plan, analysis.spec)
        analysis.setup = apply_to_setup(analysis.setup, analysis.versions)
        analysis.setup, release_notes = with_release_defaults(
            plan, analysis.spec, analysis.setup, analysis.versions
        )
        trl_note = _sft_trainer_rules(plan, analysis)
        _trl_sft_stack(plan, analysis)
        note = loaded_dtype_note(plan, analysis.spec)
        if note and analysis.setup.transformers_release < (5, 0):
            # before transformers 5, from_pretrained without dtype= loads torch's default
            # dtype (fp32); 5 made "auto", the checkpoint's own dtype, the default
            note = (
                f"no dtype= given: transformers {analysis.setup.transformers_version} loads "
                f"the checkpoint's {analysis.spec.torch_dtype} weights as fp32 (its default "
                "before transformers 5)"
            )
            fp32_default = True
        else:
            fp32_default = False
        if note and not fp32_default:
            precision = (
                Precision.FP16_TRUE
                if analysis.spec.torch_dtype == "float16"
                else Precision.BF16_AUTOCAST
                if analysis.setup.precision is Precision.BF16
                else Precision.BF16_TRUE
            )
            if precision is Precision.BF16_AUTOCAST:
                # the Trainer's bf16=True still autocasts over the 16-bit weights it was given
                note += "; bf16=True autocasts over them"
            analysis.setup = replace(analysis.setup, precision=precision)
        note = note or _swift_checkpoint_dtype(plan, analysis)
        from llmmem.preference_plan import preference_setup, unmodelled_objective_problem

        preference = preference_setup(plan)
        unmodelled = unmodelled_objective_problem(plan)
        if unmodelled:
            analysis.problems.append(unmodelled)
        backend = _extra_text(plan, "fp8_backend")
        te_reason = te_refusal(analysis.spec, analysis.setup) if analysis.setup.float8_te else None
        if te_reason is not None:
            analysis.setup = replace(analysis.setup, float8_te=False)
        if backend and not analysis.setup.float8 and not analysis.setup.float8_te:
            analysis.problems.append(
                f"accelerate's fp8 with the {backend} backend"
                + (
                    " under LoRA or k-bit weights"
                    if backend in ("AO", "TE") and not te_reason
                    else ""
                )
                + (f" ({te_reason})" if te_reason else "")
                + " is not sized: the step is sized as bf16 autocast"
            )
        if preference is not None:
            from llmmem.preference_plan import autocast_as_mixed_precision

            kbit_note = _preference_trainer_on_kbit(plan, analysis, preference)
            trl_note = trl_note or kbit_note
            analysis.setup, preference = autocast_as_mixed_precision(analysis.setup, preference)
        if preference is None:
            analysis.budget = estimate_budget(analysis.spec, analysis.setup, analysis.gpu)
        else:
            from llmmem.budget.preference import estimate_preference_budget
            from llmmem.preference_plan import trl_release_note

            analysis.budget = estimate_preference_budget(
                analysis.spec, analysis.setup, preference, analysis.gpu
            )
            release_note = trl_release_note(analysis.versions)
            if release_note:
                analysis.budget.notes.append(release_note)
            from llmmem.preference_plan import grpo_assumed_note

            assumed = grpo_assumed_note(plan)
            if assumed:
                analysis.budget.notes.append(assumed)
        if trl_note:
            analysis.budget.notes.append(trl_note)
        analysis.budget.notes.extend(release_notes)
        from llmmem.calibration.store import with_local_evidence

        analysis.budget = with_local_evidence(analysis.budget, Path(plan.path), plan.framework)
        if note:
            analysis.budget.notes.append(note)
        units = _own_units_note(plan)
        if units:
            analysis.budget.notes.append(units)
    except (SetupError, ValueError) as err:
        analysis.refusal = str(err).removeprefix("Value error, ")
        analysis.problems.append(analysis.refusal)
    return analysis


def _written_in_project(
    ref: str, plan: TrainingPlan, *, hub: bool, hub_timeout_s: float, error: Exception
) -> ModelSpec | None:
    """The spec of the model another training file of the project trains into the folder `ref`
    names (llmmem.project_outputs), for a reference nothing else resolved; None where no file
    writes it. A stage that loads a folder an earlier stage writes itself is followed up to
    MAX_STAGES files back. Where files disagree, `error`'s message says so."""
    from llmmem.models.resolve import ModelResolutionError, resolve_model
    from llmmem.project_outputs import find_project_writer, writer_note

    if "/" not in ref and "\\" not in ref:
        return None
    notes: list[str] = []
    path = Path(plan.path)
    for _ in range(MAX_STAGES):
        writer, disagreement = find_project_writer(ref, path)
        if writer is None:
            if disagreement:
                error.args = (f"{error.args[0]}; {disagreement}", *error.args[1:])
            return None
        notes.append(writer_note(ref, writer, path))
        if len(notes) == 1 and _takes_writers_adapter(plan, writer):
            plan.lora = writer.lora
            notes.append(
                f"the k-bit model here can train only through the adapter "
                f"{writer.path.name} saves in that folder: its LoRA settings are used"
            )
        try:
            spec = resolve_model(
                writer.model, hub=hub, hub_timeout_s=hub_timeout_s, base_dir=writer.path.parent
            )
        except ModelResolutionError:
            ref, path = writer.model, writer.path
            continue
        return replace(spec, notes=[*notes, *spec.notes])
    return None


MAX_STAGES = 3  # earlier stages followed back through the folders they write


def _takes_writers_adapter(plan: TrainingPlan, writer: Any) -> bool:
    """A k-bit model with no adapter of its own, loaded from the folder where an earlier stage
    saves its adapter (not a merged copy): that adapter is what trains (a k-bit model cannot be
    trained in full, so a file that trains it trains the adapter it loads)."""
    return (
        plan.lora is None
        and plan.quantization is not None
        and writer.lora is not None
        and not writer.merged
    )


def _with_plan_task_head(plan: TrainingPlan, spec: ModelSpec, problems: list[str]) -> ModelSpec:
    """The model as the file's `AutoModelFor{SequenceClassification,TokenClassification,
    QuestionAnswering}` builds it: its task head, no vocabulary logits
    (llmmem.models.task_heads)."""
    task = plan.extra.get("task_head")
    if not isinstance(task, Sourced):
        return spec
    from llmmem.models.spec import ModelSpecError
    from llmmem.models.task_heads import with_task_head

    labels = plan.extra.get("num_labels")
    count = labels.value if isinstance(labels, Sourced) and isinstance(labels.value, int) else 2
    try:
        return with_task_head(spec, task.value, count)
    except ModelSpecError as err:
        problems.append(str(err))
        return spec

"""A fully determined training (or generation) setup: everything the accounting core needs besides
the model. Nothing here is optional-unknown: an extractor or the CLI fills every field, labelling
what it defaulted; the core only computes.

The setups are frozen dataclasses that check themselves when built (and again on
`dataclasses.replace`): a value out of range raises SetupError with a one-line message. Enum fields
also accept their values as text ("qlora", "bf16-true").
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, TypeVar

# the transformers release the tests run against: a plan that names none gets its behaviour
TESTED_TRANSFORMERS = "5.24"


class SetupError(ValueError):
    """An impossible or contradictory setup; the message says what to change."""


E = TypeVar("E", bound=Enum)


def _as_enum(kind: type[E], value: Any, what: str) -> E:
    """`value` as a member of `kind`; its text value is accepted too."""
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(member.value) for member in kind)
        raise SetupError(f"{what} must be one of {choices}, got {value!r}") from None


def _whole(value: Any, what: str, *, at_least: int, at_most: int | None = None) -> int:
    """`value` as an int within bounds; a float with no fraction is accepted."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SetupError(f"{what} must be a whole number, got {value!r}")
    if value < at_least:
        raise SetupError(f"{what} must be at least {at_least}, got {value}")
    if at_most is not None and value > at_most:
        raise SetupError(f"{what} must be at most {at_most}, got {value}")
    return value


def _real(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SetupError(f"{what} must be a number, got {value!r}")
    return float(value)


def _set(obj: object, name: str, value: Any) -> None:
    """Assign a field of a frozen setup while it checks itself in `__post_init__`."""
    object.__setattr__(obj, name, value)


class Method(str, Enum):
    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"


class Precision(str, Enum):
    FP32 = "fp32"  # fp32 weights, no autocast
    FP16 = "fp16"  # AMP: fp16 autocast over fp32 weights (HF `fp16=True`)
    BF16 = "bf16"  # AMP: bf16 autocast over fp32 weights (HF `bf16=True` on an fp32 model)
    BF16_TRUE = (
        "bf16-true"  # weights, gradients and optimizer states in bf16 (`torch_dtype=bfloat16`)
    )
    FP16_TRUE = "fp16-true"  # weights in fp16 without autocast (rare; unstable for training)
    # bf16 weights under bf16 autocast: HF `bf16=True` over a model loaded with
    # `dtype=torch.bfloat16` (the Trainer leaves the weights alone; accelerate autocasts)
    BF16_AUTOCAST = "bf16-autocast"

    @property
    def weight_bytes(self) -> int:
        sixteen = (Precision.BF16_TRUE, Precision.FP16_TRUE, Precision.BF16_AUTOCAST)
        return 2 if self in sixteen else 4

    @property
    def compute_bytes(self) -> int:
        return 4 if self is Precision.FP32 else 2

    @property
    def is_autocast(self) -> bool:
        """Mixed precision over fp32 weights (AMP): autocast casts the weights at each use."""
        return self in (Precision.FP16, Precision.BF16)

    @property
    def autocasts(self) -> bool:
        """Whether forward runs under autocast: AMP, or bf16 weights under bf16 autocast."""
        return self.is_autocast or self is Precision.BF16_AUTOCAST

    @property
    def uses_bf16(self) -> bool:
        return self in (Precision.BF16, Precision.BF16_TRUE, Precision.BF16_AUTOCAST)


class AttnImpl(str, Enum):
    EAGER = "eager"
    SDPA = "sdpa"
    FLASH_ATTENTION_2 = "flash_attention_2"


class Packing(str, Enum):
    """How several samples share a micro-batch (the memory differs only in attention).

    FLAT: one row of batch × seq tokens, each sample restarting its position ids (TRL's
    `padding_free`, which `packing=True` turns on with its default "bfd" strategy since 0.20;
    axolotl's and LLaMA-Factory's flash-attention packing). ROWS: batch rows of seq tokens,
    each holding several samples kept apart by their position ids or a block-diagonal mask
    (axolotl's `sample_packing`, LLaMA-Factory's `neat_packing`). With flash-attention the
    samples' boundaries go to the kernel (varlen): no mask. With SDPA transformers builds the
    block-diagonal mask from the position ids and SDPA keeps it per layer; eager attention
    scores a flat row's whole batch × seq square."""

    FLAT = "flat"
    ROWS = "rows"


class LossImpl(str, Enum):
    STANDARD = "standard"  # HF loss: logits upcast to fp32, log-softmax saved
    CHUNKED = "chunked"  # cross-entropy computed over chunks of the sequence
    LIGER = "liger"  # Liger's fused linear cross-entropy: logits never materialised whole
    CCE = "cce"  # Cut Cross-Entropy (axolotl's plugin): logits never materialised at all


class QuantType(str, Enum):
    NF4 = "nf4"
    FP4 = "fp4"
    INT8 = "int8"


class Framework(str, Enum):
    HF = "hf"  # transformers models, PEFT adapters, HF Trainer / TRL loops
    LITGPT = "litgpt"  # LitGPT's own model code: fused qkv, its LoRA, chunked bf16 loss
    # transformers models in a training loop of the script's own (no HF Trainer or
    # accelerate): what the Trainer sets up around the model (its FSDP wrap policy for PEFT,
    # where checkpointing wraps) is not assumed
    PLAIN = "plain"
    # torchtune's own model code, recipes and stack (llmmem.budget.stacks.torchtune)
    TORCHTUNE = "torchtune"
    # TRL's SFTTrainer around transformers models: the HF stack with its release's own loss
    # and metrics (llmmem.budget.stacks.trl; `trl_version` says which release)
    TRL = "trl"
    # ms-swift's `swift sft|pt|rlhf` on the HF Trainer (llmmem.budget.stacks.swift)
    SWIFT = "swift"
    # unsloth's patched models and trainers (llmmem.budget.stacks.unsloth)
    UNSLOTH = "unsloth"


class Mode(str, Enum):
    TRAIN = "train"
    GENERATE = "generate"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraSetup:
    r: int = 16
    alpha: float = 32.0
    # leaf names or ["all-linear"]; None: PEFT's default for the architecture (q and v)
    targets: list[str] | None = None
    modules_to_save: list[str] = field(default_factory=list)
    dora: bool = False
    dropout: float = 0.0
    # adapter weights' bytes: 4 where PEFT upcasts them (autocast_adapter_dtype=True, its
    # default), 2 where they stay in the base's bf16/fp16
    adapter_bytes: int = 4

    def __post_init__(self) -> None:
        _set(self, "r", _whole(self.r, "LoRA r", at_least=1))
        _set(self, "alpha", _real(self.alpha, "LoRA alpha"))
        dropout = _real(self.dropout, "LoRA dropout")
        if not 0.0 <= dropout < 1.0:
            raise SetupError(f"LoRA dropout must be at least 0 and below 1, got {dropout:g}")
        _set(self, "dropout", dropout)
        _set(
            self,
            "adapter_bytes",
            _whole(self.adapter_bytes, "adapter_bytes", at_least=2, at_most=4),
        )
        if self.targets is not None:
            _set(self, "targets", list(self.targets))
        _set(self, "modules_to_save", list(self.modules_to_save))


def release(version: str) -> tuple[int, int]:
    """`"2.13"` or `"0.50.2"` as (major, minor); a ValueError for anything else."""
    major, _, minor = version.partition(".")
    return int(major), int(minor.split(".")[0] or 0)


# a release named without its patch ("0.43") stands for that minor release's newest patch, what
# `pip install "bitsandbytes==0.43.*"` installs; above any patch a rule names
NEWEST_PATCH = 10**6


def patch_release(version: str) -> tuple[int, int, int]:
    """`"0.43.2"` as (0, 43, 2); `"0.43"`, which names no patch, as 0.43's newest patch."""
    major, minor = release(version)
    parts = version.split(".")
    patch = re.match(r"\d+", parts[2]) if len(parts) > 2 else None
    return major, minor, int(patch.group()) if patch else NEWEST_PATCH


def check_release(version: str, name: str, example: str) -> None:
    """A clear SetupError where `version` is not a release like `example`."""
    try:
        release(version)
    except ValueError:
        raise SetupError(f"{name} must look like '{example}', got '{version}'") from None


# bnb_4bit_quant_storage spellings -> the dtype's name
QUANT_STORAGE_NAMES = {
    "uint8": "uint8",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantSetup:
    quant_type: QuantType = QuantType.NF4
    double_quant: bool = False
    compute_dtype_bytes: int = 2  # bnb_4bit_compute_dtype: bf16/fp16 2, fp32 4
    prepare_for_kbit_training: bool = True  # peft's prepare_model_for_kbit_training was called
    # after the preparation, TRL's `peft_module_casting_to_bf16` (SFTTrainer up to TRL 0.25
    # with bf16=True) casts the embeddings and the head, which the preparation upcast to fp32,
    # back to bf16; the norms stay fp32
    embeddings_16bit: bool = False
    # the bitsandbytes release, "major.minor" or "major.minor.patch": what its 4-bit matmul
    # keeps for backward changed in a patch release (0.43.2)
    bitsandbytes_version: str = "0.50"
    # bnb_4bit_quant_storage: the dtype the packed 4-bit values are stored in. uint8 (the
    # default) or a float dtype (bfloat16, float16, float32) that FSDP can flatten and shard with
    # the model's other parameters (bitsandbytes >= 0.43, transformers >= 4.39, peft >= 0.10)
    quant_storage: str = "uint8"

    def __post_init__(self) -> None:
        _set(self, "quant_type", _as_enum(QuantType, self.quant_type, "quant_type"))
        check_release(self.bitsandbytes_version, "bitsandbytes_version", "0.45")
        storage = QUANT_STORAGE_NAMES.get(str(self.quant_storage).lower().removeprefix("torch."))
        if storage is None:
            choices = ", ".join(sorted(set(QUANT_STORAGE_NAMES.values())))
            raise SetupError(f"quant_storage must be one of {choices}, got {self.quant_storage!r}")
        _set(self, "quant_storage", storage)

    @property
    def storage_shardable(self) -> bool:
        """Whether FSDP can shard the packed weights: they are stored in a float dtype, like the
        parameters around them (a uint8 Params4bit cannot be flattened with them)."""
        return self.quant_type is not QuantType.INT8 and self.quant_storage != "uint8"

    @property
    def bitsandbytes_release(self) -> tuple[int, int]:
        return release(self.bitsandbytes_version)

    @property
    def bitsandbytes_patch_release(self) -> tuple[int, int, int]:
        return patch_release(self.bitsandbytes_version)

    @property
    def matmul_keeps_input(self) -> bool:
        """Whether the k-bit matmul keeps its input for backward though its weight is frozen:
        LLM.int8 always does; the 4-bit one did up to bitsandbytes 0.43.1 (its input cast to the
        compute dtype, held as `ctx.tensors = (A, B)`: MatMul4Bit.forward,
        autograd/_functions.py:523 from 0.41.0 to 0.43.0, :516 in 0.43.1) and keeps only the
        packed weight since 0.43.2 (`ctx.tensors = (None, B)`, :516; bitsandbytes #1270).
        The input is an attribute of the autograd context, not a saved tensor: backward does not
        free it, it lives as long as the step's graph."""
        return self.quant_type is QuantType.INT8 or self.bitsandbytes_patch_release < (0, 43, 2)

    @property
    def bits(self) -> int:
        return 8 if self.quant_type is QuantType.INT8 else 4


class FsdpShard(str, Enum):
    FULL_SHARD = "full_shard"
    HYBRID_SHARD = "hybrid_shard"
    SHARD_GRAD_OP = "shard_grad_op"
    # a whole replica per device, FSDP-wrapped: each unit's flat gradient is all-reduced in
    # place (no bucket copies as under DDP); parameters, gradients and states stay whole
    NO_SHARD = "no_shard"


class ContextParallel(str, Enum):
    """How a context-parallel group attends over the whole sequence."""

    RING = "ring"  # torch's context_parallel: K and V all-gathered once (its default rotation)
    RING_FLASH = "ring-flash-attn"  # ring-flash-attn (axolotl): K and V passed rank to rank
    ULYSSES = "ulysses"  # all-to-all to whole sequences of a share of the heads (DeepSpeed)


@dataclass(frozen=True, slots=True, kw_only=True)
class DistributedSetup:
    world_size: int = 1
    gpus_per_node: int = 8  # where hybrid sharding stops sharding
    zero_stage: int = 0  # DeepSpeed ZeRO stage; 0 = no DeepSpeed
    offload_optimizer: bool = False  # DeepSpeed offload_optimizer / FSDP cpu_offload
    offload_params: bool = False  # DeepSpeed ZeRO-3 offload_param / FSDP cpu_offload
    fsdp: FsdpShard | None = None
    # DeepSpeed's gradient reduction buckets, in elements, as its config says; None is "auto",
    # which the trainer sizes from the model (hidden_size²)
    reduce_bucket_size: int | None = 500_000_000
    overlap_comm: bool | None = None  # None: DeepSpeed's default (on for ZeRO-3 only)
    contiguous_gradients: bool = True
    # ZeRO-3 keeps a gathered parameter when its next use is this many elements away or fewer
    max_reuse_distance: int = 1_000_000_000
    # ZeRO-3 gathers up to this many elements of upcoming parameters ahead of use; None is
    # "auto" (the trainer: 0.9·hidden_size²)
    prefetch_bucket_size: int | None = 50_000_000
    # ZeRO-3 keeps parameters of at most this many elements whole on every rank; None is
    # "auto" (the trainer: 10·hidden_size)
    param_persistence_threshold: int | None = 100_000
    # ZeRO-3 steps the optimizer over runs of at least this many partition elements
    sub_group_size: int = 1_000_000_000
    # modules FSDP shards as units of their own beside the blocks, out of the root unit:
    # "embeddings", "head" (torchtune's custom_sharded_layers: tok_embeddings, output)
    fsdp_own_units: tuple[str, ...] = ()
    # context (sequence) parallelism: each sample's sequence divided over this many of the
    # world's ranks (llmmem.budget.context_parallel), by ring attention (torch's
    # context_parallel, ring-flash-attn) or Ulysses' all-to-all (DeepSpeed)
    cp_size: int = 1
    cp_scheme: ContextParallel = ContextParallel.RING
    # tensor parallelism: each block's Linears split over this many of the world's ranks
    # (llmmem.budget.tensor_parallel); FSDP or ZeRO shard over the rest
    tp_size: int = 1
    # expert parallelism: a MoE layer's routed experts divided over this many of the
    # data-parallel ranks, tokens exchanged all-to-all (llmmem.budget.expert_parallel)
    ep_size: int = 1

    def __post_init__(self) -> None:
        _set(self, "world_size", _whole(self.world_size, "world_size", at_least=1))
        _set(self, "cp_size", _whole(self.cp_size, "context-parallel size", at_least=1))
        _set(self, "cp_scheme", _as_enum(ContextParallel, self.cp_scheme, "cp_scheme"))
        _set(self, "tp_size", _whole(self.tp_size, "tensor-parallel size", at_least=1))
        if self.world_size % self.cp_size:
            raise SetupError(
                f"a context-parallel group of {self.cp_size} does not divide {self.world_size} "
                "devices"
            )
        if self.world_size % (self.cp_size * self.tp_size):
            raise SetupError(
                f"a tensor-parallel group of {self.tp_size}"
                + (f" and a context-parallel one of {self.cp_size}" if self.cp_size > 1 else "")
                + f" do not divide {self.world_size} devices"
            )
        _set(self, "ep_size", _whole(self.ep_size, "expert-parallel size", at_least=1))
        if self.data_parallel % self.ep_size:
            raise SetupError(
                f"an expert-parallel group of {self.ep_size} does not divide the "
                f"{self.data_parallel} data-parallel ranks it is made of"
            )
        _set(self, "sub_group_size", _whole(self.sub_group_size, "sub_group_size", at_least=0))
        if self.reduce_bucket_size is not None:
            _set(
                self,
                "reduce_bucket_size",
                _whole(self.reduce_bucket_size, "reduce_bucket_size", at_least=1),
            )
        _set(
            self,
            "max_reuse_distance",
            _whole(self.max_reuse_distance, "max_reuse_distance", at_least=0),
        )
        for name in ("prefetch_bucket_size", "param_persistence_threshold"):
            value = getattr(self, name)
            if value is not None:
                _set(self, name, _whole(value, name, at_least=0))
        _set(self, "gpus_per_node", _whole(self.gpus_per_node, "gpus_per_node", at_least=1))
        _set(self, "zero_stage", _whole(self.zero_stage, "ZeRO stage", at_least=0, at_most=3))
        if self.fsdp is not None:
            _set(self, "fsdp", _as_enum(FsdpShard, self.fsdp, "fsdp"))
        if self.zero_stage and self.fsdp is not None:
            raise SetupError("choose DeepSpeed ZeRO or FSDP, not both")
        if self.offload_params and not (self.zero_stage == 3 or self.fsdp is not None):
            raise SetupError("parameter offload needs ZeRO stage 3 or FSDP")

    @property
    def is_multi_gpu(self) -> bool:
        return self.world_size > 1

    @property
    def data_parallel(self) -> int:
        """Ranks that each take micro-batches of their own (the context-parallel ones share
        one)."""
        return self.world_size // (self.cp_size * self.tp_size)

    @property
    def shard_world(self) -> int:
        """Ranks FSDP or ZeRO shard one tensor-parallel slice of the model over."""
        return self.world_size // self.tp_size


@dataclass(frozen=True, slots=True, kw_only=True)
class VisionSetup:
    """The images of each sample of a vision-language model, and what of its image side
    trains (llmmem.budget.vision)."""

    images: int = 1  # images per sample
    height: int = 448  # pixels of each image, before the processor resizes it
    width: int = 448
    # the processor's bounds on an image's area (Qwen's min_pixels, max_pixels; LLaMA-Factory's
    # image_min_pixels, image_max_pixels); None: the checkpoint's processor's
    min_pixels: int | None = None
    max_pixels: int | None = None
    # whether the encoder and the projector train; None: as the method says (full fine-tuning
    # trains them, LoRA trains only adapters)
    encoder_trains: bool | None = None
    projector_trains: bool | None = None
    # LoRA's target names reach the encoder's and projector's Linears of those names (PEFT
    # matches leaf names anywhere in the model); False where the framework keeps the adapters
    # in the language model (LLaMA-Factory with freeze_vision_tower, a regex on language_model)
    adapters_reach_vision: bool = True
    # `seq` already counts the image tokens (a maximum length over the whole sequence), else
    # they come on top of it
    seq_includes_images: bool = False
    # where the images were not stated but assumed (a config that names no image count): why,
    # shown with the image tokens
    assumed: str = ""

    def __post_init__(self) -> None:
        _set(self, "images", _whole(self.images, "images per sample", at_least=1, at_most=4096))
        _set(self, "height", _whole(self.height, "image height", at_least=1, at_most=1 << 16))
        _set(self, "width", _whole(self.width, "image width", at_least=1, at_most=1 << 16))
        longest, shortest = max(self.height, self.width), min(self.height, self.width)
        if longest > 200 * shortest:
            raise SetupError(
                f"an image of {self.width}x{self.height} pixels is more than 200 times as long "
                "as it is wide: the processors refuse it"
            )
        for name in ("min_pixels", "max_pixels"):
            value = getattr(self, name)
            if value is not None:
                _set(self, name, _whole(value, name, at_least=1))
        if (
            self.min_pixels is not None
            and self.max_pixels is not None
            and self.min_pixels > self.max_pixels
        ):
            raise SetupError(
                f"min_pixels ({self.min_pixels}) is above max_pixels ({self.max_pixels})"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSetup:
    mode: Mode = Mode.TRAIN
    method: Method = Method.FULL
    batch: int = 1  # micro-batch per device
    seq: int = 512  # tokens per sequence (the longest padded batch)
    grad_accum: int = 1
    grad_ckpt: bool = False
    precision: Precision = Precision.BF16
    optim: str = "adamw_torch_fused"
    attn: AttnImpl = AttnImpl.SDPA
    loss: LossImpl = LossImpl.STANDARD
    lora: LoraSetup | None = None
    quant: QuantSetup | None = None
    distributed: DistributedSetup = field(default_factory=DistributedSetup)
    use_cache: bool = False  # config.use_cache during training (the HF default True costs memory)
    new_tokens: int = 256  # generation only: tokens generated after the prompt
    # torchtune's `optimizer_in_bwd`: one optimizer per parameter, stepped in the parameter's
    # post-accumulate-grad hook, which then frees its gradient (torchtune 0.6
    # training/memory.py `register_optim_in_bwd_hooks`)
    optimizer_in_backward: bool = False
    first_step: bool = False  # the first optimizer step (no states before it) instead of later ones
    cuda_module_loading: str = "lazy"  # "lazy" (CUDA >= 11.7 default) or "eager"
    # the torch release the step runs on, "major.minor": a few allocation rules changed
    torch_version: str = "2.13"
    # the training code around the model: "hf" (transformers + PEFT) or "litgpt"
    framework: Framework = Framework.HF
    # the transformers release, "major.minor": how it stores a MoE layer's experts changed
    transformers_version: str = TESTED_TRANSFORMERS
    # the TRL release, "major.minor", where it is known (None: not known; a preference budget
    # then follows the release it restates)
    trl_version: str | None = None
    # the unsloth release, as its calendar version ("2024.1", "2025.10.10") where it is known:
    # its loss changed from release to release (llmmem.budget.stacks.unsloth)
    unsloth_version: str | None = None
    # several samples per row or one flat row (None: one sample per row, padded to seq)
    packing: Packing | None = None
    # saved activations copied to the host in forward and back in backward (TRL's and
    # torchtune's OffloadActivations, axolotl's activation_offloading): how much stays on the
    # device depends on the release's storage deduplication and the allocator (see
    # budget.phases.offload_floor), so the budget is the step without it and the band reaches
    # down to the step with every saved tensor gone
    activation_offload: bool = False
    # gradient checkpointing with torch's reentrant implementation; None: the transformers
    # release's default (`gradient_checkpointing_enable`: reentrant up to 4.x, non-reentrant
    # from 5.0; TRL's SFTTrainer asks for non-reentrant from 0.28)
    reentrant_checkpointing: bool | None = None
    # the chunks torchtune's CEWithChunkedOutputLoss splits the sequence into
    # (`num_output_chunks`, 8 by default); the torchtune stack's chunked loss only
    loss_chunks: int = 8
    # the framework's own script that runs the step, where its scripts differ (LitGPT:
    # finetune_lora, finetune_adapter, finetune_full, pretrain); None: the method's script
    framework_script: str | None = None
    # the model runs under torch.compile: AOTAutograd's partitioner recomputes cheap ops in
    # backward instead of saving their outputs, so the step saves no more than eager's and no
    # less than checkpointing would keep (see budget.phases.compile_floor_text)
    compile: bool = False
    # the device runs Triton kernels (CUDA, XPU); False on one without (the CPU), where TRL's
    # fused LM head scores every position and folds its tiles in torch ops
    # (llmmem.budget.fused_head_bytes)
    triton: bool = True
    # a vision-language model's images per sample and what of its image side trains (None: no
    # images; the vision tower only holds its weights)
    vision: VisionSetup | None = None
    # torchao's float8 Linears in the blocks (llmmem.budget.float8): full fine-tuning only
    float8: bool = False
    # TransformerEngine's te.Linear in place of nn.Linear, as accelerate converts the model
    # (llmmem.budget.float8_te): full fine-tuning only
    float8_te: bool = False

    def __post_init__(self) -> None:
        _set(self, "mode", _as_enum(Mode, self.mode, "mode"))
        _set(self, "method", _as_enum(Method, self.method, "method"))
        _set(self, "precision", _as_enum(Precision, self.precision, "precision"))
        _set(self, "attn", _as_enum(AttnImpl, self.attn, "attn"))
        _set(self, "loss", _as_enum(LossImpl, self.loss, "loss"))
        _set(self, "framework", _as_enum(Framework, self.framework, "framework"))
        if self.packing is not None:
            _set(self, "packing", _as_enum(Packing, self.packing, "packing"))
        _set(self, "batch", _whole(self.batch, "batch", at_least=1))
        _set(self, "seq", _whole(self.seq, "seq", at_least=1))
        _set(self, "grad_accum", _whole(self.grad_accum, "grad_accum", at_least=1))
        _set(self, "new_tokens", _whole(self.new_tokens, "new_tokens", at_least=0))
        _set(self, "loss_chunks", _whole(self.loss_chunks, "loss_chunks", at_least=1))
        if self.float8 and (self.method is not Method.FULL or self.quant is not None):
            raise SetupError(
                "float8 training is sized for full fine-tuning: torchao's float8 Linears under "
                "LoRA adapters or k-bit weights are not"
            )
        if self.float8 and self.float8_te:
            raise SetupError("float8 training is torchao's or TransformerEngine's, not both")
        if self.float8_te and (self.method is not Method.FULL or self.quant is not None):
            raise SetupError(
                "TransformerEngine's FP8 is sized for full fine-tuning: te.Linear under LoRA "
                "adapters or k-bit weights is not"
            )
        check_release(self.torch_version, "torch_version", "2.4")
        check_release(self.transformers_version, "transformers_version", "4.48")
        if self.trl_version is not None:
            check_release(self.trl_version, "trl_version", "0.29")
        if self.method is Method.FULL and self.quant is not None and self.mode is Mode.TRAIN:
            raise SetupError(
                "full fine-tuning of a quantized model is not possible: use --method qlora "
                "(LoRA adapters over the quantized base) or drop --quant"
            )
        if self.optimizer_in_backward and self.grad_accum > 1:
            raise SetupError(
                "the optimizer in backward steps each parameter as its gradient is made: "
                "it cannot accumulate gradients (torchtune refuses gradient_accumulation_steps "
                "> 1 with optimizer_in_bwd)"
            )
        if self.optimizer_in_backward and (
            self.distributed.world_size > 1 or self.distributed.zero_stage
        ):
            raise SetupError(
                "the optimizer in backward is modelled on one device only (torchtune's "
                "single-device recipes)"
            )
        if self.method is Method.QLORA and self.quant is None:
            _set(self, "quant", QuantSetup())
        if self.method in (Method.LORA, Method.QLORA) and self.lora is None:
            _set(self, "lora", LoraSetup())

    @property
    def torch_release(self) -> tuple[int, int]:
        return release(self.torch_version)

    @property
    def zero_grad_frees_gradients(self) -> bool:
        """torch >= 2.0 `zero_grad()` sets gradients to None; before, it zeroed them in place,
        so gradients stayed allocated through every forward and backward."""
        return self.torch_release >= (2, 0)

    @property
    def transformers_release(self) -> tuple[int, int]:
        return release(self.transformers_version)

    @property
    def checkpoints_reentrant(self) -> bool:
        if self.reentrant_checkpointing is not None:
            return self.reentrant_checkpointing
        return self.transformers_release < (5, 0)

    @property
    def experts_are_linears(self) -> bool:
        """Whether a MoE layer's routed experts are one nn.Linear per expert and projection (as
        in transformers 4: Mixtral's experts.{i}.w1/w2/w3), which bitsandbytes replaces by k-bit
        layers; transformers 5 stores them as 3-D parameters, which it leaves unquantized."""
        return self.transformers_release < (5, 0)

    @property
    def loss_forward_copies(self) -> tuple[bool, bool]:
        """How transformers' causal-LM loss holds the logits while it computes (read in its
        code at each release, measured on CPU in tests/budget/test_loss_versions.py):
        (keeps the 16-bit logits beside the fp32 copy, shifts the fp32 logits into a copy).
        Up to 4.45 each model's forward upcast the logits in place of the 16-bit ones (which
        die there) and sliced `logits[..., :-1, :].contiguous()`; 4.46-4.48's shared
        `ForCausalLMLoss` kept the caller's 16-bit logits alive beside the upcast and still
        made the shifted copy; from 4.49 it pads the labels instead and makes no copy."""
        found = self.transformers_release
        if found < (4, 46):
            return (False, True)
        if found < (4, 49):
            return (True, True)
        return (True, False)

    @property
    def softmax_keeps_input(self) -> bool:
        """Up to torch 1.10 softmax's backward kept its input as well as its output."""
        return self.torch_release < (1, 11)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def attention_shape(self) -> tuple[int, int]:
        """(rows, tokens per row) as attention sees them: a flat packed batch is one row."""
        if self.packing is Packing.FLAT:
            return 1, self.batch * self.seq
        return self.batch, self.seq

    @property
    def packed_mask(self) -> bool:
        """Whether attention gets a block-diagonal mask of the packed samples: SDPA and eager
        (flash-attention takes the boundaries instead)."""
        return self.packing is not None and self.attn is not AttnImpl.FLASH_ATTENTION_2

    @property
    def effective_batch(self) -> int:
        return self.batch * self.grad_accum * self.distributed.data_parallel

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON values: enums as their text, nested setups as objects."""
        return asdict(self, dict_factory=_json_fields)


def _json_fields(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {name: value.value if isinstance(value, Enum) else value for name, value in items}

"""A fully determined training (or generation) setup: everything the accounting core needs besides
the model. Nothing here is optional-unknown: an extractor or the CLI fills every field, labelling
what it defaulted; the core only computes."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field, model_validator


class SetupError(ValueError):
    """An impossible or contradictory setup; the message says what to change."""


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

    @property
    def weight_bytes(self) -> int:
        return 2 if self in (Precision.BF16_TRUE, Precision.FP16_TRUE) else 4

    @property
    def compute_bytes(self) -> int:
        return 4 if self is Precision.FP32 else 2

    @property
    def is_autocast(self) -> bool:
        return self in (Precision.FP16, Precision.BF16)

    @property
    def uses_bf16(self) -> bool:
        return self in (Precision.BF16, Precision.BF16_TRUE)


class AttnImpl(str, Enum):
    EAGER = "eager"
    SDPA = "sdpa"
    FLASH_ATTENTION_2 = "flash_attention_2"


class LossImpl(str, Enum):
    STANDARD = "standard"  # HF loss: logits upcast to fp32, log-softmax saved
    CHUNKED = "chunked"  # cross-entropy computed over chunks of the sequence
    LIGER = "liger"  # Liger's fused linear cross-entropy: logits never materialised whole


class QuantType(str, Enum):
    NF4 = "nf4"
    FP4 = "fp4"
    INT8 = "int8"


class Framework(str, Enum):
    HF = "hf"  # transformers models, PEFT adapters, HF Trainer / TRL loops
    LITGPT = "litgpt"  # LitGPT's own model code: fused qkv, its LoRA, chunked bf16 loss


class Mode(str, Enum):
    TRAIN = "train"
    GENERATE = "generate"


class LoraSetup(BaseModel):
    r: int = Field(16, gt=0)
    alpha: float = 32
    # leaf names or ["all-linear"]; None: PEFT's default for the architecture (q and v)
    targets: list[str] | None = None
    modules_to_save: list[str] = Field(default_factory=list)
    dora: bool = False
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # adapter weights' bytes: 4 where PEFT upcasts them (autocast_adapter_dtype=True, its
    # default), 2 where they stay in the base's bf16/fp16
    adapter_bytes: int = Field(4, ge=2, le=4)


class QuantSetup(BaseModel):
    quant_type: QuantType = QuantType.NF4
    double_quant: bool = False
    compute_dtype_bytes: int = 2  # bnb_4bit_compute_dtype: bf16/fp16 2, fp32 4
    prepare_for_kbit_training: bool = True  # peft's prepare_model_for_kbit_training was called

    @property
    def bits(self) -> int:
        return 8 if self.quant_type is QuantType.INT8 else 4


class FsdpShard(str, Enum):
    FULL_SHARD = "full_shard"
    HYBRID_SHARD = "hybrid_shard"
    SHARD_GRAD_OP = "shard_grad_op"


class DistributedSetup(BaseModel):
    world_size: int = Field(1, gt=0)
    gpus_per_node: int = Field(8, gt=0)  # where hybrid sharding stops sharding
    zero_stage: int = Field(0, ge=0, le=3)  # DeepSpeed ZeRO stage; 0 = no DeepSpeed
    offload_optimizer: bool = False  # DeepSpeed offload_optimizer / FSDP cpu_offload
    offload_params: bool = False  # DeepSpeed ZeRO-3 offload_param / FSDP cpu_offload
    fsdp: FsdpShard | None = None

    @model_validator(mode="after")
    def _one_sharding_scheme(self) -> DistributedSetup:
        if self.zero_stage and self.fsdp is not None:
            raise SetupError("choose DeepSpeed ZeRO or FSDP, not both")
        if self.offload_params and not (self.zero_stage == 3 or self.fsdp is not None):
            raise SetupError("parameter offload needs ZeRO stage 3 or FSDP")
        return self

    @property
    def is_multi_gpu(self) -> bool:
        return self.world_size > 1


class TrainingSetup(BaseModel):
    mode: Mode = Mode.TRAIN
    method: Method = Method.FULL
    batch: int = Field(1, gt=0)  # micro-batch per device
    seq: int = Field(512, gt=0)  # tokens per sequence (the longest padded batch)
    grad_accum: int = Field(1, gt=0)
    grad_ckpt: bool = False
    precision: Precision = Precision.BF16
    optim: str = "adamw_torch_fused"
    attn: AttnImpl = AttnImpl.SDPA
    loss: LossImpl = LossImpl.STANDARD
    lora: LoraSetup | None = None
    quant: QuantSetup | None = None
    distributed: DistributedSetup = Field(default_factory=DistributedSetup)
    use_cache: bool = False  # config.use_cache during training (the HF default True costs memory)
    new_tokens: int = Field(256, ge=0)  # generation only: tokens generated after the prompt
    first_step: bool = False  # the first optimizer step (no states before it) instead of later ones
    cuda_module_loading: str = "lazy"  # "lazy" (CUDA >= 11.7 default) or "eager"
    # the torch release the step runs on, "major.minor": a few allocation rules changed
    torch_version: str = "2.13"
    # the training code around the model: "hf" (transformers + PEFT) or "litgpt"
    framework: Framework = Framework.HF

    @property
    def torch_release(self) -> tuple[int, int]:
        major, _, minor = self.torch_version.partition(".")
        return int(major), int(minor.split(".")[0] or 0)

    @property
    def zero_grad_frees_gradients(self) -> bool:
        """torch >= 2.0 `zero_grad()` sets gradients to None; before, it zeroed them in place,
        so gradients stayed allocated through every forward and backward."""
        return self.torch_release >= (2, 0)

    @property
    def softmax_keeps_input(self) -> bool:
        """Up to torch 1.10 softmax's backward kept its input as well as its output."""
        return self.torch_release < (1, 11)

    @model_validator(mode="after")
    def _consistent(self) -> TrainingSetup:
        try:
            self.torch_release  # noqa: B018 - validates the version text
        except ValueError:
            raise SetupError(
                f"torch_version must look like '2.4', got '{self.torch_version}'"
            ) from None
        if self.method is Method.FULL and self.quant is not None and self.mode is Mode.TRAIN:
            raise SetupError(
                "full fine-tuning of a quantized model is not possible: use --method qlora "
                "(LoRA adapters over the quantized base) or drop --quant"
            )
        if self.method is Method.QLORA and self.quant is None:
            self.quant = QuantSetup()
        if self.method in (Method.LORA, Method.QLORA) and self.lora is None:
            self.lora = LoraSetup()
        return self

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def effective_batch(self) -> int:
        return self.batch * self.grad_accum * self.distributed.world_size

"""What a model is made of, read from its HF `config.json`.

A `ModelSpec` holds the exact parameter count of a model split by role (embeddings, attention,
MLP, experts, norms, head), and the named Linear modules of each transformer block with their
shapes, so that LoRA targets and quantized modules can be counted without building the model.

`spec_from_config(config, model_id=..., source=...)` is the one entry point; each supported
`model_type` has a small reader function registered in `ARCHITECTURE_READERS`.

The classes are plain frozen dataclasses: the readers hand them typed values (`ConfigView` checks
the config), so no runtime validation library is imported on the CLI path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Literal


class ModelSource(str, Enum):
    """Where a ModelSpec came from, most trustworthy first."""

    LOCAL = "local"  # a directory or config.json path on disk
    CACHE = "cache"  # the Hugging Face cache on this machine
    HUB = "hub"  # fetched from the hub (or an on-disk copy of an earlier fetch)
    CATALOG = "catalog"  # the catalog bundled with llmmem
    CONFIG = "config"  # a config dict handed over directly (tests, pragmas)
    GUESS = "guess"  # only a size read from the name ("8B"); the shapes are invented


class ModelSpecError(ValueError):
    """A config that cannot be turned into a ModelSpec; the message says why and what to do."""


LinearRole = Literal["attention", "mlp", "expert", "shared_expert", "router", "other"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearModule:
    """One nn.Linear (or Conv1D used as a linear) inside a transformer block."""

    name: str  # the leaf name PEFT matches on: "q_proj", "c_attn", "query_key_value", "w1"
    path: str  # the dotted path inside the block: "self_attn.q_proj", "mlp.experts.w1"
    in_features: int
    out_features: int
    bias: bool
    count: int = 1  # how many copies per block (experts of a MoE layer)
    role: LinearRole

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features * self.count

    @property
    def params(self) -> int:
        return (self.in_features * self.out_features + (self.out_features if self.bias else 0)) * (
            self.count
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockGroup:
    """A run of identical transformer blocks (a decoder stack, or T5's encoder and decoder)."""

    name: str  # "decoder", "encoder"
    count: int  # number of blocks in the run
    linears: list[LinearModule]
    norm_params: int  # parameters of the norms inside one block (weights and biases)
    other_params: int = 0  # anything else inside one block (relative position biases, sinks, ...)
    experts_per_token: int = 0  # routed experts each token visits (0 for a dense block)
    num_experts: int = 0

    @property
    def params_per_block(self) -> int:
        return sum(lin.params for lin in self.linears) + self.norm_params + self.other_params

    @property
    def params(self) -> int:
        return self.params_per_block * self.count


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamBreakdown:
    """Exact parameter counts by role; `total` is what `sum(p.numel() for p in model.parameters())`
    gives for the HF class that `architecture` names (tied weights counted once)."""

    embedding: int  # token embeddings, plus learned position / token-type embeddings
    attention: int  # q, k, v, o projections with their biases, all blocks
    mlp: int  # dense MLP weights and biases (shared experts included), all blocks
    experts: int  # routed experts, all of them, all blocks
    experts_active: int  # routed experts one token visits, all blocks
    router: int  # MoE gates
    norms: int  # every norm in the model, final norm included
    head: int  # the LM head (0 when tied to the embeddings) or a task head / pooler
    other: int = 0  # relative position biases, attention sinks, ...

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.attention
            + self.mlp
            + self.experts
            + self.router
            + self.norms
            + self.head
            + self.other
        )

    @property
    def active(self) -> int:
        """Parameters one token touches (experts counted only for those it is routed to)."""
        return self.total - self.experts + self.experts_active


NormKind = Literal["rmsnorm", "layernorm", "gemma_rmsnorm"]
# gated: act(gate) * up -> down (SwiGLU, GeGLU); plain: fc1 -> act -> fc2
MlpKind = Literal["gated", "plain"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointQuantization:
    """A checkpoint that is already quantized on the hub (bnb 4-bit, GPTQ, AWQ, ...)."""

    method: str  # "bitsandbytes", "gptq", "awq", "fp8", ...
    bits: int
    quant_type: str | None = None  # "nf4", "fp4"
    double_quant: bool = False
    group_size: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    model_id: str
    model_type: str  # config["model_type"]
    architecture: str  # the HF class the counts are for, e.g. "LlamaForCausalLM"
    source: ModelSource
    source_detail: str = ""  # a path, a URL, "bundled catalog", "guessed from '8B' in the name"

    hidden_size: int
    num_layers: int  # all transformer blocks (encoder + decoder for T5)
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int  # per head, of queries and keys
    intermediate_size: int  # dense MLP width (per expert for MoE)
    vocab_size: int
    max_position_embeddings: int | None = None

    tie_word_embeddings: bool
    norm: NormKind
    mlp: MlpKind
    activation: str  # "silu", "gelu_pytorch_tanh", "gelu_new", ...
    qk_norm: bool = False
    # attention and MLP read the same input (GPT-J, NeoX, Phi, Falcon)
    parallel_residual: bool = False
    sliding_window: int | None = None
    sliding_layers: int = 0  # how many blocks use the sliding window (0 = none, num_layers = all)
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    supports_sdpa: bool = True  # False where transformers refuses SDPA and trains eager
    is_encoder_decoder: bool = False
    is_causal_lm: bool = True  # has an LM head over the vocabulary
    num_experts: int = 0
    experts_per_token: int = 0
    attention_dropout: float = 0.0  # dropout on attention probabilities while training
    hidden_dropout: float = 0.0  # dropout on the residual branches while training
    # multi-head latent attention (DeepSeek-V2/V3): values and the attention output are
    # `v_head_dim` wide per head, narrower than queries and keys (None: head_dim, as usual)
    v_head_dim: int | None = None
    # what one block caches per token when it is not K and V per KV head: MLA caches its
    # compressed latent, kv_lora_rank + qk_rope_head_dim values (None: K and V)
    kv_cache_per_token: int | None = None

    params: ParamBreakdown
    blocks: list[BlockGroup]

    torch_dtype: str | None = None  # the checkpoint dtype the config declares
    checkpoint_quantization: CheckpointQuantization | None = None
    # exact tensor bytes per safetensors dtype ("BF16", "U8", "F32"), when the hub header was read
    checkpoint_bytes_by_dtype: dict[str, int] | None = None
    notes: list[str] = field(default_factory=list)  # what the reader assumed
    # a vision-language model's image side; the fields above are its language model's
    vision: VisionTower | None = None

    @property
    def total_params(self) -> int:
        """Every parameter of the model: the language model's, and the vision tower's and
        projector's where there are some."""
        return self.params.total + (self.vision.params if self.vision is not None else 0)

    @property
    def whole_architecture(self) -> str:
        """The class a user loads: a vision-language model's own (its language model is
        counted as `architecture`)."""
        return self.vision.architecture if self.vision is not None else self.architecture

    @property
    def value_head_dim(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def q_dim(self) -> int:
        """Per-token width of the query and of the attention output, as their mean: 2 · q_dim is
        the two together (they are equal but in multi-head latent attention)."""
        return self.num_attention_heads * (self.head_dim + self.value_head_dim) // 2

    @property
    def kv_dim(self) -> int:
        """Per-token width of the keys and of the values, as their mean: 2 · kv_dim is K and V
        together (K and V are equal but in multi-head latent attention)."""
        return self.num_kv_heads * (self.head_dim + self.value_head_dim) // 2

    @property
    def kv_cache_dim(self) -> int:
        """Values one block caches per token: K and V, or MLA's compressed latent."""
        if self.kv_cache_per_token is not None:
            return self.kv_cache_per_token
        return 2 * self.kv_dim

    @property
    def is_guess(self) -> bool:
        return self.source is ModelSource.GUESS

    def block_linears(self) -> list[tuple[BlockGroup, LinearModule]]:
        return [(group, lin) for group in self.blocks for lin in group.linears]


# How images become language-model tokens:
# - grid: every image keeps its own aspect (Qwen2-VL's smart resize between min and max
#   pixels; Pixtral's longest edge), (H/patch)·(W/patch) patches, merge² patches per token;
# - fixed: every image is resized to one square and gives the same tokens (Gemma 3, LLaVA);
# - tiles: square tiles of image_size as many as the image needs, up to max_tiles, plus one
#   whole-image tile (InternVL, Idefics3, LLaVA-NeXT's grid);
# - cross_attention: the text holds one token per image; the language model's cross-attention
#   blocks read the encoder's tiles (Llama 3.2 Vision)
ImageRule = Literal["grid", "fixed", "tiles", "cross_attention", "hd_crops"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageGeometry:
    """How a vision tower cuts images into patches and how many tokens they give."""

    rule: ImageRule
    patch_size: int
    # the square side an image (fixed) or a tile (tiles, cross_attention) is resized to
    image_size: int | None = None
    merge: int = 1  # patches folded into one token along each side (merger, pixel shuffle, pool)
    temporal_patch_size: int = 1  # frames folded into one patch (Qwen: an image is repeated)
    tokens_per_image: int | None = None  # fixed: language-model tokens per image
    class_token: bool = False  # the encoder prepends one token per image or tile
    max_tiles: int = 1  # tiles, cross_attention, hd_crops: tiles per image at most
    # Qwen2.5-VL: the side, in patches, of the windows most blocks attend within (None: every
    # block attends over the whole image)
    window_patches: int | None = None
    full_attention_blocks: int = 0  # of the encoder's blocks, those attending the whole image
    # a token ending each row of merged patches (Pixtral's [IMG_BREAK], LLaVA-NeXT's newline)
    row_break: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class VisionTower:
    """The image side of a vision-language model: its encoder (a ModelSpec of its own, with
    exact counts by role and its blocks; no vocabulary, no head), the projector that brings
    its features to the language model's width, and how images become tokens."""

    architecture: str  # the whole model's class: "Qwen2_5_VLForConditionalGeneration"
    encoder: ModelSpec
    projector_linears: list[LinearModule]  # the projector's Linears (PEFT's all-linear too)
    projector_params: int  # every parameter of the projector or merger, its norms included
    # the encoder's features the projector reads, per token, where wider than its width:
    # Mllama concatenates intermediate layers' outputs
    feature_width: int = 0
    geometry: ImageGeometry

    @property
    def params(self) -> int:
        return self.encoder.params.total + self.projector_params

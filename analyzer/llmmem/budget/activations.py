"""Saved activations: the tensors autograd keeps from forward to backward, per transformer block.

Each block is walked op by op in the order the HF implementation runs it, and each op adds what
autograd saves for it, with these rules (all checked against steps measured on CPU and under
FakeTensorMode, see `MEMORY-MODEL.md`):

- a Linear saves its input only when its weight trains; a frozen Linear needs only the weight to
  pass the gradient back. Under DeepSpeed ZeRO-3 every Linear saves its input: ZeRO-3 replaces
  `F.linear` by its own autograd function, which keeps input and weight whatever trains.
  Linears reading the same tensor share one saved copy, except under autocast, where each one
  saves its own low-precision cast of an fp32 input;
- a LoRA adapter saves its (fp32-cast) input and the rank-r output of `lora_A`;
- a bitsandbytes 4-bit Linear keeps only its packed weight (bitsandbytes 0.43.2 on; before, also
  its input cast to the compute dtype; LLM.int8 keeps its input) and returns its input's dtype, so
  after `prepare_model_for_kbit_training` the MLP runs in fp32, under autocast too;
- HF's RMSNorm upcasts its input to fp32 and saves that copy; it saves the normalised tensor only
  when its weight trains; LayerNorm saves its input;
- SDPA and flash attention save q, k, v, the output and a fp32 log-sum-exp per head and row;
  eager attention saves the fp32 softmax of every score (b·a·s²), its cast, and K/V repeated to
  all heads;
- an elementwise product saves both operands; SiLU/GELU save their input; GPT-2's `gelu_new`,
  written out in Python, saves four tensors of the MLP width.

Every coefficient is kept symbolic so the hover can show the formula: `20·N·h + 4·N·kvd + ...`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmmem.budget.float8_te import FP8_INPUT_BYTES, te_converts, te_converts_head
from llmmem.budget.image_tokens import image_tokens
from llmmem.budget.setup import (
    AttnImpl,
    Framework,
    Method,
    Precision,
    QuantType,
    TrainingSetup,
)
from llmmem.budget.vision_training import vision_training
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec

# The symbols of the formulas, in the order they are printed.
SYMBOLS = (
    "N·h",
    "N·q",
    "N·kvd",
    "N·I",
    "N·Is",
    "N·r",
    "N·E",
    "b·a·s",
    "b·a·s²",
    "b·s²",
    "k·N",
    "k·N·h",
    "k·N·I",
    # Mllama's cross-attention blocks: Nv vision states per sample, b·s·v the text × vision mask
    "Nv·h",
    "Nv·q",
    "Nv·kvd",
    "Nv·r",
    "b·s·v",
)

# How many tensors of the MLP width an activation function saves (its input included).
ACTIVATION_SAVES = {
    "silu": 1,
    "swish": 1,
    "gelu": 1,
    "gelu_pytorch_tanh": 1,
    "gelu_fast": 1,
    "relu": 1,
    "gelu_new": 4,
    "gelu_python": 3,
    "quick_gelu": 2,
    "gelu_10": 1,
    "relu2": 2,
    "gelu_accurate": 4,
}
ACTIVATIONS_KEEPING_OUTPUT = {"relu"}


@dataclass
class Tally:
    """Bytes as a sum of coefficient × symbol, e.g. {"N·h": 20, "N·I": 8}."""

    coefficients: dict[str, float] = field(default_factory=dict)

    def add(self, bytes_per_unit: float, symbol: str) -> None:
        if bytes_per_unit:
            self.coefficients[symbol] = self.coefficients.get(symbol, 0.0) + bytes_per_unit

    def extend(self, other: Tally, times: float = 1.0) -> None:
        for symbol, coef in other.coefficients.items():
            self.add(coef * times, symbol)

    def evaluate(self, dims: dict[str, float]) -> int:
        return round(sum(coef * dims[symbol] for symbol, coef in self.coefficients.items()))

    def formula(self) -> str:
        parts = []
        for symbol in SYMBOLS:
            coef = self.coefficients.get(symbol)
            if coef:
                parts.append(f"{coef:g}·{symbol}")
        return " + ".join(parts) if parts else "0"


@dataclass(frozen=True)
class Dtypes:
    """Bytes per element of the tensors a block computes with."""

    compute: int  # outputs of Linears and attention (2 under autocast or in bf16/fp16)
    residual: int  # the residual stream and the norms' inputs (4 under autocast)
    autocast: bool
    # what a block's Linears return, where not `compute`: a k-bit Linear returns its input's
    # dtype (the residual stream's), under autocast too
    linear_out: int = 0

    @property
    def linear_out_bytes(self) -> int:
        return self.linear_out or self.compute


def dtypes_for(setup: TrainingSetup) -> Dtypes:
    precision = setup.precision
    if setup.quant is not None:
        # the weights bitsandbytes leaves alone (embeddings, norms, head) load in the compute
        # dtype, and prepare_model_for_kbit_training upcasts them to fp32: the residual stream
        # has their dtype. Autocast runs attention and the adapters in 16 bits, but a k-bit
        # Linear casts its output back to its input's dtype: the projections read the residual
        # stream's normalised copy, so the MLP runs in the residual dtype, under autocast too
        residual = 4 if setup.quant.prepare_for_kbit_training else setup.quant.compute_dtype_bytes
        return Dtypes(
            compute=2 if precision.autocasts else residual,
            residual=residual,
            autocast=precision.autocasts,
            linear_out=residual,
        )
    return Dtypes(
        compute=precision.compute_bytes,
        residual=4 if precision in (Precision.FP32,) or precision.is_autocast else 2,
        autocast=precision.autocasts,
    )


@dataclass(frozen=True)
class Trainability:
    base_trains: bool  # full fine-tuning: every weight trains
    adapted: frozenset[str]  # paths of Linears with a LoRA adapter
    lora_dropout: bool
    dora: bool
    adapter_bytes: int = 4  # PEFT keeps adapters in fp32 (autocast_adapter_dtype)
    # DeepSpeed ZeRO-3's memory-efficient linear keeps every Linear's input, frozen or not
    linears_save_input: bool = False

    @property
    def linear_inputs_saved(self) -> bool:
        return self.base_trains or self.linears_save_input

    def adapter(self, lin: LinearModule) -> bool:
        return lin.path in self.adapted


def trainability_for(spec: ModelSpec, setup: TrainingSetup) -> Trainability:
    from llmmem.budget.lora_targets import lora_target_linears

    if setup.method is Method.FULL or setup.lora is None:
        return Trainability(True, frozenset(), False, False)
    adapted = frozenset(lin.path for lin in lora_target_linears(spec, setup.lora.targets))
    return Trainability(
        False,
        adapted,
        setup.lora.dropout > 0,
        setup.lora.dora,
        setup.lora.adapter_bytes,
        linears_save_input=setup.distributed.zero_stage == 3,
    )


@dataclass(frozen=True)
class BlockRules:
    """Where a framework's own block code saves other tensors than transformers' modules (a
    framework's stack, llmmem.budget.stacks, gives them; the defaults are transformers').

    - `norm_output_fp32`: the RMSNorm multiplies its weight into the normalised fp32 tensor
      (torchtune's `F.rms_norm(x.float(), weight=scale)`), so a trainable weight keeps that fp32
      tensor, where transformers' keeps it in the input's dtype;
    - `repeats_kv_heads`: K and V are copied to every query head before attention (torchtune's
      `expand(...).flatten(1, 2)`), and attention keeps the copies."""

    norm_output_fp32: bool = False
    repeats_kv_heads: bool = False
    # unsloth's own autograd functions (unsloth 2026.10.9, kernels/fast_lora.py, llmmem.budget.
    # stacks.unsloth): LoRA_QKV and LoRA_W keep their input alone, LoRA_MLP its input, the gate
    # and the up projection's outputs (:448); none keeps a LoRA intermediate or a cast copy
    fast_lora: bool = False
    # unsloth's fast_rms_layernorm keeps its input as it comes and an fp32 rsqrt a row
    # (kernels/rms_layernorm.py :981), no fp32 copy of the input
    fast_norm: bool = False


TRANSFORMERS_RULES = BlockRules()


@dataclass
class BlockContext:
    spec: ModelSpec
    setup: TrainingSetup
    dt: Dtypes
    train: Trainability
    rules: BlockRules = TRANSFORMERS_RULES

    @property
    def quantized(self) -> bool:
        return self.setup.quant is not None

    @property
    def kbit_keeps_input(self) -> bool:
        return self.setup.quant is not None and self.setup.quant.matmul_keeps_input

    def consumers_save(
        self,
        tally: Tally,
        tensor_dtype: int,
        width: str,
        consumers: list[LinearModule],
        already_saved: bool = False,
    ) -> bool:
        """What the Linears reading one tensor save of it (shared copy or private casts);
        whether the tensor itself is kept."""
        shared = already_saved
        private = 0.0
        stored = self.train.adapter_bytes  # the adapters' own dtype
        kept = 2 if self.dt.autocast else stored  # what lora_A's matmul keeps of its input
        # LitGPT's fused qkv has one lora_A for its adapted parts, fed one dropped copy of the
        # input (litgpt/lora.py:421 at 0.4.0: `self.lora_A` over `self.lora_dropout(x)`)
        fused_dropout = self.setup.framework is Framework.LITGPT
        dropped = False
        for lin in consumers:
            if (
                self.train.linear_inputs_saved
                and self.setup.float8_te
                and te_converts(self.spec, lin)
            ):
                private += FP8_INPUT_BYTES  # te.Linear's own column-wise FP8 copy
            elif self.train.linear_inputs_saved:
                if self.dt.autocast and tensor_dtype == 4:
                    private += 2  # autocast casts an fp32 input to bf16/fp16 for each op
                else:
                    shared = True
            elif self.kbit_keeps_input and lin.role != "expert":
                quant = self.setup.quant
                assert quant is not None
                if quant.quant_type is QuantType.INT8 or tensor_dtype == quant.compute_dtype_bytes:
                    shared = True  # LLM.int8 keeps its input as it comes
                else:
                    private += quant.compute_dtype_bytes  # cast to the compute dtype first
            if self.train.adapter(lin):
                # peft's lora.Linear casts its input to the adapters' dtype whatever autocast
                # does (its bitsandbytes layers only while autocast is off); autocast then casts
                # an fp32 input to 16 bits for lora_A's matmul: either way a copy per adapter
                peft_casts = tensor_dtype != stored and not (self.quantized and self.dt.autocast)
                into_lora_a = stored if peft_casts else tensor_dtype
                if self.train.lora_dropout:
                    # dropout before lora_A: a bool mask and the dropped copy it keeps
                    fused = fused_dropout and linear_position(lin) == "attn_in"
                    if not (fused and dropped):
                        private += 1 + kept
                    dropped = dropped or fused
                elif peft_casts or self.dt.autocast and into_lora_a == 4:
                    private += kept
                else:
                    shared = True
                tally.add(kept, "N·r")  # lora_A output, saved by lora_B
                if self.train.dora:
                    # DoRA rescales the base output: it keeps that output for the magnitude grad
                    tally.add(self.dt.compute * lin.out_features / _width(self.spec, width), width)
        if shared and not already_saved:
            tally.add(tensor_dtype, width)
        tally.add(private, width)
        return shared

    def fast_lora(self, linears: list[LinearModule]) -> bool:
        """Whether unsloth's own LoRA function runs these Linears: each has an adapter and no
        bias (unsloth's get_peft_model patches a group only so, models/llama.py :5330-5420)."""
        return (
            self.rules.fast_lora
            and bool(linears)
            and all(self.train.adapter(lin) and not lin.bias for lin in linears)
        )

    def norm(self, tally: Tally, width: str = "N·h", input_dtype: int | None = None) -> int:
        """A norm over the residual stream; returns the dtype of its output."""
        d = self.dt.residual if input_dtype is None else input_dtype
        trains = self.train.base_trains
        kind = self.spec.norm
        if self.rules.fast_norm and kind != "layernorm":
            tally.add(d, width)  # its input (the fp32 rsqrt a row is N × 4 B: left out)
            return d
        if kind == "layernorm":
            tally.add(d, width)  # native_layer_norm saves its input (and per-row stats)
        elif kind == "gemma_rmsnorm":
            tally.add(4, width)  # x.float()
            if trains:
                tally.add(4, width)  # normalised fp32 tensor, saved by the (1 + weight) product
        else:
            tally.add(4, width)  # x.to(float32), saved by pow and by the rsqrt product
            if trains:
                # the normalised tensor, saved by weight * x: in the input dtype, or in fp32
                # where the weight multiplies the fp32 tensor
                tally.add(4 if self.rules.norm_output_fp32 else d, width)
        return d


def _width(spec: ModelSpec, symbol: str) -> float:
    return {
        "N·h": spec.hidden_size,
        "N·q": spec.q_dim,
        "N·kvd": spec.kv_dim,
        "N·I": spec.intermediate_size,
        "N·Is": shared_expert_width(spec),
    }.get(symbol, spec.hidden_size)


def _linears(group: BlockGroup, position: str) -> list[LinearModule]:
    return [lin for lin in group.linears if linear_position(lin) == position]


# (vision encoders: the Qwen ViTs' attn.proj and mlp.linear_fc2, InternViT's projection_layer)
ATTN_OUT_NAMES = {"o_proj", "out_proj", "o", "dense", "c_proj", "wo", "proj", "projection_layer"}
MLP_OUT_NAMES = {
    "down_proj",
    "fc2",
    "c_proj",
    "dense_4h_to_h",
    "wo",
    "w2",
    "dense",
    "fc_out",
    "linear_fc2",
}


def linear_position(lin: LinearModule) -> str:
    """Where a Linear sits in its block.

    One of attn_in, attn_out, cross_in, cross_out, mlp_in, mlp_out, expert, router.
    """
    if lin.role in ("expert", "router"):
        return lin.role
    path = lin.path.lower()
    if lin.role == "attention":
        if (
            "cross" in path
            or "encdecattention" in path
            or ".layer.1." in path
            and "decoder" in path
        ):
            return "cross_out" if lin.name in ATTN_OUT_NAMES else "cross_in"
        if lin.name in ATTN_OUT_NAMES or path.endswith("output.dense"):
            return "attn_out"
        return "attn_in"
    if "intermediate" in path:
        return "mlp_in"  # BERT's intermediate.dense
    if lin.name in MLP_OUT_NAMES or path.endswith("output.dense"):
        return "mlp_out"
    return "mlp_in"


def attention_core(
    ctx: BlockContext, tally: Tally, cross: bool = False, fused_qkv: bool = False
) -> None:
    """Saved tensors of the attention itself, between the projections and the output Linear."""
    spec, e = ctx.spec, ctx.dt.compute
    # with one fused q/k/v projection and rotary embeddings, q and k become new tensors but v
    # stays a view of the projection's output, and the view attention keeps pins all of it
    # (unless autocast casts q, k and v to 16 bits first: a k-bit projection returns fp32)
    pinned_qkv = (
        fused_qkv
        and not cross
        and spec.model_type not in ABSOLUTE_POSITION_TYPES
        and ctx.dt.linear_out_bytes == e
    )
    if spec.qk_norm and not cross:
        for width in ("N·q", "N·kvd"):
            tally.add(4, width)  # per-head RMSNorm on q and k upcasts to fp32
            if ctx.train.base_trains:
                tally.add(e, width)
    attn = ctx.setup.attn if spec.supports_sdpa else AttnImpl.EAGER
    grouped = spec.num_kv_heads < spec.num_attention_heads
    if attn is not AttnImpl.EAGER and math_sdpa_fallback(spec) and not cross:
        # SDPA with a mask and unexpanded K/V heads runs torch's math path, in fp32: q, K and V
        # broadcast to every head, and the probabilities
        tally.add(12, "N·q")
        tally.add(4, "b·a·s²")
        return
    if attn is AttnImpl.EAGER:
        kv_width = "N·q" if grouped else "N·kvd"  # repeat_kv materialises K and V per head
        if spec.model_type in QK_IN_FP32_TYPES:
            tally.add(4, "N·q")  # q and k cast to fp32, saved by q @ kᵀ
            tally.add(4 + e, kv_width)  # k in fp32, v as it is
        else:
            tally.add(e, "N·q")  # q, saved by q @ kᵀ
            tally.add(2 * e, kv_width)
        if spec.model_type in SOFTMAX_IN_COMPUTE_DTYPE_TYPES and not ctx.dt.autocast:
            probs = e  # softmax in the scores' dtype, its output shared with probs @ v
            tally.add(e, "b·a·s²")
        else:
            probs = 4
            tally.add(4, "b·a·s²")  # softmax in fp32 (asked for, or autocast's fp32 op)
            if e != 4:
                tally.add(e, "b·a·s²")  # the probabilities cast back, saved by probs @ v
        if ctx.setup.softmax_keeps_input:
            tally.add(4, "b·a·s²")  # torch <= 1.10: softmax's backward kept its input too
        if pinned_qkv and not grouped:
            tally.add(e, "N·q")  # the q and k parts of the fused output, pinned by v
            tally.add(e, "N·kvd")
        if spec.attn_logit_softcapping:
            tally.add(e, "b·a·s²")  # tanh of the capped scores
        if _dropout(spec, "attention") > 0:
            tally.add(1, "b·a·s²")  # dropout mask
            if probs == 4 and e == 4:
                tally.add(4, "b·a·s²")  # dropout output, saved by probs @ v
        return
    tally.add(2 * e, "N·q")  # q after rotary embedding, and the attention output
    masked = attn is AttnImpl.SDPA and ctx.setup.packed_mask and not cross
    # transformers passes SDPA grouped K/V heads (enable_gqa) only without a mask
    # (`use_gqa_in_sdpa`, 4.5x to 5.x): with the packed samples' mask it repeats K and V to
    # every query head first, and SDPA keeps the repeated copies
    repeated = grouped and (masked or ctx.rules.repeats_kv_heads)
    tally.add(2 * e, "N·q" if repeated else "N·kvd")  # k after rotary embedding, v
    tally.add(4, "b·a·s")  # log-sum-exp per head and row (fp32)
    if masked:
        # packed samples: transformers passes SDPA a boolean block-diagonal mask, which SDPA
        # converts to an additive one in q's dtype on every call (torch's
        # convert_boolean_attn_mask) and keeps for backward: rows × tokens² per layer
        tally.add(e, "b·s²")
    if pinned_qkv:
        tally.add(e, "N·q")  # the q and k parts of the fused output, pinned by v
        tally.add(e, "N·kvd")


def math_sdpa_fallback(spec: ModelSpec) -> bool:
    """Falcon passes a mask with K/V heads fewer than query heads and no `enable_gqa`: no fused
    kernel takes that, so SDPA falls back to the math path."""
    return spec.model_type == "falcon" and spec.num_kv_heads < spec.num_attention_heads


def _dropout(spec: ModelSpec, kind: str) -> float:
    return float(getattr(spec, f"{kind}_dropout", 0.0) or 0.0)


def mlp_core(ctx: BlockContext, tally: Tally, group: BlockGroup, width: str = "N·I") -> None:
    """From the MLP input's consumers to the down projection's input."""
    e = ctx.dt.linear_out_bytes
    saves = ACTIVATION_SAVES.get(ctx.spec.activation, 1)
    down = _linears(group, "mlp_out")
    if ctx.spec.mlp == "gated":
        tally.add(saves * e, width)  # the gate projection, kept by the activation
        tally.add(2 * e, width)  # act(gate) and up, kept by their product
        ctx.consumers_save(tally, e, width, down)
        return
    tally.add(saves * e, width)  # fc1 output (and the pieces of a written-out GELU)
    # ReLU keeps its output, which is the tensor fc2 reads: one copy serves both
    ctx.consumers_save(
        tally, e, width, down, already_saved=ctx.spec.activation in ACTIVATIONS_KEEPING_OUTPUT
    )


def block_tally(ctx: BlockContext, group: BlockGroup) -> Tally:
    """Saved activation bytes of one block, as coefficients of N·h, N·kvd, N·I, ..."""
    tally = Tally()
    spec, dt = ctx.spec, ctx.dt
    attn_in = _linears(group, "attn_in")
    attn_out = _linears(group, "attn_out")
    mlp_in = _linears(group, "mlp_in") + _linears(group, "router")
    post_norm = spec.model_type in POST_NORM_TYPES
    # GPT-NeoX runs a second LayerNorm over the same block input for its MLP
    two_norm_parallel = spec.parallel_residual and spec.model_type in TWO_NORM_PARALLEL_TYPES
    if post_norm:
        # BERT-style: attention reads the block input; LayerNorm follows each residual add
        ctx.consumers_save(tally, dt.residual, "N·h", attn_in)
    else:
        ctx.norm(tally)
        one_norm_parallel = spec.parallel_residual and not two_norm_parallel
        if not spec.parallel_residual and ctx.fast_lora(attn_in):
            tally.add(dt.residual, "N·h")  # LoRA_QKV keeps the norm's output, nothing else
        else:
            ctx.consumers_save(
                tally, dt.residual, "N·h", attn_in + (mlp_in if one_norm_parallel else [])
            )
    fused_qkv = len(attn_in) == 1 or ctx.setup.framework is Framework.LITGPT
    attention_core(ctx, tally, fused_qkv=fused_qkv)
    if ctx.setup.framework is Framework.LITGPT and any(ctx.train.adapter(x) for x in attn_in):
        # LitGPT zero-pads the LoRA output of the adapted q and v parts with index_copy,
        # whose backward keeps its source: lora_B's output for those parts
        tally.add(ctx.dt.compute, "N·q")
        tally.add(ctx.dt.compute, "N·kvd")
    sdpa_keeps_output = (
        ctx.setup.attn is not AttnImpl.EAGER
        and spec.supports_sdpa
        and not math_sdpa_fallback(spec)
        and spec.model_type not in CONCATENATED_ROTARY_TYPES
    )
    if ctx.fast_lora(attn_out):
        if not sdpa_keeps_output:
            tally.add(dt.compute, "N·q")  # LoRA_W keeps its input, nothing else
    else:
        ctx.consumers_save(tally, dt.compute, "N·q", attn_out, already_saved=sdpa_keeps_output)
    if _dropout(spec, "hidden") > 0:
        tally.add(2, "N·h")  # two residual dropout masks (bool)
    if any(linear_position(lin) == "cross_in" for lin in group.linears):
        _cross_attention(ctx, tally, group)
    if post_norm:
        ctx.norm(tally)
        ctx.consumers_save(tally, dt.residual, "N·h", mlp_in)
        mlp_core(ctx, tally, group)
        ctx.norm(tally)
        return tally
    down = _linears(group, "mlp_out")
    if (
        not spec.parallel_residual
        and not group.num_experts
        and spec.mlp == "gated"
        and spec.model_type not in SANDWICH_NORM_TYPES
        and ctx.fast_lora(mlp_in + down)
    ):
        ctx.norm(tally)
        tally.add(dt.residual, "N·h")  # LoRA_MLP keeps its input,
        tally.add(2 * dt.compute, "N·I")  # the gate's and the up projection's outputs
        return tally
    if not spec.parallel_residual:
        ctx.norm(tally)
        ctx.consumers_save(tally, dt.residual, "N·h", mlp_in)
    elif two_norm_parallel:
        # the second LayerNorm saves the same input tensor as the first: only its output is new
        ctx.consumers_save(tally, dt.residual, "N·h", mlp_in)
    if spec.model_type in SANDWICH_NORM_TYPES:
        ctx.norm(tally)  # post-attention norm
        ctx.norm(tally)  # post-feedforward norm
    if group.num_experts:
        _experts(ctx, tally, group)
    else:
        mlp_core(ctx, tally, group)
    return tally


POST_NORM_TYPES = {"bert", "roberta", "distilbert"}
# rotary embeddings applied by concatenating a rotated part and a pass-through part: q comes
# out contiguous per head, the attention output takes that layout, and the output projection
# reads a transposed copy of it instead of the output itself (GPT-J, which transposes q after
# the concatenation since transformers 5.24, does not)
CONCATENATED_ROTARY_TYPES = {"phi3", "phi", "gpt_neox", "stablelm"}
# eager attention that multiplies q and k in fp32 whatever the weights' dtype
QK_IN_FP32_TYPES = {"gptj"}
# eager attention whose softmax runs in the compute dtype (no fp32 upcast of the scores)
SOFTMAX_IN_COMPUTE_DTYPE_TYPES = {"gpt2", "bert", "roberta", "falcon"}
# learned, absolute or ALiBi positions: no rotary embedding copies q and k
ABSOLUTE_POSITION_TYPES = {"gpt2", "opt", "bert", "roberta", "bloom", "t5", "mt5"}
TWO_NORM_PARALLEL_TYPES = {"gpt_neox"}


def _cross_attention(ctx: BlockContext, tally: Tally, group: BlockGroup) -> None:
    cross_in = [lin for lin in group.linears if linear_position(lin) == "cross_in"]
    cross_out = [lin for lin in group.linears if linear_position(lin) == "cross_out"]
    ctx.norm(tally)
    ctx.consumers_save(tally, ctx.dt.residual, "N·h", cross_in)
    attention_core(ctx, tally, cross=True)
    ctx.consumers_save(tally, ctx.dt.compute, "N·q", cross_out)


def _experts(ctx: BlockContext, tally: Tally, group: BlockGroup) -> None:
    """A routed MoE layer: each token visits k experts (shapes do not depend on the routing)."""
    e = ctx.dt.compute
    tally.add(4, "N·E")  # the router's fp32 softmax
    # top-k indices and the sort/gather bookkeeping (int64), and the routing weights
    tally.add(32 + e, "k·N")
    shared = [lin for lin in group.linears if lin.role == "shared_expert"]
    trains = ctx.train.base_trains
    # gathered inputs (kept by trainable experts), gate, act(gate), up, and the routed output
    tally.add((2 if trains else 1) * e, "k·N·h")
    tally.add((4 if trains else 3) * e, "k·N·I")
    if shared:
        shared_mlp = BlockGroup(name="shared", count=1, linears=shared, norm_params=0)
        mlp_core(ctx, tally, shared_mlp, width="N·Is")
        if any(lin.role == "router" and lin.out_features == 1 for lin in group.linears):
            tally.add(e, "N·h")  # the shared expert's output, kept by its sigmoid gate


@dataclass(frozen=True)
class ActivationEstimate:
    per_block: list[tuple[BlockGroup, Tally]]
    outside: Tally  # final norm, head input, masks: once per model
    checkpointed: bool
    dims: dict[str, float]
    final: Tally | None = None  # the final norm's and the head input's part of `outside`

    @property
    def final_bytes(self) -> int:
        """What the final norm and the head keep: given back once their backward has run."""
        return self.final.evaluate(self.dims) if self.final is not None else 0

    def per_block_bytes(self, group: BlockGroup) -> int:
        for g, tally in self.per_block:
            if g is group:
                return tally.evaluate(self.dims)
        raise KeyError(group.name)

    @property
    def full_bytes(self) -> int:
        """Every block's saved tensors, without checkpointing."""
        return sum(t.evaluate(self.dims) * g.count for g, t in self.per_block) + (
            self.outside.evaluate(self.dims)
        )

    @property
    def largest_block_bytes(self) -> int:
        return max((t.evaluate(self.dims) for _, t in self.per_block), default=0)


def head_input_dtype(dt: Dtypes) -> int:
    """Bytes per element of the input the LM head keeps: autocast's 16-bit cast of it, else
    the residual stream's dtype."""
    return 2 if dt.autocast else dt.residual


def estimate_activations(
    spec: ModelSpec, setup: TrainingSetup, rules: BlockRules = TRANSFORMERS_RULES
) -> ActivationEstimate:
    dt = dtypes_for(setup)
    train = trainability_for(spec, setup)
    ctx = BlockContext(spec, setup, dt, train, rules)
    per_block = [
        (
            group,
            cross_attention_tally(ctx, group)
            if group.name == "cross_attention"
            else block_tally(ctx, group),
        )
        for group in spec.blocks
    ]
    outside = Tally()
    final = Tally()
    ctx.norm(final)
    if train.linear_inputs_saved and spec.is_causal_lm:
        te_head = setup.float8_te and te_converts_head(spec)
        # the head's input (a te.Linear head: its column-wise FP8 copy)
        final.add(FP8_INPUT_BYTES if te_head else head_input_dtype(dt), "N·h")
    outside.extend(final)
    # attention's geometry: a flat packed batch is one row of batch × seq tokens
    b, s = setup.attention_shape
    # a decoder's causal masks: a causal LM's, or a decoder under a score head (a reward
    # model, AutoModelForSequenceClassification), which builds them the same way
    decoder = spec.is_causal_lm or (
        spec.architecture.endswith(
            ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
        )
        and spec.model_type not in POST_NORM_TYPES
    )
    eager = decoder and (setup.attn is AttnImpl.EAGER or not spec.supports_sdpa)
    if eager:
        # eager attention adds a mask to the scores: transformers builds it once per forward
        # and per kind of layer (a model mixing sliding-window and full layers, Gemma-2's,
        # gets both, whatever the length), rows × tokens² (block-diagonal for packed
        # samples), in the embeddings' dtype: fp32 under autocast over fp32 weights. The
        # addition keeps nothing: the masks outlive the model's forward only as the
        # checkpointed blocks' inputs
        if setup.grad_ckpt:
            outside.add(eager_mask_kinds(spec) * dt.residual, "b·s²")
    else:
        if spec.sliding_window and s > spec.sliding_window and spec.sliding_layers:
            outside.add(1, "b·s²")  # the boolean sliding-window mask built once per forward
        if setup.packed_mask and spec.is_causal_lm:
            outside.add(1, "b·s²")  # the packed samples' boolean mask, built once per forward
    r = setup.lora.r if setup.lora else 0
    dims: dict[str, float] = {
        "N·h": b * s * spec.hidden_size,
        "N·q": b * s * spec.q_dim,
        "N·kvd": b * s * spec.kv_dim,
        "N·I": b * s * spec.intermediate_size,
        "N·Is": b * s * shared_expert_width(spec),
        "k·N": spec.experts_per_token * b * s,
        "N·r": b * s * r,
        "N·E": b * s * max(spec.num_experts, 1),
        "b·a·s": b * spec.num_attention_heads * s,
        "b·a·s²": b * spec.num_attention_heads * s * s,
        "b·s²": b * s * s,
        "k·N·h": spec.experts_per_token * b * s * spec.hidden_size,
        "k·N·I": spec.experts_per_token * b * s * spec.intermediate_size,
    }
    states = cross_attention_states(spec, setup)
    if states:
        dims.update(
            {
                "Nv·h": b * states * spec.hidden_size,
                "Nv·q": b * states * spec.q_dim,
                "Nv·kvd": b * states * spec.kv_dim,
                "Nv·r": b * states * r,
                "b·s·v": b * s * states,
            }
        )
        outside.extend(cross_attention_outside(ctx))
    else:
        dims.update(dict.fromkeys(("Nv·h", "Nv·q", "Nv·kvd", "Nv·r", "b·s·v"), 0))
    return ActivationEstimate(per_block, outside, setup.grad_ckpt, dims, final)


def cross_attention_states(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Vision states per sample Mllama's cross-attention blocks read (0 for other models)."""
    if (
        spec.vision is None
        or setup.vision is None
        or spec.vision.geometry.rule != ("cross_attention")
    ):
        return 0
    return image_tokens(spec.vision, setup.vision).cross_states


def cross_attention_tally(ctx: BlockContext, group: BlockGroup) -> Tally:
    """Mllama's cross-attention block (transformers 5.24 MllamaCrossAttentionDecoderLayer):
    an RMSNorm, queries from the text normalised per head (q_norm upcasts them to fp32), keys
    and values projected from the Nv vision states (k_norm upcasts the keys, where they need a
    gradient), SDPA under the text × vision mask, so K and V repeated to every query head
    (transformers passes grouped heads to SDPA only without a mask), the tanh-gated residual
    (the gate's gradient needs the attention's output where the gate trains), and a gated MLP.
    The vision states and the mask are shared by every block: counted once, outside."""
    tally = Tally()
    spec, dt, train = ctx.spec, ctx.dt, ctx.train
    e = dt.compute
    by_name = {lin.name: lin for lin in group.linears}
    q, k, v, o = (by_name[name] for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
    ctx.norm(tally)
    ctx.consumers_save(tally, dt.residual, "N·h", [q])
    tally.add(4, "N·q")  # q_norm's fp32 input
    tally.add(e, "N·q")  # the normalised queries, saved by SDPA
    training = vision_training(spec, ctx.setup)
    states_need_grad = training.projector_grad
    stored = train.adapter_bytes
    kept = 2 if dt.autocast else stored
    for lin in (k, v):
        if train.adapter(lin):
            if e != stored:
                tally.add(kept, "Nv·h")  # peft's cast of the states for this adapter
            tally.add(kept, "Nv·r")  # lora_A's output
    if train.base_trains or train.adapter(k) or states_need_grad:
        tally.add(4, "Nv·kvd")  # k_norm's fp32 input
        if train.base_trains:
            tally.add(e, "Nv·kvd")
    repeated = spec.num_kv_heads < spec.num_attention_heads
    tally.add(2 * e, "Nv·q" if repeated else "Nv·kvd")  # K and V, saved by SDPA
    tally.add(e, "N·q")  # the attention's output
    tally.add(4, "b·a·s")  # log-sum-exp
    ctx.consumers_save(tally, e, "N·q", [o], already_saved=True)
    if train.base_trains:
        tally.add(e, "N·h")  # tanh(gate) · attention: kept for the gate's gradient
    ctx.norm(tally)
    ctx.consumers_save(tally, dt.residual, "N·h", _linears(group, "mlp_in"))
    mlp_core(ctx, tally, group)
    if train.base_trains:
        tally.add(e, "N·h")  # tanh(gate) · MLP: kept for the gate's gradient
    return tally


def cross_attention_outside(ctx: BlockContext) -> Tally:
    """What every cross-attention block shares: the text × vision mask SDPA keeps (in the
    weights' dtype), and the vision states where a k/v projection keeps its input."""
    tally = Tally()
    tally.add(ctx.dt.compute, "b·s·v")
    kv = [
        lin
        for group in ctx.spec.blocks
        if group.name == "cross_attention"
        for lin in group.linears
        if lin.name in ("k_proj", "v_proj")
    ]
    if ctx.train.linear_inputs_saved or any(ctx.train.adapter(lin) for lin in kv):
        tally.add(ctx.dt.compute, "Nv·h")
    return tally


def shared_expert_width(spec: ModelSpec) -> int:
    """The intermediate width of a MoE block's always-on shared expert (0 without one)."""
    for group in spec.blocks:
        for lin in group.linears:
            if lin.role == "shared_expert" and linear_position(lin) == "mlp_in":
                return lin.out_features // (2 if lin.name == "gate_up_proj" else 1)
    return 0


def checkpoint_input_bytes(spec: ModelSpec, setup: TrainingSetup) -> tuple[int, str]:
    """With gradient checkpointing each block keeps only its input (the residual stream)."""
    d = dtypes_for(setup).residual
    n = setup.tokens * spec.hidden_size
    blocks = sum(g.count for g in spec.blocks)
    return d * n * blocks, f"{d}·N·h × {blocks} blocks"


def backward_workspace(
    spec: ModelSpec, setup: TrainingSetup, rules: BlockRules = TRANSFORMERS_RULES
) -> tuple[int, str]:
    """The gradients of one block in flight during its backward: the residual stream's two
    (the block's output gradient and its input gradient), and the MLP's. A gated MLP's
    product `act(gate) * up` has one backward node that makes both its inputs' gradients
    while the product's own gradient is alive, beside the residual's: three N·I tensors. Where
    the down projection keeps the product for its weight's gradient, its backward gives it back
    first, and the three stand where it stood: two beyond the saved tensors."""
    dt = dtypes_for(setup)
    n_h = setup.tokens * spec.hidden_size
    n_i = setup.tokens * spec.intermediate_size
    d, e = dt.residual, dt.linear_out_bytes
    best = 2 * d * n_h + 2 * e * n_i, f"2·{d}·N·h + 2·{e}·N·I (gradients of one block in flight)"
    if spec.mlp == "gated" and spec.blocks and not _keeps_mlp_product(spec, setup, dt, rules):
        gated = d * n_h + 3 * e * n_i
        if gated > best[0]:
            best = gated, f"{d}·N·h + 3·{e}·N·I (gradients of one block in flight)"
    if spec.model_type in SANDWICH_NORM_TYPES:
        # a norm ends the block (Gemma-2's post-feedforward norm): its backward runs first,
        # beside every tensor the block keeps, and its fp32 `pow` branch has five N·h
        # tensors in flight (the rsqrt product's input gradient waiting in autograd's buffer,
        # the mean's expanded gradient, `x.pow(1)`, its double and their product)
        norm = d * n_h + 5 * 4 * n_h
        if norm > best[0]:
            best = norm, f"{d}·N·h + 5·4·N·h (the block's last norm's backward)"
    return best


# norms after attention and after the MLP as well as before them
SANDWICH_NORM_TYPES = {"gemma2", "gemma3_text", "gemma3"}


def _keeps_mlp_product(
    spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, rules: BlockRules
) -> bool:
    ctx = BlockContext(spec, setup, dt, trainability_for(spec, setup), rules)
    down = _linears(spec.blocks[0], "mlp_out")
    return ctx.consumers_save(Tally(), dt.linear_out_bytes, "N·I", down)


def eager_mask_kinds(spec: ModelSpec) -> int:
    """How many additive masks transformers builds per forward for eager attention: one per
    kind of layer, two for a model mixing sliding-window and full layers (Gemma-2)."""
    layers = sum(g.count for g in spec.blocks)
    return 2 if 0 < spec.sliding_layers < layers else 1

"""FP8 training with TransformerEngine as accelerate runs it (`mixed_precision: fp8` with
`fp8_config.backend: TE`, `llmmem estimate --fp8 te`). Read in accelerate 1.15.0 and
transformer_engine 2.20.2; unmeasured here (TransformerEngine needs CUDA).

What accelerate does (accelerate/accelerator.py, utils/transformer_engine.py):

- `Accelerator.prepare` calls `_prepare_te` (accelerator.py:1545), which runs `convert_model`
  (:2132) and points the optimizer at the new parameters (:2133-2137). `convert_model`
  (utils/transformer_engine.py:42-92) swaps every `nn.Linear` whose weight's two dimensions
  divide by 16 for a `te.Linear` of the same dtype (`params_dtype=module.weight.dtype`, :52):
  the high-precision master weights stay. A Linear that does not divide ends the conversion of
  its parent's later children (`return`, :50-51). `nn.LayerNorm` becomes `te.LayerNorm`
  (:61-69); an RMSNorm, the embedding and everything else stay. Nothing becomes
  `LayerNormLinear` or `LayerNormMLP` (transformers and accelerate never build them). The LM
  head is an `nn.Linear` like the others: converted where the vocabulary and the width divide
  by 16; a head tied to the embedding then gets a weight of its own, outside the optimizer (the
  mapping at :2133 is by the old parameters' names, and the tied head has none).
- the recipe: `apply_fp8_autowrap` builds `DelayedScaling(**kwargs)` (:177) from
  `TERecipeKwargs`, whose defaults pass no arguments (`to_kwargs` keeps only what differs from
  them, utils/dataclasses.py:78-88): TransformerEngine's own defaults, `amax_history_len`
  1024 (common/recipe/__init__.py:255), per-tensor scales. MXFP8 only with
  `use_mxfp8_block_scaling`. The model's forward runs under `fp8_autocast` (:133) inside bf16
  autocast (accelerate's native AMP for fp8, accelerator.py:604).

What a `te.Linear` keeps (transformer_engine/pytorch):

- its weight: quantized at every forward (`quantize_weight`, module/linear.py:575-585). The FP8
  weight cache across micro-batches exists only when the caller passes `is_first_microbatch`
  (`cache_name = None if is_first_microbatch is None`, :2443); the transformers model never
  does, so each forward makes a fresh one and saves it for backward (`wt_save = weightmat`,
  :729). Row- and column-wise, since the input needs a gradient (:563, :571): on Ada and
  Hopper, whose FP8 GEMMs take only the TN layout, that is `_data` and its `_transpose`, 2
  bytes per weight (tensor/float8_tensor.py:423-428); on Blackwell one `_data` serves both (1
  byte). Sized here: 2 bytes, alive from the Linear's forward to its backward, as autocast's
  16-bit copy of a plain Linear is.
- its input: quantized by the Linear itself (:524-532), no 16-bit cast, and only the
  column-wise FP8 copy is saved (`update_usage(rowwise_usage=False, columnwise_usage=True)`,
  :712; `saved_inputmat`, :717): 1 byte per element, one copy per Linear, where a plain
  Linear keeps the tensor it reads (shared by q, k and v) or autocast's 16-bit cast of it. The
  row-wise copy lives only while the GEMM runs.
- the gradient of its output: quantized row- and column-wise for the two backward GEMMs
  (:1243), 2 bytes per element on Ada and Hopper, beside the 16-bit gradient. Its input
  gradient comes back in the autocast dtype (no `grad_input_quantizer` unless asked: :1396),
  and its weight gradient too (`out_dtype=activation_dtype`, :1594-1599), cast to the
  parameter's dtype by autograd, as a plain Linear's under autocast.
- the scaling state: `DelayedScaling` keeps, per Linear, `amax_history` (1024 × 5 fp32) and
  `scale` (5 fp32) (quantization.py:1436-1441): 3 forward quantizers (input, weight, output)
  and 2 backward ones (module/base.py:1139). About 20 KiB a Linear.

Not sized (refused, each with its reason): gradient checkpointing (torch's checkpoint
recomputes a block in backward, outside `fp8_autocast`, and each forward reads the FP8 state
afresh: module/base.py:1532), a tied head that gets converted, te.LayerNorm, mixtures of
experts, vision towers, FSDP and ZeRO-3, activation offloading, torch.compile, other stacks
than the HF Trainer's and TRL's, and a batch whose tokens do not divide by 8
(`assert_dim_for_fp8_exec`, utils.py:704-714)."""

from __future__ import annotations

from llmmem.budget.setup import Framework, Method, TrainingSetup
from llmmem.models.spec import LinearModule, ModelSpec

# DelayedScaling's default history (common/recipe/__init__.py:255), which accelerate keeps
AMAX_HISTORY_LEN = 1024
# quantizers per te.Linear: input, weight and output in forward; two in backward
QUANTIZERS_PER_LINEAR = 5
# bytes per weight element of the FP8 workspace: row-wise data and its transpose (Ada, Hopper)
FP8_WEIGHT_BYTES = 2
# bytes per element of the input a te.Linear saves: its column-wise FP8 copy
FP8_INPUT_BYTES = 1
# bytes per element of an output gradient quantized for the two backward GEMMs
FP8_GRAD_OUTPUT_BYTES = 2
# the FP8 GEMM's alignment: weight dimensions (accelerate's test) and tokens
DIMENSION_MULTIPLE = 16
TOKEN_MULTIPLE = 8
TE_FRAMEWORKS = (Framework.HF, Framework.TRL, Framework.SWIFT, Framework.PLAIN)


def divides(lin: LinearModule) -> bool:
    """accelerate converts an nn.Linear whose weight's dimensions both divide by 16."""
    return lin.in_features % DIMENSION_MULTIPLE == 0 and lin.out_features % DIMENSION_MULTIPLE == 0


def te_converted_paths(spec: ModelSpec) -> frozenset[str]:
    """The block Linears (dotted paths inside a block) convert_model makes te.Linear: those
    that divide by 16, up to the first one of the same parent that does not."""
    converted: set[str] = set()
    for group in spec.blocks:
        stopped: list[str] = []  # parents whose conversion ended
        for lin in group.linears:
            if any(lin.path.startswith(f"{parent}.") or not parent for parent in stopped):
                continue
            if divides(lin):
                converted.add(lin.path)
            else:
                stopped.append(lin.path.rpartition(".")[0])
    return frozenset(converted)


def te_converts(spec: ModelSpec, lin: LinearModule) -> bool:
    return lin.path in te_converted_paths(spec)


def te_converts_head(spec: ModelSpec) -> bool:
    return (
        spec.is_causal_lm
        and spec.vocab_size % DIMENSION_MULTIPLE == 0
        and spec.hidden_size % DIMENSION_MULTIPLE == 0
    )


def te_refusal(spec: ModelSpec, setup: TrainingSetup) -> str | None:
    """Why TransformerEngine's FP8 step is not sized for this model and setup (None: it is)."""
    if setup.method is not Method.FULL or setup.quant is not None:
        return "sized for full fine-tuning, not LoRA or k-bit weights"
    if setup.framework not in TE_FRAMEWORKS:
        return (
            f"accelerate converts the HF Trainer's and TRL's models, not {setup.framework.value}'s"
        )
    if setup.grad_ckpt:
        return (
            "gradient checkpointing is not sized: torch's checkpoint recomputes each block in "
            "backward outside fp8_autocast, so the recompute runs its te.Linear in 16 bits"
        )
    if spec.num_experts:
        return (
            "mixtures of experts are not sized (whether experts are nn.Linear depends on the "
            "transformers release)"
        )
    if spec.vision is not None:
        return "vision-language models are not sized (the vision tower's Linears convert too)"
    if spec.norm == "layernorm":
        return "te.LayerNorm (what accelerate makes of nn.LayerNorm) is not sized"
    if spec.tie_word_embeddings and te_converts_head(spec):
        return (
            "a tied LM head is not sized: accelerate's convert_model gives it a te.Linear weight "
            "of its own, untied from the embedding and outside the optimizer"
        )
    dist = setup.distributed
    if dist.fsdp is not None or dist.zero_stage == 3:
        return "sharded weights (FSDP, ZeRO-3) are not sized"
    if setup.activation_offload or setup.compile:
        return "activation offloading and torch.compile are not sized"
    b, s = setup.attention_shape
    if (b * s) % TOKEN_MULTIPLE:
        return (
            f"te.Linear's FP8 GEMM needs the tokens of a step (batch × seq = {b * s}) to divide "
            f"by {TOKEN_MULTIPLE}"
        )
    return None


def _converted_linears(spec: ModelSpec) -> list[tuple[int, LinearModule]]:
    """(blocks, Linear) for every converted block Linear, with how many blocks have it."""
    paths = te_converted_paths(spec)
    return [(g.count, lin) for g in spec.blocks for lin in g.linears if lin.path in paths]


def te_linear_count(spec: ModelSpec) -> int:
    """te.Linear modules in the model (the head included where it converts)."""
    blocks = sum(count * lin.count for count, lin in _converted_linears(spec))
    return blocks + (1 if te_converts_head(spec) else 0)


def te_scaling_state_bytes(spec: ModelSpec) -> int:
    """DelayedScaling's amax histories and scales: (1024 + 1) × 5 fp32 per te.Linear."""
    return te_linear_count(spec) * (AMAX_HISTORY_LEN + 1) * QUANTIZERS_PER_LINEAR * 4


def te_weight_copy_terms(spec: ModelSpec, setup: TrainingSetup) -> tuple[int, int, int]:
    """The weight copies of a TransformerEngine FP8 step (through forward, at the start of
    backward, while a block is recomputed: no checkpointing here, so as at the start of
    backward): every te.Linear's FP8 weight, saved for its backward, the scaling state and
    autocast's 16-bit copies of the fp32 Linears left plain; in forward, one Linear's row-wise
    FP8 input too, alive while its GEMM runs."""
    converted = _converted_linears(spec)
    paths = te_converted_paths(spec)
    head = te_converts_head(spec)
    fp8_weights = sum(count * FP8_WEIGHT_BYTES * lin.weight_params for count, lin in converted)
    if head:
        fp8_weights += FP8_WEIGHT_BYTES * spec.vocab_size * spec.hidden_size
    plain = 0
    if setup.precision.is_autocast:
        # autocast caches a 16-bit copy of each fp32 weight an F.linear reads
        plain = sum(
            2 * g.count * lin.weight_params
            for g in spec.blocks
            for lin in g.linears
            if lin.path not in paths
        )
        if spec.is_causal_lm and not head:
            plain += 2 * spec.vocab_size * spec.hidden_size
    widths = [lin.in_features for _, lin in converted] + ([spec.hidden_size] if head else [])
    row_wise_input = FP8_INPUT_BYTES * setup.tokens * max(widths, default=0)
    held = fp8_weights + plain + te_scaling_state_bytes(spec)
    return held + row_wise_input, held, held


def te_head_gradient_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """In the head's backward, a te.Linear head quantizes the logits' gradient row- and
    column-wise for its two GEMMs (module/linear.py:1243): 2 bytes × N·V beside the 16-bit
    gradient, until its weight gradient is made. (A block Linear's, N·out, lives inside its
    block's backward.)"""
    if not te_converts_head(spec):
        return 0
    return FP8_GRAD_OUTPUT_BYTES * setup.tokens * spec.vocab_size


def te_float8_text(spec: ModelSpec, setup: TrainingSetup) -> str:
    paths = te_converted_paths(spec)
    plain = setup.precision.is_autocast and (
        any(lin.path not in paths for g in spec.blocks for lin in g.linears)
        or spec.is_causal_lm
        and not te_converts_head(spec)
    )
    return (
        "TransformerEngine FP8 (transformer_engine 2.20.2, accelerate 1.15.0; unmeasured: needs "
        "CUDA): each te.Linear's FP8 weight, row- and column-wise (2 bytes a weight, made at "
        "every forward and saved for backward: module/linear.py:575, :729; "
        "tensor/float8_tensor.py:423) + DelayedScaling's amax histories ((1024 + 1) × 5 fp32 a "
        "Linear: quantization.py:1436) + one Linear's row-wise FP8 input in forward (1 byte)"
        + (
            " + in the head's backward, the logits' gradient in FP8 (2·N·V: module/linear.py:1243)"
            if te_converts_head(spec)
            else ""
        )
        + (" + autocast's 16-bit copies of the fp32 Linears left plain" if plain else "")
    )

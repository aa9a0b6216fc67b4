"""LitGPT's own training stack, as `litgpt finetune lora|full` runs a step.

Read in LitGPT 0.4.0 (the config hub's 2024 rows ran its `main` of that spring; its pyproject pins
lightning 2.3.0.dev20240428 and bitsandbytes 0.42.0), Lightning 2.3.0.dev20240428 and bitsandbytes
0.42.0 and 0.50.2; file:line at those releases:

What it builds and casts
- The model is built under `fabric.init_module()` (finetune/lora.py:172-173) in the precision's
  dtype: with `bf16-true` every parameter, the LoRA `lora_A`/`lora_B` too (lora.py:121-122, plain
  `nn.Parameter`s), is bf16. Nothing is upcast: there is no k-bit preparation.
- The head is a Linear of its own (`self.lm_head = LoRALinear(...)`, lora.py:504; model.py
  likewise) beside `transformer.wte` (lora.py:514): LitGPT of that time has no weight tying, so
  a model whose Hugging Face config ties them (Llama 3.2, Gemma) trains with a separate head.
- `--quantize bnb.nf4|bnb.nf4-dq|bnb.fp4|...` is Lightning's `BitsandbytesPrecision(mode, dtype)`
  (finetune/lora.py:124-133) without `ignore_modules`: `convert_module` replaces every
  `torch.nn.Linear` (plugins/precision/bitsandbytes.py:103-115, `_convert_layers` :415-438), the
  head's too, by a 4-bit layer. Its `quantize` casts each weight to fp16 first (:335-341), so
  the layer's quant state is fp16 whatever the training dtype.

Its loss
- `finetune full` calls `model(input_ids)` (finetune/full.py:237): the whole logits, then
  `chunked_cross_entropy` over a reshaped copy of the shifted slice (`whole_logits_loss`); the
  rest of this section is `finetune lora`'s.
- `model(input_ids, lm_head_chunk_size=128)` (finetune/lora.py:287) applies the head to each run
  of 128 positions and returns the chunks' logits in the model's dtype (lora.py:546-548);
  `chunked_cross_entropy` (utils.py:248-277) takes each chunk's cross-entropy in that dtype (no
  upcast): the shared budget's chunked loss (budget.logits).
- In forward the last chunk is sliced one position short (`logits[-1][..., :-1, :]`,
  finetune/lora.py:289) and `reshape` copies that slice (utils.py:269); in backward each chunk's
  cross-entropy gradient comes in the logits' dtype (the log-softmax's and its input's), one chunk
  at a time. Measured on the CPU (bench/litgpt_steps.py).
- The RoPE cache is two buffers, cos and sin, of block_size × head_size in fp32
  (`build_rope_cache`, model.py; kept with `register_buffer(..., persistent=False)`).
- With a 4-bit head, each chunk's head call dequantizes the whole head. bitsandbytes 0.42's
  `MatMul4Bit.forward` does it as `dequantize_4bit(B, quant_state).to(A.dtype)` (fp16, then a
  bf16 copy: 4 B per value of the head alive at once); from bitsandbytes 0.46 the forward is the
  `gemm_4bit` op, which dequantizes straight to the input's dtype (backends/default/ops.py
  :323-342, 2 B). Backward (the head is frozen but its input needs a gradient) dequantizes again,
  `dequantize_4bit(B, ctx.state).to(grad_output.dtype)` (autograd/_functions.py:384 in 0.50.2):
  fp16 and bf16, 4 B per value, in every release. The blocks' 4-bit Linears do the same.

Its blocks
- The attention's fused qkv and LoRA's zero-padded q/v output (`index_copy`, whose backward keeps
  its source) are the shared block rules' LitGPT cases (budget.activations).

Its loop: the previous step's graph
- `fit` binds the step's outputs to `logits` (finetune/lora.py:276 at 5895df10, :287 in the 0.4.0
  wheel) and the name is bound again only when the next step's model call returns: through the
  next step's forward, the previous step's logits are alive, and with them its autograd graph.
  Backward freed that graph's saved tensors, not what a custom autograd function keeps as a
  plain attribute of its context: bitsandbytes' `MatMul4Bit` keeps its input so (`ctx.tensors =
  (A, B)`, autograd/_functions.py:523 from 0.41.0 to 0.43.0, :516 in 0.43.1; `(None, B)` from
  0.43.2). Up to bitsandbytes 0.43.1, every 4-bit Linear's input of the previous step (those that
  need a gradient: not the first block's attention input, made from the frozen embeddings) is
  alive when the next step's head runs, beside that step's own.
- lit-gpt's scripts before LitGPT's first release ran the longest sample as the first step
  (`get_batch(..., longest_seq_ix if iter_num == 0 else None)`, finetune/lora.py:212 at 8641822),
  with no step before it: their published peaks are first steps (`first_step`, which leaves this
  term out). Every LitGPT release, 0.2.0 on, shuffles its batches through a DataLoader.
- Without 4-bit weights the previous step's logits are alive through the next forward as well;
  that moment (the new chunks' logits beside the old ones, before the model returns) is not
  added: the LoRA rows' peaks are in backward, where the old logits are gone.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.activations import (
    TWO_NORM_PARALLEL_TYPES,
    Trainability,
    dtypes_for,
    linear_position,
    trainability_for,
)
from llmmem.budget.logits import (
    CHUNK_POSITIONS,
    LogitsMoments,
    logits_count,
    logits_hole,
    logits_moments,
)
from llmmem.budget.setup import LossImpl, Method, QuantType, SetupError, TrainingSetup
from llmmem.budget.stacks.hf import LossMoments, Stack, WeightCopies
from llmmem.budget.weights import Inventory, ParameterGroup, bitsandbytes_bytes
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec
from llmmem.units import format_bytes, format_count

RELEASE = "0.4.0"
# Lightning quantizes every weight from fp16 (plugins/precision/bitsandbytes.py:335)
QUANT_STATE_BYTES = 2


def dequantized_bytes(setup: TrainingSetup, values: int, *, backward: bool) -> int:
    """The bytes alive while a 4-bit weight of `values` values is dequantized for a matmul:
    the fp16 dequantization and, where the model computes in another 16-bit dtype, its cast
    (forward from bitsandbytes 0.46 dequantizes straight to the input's dtype)."""
    compute = dtypes_for(setup).compute
    quant = setup.quant
    direct = quant is not None and quant.bitsandbytes_release >= (0, 46) and not backward
    if direct or compute == QUANT_STATE_BYTES and not setup.precision.uses_bf16:
        return compute * values
    return (QUANT_STATE_BYTES + compute) * values


def _block_kept_inputs(
    spec: ModelSpec, group: BlockGroup, train: Trainability, grad_in: bool
) -> tuple[int, bool]:
    """The input values one block's 4-bit Linears keep on their autograd context (those inputs
    that need a gradient), and whether the block's output needs one."""

    def of(position: str) -> list[LinearModule]:
        return [lin for lin in group.linears if linear_position(lin) == position]

    attn_in, attn_out, mlp_in, mlp_out = (
        of(p) for p in ("attn_in", "attn_out", "mlp_in", "mlp_out")
    )

    def width(linears: list[LinearModule]) -> int:
        return linears[0].in_features if linears else 0

    def adapted(linears: list[LinearModule]) -> bool:
        return any(train.adapter(lin) for lin in linears)

    kept = width(attn_in) if grad_in else 0
    attention = grad_in or adapted(attn_in)
    kept += width(attn_out) if attention else 0
    attention = attention or adapted(attn_out)
    # a parallel block's MLP reads the block input (normalised once more by GPT-NeoX, the same
    # normalised tensor as the attention's by Falcon); a sequential one the attention's sum
    mlp = grad_in if spec.parallel_residual else attention
    shared = spec.parallel_residual and spec.model_type not in TWO_NORM_PARALLEL_TYPES
    kept += width(mlp_in) if mlp and not shared else 0
    mlp = mlp or adapted(mlp_in)
    kept += width(mlp_out) if mlp else 0
    return kept, attention or mlp or adapted(mlp_out)


def kept_matmul_inputs(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Bytes of the inputs a step's 4-bit Linears keep on their autograd contexts (bitsandbytes
    up to 0.43.1): each block's in forward order, from the first input that needs a gradient
    (the embeddings are frozen), and the head's."""
    quant = setup.quant
    if quant is None or quant.quant_type is QuantType.INT8 or not quant.matmul_keeps_input:
        return 0
    train = trainability_for(spec, setup)
    values, grad = 0, False
    for group in spec.blocks:
        for _ in range(group.count):
            kept, grad = _block_kept_inputs(spec, group, train, grad)
            values += kept
    if grad and spec.is_causal_lm:
        values += spec.hidden_size  # the final norm's output, split into the head's chunks
    return quant.compute_dtype_bytes * setup.tokens * values


def previous_step_bytes(spec: ModelSpec, setup: TrainingSetup) -> tuple[int, str]:
    """What the previous step's graph holds while a later step's head runs (the loop's `logits`
    keep it until the model returns): its logits and the inputs its 4-bit Linears kept. None
    before the first step."""
    quant = setup.quant
    if setup.first_step or quant is None:
        return 0, ""
    e = dtypes_for(setup).compute
    logits = e * logits_count(spec, setup)
    inputs = kept_matmul_inputs(spec, setup)
    text = f"the previous step's logits ({e} B × N·V)"
    if inputs:
        text += (
            f" and its 4-bit Linears' inputs, kept on their autograd contexts by bitsandbytes "
            f"{quant.bitsandbytes_version} ({format_bytes(inputs)})"
        )
    return logits + inputs, text + ", alive until the model returns"


def chunked_loss(spec: ModelSpec, setup: TrainingSetup) -> LogitsMoments:
    """`chunked_cross_entropy` over the head's chunks of 128 positions, in the logits' dtype."""
    e = dtypes_for(setup).compute
    n = logits_count(spec, setup)
    shared = logits_moments(spec, setup)
    rows = min(CHUNK_POSITIONS, setup.seq)
    chunk = setup.batch * rows * spec.vocab_size
    last = setup.seq - CHUNK_POSITIONS * ((setup.seq - 1) // CHUNK_POSITIONS)
    copy = e * setup.batch * max(last - 1, 0) * spec.vocab_size
    kept = f"({e} + {e}) B × N·V: the chunks' logits and log-softmaxes"
    return replace(
        shared,
        forward_end=2 * e * n + copy,
        backward_start=2 * e * n + 2 * e * chunk,
        formula_forward=kept + f" + {e} B × the last chunk's shifted copy ({last - 1} positions)",
        formula_backward=kept + f" + 2 × {e} B × one chunk of {rows} positions (its gradients)",
    )


def whole_logits(setup: TrainingSetup) -> bool:
    """Whether the step is `finetune full`'s (the head not chunked, the loss over a shifted
    slice): that script, or full fine-tuning where no script is named. `finetune lora` and
    `finetune adapter` chunk the head (lm_head_chunk_size=128, finetune/adapter.py:256);
    `pretrain` takes the whole logits without a slice (pretrain.py:294-295), a reshape that
    is a view: its chunks' log-softmaxes beside the logits, as the chunked rule counts them
    (one chunk's copy apart)."""
    script = setup.framework_script
    if script is None:
        return setup.method is Method.FULL
    return script == "finetune_full"


def whole_logits_loss(spec: ModelSpec, setup: TrainingSetup) -> LogitsMoments:
    """`finetune full`: `model(input_ids)` makes the whole logits (no `lm_head_chunk_size`,
    finetune/full.py:237) and `chunked_cross_entropy(logits[..., :-1, :], ...)` reshapes the
    shifted slice (a copy where the batch has more than one row), then splits it into chunks of
    128 rows whose cross-entropy keeps each log-softmax in the logits' dtype (utils.py:279-297):
    while its last chunk runs, the logits, the copy and every chunk's log-softmax are alive.
    Backward gives the copy's gradient, then the slice's into a zero tensor of the logits'
    shape, beside the logits the loop keeps."""
    e = dtypes_for(setup).compute
    n = logits_count(spec, setup)
    shifted = setup.batch * max(setup.seq - 1, 0) * spec.vocab_size
    shared = logits_moments(spec, setup)
    # one row: the slice of positions is contiguous and `reshape` gives a view
    copies = 2 if setup.batch > 1 else 1
    return replace(
        shared,
        forward_end=e * n + copies * e * shifted,
        backward_start=2 * e * n + e * shifted,
        formula_forward=f"{e} B × N·V (the whole logits) + "
        + (
            f"2 × {e} B × the shifted positions' logits (the loss's reshaped copy and its "
            "chunks' log-softmaxes)"
            if copies == 2
            else f"{e} B × the shifted positions' logits (the chunks' log-softmaxes; one row's "
            "slice reshapes to a view)"
        ),
        formula_backward=f"2 × {e} B × N·V (the logits and their gradient) + {e} B × the "
        "shifted positions' (the copy's gradient)",
    )


def untied(spec: ModelSpec) -> ModelSpec:
    """The model with a head of its own, as LitGPT builds every model."""
    if not spec.is_causal_lm or not spec.tie_word_embeddings:
        return spec
    head = spec.vocab_size * spec.hidden_size
    return replace(
        spec,
        tie_word_embeddings=False,
        params=replace(spec.params, head=head),
        notes=[*spec.notes, "LitGPT ties no weights: the head is a Linear of its own"],
    )


class LitgptStack(Stack):
    name = "litgpt"

    def check(self, setup: TrainingSetup) -> None:
        script = setup.framework_script or ""
        if script.startswith("finetune_adapter"):
            raise SetupError(
                f"litgpt {script.replace('_', ' ')} trains LLaMA-Adapter's "
                "prompts and gates (litgpt/adapter.py), which llmmem does not size; it is not "
                "full fine-tuning (finetune lora and finetune full are sized)"
            )

    def prepare(self, setup: TrainingSetup) -> TrainingSetup:
        weight = setup.precision.weight_bytes
        if setup.lora is not None and setup.lora.adapter_bytes != weight:
            setup = replace(setup, lora=replace(setup.lora, adapter_bytes=weight))
        if setup.quant is not None and (
            setup.quant.prepare_for_kbit_training or setup.quant.embeddings_16bit
        ):
            quant = replace(setup.quant, prepare_for_kbit_training=False, embeddings_16bit=False)
            setup = replace(setup, quant=quant)
        return setup

    def model(self, spec: ModelSpec, setup: TrainingSetup) -> ModelSpec:
        return untied(spec)

    def inventory(self, spec: ModelSpec, setup: TrainingSetup, inv: Inventory) -> Inventory:
        quant = setup.quant
        if quant is None:
            return inv
        groups = [
            replace(
                g,
                bytes_per_param=bitsandbytes_bytes(quant, g.cols, g.rows),
                quantized=True,
            )
            if g.kind == "head" and not g.trainable
            else g
            for g in inv.groups
        ]
        note = "Lightning's bitsandbytes plugin quantizes every Linear, LitGPT's head too"
        return replace(inv, groups=groups, notes=[*inv.notes, note])

    def buffers(self, spec: ModelSpec, setup: TrainingSetup) -> tuple[ParameterGroup, ...]:
        positions = spec.max_position_embeddings
        if not positions:
            return ()
        return (
            ParameterGroup(
                name="RoPE cos and sin (fp32 buffers, block_size positions)",
                kind="buffer",
                tensors=2,
                rows=positions,
                cols=spec.head_dim,
                bytes_per_param=4.0,
                trainable=False,
            ),
        )

    def loss(self, spec: ModelSpec, setup: TrainingSetup) -> LossMoments | None:
        if not spec.is_causal_lm or setup.loss is not LossImpl.CHUNKED:
            return None
        hole = logits_hole(spec, setup)
        if whole_logits(setup):
            return LossMoments(whole_logits_loss(spec, setup), hole)
        shared = chunked_loss(spec, setup)
        if setup.quant is None:
            return LossMoments(shared, hole)
        e = dtypes_for(setup).compute
        head = spec.vocab_size * spec.hidden_size
        forward = dequantized_bytes(setup, head, backward=False)
        backward = dequantized_bytes(setup, head, backward=True)
        logits = e * logits_count(spec, setup)
        count = f"{format_count(head)} values"
        previous, previous_text = previous_step_bytes(spec, setup)
        at_head = logits + forward + previous
        moments = replace(
            shared,
            forward_end=max(shared.forward_end, at_head),
            formula_forward=shared.formula_forward
            if shared.forward_end >= at_head
            else f"{e} B × N·V (the chunks' logits) + the 4-bit head dequantized for the last "
            f"chunk ({count}: {format_bytes(forward)})"
            + (f" + {previous_text}" if previous else ""),
            head_backward=shared.head_backward + backward,
            formula_head=shared.formula_head
            + f" + the 4-bit head dequantized to fp16 and cast for a chunk's input gradient "
            f"({count}: {format_bytes(backward)})",
        )
        return LossMoments(moments, hole)

    def weight_copies(self, spec: ModelSpec, setup: TrainingSetup) -> WeightCopies | None:
        if setup.quant is None:
            return None
        largest = max(
            (
                lin.out_features * lin.in_features
                for group in spec.blocks
                for lin in group.linears
                if lin.role != "expert"
            ),
            default=0,
        )
        inside = dequantized_bytes(setup, largest, backward=True)
        return WeightCopies(
            at_loss=0,
            backward_start=0,
            recompute=inside,
            in_block=inside,
            formula=f"the largest 4-bit Linear ({format_count(largest)} values) dequantized to "
            "fp16 and cast to the compute dtype",
        )

    def notes(self, spec: ModelSpec, setup: TrainingSetup) -> list[str]:
        parts = ["its own model code (fused qkv, a head of its own, no tied weights)"]
        if setup.lora is not None:
            parts.append("LoRA weights in the model's dtype")
        if setup.quant is not None:
            parts.append(
                "Lightning's bitsandbytes plugin on every Linear (the head too), quantized "
                "from fp16, no k-bit preparation"
            )
        if setup.loss is LossImpl.CHUNKED:
            parts.append("the head in chunks of 128 positions, chunked_cross_entropy")
        return [f"LitGPT {RELEASE}'s stack: " + "; ".join(parts)]


LITGPT_STACK = LitgptStack()

"""TRL's SFTTrainer: the Hugging Face stack with its release's own loss and metrics.

SFTTrainer is the HF Trainer around a transformers model (llmmem.budget.stacks.hf answers the
rest); its `compute_loss` differs from the Trainer's, release by release (read in
`trl/trainer/sft_trainer.py` of each wheel; the release is `TrainingSetup.trl_version`, and
without it the step is the HF Trainer's):

- up to 0.14 (0.13.0, 0.14.0): no `compute_loss` of its own: the HF Trainer's step;
- 0.15 to 1.14: the model's own loss on the full logits (the HF budget's), then metrics from
  the logits the prepared forward returned, with everything the loss keeps alive beside them
  (`sft_metrics`): mean_token_accuracy's shifted copy and its argmax (0.15.2
  sft_trainer.py:480, 0.29.1 sft_trainer.py:1292, 1303) and, from 0.22, the entropy
  (`entropy_from_logits`, 0.29.1 sft_trainer.py:1241 over the logits, utils.py:600-602 in
  chunks); from 0.22 `compute_loss` passes `use_cache=False` (0.29.1 sft_trainer.py:1210);
- from 1.15: the loss and both metrics through TRL's fused LM head
  (`add_fused_lm_head(..., outputs=("log_probs", "entropy", "is_top1"))`, 1.16.0
  sft_trainer.py:1144-1147; `model(**inputs, fused_lm_head=True)`, sft_trainer.py:1611;
  `per_token_loss = -outputs.log_probs`, 1612; the metrics summed from its outputs,
  1641-1642): no `(rows, seq, vocab)` logits at all (`fused_sft_loss`). `use_liger_kernel`
  keeps only Liger's layer kernels there (`"fused_linear_cross_entropy": False`,
  sft_trainer.py:1140): the loss is the fused head's too. 1.15.0 runs the same code
  (sft_trainer.py:1137, 1586-1609; only Triton's import differs).

Not sized: `compute_loss_func` and label smoothing, which from 1.15 run a full-logits forward
for the loss and the fused head without gradient for the metrics (sft_trainer.py:1593-1609),
and 1.4-1.14's optional `loss_type="chunked_nll"`.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.activations import dtypes_for, head_input_dtype, trainability_for
from llmmem.budget.fused_head_bytes import (
    FIRST_RELEASE,
    VOCAB_CHUNK,
    head_bytes,
    head_weight_bytes,
    shapes,
)
from llmmem.budget.logits import LogitsMoments, logits_hole, logits_moments, own_16bit_loss
from llmmem.budget.setup import LossImpl, Method, TrainingSetup, release
from llmmem.budget.stacks.hf import LossMoments, Stack
from llmmem.models.spec import ModelSpec
from llmmem.units import format_count

# 0.15.2 sft_trainer.py:470: the first release read with a `compute_loss` of its own (0.13.0
# and 0.14.0 have none)
METRICS_FROM = (0, 15)
# 0.22.0 sft_trainer.py:1040 `inputs["use_cache"] = False` and :1048 `entropy_from_logits`
ENTROPY_FROM = (0, 22)
# 0.23.0 utils.py:1505: `entropy_from_logits` flattens the positions and takes 128 at a time
# (0.22.0 utils.py:1476, 1494: `chunk_size=1` over the rows, one sequence at a time)
FLAT_ENTROPY_FROM = (0, 23)
ENTROPY_ROWS = 128
# 1.3.0 sft_trainer.py:1295, 1305: the entropy taken over the shifted contiguous copy, and a
# second copy made for the accuracy (:1349) while the first is still bound to `shift_logits`
COPY_FIRST_FROM = (1, 3)
# 1.6.0 sft_trainer.py:1668, 1678-1679: a view of the shifted logits, which
# `entropy_from_logits` flattens (`logits.reshape(-1, V)`, utils.py: a copy of a batch of
# several rows), argmax on the view
VIEWS_FROM = (1, 6)


def trl_release(setup: TrainingSetup) -> tuple[int, int] | None:
    """The run's TRL release, None where it is not known (or not readable)."""
    if setup.trl_version is None:
        return None
    try:
        return release(setup.trl_version)
    except ValueError:
        return None


def fused_sft_loss(spec: ModelSpec, setup: TrainingSetup) -> LogitsMoments:
    """SFTTrainer's loss and metrics through TRL's fused LM head (1.15 on), at the SFT step's
    moments, in place of the logits term (llmmem.budget.fused_head_bytes for each piece):

    - end of forward: inside the head's forward tiles: the last hidden state, the scored
      positions' copy, the tile buffer, the per-position statistics;
    - start of backward: the head's backward: the saved copy, the fp32 gradients of the hidden
      states and (full fine-tuning) of the head's weight, the backward's tile buffer;
    - the head's backward done: the hidden states' gradient it returned and that gradient
      scattered into the last hidden state's shape.

    The SFT step counts the head's saved input (a Linear keeps it for its weight's gradient)
    and, under autocast over an fp32 head, autocast's 16-bit cast of the head: the fused head
    keeps its own copy of the positions instead and casts one vocabulary chunk per tile, so
    both come off these moments. A flat packed batch (padding-free) is one row."""
    rows, seq = setup.attention_shape
    shaped = replace(setup, batch=rows, seq=seq, packing=None)
    dt = dtypes_for(setup)
    s = shapes(spec, shaped, rows, triton=setup.triton)
    head = head_bytes(spec, shaped, rows, "sft", triton=setup.triton)
    hb, c = dt.residual, dt.compute
    sft_input = (
        head_input_dtype(dt) * setup.tokens * spec.hidden_size
        if trainability_for(spec, setup).linear_inputs_saved
        else 0
    )
    w = head_weight_bytes(setup)
    head_cast = c * spec.vocab_size * spec.hidden_size if dt.autocast and w != c else 0
    taken = sft_input + head_cast
    # the Function's `grad_hidden` in the residual dtype, and its scatter through the mask and
    # the `[:, :-1]` slice into the last hidden state's shape
    returned = hb * (s.positions + setup.tokens) * spec.hidden_size
    count = f"P = {rows}×{s.positions // max(rows, 1)} positions, H = {s.hidden}"
    tile = f"the tile buffer ({c} B × {s.rows} × {VOCAB_CHUNK})"
    fold = "" if setup.triton else " + the fold's fp32 tiles in torch (no Triton)"
    instead = " − the head's saved input" * bool(sft_input) + (
        " − autocast's cast of its weight" if head_cast else ""
    )
    trains = trainability_for(spec, setup).base_trains
    return LogitsMoments(
        forward_end=head.forward - taken,
        backward_start=head.backward - taken,
        head_backward=max(returned - taken, 0),
        formula_forward=(
            f"TRL's fused LM head: {hb} B × P × H (the positions' hidden states, copied and "
            f"saved, {count}) + the last hidden state ({hb} B × rows × s × H) + {tile} + "
            f"P-sized statistics{fold}{instead}"
        ),
        formula_backward=(
            "the fused LM head's backward: the saved copy + fp32 gradients of the hidden "
            "states (4 B × P × H)"
            + (
                f" and of the head's weight (4 B × {format_count(s.vocab)} × {s.hidden})"
                if trains
                else ""
            )
            + f" + {tile}, recomputed{fold}{instead}"
        ),
        formula_head=(
            f"the hidden states' gradient the fused head returns ({hb} B × P × H) and its "
            f"scatter into the last hidden state ({hb} B × N × H){instead}"
        ),
        moment_backward="start of backward: TRL's fused LM head, tile by tile",
    )


def sft_metrics(
    spec: ModelSpec, setup: TrainingSetup, trl: tuple[int, int]
) -> tuple[int, str] | None:
    """What SFTTrainer 0.15-1.14 holds while it takes its metrics from the logits, after the
    loss: the logits the prepared forward returned (accelerate's `convert_outputs_to_fp32`
    makes them fp32 under mixed precision; else the compute dtype), what the loss keeps for
    backward (the fp32 log-softmax; a 16-bit loss's in its dtype; Gemma-2's capped tanh), and
    the metrics' own tensors, of L' = rows × (s − 1) × V shifted logits:

    - accuracy: `outputs.logits[..., :-1, :].contiguous()` (L') and its argmax (int64);
    - 0.22: the entropy one sequence at a time (3 × s × V: the log-softmax, its exp, their
      product) before the accuracy's copy; 0.23-1.2 128 positions at a time;
    - 1.3-1.5: the entropy over the shifted copy (beside it), then a second copy for the
      accuracy made while the first is still bound;
    - 1.6-1.14: the entropy over a view, which `reshape` copies for a batch of several rows.

    None where they are not taken: Liger's loss returns no logits (`if not
    self.args.use_liger_kernel`), torch.compile's fused loss is not sized here."""
    if trl < METRICS_FROM or trl >= FIRST_RELEASE:
        return None
    if setup.loss is not LossImpl.STANDARD or setup.compile:
        return None
    e = dtypes_for(setup).compute
    out = 4 if setup.precision.autocasts else e
    v = spec.vocab_size
    n_v = setup.tokens * v
    rows, seq = setup.attention_shape
    shifted = rows * max(seq - 1, 0)
    kept_by_loss = (e if own_16bit_loss(spec, setup) else 4) * n_v
    capped = e * n_v if spec.final_logit_softcapping is not None else 0
    kept = kept_by_loss + capped + out * n_v
    copy = out * shifted * v
    accuracy = copy + 8 * shifted
    kept_text = (
        f"{out} B × N·V (the logits returned) + {kept_by_loss // max(n_v, 1)} B × N·V (the "
        "loss's log-softmax, kept)" + (" + the capped tanh" if capped else "")
    )
    if trl < ENTROPY_FROM:
        extra, text = accuracy, "the accuracy's shifted copy and argmax"
    elif trl < COPY_FIRST_FROM:
        chunk = seq if trl < FLAT_ENTROPY_FROM else min(ENTROPY_ROWS, setup.tokens)
        entropy = 3 * out * chunk * v
        extra = max(entropy, accuracy)
        text = (
            f"the entropy over {chunk} positions at a time (3 × {out} B × {chunk} × V)"
            if entropy >= accuracy
            else "the accuracy's shifted copy and argmax"
        )
    else:
        entropy = 3 * out * min(ENTROPY_ROWS, shifted) * v
        if trl < VIEWS_FROM:
            extra = max(copy + entropy, 2 * copy + 8 * shifted)
            text = "the shifted copy with the entropy's 128-position chunk, or two copies"
        else:
            extra = (copy if rows > 1 else 0) + entropy
            text = "the entropy's flattened copy of the shifted logits and its 128-position chunk"
    return kept + extra, (
        f"TRL {setup.trl_version} SFTTrainer's metrics after the loss: {kept_text} + {text} "
        f"(N·V = {format_count(setup.tokens)}×{format_count(v)})"
    )


def copies_after_forward(spec: ModelSpec, setup: TrainingSetup) -> int | None:
    """The weight copies once the prepared forward has returned (autocast's cache gone with
    its context): a checkpointed full fine-tune under autocast keeps only the head's 16-bit
    cast (its matmul saved it; the blocks' casts were saved by nothing), a k-bit model only
    its fp32 head's cast (the dequantized weight was a temporary); None: as at the loss."""
    dt = dtypes_for(setup)
    head = 2 * spec.vocab_size * spec.hidden_size
    if setup.quant is not None:
        fp32_head = setup.quant.prepare_for_kbit_training and not setup.quant.embeddings_16bit
        return head if dt.autocast and fp32_head else 0
    if setup.method is Method.FULL and setup.precision.is_autocast and setup.grad_ckpt:
        return head
    return None


class TrlStack(Stack):
    """TRL's SFTTrainer (see the module): the HF stack's answers, but for its loss, its
    metrics and `use_cache`."""

    name = "trl"

    def prepare(self, setup: TrainingSetup) -> TrainingSetup:
        trl = trl_release(setup)
        if trl is not None and trl >= ENTROPY_FROM and setup.use_cache:
            return replace(setup, use_cache=False)  # `inputs["use_cache"] = False`
        return setup

    def loss(self, spec: ModelSpec, setup: TrainingSetup) -> LossMoments | None:
        trl = trl_release(setup)
        if trl is None or not spec.is_causal_lm:
            return None
        if trl >= FIRST_RELEASE and setup.loss in (LossImpl.STANDARD, LossImpl.LIGER):
            return LossMoments(fused_sft_loss(spec, setup), hole_bytes=0)
        metrics = sft_metrics(spec, setup, trl)
        if metrics is None:
            return None
        moments = replace(
            logits_moments(spec, setup),
            after_forward=metrics[0],
            formula_after_forward=metrics[1],
            copies_after_forward=copies_after_forward(spec, setup),
        )
        return LossMoments(moments, hole_bytes=logits_hole(spec, setup))

    def notes(self, spec: ModelSpec, setup: TrainingSetup) -> list[str]:
        trl = trl_release(setup)
        if trl is None:
            return [
                "TRL's SFTTrainer of an unknown release: sized as the HF Trainer's step "
                "(--versions trl=X, or the release installed beside the script, adds its own)"
            ]
        if trl < FIRST_RELEASE or not spec.is_causal_lm:
            return []
        if setup.loss not in (LossImpl.STANDARD, LossImpl.LIGER):
            return []
        notes = [
            f"sft (TRL {setup.trl_version}): the loss, entropy and mean_token_accuracy come "
            f"from TRL's fused LM head, in tiles of 4096 tokens × {VOCAB_CHUNK} vocabulary "
            "entries, without the logits"
        ]
        if setup.loss is LossImpl.LIGER:
            notes.append(
                f"use_liger_kernel: TRL {setup.trl_version} keeps Liger's layer kernels only "
                "(fused_linear_cross_entropy off): the loss is the fused head's"
            )
        if not setup.triton:
            notes.append(
                "no Triton on this device: TRL's fused head scores every position and folds "
                "its tiles in torch, with fp32 temporaries a GPU's kernel does without"
            )
        return notes


TRL_STACK = TrlStack()

"""TRL 1.x's fused LM head: the log-probabilities without the `(rows, seq, vocab)` logits.

From TRL 1.15 on, DPOTrainer, KTOTrainer and GRPOTrainer patch the policy (and the reference
copy) with `add_fused_lm_head` (trl 1.16.0, trl/trainer/utils.py) and call it with
`fused_lm_head=True`: the backbone runs as before, and its last hidden state goes through
`ChunkedLogProbFunction` (trl/kernels/chunked_logprob.py), a custom autograd Function that
projects it through the head one tile at a time, folds each tile into online-logsumexp
statistics and keeps none of it. Its backward recomputes every tile and turns it into the
logits' gradient in place. What that costs, each term with the line it comes from (utils.py is
`add_fused_lm_head`'s `_fused_forward`, the rest chunked_logprob.py):

- P = rows × (s − 1) positions are scored: `hidden_states[:, :-1]` against `labels[:, 1:]`.
  On a device with Triton (CUDA, XPU) only the labelled ones (`hidden_states[mask]`, the
  completion's tokens), elsewhere every one (`hidden_states.reshape(-1, H)`, labels clamped):
  rows × (s − 1) is exact there and an upper bound on a GPU, where the prompts are not scored;
- the Function's input is a copy of those positions' hidden states (`hidden_states[mask]`, or
  the reshape of a non-contiguous slice), in the residual stream's dtype, which
  `ctx.save_for_backward(hidden, weight, ...)` keeps until backward. It takes the place of the
  head's saved input in the SFT step (a Linear head keeps its input only for its weight's
  gradient; this copy is kept under LoRA too);
- the whole last hidden state (rows × s × H) lives while the Function runs (`backbone_outputs`
  is `_fused_forward`'s local) and dies when the forward returns;
- one tile buffer, `mm_buf = torch.empty((min(N, TOKEN_CHUNK_SIZE), chunk_size))` in the
  compute dtype (the autocast dtype under autocast), 4096 × 32768 elements at most
  (`TOKEN_CHUNK_SIZE = 4096`; `_CHUNKED_LOGPROB_CHUNK_SIZE = 32768` in utils.py), allocated at
  the full 32768 columns whatever the vocabulary; forward and backward each make their own;
- `hidden[...].to(compute_dtype)` and `weight[start:end].to(compute_dtype)`: a copy of the
  token chunk and of the vocabulary chunk when their dtype is not the compute dtype (autocast
  over fp32 weights);
- seven fp32 per-position statistics (`running_max` ... `target_logit`), the targets (int64),
  `log_z` and the entropy saved, and the outputs the caller keeps (masked copies): P-sized;
- backward: `grad_hidden` (P × H) and, when the head trains, `grad_weight` (V × H) are
  allocated whole in fp32 before the first tile ("Always accumulate in fp32"); the return
  casts them to the input's and the weight's dtype (`grad_hidden.to(hidden.dtype)`,
  `grad_weight.to(weight.dtype)`: no copy for fp32), with the tile buffer still alive in the
  frame.

On a GPU the fold is Triton's `_forward_kernel` / `_backward_kernel`, working in the tile in
place: nothing else tile-sized. Without Triton (the CPU) `_forward_tile` and `_backward_tile`
fold the tile with torch ops, whose fp32 temporaries `torch_fold_bytes` counts; the budget
does not (it sizes a GPU's step).

Which trainers use it at 1.16: DPOTrainer (policy outputs log_probs, entropy, mean_logits,
is_top1; the reference's log_probs only), KTOTrainer (moved to trl/trainer/, policy outputs
log_probs, entropy, mean_logits), GRPOTrainer (policy outputs log_probs and entropy, the
reference copy's log_probs only; only the completion's tokens are labelled, so on a GPU P is
rows × completion) and RLOOTrainer, SFTTrainer. Not ORPO and CPO (still trl.experimental, full
logits through `selective_log_softmax`) nor RewardTrainer (a score head). This module sizes
DPO's and KTO's steps, and GRPO's head for llmmem.budget.grpo (`scored`: the completion's
positions).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmem.budget.activations import dtypes_for, head_input_dtype, trainability_for
from llmmem.budget.preference import TRL_RELEASE, LogProbMoments, Objective, PreferenceSetup
from llmmem.budget.setup import TrainingSetup, release
from llmmem.models.spec import ModelSpec
from llmmem.units import format_count

# trl/kernels/chunked_logprob.py: `TOKEN_CHUNK_SIZE = 4096` (tokens per tile)
TOKEN_CHUNK = 4096
# trl/trainer/utils.py: `_CHUNKED_LOGPROB_CHUNK_SIZE = 32768` (vocabulary columns per tile)
VOCAB_CHUNK = 32768
# the release that brought the fused head to the trainers: `add_fused_lm_head` is in neither
# trl/trainer/utils.py of 1.0.0 to 1.14.0 (every minor release read), and from 1.15.0 DPO, KTO,
# GRPO and SFT call `fused_lm_head=True`
FIRST_RELEASE = (1, 15)
# the trainers this module sizes with it (GRPO's budget is llmmem.budget.grpo's)
FUSED_OBJECTIVES = frozenset({Objective.DPO, Objective.KTO})


def uses_fused_head(pref: PreferenceSetup) -> bool:
    """Whether the run's trainer takes its log-probabilities through the fused LM head: DPO
    and KTO from TRL 1.15 on (GRPO: llmmem.budget.grpo.uses_fused_head)."""
    return (
        pref.objective in FUSED_OBJECTIVES
        # LLaMA-Factory's own DPO trainer computes its log-probabilities itself
        and getattr(pref, "trainer", "trl") == "trl"
        and release(pref.trl_release or TRL_RELEASE) >= FIRST_RELEASE
    )


@dataclass(frozen=True)
class Shapes:
    positions: int  # P: the positions scored
    rows: int  # the tile's rows: min(P, 4096)
    width: int  # the tile's used columns: min(V, 32768)
    hidden: int  # H
    vocab: int  # V


def shapes(
    spec: ModelSpec,
    setup: TrainingSetup,
    sequences: int,
    scored: int | None = None,
    triton: bool = True,
) -> Shapes:
    """`scored`: the labelled positions a row, where the caller knows them (GRPO labels the
    completion's tokens only). With Triton only those go through the head
    (`hidden_states[mask]`); without it every one of the s − 1 (`.reshape(-1, H)`)."""
    per_row = scored if scored is not None and triton else setup.seq - 1
    positions = sequences * max(min(per_row, setup.seq - 1), 0)
    return Shapes(
        positions,
        min(positions, TOKEN_CHUNK),
        min(spec.vocab_size, VOCAB_CHUNK),
        spec.hidden_size,
        spec.vocab_size,
    )


def _head_weight_bytes(setup: TrainingSetup) -> int:
    # the head is not quantized: its weights are in the compute dtype, or fp32 after
    # prepare_model_for_kbit_training (the residual stream's dtype)
    return setup.precision.weight_bytes if setup.quant is None else dtypes_for(setup).residual


@dataclass(frozen=True)
class HeadBytes:
    """The fused head's own bytes for one call, beside the weights and what the backbone
    keeps."""

    saved: int  # kept from the forward to the backward: the positions' copy, P-sized tensors
    forward: int  # the forward's peak, inside a tile: with the last hidden state and the buffer
    backward: int  # the backward's peak: the saved tensors, the fp32 gradients, the buffer
    no_grad: int  # the same call without gradient (a reference): its forward's peak


def head_bytes(
    spec: ModelSpec,
    setup: TrainingSetup,
    sequences: int,
    objective: Objective = Objective.DPO,
    adapter_reference: bool = False,
    triton: bool = True,
    scored: int | None = None,
) -> HeadBytes:
    """One call of the patched forward with `fused_lm_head=True` over `sequences` rows of
    `setup.seq` tokens, in the step's dtypes (compute c, the residual stream's hb, the head's
    weight w). `scored`: the labelled positions a row (`shapes`)."""
    dt = dtypes_for(setup)
    s = shapes(spec, setup, sequences, scored, triton)
    c, hb, w = dt.compute, dt.residual, _head_weight_bytes(setup)
    p, h, v = s.positions, s.hidden, s.vocab
    # utils.py `hidden_states[mask]` / `.reshape(-1, H)`: the copy saved for backward
    copy = hb * p * h
    # utils.py: `backbone_outputs.last_hidden_state`, alive while the Function runs
    last_hidden = hb * sequences * setup.seq * h
    # `mm_buf = torch.empty((min(N, TOKEN_CHUNK_SIZE), chunk_size), dtype=compute_dtype)`
    buffer = c * s.rows * VOCAB_CHUNK
    # `hidden[token_start:token_end].to(compute_dtype)`, `weight[start:end].to(compute_dtype)`
    casts = (c * s.rows * h if hb != c else 0) + (c * s.width * h if w != c else 0)
    # `running_max` ... `target_logit`: seven fp32 statistics; the int64 targets
    statistics = (7 * 4 + 8) * p
    # `ctx.save_for_backward(..., targets, log_z, entropy)` and the masked outputs the caller
    # keeps (`masked_fill`: log_probs, entropy, mean_logits in fp32, is_top1 a bool; GRPO's
    # policy asks for `outputs=("log_probs", "entropy")`: two fp32)
    outputs = 2 * 4 if objective is Objective.GRPO else 3 * 4 + 1
    saved = copy + (8 + 4 + 4) * p + outputs * p
    # backward: `grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32)`, and
    # `grad_weight` (V × H, fp32) when the head trains; at the return
    # `grad_hidden.to(hidden.dtype)` and `grad_weight.to(weight.dtype)` copy when not fp32,
    # the buffer still alive in the frame; `grad_logprobs.float().contiguous()`: P × 4
    trains = trainability_for(spec, setup).base_trains
    grads = 4 * p * h + (4 * v * h if trains else 0)
    returned = (hb * p * h if hb != 4 else 0) + (w * v * h if trains and w != 4 else 0)
    fold = (
        torch_fold_bytes(spec, setup, sequences, objective, adapter_reference, scored)
        if not triton
        else TorchFold(0, 0, 0)
    )
    forward = last_hidden + copy + buffer + casts + statistics + fold.forward
    return HeadBytes(
        saved=saved,
        forward=forward,
        backward=saved + grads + buffer + max(casts, returned) + 4 * p + fold.backward,
        no_grad=forward - fold.forward + fold.reference,
    )


def fused_head_moments(
    spec: ModelSpec,
    setup: TrainingSetup,
    sequences: int,
    objective: Objective = Objective.DPO,
    adapter_reference: bool = False,
    triton: bool = True,
    scored: int | None = None,
) -> LogProbMoments:
    """The fused head's bytes at the preference step's moments, in place of the logits term
    (`preference._log_prob_moments`' shape): `forward_end` is the policy's head while its
    tiles run (the largest moment of its forward), `reference` what the reference's head
    adds beside the policy's saved tensors (the policy's tiles given back), `backward_peak`
    the Function's backward. `sequences` rows of `setup.seq` tokens go through the policy and
    through the reference (DPO's pairs; KTO's completions, and its KL batch of as many rows
    one pass after the other). `triton=False`: the fold in torch, as on a device without
    Triton (`torch_fold_bytes`); `adapter_reference`: the reference is the policy with its
    adapter disabled (the policy's patched forward, with its outputs); `scored`: the labelled
    positions a row (`shapes`)."""
    dt = dtypes_for(setup)
    s = shapes(spec, setup, sequences, scored, triton)
    head = head_bytes(spec, setup, sequences, objective, adapter_reference, triton, scored)
    c, hb = dt.compute, dt.residual
    count = f"P = {sequences}×{s.positions // max(sequences, 1)} positions, H = {s.hidden}"
    # the SFT step counts the head's saved input (a Linear keeps it for its weight's
    # gradient): the fused head keeps its own copy instead, under LoRA too
    sft_input = (
        head_input_dtype(dt) * sequences * setup.seq * s.hidden
        if trainability_for(spec, setup).linear_inputs_saved and spec.is_causal_lm
        else 0
    )
    # the SFT step counts autocast's 16-bit cast of the head's weight (kept by the head's
    # matmul for its input's gradient, llmmem.budget.phases); the fused head casts one
    # vocabulary chunk at a time (`weight[start:end].to(compute_dtype)`, counted in its
    # casts) and saves the weight itself: that cast is not there
    w = _head_weight_bytes(setup)
    head_cast = c * s.vocab * s.hidden if dt.autocast and w != c and spec.is_causal_lm else 0
    sft_input += head_cast
    tile = f"the tile buffer ({c} B × {s.rows} × {VOCAB_CHUNK})"
    fold = "" if triton else " + the fold's fp32 tiles in torch (no Triton)"
    trains = trainability_for(spec, setup).base_trains
    return LogProbMoments(
        forward_end=head.forward - sft_input,
        reference=head.no_grad - (head.forward - head.saved),
        inside_kernel=0,
        backward_peak=head.backward - sft_input,
        formula_forward=(
            f"the fused LM head (TRL 1.x): {hb} B × P × H (the positions' hidden states, "
            f"copied and saved, {count}) + the last hidden state ({hb} B × rows × s × H) + "
            f"{tile} + P-sized statistics{fold}, in place of the head's saved input"
            + (" and of autocast's cast of its weight" if head_cast else "")
        ),
        formula_reference=(
            "the reference's fused LM head: its last hidden state, the positions' copy and "
            f"{tile}{fold}, beside the policy's saved copy"
        ),
        formula_backward=(
            "the fused LM head's backward: the saved copy + fp32 gradients of the hidden "
            "states (4 B × P × H)"
            + (
                f" and of the head's weight (4 B × {format_count(s.vocab)} × {s.hidden})"
                if trains
                else ""
            )
            + f" + {tile}, recomputed{fold}"
        ),
    )


@dataclass(frozen=True)
class TorchFold:
    forward: int  # the policy's forward tile
    reference: int  # the reference's forward tile
    backward: int  # the backward tile


def torch_fold_bytes(
    spec: ModelSpec,
    setup: TrainingSetup,
    sequences: int,
    objective: Objective = Objective.DPO,
    adapter_reference: bool = False,
    scored: int | None = None,
) -> TorchFold:
    """What `_forward_tile` and `_backward_tile` (the fold in torch, on a device without
    Triton) add beside the tile buffer, in fp32 tiles of E = min(P, 4096) × min(V, 32768):

    - forward: `_torch_transform` makes `z * logit_scale` and `* inv_t` (8 E at most, one
      given back); with `is_top1` asked (DPO's policy) `before_target` (bool, a local kept to
      the end), its negation and `z.masked_fill` (4 E); `torch.exp(z - new_m)` beside its
      argument (z, the difference and e: 12 E); with the entropy asked, `e * z` beside z and
      e (12 E). So 12 E, and 13 E with `before_target` alive (DPO's policy, and the policy
      with its adapter disabled as DPO's reference: the same patched forward);
    - backward: y, z, log_p, p and `grad` (20 E), `is_target` (bool, E), `is_target.float()`
      and its difference with p (8 E): 29 E;
    - in 16 bits `tile.float()` copies the tile first (4 E, given back before the peaks
      above) and `_addmm_fp32` upcasts its operands after the fold's temporaries are gone:
      under 29 E.
    """
    s = shapes(spec, setup, sequences, scored, triton=False)
    e = s.rows * s.width
    dpo = objective is Objective.DPO
    return TorchFold(
        forward=(13 if dpo else 12) * e,
        reference=(13 if dpo and adapter_reference else 12) * e,
        backward=29 * e,
    )

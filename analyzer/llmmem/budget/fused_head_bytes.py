"""The bytes of one call of TRL 1.x's fused LM head, whichever trainer makes it.

TRL 1.15 on patches a causal LM with `add_fused_lm_head` (trl 1.16.0 trl/trainer/utils.py:1548)
and calls it with `fused_lm_head=True`: the backbone runs as before, and its last hidden state
goes through `ChunkedLogProbFunction` (trl/kernels/chunked_logprob.py:299), a custom autograd
Function that projects it through the head one tile at a time, folds each tile into
online-logsumexp statistics and keeps none of it. Its backward recomputes every tile and turns
it into the logits' gradient in place. What one call costs, each term with the line it comes
from (trl 1.16.0; utils.py is `add_fused_lm_head`'s `_fused_forward`, the rest
chunked_logprob.py):

- P positions are scored: `hidden_states[:, :-1]` against `labels[:, 1:]` (utils.py:1618).
  On a device with Triton (CUDA, XPU: `_use_triton`, chunked_logprob.py:48) only the labelled
  ones (`hidden_states[mask]`, utils.py:1645), elsewhere every one (`.reshape(-1, H)`, labels
  clamped): rows × (s − 1) is exact there and an upper bound on a GPU, where prompts, padding
  and (padding-free) each document's first token are not scored;
- the Function's input is a copy of those positions' hidden states (`hidden_states[mask]`, or
  the reshape of a non-contiguous slice), in the residual stream's dtype, which
  `ctx.save_for_backward(hidden, weight, ...)` (chunked_logprob.py:386) keeps until backward;
- the whole last hidden state (rows × s × H) lives while the Function runs (`backbone_outputs`
  is `_fused_forward`'s local, utils.py:1616) and dies when the forward returns;
- one tile buffer, `mm_buf = torch.empty((min(N, TOKEN_CHUNK_SIZE), chunk_size))` in the
  compute dtype (the autocast dtype under autocast; chunked_logprob.py:347), 4096 × 32768
  elements at most (`TOKEN_CHUNK_SIZE = 4096`, chunked_logprob.py:31;
  `_CHUNKED_LOGPROB_CHUNK_SIZE = 32768`, utils.py:1506), allocated at the full 32768 columns
  whatever the vocabulary; forward and backward (chunked_logprob.py:413) each make their own;
- `hidden[...].to(compute_dtype)` and `weight[start:end].to(compute_dtype)`
  (chunked_logprob.py:352, 356, 423): a copy of the token chunk and of the vocabulary chunk
  when their dtype is not the compute dtype (autocast over fp32 weights); in forward the
  vocabulary chunk's copy is the tile matmul's temporary, gone before the tile is folded;
- seven fp32 per-position statistics (`running_max` ... `target_logit`,
  chunked_logprob.py:340-346), the targets (int64), `log_z` and the entropy saved, and what
  the caller keeps of the outputs: P-sized;
- backward: `grad_hidden` (P × H) and, when the head trains, `grad_weight` (V × H) are
  allocated whole in fp32 before the first tile (chunked_logprob.py:406-411, "Always
  accumulate in fp32"); the return casts them to the input's and the weight's dtype
  (chunked_logprob.py:456-457: no copy for fp32), with the tile buffer still alive in the
  frame.

On a GPU the fold is Triton's `_forward_kernel` / `_backward_kernel`, working in the tile in
place: nothing else tile-sized. Without Triton (the CPU) `_forward_tile` and `_backward_tile`
fold the tile with torch ops, whose fp32 temporaries `torch_fold_bytes` counts.

Each trainer asks the head for its own outputs (`add_fused_lm_head(..., outputs=...)`):
`objective` names the trainer ("dpo", "kto", "grpo", "sft"). llmmem.budget.fused_head puts
these bytes into the preference steps, llmmem.budget.grpo into GRPO's, and
llmmem.budget.stacks.trl into SFTTrainer's.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmem.budget.activations import dtypes_for, trainability_for
from llmmem.budget.setup import TrainingSetup
from llmmem.models.spec import ModelSpec

# trl/kernels/chunked_logprob.py:31 `TOKEN_CHUNK_SIZE = 4096` (tokens per tile)
TOKEN_CHUNK = 4096
# trl/trainer/utils.py:1506 `_CHUNKED_LOGPROB_CHUNK_SIZE = 32768` (vocabulary columns per tile)
VOCAB_CHUNK = 32768
# the release that brought the fused head to the trainers: `add_fused_lm_head` is in neither
# trl/trainer/utils.py of 1.0.0 to 1.14.0 (every minor release read), and from 1.15.0 DPO, KTO,
# GRPO and SFT call `fused_lm_head=True` (1.15.0 trl/trainer/sft_trainer.py:1137, 1609)
FIRST_RELEASE = (1, 15)
# the trainers that ask the head for `is_top1` (DPO's policy; SFTTrainer's
# `outputs=("log_probs", "entropy", "is_top1")`, 1.16.0 sft_trainer.py:1144-1147, for its
# mean_token_accuracy): the torch fold keeps a boolean mask per tile for it
ASKS_TOP1 = frozenset({"dpo", "sft"})


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


def head_weight_bytes(setup: TrainingSetup) -> int:
    """The head is not quantized: its weights are in the compute dtype, or fp32 after
    prepare_model_for_kbit_training (the residual stream's dtype)."""
    return setup.precision.weight_bytes if setup.quant is None else dtypes_for(setup).residual


def trainer_name(objective: object) -> str:
    """ "dpo", "grpo", "sft", ...: an objective's value (llmmem.budget.preference.Objective is
    a str Enum) or the name itself."""
    return str(getattr(objective, "value", objective))


def kept_outputs_bytes(objective: str) -> int:
    """Bytes per position of the Function's outputs the caller keeps into backward.

    DPO's policy asks for log_probs, entropy, mean_logits (fp32) and is_top1 (a bool), KTO's
    is counted the same; GRPO's policy for `outputs=("log_probs", "entropy")`: two fp32.
    SFTTrainer's outputs die with `compute_loss` (its loss is `-outputs.log_probs`, whose
    negation and sum keep nothing, sft_trainer.py:1612-1617): only the label mask the
    outputs' `masked_fill(~mask, 0)` / `masked_scatter(mask, x)` keep for their backward, and
    its negation (utils.py:1658-1660)."""
    name = trainer_name(objective)
    if name == "grpo":
        return 2 * 4
    if name == "sft":
        return 2
    return 3 * 4 + 1


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
    objective: str = "dpo",
    adapter_reference: bool = False,
    triton: bool = True,
    scored: int | None = None,
) -> HeadBytes:
    """One call of the patched forward with `fused_lm_head=True` over `sequences` rows of
    `setup.seq` tokens, in the step's dtypes (compute c, the residual stream's hb, the head's
    weight w). `scored`: the labelled positions a row (`shapes`); `objective`: the trainer
    asking (`kept_outputs_bytes`, `torch_fold_bytes`)."""
    dt = dtypes_for(setup)
    s = shapes(spec, setup, sequences, scored, triton)
    c, hb, w = dt.compute, dt.residual, head_weight_bytes(setup)
    p, h, v = s.positions, s.hidden, s.vocab
    # utils.py `hidden_states[mask]` / `.reshape(-1, H)`: the copy saved for backward
    copy = hb * p * h
    # utils.py: `backbone_outputs.last_hidden_state`, alive while the Function runs
    last_hidden = hb * sequences * setup.seq * h
    # `mm_buf = torch.empty((min(N, TOKEN_CHUNK_SIZE), chunk_size), dtype=compute_dtype)`
    buffer = c * s.rows * VOCAB_CHUNK
    # `hidden_chunk = hidden[token_start:token_end].to(compute_dtype)`, a local of the token
    # loop; `weight[start:end].to(compute_dtype)`, in forward a temporary of the tile's matmul
    # (gone before the fold), in backward the local `w_chunk` (alive through it)
    hidden_cast = c * s.rows * h if hb != c else 0
    weight_cast = c * s.width * h if w != c else 0
    casts = hidden_cast + weight_cast
    # `running_max` ... `target_logit`: seven fp32 statistics; the int64 targets
    statistics = (7 * 4 + 8) * p
    # `ctx.save_for_backward(..., targets, log_z, entropy)` and what the caller keeps
    saved = copy + (8 + 4 + 4) * p + kept_outputs_bytes(objective) * p
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
    # inside a tile: its matmul with the vocabulary chunk's cast, then the fold
    in_tiles = last_hidden + copy + buffer + hidden_cast + statistics
    return HeadBytes(
        saved=saved,
        forward=in_tiles + max(weight_cast, fold.forward),
        backward=saved + grads + buffer + max(casts, returned) + 4 * p + fold.backward,
        no_grad=in_tiles + max(weight_cast, fold.reference),
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
    objective: str = "dpo",
    adapter_reference: bool = False,
    scored: int | None = None,
) -> TorchFold:
    """What `_forward_tile` and `_backward_tile` (the fold in torch, on a device without
    Triton; chunked_logprob.py:211, 257) add beside the tile buffer, in fp32 tiles of
    E = min(P, 4096) × min(V, 32768):

    - forward: `_torch_transform` makes `z * logit_scale` and `* inv_t` (8 E at most, one
      given back); with `is_top1` asked (DPO's policy, SFTTrainer) `before_target` (bool, a
      local kept to the end), its negation and `z.masked_fill` (4 E); `torch.exp(z - new_m)`
      beside its argument (z, the difference and e: 12 E); with the entropy asked, `e * z`
      beside z and e (12 E). So 12 E, and 13 E with `before_target` alive (DPO's policy and
      the policy with its adapter disabled as DPO's reference: the same patched forward;
      SFTTrainer's);
    - backward: y, z, log_p, p and `grad` (20 E), `is_target` (bool, E), `is_target.float()`
      and its difference with p (8 E): 29 E;
    - in 16 bits `tile.float()` copies the tile first (4 E, given back before the peaks
      above) and `_addmm_fp32` upcasts its operands after the fold's temporaries are gone:
      under 29 E.
    """
    s = shapes(spec, setup, sequences, scored, triton=False)
    e = s.rows * s.width
    top1 = trainer_name(objective) in ASKS_TOP1
    return TorchFold(
        forward=(13 if top1 else 12) * e,
        reference=(13 if top1 and adapter_reference else 12) * e,
        backward=29 * e,
    )

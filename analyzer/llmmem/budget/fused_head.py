"""TRL 1.x's fused LM head in the preference steps: the log-probabilities without the
`(rows, seq, vocab)` logits.

From TRL 1.15 on, DPOTrainer, KTOTrainer and GRPOTrainer patch the policy (and the reference
copy) with `add_fused_lm_head` and take their log-probabilities through it (what one call of
the head holds, line by line: llmmem.budget.fused_head_bytes). It takes the place of the
head's saved input in the SFT step (a Linear head keeps its input only for its weight's
gradient; the fused head's copy of the positions' hidden states is kept under LoRA too).

Which trainers use it at 1.16: DPOTrainer (policy outputs log_probs, entropy, mean_logits,
is_top1; the reference's log_probs only), KTOTrainer (moved to trl/trainer/, policy outputs
log_probs, entropy, mean_logits), GRPOTrainer (policy outputs log_probs and entropy, the
reference copy's log_probs only; only the completion's tokens are labelled, so on a GPU P is
rows × completion) and RLOOTrainer, SFTTrainer (llmmem.budget.stacks.trl). Not ORPO and CPO
(still trl.experimental, full logits through `selective_log_softmax`) nor RewardTrainer (a
score head). This module sizes DPO's and KTO's steps, and GRPO's head for llmmem.budget.grpo
(`scored`: the completion's positions).
"""

from __future__ import annotations

from llmmem.budget.activations import dtypes_for, head_input_dtype, trainability_for
from llmmem.budget.fused_head_bytes import (
    FIRST_RELEASE,
    TOKEN_CHUNK,
    VOCAB_CHUNK,
    HeadBytes,
    Shapes,
    TorchFold,
    head_bytes,
    head_weight_bytes,
    shapes,
    torch_fold_bytes,
)
from llmmem.budget.preference_setup import TRL_RELEASE, LogProbMoments, Objective, PreferenceSetup
from llmmem.budget.setup import TrainingSetup, release
from llmmem.models.spec import ModelSpec
from llmmem.units import format_count

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
    (`preference_log_probs.log_prob_moments`' shape): `forward_end` is the policy's head while its
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
    w = head_weight_bytes(setup)
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


__all__ = [
    "FIRST_RELEASE",
    "FUSED_OBJECTIVES",
    "TOKEN_CHUNK",
    "VOCAB_CHUNK",
    "HeadBytes",
    "Shapes",
    "TorchFold",
    "fused_head_moments",
    "head_bytes",
    "shapes",
    "torch_fold_bytes",
    "uses_fused_head",
]

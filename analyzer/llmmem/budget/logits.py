"""The logits and the loss: often the largest single item for a large vocabulary.

HF's causal-LM loss upcasts the logits to fp32 and `cross_entropy` saves the fp32 log-softmax.
At the start of backward the saved log-softmax, its incoming gradient and the gradient being
computed are alive at once: three fp32 tensors of batch × seq × vocab, 12 bytes per logit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmmem.budget.activations import dtypes_for
from llmmem.budget.setup import LossImpl, TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.units import format_count

CHUNK_POSITIONS = 128


@dataclass(frozen=True)
class LogitsMoments:
    forward_end: int  # alive when forward returns the loss
    backward_start: int  # the log-softmax backward
    head_backward: int  # the logits' gradient alive while the head computes its gradients
    formula_forward: str
    formula_backward: str
    formula_head: str
    # what the trainer computes from the model's outputs once the forward has returned, before
    # backward (TRL's SFTTrainer metrics: llmmem.budget.stacks.trl): the logits' bytes then,
    # 0 where nothing runs there
    after_forward: int = 0
    formula_after_forward: str = ""
    # the weight copies left then (autocast's cache is gone with the prepared forward's
    # context); None: as when the loss is computed
    copies_after_forward: int | None = None
    # the name of `backward_start`'s moment
    moment_backward: str = "start of backward: log-softmax gradient"


def logits_count(spec: ModelSpec, setup: TrainingSetup) -> int:
    return setup.tokens * spec.vocab_size


def liger_chunk_rows(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Liger's fused linear cross-entropy splits the tokens into chunks of about h/V of them."""
    chunks = max(1, math.ceil(spec.vocab_size / spec.hidden_size))
    rows = math.ceil(setup.tokens / chunks)
    return 1 << max(0, (rows - 1).bit_length())


# Causal LMs whose forward computed its own cross-entropy on the 16-bit logits, with no fp32
# upcast, until transformers 4.49 moved them onto the shared `ForCausalLMLoss` (read in each
# model's modeling file at 4.48.1 and 4.49.0). GPT-J upcast its logits and is not one of them.
OWN_16BIT_LOSS_BEFORE_4_49 = frozenset(
    {"gpt_bigcode", "gpt_neox", "falcon", "bloom", "opt", "gpt_neo", "mpt", "codegen", "dbrx"}
)


def own_16bit_loss(spec: ModelSpec, setup: TrainingSetup) -> bool:
    return (
        setup.loss is LossImpl.STANDARD
        and setup.transformers_release < (4, 49)
        and spec.model_type in OWN_16BIT_LOSS_BEFORE_4_49
        and dtypes_for(setup).compute != 4
    )


def logits_moments(spec: ModelSpec, setup: TrainingSetup) -> LogitsMoments:
    if not spec.is_causal_lm:
        return LogitsMoments(0, 0, 0, "no LM head", "no LM head", "no LM head")
    e = dtypes_for(setup).compute
    n_logits = logits_count(spec, setup)
    count = f"N·V = {format_count(setup.tokens)}×{format_count(spec.vocab_size)}"
    softcap = spec.final_logit_softcapping is not None
    if setup.loss is LossImpl.LIGER:
        rows = liger_chunk_rows(spec, setup)
        chunk = 3 * 4 * rows * spec.vocab_size
        grad_input = 4 * setup.tokens * spec.hidden_size
        text = (
            f"3 × 4 B × {format_count(rows)} rows × V (one chunk) + "
            f"4 B × N·h (input gradient computed in forward)"
        )
        return LogitsMoments(
            chunk + grad_input,
            grad_input,
            grad_input,
            text,
            "4 B × N·h (precomputed input gradient)",
            "4 B × N·h (precomputed input gradient)",
        )
    if setup.loss is LossImpl.CCE:
        return cut_cross_entropy_moments(spec, setup)
    if setup.loss is LossImpl.CHUNKED:
        # cross-entropy per chunk of CHUNK_POSITIONS positions, in the logits' own dtype (as
        # litgpt's chunked_cross_entropy): the logits and each chunk's log-softmax are kept,
        # and only one chunk's gradient spikes at a time
        kept = 2 * e * n_logits
        chunk = 12 * min(CHUNK_POSITIONS, setup.seq) * setup.batch * spec.vocab_size
        text = f"({e} + {e}) B × {count}: logits and log-softmax in the logits' dtype"
        return LogitsMoments(
            kept,
            kept + chunk,
            kept,
            text,
            text + f" + 12 B × one chunk of {CHUNK_POSITIONS} positions",
            text,
        )
    if setup.compile and setup.loss is LossImpl.STANDARD:
        # torch.compile fuses the upcast, the log-softmax and the loss into reductions over
        # the logits: forward keeps the logits alone, and backward's gradient comes out of one
        # kernel in fp32 beside them (an H100 under torch 2.11 with transformers 5.24:
        # bench/gpu/2026-11-26-h100/grid-compile.json, 2 and 6 B × N·V for bf16 logits)
        capped = e if softcap else 0
        text = f"{e + capped} B × {count}: the logits, the loss fused by torch.compile"
        return LogitsMoments(
            (e + capped) * n_logits,
            (e + 4 + capped) * n_logits,
            (e + capped) * n_logits,
            text,
            f"{e + 4 + capped} B × {count}: the logits + their gradient in fp32 (fused loss)",
            f"{e + capped} B × {count}: the logits' gradient in the compute dtype",
        )
    if own_16bit_loss(spec, setup):
        # the shifted copy and the log-softmax in the logits' dtype, beside the logits
        text = f"({e} (logits) + {e} (shifted copy) + {e} (log-softmax)) B × {count}"
        return LogitsMoments(
            3 * e * n_logits,
            3 * e * n_logits,
            2 * e * n_logits,
            text + f": the model's own loss in transformers {setup.transformers_version}",
            f"{3 * e} B × {count}: saved log-softmax + its gradient + the input gradient "
            "(logits' dtype)",
            f"{2 * e} B × {count}: the logits' gradient, scattered into the unshifted shape",
        )
    upcast = 4 if e != 4 else 0
    capped = e if softcap else 0  # tanh of the soft-capped logits is saved
    keeps_16bit, shifted_copy = setup.loss_forward_copies
    if not upcast:
        keeps_16bit = True  # fp32 logits: the upcast is the logits themselves
    shift = 4 if shifted_copy else 0
    forward_per = (e if keeps_16bit else 0) + upcast + shift + 4 + capped
    parts = [f"{e} (logits)"] if keeps_16bit else []
    parts += [f"{upcast} (fp32 copy)"] if upcast else []
    if shift:
        parts += [f"{shift} (shifted fp32 copy, transformers {setup.transformers_version})"]
    parts += ["4 (log-softmax)"] + ([f"{capped} (softcap tanh)"] if capped else [])
    backward_per = 12 + capped
    head_per = 4 + e + capped if e != 4 else 4 + capped
    return LogitsMoments(
        forward_per * n_logits,
        backward_per * n_logits,
        head_per * n_logits,
        f"({' + '.join(parts)}) B × {count}",
        f"{backward_per} B × {count}: saved log-softmax + its gradient + the input gradient (fp32)",
        f"{head_per} B × {count}: the logits' gradient in fp32 and in the compute dtype",
    )


def cut_cross_entropy_moments(spec: ModelSpec, setup: TrainingSetup) -> LogitsMoments:
    """Apple's Cut Cross-Entropy (cut-cross-entropy 25.1.1, axolotl's CutCrossEntropyPlugin):
    the head's matmul and the log-sum-exp run block by block in Triton, and no logit reaches
    global memory. Forward keeps the log-sum-exp (fp32, one a position: cce_lse_forward.py:168),
    the negated target logits it adds it to (fp32: indexed_dot.py:101), the vocabulary's mean
    logit (fp32, one an entry: :176) and the indices of the positions that count (int64:
    `valids`); backward recomputes the logits block by block and writes the hidden states'
    gradient (`torch.zeros_like(e)`, the compute dtype: cce_backward.py:272) and, for a head
    that trains, the head's gradient (counted with the gradients)."""
    e = dtypes_for(setup).compute
    n, vocab = setup.tokens, spec.vocab_size
    kept = 4 * n + 8 * n + 4 * vocab  # lse, valids, logit_avg
    forward = kept + 4 * n  # and the nll being reduced
    grad_input = e * n * spec.hidden_size
    order = 4 * vocab  # the vocabulary's order by mean logit (int32)
    text = "4 B × N (log-sum-exp) + 8 B × N (positions) + 4 B × V (mean logits)"
    return LogitsMoments(
        forward,
        kept + order + grad_input,
        kept + order + grad_input,
        text + " + 4 B × N (the losses): no logits (Cut Cross-Entropy)",
        text + f" + 4 B × V (its order) + {e} B × N·h (the hidden states' gradient)",
        f"{e} B × N·h: the hidden states' gradient, written block by block",
        moment_backward="start of backward: Cut Cross-Entropy's blockwise gradient",
    )


def logits_hole(spec: ModelSpec, setup: TrainingSetup) -> int:
    """The 16-bit logits' block, freed at the start of backward and too small for the fp32
    tensors that follow: the caching allocator keeps it reserved, unused, until the logits'
    16-bit gradient fits into it. Only the standard loss upcasts whole 16-bit logits."""
    if not spec.is_causal_lm or setup.loss is not LossImpl.STANDARD or setup.compile:
        return 0  # (torch.compile's fused loss makes no fp32 copy)
    if own_16bit_loss(spec, setup) or all(setup.loss_forward_copies):
        # transformers 4.46-4.48 (and the 16-bit losses): the 16-bit logits stay allocated
        # beside the fp32 copies until forward's end, the allocated peak, and the backward's
        # fp32 tensors fit into the copies' freed blocks
        return 0
    e = dtypes_for(setup).compute
    return e * logits_count(spec, setup) if e != 4 else 0

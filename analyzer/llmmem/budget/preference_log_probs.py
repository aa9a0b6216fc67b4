"""The log-probabilities of the DPO family's trainers (DPO, IPO, ORPO, CPO/SimPO, KTO): their
logits, shifted copies and log-softmax at the end of the policy's forward, beside the
reference's, and inside their backward, as `LogProbMoments`.

Each trainer's own code: TRL 0.29.1's `selective_log_softmax` over shifted copies, TRL 1.6 to
1.14's on views, trl.experimental's ORPO and CPO (a view and the chosen half's cross-entropy),
LLaMA-Factory 0.9.5's fp32 logits and full log_softmax (DPO and KTO); Gemma-2's soft-capping on
top. llmmem.budget.preference places them in the step's phases; TRL 1.x's fused LM head is
llmmem.budget.fused_head's.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.activations import dtypes_for
from llmmem.budget.preference_setup import LogProbMoments
from llmmem.budget.setup import TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.units import format_count


def log_prob_moments(
    spec: ModelSpec,
    setup: TrainingSetup,
    sequences: int,
    fp32: bool = False,
    reference_fp32: bool | None = None,
    chosen_nll: bool = False,
    trainer: str = "trl",
    cross_entropy: bool = True,
    views: bool = False,
) -> LogProbMoments:
    """`selective_log_softmax` over `sequences` rows of `setup.seq` tokens (trl 0.29.1,
    trl/trainer/utils.py), measured on CPU in tests/budget/test_preference.py.

    L = rows × s × V logits in the compute dtype e (the model is called without labels: no
    loss upcasts them), or in fp32 when `fp32` (accelerate's mixed precision converts the
    prepared model's outputs; `reference_fp32` the same for the reference's, default `fp32`);
    L' = rows × (s − 1) × V for the shifted copy. At the end of the loss call the
    logits (held by the output), the shifted copy and, for 16-bit logits, the per-row
    log-softmax autograd keeps are alive. In backward fp32 logits peak at four L'-sized fp32
    tensors (the saved copy, the gather's scattered gradient, the per-row logsumexp gradients
    accumulated into one buffer, and the next row's); 16-bit ones at two (the saved
    log-softmax and the gradient buffer).

    `chosen_nll`: ORPO's and CPO's step at TRL 0.29 (trl/experimental/orpo/orpo_trainer.py,
    cpo/cpo_trainer.py `concatenated_forward` and `get_batch_logps`), which `_orpo_moments`
    follows instead; `cross_entropy=False` is CPO's with `cpo_alpha=0`, whose
    `concatenated_forward` skips the chosen half's cross-entropy. `trainer="llamafactory"`:
    LLaMA-Factory's own trainer, which `_llamafactory_moments` follows."""
    if trainer == "llamafactory-kto":
        moments = _llamafactory_kto_moments(spec, setup, sequences)
    elif trainer == "llamafactory":
        moments = _llamafactory_moments(spec, setup, sequences, fp32, reference_fp32)
    elif views:
        moments = _dpo_view_moments(spec, setup, sequences, fp32, reference_fp32)
    else:
        moments = _log_prob_moments(
            spec, setup, sequences, fp32, reference_fp32, chosen_nll, cross_entropy
        )
    if spec.final_logit_softcapping is None:
        return moments
    # Gemma-2's soft-capped logits (`tanh(logits / cap) * cap` inside the model's forward):
    # the policy's tanh output, in the model's compute dtype, is kept for backward from the
    # forward's end until the capping's backward runs, after the log-probabilities'
    compute = dtypes_for(setup).compute
    capped = compute * sequences * setup.seq * spec.vocab_size
    text = f" + {compute} B × L (the soft-capping's tanh, kept)"
    kept = moments.kept_for_reference
    return replace(
        moments,
        forward_end=moments.forward_end + capped,
        backward_peak=moments.backward_peak + capped,
        formula_forward=moments.formula_forward + text,
        formula_backward=moments.formula_backward + text,
        kept_for_reference=None if kept is None else kept + capped,
        formula_kept=moments.formula_kept + (text if kept is not None else ""),
    )


def _logit_sizes(
    spec: ModelSpec,
    setup: TrainingSetup,
    sequences: int,
    fp32: bool,
    reference_fp32: bool | None,
) -> tuple[int, int, int, int, int, int, str]:
    """The log-probabilities' sizes: the compute dtype's bytes, the policy's and the
    reference's bytes per logit, L = rows × s × V and L' = rows × (s − 1) × V elements, one
    row's (s − 1) × V, and L's text."""
    compute = dtypes_for(setup).compute
    e = 4 if fp32 else compute
    r = 4 if (fp32 if reference_fp32 is None else reference_fp32) else compute
    vocab = spec.vocab_size
    row = max(setup.seq - 1, 0) * vocab
    count = f"L = {sequences}×{setup.seq}×{format_count(vocab)}"
    return compute, e, r, sequences * setup.seq * vocab, sequences * row, row, count


def _log_prob_moments(
    spec: ModelSpec,
    setup: TrainingSetup,
    sequences: int,
    fp32: bool,
    reference_fp32: bool | None,
    chosen_nll: bool,
    cross_entropy: bool = True,
) -> LogProbMoments:
    compute, e, r, whole, shifted, row, count = _logit_sizes(
        spec, setup, sequences, fp32, reference_fp32
    )
    converted = " (accelerate's fp32 outputs)" if compute != 4 else ""
    if chosen_nll:
        pairs = sequences // 2
        text = count + (converted if e == 4 else "")
        if not cross_entropy:
            return _view_moments(e, whole, shifted, row, text, compute if e != compute else 0)
        return _orpo_moments(e, whole, shifted, pairs, row, text)
    if e == 4:
        forward = 4 * whole + 4 * shifted
        forward_text = f"4 B × {count} (fp32 logits{converted}) + 4 B × L' (the shifted copy, kept)"
        backward = 16 * shifted
        backward_text = (
            "16 B × L' (the saved shifted copy, the gather's gradient, the logsumexp "
            "gradients' buffer and one row's)"
        )
    else:
        forward = e * whole + 2 * e * shifted
        forward_text = (
            f"{e} B × {count} (logits) + {e} B × L' (shifted copy) + {e} B × L' "
            "(per-row log-softmax, kept)"
        )
        backward = 2 * e * shifted
        backward_text = f"{2 * e} B × L' (the saved log-softmax and its gradient buffer)"
    # one row at a time: fp32 logsumexp makes a row-sized temporary inside the kernel
    # (aten's logsumexp: `(self - maxes).exp_()` before the sum); a 16-bit row's log_softmax
    # is its own output
    row_bytes = 4 * row if r == 4 else r * row
    reference = r * whole + r * shifted + row_bytes
    reference_text = f"{r} B × L (the reference's logits) + {r} B × L' (their shifted copy) + " + (
        "one row's logsumexp temporary" if r == 4 else "one row's log-softmax"
    )
    return LogProbMoments(
        forward,
        reference,
        row_bytes if r == 4 else 0,
        backward,
        forward_text,
        reference_text,
        backward_text,
    )


KERNEL_COPY_TEXT = " + 4 B × L' (the kernel's contiguous copy of the strided view)"


def _llamafactory_moments(
    spec: ModelSpec,
    setup: TrainingSetup,
    sequences: int,
    fp32: bool,
    reference_fp32: bool | None,
) -> LogProbMoments:
    """LLaMA-Factory 0.9.5's log-probabilities (llamafactory/train/dpo/trainer.py
    `concatenated_forward`: `model(...).logits.to(torch.float32)`; trainer_utils.py
    `get_batch_logps`: `torch.gather(logits[:, :-1, :].log_softmax(-1), 2, labels)`), the
    policy's with gradient, then the reference's under `no_grad` (`compute_reference_log_probs`,
    its outputs freed as it returns). With L = rows × s × V and L' = rows × (s − 1) × V, all
    fp32 whatever the compute dtype (the cast makes an fp32 copy of 16-bit logits, which die
    with the model's output; accelerate's mixed precision has made them fp32 already):

    - the policy keeps its logits (returned, and read by the metrics' means) and the
      log_softmax (saved by its backward; the gather saves only its index): 4 B × (L + L');
    - the log_softmax runs on a strided view (two or more rows): CUDA's kernel
      (aten/src/ATen/native/cuda/SoftMax.cu `host_softmax`: `input_.contiguous()`) first makes
      a contiguous copy, 4 B × L', inside the kernel: a dispatch-level counter cannot see it;
    - the reference adds the same beside the policy's: its fp32 logits, the log_softmax and
      the kernel's copy (16-bit reference logits not converted by accelerate: their fp32 cast
      beside them first, which is smaller);
    - backward: the saved log_softmax, the gather's gradient (scattered into zeros) and the
      log_softmax's input gradient, 12 B × L'; the slicing's gradient (4 B × L, zeros with
      the L' rows copied in) comes after the first two are freed.

    Measured on the CPU with the step restated (llmmem.verify.preference_grid, trainer
    "llamafactory") and against LLaMA-Factory's own trainer (bench/llamafactory_trainers.py)."""
    compute = dtypes_for(setup).compute
    vocab = spec.vocab_size
    whole = sequences * setup.seq * vocab
    shifted = sequences * max(setup.seq - 1, 0) * vocab
    strided = sequences > 1
    inside = 4 * shifted if strided else 0
    r16 = not (fp32 if reference_fp32 is None else reference_fp32) and compute != 4
    count = f"L = {sequences}×{setup.seq}×{format_count(vocab)}"
    copy_text = KERNEL_COPY_TEXT if strided else ""
    forward = 4 * whole + 4 * shifted + inside
    forward_text = (
        f"4 B × {count} (fp32 logits) + 4 B × L' (the full log_softmax, kept)" + copy_text
    )
    reference = 4 * whole + 4 * shifted + inside
    reference_text = (
        "4 B × L (the reference's fp32 logits"
        + (", cast from 16-bit" if r16 else "")
        + ") + 4 B × L' (its log_softmax)"
        + copy_text
    )
    backward = 12 * shifted
    backward_text = (
        "12 B × L' (the saved log_softmax, the gather's gradient and the log_softmax's input "
        "gradient)"
    )
    return LogProbMoments(
        forward,
        reference,
        inside,
        backward,
        forward_text,
        reference_text,
        backward_text,
        inside_forward=inside,
    )


def _llamafactory_kto_moments(spec: ModelSpec, setup: TrainingSetup, rows: int) -> LogProbMoments:
    """LLaMA-Factory 0.9.5's KTO step (llamafactory/train/kto/trainer.py): `forward` casts each
    batch's logits to fp32 and takes `get_batch_logps`' full log_softmax of their shifted view;
    `concatenated_forward` runs the completions with gradient, then the KL batch under
    `no_grad`, then copies the completions' logits by boolean masks (chosen, rejected);
    `compute_reference_log_probs` runs the same under `no_grad`. With L = rows × s × V and
    L' = rows × (s − 1) × V (rows: the completions; the KL batch has as many), all fp32:

    - the policy peaks inside the KL batch's log_softmax: the completions' logits and their
      kept log_softmax, the KL batch's logits and log_softmax, and the kernel's contiguous
      copy of the strided view (two or more rows; inside the kernel): 4 B × (2L + 2L') + 4 B × L';
    - when the reference starts the policy holds the masked copies of its logits (L) and the
      kept log_softmax (L');
    - the reference peaks inside its KL batch's log_softmax, its completions' logits alive:
      4 B × (2L + L') + the kernel's copy;
    - backward is DPO's: 12 B × L'."""
    vocab = spec.vocab_size
    whole = rows * setup.seq * vocab
    shifted = rows * max(setup.seq - 1, 0) * vocab
    inside = 4 * shifted if rows > 1 else 0
    copy_text = KERNEL_COPY_TEXT if inside else ""
    count = f"L = {rows}×{setup.seq}×{format_count(vocab)}"
    reference = 8 * whole + 4 * shifted
    reference_text = (
        "4 B × 2L (the reference's completion and KL logits) + 4 B × L' (the KL batch's "
        "log_softmax)" + copy_text
    )
    # on the GPU the larger of the moments; a storage counter sees the kernel's copy in none
    total, visible = reference + inside, reference
    if spec.final_logit_softcapping is not None:
        # Gemma-2's capping (`logits / cap`, `tanh`, `* cap`) in the KL batch's forward: its
        # head's output and the division's, beside the completions' fp32 logits
        compute = dtypes_for(setup).compute
        capping = 4 * whole + 2 * compute * whole
        visible = max(visible, capping)
        if capping > total:
            total = capping
            reference_text = (
                f"4 B × L (the reference's completion logits) + 2 × {compute} B × L (the KL "
                "batch's head output and its division by the cap)"
            )
    return LogProbMoments(
        8 * whole + 8 * shifted + inside,
        total,
        total - visible,
        12 * shifted,
        f"4 B × 2 × {count} (the completions' and the KL batch's fp32 logits) + 4 B × 2 × L' "
        "(their log_softmax, the completions' kept)" + copy_text,
        reference_text,
        "12 B × L' (the saved log_softmax, the gather's gradient and the log_softmax's input "
        "gradient)",
        inside_forward=inside,
        kept_for_reference=4 * whole + 4 * shifted,
        formula_kept=f"4 B × {count} (the masked copies of the policy's logits) + 4 B × L' "
        "(the kept log_softmax)",
    )


def _orpo_moments(
    e: int, whole: int, shifted: int, pairs: int, row: int, count: str
) -> LogProbMoments:
    """ORPO's (and CPO's, `cpo_alpha` > 0) log-probabilities at TRL 0.29.1: the chosen half's
    NLL is `nn.CrossEntropyLoss` over `logits[:n_chosen][..., :-1, :].contiguous()` (a copy
    of that half, freed when the loss is made; its log_softmax kept for backward), and
    `get_batch_logps` takes `selective_log_softmax` of the view `logits[:, :-1, :]`: no
    shifted copy. With e-byte logits, L' = rows × (s − 1) × V and H = L'/2 (the chosen half),
    as measured on the CPU, on the grid's restated step (tests/budget/test_preference.py) and
    on TRL's own trainer (bench/trl_trainers.py):

    - fp32 logits: the forward peaks inside the cross-entropy (L, the copy H and its
      log_softmax H); backward at L (kept by the per-row logsumexp's saved rows) + H (the
      saved log_softmax) + three L'-sized gradients (the gather's, the rows' logsumexp
      gradients stacked, and their sum);
    - 16-bit logits: the per-row log_softmax outputs (L') are kept beside the logits and the
      cross-entropy's H; backward peaks at three L-sized gradients of the logits (the
      log-probabilities', the cross-entropy's, and their sum), the saved tensors given back.

    With one pair the chosen half's slice is already contiguous and `.contiguous()` copies
    nothing; the fp32 forward then peaks at the per-row logsumexp of the view, whose
    row-sized temporary (aten's `(self - maxes).exp_()`, inside the kernel) is as large as the
    copy would be: the same bytes, of which `inside_kernel` is what a dispatch-level counter
    cannot see. There is no reference model: `reference` is 0."""
    half = pairs * row
    inside = 0
    if e == 4:
        forward = 4 * whole + 8 * half
        forward_text = (
            f"4 B × {count} (fp32 logits) + 4 B × L'/2 (the chosen half's shifted copy, inside "
            "its cross-entropy) + 4 B × L'/2 (that cross-entropy's log_softmax, kept)"
        )
        if pairs == 1:
            inside = 4 * row
            forward_text = (
                f"4 B × {count} (fp32 logits) + 4 B × L'/2 (the chosen sequence's "
                "cross-entropy log_softmax, kept) + 4 B × (s − 1) × V (one row's logsumexp "
                "temporary)"
            )
        backward = 4 * whole + 12 * shifted + 4 * half
        backward_text = (
            "4 B × L (kept by the per-row logsumexp's saved rows) + 4 B × L'/2 (the "
            "cross-entropy's log_softmax) + 12 B × L' (the gather's gradient, the rows' "
            "logsumexp gradients stacked, and their sum)"
        )
    else:
        forward = e * whole + e * half + e * shifted
        forward_text = (
            f"{e} B × {count} (logits) + {e} B × L'/2 (the chosen half's cross-entropy "
            f"log_softmax, kept) + {e} B × L' (per-row log-softmax of the view, kept)"
        )
        backward = 3 * e * whole
        backward_text = (
            f"{3 * e} B × L (the logits' gradients from the log-probabilities and from the "
            "cross-entropy, and their sum)"
        )
    return LogProbMoments(forward, 0, inside, backward, forward_text, "", backward_text)


def _view_moments(
    e: int, whole: int, shifted: int, row: int, count: str, converted: int = 0
) -> LogProbMoments:
    """CPO's log-probabilities with `cpo_alpha=0` at TRL 0.29.1
    (trl/experimental/cpo/cpo_trainer.py `concatenated_forward`: `nll_loss =
    torch.tensor(0.0)`; `get_batch_logps`: `selective_log_softmax` of the view
    `logits[:, :-1, :]`): ORPO's moments without the chosen half's cross-entropy, as measured
    on the CPU (llmmem.verify.preference_grid, objective "simpo"):

    - fp32 logits: the logits, kept by the per-row logsumexp's saved rows, and one row's
      logsumexp temporary inside the kernel; backward at L + three L'-sized gradients (the
      gather's, the rows' logsumexp gradients stacked, and their sum);
    - 16-bit logits: the per-row log_softmax outputs (L') kept beside the logits; backward at
      the logits' gradient (L) beside the saved outputs (L').

    Without the cross-entropy's copy the forward can peak earlier, where accelerate's
    `convert_outputs_to_fp32` makes the fp32 logits while the model's 16-bit ones (`converted`
    bytes a logit) are still alive."""
    if e == 4:
        inside = 4 * row
        if converted * whole > inside:
            return LogProbMoments(
                4 * whole + converted * whole,
                0,
                0,
                4 * whole + 12 * shifted,
                f"4 B × {count} + {converted} B × L (the model's {8 * converted}-bit logits, "
                "alive while accelerate converts them)",
                "",
                "4 B × L (kept by the per-row logsumexp's saved rows) + 12 B × L' (the "
                "gather's gradient, the rows' logsumexp gradients stacked, and their sum)",
            )
        return LogProbMoments(
            4 * whole + inside,
            0,
            inside,
            4 * whole + 12 * shifted,
            f"4 B × {count} (fp32 logits, kept by the per-row logsumexp) + 4 B × (s − 1) × V "
            "(one row's logsumexp temporary)",
            "",
            "4 B × L (kept by the per-row logsumexp's saved rows) + 12 B × L' (the gather's "
            "gradient, the rows' logsumexp gradients stacked, and their sum)",
        )
    return LogProbMoments(
        e * whole + e * shifted,
        0,
        0,
        e * whole + e * shifted,
        f"{e} B × {count} (logits) + {e} B × L' (per-row log-softmax of the view, kept)",
        "",
        f"{e} B × L (the logits' gradient) + {e} B × L' (the saved per-row log-softmax)",
    )


def _dpo_view_moments(
    spec: ModelSpec,
    setup: TrainingSetup,
    sequences: int,
    fp32: bool,
    reference_fp32: bool | None,
) -> LogProbMoments:
    """TRL 1.6 to 1.14's DPOTrainer (trl/trainer/dpo_trainer.py `_compute_loss`):
    `selective_log_softmax(outputs.logits[..., :-1, :], ...)` for the policy and under
    `no_grad` for the reference, on views, no shifted copies. The policy's moments are CPO's
    without its cross-entropy (`_view_moments`: the same call on the same view, measured on the
    CPU as the grid's "simpo" step); the reference adds its logits and one row's temporary."""
    compute, e, r, whole, shifted, row, count = _logit_sizes(
        spec, setup, sequences, fp32, reference_fp32
    )
    policy = _view_moments(e, whole, shifted, row, count, compute if e != compute else 0)
    reference = r * whole + (4 * row if r == 4 else r * row)
    # what the policy still holds when the reference runs: its logits (and, in 16 bits, the
    # per-row log-softmax outputs), not the model's 16-bit logits accelerate converted from
    kept = e * whole + (e * shifted if e != 4 else 0)
    return replace(
        policy,
        reference=reference,
        inside_kernel=4 * row if r == 4 else 0,
        inside_forward=policy.inside_kernel,
        kept_for_reference=kept,
        formula_kept=f"{e} B × {count} (the policy's logits)"
        + (f" + {e} B × L' (its per-row log-softmax, kept)" if e != 4 else ""),
        formula_reference=f"{r} B × L (the reference's logits) + "
        + ("one row's logsumexp temporary" if r == 4 else "one row's log-softmax"),
    )

"""Preference training (DPO, IPO, ORPO, CPO/SimPO, KTO) and reward models, on top of the SFT step.

The step of TRL's preference trainers is an SFT step with four differences, each read in TRL's
code (trl 0.29.1: `trl/trainer/dpo_trainer.py` `DPOTrainer._compute_loss` and
`DataCollatorForPreference`; `trl/trainer/utils.py` `selective_log_softmax`;
`trl/experimental/orpo/orpo_trainer.py`; `trl/trainer/reward_trainer.py`
`RewardTrainer.compute_loss`):

- chosen and rejected are concatenated into one batch: 2 × micro-batch sequences go through the
  policy, each `max_length` long at most (prompt and completion, truncated by the collator);
- the model is called without labels, so no loss upcasts the logits; they come back in the
  compute dtype, or in fp32 under accelerate's mixed precision (see below);
  `logits[..., :-1, :].contiguous()` makes a shifted copy, and `selective_log_softmax`
  takes the label's log-probability row by row (fp32 logits: gather and a per-row logsumexp;
  16-bit logits: a per-row `log_softmax`, whose output autograd keeps);
- the reference forward runs inside the same loss call, after the policy's forward, under
  `torch.no_grad()`: the policy's saved tensors and its logits are all alive while it runs. The
  reference is a second frozen copy of the weights (full fine-tuning, `ref_model=None` or given),
  the policy with its adapter disabled (PEFT, `ref_model=None`: no copy), or nothing during
  training (`precompute_ref_log_probs=True`: a pass over the data before training);
- ORPO, CPO and SimPO have no reference model; KTO adds a KL batch (mismatched prompt and
  completion pairs) whose log-probabilities are taken without gradient, by the policy and by the
  reference; a reward model is a sequence-classification model (`num_labels=1`): a score head of
  hidden × num_labels instead of the vocabulary head, and no vocabulary logits.

Accelerate's mixed precision (`bf16=True` or `fp16=True` in the config, TRL's default `bf16=True`
unless `fp16`) wraps the forward of every model the accelerator prepares in
`convert_outputs_to_fp32` (accelerate 1.15.0, `Accelerator.prepare_model` when `native_amp`;
`utils/operations.py` `convert_to_fp32`), whatever the weights' dtype: the 16-bit logits come
back as an fp32 copy (the 16-bit ones die with the model's output, nothing saves them). TRL
prepares the reference copy the same way (`accelerator.prepare_model(ref_model,
evaluation_mode=True)`), except under DeepSpeed and FSDP (`prepare_deepspeed`, `prepare_fsdp`:
its forward is left as it is); the adapter-disabled reference is the prepared policy itself.
Under DeepSpeed accelerate turns `native_amp` off: no model's outputs are converted. A causal
LM's SFT step is not changed the same way: its loss upcasts the logits to fp32 inside the
forward anyway, and the output's fp32 copy is made after that loss's own copy is freed.

Two moments are TRL 0.29's own code and are counted only when `PreferenceSetup.trl_release`
is a 0.29 release (None: 0.29): DPOTrainer (rewritten in 0.29) logs metrics after the loss, in
the same call, with the policy's and the reference's logits and shifted copies alive
(`entropy_from_logits` over 128-row chunks, a mask copy of the chosen completions' logits),
and the step peaks there where the reference's logits are large; trl.experimental's ORPO and
CPO trainers take the log-probabilities on a view of the logits (no shifted copy, but the
logits stay alive through backward) and add the chosen half's cross-entropy over a shifted copy
of that half. Both were found running the trainers themselves (bench/trl_trainers.py).

TRL 1.x replaced the full logits by a fused, tiled LM head (`add_fused_lm_head` in
trl/trainer/utils.py at 1.16.0): the logits are never whole there. This module follows the 0.x
trainers, read at 0.29.1 (KTO: trl/experimental/kto/kto_trainer.py); where the run's TRL is 1.x,
DPO's and KTO's log-probabilities are llmmem.budget.fused_head's instead.

GRPO (generation inside the step, vLLM) is budgeted in llmmem.budget.grpo, reached from here
through `PreferenceSetup.grpo`; PPO (a value model trained beside the policy, a reference and a
reward model, generation inside the step) in llmmem.budget.ppo, through `PreferenceSetup.ppo`.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget import fused_head
from llmmem.budget.activations import (
    dtypes_for,
    eager_mask_kinds,
    estimate_activations,
    linear_position,
    trainability_for,
)
from llmmem.budget.fused_head import uses_fused_head
from llmmem.budget.grpo import GrpoSetup, estimate_grpo_budget
from llmmem.budget.grpo import reference_of as grpo_reference
from llmmem.budget.phases import estimate_budget
from llmmem.budget.ppo import PpoSetup, estimate_ppo_budget
from llmmem.budget.ppo import reference_of as ppo_reference
from llmmem.budget.preference_moments import (
    backward_phase,
    budget_from_phases,
    last_block_moment,
    later_backward_moments,
    reference_copy_term,
    replace_logits,
    reward_spec,
    with_terms,
)
from llmmem.budget.preference_setup import (
    MODELLED,
    TRL_RELEASE,
    WITH_REFERENCE,
    LogProbMoments,
    Objective,
    PreferenceSetup,
    Reference,
    fp32_outputs,
    policy_under_autocast,
    reference_fp32_outputs,
)
from llmmem.budget.result import Budget, Component, GpuTarget, Phase, PhaseBudget, Term
from llmmem.budget.setup import Method, SetupError, TrainingSetup, release
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes, format_count


def reference_for(pref: PreferenceSetup, setup: TrainingSetup) -> Reference:
    """How the reference log-probabilities are made: as asked, else TRL's default. Under PEFT
    with `ref_model=None` TRL disables the adapter (trl/trainer/dpo_trainer.py: `use_adapter`);
    in full fine-tuning it loads a second copy of the model. GRPO's follows `beta`."""
    if pref.objective is Objective.GRPO:
        return grpo_reference(pref.grpo or GrpoSetup(), setup)
    if pref.objective is Objective.PPO:
        ppo = pref.ppo or PpoSetup()
        if pref.reference is not None and ppo.reference is None:
            ppo = replace(ppo, reference=pref.reference)
        return ppo_reference(ppo, setup)
    if pref.objective not in WITH_REFERENCE:
        return Reference.NONE
    if pref.reference is not None:
        if pref.reference is Reference.ADAPTER and setup.method is Method.FULL:
            raise SetupError(
                "the reference can be the adapter-disabled policy only with LoRA/QLoRA: full "
                "fine-tuning needs a reference copy or precompute_ref_log_probs"
            )
        return pref.reference
    return Reference.COPY if setup.method is Method.FULL else Reference.ADAPTER


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


def dpo_metrics_bytes(spec: ModelSpec, setup: TrainingSetup, sequences: int, e: int) -> int:
    """What TRL 0.29.1's `DPOTrainer._compute_loss` allocates for its metrics after the loss,
    with the policy's (and the reference's) logits and shifted copies still alive: the larger
    of `entropy_from_logits` on the shifted logits (trl/trainer/utils.py: `log_softmax`,
    `exp` and their product over chunks of 128 rows of the flattened logits, three chunks at
    once) and the boolean-mask copy of the chosen completions' logits for their mean
    (`chosen_logits[chosen_mask.bool()]`: every position of a chosen sequence counted, an
    upper bound, as prompts and padding are not copied). e: bytes per logit."""
    positions = sequences * max(setup.seq - 1, 0)
    chunk = min(128, positions)
    chosen = (sequences // 2) * max(setup.seq - 1, 0)
    return e * spec.vocab_size * max(3 * chunk, chosen)


def _metrics_phase(
    spec: ModelSpec,
    setup: TrainingSetup,
    phase: PhaseBudget,
    reference_row: int,
    rows: int,
    e: int,
    views: bool = False,
) -> PhaseBudget:
    """DPO's metrics moment (TRL 0.29): `phase` (the reference forward, or the policy's forward
    without a reference in the step) with the reference's one-row temporary (`reference_row`
    bytes) given back and the metrics' tensors made, or `phase` where it is larger."""
    extra = dpo_metrics_bytes(spec, setup, rows, e)
    if views:
        # `entropy_from_logits` reshapes the strided view of the logits: a copy of it, beside
        # its three chunks (the chosen rows' mask copy comes after the copy is freed)
        positions = rows * max(setup.seq - 1, 0)
        chunk = min(128, positions)
        extra = max(e * spec.vocab_size * (positions + 3 * chunk), extra)
    parts = dict(phase.components)
    temporaries = parts.get(Component.TEMPORARIES)
    kept = 0
    text = ""
    if temporaries is not None:
        given_back = reference_row if phase.phase is Phase.REFERENCE_FORWARD else 0
        kept = temporaries.bytes - given_back
        text = temporaries.formula + (" (its row's given back)" if given_back else "") + " + "
    chunk = min(128, rows * max(setup.seq - 1, 0))
    parts[Component.TEMPORARIES] = Term(
        bytes=kept + extra,
        formula=text
        + f"DPO's metrics (TRL 0.29): {e} B × V × max(3 × {chunk} rows (entropy_from_logits' "
        "chunks), the chosen completions' rows (their mask copy))",
    )
    metrics = PhaseBudget(
        phase=phase.phase,
        moment="DPO's metrics after the loss (TRL 0.29: entropy_from_logits), the logits alive",
        components=parts,
    )
    return metrics if metrics.allocated_bytes > phase.allocated_bytes else phase


def sequences_per_step(pref: PreferenceSetup, setup: TrainingSetup) -> int:
    """The sequences one micro-batch puts through the policy with gradient: chosen and
    rejected concatenated (DPO, ORPO, CPO, reward), or the batch itself (KTO: unpaired)."""
    if pref.objective is Objective.KTO:
        return setup.batch
    return 2 * setup.batch


def _value_head_logits_moment(
    spec: ModelSpec, setup: TrainingSetup, forward_end: PhaseBudget
) -> PhaseBudget:
    """The end of the value-head model's forward (TRL 0.24, trl/models/modeling_value_head.py
    `AutoModelForCausalLMWithValueHead.forward`, as LLaMA-Factory 0.9.5's rm stage runs it): the
    causal LM's full logits in the compute dtype, the log_softmax of its own cross-entropy (the
    pairwise collator passes `labels`: transformers' ForCausalLMLoss upcasts and takes it, and
    the unread loss keeps it) and the logits' fp32 upcast (`lm_logits.float()`), all alive
    until it returns, beside every tensor the forward saved; with fp32 weights under autocast,
    autocast's 16-bit cast of the head's weight too."""
    compute = dtypes_for(setup).compute
    whole = setup.batch * setup.seq * spec.vocab_size
    logits = compute * whole + 4 * whole + (4 * whole if compute != 4 else 0)
    count = f"{setup.batch}×{setup.seq}×{format_count(spec.vocab_size)}"
    text = (
        f"{compute} B × L = {count} (the LM logits) + 4 B × L (the log_softmax of the causal "
        "LM's own cross-entropy over the collator's labels, kept by that unread loss)"
        + (" + 4 B × L (the logits' fp32 upcast)" if compute != 4 else "")
    )
    if spec.final_logit_softcapping is not None:
        # Gemma-2's capping keeps its tanh for a backward that never comes, until the logits go
        logits += compute * whole
        text += f" + {compute} B × L (the soft-capping's tanh, kept by the graph)"
    parts = dict(forward_end.components)
    parts[Component.LOGITS] = Term(bytes=logits, formula=text)
    # the value head's input: the last hidden state (kept by the output's hidden_states)
    # through dropout (CUDA's fused kernel: a 1-byte mask) in the hidden states' dtype, cast
    # to the head's fp32 where it differs, kept by the head's matmul
    tokens = setup.batch * setup.seq * spec.hidden_size
    residual = 4 if setup.precision.weight_bytes == 4 else 2
    head_input = tokens * (1 + residual + residual + (4 if residual != 4 else 0))
    temporaries = parts.get(Component.TEMPORARIES, Term(0, ""))
    parts[Component.TEMPORARIES] = Term(
        bytes=temporaries.bytes + head_input,
        formula=(temporaries.formula + " + " if temporaries.bytes else "")
        + "the value head's input: the last hidden state, its dropout mask and output"
        + (" and fp32 cast" if residual != 4 else ""),
    )
    if setup.precision.is_autocast and setup.precision.weight_bytes == 4:
        copies = parts.get(Component.WEIGHT_COPIES, Term(0, ""))
        head = 2 * spec.vocab_size * spec.hidden_size
        parts[Component.WEIGHT_COPIES] = Term(
            bytes=copies.bytes + head,
            formula=(copies.formula + " + " if copies.bytes else "")
            + "2 B × V × h (autocast's cast of the LM head)",
        )
    return PhaseBudget(
        phase=Phase.FORWARD,
        moment="end of the value-head model's forward: the LM logits made and upcast, unread",
        components=parts,
    )


def _with_lm_head(phase: PhaseBudget, spec: ModelSpec, setup: TrainingSetup) -> PhaseBudget:
    """`phase` with the value-head model's LM head among the weights (untied: a tied head is
    the embedding, counted already): trainable in full fine-tuning, upcast with the rest, but
    never given a gradient, so neither gradients nor optimizer states."""
    weights = phase.components.get(Component.WEIGHTS)
    if weights is None or spec.tie_word_embeddings:
        return phase
    size = 2 if setup.quant is not None else setup.precision.weight_bytes
    head = size * spec.vocab_size * spec.hidden_size
    parts = dict(phase.components)
    parts[Component.WEIGHTS] = Term(
        bytes=weights.bytes + head,
        formula=weights.formula + f" + V × h × {size} B (the LM head, no gradient)",
    )
    return replace(phase, components=parts)


def estimate_preference_budget(
    spec: ModelSpec,
    setup: TrainingSetup,
    pref: PreferenceSetup,
    gpu: GpuTarget | None = None,
) -> Budget:
    """One step of a preference trainer: the SFT step of the concatenated batch, with the
    log-probability computation in place of the causal-LM loss, the reference model beside
    it, and the reference forward as its own phase. GRPO's step is llmmem.budget.grpo's."""
    if pref.objective is Objective.GRPO:
        grpo = pref.grpo or GrpoSetup()
        if pref.mixed_precision is not None and grpo.mixed_precision is None:
            grpo = replace(grpo, mixed_precision=pref.mixed_precision)
        grpo = replace(grpo, trl_release=grpo.trl_release or pref.trl_release)
        return estimate_grpo_budget(spec, setup, grpo, gpu)
    if pref.objective is Objective.PPO:
        ppo = pref.ppo or PpoSetup()
        if pref.reference is not None and ppo.reference is None:
            ppo = replace(ppo, reference=pref.reference)
        if pref.mixed_precision is not None and ppo.mixed_precision is None:
            ppo = replace(ppo, mixed_precision=pref.mixed_precision)
        return estimate_ppo_budget(spec, setup, ppo, gpu)
    if pref.objective not in MODELLED:
        raise SetupError(f"the memory of a {pref.objective.value.upper()} step is not modelled yet")
    reference = reference_for(pref, setup)
    rows = sequences_per_step(pref, setup)
    # TRL calls the model with use_cache=False: no unused KV cache during training
    policy_setup = policy_under_autocast(
        replace(setup, batch=rows, use_cache=False), pref.mixed_precision
    )
    policy_spec = reward_spec(spec, pref.num_labels) if pref.objective is Objective.REWARD else spec
    sft = estimate_budget(policy_spec, policy_setup, gpu)
    notes = list(sft.notes)
    notes.append(
        f"{pref.objective.value}: "
        + (
            f"chosen and rejected concatenated, {rows} sequences of {setup.seq} tokens per "
            "micro-batch through the policy"
            if pref.objective is not Objective.KTO
            else f"{rows} sequences with gradient, and a KL batch of {rows} without"
        )
        + (
            " (LLaMA-Factory's trainer)"
            if pref.trainer == "llamafactory"
            else f" (TRL {TRL_RELEASE})"
        )
    )
    forward = sft.phase(Phase.FORWARD)
    backward = sft.phase(Phase.BACKWARD)
    step = sft.phase(Phase.OPTIMIZER_STEP)

    last_block = last_block_moment(policy_spec, policy_setup, forward)
    ref_weights = (
        reference_copy_term(
            spec,
            setup,
            pref.reference_bytes,
            pref.reference_sharded,
            pref.reference_offloaded,
        )
        if reference is Reference.COPY
        else Term(bytes=0, formula="no reference copy")
    )
    extra: dict[Component, Term] = (
        {Component.REFERENCE_MODEL: ref_weights} if ref_weights.bytes else {}
    )

    if pref.objective is Objective.REWARD:
        # the score is hidden × num_labels per sequence: nothing vocabulary-sized to replace
        candidates = [_embedding_last(backward, spec, setup)]
        candidates += [last_block] if last_block else []
        # the token embedding's gradient comes last under a score head too (the later
        # moments count it out only beside a vocabulary head)
        candidates += [
            _embedding_last(moment, spec, setup)
            for moment in later_backward_moments(policy_spec, policy_setup, forward, step)
        ]
        norm_forward, norm_backward = _final_norm_moments(policy_spec, policy_setup, forward)
        candidates += [norm_backward] if norm_backward else []
        backward = max(candidates, key=lambda p: p.allocated_bytes)
        in_block = _checkpointed_block_moment(policy_spec, policy_setup, forward)
        running = _running_block_moments(policy_spec, policy_setup, forward)
        for moment in (in_block, norm_forward, *running):
            if moment is not None and moment.allocated_bytes > forward.allocated_bytes:
                forward = moment
        if pref.trainer == "llamafactory":
            logits_moment = _value_head_logits_moment(spec, policy_setup, sft.phase(Phase.FORWARD))
            if logits_moment.allocated_bytes > forward.allocated_bytes:
                forward = logits_moment
        phases = [with_terms(p, extra) for p in (forward, backward, step)]
        if pref.trainer == "llamafactory":
            phases = [_with_lm_head(p, spec, policy_setup) for p in phases]
            notes.append(
                "reward model: LLaMA-Factory's rm stage trains TRL's "
                "AutoModelForCausalLMWithValueHead: a value head of "
                f"{spec.hidden_size} × 1 on the last hidden state, beside the "
                f"{format_count(spec.vocab_size)}-token LM head, whose logits the forward still "
                "makes (upcast to fp32) and the pairwise loss never reads; the LM head gets no "
                "gradient and no optimizer state"
            )
        else:
            notes.append(
                f"reward model: a score head of {spec.hidden_size} × {pref.num_labels} instead "
                f"of the {format_count(spec.vocab_size)}-token vocabulary head; no vocabulary "
                "logits"
            )
        budget = budget_from_phases(sft, phases, notes, policy_spec, policy_setup, reference)
        return _with_first_step(budget, spec, setup, pref, gpu)

    fp32 = fp32_outputs(pref.mixed_precision, setup)
    llamafactory = pref.trainer == "llamafactory"
    release_029 = pref.follows_trl_release and not llamafactory
    # trl.experimental's ORPO and CPO trainers take the log-probabilities on a view and add the
    # chosen half's cross-entropy from 0.29 on: 1.16 runs the same code (measured on the CPU:
    # bench/trl_trainers.py --trl 1.16.0 reads ORPO as 0.29 does)
    view_and_nll = (
        not llamafactory
        and pref.objective in (Objective.ORPO, Objective.CPO)
        and release(pref.trl_release or TRL_RELEASE) >= release(TRL_RELEASE)
    )
    lp = log_prob_moments(
        spec,
        policy_setup,
        rows,
        fp32,
        reference_fp32_outputs(pref.mixed_precision, setup, reference),
        chosen_nll=view_and_nll,
        trainer=(
            ("llamafactory-kto" if pref.objective is Objective.KTO else "llamafactory")
            if llamafactory
            else "trl"
        ),
        cross_entropy=not (pref.objective is Objective.CPO and pref.cpo_alpha == 0),
        views=pref.dpo_on_views,
    )
    fused = uses_fused_head(pref)
    if fused:
        # TRL 1.x: the log-probabilities through the fused, tiled LM head, no logits
        lp = fused_head.fused_head_moments(
            spec, policy_setup, rows, pref.objective, reference is Reference.ADAPTER
        )
        notes.append(
            f"{pref.objective.value} (TRL {pref.trl_release}): the log-probabilities come from "
            "TRL's fused LM head, in tiles of 4096 tokens × 32768 vocabulary entries, without "
            "the logits"
        )
    if llamafactory:
        notes.append(
            f"LLaMA-Factory's own {'KTO' if pref.objective is Objective.KTO else 'DPO'} "
            "trainer: the logits cast to fp32 and a full log_softmax "
            "kept for backward (its get_batch_logps), the policy's forward before the "
            "reference's"
            + (
                "; ORPO and SimPO add no cross-entropy (the NLL term is the chosen "
                "log-probabilities')"
                if pref.objective is not Objective.DPO
                else ""
            )
        )
    if fp32 and not fused:
        notes.append(
            "mixed precision: accelerate returns the prepared models' logits in fp32 "
            "(convert_outputs_to_fp32), 4 B per logit"
        )
    policy_forward = replace_logits(
        _autocast_cache_cleared(forward, spec, policy_setup, fp32),
        "end of the policy's forward: per-token log-probabilities taken",
        Term(bytes=lp.forward_end, formula=lp.formula_forward),
        extra,
    )
    phases = [policy_forward]
    if reference in (Reference.COPY, Reference.ADAPTER) or pref.objective is Objective.KTO:
        phases.append(_reference_phase(spec, setup, pref, policy_forward, lp, reference, rows))
    views_entropy = pref.dpo_on_views and release(pref.trl_release or TRL_RELEASE) < (1, 14)
    if pref.objective is Objective.DPO and (release_029 or views_entropy):
        # the metrics run after the loss, in the same call: the last phase before backward
        # (1.6 to 1.13 still take `entropy_from_logits`, of a view; 1.14 folds the entropy
        # into its log-probabilities' pass)
        compute = dtypes_for(setup).compute
        e = 4 if fp32 else compute
        r = 4 if reference_fp32_outputs(pref.mixed_precision, setup, reference) else compute
        reference_row = r * max(setup.seq - 1, 0) * spec.vocab_size
        phases[-1] = _metrics_phase(
            spec, policy_setup, phases[-1], reference_row, rows, e, views=pref.dpo_on_views
        )
    if pref.dpo_on_views:
        notes.append(
            f"dpo (TRL {pref.trl_release}): the log-probabilities are taken on views of the "
            "logits, without 0.29's shifted copies"
        )
    if reference is Reference.PRECOMPUTED:
        notes.append(
            "precompute_ref_log_probs: the reference log-probabilities are read from the "
            "dataset; the reference model runs once before training, not in the step"
        )
    later = later_backward_moments(policy_spec, policy_setup, forward, step)
    phases.append(backward_phase(backward, policy_forward, lp, extra, last_block, later))
    phases.append(with_terms(step, extra))
    phases = _inside_kernels(phases, lp)
    if pref.objective in (Objective.ORPO, Objective.CPO) and not llamafactory:
        notes.append(
            f"{pref.objective.value}: no reference model; "
            + (
                "the log-probabilities are taken on a view of the logits; cpo_alpha=0 skips the "
                "chosen half's NLL and its cross-entropy (TRL 0.29)"
                if view_and_nll and pref.objective is Objective.CPO and pref.cpo_alpha == 0
                else "the log-probabilities are taken on a view of the logits and the chosen "
                "half's NLL is a cross-entropy over a shifted copy of that half (TRL 0.29)"
                if view_and_nll
                else "the chosen half's NLL term reuses the same logits (its cross-entropy's "
                "own copy is not counted)"
            )
        )
    budget = budget_from_phases(sft, phases, notes, policy_spec, policy_setup, reference)
    return _with_first_step(budget, spec, setup, pref, gpu)


def _reference_phase(
    spec: ModelSpec,
    setup: TrainingSetup,
    pref: PreferenceSetup,
    policy_forward: PhaseBudget,
    lp: LogProbMoments,
    reference: Reference,
    rows: int,
) -> PhaseBudget:
    """The reference forward, under no_grad, inside the loss call: everything the policy's
    forward left alive, plus the reference's own logits and shifted copy (its activations are
    freed block by block). KTO's KL batch goes through the reference too, and through the
    policy without gradient, one after the other."""
    parts = dict(policy_forward.components)
    logits = parts.get(Component.LOGITS)
    if lp.kept_for_reference is not None and logits is not None:
        logits = Term(bytes=lp.kept_for_reference, formula=lp.formula_kept)
        parts[Component.LOGITS] = logits
    elif lp.inside_forward and logits is not None:
        # the policy's kernel copy was freed with its log_softmax's return
        logits = Term(
            bytes=logits.bytes - lp.inside_forward,
            formula=logits.formula.replace(KERNEL_COPY_TEXT, ""),
        )
        parts[Component.LOGITS] = logits
    e = 4 if fp32_outputs(pref.mixed_precision, setup) else dtypes_for(setup).compute
    # (TRL 1.x's fused head: no logits to free)
    if (
        pref.objective is Objective.KTO
        and e != 4
        and logits is not None
        and lp.kept_for_reference is None
        and not uses_fused_head(pref)
    ):
        # KTO's `forward` returns before the reference runs: the policy's 16-bit logits die
        # with it (the per-row log_softmax keeps only its output; fp32 logits stay, kept by
        # the gather), and the returned index_select copies of them take their place
        whole = rows * setup.seq * spec.vocab_size * e
        parts[Component.LOGITS] = Term(
            bytes=logits.bytes - whole,
            formula=logits.formula + " − the logits, freed as KTO's forward returns",
        )
    what = {
        Reference.COPY: "the frozen copy",
        Reference.ADAPTER: "the policy with its adapter disabled",
        Reference.PRECOMPUTED: "the policy without gradient",
        Reference.NONE: "the policy without gradient",
    }[reference]
    if pref.objective is Objective.KTO:
        what += " (KTO: the completions, then the KL batch)"
    parts[Component.TEMPORARIES] = Term(
        bytes=parts.get(Component.TEMPORARIES, Term(0, "")).bytes + lp.reference,
        formula=f"{lp.formula_reference}, by {what}",
    )
    return PhaseBudget(
        phase=Phase.REFERENCE_FORWARD,
        moment=f"reference forward ({what}): its log-probabilities taken",
        components=parts,
    )


def _inside_kernels(phases: list[PhaseBudget], lp: LogProbMoments) -> list[PhaseBudget]:
    """The phases with what their log-probability moment allocates inside a kernel marked
    (`PhaseBudget.inside_kernels`): the reference's (one row's logsumexp temporary, or
    LLaMA-Factory's contiguous copy), and the policy's where it has its own (LLaMA-Factory's
    copy; ORPO's and CPO's row without a reference). A moment that is not the
    log-probabilities' (DPO's metrics, after the kernels returned) has none."""
    has_reference = any(p.phase is Phase.REFERENCE_FORWARD for p in phases)
    out = []
    for phase in phases:
        inside = 0
        if phase.phase is Phase.REFERENCE_FORWARD and phase.moment.startswith("reference forward"):
            inside = lp.inside_kernel
        elif phase.phase is Phase.FORWARD and phase.moment.startswith(
            "end of the policy's forward"
        ):
            inside = lp.inside_forward or (0 if has_reference else lp.inside_kernel)
        out.append(replace(phase, inside_kernels=inside) if inside else phase)
    return out


def _autocast_cache_cleared(
    phase: PhaseBudget, spec: ModelSpec, setup: TrainingSetup, fp32: bool
) -> PhaseBudget:
    """Autocast caches its 16-bit casts of the weights for as long as its context lasts. The
    prepared model's forward (accelerate's autocast, then `convert_outputs_to_fp32`) leaves
    that context before the log-probabilities are taken, outside it: with checkpointed blocks,
    whose casts nothing saved, only the head's cast is left (kept by its matmul for the input
    gradient). Without checkpointing every cast is kept by its matmul anyway."""
    copies = phase.components.get(Component.WEIGHT_COPIES)
    if (
        copies is None
        or not fp32
        or not setup.grad_ckpt
        or setup.method is not Method.FULL
        or not setup.precision.is_autocast
        or setup.quant is not None
    ):
        return phase
    head = 2 * spec.vocab_size * spec.hidden_size
    parts = dict(phase.components)
    parts[Component.WEIGHT_COPIES] = Term(
        bytes=min(head, copies.bytes),
        formula="autocast's 16-bit cast of the head, kept for its input gradient (the blocks' "
        "casts gone with autocast's cache when the prepared forward returned)",
    )
    return PhaseBudget(phase=phase.phase, moment=phase.moment, components=parts)


def _embedding_last(phase: PhaseBudget, spec: ModelSpec, setup: TrainingSetup) -> PhaseBudget:
    """The token embedding is the last weight backward reaches: while the first block's
    gradients are computed its gradient does not exist yet, under a score head as under an LM
    head (the SFT step counts this for causal LMs)."""
    if phase.moment != "backward of the first block" or setup.method is not Method.FULL:
        return phase
    if setup.grad_accum > 1 or setup.distributed.is_multi_gpu:
        return phase
    gradients = phase.components.get(Component.GRADIENTS)
    if gradients is None:
        return phase
    embedding = spec.vocab_size * spec.hidden_size * setup.precision.weight_bytes
    parts = dict(phase.components)
    parts[Component.GRADIENTS] = Term(
        bytes=max(gradients.bytes - embedding, 0),
        formula=gradients.formula + " − the token embedding's (still to come)",
    )
    return PhaseBudget(phase=phase.phase, moment=phase.moment, components=parts)


def _running_block_moments(
    spec: ModelSpec, setup: TrainingSetup, forward: PhaseBudget
) -> list[PhaseBudget]:
    """Under a score head the forward can peak inside the last block, whose tensors that
    nothing keeps for backward are alive while it runs (transformers' decoder layers: the
    residual is a local, each sub-layer's input a local until it returns):

    - its MLP, as the down projection's output is made: the residual (not kept when the
      norm keeps an fp32 copy of a 16-bit one), the MLP's input and act(gate) · up where no
      Linear keeps them; under checkpointing nothing is kept, and act(gate), up and their
      product are alive together;
    - its eager attention, as the fp32 softmax is made: the masked scores and their fp32
      upcast (a 16-bit model), beside the masks transformers builds once per forward; under
      checkpointing the softmax's output and the block's q, k and v too.

    Below them every earlier block's saved tensors (without checkpointing), or the
    checkpointed inputs."""
    if not spec.blocks or spec.mlp != "gated":
        return []
    from llmmem.budget.activations import ABSOLUTE_POSITION_TYPES, BlockContext, Tally
    from llmmem.budget.setup import AttnImpl

    dt = dtypes_for(setup)
    train = trainability_for(spec, setup)
    ctx = BlockContext(spec, setup, dt, train)
    acts = estimate_activations(spec, setup)
    group = spec.blocks[-1]
    dims = acts.dims
    d, e = dt.residual, dt.linear_out_bytes
    n_h, n_i = dims["N·h"], dims["N·I"]
    ckpt = setup.grad_ckpt
    held: dict[Component, Term] = {
        k: v
        for k, v in forward.components.items()
        if k not in (Component.LOGITS, Component.TEMPORARIES, Component.ACTIVATIONS)
    }
    final = Tally()
    ctx.norm(final)
    final_norm = final.evaluate(dims)
    if ckpt:
        below = forward.components.get(Component.ACTIVATIONS, Term(0, "")).bytes - final_norm
        below_text = "the checkpointed blocks' inputs"
    else:
        below = acts.full_bytes - acts.outside.evaluate(dims)
        below_text = "every block's saved tensors"
    # the residual stream's tensor: kept when the norm's fp32 view of it is itself
    residual_kept = d == 4 and spec.norm != "layernorm" and not ckpt
    residual = 0 if residual_kept else d * n_h
    mlp_in = [lin for lin in group.linears if linear_position(lin) == "mlp_in"]
    down = [lin for lin in group.linears if linear_position(lin) == "mlp_out"]
    scratch = Tally()
    input_kept = not ckpt and ctx.consumers_save(scratch, d, "N·h", mlp_in)
    product_kept = not ckpt and ctx.consumers_save(scratch, e, "N·I", down)
    if ckpt:
        mlp_live = residual + d * n_h + 3 * e * n_i + e * n_h
        mlp_text = f"{d}·N·h residual + {d}·N·h MLP input + 3·{e}·N·I + {e}·N·h output"
    else:
        mlp_live = (
            residual + (0 if input_kept else d * n_h) + (0 if product_kept else e * n_i) + e * n_h
        )
        mlp_text = "the MLP's tensors no Linear keeps + its output"
    eager = setup.attn is AttnImpl.EAGER or not spec.supports_sdpa
    masks = eager_mask_kinds(spec) * d * dims["b·s²"] if eager else 0
    moments = [
        PhaseBudget(
            phase=Phase.FORWARD,
            moment="the last block's MLP (no vocabulary logits)",
            components={
                **held,
                Component.ACTIVATIONS: Term(bytes=round(below), formula=below_text),
                Component.TEMPORARIES: Term(
                    bytes=round(mlp_live + (0 if ckpt else masks)), formula=mlp_text
                ),
            },
        )
    ]
    if eager:
        c = dt.compute
        scores = dims["b·a·s²"]
        # the scores plus the mask: type promotion makes them fp32 under autocast over fp32
        # weights (an fp32 mask); softmax(dtype=float32) upcasts 16-bit ones first
        m = max(c, d)
        upcast = 4 if m != 4 else 0
        if ckpt:
            # the residual is the block's input, a checkpointed one; repeat_kv copies K and V
            # to every head where the model groups them
            # (rotary embeddings multiply q and k by cos and sin in the residual stream's
            # dtype: fp32 q and k under autocast over fp32 weights)
            r = max(c, d) if spec.model_type not in ABSOLUTE_POSITION_TYPES else c
            qkv = r * dims["N·q"] + r * dims["N·kvd"] + c * dims["N·kvd"]
            if spec.num_kv_heads < spec.num_attention_heads:
                qkv += (r + c) * dims["N·q"]
            live = d * n_h + qkv + (m + upcast + 4) * scores
            text = (
                "attention input, q, k, v (repeated per head) + the masked scores, upcast and "
                "softmax"
            )
        else:
            # the last block has kept only what comes before its softmax: its norm's, its
            # projections' inputs, q and the (repeated) K and V
            kv_width = "N·q" if spec.num_kv_heads < spec.num_attention_heads else "N·kvd"
            before = Tally()
            ctx.norm(before)
            attn_in = [lin for lin in group.linears if linear_position(lin) == "attn_in"]
            ctx.consumers_save(before, d, "N·h", attn_in)
            before.add(c, "N·q")
            before.add(2 * c, kv_width)
            below -= acts.per_block_bytes(group) - before.evaluate(dims)
            live = residual + masks + (m + upcast + 4) * scores
            text = "the masked scores, their fp32 upcast and softmax + the masks"
        moments.append(
            PhaseBudget(
                phase=Phase.FORWARD,
                moment="the last block's eager attention (no vocabulary logits)",
                components={
                    **held,
                    Component.ACTIVATIONS: Term(bytes=round(below), formula=below_text),
                    Component.TEMPORARIES: Term(bytes=round(live), formula=text),
                },
            )
        )
    return moments


def _final_norm_moments(
    spec: ModelSpec, setup: TrainingSetup, forward: PhaseBudget
) -> tuple[PhaseBudget | None, PhaseBudget | None]:
    """Under a score head nothing vocabulary-sized outweighs the final RMSNorm, whose forward
    and backward are then the model's peaks outside the blocks. transformers' RMSNorm
    (Llama's, Qwen2's: `x.to(float32)`, `x * rsqrt(x.pow(2).mean(-1) + eps)`, `weight *
    x.to(input_dtype)`) runs written out:

    - forward, as its output is made: the input (still the caller's), its fp32 copy, the
      fp32 normalised tensor (the function's local), its cast back and the output; under
      autocast over fp32 weights, once it has returned, the output (the model's local until
      its forward returns) beside the score head's 16-bit cast of it;
    - backward, in the `pow` branch: the gradient of the fp32 input from the rsqrt product
      waits in autograd's buffer while the mean's expanded gradient, `x.pow(1)`, its double
      and their product are made: five fp32 tensors of N·h, beside every block's saved
      tensors and the fp32 input the `pow` keeps.

    Gemma's RMSNorm runs the same way in fp32 and casts its product back; LayerNorm's fused
    kernel is left to the blocks' moments."""
    if spec.norm == "layernorm" or not spec.blocks:
        return None, None
    dt = dtypes_for(setup)
    n_h = setup.tokens * spec.hidden_size
    d = dt.residual
    copies = d != 4  # x.to(float32) copies a 16-bit input; an fp32 one is returned as is
    trains = trainability_for(spec, setup).base_trains
    if spec.norm == "gemma_rmsnorm":
        # Gemma's `(x.float() normalised) * (1 + weight.float())`, then `.type_as(x)`: the
        # fp32 product and, for a 16-bit input, the input and the product's cast back
        making = d + 4 + d if copies else 4 + (0 if trains else 4)
        normalised = 4
    else:
        # (a frozen weight's product keeps no normalised tensor: alive only as it is read)
        making = (d + 4 if copies else 0) + d + (0 if trains else d)
        normalised = d
    returned = d + (2 if dt.autocast and not copies else 0)
    held: dict[Component, Term] = {
        k: v
        for k, v in forward.components.items()
        if k not in (Component.LOGITS, Component.TEMPORARIES)
    }
    in_forward = PhaseBudget(
        phase=Phase.FORWARD,
        moment="the final norm's forward (no vocabulary logits)",
        components={
            **held,
            Component.TEMPORARIES: Term(
                bytes=max(making, returned) * n_h,
                formula=(
                    f"{d}·N·h input + 4·N·h fp32 normalised + {d}·N·h output"
                    if making >= returned
                    else f"{d}·N·h output + 2·N·h the score head's cast of it"
                ),
            ),
        },
    )
    acts = forward.components.get(Component.ACTIVATIONS, Term(0, ""))
    # the weight product's backward has run: the normalised tensor it kept is gone
    saved = max(acts.bytes - (normalised * n_h if trains else 0), 0)
    in_backward = PhaseBudget(
        phase=Phase.BACKWARD,
        moment="the final norm's backward (no vocabulary logits)",
        components={
            **held,
            Component.ACTIVATIONS: Term(
                bytes=saved, formula=acts.formula + " (the norm's weight product done)"
            ),
            Component.TEMPORARIES: Term(
                bytes=5 * 4 * n_h, formula="5·4·N·h (the pow branch of the norm's backward)"
            ),
        },
    )
    return in_forward, in_backward


def _checkpointed_block_moment(
    spec: ModelSpec, setup: TrainingSetup, forward: PhaseBudget
) -> PhaseBudget | None:
    """With checkpointing a block's forward keeps nothing for backward, but its MLP's
    intermediates live while it runs: act(gate), up and their product for a gated MLP
    (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`), fc1's output and its activation for a
    plain one. Without vocabulary logits (a reward model's score head) this is the forward's
    peak."""
    if not setup.grad_ckpt or not spec.blocks:
        return None
    dt = dtypes_for(setup)
    n_i = setup.tokens * spec.intermediate_size
    alive = 3 if spec.mlp == "gated" else 2
    parts: dict[Component, Term] = {
        k: v for k, v in forward.components.items() if k is not Component.LOGITS
    }
    temporaries = forward.components.get(Component.TEMPORARIES)
    parts[Component.TEMPORARIES] = Term(
        bytes=alive * dt.linear_out_bytes * n_i + (temporaries.bytes if temporaries else 0),
        formula=f"{alive}·{dt.linear_out_bytes}·N·I (the running block's MLP intermediates)",
    )
    return PhaseBudget(
        phase=Phase.FORWARD, moment="forward of the last block (checkpointed)", components=parts
    )


def _with_first_step(
    budget: Budget,
    spec: ModelSpec,
    setup: TrainingSetup,
    pref: PreferenceSetup,
    gpu: GpuTarget | None,
) -> Budget:
    """The first step's peak beside it (no optimizer states before the step)."""
    if setup.first_step or budget.first_step_allocated_peak_bytes is None:
        return budget
    first = estimate_preference_budget(spec, replace(setup, first_step=True), pref, gpu)
    return replace(budget, first_step_allocated_peak_bytes=first.allocated_peak_bytes)


def describe(budget: Budget) -> str:
    """One line per phase: the moment and its total."""
    return "\n".join(
        f"{p.phase.value}: {p.moment}: {format_bytes(p.allocated_bytes)}" for p in budget.phases
    )

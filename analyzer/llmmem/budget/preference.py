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

This module places the moments in the step's phases. The setup it starts from is
llmmem.budget.preference_setup's; the log-probabilities' bytes are
llmmem.budget.preference_log_probs's, a reward model's moments
llmmem.budget.reward_model_moments's, and the moments GRPO and PPO share with this step
llmmem.budget.preference_moments's.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget import fused_head
from llmmem.budget.activations import dtypes_for
from llmmem.budget.fused_head import uses_fused_head
from llmmem.budget.grpo import GrpoSetup, estimate_grpo_budget
from llmmem.budget.grpo import reference_of as grpo_reference
from llmmem.budget.phases import estimate_budget
from llmmem.budget.ppo import estimate_ppo_budget
from llmmem.budget.ppo_setup import PpoSetup
from llmmem.budget.ppo_setup import reference_of as ppo_reference
from llmmem.budget.preference_log_probs import KERNEL_COPY_TEXT, log_prob_moments
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
from llmmem.budget.reward_model_moments import (
    checkpointed_block_moment,
    embedding_last,
    final_norm_moments,
    running_block_moments,
    value_head_logits_moment,
    with_lm_head,
)
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
        candidates = [embedding_last(backward, spec, setup)]
        candidates += [last_block] if last_block else []
        # the token embedding's gradient comes last under a score head too (the later
        # moments count it out only beside a vocabulary head)
        candidates += [
            embedding_last(moment, spec, setup)
            for moment in later_backward_moments(policy_spec, policy_setup, forward, step)
        ]
        norm_forward, norm_backward = final_norm_moments(policy_spec, policy_setup, forward)
        candidates += [norm_backward] if norm_backward else []
        backward = max(candidates, key=lambda p: p.allocated_bytes)
        in_block = checkpointed_block_moment(policy_spec, policy_setup, forward)
        running = running_block_moments(policy_spec, policy_setup, forward)
        for moment in (in_block, norm_forward, *running):
            if moment is not None and moment.allocated_bytes > forward.allocated_bytes:
                forward = moment
        if pref.trainer == "llamafactory":
            logits_moment = value_head_logits_moment(spec, policy_setup, sft.phase(Phase.FORWARD))
            if logits_moment.allocated_bytes > forward.allocated_bytes:
                forward = logits_moment
        phases = [with_terms(p, extra) for p in (forward, backward, step)]
        if pref.trainer == "llamafactory":
            phases = [with_lm_head(p, spec, policy_setup) for p in phases]
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

"""PPO (TRL's PPOTrainer): a policy and a value model trained together, a reference and a reward
model beside them, generation inside the step.

Read in TRL 0.29.1 (`trl/experimental/ppo/ppo_trainer.py`, `ppo_config.py`,
`trl/experimental/utils.py` `get_reward` and `create_reference_model`, `trl/trainer/utils.py`
`pad` and `selective_log_softmax`) and transformers 5.24's `generate`. What lives on the GPU:

- four models. The policy (trainable: every weight, or its LoRA adapter when `peft_config` is
  given); the value model, an `AutoModelForSequenceClassification` (`num_labels=1`: a score head
  of hidden × 1 instead of the vocabulary head) of its own size, loaded by the script (TRL's
  example loads it from `reward_model_path`: it may be smaller or larger than the policy), and
  trained in full even when the policy has an adapter; the reference policy, a frozen
  `deepcopy` of the policy (`create_reference_model`, full fine-tuning), the model passed as
  `ref_model`, or under PEFT the policy itself with its adapter disabled (`null_ref_context`:
  no copy); the reward model, a frozen sequence-classification model, moved to the device as
  loaded.
- `PolicyAndValueWrapper(policy, value_model)` is what the accelerator prepares, and one
  optimizer (`create_optimizer_and_scheduler`) covers both trainables: the optimizer states,
  the gradients and the step's buffers are the policy's trainable set plus the whole value
  model.
- one update, per device, over `local_batch_size = per_device_train_batch_size ×
  gradient_accumulation_steps` queries:
  1. generation (`batch_generation`, no gradient): the policy generates `response_length`
     tokens for `local_rollout_forward_batch_size` queries at a time, with its KV cache and
     `output_scores=True`: every step's processed fp32 scores (rows × V) are kept, stacked into
     rows × response_length × V per chunk, and the chunks padded into one tensor (`pad`: the
     list and the padded copy alive together). `train` keeps that tensor (`logitss`) until the
     next update's generation returns: through the whole update, and beside the next
     generation.
  2. the rollout forwards (no gradient), chunk by chunk: the policy's log-probabilities from
     the kept scores; the reference's forward over query + response (`forward`,
     `output_hidden_states=True`: every layer's hidden states alive with the logits, which
     cover the whole sequence in the compute dtype, divided by the temperature in place), the
     value model's and the reward model's backbones (`get_reward`, hidden states kept, the
     score head on the last). Only per-token numbers leave a chunk.
  3. training: `num_ppo_epochs` passes over `num_mini_batches` mini-batches, each
     `gradient_accumulation_steps` micro-batches of `per_device_train_batch_size` rows through
     the wrapper: the value backbone first (with gradient, hidden states kept; its output,
     with the KV cache it builds, stays bound in the wrapper's forward through the policy's
     forward, and its score head keeps its input), then the policy (the whole sequence's
     logits), `logits /= temperature` in place on the response slice,
     `selective_log_softmax`, the clipped policy and value losses, backward,
     `optimizer.step()` and `zero_grad()` (a step every `gradient_accumulation_steps`
     micro-batches under `accelerator.accumulate`), then, without gradient, the entropy
     (`softmax(logits)` and its product with the logits) while the micro-batch's output is
     still alive. A micro-batch's tensors are deleted only at the end of its mini-batch: with
     several micro-batches per mini-batch the one before is alive through the next's forward.
  The peaks repeat across epochs and mini-batches: one of each is the step's.
- `PPOConfig(gradient_checkpointing=True)` is not applied: PPOTrainer runs its own loop and
  never calls `gradient_checkpointing_enable`. Under mixed precision (`bf16=True`, PPOConfig's
  default) the accelerator wraps the prepared wrapper only, in autocast and in
  `convert_outputs_to_fp32` (accelerate 1.15.0): the training forward's logits come back in
  fp32, and 16-bit hidden states as fp32 copies; generation and the rollout forwards (the
  unwrapped policy, the reference, the value and the reward models) run in the weights' dtype.

LLaMA-Factory's `stage: ppo` (llamafactory 0.9.3, `llamafactory/train/ppo/trainer.py`
`CustomPPOTrainer`, `train/trainer_utils.py` `create_ref_model`, `create_reward_model`) runs TRL
0.9's older PPOTrainer (it pins trl <= 0.9.6; read at 0.9.6: `trl/trainer/ppo_trainer.py`
`batched_forward_pass`, `trl/core.py` `logprobs_from_logits`, `trl/models/modeling_value_head.py`:
the logits upcast to fp32, copied by `torch.cat` and put through a whole `log_softmax`) with its
own models: the value is a head on the policy
(`AutoModelForCausalLMWithValueHead`, a hidden × 1 linear: no value backbone), the reference is
a copy in full fine-tuning and the adapter disabled under LoRA, and the reward is a separate
frozen model (`reward_model_type: full`), a second adapter on the policy (`lora`: no copy) or a
server (`api`: nothing on the GPU). It generates `per_device_train_batch_size` queries at a time
with `max_new_tokens` and does not keep the scores. This module sizes it with the same phases;
that path is not checked against a run.
"""

from __future__ import annotations

from dataclasses import replace
from math import ceil

from llmmem.budget.activations import dtypes_for, trainability_for
from llmmem.budget.generation import kv_cache_term
from llmmem.budget.phases import estimate_budget
from llmmem.budget.ppo_models import (
    PpoModels,
    frozen_term,
    model_lines,
    models_of,
    policy_and_value,
    score_input_term,
    sum_terms,
    weights_term,
)
from llmmem.budget.ppo_rollout import (
    decoder_blocks,
    generation_phase,
    hidden_states_bytes,
    rollout_bytes,
    rollout_phase,
    rollout_setup,
    vllm_engine_term,
)
from llmmem.budget.ppo_setup import TRL_RELEASE, PpoSetup, check_ppo, local_batch, reference_of
from llmmem.budget.preference_moments import budget_from_phases, later_backward_moments
from llmmem.budget.preference_setup import fp32_outputs
from llmmem.budget.result import Budget, Component, GpuTarget, Phase, PhaseBudget, Term
from llmmem.budget.setup import Method, Packing, TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.units import format_count


def unseen_by_a_counter(
    budget: Budget, spec: ModelSpec, setup: TrainingSetup, ppo: PpoSetup
) -> dict[str, int]:
    """Of each phase's bytes, what aten allocates inside a kernel and a dispatch-level storage
    counter does not see: fp32 logsumexp's row temporary (response_length × V), where the
    rollout's peak is the reference's log-probabilities."""
    rollout = budget.phase(Phase.REFERENCE_FORWARD)
    if rollout_bytes(setup) != 4 or "logits" not in rollout.moment:
        return {}
    return {Phase.REFERENCE_FORWARD.value: 4 * ppo.response_length * spec.vocab_size}


def estimate_ppo_budget(
    spec: ModelSpec,
    setup: TrainingSetup,
    ppo: PpoSetup,
    gpu: GpuTarget | None = None,
) -> Budget:
    """One update of TRL 0.29.1's PPOTrainer: generation, the rollout forwards without
    gradient, the policy's and the value model's forward and backward on a micro-batch, the
    step. `setup.batch` is `per_device_train_batch_size`; its `seq` is replaced by query +
    response."""
    ppo = ppo.resolved(setup)
    check_ppo(ppo, setup)
    reference = reference_of(ppo, setup)
    models = models_of(spec, ppo)
    q, r_len = ppo.query_length or setup.seq, ppo.response_length
    seq = ppo.seq
    # TRL's PPOTrainer runs its own loop: `gradient_checkpointing=True` is never applied. The
    # unused KV cache TRL's `forward` builds (use_cache left at the config's default) is
    # counted here, not by the SFT step
    ckpt = setup.grad_ckpt and ppo.trainer != "trl"
    policy_setup = replace(setup, seq=seq, use_cache=False, grad_ckpt=ckpt)
    if ppo.padded_queries and setup.packing is None:
        # padded queries: SDPA gets the padding mask and K/V repeated to every head, as it does
        # the block-diagonal mask of packed rows (flash-attention unpads instead: no mask)
        policy_setup = replace(policy_setup, packing=Packing.ROWS)
    sft = estimate_budget(spec, policy_setup, gpu)
    forward = sft.phase(Phase.FORWARD)
    step = sft.phase(Phase.OPTIMIZER_STEP)
    value_sft = None
    if models.value is not None:
        value_setup = replace(policy_setup, method=Method.FULL, lora=None, quant=None)
        value_sft = estimate_budget(models.value, value_setup, gpu)

    e = dtypes_for(policy_setup).compute
    residual = dtypes_for(policy_setup).residual
    vocab = spec.vocab_size
    rows_local = local_batch(setup)
    chunk = min(ppo.local_rollout_forward_batch_size or setup.batch, rows_local)
    chunks = ceil(rows_local / chunk)
    last_chunk = rows_local - (chunks - 1) * chunk
    padded_rows = chunks * chunk
    micro = setup.batch
    first = setup.first_step

    # -- what every phase holds
    held: dict[Component, Term] = {}
    held[Component.WEIGHTS] = weights_term(forward, value_sft, models, ppo)
    frozen = frozen_term(spec, setup, models, reference, ppo)
    if frozen.bytes:
        held[Component.REFERENCE_MODEL] = frozen
    engine = vllm_engine_term(ppo, gpu)
    # the optimizer states as the forward finds them (none before the first step)
    states = policy_and_value(forward, value_sft, Phase.FORWARD, Component.OPTIMIZER_STATES)
    step_states = policy_and_value(
        step, value_sft, Phase.OPTIMIZER_STEP, Component.OPTIMIZER_STATES
    )
    if states.bytes:
        held[Component.OPTIMIZER_STATES] = states
    score_row = r_len * vocab * 4
    kept_bytes = padded_rows * score_row if ppo.keep_scores else 0
    kept = Term(
        bytes=kept_bytes,
        formula=f"4 B × {padded_rows} rows × {r_len} × {format_count(vocab)} (the rollout's "
        "fp32 generation scores, kept through the update)",
    )

    # -- 1. generation
    if ppo.vllm is None:
        phases = [
            generation_phase(
                spec,
                policy_setup,
                ppo,
                held,
                kept,
                first,
                rows_local,
                chunk,
                last_chunk,
                padded_rows,
            )
        ]
    else:
        phases = [
            PhaseBudget(
                phase=Phase.GENERATE,
                moment="the colocated vLLM engines generate"
                if engine is not None
                else "the vLLM engines on GPUs of their own generate; weights synced to them",
                components={**held, Component.VLLM_ENGINE: engine} if engine else dict(held),
            )
        ]
    if engine is not None and not ppo.vllm_enable_sleep_mode:
        held[Component.VLLM_ENGINE] = engine  # reserved through the whole update

    # -- 2. the rollout forwards, one chunk of `chunk` rows
    phases.append(rollout_phase(spec, setup, ppo, models, reference, held, kept, chunk, residual))

    # -- 3. training: the wrapper's forward on one micro-batch
    train = dict(held)
    copies = policy_and_value(forward, value_sft, Phase.FORWARD, Component.WEIGHT_COPIES)
    if copies.bytes:
        train[Component.WEIGHT_COPIES] = copies
    policy_acts = forward.components.get(Component.ACTIVATIONS, Term(0, ""))
    value_acts = (
        value_sft.phase(Phase.FORWARD).components.get(Component.ACTIVATIONS, Term(0, ""))
        if value_sft
        else Term(0, "")
    )
    score_input = score_input_term(models.value, policy_setup, micro, seq)
    if score_input.bytes:
        value_acts = Term(
            bytes=value_acts.bytes + score_input.bytes,
            formula=f"{value_acts.formula} + {score_input.formula}",
        )
    train[Component.ACTIVATIONS] = sum_terms(
        policy_acts, value_acts, "the policy's", "the value backbone's"
    )
    # accelerate's mixed precision converts the prepared wrapper's outputs to fp32: the
    # policy's logits, and its 16-bit hidden states (`output_hidden_states=True`) as copies
    # beside the ones autograd keeps; the rollout's unwrapped models are not converted
    out32 = (
        ppo.trainer == "trl" and fp32_outputs(ppo.mixed_precision, policy_setup)
    ) or ppo.trainer == "openrlhf"
    hidden_copies = (
        hidden_states_bytes(spec, micro, seq, 4)
        if out32 and residual != 4 and ppo.trainer == "trl"
        else 0
    )
    if hidden_copies:
        acts = train[Component.ACTIVATIONS]
        train[Component.ACTIVATIONS] = Term(
            bytes=acts.bytes + hidden_copies,
            formula=acts.formula
            + f" + ({decoder_blocks(spec)} + 1) × {micro}×{seq}×{spec.hidden_size} × 4 B (the "
            "output's hidden states, converted to fp32)",
        )
    # `output_hidden_states=True` with a 16-bit residual stream: an RMS norm saves its fp32 copy
    # (`hidden_states.to(torch.float32)`), not its input, so the embeddings' output and every
    # block's output but the last (the tuple's last entry is the final norm's, which the head
    # keeps) are held by the policy's output alone, until accelerate's conversion ends (mixed
    # precision) or the output is deleted
    unsaved = (
        decoder_blocks(spec) * micro * seq * spec.hidden_size * residual
        if residual != 4 and spec.norm != "layernorm" and ppo.trainer == "trl"
        else 0
    )
    if unsaved:
        acts = train[Component.ACTIVATIONS]
        train[Component.ACTIVATIONS] = Term(
            bytes=acts.bytes + unsaved,
            formula=acts.formula
            + f" + {decoder_blocks(spec)} × {micro}×{seq}×{spec.hidden_size} × {residual} B (the "
            "output's hidden states autograd does not keep)",
        )
    compute = e
    # the model's 16-bit logits, alive beside their fp32 copy while the output is converted
    converted = micro * seq * vocab * compute if out32 and compute != 4 else 0
    if out32:
        e = 4
    if ppo.trainer in ("trl", "openrlhf"):
        whole = micro * seq * vocab * e
        response = micro * r_len * vocab * e
        lp = whole + (response if e != 4 else 0)
        lp_text = f"{e} B × {micro}×{seq}×{format_count(vocab)} (the policy's logits)" + (
            f" + {e} B × {micro}×{r_len}×V (every row's log-softmax, kept)" if e != 4 else ""
        )
        if converted:
            # the conversion builds a new output: the model's 16-bit logits stay alive, held
            # by the old one, until every tensor in it is converted; the fp32 path keeps
            # nothing logits-sized after that (the slice is a view, divided in place)
            lp += converted
            lp_text = (
                f"4 B + {compute} B × {micro}×{seq}×{format_count(vocab)} (the policy's "
                "logits converted to fp32, beside the 16-bit ones until the conversion ends)"
            )
    else:
        # TRL 0.9.6 (LLaMA-Factory 0.9.3 pins trl <= 0.9.6): the value-head wrapper upcasts
        # the logits to fp32, batched_forward_pass copies them (torch.cat) and
        # logprobs_from_logits keeps a whole log_softmax; read, not measured
        e = 4
        whole = micro * seq * vocab * 4
        response = micro * r_len * vocab * 4
        lp = 3 * whole
        lp_text = (
            f"3 × 4 B × {micro}×{seq}×{format_count(vocab)} (TRL 0.9: the logits upcast to "
            "fp32, their torch.cat copy and the whole log-softmax)"
        )
    capped = 0
    if spec.final_logit_softcapping is not None:
        # Gemma-2's soft-capped logits: the policy's tanh output (compute dtype, the whole
        # sequence) is kept for the capping's backward, which runs after the log-probabilities'
        capped = micro * seq * vocab * compute
        lp += capped
        lp_text += f" + {compute} B × {micro}×{seq}×V (the soft-capping's tanh, kept)"
    logits = Term(
        bytes=lp + kept.bytes,
        formula=lp_text
        + (f" + {format_count(kept.bytes)} B of kept rollout scores" if kept.bytes else ""),
    )
    train[Component.LOGITS] = logits
    caches = _training_caches(spec, policy_setup, micro, seq)
    if caches.bytes:
        train[Component.KV_CACHE] = caches
    policy_forward = PhaseBudget(
        phase=Phase.FORWARD,
        moment="end of the policy and value forward: log-probabilities and values taken",
        components=train,
    )
    head = _head_moment(
        spec, policy_setup, models, train, micro, seq, compute, kept, caches, hidden_copies
    )
    if head is not None and head.allocated_bytes > policy_forward.allocated_bytes:
        policy_forward = head
    phases.append(policy_forward)

    grads = policy_and_value(step, value_sft, Phase.OPTIMIZER_STEP, Component.GRADIENTS)
    tuple_bytes = hidden_copies or hidden_states_bytes(spec, micro, seq, residual)
    # with several micro-batches a mini-batch, the one before is alive through the next one's
    # forward (its output is replaced only as that forward returns, its softmax only after
    # the next step); with gradient accumulation the gradients live between steps
    per_mini = ceil(rows_local / ppo.num_mini_batches / micro)
    leftover = Term(
        bytes=whole + response + caches.bytes + tuple_bytes if per_mini > 1 else 0,
        formula="the micro-batch before's output (logits, KV cache, hidden states) and its softmax",
    )
    softmax = Term(
        bytes=response if per_mini > 1 else 0, formula="the micro-batch before's softmax"
    )

    def before(moment: PhaseBudget, extra: Term, accumulated: Term | None) -> PhaseBudget:
        parts = dict(moment.components)
        if extra.bytes:
            logits_term = parts.get(Component.LOGITS, Term(0, ""))
            parts[Component.LOGITS] = Term(
                bytes=logits_term.bytes + extra.bytes,
                formula=logits_term.formula + " + " + extra.formula,
            )
        if accumulated is not None and accumulated.bytes:
            parts[Component.GRADIENTS] = accumulated
        return replace(moment, components=parts)

    accumulated = (
        Term(bytes=grads.bytes, formula=grads.formula + ", accumulated over the micro-batches")
        if setup.grad_accum > 1
        else None
    )
    phases[-1] = before(policy_forward, leftover, accumulated)

    # backward: the log-probabilities' gradient (measured on CPU: two logits-sized buffers,
    # the gradient of the whole output and of its response slice, and two response-sized
    # ones, the gather's scattered gradient and the per-row logsumexp gradients stacked; a
    # 16-bit row's saved log-softmax is freed as its gradient is made)
    backward_parts = dict(train)
    if converted:
        # the 16-bit logits died as the conversion ended
        backward_parts[Component.LOGITS] = Term(
            bytes=logits.bytes - converted,
            formula=logits.formula + f" − the 16-bit logits ({format_count(converted)} B)",
        )
    if unsaved and hidden_copies:
        # and the 16-bit hidden states with them: the converted output holds fp32 copies
        acts = train[Component.ACTIVATIONS]
        backward_parts[Component.ACTIVATIONS] = Term(
            bytes=acts.bytes - unsaved, formula=acts.formula + " − the 16-bit hidden states"
        )
    grad = 2 * whole + (2 * response if e == 4 else response)
    backward_parts[Component.TEMPORARIES] = Term(
        bytes=grad,
        formula=f"2 × {e} B × {micro}×{seq}×V (the logits' gradient, and its slice's) + "
        + ("2" if e == 4 else "1")
        + f" × {e} B × {micro}×{r_len}×V (the log-probabilities' gradients)",
    )
    logprob_backward = PhaseBudget(
        phase=Phase.BACKWARD,
        moment="backward of the log-probabilities",
        components=backward_parts,
    )
    value_kept = (
        value_sft.phase(Phase.OPTIMIZER_STEP).components.get(Component.GRADIENTS)
        if value_sft is not None and setup.grad_accum > 1
        else None
    )
    after_head = dict(train)
    if capped:
        # past the head's backward the tanh is freed
        after_head[Component.LOGITS] = Term(
            bytes=logits.bytes - capped, formula=logits.formula + " − the tanh, freed"
        )
    later = _later_moments(
        spec,
        policy_setup,
        forward,
        step,
        value_sft,
        models,
        held,
        after_head,
        caches,
        value_kept,
        score_input,
    )
    moments = [before(logprob_backward, softmax, accumulated)]
    moments += [before(m, softmax, None) for m in later]
    phases.append(max(moments, key=lambda p: p.allocated_bytes))

    # after backward the micro-batch's output is still alive: its logits, its KV cache and
    # the hidden states `output_hidden_states` holds (the saved tensors are freed)
    kept_hidden = Term(
        bytes=tuple_bytes,
        formula=f"({decoder_blocks(spec)} + 1) × {micro}×{seq}×{spec.hidden_size} × "
        f"{4 if hidden_copies else residual} B (the policy's hidden states, kept by its output)",
    )
    step_parts = dict(held)
    step_parts[Component.OPTIMIZER_STATES] = step_states
    step_parts[Component.GRADIENTS] = grads
    step_parts[Component.TEMPORARIES] = policy_and_value(
        step, value_sft, Phase.OPTIMIZER_STEP, Component.TEMPORARIES
    )
    step_parts[Component.LOGITS] = Term(
        bytes=whole + kept.bytes,
        formula=f"{e} B × {micro}×{seq}×{format_count(vocab)} (the micro-batch's logits, still "
        "alive)" + (" + the kept rollout scores" if kept.bytes else ""),
    )
    step_parts[Component.ACTIVATIONS] = kept_hidden
    if caches.bytes:
        step_parts[Component.KV_CACHE] = caches
    step_phase = PhaseBudget(
        phase=Phase.OPTIMIZER_STEP, moment="inside the optimizer step", components=step_parts
    )
    # then the entropy, without gradient: softmax(logits) and its product with the logits.
    # The micro-batch before's softmax (`prob_dist`) dies as the new one is assigned: while
    # the new one is made the two are alive, as the new one and the product are after. Before
    # the last micro-batch of an accumulation the step is skipped (`accelerator.accumulate`):
    # the accumulated gradients are alive through the entropy
    entropy_parts: dict[Component, Term] = {
        k: v for k, v in step_parts.items() if k not in (Component.GRADIENTS, Component.TEMPORARIES)
    }
    if accumulated is not None:
        entropy_parts[Component.GRADIENTS] = Term(
            bytes=grads.bytes,
            formula=grads.formula + ", accumulated (the step comes at the last micro-batch)",
        )
    entropy_parts[Component.TEMPORARIES] = Term(
        bytes=2 * response,
        formula=f"2 × {e} B × {micro}×{r_len}×V (softmax of the logits and its product with "
        "them; or the micro-batch before's softmax and the new one)",
    )
    entropy_phase = PhaseBudget(
        phase=Phase.OPTIMIZER_STEP,
        moment="after the step: the entropy of the micro-batch's logits"
        if accumulated is None
        else "the entropy of a micro-batch's logits, its gradients accumulated",
        components=entropy_parts,
    )
    phases.append(
        max(
            (before(step_phase, softmax, None), entropy_phase),
            key=lambda p: p.allocated_bytes,
        )
    )

    notes = list(sft.notes)
    trainer = {
        "trl": f"TRL {TRL_RELEASE}",
        "llamafactory": "LLaMA-Factory stage: ppo",
        "openrlhf": "OpenRLHF train_ppo_ray",
    }.get(ppo.trainer, ppo.trainer)
    notes.append(
        f"ppo ({trainer}): {rows_local} queries per device per update, generated {chunk} at a "
        f"time up to {r_len} tokens after queries of {q}; {micro} rows of {seq} tokens per "
        "micro-batch through the policy" + (" and the value model" if models.value else "")
    )
    if out32 and ppo.trainer == "trl":
        notes.append(
            "mixed precision: accelerate returns the training forward's logits in fp32 "
            "(convert_outputs_to_fp32), 4 B per logit"
        )
    notes.append("ppo: four models: " + "; ".join(model_lines(spec, setup, ppo, models, reference)))
    if setup.grad_ckpt and not ckpt:
        notes.append(
            "gradient_checkpointing: PPOTrainer (TRL 0.29.1) runs its own loop and never enables "
            "it; the step is sized without"
        )
    if ppo.keep_scores:
        notes.append(
            "the rollout keeps every generated token's fp32 scores over the vocabulary "
            f"({format_count(kept.bytes)} B) through the update (TRL 0.29.1 `logitss`)"
        )
    if setup.distributed.zero_stage == 3 or setup.distributed.fsdp is not None:
        notes.append(
            "ZeRO-3/FSDP: generation gathers the whole policy (ds3_gather_for_generation) and "
            + (
                "the reward model is counted whole on each device; the gather is not counted"
                if ppo.reference_sharded
                else "the frozen models are counted whole on each device; neither is sharded here"
            )
        )
    if ppo.trainer == "openrlhf":
        notes.append(
            "OpenRLHF's PPO is sized with TRL 0.29.1's phases on the actor's GPU, with the "
            "models OpenRLHF puts there (critic and reward only with colocate_all_models, the "
            "reference with colocate_all_models or colocate_actor_ref) and its actor's fp32 "
            "logits (openrlhf 0.11.0 models/actor.py); not checked against a run"
        )
    if ppo.trainer == "llamafactory":
        notes.append(
            "LLaMA-Factory's PPO step is sized with TRL 0.29.1's phases, its own models and "
            "TRL 0.9's fp32 logits as read in its code; not checked against a run"
        )
    budget = budget_from_phases(sft, phases, notes, spec, policy_setup, reference)
    if setup.first_step or budget.first_step_allocated_peak_bytes is None:
        return budget
    # the first update: no optimizer states, no scores kept from an update before
    first_budget = estimate_ppo_budget(spec, replace(setup, first_step=True), ppo, gpu)
    return replace(budget, first_step_allocated_peak_bytes=first_budget.allocated_peak_bytes)


def _later_moments(
    spec: ModelSpec,
    setup: TrainingSetup,
    forward: PhaseBudget,
    step: PhaseBudget,
    value_sft: Budget | None,
    models: PpoModels,
    held: dict[Component, Term],
    train: dict[Component, Term],
    caches: Term,
    value_kept: Term | None,
    score_input: Term,
) -> list[PhaseBudget]:
    """The backward moments after the log-probabilities': the policy's (its first block, the
    end of its backward) with the value backbone's saved tensors still waiting, then the value
    model's with the policy's gradients complete. Autograd runs the policy's nodes first: they
    were made after the value backbone's. The micro-batch's output (its logits, KV cache and
    hidden states) stays alive throughout."""
    kept = train.get(Component.LOGITS, Term(0, ""))
    output = Term(
        bytes=kept.bytes + caches.bytes,
        formula=kept.formula + " + the policy's KV cache (the micro-batch's output)",
    )
    value_acts = Term(0, "")
    value_moments: list[PhaseBudget] = []
    if value_sft is not None and models.value is not None:
        value_forward = value_sft.phase(Phase.FORWARD)
        value_acts = value_forward.components.get(Component.ACTIVATIONS, Term(0, ""))
        value_acts = Term(bytes=value_acts.bytes + score_input.bytes, formula=value_acts.formula)
        value_setup = replace(setup, method=Method.FULL, lora=None, quant=None)
        value_moments = later_backward_moments(
            models.value, value_setup, value_forward, value_sft.phase(Phase.OPTIMIZER_STEP)
        )
    policy_grads = step.components.get(Component.GRADIENTS, Term(0, ""))
    out = []
    for moment in later_backward_moments(spec, setup, forward, step):
        parts = dict(held)
        for comp in (Component.GRADIENTS, Component.TEMPORARIES):
            if comp in moment.components:
                parts[comp] = moment.components[comp]
        if value_kept is not None and value_kept.bytes:
            own = parts.get(Component.GRADIENTS, Term(0, ""))
            parts[Component.GRADIENTS] = Term(
                bytes=own.bytes + value_kept.bytes,
                formula=f"{own.formula} (the policy's) + {value_kept.formula} (the value "
                "model's, accumulated)",
            )
        acts = moment.components.get(Component.ACTIVATIONS, Term(0, ""))
        parts[Component.ACTIVATIONS] = Term(
            bytes=acts.bytes + value_acts.bytes,
            formula=(acts.formula + " + " if acts.bytes else "")
            + "the value backbone's saved tensors (its backward comes after)",
        )
        parts[Component.LOGITS] = output
        out.append(replace(moment, moment="policy: " + moment.moment, components=parts))
    for moment in value_moments:
        parts = dict(held)
        grads = moment.components.get(Component.GRADIENTS, Term(0, ""))
        parts[Component.GRADIENTS] = Term(
            bytes=grads.bytes + policy_grads.bytes,
            formula=f"{grads.formula} (the value model's) + {policy_grads.formula} (the "
            "policy's, complete)",
        )
        for comp in (Component.ACTIVATIONS, Component.TEMPORARIES):
            if comp in moment.components:
                parts[comp] = moment.components[comp]
        parts[Component.LOGITS] = output
        out.append(replace(moment, moment="value model: " + moment.moment, components=parts))
    return out


def _head_moment(
    spec: ModelSpec,
    setup: TrainingSetup,
    models: PpoModels,
    train: dict[Component, Term],
    micro: int,
    seq: int,
    compute: int,
    kept: Term,
    caches: Term,
    hidden_copies: int,
) -> PhaseBudget | None:
    """The policy's LM head inside `PolicyAndValueWrapper.forward` (ppo_trainer.py, TRL
    0.29.1): `output = self.critic_backbone(**kwargs)` is bound until the wrapper returns, so
    the value backbone's output, and in it the KV cache it builds (called without
    `use_cache=False`), is alive through the policy's whole forward. At the head the policy's
    logits exist in the compute dtype only (accelerate's fp32 conversion of the outputs, and
    of the hidden states, comes after the wrapper returns); Gemma-2's soft-capping has the
    head's output beside its division by the cap. None without a value backbone."""
    if models.value is None:
        return None
    value_cache = _training_caches(models.value, setup, micro, seq)
    if not value_cache.bytes:
        return None
    parts = dict(train)
    acts = parts[Component.ACTIVATIONS]
    if hidden_copies:
        acts = Term(
            bytes=acts.bytes - hidden_copies,
            formula=acts.formula + " − the fp32 copies of the hidden states (made later)",
        )
    if not trainability_for(spec, setup).linear_inputs_saved:
        # a frozen head saves nothing, but its input, the final norm's output, is alive while
        # the head runs
        size = dtypes_for(setup).residual
        acts = Term(
            bytes=acts.bytes + size * micro * seq * spec.hidden_size,
            formula=acts.formula + f" + {size} B × {micro}×{seq}×{spec.hidden_size} (the "
            "frozen head's input, the final norm's output)",
        )
    parts[Component.ACTIVATIONS] = acts
    copies = 2 if spec.final_logit_softcapping is not None else 1
    head = copies * micro * seq * spec.vocab_size * compute
    parts[Component.LOGITS] = Term(
        bytes=head + kept.bytes,
        formula=f"{copies} × {compute} B × {micro}×{seq}×{format_count(spec.vocab_size)} (the "
        "LM head's output"
        + (" and its division by the soft-cap" if copies > 1 else "")
        + ")"
        + (f" + {format_count(kept.bytes)} B of kept rollout scores" if kept.bytes else ""),
    )
    parts[Component.KV_CACHE] = Term(
        bytes=caches.bytes + value_cache.bytes,
        formula=f"{caches.formula} + "
        + value_cache.formula.replace("the policy", "the value backbone")
        + " (its output still bound in the wrapper's forward)",
    )
    return PhaseBudget(
        phase=Phase.FORWARD,
        moment="the policy's LM head inside the wrapper's forward, the value backbone's output "
        "(its KV cache) still alive",
        components=parts,
    )


def _training_caches(spec: ModelSpec, setup: TrainingSetup, rows: int, seq: int) -> Term:
    """The wrapper calls the policy without `use_cache=False`: it builds a KV cache (fp32 under
    autocast: the rotary output) that the micro-batch's output keeps until it is deleted. The
    value backbone's dies with its output, inside the wrapper's forward."""
    cache_setup = replace(rollout_setup(setup), batch=rows, seq=seq, new_tokens=0)
    policy = kv_cache_term(spec, cache_setup)
    return Term(bytes=policy.bytes, formula=policy.formula + " (the policy's, never read)")

"""The moments every preference and RL budget shares, on top of the SFT step's.

The policy's later backward moments (the last block as its backward starts, a recomputed block,
the first block, the end of backward), the log-probabilities' backward chosen among them, the
reference copy's weights, the sequence-classification model a reward or value model is, and the
budget made again from a trainer's own phases. llmmem.budget.preference, grpo and ppo build their
steps from these; none of them imports another for them.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.activations import backward_workspace, estimate_activations
from llmmem.budget.overheads import overhead_terms, reserved_and_device_total
from llmmem.budget.preference_setup import LogProbMoments, Reference
from llmmem.budget.result import Budget, Component, Phase, PhaseBudget, Term
from llmmem.budget.setup import Method, TrainingSetup
from llmmem.budget.weights import build_inventory
from llmmem.models.spec import ModelSpec
from llmmem.units import format_count


def reward_spec(spec: ModelSpec, num_labels: int) -> ModelSpec:
    """The model as AutoModelForSequenceClassification builds it: the vocabulary head replaced
    by a score head of hidden × num_labels (no bias), no vocabulary logits."""
    params = replace(spec.params, head=spec.hidden_size * num_labels)
    architecture = spec.architecture.replace("ForCausalLM", "ForSequenceClassification")
    return replace(
        spec,
        params=params,
        architecture=architecture,
        is_causal_lm=False,
        tie_word_embeddings=False,
    )


def reference_copy_term(
    spec: ModelSpec,
    setup: TrainingSetup,
    size: int | None = None,
    sharded: bool = False,
    offloaded: bool = False,
    what: str = "the frozen reference copy",
) -> Term:
    """A reference copy's weights on one device. TRL loads it in the policy's dtype
    (trl/trainer/dpo_trainer.py: `ref_model_init_kwargs.setdefault("dtype",
    self.model.dtype)`), whole on every device; OpenRLHF (0.11.0, cli/train_dpo.py and
    trainer/ray/launcher.py `ReferenceModelActor`) loads it in `--param_dtype` and initialises
    it with `get_ds_eval_config`, ZeRO stage 3 when the training runs stage 3 (partitioned
    across the ranks, each layer gathered as the forward reaches it), else stage 0 (whole);
    `--ref_offload` keeps the partitions on the CPU."""
    size = size or setup.precision.weight_bytes
    world = setup.distributed.world_size
    if offloaded:
        return Term(bytes=0, formula=f"{what}: its weights offloaded to the CPU")
    if sharded and world > 1:
        return Term(
            bytes=-(-spec.total_params * size // world),
            formula=f"{format_count(spec.total_params)} params × {size} B / {world} ranks "
            f"({what}, ZeRO-3 partitioned)",
        )
    return Term(
        bytes=spec.total_params * size,
        formula=f"{format_count(spec.total_params)} params × {size} B ({what})",
    )


def replace_logits(
    phase: PhaseBudget, moment: str, logits: Term, extra: dict[Component, Term]
) -> PhaseBudget:
    """`phase` as `moment`, its logits term `logits`, with `extra`'s terms added."""
    parts: dict[Component, Term] = {
        k: v for k, v in phase.components.items() if k is not Component.LOGITS
    }
    parts[Component.LOGITS] = logits
    parts.update(extra)
    return PhaseBudget(phase=phase.phase, moment=moment, components=parts)


def with_terms(phase: PhaseBudget, extra: dict[Component, Term]) -> PhaseBudget:
    """`phase` with `extra`'s terms added (or put in place of its own)."""
    return PhaseBudget(
        phase=phase.phase, moment=phase.moment, components={**phase.components, **extra}
    )


def without_empty_terms(phase: PhaseBudget) -> PhaseBudget:
    """`phase` without its zero-byte terms (the weights' always shown)."""
    keep = (Component.WEIGHTS,)
    parts = {k: v for k, v in phase.components.items() if v.bytes or k in keep}
    return PhaseBudget(phase=phase.phase, moment=phase.moment, components=parts)


def last_block_moment(
    spec: ModelSpec, setup: TrainingSetup, forward: PhaseBudget
) -> PhaseBudget | None:
    """The last block's backward as it starts (no checkpointing): the head and the final norm
    have given back what they saved, every block's saved tensors are alive, and the block's
    input gradients are in flight. A causal LM's logits moment is larger; a reward model's
    score head leaves this one the peak."""
    if setup.grad_ckpt or not spec.blocks:
        return None
    acts = estimate_activations(spec, setup)
    outside = acts.outside.evaluate(acts.dims)
    workspace, work_text = backward_workspace(spec, setup)
    parts: dict[Component, Term] = {
        k: v
        for k, v in forward.components.items()
        if k not in (Component.LOGITS, Component.ACTIVATIONS, Component.TEMPORARIES)
    }
    parts[Component.ACTIVATIONS] = Term(
        bytes=acts.full_bytes - outside,
        formula="every block's saved tensors (the head's and the final norm's given back)",
    )
    temporaries = forward.components.get(Component.TEMPORARIES)
    parts[Component.TEMPORARIES] = Term(
        bytes=workspace + (temporaries.bytes if temporaries else 0),
        formula=work_text,
    )
    return PhaseBudget(
        phase=Phase.BACKWARD, moment="backward of the last block, as it starts", components=parts
    )


def later_backward_moments(
    spec: ModelSpec, setup: TrainingSetup, forward: PhaseBudget, step: PhaseBudget
) -> list[PhaseBudget]:
    """The backward moments after the log-probabilities' (the SFT step's, which the SFT
    budget reports only when they are its largest): the last block recomputed with the head's
    gradient made (checkpointing), the first block's backward without the embedding's gradient
    yet, and the end of backward with every gradient (a tied weight's two gradients summed into
    a third)."""
    if not spec.blocks:
        return []
    gradients = step.components.get(Component.GRADIENTS, Term(0, "none"))
    kept = gradients.bytes if setup.grad_accum > 1 else 0
    full = setup.method is Method.FULL
    weight = setup.precision.weight_bytes
    head = spec.vocab_size * spec.hidden_size * weight if full and spec.is_causal_lm else 0
    acts = estimate_activations(spec, setup)
    workspace, work_text = backward_workspace(spec, setup)
    held: dict[Component, Term] = {
        k: v
        for k, v in forward.components.items()
        if k in (Component.WEIGHTS, Component.OPTIMIZER_STATES, Component.REFERENCE_MODEL)
    }
    moments = []
    if setup.grad_ckpt:
        moments.append(
            PhaseBudget(
                phase=Phase.BACKWARD,
                moment="recompute of the last block",
                components={
                    **held,
                    Component.GRADIENTS: Term(
                        bytes=kept or head, formula="the head's gradient" if not kept else ""
                    ),
                    # the final norm's and the head's backward have given theirs back
                    Component.ACTIVATIONS: Term(
                        bytes=forward.components.get(Component.ACTIVATIONS, Term(0, "")).bytes
                        - acts.final_bytes,
                        formula="the checkpointed blocks' inputs",
                    ),
                    Component.TEMPORARIES: Term(
                        bytes=acts.largest_block_bytes + workspace,
                        formula=f"one block recomputed + {work_text}",
                    ),
                },
            )
        )
    else:
        embedding = head if not kept and not setup.distributed.is_multi_gpu else 0
        moments.append(
            PhaseBudget(
                phase=Phase.BACKWARD,
                moment="backward of the first block",
                components={
                    **held,
                    Component.GRADIENTS: Term(
                        bytes=gradients.bytes - embedding,
                        formula=gradients.formula
                        + (" − the token embedding's (still to come)" if embedding else ""),
                    ),
                    Component.ACTIVATIONS: Term(
                        bytes=acts.largest_block_bytes, formula="the first block's saved tensors"
                    ),
                    Component.TEMPORARIES: Term(bytes=workspace, formula=work_text),
                },
            )
        )
    tied = 2 * head if spec.tie_word_embeddings and not kept else 0
    moments.append(
        PhaseBudget(
            phase=Phase.BACKWARD,
            moment="end of backward: every gradient complete",
            components={
                **held,
                Component.GRADIENTS: gradients,
                Component.TEMPORARIES: Term(
                    bytes=tied, formula="the tied weight's two gradients, summed into it"
                ),
            },
        )
    )
    return [without_empty_terms(m) for m in moments]


def backward_phase(
    sft_backward: PhaseBudget,
    policy_forward: PhaseBudget,
    lp: LogProbMoments,
    extra: dict[Component, Term],
    last_block: PhaseBudget | None,
    later: list[PhaseBudget],
) -> PhaseBudget:
    """The larger of the log-softmax backward (the policy forward's tensors, with the
    log-probability backward's in place of the logits) and the SFT step's other backward
    moments (a recomputed block, the end of backward), which the log-probabilities do not
    touch."""
    start = replace_logits(
        policy_forward,
        "backward of the log-probabilities",
        Term(bytes=lp.backward_peak, formula=lp.formula_backward),
        {},
    )
    others = ([last_block] if last_block else []) + later
    if not sft_backward.moment.startswith(("start of backward", "head backward")):
        others.append(sft_backward)
    # the policy forward's parts carry the reference copy already; the others get it here
    candidates = [start] + [with_terms(moment, extra) for moment in others]
    chosen = max(candidates, key=lambda p: p.allocated_bytes)
    return replace(chosen, phase=Phase.BACKWARD)


def budget_from_phases(
    sft: Budget,
    phases: list[PhaseBudget],
    notes: list[str],
    spec: ModelSpec,
    setup: TrainingSetup,
    reference: Reference,
) -> Budget:
    """The budget of the phases, with what sits beside the allocated peak worked out again:
    the churn of the new peak, and the reference copy's tensors among the large ones. The SFT
    loss's 16-bit logits hole is not there: these logits are never upcast whole, and the
    backward's 16-bit tensors reuse their blocks."""
    peak = max(phases, key=lambda p: p.allocated_bytes)
    transient = sum(
        term.bytes
        for comp, term in peak.components.items()
        if comp in (Component.ACTIVATIONS, Component.TEMPORARIES, Component.WEIGHT_COPIES)
    )
    inventory = build_inventory(spec, setup)
    live = sum(g.tensors for g in inventory.groups if g.numel * g.bytes_per_param > 2**20)
    if reference is Reference.COPY:
        live *= 2
    overheads = overhead_terms(setup, transient, live, 0)
    reserved, device_total = reserved_and_device_total(peak.allocated_bytes, overheads)
    return replace(
        sft,
        phases=phases,
        peak_phase=peak.phase,
        allocated_peak_bytes=peak.allocated_bytes,
        overheads=overheads,
        reserved_peak_bytes=reserved,
        device_total_bytes=device_total,
        notes=notes,
    )

"""PPO's four models on one GPU: the policy and the value model trained together (one optimizer
over both), the frozen reference and reward models beside them; their weights, their summed
terms, the value score head's input, and the line each gets in the notes.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmem.budget.activations import dtypes_for, head_input_dtype
from llmmem.budget.ppo_setup import PpoSetup
from llmmem.budget.preference_moments import reference_copy_term, reward_spec
from llmmem.budget.preference_setup import Reference
from llmmem.budget.result import Budget, Component, Phase, PhaseBudget, Term
from llmmem.budget.setup import TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.units import format_count


@dataclass(frozen=True)
class PpoModels:
    """The models of the update as they are sized: the policy, the value model as a
    sequence-classification model, and the frozen reward model."""

    policy: ModelSpec
    value: ModelSpec | None  # None: a value head on the policy
    reward: ModelSpec | None  # None: no separate reward model


def models_of(spec: ModelSpec, ppo: PpoSetup) -> PpoModels:
    """The update's models: the value and reward models as sequence-classification models (a
    score head of hidden × 1), each of its own size or the policy's."""
    value = reward_spec(ppo.value_model or spec, 1) if ppo.value == "model" else None
    reward = reward_spec(ppo.reward_model or spec, 1) if ppo.reward == "model" else None
    return PpoModels(spec, value, reward)


def policy_and_value(
    policy: PhaseBudget, value_sft: Budget | None, phase: Phase, component: Component
) -> Term:
    """`component` of the policy's phase and of the value model's same phase, summed."""
    value = value_sft.phase(phase).components.get(component) if value_sft else None
    return sum_terms(policy.components.get(component), value, "the policy's", "the value model's")


def sum_terms(a: Term | None, b: Term | None, what_a: str, what_b: str) -> Term:
    parts = [(t, w) for t, w in ((a, what_a), (b, what_b)) if t is not None and t.bytes]
    return Term(
        bytes=sum(t.bytes for t, _ in parts),
        formula=" + ".join(f"{t.formula} ({w})" for t, w in parts) or "none",
    )


def weights_term(
    forward: PhaseBudget, value_sft: Budget | None, models: PpoModels, ppo: PpoSetup
) -> Term:
    policy = forward.components[Component.WEIGHTS]
    if value_sft is None:
        return Term(
            bytes=policy.bytes,
            formula=policy.formula
            + " (the policy"
            + (", its value head" if ppo.value == "head" else "")
            + ")",
        )
    value = value_sft.phase(Phase.FORWARD).components[Component.WEIGHTS]
    return sum_terms(policy, value, "the policy", "the value model, trained in full")


def frozen_term(
    spec: ModelSpec, setup: TrainingSetup, models: PpoModels, reference: Reference, ppo: PpoSetup
) -> Term:
    size = setup.precision.weight_bytes
    parts = []
    if reference is Reference.COPY:
        copy = reference_copy_term(
            spec, setup, ppo.reference_bytes, ppo.reference_sharded, ppo.reference_offloaded
        )
        if copy.bytes:
            parts.append((copy.bytes, copy.formula))
    if models.reward is not None:
        parts.append(
            (
                models.reward.total_params * size,
                f"{format_count(models.reward.total_params)} params × {size} B (the reward model)",
            )
        )
    return Term(bytes=sum(b for b, _ in parts), formula=" + ".join(f for _, f in parts) or "none")


def score_input_term(value: ModelSpec | None, setup: TrainingSetup, rows: int, seq: int) -> Term:
    """The value model's score head (hidden × 1) runs over every position
    (`self.value_model.score(output.hidden_states[-1])` in `PolicyAndValueWrapper.forward`) and
    keeps its input for the weight's gradient: the final norm's output, rows × seq × hidden in
    the residual stream's dtype (autocast's 16-bit cast of it under mixed precision). A
    sequence-classification model's activations leave it out (no vocabulary head)."""
    if value is None:
        return Term(0, "")
    size = head_input_dtype(dtypes_for(setup))
    return Term(
        bytes=size * rows * seq * value.hidden_size,
        formula=f"{size} B × {rows}×{seq}×{value.hidden_size} (the value score head's input)",
    )


def model_lines(
    spec: ModelSpec, setup: TrainingSetup, ppo: PpoSetup, models: PpoModels, reference: Reference
) -> list[str]:
    """The four models, one line each: what they are and whether they train."""
    policy = spec.model_id + (" (its LoRA adapter trains)" if setup.lora else " (trains in full)")
    if ppo.value == "remote":
        value = (ppo.value_name or "a critic") + " on GPUs of its own (nothing on this GPU)"
    elif models.value is None:
        value = "a value head on the policy (hidden × 1, trains)"
    else:
        name = ppo.value_name or "the policy's size"
        value = (
            f"{name}, a sequence-classification model of "
            f"{format_count(models.value.total_params)} params, trains in full"
        )
    ref = {
        Reference.COPY: "a frozen copy ("
        + reference_copy_term(
            spec,
            setup,
            ppo.reference_bytes,
            ppo.reference_sharded,
            ppo.reference_offloaded,
            "on this GPU",
        ).formula
        + ")",
        Reference.ADAPTER: "the policy with its adapter disabled (no copy)",
        Reference.NONE: "on GPUs of its own (nothing on this GPU)",
    }.get(reference, reference.value)
    if models.reward is not None:
        name = ppo.reward_name or "the policy's size"
        reward = f"{name}, frozen ({format_count(models.reward.total_params)} params)"
    elif ppo.reward == "adapter":
        reward = "a second adapter on the policy (no copy)"
    else:
        reward = (ppo.reward_name or "a reward server") + " (nothing on this GPU)"
    return [f"policy {policy}", f"value model {value}", f"reference {ref}", f"reward {reward}"]

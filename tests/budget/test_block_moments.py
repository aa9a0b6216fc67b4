"""Moments inside a block and around the final norm, counted by hand from the code that makes
them (transformers 5.24's decoder layers, eager attention and masks; torch autograd's backward
nodes), for the steps where no vocabulary logits outweigh them: reward models, and
checkpointed blocks. The CPU steps that check them phase by phase are in test_preference.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmmem.budget.activations import backward_workspace, estimate_activations
from llmmem.budget.preference import estimate_preference_budget
from llmmem.budget.preference_setup import Objective, PreferenceSetup
from llmmem.budget.result import Component, Phase
from llmmem.budget.setup import AttnImpl, LoraSetup, SetupError, TrainingSetup
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.preference_grid import SMALL

# the preference grid's tiny configs: Llama (GQA, 64 wide, MLP 160, 1,000 tokens, untied) and
# Gemma-2 at the same size (eager attention, sliding and full layers, soft-capped logits)
LLAMA = SMALL["llama"]
GEMMA2 = SMALL["gemma2"]
B, S = 2, 64
N = B * S


def _spec(config: dict):  # type: ignore[no-untyped-def]
    return spec_from_config(config, model_id="tiny", source=ModelSource.CONFIG)


def _setup(**kw) -> TrainingSetup:  # type: ignore[no-untyped-def]
    return TrainingSetup(batch=B, seq=S, optim="adamw_torch", **kw)


def _outside(config: dict, **kw) -> int:  # type: ignore[no-untyped-def]
    acts = estimate_activations(_spec(config), _setup(**kw))
    return acts.outside.evaluate(acts.dims)


def test_eager_masks_outlive_the_forward_only_as_checkpointed_inputs() -> None:
    # transformers builds one additive mask per kind of layer, rows × tokens², in the
    # embeddings' dtype; `scores + mask` keeps nothing, so without checkpointing the masks
    # are gone when the model returns. Gemma-2 mixes sliding and full layers: two masks
    eager = {"attn": AttnImpl.EAGER}
    for config, kinds in ((GEMMA2, 2), (LLAMA, 1)):
        for precision, dtype_bytes in (("fp32", 4), ("bf16-true", 2), ("bf16", 4)):
            ckpt = _outside(config, grad_ckpt=True, precision=precision, **eager)
            no_ckpt = _outside(config, precision=precision, **eager)
            assert ckpt - no_ckpt == kinds * dtype_bytes * B * S * S, (config, precision)
    # SDPA (Llama): no additive mask at all
    assert _outside(LLAMA, grad_ckpt=True) == _outside(LLAMA)


def test_a_gated_mlps_backward_holds_three_of_its_gradients() -> None:
    # MulBackward of act(gate) * up makes both inputs' gradients while the product's is
    # alive: three N·I tensors beside the residual's N·h. Where the down projection keeps
    # the product (full fine-tuning), its backward gives that back first: two beyond the
    # saved tensors, the count kept for every other block
    spec = _spec(LLAMA)
    h, i = 64, 160
    lora = _setup(method="lora", precision="bf16-true", lora=LoraSetup(targets=["q_proj"]))
    assert backward_workspace(spec, lora)[0] == 2 * N * h + 3 * 2 * N * i
    full = _setup(precision="bf16-true")
    assert backward_workspace(spec, full)[0] == 2 * 2 * N * h + 2 * 2 * N * i
    # a LoRA on the down projection keeps the product too where it reads it as it is (fp32);
    # over bf16 weights PEFT keeps its own fp32 cast instead, and the product goes
    down = _setup(method="lora", precision="fp32", lora=LoraSetup(targets=["down_proj"]))
    assert backward_workspace(spec, down)[0] == 2 * 4 * N * h + 2 * 4 * N * i
    down_bf16 = replace(down, precision="bf16-true")
    assert backward_workspace(spec, down_bf16)[0] == 2 * N * h + 3 * 2 * N * i


def test_gemma2s_last_norm_backward_can_outweigh_its_mlps() -> None:
    # the post-feedforward norm ends each block: its backward runs first, beside every tensor
    # the block keeps, with five fp32 N·h tensors in its pow branch
    spec = _spec(GEMMA2)
    setup = _setup(method="lora", precision="bf16-true", lora=LoraSetup(targets=["q_proj"]))
    norm = 2 * N * 64 + 5 * 4 * N * 64
    mlp = 2 * N * 64 + 3 * 2 * N * 160
    assert norm > mlp
    assert backward_workspace(spec, setup)[0] == norm


def test_the_first_blocks_own_gradients_come_during_its_backward() -> None:
    # a reward model, fully fine-tuned in fp32 with checkpointing: its backward peaks in the
    # first block, whose MLP backward runs with only the down projection's weight gradient
    # made among the block's own, and without the token embedding's (the last to come)
    spec = _spec(LLAMA)
    setup = _setup(precision="fp32", grad_ckpt=True)
    budget = estimate_preference_budget(spec, setup, PreferenceSetup(objective=Objective.REWARD))
    backward = budget.phase(Phase.BACKWARD)
    assert backward.moment == "backward of the first block"
    h, i, kvd, vocab = 64, 160, 32, 1000
    block = h * h * 2 + 2 * h * kvd + 3 * h * i + 2 * h  # q, o; k, v; MLP; two norms
    total = vocab * h + 2 * block + h + h  # embedding, blocks, final norm, score head
    to_come = block - i * h
    expected = 4 * (total - vocab * h - to_come)
    assert backward.components[Component.GRADIENTS].bytes == expected


def test_a_reward_model_names_its_score_head_in_modules_to_save() -> None:
    # TRL's RewardTrainer recommends modules_to_save=["score"]: the head trains whole, a
    # hidden × 1 copy beside the frozen one
    spec = _spec(LLAMA)
    lora = _setup(method="lora", lora=LoraSetup(targets=["q_proj"], modules_to_save=["score"]))
    reward = PreferenceSetup(objective=Objective.REWARD)
    plain = _setup(method="lora", lora=LoraSetup(targets=["q_proj"]))
    with_score = estimate_preference_budget(spec, lora, reward)
    without = estimate_preference_budget(spec, plain, reward)
    grads = [
        b.phase(Phase.OPTIMIZER_STEP).components[Component.GRADIENTS].bytes
        for b in (with_score, without)
    ]
    assert grads[0] - grads[1] == 4 * 64
    # a causal LM has no score head: a clear error, not a silent zero
    from llmmem.budget.phases import estimate_budget

    with pytest.raises(SetupError, match="sequence-classification head"):
        estimate_budget(spec, lora)

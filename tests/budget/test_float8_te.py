"""TransformerEngine's FP8 step as accelerate 1.15.0 runs it (convert_model's te.Linear under
DelayedScaling, read in transformer_engine 2.20.2; unmeasured here: it needs CUDA). The budget
of a small Llama differs from the bf16 autocast budget by exactly the terms read in TE's code,
computed here from the shapes:

- each converted Linear saves its own column-wise FP8 copy of its input (1 byte) where a plain
  Linear under autocast keeps a 16-bit cast of an fp32 input (2 bytes each) or the 16-bit tensor
  it reads (shared);
- each converted Linear's FP8 weight, row- and column-wise on Ada and Hopper (2 bytes a weight),
  saved for backward: as many bytes as autocast's 16-bit copy it replaces;
- DelayedScaling's amax history and scales: (1024 + 1) × 5 fp32 per te.Linear;
- one Linear's row-wise FP8 input while its GEMM runs (1 byte × N × its input width) in forward,
  and in the head's backward the logits' gradient quantized row- and column-wise (2·N·V)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from llmmem.budget import Component, Phase, SetupError, TrainingSetup, estimate_budget
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource, ModelSpec

LAYERS, HIDDEN, INTER, VOCAB = 2, 256, 704, 32000
BATCH, SEQ = 2, 64
N = BATCH * SEQ
AMAX_PER_LINEAR = (1024 + 1) * 5 * 4


def llama(**overrides: Any) -> ModelSpec:
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        **overrides,
    }
    return spec_from_config(config, model_id="tiny-llama", source=ModelSource.LOCAL)


def parts(spec: ModelSpec, setup: TrainingSetup, phase: Phase) -> dict[Component, int]:
    found = estimate_budget(spec, setup).phase(phase)
    return {component: term.bytes for component, term in found.components.items()}


BF16 = TrainingSetup(batch=BATCH, seq=SEQ)  # bf16 autocast over fp32 weights
TE = replace(BF16, float8_te=True)


def test_te_budget_differs_from_bf16_by_the_terms_read_in_transformer_engine() -> None:
    spec = llama()
    q = HIDDEN  # 4 heads of 64
    # every Linear divides by 16: the 7 of each block and the head are te.Linear
    te_linears = LAYERS * 7 + 1
    per_block = (
        -3 * N * HIDDEN  # q, k, v: three 1-byte FP8 copies for three 2-byte casts of the fp32 norm
        - 2 * N * HIDDEN  # gate, up: the same, two of them
        + N * q  # o_proj: its FP8 copy beside the attention output SDPA keeps anyway
        - N * INTER  # down_proj: a 1-byte copy instead of the 2-byte product it kept
    )
    head_input = -N * HIDDEN  # the head's 1-byte copy for autocast's 2-byte cast
    amax = te_linears * AMAX_PER_LINEAR
    row_wise_input = N * INTER  # down_proj's input is the widest a GEMM reads
    logits_gradient = 2 * N * VOCAB

    bf16_fwd, te_fwd = parts(spec, BF16, Phase.FORWARD), parts(spec, TE, Phase.FORWARD)
    assert te_fwd[Component.ACTIVATIONS] - bf16_fwd[Component.ACTIVATIONS] == (
        LAYERS * per_block + head_input
    )
    assert te_fwd[Component.WEIGHT_COPIES] - bf16_fwd[Component.WEIGHT_COPIES] == (
        amax + row_wise_input
    )
    for same in (Component.WEIGHTS, Component.OPTIMIZER_STATES, Component.LOGITS):
        assert te_fwd[same] == bf16_fwd[same]

    # the step's backward peak is the head's backward, on both roads
    bf16_bwd, te_bwd = parts(spec, BF16, Phase.BACKWARD), parts(spec, TE, Phase.BACKWARD)
    assert te_bwd[Component.WEIGHT_COPIES] - bf16_bwd[Component.WEIGHT_COPIES] == (
        amax + logits_gradient
    )
    assert te_bwd[Component.ACTIVATIONS] - bf16_bwd[Component.ACTIVATIONS] == (
        LAYERS * per_block + head_input
    )
    assert te_bwd[Component.GRADIENTS] == bf16_bwd[Component.GRADIENTS]
    assert parts(spec, TE, Phase.OPTIMIZER_STEP) == parts(spec, BF16, Phase.OPTIMIZER_STEP)


def test_a_linear_that_does_not_divide_by_16_ends_its_parents_conversion() -> None:
    """32 heads of 8 with one key-value head: k_proj and v_proj are 256 × 8. convert_model
    returns at k_proj, so v_proj and o_proj (256 × 256, which divides) stay nn.Linear: autocast
    keeps its 16-bit copies of the three, and their inputs as before."""
    spec = llama(num_attention_heads=32, num_key_value_heads=1)
    te_linears = LAYERS * 4 + 1  # q, gate, up, down and the head
    per_block = (
        -1 * N * HIDDEN  # q alone trades its 2-byte cast for a 1-byte copy; k, v keep theirs
        - 2 * N * HIDDEN  # gate, up
        - N * INTER  # down_proj
    )  # o_proj: nothing new beside SDPA's output
    bf16_fwd, te_fwd = parts(spec, BF16, Phase.FORWARD), parts(spec, TE, Phase.FORWARD)
    assert te_fwd[Component.ACTIVATIONS] - bf16_fwd[Component.ACTIVATIONS] == (
        LAYERS * per_block - N * HIDDEN
    )
    assert te_fwd[Component.WEIGHT_COPIES] - bf16_fwd[Component.WEIGHT_COPIES] == (
        te_linears * AMAX_PER_LINEAR + N * INTER
    )


@pytest.mark.parametrize(
    ("spec_overrides", "setup_change", "reason"),
    [
        ({}, {"grad_ckpt": True}, "gradient checkpointing"),
        ({"tie_word_embeddings": True}, {}, "tied LM head"),
        ({}, {"batch": 1, "seq": 63}, "divide by 8"),
        ({}, {"framework": "torchtune", "precision": "bf16-true"}, "not torchtune's"),
    ],
)
def test_what_te_does_not_size_is_refused_with_its_reason(
    spec_overrides: dict[str, Any], setup_change: dict[str, Any], reason: str
) -> None:
    with pytest.raises(SetupError, match=reason) as err:
        estimate_budget(llama(**spec_overrides), replace(TE, **setup_change))
    assert str(err.value).startswith("TransformerEngine's FP8: ")
    assert "\n" not in str(err.value)


def test_te_and_torchao_together_or_under_lora_are_refused() -> None:
    with pytest.raises(SetupError, match="not both"):
        replace(TE, float8=True)
    with pytest.raises(SetupError, match="full fine-tuning"):
        TrainingSetup(method="lora", float8_te=True)

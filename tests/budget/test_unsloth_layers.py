"""unsloth's own layer functions (unsloth 2026.10.9, read from its code; its kernels need CUDA,
so no step of its own runs here): what a decoder layer keeps for backward where unsloth's
`patch_peft_model` runs LoRA_QKV, LoRA_W and LoRA_MLP and its fast RMSNorm.

The expected bytes are written out from unsloth's `save_for_backward` calls, tensor by tensor
(kernels/fast_lora.py :448, :845, :1073; kernels/rms_layernorm.py :981), with attention's own
tensors as SDPA keeps them (q, k, v, the output, an fp32 log-sum-exp a row and head)."""

from __future__ import annotations

import pytest

from llmmem.budget.activations import estimate_activations
from llmmem.budget.setup import (
    Framework,
    LoraSetup,
    Method,
    Precision,
    QuantSetup,
    QuantType,
    TrainingSetup,
)
from llmmem.budget.stacks.unsloth import UNSLOTH_STACK, unsloth_block_rules
from llmmem.models.resolve import resolve_model
from llmmem.models.spec import ModelSpec

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
BATCH, SEQ = 2, 4096


def setup_for(dropout: float = 0.0, targets: list[str] | None = None) -> TrainingSetup:
    """unsloth's T4 notebook: QLoRA r 32 over a 4-bit base, fp16, 2 × 4096, no checkpointing."""
    return TrainingSetup(
        method=Method.QLORA,
        batch=BATCH,
        seq=SEQ,
        precision=Precision.FP16_TRUE,
        optim="adamw_8bit",
        lora=LoraSetup(r=32, alpha=32, targets=targets or ALL_LINEAR, dropout=dropout),
        quant=QuantSetup(
            quant_type=QuantType.NF4,
            double_quant=True,
            prepare_for_kbit_training=False,
            compute_dtype_bytes=2,
        ),
        framework=Framework.UNSLOTH,
    )


def per_layer(spec: ModelSpec, setup: TrainingSetup) -> int:
    setup = UNSLOTH_STACK.prepare(setup)
    acts = estimate_activations(spec, setup, unsloth_block_rules(spec, setup))
    ((group, _),) = acts.per_block
    return acts.per_block_bytes(group)


@pytest.fixture(scope="module")
def tinyllama() -> ModelSpec:
    return resolve_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0", hub=False)


def test_a_fused_layer_keeps_what_unsloths_functions_save(tinyllama: ModelSpec) -> None:
    spec = tinyllama
    n = BATCH * SEQ
    h, q, kv, inter = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.intermediate_size
    fp16 = 2
    expected = (
        2 * fp16 * n * h  # the two fast RMSNorms: each its fp16 input (rsqrt rows: left out)
        + fp16 * n * h  # LoRA_QKV: its input, the first norm's output
        + fp16 * n * (q + 2 * kv)  # SDPA: q, k, v after the in-place rotary
        + fp16 * n * q  # SDPA's output, which LoRA_W reads as it is
        + 4 * BATCH * spec.num_attention_heads * SEQ  # SDPA's log-sum-exp, fp32
        + fp16 * n * h  # LoRA_MLP: its input, the second norm's output
        + 2 * fp16 * n * inter  # LoRA_MLP: the gate's and the up projection's outputs
    )
    assert per_layer(spec, setup_for()) == expected


def test_lora_dropout_keeps_peft_forward_and_its_copies(tinyllama: ModelSpec) -> None:
    """unsloth fuses only with lora_dropout 0 (models/llama.py :5330): with dropout each
    adapter keeps a mask and a dropped copy of its input, as PEFT's forward does."""
    fused = per_layer(tinyllama, setup_for())
    dropped = per_layer(tinyllama, setup_for(dropout=0.05))
    assert dropped > fused + 7 * tinyllama.hidden_size * BATCH * SEQ


def test_a_group_without_every_adapter_is_not_fused(tinyllama: ModelSpec) -> None:
    """LoRA on q and v only: LoRA_QKV needs q, k and v adapted, LoRA_MLP gate, up and down, so
    both keep PEFT's forward and its tensors; only the norms are unsloth's (each keeps its
    fp16 input where transformers' keeps an fp32 copy: 2 B × N·h less a norm)."""
    from llmmem.budget.activations import TRANSFORMERS_RULES

    setup = UNSLOTH_STACK.prepare(setup_for(targets=["q_proj", "v_proj"]))
    peft = estimate_activations(tinyllama, setup, TRANSFORMERS_RULES)
    ((group, _),) = peft.per_block
    n = BATCH * SEQ
    assert per_layer(tinyllama, setup) == peft.per_block_bytes(group) - 2 * 2 * n * (
        tinyllama.hidden_size
    )


def test_the_hf_stack_keeps_its_own_rules(tinyllama: ModelSpec) -> None:
    from llmmem.budget.stacks.hf import HF_STACK

    setup = setup_for()
    rules = HF_STACK.block_rules(tinyllama, setup)
    assert not rules.fast_lora and not rules.fast_norm


def test_the_budget_says_which_functions_it_counted(tinyllama: ModelSpec) -> None:
    (note,) = UNSLOTH_STACK.notes(tinyllama, UNSLOTH_STACK.prepare(setup_for()))
    assert "LoRA_MLP" in note and "RMSNorm" in note
    (note,) = UNSLOTH_STACK.notes(tinyllama, UNSLOTH_STACK.prepare(setup_for(dropout=0.1)))
    assert "LoRA_MLP" not in note and "RMSNorm" in note

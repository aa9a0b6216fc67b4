"""torchtune's own stack (llmmem.budget.stacks.torchtune): the budget of `--framework torchtune`
and of a torchtune YAML, where torchtune's code keeps other tensors than the HF stack.

Each expected number is derived from torchtune 0.6.1's and torchao 0.14.1's code (the stack
module's docstring cites it) and was measured on the CPU against torchtune's own step
(`python bench/torchtune_steps.py`, every phase within 3% at both sizes); the HF budget of the
same setup sizes bitsandbytes, PEFT's fp32 adapters, transformers' blocks and HF's loss instead.
"""

from __future__ import annotations

import math

import pytest

from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Component, GpuTarget, Overhead, Phase
from llmmem.budget.setup import (
    Framework,
    LoraSetup,
    LossImpl,
    Method,
    Precision,
    SetupError,
    TrainingSetup,
)
from llmmem.budget.stacks.torchtune import TORCHTUNE_STACK
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource

# a tiny Llama 3 (grouped K/V heads, untied head)
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
SPEC = spec_from_config(CONFIG, model_id="tiny-llama3", source=ModelSource.CONFIG)
H, MLP, V, LAYERS = 256, 768, 4096, 2
Q, KV = 256, 64  # query and key/value widths (8 heads and 2 K/V heads of 32)
BATCH, SEQ = 2, 256
N = BATCH * SEQ
ALL_LINEAR = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def setup(**changes: object) -> TrainingSetup:
    values: dict[str, object] = {
        "method": Method.FULL,
        "batch": BATCH,
        "seq": SEQ,
        "precision": Precision.BF16_TRUE,
        "loss": LossImpl.CHUNKED,
        "framework": Framework.TORCHTUNE,
    }
    values.update(changes)
    return TrainingSetup(**values)  # type: ignore[arg-type]


def lora(**changes: object) -> TrainingSetup:
    return setup(method=Method.LORA, lora=LoraSetup(r=8, alpha=16, targets=ALL_LINEAR), **changes)


def phase_part(setup_: TrainingSetup, phase: Phase, component: Component) -> int:
    budget = estimate_budget(SPEC, setup_, with_first_step=False)
    term = budget.phase(phase).components.get(component)
    return term.bytes if term is not None else 0


def test_qlora_holds_torchao_nf4_blocks_beside_bf16_embeddings_and_adapters() -> None:
    """torchao keeps 0.5 B per value, an int8 scaler per 64 values and a bf16 factor per 256
    scalers, and per tensor a 16-entry table and the scalers' mean in bf16; nothing else is
    upcast (no k-bit preparation) and the adapters are bf16."""
    qlora = setup(method=Method.QLORA, lora=LoraSetup(r=8, alpha=16, targets=ALL_LINEAR))
    shapes = [
        (Q, H),
        (KV, H),
        (KV, H),
        (H, Q),
        (MLP, H),
        (MLP, H),
        (H, MLP),
    ]  # q k v o gate up down
    nf4 = (
        sum(rows * cols * (0.5 + 1 / 64 + 2 / (64 * 256)) + 17 * 2 for rows, cols in shapes)
        * LAYERS
    )
    bf16 = 2 * (V * H + V * H + (2 * LAYERS + 1) * H)  # embeddings, head, norms
    adapters = (
        2 * LAYERS * sum(8 * (rows + cols) for rows, cols in shapes if (rows, cols) != (KV, H))
    )
    adapters += 2 * LAYERS * 8 * (KV + H)  # v's adapter (k has none)
    rope = 4 * 1024 * 32  # the fp32 RoPE table, max_position_embeddings × head_dim
    weights = phase_part(qlora, Phase.OPTIMIZER_STEP, Component.WEIGHTS)
    assert weights == round(nf4) + bf16 + adapters + rope
    # torch AdamW's states follow the bf16 adapters: 2 × 2 B a value
    assert phase_part(qlora, Phase.OPTIMIZER_STEP, Component.OPTIMIZER_STATES) == 2 * adapters
    hf = phase_part(replace_framework(qlora), Phase.OPTIMIZER_STEP, Component.WEIGHTS)
    assert hf > weights  # PEFT's fp32 adapters, fp32 norms, embeddings and head


def replace_framework(setup_: TrainingSetup) -> TrainingSetup:
    from dataclasses import replace

    return replace(setup_, framework=Framework.HF)


def test_chunked_loss_keeps_every_chunks_fp32_log_softmax_and_upcasts_one_chunk() -> None:
    """CEWithChunkedOutputLoss: the bf16 logits of 8 chunks and every chunk's fp32
    log-softmax, one chunk's fp32 copy while its loss runs; backward starts with the
    log-softmaxes (the recipe deleted the logits) and one chunk's two fp32 gradients."""
    chunk = BATCH * math.ceil(SEQ / 8) * V
    assert phase_part(lora(), Phase.FORWARD, Component.LOGITS) == 6 * N * V + 4 * chunk
    budget = estimate_budget(SPEC, lora(), with_first_step=False)
    backward = budget.phase(Phase.BACKWARD)
    assert "log-softmax" in backward.moment
    assert backward.components[Component.LOGITS].bytes == 4 * N * V + 8 * chunk
    # the HF budget's chunked loss (litgpt's: 128 positions, logits and log-softmax in bf16)
    assert phase_part(replace_framework(lora()), Phase.FORWARD, Component.LOGITS) == 4 * N * V


def test_num_output_chunks_sizes_the_chunk() -> None:
    four = lora(loss_chunks=4)
    assert phase_part(four, Phase.FORWARD, Component.LOGITS) == 6 * N * V + 4 * N * V // 4


def test_a_trainable_heads_gradients_from_two_chunks_are_summed_into_a_third() -> None:
    """Full fine-tuning: the head's weight gradient comes from each chunk; autograd adds the
    first two into a new tensor (then accumulates in place), two chunks' logits gradients
    done. The sum is the head's gradient the budget counts beside; with the optimizer in
    backward (no gradient kept beside) the loss's moment counts it."""
    chunk = BATCH * math.ceil(SEQ / 8) * V
    head = TORCHTUNE_STACK.loss(SPEC, setup())
    assert head is not None
    assert head.moments.head_backward == 2 * (N * V - 2 * chunk) + 2 * 2 * V * H
    in_backward = TORCHTUNE_STACK.loss(SPEC, setup(optimizer_in_backward=True))
    assert in_backward is not None
    assert in_backward.moments.head_backward == head.moments.head_backward + 2 * V * H
    frozen_head = TORCHTUNE_STACK.loss(SPEC, lora())
    assert frozen_head is not None and frozen_head.moments.head_backward == 2 * N * V


def test_full_blocks_keep_fp32_norm_outputs_and_kv_copied_to_every_head() -> None:
    """torchtune's RMSNorm multiplies its scale into the fp32 tensor, which a trainable scale
    keeps (8·N·h a norm with its fp32 input, 2·N·h its bf16 output the projections keep);
    attention keeps q, K and V copied to all 8 heads, and its output: 4 × 2·N·q."""
    per_block = 2 * 10 * N * H + 4 * 2 * N * Q + 8 * N * MLP + 4 * BATCH * 8 * SEQ
    final = 8 * N * H + 2 * N * H  # the final norm's fp32 tensors and the head's input
    assert phase_part(setup(), Phase.FORWARD, Component.ACTIVATIONS) == LAYERS * per_block + final
    hf = phase_part(replace_framework(setup()), Phase.FORWARD, Component.ACTIVATIONS)
    # transformers keeps K and V at their 2 heads and the normalised tensor in bf16
    assert hf == LAYERS * (per_block - 2 * 2 * N * (Q - KV) - 2 * 2 * N * H) + final - 2 * N * H


def test_activation_offloading_is_the_estimate_not_a_floor() -> None:
    """OffloadActivations moves every saved tensor of 1 KiB or more: the offloaded step is
    the estimate (the HF budget keeps the step without it and lowers only the band)."""
    plain = estimate_budget(SPEC, lora(grad_ckpt=True))
    offloaded = estimate_budget(SPEC, lora(grad_ckpt=True, activation_offload=True))
    assert offloaded.band_floor is None
    assert offloaded.allocated_peak_bytes < plain.allocated_peak_bytes
    # after forward: the final norm's fp32 input and rsqrt, and the last layer's input, still
    # in the stash of the 5 latest offloaded tensors
    forward = offloaded.phase(Phase.FORWARD).components[Component.ACTIVATIONS].bytes
    assert forward == 4 * N * H + 4 * N + 2 * N * H
    hf = estimate_budget(SPEC, replace_framework(lora(grad_ckpt=True, activation_offload=True)))
    assert hf.band_floor is not None


def test_what_torchtune_refuses_is_said() -> None:
    with pytest.raises(SetupError, match="enable_activation_checkpointing"):
        estimate_budget(SPEC, lora(activation_offload=True))
    with pytest.raises(SetupError, match="bf16-true"):
        estimate_budget(SPEC, lora(precision=Precision.BF16))
    with pytest.raises(SetupError, match="fp16"):
        estimate_budget(SPEC, lora(precision=Precision.FP16_TRUE))


def test_qlora_dequantizes_a_weight_inside_a_block_not_at_the_loss() -> None:
    """torchao dequantizes a NF4 weight at each use: two int64 index tensors and three bf16
    tensors of its size, (8 + 3·2) B a value, inside a block's forward and backward only (the
    HF budget counts bitsandbytes' one 16-bit weight at every moment)."""
    qlora = setup(
        method=Method.QLORA, lora=LoraSetup(r=8, alpha=16, targets=ALL_LINEAR), grad_ckpt=True
    )
    copies = TORCHTUNE_STACK.weight_copies(SPEC, qlora)
    assert copies is not None
    assert (copies.at_loss, copies.backward_start) == (0, 0)
    assert copies.recompute == copies.in_block == 14 * MLP * H
    # with a small vocabulary the dequantized weight, not the loss, is forward's peak
    small_vocab = spec_from_config(
        {**CONFIG, "vocab_size": 512}, model_id="tiny", source=ModelSource.CONFIG
    )
    forward = estimate_budget(small_vocab, qlora, with_first_step=False).phase(Phase.FORWARD)
    assert forward.moment == "forward of the last block, a quantized weight dequantized"
    assert forward.components[Component.TEMPORARIES].bytes == 14 * MLP * H
    # the running block's residual, MLP input and one more N·h tensor, and one MLP-wide one
    blocks = LAYERS * 2 * N * H
    assert forward.components[Component.ACTIVATIONS].bytes == blocks + 3 * 2 * N * H + 2 * N * MLP


def test_paged_optimizer_states_are_unified_memory_outside_the_pool() -> None:
    """bitsandbytes' paged states (parameters of 1e5 values or more) are cudaMallocManaged
    memory: not in the allocated or reserved peaks; the device shows what fits beside."""
    from llmmem.models.resolve import resolve_model

    spec = resolve_model("meta-llama/Llama-3.1-8B", hub=False)
    paged = setup(
        seq=1024,
        grad_ckpt=True,
        optim="paged_adamw_8bit",
        optimizer_in_backward=True,
    )
    card = GpuTarget(name="24GiB", capacity_bytes=24 * 2**30)
    budget = estimate_budget(spec, paged, card)
    unified = 2 * sum(g.params for g in _large_trainable(spec, paged))  # two 8-bit states a value
    assert budget.unified_memory_bytes == unified
    states = budget.phase(Phase.OPTIMIZER_STEP).components[Component.OPTIMIZER_STATES].bytes
    assert states < unified // 50  # the absmax (4 B per 256 values) and small tensors
    assert budget.reserved_peak_bytes < 20 * 2**30 < budget.reserved_peak_bytes + unified
    resident = budget.overheads[Overhead.UNIFIED_MEMORY].bytes
    assert budget.device_total_bytes == budget.pool_total_bytes + resident <= card.capacity_bytes
    assert budget.verdict == "fits"
    bigger = estimate_budget(spec, paged, GpuTarget(name="80GiB", capacity_bytes=80 * 2**30))
    assert bigger.overheads[Overhead.UNIFIED_MEMORY].bytes == unified  # all of it resident


def _large_trainable(spec: object, setup_: TrainingSetup) -> list:  # type: ignore[type-arg]
    from llmmem.budget.weights import build_inventory

    inventory = build_inventory(spec, setup_)  # type: ignore[arg-type]
    return [g for g in inventory.trainable if g.numel >= 100_000]

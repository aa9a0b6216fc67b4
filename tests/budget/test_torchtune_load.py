"""What torchtune's QLoRA recipe leaves reserved from loading the model
(llmmem.budget.stacks.torchtune_load): the recipe builds the model on the device and quantizes
each weight there, the caching allocator keeps the blocks, and no later peak is below them.

The numbers are derived here from Llama-2-7B's shapes and torchao's code (the module's docstring
cites it): with torchao 0.1 (torchtune 0.1.x, torch 2.2) the largest quantization holds the
weight, its scaled blocks and two (n × 16) comparisons with the NF4 table at once, and the pool
ends one more comparison block above that; from torchao 0.2 the comparisons run in chunks of
2^20 values and the load never decides the peak.
"""

from __future__ import annotations

from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Component, GpuTarget, Overhead
from llmmem.budget.setup import (
    Framework,
    LoraSetup,
    LossImpl,
    Method,
    Precision,
    TrainingSetup,
)
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource

LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
SPEC = spec_from_config(LLAMA2_7B, model_id="llama-2-7b", source=ModelSource.CONFIG)
H, MLP, V, LAYERS, HEAD_DIM, POSITIONS = 4096, 11008, 32000, 32, 128, 4096
E = 2  # bf16
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# (out, in) of q k v o gate up down
SHAPES = [(H, H)] * 4 + [(MLP, H), (MLP, H), (H, MLP)]
RTX_4090 = GpuTarget("RTX 4090", 24 * 1000**3)


def tutorial(method: Method, torch_version: str) -> TrainingSetup:
    """torchtune's QLoRA tutorial run: batch 2 × 512, bf16, checkpointing, whole-logits loss."""
    return TrainingSetup(
        method=method,
        batch=2,
        seq=512,
        precision=Precision.BF16_TRUE,
        loss=LossImpl.STANDARD,
        grad_ckpt=True,
        framework=Framework.TORCHTUNE,
        lora=LoraSetup(r=8, alpha=16, targets=ALL_LINEAR),
        torch_version=torch_version,
    )


def torchao_01_weights() -> int:
    """Every persistent tensor of the QLoRA model with torchao 0.1: NF4 data (0.5 B), int8
    scalers per 64 values, the quantization factor's whole tensor (one bf16 value per scaler,
    kept behind its view), a 16-entry table and the scalers' mean per tensor; bf16 embeddings,
    head, norms and adapters; the fp32 RoPE table."""
    nf4 = sum(out * inp * (0.5 + 1 / 64 + E / 64) + 17 * E for out, inp in SHAPES)
    adapters = sum(8 * (out + inp) * E for out, inp in SHAPES)
    norms = (2 * LAYERS + 1) * H * E
    return round(LAYERS * (nf4 + adapters) + 2 * V * H * E + norms + POSITIONS * HEAD_DIM * 4)


def test_torchao_01_qlora_reserved_peak_is_what_the_load_left() -> None:
    """torch 2.2 (torchtune 0.1's torchao 0.1): the largest Linear (4096 × 11008) quantized on
    the device holds 2 × 2 B (the weight, its scaled blocks) + 2 × 16 × 2 B (the comparisons)
    per value, and the pool keeps one more comparison block: the reserved peak is that load,
    not the step (about 5.8 GB), and the allocated peak stays the step's."""
    budget = estimate_budget(SPEC, tutorial(Method.QLORA, "2.2"), RTX_4090)
    n = MLP * H
    load = torchao_01_weights() + 2 * E * n + 3 * 16 * E * n
    assert abs(budget.reserved_peak_bytes - load) < 2**20
    assert 8.5e9 < budget.reserved_peak_bytes < 8.8e9
    assert budget.allocated_peak_bytes < 6e9
    slack = budget.overheads[Overhead.ALLOCATOR_SLACK]
    assert "kept reserved from the model's load" in slack.formula
    # the weights the step holds are the loaded ones, the factor's whole tensor with them
    weights = budget.peak.components[Component.WEIGHTS].bytes
    assert abs(weights - torchao_01_weights()) < 2**20


def test_chunked_quantization_leaves_the_step_its_own_reserved_peak() -> None:
    """torch 2.4 (torchao 0.3 on): the comparisons run 2^20 values at a time, so the load holds
    (2 + 2 + 1) B per value of the largest Linear and 64 MiB beside the weights, less than the
    step's own peak: the reserved peak is the step's allocated peak and its overheads."""
    budget = estimate_budget(SPEC, tutorial(Method.QLORA, "2.4"), RTX_4090)
    slack = budget.overheads[Overhead.ALLOCATOR_SLACK]
    assert "the model's load" not in slack.formula
    workspaces = budget.overheads[Overhead.CUBLAS_WORKSPACES].bytes
    assert budget.reserved_peak_bytes == budget.allocated_peak_bytes + workspaces + slack.bytes
    weights = budget.peak.components[Component.WEIGHTS].bytes
    load = weights + (2 * E + 1) * MLP * H + 2 * 16 * E * 2**20
    assert load < budget.reserved_peak_bytes
    assert budget.reserved_peak_bytes < 6.5e9


def test_lora_budget_has_no_load_term() -> None:
    """A LoRA model is built in bf16 and loaded by in-place copies: nothing is quantized, and
    the reserved peak is the step's allocated peak, cuBLAS's workspaces and the slack alone."""
    for version in ("2.2", "2.4"):
        budget = estimate_budget(SPEC, tutorial(Method.LORA, version), RTX_4090)
        slack = budget.overheads[Overhead.ALLOCATOR_SLACK]
        assert "the model's load" not in slack.formula
        workspaces = budget.overheads[Overhead.CUBLAS_WORKSPACES].bytes
        assert budget.reserved_peak_bytes == (
            budget.allocated_peak_bytes + workspaces + slack.bytes
        )
        assert 14e9 < budget.reserved_peak_bytes < 15.5e9

"""The accounting core against hand-derived cases and the measured facts of MEMORY-MODEL.md.

Expected values here are derived by hand from how the frameworks allocate (the derivation is in
each test), never copied from the code's output.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmmem.budget import Component, Phase, SetupError, TrainingSetup, estimate_budget
from llmmem.budget.activations import estimate_activations
from llmmem.budget.generation import kv_cache_term
from llmmem.budget.result import PhaseBudget
from llmmem.budget.setup import DistributedSetup, LoraSetup, QuantSetup
from llmmem.budget.weights import build_inventory
from llmmem.models.architectures import spec_from_config
from llmmem.models.catalog import catalog_entry
from llmmem.models.spec import ModelSource, ModelSpec


def spec_of(model_id: str) -> ModelSpec:
    entry = catalog_entry(model_id)
    assert entry is not None, model_id
    return spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)


@pytest.fixture(scope="module")
def llama2_7b() -> ModelSpec:
    return spec_of("meta-llama/Llama-2-7b-hf")


@pytest.fixture(scope="module")
def llama3_8b() -> ModelSpec:
    return spec_of("meta-llama/Meta-Llama-3-8B")


@pytest.fixture(scope="module")
def llama32_3b() -> ModelSpec:
    return spec_of("meta-llama/Llama-3.2-3B")


def step_components(budget, *names: Component) -> int:
    return sum(budget.phase(Phase.OPTIMIZER_STEP).components[n].bytes for n in names)


# --- model states -------------------------------------------------------------------------


def test_full_fp32_adamw_is_16_bytes_per_parameter(llama2_7b: ModelSpec) -> None:
    # fp32 weights 4 + fp32 gradients 4 + two fp32 Adam states 8 = 16 B per parameter
    setup = TrainingSetup(precision="fp32", optim="adamw_torch_fused", batch=1, seq=128)
    budget = estimate_budget(llama2_7b, setup)
    states = step_components(
        budget, Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES
    )
    assert states == 16 * llama2_7b.total_params
    assert budget.params == llama2_7b.total_params == 6_738_415_616


def test_foreach_adamw_needs_one_parameter_sized_buffer(llama2_7b: ModelSpec) -> None:
    # MEMORY-MODEL: foreach peaks at W+G+S+Pt·w = 20 B/param for fp32; fused needs none
    foreach = estimate_budget(
        llama2_7b, TrainingSetup(precision="fp32", optim="adamw_torch", batch=1, seq=64)
    )
    fused = estimate_budget(
        llama2_7b, TrainingSetup(precision="fp32", optim="adamw_torch_fused", batch=1, seq=64)
    )
    p = llama2_7b.total_params
    assert foreach.phase(Phase.OPTIMIZER_STEP).allocated_bytes == 20 * p
    assert fused.phase(Phase.OPTIMIZER_STEP).allocated_bytes == 16 * p


def test_torch_adamw_states_follow_a_bf16_parameter(llama2_7b: ModelSpec) -> None:
    # pure bf16: weights 2 + gradients 2 + states 2 × 2 = 8 B per parameter
    budget = estimate_budget(llama2_7b, TrainingSetup(precision="bf16-true", batch=1, seq=64))
    p = llama2_7b.total_params
    assert step_components(budget, Component.OPTIMIZER_STATES) == 4 * p
    assert step_components(budget, Component.WEIGHTS, Component.GRADIENTS) == 4 * p


def test_bitsandbytes_8bit_adam_is_about_two_bytes_per_parameter(llama2_7b: ModelSpec) -> None:
    budget = estimate_budget(
        llama2_7b, TrainingSetup(precision="bf16", optim="adamw_bnb_8bit", batch=1, seq=64)
    )
    per_param = step_components(budget, Component.OPTIMIZER_STATES) / llama2_7b.total_params
    # 2 × (1 B + fp32 absmax per 256 values); norms (< 4096 values) keep 32-bit states
    assert 2.03 <= per_param <= 2.04


def test_nf4_double_quant_is_0_516_bytes_per_quantized_parameter(llama3_8b: ModelSpec) -> None:
    setup = TrainingSetup(method="qlora", quant=QuantSetup(quant_type="nf4", double_quant=True))
    inv = build_inventory(llama3_8b, setup)
    quantized = [g for g in inv.groups if g.quantized]
    per_param = sum(g.bytes for g in quantized) / sum(g.params for g in quantized)
    # 0.5 (4 bits) + 1/64 (8-bit absmax per 64) + 4/(64·256) (fp32 absmax per 256 blocks)
    assert per_param == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256), rel=1e-6)
    assert 0.5155 < per_param < 0.5165
    single = build_inventory(
        llama3_8b,
        replace(setup, quant=QuantSetup(quant_type="nf4", double_quant=False)),
    )
    q1 = [g for g in single.groups if g.quantized]
    assert sum(g.bytes for g in q1) / sum(g.params for g in q1) == pytest.approx(0.5625)


def test_prepare_for_kbit_training_keeps_unquantized_parameters_in_fp32(
    llama3_8b: ModelSpec,
) -> None:
    prepared = build_inventory(llama3_8b, TrainingSetup(method="qlora"))
    raw = build_inventory(
        llama3_8b, TrainingSetup(method="qlora", quant=QuantSetup(prepare_for_kbit_training=False))
    )
    embed_and_head = 2 * 128_256 * 4096  # untied embeddings and LM head of Llama-3-8B
    norms = 32 * 2 * 4096 + 4096
    assert prepared.weight_bytes - raw.weight_bytes == (4 - 2) * (embed_and_head + norms)


def test_lora_trainable_parameters_match_peft(llama32_3b: ModelSpec) -> None:
    # calibration row: r=32 on q_proj and v_proj of Llama-3.2-3B trains 9,175,040 parameters
    setup = TrainingSetup(method="lora", lora=LoraSetup(r=32, targets=["q_proj", "v_proj"]))
    assert build_inventory(llama32_3b, setup).trainable_params == 9_175_040
    setup = TrainingSetup(
        method="lora", lora=LoraSetup(r=10, targets=["gate_proj", "up_proj", "down_proj"])
    )
    assert build_inventory(llama32_3b, setup).trainable_params == 9_461_760


def test_lora_targets_that_match_nothing_name_the_modules(llama32_3b: ModelSpec) -> None:
    with pytest.raises(SetupError, match="q_proj"):
        estimate_budget(
            llama32_3b, TrainingSetup(method="lora", lora=LoraSetup(targets=["c_attn"]))
        )


def test_unknown_optimizer_suggests_close_names(llama32_3b: ModelSpec) -> None:
    with pytest.raises(SetupError, match="adamw_torch"):
        estimate_budget(llama32_3b, TrainingSetup(optim="adamw_torh"))


def test_full_fine_tuning_of_a_quantized_model_is_refused() -> None:
    with pytest.raises(ValueError, match="qlora"):
        TrainingSetup(method="full", quant=QuantSetup())


# --- activations: the per-block formulas measured in MEMORY-MODEL.md -----------------------

MEASURED_BLOCK_FORMULAS = {
    # mode: (N·h incl. the query width, N·kvd, N·I, N·r) bytes per block, SDPA
    "fp32": (32, 8, 16, 0),
    "bf16-true": (20, 4, 8, 0),
    "bf16": (30, 4, 8, 0),
    "lora-fp32": (20, 8, 12, 8),
    "lora-bf16-true": (20, 4, 6, 8),
}


@pytest.mark.parametrize("mode", sorted(MEASURED_BLOCK_FORMULAS))
def test_llama_block_saves_what_was_measured(mode: str, llama32_3b: ModelSpec) -> None:
    lora = mode.startswith("lora-")
    precision = mode.removeprefix("lora-")
    setup = TrainingSetup(
        precision=precision,
        method="lora" if lora else "full",
        lora=LoraSetup(r=16, targets=["q_proj", "v_proj"]) if lora else None,
    )
    tally = estimate_activations(llama32_3b, setup).per_block[0][1].coefficients
    nh, nkvd, ni, nr = MEASURED_BLOCK_FORMULAS[mode]
    # Llama's query width equals its hidden size, so N·q and N·h add up
    assert tally.get("N·h", 0) + tally.get("N·q", 0) == nh
    assert tally.get("N·kvd", 0) == nkvd
    assert tally.get("N·I", 0) == ni
    assert tally.get("N·r", 0) == nr
    assert tally.get("b·a·s", 0) == 4  # fp32 log-sum-exp per head and row


def test_eager_attention_keeps_fp32_scores(llama32_3b: ModelSpec) -> None:
    sdpa = estimate_activations(llama32_3b, TrainingSetup(precision="bf16-true", attn="sdpa"))
    eager = estimate_activations(llama32_3b, TrainingSetup(precision="bf16-true", attn="eager"))
    assert "b·a·s²" not in sdpa.per_block[0][1].coefficients
    # softmax(dtype=float32) output 4 B + its bf16 cast 2 B per score
    assert eager.per_block[0][1].coefficients["b·a·s²"] == 6


def test_gemma2_trains_eager_and_says_so() -> None:
    gemma2 = spec_of("google/gemma-2-9b")
    assert not gemma2.supports_sdpa
    budget = estimate_budget(
        gemma2, TrainingSetup(precision="bf16-true", batch=1, seq=1024, attn="sdpa")
    )
    assert any("eager" in note for note in budget.notes)
    acts = estimate_activations(gemma2, TrainingSetup(precision="bf16-true", attn="sdpa"))
    assert acts.per_block[0][1].coefficients.get("b·a·s²", 0) > 0


def test_gradient_checkpointing_keeps_block_inputs_and_one_recompute(
    llama32_3b: ModelSpec,
) -> None:
    setup = TrainingSetup(precision="bf16-true", batch=4, seq=768, grad_ckpt=True)
    budget = estimate_budget(llama32_3b, setup)
    plain = estimate_budget(llama32_3b, replace(setup, grad_ckpt=False))
    n_h = 4 * 768 * 3072
    fwd = budget.phase(Phase.FORWARD).components[Component.ACTIVATIONS].bytes
    # 28 block inputs in bf16, plus the final norm (fp32 upcast 4 + normalised 2) and the head's
    # input (2): 2·N·h × 28 + 8·N·h
    assert fwd == 2 * n_h * 28 + 8 * n_h
    assert budget.allocated_peak_bytes < plain.allocated_peak_bytes


# --- logits -----------------------------------------------------------------------------


def test_llama3_logits_at_8k_tokens_are_12_bytes_per_logit_at_backward(
    llama3_8b: ModelSpec,
) -> None:
    setup = TrainingSetup(precision="bf16-true", batch=1, seq=8192)
    budget = estimate_budget(llama3_8b, setup)
    logits = 8192 * 128_256
    start = budget.phase(Phase.BACKWARD)
    assert start.moment.startswith("start of backward")
    assert start.components[Component.LOGITS].bytes == 12 * logits  # 12.6 GB


def test_fused_linear_cross_entropy_shrinks_the_logits(llama3_8b: ModelSpec) -> None:
    standard = estimate_budget(llama3_8b, TrainingSetup(precision="bf16-true", batch=1, seq=8192))
    liger = estimate_budget(
        llama3_8b, TrainingSetup(precision="bf16-true", batch=1, seq=8192, loss="liger")
    )
    assert liger.allocated_peak_bytes < standard.allocated_peak_bytes - 8 * 8192 * 128_256


# --- steps, accumulation, phases ----------------------------------------------------------


def test_gradients_persist_across_accumulation(llama32_3b: ModelSpec) -> None:
    one = estimate_budget(llama32_3b, TrainingSetup(precision="bf16-true", batch=1, seq=256))
    four = estimate_budget(
        llama32_3b, TrainingSetup(precision="bf16-true", batch=1, seq=256, grad_accum=4)
    )
    assert Component.GRADIENTS not in one.phase(Phase.FORWARD).components
    grads = four.phase(Phase.FORWARD).components[Component.GRADIENTS].bytes
    assert grads == 2 * llama32_3b.total_params


def test_first_step_has_no_optimizer_states_before_the_step(llama32_3b: ModelSpec) -> None:
    budget = estimate_budget(llama32_3b, TrainingSetup(precision="bf16-true", batch=4, seq=768))
    assert budget.first_step_allocated_peak_bytes is not None
    assert budget.first_step_allocated_peak_bytes < budget.allocated_peak_bytes


def test_peak_is_the_largest_phase(llama32_3b: ModelSpec) -> None:
    budget = estimate_budget(llama32_3b, TrainingSetup(precision="bf16-true", batch=4, seq=768))
    assert budget.allocated_peak_bytes == max(p.allocated_bytes for p in budget.phases)
    assert budget.reserved_peak_bytes > budget.allocated_peak_bytes
    assert budget.device_total_bytes > budget.reserved_peak_bytes


# --- multi-GPU ------------------------------------------------------------------------------


def test_zero3_shards_model_states(llama3_8b: ModelSpec) -> None:
    single = estimate_budget(llama3_8b, TrainingSetup(precision="bf16-true", batch=1, seq=512))
    zero3 = estimate_budget(
        llama3_8b,
        TrainingSetup(
            precision="bf16-true",
            batch=1,
            seq=512,
            distributed=DistributedSetup(world_size=8, zero_stage=3),
        ),
    )
    step1 = single.phase(Phase.OPTIMIZER_STEP).components
    step8 = zero3.phase(Phase.OPTIMIZER_STEP).components
    assert step8[Component.WEIGHTS].bytes == pytest.approx(step1[Component.WEIGHTS].bytes / 8, 1e-6)
    assert step8[Component.GRADIENTS].bytes == pytest.approx(
        step1[Component.GRADIENTS].bytes / 8, 1e-6
    )
    # DeepSpeed steps fp32 master weights (4 B) with fp32 AdamW moments (8 B), sharded by 8
    total = llama3_8b.total_params
    assert step8[Component.OPTIMIZER_STATES].bytes == pytest.approx(12 * total / 8, 1e-6)
    assert zero3.device_total_bytes < single.device_total_bytes / 2


def _zero(spec: ModelSpec, stage: int, **distributed: object) -> TrainingSetup:
    return TrainingSetup(
        precision="bf16-true",
        batch=1,
        seq=512,
        distributed=DistributedSetup(world_size=8, zero_stage=stage, **distributed),  # type: ignore[arg-type]
    )


def test_zero2_backward_holds_deepspeeds_reduction_bucket(llama3_8b: ModelSpec) -> None:
    def backward(**distributed: object) -> PhaseBudget:
        return estimate_budget(llama3_8b, _zero(llama3_8b, 2, **distributed)).phase(Phase.BACKWARD)

    # DeepSpeed's default reduce_bucket_size: 5e8 elements of bf16 gradients, allocated at the
    # first gradient hook (after the logits' gradient is gone), larger than those logits here
    default = backward()
    assert default.components[Component.TEMPORARIES].bytes >= 500_000_000 * 2
    assert default.allocated_bytes > backward(contiguous_gradients=False).allocated_bytes
    # overlap_comm double-buffers it
    assert backward(overlap_comm=True).allocated_bytes - default.allocated_bytes == 500_000_000 * 2
    # "auto" (HF trainer, accelerate): hidden_size² elements (32 MiB), which stays below the
    # logits' gradient at the start of backward: the peak is the bucket-free one
    auto = backward(reduce_bucket_size=None)
    assert auto.allocated_bytes == backward(contiguous_gradients=False).allocated_bytes
    assert auto.moment.startswith("start of backward")


def test_zero2_bucket_is_gone_before_the_optimizer_step(llama3_8b: ModelSpec) -> None:
    with_bucket = estimate_budget(llama3_8b, _zero(llama3_8b, 2))
    without = estimate_budget(llama3_8b, _zero(llama3_8b, 2, contiguous_gradients=False))
    for phase in (Phase.FORWARD, Phase.OPTIMIZER_STEP):
        assert with_bucket.phase(phase).allocated_bytes == without.phase(phase).allocated_bytes


def test_zero3_keeps_its_bucket_and_gradient_partition_through_the_step(
    llama3_8b: ModelSpec,
) -> None:
    with_bucket = estimate_budget(llama3_8b, _zero(llama3_8b, 3))
    without = estimate_budget(llama3_8b, _zero(llama3_8b, 3, contiguous_gradients=False))
    for phase in Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER_STEP:
        extra = with_bucket.phase(phase).allocated_bytes - without.phase(phase).allocated_bytes
        assert extra == 500_000_000 * 2, phase
    forward = with_bucket.phase(Phase.FORWARD).components
    assert forward[Component.GRADIENTS].bytes == round(2 * llama3_8b.total_params / 8)


def test_zero3_gathers_parameters_within_the_reuse_distance(llama3_8b: ModelSpec) -> None:
    def forward(distance: int) -> int:
        setup = _zero(llama3_8b, 3, max_reuse_distance=distance)
        return estimate_budget(llama3_8b, setup).phase(Phase.FORWARD).allocated_bytes

    # half the distance stays gathered (2 B each): 1e9 → 5e8 elements, 2e8 → 1e8
    assert forward(1_000_000_000) - forward(200_000_000) == (500_000_000 - 100_000_000) * 2
    # never more than the whole model
    assert forward(10**12) == forward(10**11)


def test_zero3_keeps_small_parameters_whole_on_every_rank(llama3_8b: ModelSpec) -> None:
    def weights(**distributed: object) -> int:
        budget = estimate_budget(llama3_8b, _zero(llama3_8b, 3, **distributed))
        return budget.phase(Phase.FORWARD).components[Component.WEIGHTS].bytes

    partitions = round(2 * llama3_8b.total_params / 8)
    # default stage3_param_persistence_threshold 1e5: the RMSNorm vectors (4096 each, two per
    # layer and the final one) stay whole in bf16 on every rank, besides their partition
    norms = (2 * 32 + 1) * 4096
    assert weights() == partitions + 2 * norms
    assert weights(param_persistence_threshold=0) == partitions
    # "auto" (10 · hidden_size = 40960) keeps the same vectors
    assert weights(param_persistence_threshold=None) == partitions + 2 * norms
    # 2e7: q and o (4096 × 4096), k and v (1024 × 4096) of every layer too, not the MLP
    attention = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096)
    assert weights(param_persistence_threshold=20_000_000) == partitions + 2 * (norms + attention)


def test_zero3_prefetches_parameters_ahead_of_use(llama3_8b: ModelSpec) -> None:
    def forward(**distributed: object) -> int:
        setup = _zero(llama3_8b, 3, max_reuse_distance=0, **distributed)
        return estimate_budget(llama3_8b, setup).phase(Phase.FORWARD).allocated_bytes

    # the default stage3_prefetch_bucket_size gathers 5e7 more elements (bf16) ahead of use;
    # "auto" 0.9 · hidden_size²
    assert forward() - forward(prefetch_bucket_size=0) == 50_000_000 * 2
    auto = int(0.9 * 4096 * 4096)
    assert forward(prefetch_bucket_size=None) - forward(prefetch_bucket_size=0) == auto * 2


def test_zero3_lora_step_peaks_once_persistent_parameters_are_gathered_again(
    llama3_8b: ModelSpec,
) -> None:
    # DeepSpeed partitions every parameter as its step starts and gathers the persistent ones
    # (norms, and LoRA adapters: r × 4096 = 65536 elements each) again after it. A LoRA step's
    # own buffers are small, so the larger moment is after the step, with every weight
    lora = replace(
        _zero(llama3_8b, 3), method="lora", lora=LoraSetup(r=16, targets=["q_proj", "v_proj"])
    )
    step = estimate_budget(llama3_8b, lora).phase(Phase.OPTIMIZER_STEP)
    assert step.moment.startswith("after the step")
    forward = estimate_budget(llama3_8b, lora).phase(Phase.FORWARD)
    assert step.components[Component.WEIGHTS] == forward.components[Component.WEIGHTS]
    # a full fine-tune's step buffers (fp32 gradient copy, foreach lists) dominate: inside
    full = estimate_budget(llama3_8b, _zero(llama3_8b, 3)).phase(Phase.OPTIMIZER_STEP)
    assert full.moment == "inside the optimizer step"


def test_zero3_lora_saves_the_input_of_every_linear(llama3_8b: ModelSpec) -> None:
    # ZeRO-3 replaces F.linear by an autograd function that keeps its input, frozen or not:
    # under LoRA on q and v, the MLP's input (bf16, shared by gate and up), the down
    # projection's input and the head's input are kept, which a frozen Linear would not keep
    def activations(stage: int) -> int:
        setup = replace(
            _zero(llama3_8b, stage),
            method="lora",
            lora=LoraSetup(r=16, targets=["q_proj", "v_proj"]),
        )
        return (
            estimate_budget(llama3_8b, setup)
            .phase(Phase.FORWARD)
            .components[Component.ACTIVATIONS]
            .bytes
        )

    n = 512  # batch 1 × seq 512
    per_layer = 2 * n * 4096 + 2 * n * 14336
    assert activations(3) - activations(2) == 32 * per_layer + 2 * n * 4096


def test_zero3_lora_releases_a_frozen_embedding_after_forward() -> None:
    # a small untied model stays gathered whole within the reuse distance, except a frozen
    # embedding that backward never reaches (no checkpointing): it is not used again
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
    }
    spec = spec_from_config(config, model_id="small", source=ModelSource.LOCAL)

    def gathered(grad_ckpt: bool) -> int:
        setup = replace(
            _zero(spec, 3, prefetch_bucket_size=0),
            method="lora",
            lora=LoraSetup(r=8, targets=["q_proj", "v_proj"]),
            grad_ckpt=grad_ckpt,
        )
        forward = estimate_budget(spec, setup).phase(Phase.FORWARD)
        return forward.components[Component.TEMPORARIES].bytes

    assert gathered(True) - gathered(False) == 32000 * 1024 * 2


def test_optimizer_offload_removes_states_from_the_device(llama3_8b: ModelSpec) -> None:
    offload = estimate_budget(
        llama3_8b,
        TrainingSetup(
            precision="bf16-true",
            batch=1,
            seq=512,
            distributed=DistributedSetup(world_size=2, zero_stage=2, offload_optimizer=True),
        ),
    )
    assert Component.OPTIMIZER_STATES not in offload.phase(Phase.OPTIMIZER_STEP).components


def test_fsdp_under_autocast_gathers_16_bit_weights_and_casts_nothing(
    llama3_8b: ModelSpec,
) -> None:
    # accelerate gives FSDP a mixed-precision policy (param_dtype bf16) under bf16=True:
    # gathered blocks are already bf16, so autocast keeps no copies of them; DDP's
    # replicated fp32 weights are cast, every Linear of them
    fsdp = TrainingSetup(
        precision="bf16",
        batch=1,
        seq=512,
        distributed=DistributedSetup(world_size=8, fsdp="full_shard"),  # type: ignore[arg-type]
    )
    budget = estimate_budget(llama3_8b, fsdp)
    for phase in budget.phases:
        assert Component.WEIGHT_COPIES not in phase.components, phase.phase
    # the sharded parameters, gradients and AdamW states stay fp32: 4 + 4 + 8 B each, ÷ 8
    step = budget.phase(Phase.OPTIMIZER_STEP).components
    total = llama3_8b.total_params
    assert step[Component.WEIGHTS].bytes == pytest.approx(4 * total / 8, 1e-6)
    assert step[Component.OPTIMIZER_STATES].bytes == pytest.approx(8 * total / 8, 1e-6)
    ddp = replace(fsdp, distributed=DistributedSetup(world_size=8))
    forward = estimate_budget(llama3_8b, ddp).phase(Phase.FORWARD).components
    assert forward[Component.WEIGHT_COPIES].bytes > 0


def test_ddp_keeps_gradient_buckets(llama32_3b: ModelSpec) -> None:
    single = estimate_budget(llama32_3b, TrainingSetup(precision="bf16-true", batch=1, seq=256))
    ddp = estimate_budget(
        llama32_3b,
        TrainingSetup(
            precision="bf16-true", batch=1, seq=256, distributed=DistributedSetup(world_size=4)
        ),
    )
    gradients = 2 * llama32_3b.total_params
    step_single = single.phase(Phase.OPTIMIZER_STEP).allocated_bytes
    assert ddp.phase(Phase.OPTIMIZER_STEP).allocated_bytes == step_single + gradients
    assert "nccl_buffers" in {o.value for o in ddp.overheads}


# --- generation ----------------------------------------------------------------------------


def test_kv_cache_of_llama3_8b_at_8k_tokens_is_1_gib(llama3_8b: ModelSpec) -> None:
    # 2 (K, V) × 32 blocks × 8 kv heads × 128 × 8192 tokens × 2 B = 1 GiB
    setup = TrainingSetup(mode="generate", precision="bf16-true", batch=1, seq=8192, new_tokens=0)
    assert kv_cache_term(llama3_8b, setup).bytes == 2 * 32 * 8 * 128 * 8192 * 2 == 1 << 30


def test_sliding_window_caps_the_kv_cache() -> None:
    mistral = spec_of("mistralai/Mistral-7B-v0.1")  # sliding window 4096 in every block
    setup = TrainingSetup(mode="generate", precision="bf16-true", batch=1, seq=16384, new_tokens=0)
    assert kv_cache_term(mistral, setup).bytes == 2 * 32 * 8 * 128 * 4096 * 2


def test_use_cache_during_training_costs_a_kv_cache_in_forward(llama2_7b: ModelSpec) -> None:
    # MEMORY-MODEL: under AMP the unused cache is fp32: 2 × 32 × 16,384 tokens × 4096 × 4 B
    setup = TrainingSetup(precision="bf16", batch=8, seq=2048, use_cache=True)
    cached = estimate_budget(llama2_7b, setup).phase(Phase.FORWARD).allocated_bytes
    plain = estimate_budget(llama2_7b, replace(setup, use_cache=False))
    extra = cached - plain.phase(Phase.FORWARD).allocated_bytes
    assert extra == 2 * 32 * 8 * 2048 * 4096 * 4
    assert extra == 16 * 2**30  # the "+16 GiB for 7B at b8 s2048" of MEMORY-MODEL.md


def test_modules_to_save_trains_a_full_copy(llama3_8b: ModelSpec) -> None:
    plain = TrainingSetup(method="lora", precision="bf16-true", batch=1, seq=256)
    saved = replace(
        plain, lora=LoraSetup(targets=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    )
    a, b = build_inventory(llama3_8b, plain), build_inventory(llama3_8b, saved)
    head = 128_256 * 4096
    # the copy trains at the base's bf16; the original stays frozen beside it
    assert b.trainable_params - a.trainable_params == head
    assert b.weight_bytes - a.weight_bytes == 2 * head
    with pytest.raises(SetupError, match="embed_tokens"):
        build_inventory(
            llama3_8b,
            replace(plain, lora=LoraSetup(modules_to_save=["classifier_head"])),
        )

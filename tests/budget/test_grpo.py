"""The GRPO budget (llmmem.budget.grpo) against a GRPO step run on the CPU.

The step (`llmmem.verify.grpo_grid`, which `python -m llmmem.verify.grid --grpo` runs too) is
TRL 0.29.1's GRPOTrainer restated on a tiny Llama built from a config: generation with the KV
cache, the reference log-probabilities with `beta != 0`, the policy's per-token log-probabilities
over the completion, the dapo loss, backward and an AdamW step; fp32, bf16 and bf16 autocast.
A warm-up step makes the optimizer states; the second is measured with the project's
StorageTracker, one peak per phase.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from llmmem.budget.grpo import GrpoSetup, estimate_grpo_budget  # noqa: E402
from llmmem.budget.preference import estimate_preference_budget  # noqa: E402
from llmmem.budget.preference_setup import Objective, PreferenceSetup  # noqa: E402
from llmmem.budget.result import Component, GpuTarget, Phase  # noqa: E402
from llmmem.budget.setup import SetupError, TrainingSetup  # noqa: E402
from llmmem.verify.grpo_grid import (  # noqa: E402
    PROMPT,
    Case,
    _grpo,
    _setup,
    _spec,
    measure,
    predict,
)
from llmmem.verify.preference_grid import SMALL  # noqa: E402
from llmmem.verify.tracker import StorageTracker  # noqa: E402

TOLERANCE = 0.05


PADDED = [
    Case(generations, completion, beta)
    for generations in (2, 4)
    for completion in (32, 64)
    for beta in (0.0, 0.04)
] + [
    Case(2, 64, 0.04, method="lora"),
    Case(2, 32, 0.04, dtype="bf16-true"),
    Case(4, 64, 0.0, dtype="bf16-true"),
    Case(4, 32, 0.0, batch=8, grad_ckpt=True),
    Case(2, 32, 0.0, dtype="bf16"),
    Case(2, 64, 0.04, dtype="bf16"),
    Case(4, 32, 0.0, dtype="bf16", grad_ckpt=True),
    # bf16 weights without accelerate's mixed precision (bf16=False): 16-bit logits
    Case(2, 32, 0.04, dtype="bf16-true", mixed=False),
    Case(2, 64, 0.04, dtype="bf16-true", family="qwen2"),
    # Gemma-2 (eager attention, soft-capped logits): the tanh kept with gradient, the capped
    # head without it (first chunk, and a later one beside the previous chunk's logits), the
    # grouped K/V heads repeated at each decoding step
    Case(2, 64, 0.04, family="gemma2"),
    Case(2, 32, 0.04, method="lora", family="gemma2"),
    Case(2, 32, 0.04, spg=2, family="gemma2"),
    Case(4, 64, 0.04, family="qwen2"),
]
# every case above padded as TRL pads a batch (left-padded prompts, a completion cut short):
# SDPA's mask and K/V repeated in the training forward; two more without padding
CASES = [replace(c, padded=True) for c in PADDED] + [
    Case(2, 32, 0.04),
    Case(2, 64, 0.0, family="qwen2"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_phase_within_five_percent_of_a_cpu_step(case: Case) -> None:
    measured = measure(case)
    predicted = predict(case)
    assert set(measured) == set(predicted)
    for phase, got in measured.items():
        error = (predicted[phase] - got) / got
        assert abs(error) <= TOLERANCE, (
            f"{case.id} {phase}: measured {got} B, predicted {predicted[phase]} B ({error:+.1%})"
        )


@pytest.mark.parametrize(
    ("rows", "prompt", "completion", "padded"),
    [(4, 16, 64, False), (8, 16, 128, False), (8, 64, 16, False), (8, 16, 128, True)],
)
def test_generation_beside_the_weights_within_five_percent(
    rows: int, prompt: int, completion: int, padded: bool
) -> None:
    """What `generate` adds to the weights (its KV cache, the token ids, the last position's
    logits, a block's intermediates at the prefill), measured alone: in the step above the
    weights and optimizer states dwarf it. Left-padded prompts give every step a mask, which
    SDPA takes with the grouped heads packed (one query): nothing more."""
    import transformers

    config = dict(SMALL["llama"])
    config.pop("architectures")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config), attn_implementation="sdpa"
    )
    model.train()
    tracker = StorageTracker()
    with tracker:
        for tensor in list(model.parameters()) + list(model.buffers()):
            tracker.track(tensor, "weights")
        weights = tracker.current
        tracker.reset_peak("activations")
        prompts = torch.randint(3, config["vocab_size"], (rows, prompt))
        mask = torch.ones_like(prompts)
        if padded:  # half the prompts shorter by a quarter, left-padded
            prompts[rows // 2 :, : prompt // 4] = 0
            mask[rows // 2 :, : prompt // 4] = 0
        with torch.no_grad():
            model.generate(
                input_ids=prompts,
                attention_mask=mask,
                max_new_tokens=completion,
                min_new_tokens=completion,
                do_sample=True,
                pad_token_id=0,
                eos_token_id=None,
                use_cache=True,
                disable_compile=True,
            )
        measured = tracker.peak - weights
    setup = TrainingSetup(batch=rows, seq=prompt + completion, precision="fp32", optim="sgd")
    grpo = GrpoSetup(num_generations=2, max_prompt_length=prompt, max_completion_length=completion)
    generate = estimate_grpo_budget(_spec(), setup, grpo, None).phase(Phase.GENERATE)
    predicted = generate.allocated_bytes - sum(
        term.bytes
        for component, term in generate.components.items()
        if component in (Component.WEIGHTS, Component.OPTIMIZER_STATES)
    )
    error = (predicted - measured) / measured
    assert abs(error) <= TOLERANCE, f"measured {measured} B, predicted {predicted} B ({error:+.1%})"


def _budget(case: Case, **grpo: Any) -> Any:
    fields = {
        "num_generations": case.generations,
        "max_prompt_length": PROMPT,
        "max_completion_length": case.completion,
        "beta": case.beta,
    } | grpo
    gpu = GpuTarget(name="80GiB", capacity_bytes=80 * 2**30)
    return estimate_grpo_budget(_spec(), _setup(case), GrpoSetup(**fields), gpu)


def _phases(budget: Any) -> set[str]:
    return {p.phase.value for p in budget.phases}


def test_padded_batches_cost_the_masks_and_the_repeated_heads_in_the_training_forward() -> None:
    # llama small: 2 blocks, 4 query heads and 2 K/V heads of 16, h = 64; 4 completions of
    # 16 + 32 tokens, fp32
    padded = _budget(Case())
    same = _budget(Case(), padded_prompts=False)
    rows, seq, layers = 4, 16 + 32, 2
    # per layer: SDPA's additive mask (4 B × rows × seq²) and K and V repeated from 2 heads to
    # 4 (2 × 4 B × rows × seq × (64 − 32) more than the unrepeated ones), kept for backward
    per_layer = 4 * rows * seq**2 + 2 * 4 * rows * seq * (64 - 32)
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        added = padded.phase(phase).allocated_bytes - same.phase(phase).allocated_bytes
        # (and at most the boolean mask transformers builds once per forward, 1 B × rows × seq²)
        assert layers * per_layer <= added <= layers * per_layer + rows * seq**2, phase
    # generation (one query a step: SDPA packs the grouped heads) and the optimizer step keep
    # nothing more
    for phase in (Phase.GENERATE, Phase.OPTIMIZER_STEP):
        assert padded.phase(phase).allocated_bytes == same.phase(phase).allocated_bytes


def test_a_reference_only_with_beta() -> None:
    spec = _spec()
    plain = _budget(Case())
    assert _phases(plain) == {"generate", "forward", "backward", "optimizer_step"}
    assert all(Component.REFERENCE_MODEL not in p.components for p in plain.phases)
    copy_ = _budget(Case(beta=0.04))
    assert "reference_forward" in _phases(copy_)
    for phase in copy_.phases:  # the frozen copy lives through the whole step
        assert phase.components[Component.REFERENCE_MODEL].bytes == spec.total_params * 4
    adapter = _budget(Case(beta=0.04, method="lora"))
    assert "reference_forward" in _phases(adapter)
    assert all(Component.REFERENCE_MODEL not in p.components for p in adapter.phases)


def test_the_kv_cache_holds_every_completion_to_its_last_token() -> None:
    def cache(case: Case) -> int:
        return _budget(case).phase(Phase.GENERATE).components[Component.KV_CACHE].bytes

    # 2 (K, V) × 2 layers × 2 kv heads × 16 head dim × (prompt + completion − 1) × rows × 4 B
    assert cache(Case(completion=64)) == 2 * 2 * 2 * 16 * (PROMPT + 63) * 4 * 4
    assert cache(Case(completion=64, batch=8)) == 2 * cache(Case(completion=64))


def test_vllm_colocate_holds_its_share_of_the_gpu() -> None:
    case = Case(completion=64)
    share = int(0.3 * 80 * 2**30)
    awake = _budget(case, vllm="colocate")
    for phase in awake.phases:
        assert phase.components[Component.VLLM_ENGINE].bytes == share
    assert Component.KV_CACHE not in awake.phase(Phase.GENERATE).components
    # importance sampling against vLLM's sampler: the policy's own log-probabilities first
    assert "reference_forward" in _phases(awake)
    asleep = _budget(case, vllm="colocate", vllm_enable_sleep_mode=True)
    assert Component.VLLM_ENGINE in asleep.phase(Phase.GENERATE).components
    training = [p for p in asleep.phases if p.phase is not Phase.GENERATE]
    assert all(Component.VLLM_ENGINE not in p.components for p in training)
    assert asleep.allocated_peak_bytes < awake.allocated_peak_bytes
    server = _budget(case, vllm="server")
    generate = server.phase(Phase.GENERATE).components
    assert Component.KV_CACHE not in generate and Component.VLLM_ENGINE not in generate
    with pytest.raises(SetupError, match="GPU"):
        estimate_grpo_budget(_spec(), _setup(case), replace(_grpo(case), vllm="colocate"))


def test_the_batch_counts_completions() -> None:
    with pytest.raises(SetupError, match="num_generations"):
        _budget(Case(generations=3, batch=4))
    with pytest.raises(SetupError, match="at least 2"):
        GrpoSetup(num_generations=1)
    # four micro-batches per generation: the generation batch, and its cache, is four times
    # as large; the policy's micro-batch is not
    one = _budget(Case(completion=64))
    four = _budget(Case(completion=64), steps_per_generation=4)
    kv = Component.KV_CACHE
    assert four.phase(Phase.GENERATE).components[kv].bytes == 4 * (
        one.phase(Phase.GENERATE).components[kv].bytes
    )
    assert four.phase(Phase.FORWARD).allocated_bytes == one.phase(Phase.FORWARD).allocated_bytes


def test_the_preference_entry_point_sizes_grpo() -> None:
    case = Case()
    pref = PreferenceSetup(objective=Objective.GRPO, grpo=_grpo(case))
    budget = estimate_preference_budget(_spec(), _setup(case), pref)
    assert (
        budget.allocated_peak_bytes
        == estimate_grpo_budget(_spec(), _setup(case), _grpo(case)).allocated_peak_bytes
    )


def test_mixed_precision_divides_fp32_logits() -> None:
    """GRPOConfig's default bf16=True: accelerate returns fp32 logits, and the division by the
    temperature copies them in fp32; with bf16=False over bf16 weights both stay 16-bit."""
    case = Case(2, 64, 0.04, dtype="bf16-true")
    spec, setup = _spec(case), _setup(case)
    on = estimate_grpo_budget(spec, setup, _grpo(case))
    off = estimate_grpo_budget(spec, setup, replace(_grpo(case), mixed_precision=False))
    logits = on.phase(Phase.FORWARD).components[Component.LOGITS].bytes
    rows, c, vocab = case.batch, case.completion, spec.vocab_size
    # fp32 logits of C + 1 positions and their fp32 copy divided by the temperature
    assert logits >= 4 * rows * (c + 1) * vocab + 4 * rows * c * vocab
    assert logits > off.phase(Phase.FORWARD).components[Component.LOGITS].bytes
    assert on.allocated_peak_bytes > off.allocated_peak_bytes


def test_eager_attention_repeats_the_grouped_heads_at_each_decoding_step() -> None:
    from llmmem.budget.setup import AttnImpl

    case = Case(completion=64)

    def temporaries(attn: AttnImpl) -> int:
        setup = replace(_setup(case), attn=attn)
        budget = estimate_grpo_budget(_spec(case), setup, _grpo(case))
        return budget.phase(Phase.GENERATE).components[Component.TEMPORARIES].bytes

    # one layer's keys: 2 kv heads × 16 × (prompt + 63) cached tokens × 4 rows × 4 B. SDPA
    # copies them once as the cache grows; eager attention copies K and V to all 4 query heads
    keys = 2 * 16 * (PROMPT + 63) * 4 * 4
    assert temporaries(AttnImpl.EAGER) - temporaries(AttnImpl.SDPA) == 2 * 2 * keys - keys


def test_soft_capped_logits_keep_their_tanh_through_the_log_probabilities() -> None:
    from llmmem.models.architectures import spec_from_config
    from llmmem.models.spec import ModelSource

    case = Case(2, 32, 0.0, family="gemma2")
    uncapped = spec_from_config(
        {**SMALL["gemma2"], "final_logit_softcapping": None},
        model_id="uncapped",
        source=ModelSource.CONFIG,
    )

    def logits(spec: Any, phase: Phase) -> int:
        budget = estimate_grpo_budget(spec, _setup(case), _grpo(case))
        return budget.phase(phase).components[Component.LOGITS].bytes

    # the tanh over 4 rows × (32 + 1) positions × 1,000 tokens, fp32, kept for backward
    tanh = 4 * 4 * 33 * 1000
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        assert logits(_spec(case), phase) - logits(uncapped, phase) == tanh


# -- TRL 1.x: the fused LM head, by hand from its tile sizes -----------------------------------


def _qwen_like() -> Any:
    """Qwen2.5-0.5B's proportions: hidden 896, a 151,936-token vocabulary, 24 layers."""
    from llmmem.models.architectures import spec_from_config
    from llmmem.models.spec import ModelSource

    config = {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    }
    return spec_from_config(config, model_id="qwen2.5-0.5b-like", source=ModelSource.CONFIG)


def _qwen_grpo(release: str | None, **grpo: Any) -> Any:
    """4 completions of 256 tokens after prompts of 512, bf16 weights, full fine-tuning."""
    from llmmem.budget.setup import Method, Precision

    setup = TrainingSetup(
        method=Method.FULL,
        batch=4,
        seq=768,
        precision=Precision("bf16-true"),
        optim="adamw_torch",
    )
    config = GrpoSetup(num_generations=4, max_prompt_length=512, max_completion_length=256, **grpo)
    return estimate_grpo_budget(_qwen_like(), setup, replace(config, trl_release=release))


def test_at_trl_1_the_policy_forward_holds_no_logits_sized_tensor() -> None:
    """TRL 1.16's GRPOTrainer scores the completion's tokens through the fused head: on a GPU
    P = 4 rows × 256 completion tokens = 1024 positions. Beyond what the SFT step already
    counts (the head's input, 2 B × 4 × 768 × 896), the head's forward holds the positions'
    bf16 copy (2 B × 1024 × 896), one tile buffer at the full 32768 columns (2 B × 1024 ×
    32768) and 36 B of per-position statistics (seven fp32 and the int64 targets)."""
    at_116 = _qwen_grpo("1.16.0")
    head = at_116.phase(Phase.FORWARD).components[Component.LOGITS].bytes
    assert head == 2 * 1024 * 896 + 2 * 1024 * 32768 + 36 * 1024
    one_logits = 2 * 4 * 257 * 151936  # 0.29: the bf16 logits of C + 1 positions, alone
    assert head < one_logits / 4


def test_at_trl_1_the_step_is_lower_by_about_the_logits() -> None:
    """At 0.29 the policy's forward makes the fp32 logits of 4 × 257 positions (accelerate's
    mixed precision, GRPOConfig's default) and their divided copy over 256: 2.4 GiB beside a
    tile buffer of 64 MiB at 1.16. The step's peak drops by more than one fp32 logits tensor
    and less than the logits terms together."""
    at_029 = _qwen_grpo(None).allocated_peak_bytes
    at_116 = _qwen_grpo("1.16.0").allocated_peak_bytes
    logits = 4 * 4 * 256 * 151936
    assert logits < at_029 - at_116 < 3 * logits
    assert _qwen_grpo("0.29.1").allocated_peak_bytes == at_029


def test_at_trl_1_a_later_chunk_keeps_nothing_of_the_earlier_one() -> None:
    """At 0.29 the reference's second chunk runs its head beside the first chunk's divided
    logits; at 1.16 a chunk keeps only its per-token outputs,
    so two chunks a generation size the reference's pass as one does (bf16 weights: no
    autocast copies either way)."""

    def reference(release: str | None, spg: int) -> int:
        budget = _qwen_grpo(release, beta=0.04, steps_per_generation=spg)
        return budget.phase(Phase.REFERENCE_FORWARD).allocated_bytes

    assert reference("1.16.0", 2) == reference("1.16.0", 1)
    assert reference(None, 2) > reference(None, 1)
    # and the one chunk's fp32 logits (C + 1 positions) and divided copy (C) are gone
    assert reference("1.16.0", 1) < reference(None, 1) - 4 * 4 * 256 * 151936


def test_the_preference_entry_point_passes_the_trl_release_to_grpo() -> None:
    case = Case(2, 64, 0.04)
    spec, setup = _spec(case), _setup(case)
    pref = PreferenceSetup(objective=Objective.GRPO, grpo=_grpo(case), trl_release="1.16.0")
    at_116 = estimate_grpo_budget(spec, setup, replace(_grpo(case), trl_release="1.16.0"))
    got = estimate_preference_budget(spec, setup, pref)
    assert got.allocated_peak_bytes == at_116.allocated_peak_bytes
    at_029 = estimate_grpo_budget(spec, setup, _grpo(case))
    assert got.allocated_peak_bytes != at_029.allocated_peak_bytes
    assert any("TRL 1.16.0" in note for note in got.notes)


def test_a_malformed_trl_release_is_a_clear_error() -> None:
    with pytest.raises(SetupError, match="trl_release must look like"):
        GrpoSetup(trl_release="one")


def test_trl_releases_before_the_fused_head_keep_the_full_logits() -> None:
    """`add_fused_lm_head` came with TRL 1.15: a run on 1.3 computes its log-probabilities from
    the full logits as 0.29 does, and is sized so."""
    assert _qwen_grpo("1.3.0").allocated_peak_bytes == _qwen_grpo(None).allocated_peak_bytes
    assert _qwen_grpo("1.15.0").allocated_peak_bytes == _qwen_grpo("1.16.0").allocated_peak_bytes

"""Packed samples: the budget against simulated steps whose batches really are packed.

The step gets position ids that restart at each sample, as TRL's padding-free collator and
axolotl's multipack sampler make them, and transformers builds whatever mask that implies for
the attention implementation (transformers 5.24, torch 2.13). The budget must follow every
phase within 5%, and say what packing costs: a block-diagonal mask that SDPA keeps per layer,
nothing under flash-attention.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmmem.budget.phases import estimate_budget
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.grid import GridCase, config_for, predict_case, run_case, setup_for

CASES = [
    GridCase(family, "lora", ckpt, 4, 256, "bf16", attn=attn, packing=packing)
    for family in ("llama", "qwen2")
    for packing in ("flat", "rows")
    for attn in ("sdpa", "flash_attention_2")
    for ckpt in (False, True)
] + [
    GridCase("llama", "full", False, 2, 128, "bf16-true", attn="eager", packing="flat"),
    GridCase("qwen2", "lora", False, 4, 256, "bf16", attn="eager", packing="rows"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_packed_step_within_five_percent(case: GridCase) -> None:
    result = run_case(case, config_for(case.family, "small"), device="fake")
    assert result.error is None, result.error
    assert result.simulated, "no phase was measured"
    assert result.worst <= 0.05, (case.name, result.predicted, result.simulated)


def _peak(case: GridCase) -> int:
    return max(predict_case(case, config_for(case.family, "small"), "grid")["phases"].values())


def test_sdpa_keeps_the_packed_mask_and_flash_attention_does_not() -> None:
    flat = GridCase("llama", "lora", False, 4, 256, "bf16", attn="sdpa", packing="flat")
    unpacked = replace(flat, packing=None)
    config = config_for("llama", "small")
    layers = config["num_hidden_layers"]
    tokens = 4 * 256
    # one additive mask of tokens² in bf16 per layer, and the boolean one built per forward
    expected = layers * tokens * tokens * 2 + tokens * tokens
    # with a mask transformers repeats K and V to every query head (no enable_gqa), and SDPA
    # keeps the copies: 2 tensors × bf16 × tokens × (query width − K/V width) per layer
    q_width = config["hidden_size"]
    kv_width = q_width * config["num_key_value_heads"] // config["num_attention_heads"]
    expected += layers * 2 * 2 * tokens * (q_width - kv_width)
    grown = _peak(flat) - _peak(unpacked)
    assert abs(grown - expected) <= 0.02 * expected, (grown, expected)
    flash = replace(flat, attn="flash_attention_2")
    assert _peak(flash) == _peak(replace(flash, packing=None))


def test_a_flat_row_of_eager_attention_scores_the_whole_square() -> None:
    """Eager attention over one flat row of batch × seq tokens scores (batch × seq)² pairs per
    head: batch times more than the same tokens in separate rows."""
    spec = spec_from_config(config_for("llama", "small"), model_id="g", source=ModelSource.LOCAL)
    rows = setup_for(GridCase("llama", "full", False, 4, 256, "bf16-true", attn="eager"))
    flat = replace(rows, packing="flat")
    a = estimate_budget(spec, rows).allocated_peak_bytes
    b = estimate_budget(spec, flat).allocated_peak_bytes
    assert b > a * 1.3


def test_a_real_cpu_step_with_packed_samples_agrees() -> None:
    """The same on real tensors: transformers finds the samples from the position ids (it
    skips that search for fake tensors' sake only when nothing is packed)."""
    case = GridCase("llama", "lora", False, 4, 256, "bf16", attn="sdpa", packing="flat")
    result = run_case(case, config_for("llama", "small"), device="cpu")
    assert result.error is None, result.error
    assert result.worst <= 0.05, (result.predicted, result.simulated)

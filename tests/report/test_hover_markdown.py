"""The Markdown the editor shows, and the per-setting deltas, checked against the accounting core
run directly (never against strings copied from the output)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from llmmem.budget.limits import largest_batch
from llmmem.budget.phases import estimate_budget
from llmmem.budget.setup import QuantType
from llmmem.check import check_text
from llmmem.report.deltas import setting_deltas
from llmmem.report.markdown import (
    budget_hover,
    cell,
    lora_hover,
    model_hover,
    plain_text,
    quantization_hover,
    setting_hover,
)
from llmmem.units import format_bytes

REPO = Path(__file__).resolve().parents[2]
QLORA = REPO / "examples" / "qlora_sft.py"


@pytest.fixture(scope="module")
def qlora():  # type: ignore[no-untyped-def]
    return check_text(QLORA, QLORA.read_text(), gpu="RTX-4090", hub=False).analysis


def test_budget_hover_rows_are_the_budget(qlora) -> None:  # type: ignore[no-untyped-def]
    text = budget_hover(qlora)
    # each number keeps its unit on its line (a no-break space): no `24.4` over `GiB`
    assert re.search(r"\| [\d.]+\u00a0GiB \|", text)
    text = text.replace("\u00a0", " ")
    budget = qlora.budget
    for component, term in budget.peak.components.items():
        if term.bytes:
            name = component.value.replace("_", " ")
            assert f"| {name} | {format_bytes(term.bytes)} |" in text
    assert f"**{format_bytes(budget.allocated_peak_bytes)}**" in text
    assert f"| **device total** | **{format_bytes(budget.device_total_bytes)}** |" in text
    best, _ = largest_batch(qlora.spec, qlora.setup, qlora.gpu)
    assert f"Largest micro-batch that fits RTX-4090: **{best}** (now 4)." in text
    # every table row has the same number of cells: no stray pipes from formulas
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert {line.replace("\\|", "").count("|") for line in rows} == {5}


def test_model_hover_counts_add_up(qlora) -> None:  # type: ignore[no-untyped-def]
    text = model_hover(qlora)
    p = qlora.spec.params
    assert f"| attention | {p.attention:,} |" in text
    assert f"| MLP | {p.mlp:,} |" in text
    assert "LlamaForCausalLM" in text and "catalog" in text


def test_quantization_hover_what_ifs_are_estimates(qlora) -> None:  # type: ignore[no-untyped-def]
    text = quantization_hover(qlora)
    assert text.startswith("**4-bit base weights** (nf4, double quantization)")
    eight_bit = replace(qlora.setup, quant=replace(qlora.setup.quant, quant_type=QuantType.INT8))
    total = estimate_budget(qlora.spec, eight_bit, qlora.gpu).device_total_bytes
    assert f"| 8-bit (load_in_8bit) | {format_bytes(total)} |" in text
    assert lora_hover(qlora).startswith("**LoRA** r = 16, alpha = 32")


def test_hover_without_an_estimate_says_why(tmp_path: Path) -> None:
    analysis = check_text(tmp_path / "x.py", "x = 1\n", hub=False).analysis
    text = budget_hover(analysis)
    assert text.startswith("**llmmem: no estimate**")
    assert "no model found" in text


def test_per_sample_delta_is_one_more_sample_estimated_again(qlora) -> None:  # type: ignore[no-untyped-def]
    deltas = {d.field: d for d in setting_deltas(qlora)}
    one_more = estimate_budget(qlora.spec, replace(qlora.setup, batch=5), qlora.gpu)
    expected = one_more.device_total_bytes - qlora.budget.device_total_bytes
    assert deltas["per_device_train_batch_size"].delta_bytes == expected
    assert deltas["per_device_train_batch_size"].label == f"≈ {format_bytes(expected)} per sample"
    # checkpointing is on: the hint says what it saves, a positive number
    assert deltas["gradient_checkpointing"].label.startswith("saves ")
    assert deltas["gradient_checkpointing"].delta_bytes > 0
    # each delta sits on the value it is about, in this file
    line = QLORA.read_text().splitlines()[deltas["optim"].range.start_line]
    assert "optim=" in line


def test_cell_escapes_pipes_and_newlines() -> None:
    assert cell("a | b\nc") == "a \\| b c"


def test_a_settings_hover_is_short_and_leads_with_the_whole(qlora) -> None:  # type: ignore[no-untyped-def]
    """The keyword's hover: the headline, what this setting costs and its nearby values, the
    largest micro-batch; not the table (that stays on the trainer call)."""
    text = setting_hover(qlora, "per_device_train_batch_size")
    lines = [line for line in text.splitlines() if line]
    budget = qlora.budget
    total = format_bytes(budget.device_total_bytes)
    assert lines[0].startswith(f"**≈ {total} of 24.0 GiB on RTX-4090**")
    assert lines[1].startswith("`per_device_train_batch_size=4`: Each extra sequence")
    assert "at micro-batch 2:" in text and "at micro-batch 8:" in text
    best, _ = largest_batch(qlora.spec, qlora.setup, qlora.gpu)
    assert f"Largest micro-batch that fits RTX-4090: **{best}** (now 4)." in text
    assert "| component |" not in text
    assert len(lines) <= 6


def test_nearby_values_are_estimates_of_those_values(qlora) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from llmmem.budget.phases import estimate_budget

    text = setting_hover(qlora, "per_device_train_batch_size").replace("\u00a0", " ")
    at_two = estimate_budget(qlora.spec, replace(qlora.setup, batch=2), qlora.gpu)
    assert f"at micro-batch 2: {format_bytes(at_two.device_total_bytes)}" in text


def test_plain_text_hover_has_no_markdown(qlora) -> None:  # type: ignore[no-untyped-def]
    text = plain_text(budget_hover(qlora))
    assert "**" not in text and "`" not in text and "|---" not in text
    assert text.splitlines()[0].startswith("≈ ")
    assert any(line.startswith("weights · ") for line in text.splitlines())

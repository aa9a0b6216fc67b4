"""A torchtune built-in config named on `tune run` (not on disk): its LoRA is the one torchtune's
LoRA configs share (rank 8, alpha 16, q, v and output projections and the MLP), not PEFT's
default of q and v, and `llmmem estimate --framework torchtune` takes the same targets."""

from __future__ import annotations

from pathlib import Path

from llmmem.extract import extract_plan
from llmmem.plan import Provenance
from llmmem.scenario import analyze


def test_a_built_in_lora_config_has_torchtunes_lora(tmp_path: Path) -> None:
    script = tmp_path / "launch.sh"
    script.write_text(
        "tune run lora_finetune_single_device --config llama3_1/8B_lora_single_device\n"
    )
    plan = extract_plan(script)
    assert plan.lora is not None
    assert plan.lora.target_modules.value == [
        "q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    ]  # fmt: skip
    assert plan.lora.target_modules.source is Provenance.DEFAULT
    assert "torchtune's built-in LoRA configs" in plan.lora.target_modules.note
    assert (plan.lora.r.value, plan.lora.alpha.value) == (8, 16.0)
    analysis = analyze(plan)
    assert analysis.setup is not None and analysis.setup.lora is not None
    # Llama-3.1-8B: 32 blocks of q (4096→4096), v (4096→1024), o (4096→4096), gate and up
    # (4096→14336) and down (14336→4096), rank 8
    per_block = 8 * ((4096 + 4096) + (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 14336)
                     + (14336 + 4096))  # fmt: skip
    assert analysis.budget is not None
    assert analysis.budget.trainable_params == 32 * per_block

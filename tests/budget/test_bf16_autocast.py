"""bf16 weights under bf16 autocast: a script that loads its model with dtype=torch.bfloat16 and
trains with bf16=True (TRL's configs default to it). The trainer keeps the weights as loaded
and accelerate runs forward under autocast, so the step is neither pure bf16 nor AMP over fp32
weights. Real CPU steps (torch 2.13, transformers 5.24, peft 0.21.2) at a medium size, as the
runner builds them: bf16 weights, fp32 LoRA adapters, forward under torch.autocast."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llmmem.budget.activations import estimate_activations
from llmmem.budget.phases import estimate_budget
from llmmem.budget.setup import LoraSetup, Method, Precision, TrainingSetup
from llmmem.extract import extract_plan
from llmmem.models.architectures import spec_from_config
from llmmem.models.catalog import catalog_entry
from llmmem.models.spec import ModelSource
from llmmem.verify.grid import GridCase, config_for, run_case, setup_for

CASES = [
    GridCase(family, "lora", ckpt, 2, 256, "bf16-autocast")
    for family in ("llama", "qwen2")
    for ckpt in (False, True)
] + [GridCase("llama", "full", False, 2, 256, "bf16-autocast")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_phase_within_5_percent_of_a_real_cpu_step(case: GridCase) -> None:
    result = run_case(case, config_for(case.family, "medium"), device="cpu")
    assert result.error is None, result.error
    assert result.worst <= 0.05, (result.predicted, result.simulated)


@pytest.mark.parametrize("family", ["qwen2"])
def test_lora_under_autocast_keeps_less_than_pure_bf16(family: str) -> None:
    """Pure bf16 hands each fp32 adapter an fp32 cast of its input, which its matmul keeps;
    under autocast the matmul runs in bf16 and keeps a bf16 cast. Both measured for real: the
    estimate must tell them apart, lower under autocast by between half and twice what the
    steps differ by (each estimate has its own error of about 1% of the peak)."""
    config = config_for(family, "medium")
    autocast = GridCase(family, "lora", False, 2, 256, "bf16-autocast")
    pure = replace(autocast, precision="bf16-true")
    got = {
        c.precision: max(run_case(c, config, device="cpu").simulated.values())
        for c in (autocast, pure)
    }
    measured = got["bf16-true"] - got["bf16-autocast"]
    assert measured > 0.01 * got["bf16-true"]
    spec = spec_from_config(config, model_id="g", source=ModelSource.LOCAL)
    predicted = (
        estimate_budget(spec, setup_for(pure), with_first_step=False).allocated_peak_bytes
        - estimate_budget(spec, setup_for(autocast), with_first_step=False).allocated_peak_bytes
    )
    assert 0.5 * measured < predicted < 2 * measured


def test_a_script_loading_bf16_and_training_with_bf16_true_is_read_so(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B', dtype=torch.bfloat16)\n"
        "args = TrainingArguments(output_dir='o', bf16=True)\n"
        "Trainer(model=model, args=args).train()\n",
        encoding="utf-8",
    )
    plan = extract_plan(script)
    assert plan.precision.value == Precision.BF16_AUTOCAST.value
    assert "autocast" in (plan.precision.note or "")


@pytest.mark.parametrize(("bf16", "precision"), [(True, "bf16-autocast"), (False, "bf16-true")])
def test_a_script_giving_no_dtype_trains_the_checkpoints_bf16_under_its_autocast(
    tmp_path: Path, bf16: bool, precision: str
) -> None:
    """transformers 5 loads a bf16 checkpoint as bf16 when from_pretrained has no dtype=; the
    Trainer's bf16=True then autocasts over those weights (the step measured above), and
    without it the step is pure bf16."""
    from llmmem.scenario import analyze

    script = tmp_path / "train.py"
    script.write_text(
        "from peft import LoraConfig, get_peft_model\n"
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
        "model = get_peft_model(model, LoraConfig(r=8, target_modules=['q_proj', 'v_proj']))\n"
        f"args = TrainingArguments(output_dir='o', bf16={bf16})\n"
        "Trainer(model=model, args=args).train()\n",
        encoding="utf-8",
    )
    analysis = analyze(extract_plan(script))
    assert analysis.setup is not None and analysis.budget is not None
    assert analysis.setup.precision.value == precision
    as_stated = replace(analysis.setup, precision=Precision(precision))
    assert analysis.spec is not None
    assert (
        estimate_budget(analysis.spec, as_stated).allocated_peak_bytes
        == analysis.budget.allocated_peak_bytes
    )


def test_each_fp32_adapter_keeps_its_own_16_bit_copy_of_its_input() -> None:
    """bf16 weights under bf16 autocast (the Trainer's bf16=True on a model loaded in bf16), LoRA
    on q, k, v and o: peft's lora.Linear casts its bf16 input to the adapters' fp32
    (`_cast_input_dtype(x, lora_A.weight.dtype)`, peft 0.21.2 tuners/lora/layer.py), and autocast
    casts that copy (not a leaf: not cached) back to bf16 for lora_A, which keeps it: one N·in
    bf16 tensor per adapter, none shared with the block's input. Real CPU steps of
    Llama-3.2-1B at 4 × 1024 (torch 2.13, transformers 5.24, peft 0.21.2) with 2 and 4 layers
    differ by 503,193,632 B per block, of which 124,198,912 B are the block's weights, adapters
    and AdamW states: 378,994,720 B of saved tensors (458,784 B of them the norms' rsqrt and
    autocast's cached bf16 copies of the adapters, not counted)."""
    entry = catalog_entry("meta-llama/Llama-3.2-1B")
    assert entry is not None
    spec = spec_from_config(dict(entry.config), model_id="m", source=ModelSource.LOCAL)
    lora = LoraSetup(r=16, alpha=32, targets=["q_proj", "k_proj", "v_proj", "o_proj"])
    setup = TrainingSetup(
        method=Method.LORA, lora=lora, batch=4, seq=1024, precision=Precision.BF16_AUTOCAST
    )
    block = estimate_activations(spec, setup).per_block_bytes(spec.blocks[0])
    assert abs(block - 378_994_720) <= 0.002 * 378_994_720, block

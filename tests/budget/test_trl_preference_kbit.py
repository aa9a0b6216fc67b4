"""TRL's preference trainers over a k-bit model given a peft_config (read in TRL 0.29.1 and
1.16.0): DPOTrainer prepares nothing and casts its adapters to bf16; KTO, ORPO and CPO prepare the
model for k-bit training, keep fp32 adapters and, under bf16=True over a 4-bit model, cast the
embeddings and the head back to bf16. One rule (budget/trl_rules.py) for a script and for
`llmmem estimate`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmmem.budget.setup import LoraSetup, Precision, QuantSetup, QuantType, TrainingSetup
from llmmem.budget.trl_rules import preference_trainer_on_kbit
from llmmem.extract import extract_plan
from llmmem.scenario import analyze


def qlora(precision: Precision = Precision.BF16, quant_type: QuantType = QuantType.NF4) -> Any:
    return TrainingSetup(
        method="qlora" if quant_type is not QuantType.INT8 else "lora",
        precision=precision,
        lora=LoraSetup(r=16, alpha=32, targets=["q_proj", "v_proj"]),
        quant=QuantSetup(quant_type=quant_type),
    )


def test_dpo_casts_its_adapters_and_prepares_nothing() -> None:
    setup, note = preference_trainer_on_kbit(qlora(), "dpo")
    assert setup.quant is not None and setup.lora is not None
    assert setup.quant.prepare_for_kbit_training is False
    assert setup.lora.adapter_bytes == 2
    assert note is not None and "DPOTrainer" in note


@pytest.mark.parametrize("objective", ["kto", "orpo", "cpo"])
def test_kto_orpo_cpo_prepare_and_cast_the_embeddings_back_under_bf16(objective: str) -> None:
    setup, _ = preference_trainer_on_kbit(qlora(), objective)
    assert setup.quant is not None and setup.lora is not None
    assert setup.quant.prepare_for_kbit_training is True
    assert setup.quant.embeddings_16bit is True
    assert setup.lora.adapter_bytes == 4
    fp32, _ = preference_trainer_on_kbit(qlora(Precision.FP32), objective)
    assert fp32.quant is not None and fp32.quant.embeddings_16bit is False
    # peft_module_casting_to_bf16 runs only over a 4-bit model
    int8, _ = preference_trainer_on_kbit(qlora(quant_type=QuantType.INT8), objective)
    assert int8.quant is not None and int8.quant.embeddings_16bit is False


def test_other_objectives_and_unquantized_models_are_left_alone() -> None:
    assert preference_trainer_on_kbit(qlora(), "grpo") == (qlora(), None)
    plain = TrainingSetup(method="lora", lora=LoraSetup(r=8, alpha=16, targets=["q_proj"]))
    assert preference_trainer_on_kbit(plain, "dpo") == (plain, None)


SCRIPT = """\
import torch
from peft import LoraConfig{prepare_import}
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from trl import DPOConfig, DPOTrainer

quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                           bnb_4bit_compute_dtype=torch.bfloat16)
name = "Qwen/Qwen2.5-0.5B-Instruct"
model = AutoModelForCausalLM.from_pretrained(name, quantization_config=quant)
{prepare}
lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
args = DPOConfig(output_dir="out", per_device_train_batch_size=2, max_length=512)
DPOTrainer(model=model, args=args, peft_config=lora, train_dataset=None).train()
"""


def test_a_dpo_qlora_script_and_estimate_take_the_same_rule(tmp_path: Path) -> None:
    script = tmp_path / "dpo.py"
    script.write_text(SCRIPT.format(prepare_import="", prepare=""))
    analysis = analyze(extract_plan(script))
    assert analysis.setup is not None and analysis.setup.lora is not None
    assert analysis.setup.lora.adapter_bytes == 2
    assert analysis.setup.quant is not None
    assert analysis.setup.quant.prepare_for_kbit_training is False
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "estimate", "--offline", "--format", "json"]
        + ["--model", "Qwen/Qwen2.5-0.5B-Instruct", "--objective", "dpo", "--method", "qlora"]
        + ["--lora-targets", "all-linear", "--lora-r", "16", "--batch", "2", "--seq", "512"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    values = json.loads(done.stdout)["setup"]["values"]
    assert values["lora"]["adapter_bytes"] == 2
    assert values["quant"]["prepare_for_kbit_training"] is False


def test_a_script_that_prepares_the_model_itself_keeps_it(tmp_path: Path) -> None:
    script = tmp_path / "dpo.py"
    script.write_text(
        SCRIPT.format(
            prepare_import=", prepare_model_for_kbit_training",
            prepare="model = prepare_model_for_kbit_training(model)",
        )
    )
    analysis = analyze(extract_plan(script))
    assert analysis.setup is not None and analysis.setup.quant is not None
    assert analysis.setup.quant.prepare_for_kbit_training is True

"""`bnb_4bit_quant_storage` read from scripts and configs: FSDP shards the packed 4-bit weights
when they are stored in a float dtype, so the per-GPU estimate drops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llmmem.check import check_text
from llmmem.extract import extract_plan
from llmmem.plan import Provenance

SCRIPT = """\
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

bnb = BitsAndBytesConfig(
    load_in_4bit=True,
    bnb_4bit_quant_type="nf4",
    bnb_4bit_compute_dtype=torch.bfloat16,{storage}
)
model = AutoModelForCausalLM.from_pretrained(
    "meta-llama/Llama-2-7b-hf", quantization_config=bnb, torch_dtype=torch.bfloat16
)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
args = TrainingArguments(
    "out",
    per_device_train_batch_size=1,
    bf16=True,
    gradient_checkpointing=True,
    fsdp="full_shard auto_wrap",
)
Trainer(model=model, args=args).train()
"""
STORAGE = "\n    bnb_4bit_quant_storage=torch.bfloat16,"


def per_gpu_bytes(tmp_path: Path, storage: str) -> int:
    path = tmp_path / "train.py"
    checked = check_text(
        path, SCRIPT.format(storage=storage), gpu="RTX-3090", hub=False, world_size=2
    )
    budget = checked.analysis.budget
    assert budget is not None, checked.analysis.problems
    return budget.device_total_bytes


def test_quant_storage_in_a_float_dtype_lowers_the_fsdp_estimate(tmp_path: Path) -> None:
    with_storage = per_gpu_bytes(tmp_path, STORAGE)
    without = per_gpu_bytes(tmp_path, "")
    # 7B packed 4-bit weights are about 3.5 GB: half of them live on the other GPU
    assert without - with_storage > 1_000_000_000, (with_storage, without)


def test_the_script_value_and_its_line_are_in_the_plan(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    plan = extract_plan(path, SCRIPT.format(storage=STORAGE))
    assert plan.quantization is not None
    storage = plan.quantization.quant_storage
    assert storage.value == "bfloat16" and storage.source is Provenance.EXPLICIT
    assert storage.range is not None and storage.range.start_line + 1 == 9
    default = extract_plan(path, SCRIPT.format(storage="")).quantization
    assert default is not None and default.quant_storage.value == "uint8"
    assert default.quant_storage.source is Provenance.DEFAULT


def test_explain_shows_the_storage_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.format(storage=STORAGE))
    proc = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", str(path), "--gpu", "RTX-3090"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if "quant storage" in line)
    assert "bfloat16" in row and "9" in row, row


def test_configs_spell_it_their_way(tmp_path: Path) -> None:
    trl = tmp_path / "trl.yaml"
    trl_text = (
        "model_name_or_path: meta-llama/Llama-2-7b-hf\nload_in_4bit: true\n"
        "bnb_4bit_quant_storage: bfloat16\n"
    )
    plan = extract_plan(trl, trl_text)
    assert plan.quantization is not None
    assert plan.quantization.quant_storage.value == "bfloat16"
    axolotl = tmp_path / "axolotl.yml"
    axolotl_text = (
        "base_model: meta-llama/Llama-2-7b-hf\nadapter: qlora\nload_in_4bit: true\n"
        "lora_r: 8\nlora_alpha: 16\nbf16: true\nsequence_len: 1024\nmicro_batch_size: 1\n"
    )
    plan = extract_plan(axolotl, axolotl_text)
    assert plan.quantization is not None
    assert plan.quantization.quant_storage.value == "bfloat16"

"""A later stage of a project loads the folder an earlier stage writes (`./results/sft_model`,
often as the absolute path of the machine it ran on): sized as the model the earlier stage
trains, said so, and left unsized where the project's files disagree or nothing writes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

QWEN25_05B_PARAMS = 494_032_768  # Qwen/Qwen2.5-0.5B, its model card's safetensors count
QWEN25_15B_PARAMS = 1_543_714_304  # Qwen/Qwen2.5-1.5B

SFT_SCRIPT = """\
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("{model}")
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
args = TrainingArguments(output_dir="{output}", per_device_train_batch_size=2)
Trainer(model=model, args=args).train()
"""

DPO_LAUNCHER = """\
#!/bin/bash
accelerate launch train_dpo.py \\
    --model_name_or_path "{ref}" \\
    --output_dir ./results/dpo_model \\
    --per_device_train_batch_size 2 \\
    --bf16
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
        "LLMMEM_CACHE_DIR": str(tmp_path / "llmmem-cache"),
        "HF_ENDPOINT": "http://127.0.0.1:9",
    }


def project(tmp_path: Path) -> Path:
    root = tmp_path / "dpo-project"
    (root / ".git").mkdir(parents=True)
    (root / "scripts").mkdir()
    return root


def explain(path: Path, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=path.parent,
    )
    assert done.returncode in (0, 1), done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_a_merged_model_an_earlier_stage_writes_is_sized_as_the_model_it_trains(
    tmp_path: Path, env: dict[str, str]
) -> None:
    root = project(tmp_path)
    (root / "scripts" / "train_sft.py").write_text(
        SFT_SCRIPT.format(model="Qwen/Qwen2.5-0.5B", output="./results/sft_model")
    )
    launcher = root / "scripts" / "training_dpo.sh"
    launcher.write_text(DPO_LAUNCHER.format(ref="/workspace/dpo-project/results/sft_model/merged"))
    report = explain(launcher, env)
    model = report["budget"]["model"]
    assert model["params"] == QWEN25_05B_PARAMS
    assert model["is_guess"] is False
    notes = " ".join(report["budget"]["notes"] + model.get("notes", []))
    assert "scripts/train_sft.py:6 of this project writes it" in notes
    assert "Qwen/Qwen2.5-0.5B" in notes


def test_a_k_bit_stage_on_an_earlier_stages_adapter_trains_that_adapter(
    tmp_path: Path, env: dict[str, str]
) -> None:
    root = project(tmp_path)
    (root / "sft.py").write_text(
        SFT_SCRIPT.format(model="Qwen/Qwen2.5-1.5B", output="qwen_sft_lora")
    )
    grpo = root / "grpo.py"
    grpo.write_text(
        "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
        "from trl import GRPOConfig, GRPOTrainer\n"
        "model = AutoModelForCausalLM.from_pretrained(\n"
        "    '/home/me/proj/qwen_sft_lora/',\n"
        "    quantization_config=BitsAndBytesConfig(load_in_4bit=True),\n"
        ")\n"
        "args = GRPOConfig(output_dir='grpo_out', per_device_train_batch_size=4)\n"
        "GRPOTrainer(model=model, args=args, reward_funcs=[]).train()\n"
    )
    report = explain(grpo, env)
    budget = report["budget"]
    assert budget["model"]["params"] == QWEN25_15B_PARAMS
    # the adapter sft.py configures (r=8 on q and v) is what trains: its size is in the budget
    spec_layers, hidden = 28, 1536
    kv = 256  # 2 key-value heads of 128
    lora_params = spec_layers * 8 * ((hidden + hidden) + (hidden + kv))
    assert budget["trainable_params"] == lora_params
    lora = report["plan"]["lora"]
    assert lora["r"]["value"] == 8
    assert lora["r"]["range"]["path"].endswith("sft.py")


def test_files_that_write_the_folder_from_different_models_leave_it_unsized(
    tmp_path: Path, env: dict[str, str]
) -> None:
    root = project(tmp_path)
    for name, model in [("a.py", "Qwen/Qwen2.5-0.5B"), ("b.py", "Qwen/Qwen2.5-1.5B")]:
        (root / name).write_text(SFT_SCRIPT.format(model=model, output="./out/sft"))
    launcher = root / "scripts" / "dpo.sh"
    launcher.write_text(DPO_LAUNCHER.format(ref="./out/sft"))
    report = explain(launcher, env)
    assert report["budget"] is None
    error = " ".join(report["problems"])
    assert "train different models" in error
    assert "a.py (Qwen/Qwen2.5-0.5B)" in error and "b.py (Qwen/Qwen2.5-1.5B)" in error


def test_a_folder_nothing_in_the_project_writes_stays_unknown(
    tmp_path: Path, env: dict[str, str]
) -> None:
    root = project(tmp_path)
    # writes ./results/sft_model_v2, not ./results/sft_model, and another project's folder
    (root / "train_sft.py").write_text(
        SFT_SCRIPT.format(model="Qwen/Qwen2.5-0.5B", output="./results/sft_model_v2")
    )
    launcher = root / "scripts" / "dpo.sh"
    launcher.write_text(DPO_LAUNCHER.format(ref="/workspace/x/results/sft_model/merged_model"))
    report = explain(launcher, env)
    assert report["budget"] is None
    problems = " ".join(report["problems"])
    assert "no such path" in problems and "writes it" not in problems


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_named_pipe_in_the_project_is_not_read(tmp_path: Path, env: dict[str, str]) -> None:
    """The search reads regular files only: a FIFO named like a config would block for ever."""
    root = project(tmp_path)
    os.mkfifo(root / "sft_model.json")
    launcher = root / "scripts" / "dpo.sh"
    launcher.write_text(DPO_LAUNCHER.format(ref="/workspace/x/results/sft_model"))
    report = explain(launcher, env)  # would time out reading the pipe
    assert report["budget"] is None

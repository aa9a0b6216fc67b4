"""`llmmem verify` on preference scripts: the step TRL 0.29.1 runs, on the script's own model
(a tiny Llama from a local config), phase by phase against the preference budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from llmmem.verify.grid import SMALL_CONFIGS  # noqa: E402

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}

DPO_SCRIPT = """import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM
from trl import DPOConfig, DPOTrainer

model = AutoModelForCausalLM.from_pretrained("./tiny", dtype=torch.bfloat16)
args = DPOConfig(
    output_dir="out",
    per_device_train_batch_size=2,
    max_length=128,
    optim="adamw_torch",
    bf16=True,
)
trainer = DPOTrainer(
    model=model,
    args=args,
    train_dataset=load_dataset("trl-lib/ultrafeedback_binarized", split="train"),
    peft_config=PEFT,
)
trainer.train()
"""


def _project(tmp_path: Path, script: str) -> Path:
    (tmp_path / ".git").mkdir()
    model = tmp_path / "tiny"
    model.mkdir()
    config = {**SMALL_CONFIGS["llama"], "torch_dtype": "bfloat16"}
    (model / "config.json").write_text(json.dumps(config))
    (tmp_path / "train.py").write_text(script)
    return tmp_path


def _verify(project: Path, *args: str, file: str = "train.py") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmmem", "verify", file, "--format", "json", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("peft", "reference"),
    [
        ('LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])', "adapter"),
        ("None", "copy"),
    ],
)
@pytest.mark.parametrize("device", ["--simulate", "--device=cpu"])
def test_dpo_is_verified_phase_by_phase(
    tmp_path: Path, peft: str, reference: str, device: str
) -> None:
    project = _project(tmp_path, DPO_SCRIPT.replace("PEFT", peft))
    done = _verify(project, device)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {row["what"]: row for row in report["comparison"]}
    # the reference's own pass is measured, as the budget names it
    assert rows["reference forward peak"]["measured_bytes"]
    for name in ("forward peak", "reference forward peak", "backward peak", "allocated peak"):
        assert abs(rows[name]["error"]) < 0.05, (name, rows[name])
    assert rows["reserved peak"]["measured_bytes"] >= rows["allocated peak"]["measured_bytes"]
    notes = " ".join(report["measurement"]["notes"])
    assert "DPO step as TRL 0.29.1 computes it" in notes
    expected = {"adapter": "adapter disabled", "copy": "a frozen copy"}[reference]
    assert expected in notes


def test_a_kto_script_is_not_simulated_and_says_why(tmp_path: Path) -> None:
    script = DPO_SCRIPT.replace("DPOConfig", "KTOConfig").replace("DPOTrainer", "KTOTrainer")
    project = _project(tmp_path, script.replace("PEFT", "None"))
    done = _verify(project, "--simulate")
    assert done.returncode == 2
    assert "KTO" in done.stderr and "--device cpu" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_simulated_grpo_script_is_sent_to_the_cpu(tmp_path: Path) -> None:
    script = (
        "import torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "from trl import GRPOConfig, GRPOTrainer\n"
        'model = AutoModelForCausalLM.from_pretrained("./tiny", dtype=torch.bfloat16)\n'
        'args = GRPOConfig(output_dir="out", per_device_train_batch_size=4, num_generations=4)\n'
        "GRPOTrainer(model=model, args=args, reward_funcs=[len]).train()\n"
    )
    done = _verify(_project(tmp_path, script), "--simulate")
    assert done.returncode == 2
    # sampling cannot run on fake tensors; the real step runs on the CPU
    # (tests/verify/test_grpo_verify.py)
    assert "--device cpu" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_ppo_script_points_to_its_grid(tmp_path: Path) -> None:
    script = (
        "import torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "from trl.experimental.ppo import PPOConfig, PPOTrainer\n"
        'model = AutoModelForCausalLM.from_pretrained("./tiny", dtype=torch.bfloat16)\n'
        'args = PPOConfig(output_dir="out", per_device_train_batch_size=4, response_length=16)\n'
        "PPOTrainer(args=args, model=model, ref_model=None, reward_model=model,\n"
        "           value_model=model, processing_class=None, train_dataset=[]).train()\n"
    )
    done = _verify(_project(tmp_path, script), "--simulate")
    assert done.returncode == 2
    assert "--ppo" in done.stderr and "PPO" in done.stderr
    assert "Traceback" not in done.stderr


SIMPO_SCRIPT = """import torch
from transformers import AutoModelForCausalLM
from trl.experimental.cpo import CPOConfig, CPOTrainer

model = AutoModelForCausalLM.from_pretrained("./tiny", dtype=torch.bfloat16)
args = CPOConfig(
    output_dir="out",
    loss_type="simpo",
    cpo_alpha=0.0,
    per_device_train_batch_size=2,
    max_length=128,
    optim="adamw_torch",
    bf16=True,
)
CPOTrainer(model=model, args=args, train_dataset=None).train()
"""


def test_a_simpo_script_is_verified_without_the_cross_entropy(tmp_path: Path) -> None:
    done = _verify(_project(tmp_path, SIMPO_SCRIPT), "--device=cpu")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {row["what"]: row for row in report["comparison"]}
    for name in ("forward peak", "backward peak", "allocated peak"):
        assert abs(rows[name]["error"]) < 0.05, (name, rows[name])
    assert "SIMPO step as TRL 0.29.1 computes it" in " ".join(report["measurement"]["notes"])


LLAMAFACTORY_DPO = """model_name_or_path: ./tiny
stage: dpo
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: q_proj,v_proj
pref_loss: sigmoid
dataset: dpo_en_demo
template: llama2
cutoff_len: 128
output_dir: out
per_device_train_batch_size: 2
optim: adamw_torch
bf16: true
"""


@pytest.mark.parametrize("stage", ["dpo", "kto"])
def test_a_llamafactory_yaml_is_verified_with_its_own_trainer(tmp_path: Path, stage: str) -> None:
    project = _project(tmp_path, "")
    (project / "dpo.yaml").write_text(LLAMAFACTORY_DPO.replace("stage: dpo", f"stage: {stage}"))
    done = _verify(project, "--device=cpu", file="dpo.yaml")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {row["what"]: row for row in report["comparison"]}
    for name in ("forward peak", "reference forward peak", "backward peak", "allocated peak"):
        assert abs(rows[name]["error"]) < 0.05, (name, rows[name])
    notes = " ".join(report["measurement"]["notes"])
    assert f"{stage.upper()} step as LLaMA-Factory 0.9.5's trainer" in notes

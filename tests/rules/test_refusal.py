"""LLM018: a training file whose setup is read but not sized gets a finding, not a silent pass
(`llmmem-lint` run as a user runs it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

TORCHTUNE = """\
model:
  _component_: torchtune.models.llama3_1.lora_llama3_1_8b
batch_size: 2
tokenizer:
  max_seq_len: 1024
dtype: {dtype}
"""

LITGPT_CONFIG = """\
checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B
precision: bf16-true
train:
  micro_batch_size: 2
  max_seq_length: 512
"""


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["llmmem-lint", str(path), "--gpu", "A100-80GB"],
        capture_output=True,
        text=True,
        check=False,
        cwd=path.parent,
    )


def test_a_setup_the_framework_refuses_is_a_warning_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "8B_lora.yaml"
    path.write_text(TORCHTUNE.format(dtype="fp16"))
    done = lint(path)
    assert done.returncode == 1
    (line,) = done.stdout.splitlines()
    assert "LLM018 [warning] no estimate:" in line and "torchtune refuses fp16" in line
    path.write_text(TORCHTUNE.format(dtype="bf16"))
    done = lint(path)
    assert "LLM018" not in done.stdout, done.stdout


def test_a_method_llmmem_does_not_size_is_said(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(LITGPT_CONFIG)
    script = tmp_path / "train.sh"
    script.write_text("litgpt finetune adapter --config c.yaml\n")
    done = lint(script)
    assert done.returncode == 1
    assert "LLM018" in done.stdout and "LLaMA-Adapter" in done.stdout
    script.write_text("litgpt finetune lora --config c.yaml\n")
    assert "LLM018" not in lint(script).stdout


def test_a_refusal_another_rule_explains_is_said_once(tmp_path: Path) -> None:
    """LoRA targets that match nothing stop the estimate too: LLM013 names them; LLM018 adds
    nothing there."""
    path = tmp_path / "8B_lora.yaml"
    path.write_text(
        TORCHTUNE.format(dtype="bf16").replace(
            "  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n",
            "  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n"
            "  lora_attn_modules: ['qkv']\n",
        )
    )
    done = lint(path)
    codes = [line.split()[1] for line in done.stdout.splitlines()]
    assert "LLM013" in codes and "LLM018" not in codes


KBIT_SCRIPT = """\
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained(
    "meta-llama/Llama-3.2-1B", quantization_config=BitsAndBytesConfig(load_in_4bit=True)
)
"""


def test_a_trainer_over_a_4bit_model_without_adapters_is_said_but_a_loader_is_not(
    tmp_path: Path,
) -> None:
    """Full fine-tuning of a 4-bit model is not possible: said where a Trainer trains it; a
    file that only loads the model (no trainer) trains nothing and gets no finding."""
    loader = tmp_path / "load_model.py"
    loader.write_text(KBIT_SCRIPT)
    assert "LLM018" not in lint(loader).stdout
    trainer = tmp_path / "train.py"
    trainer.write_text(
        KBIT_SCRIPT
        + 'args = TrainingArguments(output_dir="out", per_device_train_batch_size=2)\n'
        + "Trainer(model=model, args=args).train()\n"
    )
    done = lint(trainer)
    assert "LLM018" in done.stdout and "no LoRA adapter" in done.stdout, done.stdout

"""The model id as the run reaches it: through `snapshot_download` (a local copy of the named
repository), and a required argument whose default is empty (not a value written wrong); PEFT's
old `prepare_model_for_int8_training` keeps the model and its adapter."""

from __future__ import annotations

from pathlib import Path

from llmmem.check import check_text
from llmmem.extract import extract_plan

DOWNLOADED = """from modelscope import snapshot_download
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model_dir = snapshot_download("Qwen/Qwen3-0.6B", cache_dir="./models")
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype="auto")
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=32))
Trainer(model=model, args=TrainingArguments(output_dir="o", per_device_train_batch_size=2)).train()
"""

REQUIRED = """import fire
from peft import LoraConfig, get_peft_model, prepare_model_for_int8_training
from transformers import LlamaForCausalLM, Trainer, TrainingArguments


def train(base_model: str = "", micro_batch_size: int = 4, lora_r: int = 8):
    assert base_model, "Please specify a --base_model"
    model = LlamaForCausalLM.from_pretrained(base_model, load_in_8bit=True)
    model = prepare_model_for_int8_training(model)
    model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=16))
    args = TrainingArguments(output_dir="o", per_device_train_batch_size=micro_batch_size)
    Trainer(model=model, args=args).train()


if __name__ == "__main__":
    fire.Fire(train)
"""


def test_a_snapshot_download_is_the_repository_it_copies(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(DOWNLOADED)
    plan = extract_plan(path)
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen3-0.6B"
    assert "snapshot_download" in plan.model_id.note


def test_an_empty_required_model_is_asked_for_not_rejected(tmp_path: Path) -> None:
    path = tmp_path / "finetune.py"
    path.write_text(REQUIRED)
    checked = check_text(path, REQUIRED, gpu="A100-80GB", hub=False)
    codes = [finding.code for finding in checked.findings]
    assert codes == ["LLM010"]  # no LLM011: the empty default is not a value written wrong
    assert "empty: the command line must give it" in checked.findings[0].message
    plan = checked.analysis.plan
    # the old PEFT preparation keeps the model, so its adapter is read
    assert plan.lora is not None and plan.lora.r.value == 8
    assert plan.quantization is not None and plan.quantization.bits.value == 8
    assert plan.quantization.prepare_for_kbit_training.value is True

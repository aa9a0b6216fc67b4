"""A vision-language model's training file as a user writes it: a LLaMA-Factory `qwen2_vl` LoRA
config and a TRL SFT script. No config says how many images a sample holds; one is assumed and
the estimate says so. LLaMA-Factory's images are sized at its `image_max_pixels`, and its
`freeze_vision_tower` (on by default) keeps LoRA's adapters out of the vision encoder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmmem.cli import main

LLAMAFACTORY = """\
model_name_or_path: Qwen/Qwen2-VL-7B-Instruct
image_max_pixels: 262144
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
template: qwen2_vl
cutoff_len: 2048
per_device_train_batch_size: 1
bf16: true
"""

TRL_SCRIPT = """\
import torch
from peft import LoraConfig
from transformers import AutoModelForImageTextToText
from trl import SFTConfig, SFTTrainer

model = AutoModelForImageTextToText.from_pretrained(
    "Qwen/Qwen2.5-VL-7B-Instruct", torch_dtype=torch.bfloat16
)
args = SFTConfig(output_dir="out", per_device_train_batch_size=2, max_length=2048, bf16=True)
lora = LoraConfig(r=16, target_modules=["q_proj"])
trainer = SFTTrainer(model=model, args=args, peft_config=lora)
trainer.train()
"""

# Qwen2-VL-7B's language model: 28 layers of hidden 3584, kv width 512, MLP 18944; LoRA r 8
# on every Linear of a layer: r × (in + out) summed over q, k, v, o, gate, up, down
LM_LORA_R8 = 28 * 8 * (2 * 7168 + 2 * 4096 + 3 * 22528)


def explain(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    code = main(["explain", str(path), "--format", "json", "--gpu", "A100-80GB"])
    out = capsys.readouterr().out
    assert code == 0, out
    report: dict[str, Any] = json.loads(out)
    return report["budget"]


def test_llamafactory_sizes_one_image_at_its_bound_and_keeps_adapters_in_the_lm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "qwen2vl_lora_sft.yaml"
    config.write_text(LLAMAFACTORY)
    budget = explain(capsys, config)
    # image_max_pixels 262144: a 512² image, smart_resize to 504² (18 × 28), 36×36 patches of
    # 14, 2×2 a token: 324 tokens
    notes = budget["notes"]
    assert any("324 tokens of each sample" in note and "assumed" in note for note in notes), notes
    assert budget["trainable_params"] == LM_LORA_R8

    config.write_text(LLAMAFACTORY + "freeze_vision_tower: false\n")
    unfrozen = explain(capsys, config)
    # the vision blocks' Linears get adapters too
    assert unfrozen["trainable_params"] > LM_LORA_R8
    assert unfrozen["allocated_peak_bytes"] > budget["allocated_peak_bytes"]


def test_a_trl_vision_script_assumes_one_image_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "sft_vlm.py"
    script.write_text(TRL_SCRIPT)
    budget = explain(capsys, script)
    assert any(
        "448×448 px" in note and "one image a sample assumed" in note for note in budget["notes"]
    ), budget["notes"]
    # the ViT and the merger are weights of the model: 8.29B parameters in all
    assert budget["model"]["params"] > 8_200_000_000
    assert budget["model"]["architecture"] == "Qwen2_5_VLForConditionalGeneration"


AXOLOTL = """\
base_model: Qwen/Qwen2-VL-7B-Instruct
processor_type: AutoProcessor
skip_prepare_dataset: true
remove_unused_columns: false
sample_packing: false
chat_template: qwen2_vl
datasets:
  - path: HuggingFaceH4/llava-instruct-mix-vsft
    type: chat_template
image_size: 512
adapter: lora
lora_r: 32
lora_alpha: 16
lora_target_modules: >-
  model.language_model.layers.[\\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj
sequence_len: 8192
micro_batch_size: 1
bf16: true
gradient_checkpointing: true
flash_attention: true
"""


def test_an_axolotl_multimodal_config_adapts_the_language_model_by_its_expression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "qwen2vl_lora.yaml"
    config.write_text(AXOLOTL)
    budget = explain(capsys, config)
    # the expression names the language model's Linears only: r 32 is four times r 8
    assert budget["trainable_params"] == 4 * LM_LORA_R8
    # image_size 512: resized to 512² first, then smart_resize to 504², 324 tokens
    assert any("324 tokens of each sample" in note for note in budget["notes"]), budget["notes"]

"""A YAML config that stops parsing: the keys above the error are still read, even where the
line just above it (a `key:value` with no blank) only fails once the next line is seen."""

from __future__ import annotations

from pathlib import Path

from llmmem.extract import extract_plan

CONFIG = """model_name_or_path: Qwen/Qwen2.5-3B-Instruct
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 16
cutoff_len: 4096
report_to:wandb

per_device_train_batch_size: 4
"""


def test_keys_above_a_broken_line_are_read(tmp_path: Path) -> None:
    path = tmp_path / "lf.yaml"
    path.write_text(CONFIG)
    plan = extract_plan(path)
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-3B-Instruct"
    assert plan.lora is not None and plan.lora.r.value == 16
    assert plan.max_seq_length.value == 4096
    assert plan.parse_error is not None and "kept the 6 line(s) above it" in plan.parse_error

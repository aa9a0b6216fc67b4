"""The sequence a GRPO step sees is prompt + completion: lengths a launcher states outweigh the
script's GRPOConfig defaults."""

from __future__ import annotations

from pathlib import Path

from llmmem.extract import extract_plan

SCRIPT = """from transformers import HfArgumentParser
from trl import GRPOConfig, GRPOTrainer

args = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses()[0]
GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", args=args, reward_funcs=[]).train()
"""


def test_launcher_lengths_replace_the_scripts_grpo_defaults(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "grpo.py").write_text(SCRIPT)
    alone = extract_plan(tmp_path / "grpo.py")
    assert alone.max_seq_length.value == 512 + 256  # GRPOConfig's defaults
    launcher = tmp_path / "run.sh"
    launcher.write_text(
        "accelerate launch grpo.py --max_prompt_length 512 --max_completion_length 1024\n"
    )
    plan = extract_plan(launcher)
    assert plan.max_seq_length.value == 512 + 1024
    assert plan.max_seq_length.source.value == "explicit"


CUT = """from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

MAX_LENGTH = 1536
tokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-0.5B")


def process(example):
    prompt = tokenizer(example["prompt"], add_special_tokens=False)
    answer = tokenizer(example["answer"], add_special_tokens=False)
    input_ids = prompt["input_ids"] + answer["input_ids"] + [tokenizer.eos_token_id]
    if len(input_ids) > MAX_LENGTH:
        input_ids = input_ids[:MAX_LENGTH]
    return {"input_ids": input_ids, "preview": input_ids[:8]}


data = load_dataset("json", data_files="train.jsonl")["train"].map(process)
model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")
Trainer(model=model, args=TrainingArguments(output_dir="o"), train_dataset=data).train()
"""


def test_token_ids_cut_by_hand_are_the_sequence_length(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(CUT)
    plan = extract_plan(path)
    assert plan.max_seq_length.value == 1536
    assert plan.max_seq_length.range is not None and plan.max_seq_length.range.start_line == 3

"""A guard that gives up under a condition known only at run time (`if not
torch.cuda.is_available(): print(...); return`) does not end the reading: the rest of the
function is the run the file describes."""

from __future__ import annotations

from pathlib import Path

from llmmem.extract import extract_plan

SCRIPT = """import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments


def train():
    if not torch.cuda.is_available():
        print("a GPU is needed")
        return
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=6)
    Trainer(model=model, args=args).train()


if __name__ == "__main__":
    train()
"""


def test_a_guard_returning_nothing_is_not_the_run(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    plan = extract_plan(path)
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-0.5B"
    assert plan.per_device_train_batch_size.value == 6


def test_a_branch_returning_a_value_is_still_taken_first(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(
        SCRIPT.replace('        print("a GPU is needed")\n        return\n', "        batch = 2\n")
        .replace("per_device_train_batch_size=6", "per_device_train_batch_size=batch")
        .replace("    if not", "    batch = 6\n    if not")
    )
    plan = extract_plan(path)
    assert plan.per_device_train_batch_size.value == 2  # the first branch, as before


FLAGS = """import argparse
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B")
    parser.add_argument("--executor", default="local")
    parser.add_argument("--allow-local", action="store_true")
    args = parser.parse_args()
    if args.executor == "local" and not args.allow_local:
        raise SystemExit("pass --allow-local to run generated code here")
    model = AutoModelForCausalLM.from_pretrained(args.model)
    args = TrainingArguments(output_dir="o", per_device_train_batch_size=3)
    Trainer(model=model, args=args).train()


main()
"""


def test_an_exit_decided_by_command_line_defaults_does_not_end_the_reading(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(FLAGS)
    plan = extract_plan(path)
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-0.5B"
    assert plan.per_device_train_batch_size.value == 3

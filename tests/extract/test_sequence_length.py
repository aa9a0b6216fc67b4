"""The sequence a GRPO step sees is prompt + completion: lengths a launcher states outweigh the
script's GRPOConfig defaults."""

from __future__ import annotations

from pathlib import Path

from llmmem.extract import extract_plan

SCRIPT = '''from transformers import HfArgumentParser
from trl import GRPOConfig, GRPOTrainer

args = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses()[0]
GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", args=args, reward_funcs=[]).train()
'''


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

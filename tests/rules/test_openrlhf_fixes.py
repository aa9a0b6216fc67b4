"""Fixes on an OpenRLHF launch line are written as the trainer's own flags, in the spelling the
line already uses (the flat names up to OpenRLHF 0.10.1, the dotted ones from 0.10.2), and the
edited line, analysed again, comes out lower, at the total the fix's title states."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from llmmem.check import check_text
from llmmem.rules.finding import Fix
from llmmem.rules.text_edits import apply_edits
from llmmem.units import format_bytes

SHELL = Path(__file__).resolve().parents[1] / "fixtures" / "shell"
SFT = SHELL / "openrlhf_sft.sh"
GRPO = SHELL / "openrlhf_grpo_ray.sh"

CHECKPOINTING = "Enable gradient checkpointing"
HALVE = "Halve the micro-batch, double the accumulation"

# the flags train_sft declares that the fixture and the fixes use (OpenRLHF 0.10.1.post2's
# argparse: store_true switches, and flags taking one value)
SFT_SWITCHES = ("apply_chat_template", "gradient_checkpointing")
SFT_VALUES = {
    "pretrain": str,
    "dataset": str,
    "train_batch_size": int,
    "micro_train_batch_size": int,
    "max_len": int,
    "zero_stage": int,
    "param_dtype": str,
    "learning_rate": float,
}


def train_sft_arguments(text: str) -> argparse.Namespace:
    """The launch line's arguments as train_sft parses them; fails on a flag it would stop on."""
    parser = argparse.ArgumentParser(prog="train_sft", exit_on_error=False)
    for name in SFT_SWITCHES:
        parser.add_argument(f"--{name}", action="store_true")
    for name, kind in SFT_VALUES.items():
        parser.add_argument(f"--{name}", type=kind)
    joined = re.sub(r"\\\r?\n", " ", text)
    (line,) = [line for line in joined.splitlines() if "openrlhf.cli.train_sft" in line]
    words = shlex.split(line.split("openrlhf.cli.train_sft", 1)[1], comments=True)
    try:
        parsed, unknown = parser.parse_known_args(words)
    except (argparse.ArgumentError, SystemExit) as error:
        pytest.fail(f"train_sft stops on {words}: {error}")
    assert unknown == [], f"train_sft stops on unrecognized arguments {unknown}"
    return parsed


def fixes_of(path: Path, text: str, gpu: str) -> dict[str, Fix]:
    checked = check_text(path, text, gpu=gpu, hub=False)
    return {fix.title.split(" → ")[0]: fix for finding in checked.findings for fix in finding.fixes}


def fixed(path: Path, text: str, title: str, gpu: str) -> str:
    """The line after the fix titled `title`: its estimate read again is the title's, and
    lower than before."""
    before = check_text(path, text, gpu=gpu, hub=False).analysis.budget
    fixes = fixes_of(path, text, gpu)
    assert title in fixes, sorted(fixes)
    after_text = apply_edits(text, fixes[title].edits)
    after = check_text(path, after_text, gpu=gpu, hub=False).analysis.budget
    assert before is not None and after is not None
    assert f"→ {format_bytes(after.device_total_bytes)}" in fixes[title].title
    assert after.device_total_bytes < before.device_total_bytes
    return after_text


def test_checkpointing_is_the_bare_flat_switch() -> None:
    text = SFT.read_text(encoding="utf-8")
    train_sft_arguments(text)  # the fixture as written runs
    after = fixed(SFT, text, CHECKPOINTING, "RTX-4090")
    assert after == text.replace(
        "   --learning_rate 5e-6\n", "   --learning_rate 5e-6 \\\n   --gradient_checkpointing\n"
    )
    assert train_sft_arguments(after).gradient_checkpointing is True
    plan = check_text(SFT, after, gpu="RTX-4090", hub=False).analysis.plan
    assert plan.gradient_checkpointing.value is True


def test_halving_edits_the_micro_batch_and_keeps_the_global_batch() -> None:
    # OpenRLHF derives the accumulation from --train_batch_size: halving the micro-batch
    # doubles it with no second flag
    text = SFT.read_text(encoding="utf-8")
    after = fixed(SFT, text, HALVE, "RTX-4090")
    assert after == text.replace("--micro_train_batch_size 8 ", "--micro_train_batch_size 4 ")
    parsed = train_sft_arguments(after)
    assert (parsed.micro_train_batch_size, parsed.train_batch_size) == (4, 64)
    plan = check_text(SFT, after, gpu="RTX-4090", hub=False).analysis.plan
    assert plan.per_device_train_batch_size.value == 4
    assert plan.gradient_accumulation_steps.value == 16  # 64 / (4 × 1 GPU)


def test_dotted_lines_get_dotted_flags(tmp_path: Path) -> None:
    text = SFT.read_text(encoding="utf-8")
    for flat, dotted in (
        ("--pretrain ", "--model.model_name_or_path "),
        ("--train_batch_size ", "--train.batch_size "),
        ("--micro_train_batch_size ", "--train.micro_batch_size "),
        ("--max_len ", "--data.max_len "),
        ("--zero_stage ", "--ds.zero_stage "),
        ("--param_dtype ", "--ds.param_dtype "),
    ):
        text = text.replace(flat, dotted)
    path = tmp_path / "openrlhf_sft.sh"
    path.write_text(text, encoding="utf-8")
    after = fixed(path, text, CHECKPOINTING, "RTX-4090")
    assert after.endswith("   --learning_rate 5e-6 \\\n   --model.gradient_checkpointing_enable\n")
    after = fixed(path, text, HALVE, "RTX-4090")
    assert "--train.micro_batch_size 4 \\\n" in after


def test_the_ppo_trainer_checkpoints_its_actor(tmp_path: Path) -> None:
    # train_ppo_ray's switch is --actor.gradient_checkpointing_enable (0.10.2 on)
    text = GRPO.read_text(encoding="utf-8").replace(
        "   --actor.gradient_checkpointing_enable \\\n", ""
    )
    text = text.replace("--train.micro_batch_size 2 ", "--train.micro_batch_size 8 ")
    path = tmp_path / "openrlhf_grpo_ray.sh"
    path.write_text(text, encoding="utf-8")
    after = fixed(path, text, CHECKPOINTING, "H200")
    assert after.endswith("   --ds.packing_samples \\\n   --actor.gradient_checkpointing_enable\n")
    assert "--model.gradient_checkpointing_enable" not in after

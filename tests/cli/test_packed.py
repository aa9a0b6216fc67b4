"""Packed samples, from the flag and from the files that ask for them.

What a user sees: packing under SDPA costs a block-diagonal mask per layer (transformers
builds it from the restarting position ids, SDPA converts it to an additive mask in q's dtype
and keeps it for backward: torch 2.13, transformers 5.24) and K/V repeated to every query head
(with a mask transformers does not pass `enable_gqa`; measured on an H100 in
bench/gpu/2026-11-26-h100), packing under flash-attention costs nothing, and each framework's
spelling of packing reaches the estimate.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmmem.cli import main
from llmmem.extract import extract_plan
from llmmem.scenario import packing_of

QWEN_LAYERS = 24  # Qwen2.5-0.5B
QWEN_Q, QWEN_KV = 896, 128  # query width (14 heads × 64), K/V width (2 heads × 64)


def _repeated_heads(tokens: int) -> int:
    """K and V repeated from 2 heads to 14, in bf16, kept by SDPA in every layer."""
    return QWEN_LAYERS * 2 * 2 * tokens * (QWEN_Q - QWEN_KV)


QWEN_LORA = ("--model", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--batch", "4", "--seq", "4096")


def _peak(estimate_json: Callable[..., dict[str, Any]], *args: str) -> int:
    return int(estimate_json(*QWEN_LORA, *args)["allocated_peak_bytes"])


def test_a_flat_packed_batch_under_sdpa_keeps_a_mask_per_layer(
    estimate_json: Callable[..., dict[str, Any]],
) -> None:
    unpacked = _peak(estimate_json)
    flat = _peak(estimate_json, "--packed", "flat")
    tokens = 4 * 4096
    # bf16 additive mask of tokens² per layer, and the boolean one once
    mask = QWEN_LAYERS * tokens * tokens * 2 + tokens * tokens
    assert flat - unpacked == pytest.approx(mask + _repeated_heads(tokens), rel=0.03)


def test_rows_of_packed_samples_keep_a_mask_per_row(
    estimate_json: Callable[..., dict[str, Any]],
) -> None:
    unpacked = _peak(estimate_json)
    rows = _peak(estimate_json, "--packed", "rows")
    mask = QWEN_LAYERS * 4 * 4096 * 4096 * 2 + 4 * 4096 * 4096
    assert rows - unpacked == pytest.approx(mask + _repeated_heads(4 * 4096), rel=0.03)


def test_flash_attention_packs_for_free(estimate_json: Callable[..., dict[str, Any]]) -> None:
    flash = ("--attn", "flash_attention_2")
    assert _peak(estimate_json, *flash, "--packed", "flat") == _peak(estimate_json, *flash)


def test_the_text_report_says_how_attention_sees_the_batch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "estimate",
            "--offline",
            "--model",
            "Qwen/Qwen2.5-0.5B",
            "--batch",
            "2",
            "--seq",
            "1024",
            "--packed",
            "flat",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "flat, 1 × 2048, masked" in out


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "train.py",
            "from trl import SFTConfig, SFTTrainer\n"
            "args = SFTConfig(output_dir='o', per_device_train_batch_size=4, max_length=2048,"
            " packing=True)\n"
            "SFTTrainer(model='Qwen/Qwen2.5-0.5B', args=args, train_dataset=None)\n",
            "flat",
        ),
        (
            "wrapped.py",
            "from trl import SFTConfig, SFTTrainer\n"
            "args = SFTConfig(output_dir='o', max_length=2048, packing=True,"
            " packing_strategy='wrapped')\n"
            "SFTTrainer(model='Qwen/Qwen2.5-0.5B', args=args, train_dataset=None)\n",
            None,
        ),
        (
            "free.py",
            "from trl import SFTConfig, SFTTrainer\n"
            "args = SFTConfig(output_dir='o', max_length=2048, padding_free=True)\n"
            "SFTTrainer(model='Qwen/Qwen2.5-0.5B', args=args, train_dataset=None)\n",
            "flat",
        ),
        (
            "axolotl.yml",
            "base_model: Qwen/Qwen2.5-0.5B\nsample_packing: true\nsequence_len: 2048\n"
            "micro_batch_size: 2\n",
            "rows",
        ),
        (
            "lf.yaml",
            "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\n"
            "packing: true\nneat_packing: true\ncutoff_len: 2048\n",
            "rows",
        ),
        (
            "lf_plain.yaml",
            "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\n"
            "packing: true\ncutoff_len: 2048\n",
            None,
        ),
        (
            "sft.yaml",
            "model_name_or_path: Qwen/Qwen2.5-0.5B\ndataset_name: x\nmax_length: 2048\n"
            "packing: true\n",
            "flat",
        ),
    ],
)
def test_each_framework_spelling_of_packing(
    tmp_path: Path, name: str, text: str, expected: str | None
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    packing = packing_of(extract_plan(path))
    assert (packing.value if packing is not None else None) == expected

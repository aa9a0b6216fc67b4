"""torch.compile: the fused loss, the band's bracket, and a compiled step on the CPU that lands
inside it.

Inductor fuses the loss: the upcast, the log-softmax and the cross-entropy become reductions
over the 16-bit logits, so forward keeps the logits alone and backward their fp32 gradient
beside them (an H100 under torch 2.11: bench/gpu/2026-11-26-h100, held to it by
tests/budget/test_gpu_measurements.py). The blocks are counted as in eager mode and the band
reaches down to the compiled step under gradient checkpointing: AOTAutograd's partitioner
recomputes cheap ops in backward rather than save their outputs, so a compiled step saves no
more than eager and no less than the blocks' inputs. Measured for real (inductor on the CPU,
torch 2.13).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from compile_saved import measure  # noqa: E402


def test_a_compiled_step_saves_between_checkpointing_and_eager() -> None:
    got = measure("llama", 2, 128)
    assert got["checkpointed"] < got["compiled"] <= got["eager"]


def test_the_band_reaches_down_to_the_compiled_checkpointed_step(
    lora_8b_json: Callable[..., dict[str, Any]],
) -> None:
    eager = lora_8b_json()
    compiled = lora_8b_json("--compile")
    compiled_checkpointed = lora_8b_json("--grad-ckpt", "--compile")
    # the fused loss lowers the estimate; the blocks stay eager's
    assert compiled["device_total_bytes"] < eager["device_total_bytes"]
    low_ratio = eager["band_low_bytes"] / eager["device_total_bytes"]
    expected = compiled_checkpointed["device_total_bytes"] * low_ratio
    assert compiled["band_low_bytes"] == pytest.approx(expected, rel=0.001)
    assert "torch.compile" in compiled["band_basis"]


def test_the_fused_loss_keeps_the_logits_alone(
    lora_8b_json: Callable[..., dict[str, Any]],
) -> None:
    """Llama-3.1-8B LoRA at 4 × 4096 under checkpointing: the eager loss keeps
    the bf16 logits' fp32 copy and its log-softmax (4 + 4 B per logit) at the end of forward
    and 12 B per logit at the start of backward; compiled, 2 and 2 + 4 B. Backward's start is
    the peak either way: 12 − 6 = 6 B per logit less."""
    plain = lora_8b_json("--grad-ckpt")
    compiled = lora_8b_json("--grad-ckpt", "--compile")
    logits = 4 * 4096 * 128_256
    saved = plain["allocated_peak_bytes"] - compiled["allocated_peak_bytes"]
    assert saved == pytest.approx(6 * logits, rel=0.02)


def test_a_script_that_compiles_says_so(tmp_path: Path) -> None:
    from llmmem.extract import extract_plan
    from llmmem.models.architectures import spec_from_config
    from llmmem.models.spec import ModelSource
    from llmmem.scenario import setup_from_plan
    from llmmem.verify.grid import config_for

    script = tmp_path / "train.py"
    script.write_text(
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
        "args = TrainingArguments(output_dir='o', torch_compile=True)\n"
        "Trainer(model=model, args=args).train()\n",
        encoding="utf-8",
    )
    spec = spec_from_config(config_for("qwen2", "small"), model_id="q", source=ModelSource.LOCAL)
    assert setup_from_plan(extract_plan(script), spec).compile

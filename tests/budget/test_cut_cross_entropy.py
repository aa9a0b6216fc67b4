"""Cut Cross-Entropy (cut-cross-entropy 25.1.1, axolotl's CutCrossEntropyPlugin): no logit is
ever materialised; the loss keeps per-position and per-entry vectors, and backward writes the
hidden states' gradient. Read in its code (Triton: unmeasured here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from llmmem.budget.logits import logits_moments
from llmmem.budget.setup import LoraSetup, LossImpl, TrainingSetup
from llmmem.extract import extract_plan
from llmmem.models.resolve import resolve_model


def test_the_moments_hold_vectors_and_the_hidden_gradient_not_logits() -> None:
    spec = resolve_model("meta-llama/Llama-3.1-8B", hub=False)
    setup = TrainingSetup(
        method="lora",
        batch=4,
        seq=2048,
        loss=LossImpl.CCE,
        lora=LoraSetup(r=16, alpha=32, targets=["q_proj", "v_proj"]),
    )
    n, vocab, hidden = 4 * 2048, 128_256, 4096
    moments = logits_moments(spec, setup)
    # log-sum-exp and the losses (fp32), the positions that count (int64), the mean logits
    assert moments.forward_end == 4 * n + 4 * n + 8 * n + 4 * vocab
    # backward: the kept vectors, the vocabulary's order (int32) and the bf16 hidden gradient
    assert moments.backward_start == 4 * n + 8 * n + 4 * vocab + 4 * vocab + 2 * n * hidden
    standard = logits_moments(spec, TrainingSetup(method="lora", batch=4, seq=2048))
    assert standard.backward_start > 100 * moments.backward_start


def test_axolotl_cut_cross_entropy_is_read_as_cce_and_estimate_agrees(tmp_path: Path) -> None:
    config = tmp_path / "axolotl.yml"
    config.write_text(
        "base_model: meta-llama/Llama-3.1-8B\n"
        "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"
        "cut_cross_entropy: true\n"
        "adapter: lora\nlora_r: 16\nlora_alpha: 32\nlora_target_linear: true\n"
        "sequence_len: 2048\nmicro_batch_size: 4\ngradient_accumulation_steps: 1\n"
        "gradient_checkpointing: true\nbf16: true\n"
    )
    plan = extract_plan(config)
    assert plan.loss is not None and plan.loss.value == "cce"

    def run(*args: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "llmmem", *args, "--format", "json"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode in (0, 1), done.stderr
        out: dict[str, Any] = json.loads(done.stdout)
        return out

    explained = run("explain", str(config))["budget"]
    # at the end of forward: 4 + 4 + 8 B a position and 4 B a vocabulary entry, no logits
    n, vocab = 4 * 2048, 128_256
    assert explained["phases"]["forward"]["components"]["logits"] == 16 * n + 4 * vocab
    estimated = run(
        "estimate", "--offline", "--model", "meta-llama/Llama-3.1-8B", "--method", "lora",
        "--lora-r", "16", "--lora-alpha", "32", "--lora-targets", "all-linear",
        "--batch", "4", "--seq", "2048", "--grad-ckpt", "--precision", "bf16-autocast",
        "--loss", "cce", "--framework", "axolotl",
    )  # fmt: skip
    assert estimated["allocated_peak_bytes"] == explained["allocated_peak_bytes"]

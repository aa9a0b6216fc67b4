"""unsloth's loss by release, as its released wheels compute it (models/llama.py's
`CausalLM_fast_forward`; 2024.1 at commit 2f55935f): the whole logits through its own kernel up
to 2024.11.7, Cut Cross-Entropy from 2024.11.8 where it loads (torch 2.4+; the whole logits
again for 1,024 positions or fewer from 2024.12.5), its chunked loss from 2025.8.5 (the whole
logits still for 1,024 positions or fewer) and whatever the positions from 2025.10.10."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llmmem.budget.setup import (
    Framework,
    LoraSetup,
    Method,
    Precision,
    QuantSetup,
    QuantType,
    TrainingSetup,
)
from llmmem.budget.stacks.unsloth import UNSLOTH_STACK, loss_of_release
from llmmem.models.resolve import resolve_model

TINYLLAMA = resolve_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0", hub=False)  # V = 32,000
LLAMA_3 = resolve_model("meta-llama/Llama-3.2-1B", hub=False)  # V = 128,256


def setup_for(
    release: str | None, batch: int = 2, seq: int = 4096, torch: str = "2.13"
) -> TrainingSetup:
    return TrainingSetup(
        method=Method.QLORA,
        batch=batch,
        seq=seq,
        precision=Precision.FP16_TRUE,
        lora=LoraSetup(r=16, alpha=16, targets=["q_proj", "v_proj"]),
        quant=QuantSetup(quant_type=QuantType.NF4, prepare_for_kbit_training=False),
        framework=Framework.UNSLOTH,
        torch_version=torch,
        unsloth_version=release,
    )


@pytest.mark.parametrize(
    ("release", "batch", "seq", "torch", "loss"),
    [
        ("2024.1", 2, 4096, "2.1", "logits"),
        ("2024.11.7", 2, 4096, "2.5", "logits"),
        ("2024.11.8", 2, 4096, "2.5", "cce"),
        ("2024.11.8", 2, 4096, "2.3", "logits"),  # Cut Cross-Entropy needs torch 2.4
        ("2024.11.8", 1, 1024, "2.5", "cce"),  # no small-batch switch yet
        ("2024.12.5", 1, 1024, "2.5", "logits"),
        ("2025.3.19", 1, 2048, "2.6", "cce"),
        ("2025.8.5", 2, 4096, "2.7", "fused"),
        ("2025.8.5", 1, 512, "2.7", "logits"),
        ("2025.10.10", 1, 512, "2.8", "fused"),
        ("2026.10.9", 2, 4096, "2.9", "fused"),
        (None, 1, 512, "2.13", "fused"),  # not known: the release the stack was read in
    ],
)
def test_each_release_computes_its_own_loss(
    release: str | None, batch: int, seq: int, torch: str, loss: str
) -> None:
    assert loss_of_release(TINYLLAMA, setup_for(release, batch, seq, torch)) == loss


def test_before_2024_2_a_large_vocabulary_went_to_torchs_cross_entropy() -> None:
    """2024.1's kernel took at most 65,536 entries (kernels/cross_entropy_loss.py:163-173):
    Llama 3's 128,256 went through `logits.float()` and torch's cross-entropy."""
    assert loss_of_release(LLAMA_3, setup_for("2024.1")) == "torch"
    assert loss_of_release(LLAMA_3, setup_for("2024.3")) == "logits"


def test_the_kernel_over_the_whole_logits_keeps_them_in_fp16_and_no_fp32_copy() -> None:
    setup = setup_for("2024.1")
    moments = UNSLOTH_STACK.loss(TINYLLAMA, setup)
    assert moments is not None
    n, vocab = 2 * 4096, TINYLLAMA.vocab_size
    # the fp16 logits, an fp32 log-sum-exp a position, int64 labels and the fp32 losses
    assert moments.moments.forward_end == 2 * n * vocab + (4 + 8 + 4) * n
    # backward writes the gradient into the logits: nothing of their size is added
    assert moments.moments.head_backward == 2 * n * vocab
    chunked = UNSLOTH_STACK.loss(TINYLLAMA, replace(setup, unsloth_version="2026.10.9"))
    assert chunked is not None and chunked.moments.head_backward < n * vocab


def test_estimate_takes_the_release_and_says_it() -> None:
    flags = [
        sys.executable, "-m", "llmmem", "estimate", "--offline", "--format", "json",
        "--model", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "--framework", "unsloth",
        "--method", "qlora", "--batch", "2", "--seq", "4096", "--gpu", "T4",
    ]  # fmt: skip
    old = json.loads(
        subprocess.run(
            [*flags, "--versions", "unsloth=2024.1"], capture_output=True, text=True, check=True
        ).stdout
    )
    new = json.loads(subprocess.run(flags, capture_output=True, text=True, check=True).stdout)
    assert old["setup"]["values"]["unsloth_version"] == "2024.1"
    assert any(note.startswith("unsloth 2024.1's stack") for note in old["notes"])
    assert any("release not found" in note for note in new["notes"])
    assert old["allocated_peak_bytes"] != new["allocated_peak_bytes"]
    refused = subprocess.run([*flags, "--versions", "unsloth=24.1"], capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "unsloth=YYYY.M[.P]" in refused.stderr


def test_a_script_beside_its_requirements_is_sized_with_their_unsloth(tmp_path: Path) -> None:
    """The release comes from the file's requirements as the other libraries' do: a script
    beside `unsloth==2024.11.7` gets that release's loss over the whole logits."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "requirements.txt").write_text("unsloth==2024.11.7\ntorch==2.5.1\n")
    script = tmp_path / "train.py"
    script.write_text(
        "from unsloth import FastLanguageModel\n"
        "from trl import SFTConfig, SFTTrainer\n"
        "model, tokenizer = FastLanguageModel.from_pretrained(\n"
        '    "unsloth/Llama-3.2-1B-bnb-4bit", max_seq_length=2048, load_in_4bit=True)\n'
        "model = FastLanguageModel.get_peft_model(model, r=16)\n"
        "args = SFTConfig(output_dir='out', per_device_train_batch_size=2, max_length=2048)\n"
        "SFTTrainer(model=model, args=args).train()\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", str(script), "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    report = json.loads(done.stdout)
    assert report["versions"]["unsloth"]["version"] == "2024.11.7"
    notes = report["budget"]["notes"]
    assert any(
        note.startswith("unsloth 2024.11.7's stack") and "over the whole logits" in note
        for note in notes
    )

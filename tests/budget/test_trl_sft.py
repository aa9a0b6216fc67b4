"""TRL's SFTTrainer, release by release (llmmem.budget.stacks.trl): its own metrics on the full
logits from 0.15 to 1.14, its fused LM head from 1.15.

The release's own step is measured where it runs here: TRL 1.16.0 (the tests' pin) trains a
tiny Llama on this CPU through `bench/trl_step.py`, as `bench/trl_trainers.py --objective sft`
runs it, and each phase is compared with the budget. The other releases' rules are worked out
by hand from their code (the bench runs TRL 0.29.1's SFTTrainer in its own environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Component
from llmmem.budget.setup import (
    Framework,
    LoraSetup,
    LossImpl,
    Method,
    Packing,
    Precision,
    TrainingSetup,
)
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource

REPO = Path(__file__).resolve().parents[2]
MiB = 2**20

TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}
# Llama-3.1-8B's shapes: a 128,256-token vocabulary over a width of 4096
LLAMA_8B = {
    **TINY,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}


def _spec(config: dict[str, Any]) -> Any:
    return spec_from_config(config, model_id="llama", source=ModelSource.CONFIG)


def _setup(method: str, rows: int, seq: int, precision: str, ckpt: bool, **more: Any) -> Any:
    return TrainingSetup(
        method=Method(method),
        batch=rows,
        seq=seq,
        precision=Precision(precision),
        optim="adamw_torch",
        grad_ckpt=ckpt,
        lora=LoraSetup(r=8, alpha=16, targets=["q_proj", "v_proj"]) if method == "lora" else None,
        **more,
    )


def _phases(spec: Any, setup: Any) -> dict[str, Any]:
    return {p.phase.value: p for p in estimate_budget(spec, setup).phases}


# -- TRL 1.16's own SFTTrainer on this CPU ----------------------------------------------------


def _trl_step(method: str, bf16: bool, ckpt: bool) -> dict[str, Any]:
    """bench/trl_step.py's SFT case in a process of its own: TRL's SFTTrainer, two steps of
    4 rows × 60 tokens, the second measured phase by phase under llmmem's storage tracker."""
    payload = {
        "objective": "sft",
        "method": method,
        "batch": 4,
        "seq": 60,
        "config": TINY,
        "grad_ckpt": ckpt,
        "bf16": bf16,
    }
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "analyzer"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "trl_step.py"), json.dumps(payload)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("method", "bf16", "ckpt"),
    [("full", False, False), ("lora", True, True)],
    ids=["full-fp32", "lora-bf16-checkpointing"],
)
def test_trl_1_16_sft_trainer_reads_as_its_release_is_sized(
    method: str, bf16: bool, ckpt: bool
) -> None:
    """The brief's step (LoRA, bf16 mixed precision, checkpointing, 4 × 60 on a vocabulary of
    1000) peaked at 24 MiB under TRL 1.16 where the HF Trainer's step is 5.5 MiB: the fused
    head's (236, 32768) tile buffer is wider than the vocabulary. Sized as TRL 1.16's
    SFTTrainer on a device without Triton, every phase reads within 2%."""
    import trl

    release = ".".join(trl.__version__.split(".")[:2])
    assert release == "1.16"
    measured = _trl_step(method, bf16, ckpt)
    assert "_backward_tile" in measured["step where"]  # TRL's own fold, in torch
    precision = "bf16" if bf16 else "fp32"
    setup = _setup(method, 4, 60, precision, ckpt)
    spec = _spec(TINY)
    trl_setup = replace(setup, framework=Framework.TRL, trl_version=release, triton=False)
    budget = _phases(spec, trl_setup)
    for phase, key in (
        ("forward", "forward"),
        ("backward", "backward"),
        ("optimizer_step", "optimizer"),
    ):
        assert budget[phase].allocated_bytes == pytest.approx(measured[key], rel=0.02), phase
    # the HF Trainer's step (the budget for TRL's SFTTrainer before its own stack) is under a
    # third of it
    assert _phases(spec, setup)["backward"].allocated_bytes < measured["backward"] / 3


# -- the release decides ----------------------------------------------------------------------


def _llama_8b_lora(**more: Any) -> tuple[Any, Any]:
    setup = _setup("lora", 2, 2048, "bf16-autocast", True, **more)
    return _spec(LLAMA_8B), setup


def test_without_a_release_or_before_0_15_it_is_the_hf_trainers_step() -> None:
    spec, setup = _llama_8b_lora()
    hf = estimate_budget(spec, setup)
    for version in (None, "0.13", "0.14"):
        trl = estimate_budget(spec, replace(setup, framework=Framework.TRL, trl_version=version))
        assert [p.allocated_bytes for p in trl.phases] == [p.allocated_bytes for p in hf.phases]
    # and a release known to a plain HF Trainer's script changes nothing: only SFTTrainer's
    with_trl = estimate_budget(spec, replace(setup, trl_version="1.16"))
    assert with_trl.allocated_peak_bytes == hf.allocated_peak_bytes


def test_0_29_takes_its_metrics_beside_what_the_loss_keeps() -> None:
    """TRL 0.29.1 `compute_loss`: after the loss, `entropy_from_logits` over the returned fp32
    logits 128 positions at a time, then the accuracy's shifted contiguous copy and its argmax,
    beside the loss's fp32 log-softmax (bf16 autocast: the returned logits are fp32)."""
    spec, setup = _llama_8b_lora(framework=Framework.TRL, trl_version="0.29")
    forward = _phases(spec, setup)["forward"]
    assert forward.moment == "after forward: the trainer's metrics on the outputs"
    v, n, shifted = 128256, 2 * 2048, 2 * 2047
    entropy = 3 * 4 * 128 * v
    accuracy = 4 * shifted * v + 8 * shifted
    assert accuracy > entropy
    logits = forward.components[Component.LOGITS]
    assert logits.bytes == (4 + 4) * n * v + accuracy
    assert "SFTTrainer's metrics" in logits.formula


def test_each_release_holds_its_own_metrics() -> None:
    """0.21: the accuracy's copy only; 0.22: the entropy of one sequence at a time (3 × 2048 ×
    V, more than the copy); 1.3-1.5: a second copy made while the first is bound; 1.6-1.14:
    the entropy's flattened copy and one 128-position chunk."""
    v, n, shifted = 128256, 2 * 2048, 2 * 2047
    kept = (4 + 4) * n * v
    copy = 4 * shifted * v
    expected = {
        "0.21": copy + 8 * shifted,
        "0.22": 3 * 4 * 2048 * v,
        "1.3": 2 * copy + 8 * shifted,
        "1.6": copy + 3 * 4 * 128 * v,
        "1.14": copy + 3 * 4 * 128 * v,
    }
    for version, extra in expected.items():
        spec, setup = _llama_8b_lora(framework=Framework.TRL, trl_version=version)
        logits = _phases(spec, setup)["forward"].components[Component.LOGITS]
        assert logits.bytes == kept + extra, version


def test_from_1_15_no_logits_are_held_and_the_step_is_gibibytes_lower() -> None:
    """Llama-3.1-8B LoRA, 2 × 2048, bf16 weights under bf16 autocast: 1.14's metrics moment
    holds 8 B × N·V of returned logits and log-softmax and a 4 B × N'·V copy; 1.15's fused
    head a 4096 × 32768 bf16 tile."""
    spec, setup = _llama_8b_lora(framework=Framework.TRL, trl_version="1.14")
    at_114 = estimate_budget(spec, setup)
    at_115 = estimate_budget(spec, replace(setup, trl_version="1.15"))
    assert at_114.allocated_peak_bytes - at_115.allocated_peak_bytes > 4.5 * 2**30
    assert "after forward: the trainer's metrics on the outputs" not in {
        p.moment for p in at_115.phases
    }
    assert any("from TRL's fused LM head" in note for note in at_115.notes)


def test_the_fused_heads_backward_by_hand() -> None:
    """Without checkpointing the head's backward is the step's backward peak. On a GPU its
    bytes, by hand: the bf16 copy of the 4094 scored positions (the residual stream's dtype),
    the int64 targets, fp32 log_z and entropy, the label mask and its negation, the fp32
    gradient of the hidden states and its bf16 cast, the bf16 4094 × 32768 tile buffer, the
    incoming fp32 gradient; no cast of a chunk (bf16 weights), no weight gradient (LoRA)."""
    spec, setup = _llama_8b_lora(framework=Framework.TRL, trl_version="1.15")
    backward = _phases(spec, replace(setup, grad_ckpt=False))["backward"]
    assert backward.moment == "start of backward: TRL's fused LM head, tile by tile"
    p, h = 2 * 2047, 4096
    saved = 2 * p * h + (8 + 4 + 4 + 2) * p
    head = saved + 4 * p * h + 2 * p * h + 2 * 4094 * 32768 + 4 * p
    assert backward.components[Component.LOGITS].bytes == head


def test_without_triton_every_position_goes_through_the_head_and_the_fold_is_in_torch() -> None:
    """On the CPU TRL scores every position and folds the tiles with torch ops: 29 fp32
    bytes per tile element beside the buffer in backward (E = 236 × 1000 here)."""
    spec = _spec(TINY)
    setup = _setup("lora", 4, 60, "fp32", False, framework=Framework.TRL, trl_version="1.16")
    gpu = _phases(spec, setup)["backward"].components[Component.LOGITS].bytes
    cpu = _phases(spec, replace(setup, triton=False))["backward"].components[Component.LOGITS]
    assert cpu.bytes - gpu == 29 * 236 * 1000
    assert "no Triton" in cpu.formula


def test_a_flat_packed_batch_is_one_row_through_the_head() -> None:
    """Padding-free (packing's default "bfd" strategy): the batch is one row of 8 × 512
    tokens, 4095 positions scored, one tile of 4095 rows."""
    spec = _spec(LLAMA_8B)
    setup = _setup("lora", 8, 512, "bf16-true", False, framework=Framework.TRL, trl_version="1.16")
    flat = _phases(spec, replace(setup, packing=Packing.FLAT))["backward"]
    rows = _phases(spec, setup)["backward"]
    p_flat, p_rows, h = 4095, 8 * 511, 4096
    per_position = 2 * h + 18 + 4 * h + 2 * h + 4  # the copy, small ones, fp32 grad, returned
    difference = (p_flat - p_rows) * per_position + 2 * (p_flat - p_rows) * 32768
    logits = Component.LOGITS
    assert flat.components[logits].bytes - rows.components[logits].bytes == difference


def test_liger_from_1_15_is_the_fused_head() -> None:
    """`use_liger_kernel` at 1.15 on keeps Liger's layer kernels only (TRL turns its fused
    linear cross-entropy off): the loss is the fused head's all the same; at 0.29 it is
    Liger's, without TRL's metrics (no logits to take them from)."""
    spec, setup = _llama_8b_lora(framework=Framework.TRL, trl_version="1.16")
    standard = estimate_budget(spec, setup).allocated_peak_bytes
    liger = estimate_budget(spec, replace(setup, loss=LossImpl.LIGER))
    assert liger.allocated_peak_bytes == standard
    assert any("use_liger_kernel" in note for note in liger.notes)
    at_029 = replace(setup, trl_version="0.29", loss=LossImpl.LIGER)
    hf = replace(at_029, framework=Framework.HF)
    assert estimate_budget(spec, at_029).allocated_peak_bytes == (
        estimate_budget(spec, hf).allocated_peak_bytes
    )


def test_the_kv_cache_is_not_built_from_0_22() -> None:
    """`compute_loss` passes `use_cache=False` from 0.22: a config's use_cache=True builds no
    unused cache in SFTTrainer's forward."""
    spec, setup = _llama_8b_lora(framework=Framework.TRL, use_cache=True)
    setup = replace(setup, grad_ckpt=False)
    at_021 = _phases(spec, replace(setup, trl_version="0.21"))["forward"]
    at_022 = _phases(spec, replace(setup, trl_version="0.22"))["forward"]
    assert "KV cache" in at_021.components[Component.TEMPORARIES].formula
    temporaries = at_022.components.get(Component.TEMPORARIES)
    assert temporaries is None or "KV cache" not in temporaries.formula

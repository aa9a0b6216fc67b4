"""The optimizer in backward (torchtune's `optimizer_in_bwd`): one optimizer per parameter,
stepped in the parameter's post-accumulate-grad hook, which frees the gradient there.

Measured on real CPU steps of a tiny Llama (torch's own hooks and AdamW, the way torchtune 0.6
registers them in `training/memory.py`), against the budget phase by phase."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Component, Phase
from llmmem.budget.setup import DistributedSetup, SetupError, TrainingSetup
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.compare import request_for
from llmmem.verify.grid import SMALL_CONFIGS
from llmmem.verify.runner import run_step

# weights, gradients and states dominate: a small vocabulary and wide blocks
CONFIG = {
    **SMALL_CONFIGS["llama"],
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "vocab_size": 512,
}
SPEC = spec_from_config(CONFIG, model_id="tiny-llama", source=ModelSource.CONFIG)


def _setup(**changes: object) -> TrainingSetup:
    fields: dict[str, object] = {
        "method": "full",
        "batch": 1,
        "seq": 32,
        "precision": "bf16-true",
        "optim": "adamw_torch",
    }
    fields.update(changes)
    return TrainingSetup(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("grad_ckpt", [False, True], ids=["no-ckpt", "ckpt"])
def test_each_phase_is_the_measured_cpu_step(grad_ckpt: bool) -> None:
    setup = _setup(optimizer_in_backward=True, grad_ckpt=grad_ckpt)
    budget = estimate_budget(SPEC, setup)
    measured = run_step(request_for(SPEC, setup, CONFIG, "cpu"))
    assert measured.error is None, measured.error
    for predicted in budget.phases:
        phase = measured.phase(predicted.phase.value)
        assert phase is not None
        assert predicted.allocated_bytes == pytest.approx(phase.peak_bytes, rel=0.05), (
            predicted.phase,
            predicted.moment,
        )


def test_the_step_no_longer_holds_every_gradient() -> None:
    usual = estimate_budget(SPEC, _setup())
    in_backward = estimate_budget(SPEC, _setup(optimizer_in_backward=True))
    measured_usual = run_step(request_for(SPEC, _setup(), CONFIG, "cpu"))
    measured_in_backward = run_step(
        request_for(SPEC, _setup(optimizer_in_backward=True), CONFIG, "cpu")
    )
    # the usual step's peak is the optimizer step (weights + gradients + states + buffers);
    # stepped in backward, the gradients never all exist: the peak drops by about them
    assert usual.peak_phase is Phase.OPTIMIZER_STEP
    gradients = usual.peak.components[Component.GRADIENTS].bytes
    saved = usual.allocated_peak_bytes - in_backward.allocated_peak_bytes
    assert saved >= gradients
    measured_saved = measured_usual.allocated_peak_bytes - measured_in_backward.allocated_peak_bytes
    assert saved == pytest.approx(measured_saved, rel=0.1)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"grad_accum": 4}, "cannot accumulate gradients"),
        ({"distributed": DistributedSetup(world_size=2)}, "one device"),
    ],
)
def test_what_it_cannot_do_is_said(changes: dict[str, object], words: str) -> None:
    with pytest.raises(SetupError, match=words):
        _setup(optimizer_in_backward=True, **changes)


def test_a_torchtune_config_with_optimizer_in_bwd_is_sized_so(tmp_path: Path) -> None:
    config = tmp_path / "full_single_device.yaml"
    text = (
        "model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\n"
        "checkpointer:\n  _component_: torchtune.training.FullModelHFCheckpointer\n"
        "  checkpoint_dir: /tmp/Meta-Llama-3.1-8B-Instruct/\n"
        "batch_size: 2\ndtype: bf16\nenable_activation_checkpointing: True\n"
        "optimizer:\n  _component_: bitsandbytes.optim.PagedAdamW8bit\n  lr: 2e-5\n"
        "optimizer_in_bwd: {}\n"
        "gradient_accumulation_steps: 1\n"
        "tokenizer:\n  _component_: torchtune.models.llama3.llama3_tokenizer\n  max_seq_len: 2048\n"
    )

    def explain(flag: str) -> str:
        config.write_text(text.format(flag))
        done = subprocess.run(
            [sys.executable, "-m", "llmmem", "explain", str(config), "--gpu", "A100-80GB"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode in (0, 1), done.stderr
        return done.stdout

    on, off = explain("True"), explain("False")
    assert "optimizer in backward" in on
    assert "optimizer in backward" not in off

    def total(report: str) -> float:
        return float(report.split(" GiB (")[0].split()[-1])

    # the step no longer holds 15 GiB of bf16 gradients; the peak moves to backward
    assert total(on) < total(off) - 5

"""SimPO as its paper trains it: TRL's CPO trainer with `cpo_alpha=0` (or `loss_type="alphapo"`),
whose `concatenated_forward` (trl/experimental/cpo/cpo_trainer.py at 0.29.1) skips the chosen
half's cross-entropy: the step holds the logits and the per-row log-softmax of their view, no
shifted copy of the chosen half. Checked against CPU steps written that way
(`llmmem.verify.preference_grid`, objective "simpo"), and from the scripts and configs that
ask for it down to the budget.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from llmmem.budget.preference import estimate_preference_budget  # noqa: E402
from llmmem.budget.preference_setup import Objective, PreferenceSetup  # noqa: E402
from llmmem.budget.result import Component, Phase  # noqa: E402
from llmmem.budget.setup import Method, Precision, TrainingSetup  # noqa: E402
from llmmem.models.architectures import spec_from_config  # noqa: E402
from llmmem.models.spec import ModelSource  # noqa: E402
from llmmem.verify.preference_grid import SMALL, Case, measure, predict  # noqa: E402

CASES = [
    Case("llama", "simpo", "full", True, "fp32"),
    # accelerate's fp32 conversion: the model's 16-bit logits alive beside the fp32 ones
    Case("llama", "simpo", "full", True, "bf16"),
    Case("qwen2", "simpo", "lora", False, "bf16-true", batch=1, seq=128),
    Case("qwen2", "simpo", "full", True, "bf16-true", mixed=False),
    Case("gemma2", "simpo", "lora", True, "bf16"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_phase_within_five_percent_of_a_cpu_step(case: Case) -> None:
    measured = measure(case)
    predicted = predict(case)
    for phase, got in measured.items():
        error = (predicted[phase] - got) / got
        assert abs(error) <= 0.05, f"{phase}: measured {got}, predicted {predicted[phase]}"


def _budget(alpha: float | None, precision: Precision = Precision.FP32):
    spec = spec_from_config(SMALL["llama"], model_id="small-llama", source=ModelSource.CONFIG)
    setup = TrainingSetup(method=Method.FULL, batch=2, seq=64, precision=precision, grad_ckpt=True)
    pref = PreferenceSetup(objective=Objective.CPO, cpo_alpha=alpha)
    return estimate_preference_budget(spec, setup, pref)


def test_without_the_nll_the_forward_holds_the_logits_and_one_rows_temporary() -> None:
    # 2 pairs: 4 rows × 64 tokens × 1000, fp32; one row's logsumexp temporary 63 × 1000
    whole, row = 4 * 64 * 1000, 63 * 1000
    forward = _budget(0.0).phase(Phase.FORWARD)
    assert forward.components[Component.LOGITS].bytes == 4 * whole + 4 * row
    backward = _budget(0.0).phase(Phase.BACKWARD)
    shifted = 4 * 63 * 1000
    assert backward.components[Component.LOGITS].bytes == 4 * whole + 12 * shifted


def test_under_mixed_precision_the_conversion_moment_is_the_forwards() -> None:
    # bf16 autocast: the model's bf16 logits (2 B) beside accelerate's fp32 copy (4 B)
    whole = 4 * 64 * 1000
    forward = _budget(0.0, Precision.BF16_AUTOCAST).phase(Phase.FORWARD)
    assert forward.components[Component.LOGITS].bytes == 6 * whole


def test_cpo_alpha_zero_reads_lower_than_trls_default_by_the_cross_entropy() -> None:
    cpo, simpo = _budget(None), _budget(0.0)
    assert simpo.allocated_peak_bytes < cpo.allocated_peak_bytes
    # the chosen half's shifted copy and its log_softmax: 8 B × 2 rows × 63 × 1000 in forward
    assert (
        cpo.phase(Phase.FORWARD).components[Component.LOGITS].bytes
        - simpo.phase(Phase.FORWARD).components[Component.LOGITS].bytes
        == 8 * 2 * 63 * 1000 - 4 * 63 * 1000
    )


SCRIPT = textwrap.dedent(
    """\
    from trl.experimental.cpo import CPOConfig, CPOTrainer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")
    tokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")
    args = CPOConfig(output_dir="out", {loss}, per_device_train_batch_size=2, max_length=1024)
    trainer = CPOTrainer(model=model, args=args, processing_class=tokenizer, train_dataset=None)
    trainer.train()
    """
)


@pytest.mark.parametrize(
    ("loss", "alpha"),
    [
        ('loss_type="simpo", cpo_alpha=0.0', 0.0),
        ('loss_type="alphapo"', 0.0),
        ('loss_type="simpo"', None),
    ],
)
def test_scripts_carry_cpo_alpha_to_the_budget(tmp_path: Path, loss: str, alpha) -> None:
    from llmmem.extract import extract_plan
    from llmmem.preference_plan import preference_setup

    path = tmp_path / "simpo.py"
    path.write_text(SCRIPT.format(loss=loss))
    pref = preference_setup(extract_plan(path))
    assert pref is not None and pref.objective is Objective.CPO
    assert pref.cpo_alpha == alpha


def test_axolotl_keeps_its_cpo_alpha(tmp_path: Path) -> None:
    from llmmem.extract import extract_plan
    from llmmem.preference_plan import preference_setup

    path = tmp_path / "simpo.yml"
    path.write_text(
        "base_model: Qwen/Qwen2.5-0.5B-Instruct\nrl: simpo\ncpo_alpha: 0\n"
        "datasets:\n  - path: argilla/ultrafeedback-binarized-preferences\n"
        "sequence_len: 1024\nmicro_batch_size: 2\nbf16: true\noutput_dir: out\n"
    )
    pref = preference_setup(extract_plan(path))
    assert pref is not None and pref.cpo_alpha == 0.0


def _estimate(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "llmmem",
            "estimate",
            "--model",
            "Qwen/Qwen2.5-0.5B-Instruct",
            "--batch",
            "2",
            "--seq",
            "1024",
            "--format",
            "json",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_the_cli_flag_lowers_the_estimate_and_refuses_nonsense() -> None:
    import json

    default = _estimate("--objective", "simpo")
    zero = _estimate("--objective", "simpo", "--cpo-alpha", "0")
    assert default.returncode == 0 and zero.returncode == 0, default.stderr + zero.stderr
    peak = lambda out: json.loads(out.stdout)["allocated_peak_bytes"]  # noqa: E731
    assert peak(zero) < peak(default)
    wrong = _estimate("--objective", "dpo", "--cpo-alpha", "0")
    assert wrong.returncode == 2 and "--cpo-alpha needs --objective cpo or simpo" in wrong.stderr
    assert "Traceback" not in wrong.stderr

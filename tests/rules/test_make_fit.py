"""'Make it fit': when no single fix brings the step under the GPU, one fix with the fewest
changes that together do (or a plain statement that nothing in reach does), and
`llmmem-lint --fix --fit` applying it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmmem.check import check_text
from llmmem.lint_command import lint_main
from llmmem.rules.text_edits import apply_edits
from llmmem.units import format_bytes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "full_finetune.py"


def effective_batch(path: Path, text: str) -> int:
    setup = check_text(path, text, gpu="A100-80GB", hub=False).analysis.setup
    assert setup is not None
    return setup.batch * setup.grad_accum


def test_a_full_fine_tune_on_an_a100_gets_one_fix_that_makes_it_fit() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    checked = check_text(EXAMPLE, text, gpu="A100-80GB", hub=False)
    (will_not_fit,) = [f for f in checked.findings if f.code == "LLM001"]
    combined = [fix for fix in will_not_fit.fixes if fix.title.startswith("Make it fit: ")]
    assert len(combined) == 1
    fix = combined[0]
    singles = [fix for fix in will_not_fit.fixes if not fix.title.startswith("Make it fit")]
    assert singles and not any(single.fits for single in singles)  # why it is offered
    assert fix.fits and not fix.safe  # several changes at once: applied on request only

    fixed = apply_edits(text, fix.edits)
    compile(fixed, str(EXAMPLE), "exec")
    after = check_text(EXAMPLE, fixed, gpu="A100-80GB", hub=False)
    assert after.analysis.budget is not None and after.analysis.budget.fits
    assert "LLM001" not in [f.code for f in after.findings]
    assert f"→ {format_bytes(after.analysis.budget.device_total_bytes)} (fits A100-80GB)" in (
        fix.title
    )
    # the micro-batch is traded for accumulation: the effective batch is the script's
    assert effective_batch(EXAMPLE, fixed) == effective_batch(EXAMPLE, text) == 16
    # each change named in the title is in the text
    if "gradient checkpointing" in fix.title:
        assert "gradient_checkpointing=True" in fixed
    batch = re.search(r"micro-batch (\d+) × accumulation (\d+)", fix.title)
    if batch:
        assert f"per_device_train_batch_size={batch.group(1)}," in fixed
        assert f"gradient_accumulation_steps={batch.group(2)}," in fixed


def test_when_nothing_in_reach_fits_the_finding_says_so_and_names_the_closest() -> None:
    # 7.6B parameters' bf16 weights alone (about 14 GiB), their gradients and any optimizer
    # states are more than a 24 GiB card holds without sharding or quantized weights
    text = EXAMPLE.read_text(encoding="utf-8")
    checked = check_text(EXAMPLE, text, gpu="RTX-4090", hub=False)
    (will_not_fit,) = [f for f in checked.findings if f.code == "LLM001"]
    assert not any(fix.fits for fix in will_not_fit.fixes)
    assert not any(fix.title.startswith("Make it fit") for fix in will_not_fit.fixes)
    assert "Nothing llmmem knows to change fits RTX-4090; the closest is " in will_not_fit.message
    closest = re.search(r"the closest is (.+), about ([\d.]+ GiB)", will_not_fit.message)
    assert closest is not None
    # no single fix comes as close as the combination named
    best_single = min(fix.predicted_device_bytes or 0 for fix in will_not_fit.fixes)
    assert float(closest.group(2).split()[0]) < best_single / 2**30


SIXTEEN_PER_STEP = """from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B", torch_dtype="bfloat16")
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=16,
    bf16=True,
    optim="adamw_torch",
)
"""


def test_lint_fix_fit_reaches_a_fit_that_one_fix_at_a_time_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # fixes taken one at a time apply only the safe ones, each of which must lower the
    # estimate (checkpointing, the paged 8-bit AdamW whose states live in unified memory, a
    # halved micro-batch) and stop short of a V100's 32 GB; the searched combination also
    # takes Liger's loss and fits
    plain, fit = tmp_path / "plain" / "train.py", tmp_path / "fit" / "train.py"
    for script in (plain, fit):
        script.parent.mkdir()
        script.write_text(SIXTEEN_PER_STEP, encoding="utf-8")
    lint_main([str(plain), "--gpu", "V100-32GB", "--fix"])
    lint_main([str(fit), "--gpu", "V100-32GB", "--fix", "--fit"])  # LLM002 may remain: exit 1
    capsys.readouterr()
    one_at_a_time = check_text(plain, plain.read_text(), gpu="V100-32GB", hub=False).analysis.budget
    assert one_at_a_time is not None and not one_at_a_time.fits

    fixed = fit.read_text(encoding="utf-8")
    compile(fixed, str(fit), "exec")
    checked = check_text(fit, fixed, gpu="V100-32GB", hub=False)
    assert "LLM001" not in [f.code for f in checked.findings]
    after = checked.analysis
    assert after.budget is not None and after.budget.fits
    assert after.setup is not None and after.setup.batch * after.setup.grad_accum == 16
    # --fit goes with --fix
    assert lint_main([str(fit), "--gpu", "V100-32GB", "--fit"]) == 2
    assert "--fit goes with --fix" in capsys.readouterr().err

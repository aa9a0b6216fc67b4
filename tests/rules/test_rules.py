"""Rules on plans built by hand: the findings a user would see and the edits they carry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmmem.check import check_text
from llmmem.plan import (
    DistributedPlan,
    LoraPlan,
    Provenance,
    QuantizationPlan,
    Sourced,
    SourceRange,
    TrainingPlan,
)
from llmmem.rules import run_rules
from llmmem.rules.catalog import all_rules
from llmmem.rules.docs import RULES_DOC, render_rules_doc
from llmmem.rules.text_edits import apply_edits
from llmmem.scenario import analyze

SCRIPT = """from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=8,
    bf16=True,
)
"""


def at(text: str, needle: str, after: str = "") -> SourceRange:
    """The range of the first occurrence of `needle` in `text` (after `after`)."""
    index = text.index(needle, text.index(after) + len(after) if after else 0)
    line = text.count("\n", 0, index)
    col = index - (text.rfind("\n", 0, index) + 1)
    end = index + len(needle)
    return SourceRange(
        start_line=line,
        start_col=col,
        end_line=text.count("\n", 0, end),
        end_col=end - (text.rfind("\n", 0, end) + 1),
    )


def src(
    value: Any, source: Provenance = Provenance.DEFAULT, range_: SourceRange | None = None
) -> Sourced[Any]:
    return Sourced[Any](value=value, source=source, range=range_)


def plan_for(text: str, **changes: Any) -> TrainingPlan:
    model = "meta-llama/Llama-3.1-8B" if "meta-llama" in text else "acme/secret-model"
    batch = text.split("per_device_train_batch_size=")[1].split(",")[0]
    fields: dict[str, Any] = dict(
        path="train.py",
        kind="python",
        model_id=src(model, Provenance.EXPLICIT, at(text, f'"{model}"')),
        per_device_train_batch_size=src(
            int(batch), Provenance.EXPLICIT, at(text, batch, after="per_device_train_batch_size=")
        ),
        gradient_accumulation_steps=src(1),
        max_seq_length=src(2048, Provenance.ASSUMED),
        gradient_checkpointing=src(False),
        precision=src("bf16", Provenance.EXPLICIT, at(text, "True", after="bf16=")),
        optim=src("adamw_torch_fused"),
        attn_implementation=src("sdpa"),
        distributed=DistributedPlan(
            world_size=src(1),
            zero_stage=src(0),
            offload_optimizer=src(False),
            offload_params=src(False),
            fsdp=src(None),
            deepspeed_config=src(None),
        ),
        trainer_range=at(
            text,
            'TrainingArguments(\n    output_dir="out",\n    '
            f"per_device_train_batch_size={batch},\n    bf16=True,\n)",
        ),
    )
    fields.update(changes)
    return TrainingPlan(**fields)


def codes(findings: list) -> list[str]:
    return [f.code for f in findings]


def test_full_fine_tune_of_8b_on_a_4090_will_not_fit() -> None:
    analysis = analyze(plan_for(SCRIPT), gpu="RTX-4090")
    findings = run_rules(analysis, SCRIPT)
    assert "LLM001" in codes(findings)
    oom = next(f for f in findings if f.code == "LLM001")
    assert oom.severity.value == "error"
    assert "RTX-4090" in oom.message and "GiB" in oom.message
    assert oom.range is not None and oom.range.start_line == 3  # the TrainingArguments call
    # it points at what drives the number
    assert any("per_device_train_batch_size" in r.message for r in oom.related)


def test_fix_edits_produce_valid_python_with_the_setting() -> None:
    analysis = analyze(plan_for(SCRIPT), gpu="A100-80GB")
    findings = run_rules(analysis, SCRIPT)
    fixes = [fix for f in findings for fix in f.fixes]
    ckpt = next(fix for fix in fixes if fix.title.startswith("Enable gradient checkpointing"))
    fixed = apply_edits(SCRIPT, ckpt.edits)
    compile(fixed, "train.py", "exec")
    assert "    gradient_checkpointing=True,\n)" in fixed
    assert ckpt.predicted_device_bytes is not None
    assert "GiB" in ckpt.title and "A100-80GB" in ckpt.title
    halve = next(fix for fix in fixes if fix.title.startswith("Halve the micro-batch"))
    halved = apply_edits(SCRIPT, halve.edits)
    assert "per_device_train_batch_size=4," in halved
    assert "gradient_accumulation_steps=2," in halved
    compile(halved, "train.py", "exec")


def test_the_fix_titles_predict_what_the_estimate_says_after_the_change() -> None:
    # the file as the reader sees it (a hand-built plan need not be what its text gives)
    before = check_text(Path("train.py"), SCRIPT, gpu="A100-80GB", hub=False)
    fix = next(
        fix
        for f in before.findings
        for fix in f.fixes
        if fix.title.startswith("Enable gradient checkpointing")
    )
    fixed = apply_edits(SCRIPT, fix.edits)
    assert "gradient_checkpointing=True" in fixed
    after = check_text(Path("train.py"), fixed, gpu="A100-80GB", hub=False).analysis.budget
    assert after is not None
    assert fix.predicted_device_bytes == after.device_total_bytes


def test_a_small_lora_run_on_an_h100_is_clean() -> None:
    text = SCRIPT.replace("8,", "1,")
    batch = at(text, "1", after="per_device_train_batch_size=")
    plan = plan_for(
        text,
        per_device_train_batch_size=src(1, Provenance.EXPLICIT, batch),
        lora=LoraPlan(
            r=src(16),
            alpha=src(32.0),
            target_modules=src(None),
            modules_to_save=src([]),
            dora=src(False),
            dropout=src(0.0),
        ),
    )
    findings = run_rules(analyze(plan, gpu="H100"), text)
    assert [f for f in findings if f.severity.value != "info"] == []


def test_bf16_on_a_t4() -> None:
    findings = run_rules(analyze(plan_for(SCRIPT), gpu="T4"), SCRIPT)
    bf16 = next(f for f in findings if f.code == "LLM006")
    assert bf16.severity.value == "error"
    fixed = apply_edits(SCRIPT, bf16.fixes[0].edits)
    assert "bf16=False" in fixed and "fp16=True" in fixed
    compile(fixed, "train.py", "exec")


def test_kbit_without_preparation() -> None:
    plan = plan_for(
        SCRIPT,
        lora=LoraPlan(
            r=src(16),
            alpha=src(32.0),
            target_modules=src(None),
            modules_to_save=src([]),
            dora=src(False),
            dropout=src(0.0),
        ),
        quantization=QuantizationPlan(
            bits=src(4),
            quant_type=src("nf4"),
            double_quant=src(True),
            compute_dtype=src("bfloat16"),
            prepare_for_kbit_training=src(False),
        ),
    )
    assert "LLM008" in codes(run_rules(analyze(plan, gpu="H100"), SCRIPT))


def test_unresolvable_model_asks_for_a_pragma() -> None:
    text = SCRIPT.replace("meta-llama/Llama-3.1-8B", "acme/secret-model")
    plan = plan_for(
        text,
        model_id=src("acme/secret-model", Provenance.EXPLICIT, at(text, '"acme/secret-model"')),
    )
    findings = run_rules(analyze(plan, gpu="H100"), text)
    assert codes(findings) == ["LLM010"]
    assert "# llmmem: model_config=" in findings[0].message


def test_every_rule_has_a_complete_doc() -> None:
    rules = all_rules()
    assert [r.code for r in rules] == [f"LLM{n:03d}" for n in range(1, len(rules) + 1)]
    for rule in rules:
        doc = rule.doc()
        for part in ("**What it does.**", "**Why.**", "**Example.**", "**Fix.**"):
            assert part in doc, (rule.code, part)


def test_rules_reference_is_current() -> None:
    assert RULES_DOC.read_text(encoding="utf-8") == render_rules_doc(), (
        "run `python -m llmmem.rules.docs`"
    )


@pytest.mark.parametrize("gpu", ["A100-80GB", "RTX-4090", "T4"])
def test_findings_have_ranges_inside_the_file(gpu: str) -> None:
    lines = SCRIPT.splitlines()
    for finding in run_rules(analyze(plan_for(SCRIPT), gpu=gpu), SCRIPT):
        assert finding.range is not None
        assert finding.range.start_line < len(lines)


AXOLOTL = """base_model: Qwen/Qwen2.5-0.5B
micro_batch_size: 2
sequence_len: 1024
adapter: lora
lora_r: 16
lora_alpha: 32
lora_target_linear: true
{precision}
"""


@pytest.mark.parametrize("precision", ["bf16: auto", "bf16: auto\nfp16: false", ""])
def test_axolotl_bf16_auto_on_a_t4_is_not_an_error(tmp_path: Path, precision: str) -> None:
    # axolotl resolves auto (and an unset bf16) on the GPU: fp16 (or fp32) on a T4
    text = AXOLOTL.format(precision=precision)
    path = tmp_path / "axolotl.yml"
    path.write_text(text, encoding="utf-8")
    codes = [finding.code for finding in check_text(path, text, gpu="T4", hub=False).findings]
    assert "LLM006" not in codes


def test_axolotl_bf16_true_on_a_t4_is_still_an_error(tmp_path: Path) -> None:
    text = AXOLOTL.format(precision="bf16: true")
    path = tmp_path / "axolotl.yml"
    path.write_text(text, encoding="utf-8")
    findings = check_text(path, text, gpu="T4", hub=False).findings
    assert [finding.severity.value for finding in findings if finding.code == "LLM006"] == ["error"]

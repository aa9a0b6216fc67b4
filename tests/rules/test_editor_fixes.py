"""The fixes and edits the editor offers: LoRA -> QLoRA, checkpointing in a plain loop,
suppression comments; each applied to real text and the result analysed again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from llmmem.check import check_text
from llmmem.plan import SourceRange
from llmmem.rules.edits import ensure_import, keyword_span, suppression_edit
from llmmem.rules.text_edits import apply_edits
from llmmem.units import format_bytes

LORA_SCRIPT = '''"""LoRA on Llama-3.1-8B."""
from __future__ import annotations

from peft import LoraConfig
from transformers import AutoModelForCausalLM, TrainingArguments
from trl import SFTTrainer

model = AutoModelForCausalLM.from_pretrained(
    "meta-llama/Llama-3.1-8B",
    dtype="bfloat16",
)
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=4,
    gradient_checkpointing=True,
    bf16=True,
)
peft_config = LoraConfig(r=16, target_modules="all-linear")
trainer = SFTTrainer(model=model, args=args, peft_config=peft_config)
'''

PLAIN_LOOP = """import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", dtype=torch.bfloat16)
model.cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
loader = DataLoader(dataset, batch_size=8)  # noqa: F821
for batch in loader:
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
"""


def fix_titled(findings: list, prefix: str):  # type: ignore[no-untyped-def]
    for finding in findings:
        for fix in finding.fixes:
            if fix.title.startswith(prefix):
                return fix
    raise AssertionError(f"no fix {prefix!r} in {[f.title for x in findings for f in x.fixes]}")


def test_switch_to_qlora_edits_the_script_and_delivers_the_promised_total(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    checked = check_text(path, LORA_SCRIPT, gpu="RTX-4090", hub=False)
    assert checked.analysis.setup is not None and checked.analysis.setup.method.value == "lora"
    fix = fix_titled(checked.findings, "Switch to QLoRA")
    assert not fix.safe  # changes the numerics: never applied by --fix on its own
    fixed = apply_edits(LORA_SCRIPT, fix.edits)
    ast.parse(fixed)  # still Python
    assert "from transformers import BitsAndBytesConfig" in fixed
    assert "from peft import prepare_model_for_kbit_training" in fixed
    assert fixed.index("from peft import prepare") > fixed.index("from __future__")
    assert "import torch\n" in fixed
    assert (
        'quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"'
        in (fixed)
    )
    assert "\nmodel = prepare_model_for_kbit_training(model)\nargs = TrainingArguments(" in fixed

    again = check_text(path, fixed, gpu="RTX-4090", hub=False)
    plan = again.analysis.plan
    assert plan.quantization is not None and plan.quantization.quant_type.value == "nf4"
    assert plan.quantization.prepare_for_kbit_training.value is True
    assert again.analysis.budget is not None
    assert format_bytes(again.analysis.budget.device_total_bytes) in fix.title


def test_checkpointing_in_a_plain_loop_is_enabled_on_the_model(tmp_path: Path) -> None:
    path = tmp_path / "loop.py"
    checked = check_text(path, PLAIN_LOOP, gpu="A100-80GB", hub=False)
    fix = fix_titled(checked.findings, "Enable gradient checkpointing")
    fixed = apply_edits(PLAIN_LOOP, fix.edits)
    assert "dtype=torch.bfloat16)\nmodel.gradient_checkpointing_enable()\nmodel.cuda()" in fixed
    again = check_text(path, fixed, gpu="A100-80GB", hub=False)
    assert again.analysis.setup is not None and again.analysis.setup.grad_ckpt
    assert again.analysis.budget is not None
    assert format_bytes(again.analysis.budget.device_total_bytes) in fix.title


def test_suppression_comment_is_added_or_extended() -> None:
    text = "args = TrainingArguments(\nx = 1  # llmmem: ignore[LLM002]\ny = 2  # llmmem: ignore\n"
    first = suppression_edit(text, 0, "LLM001", "python")
    assert first is not None
    assert apply_edits(text, [first]).splitlines()[0] == (
        "args = TrainingArguments(  # llmmem: ignore[LLM001]"
    )
    second = suppression_edit(text, 1, "LLM001", "python")
    assert second is not None
    assert apply_edits(text, [second]).splitlines()[1] == "x = 1  # llmmem: ignore[LLM002, LLM001]"
    assert suppression_edit(text, 1, "LLM002", "python") is None  # already silenced
    assert suppression_edit(text, 2, "LLM001", "python") is None  # a bare ignore covers it
    assert suppression_edit('{"a": 1}', 0, "LLM001", "json") is None  # JSON has no comments


def test_silenced_finding_is_gone_from_the_check(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    checked = check_text(path, PLAIN_LOOP, gpu="T4", hub=False)
    finding = next(f for f in checked.findings if f.code == "LLM001")
    assert finding.range is not None
    edit = suppression_edit(PLAIN_LOOP, finding.range.start_line, "LLM001", "python")
    assert edit is not None
    silenced = check_text(path, apply_edits(PLAIN_LOOP, [edit]), gpu="T4", hub=False)
    assert "LLM001" not in [f.code for f in silenced.findings]


def test_ensure_import_skips_what_is_there() -> None:
    text = "import torch\nfrom peft import LoraConfig, get_peft_model\n"
    assert ensure_import(text, "torch") is None
    assert ensure_import(text, "peft", "get_peft_model") is None
    added = ensure_import(text, "peft", "prepare_model_for_kbit_training")
    assert added is not None and added.range.start_line == 0
    assert ensure_import("import torch.nn\n", "torch") is not None  # torch.nn is not torch


def test_keyword_span_covers_the_keyword_before_a_value() -> None:
    text = "args = TrainingArguments(\n    per_device_train_batch_size=8,\n)\n"
    value = SourceRange(start_line=1, start_col=32, end_line=1, end_col=33)
    span = keyword_span(text, value)
    assert (span.start_col, span.end_col) == (4, 33)
    yaml_value = SourceRange(start_line=0, start_col=18, end_line=0, end_col=19)
    assert keyword_span("micro_batch_size: 2\n", yaml_value).start_col == 0
    lone = SourceRange(start_line=0, start_col=0, end_line=0, end_col=1)
    assert keyword_span("8\n", lone) == lone


def test_a_pragma_gpu_wins_over_the_editor_fallback(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    text = "# llmmem: gpu=H100\n" + PLAIN_LOOP
    checked = check_text(path, text, fallback_gpu="T4", hub=False)
    assert checked.analysis.gpu is not None and checked.analysis.gpu.name == "H100-80GB"
    flagged = check_text(path, text, gpu="T4", hub=False)  # a command-line flag wins over all
    assert flagged.analysis.gpu is not None and flagged.analysis.gpu.name == "T4"
    fallback = check_text(path, PLAIN_LOOP, fallback_gpu="T4", hub=False)
    assert fallback.analysis.gpu is not None and fallback.analysis.gpu.name == "T4"
    assert fallback.analysis.gpu_source == "setting"


NOTEBOOK_CELLS = [
    {"cell_type": "markdown", "source": "# Full fine-tune"},
    {
        "cell_type": "code",
        "source": "import torch\nfrom transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained(\n"
        "    'meta-llama/Llama-3.1-8B', dtype=torch.bfloat16\n)",
    },
    {
        "cell_type": "code",
        "source": "from transformers import TrainingArguments\nargs = TrainingArguments(\n"
        "    output_dir='out',\n    per_device_train_batch_size=8,\n    bf16=True,\n)",
    },
]


def test_notebook_fixes_edit_the_cells_and_lint_fix_writes_them_into_the_json(
    tmp_path: Path,
) -> None:
    import json

    from llmmem.lint_command import fix_file

    path = tmp_path / "finetune.ipynb"
    text = json.dumps({"cells": NOTEBOOK_CELLS, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    checked = check_text(path, text, gpu="A100-80GB", hub=False)
    fix = fix_titled(checked.findings, "Enable gradient checkpointing")
    (edit,) = fix.edits
    assert edit.range.path == f"{path}#cell=2"  # the trainer's cell, in its own lines
    cell = NOTEBOOK_CELLS[2]["source"].splitlines()
    assert cell[edit.range.start_line][: edit.range.start_col] == "    bf16=True,"
    with pytest.raises(ValueError, match="notebook cells"):
        apply_edits(text, fix.edits)
    fixed, _ = fix_file(path, text, gpu="A100-80GB", hub=False, select=None)
    cells = json.loads(fixed)["cells"]
    assert cells[:2] == NOTEBOOK_CELLS[:2]  # --fix writes the cell's fixes into the JSON
    assert "    gradient_checkpointing=True,\n" in cells[2]["source"]
    assert fixed.startswith(text[: text.index("    bf16=True")])  # the JSON before it as it was


FP32_SCRIPT = """from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B", dtype="float32")
args = TrainingArguments(output_dir="out", per_device_train_batch_size=8)
"""


def test_bf16_is_offered_only_where_the_gpu_has_it(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    on_a100 = check_text(path, FP32_SCRIPT, gpu="A100-80GB", hub=False)
    fix = fix_titled(on_a100.findings, "Train in bf16 mixed precision")
    fixed = apply_edits(FP32_SCRIPT, fix.edits)
    assert "per_device_train_batch_size=8, bf16=True)" in fixed
    again = check_text(path, fixed, gpu="A100-80GB", hub=False)
    assert again.analysis.setup is not None and again.analysis.setup.precision.value == "bf16"
    on_t4 = check_text(path, FP32_SCRIPT, gpu="T4", hub=False)
    titles = [f.title for finding in on_t4.findings for f in finding.fixes]
    assert titles and not any(t.startswith("Train in bf16") for t in titles)

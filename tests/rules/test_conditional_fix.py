"""A micro-batch (or accumulation) written as a conditional expression is halved (doubled) in
every branch by `llmmem-lint --fix`, or not at all: each branch's effective batch (micro-batch ×
accumulation) is what it was before the fix.

Editing only the branch the reader took used to halve `16 if BIG else 8`'s else branch and double
the accumulation both branches share: the BIG run's effective batch went from 32 to 128 and more.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LINT = str(Path(sys.executable).parent / "llmmem-lint")  # the installed command
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "python"

SCRIPT = """import os

from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

{switch}
{batch_variable}
model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B", torch_dtype="bfloat16")
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size={batch},
    gradient_accumulation_steps={accumulation},
    bf16=True,
    gradient_checkpointing=True,
    optim="adamw_bnb_8bit",
)
Trainer(model=model, args=args).train()
"""


def lint(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([LINT, *args], capture_output=True, text=True, timeout=120, env=ENV)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def effective_batches(text: str, switch: str) -> dict[bool, int]:
    """Micro-batch × accumulation of the TrainingArguments call, for the switch on and off
    (the file's other simple assignments, such as `bs = ...`, evaluated as Python would)."""
    tree = ast.parse(text)
    results = {}
    for on in (True, False):
        names: dict[str, object] = {}
        for statement in tree.body:
            if (
                isinstance(statement, ast.Assign)
                and isinstance(statement.targets[0], ast.Name)
                and not any(isinstance(node, ast.Call) for node in ast.walk(statement.value))
            ):
                names[statement.targets[0].id] = eval(ast.unparse(statement.value), {}, names)
            names[switch] = on
        call = next(
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "TrainingArguments"
        )
        values = {kw.arg: eval(ast.unparse(kw.value), {}, names) for kw in call.keywords}
        results[on] = values["per_device_train_batch_size"] * values["gradient_accumulation_steps"]
    return results


@pytest.mark.parametrize(
    ("switch", "batch_variable", "batch", "accumulation"),
    [
        ("BIG = False", "", "16 if BIG else 8", "2"),  # as reported: the else branch is read
        ("BIG = True", "", "16 if BIG else 8", "2"),
        ('BIG = os.environ.get("BIG") == "1"', "", "16 if BIG else 8", "2"),  # run-time choice
        ("BIG = False", "bs = 16 if BIG else 8", "bs", "2"),
        ("BIG = False", "", "8", "2 if BIG else 4"),
        ("BIG = False\nMID = True", "", "16 if BIG else (8 if MID else 4)", "2"),
    ],
)
def test_fix_keeps_each_branchs_effective_batch(
    tmp_path: Path, switch: str, batch_variable: str, batch: str, accumulation: str
) -> None:
    text = SCRIPT.format(
        switch=switch, batch_variable=batch_variable, batch=batch, accumulation=accumulation
    )
    script = tmp_path / "train.py"
    script.write_text(text)
    before = effective_batches(text, "BIG")

    lint(str(script), "--gpu", "RTX-3060", "--fix")
    after = script.read_text()
    assert after != text  # the micro-batch was halved
    assert effective_batches(after, "BIG") == before


def test_a_branch_that_cannot_be_halved_leaves_the_fix_out(tmp_path: Path) -> None:
    """`1 if SMALL_GPU else 4`: the 1 cannot be halved, so the fix is not offered (it used to
    write `1 if SMALL_GPU else 1` with the accumulation quadrupled for both)."""
    script = tmp_path / "conditional_expression.py"
    shutil.copy(FIXTURES / "conditional_expression.py", script)
    text = script.read_text()
    proc = lint(str(script), "--gpu", "RTX-4090", "--format", "json")
    titles = [fix["title"] for finding in json.loads(proc.stdout) for fix in finding["fixes"]]
    assert titles and not any(title.startswith("Halve the micro-batch") for title in titles)

    lint(str(script), "--gpu", "RTX-4090", "--fix")
    after = script.read_text()
    assert after != text  # other fixes are applied
    assert "    per_device_train_batch_size=1 if SMALL_GPU else 4,\n" in after
    assert 'gradient_accumulation_steps=int(os.environ.get("GRAD_ACCUM", 2)),' in after


@pytest.mark.parametrize(
    ("batch_variable", "batch"),
    [("", "16 if BIG else 8"), ("bs = 16 if BIG else 8", "bs"), ("", "16 if BIG else x")],
)
def test_the_text_writer_edits_the_branches_as_the_codemod_does(
    tmp_path: Path, batch_variable: str, batch: str
) -> None:
    """A lint that shows no fix (and a script too long for libcst) writes fixes with the text
    writer: it must offer the same halving, written the same way, or none where the codemod
    has none (`x` is no literal to halve)."""
    from llmmem.check import check_text
    from llmmem.rules.edits import preview_python_edits
    from llmmem.rules.text_edits import apply_edits

    text = SCRIPT.format(
        switch="BIG = False\nx = 8", batch_variable=batch_variable, batch=batch, accumulation="2"
    )
    path = tmp_path / "train.py"

    def halved(findings: list) -> set[str]:
        return {
            apply_edits(text, fix.edits)
            for finding in findings
            for fix in finding.fixes
            if fix.title.startswith("Halve the micro-batch")
        }

    written = halved(check_text(path, text, gpu="RTX-3060", hub=False).findings)
    with preview_python_edits():
        previewed = halved(check_text(path, text, gpu="RTX-3060", hub=False).findings)
    assert written == previewed
    assert len(written) == (0 if batch.endswith("x") else 1)
    for after in written:
        assert effective_batches(after, "BIG") == effective_batches(text, "BIG")


def test_a_notebook_cells_conditional_is_halved_in_every_branch(tmp_path: Path) -> None:
    notebook = tmp_path / "finetune.ipynb"
    document = json.loads((FIXTURES.parent / "notebooks" / "qlora_finetune.ipynb").read_text())
    source = document["cells"][6]["source"]
    assert source[2] == "    per_device_train_batch_size=4,\n"
    source[2] = "    per_device_train_batch_size=8 if BIG else 4,\n"
    document["cells"][6]["source"] = ["BIG = False\n", *source]
    notebook.write_text(json.dumps(document, indent=1))

    lint(str(notebook), "--gpu", "RTX-3060", "--fix")
    cell = "".join(json.loads(notebook.read_text())["cells"][6]["source"])
    assert "    per_device_train_batch_size=4 if BIG else 2,\n" in cell
    assert "    gradient_accumulation_steps=8,\n" in cell  # was 4: 8 × 4 and 4 × 4 kept

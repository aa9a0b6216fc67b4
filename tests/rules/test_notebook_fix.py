"""`llmmem-lint --fix` on a notebook applies the safe fixes it shows, in the cells' sources inside
the notebook's JSON, and leaves every other byte of the file as it was.

The fixes of a notebook are edits of its cells (what an editor applies cell by cell); `--format
json` shows them as safe, so `--fix` must write them (it used to leave the file unchanged
without a word).
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LINT = str(Path(sys.executable).parent / "llmmem-lint")  # the installed command
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
NOTEBOOKS = Path(__file__).resolve().parents[1] / "fixtures" / "notebooks"


def lint(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([LINT, *args], capture_output=True, text=True, timeout=120, env=ENV)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def safe_fixes(path: Path, gpu: str) -> list[str]:
    proc = lint(str(path), "--gpu", gpu, "--format", "json")
    return [
        fix["title"]
        for finding in json.loads(proc.stdout)
        for fix in finding["fixes"]
        if fix["safe"]
    ]


def changed_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    """The lines only `before` has, and those only `after` has."""
    old, new = [], []
    for line in difflib.ndiff(before.splitlines(), after.splitlines()):
        if line.startswith("- "):
            old.append(line[2:])
        elif line.startswith("+ "):
            new.append(line[2:])
    return old, new


def test_the_safe_fix_shown_for_a_notebook_is_what_fix_writes(tmp_path: Path) -> None:
    notebook = tmp_path / "qlora_finetune.ipynb"
    shutil.copy(NOTEBOOKS / "qlora_finetune.ipynb", notebook)
    before = notebook.read_bytes()
    shown = safe_fixes(notebook, "RTX-3060")
    assert any(title.startswith("Halve the micro-batch") for title in shown)

    proc = lint(str(notebook), "--gpu", "RTX-3060", "--fix")
    after = notebook.read_bytes()
    assert proc.returncode == 0, proc.stdout + proc.stderr  # it fits now
    assert changed_lines(before.decode(), after.decode()) == (
        [
            '    "    per_device_train_batch_size=4,\\n",',
            '    "    gradient_accumulation_steps=4,\\n",',
        ],
        [
            '    "    per_device_train_batch_size=2,\\n",',
            '    "    gradient_accumulation_steps=8,\\n",',
        ],
    )
    assert safe_fixes(notebook, "RTX-3060") == []  # nothing safe is left unapplied


def jupyter_notebook(cells: list[dict[str, object]]) -> str:
    """The notebook as Jupyter saves it: one-space indents, sources as lists of lines,
    non-ASCII characters as they are, a newline at the end."""
    for cell in cells:
        source = str(cell["source"])
        cell["source"] = source.splitlines(keepends=True)
        cell.setdefault("metadata", {})
        if cell["cell_type"] == "code":
            cell.setdefault("execution_count", None)
            cell.setdefault("outputs", [])
    document = {
        "cells": cells,
        "metadata": {"kernelspec": {"display_name": "Python 3", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


FULL_FINETUNE = [
    {"cell_type": "markdown", "source": "# Full fine-tune — 8 × A100 ✓"},
    {
        "cell_type": "code",
        "source": "import torch\nfrom transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained(\n"
        "    'meta-llama/Llama-3.1-8B', dtype=torch.bfloat16\n)",
        "outputs": [{"name": "stdout", "output_type": "stream", "text": ["loaded ✓\n"]}],
    },
    {
        "cell_type": "code",
        "source": "from transformers import TrainingArguments\n%env WANDB_MODE=offline\n"
        "args = TrainingArguments(\n"
        "    output_dir='out',  # checkpoints — every 500 steps\n"
        "    per_device_train_batch_size=8,\n    bf16=True,\n)",
    },
]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_keyword_added_in_a_cell_is_one_more_line_of_its_source(
    tmp_path: Path, newline: str
) -> None:
    notebook = tmp_path / "finetune.ipynb"
    text = jupyter_notebook([dict(cell) for cell in FULL_FINETUNE])
    notebook.write_bytes(text.replace("\n", newline).encode())
    assert "Enable gradient checkpointing" in " ".join(safe_fixes(notebook, "A100-80GB"))

    proc = lint(str(notebook), "--gpu", "A100-80GB", "--fix")
    assert proc.returncode in (0, 1), proc.stderr
    after = notebook.read_bytes().decode()
    assert after.count("\n") == after.count(newline)  # the file's own line ends
    old, new = changed_lines(text, after.replace(newline, "\n"))
    assert old == [] and new  # lines added to the cell's source, nothing else rewritten
    assert all(line.startswith('    "    ') and line.endswith('\\n",') for line in new)
    assert '    "    gradient_checkpointing=True,\\n",' in new
    cells = json.loads(after)["cells"]
    assert cells[0]["source"] == ["# Full fine-tune — 8 × A100 ✓"]
    assert cells[2]["source"][:4] == [
        "from transformers import TrainingArguments\n",
        "%env WANDB_MODE=offline\n",
        "args = TrainingArguments(\n",
        "    output_dir='out',  # checkpoints — every 500 steps\n",
    ]
    assert cells[2]["source"][-1] == ")"


def test_a_cell_with_its_own_line_ends_keeps_them(tmp_path: Path) -> None:
    """A cell written on Windows (CRLF inside the source strings, one line mixing in a LF)
    is fixed with each untouched line as it was."""
    notebook = tmp_path / "windows.ipynb"
    cells = [dict(cell) for cell in FULL_FINETUNE]
    source = str(cells[2]["source"]).replace("\n", "\r\n").replace("\r\n", "\n", 1)
    cells[2] = {**cells[2], "source": source}
    text = jupyter_notebook(cells)
    notebook.write_text(text)

    lint(str(notebook), "--gpu", "A100-80GB", "--fix")
    after = notebook.read_text()
    old, new = changed_lines(text, after)
    assert old == [] and '    "    gradient_checkpointing=True,\\r\\n",' in new
    lines = json.loads(after)["cells"][2]["source"]
    assert lines[:3] == [
        "from transformers import TrainingArguments\n",
        "%env WANDB_MODE=offline\r\n",
        "args = TrainingArguments(\r\n",
    ]

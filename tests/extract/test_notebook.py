"""Notebooks: code cells read as one script, IPython syntax taken out, every range in its cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmmem.extract.notebook import extract_notebook_plan, python_lines_of_cell
from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan

NOTEBOOKS = Path(__file__).resolve().parent.parent / "fixtures" / "notebooks"
QLORA = NOTEBOOKS / "qlora_finetune.ipynb"
EXPLICIT = Provenance.EXPLICIT


def setting(plan: TrainingPlan, key: str) -> Sourced[Any]:
    owner: Any = plan
    for part in key.split("."):
        owner = getattr(owner, part)
    assert isinstance(owner, Sourced), key
    return owner


def cell_text(notebook: dict[str, Any], located: SourceRange) -> str:
    """The text a `path#cell=N` range covers in that cell's source."""
    assert located.path is not None and "#cell=" in located.path
    index = int(located.path.rsplit("#cell=", 1)[1])
    source = notebook["cells"][index]["source"]
    lines = ("".join(source) if isinstance(source, list) else source).split("\n")
    assert located.start_line == located.end_line
    return lines[located.start_line][located.start_col : located.end_col]


def expect(
    plan: TrainingPlan,
    notebook: dict[str, Any],
    key: str,
    value: Any,
    text: str,
    *,
    cell: int,
    source: Provenance = EXPLICIT,
) -> None:
    found = setting(plan, key)
    assert found.value == value, f"{key}: {found.value!r} != {value!r}"
    assert found.source is source, key
    assert found.range is not None, key
    assert found.range.path == f"{plan.path}#cell={cell}", key
    assert cell_text(notebook, found.range) == text, key


def test_qlora_notebook() -> None:
    notebook = json.loads(QLORA.read_text(encoding="utf-8"))
    plan = extract_notebook_plan(QLORA)
    assert plan.kind == "notebook"
    expect(
        plan, notebook, "model_id", "meta-llama/Llama-3.2-3B", '"meta-llama/Llama-3.2-3B"', cell=3
    )
    expect(plan, notebook, "quantization.bits", 4, "True", cell=3)
    expect(plan, notebook, "quantization.quant_type", "nf4", '"nf4"', cell=3)
    expect(plan, notebook, "quantization.double_quant", True, "True", cell=3)
    expect(plan, notebook, "lora.r", 16, "16", cell=5)
    expect(plan, notebook, "lora.alpha", 32.0, "32", cell=5)
    expect(plan, notebook, "lora.target_modules", ["all-linear"], '"all-linear"', cell=5)
    expect(plan, notebook, "per_device_train_batch_size", 4, "4", cell=6)
    expect(plan, notebook, "gradient_accumulation_steps", 4, "4", cell=6)
    expect(plan, notebook, "max_seq_length", 1024, "1024", cell=6)
    expect(plan, notebook, "gradient_checkpointing", True, "True", cell=6)
    expect(plan, notebook, "optim", "paged_adamw_8bit", '"paged_adamw_8bit"', cell=6)
    # `!pip`, `%env`, `%%capture`, `%%bash`, `x = !cmd` and `%time` are all taken out cleanly
    assert plan.problems == []


def test_broken_json_is_a_problem() -> None:
    plan = extract_notebook_plan(NOTEBOOKS / "broken.ipynb")
    assert plan.kind == "notebook"
    assert any("not valid notebook JSON" in problem for problem in plan.problems)


def notebook_text(*sources: str, cell_type: str = "code") -> str:
    cells = [{"cell_type": cell_type, "metadata": {}, "source": source} for source in sources]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_a_cell_that_is_not_python_is_left_out_with_its_place() -> None:
    text = notebook_text(
        "from transformers import TrainingArguments",
        "args = TrainingArguments(output_dir='o',\n    per_device_train_batch_size=)",
        "args = TrainingArguments(output_dir='o', per_device_train_batch_size=2)",
    )
    plan = extract_notebook_plan(NOTEBOOKS / "inline.ipynb", text)
    assert any(problem.startswith("cell 2, line 2") for problem in plan.problems)
    batch = plan.per_device_train_batch_size
    assert batch.value == 2 and batch.range is not None
    assert batch.range.path == f"{NOTEBOOKS / 'inline.ipynb'}#cell=2"
    assert (batch.range.start_line, batch.range.start_col) == (0, 69)


def test_pragmas_in_cells_and_their_problems_name_the_cell() -> None:
    text = notebook_text(
        "# a title cell\nx = 1",
        "# llmmem: gpu=A100-80GB\n# llmmem: nonsense=1\nimport torch",
    )
    plan = extract_notebook_plan(NOTEBOOKS / "inline.ipynb", text)
    assert plan.gpu is not None and plan.gpu.value == "A100-80GB"
    assert plan.gpu.range is not None and plan.gpu.range.path is not None
    assert plan.gpu.range.path.endswith("#cell=1") and plan.gpu.range.start_line == 0
    assert any("cell 2, line 2" in problem for problem in plan.problems)


def test_nbformat_3_worksheets() -> None:
    text = json.dumps(
        {
            "worksheets": [{"cells": [{"cell_type": "code", "input": ["model_id = 'gpt2'\n"]}]}],
            "nbformat": 3,
        }
    )
    plan = extract_notebook_plan(NOTEBOOKS / "old.ipynb", text)
    assert not any("not a Jupyter notebook" in problem for problem in plan.problems)


@pytest.mark.parametrize(
    "text",
    ["", "[]", "{}", '{"cells": 3}', '{"cells": [1, null, {"cell_type": "code"}]}', "\x00\x01"],
)
def test_odd_notebooks_give_a_plan(text: str) -> None:
    plan = extract_notebook_plan(NOTEBOOKS / "inline.ipynb", text)
    assert plan.problems


def test_ipython_lines_become_python_line_for_line() -> None:
    lines = [
        "%pip install peft",
        "files = !ls",
        "for f in files:",
        "    !echo $f",
        "model?",
        "x = 1",
    ]
    assert python_lines_of_cell(lines) == [
        "pass",
        "files = None",
        "for f in files:",
        "    pass",
        "pass",
        "x = 1",
    ]
    assert python_lines_of_cell(["%%bash", "nvidia-smi"]) is None
    assert python_lines_of_cell(["%%time", "x = 1"]) == ["", "x = 1"]


# -- nothing raises -----------------------------------------------------------------------------


def test_every_line_prefix_reads() -> None:
    lines = QLORA.read_text(encoding="utf-8").splitlines(keepends=True)
    for count in range(len(lines) + 1):
        assert isinstance(extract_notebook_plan(QLORA, "".join(lines[:count])), TrainingPlan)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(cut=st.floats(0, 1))
def test_character_cuts_read(cut: float) -> None:
    text = QLORA.read_text(encoding="utf-8")
    assert isinstance(extract_notebook_plan(QLORA, text[: int(len(text) * cut)]), TrainingPlan)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=6))
def test_byte_edits_read(edits: list[tuple[float, int]]) -> None:
    data = bytearray(QLORA.read_bytes())
    for where, byte in edits:
        data[min(len(data) - 1, int(len(data) * where))] = byte
    text = data.decode("utf-8", errors="replace")
    assert isinstance(extract_notebook_plan(QLORA, text), TrainingPlan)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    sources=st.lists(
        st.text(alphabet=st.sampled_from(list("%!?()=:\n \tabx1'\"\\#")), max_size=40),
        max_size=4,
    )
)
def test_cell_soup_reads(sources: list[str]) -> None:
    plan = extract_notebook_plan(NOTEBOOKS / "inline.ipynb", notebook_text(*sources))
    assert isinstance(plan, TrainingPlan)

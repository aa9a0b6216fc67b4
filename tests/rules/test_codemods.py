"""Python fixes written by the libcst codemods (`rules/codemods`): what the file had stays as it
was (comments, trailing commas, quotes, line endings), LoRA -> QLoRA is one codemod, and a lint
that shows no fix never imports libcst."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from llmmem.budget.setup import Method
from llmmem.check import check_text
from llmmem.plan import SourceRange
from llmmem.rules import codemods
from llmmem.rules.edits import preview_python_edits
from llmmem.rules.finding import Finding, Fix
from llmmem.rules.text_edits import apply_edits, diff_edits

ROOT = Path(__file__).resolve().parents[2]


def call_range(text: str, name: str) -> SourceRange:
    """Where the (first) call of `name` is written, as the reader gives ranges."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == name:
            assert node.end_lineno is not None and node.end_col_offset is not None
            return SourceRange(
                start_line=node.lineno - 1,
                start_col=node.col_offset,
                end_line=node.end_lineno - 1,
                end_col=node.end_col_offset,
            )
    raise AssertionError(name)


def fix_titled(findings: list[Finding], prefix: str) -> Fix:
    return next(fix for f in findings for fix in f.fixes if fix.title.startswith(prefix))


def with_keyword(text: str, name: str = "gradient_checkpointing", value: object = True) -> str:
    python_text = text.replace("\r\n", "\n").replace("\r", "\n")  # ast's lines, for the range
    edits = codemods.keyword_edits(text, call_range(python_text, "TrainingArguments"), name, value)
    assert edits
    return apply_edits(text, edits)


def test_a_comment_after_the_last_argument_stays_on_its_line() -> None:
    text = 'args = TrainingArguments(\n    output_dir="out",\n    bf16=True  # mixed\n)\n'
    assert with_keyword(text) == (
        'args = TrainingArguments(\n    output_dir="out",\n    bf16=True,  # mixed\n'
        "    gradient_checkpointing=True,\n)\n"
    )
    with_comma = 'args = TrainingArguments(\n    output_dir="out",\n    bf16=True,  # mixed\n)\n'
    assert with_keyword(with_comma) == (
        'args = TrainingArguments(\n    output_dir="out",\n    bf16=True,  # mixed\n'
        "    gradient_checkpointing=True,\n)\n"
    )
    opening = 'args = TrainingArguments(  # the run\n    output_dir="out"\n)\n'
    assert with_keyword(opening) == (
        'args = TrainingArguments(  # the run\n    output_dir="out",\n'
        "    gradient_checkpointing=True,\n)\n"
    )


def test_trailing_commas_and_the_calls_layout_are_kept() -> None:
    one_line = 'args = TrainingArguments(output_dir="out", bf16=True,)\n'
    assert with_keyword(one_line) == (
        'args = TrainingArguments(output_dir="out", bf16=True, gradient_checkpointing=True,)\n'
    )
    hanging = 'args = TrainingArguments(output_dir="out",\n                         bf16=True)\n'
    assert with_keyword(hanging) == (
        'args = TrainingArguments(output_dir="out",\n                         bf16=True,\n'
        "                         gradient_checkpointing=True)\n"
    )
    empty = "args = TrainingArguments()\n"
    assert with_keyword(empty) == "args = TrainingArguments(gradient_checkpointing=True)\n"


SINGLE_QUOTED = """\
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained('meta-llama/Llama-3.1-8B', dtype='bfloat16')
args = TrainingArguments(output_dir='out', per_device_train_batch_size=4, optim='adamw_torch')
"""


def test_quotes_of_the_file_are_kept(tmp_path: Path) -> None:
    checked = check_text(tmp_path / "train.py", SINGLE_QUOTED, gpu="A100-80GB", hub=False)
    fix = fix_titled(checked.findings, "Use the 8-bit AdamW")
    assert "optim='adamw_bnb_8bit')" in apply_edits(SINGLE_QUOTED, fix.edits)
    # a keyword added to a call written with single quotes gets them too
    text = "args = TrainingArguments(output_dir='out')\n"
    edits = codemods.keyword_edits(text, call_range(text, "TrainingArguments"), "optim", "x")
    assert edits is not None and apply_edits(text, edits) == (
        "args = TrainingArguments(output_dir='out', optim='x')\n"
    )


@pytest.mark.parametrize("newline", ["\r\n", "\r"], ids=["crlf", "cr"])
def test_line_endings_are_the_files_own(newline: str) -> None:
    text = (
        "import os\n"
        "from transformers import TrainingArguments\n"
        "args = TrainingArguments(\n"
        '    output_dir="out",  # where\n'
        ")\n"
    ).replace("\n", newline)
    fixed = with_keyword(text)
    assert fixed == text.replace(
        f"  # where{newline})", f"  # where{newline}    gradient_checkpointing=True,{newline})"
    )
    if newline == "\r":
        assert "\n" not in fixed
    else:
        assert fixed.count("\n") == fixed.count("\r\n")
    source = codemods.parsed(text)
    assert source is not None
    change = codemods.Change()
    assert codemods._plan_import(source, "peft", "prepare_model_for_kbit_training", change)
    imported = apply_edits(text, codemods.written(source, change) or [])
    assert imported.startswith(
        f"from peft import prepare_model_for_kbit_training{newline}import os"
    )


def test_diff_edits_touch_only_what_changed() -> None:
    before = "a = 1\nb = f(x,\n      y)\nc = 3\n"
    after = "import z\na = 1\nb = f(x,\n      y, k=2)\nc = 3\n"
    edits = diff_edits(before, after)
    assert apply_edits(before, edits) == after
    assert [e.new_text for e in edits] == ["import z\n", ", k=2"]


LORA_SCRIPT = """\
# LoRA SFT of Llama 3.1 8B
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained(
    "meta-llama/Llama-3.1-8B",
    dtype="bfloat16",  # the weights' dtype
)
model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
args = TrainingArguments(
    output_dir='out',
    per_device_train_batch_size=4,
    gradient_checkpointing=True,
    bf16=True,
)
trainer = Trainer(model=model, args=args)
"""


def test_lora_to_qlora_is_one_codemod_that_reads_back_as_qlora(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    checked = check_text(path, LORA_SCRIPT, gpu="RTX-4090", hub=False)
    fix = fix_titled(checked.findings, "Switch to QLoRA")
    fixed = apply_edits(LORA_SCRIPT, fix.edits)
    ast.parse(fixed)
    # every site, written by one codemod of the original text
    assert fixed.startswith(
        "# LoRA SFT of Llama 3.1 8B\nimport torch\nfrom transformers import BitsAndBytesConfig\n"
        "from peft import prepare_model_for_kbit_training\nfrom peft import LoraConfig"
    )
    assert '    dtype="bfloat16",  # the weights\' dtype\n    quantization_config=' in fixed
    assert "\n)\nmodel = prepare_model_for_kbit_training(model)\nmodel = get_peft_model(" in fixed
    assert "output_dir='out'," in fixed  # untouched lines stay as written
    source = codemods.parsed(LORA_SCRIPT)
    assert source is not None and fix.edits == diff_edits(LORA_SCRIPT, fixed)
    again = check_text(path, fixed, gpu="RTX-4090", hub=False)
    setup = again.analysis.setup
    assert setup is not None and setup.method is Method.QLORA and setup.quant is not None
    assert setup.quant.prepare_for_kbit_training
    assert "LLM008" not in [f.code for f in again.findings]
    assert fix.predicted_device_bytes == again.analysis.budget.device_total_bytes  # type: ignore[union-attr]


def test_halving_the_batch_is_one_codemod_of_two_keywords(tmp_path: Path) -> None:
    text = (
        "from transformers import AutoModelForCausalLM, TrainingArguments\n"
        'model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")\n'
        "args = TrainingArguments(\n"
        '    output_dir="out",\n'
        "    per_device_train_batch_size=16  # per GPU\n"
        ")\n"
    )
    checked = check_text(tmp_path / "train.py", text, gpu="A100-80GB", hub=False)
    fix = fix_titled(checked.findings, "Halve the micro-batch")
    fixed = apply_edits(text, fix.edits)
    assert fixed.endswith(
        "    per_device_train_batch_size=8,  # per GPU\n    gradient_accumulation_steps=2,\n)\n"
    )


def test_preview_and_codemods_offer_the_same_fixes() -> None:
    """The text writer a lint without shown fixes uses decides the same findings and titles."""
    scripts = sorted((ROOT / "tests" / "fixtures" / "python").glob("*.py"))
    scripts += sorted((ROOT / "tests" / "fixtures" / "notebooks").glob("*.ipynb"))
    scripts += sorted((ROOT / "examples").glob("*.py"))
    for path in scripts:
        text = path.read_text(encoding="utf-8")
        for gpu in ("RTX-4090", "A100-80GB"):
            written = check_text(path, text, gpu=gpu, hub=False)
            with preview_python_edits():
                previewed = check_text(path, text, gpu=gpu, hub=False)

            def titles(findings: list[Finding]) -> list[tuple[str, list[str]]]:
                return [(f.code, [fix.title for fix in f.fixes]) for f in findings]

            assert titles(written.findings) == titles(previewed.findings), (path.name, gpu)


LINT_IMPORTS = """
import contextlib, io, sys
import llmmem.lint_command
with contextlib.redirect_stdout(io.StringIO()):
    llmmem.lint_command.lint_main([{path!r}, "--gpu", "RTX-4090", *{extra!r}])
print("libcst" in sys.modules)
"""


@pytest.mark.parametrize(
    ("extra", "imported"),
    [
        ([], False),
        (["--format", "github"], False),
        (["--format", "sarif"], False),
        (["--format", "json"], True),
    ],
    ids=["concise", "github", "sarif", "json"],
)
def test_a_lint_that_shows_no_fix_does_not_import_libcst(
    extra: list[str], imported: bool, trl_release: Callable[[str], Path]
) -> None:
    trl_release("0.29.1")  # the example has findings with fixes on an RTX 4090 at that release
    path = str(ROOT / "examples" / "qlora_sft.py")
    code = LINT_IMPORTS.format(path=path, extra=extra)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == str(imported)


@pytest.mark.parametrize("newline", ["\r\n", "\r"], ids=["crlf", "cr"])
def test_every_fix_of_a_crlf_or_cr_script_keeps_its_endings(tmp_path: Path, newline: str) -> None:
    path = tmp_path / "train.py"
    for script in (LORA_SCRIPT, SINGLE_QUOTED):
        text = script.replace("\n", newline)
        checked = check_text(path, text, gpu="RTX-4090", hub=False)
        fixes = [fix for finding in checked.findings for fix in finding.fixes]
        assert fixes
        for fix in fixes:
            fixed = apply_edits(text, fix.edits)
            ast.parse(fixed)
            if newline == "\r":
                assert "\n" not in fixed, fix.title
            else:
                assert fixed.count("\n") == fixed.count("\r\n"), fix.title
            again = check_text(path, fixed, gpu="RTX-4090", hub=False)
            assert again.analysis.budget is not None
            assert again.analysis.budget.device_total_bytes == fix.predicted_device_bytes


def test_a_long_script_is_fixed_by_the_text_writer_with_the_same_fixes(tmp_path: Path) -> None:
    """Past LARGEST_CODEMOD_TEXT characters the text writer edits the file (libcst's reading
    with positions costs about a second per 3,000 lines): the same fixes and titles, and every
    applied fix still parses and leaves the padding alone."""
    from llmmem.rules.edits import LARGEST_CODEMOD_TEXT

    base = (ROOT / "examples" / "full_finetune.py").read_text(encoding="utf-8")
    padding = "".join(f"# note {n}: nothing to see here\n" for n in range(1500))
    long_text = padding + base
    assert len(long_text) > LARGEST_CODEMOD_TEXT > len(base)
    path = tmp_path / "long_train.py"
    path.write_text(long_text, encoding="utf-8")
    checked = check_text(path, long_text, gpu="A100-80GB", hub=False)
    short = check_text(ROOT / "examples" / "full_finetune.py", base, gpu="A100-80GB", hub=False)

    def titles(findings: list[Finding]) -> list[tuple[str, list[str]]]:
        return [(f.code, [fix.title for fix in f.fixes]) for f in findings]

    assert titles(checked.findings) == titles(short.findings)
    fixes = [fix for f in checked.findings for fix in f.fixes]
    assert fixes
    for fix in fixes:
        fixed = apply_edits(long_text, fix.edits)
        ast.parse(fixed)
        assert fixed.startswith(padding)

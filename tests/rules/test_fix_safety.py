"""`llmmem-lint --fix` never damages a file: each reported case of damage, run for real on a
small file. After a fix the file still parses, keeps its encoding and line endings, changes only
where the fix writes, and a second `--fix` changes nothing."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmmem.lint_command import lint_main

GPU = "A100-80GB"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "python"


def lint_fix(capsys: pytest.CaptureFixture[str], *paths: Path, gpu: str = GPU) -> tuple[int, str]:
    """Exit code and stderr of `llmmem-lint PATH... --gpu GPU --fix`."""
    code = lint_main([*map(str, paths), "--gpu", gpu, "--fix"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def endings(data: bytes) -> set[bytes]:
    return set(re.findall(rb"\r\n|\r|\n", data))


def parse(path: Path, text: str) -> object:
    if path.suffix == ".py":
        return compile(text, str(path), "exec")
    if path.suffix == ".json":
        return json.loads(text)
    return list(yaml.safe_load_all(text))


def fix_soundly(
    capsys: pytest.CaptureFixture[str],
    path: Path,
    expected: str | None,
    *,
    encoding: str = "utf-8",
    gpu: str = GPU,
) -> str:
    """Run `--fix` on `path` and check what every fix must keep; returns the new text."""
    before = path.read_bytes()
    lint_fix(capsys, path, gpu=gpu)
    after = path.read_bytes()
    text = after.decode(encoding)  # strict: the file's own encoding still reads it
    parse(path, text)
    assert endings(after) <= (endings(before) or {b"\n"}), "line endings changed"
    if expected is not None:
        assert text == expected
    lint_fix(capsys, path, gpu=gpu)
    assert path.read_bytes() == after, "a second --fix changed the file again"
    return text


HEAD = """from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B", torch_dtype="bfloat16")
"""


# 1. a comment after the last argument ------------------------------------------------------


def test_a_comment_after_the_last_argument_without_a_comma(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        HEAD + 'args = TrainingArguments(\n    output_dir="out",\n    optim="adamw_bnb_8bit",\n'
        "    bf16=True  # mixed precision\n)\n"
    )
    fix_soundly(
        capsys,
        script,
        HEAD + 'args = TrainingArguments(\n    output_dir="out",\n    optim="adamw_bnb_8bit",\n'
        "    bf16=True,  # mixed precision\n    gradient_checkpointing=True,\n)\n",
    )


def test_a_comment_after_the_last_argument_with_a_comma(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        HEAD + 'args = TrainingArguments(\n    output_dir="out",\n    optim="adamw_bnb_8bit",\n'
        "    bf16=True,\n    gradient_accumulation_steps=2,\n"
        "    gradient_checkpointing=False,  # slow\n)\n"
    )
    # checkpointing, then the micro-batch halved three times (8 x 2 -> 1 x 16: the same
    # effective batch); the new keyword goes after the commented line, the comment stays
    fix_soundly(
        capsys,
        script,
        HEAD + 'args = TrainingArguments(\n    output_dir="out",\n    optim="adamw_bnb_8bit",\n'
        "    bf16=True,\n    gradient_accumulation_steps=16,\n"
        "    gradient_checkpointing=True,  # slow\n    per_device_train_batch_size=1,\n)\n",
        gpu="A100-40GB",
    )


# 2. a keyword is never given twice ---------------------------------------------------------


def test_a_keyword_held_by_a_mapping_is_edited_there_not_repeated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        HEAD + 'extra = {"gradient_checkpointing": False, "optim": "adamw_bnb_8bit"}\n'
        'args = TrainingArguments(output_dir="out", bf16=True, **extra)\n'
    )
    fix_soundly(
        capsys,
        script,
        HEAD + 'extra = {"gradient_checkpointing": True, "optim": "adamw_bnb_8bit"}\n'
        'args = TrainingArguments(output_dir="out", bf16=True, **extra)\n',
    )


def test_no_keyword_is_added_beside_an_unknown_mapping(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`**overrides` read from a file may hold any keyword: adding one could repeat it."""
    script = tmp_path / "train.py"
    original = (
        "import json\n" + HEAD + 'overrides = json.load(open("overrides.json"))\n'
        'args = TrainingArguments(output_dir="out", bf16=True, **overrides)\n'
    )
    script.write_text(original)
    text = fix_soundly(capsys, script, None)
    assert 'args = TrainingArguments(output_dir="out", bf16=True, **overrides)\n' in text
    # checkpointing is switched on where no keyword can clash: on the model
    assert text == original.replace(
        "overrides = ", "model.gradient_checkpointing_enable()\noverrides = "
    )


def test_a_keyword_written_as_false_is_flipped_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        HEAD + "args = TrainingArguments(\n"
        '    output_dir="out", gradient_checkpointing=False, optim="adamw_bnb_8bit", bf16=True\n)\n'
    )
    text = fix_soundly(capsys, script, None)
    assert text.count("gradient_checkpointing=") == 1
    assert "gradient_checkpointing=True" in text


# 3. JSON values are JSON -------------------------------------------------------------------


def test_hf_arguments_json_gets_quoted_values_and_valid_new_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "args.json"
    config.write_text(
        "{\n"
        '  "model_name_or_path": "Qwen/Qwen2.5-7B",\n'
        '  "per_device_train_batch_size": 4,\n'
        '  "optim": "adamw_torch",\n'
        '  "bf16": true\n'
        "}\n"
    )
    # a 7B full fine-tune on 80 GB: the paged 8-bit AdamW (a quoted string; its states live in
    # unified memory), then checkpointing (a new key inside the object)
    fixed = fix_soundly(capsys, config, None)
    assert json.loads(fixed)["gradient_checkpointing"] is True
    assert json.loads(fixed)["optim"] == "paged_adamw_8bit"
    assert '"optim": "paged_adamw_8bit"' in fixed
    assert fixed.startswith("{\n") and fixed.endswith("\n}\n")


# 4. YAML anchors, aliases and merge keys ---------------------------------------------------


def test_an_anchor_is_kept_and_the_alias_at_the_key_is_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "axolotl.yml"
    config.write_text(
        "base_model: Qwen/Qwen2.5-7B\ncommon: &bs 16\nmicro_batch_size: *bs\n"
        "eval_batch_size: *bs\nsequence_len: 4096\nbf16: true\n"
        "gradient_checkpointing: true\noptimizer: adamw_bnb_8bit\n"
    )
    text = fix_soundly(capsys, config, None)
    loaded = yaml.safe_load(text)
    assert "common: &bs 16\n" in text and "eval_batch_size: *bs\n" in text
    assert loaded["common"] == loaded["eval_batch_size"] == 16  # other users keep the value
    assert loaded["micro_batch_size"] < 16  # the fix wrote a literal at the key it changes
    assert re.search(r"^micro_batch_size: \d+$", text, re.M)


def test_a_value_from_a_merge_key_is_not_edited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "axolotl.yml"
    original = (
        "defaults: &base\n  micro_batch_size: 16\n  sequence_len: 4096\n"
        "base_model: Qwen/Qwen2.5-7B\n<<: *base\nbf16: true\ngradient_checkpointing: true\n"
        "optimizer: adamw_bnb_8bit\n"
    )
    config.write_text(original)
    text = fix_soundly(capsys, config, None, gpu="A100-40GB")
    assert text.startswith("defaults: &base\n  micro_batch_size: 16\n  sequence_len: 4096\n")
    assert yaml.safe_load(text)["defaults"] == {"micro_batch_size": 16, "sequence_len": 4096}


# 5. flow mappings --------------------------------------------------------------------------


def test_keys_go_inside_a_flow_mapping(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "sft.yaml"
    config.write_text(
        "{model_name_or_path: Qwen/Qwen2.5-7B, per_device_train_batch_size: 4, bf16: true,"
        " max_length: 4096}\n"
    )
    text = fix_soundly(capsys, config, None)
    (loaded,) = yaml.safe_load_all(text)
    assert loaded["optim"] == "paged_adamw_8bit" or loaded["per_device_train_batch_size"] < 4
    assert text.startswith("{model_name_or_path: Qwen/Qwen2.5-7B, per_device_train_batch_size: ")
    assert text.count("\n") == 1


# 6. several YAML documents -----------------------------------------------------------------


def test_a_key_is_added_once_to_the_document_that_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sft.yaml"
    config.write_text(
        "model_name_or_path: Qwen/Qwen2.5-7B\nper_device_train_batch_size: 1\nbf16: true\n"
        "max_length: 4096\ngradient_checkpointing: true\n---\nnotes: second document\n"
    )
    fix_soundly(
        capsys,
        config,
        "model_name_or_path: Qwen/Qwen2.5-7B\nper_device_train_batch_size: 1\nbf16: true\n"
        "max_length: 4096\ngradient_checkpointing: true\noptim: paged_adamw_8bit\n"
        "---\nnotes: second document\n",
    )


# 7. a variable read by other settings ------------------------------------------------------


def test_a_shared_variable_keeps_its_value_and_the_keyword_gets_the_literal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    body = (
        "    per_device_eval_batch_size=bs,\n    gradient_checkpointing=True,\n"
        '    optim="adamw_bnb_8bit",\n    bf16=True,\n'
    )
    script.write_text(
        HEAD + 'bs = 8\nargs = TrainingArguments(\n    output_dir="out",\n'
        "    per_device_train_batch_size=bs,\n" + body + "    gradient_accumulation_steps=2,\n)\n"
    )
    # the micro-batch halved three times (8 x 2 -> 1 x 16): `bs` still sizes the eval batch
    fix_soundly(
        capsys,
        script,
        HEAD + 'bs = 8\nargs = TrainingArguments(\n    output_dir="out",\n'
        "    per_device_train_batch_size=1,\n" + body + "    gradient_accumulation_steps=16,\n)\n",
        gpu="A100-40GB",
    )


# 8. encodings ------------------------------------------------------------------------------

LATIN1 = (
    "# -*- coding: latin-1 -*-\n# Réglages de l'entraînement\n"
    + HEAD
    + "args = TrainingArguments(\n"
    '    output_dir="sortie-été",\n    optim="adamw_bnb_8bit",\n    bf16=True,\n)\n'
)


def test_a_latin1_file_is_written_back_in_latin1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(LATIN1.encode("latin-1"))
    text = fix_soundly(
        capsys,
        script,
        LATIN1.replace("bf16=True,\n", "bf16=True,\n    gradient_checkpointing=True,\n"),
        encoding="latin-1",
    )
    assert "\ufffd" not in text
    assert b"\xe9t\xe9" in script.read_bytes()


def test_a_utf8_byte_order_mark_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "sft.yaml"
    original = (
        "model_name_or_path: Qwen/Qwen2.5-7B\nper_device_train_batch_size: 1\nbf16: true\n"
        "max_length: 4096\ngradient_checkpointing: true\n"
    )
    config.write_bytes(b"\xef\xbb\xbf" + original.encode())
    fix_soundly(capsys, config, None, encoding="utf-8")
    data = config.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf") and data.count(b"\xef\xbb\xbf") == 1
    assert data.endswith(b"optim: paged_adamw_8bit\n")


def test_a_file_that_does_not_decode_is_not_fixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    data = LATIN1.replace("# -*- coding: latin-1 -*-\n", "").encode("latin-1")  # UTF-8 by default
    script.write_bytes(data)
    _, err = lint_fix(capsys, script)
    assert script.read_bytes() == data
    assert "not fixed: it does not decode" in err


# 9. line endings ---------------------------------------------------------------------------

CHECKPOINTING_OFF = HEAD + (
    'args = TrainingArguments(\n    output_dir="out",\n    optim="adamw_bnb_8bit",\n'
    "    bf16=True,\n)\n"
)
CHECKPOINTING_ON = CHECKPOINTING_OFF.replace(
    "bf16=True,\n", "bf16=True,\n    gradient_checkpointing=True,\n"
)


@pytest.mark.parametrize("newline", ["\r\n", "\r"], ids=["crlf", "cr"])
def test_line_endings_are_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], newline: str
) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(CHECKPOINTING_OFF.replace("\n", newline).encode())
    fix_soundly(capsys, script, None)
    assert script.read_bytes() == CHECKPOINTING_ON.replace("\n", newline).encode()


def test_mixed_line_endings_are_not_fixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    data = CHECKPOINTING_OFF.replace("\n", "\r\n", 2).encode()
    script.write_bytes(data)
    _, err = lint_fix(capsys, script)
    assert script.read_bytes() == data
    assert "mixes line endings" in err


# 10. symbolic links ------------------------------------------------------------------------


def test_a_symlink_to_a_file_outside_the_tree_is_not_written_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "elsewhere" / "shared.py"
    outside.parent.mkdir()
    outside.write_text(CHECKPOINTING_OFF)
    tree = tmp_path / "project"
    tree.mkdir()
    (tree / "linked.py").symlink_to(outside)
    (tree / "train.py").write_text(CHECKPOINTING_OFF)
    _, err = lint_fix(capsys, tree)
    assert outside.read_text() == CHECKPOINTING_OFF
    assert (tree / "linked.py").is_symlink()
    assert "linked.py: not fixed: it is a symbolic link" in err
    assert (tree / "train.py").read_text() == CHECKPOINTING_ON  # the rest still gets its fixes


# 11. writing -------------------------------------------------------------------------------


def test_a_read_only_file_is_reported_and_the_others_are_fixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = tmp_path / "a_locked.py"
    locked.write_text(CHECKPOINTING_OFF)
    locked.chmod(0o444)
    script = tmp_path / "b_train.py"
    script.write_text(CHECKPOINTING_OFF)
    script.chmod(0o750)
    code, err = lint_fix(capsys, locked, script)
    assert code == 2
    assert f"{locked}: cannot write the fixes (the file is read-only)" in err
    assert locked.read_text() == CHECKPOINTING_OFF
    assert script.read_text() == CHECKPOINTING_ON
    assert stat.S_IMODE(script.stat().st_mode) == 0o750  # the mode is kept
    # no temporary file is left behind
    assert {p.name for p in tmp_path.iterdir()} == {"a_locked.py", "b_train.py"}


# 12. a result that no longer parses or analyses is not written ----------------------------


def test_a_result_that_does_not_compile_is_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The analysis reads the syntax tree; compiling is stricter (`return` outside a function),
    and a file that would not compile after the fix is left as it was."""
    script = tmp_path / "train.py"
    original = CHECKPOINTING_OFF + "if args is None:\n    return\n"
    script.write_text(original)
    _, err = lint_fix(capsys, script)
    assert script.read_text() == original
    assert "not applied, the result would not parse ('return' outside function" in err


def test_a_fix_that_loses_the_model_or_changes_nothing_is_refused(tmp_path: Path) -> None:
    from llmmem.check import check_text
    from llmmem.fix_writer import outcome_problem

    path = tmp_path / "train.py"
    good = check_text(path, CHECKPOINTING_OFF, gpu=GPU, hub=False).analysis
    fixed = check_text(path, CHECKPOINTING_ON, gpu=GPU, hub=False).analysis
    no_model = CHECKPOINTING_ON.replace("model = AutoModelForCausalLM", "model = object  #")
    lost = check_text(path, no_model, gpu=GPU, hub=False).analysis
    assert outcome_problem(good, fixed) is None
    assert "no longer give an estimate" in (outcome_problem(good, lost) or "")
    assert "would not change" in (outcome_problem(good, good) or "")


# the scripts still run: argparse and HfArgumentParser ---------------------------------------


def parses_its_arguments(script: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        cwd=script.parent,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_an_argparse_flag_gets_a_default_not_a_replacement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text((FIXTURES / "argparse_script.py").read_text())
    text = fix_soundly(capsys, script, None)
    assert (
        'parser.add_argument("--gradient_checkpointing", action="store_true", default=True)' in text
    )
    tree = ast.parse(text)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert sum(getattr(c.func, "attr", "") == "add_argument" for c in calls) == 7
    parses_its_arguments(script)


def test_hf_argument_parser_settings_go_to_the_dataclass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    original = (FIXTURES / "hf_argparser_dataclass.py").read_text()
    script.write_text(original)
    text = fix_soundly(capsys, script, None, gpu="T4")
    assert "HfArgumentParser((ModelArguments, DataArguments, MyTrainingArguments))" in text
    assert text != original
    added = [line for line in text.splitlines() if line not in original.splitlines()]
    assert added and all(re.fullmatch(r"    \w+: (int|bool|str) = \S+", a) for a in added)
    parses_its_arguments(script)


def test_a_notebook_cell_with_ipython_lines_still_gets_its_keyword(tmp_path: Path) -> None:
    """The keyword is placed with the cell's syntax tree; `%pip` and `!` lines must not hide
    the trainer call from it."""
    from llmmem.check import check_text
    from llmmem.rules.finding import TextEdit
    from llmmem.rules.text_edits import apply_edits

    cell = (
        "%pip install -q transformers\nimport torch\n"
        "from transformers import AutoModelForCausalLM, TrainingArguments\n"
        "model = AutoModelForCausalLM.from_pretrained('meta-llama/Llama-3.1-8B',"
        " dtype=torch.bfloat16)\n!nvidia-smi\n"
        "args = TrainingArguments(\n    output_dir='out',\n    bf16=True,\n)"
    )
    notebook = {"cells": [{"cell_type": "code", "source": cell}], "metadata": {}, "nbformat": 4}
    path = tmp_path / "train.ipynb"
    checked = check_text(path, json.dumps(notebook), gpu=GPU, hub=False)
    fix = next(
        f for x in checked.findings for f in x.fixes if f.title.startswith("Enable gradient")
    )
    local = [
        TextEdit(range=dataclasses.replace(edit.range, path=None), new_text=edit.new_text)
        for edit in fix.edits
    ]
    assert apply_edits(cell, local).endswith("    bf16=True,\n    gradient_checkpointing=True,\n)")

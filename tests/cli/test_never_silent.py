"""Nothing passes CI silently: a file that does not parse, a setting llmmem cannot use and an
empty or unknown option value each reach the output and the exit code.

Every case runs the installed `llmmem-lint` / `llmmem` commands in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
FORMATS = ("concise", "full", "json", "github", "sarif")


def command(name: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def lint(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return command("llmmem-lint", *args, cwd=cwd)


def usage_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()  # no pyproject.toml above it is read
    return tmp_path


QLORA = (EXAMPLES / "qlora_sft.py").read_text()


# -- a file that does not parse --------------------------------------------------------------


def test_a_missing_comma_is_an_error_in_every_format(project: Path) -> None:
    script = project / "train.py"
    script.write_text(QLORA.replace("r=16,", "r=16"))
    line = QLORA.splitlines().index("    lora_alpha=32,") + 1  # where Python says it stopped
    for report in FORMATS:
        proc = lint(str(script), "--gpu", "A100-80GB", "--format", report)
        assert proc.returncode == 1, (report, proc.stdout, proc.stderr)
        assert "LLM015" in proc.stdout, report
        assert "Perhaps you forgot a comma" in proc.stdout, report
    concise = lint(str(script), "--gpu", "A100-80GB").stdout
    assert concise.startswith(f"{script}:{line - 1}:")  # the parser's own position
    assert "[error]" in concise
    found = json.loads(lint(str(script), "--format", "json").stdout)
    assert [f["code"] for f in found] == ["LLM015"]
    assert found[0]["range"]["start_line"] == line - 2


def test_newer_python_syntax_is_read_not_refused(project: Path) -> None:
    """Python 3.12 and 3.14 constructs in a script run by llmmem on 3.11: the file is read and
    sized as it would be without them, and no syntax finding is made."""
    newer = (
        "type Batch = list[dict[str, int]]\n"
        "def first[T](items: list[T]) -> T:\n"
        "    return items[0]\n"
        'names = {"a": "llama"}\n'
        'print(f"model {names["a"]}")\n'
        "try:\n"
        "    import wandb\n"
        "except ImportError, ModuleNotFoundError:\n"
        "    wandb = None\n"
    )
    plain = project / "plain.py"
    plain.write_text(QLORA)
    script = project / "newer.py"
    script.write_text(newer + QLORA)
    shifted = len(newer.splitlines())
    old = json.loads(lint(str(plain), "--gpu", "RTX-4090", "--format", "json").stdout)
    new = json.loads(lint(str(script), "--gpu", "RTX-4090", "--format", "json").stdout)
    assert "LLM015" not in {f["code"] for f in new}
    assert [(f["code"], f["message"]) for f in new] == [(f["code"], f["message"]) for f in old]
    assert [f["range"]["start_line"] for f in new] == [
        f["range"]["start_line"] + shifted for f in old
    ]
    explained = command("llmmem", "explain", str(script), "--format", "json")
    problems = json.loads(explained.stdout)["plan"]["problems"]
    assert any("syntax newer than Python" in p for p in problems)


def test_a_real_error_after_newer_syntax_is_reported_where_it_is(project: Path) -> None:
    script = project / "train.py"
    script.write_text("type Rows = list[int]\n" + QLORA + "broken = (\n")
    proc = lint(str(script), "--format", "json")
    found = json.loads(proc.stdout)
    assert [f["code"] for f in found] == ["LLM015"]
    assert "was never closed" in found[0]["message"]
    assert found[0]["range"]["start_line"] == len(QLORA.splitlines()) + 1


@pytest.mark.parametrize(
    ("name", "text", "where", "words"),
    [
        (
            "axolotl.yaml",
            "base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: [4\nsequence_len: 2048\n",
            "3:1",
            "expected ',' or ']', but got ':' (while parsing a flow sequence) (line 3, column 13)",
        ),
        (
            "ds_config.json",
            '{"train_micro_batch_size_per_gpu": 4,\n "zero_optimization": {"stage": 3\n}',
            "3:1",
            "expected ',' or '}', but got '<stream end>' (while parsing a flow mapping) "
            "(line 3, column 2)",
        ),
        ("lf.yaml", "model_name_or_path: Qwen/Qwen2.5-7B\n\tcutoff_len: 1024\n", "2:2", "tab"),
    ],
)
def test_a_config_that_does_not_parse_is_an_error(
    project: Path, name: str, text: str, where: str, words: str
) -> None:
    config = project / name
    config.write_text(text)
    proc = lint(str(config), "--gpu", "A100-80GB")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{config}:{where}: LLM015 [error]" in proc.stdout, proc.stdout
    assert words in proc.stdout


def test_a_notebook_cell_that_does_not_parse_is_an_error(project: Path) -> None:
    cells = [
        {"cell_type": "code", "source": "import torch\n", "metadata": {}, "outputs": []},
        {
            "cell_type": "code",
            "source": QLORA.replace("r=16,", "r=16"),
            "metadata": {},
            "outputs": [],
        },
    ]
    notebook = project / "train.ipynb"
    notebook.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4}))
    proc = lint(str(notebook), "--gpu", "A100-80GB")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "LLM015 [error] cell 2, line" in proc.stdout


# -- pragmas llmmem cannot use ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("pragma", "words"),
    [
        ("gpus=A100-80GB", "unknown key 'gpus'"),
        ("gpu=", "gpu has no value"),
        ("batch=0", "batch must be"),
        ("batch=abc", "'abc'"),
        ("seq=nan", "'nan'"),
        ("world_size=-8", "'-8'"),
        ("ignore[LLM001", "close it"),
        ("ignore[LLM999]", "no rule LLM999"),
    ],
)
def test_a_pragma_that_cannot_be_used_fails_the_lint(
    project: Path, pragma: str, words: str
) -> None:
    script = project / "train.py"
    script.write_text(f"# llmmem: {pragma}\n" + QLORA)
    proc = lint(str(script), "--gpu", "A100-80GB")  # fits: only the pragma's finding fails it
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [row for row in proc.stdout.splitlines() if "LLM016" in row]
    assert line.startswith(f"{script}:1:11: LLM016 [warning]"), line
    assert words in line
    sarif = json.loads(lint(str(script), "--gpu", "A100-80GB", "--format", "sarif").stdout)
    assert "LLM016" in {r["ruleId"] for r in sarif["runs"][0]["results"]}


def test_a_pragma_after_an_empty_one_is_still_read(project: Path) -> None:
    script = project / "train.py"
    script.write_text("# llmmem: gpu= seq=512\n" + QLORA)
    found = json.loads(command("llmmem", "explain", str(script), "--format", "json").stdout)
    assert found["plan"]["max_seq_length"]["value"] == 512
    assert found["plan"]["max_seq_length"]["source"] == "pragma"


# -- [tool.llmmem] that cannot be read -------------------------------------------------------


def test_an_array_of_llmmem_tables_is_refused(project: Path) -> None:
    (project / "pyproject.toml").write_text('[[tool.llmmem]]\ngpu = "A100-80GB"\n')
    (project / "train.py").write_text(QLORA)
    usage_error(lint(str(project / "train.py")), "[[tool.llmmem]]", "[tool.llmmem]")


def test_a_utf16_pyproject_is_refused(project: Path) -> None:
    text = '[tool.llmmem]\ngpu = "RTX-4090"\n'
    (project / "pyproject.toml").write_bytes(text.encode("utf-16"))
    (project / "train.py").write_text(QLORA)
    usage_error(lint(str(project / "train.py")), "UTF-16", "UTF-8")


@pytest.mark.parametrize("kind", ["directory", "oversized"])
def test_an_unreadable_pyproject_is_a_warning_that_names_it(project: Path, kind: str) -> None:
    pyproject = project / "pyproject.toml"
    if kind == "directory":
        pyproject.mkdir()
    else:
        pyproject.write_text('[tool.llmmem]\ngpu = "RTX-4090"\n' + "# padding\n" * 500_000)
    (project / "train.py").write_text(QLORA)
    proc = lint(str(project / "train.py"), "--gpu", "A100-80GB")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "LLM016 [warning] cannot read" in proc.stdout
    assert str(pyproject) in proc.stdout


# -- option values --------------------------------------------------------------------------


def test_an_empty_gpu_is_a_usage_error_everywhere(project: Path) -> None:
    script = project / "train.py"
    script.write_text(QLORA)
    usage_error(lint(str(script), "--gpu", ""), "--gpu", "empty")
    usage_error(lint(str(script), "--gpu="), "--gpu", "empty")
    usage_error(command("llmmem", "explain", str(script), "--gpu", "  "), "--gpu", "empty")
    usage_error(
        command("llmmem", "estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", ""),
        "--gpu",
        "empty",
    )
    usage_error(command("llmmem", "estimate", "--model", ""), "--model", "empty")


def test_select_and_ignore_take_known_codes_only(project: Path) -> None:
    script = project / "train.py"
    script.write_text(QLORA)
    usage_error(lint(str(script), "--select", "LLM01"), "unknown rule code LLM01")
    usage_error(lint(str(script), "--select", ""), "--select is empty")
    usage_error(lint(str(script), "--ignore", "LLM999"), "--ignore", "LLM999")
    usage_error(lint(str(script), "--ignore", ","), "--ignore is empty")
    both = lint(str(script), "--gpu", "RTX-4090")
    assert "LLM001" in both.stdout and "LLM003" in both.stdout
    ignored = lint(str(script), "--gpu", "RTX-4090", "--ignore", "llm003")
    assert "LLM001" in ignored.stdout and "LLM003" not in ignored.stdout
    selected = lint(str(script), "--gpu", "RTX-4090", "--select", "LLM003")
    assert "LLM001" not in selected.stdout and "LLM003" in selected.stdout


@pytest.mark.parametrize(
    ("tool", "args", "written"),
    [
        (
            "llmmem",
            ["estimate", "--model", "meta-llama/Llama-3.1-8B", "--grad-acc", "2"],
            "--grad-acc",
        ),
        (
            "llmmem",
            ["estimate", "--model", "meta-llama/Llama-3.1-8B", "--cpo-al", "0.5"],
            "--cpo-al",
        ),
        ("llmmem-lint", ["train.py", "--sel", "LLM001"], "--sel"),
        ("llmmem-lint", ["train.py", "--fail", "error"], "--fail"),
        ("llmmem-lsp", ["--std"], "--std"),
    ],
)
def test_long_options_are_never_abbreviated(
    project: Path, tool: str, args: list[str], written: str
) -> None:
    (project / "train.py").write_text(QLORA)
    usage_error(command(tool, *args, cwd=project), f"unrecognized arguments: {written}")

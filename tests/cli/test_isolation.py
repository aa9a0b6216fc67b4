"""llmmem never runs the code of the project it reads, and never waits on a file it writes.

Every case runs the installed commands (`llmmem`, `python -m llmmem`) in a subprocess, in a
project folder that holds modules named like the ones llmmem imports (`json.py`, `typing.py`,
`datasets.py`, `transformers.py`, `torch.py`): each leaves a marker file when it is imported.
`verify --simulate` runs a tiny model's step, the cheapest real one (a few seconds).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
LLMMEM = str(BIN / "llmmem") if (BIN / "llmmem").exists() else shutil.which("llmmem") or "llmmem"

# a Llama small enough for a simulated step in seconds
TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

SCRIPT = """import torch
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("./tiny", dtype=torch.bfloat16)
args = TrainingArguments(
    output_dir="out", per_device_train_batch_size=2, bf16=True, optim="adamw_torch"
)
# llmmem: seq=64
"""

SHADOWS = ("json", "typing", "datasets", "transformers", "torch")


def shadow(project: Path, names: tuple[str, ...]) -> None:
    """Modules in `project` that leave `<name>.py.imported` beside them when imported."""
    for name in names:
        (project / f"{name}.py").write_text('open(__file__ + ".imported", "w").close()\n')


def imported(project: Path) -> list[str]:
    return sorted(path.name.removesuffix(".py.imported") for path in project.glob("*.imported"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()  # its own project: no pyproject.toml above it is read
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def run(
    command: list[str], project: Path, *, timeout: float = 180, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
        stdin=subprocess.DEVNULL,
    )


MODULE = [sys.executable, "-m", "llmmem"]


@pytest.mark.parametrize(
    "command",
    [
        [*MODULE, "explain", "train.py"],
        [LLMMEM, "explain", "train.py"],
        [*MODULE, "verify", "train.py", "--simulate"],
        [LLMMEM, "verify", "train.py", "--simulate"],
    ],
    ids=["python-m-explain", "llmmem-explain", "python-m-verify", "llmmem-verify"],
)
def test_no_module_of_the_project_is_imported(project: Path, command: list[str]) -> None:
    shadow(project, SHADOWS)
    proc = run(command, project)
    assert imported(project) == [], proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_steps_process_leaves_the_project_out_even_when_pythonpath_names_it(
    project: Path,
) -> None:
    """`export PYTHONPATH=$PWD` is common in a project; the step's process still builds the
    model with the installed torch and transformers. (Not json or typing: the `llmmem` script
    itself starts with PYTHONPATH on its path, before any of llmmem's code runs.)"""
    shadow(project, ("datasets", "transformers", "torch"))
    path = os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")]))
    proc = run([LLMMEM, "verify", "train.py", "--simulate"], project, PYTHONPATH=path)
    assert imported(project) == [], proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "simulated:" in proc.stdout


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_the_steps_process_is_started_isolated_outside_the_project(
    project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """What `verify` starts, as the kernel saw it: `python -I` (no working directory on the
    path, no PYTHON* variables), and every file it was given lies outside the project."""
    log = tmp_path_factory.mktemp("strace") / "exec.log"
    strace = [str(shutil.which("strace")), "-f", "-qq", "-s", "4096", "-e", "trace=execve"]
    proc = run([*strace, "-o", str(log), LLMMEM, "verify", "train.py", "--simulate"], project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = [line for line in log.read_text().splitlines() if "llmmem.verify.worker" in line]
    assert started, log.read_text()[-2000:]
    worker = started[0]
    assert re.search(r'\["[^"]*python[^"]*", "-I", ', worker), worker
    files = [arg for arg in worker.split('"') if arg.endswith(".json")]
    assert files and all(os.path.isabs(f) and str(project) not in f for f in files), worker


# -- outputs: a FIFO, a device or a directory is refused before the step runs --------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize("flag", ["--output", "--snapshot"])
def test_an_output_that_is_a_fifo_is_refused_before_the_step(project: Path, flag: str) -> None:
    fifo = project / "report.json"
    os.mkfifo(fifo)
    started = time.monotonic()
    proc = run(
        [LLMMEM, "verify", "train.py", "--simulate", flag, "report.json"], project, timeout=60
    )
    assert time.monotonic() - started < 30
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"llmmem: error: {flag} report.json: a named pipe (FIFO), not a file"], lines
    assert proc.stdout == ""  # refused before the step: nothing measured, nothing printed
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize(
    ("target", "reason"),
    [("/dev/null", "a device, not a file"), (".", "a directory, not a file")],
    ids=["device", "directory"],
)
def test_an_output_that_is_not_a_file_is_refused(project: Path, target: str, reason: str) -> None:
    proc = run([LLMMEM, "verify", "train.py", "--simulate", "--output", target], project)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"llmmem: error: --output {target}: {reason}")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_fifo_put_in_place_after_the_check_is_refused_at_the_write(tmp_path: Path) -> None:
    """The report is written at the end of a step that may take minutes: a FIFO that appeared
    meanwhile is refused at once, not waited on."""
    from llmmem.files import UnreadableFile
    from llmmem.output_files import write_output_text

    target = tmp_path / "report.json"
    os.mkfifo(target)
    started = time.monotonic()
    with pytest.raises(UnreadableFile, match=r"^a named pipe \(FIFO\), not a file$"):
        write_output_text(target, "{}\n")
    assert time.monotonic() - started < 5
    regular = tmp_path / "kept.json"
    regular.write_text("an older, longer report\n")
    write_output_text(regular, "{}\n")
    assert regular.read_text() == "{}\n"  # replaced, not appended to or left with a tail

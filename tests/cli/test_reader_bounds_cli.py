"""The installed commands on configs and launchers that used to hang or pass silently: a number
a YAML writes that is not one is LLM011 on its line, as in a Python script; a "billion laughs"
YAML and a launcher of megabytes come back in seconds with the line saying what was not read.

Every test runs the real command in a subprocess, with a timeout, on files written to tmp_path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
LINT = str(Path(sys.executable).parent / "llmmem-lint")  # the installed command


def run(
    args: list[str], cwd: Path, *, timeout: float = 60, memory_limit: int | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """The command's process and its wall time; `memory_limit`: bytes of address space."""

    def limit() -> None:
        import resource

        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    started = time.monotonic()
    proc = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=cwd,
        preexec_fn=limit if memory_limit is not None else None,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, time.monotonic() - started


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()  # its own project: no pyproject.toml above it is read
    return tmp_path


# -- a number that is not one: LLM011 on its line, exit 1 --------------------------------------

CONFIGS = {
    "axolotl": (
        "base_model: Qwen/Qwen2.5-0.5B\n"
        "adapter: lora\n"
        "lora_r: 16\n"
        "micro_batch_size: {batch}\n"
        "gradient_accumulation_steps: 4\n"
        "sequence_len: {sequence}\n"
    ),
    "llamafactory": (
        "model_name_or_path: Qwen/Qwen2.5-0.5B\n"
        "stage: sft\n"
        "finetuning_type: lora\n"
        "per_device_train_batch_size: {batch}\n"
        "gradient_accumulation_steps: 4\n"
        "cutoff_len: {sequence}\n"
    ),
}
BATCH_LINE = {"axolotl": 3, "llamafactory": 3}  # 0-based
SEQUENCE_LINE = {"axolotl": 5, "llamafactory": 5}


def value_findings(proc: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    return [finding for finding in json.loads(proc.stdout) if finding["code"] == "LLM011"]


@pytest.mark.parametrize("framework", sorted(CONFIGS))
def test_a_batch_written_as_a_word_is_llm011_on_its_line(project: Path, framework: str) -> None:
    config = project / f"{framework}.yaml"
    config.write_text(CONFIGS[framework].format(batch="four", sequence=512))
    proc, _ = run([LINT, str(config), "--gpu", "A100-80GB", "--format", "json"], project)
    (finding,) = value_findings(proc)
    assert finding["range"]["start_line"] == BATCH_LINE[framework]  # type: ignore[index]
    assert str(finding["message"]).startswith("per_device_train_batch_size: ")
    assert "must be a whole number, got 'four'" in str(finding["message"])
    assert proc.returncode == 1  # a warning fails the default --fail-on warning


@pytest.mark.parametrize("batch", ["four", "-2", "0"])
def test_axolotls_default_stands_in_for_any_batch_it_cannot_use(project: Path, batch: str) -> None:
    config = project / "axolotl.yaml"
    config.write_text(CONFIGS["axolotl"].format(batch=batch, sequence=512))
    proc, _ = run(
        [sys.executable, "-m", "llmmem", "explain", str(config), "--format", "json"], project
    )
    batch_used = json.loads(proc.stdout)["plan"]["per_device_train_batch_size"]
    assert (batch_used["value"], batch_used["note"]) == (1, "axolotl micro_batch_size default")
    proc, _ = run([LINT, str(config), "--gpu", "A100-80GB", "--format", "json"], project)
    (finding,) = value_findings(proc)
    assert finding["range"]["start_line"] == BATCH_LINE["axolotl"]  # type: ignore[index]
    assert proc.returncode == 1


@pytest.mark.parametrize("framework", sorted(CONFIGS))
def test_a_written_batch_and_sequence_both_rejected_print_two_lines(
    project: Path, framework: str
) -> None:
    config = project / f"{framework}.yaml"
    config.write_text(CONFIGS[framework].format(batch="four", sequence=0))
    proc, _ = run([LINT, str(config), "--gpu", "A100-80GB"], project)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if " LLM011 " in line]
    batch_col = CONFIGS[framework].splitlines()[BATCH_LINE[framework]].index(":") + 3
    sequence_col = CONFIGS[framework].splitlines()[SEQUENCE_LINE[framework]].index(":") + 3
    assert sorted(line.split(" LLM011 ")[0] for line in lines) == sorted(
        [
            f"{config}:{BATCH_LINE[framework] + 1}:{batch_col}:",
            f"{config}:{SEQUENCE_LINE[framework] + 1}:{sequence_col}:",
        ]
    ), proc.stdout


# -- aliases that expand without end ----------------------------------------------------------

BOMB = (
    "base_model: meta-llama/Llama-3.1-8B\n"
    "micro_batch_size: 16\n"
    "sequence_len: 4096\n"
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{name}: &{name} [{','.join([f'*{previous}'] * 9)}]\n"
        for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
    )
)
BOMB_LINE = "the YAML expands its aliases past 10000 nodes; not read"


def test_a_billion_laughs_yaml_is_refused_in_seconds_with_no_estimate(project: Path) -> None:
    assert len(BOMB) < 600
    config = project / "axolotl.yaml"
    config.write_text(BOMB)
    proc, seconds = run(
        [
            sys.executable,
            "-m",
            "llmmem",
            "explain",
            str(config),
            "--gpu",
            "A100-80GB",
            "--format",
            "json",
        ],
        project,
    )
    assert seconds < 5, seconds
    out = json.loads(proc.stdout)
    assert BOMB_LINE in out["problems"], out["problems"]
    assert out["budget"] is None
    proc, seconds = run([LINT, str(config), "--gpu", "A100-80GB"], project)
    assert seconds < 5, seconds
    assert proc.returncode == 1
    assert BOMB_LINE in proc.stdout, proc.stdout


# -- launchers of megabytes -------------------------------------------------------------------


def launcher(size: int) -> str:
    """A torchrun launcher of about `size` characters, one flag a continuation line."""
    lines = ["#!/bin/bash", "torchrun --nproc_per_node 4 train.py \\"]
    written = sum(len(line) + 1 for line in lines)
    while written < size:
        lines.append(f"    --option_{len(lines)} value_{len(lines)} \\")
        written += len(lines[-1]) + 1
    lines.append("    --bf16")
    return "\n".join(lines) + "\n"


def test_a_launcher_of_megabytes_is_refused_in_seconds(project: Path) -> None:
    script = project / "launch.sh"
    script.write_text(launcher(2_400_000))
    size = script.stat().st_size / 1e6
    assert 2.0 < size < 4.0
    proc, seconds = run([LINT, str(script)], project)
    assert seconds < 10, seconds  # it ran past five minutes
    assert (
        f"file is {size:.1f} MB; llmmem reads shell scripts up to 1 MB "
        "(only `# llmmem:` comments were read)"
    ) in proc.stdout, proc.stdout
    assert proc.returncode == 1


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
def test_a_variable_doubled_forty_times_is_given_up_on(project: Path) -> None:
    script = project / "launch.sh"
    script.write_text("A=ab\n" + 'A="$A$A"\n' * 40 + 'torchrun train.py --run_name "$A" --bf16\n')
    proc, seconds = run(
        [sys.executable, "-m", "llmmem", "explain", str(script), "--format", "json"],
        project,
        memory_limit=1 << 30,
    )
    assert seconds < 5, seconds
    out = json.loads(proc.stdout)
    assert (
        "line 15, column 3: $A grows past 100000 characters or 10000 joined parts; read as "
        "known only when the script runs" in out["problems"]
    ), out["problems"]
    assert out["plan"]["precision"]["value"] == "bf16"  # the rest of the command is read

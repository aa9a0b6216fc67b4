"""A fault of the environment ends a command with one line and exit 2, never a traceback (exit
1 would read as findings in CI): long names, folders that change while walked, output encodings
that cannot show every character, a full disk on stdout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
QLORA = REPO / "examples" / "qlora_sft.py"


def command(
    name: str, *args: str, env: dict[str, str] | None = None, stdout: object = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / name), *args],
        stdout=stdout,  # type: ignore[arg-type]
        stderr=subprocess.PIPE,
        encoding=(env or {}).get("PYTHONIOENCODING", "utf-8"),
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def one_line_exit_2(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for word in words:
        assert word in proc.stderr


@pytest.mark.parametrize("suffix", [".py", "/", ""])
def test_a_name_too_long_for_the_file_system(tmp_path: Path, suffix: str) -> None:
    name = str(tmp_path / ("a" * 300)) + suffix
    one_line_exit_2(command("llmmem-lint", name), "File name too long")
    one_line_exit_2(command("llmmem", "explain", str(tmp_path / ("b" * 300))), "too long")


@pytest.mark.parametrize("encoding", ["ascii", "cp1252"])
def test_an_output_encoding_without_the_characters_llmmem_prints(
    tmp_path: Path, encoding: str
) -> None:
    shutil.copy(QLORA, tmp_path / "train.py")
    env = {"PYTHONIOENCODING": encoding}
    lint = command(
        "llmmem-lint", str(tmp_path / "train.py"), "--gpu", "RTX-4090", "--format", "full", env=env
    )
    assert lint.returncode == 1 and "Traceback" not in lint.stderr, lint.stderr
    assert "LLM001" in lint.stdout and "\\u2192" in lint.stdout  # "→" as an escape
    explain = command("llmmem", "explain", str(tmp_path / "train.py"), "--gpu", "RTX-4090", env=env)
    assert explain.returncode == 0 and "Traceback" not in explain.stderr, explain.stderr
    assert "RTX-4090" in explain.stdout


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_on_stdout(tmp_path: Path) -> None:
    shutil.copy(QLORA, tmp_path / "train.py")
    with open("/dev/full", "w") as full:
        for args in (
            ("llmmem-lint", str(tmp_path / "train.py"), "--gpu", "RTX-4090"),
            ("llmmem", "explain", str(tmp_path / "train.py")),
            ("llmmem", "gpus"),
        ):
            one_line_exit_2(command(*args, stdout=full), "No space left on device")


def test_a_folder_that_changes_while_it_is_linted(tmp_path: Path) -> None:
    """Checkpoint folders come and go under the run's output folder while CI lints the tree."""
    shutil.copy(QLORA, tmp_path / "train.py")
    for index in range(40):
        (tmp_path / f"unrelated-{index}").mkdir()
        (tmp_path / f"unrelated-{index}" / "notes.json").write_text("{}")
    stop = threading.Event()

    def rotate() -> None:
        step = 0
        while not stop.is_set():
            folder = tmp_path / f"checkpoint-{step}"
            folder.mkdir()
            (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
            old = tmp_path / f"checkpoint-{step - 2}"
            if old.exists():
                shutil.rmtree(old, ignore_errors=True)
            step += 1

    rotating = threading.Thread(target=rotate)
    rotating.start()
    try:
        for _ in range(4):
            proc = command("llmmem-lint", str(tmp_path), "--gpu", "RTX-4090")
            assert "Traceback" not in proc.stderr, proc.stderr
            assert proc.returncode == 1, proc.stderr  # train.py does not fit: LLM001
            assert "train.py" in proc.stdout and "LLM001" in proc.stdout
    finally:
        stop.set()
        rotating.join()


def test_a_calibration_file_that_is_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "calibration.jsonl"
    os.mkfifo(fifo)
    run = tmp_path / "all_results.json"
    run.write_text(
        '{"before_init_mem_gpu": 0, "init_mem_gpu_alloc_delta": 16000000000, '
        '"train_mem_gpu_alloc_delta": 0, "train_mem_gpu_peaked_delta": 4000000000}'
    )
    proc = command(
        "llmmem", "calibrate", "add", str(run), "--for", str(QLORA), "--gpu", "RTX-4090",
        "--calibration", str(fifo),
    )  # fmt: skip
    one_line_exit_2(proc, "named pipe")

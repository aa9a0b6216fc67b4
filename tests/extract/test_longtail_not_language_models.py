"""Files of the long tail that train no language model, or no single run, get no finding: a
DDP tutorial around a bare torch layer, a launch of diffusers' image trainer, a project YAML that
holds several runs for the scripts that pick one. Beside each, the file that does train one still
gets its estimate or its finding."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmmem.check import check_text
from llmmem.extract import ProjectSettings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "longtail"
LINT = Path(sys.executable).parent / "llmmem-lint"
QUIET = ["ddp_profile_loop.py", "sd_lora_launch.sh", "runs_side_by_side.yaml"]


def checked(tmp_path: Path, name: str, text: str | None = None):  # type: ignore[no-untyped-def]
    (tmp_path / ".git").mkdir(exist_ok=True)
    target = tmp_path / name
    if text is None:
        shutil.copy(FIXTURES / name, target)
    else:
        target.write_text(text)
    return check_text(
        target, target.read_text(), gpu="A100-80GB", hub=False, settings=ProjectSettings()
    )


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("ddp_profile_loop.py", "torch.nn.Linear(32, 1), a torch layer and not a language model"),
        ("sd_lora_launch.sh", "train_text_to_image_lora.py is diffusers' trainer of an image"),
        ("runs_side_by_side.yaml", "the file holds 2 runs (lora, dpo)"),
    ],
)
def test_no_language_model_or_no_single_run_gets_no_finding(
    tmp_path: Path, name: str, reason: str
) -> None:
    result = checked(tmp_path, name)
    assert [finding.code for finding in result.findings] == []
    assert result.analysis.budget is None
    assert any(reason in problem for problem in result.analysis.problems), result.analysis.problems


def test_the_installed_linter_is_silent_on_them(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    for name in QUIET:
        shutil.copy(FIXTURES / name, tmp_path / name)
    proc = subprocess.run(
        [str(LINT), "--gpu", "A100-80GB", "--fail-on", "info", *QUIET],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_a_loop_over_a_model_class_of_its_own_is_still_told_what_is_missing(
    tmp_path: Path,
) -> None:
    text = (FIXTURES / "ddp_profile_loop.py").read_text()
    text = text.replace("torch.nn.Linear(32, 1)", "TinyGPT(vocab_size=50304, n_layer=12)")
    result = checked(tmp_path, "train_gpt.py", text)
    assert "LLM010" in [finding.code for finding in result.findings]


def test_one_run_beside_an_evaluation_section_is_sized(tmp_path: Path) -> None:
    result = checked(tmp_path, "one_run_with_eval.yaml")
    assert result.analysis.budget is not None
    assert result.analysis.plan.per_device_train_batch_size.value == 4


def test_a_section_chosen_on_the_command_line_still_trains(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "runs_side_by_side.yaml", tmp_path / "config.yaml")
    launch = "python train.py --config config.yaml --model_name_or_path Qwen/Qwen2.5-0.5B\n"
    result = checked(tmp_path, "run.sh", launch)
    assert not any("runs (" in problem for problem in result.analysis.problems)

"""No finding where nothing is wrong: files that train nothing, and k-bit models the framework
prepares itself.

Each fixture is copied into a fresh folder (with a `.git` marker, so that no environment or lock
file of this repository decides a library's release) and linted as `llmmem-lint` lints it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmmem.check import check_text
from llmmem.extract import ProjectSettings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "noise"
LINT = Path(sys.executable).parent / "llmmem-lint"


def lint(tmp_path: Path, name: str, **files: str) -> tuple[list[str], list[str], object]:
    """(finding codes, finding messages, analysis) of one fixture, linted in its own folder;
    `files` are written beside it (a requirements.txt pinning a release)."""
    (tmp_path / ".git").mkdir(exist_ok=True)
    target = tmp_path / name
    shutil.copy(FIXTURES / name, target)
    for file_name, text in files.items():
        (tmp_path / file_name.replace("_", ".")).write_text(text)
    checked = check_text(
        target, target.read_text(), gpu="A100-80GB", hub=False, settings=ProjectSettings()
    )
    codes = [finding.code for finding in checked.findings]
    messages = [finding.message for finding in checked.findings]
    return codes, messages, checked.analysis


@pytest.mark.parametrize("name", ["ds_zero2_offload.json", "accelerate_zero3.yaml"])
def test_a_deepspeed_or_accelerate_config_alone_gets_no_finding(tmp_path: Path, name: str) -> None:
    codes, _, analysis = lint(tmp_path, name)
    assert codes == []
    assert analysis.plan.distributed.zero_stage.value in (2, 3)  # still read, for the hover


def test_the_config_alone_is_silent_in_the_installed_linter(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    for name in ("ds_zero2_offload.json", "accelerate_zero3.yaml"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    proc = subprocess.run(
        [str(LINT), "--gpu", "A100-80GB", "--fail-on", "info", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("lf_predict.yaml", "do_train: true"),
        ("lf_chat.yaml", "for chat, the API or export"),
        ("evaluate_adapter.py", "only evaluates: trainer.evaluate()"),
        ("trainer_factory.py", "a helper module"),
        ("quantize_copy.py", "loads a model to save_pretrained() it"),
    ],
)
def test_a_file_that_trains_nothing_gets_no_estimate_and_says_why(
    tmp_path: Path, name: str, reason: str
) -> None:
    codes, _, analysis = lint(tmp_path, name)
    assert codes == []
    assert analysis.budget is None
    said = [problem for problem in analysis.problems if problem.startswith("trains nothing")]
    assert said and reason in said[0], analysis.problems


def test_a_pragma_model_still_sizes_a_file_that_trains_nothing(tmp_path: Path) -> None:
    text = (FIXTURES / "evaluate_adapter.py").read_text()
    (tmp_path / ".git").mkdir()
    target = tmp_path / "evaluate_adapter.py"
    target.write_text("# llmmem: model=Qwen/Qwen2.5-7B-Instruct\n" + text)
    checked = check_text(target, target.read_text(), gpu="A100-80GB", hub=False)
    assert checked.analysis.budget is not None


def test_unsloth_prepares_its_own_kbit_model(tmp_path: Path) -> None:
    codes, _, analysis = lint(tmp_path, "unsloth_qlora.py")
    assert analysis.plan.quantization is not None and analysis.plan.lora is not None
    assert "LLM008" not in codes


def test_sft_trainer_of_a_release_that_prepares_gets_no_llm008(tmp_path: Path) -> None:
    codes, _, _ = lint(tmp_path, "sft_trainer_qlora.py", requirements_txt="trl==0.24.0\n")
    assert "LLM008" not in codes


def test_sft_trainer_of_a_release_that_does_not_prepare_is_told(tmp_path: Path) -> None:
    codes, messages, _ = lint(tmp_path, "sft_trainer_qlora.py", requirements_txt="trl==0.29.1\n")
    assert "LLM008" in codes
    message = messages[codes.index("LLM008")]
    assert "SFTTrainer prepared a k-bit model it is given up to 0.25, not from 0.26" in message


def test_orpo_trainer_prepares_at_every_release(tmp_path: Path) -> None:
    codes, _, _ = lint(tmp_path, "orpo_trainer_qlora.py")
    assert "LLM008" not in codes


@pytest.mark.parametrize(
    "fixture", ["configs/axolotl_qlora.yml", "configs/torchtune_qlora.yaml", "shell/lf_qlora.yaml"]
)
def test_a_framework_that_loads_the_model_prepares_it(tmp_path: Path, fixture: str) -> None:
    (tmp_path / ".git").mkdir()
    target = tmp_path / Path(fixture).name
    shutil.copy(FIXTURES.parent / fixture, target)
    checked = check_text(target, target.read_text(), gpu="A100-80GB", hub=False)
    assert checked.analysis.plan.quantization is not None
    assert "LLM008" not in [finding.code for finding in checked.findings]


# -- every training file is answered: an estimate, or LLM010 where the model goes -------------


def llm010(tmp_path: Path, name: str) -> tuple[object, str]:
    codes, _, analysis = lint(tmp_path, name)
    assert codes == ["LLM010"], codes
    target = tmp_path / name
    checked = check_text(target, target.read_text(), gpu="A100-80GB", hub=False)
    return checked.findings[0], target.read_text()


def test_a_launch_whose_script_is_elsewhere_is_told_where_the_model_goes(tmp_path: Path) -> None:
    finding, text = llm010(tmp_path, "launch_missing_script.sh")
    assert finding.range is not None and finding.range.start_line == 3  # the command's line
    assert "`accelerate train.py` trains, but names no model" in finding.message
    fix = finding.fixes[0]
    assert not fix.safe  # a placeholder to fill in: a code action, not `--fix`
    from llmmem.rules.text_edits import apply_edits

    fixed = apply_edits(text, fix.edits)
    assert fixed.splitlines()[3] == "# llmmem: model=org/name"
    # filled in, the pragma sizes the step
    target = tmp_path / "launch_missing_script.sh"
    target.write_text(fixed.replace("org/name", "Qwen/Qwen2.5-0.5B"))
    checked = check_text(target, target.read_text(), gpu="A100-80GB", hub=False)
    assert checked.analysis.budget is not None


def test_a_model_read_at_run_time_is_named_where_it_is_written(tmp_path: Path) -> None:
    finding, text = llm010(tmp_path, "model_from_environment.py")
    assert finding.range is not None and finding.range.start_line == 6
    assert 'the model is `os.environ["BASE_MODEL"]`' in finding.message
    from llmmem.rules.text_edits import apply_edits

    fixed = apply_edits(text, finding.fixes[0].edits)
    assert fixed.splitlines()[6] == "    # llmmem: model=org/name"  # indented as the line


def test_a_plain_script_not_named_like_training_gets_nothing(tmp_path: Path) -> None:
    codes, _, _ = lint(tmp_path, "run_eval_only.sh")
    assert codes == []


def test_the_fix_is_offered_by_the_installed_linter(tmp_path: Path) -> None:
    import json

    (tmp_path / ".git").mkdir()
    shutil.copy(FIXTURES / "launch_missing_script.sh", tmp_path / "launch.sh")
    proc = subprocess.run(
        [str(LINT), "--gpu", "A100-80GB", "--format", "json", str(tmp_path / "launch.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    inserted = [
        edit["new_text"]
        for edit in _values(json.loads(proc.stdout), "edits")
        if isinstance(edit, dict) and "new_text" in edit
    ]
    assert "# llmmem: model=org/name\n" in inserted, proc.stdout


def _values(document: object, key: str) -> list[object]:
    """Every item of every list under `key`, anywhere in a JSON document."""
    found: list[object] = []
    if isinstance(document, dict):
        for name, value in document.items():
            if name == key and isinstance(value, list):
                found.extend(value)
            else:
                found.extend(_values(value, key))
    elif isinstance(document, list):
        for value in document:
            found.extend(_values(value, key))
    return found

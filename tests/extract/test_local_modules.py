"""Values from the project's own modules: `from settings import *`, `import settings as cfg`,
a trainer built by a helper package with a relative import; and a star-imported name whose
module is not in the checkout is not read as its own text."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmmem.check import check_text
from llmmem.extract import extract_plan
from llmmem.plan import Provenance

PROJECT = Path(__file__).resolve().parents[1] / "fixtures" / "python" / "project"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    copy = tmp_path / "project"
    shutil.copytree(PROJECT, copy)
    (copy / ".git").mkdir()
    return copy


def test_a_star_import_of_a_project_module_gives_its_values(project: Path) -> None:
    plan = extract_plan(project / "train_star.py")
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-1.5B-Instruct"
    assert plan.per_device_train_batch_size.value == 4  # through SFTConfig(**SFT_ARGS)
    assert plan.gradient_accumulation_steps.value == 8
    assert plan.max_seq_length.value == 2048
    assert plan.lora is not None and (plan.lora.r.value, plan.lora.alpha.value) == (32, 64.0)
    # the value points at the module it is written in
    where = plan.model_id.range
    assert where is not None and where.path is not None and where.path.endswith("settings.py")
    assert where.start_line == 1
    assert plan.model_id.source is Provenance.EXPLICIT


def test_a_module_alias_and_a_helper_package_with_a_relative_import(project: Path) -> None:
    plan = extract_plan(project / "train_alias.py")
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-1.5B-Instruct"
    assert plan.per_device_train_batch_size.value == 4  # passed to the helper
    assert plan.gradient_accumulation_steps.value == 16  # `from .defaults import ACCUMULATION`
    assert plan.gradient_checkpointing.value is True
    where = plan.gradient_accumulation_steps.range
    assert where is not None and where.path is not None and where.path.endswith("defaults.py")


def test_a_name_from_a_module_not_in_the_checkout_is_not_its_own_text(project: Path) -> None:
    path = project / "train_missing_module.py"
    checked = check_text(path, path.read_text(), gpu="A100-80GB", hub=False)
    plan = checked.analysis.plan
    assert plan.model_id is None  # not the text "MODEL_NAME"
    assert plan.per_device_train_batch_size.source is Provenance.DEFAULT
    codes = [finding.code for finding in checked.findings]
    assert "LLM011" not in codes  # nothing was written wrong
    assert any("from `from experiment_constants import *`" in p for p in plan.problems)

"""A project's own config read by what its keys mean: sections at any depth (`model: {name:}`,
`training:`, `lora: {r:}`), project spellings (`lora_rank`), the objective a TRL recipe's keys
name, and flags handed to a script that is not there to read."""

from __future__ import annotations

import shutil
from pathlib import Path

from llmmem.extract import extract_plan
from llmmem.plan import Provenance

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"


def plan_of(tmp_path: Path, name: str):  # type: ignore[no-untyped-def]
    (tmp_path / ".git").mkdir(exist_ok=True)
    shutil.copy(CONFIGS / name, tmp_path / name)
    return extract_plan(tmp_path / name)


def test_sections_of_a_project_config_are_read_by_meaning(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "project_sections.yaml")
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-3B-Instruct"
    assert plan.model_id.note == "found at model.name"
    # generation.batch_size (64) and evaluation.batch_size (32) are not the training's
    assert plan.per_device_train_batch_size.value == 6
    assert plan.gradient_accumulation_steps.value == 4
    assert plan.max_seq_length.value == 1536
    assert plan.precision.value == "bf16-true"
    assert plan.lora is not None
    assert (plan.lora.r.value, plan.lora.alpha.value, plan.lora.dropout.value) == (32, 64.0, 0.1)
    assert plan.lora.r.range is not None and plan.lora.r.range.start_line == 10


def test_a_rank_the_project_names_trains_lora(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "project_arguments.json")
    assert plan.lora is not None and plan.lora.r.value == 64
    assert (plan.lora.r.source, plan.lora.alpha.value) == (Provenance.EXPLICIT, 16.0)
    assert not [p for p in plan.problems if "use_peft" in p]


def test_trl_semantics_stay_for_a_config_trl_parses(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    path = tmp_path / "sft.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nlora_r: 16\nper_device_train_batch_size: 2\n"
    )
    plan = extract_plan(path)
    assert plan.lora is None  # TRL's ModelConfig: no LoRA without use_peft
    assert any("use_peft is not" in p for p in plan.problems)


def test_a_recipe_names_its_objective_by_its_keys(tmp_path: Path) -> None:
    dpo = plan_of(tmp_path, "dpo_recipe.yaml")
    assert dpo.objective is not None and dpo.objective.value == "dpo"
    assert dpo.objective.range is not None and dpo.objective.range.start_line == 5
    grpo = plan_of(tmp_path, "grpo_recipe.yaml")
    assert grpo.objective is not None and grpo.objective.value == "grpo"
    assert grpo.max_seq_length.value == 256 + 768
    assert grpo.extra["use_vllm"].value is True


def test_flags_to_a_script_not_here_are_read_by_meaning(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    launcher = tmp_path / "run.sh"
    launcher.write_text(
        "python /cluster/recipes/finetune.py --model_name_or_path Qwen/Qwen2.5-0.5B \\\n"
        "    --use_lora --lora_r 8 --lora_alpha 16 --batch_size 4\n"
    )
    plan = extract_plan(launcher)
    assert plan.lora is not None and (plan.lora.r.value, plan.lora.alpha.value) == (8, 16.0)
    assert plan.per_device_train_batch_size.value == 4

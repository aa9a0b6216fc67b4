"""The training objective (DPO, ORPO, CPO/SimPO, KTO, reward, GRPO, PPO) read from TRL scripts,
axolotl `rl:` and LLaMA-Factory `stage:`/`pref_loss:`, with its provenance, and the budget that
follows from it (`llmmem explain` shows the method, the reference model and the phases)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmmem.budget.result import Component, Phase
from llmmem.extract import extract_plan
from llmmem.plan import Provenance, TrainingPlan
from llmmem.preference_plan import reference_row
from llmmem.scenario import analyze

DPO_LORA = """\
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")
tokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")
dataset = load_dataset("trl-lib/ultrafeedback_binarized", split="train")
args = DPOConfig(output_dir="out", per_device_train_batch_size=2, max_length=512{extra})
trainer = DPOTrainer(
    model=model,
    args=args,
    train_dataset=dataset,
    processing_class=tokenizer,
    peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
)
trainer.train()
"""

DPO_FULL_WITH_REFERENCE = """\
from transformers import AutoModelForCausalLM
from trl import DPOConfig, DPOTrainer

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")
ref_model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")
trainer = DPOTrainer(model, ref_model, args=DPOConfig(output_dir="o", max_length=512))
"""

TRAINER_ONLY = """\
from transformers import AutoModelForCausalLM
from trl import {config}, {trainer}

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")
trainer = {trainer}(model=model, args={config}(output_dir="o", max_length=256))
"""


def _plan(tmp_path: Path, name: str, text: str) -> TrainingPlan:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return extract_plan(path)


def test_a_dpo_script_with_lora_uses_the_adapter_as_its_reference(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "train_dpo.py", DPO_LORA.format(extra=""))
    assert plan.objective is not None
    assert plan.objective.value == "dpo"
    assert plan.objective.source is Provenance.EXPLICIT
    assert plan.objective.range is not None
    analysis = analyze(plan)
    assert analysis.budget is not None, analysis.problems
    phases = {p.phase for p in analysis.budget.phases}
    assert Phase.REFERENCE_FORWARD in phases
    assert all(Component.REFERENCE_MODEL not in p.components for p in analysis.budget.phases)
    row = reference_row(plan, analysis.setup.method if analysis.setup else None)
    assert row is not None and row.value.startswith("adapter")


def test_precomputed_reference_log_probs_leave_no_reference_forward(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "train_dpo.py", DPO_LORA.format(extra=", precompute_ref_log_probs=True"))
    analysis = analyze(plan)
    assert analysis.budget is not None, analysis.problems
    assert all(p.phase is not Phase.REFERENCE_FORWARD for p in analysis.budget.phases)


def test_a_reference_model_the_script_builds_is_a_copy(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "dpo_full.py", DPO_FULL_WITH_REFERENCE)
    analysis = analyze(plan)
    assert analysis.budget is not None, analysis.problems
    peak = analysis.budget.peak.components
    assert peak[Component.REFERENCE_MODEL].bytes > 0
    row = reference_row(plan, analysis.setup.method if analysis.setup else None)
    assert row is not None and row.value.startswith("copy")
    assert row.source is Provenance.EXPLICIT


@pytest.mark.parametrize(
    ("config", "trainer", "objective"),
    [
        ("ORPOConfig", "ORPOTrainer", "orpo"),
        ("CPOConfig", "CPOTrainer", "cpo"),
        ("KTOConfig", "KTOTrainer", "kto"),
        ("RewardConfig", "RewardTrainer", "reward"),
    ],
)
def test_trl_config_classes_name_the_objective(
    tmp_path: Path, config: str, trainer: str, objective: str
) -> None:
    plan = _plan(tmp_path, "train.py", TRAINER_ONLY.format(config=config, trainer=trainer))
    assert plan.objective is not None and plan.objective.value == objective
    analysis = analyze(plan)
    assert analysis.budget is not None, analysis.problems


def test_grpo_is_read_and_sized_with_generation(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path, "grpo.py", TRAINER_ONLY.format(config="GRPOConfig", trainer="GRPOTrainer")
    )
    assert plan.objective is not None and plan.objective.value == "grpo"
    analysis = analyze(plan)
    assert analysis.budget is not None, analysis.problems
    assert any(p.phase is Phase.GENERATE for p in analysis.budget.phases)


def test_ppo_is_read_and_said_to_be_unmodelled(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "ppo.py", TRAINER_ONLY.format(config="PPOConfig", trainer="PPOTrainer"))
    assert plan.objective is not None and plan.objective.value == "ppo"
    analysis = analyze(plan)
    assert analysis.budget is None
    assert any("PPO" in problem and "not modelled" in problem for problem in analysis.problems)


def test_sft_scripts_have_no_objective(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "sft.py", TRAINER_ONLY.format(config="SFTConfig", trainer="SFTTrainer"))
    assert plan.objective is None


AXOLOTL = """\
base_model: Qwen/Qwen2.5-0.5B-Instruct
rl: {rl}
sequence_len: 1024
micro_batch_size: 2
gradient_accumulation_steps: 4
bf16: true
"""


@pytest.mark.parametrize(
    ("rl", "objective"), [("dpo", "dpo"), ("ipo", "dpo"), ("simpo", "cpo"), ("kto", "kto")]
)
def test_axolotl_rl(tmp_path: Path, rl: str, objective: str) -> None:
    plan = _plan(tmp_path, "dpo.yaml", AXOLOTL.format(rl=rl))
    assert plan.framework == "axolotl"
    assert plan.objective is not None and plan.objective.value == objective
    assert plan.objective.source is Provenance.EXPLICIT
    assert plan.objective.range is not None and plan.objective.range.start_line == 1


LLAMAFACTORY = """\
model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
stage: {stage}
do_train: true
finetuning_type: lora
lora_target: all
{more}cutoff_len: 1024
per_device_train_batch_size: 2
bf16: true
"""


@pytest.mark.parametrize(
    ("stage", "more", "objective"),
    [
        ("dpo", "pref_beta: 0.1\npref_loss: sigmoid\n", "dpo"),
        ("dpo", "pref_loss: orpo\n", "orpo"),
        ("dpo", "pref_loss: simpo\n", "cpo"),
        ("kto", "", "kto"),
        ("rm", "", "reward"),
    ],
)
def test_llamafactory_stage(tmp_path: Path, stage: str, more: str, objective: str) -> None:
    plan = _plan(tmp_path, "llamafactory.yaml", LLAMAFACTORY.format(stage=stage, more=more))
    assert plan.framework == "llamafactory"
    assert plan.objective is not None and plan.objective.value == objective
    analysis = analyze(plan)
    assert analysis.budget is not None, analysis.problems


def test_llamafactory_sft_has_no_objective(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "llamafactory.yaml", LLAMAFACTORY.format(stage="sft", more=""))
    assert plan.objective is None


def test_a_trl_1_environment_is_told_the_logits_are_an_upper_bound(tmp_path: Path) -> None:
    from llmmem.preference_plan import trl_release_note
    from llmmem.versions import FoundVersion

    def found(version: str) -> FoundVersion:
        return FoundVersion(
            library="trl", version=version, source="requirements.txt", kind="workspace"
        )

    assert trl_release_note({}) is None
    assert trl_release_note({"trl": found("0.29.1")}) is None
    note = trl_release_note({"trl": found("1.16.0")})
    assert note is not None and "upper bound" in note


def test_the_fit_search_sizes_the_preference_step(tmp_path: Path) -> None:
    from llmmem.rules.make_fit import _evaluate

    plan = _plan(tmp_path, "dpo.yaml", AXOLOTL.format(rl="dpo"))
    analysis = analyze(plan, gpu="A100-80GB")
    assert analysis.budget is not None, analysis.problems
    unchanged = _evaluate(analysis, (), 0)
    assert unchanged is not None
    assert unchanged.device_bytes == analysis.budget.device_total_bytes

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


def test_ppo_is_read_and_sized_with_its_generation(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "ppo.py", TRAINER_ONLY.format(config="PPOConfig", trainer="PPOTrainer"))
    assert plan.objective is not None and plan.objective.value == "ppo"
    analysis = analyze(plan)
    assert analysis.budget is not None, analysis.problems
    assert analysis.budget.phases[0].phase is Phase.GENERATE


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


# a GRPO script written the way TRL's GRPO documentation writes one (vLLM in colocate mode)
GRPO_VLLM = """\
from datasets import load_dataset
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

dataset = load_dataset("trl-lib/tldr", split="train")


def reward_unique_letters(completions, **kwargs):
    return [float(len(set(completion))) for completion in completions]


training_args = GRPOConfig(
    output_dir="Qwen2.5-0.5B-GRPO",
    per_device_train_batch_size=8,
    num_generations=8,{fields}
    use_vllm=True,
    vllm_mode="{mode}",
    vllm_gpu_memory_utilization=0.3,
)
trainer = GRPOTrainer(
    model="Qwen/Qwen2.5-0.5B-Instruct",
    reward_funcs=reward_unique_letters,
    args=training_args,
    train_dataset=dataset,{peft}
)
trainer.train()
"""
LORA_KEYWORD = '\n    peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"),'


def _grpo_explained(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    *,
    fields: str = "",
    mode: str = "colocate",
    peft: str = "",
) -> dict:
    from llmmem.cli import main

    path = tmp_path / "grpo.py"
    path.write_text(GRPO_VLLM.format(fields=fields, mode=mode, peft=peft), encoding="utf-8")
    code = main(["explain", str(path), "--format", "json", "--gpu", "A100-80GB"])
    out = capsys.readouterr().out
    assert code == 0, out
    import json

    return json.loads(out)


def test_grpo_config_fields_are_kept_with_their_provenance(tmp_path: Path) -> None:
    fields = "\n    beta=0.04,\n    steps_per_generation=4,\n    vllm_enable_sleep_mode=True,"
    plan = _plan(tmp_path, "grpo.py", GRPO_VLLM.format(fields=fields, mode="colocate", peft=""))
    extra = plan.extra
    for key, value in (
        ("num_generations", 8),
        ("beta", 0.04),
        ("use_vllm", True),
        ("vllm_mode", "colocate"),
        ("vllm_gpu_memory_utilization", 0.3),
        ("vllm_enable_sleep_mode", True),
        ("steps_per_generation", 4),
    ):
        assert extra[key].value == value, key
        assert extra[key].source is Provenance.EXPLICIT, key
        assert extra[key].range is not None, key
    # the fields the script leaves out carry TRL 0.29.1's defaults, said to be defaults
    assert extra["num_iterations"].value == 1
    assert extra["num_iterations"].source is Provenance.DEFAULT
    assert "TRL 0.29.1" in extra["num_iterations"].note
    assert plan.gradient_accumulation_steps.source is Provenance.DEFAULT
    assert plan.per_device_train_batch_size.value == 8


def test_grpo_defaults_are_named_when_the_script_leaves_them_out(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path, "grpo.py", TRAINER_ONLY.format(config="GRPOConfig", trainer="GRPOTrainer")
    )
    for key, value in (("num_generations", 8), ("beta", 0.0), ("use_vllm", False)):
        assert plan.extra[key].value == value
        assert plan.extra[key].source is Provenance.DEFAULT
        assert "TRL 0.29.1" in plan.extra[key].note
    assert plan.extra["steps_per_generation"].value is None
    assert "gradient_accumulation_steps" in plan.extra["steps_per_generation"].note
    analysis = analyze(plan)
    assert analysis.budget is not None, analysis.problems
    # every default is carried by the plan: nothing left to say it was assumed
    assert not any("not read from the file" in note for note in analysis.budget.notes)
    reference = reference_row(plan, analysis.setup.method)
    assert reference is not None and reference.source is Provenance.DEFAULT
    assert reference.value.startswith("none")


def test_grpo_vllm_colocate_script_is_explained_with_generation_and_the_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _grpo_explained(tmp_path, capsys)
    assert out["problems"] == []
    budget = out["budget"]
    assert "generate" in budget["phases"]
    assert "colocated vLLM engine" in budget["phases"]["generate"]["moment"]
    capacity = budget["gpu"]["capacity_bytes"]
    engine = budget["components"]["vllm_engine"]
    assert engine == pytest.approx(0.3 * capacity, rel=1e-6)
    # the engine stays through the step without sleep mode: in every phase
    for phase in budget["phases"].values():
        assert phase["components"]["vllm_engine"] == engine
    # beta left at TRL's 0.0: no reference model anywhere
    assert any("beta = 0" in note and "no reference" in note for note in budget["notes"])
    assert "reference_model" not in budget["components"]
    assert not any("not read from the file" in note for note in budget["notes"])


def test_grpo_beta_with_lora_disables_the_adapter_and_full_keeps_a_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adapter = _grpo_explained(tmp_path, capsys, fields="\n    beta=0.04,", peft=LORA_KEYWORD)
    notes = adapter["budget"]["notes"]
    assert any("0.04" in note and "adapter disabled" in note for note in notes)
    assert "adapter disabled" in adapter["budget"]["phases"]["reference_forward"]["moment"]
    assert "reference_model" not in adapter["budget"]["components"]

    full = _grpo_explained(tmp_path, capsys, fields="\n    beta=0.04,")
    assert any("0.04" in note and "copy" in note for note in full["budget"]["notes"])
    copy = full["budget"]["components"]["reference_model"]
    weights = full["budget"]["components"]["weights"]
    assert copy == weights  # a second model of the policy's size
    assert full["budget"]["allocated_peak_bytes"] > adapter["budget"]["allocated_peak_bytes"]


def test_grpo_sleep_mode_and_server_mode_change_what_the_training_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    colocate = _grpo_explained(tmp_path, capsys)
    sleeping = _grpo_explained(tmp_path, capsys, fields="\n    vllm_enable_sleep_mode=True,")
    assert "vllm_engine" in sleeping["budget"]["phases"]["generate"]["components"]
    assert "vllm_engine" not in sleeping["budget"]["phases"]["backward"]["components"]
    server = _grpo_explained(tmp_path, capsys, mode="server")
    assert "vllm_engine" not in server["budget"]["components"]
    assert any("another GPU" in note for note in server["budget"]["notes"])
    peaks = [out["budget"]["allocated_peak_bytes"] for out in (colocate, sleeping, server)]
    assert peaks[0] > peaks[1] >= peaks[2]


def test_a_grpo_value_trl_refuses_is_a_problem_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _grpo_explained(tmp_path, capsys, mode="remote")
    assert out["budget"] is None
    assert any("vllm_mode" in problem for problem in out["problems"])


def test_a_grpo_field_of_the_wrong_kind_is_named_and_its_default_kept(tmp_path: Path) -> None:
    script = """\
import os
from trl import GRPOConfig, GRPOTrainer

args = GRPOConfig(
    output_dir="o",
    num_generations=int(os.environ["NGEN"]),
    beta="high",
    use_vllm="yes please",
)
GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=len, args=args).train()
"""
    plan = _plan(tmp_path, "grpo.py", script)
    problems = "\\n".join(plan.problems)
    assert "line 6: GRPOConfig.num_generations: could not read" in problems
    assert "line 7: GRPOConfig.beta: 'high' is not a number" in problems
    assert "line 8: GRPOConfig.use_vllm: 'yes please' is not True or False" in problems
    assert plan.extra["beta"].source is Provenance.DEFAULT
    assert plan.extra["use_vllm"].value is False
    analysis = analyze(plan)
    assert analysis.budget is not None  # sized with TRL's defaults, the problems listed
    held = {c for phase in analysis.budget.phases for c in phase.components}
    assert Component.VLLM_ENGINE not in held


def test_a_verl_grpo_reference_is_decided_by_use_kl_loss(tmp_path: Path) -> None:
    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "configs" / "verl_grpo.yaml"
    with_kl = extract_plan(fixture)  # use_kl_loss: true, the reference offloaded by verl
    analysis = analyze(with_kl)
    row = reference_row(with_kl, analysis.setup.method)
    assert row is not None and row.source is Provenance.EXPLICIT
    assert "use_kl_loss: true" in row.note and "CPU" in row.value
    assert row.range is not None and row.range.start_line + 1 == 21  # use_kl_loss: true
    text = fixture.read_text(encoding="utf-8").replace("use_kl_loss: true", "use_kl_loss: false")
    without = _plan(tmp_path, "verl_grpo.yaml", text)
    row = reference_row(without, analyze(without).setup.method)
    assert row is not None and row.value.startswith("none") and "false" in row.note


ONLINE_DPO = """from transformers import AutoModelForCausalLM
from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")
args = OnlineDPOConfig(output_dir="out")
trainer = OnlineDPOTrainer(model=model, judge=None, args=args, train_dataset=None)
trainer.train()
"""


@pytest.mark.parametrize(
    ("name", "text", "objective"),
    [
        ("train.py", ONLINE_DPO, "online_dpo"),
        (
            "train.yml",
            "base_model: Qwen/Qwen2.5-0.5B-Instruct\nrl: nash_md\nsequence_len: 512\n"
            "micro_batch_size: 1\noutput_dir: out\n",
            "nash_md",
        ),
    ],
)
def test_an_objective_llmmem_does_not_size_is_said_not_sized_as_sft(
    tmp_path: Path, name: str, text: str, objective: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    analysis = analyze(extract_plan(path))
    assert str(analysis.plan.objective.value) == objective
    said = [p for p in analysis.problems if "does not size yet" in p]
    assert said and objective in said[0]
    assert analysis.budget is not None  # the supervised step, said to be that

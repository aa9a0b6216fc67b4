"""ms-swift launchers (`swift sft`, `swift rlhf`, `swift pt`): swift's own flag names and the
defaults of ms-swift 4.6.0's argument dataclasses."""

from __future__ import annotations

import shutil
from pathlib import Path

from llmmem.check import check_text
from llmmem.extract import extract_plan
from llmmem.plan import Provenance

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "shell"


def plan_of(tmp_path: Path, name: str):  # type: ignore[no-untyped-def]
    (tmp_path / ".git").mkdir(exist_ok=True)
    target = tmp_path / name
    shutil.copy(FIXTURES / name, target)
    return extract_plan(target)


def test_swift_sft_reads_swift_flags_and_defaults(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "swift_sft_lora.sh")
    assert plan.framework == "swift"
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-7B-Instruct"
    assert plan.per_device_train_batch_size.value == 2
    assert plan.max_seq_length.value == 4096
    assert plan.lora is not None
    assert (plan.lora.r.value, plan.lora.r.source) == (16, Provenance.EXPLICIT)
    # swift's defaults where the line is silent
    assert (plan.lora.alpha.value, plan.lora.alpha.source) == (32.0, Provenance.DEFAULT)
    assert plan.lora.target_modules.value == ["all-linear"]
    assert plan.gradient_checkpointing.value is True
    # accumulation: ceil(16 / batch 2 / 2 processes)
    assert plan.gradient_accumulation_steps.value == 4
    assert plan.distributed.world_size.value == 2
    # torch_dtype bfloat16: swift turns bf16 mixed precision on
    assert plan.precision.value.startswith("bf16")
    # swift's bundled zero2_offload.json: ZeRO-2 with the optimizer on the CPU
    assert plan.distributed.zero_stage.value == 2
    assert plan.distributed.offload_optimizer.value is True
    # two datasets after one flag are data, not a config to read
    assert not [problem for problem in plan.problems if "not found" in problem]


def test_swift_rlhf_trains_dpo_unless_told_otherwise(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "swift_rlhf_dpo.sh")
    assert plan.objective is not None and plan.objective.value == "dpo"
    assert plan.quantization is not None and plan.quantization.bits.value == 4
    assert plan.quantization.quant_type.value == "nf4"
    assert plan.distributed.world_size.value == 1  # one GPU visible, one process
    assert plan.precision.value.startswith("fp16")


def test_swift_pt_is_full_pretraining_sized_as_the_supervised_step(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "swift_pt_full.sh")
    assert plan.lora is None
    assert plan.objective is not None and plan.objective.value == "pretrain"
    assert plan.attn_implementation.value == "flash_attention_2"
    checked = check_text(
        tmp_path / "swift_pt_full.sh",
        (tmp_path / "swift_pt_full.sh").read_text(),
        gpu="A100-80GB",
        hub=False,
    )
    assert checked.analysis.budget is not None
    assert not [p for p in checked.analysis.problems if "does not size yet" in p]


def test_several_visible_gpus_without_nproc_is_one_process_and_said(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    script = tmp_path / "run.sh"
    script.write_text(
        "CUDA_VISIBLE_DEVICES=0,3 swift sft --model Qwen/Qwen2.5-7B-Instruct --lora_rank 32\n"
    )
    plan = extract_plan(script)
    assert plan.distributed.world_size.value == 1
    assert any("spreads the model over the 2 visible GPUs" in p for p in plan.problems)
    assert plan.lora is not None and plan.lora.r.value == 32

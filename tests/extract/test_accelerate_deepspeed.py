"""accelerate's DeepSpeed block as accelerate reads it, and a DeepSpeed file named for having no
offload."""

from __future__ import annotations

from pathlib import Path

from llmmem.extract import extract_plan
from llmmem.plan import Provenance

NESTED = """compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
num_processes: 4
deepspeed_config:
  zero_optimization:
    stage: 3
    offload_optimizer:
      device: cpu
  bf16:
    enabled: true
"""


def test_a_deepspeed_dict_inside_the_block_is_not_what_accelerate_reads(tmp_path: Path) -> None:
    path = tmp_path / "accelerate.yaml"
    path.write_text(NESTED)
    plan = extract_plan(path)
    # accelerate takes only its flat keys: no zero_stage among them, its plugin's default 2
    assert plan.distributed.zero_stage.value == 2
    assert plan.distributed.zero_stage.source is Provenance.DEFAULT
    assert plan.distributed.offload_optimizer.value is False
    assert any("ignores these" in problem for problem in plan.problems)


def test_a_flat_zero_stage_is_read(tmp_path: Path) -> None:
    path = tmp_path / "accelerate.yaml"
    path.write_text(NESTED.split("deepspeed_config:")[0] + "deepspeed_config:\n  zero_stage: 3\n")
    plan = extract_plan(path)
    assert plan.distributed.zero_stage.value == 3
    assert plan.distributed.zero_stage.source is Provenance.EXPLICIT


def test_a_file_named_no_offload_is_not_offloaded(tmp_path: Path) -> None:
    path = tmp_path / "axolotl.yml"
    path.write_text(
        "base_model: Qwen/Qwen2.5-0.5B\nmicro_batch_size: 2\nsequence_len: 1024\n"
        "deepspeed: deepspeed_configs/zero2_no_offload.json\n"
    )
    plan = extract_plan(path)
    assert plan.distributed.zero_stage.value == 2
    assert plan.distributed.offload_optimizer.value is False

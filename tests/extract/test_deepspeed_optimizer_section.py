"""A DeepSpeed config's `optimizer` section and `sub_group_size`, read as DeepSpeed 0.19.8 runs
them, through `llmmem explain` as a user runs it.

- `"optimizer": {"type": "AdamW"}` is DeepSpeed's FusedAdam on a GPU (runtime/engine.py
  `get_optimizer_configuration`, :2377-2409), DeepSpeedCPUAdam where the optimizer is offloaded,
  torch's AdamW with `torch_adam: true`; the HF trainer's own `optim` is then not used
  (transformers' `deepspeed_optim_sched` hands DeepSpeed a placeholder). Read before as torch's
  foreach AdamW, whose `_foreach_sqrt` over ZeRO-3's sub-group is a temporary FusedAdam never
  makes.
- `zero_optimization.sub_group_size` (1e9 by default, runtime/zero/config.py:182) sizes the
  sub-group ZeRO-3 flattens and copies to fp32 one at a time: 1e8 makes the step's temporaries
  about a tenth. Read before as 1e9 whatever the file said.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

GiB = 2**30

TRAINER = """# llmmem: world_size=4
base_model: meta-llama/Meta-Llama-3-8B
micro_batch_size: 1
sequence_len: 512
gradient_checkpointing: true
bf16: true
optimizer: adamw_torch
deepspeed: ds.json
"""


def explain(folder: Path, deepspeed: dict[str, Any]) -> dict[str, Any]:
    (folder / "ds.json").write_text(json.dumps(deepspeed))
    (folder / "train.yml").write_text(TRAINER)
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", "--format", "json", str(folder / "train.yml")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def zero3(**extra: Any) -> dict[str, Any]:
    section: dict[str, Any] = {"stage": 3, **extra.pop("zero", {})}
    return {"zero_optimization": section, "bf16": {"enabled": "auto"}, **extra}


def step_temporaries(report: dict[str, Any]) -> int:
    return int(report["budget"]["phases"]["optimizer_step"]["components"]["temporaries"])


@pytest.mark.parametrize(
    ("optimizer", "zero", "expected", "said"),
    [
        ({"type": "AdamW"}, {}, "deepspeed_fused_adam", "FusedAdam"),
        ({"type": "Adam"}, {}, "deepspeed_fused_adam", "FusedAdam"),
        (
            {"type": "AdamW"},
            {"offload_optimizer": {"device": "cpu"}},
            "deepspeed_cpu_adam",
            "DeepSpeedCPUAdam",
        ),
        ({"type": "AdamW", "params": {"torch_adam": True}}, {}, "adamw_torch", "torch's AdamW"),
        ({"type": "Lion"}, {}, "deepspeed_fused_lion", "FusedLion"),
    ],
)
def test_the_optimizer_section_is_what_deepspeed_builds(
    tmp_path: Path, optimizer: dict[str, Any], zero: dict[str, Any], expected: str, said: str
) -> None:
    report = explain(tmp_path, zero3(optimizer=optimizer, zero=zero))
    optim = report["plan"]["optim"]
    assert optim["value"] == expected
    assert optim["range"]["path"].endswith("ds.json")
    assert said in optim["note"]
    assert "the trainer's optim 'adamw_torch' is not used" in optim["note"]


def test_fused_adam_steps_zero3_without_the_foreach_buffer(tmp_path: Path) -> None:
    trainer_side = explain(tmp_path, zero3())
    fused = explain(tmp_path, zero3(optimizer={"type": "AdamW"}))
    assert trainer_side["plan"]["optim"]["value"] == "adamw_torch"
    # the largest sub-group (about 1e9 elements of the 2e9 partition): 4 B fp32 gradient + 4 B
    # foreach sqrt under torch's AdamW, (2 + 4) B while it is prepared under FusedAdam
    difference = step_temporaries(trainer_side) - step_temporaries(fused)
    assert 1.5 * GiB < difference < 2.5 * GiB
    assert "FusedAdam" in fused["budget"]["formulas"]["optimizer_states"]


def test_sub_group_size_sizes_the_zero3_step(tmp_path: Path) -> None:
    default = explain(tmp_path, zero3(optimizer={"type": "AdamW"}))
    smaller = explain(tmp_path, zero3(optimizer={"type": "AdamW"}, zero={"sub_group_size": 1e8}))
    # (2 + 4) B × the largest sub-group: about 1e9 elements, then about 1e8 (the norm's fp64
    # copy of the embeddings' partition, 8 B × 1.3e8, is then the larger moment)
    assert step_temporaries(default) - step_temporaries(smaller) > 4.5 * GiB
    assert (
        smaller["budget"]["phases"]["optimizer_step"]["allocated_bytes"]
        < (default["budget"]["phases"]["optimizer_step"]["allocated_bytes"])
    )


def test_a_sub_group_size_that_is_not_a_number_is_said(tmp_path: Path) -> None:
    report = explain(tmp_path, zero3(zero={"sub_group_size": "large"}))
    assert any("sub_group_size" in problem for problem in report["problems"]), report["problems"]

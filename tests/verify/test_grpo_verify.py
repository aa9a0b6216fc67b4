"""`llmmem verify` on a GRPO script: the step runs for real on the CPU, generation included.

The script is written the way TRL's documentation writes one (a reward function, GRPOConfig,
GRPOTrainer given a model path); the model is a tiny Llama saved as a local folder, so
nothing comes from the hub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmmem.verify.preference_grid import SMALL

# the preference grid's tiny Llama, saved as a local model folder
CONFIG = {**SMALL["llama"], "torch_dtype": "float32"}

SCRIPT = """\
from trl import GRPOConfig, GRPOTrainer


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


args = GRPOConfig(output_dir="out", per_device_train_batch_size=4, num_generations=2,
                  max_prompt_length=16, max_completion_length=32, beta={beta}, bf16=False{extra})
GRPOTrainer(model="./tiny", reward_funcs=reward_len, args=args, train_dataset=None).train()
"""


def _project(tmp_path: Path, beta: float = 0.04, extra: str = "") -> Path:
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(CONFIG), encoding="utf-8")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(beta=beta, extra=extra), encoding="utf-8")
    return script


def _verify(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmmem", "verify", script.name, "--offline", *args],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_a_grpo_script_is_verified_on_the_cpu_phase_by_phase(tmp_path: Path, beta: float) -> None:
    done = _verify(_project(tmp_path, beta), "--device", "cpu", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    phases = {row["what"]: row for row in report["comparison"] if row["what"].endswith(" peak")}
    expected = {"generate peak", "forward peak", "backward peak", "optimizer step peak"}
    if beta:
        expected.add("reference forward peak")
    assert expected <= set(phases)
    for name in expected:
        assert abs(phases[name]["error"]) <= 0.05, (name, phases[name])


def test_a_simulated_grpo_step_is_refused_with_the_way_to_verify_it(tmp_path: Path) -> None:
    done = _verify(_project(tmp_path), "--simulate")
    assert done.returncode != 0
    assert "--device cpu" in done.stderr and "Traceback" not in done.stderr


def test_a_grpo_plan_that_generates_with_vllm_says_why_it_is_not_run(tmp_path: Path) -> None:
    done = _verify(
        _project(tmp_path, extra=', use_vllm=True, vllm_mode="colocate"'), "--device", "cpu"
    )
    assert done.returncode != 0
    assert "vLLM" in done.stderr and "Traceback" not in done.stderr

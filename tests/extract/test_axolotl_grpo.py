"""axolotl `rl: grpo`: the `trl:` block's GRPO settings reach the GRPO budget.

The fixture is written the way axolotl's docs write a GRPO config (`rl: grpo`, a `trl:` block
with the generation settings, vLLM colocated in the trainer with the `vllm:` block's share of
the GPU). `llmmem explain` on it must show the generation phase, the vLLM engine's share in
every phase, the reference copy that `beta` above 0 loads, and the number of completions per
prompt the file asks for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmmem.cli import main
from llmmem.extract.configs import extract_config_plan

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "axolotl_grpo.yaml"
GIB = 2**30


def explain(capsys: pytest.CaptureFixture[str], path: Path, *options: str) -> str:
    code = main(["explain", str(path), "--gpu", "80GiB", *options])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def test_the_trl_block_is_read_under_trls_names() -> None:
    plan = extract_config_plan(FIXTURE)
    assert plan.problems == []
    assert plan.objective is not None and plan.objective.value == "grpo"
    kept = {name: plan.extra[name].value for name in plan.extra}
    assert kept["num_generations"] == 8
    assert kept["max_completion_length"] == 512
    assert kept["beta"] == 0.001
    assert kept["use_vllm"] is True
    assert kept["vllm_mode"] == "colocate"
    assert kept["vllm_gpu_memory_utilization"] == 0.35
    # each value points at its line in the file
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    where = plan.extra["num_generations"].range
    assert lines[where.start_line].strip() == "num_generations: 8"  # 0-based lines


def test_explain_shows_the_generation_phase_and_the_vllm_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = json.loads(explain(capsys, FIXTURE, "--format", "json"))
    assert out["problems"] == [] and out["plan"]["problems"] == []
    phases = out["budget"]["phases"]
    assert "generate" in phases
    share = int(0.35 * 80 * GIB)  # the vllm: block's gpu_memory_utilization of an 80 GiB GPU
    for phase in phases.values():
        assert phase["components"]["vllm_engine"] == share
    # beta 0.001 above 0: TRL loads a frozen copy for the KL term (full fine-tuning)
    assert phases["generate"]["components"]["reference_model"] > 0

    text = explain(capsys, FIXTURE)
    assert "grpo" in text and "generate" in text and "vllm_engine" in text
    assert "0.35" in text


def test_a_vllm_server_holds_nothing_on_the_training_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = FIXTURE.read_text(encoding="utf-8").replace(
        "  vllm_mode: colocate\n", "  vllm_server_host: 0.0.0.0\n  vllm_server_port: 8000\n"
    )
    path = tmp_path / "grpo_server.yaml"
    path.write_text(text, encoding="utf-8")
    plan = extract_config_plan(path)
    assert plan.extra["vllm_mode"].value == "server"
    out = json.loads(explain(capsys, path, "--format", "json"))
    phases = out["budget"]["phases"]
    assert "generate" in phases
    assert all("vllm_engine" not in phase["components"] for phase in phases.values())


def test_generation_without_vllm_and_a_bad_trl_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = FIXTURE.read_text(encoding="utf-8")
    path = tmp_path / "grpo_generate.yaml"
    path.write_text(text.replace("use_vllm: true", "use_vllm: false"), encoding="utf-8")
    out = json.loads(explain(capsys, path, "--format", "json"))
    phases = out["budget"]["phases"]
    assert "generate" in phases
    assert all("vllm_engine" not in phase["components"] for phase in phases.values())

    path.write_text("base_model: Qwen/Qwen2.5-1.5B-Instruct\nrl: grpo\ntrl: 8\n", encoding="utf-8")
    plan = extract_config_plan(path)
    assert any("trl:" in problem for problem in plan.problems)

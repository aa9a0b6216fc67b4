"""OpenRLHF's preference and RL launch lines, budgeted as OpenRLHF loads its models (read in
openrlhf 0.11.0: cli/train_dpo.py, trainer/ray/launcher.py `ReferenceModelActor`,
utils/deepspeed/deepspeed.py `get_ds_eval_config`, cli/train_ppo_ray.py's checks).

The launch lines are written as OpenRLHF's README and examples write them: the flat flags of
0.10.1 and before (`--pretrain`, `--zero_stage`) and the dotted ones of 0.10.2 on
(`--actor.model_name_or_path`, `--ds.zero_stage`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from llmmem.cli import main
from llmmem.models.resolve import resolve_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "shell"
DPO = FIXTURES / "openrlhf_dpo.sh"
GRPO = FIXTURES / "openrlhf_grpo_ray.sh"
GIB = 2**30


def _explain(capsys: pytest.CaptureFixture[str], path: Path) -> dict:
    code = main(["explain", str(path), "--gpu", "80GiB", "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def _run(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.sh"
    path.write_text(text, encoding="utf-8")
    return path


def _params(model: str) -> int:
    return resolve_model(model, hub=False).total_params


def _reference_bytes(out: dict) -> int:
    phases = out["budget"]["phases"]
    held = [p["components"].get("reference_model", 0) for p in phases.values()]
    return max(held)


def _row(path: Path, method: str = "full") -> dict:
    """The reference row `llmmem explain` shows for the file."""
    from llmmem.extract.shell import extract_shell_plan
    from llmmem.preference_plan import reference_row

    row = reference_row(extract_shell_plan(path), method)
    assert row is not None
    return {"value": row.value, "source": row.source.value, "note": row.note or ""}


# -- (a) DPO's reference: --param_dtype (2 bytes), partitioned under ZeRO-3


def test_dpo_reference_is_bf16_and_partitioned_under_zero3(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _explain(capsys, DPO)  # 8 GPUs, --zero_stage 3, --param_dtype bf16
    params = _params("meta-llama/Llama-3.1-8B-Instruct")
    assert _reference_bytes(out) == -(-params * 2 // 8)


def test_dpo_reference_is_whole_under_zero2_and_gone_when_offloaded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # OpenRLHF takes its log-probabilities from the full logits in code of its own: the tests'
    # TRL 1.16 beside it changes nothing (its step restates TRL 0.29.1's moments)
    text = DPO.read_text(encoding="utf-8")
    zero2 = _explain(capsys, _run(tmp_path, text.replace("--zero_stage 3", "--zero_stage 2")))
    params = _params("meta-llama/Llama-3.1-8B-Instruct")
    # stage 0 for the reference when the training is not ZeRO-3: every rank holds it whole
    assert _reference_bytes(zero2) == params * 2
    offloaded = _explain(
        capsys, _run(tmp_path, text.replace("--zero_stage 3", "--zero_stage 3 --ref_offload"))
    )
    assert _reference_bytes(offloaded) == 0
    zero3 = _explain(capsys, DPO)
    assert offloaded["budget"]["allocated_peak_bytes"] < zero3["budget"]["allocated_peak_bytes"]


# -- (b) GRPO under LoRA: OpenRLHF's reference is a model of its own

GRPO_LORA = """#!/bin/bash
ray job submit --address="http://127.0.0.1:8265" -- python3 -m openrlhf.cli.train_ppo_ray \\
   --ref.num_nodes 1 --ref.num_gpus_per_node 4 \\
   --actor.num_nodes 1 --actor.num_gpus_per_node 4 \\
   --vllm.num_engines 2 --vllm.tensor_parallel_size 2 --vllm.gpu_memory_utilization 0.4 \\
   --train.colocate_all \\
   --actor.model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
   --reward.remote_url http://localhost:5000/get_reward \\
   --train.micro_batch_size 2 --train.batch_size 64 \\
   --rollout.micro_batch_size 4 --rollout.batch_size 64 \\
   --rollout.n_samples_per_prompt {n} \\
   --algo.advantage.estimator {estimator} \\
   --algo.kl.init_coef 1e-3 \\
   --data.max_len 2048 --rollout.max_new_tokens 1024 \\
   --ds.zero_stage {stage} --ds.param_dtype bf16 \\
   --ds.lora.rank 16 --ds.lora.alpha 32 \\
   --actor.gradient_checkpointing_enable
"""


def test_grpo_under_lora_keeps_a_reference_copy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = GRPO_LORA.format(n=8, estimator="group_norm", stage=2)
    out = _explain(capsys, _run(tmp_path, text))
    assert out["plan"]["lora"] is not None
    params = _params("Qwen/Qwen2.5-1.5B-Instruct")
    # not the adapter-disabled policy: a frozen bf16 copy beside it
    assert _reference_bytes(out) == params * 2
    out = _explain(capsys, _run(tmp_path, GRPO_LORA.format(n=8, estimator="group_norm", stage=3)))
    assert _reference_bytes(out) == -(-params * 2 // 4)


# -- (c) the reference row says where it was decided


def test_reference_rows_carry_the_plans_source_and_note() -> None:
    row = _row(DPO)
    assert row["value"].startswith("copy")
    # OpenRLHF's own default (train_dpo loads --pretrain again), not TRL's
    assert row["source"] == "default"
    assert "train_dpo" in row["note"] and "TRL" not in row["note"]
    row = _row(GRPO)
    assert row["value"].startswith("copy")
    assert "colocate" in row["note"]


def test_reference_on_its_own_gpus_is_said_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = GRPO_LORA.format(n=8, estimator="group_norm", stage=2).replace(
        "   --train.colocate_all \\\n", ""
    )
    path = _run(tmp_path, text)
    out = _explain(capsys, path)
    row = _row(path, "lora")
    assert row["value"].startswith("none")
    assert "own GPUs" in row["note"] and "TRL" not in row["note"]
    assert _reference_bytes(out) == 0


# -- (d) one completion a prompt: REINFORCE++ runs, the group baselines stop


def test_one_completion_a_prompt_is_fine_for_reinforce_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = _explain(capsys, _run(tmp_path, GRPO_LORA.format(n=1, estimator="reinforce", stage=2)))
    assert out["plan"]["objective"]["value"] == "grpo"
    assert out["budget"]["allocated_peak_bytes"] > 0
    path = _run(tmp_path, GRPO_LORA.format(n=1, estimator="group_norm", stage=2))
    code = main(["explain", str(path), "--gpu", "80GiB", "--format", "json"])
    text = capsys.readouterr()
    assert "num_generations must be at least 2" in text.out + text.err
    assert "Traceback" not in text.out + text.err
    assert code in (0, 1, 2)


# -- accelerate's mixed precision as a plan says it


def test_a_plans_mixed_precision_reaches_the_preference_setup(tmp_path: Path) -> None:
    """Autocast precisions are accelerate's mixed precision; a kept bf16/fp16 flag decides for
    16-bit weights; a plan that says nothing leaves TRL's default (bf16=True) to the budget;
    DeepSpeed (OpenRLHF) turns the conversion off whatever the plan says."""
    from dataclasses import replace

    from llmmem.extract import extract_plan
    from llmmem.extract.shell import extract_shell_plan
    from llmmem.plan import Provenance, Sourced
    from llmmem.preference_plan import mixed_precision_of, preference_setup

    examples = Path(__file__).resolve().parents[2] / "examples"
    # bf16 weights, no bf16= flag: DPOConfig's default bf16=True autocasts over them
    plan = extract_plan(examples / "dpo_lora.py")
    assert plan.precision.value == "bf16-autocast"
    assert mixed_precision_of(plan) is True
    plan = replace(plan, precision=replace(plan.precision, value="bf16-true"))
    assert mixed_precision_of(plan) is None
    off = replace(
        plan, extra={**plan.extra, "bf16": Sourced(value=False, source=Provenance.EXPLICIT)}
    )
    assert mixed_precision_of(off) is False
    setup = preference_setup(off)
    assert setup is not None and setup.mixed_precision is False
    autocast = replace(plan, precision=replace(plan.precision, value="bf16"))
    assert mixed_precision_of(autocast) is True
    # OpenRLHF trains under DeepSpeed: accelerate's native AMP is off, no fp32 outputs
    from llmmem.budget.preference_setup import fp32_outputs
    from llmmem.budget.setup import DistributedSetup, TrainingSetup

    dpo = extract_shell_plan(DPO)
    assert dpo.distributed.zero_stage.value == 3
    zero3 = TrainingSetup(
        precision="bf16", distributed=DistributedSetup(world_size=8, zero_stage=3)
    )
    assert fp32_outputs(mixed_precision_of(dpo), zero3) is False


# -- (e) PPO: the lengths from the launch line, the models OpenRLHF puts on the actor's GPU

PPO = """#!/bin/bash
ray job submit --address="http://127.0.0.1:8265" -- python3 -m openrlhf.cli.train_ppo_ray \\
   --ref.num_nodes 1 --ref.num_gpus_per_node 4 \\
   --critic.num_nodes 1 --critic.num_gpus_per_node 4 \\
   --actor.num_nodes 1 --actor.num_gpus_per_node 4 \\
   --vllm.num_engines 2 --vllm.tensor_parallel_size 2 --vllm.gpu_memory_utilization 0.4 \\
{colocate}   --actor.model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
   --critic.model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
   {reward} \\
   --train.micro_batch_size 2 --train.batch_size 64 \\
   --rollout.micro_batch_size 4 --rollout.batch_size 64 \\
   --data.max_len {max_len} --rollout.max_new_tokens {new} \\
   --ds.zero_stage 3 --ds.param_dtype bf16 \\
   --actor.gradient_checkpointing_enable
"""
REWARD_MODEL = "--reward.model_name_or_path Qwen/Qwen2.5-0.5B-Instruct"
COLOCATE = "   --train.colocate_all \\\n"


def _ppo(tmp_path: Path, colocate: bool, reward: str = REWARD_MODEL, **lengths: int) -> Path:
    text = PPO.format(
        colocate=COLOCATE if colocate else "",
        reward=reward,
        max_len=lengths.get("max_len", 2048),
        new=lengths.get("new", 1024),
    )
    return _run(tmp_path, text)


def _ppo_setup(path: Path):  # type: ignore[no-untyped-def]
    from llmmem.extract.shell import extract_shell_plan
    from llmmem.preference_plan import ppo_setup

    return ppo_setup(extract_shell_plan(path))


def test_ppo_rollout_lengths_come_from_the_launch_line(tmp_path: Path) -> None:
    ppo = _ppo_setup(_ppo(tmp_path, True, max_len=3072, new=512))
    # --max_len covers prompt and response: the queries are what the response leaves
    assert (ppo.query_length, ppo.response_length) == (3072 - 512, 512)
    assert ppo.local_rollout_forward_batch_size == 4  # --rollout.micro_batch_size


def test_ppo_critic_and_reward_share_the_gpu_only_when_everything_is_colocated(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    together = _explain(capsys, _ppo(tmp_path, True))
    apart = _explain(capsys, _ppo(tmp_path, False))
    critic = _params("Qwen/Qwen2.5-0.5B-Instruct")
    # colocated: the critic's weights and optimizer states, the reward model and the
    # colocated engines' share are on the actor's GPU; apart, none of them
    assert (
        together["budget"]["allocated_peak_bytes"] - apart["budget"]["allocated_peak_bytes"]
        > critic * 4
    )
    generate = together["budget"]["phases"]["generate"]["components"]
    assert generate["vllm_engine"] == int(0.4 * 80 * GIB)
    assert "vllm_engine" not in apart["budget"]["phases"]["generate"]["components"]
    assert _reference_bytes(apart) == 0  # the reference on GPUs of its own
    # colocated, the reference is OpenRLHF's bf16 copy partitioned over the 4 ranks
    assert _reference_bytes(together) >= -(-_params("Qwen/Qwen2.5-1.5B-Instruct") * 2 // 4)
    ppo = _ppo_setup(_ppo(tmp_path, False))
    assert ppo.value == "remote" and ppo.reward == "api"


def test_ppo_with_a_reward_server_loads_no_reward_model(tmp_path: Path) -> None:
    ppo = _ppo_setup(
        _ppo(tmp_path, True, reward="--reward.remote_url http://localhost:5000/get_reward")
    )
    assert ppo.reward == "api" and ppo.reward_model is None
    assert "localhost:5000" in ppo.reward_name
    # the critic stays: colocated with the actor
    assert ppo.value == "model" and ppo.value_model is not None


def test_openrlhf_dpo_is_the_same_whatever_trl_is_installed_beside_it(
    capsys: pytest.CaptureFixture[str], trl_release: Callable[[str], Path]
) -> None:
    with_tests_trl = _explain(capsys, DPO)["budget"]["allocated_peak_bytes"]
    trl_release("1.16.0")
    with_trl_116 = _explain(capsys, DPO)["budget"]["allocated_peak_bytes"]
    trl_release("0.29.1")
    with_trl_029 = _explain(capsys, DPO)["budget"]["allocated_peak_bytes"]
    assert with_tests_trl == with_trl_116 == with_trl_029

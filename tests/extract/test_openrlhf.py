"""OpenRLHF launch lines: each trainer's flags read into the plan, in the spellings its releases
use (0.9's `--bf16`/`--prompt_max_len`, 0.7's `--flash_attn`, the flat names up to 0.10.1, the
dotted names from 0.10.2), every value with its provenance and the range of its flag; `llmmem
explain` shows the method and the reference model the trainer loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmmem.cli import main
from llmmem.extract.shell import extract_shell_plan
from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan

SHELL = Path(__file__).resolve().parents[1] / "fixtures" / "shell"
DPO = SHELL / "openrlhf_dpo.sh"
GRPO = SHELL / "openrlhf_grpo_ray.sh"
GIB = 2**30

EXPLICIT = Provenance.EXPLICIT
CLI_DEFAULT = Provenance.CLI_DEFAULT
DEFAULT = Provenance.DEFAULT


def found(plan: TrainingPlan, key: str) -> Sourced[Any]:
    if key in plan.extra:
        return plan.extra[key]
    owner: Any = plan
    for part in key.split("."):
        owner = getattr(owner, part)
    assert isinstance(owner, Sourced), key
    return owner


def written_at(located: SourceRange | None, text: str) -> str:
    assert located is not None and located.path is None
    assert located.start_line == located.end_line
    return text.split("\n")[located.start_line][located.start_col : located.end_col]


def expect(
    plan: TrainingPlan, text: str, key: str, value: Any, source: Provenance, word: str | None
) -> Sourced[Any]:
    """The plan's `key` is `value` from `source`, and (explicit values) points at `word`."""
    value_found = found(plan, key)
    assert value_found.value == value, f"{key}: {value_found.value!r}"
    assert value_found.source is source, f"{key}: {value_found.source}"
    if word is not None:
        assert written_at(value_found.range, text) == word, key
    return value_found


def inline(tmp_path: Path, text: str) -> tuple[TrainingPlan, str]:
    path = tmp_path / "run.sh"
    path.write_text(text, encoding="utf-8")
    return extract_shell_plan(path), text


# -- the flat flags (OpenRLHF up to 0.10.1): DPO through the deepspeed launcher


def test_dpo_fixture_reads_every_flag_with_its_place() -> None:
    text = DPO.read_text(encoding="utf-8")
    plan = extract_shell_plan(DPO)
    assert plan.framework == "openrlhf"
    assert plan.problems == []
    objective = expect(plan, text, "objective", "dpo", EXPLICIT, "openrlhf.cli.train_dpo")
    assert "train_dpo" in objective.note
    expect(plan, text, "model_id", "meta-llama/Llama-3.1-8B-Instruct", EXPLICIT, None)
    # the micro-batch comes through the variable: its range is the assignment's value
    expect(plan, text, "per_device_train_batch_size", 1, EXPLICIT, "1")
    assert found(plan, "per_device_train_batch_size").range.start_line == 5
    expect(plan, text, "max_seq_length", 4096, EXPLICIT, "4096")
    expect(plan, text, "precision", "bf16", EXPLICIT, "bf16")
    expect(plan, text, "gradient_checkpointing", True, EXPLICIT, "--gradient_checkpointing")
    expect(plan, text, "attn_implementation", "flash_attention_2", EXPLICIT, "flash_attention_2")
    expect(plan, text, "distributed.zero_stage", 3, EXPLICIT, "3")
    expect(plan, text, "distributed.world_size", 8, EXPLICIT, "8")
    # DeepSpeed's accumulation: the global batch of 128 over 8 GPUs of 1 sequence pair each
    expect(plan, text, "gradient_accumulation_steps", 16, EXPLICIT, "128")
    expect(plan, text, "beta", 0.1, EXPLICIT, "0.1")
    # train_dpo loads its reference from --pretrain when --ref_pretrain is not given
    reference = expect(
        plan, text, "ref_model_id", "meta-llama/Llama-3.1-8B-Instruct", DEFAULT, None
    )
    assert "--pretrain" in reference.note
    assert plan.lora is None and plan.quantization is None
    assert plan.distributed.offload_optimizer.value is False


def test_argparse_defaults_are_labelled_as_the_trainers(tmp_path: Path) -> None:
    plan, text = inline(
        tmp_path,
        "deepspeed --module openrlhf.cli.train_dpo --pretrain Qwen/Qwen2.5-1.5B-Instruct\n",
    )
    # train_dpo's argparse (0.11.2): micro-batch 8, max_len 512, ZeRO-2, bf16, beta 0.1
    for key, value in (
        ("per_device_train_batch_size", 8),
        ("max_seq_length", 512),
        ("distributed.zero_stage", 2),
        ("precision", "bf16"),
        ("gradient_checkpointing", False),
        ("attn_implementation", "flash_attention_2"),
        ("beta", 0.1),
    ):
        value_found = expect(plan, text, key, value, CLI_DEFAULT, None)
        assert "OpenRLHF" in value_found.note, key
    assert plan.problems == []


def test_ipo_is_still_dpo_and_kto_and_reward_have_their_own(tmp_path: Path) -> None:
    plan, text = inline(
        tmp_path,
        "deepspeed --module openrlhf.cli.train_dpo --pretrain Qwen/Qwen2.5-1.5B --ipo "
        "--ref_pretrain Qwen/Qwen2.5-1.5B-Instruct --beta 0.2\n",
    )
    expect(plan, text, "objective", "dpo", EXPLICIT, "openrlhf.cli.train_dpo")
    assert "--ipo" in found(plan, "objective").note
    expect(plan, text, "ref_model_id", "Qwen/Qwen2.5-1.5B-Instruct", EXPLICIT, None)
    expect(plan, text, "beta", 0.2, EXPLICIT, "0.2")
    # train_kto (0.9.0, its last release read): beta 0.01, max_len 2048
    plan, text = inline(
        tmp_path, "deepspeed --module openrlhf.cli.train_kto --pretrain Qwen/Qwen2.5-1.5B\n"
    )
    expect(plan, text, "objective", "kto", EXPLICIT, "openrlhf.cli.train_kto")
    expect(plan, text, "beta", 0.01, CLI_DEFAULT, None)
    expect(plan, text, "max_seq_length", 2048, CLI_DEFAULT, None)
    plan, text = inline(
        tmp_path,
        "deepspeed --module openrlhf.cli.train_rm --pretrain Qwen/Qwen2.5-1.5B "
        "--micro_train_batch_size 4\n",
    )
    expect(plan, text, "objective", "reward", EXPLICIT, "openrlhf.cli.train_rm")
    expect(plan, text, "per_device_train_batch_size", 4, EXPLICIT, "4")
    assert "ref_model_id" not in plan.extra
    # supervised fine-tuning has no objective; this is no longer read as DeepSpeed-Chat's
    plan, text = inline(
        tmp_path, "python -m openrlhf.cli.train_sft --pretrain Qwen/Qwen2.5-1.5B --max_len 1024\n"
    )
    assert plan.objective is None
    expect(plan, text, "max_seq_length", 1024, EXPLICIT, "1024")
    expect(plan, text, "per_device_train_batch_size", 8, CLI_DEFAULT, None)


def test_lora_and_4bit_flags(tmp_path: Path) -> None:
    plan, text = inline(
        tmp_path,
        "deepspeed --module openrlhf.cli.train_sft --pretrain meta-llama/Llama-3.1-8B \\\n"
        "  --lora_rank 64 --lora_alpha 128 --target_modules q_proj k_proj v_proj \\\n"
        "  --load_in_4bit --adam_offload --zero_stage 2\n",
    )
    assert plan.lora is not None and plan.quantization is not None
    expect(plan, text, "lora.r", 64, EXPLICIT, "64")
    expect(plan, text, "lora.alpha", 128, EXPLICIT, "128")
    expect(plan, text, "lora.dropout", 0.0, CLI_DEFAULT, None)
    targets = expect(
        plan, text, "lora.target_modules", ["q_proj", "k_proj", "v_proj"], EXPLICIT, None
    )
    assert targets.range is not None
    expect(plan, text, "quantization.bits", 4, EXPLICIT, "--load_in_4bit")
    expect(plan, text, "quantization.quant_type", "nf4", EXPLICIT, "--load_in_4bit")
    expect(plan, text, "distributed.offload_optimizer", True, EXPLICIT, "--adam_offload")
    # the default target is every Linear layer
    plan, text = inline(
        tmp_path, "deepspeed --module openrlhf.cli.train_sft --pretrain x/y --lora_rank 8\n"
    )
    expect(plan, text, "lora.target_modules", ["all-linear"], CLI_DEFAULT, None)
    expect(plan, text, "lora.alpha", 16, CLI_DEFAULT, None)


def test_openrlhf_09_spellings(tmp_path: Path) -> None:
    plan, text = inline(
        tmp_path,
        "deepspeed --module openrlhf.cli.train_sft --pretrain Qwen/Qwen2.5-1.5B --bf16 "
        "--flash_attn --max_len 2048\n",
    )
    expect(plan, text, "precision", "bf16", EXPLICIT, "--bf16")
    expect(plan, text, "attn_implementation", "flash_attention_2", EXPLICIT, "--flash_attn")
    # 0.9's PPO: the row is --prompt_max_len + --generate_max_len
    plan, text = inline(
        tmp_path,
        "python3 -m openrlhf.cli.train_ppo_ray --pretrain Qwen/Qwen2.5-1.5B --bf16 "
        "--reward_pretrain my/rm --prompt_max_len 512 --generate_max_len 1536\n",
    )
    expect(plan, text, "max_seq_length", 2048, EXPLICIT, "1536")
    expect(plan, text, "max_prompt_length", 512, EXPLICIT, "512")
    expect(plan, text, "max_completion_length", 1536, EXPLICIT, "1536")


# -- PPO and GRPO through Ray, dotted flags (0.10.2 on)


def test_grpo_ray_fixture_reads_generation_and_placement() -> None:
    text = GRPO.read_text(encoding="utf-8")
    plan = extract_shell_plan(GRPO)
    assert plan.framework == "openrlhf"
    objective = expect(plan, text, "objective", "grpo", EXPLICIT, "group_norm")
    assert "no critic" in objective.note
    expect(plan, text, "model_id", "Qwen/Qwen2.5-7B-Instruct", EXPLICIT, "Qwen/Qwen2.5-7B-Instruct")
    # the actor's GPUs are the flags', not the `ray start` line's
    expect(plan, text, "distributed.world_size", 8, EXPLICIT, "8")
    expect(plan, text, "per_device_train_batch_size", 2, EXPLICIT, "2")
    expect(plan, text, "gradient_accumulation_steps", 8, EXPLICIT, "128")
    expect(plan, text, "max_seq_length", 3072, EXPLICIT, "3072")
    expect(plan, text, "max_completion_length", 2048, EXPLICIT, "2048")
    expect(plan, text, "max_prompt_length", 1024, DEFAULT, "3072")
    expect(plan, text, "num_generations", 8, EXPLICIT, "8")
    expect(
        plan,
        text,
        "gradient_checkpointing",
        True,
        EXPLICIT,
        "--actor.gradient_checkpointing_enable",
    )
    expect(plan, text, "distributed.zero_stage", 3, EXPLICIT, "3")
    expect(plan, text, "use_vllm", True, EXPLICIT, "4")
    expect(plan, text, "vllm_mode", "colocate", EXPLICIT, "--train.colocate_all")
    expect(plan, text, "vllm_gpu_memory_utilization", 0.5, EXPLICIT, "0.5")
    expect(plan, text, "vllm_enable_sleep_mode", True, EXPLICIT, "--vllm.enable_sleep")
    # the reference shares the actor's GPUs: the KL coefficient is the GRPO plan's beta
    expect(plan, text, "beta", 0.001, EXPLICIT, "1e-3")
    expect(plan, text, "init_kl_coef", 0.001, EXPLICIT, "1e-3")
    expect(plan, text, "ref_model_id", "Qwen/Qwen2.5-7B-Instruct", DEFAULT, None)
    expect(plan, text, "packing_samples", True, EXPLICIT, "--ds.packing_samples")
    # OpenRLHF packs a micro-batch into one row for flash-attention: TRL's padding_free
    expect(plan, text, "padding_free", True, DEFAULT, "--ds.packing_samples")
    assert plan.problems == []


def test_ppo_keeps_critic_and_reward_and_places_the_reference(tmp_path: Path) -> None:
    plan, text = inline(
        tmp_path,
        "python3 -m openrlhf.cli.train_ppo_ray --pretrain meta-llama/Llama-3.1-8B-Instruct "
        "--reward_pretrain my-org/llama3-rm --vllm_num_engines 2 --max_len 2048 "
        "--max_new_tokens 1024 --actor_num_gpus_per_node 4\n",
    )
    objective = expect(plan, text, "objective", "ppo", CLI_DEFAULT, None)
    assert "gae" in objective.note
    expect(plan, text, "distributed.world_size", 4, EXPLICIT, "4")
    expect(plan, text, "reward_model_id", "my-org/llama3-rm", EXPLICIT, "my-org/llama3-rm")
    expect(plan, text, "critic_model_id", "my-org/llama3-rm", DEFAULT, "my-org/llama3-rm")
    expect(plan, text, "num_generations", 1, CLI_DEFAULT, None)
    expect(plan, text, "vllm_mode", "server", DEFAULT, "2")
    expect(plan, text, "vllm_gpu_memory_utilization", 0.95, CLI_DEFAULT, None)
    # not colocated: the reference (init_kl_coef 0.01 by default) has GPUs of its own
    beta = expect(plan, text, "beta", 0.0, DEFAULT, None)
    assert "own GPUs" in beta.note
    expect(plan, text, "init_kl_coef", 0.01, CLI_DEFAULT, None)
    # without vLLM engines the actor generates
    plan, text = inline(
        tmp_path,
        "python3 -m openrlhf.cli.train_ppo_ray --pretrain x/y --remote_rm_url http://rm "
        "--advantage_estimator reinforce_baseline --n_samples_per_prompt 4 "
        "--colocate_actor_ref --init_kl_coef 0.02\n",
    )
    expect(plan, text, "objective", "grpo", EXPLICIT, "reinforce_baseline")
    expect(plan, text, "use_vllm", False, DEFAULT, None)
    expect(plan, text, "beta", 0.02, EXPLICIT, "0.02")
    assert "critic_model_id" not in plan.extra  # critic-free


def test_ray_job_submit_without_a_separator(tmp_path: Path) -> None:
    plan, _ = inline(
        tmp_path,
        "ray job submit --address http://127.0.0.1:8265 python3 -m openrlhf.cli.train_ppo_ray "
        "--pretrain x/y --remote_rm_url http://rm --advantage_estimator dr_grpo "
        "--n_samples_per_prompt 4\n",
    )
    assert plan.objective is not None and plan.objective.value == "grpo"


def test_other_launchers_and_a_checkout_script(tmp_path: Path) -> None:
    # a module started by torchrun keeps torchrun's process count
    plan, text = inline(
        tmp_path, "torchrun --nproc_per_node 4 -m openrlhf.cli.train_sft --pretrain x/y\n"
    )
    expect(plan, text, "distributed.world_size", 4, EXPLICIT, "4")
    expect(plan, text, "gradient_accumulation_steps", 4, CLI_DEFAULT, None)  # 128 / (8 × 4)
    # a trainer run from a checkout of OpenRLHF is read by its flags, not as a script
    plan, text = inline(tmp_path, "python openrlhf/cli/train_dpo.py --pretrain x/y\n")
    expect(plan, text, "objective", "dpo", EXPLICIT, "openrlhf/cli/train_dpo.py")
    assert not any("not found" in problem for problem in plan.problems), plan.problems


# -- what is wrong is said, once, where it is written


def test_malformed_values_are_problems_not_tracebacks(tmp_path: Path) -> None:
    plan, text = inline(
        tmp_path,
        "python3 -m openrlhf.cli.train_ppo_ray --pretrain x/y --remote_rm_url http://rm \\\n"
        "  --micro_train_batch_size two --zero_stage 5 --param_dtype fp8 \\\n"
        "  --vllm_num_engines 2 --vllm_gpu_memory_utilization 1.5 \\\n"
        "  --advantage_estimator group_norm --init_kl_coef -1 --gradient_checkpointing yes\n",
    )
    problems = "\n".join(plan.problems)
    assert "--micro_train_batch_size must be a whole number 1 or more; got 'two'" in problems
    assert "--zero_stage must be a whole number from 0 to 3; got '5'" in problems
    assert "--param_dtype must be one of bf16, fp16; got 'fp8'" in problems
    assert "--vllm_gpu_memory_utilization must be a number above 0, at most 1; got '1.5'" in (
        problems
    )
    assert "--init_kl_coef must be a number 0 or more; got '-1'" in problems
    # group_norm compares the samples of a prompt: one sample each is refused by OpenRLHF
    assert "needs --n_samples_per_prompt 2 or more" in problems
    assert "--gradient_checkpointing takes no value" in problems
    assert "line 2" in problems  # each problem names where it is written
    # the refused values are not used; the trainer's defaults stand in, said so
    micro = expect(plan, text, "per_device_train_batch_size", 1, CLI_DEFAULT, None)
    assert "refused" in micro.note
    assert plan.distributed.zero_stage.value == 2
    assert "internal error" not in problems


def test_a_value_known_at_run_time_takes_no_default(tmp_path: Path) -> None:
    plan, _ = inline(
        tmp_path,
        "deepspeed --module openrlhf.cli.train_sft --pretrain x/y --micro_train_batch_size $1\n",
    )
    assert plan.per_device_train_batch_size.source is not CLI_DEFAULT
    assert any("$1" in problem for problem in plan.problems)


def test_an_unknown_trainer_is_said(tmp_path: Path) -> None:
    plan, _ = inline(
        tmp_path, "deepspeed --module openrlhf.cli.train_prm --pretrain x/y --max_len 1024\n"
    )
    assert plan.objective is None
    assert any("train_prm is not read as its own method" in p for p in plan.problems)


# -- llmmem explain


def explain(capsys: pytest.CaptureFixture[str], path: Path, *options: str) -> str:
    code = main(["explain", str(path), "--gpu", "80GiB", *options])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def test_explain_shows_the_method_and_the_reference(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    out = explain(capsys, DPO)
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "dpo" in rows["method"] and "train_dpo" in rows["method"]
    assert "copy: a second, frozen copy of the model" in rows["reference model"]
    out = explain(capsys, GRPO)
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "grpo" in rows["method"] and "group_norm" in rows["method"]
    assert "copy" in rows["reference model"] and "0.001" in rows["reference model"]


def test_explain_sizes_the_colocated_engine_and_reference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = json.loads(explain(capsys, GRPO, "--format", "json"))
    assert out["plan"]["objective"]["value"] == "grpo"
    phases = out["budget"]["phases"]
    assert "generate" in phases
    share = int(0.5 * 80 * GIB)  # --vllm.gpu_memory_utilization 0.5 of an 80 GiB GPU
    assert phases["generate"]["components"]["vllm_engine"] == share
    assert phases["generate"]["components"]["reference_model"] > 0

"""verl configs: the FSDP SFT trainer's layout and the RL trainer's (actor_rollout_ref), read
with verl 0.7.0's defaults where the file is silent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmmem.extract.configs import detect_framework, extract_config_plan
from llmmem.plan import Provenance, Sourced, TrainingPlan

CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "configs"

EXPLICIT = Provenance.EXPLICIT
DEFAULT = Provenance.DEFAULT


def value(plan: TrainingPlan, key: str) -> Sourced[Any]:
    owner: Any = plan
    for part in key.split("."):
        owner = getattr(owner, part)
    assert isinstance(owner, Sourced), key
    return owner


def written_at(plan: TrainingPlan, key: str) -> str:
    """The text of the line the value was read from (the plan's own file)."""
    found = value(plan, key)
    assert found.range is not None and found.range.path is None, key
    lines = Path(plan.path).read_text(encoding="utf-8").split("\n")
    return lines[found.range.start_line].strip()


def expect(plan: TrainingPlan, key: str, expected: Any, source: Provenance) -> None:
    found = value(plan, key)
    assert found.value == expected, f"{key}: {found.value!r} != {expected!r}"
    assert found.source is source, f"{key}: {found.source} != {source}"


def kept(plan: TrainingPlan, name: str) -> Any:
    found = plan.extra.get(name)
    return found.value if isinstance(found, Sourced) else found


def write(tmp_path: Path, text: str) -> TrainingPlan:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return extract_config_plan(path)


# -- detection ---------------------------------------------------------------------------------


def test_verl_layouts_are_detected() -> None:
    assert detect_framework({"actor_rollout_ref": {"model": {"path": "m"}}}) == "verl"
    sft = {"data": {"micro_batch_size_per_gpu": 4}, "model": {}, "trainer": {}}
    assert detect_framework(sft) == "verl"
    pretrain = {"data": {}, "model": {"partial_pretrain": "m"}, "trainer": {}}
    assert detect_framework(pretrain) == "verl"
    # data/model/trainer blocks alone are not enough
    assert detect_framework({"data": {}, "model": {}, "trainer": {}}) != "verl"
    # verl's generated configs carry Hydra `_target_` keys: still verl, not torchtune
    targets = {"actor_rollout_ref": {"actor": {"_target_": "verl.workers.config.X"}}}
    assert detect_framework(targets) == "verl"


# -- FSDP SFT ----------------------------------------------------------------------------------


def test_sft_lora_fixture() -> None:
    plan = extract_config_plan(CONFIGS / "verl_sft_lora.yaml")
    assert (plan.framework, plan.kind) == ("verl", "yaml")
    assert plan.problems == []
    expect(plan, "model_id", "Qwen/Qwen2.5-7B-Instruct", EXPLICIT)
    expect(plan, "per_device_train_batch_size", 2, EXPLICIT)
    assert written_at(plan, "per_device_train_batch_size") == "micro_batch_size_per_gpu: 2"
    # 64 samples a step over 4 GPUs, 2 at a time: 8 micro-batches each
    expect(plan, "gradient_accumulation_steps", 8, EXPLICIT)
    assert written_at(plan, "gradient_accumulation_steps") == "train_batch_size: 64"
    expect(plan, "max_seq_length", 2048, EXPLICIT)
    expect(plan, "gradient_checkpointing", True, EXPLICIT)
    # model_dtype bf16: the weights themselves are bf16, not fp32 under autocast
    expect(plan, "precision", "bf16-true", EXPLICIT)
    assert written_at(plan, "precision") == "model_dtype: bf16"
    assert plan.lora is not None
    expect(plan, "lora.r", 32, EXPLICIT)
    expect(plan, "lora.alpha", 32.0, EXPLICIT)
    expect(plan, "lora.target_modules", ["all-linear"], EXPLICIT)
    expect(plan, "distributed.world_size", 4, EXPLICIT)
    expect(plan, "distributed.fsdp", "full_shard", EXPLICIT)
    expect(plan, "attn_implementation", "flash_attention_2", DEFAULT)
    assert plan.quantization is None


def test_sft_defaults_are_verls(tmp_path: Path) -> None:
    plan = write(
        tmp_path,
        "data:\n  micro_batch_size_per_gpu: 8\n"
        "model:\n  partial_pretrain: Qwen/Qwen2.5-0.5B-Instruct\n"
        "trainer:\n  project_name: sft\n",
    )
    assert plan.framework == "verl" and plan.problems == []
    expect(plan, "per_device_train_batch_size", 8, EXPLICIT)
    # sft_trainer.yaml: 8 GPUs on 1 node, train_batch_size 256, max_length 1024
    expect(plan, "distributed.world_size", 8, DEFAULT)
    expect(plan, "gradient_accumulation_steps", 4, DEFAULT)  # 256 / 8 GPUs / 8
    expect(plan, "max_seq_length", 1024, DEFAULT)
    expect(plan, "gradient_checkpointing", True, DEFAULT)
    # fp32 weights (model_dtype fp32) under FSDP's bf16 mixed precision
    expect(plan, "precision", "bf16", DEFAULT)
    expect(plan, "distributed.fsdp", "full_shard", DEFAULT)
    assert plan.lora is None  # lora_rank 0: every weight trains


def test_sft_sequence_parallel_divides_the_data_parallel_batch(tmp_path: Path) -> None:
    plan = write(
        tmp_path,
        "data:\n  micro_batch_size_per_gpu: 1\n  train_batch_size: 32\n"
        "model:\n  partial_pretrain: Qwen/Qwen2.5-0.5B-Instruct\n"
        "ulysses_sequence_parallel_size: 2\n"
        "trainer:\n  n_gpus_per_node: 8\n",
    )
    # 8 GPUs in groups of 2 share a sequence: 4 data-parallel ranks, 32 / 4 / 1 = 8
    expect(plan, "gradient_accumulation_steps", 8, EXPLICIT)
    assert kept(plan, "ulysses_sequence_parallel_size") == 2


def test_sft_cpu_offload(tmp_path: Path) -> None:
    head = "data:\n  micro_batch_size_per_gpu: 1\nmodel:\n  partial_pretrain: m/n\n"
    plan = write(
        tmp_path,
        head + "  fsdp_config:\n    cpu_offload: true\n    offload_params: true\ntrainer: {}\n",
    )
    expect(plan, "distributed.offload_params", True, EXPLICIT)
    expect(plan, "distributed.offload_optimizer", True, EXPLICIT)
    # cpu_offload alone wraps FSDP's CPUOffload(offload_params=False): nothing moves
    plan = write(tmp_path, head + "  fsdp_config:\n    cpu_offload: true\ntrainer: {}\n")
    assert plan.distributed.offload_params.value is False
    assert plan.distributed.offload_optimizer.value is False


def test_sft_bad_values_are_problems(tmp_path: Path) -> None:
    plan = write(
        tmp_path,
        "data:\n  micro_batch_size_per_gpu: four\n"
        "model:\n  partial_pretrain: m/n\n  strategy: megatron\n  lora_rank: [8]\n"
        "trainer:\n  n_gpus_per_node: eight\n",
    )
    assert plan.framework == "verl"
    assert any("micro_batch_size_per_gpu must be a whole number" in p for p in plan.problems)
    assert any("n_gpus_per_node must be a whole number" in p for p in plan.problems)
    assert any("strategy 'megatron' is not read" in p for p in plan.problems)
    assert any("lora_rank must be a whole number" in p for p in plan.problems)
    expect(plan, "per_device_train_batch_size", 4, DEFAULT)


# -- RL ------------------------------------------------------------------------------------------


def test_grpo_fixture_sizes_the_actor_step() -> None:
    plan = extract_config_plan(CONFIGS / "verl_grpo.yaml")
    assert plan.framework == "verl" and plan.problems == []
    expect(plan, "model_id", "Qwen/Qwen2.5-3B-Instruct", EXPLICIT)
    assert plan.objective is not None and plan.objective.value == "grpo"
    expect(plan, "per_device_train_batch_size", 16, EXPLICIT)
    # 256 prompts × 5 responses per optimizer step over 8 GPUs, 16 rows at a time
    expect(plan, "gradient_accumulation_steps", 10, EXPLICIT)
    assert written_at(plan, "gradient_accumulation_steps") == "ppo_mini_batch_size: 256"
    expect(plan, "max_seq_length", 512 + 1024, EXPLICIT)
    expect(plan, "distributed.world_size", 8, EXPLICIT)
    expect(plan, "gradient_checkpointing", True, EXPLICIT)
    expect(plan, "precision", "bf16", DEFAULT)  # the actor keeps fp32 weights
    expect(plan, "distributed.fsdp", "full_shard", DEFAULT)
    # the rollout side, in the names a GRPO plan reads
    assert kept(plan, "num_generations") == 5
    assert kept(plan, "max_prompt_length") == 512
    assert kept(plan, "max_completion_length") == 1024
    assert kept(plan, "use_vllm") is True
    assert kept(plan, "vllm_mode") == "colocate"
    assert kept(plan, "vllm_gpu_memory_utilization") == 0.6
    # param_offload parks the weights on the CPU between phases only: the update step holds
    # them on the GPU, so it is not FSDP CPU offload
    assert kept(plan, "verl_param_offload") is False
    assert not plan.distributed.offload_params.value


def test_ppo_defaults_and_dynamic_batches(tmp_path: Path) -> None:
    plan = write(
        tmp_path,
        "actor_rollout_ref:\n"
        "  model:\n    path: Qwen/Qwen2.5-0.5B-Instruct\n"
        "  actor:\n    use_dynamic_bsz: true\n    ppo_max_token_len_per_gpu: 8192\n"
        "  rollout:\n    name: vllm\n"
        "trainer:\n  n_gpus_per_node: 2\n",
    )
    assert plan.framework == "verl" and plan.problems == []
    # no adv_estimator: gae, PPO with a critic
    assert plan.objective is not None and plan.objective.value == "ppo"
    # dynamic batches pack up to 8192 tokens per micro-batch: one row that long
    expect(plan, "per_device_train_batch_size", 1, EXPLICIT)
    expect(plan, "max_seq_length", 8192, EXPLICIT)
    assert kept(plan, "num_generations") == 1  # rollout.n default
    assert kept(plan, "vllm_gpu_memory_utilization") == 0.5  # verl's default


def test_rl_without_a_micro_batch_says_so(tmp_path: Path) -> None:
    plan = write(
        tmp_path,
        "actor_rollout_ref:\n  model:\n    path: m/n\n  actor:\n    ppo_mini_batch_size: 64\n",
    )
    assert any("ppo_micro_batch_size_per_gpu is not set" in p for p in plan.problems)


def test_fsdp2_offload_policy_is_cpu_offload(tmp_path: Path) -> None:
    plan = write(
        tmp_path,
        "actor_rollout_ref:\n  model:\n    path: m/n\n"
        "  actor:\n    strategy: fsdp2\n    ppo_micro_batch_size_per_gpu: 2\n"
        "    fsdp_config:\n      offload_policy: true\n",
    )
    expect(plan, "distributed.offload_params", True, EXPLICIT)
    expect(plan, "distributed.offload_optimizer", True, EXPLICIT)

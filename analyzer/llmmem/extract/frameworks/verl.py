"""verl YAML (Hydra configs of `verl.trainer.fsdp_sft_trainer` and `verl.trainer.main_ppo`).

Two layouts:

- FSDP SFT: `data.micro_batch_size_per_gpu`, `data.train_batch_size` (global, in samples),
  `data.max_length`, `model.partial_pretrain`, `model.enable_gradient_checkpointing`,
  `model.lora_rank` / `lora_alpha` / `target_modules`, `model.strategy` (fsdp, fsdp2),
  `model.fsdp_config` (model_dtype, cpu_offload, offload_params).
- RL (PPO, GRPO and the other estimators): the actor's update step is what a plan sizes:
  `actor_rollout_ref.model.path`, `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu`
  (rows of prompt + response), `actor.ppo_mini_batch_size` (prompts, × `rollout.n`
  responses each), `data.max_prompt_length` + `data.max_response_length`,
  `actor.fsdp_config` (model_dtype, param_offload, optimizer_offload, offload_policy).

Both train with FSDP across `trainer.n_gpus_per_node` × `trainer.nnodes` GPUs, divided by the
Ulysses sequence-parallel size for the data-parallel batch. `optim.lr` and the like do not
change memory and are not read.
"""

from __future__ import annotations

from typing import Any

from llmmem.extract.frameworks.common import (
    DocumentReader,
    as_bool,
    as_dtype,
    as_float,
    as_int,
    as_text,
    lora_targets,
)
from llmmem.extract.frameworks.spelling import KeyWrite, Spelling, half_batch
from llmmem.extract.yaml_positions import KeyPath

ACTOR_ROLLOUT_REF: KeyPath = ("actor_rollout_ref",)


def is_verl_config(value: dict[str, Any]) -> bool:
    """`actor_rollout_ref:` (RL), or `data:`, `model:` and `trainer:` blocks with the SFT
    trainer's `data.micro_batch_size_per_gpu` or `model.partial_pretrain`."""
    if isinstance(value.get("actor_rollout_ref"), dict):
        return True
    data, model, trainer = (value.get(name) for name in ("data", "model", "trainer"))
    if not (isinstance(data, dict) and isinstance(model, dict) and isinstance(trainer, dict)):
        return False
    return "micro_batch_size_per_gpu" in data or "partial_pretrain" in model


# read from verl 0.7.0: verl/trainer/config/sft_trainer.yaml and
# verl/trainer/fsdp_sft_trainer.py (flash_attention_2, torch AdamW, bf16 FSDP mixed precision)
VERL_SFT_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("per_device_train_batch_size", 4, "verl data.micro_batch_size_per_gpu default"),
    ("max_seq_length", 1024, "verl data.max_length default"),
    ("gradient_checkpointing", True, "verl model.enable_gradient_checkpointing default"),
    ("distributed.fsdp", "full_shard", "verl model.strategy default fsdp2: full sharding"),
    (
        "precision",
        "bf16",
        "verl loads fp32 weights (fsdp_config.model_dtype default fp32), FSDP computes in bf16",
    ),
    ("optim", "adamw_torch", "verl's FSDP trainers step torch AdamW"),
    ("attn_implementation", "flash_attention_2", "verl loads the model with flash_attention_2"),
)
VERL_SFT_TRAIN_BATCH_SIZE = 256  # data.train_batch_size default

# read from verl 0.7.0: verl/trainer/config/_generated_ppo_trainer.yaml (actor/dp_actor.yaml,
# model/hf_model.yaml, data/legacy_data.yaml) and verl/workers/fsdp_workers.py (the actor
# loads fp32 weights when model_dtype is unset, computes in fsdp_config.dtype bfloat16)
VERL_RL_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("gradient_checkpointing", True, "verl actor_rollout_ref.model.enable_gradient_checkpointing"),
    ("distributed.fsdp", "full_shard", "verl actor strategy default fsdp: full sharding"),
    ("precision", "bf16", "verl's actor keeps fp32 weights and computes in bf16"),
    ("optim", "adamw_torch", "verl's FSDP actor steps torch AdamW"),
    ("attn_implementation", "flash_attention_2", "verl loads the model with flash_attention_2"),
)
VERL_RL_MINI_BATCH_SIZE = 256  # actor.ppo_mini_batch_size default
VERL_RL_PROMPT_LENGTH = 512  # data.max_prompt_length default
VERL_RL_RESPONSE_LENGTH = 512  # data.max_response_length default
VERL_GPUS_PER_NODE = 8  # trainer.n_gpus_per_node default
VERL_LORA_ALPHA = 16.0  # model.lora_alpha default
VERL_TARGET_MODULES = ["all-linear"]  # model.target_modules default


def read_verl(reader: DocumentReader) -> None:
    if isinstance(reader.get(ACTOR_ROLLOUT_REF), dict):
        read_verl_rl(reader)
    else:
        read_verl_sft(reader)


# --------------------------------------------------------------------------------------------
# what both layouts share


def read_verl_world(reader: DocumentReader) -> int:
    """trainer.n_gpus_per_node × trainer.nnodes (8 × 1 when the file says neither)."""
    gpus_path, nodes_path = ("trainer", "n_gpus_per_node"), ("trainer", "nnodes")
    gpus = reader.converted(gpus_path, as_int)
    nodes = reader.converted(nodes_path, as_int)
    world = max(1, gpus or VERL_GPUS_PER_NODE) * max(1, nodes or 1)
    if gpus is not None or nodes is not None:
        note = "trainer.n_gpus_per_node × trainer.nnodes"
        reader.put("distributed.world_size", world, gpus_path if gpus else nodes_path, note)
    else:
        reader.default(
            "distributed.world_size",
            world,
            "verl trainer.n_gpus_per_node default 8 × trainer.nnodes default 1",
        )
    return world


def read_verl_lora(reader: DocumentReader, model: KeyPath) -> None:
    """`lora_rank` above 0 turns LoRA on (0, the default, trains every weight)."""
    rank_path = (*model, "lora_rank")
    rank = reader.converted(rank_path, as_int)
    if rank is None or rank <= 0:
        return
    reader.put("lora.enabled", True, rank_path, f"lora_rank: {rank}")
    reader.put("lora.r", rank, rank_path)
    reader.take((*model, "lora_alpha"), "lora.alpha", as_float)
    reader.take((*model, "target_modules"), "lora.target_modules", lora_targets)
    reader.default("lora.alpha", VERL_LORA_ALPHA, "verl lora_alpha default")
    reader.default("lora.target_modules", VERL_TARGET_MODULES, "verl target_modules: all-linear")
    reader.default("lora.dropout", 0.0, "verl builds its LoraConfig without dropout")


def read_verl_precision(reader: DocumentReader, fsdp_config: KeyPath) -> None:
    """fsdp_config.model_dtype: the dtype the weights (and AdamW states) are kept in; FSDP's
    mixed precision computes in bf16 either way."""
    path = (*fsdp_config, "model_dtype")
    dtype = reader.converted(path, as_dtype)
    if dtype == "bfloat16":
        reader.put("precision", "bf16-true", path, "model_dtype bf16: weights and AdamW in bf16")
    elif dtype == "float16":
        reader.put("precision", "fp16-true", path, "model_dtype fp16: weights and AdamW in fp16")
    elif dtype == "float32":
        reader.put("precision", "bf16", path, "fp32 weights, FSDP computes in bf16")


def read_verl_model_switches(reader: DocumentReader, model: KeyPath) -> None:
    reader.take((*model, "enable_gradient_checkpointing"), "gradient_checkpointing", as_bool)
    if reader.converted((*model, "use_liger"), as_bool):
        reader.put("loss", "liger", (*model, "use_liger"), "use_liger: Liger kernels")
    reader.keep("activation_offloading", (*model, "enable_activation_offload"))


def read_verl_strategy(
    reader: DocumentReader, strategy_path: KeyPath, fsdp_config: KeyPath
) -> None:
    """fsdp and fsdp2 shard fully unless `reshard_after_forward: false` (the RL actor's)."""
    strategy = reader.converted(strategy_path, as_text)
    if strategy is not None and strategy.strip().lower() not in ("fsdp", "fsdp2"):
        reader.problem(
            strategy_path,
            f"strategy '{strategy}' is not read (fsdp and fsdp2 are); sized as FSDP",
        )
        strategy = None
    reshard_path = (*fsdp_config, "reshard_after_forward")
    reshard = reader.converted(reshard_path, as_bool)
    if reshard is False:
        reader.put(
            "distributed.fsdp",
            "shard_grad_op",
            reshard_path,
            "reshard_after_forward: false keeps the gathered weights until the backward pass",
        )
    elif strategy is not None:
        reader.put("distributed.fsdp", "full_shard", strategy_path, f"strategy: {strategy}")


# --------------------------------------------------------------------------------------------
# FSDP SFT (verl.trainer.fsdp_sft_trainer)


def read_verl_sft(reader: DocumentReader) -> None:
    reader.take(("model", "partial_pretrain"), "model_id", as_text)
    world = read_verl_world(reader)
    sequence_parallel = max(1, reader.converted(("ulysses_sequence_parallel_size",), as_int) or 1)
    reader.keep("ulysses_sequence_parallel_size", ("ulysses_sequence_parallel_size",))
    reader.keep("use_remove_padding", ("use_remove_padding",))
    data_parallel = max(1, world // sequence_parallel)
    micro_path = ("data", "micro_batch_size_per_gpu")
    micro = reader.take(micro_path, "per_device_train_batch_size", as_int) or 4
    batch_path = ("data", "train_batch_size")
    batch = reader.converted(batch_path, as_int)
    how = "data.train_batch_size / data-parallel GPUs / micro_batch_size_per_gpu"
    if batch is not None:
        reader.put(
            "gradient_accumulation_steps", max(1, batch // data_parallel // micro), batch_path, how
        )
    else:
        reader.default(
            "gradient_accumulation_steps",
            max(1, VERL_SFT_TRAIN_BATCH_SIZE // data_parallel // micro),
            f"verl data.train_batch_size default {VERL_SFT_TRAIN_BATCH_SIZE}: {how}",
        )
    reader.take(("data", "max_length"), "max_seq_length", as_int)
    read_verl_model_switches(reader, ("model",))
    read_verl_lora(reader, ("model",))
    if reader.reading.has("lora.enabled"):
        reader.derived(
            "lora_adapter_dtype",
            "model dtype",
            "verl casts the model, adapters too, to fsdp_config.model_dtype",
        )
    fsdp_config = ("model", "fsdp_config")
    read_verl_precision(reader, fsdp_config)
    read_verl_strategy(reader, ("model", "strategy"), fsdp_config)
    read_verl_sft_offload(reader, fsdp_config)
    for key, value, note in VERL_SFT_DEFAULTS:
        reader.default(key, value, note)


def read_verl_sft_offload(reader: DocumentReader, fsdp_config: KeyPath) -> None:
    """`cpu_offload: true` wraps the model in FSDP's CPUOffload(offload_params=offload_params):
    with offload_params the parameters, their gradients and the AdamW step live on the CPU."""
    cpu_path, params_path = (*fsdp_config, "cpu_offload"), (*fsdp_config, "offload_params")
    if not reader.converted(cpu_path, as_bool):
        return
    offload = bool(reader.converted(params_path, as_bool))
    path = params_path if reader.is_set(params_path) else cpu_path
    note = (
        "FSDP CPU offload: parameters, gradients and the optimizer step on the CPU"
        if offload
        else "cpu_offload without offload_params: FSDP keeps the parameters on the GPU"
    )
    reader.put("distributed.offload_params", offload, path, note)
    reader.put("distributed.offload_optimizer", offload, path, note)


# --------------------------------------------------------------------------------------------
# RL (verl.trainer.main_ppo): the actor's update step


def read_verl_rl(reader: DocumentReader) -> None:
    model, actor = (*ACTOR_ROLLOUT_REF, "model"), (*ACTOR_ROLLOUT_REF, "actor")
    reader.take((*model, "path"), "model_id", as_text)
    read_verl_objective(reader)
    world = read_verl_world(reader)
    sequence_parallel_path = (*actor, "ulysses_sequence_parallel_size")
    sequence_parallel = max(1, reader.converted(sequence_parallel_path, as_int) or 1)
    reader.keep("ulysses_sequence_parallel_size", sequence_parallel_path)
    reader.keep("use_remove_padding", (*model, "use_remove_padding"))
    data_parallel = max(1, world // sequence_parallel)
    micro = read_verl_rl_micro_batch(reader, actor, data_parallel)
    read_verl_rl_accumulation(reader, actor, data_parallel, micro)
    if not reader.reading.has("max_seq_length"):
        read_verl_rl_length(reader)
    read_verl_model_switches(reader, model)
    read_verl_lora(reader, model)
    fsdp_config = (*actor, "fsdp_config")
    read_verl_precision(reader, fsdp_config)
    read_verl_strategy(reader, (*actor, "strategy"), fsdp_config)
    read_verl_rl_offload(reader, actor)
    read_verl_rollout(reader, actor)
    for key, value, note in VERL_RL_DEFAULTS:
        reader.default(key, value, note)


def read_verl_objective(reader: DocumentReader) -> None:
    """algorithm.adv_estimator: gae (the default) trains a critic beside the actor: PPO; the
    critic-free estimators (grpo, rloo, reinforce_plus_plus, remax, ...) are GRPO-like."""
    path = ("algorithm", "adv_estimator")
    estimator = (reader.converted(path, as_text) or "").strip().lower()
    if not estimator:
        reader.derived("objective", "ppo", "verl algorithm.adv_estimator default gae: PPO")
        return
    objective = "ppo" if estimator == "gae" else "grpo"
    reader.put("objective", objective, path, f"verl adv_estimator: {estimator}")


def read_verl_rl_micro_batch(reader: DocumentReader, actor: KeyPath, data_parallel: int) -> int:
    """Rows (prompt + response) per forward and backward on one GPU."""
    micro = reader.take(
        (*actor, "ppo_micro_batch_size_per_gpu"), "per_device_train_batch_size", as_int
    )
    if micro is not None:
        return micro
    global_path = (*actor, "ppo_micro_batch_size")
    global_micro = reader.converted(global_path, as_int)
    if global_micro is not None:
        micro = max(1, global_micro // data_parallel)
        reader.put(
            "per_device_train_batch_size",
            micro,
            global_path,
            "ppo_micro_batch_size / data-parallel GPUs",
        )
        return micro
    if reader.converted((*actor, "use_dynamic_bsz"), as_bool):
        # micro-batches are packed up to ppo_max_token_len_per_gpu tokens: one row that long
        tokens_path = (*actor, "ppo_max_token_len_per_gpu")
        tokens = reader.converted(tokens_path, as_int) or 16384
        note = "use_dynamic_bsz: each micro-batch packs up to ppo_max_token_len_per_gpu tokens"
        reader.put("per_device_train_batch_size", 1, (*actor, "use_dynamic_bsz"), note)
        if reader.is_set(tokens_path):
            reader.put("max_seq_length", tokens, tokens_path, note)
        else:
            reader.default("max_seq_length", tokens, f"{note} (default 16384)")
        return 1
    reader.problem(
        (*actor, "ppo_micro_batch_size_per_gpu") if reader.found(actor)[0] else ACTOR_ROLLOUT_REF,
        "actor.ppo_micro_batch_size_per_gpu is not set (nor use_dynamic_bsz): verl needs one",
    )
    return 1


def read_verl_rl_accumulation(
    reader: DocumentReader, actor: KeyPath, data_parallel: int, micro: int
) -> None:
    """One optimizer step per mini-batch: ppo_mini_batch_size prompts × rollout.n responses,
    spread over the data-parallel GPUs, in micro-batches."""
    responses = max(1, reader.converted((*ACTOR_ROLLOUT_REF, "rollout", "n"), as_int) or 1)
    mini_path = (*actor, "ppo_mini_batch_size")
    mini = reader.converted(mini_path, as_int)
    rows = (mini or VERL_RL_MINI_BATCH_SIZE) * responses
    steps = max(1, rows // data_parallel // micro)
    how = "ppo_mini_batch_size × rollout.n / data-parallel GPUs / micro-batch"
    if mini is not None:
        reader.put("gradient_accumulation_steps", steps, mini_path, how)
    else:
        reader.default(
            "gradient_accumulation_steps",
            steps,
            f"verl ppo_mini_batch_size default {VERL_RL_MINI_BATCH_SIZE}: {how}",
        )


def read_verl_rl_length(reader: DocumentReader) -> None:
    """A row is the prompt and its response: max_prompt_length + max_response_length."""
    prompt_path, response_path = ("data", "max_prompt_length"), ("data", "max_response_length")
    prompt = reader.converted(prompt_path, as_int)
    response = reader.converted(response_path, as_int)
    length = (prompt or VERL_RL_PROMPT_LENGTH) + (response or VERL_RL_RESPONSE_LENGTH)
    note = "data.max_prompt_length + data.max_response_length"
    if prompt is None and response is None:
        reader.default("max_seq_length", length, f"verl defaults: {note} (512 + 512)")
        return
    if prompt is None or response is None:
        note += " (the other at verl's default 512)"
    path = response_path if response is not None else prompt_path
    reader.put("max_seq_length", length, path, note)


def read_verl_rl_offload(reader: DocumentReader, actor: KeyPath) -> None:
    """param_offload and optimizer_offload move the actor's weights and AdamW states to the
    CPU between phases (room for the rollout engine) and back for the update step, so the
    step itself holds them on the GPU; FSDP2's `offload_policy: true` keeps them on the CPU
    through the step."""
    fsdp_config = (*actor, "fsdp_config")
    reader.keep("verl_param_offload", (*fsdp_config, "param_offload"))
    reader.keep("verl_optimizer_offload", (*fsdp_config, "optimizer_offload"))
    policy_path = (*fsdp_config, "offload_policy")
    strategy = (reader.converted((*actor, "strategy"), as_text) or "fsdp").strip().lower()
    if strategy == "fsdp2" and reader.converted(policy_path, as_bool):
        note = "FSDP2 CPUOffloadPolicy: parameters, gradients and the optimizer step on the CPU"
        reader.put("distributed.offload_params", True, policy_path, note)
        reader.put("distributed.offload_optimizer", True, policy_path, note)


def read_verl_rollout(reader: DocumentReader, actor: KeyPath) -> None:
    """The generation side, in the names a GRPO plan keeps (TRL's GRPOConfig fields) where verl
    means the same: `rollout.n` responses per prompt (num_generations), the prompt and response
    lengths, and the hybrid engine's rollout
    (vLLM or SGLang in the training process, holding `gpu_memory_utilization` of the GPU, its
    memory released between rollouts while `free_cache_engine` is on)."""
    rollout = (*ACTOR_ROLLOUT_REF, "rollout")
    responses_path = (*rollout, "n")
    if reader.converted(responses_path, as_int) is not None:
        reader.put("num_generations", reader.converted(responses_path, as_int), responses_path)
    else:
        reader.derived("num_generations", 1, "verl rollout.n default 1")
    for name, path, default in (
        ("max_prompt_length", ("data", "max_prompt_length"), VERL_RL_PROMPT_LENGTH),
        ("max_completion_length", ("data", "max_response_length"), VERL_RL_RESPONSE_LENGTH),
    ):
        value = reader.converted(path, as_int)
        if value is not None:
            reader.put(name, value, path)
        else:
            reader.derived(name, default, f"verl {'.'.join(path)} default {default}")
    # the KL term's reference policy is FSDP-wrapped with CPUOffload (fsdp_workers.py): its
    # weights stay on the CPU, so it is kept under verl's own name, not as TRL's `beta` (which
    # sizes a second copy of the model on the GPU)
    reader.keep("use_kl_loss", (*actor, "use_kl_loss"))
    engine = reader.converted((*rollout, "name"), as_text)
    reader.keep("rollout_engine", (*rollout, "name"))
    reader.keep("rollout_tensor_parallel_size", (*rollout, "tensor_model_parallel_size"))
    if engine is None or engine.strip().lower() not in ("vllm", "sglang"):
        return
    reader.put("use_vllm", True, (*rollout, "name"), f"rollout.name: {engine}")
    reader.derived("vllm_mode", "colocate", "verl's hybrid engine: the rollout shares the GPUs")
    utilization_path = (*rollout, "gpu_memory_utilization")
    utilization = reader.converted(utilization_path, as_float)
    if utilization is not None:
        reader.put("vllm_gpu_memory_utilization", utilization, utilization_path)
    else:
        reader.derived("vllm_gpu_memory_utilization", 0.5, "verl gpu_memory_utilization default")
    free_path = (*rollout, "free_cache_engine")
    free = reader.converted(free_path, as_bool)
    if free is not None:
        reader.put("vllm_enable_sleep_mode", free, free_path, "free_cache_engine")
    else:
        reader.derived(
            "vllm_enable_sleep_mode",
            True,
            "verl free_cache_engine default: the engine's memory is released after each rollout",
        )


# --------------------------------------------------------------------------------------------
# how a fix is written in this framework's config (`llmmem.extract.frameworks.spelling`)

# The SFT and RL layouts write the same switch under different blocks, so each lever names both
# keys as `layout_key`s: the one the file writes is edited, the other skipped. verl's defaults
# already checkpoint and compute in bf16, so a fix edits what the file turned off or set, and
# never adds a nested key. The accumulation is derived from data.train_batch_size (SFT) or
# actor.ppo_mini_batch_size (RL) over the micro-batch, so halving the micro-batch doubles it
# with no second key. verl's FSDP trainers step torch AdamW (no optimizer name to change).
VERL_SFT_MODEL: KeyPath = ("model",)
VERL_RL_MODEL: KeyPath = (*ACTOR_ROLLOUT_REF, "model")


def _in_both_layouts(sft: KeyPath, rl: KeyPath, value: Any) -> Spelling:
    return (KeyWrite(sft, value, layout_key=True), KeyWrite(rl, value, layout_key=True))


FIX_SPELLINGS: dict[str, Spelling] = {
    "grad-ckpt": _in_both_layouts(
        (*VERL_SFT_MODEL, "enable_gradient_checkpointing"),
        (*VERL_RL_MODEL, "enable_gradient_checkpointing"),
        True,
    ),
    "liger": _in_both_layouts((*VERL_SFT_MODEL, "use_liger"), (*VERL_RL_MODEL, "use_liger"), True),
    "halve-batch": _in_both_layouts(
        ("data", "micro_batch_size_per_gpu"),
        (*ACTOR_ROLLOUT_REF, "actor", "ppo_micro_batch_size_per_gpu"),
        half_batch,
    ),
}

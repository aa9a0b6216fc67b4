"""OpenRLHF's trainers, read from their command line.

    deepspeed --module openrlhf.cli.train_dpo --pretrain meta-llama/Llama-3.1-8B-Instruct \\
        --micro_train_batch_size 1 --max_len 2048 --zero_stage 3 --bf16 --beta 0.1 ...
    ray job submit --address=http://127.0.0.1:8265 -- python3 -m openrlhf.cli.train_ppo_ray \\
        --pretrain Qwen/Qwen2.5-7B-Instruct --advantage_estimator group_norm ...

OpenRLHF has no config file: each trainer (`openrlhf.cli.train_sft`, `train_dpo`, `train_kto`,
`train_rm`, `train_ppo_ray`) declares its own argparse flags and builds the DeepSpeed config
from them in code. Read at OpenRLHF 0.11.2 (openrlhf/cli/*.py, models/actor.py,
utils/deepspeed/deepspeed_utils.py), with the two older spellings its published scripts still
use:

- 0.10.2 on (0.11.2 read): dotted names, `--model.model_name_or_path`,
  `--train.micro_batch_size`, `--data.max_len`, `--ds.zero_stage`, `--ds.param_dtype`,
  `--ds.lora.rank`, `--model.gradient_checkpointing_enable` (PPO: `--actor.*`),
  `--rollout.n_samples_per_prompt`, `--algo.advantage.estimator`, `--algo.kl.init_coef`,
  `--vllm.num_engines`, `--train.colocate_all`, ...;
- up to 0.10.1 (0.10.1.post2 read): the flat names `--pretrain`, `--micro_train_batch_size`,
  `--max_len`, `--zero_stage`, `--param_dtype`, `--lora_rank`, `--gradient_checkpointing`,
  `--n_samples_per_prompt`, `--advantage_estimator`, `--init_kl_coef`, `--vllm_num_engines`,
  `--colocate_all_models`, `--ref_reward_offload`, ...;
- before 0.9.10 (0.9.0 read, the last release read that ships `train_kto`): `--bf16` instead of
  `--param_dtype`, PPO's `--prompt_max_len` + `--generate_max_len`; and up to 0.7 (0.7.5
  read) `--flash_attn` instead of `--attn_implementation` (eager attention without it).

What the flags mean for memory:

    model               --pretrain; DPO and KTO load a second, frozen model as the reference
                        (--ref_pretrain, else --pretrain), under LoRA too; PPO/GRPO load one
                        when --init_kl_coef > 0 (default 0.01), on its own GPUs unless
                        --colocate_actor_ref or --colocate_all_models
    objective           the trainer: train_dpo -> dpo (--ipo changes the loss only), train_kto
                        -> kto, train_rm -> reward, train_ppo_ray -> ppo, or grpo with a
                        critic-free --advantage_estimator (anything but gae); train_sft -> none
    micro-batch         --micro_train_batch_size (sft, dpo, kto: 8; rm, ppo: 1)
    sequence length     --max_len (sft 2048, dpo 512, rm 512, kto 2048; ppo 2048: prompt and
                        response together); 0.9's PPO: --prompt_max_len + --generate_max_len
                        (1024 each)
    precision           --param_dtype bf16|fp16 (default bf16): the weights in that dtype,
                        DeepSpeed's bf16/fp16 engine with fp32 master weights; 0.9's --bf16
    ZeRO                --zero_stage (default 2); --adam_offload: the optimizer on the CPU
    LoRA                --lora_rank N (0: none), --lora_alpha (16), --lora_dropout (0),
                        --target_modules (all-linear); --load_in_4bit: NF4 with double
                        quantization, bf16 compute (QLoRA)
    attention           --attn_implementation (default flash_attention_2); 0.7's --flash_attn
    generation (PPO)    --n_samples_per_prompt (1), --vllm_num_engines (none: the actor
                        generates), --vllm_gpu_memory_utilization (0.95), --vllm_enable_sleep
                        (only with --colocate_all_models)

`openrlhf_meanings` turns the flags into plan values, each with the range of its flag or as the
trainer's argparse default (`cli-default`), and the problems with them: the flags' spellings,
defaults and values are in `openrlhf_flags`, what they mean in `openrlhf_reading` (every
trainer; DPO's and KTO's reference) and `openrlhf_rollout` (train_ppo_ray). `FIX_SPELLINGS` (and
`fix_spellings` for the dotted names) is how a fix is written on such a command line
(`llmmem.rules.shell_edits`).
"""

from __future__ import annotations

from collections.abc import Iterable

from llmmem.extract.frameworks.deepspeed_chat import CommandLineValue, FlagMeaning
from llmmem.extract.frameworks.openrlhf_flags import LIST_FLAGS as LIST_FLAGS
from llmmem.extract.frameworks.openrlhf_flags import OPENRLHF_RELEASE as OPENRLHF_RELEASE
from llmmem.extract.frameworks.openrlhf_flags import openrlhf_trainer as openrlhf_trainer
from llmmem.extract.frameworks.openrlhf_flags import uses_dotted_names as uses_dotted_names
from llmmem.extract.frameworks.openrlhf_reading import OpenRLHFReading
from llmmem.extract.frameworks.openrlhf_rollout import RolloutReading
from llmmem.extract.frameworks.spelling import KeyWrite, Spelling, half_batch
from llmmem.plan import SourceRange


def openrlhf_meanings(
    trainer: str,
    flags: Iterable[CommandLineValue],
    written: Iterable[str],
    *,
    trainer_range: SourceRange | None = None,
    world_size: int | None = None,
) -> tuple[list[FlagMeaning], list[tuple[SourceRange | None, str]]]:
    """The plan values an OpenRLHF trainer's flags give, and the problems with them (each with
    the range of its flag). `flags` are the flags whose values are known before the script
    runs; `written` names every flag on the command line, known or not (a flag written with a
    value known only at run time takes no default). `trainer_range` is where the trainer's
    module is named; `world_size` the launcher's process count where known."""
    kind = RolloutReading if trainer == "train_ppo_ray" else OpenRLHFReading
    reading = kind(trainer, flags, written, trainer_range, world_size)
    reading.read()
    return reading.meanings, reading.problems


# -- how a fix is written on an OpenRLHF command line
#
# Each trainer reads only its own argparse flags; anything else stops it with "unrecognized
# arguments", and the names changed at 0.10.2 (flat -> dotted). A fix is spelled the way the
# command line already spells OpenRLHF's flags. The levers with a flag:
#   checkpointing   --gradient_checkpointing (store_true: bare); 0.10.2 on
#                   --model.gradient_checkpointing_enable (PPO: --actor.*)
#   micro-batch     --micro_train_batch_size N (--train.micro_batch_size N); the accumulation
#                   follows from --train_batch_size, the global batch, which stays
#   precision       --param_dtype bf16 where it is written fp16 (bf16 is the default; 0.9's
#                   --bf16 is not added: newer trainers stop on it)
# OpenRLHF builds its optimizer in code (FusedAdam, DeepSpeedCPUAdam with --adam_offload): no
# 8-bit optimizer; QLoRA needs --load_in_4bit with --lora_rank, not offered from here.

FIX_SPELLINGS: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("gradient_checkpointing",), True),),
    "halve-batch": (KeyWrite(("micro_train_batch_size",), half_batch),),
    "bf16": (KeyWrite(("param_dtype",), "bf16", only_if_written=True),),
}
DOTTED_FIX_SPELLINGS: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("model", "gradient_checkpointing_enable"), True),),
    "halve-batch": (KeyWrite(("train", "micro_batch_size"), half_batch),),
    "bf16": (KeyWrite(("ds", "param_dtype"), "bf16", only_if_written=True),),
}


def fix_spellings(trainer: str, dotted: bool) -> dict[str, Spelling]:
    """The fix table for a trainer's command line, in the names it is written with."""
    if not dotted:
        return FIX_SPELLINGS
    if trainer == "train_ppo_ray":
        return {
            **DOTTED_FIX_SPELLINGS,
            "grad-ckpt": (KeyWrite(("actor", "gradient_checkpointing_enable"), True),),
        }
    return DOTTED_FIX_SPELLINGS

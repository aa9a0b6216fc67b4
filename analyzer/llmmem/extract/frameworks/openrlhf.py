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
- up to 0.9.x (0.9.0 read, the last release read that ships `train_kto`): `--bf16` instead of
  `--param_dtype`, `--flash_attn`, and PPO's `--prompt_max_len` + `--generate_max_len`.

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
    attention           --attn_implementation (default flash_attention_2); 0.9's --flash_attn
    generation (PPO)    --n_samples_per_prompt (1), --vllm_num_engines (none: the actor
                        generates), --vllm_gpu_memory_utilization (0.95), --vllm_enable_sleep
                        (only with --colocate_all_models)

`openrlhf_meanings` turns the flags into plan values, each with the range of its flag or as the
trainer's argparse default (`cli-default`), and the problems with them. `FIX_SPELLINGS` (and
`fix_spellings` for the dotted names) is how a fix is written on such a command line
(`llmmem.rules.shell_edits`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from llmmem.extract.frameworks.deepspeed_chat import CommandLineValue, FlagMeaning
from llmmem.extract.frameworks.spelling import KeyWrite, Spelling, half_batch
from llmmem.plan import Provenance, SourceRange

OPENRLHF_RELEASE = "0.11.2"

# the trainer module -> the objective it trains for (None: supervised fine-tuning)
TRAINER_OBJECTIVES: dict[str, str | None] = {
    "train_sft": None,
    "train_dpo": "dpo",
    "train_kto": "kto",
    "train_rm": "reward",
    "train_ppo_ray": "ppo",
}
# --advantage_estimator's choices (0.11.2); gae trains a critic (PPO), the others compare the
# samples of one prompt or the batch instead (GRPO-like: no value model)
ESTIMATORS = (
    "gae",
    "reinforce",
    "rloo",
    "reinforce_baseline",
    "group_norm",
    "dr_grpo",
    "flash_reinforce",
)
# estimators that need more than one sample per prompt (train_ppo_ray.py asserts it)
GROUP_ESTIMATORS = frozenset({"rloo", "reinforce_baseline", "group_norm", "dr_grpo"})
PARAM_DTYPES = ("bf16", "fp16")

# each flag's spellings: the flat name (up to 0.10.1, and 0.9's), then the dotted ones (0.10.2 on)
SPELLINGS: dict[str, tuple[str, ...]] = {
    "pretrain": ("pretrain", "model.model_name_or_path", "actor.model_name_or_path"),
    "ref_pretrain": ("ref_pretrain", "ref.model_name_or_path"),
    "reward_pretrain": ("reward_pretrain", "reward.model_name_or_path"),
    "critic_pretrain": ("critic_pretrain", "critic.model_name_or_path"),
    "remote_rm_url": ("remote_rm_url", "reward.remote_url"),
    "micro_train_batch_size": ("micro_train_batch_size", "train.micro_batch_size"),
    "train_batch_size": ("train_batch_size", "train.batch_size"),
    "max_len": ("max_len", "data.max_len"),
    "prompt_max_len": ("prompt_max_len",),
    "generate_max_len": ("generate_max_len",),
    "max_new_tokens": ("max_new_tokens", "rollout.max_new_tokens"),
    "bf16": ("bf16",),
    "param_dtype": ("param_dtype", "ds.param_dtype"),
    "gradient_checkpointing": (
        "gradient_checkpointing",
        "model.gradient_checkpointing_enable",
        "actor.gradient_checkpointing_enable",
    ),
    "zero_stage": ("zero_stage", "ds.zero_stage"),
    "adam_offload": ("adam_offload", "ds.adam_offload"),
    "lora_rank": ("lora_rank", "ds.lora.rank"),
    "lora_alpha": ("lora_alpha", "ds.lora.alpha"),
    "lora_dropout": ("lora_dropout", "ds.lora.dropout"),
    "target_modules": ("target_modules", "ds.lora.target_modules"),
    "load_in_4bit": ("load_in_4bit", "ds.load_in_4bit"),
    "flash_attn": ("flash_attn",),
    "attn_implementation": ("attn_implementation", "ds.attn_implementation"),
    "packing_samples": ("packing_samples", "ds.packing_samples"),
    "use_liger_kernel": ("use_liger_kernel", "ds.use_liger_kernel"),
    "optim": ("optim", "actor.optim"),
    "ring_attn_size": ("ring_attn_size", "ds.ring_attn_size"),
    "ds_tensor_parallel_size": ("ds_tensor_parallel_size", "ds.tensor_parallel_size"),
    "beta": ("beta", "model.beta"),
    "ipo": ("ipo", "model.ipo_enable"),
    "ref_offload": ("ref_offload", "ref.offload"),
    "n_samples_per_prompt": ("n_samples_per_prompt", "rollout.n_samples_per_prompt"),
    "micro_rollout_batch_size": ("micro_rollout_batch_size", "rollout.micro_batch_size"),
    "advantage_estimator": ("advantage_estimator", "algo.advantage.estimator"),
    "init_kl_coef": ("init_kl_coef", "algo.kl.init_coef"),
    "use_kl_loss": ("use_kl_loss", "algo.kl.use_loss"),
    "vllm_num_engines": ("vllm_num_engines", "vllm.num_engines"),
    "vllm_tensor_parallel_size": ("vllm_tensor_parallel_size", "vllm.tensor_parallel_size"),
    "vllm_gpu_memory_utilization": (
        "vllm_gpu_memory_utilization",
        "vllm.gpu_memory_utilization",
    ),
    "vllm_enable_sleep": ("vllm_enable_sleep", "vllm.enable_sleep"),
    "colocate_all_models": ("colocate_all_models", "train.colocate_all"),
    "colocate_actor_ref": ("colocate_actor_ref", "train.colocate_actor_ref"),
    "colocate_critic_reward": ("colocate_critic_reward", "train.colocate_critic_reward"),
    "ref_reward_offload": ("ref_reward_offload",),  # 0.10.2 on: --ref.offload, --reward.offload
    "reward_offload": ("reward.offload",),
    "actor_num_nodes": ("actor_num_nodes", "actor.num_nodes"),
    "actor_num_gpus_per_node": ("actor_num_gpus_per_node", "actor.num_gpus_per_node"),
}
OPENRLHF_FLAGS = frozenset(name for names in SPELLINGS.values() for name in names)
# flags that take several words (argparse nargs)
LIST_FLAGS = frozenset(
    {
        "target_modules",
        "ds.lora.target_modules",
        "adam_betas",
        "adam.betas",
        "actor.adam.betas",
        "critic.adam.betas",
    }
)

# -- the trainers' argparse defaults (0.11.2; train_kto at 0.9.0)

COMMON_DEFAULTS: dict[str, Any] = {
    "zero_stage": 2,
    "param_dtype": "bf16",
    "attn_implementation": "flash_attention_2",
    "lora_rank": 0,
    "lora_alpha": 16,
    "lora_dropout": 0.0,
    "target_modules": "all-linear",
    "train_batch_size": 128,
}
TRAINER_DEFAULTS: dict[str, dict[str, Any]] = {
    "train_sft": {"micro_train_batch_size": 8, "max_len": 2048},
    "train_dpo": {"micro_train_batch_size": 8, "max_len": 512, "beta": 0.1},
    "train_kto": {"micro_train_batch_size": 8, "max_len": 2048, "beta": 0.01},
    "train_rm": {"micro_train_batch_size": 1, "max_len": 512},
    "train_ppo_ray": {
        "micro_train_batch_size": 1,
        "max_len": 2048,  # prompt and response together (0.9: 1024 + 1024)
        "n_samples_per_prompt": 1,
        "advantage_estimator": "gae",
        "init_kl_coef": 0.01,
        "vllm_gpu_memory_utilization": 0.95,
        "actor_num_nodes": 1,
        "actor_num_gpus_per_node": 8,
    },
}
OLD_ONLY_FLAGS = frozenset({"bf16", "flash_attn", "prompt_max_len", "generate_max_len"})
OLD_PPO_LENGTHS = {"prompt_max_len": 1024, "generate_max_len": 1024}  # 0.9.0's defaults

TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")


def openrlhf_trainer(target: str) -> str | None:
    """The OpenRLHF trainer a launched module or script is (`openrlhf.cli.train_dpo`,
    `openrlhf/cli/train_dpo.py` -> "train_dpo"); None for anything else."""
    text = target.strip()
    if text.endswith(".py"):
        parts = text[: -len(".py")].split("/")
        if len(parts) >= 3 and parts[-3:-1] == ["openrlhf", "cli"]:
            return parts[-1]
        return None
    parts = text.split(".")
    if len(parts) == 3 and parts[:2] == ["openrlhf", "cli"] and parts[2].startswith("train_"):
        return parts[2]
    return None


def uses_dotted_names(written: Iterable[str]) -> bool:
    """Whether a command line spells OpenRLHF's flags the 0.10.2-on way (`--ds.zero_stage`)."""
    return any("." in name and name in OPENRLHF_FLAGS for name in written)


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
    reading = _OpenRLHFFlags(trainer, flags, written, trainer_range, world_size)
    reading.read()
    return reading.meanings, reading.problems


class _OpenRLHFFlags:
    def __init__(
        self,
        trainer: str,
        flags: Iterable[CommandLineValue],
        written: Iterable[str],
        trainer_range: SourceRange | None,
        world_size: int | None,
    ) -> None:
        self.trainer = trainer
        self.known_trainer = trainer in TRAINER_OBJECTIVES
        self.defaults = {
            **COMMON_DEFAULTS,
            **TRAINER_DEFAULTS.get(trainer, TRAINER_DEFAULTS["train_sft"]),
        }
        canonical = {name: key for key, names in SPELLINGS.items() for name in names}
        self.given: dict[str, CommandLineValue] = {}
        self.spelled: dict[str, str] = {}  # canonical -> the name as written
        for flag in flags:
            name = ".".join(str(step) for step in flag.path)
            key = canonical.get(name)
            if key is not None:
                self.given[key] = flag
                self.spelled[key] = name
        written_names = set(written)
        self.written = {canonical[name] for name in written_names if name in canonical}
        for name in written_names:
            if name in canonical:
                self.spelled.setdefault(canonical[name], name)
        self.dotted = uses_dotted_names(written_names)
        self.trainer_range = trainer_range
        self.world_size = world_size
        self.meanings: list[FlagMeaning] = []
        self.problems: list[tuple[SourceRange | None, str]] = []

    # -- the whole command line

    def read(self) -> None:
        self.objective()
        self.model()
        world = self.actor_gpus() if self.trainer == "train_ppo_ray" else self.world_size
        micro = self.micro_batch()
        self.accumulation(micro, world)
        if self.trainer == "train_ppo_ray":
            self.rollout_lengths()
        else:
            self.sequence_length()
        self.precision()
        self.switch("gradient_checkpointing", "gradient_checkpointing")
        self.zero()
        self.lora()
        self.attention()
        self.optimizer()
        self.kept_switches()
        if self.trainer in ("train_dpo", "train_kto"):
            self.preference()
        if self.trainer == "train_ppo_ray":
            self.reinforcement()

    def objective(self) -> None:
        if not self.known_trainer:
            self.problem(
                None,
                f"OpenRLHF's {self.trainer} is not read as its own method: sized as supervised "
                "fine-tuning of --pretrain",
            )
            return
        objective = TRAINER_OBJECTIVES[self.trainer]
        if objective is None:
            return
        if self.trainer != "train_ppo_ray":
            note = f"OpenRLHF's {self.trainer}"
            if self.trainer == "train_dpo" and self.on("ipo"):
                note += " with --ipo (IPO's loss, DPO's forward passes)"
            self.meanings.append(
                FlagMeaning("objective", objective, Provenance.EXPLICIT, self.trainer_range, note)
            )
            return
        estimator = self.choice("advantage_estimator", ESTIMATORS)
        if estimator is None:
            if "advantage_estimator" in self.written:
                return  # known at run time only, or wrong (reported)
            self.meanings.append(
                FlagMeaning(
                    "objective",
                    "ppo",
                    Provenance.CLI_DEFAULT,
                    None,
                    "OpenRLHF's --advantage_estimator default gae: PPO, with a critic",
                )
            )
            self.default_value("advantage_estimator", "gae", "advantage_estimator")
            return
        self.explicit("advantage_estimator", estimator, "advantage_estimator")
        if estimator == "gae":
            note = f"{self.flag('advantage_estimator')} gae: PPO, with a critic"
            self.explicit("objective", "ppo", "advantage_estimator", note)
        else:
            note = (
                f"{self.flag('advantage_estimator')} {estimator}: no critic, advantages from "
                "the samples' rewards (GRPO-like)"
            )
            self.explicit("objective", "grpo", "advantage_estimator", note)

    def model(self) -> None:
        model = self.text("pretrain")
        if model is not None:
            self.explicit("model_id", model, "pretrain")
        elif "pretrain" not in self.written:
            self.problem(None, f"OpenRLHF's {self.trainer} needs --pretrain (the model to train)")

    def actor_gpus(self) -> int | None:
        """PPO: the actor trains on --actor_num_nodes × --actor_num_gpus_per_node GPUs (Ray
        places them; the launcher runs one driver process)."""
        nodes = self.whole("actor_num_nodes", 1)
        gpus = self.whole("actor_num_gpus_per_node", 1)
        if nodes is None or gpus is None:
            return None
        note = (
            f"{self.flag('actor_num_nodes')} × {self.flag('actor_num_gpus_per_node')}: the "
            "actor's GPUs"
        )
        where = "actor_num_gpus_per_node" if "actor_num_gpus_per_node" in self.given else None
        where = where or ("actor_num_nodes" if "actor_num_nodes" in self.given else None)
        if where is not None:
            self.explicit("distributed.world_size", nodes * gpus, where, note)
        else:
            self.default(
                "distributed.world_size", nodes * gpus, f"OpenRLHF's defaults (1 × 8): {note}"
            )
        return nodes * gpus

    def micro_batch(self) -> int | None:
        micro = self.whole("micro_train_batch_size", 1)
        if micro is not None:
            self.value_of("per_device_train_batch_size", micro, "micro_train_batch_size")
        else:
            self.fallback("per_device_train_batch_size", "micro_train_batch_size")
        return micro

    def accumulation(self, micro: int | None, world: int | None) -> None:
        """DeepSpeed's accumulation: --train_batch_size (global) / micro-batch / GPUs."""
        batch = self.whole("train_batch_size", 1)
        if micro is None or batch is None:
            return
        gpus = world or 1
        steps = max(1, batch // (micro * gpus))
        note = f"{self.flag('train_batch_size')} {batch} / (micro-batch {micro} × {gpus} GPU(s))"
        if world is None:
            note += "; the GPU count is not known here: 1 taken"
        if "train_batch_size" in self.given:
            self.explicit("gradient_accumulation_steps", steps, "train_batch_size", note)
        else:
            self.default("gradient_accumulation_steps", steps, f"OpenRLHF's default {note}")

    def sequence_length(self) -> None:
        length = self.whole("max_len", 1)
        if length is not None:
            self.value_of("max_seq_length", length, "max_len")
        else:
            self.fallback("max_seq_length", "max_len")

    def rollout_lengths(self) -> None:
        """PPO/GRPO rows are prompt + response. 0.9: --prompt_max_len + --generate_max_len;
        later: --max_len for both, a response up to --max_new_tokens (else what the prompt
        leaves)."""
        if self.written & {"prompt_max_len", "generate_max_len"}:
            prompt = self.whole("prompt_max_len", 1, OLD_PPO_LENGTHS["prompt_max_len"])
            response = self.whole("generate_max_len", 1, OLD_PPO_LENGTHS["generate_max_len"])
            if prompt is None or response is None:
                return
            for key, name, value in (
                ("max_prompt_length", "prompt_max_len", prompt),
                ("max_completion_length", "generate_max_len", response),
            ):
                if name in self.given:
                    self.explicit(key, value, name)
                else:
                    self.default(key, value, f"OpenRLHF 0.9's --{name} default {value}")
            where = "generate_max_len" if "generate_max_len" in self.given else "prompt_max_len"
            note = "--prompt_max_len + --generate_max_len"
            self.explicit("max_seq_length", prompt + response, where, note)
            return
        length = self.whole("max_len", 2)
        if length is None:
            self.fallback("max_seq_length", "max_len")
            return
        self.value_of("max_seq_length", length, "max_len", "prompt and response together")
        response = self.whole("max_new_tokens", 1, None)
        if response is not None:
            if response >= length:
                self.problem(
                    self.given["max_new_tokens"].range,
                    f"--max_new_tokens {response} leaves no room for a prompt in --max_len "
                    f"{length}: rows are cut at --max_len",
                )
                response = length - 1
            self.explicit("max_completion_length", response, "max_new_tokens")
            self.derived(
                "max_prompt_length",
                length - response,
                "--max_len less --max_new_tokens",
                self.range_of("max_len"),
            )
        elif "max_new_tokens" not in self.written:
            self.derived(
                "max_completion_length",
                length - 1,
                "--max_new_tokens not given: a response takes what its prompt leaves of "
                "--max_len; counted at its longest (after a 1-token prompt)",
                self.range_of("max_len"),
            )
            self.derived(
                "max_prompt_length",
                1,
                "prompt and response share --max_len",
                self.range_of("max_len"),
            )

    def precision(self) -> None:
        if "param_dtype" in self.given:
            dtype = self.choice("param_dtype", PARAM_DTYPES)
            if dtype is not None:
                note = (
                    f"{self.flag('param_dtype')} {dtype}: DeepSpeed's {dtype} engine, fp32 "
                    "master weights"
                )
                self.explicit("precision", dtype, "param_dtype", note)
            return
        if "bf16" in self.given:
            if self.switch_value("bf16"):
                note = "--bf16: DeepSpeed's bf16 engine, fp32 master weights"
                self.explicit("precision", "bf16", "bf16", note)
            return
        if "param_dtype" in self.written or "bf16" in self.written:
            return
        if self.written & OLD_ONLY_FLAGS:
            self.problem(
                None,
                "the flags are OpenRLHF 0.9's, whose trainers without --bf16 keep the "
                "checkpoint's dtype without DeepSpeed's bf16 engine; sized as bf16",
            )
        self.default(
            "precision",
            "bf16",
            f"OpenRLHF's {self.flag('param_dtype')} default bf16 (0.9.10 on; 0.9.0's trainers "
            "took --bf16)",
        )

    def zero(self) -> None:
        stage = self.whole("zero_stage", 0, highest=3)
        if stage is not None:
            self.value_of("distributed.zero_stage", stage, "zero_stage")
        else:
            self.fallback("distributed.zero_stage", "zero_stage")
        if self.switch_value("adam_offload"):
            self.explicit(
                "distributed.offload_optimizer",
                True,
                "adam_offload",
                f"{self.flag('adam_offload')}: DeepSpeedCPUAdam, the optimizer on the CPU",
            )

    def lora(self) -> None:
        rank = self.whole("lora_rank", 0)
        quantized = self.switch_value("load_in_4bit")
        if quantized:
            note = (
                f"{self.flag('load_in_4bit')}: BitsAndBytes NF4, double quantization, bf16 compute"
            )
            for key, value in (
                ("quantization.bits", 4),
                ("quantization.quant_type", "nf4"),
                ("quantization.double_quant", True),
                ("quantization.compute_dtype", "bfloat16"),
            ):
                self.explicit(key, value, "load_in_4bit", note)
            self.derived(
                "quantization.prepare_for_kbit_training",
                False,
                "OpenRLHF does not call prepare_model_for_kbit_training",
            )
            if self.choice("param_dtype", PARAM_DTYPES, quiet=True) == "fp16":
                self.problem(
                    self.range_of("load_in_4bit"),
                    "--load_in_4bit needs --param_dtype bf16 (OpenRLHF stops otherwise)",
                )
        if rank is None or rank == 0:
            if rank == 0 and "lora_rank" in self.given:
                self.explicit(
                    "lora.enabled", False, "lora_rank", f"{self.flag('lora_rank')} 0: no LoRA"
                )
            if quantized:
                self.problem(
                    self.range_of("load_in_4bit"),
                    "--load_in_4bit without --lora_rank: 4-bit weights cannot be trained; "
                    "OpenRLHF trains LoRA adapters over them",
                )
            return
        self.explicit("lora.enabled", True, "lora_rank", f"{self.flag('lora_rank')} {rank}")
        self.explicit("lora.r", rank, "lora_rank")
        alpha = self.whole("lora_alpha", 0)
        if alpha is not None:
            self.value_of("lora.alpha", alpha, "lora_alpha")
        dropout = self.fraction("lora_dropout", upper=1.0, closed=False)
        if dropout is not None:
            self.value_of("lora.dropout", dropout, "lora_dropout")
        if "target_modules" in self.given:
            value = self.given["target_modules"].value
            names = value if isinstance(value, list) else [value]
            if value is True or not names:
                self.problem(self.range_of("target_modules"), "--target_modules needs module names")
            else:
                self.explicit(
                    "lora.target_modules", [str(name) for name in names], "target_modules"
                )
        elif "target_modules" not in self.written:
            self.default(
                "lora.target_modules",
                ["all-linear"],
                f"OpenRLHF's {self.flag('target_modules')} default all-linear",
            )

    def attention(self) -> None:
        if "attn_implementation" in self.given:
            text = self.text("attn_implementation")
            if text is not None:
                self.explicit("attn_implementation", text, "attn_implementation")
            return
        if "flash_attn" in self.given:
            if self.switch_value("flash_attn"):
                self.explicit(
                    "attn_implementation", "flash_attention_2", "flash_attn", "--flash_attn"
                )
            return
        if "attn_implementation" not in self.written:
            self.default(
                "attn_implementation",
                "flash_attention_2",
                f"OpenRLHF's {self.flag('attn_implementation')} default flash_attention_2",
            )

    def optimizer(self) -> None:
        optim = self.text("optim")
        if optim is not None and optim.strip().lower() == "muon":
            self.explicit("openrlhf_optim", "muon", "optim")
            self.problem(
                self.range_of("optim"),
                "--optim muon: Muon's states are not sized here; counted as AdamW's",
            )
        adam = "DeepSpeedCPUAdam" if self.on("adam_offload") else "DeepSpeed's FusedAdam"
        self.derived("optim", "adamw_torch", f"OpenRLHF steps {adam}: fp32 moments like AdamW")

    def kept_switches(self) -> None:
        """Flags that change the memory in ways llmmem does not size: kept, and said."""
        for name in ("packing_samples", "use_liger_kernel"):
            if self.switch_value(name):
                self.explicit(name, True, name)
        for name in ("ring_attn_size", "ds_tensor_parallel_size"):
            size = self.whole(name, 1, None)
            if size is not None and name in self.given:
                self.explicit(name, size, name)
                if size > 1:
                    self.problem(
                        self.range_of(name),
                        f"{self.flag(name)} {size}: the split of each sequence or layer across "
                        "GPUs is not sized here; counted on one GPU",
                    )

    # -- DPO and KTO: the reference model

    def preference(self) -> None:
        beta = self.fraction("beta", upper=None)
        if beta is not None:
            self.value_of("beta", beta, "beta")
        if self.on("ipo"):
            self.explicit("ipo", True, "ipo")
        reference = self.text("ref_pretrain")
        if reference is not None:
            self.explicit("ref_model_id", reference, "ref_pretrain", "the reference model")
        elif "ref_pretrain" not in self.written:
            model = self.text("pretrain")
            if model is not None:
                self.derived(
                    "ref_model_id",
                    model,
                    f"OpenRLHF's {self.trainer} loads a second, frozen copy of --pretrain as "
                    "the reference (under LoRA too)",
                    self.range_of("pretrain"),
                )
        if self.switch_value("ref_offload"):
            self.explicit("ref_offload", True, "ref_offload")
            stage = self.whole("zero_stage", 0, highest=3, quiet=True)
            if stage == 3:
                self.problem(
                    self.range_of("ref_offload"),
                    "--ref_offload under ZeRO-3: the reference model's weights live on the CPU; "
                    "this estimate counts them on the GPU (an upper bound)",
                )
            else:
                self.problem(
                    self.range_of("ref_offload"),
                    "--ref_offload offloads the reference model only under --zero_stage 3 "
                    "(OpenRLHF's reference runs ZeRO-0 otherwise): no change",
                )

    # -- PPO and GRPO: generation, the other models, their placement

    def reinforcement(self) -> None:
        samples = self.whole("n_samples_per_prompt", 1)
        if samples is not None:
            self.value_of("num_generations", samples, "n_samples_per_prompt")
            estimator = self.choice("advantage_estimator", ESTIMATORS, quiet=True)
            if estimator in GROUP_ESTIMATORS and samples < 2:
                self.problem(
                    self.range_of("n_samples_per_prompt") or self.range_of("advantage_estimator"),
                    f"--advantage_estimator {estimator} needs --n_samples_per_prompt 2 or more "
                    "(OpenRLHF stops otherwise)",
                )
        rows = self.whole("micro_rollout_batch_size", 1, None)
        if rows is not None:
            self.explicit("micro_rollout_batch_size", rows, "micro_rollout_batch_size")
        colocate_all = self.switch_value("colocate_all_models")
        colocate_ref = self.switch_value("colocate_actor_ref")
        for name, value in (
            ("colocate_all_models", colocate_all),
            ("colocate_actor_ref", colocate_ref),
        ):
            if value:
                self.explicit(name, True, name)
        self.kl_reference(colocate_all or colocate_ref)
        self.vllm(colocate_all)
        self.other_models(colocate_all)

    def kl_reference(self, colocated: bool) -> None:
        """--init_kl_coef > 0 loads a reference model: on the actor's GPUs only when colocated.
        It is written as `beta` (the KL coefficient a GRPO plan reads) where it shares the
        actor's GPUs, as 0 where it does not."""
        coefficient = self.fraction("init_kl_coef", upper=None)
        if coefficient is None:
            return
        self.value_of("init_kl_coef", coefficient, "init_kl_coef")
        if self.switch_value("use_kl_loss"):
            self.explicit("use_kl_loss", True, "use_kl_loss")
        where = self.range_of("init_kl_coef")
        if coefficient == 0:
            self.derived("beta", 0.0, f"{self.flag('init_kl_coef')} 0: no reference model", where)
            return
        model = self.text("pretrain")
        if model is not None:
            self.derived(
                "ref_model_id",
                model,
                "OpenRLHF loads the reference from --pretrain, a second model under LoRA too",
                self.range_of("pretrain"),
            )
        if colocated:
            placement = (
                "--colocate_all_models"
                if self.on("colocate_all_models")
                else "--colocate_actor_ref"
            )
            self.value_of(
                "beta",
                coefficient,
                "init_kl_coef",
                f"the KL coefficient; the reference model shares the actor's GPUs ({placement})",
            )
        else:
            self.derived(
                "beta",
                0.0,
                f"init_kl_coef {coefficient}: the reference model runs on its own GPUs "
                "(--ref_num_gpus_per_node), none on the actor's",
                where,
            )
        if self.switch_value("ref_reward_offload") or self.switch_value("ref_offload"):
            name = "ref_reward_offload" if self.on("ref_reward_offload") else "ref_offload"
            self.explicit(name, True, name)
            if colocated:
                self.problem(
                    self.range_of(name),
                    f"{self.flag(name)}: the reference model's weights are offloaded between "
                    "its forward passes; this estimate counts them on the GPU (an upper bound)",
                )

    def vllm(self, colocate_all: bool) -> None:
        engines = self.whole("vllm_num_engines", 0, None)
        if engines is not None and "vllm_num_engines" in self.given:
            self.explicit("vllm_num_engines", engines, "vllm_num_engines")
        if not engines:
            if "vllm_num_engines" not in self.written:
                self.derived(
                    "use_vllm", False, "--vllm_num_engines not given: the actor generates itself"
                )
            elif engines == 0:
                self.explicit(
                    "use_vllm", False, "vllm_num_engines", "0 engines: the actor generates"
                )
            return
        self.explicit("use_vllm", True, "vllm_num_engines", f"{engines} vLLM engine(s)")
        if colocate_all:
            self.explicit(
                "vllm_mode",
                "colocate",
                "colocate_all_models",
                "the vLLM engines share the actor's GPUs",
            )
        else:
            self.derived(
                "vllm_mode",
                "server",
                "without --colocate_all_models the vLLM engines run on GPUs of their own",
                self.range_of("vllm_num_engines"),
            )
        utilization = self.fraction("vllm_gpu_memory_utilization", upper=1.0, lower_open=True)
        if utilization is not None:
            self.value_of("vllm_gpu_memory_utilization", utilization, "vllm_gpu_memory_utilization")
        sleep = self.switch_value("vllm_enable_sleep")
        if sleep and colocate_all:
            self.explicit("vllm_enable_sleep_mode", True, "vllm_enable_sleep")
        elif sleep:
            self.explicit(
                "vllm_enable_sleep_mode",
                False,
                "vllm_enable_sleep",
                "OpenRLHF turns --vllm_enable_sleep off without --colocate_all_models",
            )

    def other_models(self, colocate_all: bool) -> None:
        """PPO's critic (gae) and reward model: kept, and said where they share the GPUs."""
        estimator = self.choice("advantage_estimator", ESTIMATORS, quiet=True) or "gae"
        reward = self.text("reward_pretrain")
        remote = self.text("remote_rm_url")
        if reward is not None:
            self.explicit("reward_model_id", reward, "reward_pretrain")
        if remote is not None:
            self.explicit("remote_rm_url", remote, "remote_rm_url")
        critic = self.text("critic_pretrain")
        if estimator == "gae":
            if critic is not None:
                self.explicit("critic_model_id", critic, "critic_pretrain")
            else:
                critic = (reward or "").split(",")[0] or (self.text("pretrain") if remote else None)
                if critic:
                    self.derived(
                        "critic_model_id",
                        critic,
                        "OpenRLHF's critic starts from --reward_pretrain (from --pretrain with "
                        "a remote reward)",
                        self.range_of("reward_pretrain") or self.range_of("pretrain"),
                    )
        if (
            reward is None
            and remote is None
            and not (self.written & {"reward_pretrain", "remote_rm_url"})
        ):
            self.problem(
                self.trainer_range,
                "train_ppo_ray needs --reward_pretrain or --remote_rm_url (the reward)",
            )
        if colocate_all:
            shared = [
                name
                for name, present in (
                    ("the critic", estimator == "gae"),
                    ("the reward model", reward is not None),
                )
                if present
            ]
            if shared:
                self.problem(
                    self.range_of("colocate_all_models"),
                    f"--colocate_all_models: {' and '.join(shared)} share the actor's GPUs "
                    "too; this estimate sizes the actor's step, its reference and the vLLM "
                    "engine only",
                )

    # -- values

    def flag(self, key: str) -> str:
        """The flag as the command line writes it, else as its release spells it."""
        if key in self.spelled:
            return "--" + self.spelled[key]
        names = SPELLINGS[key]
        dotted = [name for name in names if "." in name] if self.dotted else []
        if self.trainer == "train_ppo_ray":
            dotted = [name for name in dotted if name.startswith("actor.")] or dotted
        else:
            dotted = [name for name in dotted if not name.startswith("actor.")] or dotted
        return "--" + (dotted[0] if dotted else names[0])

    def fallback(self, plan_key: str, key: str) -> None:
        """A value OpenRLHF would refuse (reported): the trainer's default stands in."""
        value = self.defaults.get(key)
        if key in self.given and value is not None:
            note = f"OpenRLHF's {self.flag(key)} default {value} (the value written is refused)"
            self.default(plan_key, value, note)

    def range_of(self, key: str) -> SourceRange | None:
        flag = self.given.get(key)
        return flag.range if flag is not None else None

    def whole(
        self,
        key: str,
        lowest: int,
        default: Any = ...,
        *,
        highest: int | None = None,
        quiet: bool = False,
    ) -> int | None:
        """The flag's whole number, else the trainer's default (None when the flag's value is
        known only at run time, or wrong: reported)."""
        if key not in self.given:
            if key in self.written:
                return None
            value = self.defaults.get(key) if default is ... else default
            return value if isinstance(value, int) else None
        flag = self.given[key]
        text = str(flag.value).strip()
        if flag.value is not True and not isinstance(flag.value, list):
            number = text[1:] if text.startswith("-") else text
            if number.isdigit():
                value = int(text)
                if value >= lowest and (highest is None or value <= highest):
                    return value
        if not quiet:
            if flag.value is True:
                self.problem(flag.range, f"{self.flag(key)} needs a value")
            else:
                bounds = (
                    f"from {lowest} to {highest}" if highest is not None else f"{lowest} or more"
                )
                self.problem(
                    flag.range, f"{self.flag(key)} must be a whole number {bounds}; got '{text}'"
                )
        return None

    def fraction(
        self,
        key: str,
        *,
        upper: float | None,
        closed: bool = True,
        lower_open: bool = False,
    ) -> float | None:
        """The flag's number (0 or more, at most `upper`), else the trainer's default."""
        if key not in self.given:
            if key in self.written:
                return None
            value = self.defaults.get(key)
            return float(value) if isinstance(value, int | float) else None
        flag = self.given[key]
        text = str(flag.value).strip()
        try:
            value = float(text) if flag.value is not True else math.nan
        except ValueError:
            value = math.nan
        low_ok = value > 0 if lower_open else value >= 0
        high_ok = upper is None or (value <= upper if closed else value < upper)
        if math.isfinite(value) and low_ok and high_ok:
            return value
        if flag.value is True:
            self.problem(flag.range, f"{self.flag(key)} needs a value")
        else:
            low = "above 0" if lower_open else "0 or more"
            high = "" if upper is None else f", {'at most' if closed else 'below'} {upper:g}"
            self.problem(flag.range, f"{self.flag(key)} must be a number {low}{high}; got '{text}'")
        return None

    def choice(self, key: str, choices: tuple[str, ...], *, quiet: bool = False) -> str | None:
        flag = self.given.get(key)
        if flag is None:
            return None
        text = str(flag.value).strip()
        if flag.value is not True and text in choices:
            return text
        if not quiet:
            shown = "no value" if flag.value is True else f"'{text}'"
            self.problem(
                flag.range, f"{self.flag(key)} must be one of {', '.join(choices)}; got {shown}"
            )
        return None

    def text(self, key: str) -> str | None:
        flag = self.given.get(key)
        if flag is None:
            return None
        if flag.value is True or isinstance(flag.value, list) or not str(flag.value).strip():
            self.problem(flag.range, f"{self.flag(key)} needs a value")
            return None
        return str(flag.value).strip()

    def on(self, key: str) -> bool:
        """A store_true flag is written (and not written false), without reporting."""
        flag = self.given.get(key)
        if flag is None:
            return False
        return flag.value is True or str(flag.value).strip().lower() in TRUE_WORDS

    def switch_value(self, key: str) -> bool:
        """A store_true flag: on when written bare; a value after it is reported (argparse
        stops on it), a true word read as on."""
        flag = self.given.get(key)
        if flag is None:
            return False
        if flag.value is True:
            return True
        text = str(flag.value).strip().lower()
        problem = f"{self.flag(key)} takes no value (OpenRLHF stops on '{flag.value}')"
        if problem not in (message for _, message in self.problems):
            self.problem(flag.range, problem)
        return text in TRUE_WORDS

    def switch(self, plan_key: str, key: str) -> None:
        if key in self.given:
            on = self.switch_value(key)
            self.explicit(plan_key, on, key, f"{self.flag(key)}")
        elif key not in self.written:
            self.default(plan_key, False, f"OpenRLHF's {self.flag(key)} not given: off")

    def value_of(self, plan_key: str, value: Any, key: str, note: str = "") -> None:
        """A value the flag gives, or the trainer's argparse default."""
        if key in self.given:
            self.explicit(plan_key, value, key, note)
        else:
            default_note = f"OpenRLHF's {self.flag(key)} default {value}"
            self.default(plan_key, value, f"{default_note}: {note}" if note else default_note)

    def default_value(self, plan_key: str, value: Any, key: str) -> None:
        self.default(plan_key, value, f"OpenRLHF's {self.flag(key)} default {value}")

    def explicit(self, plan_key: str, value: Any, key: str, note: str = "") -> None:
        self.meanings.append(
            FlagMeaning(
                plan_key, value, Provenance.EXPLICIT, self.range_of(key), note or self.flag(key)
            )
        )

    def default(self, plan_key: str, value: Any, note: str) -> None:
        self.meanings.append(FlagMeaning(plan_key, value, Provenance.CLI_DEFAULT, None, note))

    def derived(
        self, plan_key: str, value: Any, note: str, located: SourceRange | None = None
    ) -> None:
        """What OpenRLHF does with the flags, not one flag's value (labelled default)."""
        self.meanings.append(FlagMeaning(plan_key, value, Provenance.DEFAULT, located, note))

    def problem(self, located: SourceRange | None, message: str) -> None:
        self.problems.append((located, message))


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

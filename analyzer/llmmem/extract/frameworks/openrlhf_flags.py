"""OpenRLHF's trainer flags: their spellings across releases, the trainers' argparse defaults,
and how one flag's value is taken (`FlagValues`). The meanings are read in `openrlhf_reading`
and `openrlhf_rollout`; `openrlhf` is the framework's entry (see its docstring)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from llmmem.extract.frameworks.deepspeed_chat import CommandLineValue, FlagMeaning
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

# each flag's spellings: the flat name (up to 0.10.1, and older ones), then the dotted ones
# (0.10.2 on)
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


class FlagValues:
    """The flags of one OpenRLHF command line by their canonical names (`SPELLINGS`), and the
    plan values and problems read from them."""

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

"""OpenRLHF's PPO trainer (`train_ppo_ray`, PPO and the critic-free GRPO-like estimators): the
actor's GPUs, the rollout's lengths, the samples per prompt, the vLLM engines, the reference,
critic and reward models and where Ray places them."""

from __future__ import annotations

from llmmem.extract.frameworks.openrlhf_flags import (
    ESTIMATORS,
    GROUP_ESTIMATORS,
    OLD_PPO_LENGTHS,
)
from llmmem.extract.frameworks.openrlhf_reading import OpenRLHFReading


class RolloutReading(OpenRLHFReading):
    """train_ppo_ray's command line."""

    def gpus(self) -> int | None:
        return self.actor_gpus()

    def lengths(self) -> None:
        self.rollout_lengths()

    def method(self) -> None:
        self.reinforcement()

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

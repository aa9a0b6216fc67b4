"""What an OpenRLHF trainer's flags mean for memory, common to every trainer, and DPO's and
KTO's reference model; PPO's and GRPO's rollout flags are read in `openrlhf_rollout`."""

from __future__ import annotations

from llmmem.extract.frameworks.deepspeed_chat import FlagMeaning
from llmmem.extract.frameworks.openrlhf_flags import (
    ESTIMATORS,
    OLD_ONLY_FLAGS,
    PARAM_DTYPES,
    TRAINER_OBJECTIVES,
    FlagValues,
)
from llmmem.plan import Provenance


class OpenRLHFReading(FlagValues):
    """One trainer's command line read into plan values (`meanings`) and `problems`."""

    # -- the whole command line

    def read(self) -> None:
        self.objective()
        self.model()
        micro = self.micro_batch()
        self.accumulation(micro, self.gpus())
        self.lengths()
        self.precision()
        self.switch("gradient_checkpointing", "gradient_checkpointing")
        self.zero()
        self.lora()
        self.attention()
        self.optimizer()
        self.kept_switches()
        self.method()

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
                "the flags are those of OpenRLHF before 0.9.10, whose trainers without --bf16 "
                "keep the checkpoint's dtype without DeepSpeed's bf16 engine; sized as bf16",
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
        if self.on("packing_samples"):
            self.derived(
                "padding_free",
                True,
                f"{self.flag('packing_samples')}: each micro-batch's samples in one row, "
                "flash-attention taking their boundaries (TRL's padding_free)",
                self.range_of("packing_samples"),
            )
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

    # -- what differs between trainers (PPO's in `openrlhf_rollout`)

    def gpus(self) -> int | None:
        """The GPUs the trained model is sharded over: the launcher's."""
        return self.world_size

    def lengths(self) -> None:
        self.sequence_length()

    def method(self) -> None:
        if self.trainer in ("train_dpo", "train_kto"):
            self.preference()

"""DeepSpeed-Chat's training scripts, read from their command line.

`deepspeed main.py --lora_dim 128 --zero_stage 3 --dtype bf16 --offload ...`: the scripts of
DeepSpeed-Chat's training steps (training/step1_supervised_finetuning/main.py, step 2 alike)
declare their own argparse flags and build the DeepSpeed config from them in code. Read at
microsoft/DeepSpeedExamples f5c0ef6d (main.py's `parse_args`, dschat/utils/ds_utils.py and
dschat/utils/module/lora.py), the flags that decide memory are:

    --lora_dim N        LoRA of rank N on every nn.Linear whose name contains --lora_module_name
                        (default "decoder.layers."); 0, the default, is no LoRA; the base weights
                        of those layers are frozen, the rest trains unless --only_optimize_lora
    --zero_stage N      ZeRO stage (default 0)
    --dtype fp16|bf16   DeepSpeed's fp16 or bf16 engine, fp32 master weights (default fp16);
                        fp32, not among that commit's choices, is read as plain fp32
    --offload           offload_optimizer and offload_param on the CPU (the latter matters
                        under ZeRO-3 only)
    --max_seq_len N     the length every sample is padded to (default 512)

HF's TrainingArguments has none of these names. A command line is read this way when it carries
one of the flags only DeepSpeed-Chat's scripts take, or --zero_stage (common to DeepSpeed
training scripts: OpenRLHF's take it too, with --max_len and --bf16; those are read by their own
module, `openrlhf`, before this rule is asked) beside --dtype, --offload or --max_seq_len; a
script parsing its flags with HfArgumentParser or TrlParser is not. The rule itself
(`is_deepspeed_chat`) lives with the launchers in `llmmem.extract.shell.launchers`, which knows
what a launch is; the flag sets it tests are here.

`deepspeed_chat_meanings` turns the flags into plan values; `FIX_SPELLINGS` is how a fix is
written on such a command line (`llmmem.rules.shell_edits` uses it through
`llmmem.rules.spellings`, dialect "deepspeed-chat").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from llmmem.extract.frameworks.spelling import KeyWrite, Spelling, halve
from llmmem.plan import Provenance, SourceRange

# -- recognition: the flags that tell a DeepSpeed-Chat command line apart

DEEPSPEED_CHAT_OWN_FLAGS = frozenset({"lora_dim", "lora_module_name", "only_optimize_lora"})
DEEPSPEED_CHAT_BESIDE_ZERO_STAGE = frozenset({"dtype", "offload", "max_seq_len"})
DEEPSPEED_CHAT_FLAGS = DEEPSPEED_CHAT_OWN_FLAGS | DEEPSPEED_CHAT_BESIDE_ZERO_STAGE | {"zero_stage"}
DEEPSPEED_CHAT_LAUNCHERS = frozenset({"python", "torchrun", "deepspeed", "accelerate"})
HF_ARGUMENT_PARSERS = re.compile(r"\b(HfArgumentParser|TrlParser)\b")

# -- main.py's defaults for the flags above (argparse `default=`, f5c0ef6d)

DEFAULTS: dict[str, Any] = {
    "zero_stage": 0,
    "dtype": "fp16",
    "max_seq_len": 512,
    "lora_dim": 0,
    "lora_module_name": "decoder.layers.",
    "only_optimize_lora": False,  # store_true
    "offload": False,  # store_true
    "gradient_checkpointing": False,  # store_true
}
DTYPE_CHOICES = ("fp16", "bf16")  # argparse choices; fp32 is read too (plain fp32)
# how DeepSpeed-Chat's LoRA layer (LinearLayer_LoRA) is built: scaling 1/lora_dim, no dropout
LORA_ALPHA = 1.0
LORA_DROPOUT = 0.0

TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")


class CommandLineValue(Protocol):
    """A `--name value` of the program's command line (`configs.Override` is one)."""

    @property
    def path(self) -> tuple[str | int, ...]: ...

    @property
    def value(self) -> Any: ...

    @property
    def range(self) -> SourceRange | None: ...


@dataclass(frozen=True)
class FlagMeaning:
    """A plan value that a flag (or the script's default for a flag not written) gives."""

    key: str
    value: Any
    source: Provenance
    range: SourceRange | None
    note: str = ""


def deepspeed_chat_meanings(
    flags: Iterable[CommandLineValue], written: Iterable[str]
) -> tuple[list[FlagMeaning], list[tuple[SourceRange | None, str]]]:
    """The plan values DeepSpeed-Chat's flags give, and the problems with them (each with the
    range of its flag). `flags` are the flags whose values are known before the script runs;
    `written` names every flag on the command line, known or not: a flag written with a value
    known only at run time (`--zero_stage $2`) takes no default."""
    reading = _DeepSpeedChatFlags(flags, written)
    reading.read()
    return reading.meanings, reading.problems


class _DeepSpeedChatFlags:
    def __init__(self, flags: Iterable[CommandLineValue], written: Iterable[str]) -> None:
        self.given = {".".join(str(step) for step in flag.path): flag for flag in flags}
        self.written = set(written)
        self.meanings: list[FlagMeaning] = []
        self.problems: list[tuple[SourceRange | None, str]] = []

    def read(self) -> None:
        stage = self.zero_stage()
        self.precision()
        self.sequence_length()
        self.offload(stage)
        self.lora()

    def zero_stage(self) -> int | None:
        """The ZeRO stage, or None when it is known only at run time (or is wrong)."""
        if "zero_stage" in self.given:
            stage = self.whole_number("zero_stage", 0, 3)
            if stage is not None:
                self.explicit("distributed.zero_stage", stage, "zero_stage", "--zero_stage")
            return stage
        return None if "zero_stage" in self.written else DEFAULTS["zero_stage"]

    def precision(self) -> None:
        if "dtype" in self.given:
            flag = self.given["dtype"]
            text = str(flag.value).strip().lower()
            if text in DTYPE_CHOICES:
                note = f"--dtype {text}: DeepSpeed's {text} engine, fp32 master weights"
                self.explicit("precision", text, "dtype", note)
            elif text == "fp32":
                self.explicit("precision", "fp32", "dtype", "--dtype fp32")
            else:
                shown = "no value" if flag.value is True else f"'{flag.value}'"
                self.problem(flag, f"--dtype must be fp16, bf16 or fp32; got {shown}")
        elif "dtype" not in self.written:
            dtype = DEFAULTS["dtype"]
            note = f"DeepSpeed-Chat's --dtype default: {dtype}, fp32 master weights"
            self.default("precision", dtype, note)

    def sequence_length(self) -> None:
        if "max_seq_len" in self.given:
            length = self.whole_number("max_seq_len", 1)
            if length is not None:
                self.explicit("max_seq_length", length, "max_seq_len", "--max_seq_len")
        elif "max_seq_len" not in self.written:
            note = "DeepSpeed-Chat's --max_seq_len default"
            self.default("max_seq_length", DEFAULTS["max_seq_len"], note)

    def offload(self, stage: int | None) -> None:
        flag = self.given.get("offload")
        if flag is None:
            return
        text = str(flag.value).strip().lower()
        if flag.value is not True and text not in TRUE_WORDS:
            if text not in FALSE_WORDS:
                self.problem(flag, f"--offload takes no value; got '{flag.value}'")
            return
        if stage == 0:
            message = (
                "--offload needs --zero_stage 1, 2 or 3 (DeepSpeed offloads a ZeRO optimizer "
                "only); not counted"
            )
            self.problem(flag, message)
            return
        self.explicit("distributed.offload_optimizer", True, "offload", "--offload")
        if stage == 3:
            note = "--offload under ZeRO-3: the parameters live on the CPU too"
            self.explicit("distributed.offload_params", True, "offload", note)

    def lora(self) -> None:
        """`--lora_dim N`: LoRA of rank N on every Linear layer in the scope; DeepSpeed-Chat
        scales it by 1/N (alpha 1) without dropout."""
        if "lora_dim" not in self.given:
            return
        rank = self.whole_number("lora_dim", 0)
        if rank is None:
            return
        if rank == 0:
            self.explicit("lora.enabled", False, "lora_dim", "--lora_dim 0: no LoRA")
            return
        self.explicit("lora.enabled", True, "lora_dim", f"--lora_dim {rank}")
        self.explicit("lora.r", rank, "lora_dim", "--lora_dim")
        for key, value, note in (
            ("lora.alpha", LORA_ALPHA, "DeepSpeed-Chat scales LoRA by 1/lora_dim"),
            ("lora.dropout", LORA_DROPOUT, "DeepSpeed-Chat: no LoRA dropout"),
        ):
            self.meanings.append(FlagMeaning(key, value, Provenance.DEFAULT, None, note))
        scope = self.given.get("lora_module_name")
        if scope is not None and isinstance(scope.value, str):
            note = f"every Linear layer whose name contains '{scope.value}'"
            self.explicit("lora.target_modules", ["all-linear"], "lora_module_name", note)
        elif "lora_module_name" not in self.written:
            note = (
                f"DeepSpeed-Chat's --lora_module_name default {DEFAULTS['lora_module_name']}: "
                "every Linear layer"
            )
            self.default("lora.target_modules", ["all-linear"], note)
        if "only_optimize_lora" not in self.written:
            self.problem(
                self.given["lora_dim"],
                "--lora_dim without --only_optimize_lora: DeepSpeed-Chat also trains every "
                "weight outside the LoRA layers (embeddings, norms, the output layer), which "
                "this estimate leaves out; add --only_optimize_lora to train the LoRA weights "
                "only",
            )

    # -- small things

    def whole_number(self, name: str, lowest: int, highest: int | None = None) -> int | None:
        flag = self.given[name]
        text = str(flag.value).strip()
        if text.isdigit() and lowest <= int(text) and (highest is None or int(text) <= highest):
            return int(text)
        if flag.value is True:
            self.problem(flag, f"--{name} needs a value")
            return None
        bounds = f"from {lowest} to {highest}" if highest is not None else f"{lowest} or more"
        self.problem(flag, f"--{name} must be a whole number {bounds}; got '{text}'")
        return None

    def explicit(self, key: str, value: Any, name: str, note: str) -> None:
        located = self.given[name].range
        self.meanings.append(FlagMeaning(key, value, Provenance.EXPLICIT, located, note))

    def default(self, key: str, value: Any, note: str) -> None:
        self.meanings.append(FlagMeaning(key, value, Provenance.CLI_DEFAULT, None, note))

    def problem(self, flag: CommandLineValue, message: str) -> None:
        self.problems.append((flag.range, message))


# -- how a fix is written on a DeepSpeed-Chat command line
#
# The step 1 script reads only its own argparse options plus DeepSpeed's
# (`deepspeed.add_config_arguments`: --deepspeed, --deepspeed_config); anything else stops it
# with "unrecognized arguments". The levers it has a flag for:
#   micro-batch     --per_device_train_batch_size N, --gradient_accumulation_steps N (int)
#   checkpointing   --gradient_checkpointing (store_true: bare)
#   precision       --dtype bf16 (choices fp16, bf16; default fp16)
# and, for changes llmmem does not offer as fixes, --zero_stage N (int, default 0), --offload
# (store_true: ZeRO-Offload of the optimizer, and of the parameters under ZeRO-3), --lora_dim N
# with --only_optimize_lora (store_true). It builds its optimizer in code (DeepSpeed's
# FusedAdam, DeepSpeedCPUAdam with --offload): no 8-bit optimizer; no Liger loss, no 4-bit base
# weights (QLoRA): those levers have no entry, so no fix is offered for them.

FIX_SPELLINGS: dict[str, Spelling] = {
    "grad-ckpt": (KeyWrite(("gradient_checkpointing",), True),),
    "bf16": (KeyWrite(("dtype",), "bf16"),),
    "halve-batch": halve(("per_device_train_batch_size",), ("gradient_accumulation_steps",)),
}

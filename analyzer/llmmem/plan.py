"""TrainingPlan: what a file says about a training run, each value with where it came from.

An extractor (`extract/`) reads a script or config into a TrainingPlan. Every setting is a
`Sourced` value: the value, its provenance and the file range it was read from (or the range of
the call it belongs to, for defaults), so that the editor can point at it and the report can say
which numbers were defaults or guesses.

Ranges are 0-based lines and columns as in LSP, end exclusive.

The plan classes are keyword-only dataclasses. SourceRange is frozen; Sourced and the plan
parts are mutable (extractors fill them in and assign to their fields), and
`dataclasses.replace` makes an edited copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Provenance(str, Enum):
    EXPLICIT = "explicit"  # written in the file, e.g. per_device_train_batch_size=4
    DEFAULT = "default"  # the framework's default (HF TrainingArguments, TRL, axolotl, ...)
    CLI_DEFAULT = "cli-default"  # the default of a command-line argument (argparse, dataclass)
    PRAGMA = "pragma"  # a `# llmmem: key=value` comment or [tool.llmmem] in pyproject.toml
    CONFIG = "config"  # a referenced file (DeepSpeed JSON, accelerate YAML, ...)
    ASSUMED = "assumed"  # nothing said it: llmmem's own assumption, stated in `note`
    FLAG = "flag"  # a flag of `llmmem estimate` (llmmem.flag_plan)


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceRange:
    path: str | None = None  # None: the file the plan is about
    start_line: int
    start_col: int
    end_line: int
    end_col: int

    def contains(self, line: int, col: int) -> bool:
        if (line, col) < (self.start_line, self.start_col):
            return False
        return (line, col) < (self.end_line, self.end_col)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "start_line": self.start_line,
            "start_col": self.start_col,
            "end_line": self.end_line,
            "end_col": self.end_col,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RejectedValue:
    """A value a file states that llmmem refuses to use (a number past its bound): the
    estimate goes on without it, and a finding says so where it is written."""

    key: str  # the plan's key: "per_device_train_batch_size"
    message: str  # one line: what was written and why it is not used
    range: SourceRange | None = None


@dataclass(slots=True, kw_only=True)
class Sourced(Generic[T]):
    value: T
    source: Provenance
    range: SourceRange | None = None
    note: str = ""  # e.g. "one of two branches of a conditional expression"


@dataclass(slots=True, kw_only=True)
class LoraPlan:
    r: Sourced[int]
    alpha: Sourced[float]
    target_modules: Sourced[list[str] | None]  # None: PEFT's default for the architecture
    modules_to_save: Sourced[list[str]]
    dora: Sourced[bool]
    dropout: Sourced[float]
    range: SourceRange | None = None  # the LoraConfig(...) call


@dataclass(slots=True, kw_only=True)
class QuantizationPlan:
    bits: Sourced[int]  # 4 or 8
    quant_type: Sourced[str]  # "nf4", "fp4", "int8"
    double_quant: Sourced[bool]
    compute_dtype: Sourced[str]  # "bfloat16", "float16", "float32"
    prepare_for_kbit_training: Sourced[bool]
    # bnb_4bit_quant_storage: "uint8" (bitsandbytes' default) or a float dtype FSDP can shard
    quant_storage: Sourced[str] = field(
        default_factory=lambda: Sourced(
            value="uint8", source=Provenance.DEFAULT, note="bitsandbytes default"
        )
    )
    range: SourceRange | None = None  # the BitsAndBytesConfig(...) call or the keyword


@dataclass(slots=True, kw_only=True)
class DistributedPlan:
    world_size: Sourced[int]
    zero_stage: Sourced[int]  # 0 without DeepSpeed
    offload_optimizer: Sourced[bool]
    offload_params: Sourced[bool]
    fsdp: Sourced[str | None]  # "full_shard", "hybrid_shard", "shard_grad_op", "no_shard" or None
    deepspeed_config: Sourced[str | None]  # a path, or None
    # DeepSpeed's gradient reduction bucket in elements ("auto": sized from the model),
    # overlap_comm (None: DeepSpeed's default, on for ZeRO-3 only), contiguous_gradients
    reduce_bucket_size: Sourced[int | str] = field(
        default_factory=lambda: _deepspeed_default(500_000_000)
    )
    overlap_comm: Sourced[bool | None] = field(default_factory=lambda: _deepspeed_default(None))
    contiguous_gradients: Sourced[bool] = field(default_factory=lambda: _deepspeed_default(True))
    # ZeRO-3: stage3_max_reuse_distance, stage3_prefetch_bucket_size and
    # stage3_param_persistence_threshold (both in elements, or "auto": sized from the model)
    max_reuse_distance: Sourced[int] = field(
        default_factory=lambda: _deepspeed_default(1_000_000_000)
    )
    prefetch_bucket_size: Sourced[int | str] = field(
        default_factory=lambda: _deepspeed_default(50_000_000)
    )
    param_persistence_threshold: Sourced[int | str] = field(
        default_factory=lambda: _deepspeed_default(100_000)
    )
    # ZeRO-3's optimizer step runs over sub-groups of at least this many partition elements
    sub_group_size: Sourced[int] = field(default_factory=lambda: _deepspeed_default(1_000_000_000))


def _deepspeed_default(value: Any) -> Sourced[Any]:
    return Sourced(value=value, source=Provenance.DEFAULT, note="DeepSpeed default")


@dataclass(slots=True, kw_only=True)
class TrainingPlan:
    """Everything one file says about one training run, with provenance."""

    path: str
    kind: str  # "python", "yaml", "json", "shell", "notebook"
    framework: str = "hf"  # "hf", "trl", "axolotl", "llamafactory", "torchtune", "litgpt", ...
    model_id: Sourced[str] | None = None
    per_device_train_batch_size: Sourced[int]
    gradient_accumulation_steps: Sourced[int]
    max_seq_length: Sourced[int]
    gradient_checkpointing: Sourced[bool]
    precision: Sourced[str]  # "fp32", "fp16", "bf16", "bf16-true", "fp16-true"
    optim: Sourced[str]
    attn_implementation: Sourced[str]
    use_cache: Sourced[bool] | None = None
    loss: Sourced[str] | None = None  # "standard", "chunked", "liger"
    # the training objective: "dpo", "orpo", "cpo" (SimPO too), "kto", "reward", "grpo",
    # "ppo"; None for supervised fine-tuning (the trainer or config class, axolotl `rl:`,
    # LLaMA-Factory `stage:` say which)
    objective: Sourced[str] | None = None
    lora: LoraPlan | None = None
    quantization: QuantizationPlan | None = None
    distributed: DistributedPlan
    gpu: Sourced[str] | None = None  # from a pragma or [tool.llmmem]
    trainer_range: SourceRange | None = None  # the TrainingArguments/SFTConfig(...) call
    model_range: SourceRange | None = None  # the from_pretrained(...) call
    problems: list[str] = field(default_factory=list)  # what could not be read, one line each
    # set when the file could not be parsed at all (a syntax error mid-typing): the plan holds
    # only pragmas and assumptions, and an editor keeps its last good analysis instead
    unreadable: str | None = None
    # the file (or part of it) does not parse: the parser's message and where it stopped; a
    # config read up to the error has a plan and this too
    parse_error: str | None = None
    parse_error_range: SourceRange | None = None
    # `[tool.llmmem]` settings that could not be used (an unreadable pyproject.toml)
    settings_problems: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # framework keys kept for rules
    # numbers past llmmem's bounds (a batch of 10**309): not used, each reported where written
    rejected: list[RejectedValue] = field(default_factory=list)

    def sourced_fields(self) -> dict[str, Sourced[Any]]:
        """Every top-level Sourced value by name (for reports and hovers)."""
        out: dict[str, Sourced[Any]] = {}
        for item in fields(self):
            name = item.name
            value = getattr(self, name)
            if isinstance(value, Sourced):
                out[name] = value
        return out

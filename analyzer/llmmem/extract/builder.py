"""PlanBuilder: collects what a file says, setting by setting, and turns it into a TrainingPlan.

Every extractor (Python, YAML/JSON configs, shell, notebooks) feeds one builder:

    builder = PlanBuilder()
    builder.set("per_device_train_batch_size", 4, Provenance.EXPLICIT, value_range)
    builder.set("lora.r", 16, Provenance.CONFIG, value_range, note="from adapter_config.json")
    builder.trainer_range = call_range          # optional: where defaults point
    builder.problems.append("could not read ...")
    plan = builder.build(path, "yaml", "axolotl")

`set(key, value, source, range, note="")` keeps every candidate; the value that wins is the one
with the strongest provenance, and among equals the one set last:

    pragma > explicit > config > cli-default > default > assumed

Keys are the canonical keys of `llmmem.extract.vocabulary`: the top-level TrainingPlan fields
(`model_id`, `per_device_train_batch_size`, `gradient_accumulation_steps`, `max_seq_length`,
`gradient_checkpointing`, `precision`, `optim`, `attn_implementation`, `use_cache`, `loss`,
`gpu`), the precision inputs `bf16`, `fp16` (HF autocast flags) and `torch_dtype` (the weights'
dtype: "bfloat16", "float16", "float32" or "auto"), `max_prompt_length` and
`max_completion_length` (GRPO/DPO), and dotted keys for the nested plans: `lora.enabled`,
`lora.r`, `lora.alpha`, `lora.target_modules`, `lora.modules_to_save`, `lora.dora`,
`lora.dropout`; `quantization.bits`, `quantization.quant_type`, `quantization.double_quant`,
`quantization.compute_dtype`, `quantization.quant_storage`,
`quantization.prepare_for_kbit_training`;
`distributed.world_size`, `distributed.zero_stage`, `distributed.offload_optimizer`,
`distributed.offload_params`, `distributed.fsdp`, `distributed.deepspeed_config`. Any other key
is kept, as a Sourced value, in `TrainingPlan.extra`.

Values are checked and converted in `build` (`"4"` -> 4, `"true"` -> True, `"bf16"` ->
"bfloat16"); a value that does not fit its key becomes a line in `problems` and the next
candidate is used. `build` fills what nothing said with the framework's defaults, labelled
`default` (HF TrainingArguments, TRL configs; pick the table with `config_class`), and with
llmmem's own assumptions, labelled `assumed` with a note saying how to set them. It never raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmmem.extract.numbers import (
    MAX_ELEMENTS,
    NumberOutOfRange,
    check_bound,
    parse_count,
    shown,
)
from llmmem.extract.vocabulary import (
    OBJECTIVE_OF_CONFIG,
    PRECISIONS,
    TRAINER_CONFIG_CLASSES,
    normalize_attn_implementation,
    normalize_dtype,
    normalize_fsdp,
    normalize_quant_storage,
    split_module_names,
)
from llmmem.plan import (
    DistributedPlan,
    LoraPlan,
    Provenance,
    QuantizationPlan,
    RejectedValue,
    Sourced,
    SourceRange,
    TrainingPlan,
)

PRECEDENCE: dict[Provenance, int] = {
    Provenance.ASSUMED: 0,
    Provenance.DEFAULT: 1,
    Provenance.CLI_DEFAULT: 2,
    Provenance.CONFIG: 3,
    Provenance.EXPLICIT: 4,
    Provenance.PRAGMA: 5,
}

# HF TrainingArguments (transformers 4.x and 5.x; `optim` is the fused AdamW on torch >= 2.8)
_HF_TRAINER_DEFAULTS: dict[str, object] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "gradient_checkpointing": False,
    "optim": "adamw_torch_fused",
}

# TRL configs subclass TrainingArguments. Recent TRL (the shared `_BaseConfig`) turns gradient
# checkpointing on and sets `bf16=True` unless `fp16` is given; older releases (before about
# 0.20 for SFT, later for the others: the exact release differs per trainer) kept HF's
# defaults. llmmem follows the current documentation.
_TRL_BASE_DEFAULTS: dict[str, object] = {
    **_HF_TRAINER_DEFAULTS,
    "gradient_checkpointing": True,
    "bf16": True,
}

CONFIG_DEFAULTS: dict[str, dict[str, object]] = {
    "TrainingArguments": _HF_TRAINER_DEFAULTS,
    # SFTConfig.max_length (called max_seq_length before TRL 0.16)
    "SFTConfig": {**_TRL_BASE_DEFAULTS, "max_seq_length": 1024},
    "DPOConfig": {**_TRL_BASE_DEFAULTS, "max_seq_length": 1024},
    "ORPOConfig": {**_TRL_BASE_DEFAULTS, "max_seq_length": 1024},
    "KTOConfig": {**_TRL_BASE_DEFAULTS, "max_seq_length": 1024},
    "RewardConfig": {**_TRL_BASE_DEFAULTS, "max_seq_length": 1024},
    # the sequence is prompt + completion
    "GRPOConfig": {**_TRL_BASE_DEFAULTS, "max_prompt_length": 512, "max_completion_length": 256},
}

# what defaults apply per framework when no config class is named
_FRAMEWORK_CONFIG: dict[str, str] = {"hf": "TrainingArguments", "trl": "SFTConfig"}

_DEFAULT_NOTES: dict[str, str] = {
    "TrainingArguments": "HF TrainingArguments default",
}

_POSITIVE_INT_KEYS = frozenset(
    {
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "max_seq_length",
        "max_prompt_length",
        "max_completion_length",
        "lora.r",
        "quantization.bits",
        "distributed.world_size",
    }
)
_BOOL_KEYS = frozenset(
    {
        "gradient_checkpointing",
        "use_cache",
        "bf16",
        "fp16",
        "lora.enabled",
        "lora.dora",
        "quantization.double_quant",
        "quantization.prepare_for_kbit_training",
        "distributed.offload_optimizer",
        "distributed.offload_params",
        "distributed.contiguous_gradients",
    }
)
_TEXT_KEYS = frozenset({"model_id", "gpu", "optim", "loss", "distributed.deepspeed_config"})
_KNOWN_KEYS = (
    _POSITIVE_INT_KEYS
    | _BOOL_KEYS
    | _TEXT_KEYS
    | {
        "precision",
        "torch_dtype",
        "attn_implementation",
        "lora.alpha",
        "lora.dropout",
        "lora.target_modules",
        "lora.modules_to_save",
        "quantization.quant_type",
        "quantization.compute_dtype",
        "quantization.quant_storage",
        "distributed.zero_stage",
        "distributed.fsdp",
        "distributed.reduce_bucket_size",
        "distributed.max_reuse_distance",
        "distributed.prefetch_bucket_size",
        "distributed.param_persistence_threshold",
        "distributed.sub_group_size",
        "distributed.overlap_comm",
    }
)

_TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
_FALSE_WORDS = frozenset({"false", "no", "off", "0", "none", "null"})


class ValueMismatch(ValueError):
    """A value that does not fit its key; the message says what was expected."""


@dataclass
class _Candidate:
    value: object
    source: Provenance
    range: SourceRange | None
    note: str
    order: int


def _as_positive_int(value: object) -> int:
    """A count from 1 to MAX_COUNT; NumberOutOfRange past it (see `extract.numbers`)."""
    if isinstance(value, bool):
        raise ValueMismatch("expected a positive integer")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        try:
            value = parse_count(value)
        except NumberOutOfRange:
            raise
        except ValueError:
            raise ValueMismatch("expected a positive integer") from None
    if not isinstance(value, int) or value <= 0:
        raise ValueMismatch("expected a positive integer")
    return check_bound(value)


def _as_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueMismatch("expected true or false")


def _as_text(value: object) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ValueMismatch("expected a non-empty string")


def _as_float(value: object) -> float:
    if isinstance(value, bool):
        raise ValueMismatch("expected a number")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ValueMismatch("expected a number")


def _as_dropout(value: object) -> float:
    number = _as_float(value)
    if not 0.0 <= number < 1.0:
        raise ValueMismatch("expected a probability in [0, 1)")
    return number


def _as_precision(value: object) -> str:
    text = _as_text(value).lower()
    aliases = {"bf16-mixed": "bf16", "16-mixed": "fp16", "32": "fp32", "bf16-true": "bf16-true"}
    text = aliases.get(text, text)
    if text not in PRECISIONS:
        raise ValueMismatch(f"expected one of {', '.join(PRECISIONS)}")
    return text


def _as_dtype(value: object) -> str:
    dtype = normalize_dtype(value)
    if dtype is None:
        raise ValueMismatch("expected a dtype (bfloat16, float16, float32 or auto)")
    return dtype


def _as_quant_storage(value: object) -> str:
    storage = normalize_quant_storage(value)
    if storage is None:
        raise ValueMismatch("expected uint8, bfloat16, float16 or float32")
    return storage


def _as_attention(value: object) -> str:
    attention = normalize_attn_implementation(value)
    if attention is None:
        raise ValueMismatch("expected eager, sdpa or flash_attention_2")
    return attention


def _as_modules(value: object) -> list[str] | None:
    if value is None:
        return None
    names = split_module_names(value)
    if names is None:
        raise ValueMismatch("expected a list of module names or 'all-linear'")
    return names


def _as_module_list(value: object) -> list[str]:
    return _as_modules(value) or []


def _as_quant_type(value: object) -> str:
    text = _as_text(value).lower()
    if text not in ("nf4", "fp4", "int8"):
        raise ValueMismatch("expected nf4, fp4 or int8")
    return text


def _as_zero_stage(value: object) -> int:
    if isinstance(value, bool):
        raise ValueMismatch("expected a ZeRO stage 0 to 3")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or not 0 <= value <= 3:
        raise ValueMismatch("expected a ZeRO stage 0 to 3")
    return value


def _as_elements(value: object, *, at_least: int, expected: str) -> int:
    """A whole number of elements, written as DeepSpeed configs do (`5e8` too)."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueMismatch(f"expected {expected}") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < at_least:
        raise ValueMismatch(f"expected {expected}")
    return check_bound(value, MAX_ELEMENTS)


def _as_bucket_size(value: object) -> int | str:
    """DeepSpeed's bucket sizes: a count of elements (5e8 is common), or "auto"."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return _as_elements(value, at_least=1, expected='a number of elements or "auto"')


def _as_optional_bool(value: object) -> bool | None:
    return None if value is None else _as_bool(value)


def _as_count(value: object) -> int:
    return _as_elements(value, at_least=0, expected="a whole number of elements")


def _as_count_or_auto(value: object) -> int | str:
    """ZeRO-3's prefetch bucket and persistence threshold: elements (0 too), or "auto"."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return _as_elements(value, at_least=0, expected='a number of elements or "auto"')


def _as_fsdp(value: object) -> str | None:
    if value is None or value is False or value == "":
        return None
    sharding, _offload = normalize_fsdp(value)
    if sharding is None:
        raise ValueMismatch("expected full_shard, hybrid_shard, shard_grad_op or no_shard")
    return sharding


def _as_optional_text(value: object) -> str | None:
    if value is None:
        return None
    return _as_text(value)


_CONVERTERS: dict[str, Callable[[object], Any]] = {
    "precision": _as_precision,
    "torch_dtype": _as_dtype,
    "quantization.compute_dtype": _as_dtype,
    "quantization.quant_storage": _as_quant_storage,
    "attn_implementation": _as_attention,
    "lora.alpha": _as_float,
    "lora.dropout": _as_dropout,
    "lora.target_modules": _as_modules,
    "lora.modules_to_save": _as_module_list,
    "quantization.quant_type": _as_quant_type,
    "distributed.zero_stage": _as_zero_stage,
    "distributed.fsdp": _as_fsdp,
    "distributed.reduce_bucket_size": _as_bucket_size,
    "distributed.max_reuse_distance": _as_count,
    "distributed.prefetch_bucket_size": _as_count_or_auto,
    "distributed.param_persistence_threshold": _as_count_or_auto,
    "distributed.sub_group_size": _as_count,
    "distributed.overlap_comm": _as_optional_bool,  # None: DeepSpeed decides by stage
    "distributed.deepspeed_config": _as_optional_text,
}


def _converter(key: str) -> Callable[[object], Any] | None:
    if key in _CONVERTERS:
        return _CONVERTERS[key]
    if key in _POSITIVE_INT_KEYS:
        return _as_positive_int
    if key in _BOOL_KEYS:
        return _as_bool
    if key in _TEXT_KEYS:
        return _as_text
    return None


def _text_of(value: object) -> str:
    """repr() of a value for a message; an int too long for str() is described instead."""
    if isinstance(value, int) and value.bit_length() > 13_000:
        return f"a {int(value.bit_length() * 0.30103) + 1}-digit number"
    try:
        return repr(value)
    except ValueError:
        return f"a {type(value).__name__}"


def _where(range_: SourceRange | None) -> str:
    if range_ is None:
        return ""
    place = f"line {range_.start_line + 1}"
    return f" ({range_.path}, {place})" if range_.path else f" ({place})"


class PlanBuilder:
    """Collects Sourced settings by canonical key and builds a TrainingPlan (see the module
    docstring for the keys and the precedence). Besides `set` and `build`:

    - `get(key)`: the value that currently wins, as a Sourced, or None;
    - `trainer_range`, `model_range`, `lora_range`, `quantization_range`: the calls or sections
      the plan points at (defaults point there too);
    - `problems`: lines for the user about what could not be read.
    """

    def __init__(self) -> None:
        self._candidates: dict[str, list[_Candidate]] = {}
        self._order = 0
        self.trainer_range: SourceRange | None = None
        self.model_range: SourceRange | None = None
        self.lora_range: SourceRange | None = None
        self.quantization_range: SourceRange | None = None
        self.problems: list[str] = []
        self.rejected: list[RejectedValue] = []  # numbers past their bounds, where written
        self.unreadable: str | None = None  # why the file could not be parsed at all
        self.parse_error: str | None = None  # the parser's message (see TrainingPlan)
        self.parse_error_range: SourceRange | None = None  # where the parser stopped
        self.settings_problems: list[str] = []  # [tool.llmmem] that could not be used

    def set(
        self,
        key: str,
        value: object,
        source: Provenance,
        range: SourceRange | None,  # noqa: A002 - the documented keyword
        note: str = "",
    ) -> None:
        """Offer a value for `key`; the strongest provenance wins, the later one among equals."""
        self._order += 1
        candidate = _Candidate(value, Provenance(source), range, note, self._order)
        self._candidates.setdefault(key, []).append(candidate)

    def has(self, key: str) -> bool:
        return bool(self._candidates.get(key))

    def get(self, key: str) -> Sourced[Any] | None:
        """The winning value for `key` (converted), or None when nothing usable was set."""
        return self._resolve(key, report=False)

    # -- resolution -------------------------------------------------------------------------

    def _ranked(self, key: str) -> list[_Candidate]:
        candidates = self._candidates.get(key, [])
        return sorted(candidates, key=lambda c: (PRECEDENCE[c.source], c.order), reverse=True)

    def _resolve(self, key: str, *, report: bool = True) -> Sourced[Any] | None:
        convert = _converter(key)
        for candidate in self._ranked(key):
            value = candidate.value
            if convert is not None:
                try:
                    value = convert(value)
                except NumberOutOfRange as err:
                    if report:
                        message = f"{key}: {err}; not used{_where(candidate.range)}"
                        self.problems.append(message)
                        self.rejected.append(
                            RejectedValue(key=key, message=str(err), range=candidate.range)
                        )
                    continue
                except (ValueMismatch, ValueError, TypeError) as err:
                    if report:
                        written = shown(_text_of(candidate.value), 40)
                        self.problems.append(
                            f"{key}: {err}, got {written}{_where(candidate.range)}"
                        )
                        if candidate.range is not None and isinstance(
                            candidate.value, (int, float, str)
                        ):  # a value written in the file (0, -1, "abc"), not one unknown
                            self.rejected.append(
                                RejectedValue(
                                    key=key, message=f"{err}, got {written}", range=candidate.range
                                )
                            )
                    continue
            return Sourced[Any](
                value=value, source=candidate.source, range=candidate.range, note=candidate.note
            )
        return None

    def _value(
        self,
        key: str,
        fallback: object,
        source: Provenance,
        range_: SourceRange | None,
        note: str,
    ) -> Sourced[Any]:
        found = self._resolve(key)
        if found is not None:
            return found
        return Sourced[Any](value=fallback, source=source, range=range_, note=note)

    # -- build ------------------------------------------------------------------------------

    def build(
        self,
        path: Path | str,
        kind: str,
        framework: str = "hf",
        *,
        config_class: str | None = None,
    ) -> TrainingPlan:
        """The TrainingPlan: collected values, then `config_class`'s defaults (a key of
        `CONFIG_DEFAULTS`: "TrainingArguments", "SFTConfig", "DPOConfig", ...; by default the
        framework's: TRL -> SFTConfig, anything else -> TrainingArguments; "none" for a plain
        training loop, where llmmem assumes rather than defaults), then assumptions."""
        try:
            return self._build(path, kind, framework, config_class)
        except Exception as err:  # a bug here must not take the editor down
            return TrainingPlan(
                path=str(path),
                kind=kind,
                framework=framework,
                per_device_train_batch_size=_assumed(1, "plan could not be built"),
                gradient_accumulation_steps=_assumed(1, "plan could not be built"),
                max_seq_length=_assumed(1024, "plan could not be built"),
                gradient_checkpointing=_assumed(False, "plan could not be built"),
                precision=_assumed("fp32", "plan could not be built"),
                optim=_assumed("adamw_torch", "plan could not be built"),
                attn_implementation=_assumed("sdpa", "plan could not be built"),
                distributed=_single_gpu_distributed(None),
                problems=[*self.problems, f"internal error while building the plan: {err!r}"],
            )

    def _build(
        self, path: Path | str, kind: str, framework: str, config_class: str | None
    ) -> TrainingPlan:
        table_name = config_class or _FRAMEWORK_CONFIG.get(framework, "TrainingArguments")
        table_name = TRAINER_CONFIG_CLASSES.get(table_name, table_name)
        defaults = CONFIG_DEFAULTS.get(table_name, {})
        default_note = _DEFAULT_NOTES.get(table_name, f"TRL {table_name} default")
        trainer_range = self.trainer_range

        def framework_value(key: str, assumed: object, assumed_note: str) -> Sourced[Any]:
            if key in defaults:
                return self._value(
                    key, defaults[key], Provenance.DEFAULT, trainer_range, default_note
                )
            return self._value(key, assumed, Provenance.ASSUMED, trainer_range, assumed_note)

        batch = framework_value(
            "per_device_train_batch_size",
            1,
            "no batch size found; assumed 1 (set `# llmmem: batch=...`)",
        )
        grad_accum = framework_value(
            "gradient_accumulation_steps", 1, "no gradient accumulation found; assumed 1"
        )
        checkpointing = framework_value(
            "gradient_checkpointing", False, "no gradient checkpointing found"
        )
        optim = framework_value("optim", "adamw_torch", "no optimizer found; assumed torch AdamW")
        seq = self._sequence_length(defaults, default_note)
        precision = self._precision(defaults, default_note)
        attention = self._value(
            "attn_implementation",
            "sdpa",
            Provenance.DEFAULT,
            self.model_range,
            "transformers default (SDPA where torch supports it)",
        )
        plan = TrainingPlan(
            path=str(path),
            kind=kind,
            framework=framework,
            model_id=self._trained_model(),
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=grad_accum,
            max_seq_length=seq,
            gradient_checkpointing=checkpointing,
            precision=precision,
            optim=optim,
            attn_implementation=attention,
            use_cache=self._resolve("use_cache"),
            loss=self._resolve("loss"),
            objective=self._objective(config_class),
            lora=self._lora(),
            quantization=self._quantization(),
            distributed=self._distributed(),
            gpu=self._resolve("gpu"),
            trainer_range=self.trainer_range,
            model_range=self.model_range,
            problems=[],
            extra=self._extra(),
        )
        plan.problems = list(dict.fromkeys(self.problems))
        plan.rejected = list(dict.fromkeys(self.rejected))
        plan.unreadable = self.unreadable
        plan.parse_error = self.parse_error or self.unreadable
        plan.parse_error_range = self.parse_error_range
        plan.settings_problems = list(dict.fromkeys(self.settings_problems))
        return plan

    def _trained_model(self) -> Sourced[Any] | None:
        """The model the file trains; None where its reader found it trains nothing
        (`not_training`: an evaluation or chat config, a script that only evaluates, a
        helper module): what it loads is named in a problem line and not sized, unless a
        pragma names the model to size."""
        model = self._resolve("model_id")
        reason = self._resolve("not_training", report=False)
        if reason is None or (model is not None and model.source is Provenance.PRAGMA):
            return model
        loads = f" (it loads {shown(str(model.value), 80)})" if model is not None else ""
        self.problems.append(f"trains nothing: {reason.value}{loads}; no training step to size")
        return None

    def _objective(self, config_class: str | None) -> Sourced[Any] | None:
        """What the file trains for: a reader's (axolotl `rl:`, LLaMA-Factory `stage:`), else
        the TRL config or trainer class the script builds; None for supervised fine-tuning."""
        found = self._resolve("objective")
        if found is not None:
            return found
        objective = OBJECTIVE_OF_CONFIG.get(config_class or "")
        if objective is None:
            return None
        return Sourced[Any](
            value=objective,
            source=Provenance.EXPLICIT,
            range=self.trainer_range,
            note=f"the script trains with TRL's {config_class}",
        )

    def _sequence_length(self, defaults: dict[str, object], default_note: str) -> Sourced[Any]:
        found = self._resolve("max_seq_length")
        prompt = self._resolve("max_prompt_length")
        completion = self._resolve("max_completion_length")
        # a total that is only a default (GRPO's prompt + completion defaults, carried from a
        # launched script) gives way to a completion length the file states
        stated_completion = (
            found is not None
            and completion is not None
            and PRECEDENCE[completion.source] > PRECEDENCE[found.source]
        )
        if found is not None and not stated_completion:
            return found
        if prompt is not None or completion is not None or "max_prompt_length" in defaults:
            prompt = prompt or Sourced[Any](
                value=defaults.get("max_prompt_length", 512),
                source=Provenance.DEFAULT,
                range=self.trainer_range,
                note=default_note,
            )
            completion = completion or Sourced[Any](
                value=defaults.get("max_completion_length", 256),
                source=Provenance.DEFAULT,
                range=self.trainer_range,
                note=default_note,
            )
            weaker = min((prompt, completion), key=lambda s: PRECEDENCE[s.source])
            stronger = completion if weaker is prompt else prompt
            return Sourced[Any](
                value=prompt.value + completion.value,
                source=weaker.source,
                range=stronger.range,
                note=f"prompt {prompt.value} + completion {completion.value} tokens",
            )
        if "max_seq_length" in defaults:
            return Sourced[Any](
                value=defaults["max_seq_length"],
                source=Provenance.DEFAULT,
                range=self.trainer_range,
                note=default_note,
            )
        return Sourced[Any](
            value=1024,
            source=Provenance.ASSUMED,
            range=self.trainer_range,
            note="no sequence length found; set max_seq_length or add `# llmmem: seq=...`",
        )

    def _precision(self, defaults: dict[str, object], default_note: str) -> Sourced[Any]:
        stated = self._resolve("precision")
        derived = self._derived_precision(defaults, default_note)
        if stated is not None and PRECEDENCE[stated.source] >= PRECEDENCE[derived.source]:
            return stated
        return derived

    def _derived_precision(self, defaults: dict[str, object], default_note: str) -> Sourced[Any]:
        dtype = self._resolve("torch_dtype")
        bf16 = self._resolve("bf16")
        fp16 = self._resolve("fp16")
        if bf16 is None and "bf16" in defaults and not (fp16 is not None and fp16.value):
            bf16 = Sourced[Any](
                value=defaults["bf16"],
                source=Provenance.DEFAULT,
                range=self.trainer_range,
                note=f"{default_note} (bf16=True unless fp16 is set)",
            )
        if bf16 is not None and bf16.value and fp16 is not None and fp16.value:
            self.problems.append("bf16 and fp16 are both set; llmmem reads bf16")
        if dtype is not None and dtype.value in ("bfloat16", "float16"):
            precision = "bf16-true" if dtype.value == "bfloat16" else "fp16-true"
            notes = [dtype.note] if dtype.note else []
            flag = bf16 if dtype.value == "bfloat16" else fp16
            if flag is not None and flag.value and dtype.value == "bfloat16":
                # the Trainer keeps the weights as loaded and runs forward under autocast:
                # ops autocast keeps in fp32 (softmax, norms) and fp32 adapters' inputs differ
                # from a pure bf16 step
                precision = "bf16-autocast"
                notes.append("bf16 weights under bf16 autocast (the trainer's bf16=True)")
            elif flag is not None and flag.value and flag.source is not Provenance.DEFAULT:
                notes.append("autocast over weights already in that dtype: still pure 16-bit")
            return replace(dtype, value=precision, note="; ".join(notes))
        if dtype is not None and dtype.value == "auto":
            return replace(
                dtype,
                value="bf16-true",
                source=Provenance.ASSUMED,
                note="dtype='auto' loads the checkpoint's dtype; assumed bfloat16, as "
                "most current checkpoints are (add `# llmmem: precision=...` if not)",
            )
        for flag, precision in ((bf16, "bf16"), (fp16, "fp16")):
            if flag is not None and flag.value:
                return replace(flag, value=precision)
        if dtype is not None:  # float32 weights, no autocast
            return replace(dtype, value="fp32")
        flags = [flag for flag in (bf16, fp16) if flag is not None]
        if flags:
            strongest = max(flags, key=lambda s: PRECEDENCE[s.source])
            return replace(strongest, value="fp32")
        return Sourced[Any](
            value="fp32",
            source=Provenance.DEFAULT,
            range=self.model_range or self.trainer_range,
            note="no dtype and no bf16/fp16 flag: float32 weights (transformers 4 loads float32 "
            "without dtype=; transformers 5 loads the checkpoint's dtype)",
        )

    def _lora(self) -> LoraPlan | None:
        keys = [key for key in self._candidates if key.startswith("lora.")]
        enabled = self._resolve("lora.enabled")
        if enabled is not None and not enabled.value:
            return None
        if not keys:
            return None
        where = self.lora_range
        peft_default = "PEFT LoraConfig default"
        return LoraPlan(
            r=self._value("lora.r", 8, Provenance.DEFAULT, where, peft_default),
            alpha=self._value("lora.alpha", 8.0, Provenance.DEFAULT, where, peft_default),
            target_modules=self._value(
                "lora.target_modules",
                None,
                Provenance.DEFAULT,
                where,
                "PEFT picks the modules for the architecture (q and v projections for most)",
            ),
            modules_to_save=self._value(
                "lora.modules_to_save", [], Provenance.DEFAULT, where, peft_default
            ),
            dora=self._value("lora.dora", False, Provenance.DEFAULT, where, peft_default),
            dropout=self._value("lora.dropout", 0.0, Provenance.DEFAULT, where, peft_default),
            range=where,
        )

    def _quantization(self) -> QuantizationPlan | None:
        bits = self._resolve("quantization.bits")
        if bits is None or bits.value not in (4, 8):
            if bits is not None:
                self.problems.append(f"quantization: {bits.value} bits is not 4 or 8; ignored")
            return None
        where = self.quantization_range or bits.range
        bnb_default = "bitsandbytes BitsAndBytesConfig default"
        if bits.value == 8:
            quant_type = Sourced[Any](
                value="int8", source=bits.source, range=bits.range, note="8-bit LLM.int8()"
            )
        else:
            quant_type = self._value(
                "quantization.quant_type", "fp4", Provenance.DEFAULT, where, bnb_default
            )
        return QuantizationPlan(
            bits=bits,
            quant_type=quant_type,
            double_quant=self._value(
                "quantization.double_quant", False, Provenance.DEFAULT, where, bnb_default
            ),
            compute_dtype=self._value(
                "quantization.compute_dtype", "float32", Provenance.DEFAULT, where, bnb_default
            ),
            quant_storage=self._value(
                "quantization.quant_storage", "uint8", Provenance.DEFAULT, where, bnb_default
            ),
            prepare_for_kbit_training=self._value(
                "quantization.prepare_for_kbit_training",
                False,
                Provenance.DEFAULT,
                where,
                "prepare_model_for_kbit_training not called",
            ),
            range=where,
        )

    def _distributed(self) -> DistributedPlan:
        deepspeed = self._value(
            "distributed.deepspeed_config", None, Provenance.DEFAULT, None, "no DeepSpeed config"
        )
        fsdp = self._value("distributed.fsdp", None, Provenance.DEFAULT, None, "no FSDP")
        sharded = deepspeed.value is not None or fsdp.value is not None
        world_note = (
            "assumed 1 GPU; DeepSpeed/FSDP shard across GPUs: add `# llmmem: world_size=N`"
            if sharded
            else "assumed 1 GPU (add `# llmmem: world_size=N` for more)"
        )
        return DistributedPlan(
            world_size=self._value(
                "distributed.world_size", 1, Provenance.ASSUMED, None, world_note
            ),
            zero_stage=self._value(
                "distributed.zero_stage",
                0,
                Provenance.DEFAULT,
                deepspeed.range,
                "no DeepSpeed ZeRO" if deepspeed.value is None else "no stage found: ZeRO off",
            ),
            offload_optimizer=self._value(
                "distributed.offload_optimizer", False, Provenance.DEFAULT, None, "no offload"
            ),
            offload_params=self._value(
                "distributed.offload_params", False, Provenance.DEFAULT, None, "no offload"
            ),
            fsdp=fsdp,
            deepspeed_config=deepspeed,
            reduce_bucket_size=self._value(
                "distributed.reduce_bucket_size",
                500_000_000,
                Provenance.DEFAULT,
                None,
                "DeepSpeed default",
            ),
            overlap_comm=self._value(
                "distributed.overlap_comm",
                None,
                Provenance.DEFAULT,
                None,
                "DeepSpeed default: on for ZeRO-3 only",
            ),
            contiguous_gradients=self._value(
                "distributed.contiguous_gradients",
                True,
                Provenance.DEFAULT,
                None,
                "DeepSpeed default",
            ),
            max_reuse_distance=self._value(
                "distributed.max_reuse_distance",
                1_000_000_000,
                Provenance.DEFAULT,
                None,
                "DeepSpeed default",
            ),
            prefetch_bucket_size=self._value(
                "distributed.prefetch_bucket_size",
                50_000_000,
                Provenance.DEFAULT,
                None,
                "DeepSpeed default",
            ),
            param_persistence_threshold=self._value(
                "distributed.param_persistence_threshold",
                100_000,
                Provenance.DEFAULT,
                None,
                "DeepSpeed default",
            ),
            sub_group_size=self._value(
                "distributed.sub_group_size",
                1_000_000_000,
                Provenance.DEFAULT,
                None,
                "DeepSpeed default",
            ),
        )

    def _extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        for key in self._candidates:
            if key in _KNOWN_KEYS or key.startswith(("lora.", "quantization.", "distributed.")):
                continue
            if key in ("bf16", "fp16", "torch_dtype", "max_prompt_length", "max_completion_length"):
                continue
            if key == "objective":
                continue
            found = self._resolve(key)
            if found is not None:
                extra[key] = found
        for key in ("torch_dtype", "max_prompt_length", "max_completion_length"):
            found = self._resolve(key, report=False)
            if found is not None:
                extra[key] = found
        if self._resolve("quantization.bits", report=False) is None:
            # a pre-quantized checkpoint loads in k-bit with no config in the file: whether
            # the file prepares it (llmmem.scenario_setup.checkpoint_quantization_plan)
            found = self._resolve("quantization.prepare_for_kbit_training", report=False)
            if found is not None:
                extra["prepare_for_kbit_training"] = found
        return extra


def _assumed(value: object, note: str) -> Sourced[Any]:
    return Sourced[Any](value=value, source=Provenance.ASSUMED, note=note)


def _single_gpu_distributed(range_: SourceRange | None) -> DistributedPlan:
    return DistributedPlan(
        world_size=_assumed(1, "assumed 1 GPU"),
        zero_stage=Sourced[Any](value=0, source=Provenance.DEFAULT, range=range_),
        offload_optimizer=Sourced[Any](value=False, source=Provenance.DEFAULT),
        offload_params=Sourced[Any](value=False, source=Provenance.DEFAULT),
        fsdp=Sourced[Any](value=None, source=Provenance.DEFAULT),
        deepspeed_config=Sourced[Any](value=None, source=Provenance.DEFAULT),
    )

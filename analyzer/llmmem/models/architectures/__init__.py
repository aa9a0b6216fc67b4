"""Readers that turn an HF `config.json` dict into a ModelSpec, one per supported `model_type`.

Pure Python on the dict: no torch, no transformers. Every count is the exact
`sum(p.numel() for p in model.parameters())` of the transformers 5 class the spec names, and the
defaults for absent keys are those of the transformers config class of that model type.

The readers live in one module per family, and a family's module is imported only when a config
of one of its model types is read: `FAMILY_OF_MODEL_TYPE` says which module holds which reader
(a test checks it against the modules' `READERS`). `ARCHITECTURE_READERS`, every reader by model
type, imports them all on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from importlib import import_module
from typing import Any

from llmmem.models.architectures.assembly import ArchitectureReader, SpecOrigin
from llmmem.models.architectures.checkpoint_quantization import read_checkpoint_quantization
from llmmem.models.architectures.config_view import ConfigFieldError, ConfigView
from llmmem.models.spec import ModelSource, ModelSpec, ModelSpecError

# model_type -> the module (in this package) whose READERS has its reader
FAMILY_OF_MODEL_TYPE: dict[str, str] = {
    **dict.fromkeys(
        (
            "llama",
            "internlm3",
            "granite",
            "smollm3",
            "mistral",
            "qwen2",
            "qwen3",
            "olmo",
            "olmo2",
            "phi3",
            "starcoder2",
            "stablelm",
        ),
        "dense_decoders",
    ),
    **dict.fromkeys(
        ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "llama4_text", "llama4", "glm4_moe"),
        "mixture_of_experts",
    ),
    **dict.fromkeys(("deepseek_v2", "deepseek_v3"), "latent_attention"),
    **dict.fromkeys(("gemma", "gemma2", "gemma3_text", "gemma3"), "gemma"),
    **dict.fromkeys(
        ("gpt2", "gpt_bigcode", "gpt_neox", "gptj", "opt", "falcon", "bloom", "phi"), "gpt_style"
    ),
    **dict.fromkeys(("bert", "roberta", "distilbert"), "masked_lm"),
    **dict.fromkeys(("t5", "mt5"), "t5"),
    **dict.fromkeys(("qwen", "baichuan", "internlm2", "chatglm"), "remote_code"),
    **dict.fromkeys(("glm", "glm4"), "glm"),
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(FAMILY_OF_MODEL_TYPE))

# vision-language model types -> the module whose VISION_LANGUAGE_READERS has their reader; looked
# up before FAMILY_OF_MODEL_TYPE (a gemma3 config gets its vision tower as well as its text)
VISION_FAMILY_OF_MODEL_TYPE: dict[str, str] = dict.fromkeys(
    (
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "gemma3",
        "llava",
        "llava_next",
        "mistral3",
        "internvl",
        "idefics3",
        "smolvlm",
    ),
    "vision_language",
)
VISION_FAMILY_OF_MODEL_TYPE["mllama"] = "mllama"
VISION_FAMILY_OF_MODEL_TYPE["phi3_v"] = "phi3_vision"
VISION_LANGUAGE_MODEL_TYPES: tuple[str, ...] = tuple(sorted(VISION_FAMILY_OF_MODEL_TYPE))


def family_readers(family: str) -> list[ArchitectureReader]:
    """The READERS of one family module, imported on first use."""
    readers: list[ArchitectureReader] = import_module(f"{__name__}.{family}").READERS
    return readers


def architecture_reader(model_type: str) -> ArchitectureReader | None:
    """The reader of a supported `model_type`, importing only its family's module."""
    vision_family = VISION_FAMILY_OF_MODEL_TYPE.get(model_type)
    if vision_family is not None:
        module = import_module(f"{__name__}.{vision_family}")
        for reader in module.VISION_LANGUAGE_READERS:
            if reader.model_type == model_type:
                found: ArchitectureReader = reader
                return found
    family = FAMILY_OF_MODEL_TYPE.get(model_type)
    if family is None:
        return None
    for reader in family_readers(family):
        if reader.model_type == model_type:
            return reader
    return None


def __getattr__(name: str) -> Any:
    if name == "ARCHITECTURE_READERS":  # every reader by model type; imports every family
        return {
            reader.model_type: reader
            for family in dict.fromkeys(FAMILY_OF_MODEL_TYPE.values())
            for reader in family_readers(family)
        }
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def read_architecture(
    config: dict[str, Any],
    *,
    model_id: str,
    source: ModelSource,
    source_detail: str = "",
) -> ModelSpec:
    """Read an HF config dict into a ModelSpec with exact parameter counts.

    Raises ModelSpecError, with a one-line message naming the model type and the supported ones,
    for an unsupported `model_type` or a config missing the sizes its architecture needs.
    """
    if not isinstance(config, Mapping):
        raise ModelSpecError(f"a model config must be a JSON object, not {type(config).__name__}")
    model_type = config.get("model_type")
    reader = architecture_reader(model_type) if isinstance(model_type, str) else None
    if reader is None and isinstance(model_type, str) and model_type:
        from llmmem.models.architectures.generic import generic_reader

        reader = generic_reader(model_type, config)
    supported = ", ".join(sorted({*SUPPORTED_MODEL_TYPES, *VISION_LANGUAGE_MODEL_TYPES}))
    if reader is None:
        what = f"model_type {model_type!r}" if model_type else "a config without 'model_type'"
        raise ModelSpecError(
            f"{what} is not supported (supported: {supported}); "
            "give a config of a supported architecture or state the model size in a pragma"
        )
    view = ConfigView(
        model_type=reader.model_type,
        config_class=reader.config_class,
        values=config,
        defaults=reader.defaults,
    )
    origin = SpecOrigin(model_id=model_id, source=source, source_detail=source_detail)
    try:
        spec = reader.read(view, origin)
    except ConfigFieldError as error:
        raise ModelSpecError(
            f"{error}; it is needed to count the parameters of a {model_type} model "
            f"(supported: {supported})"
        ) from None
    quantization, quantization_note = read_checkpoint_quantization(config)
    extra_notes = [note for note in (view.defaults_note(), quantization_note) if note]
    return replace(
        spec,
        torch_dtype=_declared_dtype(config),
        checkpoint_quantization=quantization,
        notes=[*spec.notes, *extra_notes],
    )


def _declared_dtype(config: Mapping[str, Any]) -> str | None:
    """The checkpoint dtype the config declares: "torch_dtype", or "dtype" in newer configs."""
    for holder in (config, config.get("text_config")):
        if isinstance(holder, Mapping):
            for key in ("torch_dtype", "dtype"):
                declared = holder.get(key)
                if isinstance(declared, str) and declared:
                    return declared.removeprefix("torch.")
    return None


__all__ = ["ARCHITECTURE_READERS", "SUPPORTED_MODEL_TYPES", "read_architecture"]


def spec_from_config(
    config: dict[str, Any],
    *,
    model_id: str,
    source: ModelSource,
    source_detail: str = "",
) -> ModelSpec:
    """Read an HF config dict into a ModelSpec.

    Raises ModelSpecError with a one-line, actionable message for an unsupported `model_type`
    or a config missing the fields its architecture needs.
    """
    spec = read_architecture(config, model_id=model_id, source=source, source_detail=source_detail)
    attention_dropout, hidden_dropout = training_dropout(config)
    return replace(spec, attention_dropout=attention_dropout, hidden_dropout=hidden_dropout)


# Config keys of the dropout a model applies while training, by what it drops.
ATTENTION_DROPOUT_KEYS = (
    "attention_probs_dropout_prob",
    "attn_pdrop",
    "attention_dropout",
    "dropout_rate",
    "attention_dropout_prob",
)
HIDDEN_DROPOUT_KEYS = (
    "hidden_dropout_prob",
    "resid_pdrop",
    "hidden_dropout",
    "dropout",
    "dropout_rate",
    "resid_dropout",
)


def training_dropout(config: dict[str, Any]) -> tuple[float, float]:
    """(attention dropout, residual dropout) as the config sets them; 0 when absent."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config

    def first(keys: tuple[str, ...]) -> float:
        for key in keys:
            value = text.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        return 0.0

    return first(ATTENTION_DROPOUT_KEYS), first(HIDDEN_DROPOUT_KEYS)

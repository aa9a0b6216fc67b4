"""Readers that turn an HF `config.json` dict into a ModelSpec, one per supported `model_type`.

Pure Python on the dict: no torch, no transformers. Every count is the exact
`sum(p.numel() for p in model.parameters())` of the transformers 5 class the spec names, and the
defaults for absent keys are those of the transformers config class of that model type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from llmmem.models.architectures import (
    dense_decoders,
    gemma,
    gpt_style,
    masked_lm,
    mixture_of_experts,
    t5,
)
from llmmem.models.architectures.assembly import ArchitectureReader, SpecOrigin
from llmmem.models.architectures.checkpoint_quantization import read_checkpoint_quantization
from llmmem.models.architectures.config_view import ConfigFieldError, ConfigView
from llmmem.models.spec import ModelSource, ModelSpec, ModelSpecError

ARCHITECTURE_READERS: dict[str, ArchitectureReader] = {
    reader.model_type: reader
    for reader in (
        *dense_decoders.READERS,
        *mixture_of_experts.READERS,
        *gemma.READERS,
        *gpt_style.READERS,
        *masked_lm.READERS,
        *t5.READERS,
    )
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(ARCHITECTURE_READERS))


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
    reader = ARCHITECTURE_READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        what = f"model_type {model_type!r}" if model_type else "a config without 'model_type'"
        raise ModelSpecError(
            f"{what} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)}); "
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
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
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

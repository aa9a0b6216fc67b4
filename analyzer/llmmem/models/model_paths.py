"""Which model a path or a re-upload names, when its own config cannot be read here.

A script written on one machine is often linted on another: `from_pretrained` gets
`models/Qwen2.5-7B-Instruct`, `/data/llm/Meta-Llama-3.1-8B`, or a Hugging Face cache snapshot
(`~/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/<hash>`) that does not
exist where llmmem runs. The cache's layout names the hub id outright; a folder is named after the
model it holds far more often than not. Re-uploads (`unsloth/DeepSeek-R1-Distill-Qwen-14B`,
`unsloth/Qwen2.5-7B-Instruct-bnb-4bit`, `openai-mirror/gpt-oss-20b`) carry the original's name,
and a `-bnb-4bit` one is that model quantized to NF4.

Nothing here reads the disk or the network: these are readings of the text of a reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from llmmem.models.hub_names import is_hub_repo_id

# a folder of the Hugging Face cache: models--ORG--NAME (or models--NAME for a top-level repo)
_HF_CACHE_FOLDER = re.compile(r"(?:^|[\\/])models--([^\\/]+)(?=[\\/]|$)")

# what re-uploads append to the original's name for a bitsandbytes 4-bit checkpoint; unsloth's
# "dynamic" uploads (-unsloth-bnb-4bit) keep some modules in 16-bit, which is not known here
BNB_4BIT_SUFFIXES = ("-unsloth-bnb-4bit", "-bnb-4bit")

# the quantization_config of a `-bnb-4bit` re-upload (unsloth writes NF4 with double
# quantization and bf16 compute, as the bundled unsloth/*-bnb-4bit configs show)
BNB_4BIT_QUANTIZATION: dict[str, Any] = {
    "quant_method": "bitsandbytes",
    "load_in_4bit": True,
    "load_in_8bit": False,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bfloat16",
    "llm_int8_skip_modules": None,
}


def hub_id_of_cache_path(ref: str) -> str | None:
    """The hub id a Hugging Face cache path names (`.../models--Qwen--Qwen2.5-7B/snapshots/x`
    -> `Qwen/Qwen2.5-7B`); None for a reference without that layout."""
    match = _HF_CACHE_FOLDER.search(ref)
    if match is None:
        return None
    hub_id = "/".join(match.group(1).split("--"))
    return hub_id if is_hub_repo_id(hub_id) else None


def path_parts(ref: str) -> list[str]:
    """The parts of a path or id, `config.json` at its end left off."""
    parts = [part for part in re.split(r"[\\/]+", ref.strip()) if part not in ("", ".", "..")]
    if parts and parts[-1].lower() == "config.json":
        parts.pop()
    return parts


@dataclass(frozen=True, slots=True, kw_only=True)
class NamedModel:
    """A bundled model that a path or a re-upload names."""

    model_id: str  # the catalog's canonical id
    how: str  # what named it, for the spec's notes
    bnb_4bit: bool = False  # a `-bnb-4bit` re-upload: that model quantized to NF4


def bundled_model_named_by(ref: str) -> NamedModel | None:
    """The bundled model whose name ends `ref` (`models/Qwen2.5-7B-Instruct`,
    `/data/Qwen/Qwen2.5-7B-Instruct`, `unsloth/Qwen2.5-7B-Instruct-bnb-4bit`); None where the
    last part of `ref` is no bundled model's name."""
    from llmmem.models.catalog import catalog_entry

    parts = path_parts(ref)
    if not parts:
        return None
    name = parts[-1]
    candidates = [(name, False)]
    for suffix in BNB_4BIT_SUFFIXES:
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            candidates.append((name[: -len(suffix)], True))
            break
    for candidate, bnb_4bit in candidates:
        names = [f"{parts[-2]}/{candidate}"] if len(parts) >= 2 else []
        for looked_up in [*names, candidate]:
            entry = catalog_entry(looked_up)
            if entry is None:
                continue
            how = f"its last part '{name}' names {entry.model_id}"
            if bnb_4bit:
                how += " quantized to 4 bits (a -bnb-4bit upload: NF4, double quantization)"
            return NamedModel(model_id=entry.model_id, how=how, bnb_4bit=bnb_4bit)
    return None

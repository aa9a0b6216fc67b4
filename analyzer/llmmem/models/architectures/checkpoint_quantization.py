"""The `quantization_config` block of a checkpoint that is already quantized on the hub."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmmem.models.spec import CheckpointQuantization

# Weight bits of methods whose config does not spell them out.
_BITS_BY_METHOD = {
    "fp8": 8,
    "fbgemm_fp8": 8,
    "finegrained_fp8": 8,
    "eetq": 8,
    "mxfp4": 4,
    "bitnet": 2,
}
_GROUP_SIZE_BY_METHOD = {"mxfp4": 32}


def read_checkpoint_quantization(
    config: Mapping[str, Any],
) -> tuple[CheckpointQuantization | None, str | None]:
    """The quantization a checkpoint ships with (None for an unquantized one), and a note when
    its weight bits had to be assumed."""
    block = config.get("quantization_config")
    if not isinstance(block, Mapping):
        return None, None
    method = str(block.get("quant_method") or _method_from_keys(block)).lower()
    if method == "bitsandbytes":
        return _bitsandbytes(block), None
    if method == "compressed-tensors":
        return _compressed_tensors(block), None
    note = None
    bits = _first_int(block, "bits", "w_bit", "weight_bits", "nbits")
    if bits is None:
        bits = _BITS_BY_METHOD.get(method)
    if bits is None:
        bits = 8
        note = f"quantization_config method {method!r} does not state its weight bits; 8 assumed"
    group_size = _first_int(block, "group_size", "q_group_size")
    if group_size is None:
        group_size = _GROUP_SIZE_BY_METHOD.get(method)
    if group_size is not None and group_size <= 0:
        group_size = None  # GPTQ writes -1 for one group per row
    return CheckpointQuantization(method=method, bits=bits, group_size=group_size), note


def _method_from_keys(block: Mapping[str, Any]) -> str:
    if any(key in block for key in ("load_in_4bit", "load_in_8bit", "_load_in_4bit")):
        return "bitsandbytes"
    if "w_bit" in block:
        return "awq"
    return "unknown"


def _bitsandbytes(block: Mapping[str, Any]) -> CheckpointQuantization:
    if block.get("load_in_4bit") or block.get("_load_in_4bit"):
        return CheckpointQuantization(
            method="bitsandbytes",
            bits=4,
            quant_type=str(block.get("bnb_4bit_quant_type") or "fp4"),
            double_quant=bool(block.get("bnb_4bit_use_double_quant")),
        )
    return CheckpointQuantization(method="bitsandbytes", bits=8)


def _compressed_tensors(block: Mapping[str, Any]) -> CheckpointQuantization:
    groups = block.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping):
                bits = _first_int(weights, "num_bits") or 8
                group_size = _first_int(weights, "group_size")
                kind = weights.get("type")
                return CheckpointQuantization(
                    method="compressed-tensors",
                    bits=bits,
                    quant_type=str(kind) if kind else None,
                    group_size=group_size,
                )
    return CheckpointQuantization(method="compressed-tensors", bits=8)


def _first_int(block: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        raw = block.get(key)
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
    return None

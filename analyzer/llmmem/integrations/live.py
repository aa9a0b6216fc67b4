"""What the running objects say about the step: the same plan a file gives, with nothing guessed.

A script read without running leaves much to assumptions; at run time the model, the
TrainingArguments, the optimizer and the first batch are there. `read_live` feeds a PlanBuilder
(the same canonical keys every file reader uses, provenance `explicit`, each noted "read from
the running ...") from them:

- the model: its config (written to a temporary `config.json` the budget sizes the model from),
  the dtype its weights are in, bitsandbytes 4-bit/8-bit layers and their quant state, PEFT's
  adapter config and whether it is on, gradient checkpointing as set on the model, the attention
  implementation, `use_cache`;
- the arguments: batch, accumulation, precision flags, checkpointing, the optimizer's name, the
  sequence length a TRL config truncates to, DeepSpeed and FSDP, the world size;
- the optimizer object: its class (and `fused`), when the loop builds its own;
- the first batch: its `input_ids` shape, which wins over what the arguments say.

Nothing here moves a tensor or runs a step; torch is imported only to read dtypes.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmmem.extract.builder import PlanBuilder
from llmmem.plan import Provenance

TRL_OBJECTIVES = {  # TRL trainer classes whose batch is not one sequence per row
    "DPOTrainer": "dpo",
    "ORPOTrainer": "orpo",
    "CPOTrainer": "cpo",
    "KTOTrainer": "kto",
    "RewardTrainer": "reward",
    "GRPOTrainer": "grpo",
    "PPOTrainer": "ppo",
    "OnlineDPOTrainer": "online-dpo",
}


class NotReadable(ValueError):
    """The objects cannot be sized at run time (the message says what is missing or why)."""


@dataclass
class LiveReading:
    """The plan's settings, where the model's config was written, and what was noticed."""

    builder: PlanBuilder
    config_path: Path
    model_id: str
    framework: str  # "hf", "trl" or "plain"
    notes: list[str] = field(default_factory=list)
    adapter_bytes: int | None = None  # the adapters' own dtype, where PEFT adapters exist
    _folder: Any = None  # the temporary folder holding config.json

    def close(self) -> None:
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None


def _set(builder: PlanBuilder, key: str, value: Any, what: str) -> None:
    builder.set(key, value, Provenance.EXPLICIT, None, note=f"read from the running {what}")


def unwrapped(model: Any) -> Any:
    """The model inside DDP/FSDP/DeepSpeed wrappers and torch.compile."""
    for _ in range(8):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None or inner is model:
            return model
        model = inner
    return model


def read_live(
    *,
    model: Any,
    args: Any = None,
    optimizer: Any = None,
    batch: Any = None,
    trainer_class: str | None = None,
    world_size: int | None = None,
) -> LiveReading:
    model = unwrapped(model)
    base = _base_model(model)
    config = getattr(base, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise NotReadable(
            "the model has no transformers config (`model.config`): preflight sizes "
            "transformers models; size other models from their script with `llmmem explain`"
        )
    builder = PlanBuilder()
    framework = "plain"
    if trainer_class is not None:
        objective = TRL_OBJECTIVES.get(trainer_class)
        if objective is not None:
            raise NotReadable(
                f"{trainer_class} ({objective}): preflight sizes supervised steps (Trainer, "
                "SFTTrainer, a plain loop) today; size this one from its script with "
                "`llmmem explain`"
            )
        framework = "trl" if trainer_class.startswith("SFT") else "hf"
    folder = tempfile.TemporaryDirectory(prefix="llmmem-preflight-")
    config_dict = config.to_dict()
    config_path = Path(folder.name) / "config.json"
    config_path.write_text(json.dumps(config_dict, default=str), encoding="utf-8")
    model_id = str(getattr(config, "_name_or_path", "") or config_dict.get("model_type", "model"))
    reading = LiveReading(builder, config_path, model_id, framework, _folder=folder)
    _set(builder, "model_id", model_id, "model")
    builder.set("model_config", str(config_path), Provenance.PRAGMA, None, note="")
    _read_model(base, model, reading)
    if args is not None:
        _read_arguments(args, reading)
    if optimizer is not None:
        _read_optimizer(optimizer, reading)
    if batch is not None:
        _read_batch(batch, reading)
    if world_size is not None:
        _set(builder, "distributed.world_size", world_size, "process group")
    return reading


def _base_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper."""
    getter = getattr(model, "get_base_model", None)
    if callable(getter):
        try:
            return getter()
        except Exception:  # a wrapper that cannot answer: read the object itself
            return model
    return model


def _read_model(base: Any, model: Any, reading: LiveReading) -> None:
    import torch

    builder = reading.builder
    weights: Counter[str] = Counter()
    quantized = None
    for module in base.modules():
        kind = type(module).__name__
        if kind in ("Linear4bit", "Linear8bitLt") and quantized is None:
            quantized = module
    adapter_dtypes: Counter[str] = Counter()
    for name, parameter in model.named_parameters():
        dtype = parameter.dtype
        if "lora_" in name:
            adapter_dtypes[str(dtype)] += parameter.numel()
            continue
        if dtype.is_floating_point:
            weights[str(dtype)] += parameter.numel()
    if weights:
        dominant = weights.most_common(1)[0][0].removeprefix("torch.")
        _set(builder, "torch_dtype", dominant, "model's weights")
    if quantized is not None:
        _read_quantization(quantized, weights, builder)
    peft_config = getattr(model, "peft_config", None)
    if isinstance(peft_config, dict) and peft_config:
        active = getattr(model, "active_adapter", None)
        adapter = peft_config.get(active) if isinstance(active, str) else None
        adapter = adapter or next(iter(peft_config.values()))
        _read_adapter(adapter, builder)
        if adapter_dtypes:
            dominant = adapter_dtypes.most_common(1)[0][0]
            reading.adapter_bytes = getattr(torch, dominant.split(".")[-1]).itemsize
    checkpointing = getattr(base, "is_gradient_checkpointing", None)
    if isinstance(checkpointing, bool):
        _set(builder, "gradient_checkpointing", checkpointing, "model")
    config = base.config
    attention = getattr(config, "_attn_implementation", None)
    if isinstance(attention, str):
        _set(builder, "attn_implementation", attention, "model's config")
    use_cache = getattr(config, "use_cache", None)
    if isinstance(use_cache, bool):
        _set(builder, "use_cache", use_cache, "model's config")


def _read_quantization(layer: Any, weights: Counter[str], builder: PlanBuilder) -> None:
    what = "bitsandbytes layer"
    if type(layer).__name__ == "Linear8bitLt":
        _set(builder, "quantization.bits", 8, what)
        return
    _set(builder, "quantization.bits", 4, what)
    weight = getattr(layer, "weight", None)
    state = getattr(weight, "quant_state", None)
    if state is not None:
        quant_type = getattr(state, "quant_type", None)
        if isinstance(quant_type, str):
            _set(builder, "quantization.quant_type", quant_type, what)
        _set(builder, "quantization.double_quant", bool(getattr(state, "nested", False)), what)
        dtype = getattr(state, "dtype", None)
        if dtype is not None:
            _set(builder, "quantization.compute_dtype", str(dtype).removeprefix("torch."), what)
    compute = getattr(layer, "compute_dtype", None)
    if compute is not None:
        _set(builder, "quantization.compute_dtype", str(compute).removeprefix("torch."), what)
    if weight is not None:
        _set(builder, "quantization.quant_storage", str(weight.dtype).removeprefix("torch."), what)
    # peft's prepare_model_for_kbit_training upcasts every parameter that is not quantized to
    # fp32: the floating-point parameters are then all fp32
    floating = {dtype for dtype in weights if dtype != "torch.uint8"}
    _set(builder, "quantization.prepare_for_kbit_training", floating == {"torch.float32"}, what)


def _read_adapter(adapter: Any, builder: PlanBuilder) -> None:
    what = "PEFT adapter"
    if type(adapter).__name__ not in ("LoraConfig",) and not hasattr(adapter, "lora_alpha"):
        return
    _set(builder, "lora.enabled", True, what)
    for key, attribute in (
        ("lora.r", "r"),
        ("lora.alpha", "lora_alpha"),
        ("lora.dropout", "lora_dropout"),
        ("lora.dora", "use_dora"),
    ):
        value = getattr(adapter, attribute, None)
        if value is not None:
            _set(builder, key, value, what)
    targets = getattr(adapter, "target_modules", None)
    if isinstance(targets, (set, frozenset)):
        targets = sorted(targets)
    if targets:
        _set(builder, "lora.target_modules", targets, what)
    saved = getattr(adapter, "modules_to_save", None)
    if saved:
        _set(builder, "lora.modules_to_save", list(saved), what)


def _read_arguments(args: Any, reading: LiveReading) -> None:
    builder = reading.builder
    what = "TrainingArguments"
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        value = getattr(args, key, None)
        if isinstance(value, int) and value > 0:
            _set(builder, key, value, what)
    for key in ("bf16", "fp16", "gradient_checkpointing"):
        value = getattr(args, key, None)
        if isinstance(value, bool):
            if key == "gradient_checkpointing" and not value:
                continue  # the model's own flag says whether it checkpoints
            _set(builder, key, value, what)
    optim = getattr(args, "optim", None)
    optim = getattr(optim, "value", optim)
    if isinstance(optim, str) and optim:
        _set(builder, "optim", optim, what)
    for key in ("max_length", "max_seq_length"):  # TRL's SFTConfig truncates to it
        value = getattr(args, key, None)
        if isinstance(value, int) and value > 0:
            _set(builder, "max_seq_length", value, "SFTConfig")
            break
    world = getattr(args, "world_size", None)
    if isinstance(world, int) and world > 0:
        _set(builder, "distributed.world_size", world, what)
    deepspeed = getattr(args, "hf_deepspeed_config", None)
    config = getattr(deepspeed, "config", None)
    if isinstance(config, dict):
        stage = (config.get("zero_optimization") or {}).get("stage")
        if isinstance(stage, int):
            _set(builder, "distributed.zero_stage", stage, "DeepSpeed config")
    fsdp = getattr(args, "fsdp", None)
    if fsdp:
        options = [getattr(option, "value", option) for option in fsdp]
        _set(builder, "distributed.fsdp", " ".join(str(o) for o in options), what)


def _read_optimizer(optimizer: Any, reading: LiveReading) -> None:
    from llmmem.extract.vocabulary import optim_for_optimizer_class

    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    kind = type(inner)
    dotted = f"{kind.__module__}.{kind.__name__}"
    defaults = getattr(inner, "defaults", {}) or {}
    name = optim_for_optimizer_class(dotted, fused=bool(defaults.get("fused")))
    if name is None:
        name = optim_for_optimizer_class(kind.__name__, fused=bool(defaults.get("fused")))
    if name is not None:
        _set(reading.builder, "optim", name, "optimizer")
    else:
        reading.notes.append(f"the optimizer {dotted} is not one llmmem knows; sized as AdamW")


def _read_batch(batch: Any, reading: LiveReading) -> None:
    ids = batch.get("input_ids") if isinstance(batch, dict) else getattr(batch, "input_ids", None)
    if ids is None and hasattr(batch, "shape"):
        ids = batch
    shape = getattr(ids, "shape", None)
    if shape is None or len(shape) != 2:
        reading.notes.append("the first batch has no (batch, sequence) input_ids: not read")
        return
    rows, length = int(shape[0]), int(shape[1])
    _set(reading.builder, "per_device_train_batch_size", rows, "first batch")
    _set(reading.builder, "max_seq_length", length, "first batch")

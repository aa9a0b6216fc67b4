"""`llmmem estimate`'s flags as a TrainingPlan: the road a file's plan takes, from flags.

Each setting a flag gives is `Provenance.FLAG`; each one left out is what the HF Trainer or TRL
(or, with `--framework`, that framework's configs) would use, as `Provenance.DEFAULT` (the
sequence length, which no framework fixes, as `Provenance.ASSUMED`). From the plan on,
`llmmem.sizing` applies the same rules to flags as to a file, so `estimate` and `explain` size
the same settings the same way.

What a flag says that no file can (the images of a vision model, context and tensor
parallelism, FP8, generation) is laid over the setup the plan gives (`overlay_flags`). The
provenance each line of estimate's table shows is kept beside the plan (`FlagPlan.prov`).
A combination of flags that cannot run is refused here with one line (UsageError).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from llmmem.budget.lora_targets import default_lora_targets, torchtune_lora_targets
from llmmem.budget.optimizers import find_optimizer
from llmmem.budget.result import GpuTarget
from llmmem.budget.setup import Method, Mode, Packing, Precision, SetupError, TrainingSetup
from llmmem.errors import UsageError
from llmmem.models.spec import ModelSpec
from llmmem.plan import (
    DistributedPlan,
    LoraPlan,
    Provenance,
    QuantizationPlan,
    Sourced,
    TrainingPlan,
)
from llmmem.scenario_setup import checkpoint_quantization_plan

# What HF Trainer / TRL do when a setting is not given.
DEFAULTS: dict[str, Any] = {
    "method": "full",
    "batch": 8,  # TrainingArguments.per_device_train_batch_size
    "seq": 1024,  # TRL SFTConfig.max_length
    "grad_accum": 1,
    "grad_ckpt": False,
    "optim": "adamw_torch_fused",  # TrainingArguments.optim on torch >= 2.8
    "lora_r": 8,  # peft LoraConfig.r
    "lora_alpha": 8,
    "lora_targets": None,  # peft picks per architecture: q and v projections for most
    "attn": "sdpa",
    "loss": "standard",
    "world_size": 1,
    "zero": 0,
    "mode": "train",
    "new_tokens": 256,
}

# --framework as a plan's framework names it; unsloth is transformers' models under its
# patches (the plan's `unsloth` key), "plain" a loop of the script's own
PLAN_FRAMEWORKS = {"unsloth": "hf"}

# the plan's precision names, as --quant-compute-dtype names them
COMPUTE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

# what --adapter-dtype keeps, as ms-swift's `lora_dtype` (llmmem.scenario._adapter_bytes)
ADAPTER_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass
class FlagPlan:
    """The plan the flags make, and the provenance estimate's table shows for each line."""

    plan: TrainingPlan
    prov: dict[str, str] = field(default_factory=dict)


def _flag(value: Any) -> Sourced[Any]:
    return Sourced(value=value, source=Provenance.FLAG, note="flag")


def _default(value: Any, note: str = "llmmem estimate's default") -> Sourced[Any]:
    return Sourced(value=value, source=Provenance.DEFAULT, note=note)


# the flags whose default a framework's reader sets, by the plan key its tables name
FLAG_KEYS = {
    "per_device_train_batch_size": "batch",
    "gradient_accumulation_steps": "grad_accum",
    "max_seq_length": "seq",
    "gradient_checkpointing": "grad_ckpt",
    "optim": "optim",
    "attn_implementation": "attn",
    "lora.r": "lora_r",
    "lora.alpha": "lora_alpha",
    "lora.dropout": "lora_dropout",
    "lora.target_modules": "lora_targets",
}


@cache
def framework_defaults(framework: str | None) -> dict[str, tuple[Any, str]]:
    """What the framework's own reader takes for a setting its config leaves out (its
    defaults tables, `llmmem.extract.frameworks`), by estimate's flag: `--framework swift`
    without `--grad-ckpt` checkpoints as `swift sft` does. Empty for the HF stack and TRL, whose
    defaults are estimate's own (DEFAULTS)."""
    tables: tuple[tuple[tuple[str, Any, str], ...], ...] = ()
    if framework == "swift":
        from llmmem.extract.frameworks.swift import SWIFT_DEFAULTS, SWIFT_LORA_DEFAULTS

        tables = (SWIFT_DEFAULTS, SWIFT_LORA_DEFAULTS)
    elif framework == "axolotl":
        from llmmem.extract.frameworks.axolotl import AXOLOTL_DEFAULTS

        tables = (AXOLOTL_DEFAULTS,)
    elif framework == "llamafactory":
        from llmmem.extract.frameworks.llamafactory import LLAMAFACTORY_DEFAULTS

        tables = (LLAMAFACTORY_DEFAULTS,)
    elif framework == "litgpt":
        from llmmem.extract.frameworks.litgpt import LITGPT_DEFAULTS, LITGPT_LORA_DEFAULTS

        # its checkpointing follows the strategy (its reader: on above one device), which a
        # flag says: left to --grad-ckpt
        tables = (
            tuple(row for row in LITGPT_DEFAULTS if row[0] != "gradient_checkpointing"),
            LITGPT_LORA_DEFAULTS,
        )
    out: dict[str, tuple[Any, str]] = {}
    for table in tables:
        for key, value, note in table:
            if key in FLAG_KEYS:
                out[FLAG_KEYS[key]] = (value, note)
    return out


def _pick(args: argparse.Namespace, name: str, prov: dict[str, str]) -> Sourced[Any]:
    """The flag's value (FLAG), else the framework's default or estimate's (DEFAULT; the
    sequence no framework fixes ASSUMED)."""
    value = getattr(args, name, None)
    if value is not None:
        prov[name] = "flag"
        return _flag(value)
    own = framework_defaults(getattr(args, "framework", None)).get(name)
    if own is not None:
        prov[name] = f"default ({own[1]})"
        return _default(own[0], own[1])
    prov[name] = "default"
    source = Provenance.ASSUMED if name == "seq" else Provenance.DEFAULT
    return Sourced(value=DEFAULTS.get(name), source=source, note="default")


def plan_from_flags(
    args: argparse.Namespace,
    spec: ModelSpec,
    gpu: GpuTarget | None,
    *,
    supervised: bool = True,
) -> FlagPlan:
    """The plan the flags describe; `supervised`: an SFT step (TRL's SFTTrainer for
    `--framework trl`)."""
    prov: dict[str, str] = {}
    framework_name = getattr(args, "framework", None) or "hf"
    torchtune = framework_name == "torchtune"
    if torchtune:
        _refuse_for_torchtune(args)
    extra: dict[str, Any] = {}
    method = Method(_pick(args, "method", prov).value)
    if getattr(args, "quant", None) and args.method is None:
        method = Method.QLORA if args.quant in ("nf4", "fp4") else Method.LORA
        prov["method"] = "implied by --quant"
    elif args.method == "lora" and getattr(args, "quant", None) in ("nf4", "fp4"):
        prov["method"] = "flag: LoRA over a 4-bit base is QLoRA"
    prequantized = spec.checkpoint_quantization
    bnb_checkpoint = (
        prequantized is not None
        and prequantized.method == "bitsandbytes"
        and not getattr(args, "quant", None)
    )
    if bnb_checkpoint:
        if args.method == "full":
            raise UsageError(
                f"{spec.model_id} is a pre-quantized bitsandbytes checkpoint and cannot be fully "
                "fine-tuned: use --method lora (LoRA over the quantized base) or the original model"
            )
        if args.method is None:
            method = Method.QLORA
            prov["method"] = "implied by the pre-quantized checkpoint"
    precision = _precision(args, gpu, torchtune, prov)
    lora = _lora_plan(args, spec, method, torchtune, prov)
    if lora is not None and getattr(args, "adapter_dtype", None):
        extra["lora_dtype"] = _flag(ADAPTER_DTYPES[args.adapter_dtype])
    quantization = _quantization_plan(args, spec, method, bnb_checkpoint, prov)
    optim = _pick(args, "optim", prov)
    try:
        find_optimizer(str(optim.value))
    except SetupError as err:
        raise UsageError(str(err)) from None
    distributed = _distributed_plan(args, prov)
    loss_name = getattr(args, "loss", None)
    if loss_name is not None:
        prov["loss"] = "flag"
        loss: Sourced[str] | None = _flag(loss_name)
    elif torchtune:
        prov["loss"] = "torchtune's configs' CEWithChunkedOutputLoss (8 chunks)"
        loss = _default("chunked", prov["loss"])
    elif framework_name == "litgpt":
        prov["loss"] = "litgpt's default (chunked cross-entropy)"
        loss = None  # the plan road's rule: litgpt's finetune scripts chunk the loss
    else:
        prov["loss"] = "default"
        loss = None
    grad_ckpt = _pick(args, "grad_ckpt", prov)
    if framework_name == "unsloth":
        extra["unsloth"] = _flag(True)
    if framework_name == "trl" and supervised:
        extra["trainer"] = _default("SFTTrainer", "--framework trl")
    for flag, key in (
        ("compile", "torch_compile"),
        ("optimizer_in_backward", "optimizer_in_bwd"),
    ):
        if getattr(args, flag, None):
            extra[key] = _flag(True)
    if getattr(args, "reentrant_ckpt", None) is not None:
        extra["use_reentrant"] = _flag(bool(args.reentrant_ckpt))
    offload = _activation_offload(args, framework_name, prov)
    if offload is not None:
        extra["activation_offloading"] = offload
    batch = _pick(args, "batch", prov)
    grad_accum = _pick(args, "grad_accum", prov)
    if framework_name == "swift" and getattr(args, "grad_accum", None) is None:
        from llmmem.extract.frameworks.swift import swift_accumulation

        steps = swift_accumulation(int(batch.value), int(distributed.world_size.value or 1))
        note = "ms-swift: ceil(16 / batch / world size)"
        prov["grad_accum"] = f"default ({note})"
        grad_accum = _default(steps, note)
    plan = TrainingPlan(
        path=str(Path.cwd() / "llmmem-estimate"),
        kind="flags",
        framework=PLAN_FRAMEWORKS.get(framework_name, framework_name),
        model_id=_flag(spec.model_id),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=grad_accum,
        max_seq_length=_pick(args, "seq", prov),
        gradient_checkpointing=grad_ckpt,
        precision=precision,
        optim=optim,
        attn_implementation=_pick(args, "attn", prov),
        use_cache=_flag(True) if getattr(args, "use_cache", False) else None,
        loss=loss,
        lora=lora,
        quantization=quantization,
        distributed=distributed,
        extra=extra,
    )
    return FlagPlan(plan=plan, prov=prov)


def _precision(
    args: argparse.Namespace, gpu: GpuTarget | None, torchtune: bool, prov: dict[str, str]
) -> Sourced[str]:
    given = getattr(args, "precision", None)
    if torchtune and given in (None, "bf16", "bf16-true", "bf16-autocast"):
        # torchtune keeps the whole model in its config's dtype: bf16 in its configs
        if gpu is not None and not gpu.bf16:
            raise UsageError(
                f"{gpu.name} has no bf16 support: torchtune then trains in fp32 (--precision fp32)"
            )
        prov["precision"] = (
            "torchtune's dtype (bf16 in its configs): weights, adapters, gradients and states "
            "in bf16, no autocast"
            if given is None
            else "flag, as torchtune's dtype: everything in bf16, no autocast"
        )
        if given is None:
            return _default(Precision.BF16_TRUE.value, prov["precision"])
        return _flag(Precision.BF16_TRUE.value)
    if given is None:
        precision = Precision.BF16 if (gpu is None or gpu.bf16) else Precision.FP16
        prov["precision"] = (
            "default (bf16 autocast"
            + (
                ""
                if precision is Precision.BF16
                else f"; fp16 as {gpu.name if gpu else ''} has no bf16"
            )
            + ")"
        )
        return _default(precision.value, prov["precision"])
    precision = Precision(given)
    prov["precision"] = "flag"
    if gpu is not None and precision.uses_bf16 and not gpu.bf16:
        raise UsageError(
            f"{gpu.name} has no bf16 support: use --precision fp16 (or fp32), or a newer GPU"
        )
    return _flag(precision.value)


LORA_FLAGS = (
    "lora_r",
    "lora_alpha",
    "lora_targets",
    "lora_modules_to_save",
    "lora_dropout",
    "adapter_dtype",
)


def _lora_plan(
    args: argparse.Namespace,
    spec: ModelSpec,
    method: Method,
    torchtune: bool,
    prov: dict[str, str],
) -> LoraPlan | None:
    if method not in (Method.LORA, Method.QLORA):
        if any(getattr(args, name, None) is not None for name in LORA_FLAGS):
            raise UsageError("--lora-* and --adapter-dtype flags need --method lora or qlora")
        return None
    targets_text = getattr(args, "lora_targets", None)
    own = framework_defaults(getattr(args, "framework", None))
    if not targets_text and "lora_targets" in own:
        chosen_by_framework, note = own["lora_targets"]
        prov["lora_targets"] = f"default ({note})"
        targets: Sourced[list[str] | None] = _default(list(chosen_by_framework), note)
    elif targets_text:
        prov["lora_targets"] = "flag"
        targets = _flag([t.strip() for t in targets_text.split(",") if t.strip()])
    else:
        prov["lora_targets"] = (
            "torchtune's LoRA configs (q, v and output projections, the MLP)"
            if torchtune
            else "default (PEFT's choice for this architecture)"
        )
        chosen = torchtune_lora_targets(spec) if torchtune else default_lora_targets(spec)
        targets = _default(chosen, prov["lora_targets"])
    to_save = getattr(args, "lora_modules_to_save", None)
    dropout = getattr(args, "lora_dropout", None)
    if dropout is not None and not 0 <= dropout < 1:
        raise UsageError(f"--lora-dropout must be at least 0 and below 1, got {dropout:g}")
    r = _pick(args, "lora_r", prov)
    alpha = _pick(args, "lora_alpha", prov)
    if dropout is None and "lora_dropout" in own:
        dropout_default, dropout_note = own["lora_dropout"]
        prov["lora_dropout"] = f"default ({dropout_note})"
        dropout_sourced: Sourced[float] = _default(float(dropout_default), dropout_note)
    else:
        prov["lora_dropout"] = "flag" if dropout is not None else "default (0)"
        dropout_sourced = _flag(dropout) if dropout is not None else _default(0.0)
    adapter_dtype = getattr(args, "adapter_dtype", None)
    prov["adapter_dtype"] = (
        "torchtune: the model's dtype"
        if torchtune
        else "flag"
        if adapter_dtype
        else "default (fp32: autocast_adapter_dtype)"
    )
    return LoraPlan(
        r=r,
        alpha=alpha,
        target_modules=targets,
        modules_to_save=_flag([m.strip() for m in to_save.split(",") if m.strip()])
        if to_save
        else _default([]),
        dora=_flag(True) if getattr(args, "dora", False) else _default(False),
        dropout=dropout_sourced,
    )


def _quantization_plan(
    args: argparse.Namespace,
    spec: ModelSpec,
    method: Method,
    bnb_checkpoint: bool,
    prov: dict[str, str],
) -> QuantizationPlan | None:
    """--quant (or --method qlora) as the plan's bitsandbytes config; a pre-quantized
    bitsandbytes checkpoint's own (llmmem.scenario.checkpoint_quantization_plan), with what
    the flags say of its preparation, storage and compute dtype."""
    quant = getattr(args, "quant", None)
    if quant or method is Method.QLORA or bnb_checkpoint:
        if method is Method.FULL:
            raise UsageError(
                "--quant needs --method lora or qlora: a quantized base cannot be fully fine-tuned"
            )
        storage = getattr(args, "quant_storage", None)
        prov["quant_storage"] = "flag" if storage else "default (uint8)"
        prov["quant"] = (
            "flag"
            if quant
            else "the checkpoint's own quantization"
            if bnb_checkpoint
            else "default (qlora: nf4)"
        )
        prepare = getattr(args, "kbit_prepare", None)
        compute = getattr(args, "quant_compute_dtype", None)
        checkpoint = checkpoint_quantization_plan(spec) if bnb_checkpoint else None
        if checkpoint is not None:
            # estimate's default, as for --quant: the run prepares its k-bit model
            checkpoint.prepare_for_kbit_training = (
                _flag(bool(prepare)) if prepare is not None else _default(True)
            )
            if storage:
                checkpoint.quant_storage = _flag(storage)
            if compute:
                checkpoint.compute_dtype = _flag(COMPUTE_DTYPES[compute])
            return checkpoint
        quant_type = quant or "nf4"
        return QuantizationPlan(
            bits=_flag(8 if quant_type == "int8" else 4) if quant else _default(4),
            quant_type=_flag(quant_type) if quant else _default(quant_type),
            double_quant=_flag(True) if args.double_quant else _default(False),
            compute_dtype=_flag(COMPUTE_DTYPES[compute]) if compute else _default("bfloat16"),
            prepare_for_kbit_training=_flag(bool(prepare))
            if prepare is not None
            else _default(True),
            quant_storage=_flag(storage) if storage else _default("uint8"),
        )
    for flag, needs in (
        ("kbit_prepare", "--kbit-prepare needs --quant (or --method qlora)"),
        ("double_quant", "--double-quant needs --quant nf4 or fp4 (or --method qlora)"),
        ("quant_storage", "--quant-storage needs --quant nf4 or fp4 (or --method qlora)"),
        (
            "quant_compute_dtype",
            "--quant-compute-dtype needs --quant nf4 or fp4 (or --method qlora)",
        ),
    ):
        value = getattr(args, flag, None)
        if value is not None and value is not False:
            raise UsageError(needs)
    return None


def _distributed_plan(args: argparse.Namespace, prov: dict[str, str]) -> DistributedPlan:
    zero = _pick(args, "zero", prov)
    world = _pick(args, "world_size", prov)
    fsdp = getattr(args, "fsdp", None)
    offload = getattr(args, "offload", None)
    if zero.value and fsdp is not None:
        raise UsageError("choose DeepSpeed ZeRO or FSDP, not both")
    shards_params = zero.value == 3 or fsdp is not None
    if offload == "params" and not shards_params:
        raise UsageError(
            "--offload params needs ZeRO stage 3 (--zero 3) or FSDP (--fsdp): only sharded "
            "parameters can live on the CPU"
        )
    # FSDP's CPUOffload moves the parameters and steps them on the CPU: states too
    offload_optimizer = offload in ("optimizer", "all") or (
        offload == "params" and fsdp is not None
    )
    offload_params = offload in ("params", "all") and shards_params
    return DistributedPlan(
        world_size=world,
        zero_stage=zero,
        offload_optimizer=_flag(offload_optimizer) if offload else _default(False),
        offload_params=_flag(offload_params) if offload else _default(False),
        fsdp=_flag(fsdp) if fsdp else _default(None),
        deepspeed_config=_default(None),
    )


def _activation_offload(
    args: argparse.Namespace, framework: str, prov: dict[str, str]
) -> Sourced[bool] | None:
    """--activation-offload as given; unsloth's checkpointing offloads by default
    (get_peft_model's use_gradient_checkpointing="unsloth", llmmem.budget.stacks.unsloth), as
    a script that leaves it unsaid is read."""
    given = getattr(args, "activation_offload", None)
    if given is not None:
        prov["activation_offload"] = "flag"
        return _flag(bool(given))
    if framework == "unsloth" and getattr(args, "grad_ckpt", None):
        prov["activation_offload"] = (
            'unsloth\'s default: use_gradient_checkpointing="unsloth" keeps the checkpointed '
            "layers' inputs on the host"
        )
        return _default(True, prov["activation_offload"])
    return None


def _refuse_for_torchtune(args: argparse.Namespace) -> None:
    """Flags for what torchtune has no switch for: one line saying what it does instead."""
    if getattr(args, "kbit_prepare", None):
        raise UsageError(
            "--kbit-prepare: torchtune does not prepare a k-bit model (its norms, embeddings "
            "and head stay in the model's dtype)"
        )
    model_dtype = "fp32" if getattr(args, "precision", None) == "fp32" else "bf16"
    if getattr(args, "adapter_dtype", None) not in (None, model_dtype):
        raise UsageError(
            "--adapter-dtype: torchtune keeps the LoRA weights in the model's dtype (its "
            "`dtype`); set --precision instead"
        )
    if getattr(args, "quant_storage", None):
        raise UsageError("--quant-storage: torchtune's NF4 weights are torchao tensors")


def overlay_flags(
    args: argparse.Namespace, setup: TrainingSetup, prov: dict[str, str]
) -> TrainingSetup:
    """What only a flag says, over the plan's setup: generation, the first step's states,
    the packing of samples and new tokens."""
    mode = _pick(args, "mode", prov)
    new_tokens = _pick(args, "new_tokens", prov)
    packed = getattr(args, "packed", None)
    return replace(
        setup,
        mode=Mode(mode.value),
        new_tokens=new_tokens.value,
        first_step=bool(getattr(args, "first_step", False)),
        packing=Packing(packed) if packed else setup.packing,
    )

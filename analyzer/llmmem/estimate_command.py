"""`llmmem estimate`: flags → ModelSpec + TrainingSetup + GPU → Budget → table or JSON.

Every setting that was not given is defaulted here and labelled `default` in the output.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from llmmem.budget.limits import largest_batch, largest_seq
from llmmem.budget.lora_targets import default_lora_targets, torchtune_lora_targets
from llmmem.budget.optimizers import find_optimizer
from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Budget, GpuTarget
from llmmem.budget.setup import (
    TESTED_TRANSFORMERS,
    AttnImpl,
    DistributedSetup,
    Framework,
    FsdpShard,
    LoraSetup,
    LossImpl,
    Method,
    Mode,
    Precision,
    QuantSetup,
    QuantType,
    SetupError,
    TrainingSetup,
    release,
)
from llmmem.budget.stacks import stack_for
from llmmem.errors import UsageError
from llmmem.fp8_flags import add_fp8_flags, fp8_from_args
from llmmem.model_flags import add_task_flags, hub_wanted, resolve_spec, with_task_flags
from llmmem.models.spec import ModelSpec
from llmmem.objective_flags import (
    add_grpo_flags,
    add_ppo_flags,
    grpo_batch_unit,
    grpo_lines,
    grpo_values,
    ppo_lines,
    ppo_values,
    preference_from_args,
)
from llmmem.parallel_flags import add_parallel_flags, parallel_from_args, parallel_line
from llmmem.units import format_bytes
from llmmem.vision_flags import add_vision_flags, vision_from_args, vision_line

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


# --framework: the stack each value trains with (llmmem.budget.stacks)
FRAMEWORK_STACKS: dict[str, Framework] = {
    "hf": Framework.HF,
    "trl": Framework.HF,
    "axolotl": Framework.HF,
    "llamafactory": Framework.HF,
    "torchtune": Framework.TORCHTUNE,
    "litgpt": Framework.LITGPT,
    "plain": Framework.PLAIN,
    "swift": Framework.SWIFT,
    "unsloth": Framework.UNSLOTH,
}
# the values that run the HF Trainer (or TRL's trainers on it) around transformers' models
HF_TRAINER_FRAMEWORKS = {"trl": "TRL", "axolotl": "axolotl", "llamafactory": "LLaMA-Factory"}


# the libraries whose release changes what a step holds, as `--versions` names them
VERSIONED_LIBRARIES = ("transformers", "torch", "bitsandbytes", "trl")


def parse_versions(text: str | list[str] | None) -> dict[str, str]:
    """`--versions transformers=4.48.1[,...]` as {library: "major.minor"}; UsageError for a
    library llmmem has no rule for or a release it cannot read."""
    if not text:
        return {}
    items = text if isinstance(text, list) else [text]
    found: dict[str, str] = {}
    for item in (part.strip() for entry in items for part in entry.split(",")):
        if not item:
            continue
        library, _, version = item.partition("=")
        library = library.strip().lower()
        if library not in VERSIONED_LIBRARIES:
            raise UsageError(
                f"--versions: no rule depends on {library!r}; name one of "
                f"{', '.join(VERSIONED_LIBRARIES)} (e.g. transformers=4.48.1)"
            )
        try:
            major, minor = release(version.strip())
        except ValueError:
            raise UsageError(f"--versions: {item!r} is not LIBRARY=X.Y[.Z]") from None
        found[library] = f"{major}.{minor}"
    return found


def found_versions(args: argparse.Namespace) -> dict[str, Any]:
    """The releases found for the current folder (llmmem.versions), looked up once per run."""
    cached = getattr(args, "_found_versions", None)
    if cached is None:
        from pathlib import Path

        from llmmem.versions import find_versions

        cached = find_versions(Path.cwd())
        args._found_versions = cached
    return dict(cached)


def _bitsandbytes_release(args: argparse.Namespace) -> str | None:
    """QuantSetup's bitsandbytes_version: the flag's, else the found release, else None."""
    flagged = parse_versions(getattr(args, "versions", None)).get("bitsandbytes")
    if flagged:
        return flagged
    found = found_versions(args).get("bitsandbytes")
    return str(found.release) if found is not None else None


def versions_dict(args: argparse.Namespace) -> dict[str, Any]:
    """Each library's release and its source, the --versions flags over what was found."""
    out = {library: v.to_dict() for library, v in found_versions(args).items()}
    for library, release_ in parse_versions(getattr(args, "versions", None)).items():
        out[library] = {
            "version": release_,
            "source": "flag (--versions)",
            "kind": "flag",
            "path": None,
            "line": None,
            "label": f"{library} {release_} (flag)",
        }
    return out


def add_plan_flags(parser: argparse.ArgumentParser) -> None:
    """The estimate flags of hub lookups, the plan's quantized storage and library releases."""
    parser.add_argument(
        "--hub",
        action="store_true",
        help="look a model that is not on this machine or in the bundled catalog up on the "
        "Hugging Face Hub (without it nothing goes to the network)",
    )
    parser.add_argument(
        "--quant-storage",
        choices=["uint8", "bfloat16", "float16", "float32"],
        default=None,
        help="bnb_4bit_quant_storage: a float dtype lets FSDP shard the 4-bit weights",
    )
    parser.add_argument(
        "--quant-compute-dtype",
        choices=["bf16", "fp16", "fp32"],
        default=None,
        help="bnb_4bit_compute_dtype: the dtype the 4-bit layers compute in, their inputs cast "
        "to it (and, without k-bit preparation or autocast, the activations between them); "
        "default bf16",
    )
    parser.add_argument(
        "--versions",
        action="append",
        default=None,
        help="library releases the run uses, e.g. transformers=4.48.1 (MoE experts are "
        "quantized one nn.Linear each before transformers 5), torch=2.4, bitsandbytes=0.42; "
        "without it they are read from the environment and the requirement/lock files of the "
        "current folder (a .venv, requirements*.txt, pyproject.toml, uv.lock, poetry.lock, "
        "environment.yml), else the releases the tests pin",
    )

    add_task_flags(parser)
    add_grpo_flags(parser)
    add_ppo_flags(parser)
    add_vision_flags(parser)
    add_parallel_flags(parser)
    add_fp8_flags(parser)


def _pick(args: argparse.Namespace, name: str, provenance: dict[str, str]) -> Any:
    value = getattr(args, name, None)
    if value is None:
        provenance[name] = "default"
        return DEFAULTS.get(name)
    provenance[name] = "flag"
    return value


def resolve_gpu(name: str | None) -> tuple[GpuTarget | None, str]:
    from llmmem.gpus import UnknownGpuError, detect_local_gpus, find_gpu

    if name:
        try:
            gpu = find_gpu(name)
        except UnknownGpuError as err:
            raise UsageError(str(err)) from None
        return GpuTarget(name=gpu.name, capacity_bytes=gpu.capacity_bytes, bf16=gpu.bf16), "flag"
    detected = detect_local_gpus()
    if detected:
        spec = detected[0].as_gpu_spec()
        return (
            GpuTarget(name=spec.name, capacity_bytes=detected[0].total_bytes, bf16=spec.bf16),
            "detected",
        )
    return None, "none"


def build_setup(
    args: argparse.Namespace, spec: ModelSpec, gpu: GpuTarget | None, *, supervised: bool = True
) -> tuple[TrainingSetup, dict[str, str]]:
    """The setup the flags ask for; `supervised`: an SFT step (no preference objective), which
    `--framework trl` with a known TRL release sizes as that release's SFTTrainer."""
    prov: dict[str, str] = {}
    method = Method(_pick(args, "method", prov))
    if getattr(args, "quant", None) and args.method is None:
        method = Method.QLORA if args.quant in ("nf4", "fp4") else Method.LORA
        prov["method"] = "implied by --quant"
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
    framework_name = getattr(args, "framework", None) or "hf"
    torchtune = framework_name == "torchtune"
    if torchtune:
        _refuse_for_torchtune(args)
    precision_arg = getattr(args, "precision", None)
    if torchtune and precision_arg in (None, "bf16", "bf16-true", "bf16-autocast"):
        # torchtune keeps the whole model in its config's dtype: bf16 in its configs
        precision = Precision.BF16_TRUE
        prov["precision"] = (
            "torchtune's dtype (bf16 in its configs): weights, adapters, gradients and states "
            "in bf16, no autocast"
            if precision_arg is None
            else "flag, as torchtune's dtype: everything in bf16, no autocast"
        )
        if gpu is not None and not gpu.bf16:
            raise UsageError(
                f"{gpu.name} has no bf16 support: torchtune then trains in fp32 (--precision fp32)"
            )
    elif precision_arg is None:
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
    else:
        precision = Precision(precision_arg)
        prov["precision"] = "flag"
        if gpu is not None and precision.uses_bf16 and not gpu.bf16:
            raise UsageError(
                f"{gpu.name} has no bf16 support: use --precision fp16 (or fp32), or a newer GPU"
            )
    lora = None
    quant = None
    if method in (Method.LORA, Method.QLORA):
        targets_text = _pick(args, "lora_targets", prov)
        targets = (
            [t.strip() for t in targets_text.split(",") if t.strip()]
            if targets_text
            else torchtune_lora_targets(spec)
            if torchtune
            else default_lora_targets(spec)
        )
        if not targets_text:
            prov["lora_targets"] = (
                "torchtune's LoRA configs (q, v and output projections, the MLP)"
                if torchtune
                else "default (PEFT's choice for this architecture)"
            )
        to_save = getattr(args, "lora_modules_to_save", None)
        dropout = getattr(args, "lora_dropout", None)
        if dropout is not None and not 0 <= dropout < 1:
            raise UsageError(f"--lora-dropout must be at least 0 and below 1, got {dropout:g}")
        adapter_dtype = getattr(args, "adapter_dtype", None)
        try:
            lora = LoraSetup(
                r=_pick(args, "lora_r", prov),
                alpha=_pick(args, "lora_alpha", prov),
                targets=targets,
                dora=bool(getattr(args, "dora", False)),
                modules_to_save=[m.strip() for m in to_save.split(",") if m.strip()]
                if to_save
                else [],
                dropout=dropout or 0.0,
                adapter_bytes=4 if adapter_dtype in (None, "fp32") else 2,
            )
        except SetupError as err:
            raise UsageError(str(err)) from None
        prov["lora_dropout"] = "flag" if dropout is not None else "default (0)"
        prov["adapter_dtype"] = (
            "torchtune: the model's dtype"
            if torchtune
            else "flag"
            if adapter_dtype
            else "default (fp32: autocast_adapter_dtype)"
        )
    elif any(
        getattr(args, f, None) is not None
        for f in (
            "lora_r",
            "lora_alpha",
            "lora_targets",
            "lora_modules_to_save",
            "lora_dropout",
            "adapter_dtype",
        )
    ):
        raise UsageError("--lora-* and --adapter-dtype flags need --method lora or qlora")
    if getattr(args, "quant", None) or method is Method.QLORA or bnb_checkpoint:
        quant_type = QuantType(args.quant or "nf4")
        double_quant = bool(args.double_quant)
        if bnb_checkpoint and prequantized is not None:
            quant_type = (
                QuantType.INT8
                if prequantized.bits == 8
                else QuantType(prequantized.quant_type or "nf4")
            )
            double_quant = prequantized.double_quant
            if method is Method.LORA and quant_type is not QuantType.INT8:
                method = Method.QLORA
        if method is Method.FULL:
            raise UsageError(
                "--quant needs --method lora or qlora: a quantized base cannot be fully fine-tuned"
            )
        if method is Method.QLORA and quant_type is QuantType.INT8:
            method = Method.LORA  # LoRA over an 8-bit base
        storage = getattr(args, "quant_storage", None)
        try:
            prepare = getattr(args, "kbit_prepare", None)
            quant = QuantSetup(
                quant_type=quant_type,
                double_quant=double_quant,
                quant_storage=storage or "uint8",
                prepare_for_kbit_training=True if prepare is None else bool(prepare),
                compute_dtype_bytes=4
                if getattr(args, "quant_compute_dtype", None) == "fp32"
                else 2,
            )
            bnb_release = _bitsandbytes_release(args)
            if bnb_release:
                quant = replace(quant, bitsandbytes_version=bnb_release)
        except SetupError as err:
            raise UsageError(str(err)) from None
        prov["quant_storage"] = "flag" if storage else "default (uint8)"
        prov["quant"] = (
            "flag"
            if args.quant
            else "the checkpoint's own quantization"
            if bnb_checkpoint
            else "default (qlora: nf4)"
        )
    elif getattr(args, "kbit_prepare", None) is not None:
        raise UsageError("--kbit-prepare needs --quant (or --method qlora)")
    elif getattr(args, "double_quant", None):
        raise UsageError("--double-quant needs --quant nf4 or fp4 (or --method qlora)")
    elif getattr(args, "quant_storage", None):
        raise UsageError("--quant-storage needs --quant nf4 or fp4 (or --method qlora)")
    elif getattr(args, "quant_compute_dtype", None):
        raise UsageError("--quant-compute-dtype needs --quant nf4 or fp4 (or --method qlora)")
    versions = parse_versions(getattr(args, "versions", None))
    found = found_versions(args)
    for library, field_name in (
        ("transformers", "transformers_version"),
        ("torch", "torch_version"),
        ("bitsandbytes", "bitsandbytes_version"),
    ):
        if library in versions:
            prov[field_name] = "flag"
        elif library in found:
            prov[field_name] = found[library].source
            versions[library] = found[library].release
    optim = _pick(args, "optim", prov)
    try:
        find_optimizer(optim)
    except SetupError as err:
        raise UsageError(str(err)) from None
    zero = _pick(args, "zero", prov)
    fsdp = getattr(args, "fsdp", None)
    world = _pick(args, "world_size", prov)
    offload = getattr(args, "offload", None)
    shards_params = zero == 3 or fsdp is not None
    if offload == "params" and not shards_params:
        raise UsageError(
            "--offload params needs ZeRO stage 3 (--zero 3) or FSDP (--fsdp): only sharded "
            "parameters can live on the CPU"
        )
    try:
        distributed = DistributedSetup(
            world_size=world,
            zero_stage=zero,
            fsdp=FsdpShard(fsdp) if fsdp else None,
            # FSDP's CPUOffload moves the parameters and steps them on the CPU: states too
            offload_optimizer=offload in ("optimizer", "all")
            or (offload == "params" and fsdp is not None),
            offload_params=offload in ("params", "all") and shards_params,
        )
        setup = TrainingSetup(
            mode=Mode(_pick(args, "mode", prov)),
            method=method,
            batch=_pick(args, "batch", prov),
            seq=_pick(args, "seq", prov),
            grad_accum=_pick(args, "grad_accum", prov),
            grad_ckpt=_pick(args, "grad_ckpt", prov),
            precision=precision,
            optim=optim,
            attn=AttnImpl(_pick(args, "attn", prov)),
            loss=LossImpl(_pick(args, "loss", prov) if not torchtune else args.loss or "chunked"),
            lora=lora,
            quant=quant,
            distributed=distributed,
            new_tokens=_pick(args, "new_tokens", prov),
            first_step=bool(getattr(args, "first_step", False)),
            use_cache=bool(getattr(args, "use_cache", False)),
            optimizer_in_backward=bool(getattr(args, "optimizer_in_backward", False)),
            packing=getattr(args, "packed", None),
            activation_offload=_activation_offload(args, framework_name, prov),
            compile=bool(getattr(args, "compile", False)),
            reentrant_checkpointing=getattr(args, "reentrant_ckpt", None),
            transformers_version=versions.get("transformers", TESTED_TRANSFORMERS),
            framework=FRAMEWORK_STACKS[framework_name],
        )
        if "torch" in versions:
            setup = replace(setup, torch_version=versions["torch"])
        trl_release = versions.get("trl") or (found["trl"].release if "trl" in found else None)
        if trl_release is not None:
            # the preference budgets count one TRL release's own moments for that release only
            setup = replace(setup, trl_version=trl_release)
            if framework_name == "trl" and supervised:
                # that release's SFTTrainer: its loss and metrics (llmmem.budget.stacks.trl)
                setup = replace(setup, framework=Framework.TRL)
        setup = _with_release_defaults(args, spec, setup, prov)
        setup = _sft_trainer_rules(args, setup, prov, supervised=supervised)
        if setup.framework is Framework.LITGPT and getattr(args, "loss", None) is None:
            # litgpt's finetune scripts compute chunked_cross_entropy (128 positions a chunk)
            setup = replace(setup, loss=LossImpl.CHUNKED)
            prov["loss"] = "litgpt's default (chunked cross-entropy)"
        if torchtune and getattr(args, "loss", None) is None:
            prov["loss"] = "torchtune's configs' CEWithChunkedOutputLoss (8 chunks)"
        prov["framework"] = _framework_provenance(args, setup)
        setup = vision_from_args(args, spec, setup, prov)
        setup = parallel_from_args(args, setup, prov)
        setup = fp8_from_args(args, setup, gpu, prov)
        stack = stack_for(setup.framework)
        stack.check(setup)
        setup = stack.prepare(setup)
    except SetupError as err:
        raise UsageError(str(err)) from None
    return setup, prov


# the plan's names of the settings the releases may restate, as estimate's flags name them
RESTATED_FLAGS = {"optim": "optim", "attn_implementation": "attn", "max_seq_length": "seq"}


def _with_release_defaults(
    args: argparse.Namespace, spec: ModelSpec, setup: TrainingSetup, prov: dict[str, str]
) -> TrainingSetup:
    """The flags not given take the defaults of the releases the run uses, as a file's
    do (llmmem.release_defaults)."""
    from llmmem.release_defaults import Unstated, release_defaults

    flagged = parse_versions(getattr(args, "versions", None))
    torch_found = found_versions(args).get("torch")
    made = release_defaults(
        spec,
        setup,
        Unstated(
            optim=getattr(args, "optim", None) is None,
            attn=getattr(args, "attn", None) is None,
            seq=getattr(args, "seq", None) is None,
        ),
        torch_build=str(torch_found.version)
        if torch_found is not None and "torch" not in flagged
        else None,
    )
    for name, (_, note) in made.restated.items():
        prov[RESTATED_FLAGS[name]] = note
    return made.setup


def _framework_provenance(args: argparse.Namespace, setup: TrainingSetup) -> str:
    """What --framework changed: its own stack, or the HF budget and why."""
    name = getattr(args, "framework", None)
    if name is None:
        return "default (hf)"
    if name == "trl" and setup.framework is Framework.TRL:
        return (
            f"flag: TRL {setup.trl_version}'s SFTTrainer (its loss and metrics, its "
            "checkpointing, its k-bit preparation)"
        )
    if name == "trl" and setup.trl_version is not None:
        return (
            f"flag: the HF budget with TRL {setup.trl_version}'s SFTTrainer rules "
            "(its checkpointing, its k-bit preparation)"
        )
    if name in HF_TRAINER_FRAMEWORKS:
        why = f"{HF_TRAINER_FRAMEWORKS[name]} runs the HF Trainer"
        if name == "trl":
            why += "; --versions trl=X adds its release's SFTTrainer rules"
        return f"flag: the HF budget ({why})"
    if name == "torchtune":
        return "flag: torchtune's own stack (llmmem.budget.stacks.torchtune)"
    if name == "litgpt":
        return (
            "flag: LitGPT's own model code and stack (llmmem.budget.stacks.litgpt: a head of "
            "its own, Lightning's 4-bit head, its chunked loss)"
        )
    if name == "plain":
        return "flag: a loop of the script's own (the HF Trainer's FSDP wrapping not assumed)"
    return "flag"


def _preference_trainer_on_kbit(
    args: argparse.Namespace, setup: TrainingSetup, preference: Any, prov: dict[str, str]
) -> TrainingSetup:
    """TRL's preference trainer of the objective over a k-bit base (llmmem.budget.trl_rules, as
    a script's trainer is read), unless --kbit-prepare or --adapter-dtype say otherwise."""
    if (
        preference.trainer != "trl"
        or getattr(args, "framework", None) not in (None, "hf", "trl")
        or getattr(args, "kbit_prepare", None) is not None
        or getattr(args, "adapter_dtype", None) is not None
    ):
        return setup
    from llmmem.budget.trl_rules import preference_trainer_on_kbit

    setup, note = preference_trainer_on_kbit(setup, preference.objective.value)
    if note:
        prov["quant"] = note
        prov["adapter_dtype"] = note
    return setup


def _activation_offload(args: argparse.Namespace, framework: str, prov: dict[str, str]) -> bool:
    """--activation-offload as given; unsloth's checkpointing offloads by default
    (get_peft_model's use_gradient_checkpointing="unsloth", llmmem.budget.stacks.unsloth), as
    a script that leaves it unsaid is read."""
    given = getattr(args, "activation_offload", None)
    if given is not None:
        prov["activation_offload"] = "flag"
        return bool(given)
    if framework == "unsloth" and getattr(args, "grad_ckpt", None):
        prov["activation_offload"] = (
            'unsloth\'s default: use_gradient_checkpointing="unsloth" keeps the checkpointed '
            "layers' inputs on the host"
        )
        return True
    return False


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


def _sft_trainer_rules(
    args: argparse.Namespace,
    setup: TrainingSetup,
    prov: dict[str, str],
    *,
    supervised: bool,
) -> TrainingSetup:
    """--framework trl of a supervised step: the rules of the run's TRL release's SFTTrainer
    (llmmem.sft_trainer_rules, as a file's SFTTrainer has them), unless a flag says otherwise."""
    trl = setup.trl_version  # the flag's release, else the one found beside the file
    if getattr(args, "framework", None) != "trl" or not supervised or trl is None:
        return setup
    from llmmem.sft_trainer_rules import with_sft_trainer

    made = with_sft_trainer(
        setup,
        trl,
        kbit_stated=getattr(args, "kbit_prepare", None) is not None
        or bool(getattr(args, "adapter_dtype", None)),
    )
    if made.checkpointing_note:
        prov["grad_ckpt"] = made.checkpointing_note
    if made.kbit_note:
        prov["quant"] = made.kbit_note
        prov["adapter_dtype"] = made.kbit_note
    return made.setup


def setup_lines(
    setup: TrainingSetup,
    prov: dict[str, str],
    gpu_prov: str,
    gpu: GpuTarget | None,
    versions: dict[str, Any] | None = None,
) -> list[tuple[str, str, str]]:
    lines = [
        ("method", setup.method.value, prov.get("method", "")),
        (
            "micro-batch × seq",
            f"{setup.batch} × {setup.seq}",
            f"{prov.get('batch', '')}, {prov.get('seq', '')}",
        ),
        ("grad accumulation", str(setup.grad_accum), prov.get("grad_accum", "")),
        ("grad checkpointing", "on" if setup.grad_ckpt else "off", prov.get("grad_ckpt", "")),
        ("precision", setup.precision.value, prov.get("precision", "")),
        (
            "optimizer",
            setup.optim + (", stepped in backward" if setup.optimizer_in_backward else ""),
            prov.get("optim", ""),
        ),
        ("attention", setup.attn.value, prov.get("attn", "")),
    ]
    if setup.activation_offload:
        lines.append(("activation offload", "on: the band reaches down", "flag"))
    if setup.compile:
        lines.append(("torch.compile", "on: the band reaches down", "flag"))
    if setup.packing is not None:
        rows, tokens = setup.attention_shape
        lines.append(
            (
                "packed samples",
                f"{setup.packing.value}, {rows} × {tokens}"
                + (", masked" if setup.packed_mask else ", varlen"),
                "flag",
            )
        )
    framework_prov = prov.get("framework", "")
    if setup.framework is not Framework.HF or framework_prov.startswith("flag: the HF budget"):
        lines.append(("framework", setup.framework.value, framework_prov))
    images = vision_line(setup, prov)
    if images is not None:
        lines.append(images)
    context = parallel_line(setup, prov)
    if context is not None:
        lines.append(context)
    if setup.float8:
        lines.append(("fp8", "torchao float8 Linears in the blocks", prov.get("fp8", "")))
    if setup.float8_te:
        lines.append(
            (
                "fp8",
                "TransformerEngine te.Linear (DelayedScaling; unmeasured: needs CUDA)",
                prov.get("fp8", ""),
            )
        )
    if setup.lora:
        lines.append(
            (
                "LoRA",
                f"r={setup.lora.r} alpha={setup.lora.alpha:g} "
                f"targets={','.join(setup.lora.targets or ['PEFT default'])}"
                + (f" dropout={setup.lora.dropout:g}" if setup.lora.dropout else "")
                + (" in 16 bits" if setup.lora.adapter_bytes == 2 else ""),
                prov.get("lora_r", ""),
            )
        )
    if setup.quant:
        lines.append(
            (
                "quantization",
                setup.quant.quant_type.value
                + (" + double quant" if setup.quant.double_quant else "")
                + (
                    f", stored as {setup.quant.quant_storage}"
                    if setup.quant.quant_storage != "uint8"
                    else ""
                )
                + ("" if setup.quant.prepare_for_kbit_training else ", no kbit prepare"),
                prov.get("quant", ""),
            )
        )
    if versions:
        for library, item in versions.items():
            lines.append((library, str(item["version"]), str(item["source"])))
    else:
        lines.append(
            ("transformers", setup.transformers_version, prov.get("transformers_version", ""))
        )
    if setup.distributed.world_size > 1 or setup.distributed.zero_stage:
        lines.append(("devices", f"{setup.distributed.world_size}", prov.get("world_size", "")))
    lines.append(("GPU", gpu.name if gpu else "none given, none detected", gpu_prov))
    return lines


def run_estimate(args: argparse.Namespace) -> int:
    gpu, gpu_prov = resolve_gpu(args.gpu)
    spec = with_task_flags(args, resolve_spec(args.model, hub_wanted(args)))
    preference = preference_from_args(args)
    grpo = getattr(preference, "grpo", None)
    if grpo is not None:
        args.seq = grpo.seq  # the policy's sequence: prompt + completion
    setup, prov = build_setup(args, spec, gpu, supervised=preference is None)
    if preference is not None:
        from llmmem.preference_plan import autocast_as_mixed_precision

        setup = _preference_trainer_on_kbit(args, setup, preference, prov)

        try:
            setup, preference = autocast_as_mixed_precision(setup, preference)
        except SetupError as err:
            raise UsageError(str(err)) from None
    if grpo is not None:
        prov["seq"] = "max prompt + max completion"
        if args.max_batch and args.batch is None:
            # TRL's default 8 need not divide by num_generations: the search decides
            setup = replace(setup, batch=grpo_batch_unit(grpo, setup))
            prov["batch"] = "the smallest the generations allow (--max-batch searches)"
    try:
        if preference is None:
            budget = estimate_budget(spec, setup, gpu)
        else:
            from llmmem.budget.preference import estimate_preference_budget

            budget = estimate_preference_budget(spec, setup, preference, gpu)
    except SetupError as err:
        raise UsageError(str(err)) from None
    from pathlib import Path

    from llmmem.calibrate import with_local_evidence

    budget = with_local_evidence(budget, Path.cwd(), getattr(args, "framework", None))
    if (args.max_batch or args.max_seq) and gpu is None:
        raise UsageError(
            "--max-batch and --max-seq need a GPU: pass --gpu NAME (or a capacity such as 24GiB)"
        )
    limits: dict[str, Any] = {}
    sized = None
    if preference is not None:
        from llmmem.budget.preference import estimate_preference_budget

        def sized(spec: ModelSpec, setup: TrainingSetup, gpu: GpuTarget | None) -> Budget:
            return estimate_preference_budget(spec, setup, preference, gpu)

    if args.max_batch and gpu is not None and grpo is not None:
        # the micro-batch moves in steps that keep the generation batch a multiple of
        # num_generations
        unit = grpo_batch_unit(grpo, setup)

        def in_units(spec: ModelSpec, setup: TrainingSetup, gpu: GpuTarget | None) -> Budget:
            return estimate_preference_budget(
                spec, replace(setup, batch=setup.batch * unit), preference, gpu
            )

        best, at_best = largest_batch(spec, replace(setup, batch=1), gpu, in_units)
        limits["max_batch"] = _limit_dict(best * unit, at_best)
    elif args.max_batch and gpu is not None:
        best, at_best = largest_batch(spec, setup, gpu, sized)
        limits["max_batch"] = _limit_dict(best, at_best)
    if args.max_seq and gpu is not None:
        best, at_best = largest_seq(spec, setup, gpu, sized)
        limits["max_seq"] = _limit_dict(best, at_best)
    if args.format == "json":
        from llmmem.report.json_report import budget_dict

        out = budget_dict(budget, spec)
        values = setup.to_dict()
        if preference is not None:
            from llmmem.budget.preference import reference_for

            values["objective"] = preference.objective.value
            values["reference"] = reference_for(preference, setup).value
            if grpo is not None:
                values["seq"] = grpo.seq
                values["grpo"] = grpo_values(grpo, setup)
            if preference.ppo is not None:
                values["ppo"] = ppo_values(preference.ppo, setup)
        out["setup"] = {
            "values": values,
            "provenance": prov | {"gpu": gpu_prov},
            "versions": versions_dict(args),
        }
        out.update(limits)
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from llmmem.report.text import render_budget

    extra = []
    for key, label in (("max_batch", "largest micro-batch"), ("max_seq", "longest sequence")):
        if key in limits:
            item = limits[key]
            if item["value"]:
                extra.append(
                    f"{label} that fits: {item['value']} "
                    f"(headroom {format_bytes(item['headroom_bytes'])})"
                )
            else:
                extra.append(f"{label} that fits: none — even 1 does not fit")
    lines = setup_lines(setup, prov, gpu_prov, gpu, versions_dict(args))
    if preference is not None:
        from llmmem.budget.preference import reference_for

        reference = reference_for(preference, setup)
        lines.insert(1, ("objective", preference.objective.value, "flag"))
        lines.insert(2, ("reference", reference.value, "" if args.ref_model else "TRL default"))
        if grpo is not None:
            beta = "beta (flag)" if args.beta is not None else "beta (TRL default 0.0)"
            lines[2] = ("reference", reference.value, beta)
            lines[3:3] = grpo_lines(grpo, args, setup)
        if preference.ppo is not None:
            lines[3:3] = ppo_lines(preference.ppo, args, setup)
    render_budget(budget, spec, setup_lines=lines, extra_lines=extra)
    return 0


def _limit_dict(best: int, budget: Budget | None) -> dict[str, Any]:
    return {
        "value": best,
        "device_total_bytes": budget.device_total_bytes if budget else None,
        "headroom_bytes": budget.headroom_bytes if budget else None,
    }

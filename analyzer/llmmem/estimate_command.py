"""`llmmem estimate`: flags → a TrainingPlan (llmmem.flag_plan) → the road a file's plan
takes (llmmem.sizing) → Budget → table or JSON.

Every setting that was not given takes the HF Trainer's default (or, with `--framework`, that
framework's) and is labelled `default` in the output.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from typing import Any

from llmmem.budget.limits import largest_batch, largest_seq
from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Budget, GpuTarget
from llmmem.budget.setup import (
    Framework,
    SetupError,
    TrainingSetup,
    release,
)
from llmmem.budget.stacks import stack_for
from llmmem.errors import UsageError
from llmmem.flag_plan import overlay_flags, plan_from_flags
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
from llmmem.sizing import PlanSetup, plan_setup
from llmmem.units import format_bytes
from llmmem.vision_flags import add_vision_flags, vision_from_args, vision_line

# the values that run the HF Trainer (or TRL's trainers on it) around transformers' models
HF_TRAINER_FRAMEWORKS = {"trl": "TRL", "axolotl": "axolotl", "llamafactory": "LLaMA-Factory"}


# the libraries whose release changes what a step holds, as `--versions` names them
VERSIONED_LIBRARIES = ("transformers", "torch", "bitsandbytes", "trl", "unsloth")


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
        if library == "unsloth":  # a date: 2025.10.10, its patch part matters
            if not re.fullmatch(r"\d{4}\.\d{1,2}(?:\.\d{1,3})?", version.strip()):
                raise UsageError(f"--versions: {item!r} is not unsloth=YYYY.M[.P]")
            found[library] = version.strip()
            continue
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
        "quantized one nn.Linear each before transformers 5), torch=2.4, bitsandbytes=0.42, "
        "unsloth=2024.11.7 (its loss changed by release); "
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


def run_versions(args: argparse.Namespace) -> dict[str, Any]:
    """The releases the run uses (llmmem.versions.FoundVersion by library): the --versions
    flags over what was found for the current folder."""
    from llmmem.versions import FoundVersion

    versions = found_versions(args)
    for library, given in parse_versions(getattr(args, "versions", None)).items():
        versions[library] = FoundVersion(
            library=library, version=given, source="flag (--versions)", kind="flag"
        )
    return versions


def build_setup(
    args: argparse.Namespace,
    spec: ModelSpec,
    gpu: GpuTarget | None,
    *,
    supervised: bool = True,
    preference: Any | None = None,
) -> tuple[TrainingSetup, dict[str, str]]:
    """The setup the flags ask for, by the road a file's plan takes (llmmem.sizing);
    `supervised`: an SFT step (no preference objective), which `--framework trl` with a known
    TRL release sizes as that release's SFTTrainer."""
    made, prov = plan_setup_of_flags(args, spec, gpu, supervised=supervised, preference=preference)
    return made.setup, prov


def plan_setup_of_flags(
    args: argparse.Namespace,
    spec: ModelSpec,
    gpu: GpuTarget | None,
    *,
    supervised: bool = True,
    preference: Any | None = None,
) -> tuple[PlanSetup, dict[str, str]]:
    """The flags as a plan (llmmem.flag_plan), sized by the plan's road (llmmem.sizing), and
    the provenance of each line of estimate's table."""
    versions = run_versions(args)
    flags = plan_from_flags(args, spec, gpu, supervised=supervised and preference is None)
    prov = flags.prov
    flagged = parse_versions(getattr(args, "versions", None))
    for library, field_name in (
        ("transformers", "transformers_version"),
        ("torch", "torch_version"),
        ("bitsandbytes", "bitsandbytes_version"),
    ):
        if library in flagged:
            prov[field_name] = "flag"
        elif library in versions:
            prov[field_name] = versions[library].source

    def overlay(setup: TrainingSetup) -> TrainingSetup:
        setup = overlay_flags(args, setup, prov)
        if setup.vision is not None and setup.vision.assumed:
            prov["images"] = setup.vision.assumed
        setup = vision_from_args(args, spec, setup, prov)
        setup = parallel_from_args(args, setup, prov)
        return fp8_from_args(args, setup, gpu, prov)

    try:
        made = plan_setup(
            flags.plan, spec, versions, preference=preference, overlay=overlay, gpu=gpu
        )
    except SetupError as err:
        raise UsageError(str(err)) from None
    for name, note in made.restated.items():
        if name in RESTATED_FLAGS:
            prov[RESTATED_FLAGS[name]] = note
    if made.checkpointing_note:
        prov["grad_ckpt"] = made.checkpointing_note
    if made.trl_note:
        prov["quant"] = made.trl_note
        prov["adapter_dtype"] = made.trl_note
    if made.dtype_note:
        prov["precision"] = made.dtype_note
    prov["framework"] = _framework_provenance(args, made.setup)
    return made, prov


# the plan's names of the settings the releases may restate, as estimate's flags name them
RESTATED_FLAGS = {"optim": "optim", "attn_implementation": "attn", "max_seq_length": "seq"}


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
        return f"flag: the HF budget ({why}), with its defaults for the settings not given"
    if name == "torchtune":
        return "flag: torchtune's own stack (llmmem.budget.stacks.torchtune)"
    if name == "litgpt":
        return (
            "flag: LitGPT's own model code and stack (llmmem.budget.stacks.litgpt: a head of "
            "its own, Lightning's 4-bit head, its chunked loss), with its defaults for the "
            "settings not given"
        )
    if name == "swift":
        return (
            "flag: ms-swift's own stack (llmmem.budget.stacks.swift), with its defaults for "
            "the settings not given"
        )
    if name == "plain":
        return "flag: a loop of the script's own (the HF Trainer's FSDP wrapping not assumed)"
    return "flag"


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
    made, prov = plan_setup_of_flags(
        args, spec, gpu, supervised=preference is None, preference=preference
    )
    setup, preference = made.setup, made.preference
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

    if args.max_batch and gpu is not None and grpo is not None and preference is not None:
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
    # what the framework's stack makes of the setup: the one the budget sized
    shown = stack_for(setup.framework).prepare(setup)
    if args.format == "json":
        from llmmem.report.json_report import budget_dict

        out = budget_dict(budget, spec)
        values = shown.to_dict()
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
    lines = setup_lines(shown, prov, gpu_prov, gpu, versions_dict(args))
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

"""`llmmem explain FILE`: where each value came from, and the breakdown against the GPU."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmmem.errors import UsageError, non_empty

if TYPE_CHECKING:  # the plan's classes are imported only when explain runs
    from llmmem.plan import Sourced, TrainingPlan

# the plan's top-level training settings, in the order the report lists them
TRAINING_SETTINGS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_length",
    "gradient_checkpointing",
    "precision",
    "optim",
    "attn_implementation",
)


def add_explain_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Read FILE, say where each value came from (with its line), and print the breakdown "
        "against the GPU with its band and the findings. The releases of torch, transformers, "
        "peft, trl, bitsandbytes, deepspeed, accelerate and torchtune are read from the "
        "environment FILE runs in ($LLMMEM_RUN_ENV, else a .venv beside it), else the "
        "workspace's requirement and lock files, else the tests' pins, each with its source; "
        "runs recorded with `llmmem calibrate add` narrow the band of the same setup."
    )
    p.add_argument("file", metavar="FILE", help="a training script or config")
    p.add_argument(
        "--gpu", type=non_empty, default=None, help="target GPU (default: pragma, [tool.llmmem])"
    )
    p.add_argument("--hub", action="store_true", help="allow hub lookups for unknown models")
    p.add_argument(
        "--format",
        choices=["text", "json", "html"],
        default="text",
        help="html: a self-contained page with the breakdown as a chart (to a file with >)",
    )


def sourced_dict(sourced: Sourced[Any] | None) -> dict[str, Any] | None:
    if sourced is None:
        return None
    return {
        "value": sourced.value,
        "source": sourced.source.value,
        "range": sourced.range.to_dict() if sourced.range else None,
        **({"note": sourced.note} if sourced.note else {}),
    }


def plan_dict(plan: TrainingPlan) -> dict[str, Any]:
    """The plan's values, each as {"value", "source", "range"}."""
    out: dict[str, Any] = {
        "path": plan.path,
        "kind": plan.kind,
        "framework": plan.framework,
        "model_id": sourced_dict(plan.model_id),
        "objective": sourced_dict(plan.objective),
    }
    for name in TRAINING_SETTINGS:
        out[name] = sourced_dict(getattr(plan, name))
    out["lora"] = None
    if plan.lora is not None:
        out["lora"] = {
            "r": sourced_dict(plan.lora.r),
            "alpha": sourced_dict(plan.lora.alpha),
            "target_modules": sourced_dict(plan.lora.target_modules),
        }
    out["quantization"] = None
    if plan.quantization is not None:
        q = plan.quantization
        out["quantization"] = {
            "bits": sourced_dict(q.bits),
            "quant_type": sourced_dict(q.quant_type),
            "double_quant": sourced_dict(q.double_quant),
            "compute_dtype": sourced_dict(q.compute_dtype),
        }
    d = plan.distributed
    out["deepspeed"] = {
        "config": sourced_dict(d.deepspeed_config),
        "zero_stage": sourced_dict(d.zero_stage),
        "offload_optimizer": sourced_dict(d.offload_optimizer),
        "offload_params": sourced_dict(d.offload_params),
        "reduce_bucket_size": sourced_dict(d.reduce_bucket_size),
        "overlap_comm": sourced_dict(d.overlap_comm),
        "contiguous_gradients": sourced_dict(d.contiguous_gradients),
        "stage3_max_reuse_distance": sourced_dict(d.max_reuse_distance),
        "stage3_prefetch_bucket_size": sourced_dict(d.prefetch_bucket_size),
        "stage3_param_persistence_threshold": sourced_dict(d.param_persistence_threshold),
    }
    out["fsdp"] = sourced_dict(d.fsdp)
    out["world_size"] = sourced_dict(d.world_size)
    out["problems"] = plan.problems
    return out


def run_explain(args: argparse.Namespace) -> int:
    from llmmem.check import check_text, require_known_gpus
    from llmmem.extract import find_project_settings
    from llmmem.lint_command import read_text

    path = Path(args.file)
    if not path.is_file():
        from llmmem.files import why_not_a_file

        raise UsageError(f"{args.file}: {why_not_a_file(path)}")
    text = read_text(path)
    settings = find_project_settings(path)
    require_known_gpus(args.gpu, settings)
    from llmmem.lint_command import hub_run_deadline

    with hub_run_deadline(args.hub):
        checked = check_text(path, text, settings=settings, gpu=args.gpu, hub=args.hub)
    analysis, findings, plan = checked.analysis, checked.findings, checked.analysis.plan
    if args.format == "json":
        from llmmem.report.json_report import budget_dict

        budget = None
        if analysis.budget is not None and analysis.spec is not None:
            budget = budget_dict(analysis.budget, analysis.spec)
            if analysis.spec.is_guess:
                # sized from its name: no verdict (LLM017 among the findings gives the range)
                budget.update(fits=None, verdict=None)
        json.dump(
            {
                "plan": plan_dict(plan),
                "budget": budget,
                "findings": [f.to_json() for f in findings],
                "problems": analysis.problems
                + ([analysis.model_error] if analysis.model_error else []),
                "versions": {lib: v.to_dict() for lib, v in analysis.versions.items()},
            },
            sys.stdout,
            indent=2,
            default=str,
        )
        sys.stdout.write("\n")
        return 0
    if args.format == "html":
        sys.stdout.write(explanation_html(analysis, findings))
        return 0
    render_explanation(analysis, findings)
    return 0


def explanation_html(analysis: Any, findings: list[Any]) -> str:
    """The page of `--format html`: the chart, the tables, the local runs of the setup (the
    newest of this file's as the chart's measured mark)."""
    from llmmem.report.html_report import Measured, breakdown_html
    from llmmem.report.local_runs import local_runs

    runs = local_runs(analysis)
    mark = None
    if runs and runs[0].same_file and runs[0].metric == "device":
        mark = Measured(f"measured on {runs[0].gpu} on {runs[0].date}", runs[0].measured_bytes)
    return breakdown_html(
        analysis,
        findings,
        title=f"llmmem explain {analysis.plan.path}",
        measured=mark,
        local_runs=[run.line() for run in runs[:5]],
    )


def _describe(sourced: Sourced[Any] | None) -> tuple[str, str, str]:
    if sourced is None:
        return "—", "", ""
    where = f"line {sourced.range.start_line + 1}" if sourced.range else ""
    if sourced.range is not None and sourced.range.path:
        where = f"{sourced.range.path}:{sourced.range.start_line + 1}"
    origin = sourced.source.value + (f" — {sourced.note}" if sourced.note else "")
    return str(sourced.value), origin, where


def render_explanation(analysis: Any, findings: list[Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from llmmem.report.text import render_budget

    console = Console(emoji=False)  # text from files is printed as written
    plan = analysis.plan
    table = Table(
        title=escape(f"{plan.path} ({plan.kind}, {plan.framework})"), title_justify="left"
    )
    table.add_column("setting")
    table.add_column("value")
    table.add_column("from")
    table.add_column("where")
    rows: list[tuple[str, Sourced[Any] | None]] = [("model", plan.model_id)]
    if plan.objective is not None:
        from llmmem.preference_plan import reference_row

        method = analysis.setup.method if analysis.setup is not None else None
        rows += [("method", plan.objective)]
        reference = reference_row(plan, method)
        if reference is not None:
            rows += [("reference model", reference)]
    rows += [(name, getattr(plan, name)) for name in TRAINING_SETTINGS]
    if plan.lora is not None:
        rows += [
            ("lora r", plan.lora.r),
            ("lora alpha", plan.lora.alpha),
            ("lora targets", plan.lora.target_modules),
        ]
    if plan.quantization is not None:
        rows += [
            ("quant type", plan.quantization.quant_type),
            ("double quant", plan.quantization.double_quant),
            ("quant storage", plan.quantization.quant_storage),
        ]
    d = plan.distributed
    rows += [("world size", d.world_size), ("ZeRO stage", d.zero_stage)]
    if d.zero_stage.value:
        rows += [("reduce bucket", d.reduce_bucket_size), ("overlap_comm", d.overlap_comm)]
    if d.zero_stage.value == 3:
        rows += [
            ("max reuse distance", d.max_reuse_distance),
            ("prefetch bucket", d.prefetch_bucket_size),
            ("persistence threshold", d.param_persistence_threshold),
        ]
    rows.append(("GPU", plan.gpu))
    for name, sourced in rows:
        if name == "GPU" and analysis.gpu_source == "flag" and analysis.gpu is not None:
            table.add_row(name, escape(analysis.gpu.name), "flag (--gpu)", "")
            continue
        table.add_row(name, *(escape(cell) for cell in _describe(sourced)))
    console.print(table)
    if analysis.versions:
        from llmmem.versions import describe

        console.print(escape(f"versions: {describe(analysis.versions)}"))
    for problem in analysis.problems:
        console.print(f"[yellow]problem:[/yellow] {escape(problem)}")
    if analysis.budget is None or analysis.spec is None:
        reason = analysis.model_error or "see problems"
        console.print(f"[yellow]no estimate:[/yellow] {escape(reason)}")
    else:
        from llmmem.rules.guessed_model import guessed_verdict_text

        guessed = guessed_verdict_text(analysis)
        if guessed is None or analysis.budget.gpu is None:
            render_budget(analysis.budget, analysis.spec, setup_lines=[], console=console)
        else:  # a model sized from its name gets no verdict: the range its name allows instead
            from dataclasses import replace

            from llmmem.units import format_bytes

            budget = replace(analysis.budget, gpu=None)
            render_budget(budget, analysis.spec, setup_lines=[], console=console)
            gpu = analysis.budget.gpu
            console.print(
                escape(
                    f"{format_bytes(gpu.capacity_bytes)} on {gpu.name}: fit {guessed}; for a "
                    "verdict add `# llmmem: model_config=path/to/config.json`"
                )
            )
    for finding in findings:
        line = finding.range.start_line + 1 if finding.range else 1
        console.print(
            escape(f"{finding.code} [{finding.severity.value}] line {line}: {finding.message}")
        )
        for fix in finding.fixes:
            console.print(escape(f"    fix: {fix.title}"))

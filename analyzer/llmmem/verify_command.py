"""`llmmem verify FILE`: run the plan's step for real (CUDA, or the CPU for small models) or
simulated (`--simulate`, no GPU, no weights), and compare with the prediction.

Exit codes: 0 measured (the table says how close), 1 the step ran out of memory (a result, with
where and how much), 2 bad input, 3 the step could not be run here (no CUDA, a missing package,
a timeout). The step runs in a subprocess (`llmmem.verify.worker`) so that a crash, an OOM or a
hang never takes this process down; nothing of the user's script is run, only the model its plan
names, built from its config. That process imports nothing from the user's folder and, without
`--hub`, reaches no network (`llmmem.isolated_python`). `--output` and `--snapshot` must name a
file that can be written (not a FIFO, a device or a directory) before the step runs, and the
report is written without ever waiting on a FIFO (`llmmem.output_files`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmmem.errors import UsageError

EXIT_MEASURED = 0
EXIT_OOM = 1
EXIT_COULD_NOT_RUN = 3
DEFAULT_TIMEOUT_S = 900


def _timeout(text: str) -> float:
    """--timeout: seconds, more than 0 and at most a day (nan or inf would never end)."""
    import argparse
    import math

    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or not 0 < seconds <= 86_400:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds from more than 0 to 86400")
    return seconds


def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Run one training step of FILE's plan and compare the memory with the prediction: "
        "on CUDA, on the CPU (--device cpu, small models), or simulated (--simulate)."
    )
    p.add_argument("file", help="training script or config")
    p.add_argument("--gpu", default=None, help="the GPU to predict for (default: the plan's)")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--simulate",
        action="store_true",
        help="run the step under FakeTensorMode: no GPU, no weights, no memory allocated",
    )
    where.add_argument("--device", choices=["cuda", "cpu"], default=None)
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.add_argument("--output", metavar="REPORT.json", help="also write the JSON report here")
    p.add_argument(
        "--snapshot", metavar="SNAPSHOT.pickle", help="CUDA: save a memory snapshot (memory_viz)"
    )
    p.add_argument(
        "--timeout", type=_timeout, default=DEFAULT_TIMEOUT_S, help="seconds (900; at most a day)"
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a model that ships its own code (config auto_map) to be built",
    )
    hub = p.add_mutually_exclusive_group()
    hub.add_argument(
        "--hub",
        action="store_true",
        help="look a model that is not on this machine or in the bundled catalog up on the "
        "Hugging Face Hub (without it nothing goes to the network, the step's process included)",
    )
    hub.add_argument("--offline", action="store_true", help="never ask the hub (the default)")


def _device(args: argparse.Namespace) -> str:
    if args.simulate:
        return "fake"
    return args.device or "cuda"


def _config_for(
    model_id: str, base_dir: Path, local_paths: dict[str, str], hub: bool
) -> dict[str, Any]:
    from llmmem.models.resolve import ModelResolutionError, resolve_model_config

    try:
        resolved = resolve_model_config(
            model_id, hub=hub, local_model_paths=local_paths, base_dir=base_dir
        )
    except ModelResolutionError as err:
        raise UsageError(f"cannot build {model_id}: {err}") from None
    return dict(resolved.config)


def _check_distributed(setup: Any, args: argparse.Namespace) -> None:
    """Multi-rank plans run under torchrun, one process per rank (DDP, FSDP2 full shard or
    DeepSpeed ZeRO; a ZeRO plan also on one GPU); simulated, rank 0 runs alone in a fake
    process group (DDP and FSDP)."""
    dist = setup.distributed
    if dist.zero_stage and args.simulate:
        raise UsageError(
            f"a DeepSpeed ZeRO-{dist.zero_stage} plan cannot be simulated (DeepSpeed does not "
            "run on fake tensors): use --device cpu (small models) or run on the GPUs"
        )
    if not dist.is_multi_gpu:
        return
    if dist.fsdp is not None and dist.fsdp.value != "full_shard":
        raise UsageError(f"FSDP {dist.fsdp.value} is not verified yet; full_shard is")
    if args.simulate and dist.fsdp is None:
        raise UsageError(
            f"a {dist.world_size}-rank DDP plan cannot be simulated (DDP's reducer needs real "
            "tensors): use --device cpu (small models) or run on the GPUs"
        )


def _check_host_memory(needed_bytes: int, *, simulable: bool = True) -> None:
    """A CPU step holds everything in RAM: refuse one that would not fit the machine."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if needed_bytes > 0.8 * total:
        from llmmem.units import format_bytes

        instead = "use --simulate, or --device cuda on a GPU" if simulable else "verify it on a GPU"
        raise UsageError(
            f"a CPU step of this plan needs about {format_bytes(needed_bytes)} of RAM and this "
            f"machine has {format_bytes(total)}: {instead}"
        )


def _cpu_step_bytes(spec: Any, setup: Any, allocated_peak_bytes: int) -> int:
    """What a CPU step holds at most: its peak, or for a k-bit plan the whole model in 16 bits
    first (bitsandbytes quantizes while loading it)."""
    if setup.quant is None:
        return allocated_peak_bytes
    return max(allocated_peak_bytes, spec.total_params * setup.quant.compute_dtype_bytes)


def run_verify(args: argparse.Namespace) -> int:
    from llmmem.budget.phases import estimate_budget
    from llmmem.check import check_text, require_known_gpus
    from llmmem.extract import find_project_settings
    from llmmem.lint_command import read_text
    from llmmem.scenario import model_reference
    from llmmem.verify.compare import request_for

    path = Path(args.file)
    if not path.is_file():
        from llmmem.files import why_not_a_file

        raise UsageError(f"{args.file}: {why_not_a_file(path)}")
    _check_output_path("--output", args.output)
    _check_output_path("--snapshot", args.snapshot)
    text = read_text(path)
    settings = find_project_settings(path)
    require_known_gpus(args.gpu, settings)
    checked = check_text(path, text, settings=settings, gpu=args.gpu, hub=args.hub)
    analysis = checked.analysis
    if analysis.spec is None or analysis.setup is None:
        reason = analysis.model_error or "; ".join(analysis.problems) or "no training step found"
        raise UsageError(f"{path}: nothing to verify: {reason}")
    spec, setup = analysis.spec, analysis.setup
    from llmmem.preference_plan import preference_setup

    preference = preference_setup(analysis.plan)
    if spec.is_guess:
        raise UsageError(
            f"{spec.model_id}: only a guess from its name; verify needs the model's config "
            "(a local path, the HF cache, or the hub)"
        )
    _check_distributed(setup, args)
    config = _config_for(
        str(model.value) if (model := model_reference(analysis.plan)) else spec.model_id,
        path.parent,
        checked.settings.local_model_paths,
        hub=args.hub and checked.settings.hub,
    )
    if config.get("auto_map") and not args.trust_remote_code:
        raise UsageError(
            f"{spec.model_id} ships its own model code; run it only if you trust it, with "
            "--trust-remote-code"
        )
    device = _device(args)
    request = request_for(
        spec,
        setup,
        config,
        device,
        trust_remote_code=args.trust_remote_code,
        snapshot=str(Path(args.snapshot).resolve()) if args.snapshot else None,
    )
    budget = estimate_budget(spec, setup, analysis.gpu)
    if preference is not None:
        from llmmem.budget.preference import estimate_preference_budget, reference_for
        from llmmem.budget.preference_setup import Objective
        from llmmem.verify.preference_step import check_preference_request

        objective = preference.objective.value
        if preference.objective is Objective.CPO and preference.cpo_alpha == 0:
            objective = "simpo"  # CPO's step without the chosen half's cross-entropy
        request = replace(
            request,
            objective=objective,
            reference=reference_for(preference, setup).value,
            grpo=_grpo_fields(preference),
            trainer=preference.trainer,
        )
        why = check_preference_request(request)
        if why:
            raise UsageError(f"{path}: trains with {preference.objective.value.upper()}; {why}")
        budget = estimate_preference_budget(spec, setup, preference, analysis.gpu)
    if device == "cpu":
        from llmmem.verify.building import runs_bitsandbytes

        bitsandbytes = setup.quant is not None or runs_bitsandbytes(setup.optim)
        needed = _cpu_step_bytes(spec, setup, budget.allocated_peak_bytes)
        _check_host_memory(needed * setup.distributed.world_size, simulable=not bitsandbytes)
    measurement = _run_worker(
        request.to_json(),
        args.timeout,
        show_progress=args.format == "text",
        allow_network=args.hub and checked.settings.hub,
    )
    report = _report(path, spec, budget, measurement)
    if args.output:
        from llmmem.output_files import write_output_text

        try:
            write_output_text(args.output, json.dumps(report, indent=2) + "\n")
        except OSError as err:
            raise UsageError(
                f"--output {args.output}: cannot write ({err.strerror or err})"
            ) from None
    if args.format == "json":
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _render(report, budget, measurement)
    if measurement.oom is not None:
        return EXIT_OOM
    if measurement.error:
        return EXIT_COULD_NOT_RUN
    return EXIT_MEASURED


def _grpo_fields(preference: Any) -> dict[str, Any] | None:
    """What a GRPO step needs from the plan's GRPO setup (None for other objectives)."""
    if preference.objective.value != "grpo":
        return None
    from llmmem.budget.grpo import GrpoSetup

    grpo = preference.grpo or GrpoSetup()
    return {
        "num_generations": grpo.num_generations,
        "max_prompt_length": grpo.max_prompt_length,
        "max_completion_length": grpo.max_completion_length,
        "beta": grpo.beta,
        "vllm": grpo.vllm,
        "mixed_precision": grpo.mixed_precision,
    }


def _check_output_path(flag: str, output: str | None) -> None:
    """An output path must be one a file can be written to before a step that may take
    minutes is run: not a directory, a FIFO (writing waits for a reader) or a device."""
    if not output:
        return
    from llmmem.output_files import why_not_writable

    why = why_not_writable(output)
    if why:
        raise UsageError(f"{flag} {output}: {why}")


def _run_worker(
    request: dict[str, Any], timeout_s: float, *, show_progress: bool, allow_network: bool
) -> Any:
    """Run the step in `llmmem.verify.worker`, isolated from the user's folder: `python -I`
    with llmmem's own import path, started in a temporary directory (every path it is given is
    absolute), the hub's offline switches set unless `allow_network`."""
    # imported here: every `llmmem` command builds this parser, only verify runs a step
    import subprocess
    import tempfile
    import threading

    from llmmem.isolated_python import child_environment, isolated_python
    from llmmem.verify.request import StepMeasurement, StepRequest

    with tempfile.TemporaryDirectory(prefix="llmmem-verify-") as directory:
        request_path = Path(directory) / "request.json"
        out_path = Path(directory) / "measurement.json"
        request_path.write_text(json.dumps(request), encoding="utf-8")
        worker = isolated_python("llmmem.verify.worker", str(request_path), str(out_path))
        world_size = int(request.get("world_size") or 1)
        launched = StepRequest.from_json(request).launched
        command = worker
        if launched:  # one process per rank, as the plan's launcher would start them
            # torchrun runs the isolated worker command as it is (--no-python), not `python -m`
            launcher = ["--standalone", f"--nproc_per_node={world_size}", "--no-python"]
            command = isolated_python("torch.distributed.run", *launcher, *worker)
        started = time.monotonic()
        process = subprocess.Popen(
            command,
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=child_environment(allow_network=allow_network),
        )
        stages: list[str] = []
        tail: list[str] = []

        def read_stderr() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                line = line.rstrip()
                if line.startswith("stage: "):
                    stages.append(line.removeprefix("stage: "))
                elif line:
                    tail.append(line)
                    del tail[:-20]

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        status = _progress(show_progress)
        timed_out = False
        try:
            while process.poll() is None:
                if time.monotonic() - started > timeout_s:
                    process.kill()
                    timed_out = True
                    break
                if status is not None and stages:
                    status.update(f"verify: {stages[-1]} ({time.monotonic() - started:.0f} s)")
                time.sleep(0.1)
            process.wait()
        finally:
            if status is not None:
                status.stop()
        reader.join(timeout=2)
        if launched:
            ranks = sorted(Path(directory).glob("measurement.json.rank*"))
            if len(ranks) == world_size:
                return _combine_ranks(
                    [
                        StepMeasurement.from_json(json.loads(p.read_text(encoding="utf-8")))
                        for p in ranks
                    ]
                )
        elif out_path.exists():
            return StepMeasurement.from_json(json.loads(out_path.read_text(encoding="utf-8")))
        device = str(request.get("device"))
        failed = StepMeasurement(
            device=device, device_name=device, stage=stages[-1] if stages else "start"
        )
        if timed_out:
            failed.error = f"the step took longer than {timeout_s:g} s (stopped at: {failed.stage})"
        else:
            last = tail[-1] if tail else f"exit code {process.returncode}"
            failed.error = f"the step's process ended without a result: {last}"
        failed.seconds = round(time.monotonic() - started, 3)
        return failed


def _combine_ranks(measured: list[Any]) -> Any:
    """The rank that peaked highest stands for the step; every rank's peak is listed."""
    worst = max(measured, key=lambda m: m.allocated_peak_bytes)
    worst.ranks = [
        {
            "rank": m.rank,
            "allocated_peak_bytes": m.allocated_peak_bytes,
            "weights_bytes": m.weights_bytes,
            "error": m.error,
            "oom": m.oom,
        }
        for m in sorted(measured, key=lambda m: m.rank)
    ]
    failed = [m for m in measured if m.error or m.oom]
    if failed and not (worst.error or worst.oom):
        worst.error, worst.oom = failed[0].error, failed[0].oom
    return worst


def _progress(enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return None
    from rich.console import Console

    status = Console(stderr=True).status("verify: starting")
    status.start()
    return status


def _report(path: Path, spec: Any, budget: Any, measurement: Any) -> dict[str, Any]:
    from llmmem.report.json_report import budget_dict
    from llmmem.verify.compare import compare, rows_json, summary, unseen_overheads

    return {
        "file": str(path),
        "model": spec.model_id,
        "device": measurement.device_name,
        "summary": summary(budget, measurement),
        "comparison": rows_json(compare(budget, measurement) if measurement.phases else []),
        "not_seen": rows_json(unseen_overheads(budget, measurement)),
        "measurement": measurement.to_json(),
        "prediction": budget_dict(budget, spec),
    }


def _render(report: dict[str, Any], budget: Any, measurement: Any) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from llmmem.units import format_bytes

    console = Console(emoji=False)
    console.print(f"[bold]{escape(report['model'])}[/bold] on {escape(report['device'])}")
    if report["comparison"]:
        table = Table(title="predicted vs measured (allocated)", title_justify="left")
        table.add_column("")
        table.add_column("predicted", justify="right")
        table.add_column("measured", justify="right")
        table.add_column("error", justify="right")
        for row in report["comparison"]:
            error = row["error"]
            table.add_row(
                escape(row["what"]),
                format_bytes(row["predicted_bytes"]) if row["predicted_bytes"] else "—",
                format_bytes(row["measured_bytes"]) if row["measured_bytes"] else "—",
                f"{100 * error:+.1f}%" if error is not None else "",
            )
        console.print(table)
    if report["not_seen"]:
        console.print(
            "[dim]not seen without a GPU, as estimated: "
            + escape(
                ", ".join(
                    f"{row['what']} {format_bytes(row['predicted_bytes'])}"
                    for row in report["not_seen"]
                )
            )
            + f"; predicted device total {format_bytes(budget.device_total_bytes)}[/dim]"
        )
    for note in measurement.notes:
        console.print(f"[dim]note: {escape(note)}[/dim]")
    console.print(escape(report["summary"]))

"""`llmmem.preflight(trainer)`: the step checked against the GPU before step one.

    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset)
    llmmem.preflight(trainer, on_oom="raise")   # raises llmmem.WillNotFit before any step
    trainer.train()

The live objects are read (`integrations.live`), the plan goes through the same analysis as
`llmmem explain` (the same budget, band and local calibration), and the one-screen breakdown and
the verdict are printed. `on_oom`: "warn" prints and goes on, "raise" raises `WillNotFit` with
the changes that would fit, "ignore" prints nothing when it fits or not. The GPU is a catalog name
or a capacity (`"24GiB"`), by default the one torch sees; without one there is no verdict.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmmem.units import format_bytes

ON_OOM = ("warn", "raise", "ignore")


class WillNotFit(RuntimeError):
    """The step will not fit the GPU: raised before step one by `preflight(on_oom="raise")`."""

    def __init__(
        self, message: str, *, predicted_bytes: int, capacity_bytes: int, gpu: str, fixes: list[str]
    ) -> None:
        super().__init__(message)
        self.predicted_bytes = predicted_bytes
        self.capacity_bytes = capacity_bytes
        self.gpu = gpu
        self.fixes = fixes


@dataclass
class Preflight:
    """What preflight found: the analysis (plan, spec, setup, budget) and the changes that fit."""

    analysis: Any
    fixes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def budget(self) -> Any:
        return self.analysis.budget

    @property
    def fits(self) -> bool | None:
        return None if self.budget is None else self.budget.fits

    @property
    def predicted_allocated_bytes(self) -> int | None:
        return None if self.budget is None else self.budget.allocated_peak_bytes

    def report(self) -> str:
        """The one-screen breakdown: the model, the peak's parts, the verdict, the fixes."""
        analysis, budget = self.analysis, self.budget
        if budget is None:
            reason = analysis.model_error or "; ".join(analysis.problems) or "no estimate"
            return f"llmmem preflight: cannot size this step ({reason})\n"
        spec, setup, peak = analysis.spec, analysis.setup, budget.peak
        lines = [
            f"llmmem preflight: {spec.model_id} ({_params(spec.total_params)} params), "
            f"{setup.method.value}, batch {setup.batch} x {setup.seq} tokens, "
            f"{setup.precision.value}, {setup.optim}"
            + (", gradient checkpointing" if setup.grad_ckpt else ""),
            f"  peak at {peak.phase.value}: {peak.moment}",
        ]
        parts = sorted(peak.components.items(), key=lambda item: -item[1].bytes)
        for component, term in parts[:6]:
            lines.append(f"    {component.value:<22} {format_bytes(term.bytes):>10}")
        lines.append(f"    {'allocated peak':<22} {format_bytes(budget.allocated_peak_bytes):>10}")
        from llmmem.budget.bands import format_with_band

        total = format_with_band(budget.device_total_bytes, budget.band)
        if budget.gpu is None:
            lines.append(f"  device total {total} (no GPU named or found: no verdict)")
        else:
            headroom = budget.headroom_bytes or 0
            lines.append(
                f"  device total {total} of {format_bytes(budget.gpu.capacity_bytes)} on "
                f"{budget.gpu.name}: {budget.verdict} "
                f"({'headroom' if headroom >= 0 else 'short by'} {format_bytes(abs(headroom))})"
            )
        lines += [f"  fix: {fix}" for fix in self.fixes]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def preflight(
    trainer: Any = None,
    *,
    model: Any = None,
    optimizer: Any = None,
    batch: Any = None,
    args: Any = None,
    gpu: str | None = None,
    on_oom: str = "warn",
    world_size: int | None = None,
    script: str | os.PathLike[str] | None = None,
    file: Any = None,
    trainer_class: str | None = None,
) -> Preflight:
    """Predict the training step of `trainer` (an HF `Trainer` or TRL `SFTTrainer`), or of a plain
    loop's `model`, `optimizer` and first `batch`, before any step runs, and say whether it fits
    `gpu`. Prints the breakdown to `file` (default stderr) unless `on_oom="ignore"` and it fits.
    The calibration rows and library releases are looked up from `script` (default: the running
    script) as `llmmem explain` would for that file."""
    if on_oom not in ON_OOM:
        raise ValueError(f"on_oom must be one of {', '.join(ON_OOM)}, got {on_oom!r}")
    from llmmem.integrations.live import NotReadable, read_live

    if trainer is not None:
        model = model if model is not None else getattr(trainer, "model", None)
        args = args if args is not None else getattr(trainer, "args", None)
        optimizer = optimizer if optimizer is not None else getattr(trainer, "optimizer", None)
        trainer_class = type(trainer).__name__
        if batch is None:
            batch = first_batch(trainer)
    if model is None:
        raise ValueError("preflight needs a trainer or a model")
    try:
        reading = read_live(
            model=model,
            args=args,
            optimizer=optimizer,
            batch=batch,
            trainer_class=trainer_class,
            world_size=world_size,
        )
    except NotReadable as err:
        result = Preflight(analysis=_Unsized(str(err)))
        _print(result.report(), file)
        return result
    try:
        result = _analyse(reading, gpu or detected_gpu(), script, triton=_runs_triton(model))
    finally:
        reading.close()
    fits = result.fits
    if on_oom != "ignore" or fits is False:
        _print(result.report(), file)
    if fits is False and on_oom == "raise":
        budget = result.budget
        fixes = "; ".join(result.fixes) if result.fixes else "no single change llmmem knows fits"
        raise WillNotFit(
            f"the step needs about {format_bytes(budget.device_total_bytes)} on "
            f"{budget.gpu.name} ({format_bytes(budget.gpu.capacity_bytes)}): it will not fit. "
            f"What would fit: {fixes}",
            predicted_bytes=budget.device_total_bytes,
            capacity_bytes=budget.gpu.capacity_bytes,
            gpu=budget.gpu.name,
            fixes=result.fixes,
        )
    return result


@dataclass
class _Unsized:
    """The analysis of objects preflight could not read."""

    model_error: str
    budget: Any = None
    problems: list[str] = field(default_factory=list)


def first_batch(trainer: Any) -> Any:
    """The first batch the trainer's dataloader gives (its shape is the step's), or None."""
    getter = getattr(trainer, "get_train_dataloader", None)
    if not callable(getter) or getattr(trainer, "train_dataset", None) is None:
        return None
    try:
        return next(iter(getter()))
    except Exception:  # a dataset that cannot be read now: the arguments' sizes are used
        return None


def detected_gpu() -> str | None:
    """The GPU torch sees, by its catalog name (or its capacity)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    from llmmem.gpus import detect_local_gpus

    found = detect_local_gpus()
    if found:
        return found[0].as_gpu_spec().name
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return f"{total / 2**30:.1f}GiB"


def running_script() -> Path:
    main = sys.modules.get("__main__")
    candidate = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv else "")
    path = Path(candidate) if candidate else Path.cwd() / "train.py"
    return path.absolute()


def _runs_triton(model: Any) -> bool:
    """Whether the model's device runs Triton kernels (CUDA, XPU), as TRL's fused LM head asks
    before folding its tiles in them; a model on the CPU does not."""
    try:
        device = next(iter(model.parameters())).device.type
    except (AttributeError, StopIteration, TypeError):
        return True
    return device in ("cuda", "xpu")


def _analyse(reading: Any, gpu: str | None, script: Any, *, triton: bool = True) -> Preflight:
    from llmmem.budget.phases import estimate_budget
    from llmmem.calibration.store import with_local_evidence
    from llmmem.scenario import analyze

    path = Path(script).absolute() if script is not None else running_script()
    plan = reading.builder.build(
        str(path),
        "python",
        reading.framework,
        config_class="SFTConfig" if reading.framework == "trl" else None,
    )
    plan.problems = [p for p in plan.problems if "model_config" not in p]
    previous = os.environ.get("LLMMEM_RUN_ENV")
    os.environ["LLMMEM_RUN_ENV"] = sys.prefix  # the libraries this process runs with
    try:
        analysis = analyze(plan, gpu=gpu, hub=False)
    finally:
        if previous is None:
            os.environ.pop("LLMMEM_RUN_ENV", None)
        else:
            os.environ["LLMMEM_RUN_ENV"] = previous
    notes = list(reading.notes)
    if analysis.spec is not None:  # sized from the config written for it: say whose it is
        analysis.spec = replace(
            analysis.spec, model_id=reading.model_id, source_detail="the running model's config"
        )
    setup = analysis.setup
    refit = False
    if (
        setup is not None
        and setup.lora is not None
        and reading.adapter_bytes in (2, 4)
        and setup.lora.adapter_bytes != reading.adapter_bytes
        and analysis.budget is not None
    ):  # the adapters' dtype as the model holds them, which no file states
        setup = replace(setup, lora=replace(setup.lora, adapter_bytes=reading.adapter_bytes))
        refit = True
    if (
        setup is not None
        and setup.framework.value == "trl"
        and setup.triton != triton
        and analysis.budget is not None
    ):  # the step as this device runs it: TRL's fused LM head without Triton scores every
        # position and folds its tiles in torch (llmmem.budget.stacks.trl)
        setup = replace(setup, triton=triton)
        refit = True
    if refit and setup is not None and analysis.spec is not None:
        analysis.setup = setup
        budget = estimate_budget(analysis.spec, setup, analysis.gpu)
        analysis.budget = with_local_evidence(budget, path, plan.framework)
    return Preflight(analysis=analysis, fixes=live_fixes(analysis), notes=notes)


def live_fixes(analysis: Any) -> list[str]:
    """The single changes that bring the step under the GPU, each with the total after it."""
    budget = analysis.budget
    if budget is None or budget.gpu is None or budget.fits:
        return []
    from llmmem.budget.phases import estimate_budget
    from llmmem.budget.setup import SetupError
    from llmmem.rules.fixes import CANDIDATES

    found: list[tuple[int, str]] = []
    for candidate in CANDIDATES:
        if candidate.applies is not None:
            continue  # a preference or GRPO lever: not a step preflight sizes
        try:
            changed = candidate.change(analysis.setup)
            if changed is None or changed == analysis.setup:
                continue
            after = estimate_budget(analysis.spec, changed, analysis.gpu)
        except (SetupError, ValueError):
            continue
        if after.fits:
            found.append(
                (
                    after.device_total_bytes,
                    f"{candidate.title} → {format_bytes(after.device_total_bytes)}",
                )
            )
    return [title for _, title in sorted(found)]


def _params(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


def _print(text: str, file: Any) -> None:
    stream = file if file is not None else sys.stderr
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        pass

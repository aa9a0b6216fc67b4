"""Local calibration: the measured peaks of real runs, and the bands they narrow.

`llmmem calibrate add RUN_OUTPUT --for FILE` reads what a run wrote, predicts FILE's step as
`llmmem explain` does, and appends one row (JSON Lines) to the workspace's calibration file,
`.llmmem/calibration.jsonl` (`--calibration PATH` or `LLMMEM_CALIBRATION` name another). What
it reads:

- HF Trainer's memory metrics (`TrainingArguments(skip_memory_metrics=False)`; they need
  `psutil`), in `all_results.json`, `train_results.json` or `trainer_state.json`'s
  `log_history`. They are deltas of `torch.cuda.memory_allocated` (transformers'
  `TrainerMemoryTracker`): `before_init_mem_gpu` is what was allocated when the Trainer was
  made, `init_mem_gpu_alloc_delta` what its `__init__` added (the model moved to the GPU),
  `train_mem_gpu_alloc_delta` what `train()` left allocated, and `train_mem_gpu_peaked_delta`
  how far `max_memory_allocated` rose above that end. The allocated peak of training is their
  sum: the baseline `before_init_mem_gpu + init_mem_gpu_alloc_delta` (taken as what was
  allocated when `train()` began: nothing allocated between the two) plus the two train deltas.
  On a CPU run only the `*_mem_cpu_*` keys are written, and there is nothing to record;
- torchtune's `get_memory_stats` values in its metric log lines
  (`Step 12 | loss:1.02 ... peak_memory_active:20.1 peak_memory_alloc:20.0
  peak_memory_reserved:22.5`, GiB, the peak since the previous line): the largest of each over
  the log (the "after model init" block is not a training step and is not read);
- a `torch.cuda.max_memory_allocated` / `max_memory_reserved` figure printed in any log, with its
  unit (`max_memory_allocated: 21.3 GiB`, `... = 22871867392`): the largest of each;
- `llmmem verify --format json` (or `--output`) of a CUDA step: its allocated, reserved and
  NVML peaks, and the prediction the report carries.

A row is for one setup: the GPU, the framework class (`hf` for transformers models under HF
Trainer, TRL, axolotl, LLaMA-Factory or a plain loop; `torchtune`; `litgpt`), the method
(full, lora, qlora, generate) and the sharding (1 GPU, DDP, FSDP, ZeRO-n). It keeps the
measured and the predicted bytes of each metric it has, and the measured/predicted ratio of the
device total: where the run gives the allocated or reserved peak only, the predicted terms above
it (workspaces, allocator slack, CUDA context) are added to the measured figure.

A later prediction of the same setup (another model or shape included: the ratio is a residual
of the core, and what a GPU and a stack add moves little between models) finds the nearest
calibration file above its file (or the current folder, for `llmmem estimate`), and its band
becomes the local rows' ratios widened by the class band's half-width / sqrt(n + 1) (see
`llmmem.budget.bands.band_for`); the report says "band from 3 local runs". The estimate itself
is not moved.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmmem.calibration.store import (
    CALIBRATION_DIR,
    CALIBRATION_NAME,
    CALIBRATION_VARIABLE,
    LocalEvidence,
    _folders,
    find_calibration_file,
    framework_class,
    local_evidence,
    read_rows,
    setup_key,
    with_local_evidence,
)
from llmmem.errors import UsageError, non_empty

__all__ = [
    "CALIBRATION_DIR",
    "CALIBRATION_NAME",
    "CALIBRATION_VARIABLE",
    "LocalEvidence",
    "find_calibration_file",
    "framework_class",
    "local_evidence",
    "read_rows",
    "setup_key",
    "with_local_evidence",
]

FORMAT_VERSION = 1
MAX_READ_BYTES = 64 * 1024 * 1024
METRICS = ("device", "reserved", "allocated")  # the nearest to the device total first
GIB = 2**30


# -- reading what a run wrote ------------------------------------------------------------------


@dataclass
class Measured:
    """What one run measured, in bytes per metric, and how it was read."""

    metrics: dict[str, int]  # "allocated", "reserved", "device"
    source: str  # e.g. "HF Trainer memory metrics (all_results.json)"
    path: str
    notes: list[str] = field(default_factory=list)
    device_name: str | None = None  # verify reports name the GPU
    prediction: dict[str, Any] | None = None  # verify reports carry theirs
    file: str | None = None  # the file a verify report was about


class NothingMeasured(UsageError):
    """RUN_OUTPUT holds no GPU memory figure llmmem can read (exit 2)."""


class AlreadyRecorded(UsageError):
    """The same measurement of the same run is in the calibration file already (exit 2)."""


HF_KEYS = (
    "before_init_mem_gpu",
    "init_mem_gpu_alloc_delta",
    "train_mem_gpu_alloc_delta",
    "train_mem_gpu_peaked_delta",
)


def _read_text(path: Path) -> str:
    if not path.is_file():
        from llmmem.files import why_not_a_file

        raise NothingMeasured(f"{path}: {why_not_a_file(path)}")
    if path.stat().st_size > MAX_READ_BYTES:
        raise NothingMeasured(f"{path}: over {MAX_READ_BYTES // 2**20} MiB, not read")
    return path.read_text(encoding="utf-8", errors="replace")


def _hf_metrics(values: dict[str, Any], path: Path) -> Measured | None:
    if not any(str(k).startswith(("train_mem_", "init_mem_", "before_init_mem")) for k in values):
        return None
    if "train_mem_gpu_peaked_delta" not in values:
        if "train_mem_cpu_peaked_delta" in values:
            raise NothingMeasured(
                f"{path}: HF Trainer wrote CPU memory metrics only (train_mem_cpu_*): the run "
                "had no GPU, so there is no GPU peak to record"
            )
        return None
    missing = [k for k in HF_KEYS if not isinstance(values.get(k), (int, float))]
    if missing:
        raise NothingMeasured(
            f"{path}: HF Trainer's memory metrics lack {', '.join(missing)}: without the "
            "baseline the train deltas are not a peak"
        )
    baseline = int(values["before_init_mem_gpu"]) + int(values["init_mem_gpu_alloc_delta"])
    peak = (
        baseline
        + int(values["train_mem_gpu_alloc_delta"])
        + int(values["train_mem_gpu_peaked_delta"])
    )
    return Measured(
        metrics={"allocated": peak},
        source=f"HF Trainer memory metrics ({path.name})",
        path=str(path),
        notes=[
            "allocated peak = before_init_mem_gpu + init_mem_gpu_alloc_delta (allocated when "
            "train() began) + train_mem_gpu_alloc_delta + train_mem_gpu_peaked_delta"
        ],
    )


def _from_json(data: Any, path: Path) -> Measured | None:
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("measurement"), dict) and isinstance(data.get("prediction"), dict):
        return _from_verify(data, path)
    history = data.get("log_history")
    if isinstance(history, list):
        for entry in reversed(history):
            if isinstance(entry, dict):
                found = _hf_metrics(entry, path)
                if found is not None:
                    return found
        return None
    return _hf_metrics(data, path)


def _from_verify(report: dict[str, Any], path: Path) -> Measured:
    measurement = report["measurement"]
    if measurement.get("device") != "cuda":
        raise NothingMeasured(
            f"{path}: a {measurement.get('device')} step of llmmem verify: only a CUDA step "
            "measures a GPU"
        )
    if measurement.get("oom") or measurement.get("error"):
        raise NothingMeasured(f"{path}: the verified step did not finish (out of memory or error)")
    metrics = {}
    for metric, key in (
        ("allocated", "allocated_peak_bytes"),
        ("reserved", "reserved_peak_bytes"),
        ("device", "device_used_peak_bytes"),
    ):
        value = measurement.get(key)
        if isinstance(value, int) and value > 0:
            metrics[metric] = value
    if not metrics:
        raise NothingMeasured(f"{path}: the verify report has no measured peak")
    return Measured(
        metrics=metrics,
        source=f"llmmem verify ({path.name})",
        path=str(path),
        device_name=measurement.get("device_name") or report.get("device"),
        prediction=report["prediction"],
        file=report.get("file"),
    )


_TORCHTUNE = re.compile(
    r"\bpeak_memory_(active|alloc|reserved)\s*[:=]\s*([0-9.]+(?:[eE][-+]?\d+)?)"
)
_MAX_MEMORY = re.compile(
    r"max_memory_(allocated|reserved)\b[^0-9\n]{0,40}?([0-9][0-9_,]*(?:\.[0-9]+)?)\s*"
    r"(GiB|GB|MiB|MB|KiB|KB|bytes|B)?\b",
    re.IGNORECASE,
)
UNITS = {"gib": GIB, "gb": 10**9, "mib": 2**20, "mb": 10**6, "kib": 2**10, "kb": 10**3}


def _from_log(text: str, path: Path) -> Measured | None:
    peaks: dict[str, float] = {}
    for line in text.splitlines():
        if not line.lstrip().startswith("Step") and "|" not in line:
            continue
        for name, value in _TORCHTUNE.findall(line):
            peaks[name] = max(peaks.get(name, 0.0), float(value))
    if peaks:
        metrics = {}
        if "alloc" in peaks:
            metrics["allocated"] = round(peaks["alloc"] * GIB)
        if "reserved" in peaks:
            metrics["reserved"] = round(peaks["reserved"] * GIB)
        if metrics:
            return Measured(
                metrics=metrics,
                source=f"torchtune get_memory_stats ({path.name})",
                path=str(path),
                notes=["the largest peak_memory_alloc / peak_memory_reserved of the log (GiB)"],
            )
    found: dict[str, int] = {}
    for match in _MAX_MEMORY.finditer(text):
        metric = match.group(1).lower()
        number = float(match.group(2).replace(",", "").replace("_", ""))
        unit = (match.group(3) or "").lower()
        if unit in UNITS:
            value = round(number * UNITS[unit])
        elif number >= 2**20:  # bytes, as torch returns them
            value = round(number)
        else:
            continue  # a small number without a unit: GiB or GB cannot be told apart
        found[metric] = max(found.get(metric, 0), value)
    if found:
        return Measured(
            metrics=found,
            source=f"torch.cuda.max_memory_* in {path.name}",
            path=str(path),
            notes=["the largest max_memory_allocated / max_memory_reserved figure of the log"],
        )
    return None


def _candidates(folder: Path) -> list[Path]:
    """The files of a run's output folder that may hold memory figures, in the order tried."""
    out = [folder / n for n in ("all_results.json", "train_results.json", "trainer_state.json")]
    checkpoints = sorted(
        folder.glob("checkpoint-*/trainer_state.json"),
        key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0),
        reverse=True,
    )
    out += checkpoints
    for pattern in ("*.json", "*.log", "*.txt", "logs/*.txt", "logs/*.log"):
        out += sorted(folder.glob(pattern))
    unique: list[Path] = []
    for candidate in out:
        if candidate.is_file() and candidate not in unique:
            unique.append(candidate)
    return unique


def read_run_output(path: Path) -> Measured:
    """The measured peaks in a run's output (a folder or one file); NothingMeasured says why
    there are none."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder")
    files = _candidates(path) if path.is_dir() else [path]
    reasons = []
    for candidate in files:
        try:
            text = _read_text(candidate)
        except NothingMeasured as err:
            reasons.append(str(err))
            continue
        except OSError as err:
            reasons.append(f"{candidate}: {err.strerror or err}")
            continue
        try:
            measured = (
                _from_json(json.loads(text), candidate)
                if text.lstrip().startswith(("{", "["))
                else None
            )
        except ValueError:
            measured = None
        except NothingMeasured as err:
            reasons.append(str(err))
            continue
        if measured is None:
            measured = _from_log(text, candidate)
        if measured is not None:
            return measured
    if reasons:
        raise NothingMeasured("; ".join(reasons))
    raise NothingMeasured(
        f"{path}: no GPU memory figure found (HF Trainer: TrainingArguments("
        "skip_memory_metrics=False) with psutil installed; torchtune: log_peak_memory_stats: "
        "True; or print torch.cuda.max_memory_allocated() with its unit)"
    )


# -- recording ---------------------------------------------------------------------------------


def predicted_metrics(budget: Any) -> dict[str, int]:
    """The prediction of each metric as a GPU measures it: the allocated peak counts cuBLAS's
    workspaces (torch's allocator hands them out), the reserved peak adds the slack."""
    workspaces = 0
    for overhead, term in budget.overheads.items():
        if getattr(overhead, "value", overhead) == "cublas_workspaces":
            workspaces = term.bytes
    return {
        "allocated": budget.allocated_peak_bytes + workspaces,
        "reserved": budget.reserved_peak_bytes,
        "device": budget.device_total_bytes,
    }


def _predicted_from_report(prediction: dict[str, Any]) -> dict[str, int]:
    workspaces = (prediction.get("overheads") or {}).get("cublas_workspaces", {}).get("bytes", 0)
    return {
        "allocated": int(prediction["allocated_peak_bytes"]) + int(workspaces),
        "reserved": int(prediction["reserved_peak_bytes"]),
        "device": int(prediction["device_total_bytes"]),
    }


def device_ratio(measured: dict[str, int], predicted: dict[str, int]) -> tuple[float, str]:
    """measured / predicted of the device total, from the metric nearest to it that was
    measured: the predicted terms above that metric are added to the measured figure."""
    for metric in METRICS:
        if metric in measured and predicted.get(metric):
            implied = measured[metric] + predicted["device"] - predicted[metric]
            return implied / predicted["device"], metric
    raise UsageError("nothing measured to compare")


def workspace_root(start: Path) -> Path:
    folders = _folders(start.absolute())
    root = folders[-1]
    return root if (root / ".git").exists() else folders[0]


def calibration_target(start: Path, named: str | None) -> Path:
    if named:
        return Path(named).expanduser()
    existing = find_calibration_file(start)
    if existing is not None:
        return existing
    return workspace_root(start) / CALIBRATION_DIR / CALIBRATION_NAME


def add(
    run_output: Path,
    *,
    for_file: Path | None,
    gpu: str | None,
    calibration: str | None = None,
) -> tuple[dict[str, Any], Path]:
    """Read the run's peaks, predict `for_file`, append the row; returns (row, file)."""
    measured = read_run_output(run_output)
    if for_file is None and measured.file:
        for_file = Path(measured.file)
    if for_file is None:
        raise UsageError(
            "name the training script or config the run used: --for FILE (its prediction is "
            "what the measured peak is compared with)"
        )
    if not for_file.is_file():
        from llmmem.files import why_not_a_file

        raise UsageError(f"--for {for_file}: {why_not_a_file(for_file)}")
    analysis = _analyze(for_file, gpu or _gpu_of(measured))
    budget, spec, setup = analysis.budget, analysis.spec, analysis.setup
    if budget is None or spec is None or setup is None:
        reason = analysis.model_error or "; ".join(analysis.problems) or "no estimate"
        raise UsageError(f"--for {for_file}: cannot be estimated ({reason})")
    if budget.gpu is None:
        raise UsageError(
            "which GPU did the run use? pass --gpu NAME (a row is kept per GPU, method and stack)"
        )
    predicted = (
        _predicted_from_report(measured.prediction)
        if measured.prediction is not None
        else predicted_metrics(budget)
    )
    row = calibration_row(analysis, measured, predicted, for_file)
    target = calibration_target(for_file, calibration or os.environ.get(CALIBRATION_VARIABLE))
    for earlier in read_rows(target):
        if (
            earlier.get("run_output") == row["run_output"]
            and earlier.get("measured") == row["measured"]
            and earlier.get("key") == row["key"]
        ):
            raise AlreadyRecorded(
                f"{run_output}: already recorded in {target} for {row['key']} (one run counts once)"
            )
    append_row(target, row)
    return row, target


def append_row(target: Path, row: dict[str, Any]) -> None:
    """Append one row; a calibration path that is not a regular file (a FIFO, a device, a
    folder) is refused before anything is opened, as input paths are."""
    try:
        info = target.stat()
    except FileNotFoundError:
        info = None
    except OSError as err:
        raise UsageError(f"{target}: cannot be written ({err.strerror or err})") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        from llmmem.files import why_not_a_file

        raise UsageError(f"{target}: {why_not_a_file(target)}; a calibration file must be one")
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row, sort_keys=False) + "\n")


def calibration_row(
    analysis: Any, measured: Measured, predicted: dict[str, int], for_file: Path
) -> dict[str, Any]:
    """One row: what `measured` read beside the prediction of `analysis` for `for_file`."""
    budget, spec = analysis.budget, analysis.spec
    ratio, basis = device_ratio(measured.metrics, predicted)
    framework = framework_class(analysis.plan.framework, budget.band_class.split("/")[0])
    from datetime import datetime, timezone

    from llmmem.version import __version__

    return {
        "llmmem_calibration": FORMAT_VERSION,
        "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "key": setup_key(budget.gpu.name, framework, budget.band_class),
        "gpu": budget.gpu.name,
        "framework": framework,
        "band_class": budget.band_class,
        "model": spec.model_id,
        "for": str(for_file),
        "run_output": str(Path(measured.path).absolute()),
        "source": measured.source,
        "measured": measured.metrics,
        "predicted": {m: predicted[m] for m in METRICS},
        "device_ratio": round(ratio, 5),
        "ratio_from": basis,
        "versions": {lib: v.version for lib, v in analysis.versions.items()},
        "llmmem": __version__,
        "notes": measured.notes,
    }


def _gpu_of(measured: Measured) -> str | None:
    if not measured.device_name:
        return None
    from llmmem.gpus import UnknownGpuError, find_gpu

    try:
        return find_gpu(measured.device_name).name
    except UnknownGpuError:
        return None


def _analyze(for_file: Path, gpu: str | None) -> Any:
    from llmmem.check import check_text, require_known_gpus
    from llmmem.extract import find_project_settings
    from llmmem.lint_command import read_text

    settings = find_project_settings(for_file)
    require_known_gpus(gpu, settings)
    fallback = None
    if not gpu:
        from llmmem.gpus import detect_local_gpus

        detected = detect_local_gpus()
        fallback = detected[0].as_gpu_spec().name if detected else None
    checked = check_text(
        for_file, read_text(for_file), settings=settings, gpu=gpu, fallback_gpu=fallback, hub=False
    )
    return checked.analysis


def format_row(row: dict[str, Any], target: Path) -> str:
    measured = row["measured"]
    figures = ", ".join(f"{m} {measured[m] / GIB:.2f} GiB" for m in METRICS if m in measured)
    runs = sum(1 for r in read_rows(target) if r.get("key") == row["key"])
    return (
        f"recorded {row['key']}: {figures} ({row['source']}); predicted "
        f"{row['predicted'][row['ratio_from']] / GIB:.2f} GiB {row['ratio_from']}, device total "
        f"{100 * (row['device_ratio'] - 1):+.1f}% of the estimate\n"
        f"{target}: {runs} local run{'s' * (runs != 1)} for this setup"
    )


def run_calibrate(args: Any) -> int:
    if args.calibrate_command == "add":
        row, target = add(
            Path(args.run_output),
            for_file=Path(args.for_file) if args.for_file else None,
            gpu=args.gpu,
            calibration=args.calibration,
        )
        if args.format == "json":
            print(json.dumps({"row": row, "calibration_file": str(target)}, indent=2))
        else:
            print(format_row(row, target))
            ratio = row["device_ratio"]
            if not 1 / 3 <= ratio <= 3:
                print(
                    f"note: the run measured {ratio:.1f}× the estimate: check that --for names "
                    "the file the run used"
                )
        return 0
    start = Path(args.for_file) if getattr(args, "for_file", None) else Path.cwd()
    found: Path | None = (
        Path(args.calibration) if args.calibration else find_calibration_file(start)
    )
    rows = read_rows(found) if found is not None else []
    if args.format == "json":
        print(json.dumps({"calibration_file": str(found) if found else None, "rows": rows}))
        return 0
    if not rows:
        print("no local calibration rows (llmmem calibrate add RUN_OUTPUT --for FILE)")
        return 0
    print(f"{found}:")
    by_key: dict[str, list[float]] = {}
    for row in rows:
        if isinstance(row.get("device_ratio"), (int, float)):
            by_key.setdefault(str(row.get("key")), []).append(float(row["device_ratio"]))
    for key, ratios in sorted(by_key.items()):
        low, high = min(ratios), max(ratios)
        print(
            f"  {key}: {len(ratios)} run{'s' * (len(ratios) != 1)}, measured "
            f"{100 * (low - 1):+.1f}%..{100 * (high - 1):+.1f}% of the estimate"
        )
    return 0


def add_calibrate_arguments(p: Any) -> None:
    sub = p.add_subparsers(dest="calibrate_command", metavar="ACTION", required=True)
    add_p = sub.add_parser(
        "add",
        help="record the measured peaks a real run wrote",
        description="Record the GPU memory peaks a real run measured, beside llmmem's "
        "prediction for the file it ran, in the workspace's .llmmem/calibration.jsonl. Later "
        "predictions for the same GPU, stack (hf, torchtune, litgpt), method and sharding "
        "take their band from these runs. RUN_OUTPUT is a run's output folder or one file: HF "
        "Trainer's all_results.json / train_results.json / trainer_state.json (with "
        "skip_memory_metrics=False), a torchtune metric log (peak_memory_alloc/_reserved), a "
        "log printing torch.cuda.max_memory_allocated/_reserved with a unit, or "
        "llmmem verify --format json of a CUDA step.",
    )
    add_p.add_argument("run_output", metavar="RUN_OUTPUT", help="a run's output folder or file")
    add_p.add_argument(
        "--for",
        dest="for_file",
        metavar="FILE",
        default=None,
        help="the training script or config the run used (a verify report names its own)",
    )
    add_p.add_argument(
        "--gpu",
        type=non_empty,
        default=None,
        help="the GPU it ran on (default: the report's, the file's pragma, this machine's)",
    )
    add_p.add_argument(
        "--calibration",
        metavar="PATH",
        default=None,
        help=f"the calibration file (default: ${CALIBRATION_VARIABLE}, else the nearest "
        f"{CALIBRATION_DIR}/{CALIBRATION_NAME}, else one at the workspace root)",
    )
    add_p.add_argument("--format", choices=["text", "json"], default="text")
    list_p = sub.add_parser("list", help="the local runs per setup")
    list_p.add_argument("--for", dest="for_file", metavar="FILE", default=None)
    list_p.add_argument("--calibration", metavar="PATH", default=None)
    list_p.add_argument("--format", choices=["text", "json"], default="text")

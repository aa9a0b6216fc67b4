"""Peer estimators beside llmmem on the published calibration rows.

    python bench/peers.py [--verbose]

Installs each peer into its own virtual environment under bench/.peers/ (ignored by git; the
first run downloads them, accelerate brings torch and transformers, several GB) and runs it on
the rows of ../shared/calibration/measured.jsonl and measured-wide.jsonl that it can express,
with the same model, method, batch, sequence, precision, optimizer and LoRA/QLoRA settings that
llmmem gets from bench/calibration.py:

- `fitcheck-llm` 0.3.1 (its CLI, `--json`): single GPU, full/LoRA/QLoRA, AdamW or 8-bit Adam;
- `torch-preflight` 0.5.0 (`torch-preflight estimate -f json`): full fine-tuning only (it has no
  LoRA or quantization option), single GPU or ZeRO/FSDP sharding;
- `accelerate estimate-memory` (accelerate 1.15): full fine-tuning with Adam, single GPU, its
  "Training using Adam" column (weights only; no batch or sequence).

Nothing here reaches the Hugging Face Hub. fitcheck and torch-preflight read `config.json`
through `huggingface_hub`, so each model's config from llmmem's bundled catalog is written into
a temporary Hub cache and the peers run with HF_HUB_OFFLINE=1. `accelerate estimate-memory`
asks the Hub for the model's metadata before it reads any config and fails offline, so the
script runs the same steps its command runs after that lookup (`AutoConfig` from the local
config, `AutoModel.from_config` under `init_empty_weights`, `calculate_maximum_sizes`,
`estimate_training_usage`) inside accelerate's own environment.

A peer predicts one number per run; it is compared with the row's measured number whatever the
row's metric (llmmem predicts the row's own metric). Printed per method: each peer's median
|error| on the rows it answers, and llmmem's median |error| on the same rows; a row a peer
cannot answer is listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import venv
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration import (  # noqa: E402
    CALIBRATION_FILE,
    WIDE_CALIBRATION_FILE,
    CalibrationCase,
    RowSkipped,
    case_from_row,
    load_rows,
    wide_case_from_row,
)

from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.budget.setup import Method, Precision  # noqa: E402
from llmmem.models.catalog import catalog_entry  # noqa: E402

PEERS_DIR = Path(__file__).resolve().parent / ".peers"
MIB = 1024**2


@dataclass(frozen=True)
class Peer:
    name: str
    requirements: tuple[str, ...]


FITCHECK = Peer("fitcheck-llm 0.3.1", ("fitcheck-llm==0.3.1",))
PREFLIGHT = Peer("torch-preflight 0.5.0", ("torch-preflight[hub]==0.5.0",))
ACCELERATE = Peer("accelerate estimate-memory", ("accelerate==1.15.0", "transformers==5.24.0"))
PEERS = (FITCHECK, PREFLIGHT, ACCELERATE)


class PeerUnavailable(Exception):
    """The peer could not be installed here; the message says why."""


class Unanswered(Exception):
    """The peer cannot answer this row; the message says why."""


def _venv_dir(peer: Peer) -> Path:
    return PEERS_DIR / peer.requirements[0].split("==")[0].split("[")[0]


def install(peer: Peer) -> Path:
    """The peer's own virtual environment (created and filled on first use)."""
    root = _venv_dir(peer)
    stamp = root / "installed.txt"
    if stamp.exists() and stamp.read_text() == "\n".join(peer.requirements):
        return root
    print(f"installing {' '.join(peer.requirements)} into {root} ...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    done = subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "install", "-q", *peer.requirements],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PeerUnavailable(f"pip install failed: {' / '.join(tail)}")
    stamp.write_text("\n".join(peer.requirements))
    return root


def write_hub_cache(cases: list[CalibrationCase], hub_home: Path) -> None:
    """Each row's model config from the bundled catalog, laid out as a Hugging Face Hub cache
    (`hub/models--org--name/snapshots/<rev>/config.json`), so that `hf_hub_download` finds it
    offline."""
    for model_id in {str(case.row["model"]) for case in cases}:
        entry = catalog_entry(model_id)
        if entry is None:
            continue
        repo = hub_home / "hub" / ("models--" + model_id.replace("/", "--"))
        snapshot = repo / "snapshots" / "local"
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text("local")
        (snapshot / "config.json").write_text(json.dumps(entry.config))


def _run(command: list[str], hub_home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HOME=str(hub_home), HF_HUB_OFFLINE="1", NO_COLOR="1")
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else "no output"


# --- fitcheck -----------------------------------------------------------------------------------

FITCHECK_OPTIMIZERS = {"adamw_torch": "adamw", "adamw_hf": "adamw", "adamw_bnb_8bit": "adam8bit"}


def fitcheck_bytes(root: Path, case: CalibrationCase, hub_home: Path) -> int:
    setup = case.setup
    if setup.distributed.world_size > 1:
        raise Unanswered("no multi-GPU or sharding option")
    optimizer = FITCHECK_OPTIMIZERS.get(setup.optim)
    if optimizer is None:
        raise Unanswered(f"no optimizer like {setup.optim}")
    # its --precision is the compute dtype; full fine-tuning at 16 bits adds fp32 master weights
    precision = {Precision.FP32: "fp32", Precision.FP16: "fp16"}.get(setup.precision, "bf16")
    command = [str(root / "bin" / "fitcheck"), str(case.row["model"]), "--json"]
    command += ["--precision", precision, "--optimizer", optimizer]
    if setup.precision is Precision.BF16_TRUE and setup.method is Method.FULL:
        command += ["--optimizer-dtype", "bf16"]  # torch AdamW's states follow the bf16 weights
    command += ["--batch-size", str(setup.batch), "--seq-len", str(setup.seq)]
    command += ["--vram-mib", str(case.gpu.capacity_bytes // MIB)]
    if setup.grad_ckpt:
        command.append("--grad-checkpoint")
    if setup.attn.value != "eager":
        command.append("--flash-attn")
    if setup.method is Method.FULL:
        command.append("--no-lora")
    else:
        assert setup.lora is not None
        command += ["--lora-r", str(setup.lora.r)]
        command += ["--lora-targets", ",".join(setup.lora.targets or ["q_proj", "v_proj"])]
    if setup.quant is not None:
        command += ["--quant", "nf4" if setup.quant.quant_type.value == "nf4" else "int8"]
        if setup.quant.double_quant:
            command.append("--double-quant")
    done = _run(command, hub_home)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise Unanswered(_last_line(done.stderr or done.stdout)) from None
    return int(report["memory_mib"]["total"] * MIB)


# --- torch-preflight ----------------------------------------------------------------------------

PREFLIGHT_OPTIMIZERS = {
    "adamw_torch": "adamw",
    "adamw_hf": "adamw",
    "adamw_bnb_8bit": "adamw-8bit",
    "adafactor": "adafactor",
}
PREFLIGHT_DTYPES = {
    Precision.FP32: "fp32",
    Precision.FP16: "amp",
    Precision.BF16: "amp",
    Precision.BF16_TRUE: "pure-bf16",
}


def preflight_bytes(root: Path, case: CalibrationCase, hub_home: Path) -> int:
    setup = case.setup
    if setup.method is not Method.FULL:
        raise Unanswered("no LoRA or quantization option")
    optimizer = PREFLIGHT_OPTIMIZERS.get(setup.optim)
    if optimizer is None:
        raise Unanswered(f"no optimizer like {setup.optim}")
    distributed = setup.distributed
    if distributed.offload_params or distributed.offload_optimizer:
        raise Unanswered("no FSDP CPU offload option")
    command = [str(root / "bin" / "torch-preflight"), "estimate", "-f", "json", "--online"]
    command += ["--model", str(case.row["model"])]
    command += ["--batch-size", str(setup.batch), "--seq-len", str(setup.seq)]
    command += ["--dtype", PREFLIGHT_DTYPES[setup.precision], "--optimizer", optimizer]
    command += ["--gpu-memory", f"{case.gpu.capacity_bytes // MIB}MiB"]
    if distributed.world_size > 1:
        command += ["--world-size", str(distributed.world_size), "--sharding", "zero-3"]
    if setup.grad_ckpt:
        command.append("--checkpointing")
    if setup.attn.value != "eager":
        command.append("--flash")
    done = _run(command, hub_home)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise Unanswered(_last_line(done.stderr or done.stdout)) from None
    if not report.get("resolved") or not report.get("total_bytes"):
        raise Unanswered(str(report.get("model", {}).get("reason") or "model not resolved"))
    return int(report["total_bytes"])


# --- accelerate estimate-memory -----------------------------------------------------------------

# what `accelerate estimate-memory` runs after its Hub lookup, on a local config directory
ACCELERATE_STEPS = """
import json, sys, torch
from accelerate import init_empty_weights
from accelerate.commands.estimate import estimate_training_usage
from accelerate.utils import calculate_maximum_sizes
from transformers import AutoConfig, AutoModel
config = AutoConfig.from_pretrained(sys.argv[1])
with init_empty_weights():
    model = AutoModel.from_config(config, torch_dtype=torch.float32)
total, _ = calculate_maximum_sizes(model)
sizes = {d: max(estimate_training_usage(total, d).values()) for d in ("float32", "float16")}
print(json.dumps(sizes))
"""

_accelerate_sizes: dict[str, dict[str, int] | str] = {}


def accelerate_bytes(root: Path, case: CalibrationCase, hub_home: Path) -> int:
    setup = case.setup
    if setup.method is not Method.FULL:
        raise Unanswered("full fine-tuning only")
    if setup.optim not in ("adamw_torch", "adamw_hf"):
        raise Unanswered(f"Adam only, not {setup.optim}")
    if setup.distributed.world_size > 1:
        raise Unanswered("no multi-GPU or sharding option")
    model_id = str(case.row["model"])
    if model_id not in _accelerate_sizes:
        config_dir = hub_home / "hub" / ("models--" + model_id.replace("/", "--"))
        config_dir = config_dir / "snapshots" / "local"
        done = _run(
            [str(root / "bin" / "python"), "-c", ACCELERATE_STEPS, str(config_dir)], hub_home
        )
        try:
            _accelerate_sizes[model_id] = json.loads(done.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            _accelerate_sizes[model_id] = _last_line(done.stderr or done.stdout)
    sizes = _accelerate_sizes[model_id]
    if isinstance(sizes, str):
        raise Unanswered(sizes)
    # its float16 column is its mixed-precision (16-bit) training; float32 is plain fp32
    return int(sizes["float32" if setup.precision is Precision.FP32 else "float16"])


ESTIMATORS: dict[Peer, Callable[[Path, CalibrationCase, Path], int]] = {
    FITCHECK: fitcheck_bytes,
    PREFLIGHT: preflight_bytes,
    ACCELERATE: accelerate_bytes,
}


# --- the comparison -----------------------------------------------------------------------------


def calibration_cases() -> list[CalibrationCase]:
    cases = [case_from_row(row) for row in load_rows(CALIBRATION_FILE)]
    for row in load_rows(WIDE_CALIBRATION_FILE):
        try:
            cases.append(wide_case_from_row(row))
        except RowSkipped:
            continue  # llmmem cannot express it yet (bench/accuracy.py lists why)
    return cases


def llmmem_error(case: CalibrationCase) -> float:
    budget = estimate_budget(case.spec, case.setup, case.gpu)
    return case.predicted_bytes(budget) / case.measured_bytes - 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print each row's errors")
    args = parser.parse_args()

    cases = calibration_cases()
    ours = {case.row_id: llmmem_error(case) for case in cases}
    # peer -> row id -> error, or the reason it gave none
    answers: dict[str, dict[str, float | str]] = {}
    unavailable: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="llmmem-peers-") as temp:
        hub_home = Path(temp)
        write_hub_cache(cases, hub_home)
        for peer in PEERS:
            try:
                root = install(peer)
            except PeerUnavailable as failure:
                unavailable[peer.name] = str(failure)
                continue
            answers[peer.name] = {}
            for case in cases:
                try:
                    predicted = ESTIMATORS[peer](root, case, hub_home)
                    answers[peer.name][case.row_id] = predicted / case.measured_bytes - 1
                except Unanswered as refusal:
                    answers[peer.name][case.row_id] = f"unanswered: {refusal}"

    method_of = {case.row_id: case.setup.method.value for case in cases}
    print(f"{len(cases)} calibration rows ({CALIBRATION_FILE.name} + {WIDE_CALIBRATION_FILE.name})")
    for name, reason in unavailable.items():
        print(f"{name}: not installed here ({reason})")
    print()
    header = f"{'method':<7} {'peer':<28} {'rows':>5} {'peer median':>12} {'llmmem median':>14}"
    print(header)
    print("-" * len(header))
    for method in ("full", "lora", "qlora"):
        for name, by_row in answers.items():
            errors = {
                row: err
                for row, err in by_row.items()
                if method_of[row] == method and isinstance(err, float)
            }
            if not errors:
                print(f"{method:<7} {name:<28} {0:>5} {'-':>12} {'-':>14}")
                continue
            peer_median = statistics.median(abs(e) for e in errors.values())
            our_median = statistics.median(abs(ours[row]) for row in errors)
            print(
                f"{method:<7} {name:<28} {len(errors):>5} {100 * peer_median:>11.1f}% "
                f"{100 * our_median:>13.1f}%"
            )
    print()
    for name, by_row in answers.items():
        reasons = Counter(err for err in by_row.values() if isinstance(err, str))
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            print(f"{name}: {count} rows {reason}")

    if args.verbose:
        print()
        names = list(answers)
        print(f"{'row':<50} {'llmmem':>8} " + " ".join(f"{n.split()[0]:>16}" for n in names))
        by_method: dict[str, list[CalibrationCase]] = defaultdict(list)
        for case in cases:
            by_method[case.setup.method.value].append(case)
        for method in ("full", "lora", "qlora"):
            for case in by_method[method]:
                cells = []
                for name in names:
                    err = answers[name][case.row_id]
                    cells.append(
                        f"{100 * err:>+15.1f}%" if isinstance(err, float) else f"{'—':>16}"
                    )
                print(f"{case.row_id:<50} {100 * ours[case.row_id]:>+7.1f}% " + " ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

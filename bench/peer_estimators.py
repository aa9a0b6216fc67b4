"""The peer estimators of bench/peers.py, each run as its own release runs, on one row.

Each peer is installed into its own virtual environment under bench/.peers/ (ignored by git) and
runs offline: its model's `config.json` comes from llmmem's bundled catalog, written into a
temporary Hugging Face Hub cache. A peer answers a row with the figure it has for the metric the
row measured, or refuses the row by a rule of its own, or has no option that expresses the row.

- `fitcheck-llm` 0.3.1 (`fitcheck MODEL --json`). Its report's `memory_mib` holds five tensor
  terms (weights, lora, optimizer, gradients, activations: its "tensors" tier, which its
  calibration compares with `peak_allocated_mib`) and `overhead` (the CUDA context of its
  overhead profile plus a fragmentation share); `total` is their sum, its "process" figure,
  which its calibration compares with reserved + context. So: allocated rows get total −
  overhead, reserved rows total − the profile's CUDA context, nvidia-smi rows the total.
  fitcheck sizes a model from the Hub's safetensors parameter count and refuses a model whose
  config-derived count is off by more than 2% (`_reconcile_param_count`), and any MoE or
  multimodal config (`_reject_unsupported`). Offline it would skip that check, so the driver
  answers the Hub's count question with the true count (llmmem's catalog count of the
  checkpoint) and lets fitcheck's own rule decide.
- `torch-preflight` 0.5.0 (`torch-preflight estimate -f json --online`): full fine-tuning only
  (no LoRA or quantization option). Its breakdown carries `CUDA_context` and `fragmentation`:
  allocated rows get total − both, reserved rows total − context, nvidia-smi rows the total.
- `accelerate estimate-memory` (accelerate 1.15): its "Training using Adam" figure is weights,
  gradients and Adam states only — tensors — so it answers allocated rows of full fine-tuning
  with Adam on one GPU and has no figure for reserved or nvidia-smi rows. Its command asks the
  Hub for the model's metadata before it reads any config and fails offline, so the same steps
  its command runs after that lookup run here inside accelerate's own environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from calibration import CalibrationCase

from llmmem.budget.setup import Method, Precision
from llmmem.models.architectures import spec_from_config
from llmmem.models.catalog import catalog_entry
from llmmem.models.spec import ModelSource

PEERS_DIR = Path(__file__).resolve().parent / ".peers"
MIB = 1024**2

# the metric names of bench/calibration.py
ALLOCATED = "max_memory_allocated"
RESERVED = "max_memory_reserved"
DEVICE = "nvml_used"


@dataclass(frozen=True)
class Peer:
    name: str
    requirements: tuple[str, ...]


FITCHECK = Peer("fitcheck-llm 0.3.1", ("fitcheck-llm==0.3.1",))
PREFLIGHT = Peer("torch-preflight 0.5.0", ("torch-preflight[hub]==0.5.0",))
ACCELERATE = Peer("accelerate estimate-memory", ("accelerate==1.15.0", "transformers==5.24.0"))
PEERS = (FITCHECK, PREFLIGHT, ACCELERATE)


@dataclass(frozen=True)
class Answer:
    predicted_bytes: int
    figure: str  # which of the peer's figures was compared: a key of FIGURES


# the one-letter tags the tables print after a peer's error
FIGURES = {
    "T": "tensors only (no context, no allocator slack)",
    "R": "total less the CUDA context (tensors + allocator share)",
    "D": "device total (what nvidia-smi shows)",
}


class PeerUnavailable(Exception):
    """The peer could not be installed here; the message says why."""


class Refused(Exception):
    """The peer refuses the row by a rule of its own; the message is its reason."""


class Unanswered(Exception):
    """The peer gives no answer: no option expresses the row, it has no figure for the row's
    metric, or it fails on the model's config; the message says which."""


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


def write_hub_cache(model_ids: set[str], hub_home: Path) -> None:
    """Each model's config from the bundled catalog, laid out as a Hugging Face Hub cache
    (`hub/models--org--name/snapshots/<rev>/config.json`), so that `hf_hub_download` finds it
    offline."""
    for model_id in model_ids:
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


def _first_sentence(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else "no output"
    line = line.removeprefix("Error: ")
    cut = line.find(". ")
    return (line[: cut + 1] if cut > 0 else line)[:160]


def checkpoint_params(model_id: str) -> int:
    """The parameter count of the checkpoint as the Hub's safetensors metadata gives it: each
    stored tensor once (a tied head is the embedding)."""
    entry = catalog_entry(model_id)
    if entry is None:
        raise Unanswered(f"{model_id} is not in llmmem's catalog")
    spec = spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)
    return spec.total_params


# --- fitcheck -----------------------------------------------------------------------------------

# The Hub's answer to fitcheck's parameter-count question is the true count (argv[1]); the rest
# of argv is fitcheck's own command line. fitcheck's UnsupportedModelError is a refusal by its
# own rules ("it is the model that is refused"); everything else runs as its CLI does. The CUDA
# context of the overhead profile its estimate used comes back beside its JSON report.
FITCHECK_DRIVER = """
import contextlib, io, json, sys
from fitcheck import config_parser
true_count = int(sys.argv[1])
config_parser._reported_param_count = lambda model_id, token: true_count
args = sys.argv[2:]
try:
    config_parser.fetch_model_config(args[0])
except config_parser.UnsupportedModelError as error:
    print(json.dumps({"refused": str(error)}))
    raise SystemExit(0)
except Exception:
    pass  # the CLI reports it as it would
from fitcheck.cli import main
from fitcheck.gpu_db import GpuSpec, gpu_key_for
from fitcheck.overhead_db import DEFAULT_OVERHEAD_PROFILE, get_overhead_profile
out, err = io.StringIO(), io.StringIO()
code = 0
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        main(args=args, prog_name="fitcheck")
    except SystemExit as exit:
        code = exit.code
answer = {"exit": code, "stderr": err.getvalue()}
try:
    report = json.loads(out.getvalue())
except json.JSONDecodeError:
    report = None
if report is not None:
    training = report["training"]
    profile = get_overhead_profile(
        gpu_key_for(GpuSpec(**report["gpu"])), training["flash_attn"], training["quantization"]
    )
    if profile.uses_hump_form and not training["grad_checkpoint"]:
        profile = DEFAULT_OVERHEAD_PROFILE  # as memory/overhead.py falls back without humps
    answer["report"] = report
    answer["context_mib"] = profile.base_context_mib
print(json.dumps(answer))
"""

FITCHECK_OPTIMIZERS = {
    "adamw_torch": "adamw",
    "adamw_hf": "adamw",
    "adamw_bnb_8bit": "adam8bit",
    "adamw_8bit": "adam8bit",  # the HF Trainer's alias of adamw_bnb_8bit
    # the same 8 B of fp32 states per trainable parameter; fitcheck has no paging
    "paged_adamw_32bit": "adamw",
}
# llmmem's GPU names -> fitcheck's database keys (a card it lacks gets --vram-mib)
FITCHECK_GPUS = {
    "A100-80GB": "a100-80",
    "A100-40GB": "a100-40",
    "L40S": "l40s",
    "V100-16GB": "v100-16",
    "RTX-3090": "3090",
    "RTX-4090": "4090",
    "T4": "t4",
}
FITCHECK_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _row_lora_targets(case: CalibrationCase) -> list[str]:
    """The LoRA targets in the row's own words (q_proj and v_proj for LitGPT's fused qkv)."""
    row = case.row
    if isinstance(row.get("lora"), dict):
        return list(row["lora"]["targets"])
    if row.get("lora_targets"):
        return [t.strip() for t in str(row["lora_targets"]).split(",")]
    return ["q_proj", "v_proj"]  # PEFT's default for these decoders


def fitcheck_answer(root: Path, case: CalibrationCase, hub_home: Path) -> Answer:
    setup = case.setup
    if setup.distributed.world_size > 1:
        raise Unanswered("no multi-GPU or sharding option")
    optimizer = FITCHECK_OPTIMIZERS.get(setup.optim)
    if optimizer is None:
        raise Unanswered(f"no optimizer like {setup.optim}")
    # its --precision is the compute dtype; full fine-tuning at 16 bits adds fp32 master weights
    precision = {Precision.FP32: "fp32", Precision.FP16: "fp16"}.get(setup.precision, "bf16")
    command = [str(case.row["model"]), "--json"]
    command += ["--precision", precision, "--optimizer", optimizer]
    sixteen_bit_states = (Precision.BF16_TRUE, Precision.BF16_AUTOCAST)
    if setup.precision in sixteen_bit_states and setup.method is Method.FULL:
        command += ["--optimizer-dtype", "bf16"]  # torch AdamW's states follow the bf16 weights
    command += ["--batch-size", str(setup.batch), "--seq-len", str(setup.seq)]
    gpu_key = FITCHECK_GPUS.get(case.gpu.name)
    if gpu_key:
        command += ["--gpu", gpu_key]
    else:
        command += ["--vram-mib", str(case.gpu.capacity_bytes // MIB)]
    if setup.grad_ckpt:
        command.append("--grad-checkpoint")
    if setup.attn.value != "eager":
        command.append("--flash-attn")
    if setup.method is Method.FULL:
        command.append("--no-lora")
    else:
        assert setup.lora is not None
        targets = _row_lora_targets(case)
        unknown = [t for t in targets if t not in FITCHECK_TARGETS]
        if unknown:
            raise Unanswered(f"no LoRA target like {', '.join(unknown)}")
        command += ["--lora-r", str(setup.lora.r), "--lora-targets", ",".join(targets)]
    if setup.quant is not None:
        command += ["--quant", "nf4" if setup.quant.quant_type.value == "nf4" else "int8"]
        if setup.quant.double_quant:
            command.append("--double-quant")
    true_count = checkpoint_params(str(case.row["model"]))
    python = str(root / "bin" / "python")
    done = _run([python, "-c", FITCHECK_DRIVER, str(true_count), *command], hub_home)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise Unanswered(_first_sentence(done.stderr or done.stdout)) from None
    if "refused" in answer:
        raise Refused(_first_sentence(answer["refused"]))
    if "report" not in answer:
        raise Unanswered(_first_sentence(answer.get("stderr", "")))
    memory = answer["report"]["memory_mib"]
    if case.metric == ALLOCATED:
        return Answer(int((memory["total"] - memory["overhead"]) * MIB), "T")
    if case.metric == RESERVED:
        return Answer(int((memory["total"] - answer["context_mib"]) * MIB), "R")
    return Answer(int(memory["total"] * MIB), "D")


# --- torch-preflight ----------------------------------------------------------------------------

PREFLIGHT_OPTIMIZERS = {
    "adamw_torch": "adamw",
    "adamw_hf": "adamw",
    "adamw_bnb_8bit": "adamw-8bit",
    "adamw_8bit": "adamw-8bit",  # the HF Trainer's alias of adamw_bnb_8bit
    "adafactor": "adafactor",
}
PREFLIGHT_DTYPES = {
    Precision.FP32: "fp32",
    Precision.FP16: "amp",
    Precision.BF16: "amp",
    Precision.BF16_TRUE: "pure-bf16",
    Precision.BF16_AUTOCAST: "pure-bf16",  # bf16 weights; autocast changes no weight term
}
PREFLIGHT_GPUS = {
    "A100-80GB": "a100-80gb",
    "A100-40GB": "a100-40gb",
    "A10G": "a10g",
    "L40S": "l40s",
    "V100-16GB": "v100-16gb",
    "RTX-3090": "rtx3090",
    "RTX-4090": "rtx4090",
    "T4": "t4",
}


def _preflight_sharding(case: CalibrationCase) -> str | None:
    distributed = case.setup.distributed
    if distributed.world_size <= 1:
        return None
    if distributed.fsdp is not None:
        return "ddp" if distributed.fsdp.value == "no_shard" else "zero-3"
    return f"zero-{distributed.zero_stage}" if distributed.zero_stage else "ddp"


def preflight_answer(root: Path, case: CalibrationCase, hub_home: Path) -> Answer:
    setup = case.setup
    if setup.method is not Method.FULL:
        raise Unanswered("no LoRA or quantization option")
    optimizer = PREFLIGHT_OPTIMIZERS.get(setup.optim)
    if optimizer is None:
        raise Unanswered(f"no optimizer like {setup.optim}")
    distributed = setup.distributed
    if distributed.offload_params or distributed.offload_optimizer:
        raise Unanswered("no FSDP CPU offload option")
    dtype = PREFLIGHT_DTYPES.get(setup.precision)
    if dtype is None:
        raise Unanswered(f"no precision like {setup.precision.value}")
    command = [str(root / "bin" / "torch-preflight"), "estimate", "-f", "json", "--online"]
    command += ["--model", str(case.row["model"])]
    command += ["--batch-size", str(setup.batch), "--seq-len", str(setup.seq)]
    command += ["--dtype", dtype, "--optimizer", optimizer]
    gpu = PREFLIGHT_GPUS.get(case.gpu.name)
    command += ["--gpu", gpu] if gpu else ["--gpu-memory", f"{case.gpu.capacity_bytes // MIB}MiB"]
    sharding = _preflight_sharding(case)
    if sharding:
        command += ["--world-size", str(distributed.world_size), "--sharding", sharding]
    if setup.grad_ckpt:
        command.append("--checkpointing")
    if setup.attn.value != "eager":
        command.append("--flash")
    done = _run(command, hub_home)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise Unanswered(_first_sentence(done.stderr or done.stdout)) from None
    if not report.get("resolved") or not report.get("total_bytes"):
        raise Unanswered(str(report.get("model", {}).get("reason") or "model not resolved"))
    total = int(report["total_bytes"])
    breakdown = report["breakdown"]
    if case.metric == ALLOCATED:
        return Answer(total - breakdown["CUDA_context"] - breakdown["fragmentation"], "T")
    if case.metric == RESERVED:
        return Answer(total - breakdown["CUDA_context"], "R")
    return Answer(total, "D")


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


def accelerate_answer(root: Path, case: CalibrationCase, hub_home: Path) -> Answer:
    setup = case.setup
    if setup.method is not Method.FULL:
        raise Unanswered("full fine-tuning only")
    if setup.optim not in ("adamw_torch", "adamw_hf"):
        raise Unanswered(f"Adam only, not {setup.optim}")
    if setup.distributed.world_size > 1:
        raise Unanswered("no multi-GPU or sharding option")
    if case.metric != ALLOCATED:
        raise Unanswered("its one figure is tensors only: none for reserved or nvidia-smi rows")
    model_id = str(case.row["model"])
    if model_id not in _accelerate_sizes:
        config_dir = hub_home / "hub" / ("models--" + model_id.replace("/", "--"))
        config_dir = config_dir / "snapshots" / "local"
        python = str(root / "bin" / "python")
        done = _run([python, "-c", ACCELERATE_STEPS, str(config_dir)], hub_home)
        try:
            _accelerate_sizes[model_id] = json.loads(done.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            _accelerate_sizes[model_id] = _first_sentence(done.stderr or done.stdout)
    sizes = _accelerate_sizes[model_id]
    if isinstance(sizes, str):
        raise Unanswered(sizes)
    # its float16 column is its mixed-precision (16-bit) training; float32 is plain fp32
    return Answer(int(sizes["float32" if setup.precision is Precision.FP32 else "float16"]), "T")


ESTIMATORS: dict[Peer, Callable[[Path, CalibrationCase, Path], Answer]] = {
    FITCHECK: fitcheck_answer,
    PREFLIGHT: preflight_answer,
    ACCELERATE: accelerate_answer,
}

"""Published measured peaks (`../shared/calibration/measured.jsonl`) as llmmem scenarios.

Each row states its configuration in its own words; this module maps those words onto a
ModelSpec and a TrainingSetup and picks the predicted number that matches the row's metric:

- `max_memory_allocated` → the allocated peak;
- `max_memory_reserved` → the reserved peak (allocated + allocator slack);
- `nvml_used` → the device total (reserved + CUDA context).

Nothing here is tuned per row: a row's own metadata (its framework, CUDA version, task head)
selects which modelled behaviour applies.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmmem.budget.result import Budget, GpuTarget, Overhead
from llmmem.budget.setup import (
    AttnImpl,
    DistributedSetup,
    Framework,
    FsdpShard,
    LoraSetup,
    LossImpl,
    Method,
    Precision,
    QuantSetup,
    QuantType,
    TrainingSetup,
)
from llmmem.budget.trl_rules import sft_trainer_on_kbit
from llmmem.gpus import find_gpu
from llmmem.models.architectures import spec_from_config
from llmmem.models.catalog import catalog_entry
from llmmem.models.resolve import ModelResolutionError, resolve_model
from llmmem.models.spec import ModelSource, ModelSpec

REPO = Path(__file__).resolve().parent.parent
CALIBRATION_FILE = REPO.parent / "shared" / "calibration" / "measured.jsonl"
WIDE_CALIBRATION_FILE = REPO.parent / "shared" / "calibration" / "measured-wide.jsonl"
# published peaks nothing here was fitted to, in measured-wide.jsonl's schema (bench/peers.py)
HELD_OUT_FILE = Path(__file__).resolve().parent / "held_out_rows.jsonl"

OPTIMIZER_NAMES = {
    "torch adamw": "adamw_torch",  # torch's CUDA default: the foreach implementation
    "adamw": "adamw_hf",  # the HF Trainer default of the time: transformers' own AdamW loop
    "adafactor": "adafactor",
    "adamw_bnb_8bit": "adamw_bnb_8bit",
}


@dataclass(frozen=True)
class CalibrationCase:
    row: dict[str, Any]
    spec: ModelSpec
    setup: TrainingSetup
    gpu: GpuTarget
    trl_release: str | None = None  # the row's TRL SFTTrainer prepared its k-bit model

    @property
    def row_id(self) -> str:
        return str(self.row["id"])

    @property
    def measured_bytes(self) -> int:
        return int(self.row["measured_bytes"])

    @property
    def metric(self) -> str:
        """The row's metric in measured.jsonl's words (measured-wide.jsonl says it shorter)."""
        metric = str(self.row["metric"])
        return WIDE_METRICS.get(metric, metric)

    def predicted_bytes(self, budget: Budget) -> int:
        metric = self.metric
        if metric == "max_memory_allocated":
            # measured on a GPU, where torch's allocator also holds the cuBLAS workspaces
            workspaces = budget.overheads.get(Overhead.CUBLAS_WORKSPACES)
            return budget.allocated_peak_bytes + (workspaces.bytes if workspaces else 0)
        if metric == "max_memory_reserved":
            return budget.reserved_peak_bytes
        if metric == "nvml_used":
            return budget.device_total_bytes
        raise ValueError(f"row {self.row_id}: unknown metric {metric}")


# measured-wide.jsonl's metric names
WIDE_METRICS = {
    "allocated": "max_memory_allocated",
    "reserved": "max_memory_reserved",
    "nvml": "nvml_used",
}


def load_rows(path: Path = CALIBRATION_FILE) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sequence_classification(spec: ModelSpec, labels: int = 2) -> ModelSpec:
    """The same encoder with a pooler and a classifier instead of the masked-LM head."""
    h = spec.hidden_size
    # the masked-LM head (transform dense + LayerNorm, decoder bias) gives way to a pooler and a
    # classifier
    base = replace(
        spec.params, head=(h * h + h) + (h * labels + labels), norms=spec.params.norms - 2 * h
    )
    return replace(
        spec,
        params=base,
        is_causal_lm=False,
        architecture=spec.architecture.replace("ForMaskedLM", "ForSequenceClassification"),
    )


def _precision(row: dict[str, Any]) -> Precision:
    amp = row.get("amp")
    if row.get("weights_dtype") == "bfloat16" and not amp:
        return Precision.BF16_TRUE
    if amp == "fp16":
        return Precision.FP16
    if amp == "bf16":
        return Precision.BF16
    return Precision.FP32


def _cuda_module_loading(row: dict[str, Any]) -> str:
    """Lazy loading arrived with CUDA 11.7; older setups load every kernel at start."""
    found = re.search(r"CUDA (\d+)\.(\d+)", row.get("metric_note", ""))
    if found and (int(found.group(1)), int(found.group(2))) < (11, 7):
        return "eager"
    return "lazy"


def _torch_version(row: dict[str, Any]) -> str:
    """The torch release a row ran on, from what it states: its own words, else its CUDA.

    The HF docs' BERT runs print CUDA 11.2 and a January 2022 date: torch 1.10, the release of
    that time (torch 2.0 needs CUDA >= 11.7)."""
    source = row.get("source", "")
    stated = re.search(r"torch (\d+\.\d+)", source)
    if stated:
        return stated.group(1)
    if _cuda_module_loading(row) == "eager":
        return "1.10"
    return "2.13"


def _bitsandbytes_version(row: dict[str, Any]) -> str:
    """The bitsandbytes release a k-bit row ran on, where its source says (else today's)."""
    stated = re.search(r"bnb (\d+\.\d+)", row.get("source", ""))
    return stated.group(1) if stated else QuantSetup().bitsandbytes_version


def runs_longest_first(row: dict[str, Any]) -> bool:
    """lit-gpt's scripts before LitGPT's first release (its resource tables of 2023) ran the
    longest sample as the first step (`get_batch(..., longest_seq_ix if iter_num == 0 else
    None)`, finetune/lora.py:212 at 8641822): the peak those rows measured is a first step's,
    with no step before it."""
    return "resource-tables.md" in str(row.get("source", ""))


def case_from_row(row: dict[str, Any]) -> CalibrationCase:
    entry = catalog_entry(row["model"])
    if entry is None:
        raise LookupError(f"row {row['id']}: {row['model']} is not in the bundled catalog")
    spec = spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)
    source = row.get("source", "")
    is_litgpt = "litgpt" in source.lower()
    if is_litgpt and spec.activation in ("gelu_new", "gelu_fast"):
        # litgpt's model code runs tanh-GELU as one fused op, not written out as HF's gelu_new
        spec = replace(spec, activation="gelu_pytorch_tanh")
    if spec.model_type in ("bert", "roberta") and row.get("params") != spec.total_params:
        spec = sequence_classification(spec)
    method = Method(row.get("method", "full"))
    quant = None
    if row.get("quant"):
        method = Method.QLORA
        quant = QuantSetup(
            quant_type=QuantType.NF4,
            double_quant="double" in row["quant"],
            prepare_for_kbit_training=not is_litgpt,
            bitsandbytes_version=_bitsandbytes_version(row),
        )
    lora = None
    if row.get("lora"):
        targets = list(row["lora"]["targets"])
        names = {lin.name for group in spec.blocks for lin in group.linears}
        if not set(targets) <= names:
            # a fused qkv projection carries the q and v adapters
            targets = [n for n in ("query_key_value", "qkv_proj", "Wqkv", "c_attn") if n in names]
        lora = LoraSetup(
            r=row["lora"]["r"],
            alpha=row["lora"].get("alpha", 16),
            targets=targets,
            # litgpt: adapters in the bf16-true model dtype, lora_dropout 0.05 by default
            adapter_bytes=2 if is_litgpt else 4,
            dropout=0.05 if is_litgpt else 0.0,
        )
        if method is Method.FULL:
            method = Method.LORA
    optimizer = OPTIMIZER_NAMES[str(row.get("optimizer", "torch AdamW")).lower()]
    attn = AttnImpl.EAGER if spec.model_type in ("bert", "roberta") else AttnImpl.SDPA
    setup = TrainingSetup(
        method=method,
        batch=int(row["batch"]),
        seq=int(row["seq"]),
        grad_accum=int(row.get("grad_accum") or 1),
        grad_ckpt=bool(row.get("grad_ckpt")),
        precision=_precision(row),
        optim=optimizer,
        attn=attn,
        loss=LossImpl.CHUNKED if is_litgpt else LossImpl.STANDARD,
        lora=lora,
        quant=quant,
        cuda_module_loading=_cuda_module_loading(row),
        torch_version=_torch_version(row),
        framework=Framework.LITGPT if is_litgpt else Framework.HF,
        first_step=runs_longest_first(row),
    )
    gpu_spec = find_gpu(row["gpu"])
    gpu = GpuTarget(name=gpu_spec.name, capacity_bytes=gpu_spec.capacity_bytes, bf16=gpu_spec.bf16)
    return CalibrationCase(row=row, spec=spec, setup=setup, gpu=gpu)


# --- measured-wide.jsonl ------------------------------------------------------------------------
#
# One row per published number, in a flatter schema (see ../shared/calibration/README.md). Each row
# names its stack in `framework`, `source` and `notes`; those words, not the row's error, select
# what applies: the releases it ran on, FlashAttention-2, FSDP and its CPU offload, the quantized
# weights' storage dtype.


class RowSkipped(Exception):
    """A wide row the estimate cannot express yet; the message says what is missing."""


def _stated_release(row: dict[str, Any], library: str) -> str | None:
    """`library`'s "major.minor" where the row's source or notes name it ("torch 2.4.1")."""
    text = f"{row.get('source', '')} {row.get('notes', '')}"
    found = re.search(rf"\b{re.escape(library)} (\d+)\.(\d+)", text)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def _wide_stack(row: dict[str, Any]) -> dict[str, str]:
    """The releases a wide row ran on: as its source states them; for Answer.AI's fsdp_qlora
    runs of February-March 2024, which state none, the releases FSDP-QLoRA needed then:
    bitsandbytes 0.43 (the first with a quant_storage dtype FSDP can shard) on torch 2.2."""
    stack = {"torch": "2.2", "bitsandbytes": "0.43", "transformers": "4.39"}
    trl = _stated_release(row, "trl")
    if trl:
        stack["trl"] = trl
    for library in stack:
        stated = _stated_release(row, library)
        if stated:
            stack[library] = stated
    return stack


def _wide_framework(row: dict[str, Any]) -> Framework:
    framework = str(row.get("framework", "")).lower()
    if framework == "litgpt":
        return Framework.LITGPT
    # a training loop of its own (fsdp_qlora's train.py) is not the HF Trainer
    return Framework.PLAIN if "custom" in framework else Framework.HF


def unmodelled_kernels(row: dict[str, Any]) -> list[str]:
    """What a row states that the budget has no term for: an `attn` kernel outside AttnImpl
    (unsloth trains gpt-oss with flex attention), and `tiled_mlp` (unsloth's
    `unsloth_tiled_mlp`: each MLP run over the sequence in tiles, unsloth_zoo/tiled_mlp.py)."""
    found = []
    attn = row.get("attn")
    if attn is not None and attn not in {kernel.value for kernel in AttnImpl}:
        found.append(f"attention {attn} (sized: {', '.join(k.value for k in AttnImpl)})")
    if row.get("tiled_mlp"):
        found.append("unsloth's tiled MLP (unsloth_tiled_mlp)")
    return found


# DeepSpeed's bf16 options that keep the model's states in 16 bits (PR #7700, DeepSpeed 0.18.3):
# the budget keeps DeepSpeed's fp32 master, fp32 gradient partition and fp32 optimizer states
UNMODELLED_DEEPSPEED_BF16 = ("bf16_master_weights_and_grads", "bf16_optimizer_states")


def unmodelled_deepspeed_settings(row: dict[str, Any]) -> list[str]:
    """DeepSpeed settings a row states that the budget has no term for: `bf16` options that keep
    the master weights, gradients and optimizer states in bf16, and its `torch_autocast`
    section (autocast over DeepSpeed's bf16 model)."""
    found = [name for name in UNMODELLED_DEEPSPEED_BF16 if row.get(name)]
    if row.get("torch_autocast"):
        found.append("DeepSpeed's torch_autocast")
    return found


def _wide_spec(row: dict[str, Any]) -> ModelSpec:
    """The row's model: a config committed under bench/ (`model_config`: a model of the run's
    own code, written as the transformers architecture closest to it, read as
    `llmmem estimate --model <folder>` reads it), else the bundled catalog's."""
    local = row.get("model_config")
    if local:
        try:
            return resolve_model(str(HELD_OUT_FILE.parent / local), hub=False)
        except ModelResolutionError as error:
            raise RowSkipped(str(error)) from None
    entry = catalog_entry(row["model"])
    if entry is None:
        raise RowSkipped(f"unknown model {row['model']} (not in the bundled catalog)")
    try:
        return spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)
    except ValueError as error:
        raise RowSkipped(f"{row['model']}: {error}") from None


def _zero_buckets(row: dict[str, Any]) -> dict[str, Any]:
    """The ZeRO settings a DeepSpeed row's config states (DeepSpeed's own key names); the
    others keep DistributedSetup's defaults, which are DeepSpeed's."""
    stated: dict[str, Any] = {}
    if "reduce_bucket_size" in row:
        stated["reduce_bucket_size"] = int(row["reduce_bucket_size"])
    if "stage3_param_persistence_threshold" in row:
        stated["param_persistence_threshold"] = int(row["stage3_param_persistence_threshold"])
    if "stage3_prefetch_bucket_size" in row:
        stated["prefetch_bucket_size"] = int(row["stage3_prefetch_bucket_size"])
    if "overlap_comm" in row:
        stated["overlap_comm"] = bool(row["overlap_comm"])
    return stated


def wide_case_from_row(row: dict[str, Any]) -> CalibrationCase:
    """A measured-wide.jsonl row as a scenario; RowSkipped where it cannot be expressed."""
    if not row.get("metric"):
        raise RowSkipped("no metric: a slope-only row")
    unmodelled_settings = unmodelled_deepspeed_settings(row)
    if unmodelled_settings:
        *rest, last = unmodelled_settings
        named = f"{', '.join(rest)} and {last}" if rest else last
        verb = "are" if rest else "is"
        raise RowSkipped(
            f"{named} {verb} not modelled (the budget keeps DeepSpeed's fp32 master, gradient "
            "partition and optimizer states)"
        )
    spec = _wide_spec(row)
    notes = str(row.get("notes", ""))
    targets = row.get("lora_targets")
    target_names = [t.strip() for t in targets.split(",")] if targets else None
    if target_names and "lm_head" in target_names:
        raise RowSkipped("LoRA on the output head (lm_head) is not modelled")
    unmodelled = unmodelled_kernels(row)
    if unmodelled:
        verb = "are" if len(unmodelled) > 1 else "is"
        raise RowSkipped(f"{' and '.join(unmodelled)} {verb} not modelled")
    # LitGPT's own model code and training loop (held-out rows; no row of measured-wide.jsonl)
    is_litgpt = str(row.get("framework", "")).lower() == "litgpt"
    if is_litgpt and spec.activation in ("gelu_new", "gelu_fast"):
        # litgpt's model code runs tanh-GELU as one fused op, not written out as HF's gelu_new
        spec = replace(spec, activation="gelu_pytorch_tanh")
    stack = _wide_stack(row)
    world = int(row.get("world_size") or 1)
    # a DeepSpeed run states its ZeRO stage; any other multi-GPU row is FSDP
    zero_stage = int(row.get("zero_stage") or 0)
    replica = world > 1 and "NO_SHARD" in notes  # FSDP-wrapped, a whole replica per GPU
    sharded = world > 1 and not replica and not zero_stage
    cpu_offload = "CPU Offload True" in notes or "offload_params=True" in notes
    method = Method(row["method"])
    # FSDP-QLoRA: bnb_4bit_quant_storage in a float dtype, which FSDP shards like the others
    storage = "bfloat16" if re.search(r"quant_storage[ =]+(bfloat16|bf16)", notes) else "uint8"
    # a model FSDP flattens must hold one dtype per unit (FSDP1, accelerate 1.0): the stacks
    # that shard a QLoRA model leave it in bf16 — TRL 0.13 skips prepare_model_for_kbit_training
    # and asks peft for bf16 adapters (autocast_adapter_dtype=False); fsdp_qlora loads it so
    sharded_kbit = (sharded or replica) and storage != "uint8"  # FSDP-wrapped either way
    quant = None
    if method is Method.QLORA:
        quant = QuantSetup(
            quant_type=QuantType(row.get("quant") or "nf4"),
            double_quant=bool(row.get("double_quant")),
            bitsandbytes_version=stack["bitsandbytes"],
            quant_storage=storage,
            # LitGPT quantizes through its Fabric plugin and prepares nothing
            prepare_for_kbit_training=not sharded_kbit and not is_litgpt,
        )
    lora = None
    if method in (Method.LORA, Method.QLORA):
        dropout = re.search(r"[Dd]ropout (0\.\d+)", notes)
        if is_litgpt and target_names:
            names = {lin.name for group in spec.blocks for lin in group.linears}
            if not set(target_names) <= names:
                # a fused qkv projection carries the q and v adapters
                fused = ("query_key_value", "qkv_proj", "Wqkv", "c_attn")
                target_names = [n for n in fused if n in names]
        lora = LoraSetup(
            r=int(row["lora_r"]),
            alpha=float(row.get("lora_alpha") or 16),
            targets=target_names,
            dropout=float(dropout.group(1)) if dropout else 0.0,
            # litgpt: adapters in the bf16-true model dtype
            adapter_bytes=2 if sharded_kbit or is_litgpt else 4,
        )
    attn = AttnImpl.FLASH_ATTENTION_2 if "FA2" in notes else AttnImpl.SDPA
    setup = TrainingSetup(
        method=method,
        batch=int(row["batch"]),
        seq=int(row["seq"]),
        grad_accum=int(row.get("grad_accum") or 1),
        grad_ckpt=bool(row.get("grad_ckpt")),
        precision=Precision(row.get("precision") or "bf16"),
        optim=str(row.get("optim") or "adamw_torch"),
        attn=attn,
        loss=LossImpl.CHUNKED if is_litgpt else LossImpl.STANDARD,
        lora=lora,
        quant=quant,
        distributed=DistributedSetup(
            world_size=world,
            zero_stage=zero_stage,
            fsdp=FsdpShard.FULL_SHARD if sharded else FsdpShard.NO_SHARD if replica else None,
            offload_params=cpu_offload,
            offload_optimizer=cpu_offload,
            **_zero_buckets(row),
        ),
        torch_version=stack["torch"],
        transformers_version=stack["transformers"],
        framework=_wide_framework(row),
        first_step=runs_longest_first(row),
        # unsloth's loss follows its release (llmmem.budget.stacks.unsloth `loss_of_release`)
        unsloth_version=str(row["unsloth_release"]) if row.get("unsloth_release") else None,
    )
    trl_release = None
    if "trl" in stack and "trl" in str(row.get("framework", "")).lower():
        # TRL's SFTTrainer prepares the k-bit model as its release does
        setup, _ = sft_trainer_on_kbit(setup, stack["trl"], sharded=sharded_kbit)
        trl_release = stack["trl"]
    gpu_spec = find_gpu(row["gpu"])
    gpu = GpuTarget(name=gpu_spec.name, capacity_bytes=gpu_spec.capacity_bytes, bf16=gpu_spec.bf16)
    return CalibrationCase(row=row, spec=spec, setup=setup, gpu=gpu, trl_release=trl_release)


def wide_class(case: CalibrationCase) -> str:
    """The row's class: method × metric × sharding."""
    d = case.setup.distributed
    sharding = f"ZeRO-{d.zero_stage}" if d.zero_stage else "FSDP" if d.world_size > 1 else "1 GPU"
    return f"{case.setup.method.value} {case.row['metric']} {sharding}"


def estimate_flags(case: CalibrationCase) -> list[str]:
    """The `llmmem estimate` command line that expresses a row: the same setup, flag by flag."""
    s = case.setup
    flags = [
        "--model", str(case.row["model"]),
        "--method", s.method.value,
        "--batch", str(s.batch),
        "--seq", str(s.seq),
        "--grad-accum", str(s.grad_accum),
        "--grad-ckpt" if s.grad_ckpt else "--no-grad-ckpt",
        "--precision", s.precision.value,
        "--optim", s.optim,
        "--attn", s.attn.value,
        "--loss", s.loss.value,
        "--framework", "trl" if case.trl_release else s.framework.value,
        "--gpu", case.gpu.name,
    ]  # fmt: skip
    trl = case.trl_release
    if s.lora is not None:
        flags += ["--lora-r", str(s.lora.r), "--lora-alpha", f"{s.lora.alpha:g}"]
        if s.lora.targets:
            flags += ["--lora-targets", ",".join(s.lora.targets)]
        if s.lora.dropout:
            flags += ["--lora-dropout", f"{s.lora.dropout:g}"]
        if s.lora.adapter_bytes == 2 and not (trl and s.quant is not None):
            flags += ["--adapter-dtype", "bf16"]
    versions = [f"torch={s.torch_version}", f"transformers={s.transformers_version}"]
    if s.quant is not None:
        flags += ["--quant", s.quant.quant_type.value, "--quant-storage", s.quant.quant_storage]
        if s.quant.double_quant:
            flags.append("--double-quant")
        if not s.quant.prepare_for_kbit_training and not trl:
            flags.append("--no-kbit-prepare")  # with --framework trl, TRL's release decides
        versions.append(f"bitsandbytes={s.quant.bitsandbytes_version}")
    if trl:
        versions.append(f"trl={trl}")
    d = s.distributed
    if d.world_size > 1:
        flags += ["--world-size", str(d.world_size)]
    if d.fsdp is not None:
        flags += ["--fsdp", d.fsdp.value]
    if d.zero_stage:
        flags += ["--zero", str(d.zero_stage)]
    if d.offload_params and d.offload_optimizer:
        flags += ["--offload", "all"]
    elif d.offload_params:
        flags += ["--offload", "params"]
    elif d.offload_optimizer:
        flags += ["--offload", "optimizer"]
    return flags + ["--versions", ",".join(versions)]

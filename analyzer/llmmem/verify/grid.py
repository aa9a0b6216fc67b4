"""The accounting core against the simulator, over a grid of setups.

For each architecture, full fine-tuning and LoRA, gradient checkpointing off and on, two
micro-batches, two sequence lengths, pure bf16 and AMP (bf16 autocast over fp32 weights): the
core's allocated peak of each phase next to the simulated one. Small configs (structurally
faithful, a few MB each) run in the tests; `bench/simulated_grid.py` runs real sizes; medium
configs (the small ones at a real model's proportions, ~100M parameters) are for real CPU steps.

    python -m llmmem.verify.grid [--size small|medium|real] [--family llama ...]
                                 [--device fake|cpu|cuda] [--fsdp RANKS] [--qlora]
                                 [--model ID ...] [--method full|lora|qlora ...]
                                 [--attn sdpa|eager ...] [--shape BxS ...] [--json PATH]

`--device cuda` runs the same grid as real steps on a GPU: per phase `max_memory_allocated`,
and what NVML (nvidia-smi) shows as the phase ends; the caching allocator's reserved peak over
the step. Each case starts from an emptied cache, so its reserved and NVML figures are its own.
`--device cpu` as real CPU steps (small and medium configs).

`--model` takes catalog models at their real size instead of the families (`--model
Qwen/Qwen2.5-0.5B --model meta-llama/Llama-3.2-1B`), with the methods, attention
implementations and shapes asked for; `--json` writes every case's predicted and measured
figures (allocated per phase, reserved, on the device, and the overhead terms).

`--qlora` runs QLoRA instead (NF4 with double quantization, prepared for k-bit training, LoRA,
bitsandbytes' paged 8-bit AdamW): bitsandbytes kernels do not run on fake tensors, so these are
real steps, on the CPU (`--device cpu`; `bench/qlora_grid.py`) or a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmmem.budget.phases import estimate_budget
from llmmem.budget.setup import (
    AttnImpl,
    DistributedSetup,
    FsdpShard,
    LoraSetup,
    Method,
    Packing,
    Precision,
    QuantSetup,
    TrainingSetup,
)
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.compare import request_for

# LoRA on the query and value projections, as each family names them
LORA_TARGETS = {
    "llama": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
    "gemma2": ["q_proj", "v_proj"],
    "phi3": ["qkv_proj"],
    "gpt2": ["c_attn"],
    "mixtral": ["q_proj", "v_proj"],
}

# small configs: every structural feature of the family, at a size the CPU simulates in ~1 s
SMALL_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
    "gemma2": {
        "model_type": "gemma2",
        "architectures": ["Gemma2ForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 4096,
        "max_position_embeddings": 2048,
        "sliding_window": 128,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 64,
    },
    "phi3": {
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 4096,
        "max_position_embeddings": 2048,
        "original_max_position_embeddings": 2048,
        "sliding_window": 2047,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
    },
    "gpt2": {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": 256,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 1024,
        "vocab_size": 4096,
        "attn_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
    },
    "mixtral": {
        "model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
}

SMALL_SHAPES = ((1, 128), (2, 256))  # (micro-batch, sequence)
MEDIUM_SHAPES = ((1, 512),)
REAL_SHAPES = ((1, 512), (2, 2048))
SHAPES = {"small": SMALL_SHAPES, "medium": MEDIUM_SHAPES, "real": REAL_SHAPES}

# medium configs: the small ones at a real model's proportions (vocabulary 11× the MLP width, as
# in Llama-2-7B), ~100M parameters: a real CPU step takes seconds
MEDIUM_SIZES = {
    "hidden_size": 1024,
    "n_embd": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "n_layer": 4,
    "num_attention_heads": 8,
    "n_head": 8,
    "head_dim": 128,
    "vocab_size": 32000,
}
REAL_MODELS = {
    "llama": "meta-llama/Llama-3.1-8B",
    "qwen2": "Qwen/Qwen2.5-7B",
    "gemma2": "google/gemma-2-9b",
    "phi3": "microsoft/Phi-3-mini-4k-instruct",
    "gpt2": "openai-community/gpt2-medium",
    "mixtral": "mistralai/Mixtral-8x7B-v0.1",
}


@dataclass(frozen=True)
class GridCase:
    family: str
    method: str  # "full" | "lora" | "qlora"
    grad_ckpt: bool
    batch: int
    seq: int
    precision: str  # "bf16-true" | "bf16"
    fsdp_ranks: int = 1  # > 1: FSDP full_shard over this many ranks (rank 0's memory)
    attn: str = "sdpa"
    model: str | None = None  # a catalog model at its real size, instead of the family's config
    packing: str | None = None  # "flat" or "rows": packed samples (see budget.setup.Packing)
    offload: bool = False  # activation offloading (TRL's OffloadActivations rules)
    # how the measured step offloads: "all", "dedupe" (verify.offload's emulation of TRL's
    # rules) or "trl" (TRL's own OffloadActivations, where trl is installed); None: what
    # `llmmem verify` runs for the plan
    offload_mode: str | None = None
    compile: bool = False  # the model runs under torch.compile (measured on CUDA only)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> GridCase:
        """A case as `--json` wrote it."""
        return cls(
            row["family"],
            row["method"],
            row["grad_ckpt"],
            row["batch"],
            row["seq"],
            row["precision"],
            1,
            row.get("attn", "sdpa"),
            row.get("model"),
            row.get("packing"),
            bool(row.get("offload", False)),
            row.get("offload_mode"),
            bool(row.get("compile", False)),
        )

    @property
    def measures_the_estimate(self) -> bool:
        """Whether a measurement of this case is held to the estimate itself: not under
        activation offloading or torch.compile (the estimate is the top of their band, the
        measurement lands inside it), nor a flat packed row of one sample (measured on
        2026-11-26 before the runner cut such a row in two: it packed nothing)."""
        one_sample = self.packing == "flat" and self.batch == 1
        return not (self.offload or self.compile or one_sample)

    @property
    def name(self) -> str:
        ckpt = "ckpt" if self.grad_ckpt else "nockpt"
        fsdp = f"-fsdp{self.fsdp_ranks}" if self.fsdp_ranks > 1 else ""
        attn = f"-{self.attn}" if self.attn != "sdpa" else ""
        who = self.model.split("/")[-1] if self.model else self.family
        packed = f"-packed-{self.packing}" if self.packing else ""
        packed += "-offload" if self.offload else ""
        packed += f"-{self.offload_mode}" if self.offload and self.offload_mode else ""
        packed += "-compile" if self.compile else ""
        return (
            f"{who}-{self.method}-{ckpt}-b{self.batch}-s{self.seq}-{self.precision}{fsdp}{attn}"
            f"{packed}"
        )


@dataclass
class GridResult:
    case: GridCase
    predicted: dict[str, int]  # phase -> allocated bytes
    simulated: dict[str, int]
    error: str | None = None
    seconds: float = 0.0
    measurement: dict[str, Any] | None = None  # the step's whole StepMeasurement, as JSON
    predicted_totals: dict[str, Any] | None = None  # reserved, on the device, overhead terms

    @property
    def worst(self) -> float:
        """The largest |predicted − simulated| / simulated over the phases."""
        return max(
            (
                abs(self.predicted[phase] - got) / got
                for phase, got in self.simulated.items()
                if got and phase in self.predicted
            ),
            default=0.0,
        )

    @property
    def peak_error(self) -> float:
        simulated = max(self.simulated.values(), default=0)
        if not simulated:
            return 0.0
        return (max(self.predicted.values()) - simulated) / simulated


def cases(
    families: list[str], shapes: tuple[tuple[int, int], ...], fsdp_ranks: int = 1
) -> list[GridCase]:
    out = []
    for family, method, ckpt, (batch, seq), precision in itertools.product(
        families, ("full", "lora"), (False, True), shapes, ("bf16-true", "bf16")
    ):
        if family == "mixtral" and precision == "bf16":
            # the grouped expert kernel takes bf16 inputs only: under fp32-weight AMP the step
            # fails (in simulation as on a GPU); AMP MoE training runs with bf16 experts
            continue
        out.append(GridCase(family, method, ckpt, batch, seq, precision, fsdp_ranks))
    return out


def qlora_cases(families: list[str], shapes: tuple[tuple[int, int], ...]) -> list[GridCase]:
    """QLoRA over the families whose blocks bitsandbytes quantizes (MoE experts stay 3-D
    tensors it does not replace, and their grouped kernel refuses fp32 under autocast)."""
    return [
        GridCase(family, "qlora", ckpt, batch, seq, precision)
        for family, ckpt, (batch, seq), precision in itertools.product(
            families, (False, True), shapes, ("bf16-true", "bf16")
        )
        if family != "mixtral"
    ]


def model_cases(
    models: list[str],
    methods: list[str],
    attns: list[str],
    shapes: tuple[tuple[int, int], ...],
) -> list[GridCase]:
    """Catalog models at their real size: LoRA and full fine-tuning in pure bf16, QLoRA under
    bf16 autocast (as the scripts people write run them), checkpointing off and on."""
    out = []
    for model, method, attn, ckpt, (batch, seq) in itertools.product(
        models, methods, attns, (False, True), shapes
    ):
        precision = "bf16" if method == "qlora" else "bf16-true"
        out.append(GridCase(family_of(model), method, ckpt, batch, seq, precision, 1, attn, model))
    return out


def family_of(model: str) -> str:
    """The grid family (LoRA targets) of a catalog model, from its config's model_type."""
    from llmmem.models.catalog import catalog_entry

    entry = catalog_entry(model)
    if entry is None:
        raise KeyError(f"{model} is not in the bundled catalog")
    model_type = str(entry.config.get("model_type"))
    if model_type not in LORA_TARGETS:
        raise KeyError(f"{model} ({model_type}) has no LoRA targets in the grid")
    return model_type


def config_for(family: str, size: str, model: str | None = None) -> dict[str, Any]:
    if model is not None:
        from llmmem.models.catalog import catalog_entry

        entry = catalog_entry(model)
        if entry is None:
            raise KeyError(f"{model} is not in the bundled catalog")
        return dict(entry.config)
    if size == "small":
        return dict(SMALL_CONFIGS[family])
    if size == "medium":
        config = dict(SMALL_CONFIGS[family])
        config.update({k: v for k, v in MEDIUM_SIZES.items() if k in config})
        if "num_key_value_heads" in config:
            # grouped as the family groups them: Phi-3 has a K/V head per query head
            grouped = config["num_key_value_heads"] < SMALL_CONFIGS[family]["num_attention_heads"]
            config["num_key_value_heads"] = 2 if grouped else config["num_attention_heads"]
        return config
    from llmmem.models.catalog import catalog_entry

    entry = catalog_entry(REAL_MODELS[family])
    if entry is None:
        raise KeyError(f"{REAL_MODELS[family]} is not in the bundled catalog")
    return dict(entry.config)


def setup_for(case: GridCase) -> TrainingSetup:
    qlora = case.method == "qlora"
    return TrainingSetup(
        method=Method(case.method),
        lora=LoraSetup(r=16, alpha=32, targets=LORA_TARGETS[case.family])
        if case.method != "full"
        else None,
        quant=QuantSetup(double_quant=True) if qlora else None,
        batch=case.batch,
        seq=case.seq,
        grad_ckpt=case.grad_ckpt,
        precision=Precision(case.precision),
        optim="paged_adamw_8bit" if qlora else "adamw_torch",
        distributed=DistributedSetup(world_size=case.fsdp_ranks, fsdp=FsdpShard.FULL_SHARD)
        if case.fsdp_ranks > 1
        else DistributedSetup(),
        attn=AttnImpl(case.attn),
        packing=Packing(case.packing) if case.packing else None,
        activation_offload=case.offload,
        compile=case.compile,
    )


def predict_case(case: GridCase, config: dict[str, Any], model_id: str) -> dict[str, Any]:
    """The core's figures for a case: allocated per phase, and the totals with their terms."""
    spec = spec_from_config(config, model_id=model_id, source=ModelSource.LOCAL)
    setup = setup_for(case)
    budget = estimate_budget(spec, setup, None, with_first_step=False)
    floor: dict[str, Any] | None = None
    if budget.band_floor is not None:
        # the lowest a real run can reach: every saved tensor on the host (offloading), or
        # the checkpointed step (torch.compile), with its allocated peak beside the total
        low = (
            estimate_budget(spec, setup, None, with_first_step=False, offloaded=True)
            if case.offload
            else estimate_budget(
                spec,
                replace(setup, grad_ckpt=True, activation_offload=False),
                None,
                with_first_step=False,
            )
        )
        floor = {
            "allocated_peak_bytes": min(low.allocated_peak_bytes, budget.allocated_peak_bytes),
            "device_total_bytes": budget.band_floor[0],
            "why": budget.band_floor[1],
        }
    return {
        "phases": {phase.phase.value: phase.allocated_bytes for phase in budget.phases},
        "totals": {
            "allocated_peak_bytes": budget.allocated_peak_bytes,
            "reserved_peak_bytes": budget.reserved_peak_bytes,
            "device_total_bytes": budget.device_total_bytes,
            "floor": floor,
            "overheads": {
                name.value: {"bytes": term.bytes, "formula": term.formula}
                for name, term in budget.overheads.items()
            },
        },
    }


def run_case(
    case: GridCase, config: dict[str, Any], model_id: str = "grid", device: str = "fake"
) -> GridResult:
    from llmmem.verify.runner import run_step

    spec = spec_from_config(config, model_id=model_id, source=ModelSource.LOCAL)
    prediction = predict_case(case, config, model_id)
    started = time.monotonic()
    if device == "cuda":
        _empty_cuda_cache()
    request = request_for(spec, setup_for(case), config, device)
    if case.offload and case.offload_mode:
        request.activation_offload = case.offload_mode
    request.compile = case.compile
    measured = run_step(request)
    seconds = round(time.monotonic() - started, 2)
    if device == "cuda":
        _empty_cuda_cache()
    simulated = {phase.phase: phase.peak_bytes for phase in measured.phases}
    error = measured.error
    if measured.oom is not None:
        error = f"out of memory in {measured.oom.get('phase')}"
    return GridResult(
        case,
        prediction["phases"],
        simulated,
        error,
        seconds,
        measured.to_json(),
        prediction["totals"],
    )


def measured_cases(
    paths: list[Path],
) -> Iterator[tuple[Path, GridCase, dict[str, Any], dict[str, Any]]]:
    """(file, case, the model's config, the measurement) for each case of `--json` files whose
    phases were measured (a case that failed or ran out of memory is left out)."""
    for path in paths:
        for row in json.loads(path.read_text(encoding="utf-8")):
            measurement = row.get("measurement") or {}
            if row.get("error") or not measurement.get("phases"):
                continue
            case = GridCase.from_json(row)
            yield path, case, config_for(case.family, "real", case.model), measurement


def _empty_cuda_cache() -> None:
    """Give the last case's cached segments back, so the next one's reserved peak and NVML
    figure are its own."""
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def results_json(results: list[GridResult]) -> list[dict[str, Any]]:
    return [
        {
            "case": r.case.name,
            "model": r.case.model,
            "family": r.case.family,
            "method": r.case.method,
            "grad_ckpt": r.case.grad_ckpt,
            "batch": r.case.batch,
            "seq": r.case.seq,
            "precision": r.case.precision,
            "attn": r.case.attn,
            "packing": r.case.packing,
            "offload": r.case.offload,
            "offload_mode": r.case.offload_mode,
            "compile": r.case.compile,
            "predicted_allocated_bytes": r.predicted,
            "measured_allocated_bytes": r.simulated,
            "predicted": r.predicted_totals,
            "measurement": r.measurement,
            "error": r.error,
            "seconds": r.seconds,
        }
        for r in results
    ]


def table(results: list[GridResult]) -> str:
    lines = [
        f"{'case':<50} {'fwd':>7} {'bwd':>7} {'step':>7} {'peak':>7} {'measured':>10}  s",
        "-" * 98,
    ]
    for r in results:
        if r.error:
            lines.append(f"{r.case.name:<50} error: {r.error}")
            continue
        cells = []
        for phase in ("forward", "backward", "optimizer_step"):
            got = r.simulated.get(phase)
            want = r.predicted.get(phase)
            cells.append(f"{100 * (want - got) / got:+6.1f}%" if got and want else "      —")
        sim = max(r.simulated.values())
        lines.append(
            f"{r.case.name:<50} {' '.join(cells)} {100 * r.peak_error:+6.1f}% "
            f"{sim / 2**20:8.1f}Mi {r.seconds:4.1f}"
        )
    ok = [r for r in results if not r.error]
    if ok:
        errors = sorted(abs(r.peak_error) for r in ok)
        within = sum(r.worst <= 0.05 for r in ok)
        lines.append("-" * 98)
        lines.append(
            f"{len(ok)} cases: peak |error| median {100 * errors[len(errors) // 2]:.1f}%, "
            f"max {100 * errors[-1]:.1f}%; every phase within 5% in {within}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    # the preference, GRPO and PPO grids have their own steps and options
    if "--preference" in args_in:
        from llmmem.verify.preference_grid import main as preference_main

        return preference_main([a for a in args_in if a != "--preference"])
    if "--grpo" in args_in:
        from llmmem.verify.grpo_grid import main as grpo_main

        return grpo_main([a for a in args_in if a != "--grpo"])
    if "--ppo" in args_in:
        from llmmem.verify.ppo_grid import main as ppo_main

        return ppo_main([a for a in args_in if a != "--ppo"])
    argv = args_in
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "medium", "real"], default="small")
    parser.add_argument("--family", action="append", choices=sorted(SMALL_CONFIGS))
    parser.add_argument(
        "--device",
        choices=["fake", "cpu", "cuda"],
        default="fake",
        help="fake: simulated (default); cpu: real steps (small configs); cuda: real steps on "
        "the GPU, max_memory_allocated per phase",
    )
    parser.add_argument(
        "--qlora",
        action="store_true",
        help="QLoRA cases instead (real steps: --device cpu with small configs, or cuda)",
    )
    parser.add_argument(
        "--fsdp",
        type=int,
        default=1,
        metavar="RANKS",
        help="FSDP full_shard over RANKS ranks (simulated: rank 0 alone in a fake group)",
    )
    parser.add_argument(
        "--model", action="append", metavar="ID", help="a catalog model at its real size"
    )
    parser.add_argument(
        "--method", action="append", choices=["full", "lora", "qlora"], help="with --model"
    )
    parser.add_argument("--attn", action="append", choices=["sdpa", "eager"], help="with --model")
    parser.add_argument(
        "--shape", action="append", metavar="BxS", help="micro-batch x sequence, e.g. 2x2048"
    )
    parser.add_argument(
        "--packed",
        action="append",
        choices=["flat", "rows"],
        help="with --model: packed samples, position ids restarting per sample",
    )
    parser.add_argument(
        "--offload",
        action="append",
        choices=["all", "dedupe", "trl"],
        help="with --model: activation offloading, by the emulation of TRL's rules (all, "
        "dedupe) or by TRL's own OffloadActivations (trl, where trl is installed)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="with --model --device cuda: the model runs under torch.compile",
    )
    parser.add_argument("--json", metavar="PATH", help="write every case's figures here")
    args = parser.parse_args(argv)
    if (args.packed or args.offload or args.compile) and not args.model:
        parser.error("--packed, --offload and --compile go with --model")
    if args.compile and args.device != "cuda":
        parser.error("torch.compile is measured on a GPU: --compile needs --device cuda")
    families = args.family or list(SMALL_CONFIGS)
    shapes = SHAPES[args.size]
    if args.shape:
        try:
            shapes = tuple(
                (int(b), int(s_)) for b, s_ in (shape.lower().split("x") for shape in args.shape)
            )
        except ValueError:
            parser.error("--shape takes BATCHxSEQUENCE, e.g. 2x2048")
    methods = args.method or ["lora"]
    if (args.qlora or "qlora" in methods and args.model) and args.device == "fake":
        parser.error("QLoRA steps run bitsandbytes kernels: use --device cpu (or cuda)")
    ranks = max(1, args.fsdp)
    if args.model:
        try:
            grid = model_cases(args.model, methods, args.attn or ["sdpa"], shapes)
        except KeyError as err:
            parser.error(str(err.args[0]))
        grid = [
            replace(
                case,
                packing=packing,
                offload=offload is not None,
                offload_mode=offload,
                compile=args.compile,
            )
            for case in grid
            for packing in args.packed or [None]
            for offload in args.offload or [None]
        ]
    elif args.qlora:
        grid = qlora_cases(families, shapes)
    else:
        grid = cases(families, shapes, ranks)
    results = []
    for case in grid:
        config = config_for(case.family, args.size, case.model)
        model_id = case.model or (REAL_MODELS[case.family] if args.size == "real" else case.family)
        results.append(run_case(case, config, model_id, args.device))
        print(table(results[-1:]).splitlines()[2], flush=True, file=sys.stderr)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            with open(args.json, "w", encoding="utf-8") as out:
                json.dump(results_json(results), out, indent=1)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

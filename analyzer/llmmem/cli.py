"""`llmmem`: the command line.

Exit codes: 0 done, 2 bad input (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from llmmem.errors import EXIT_USAGE, OneLineParser, non_empty, run_entry_point

EXIT_OK = 0


def _positive_int(text: str) -> int:
    """A count from 1 to 10**9, in ASCII digits (see `llmmem.extract.numbers`)."""
    from llmmem.extract.numbers import parse_count

    try:
        return parse_count(text)
    except ValueError as err:  # the message names the value (cut when long) and the bound
        raise argparse.ArgumentTypeError(str(err)) from None


def _bounded_int(text: str) -> int:
    """A whole number up to 10**9; below 1 is left to the setup's own check and message."""
    from llmmem.extract.numbers import MAX_COUNT, shown

    try:
        value = int(text) if len(text) <= 40 else None
    except ValueError:
        value = None
    if value is None:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{shown(text)}'")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT:,}, got {shown(text)}")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text[:24]}'") from None
    if not 0 < value <= 10**9:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 10**9, got {text[:24]}")
    return value


def _probability(text: str) -> float:
    """A dropout probability: 0 is one (no dropout, where a framework's default has one); the
    setup refuses 1 or more in one line of its own."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text[:24]}'") from None
    if not 0 <= value <= 10**9:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text[:24]}")
    return value


def _add_estimate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "estimate",
        help="memory of one training step from flags",
        description="Predict the GPU memory of one training step of MODEL, component by "
        "component, against a GPU. The library releases that change the memory are read for "
        "the current folder (a .venv, requirement and lock files; --versions wins), and runs "
        "recorded with `llmmem calibrate add` under it narrow the band of the same setup.",
    )
    p.add_argument(
        "--model", required=True, type=non_empty, help="hub id, local directory or config.json path"
    )
    p.add_argument(
        "--method",
        choices=["full", "lora", "qlora", "dpo", "orpo", "cpo", "simpo", "kto", "reward"],
        default=None,
        help="full, lora or qlora; a preference objective (dpo, orpo, cpo, simpo, kto, reward) "
        "is short for --objective OBJECTIVE with full fine-tuning",
    )
    p.add_argument(
        "--objective",
        choices=["sft", "dpo", "orpo", "cpo", "simpo", "kto", "reward", "grpo", "ppo"],
        default=None,
        help="what the step trains for (default sft): chosen and rejected concatenated for "
        "dpo, orpo, cpo/simpo and reward, a reference forward for dpo and kto; --batch counts "
        "pairs; grpo generates in the step (--num-generations ..., --batch counts completions); "
        "ppo generates and trains a value model beside the policy (--value-model, "
        "--reward-model, --new-tokens as the response length, --rollout-batch)",
    )
    p.add_argument(
        "--mixed-precision",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="preference, grpo and ppo objectives: the trainer's bf16=True/fp16=True "
        "(accelerate's mixed precision hands the logits back in fp32); default on for "
        "--precision bf16/fp16 and bf16-true (TRL's configs set bf16=True), off under DeepSpeed",
    )
    p.add_argument(
        "--ref-model",
        choices=["copy", "adapter", "precomputed"],
        default=None,
        help="dpo/kto: the reference is a frozen copy (the full fine-tuning default), the "
        "policy with its adapter disabled (the LoRA default) or precomputed log-probabilities",
    )
    p.add_argument(
        "--cpo-alpha",
        type=float,
        default=None,
        help="cpo/simpo: the weight of the chosen half's NLL (TRL's CPOConfig.cpo_alpha, "
        "default 1.0); 0 drops its cross-entropy from the step, as SimPO's paper trains",
    )
    p.add_argument(
        "--trainer",
        choices=["trl", "llamafactory", "openrlhf"],
        default=None,
        help="preference objectives: whose trainer runs the step (default trl: TRL 0.29's); "
        "llamafactory is LLaMA-Factory's own DPO/ORPO/SimPO and KTO trainers (fp32 logits, a "
        "full log_softmax) and its rm stage (a value head over the causal LM); openrlhf is "
        "OpenRLHF's DPO (its own log-probabilities from the full logits, a bf16 reference copy "
        "partitioned under --zero 3)",
    )
    p.add_argument("--batch", type=_positive_int, default=None, help="micro-batch per device")
    p.add_argument("--seq", type=_positive_int, default=None, help="tokens per sequence")
    p.add_argument("--grad-accum", type=_positive_int, default=None)
    p.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument(
        "--reentrant-ckpt",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="gradient checkpointing with torch's reentrant implementation (default: the "
        "transformers release's: reentrant up to 4.x, not from 5.0; TRL's SFTTrainer asks for "
        "non-reentrant from 0.28); under FSDP1 with LoRA it keeps every finished block's input "
        "gradient until backward ends",
    )
    p.add_argument("--optim", default=None, help="HF `optim` name or optimizer class")
    p.add_argument(
        "--precision",
        choices=["fp32", "fp16", "bf16", "bf16-true", "fp16-true", "bf16-autocast"],
        default=None,
        help="bf16 = autocast over fp32 weights; bf16-true = bf16 weights; bf16-autocast = bf16 "
        "weights under bf16 autocast (bf16=True over dtype=torch.bfloat16)",
    )
    p.add_argument("--lora-r", type=_positive_int, default=None)
    p.add_argument("--lora-alpha", type=_finite_float, default=None)
    p.add_argument("--lora-targets", default=None, help="q_proj,v_proj or all-linear")
    p.add_argument(
        "--lora-modules-to-save",
        default=None,
        help="modules trained in full beside the adapters, e.g. embed_tokens,lm_head",
    )
    p.add_argument(
        "--lora-dropout",
        type=_probability,
        default=None,
        help="LoRA dropout probability (PEFT's default 0): a dropout keeps a mask and its "
        "output per adapted linear",
    )
    p.add_argument(
        "--adapter-dtype",
        choices=["fp32", "bf16", "fp16"],
        default=None,
        help="the LoRA adapters' dtype: fp32 (PEFT's autocast_adapter_dtype, the default) or "
        "16 bits (TRL casts a quantized model's adapters to bf16; FSDP-QLoRA stacks keep them "
        "in the storage dtype)",
    )
    p.add_argument(
        "--kbit-prepare",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="qlora: prepare_model_for_kbit_training upcasts the non-quantized parameters to "
        "fp32 (the default); --no-kbit-prepare where the stack skips it (TRL's SFTTrainer from "
        "0.20, FSDP-QLoRA)",
    )
    p.add_argument("--dora", action="store_true", default=None)
    p.add_argument("--quant", choices=["nf4", "fp4", "int8"], default=None)
    p.add_argument("--double-quant", action="store_true", default=None)
    p.add_argument("--attn", choices=["eager", "sdpa", "flash_attention_2"], default=None)
    p.add_argument(
        "--packed",
        choices=["flat", "rows"],
        default=None,
        help="packed samples: flat = one row of batch × seq tokens (TRL's packing and "
        "padding_free), rows = several samples in each of --batch rows (axolotl's "
        "sample_packing, LLaMA-Factory's neat_packing); SDPA keeps a block-diagonal mask per "
        "layer, flash-attention none",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="the model runs under torch.compile (TrainingArguments torch_compile): the "
        "estimate is the eager step, its band reaches down to what checkpointing would keep",
    )
    p.add_argument(
        "--activation-offload",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="saved activations copied to the host in forward (TRL's and torchtune's "
        "activation_offloading): with --framework torchtune the estimate is torchtune's "
        "offloaded step (tensors of 1 KiB and more moved, the 5 latest kept); with "
        "--framework unsloth and --grad-ckpt it is on unless --no-activation-offload says "
        'use_gradient_checkpointing=True (unsloth\'s default is "unsloth": the checkpointed '
        "layers' inputs on the host); otherwise the estimate is the step without it and its "
        "band reaches down to the step with every saved tensor on the host",
    )
    p.add_argument(
        "--loss",
        choices=["standard", "chunked", "liger", "cce"],
        default=None,
        help="the loss: standard (HF's, fp32 logits), chunked (torchtune's and LitGPT's), "
        "liger (Liger's fused linear cross-entropy) or cce (Cut Cross-Entropy, axolotl's "
        "plugin: no logits at all)",
    )
    p.add_argument(
        "--framework",
        choices=[
            "hf",
            "trl",
            "axolotl",
            "llamafactory",
            "torchtune",
            "litgpt",
            "plain",
            "swift",
            "unsloth",
        ],
        default=None,
        help="the training code around the model (default hf): torchtune runs its own model "
        "code (bf16 adapters, torchao NF4, its chunked loss, its activation offload); litgpt "
        "its own too (fused qkv, its LoRA, a chunked loss); plain is a training loop of the "
        "script's own around transformers' models (no HF Trainer); trl, axolotl and "
        "llamafactory run transformers' models under the HF Trainer and get the HF budget",
    )
    p.add_argument(
        "--gpu",
        type=non_empty,
        default=None,
        help="A100-80GB, 4090, 24GiB, ... (default: this machine's)",
    )
    p.add_argument("--world-size", type=_positive_int, default=None)
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=None)
    p.add_argument(
        "--offload",
        nargs="?",
        const="all",
        default=None,
        choices=["optimizer", "params", "all"],
        help="what lives on the CPU: the optimizer states (ZeRO offload_optimizer), the "
        "parameters (ZeRO-3 offload_param, FSDP CPUOffload: ZeRO-3 or FSDP only), or both "
        "(no value: both where the parameters can be offloaded, else the states)",
    )
    p.add_argument(
        "--fsdp",
        nargs="?",
        const="full_shard",
        default=None,
        choices=["full_shard", "hybrid_shard", "shard_grad_op", "no_shard"],
    )
    p.add_argument(
        "--use-cache",
        action="store_true",
        default=None,
        help="the model keeps config.use_cache=True while training (HF's default when "
        "gradient checkpointing is off): an unused KV cache lives through forward",
    )
    p.add_argument("--mode", choices=["train", "generate"], default=None)
    p.add_argument(
        "--new-tokens",
        type=_bounded_int,
        default=None,
        help="generation: tokens to generate; --objective ppo: the response_length (default 53)",
    )
    p.add_argument(
        "--first-step",
        action="store_true",
        default=None,
        help="the first step, before optimizer states exist",
    )
    p.add_argument(
        "--optimizer-in-backward",
        action="store_true",
        default=None,
        help="one optimizer per parameter, stepped as its gradient is made (torchtune's "
        "optimizer_in_bwd): one gradient at a time instead of all of them",
    )
    p.add_argument(
        "--max-batch", action="store_true", help="find the largest micro-batch that fits"
    )
    p.add_argument("--max-seq", action="store_true", help="find the longest sequence that fits")
    p.add_argument("--offline", action="store_true", help="never ask the hub")
    p.add_argument("--format", choices=["text", "json"], default="text")
    from llmmem.estimate_command import add_plan_flags

    add_plan_flags(p)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="llmmem",
        description="Predict the GPU memory of LLM fine-tuning before it runs.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    _add_estimate_parser(sub)
    from llmmem.explain_command import add_explain_arguments
    from llmmem.lint_command import add_lint_arguments

    lint = sub.add_parser("lint", help="findings for scripts and configs (same as llmmem-lint)")
    add_lint_arguments(lint)
    explain = sub.add_parser("explain", help="where each value came from, and the breakdown")
    add_explain_arguments(explain)
    from llmmem.verify_command import add_verify_arguments

    verify = sub.add_parser("verify", help="run one step (CUDA, CPU or simulated) and compare")
    add_verify_arguments(verify)
    from llmmem.calibrate import add_calibrate_arguments

    calibrate = sub.add_parser(
        "calibrate",
        help="record measured peaks of real runs; they narrow later bands",
        description="Local calibration: `llmmem calibrate add RUN_OUTPUT --for FILE` records "
        "what a real run measured (HF Trainer memory metrics, torchtune memory logs, "
        "torch.cuda.max_memory_* lines, llmmem verify --format json) beside the prediction "
        "for FILE in .llmmem/calibration.jsonl; `llmmem calibrate list` shows the runs per "
        "setup (GPU, stack, method, sharding).",
    )
    add_calibrate_arguments(calibrate)
    gpus = sub.add_parser("gpus", help="list the GPU catalog and the GPUs of this machine")
    gpus.add_argument("--format", choices=["text", "json"], default="text")
    schema = sub.add_parser(
        "schema",
        help="print the JSON Schema of a --format json report",
        description="Print the JSON Schema (draft 2020-12) of `llmmem explain --format json` "
        "(the default) or of `llmmem-lint --format json`.",
    )
    schema.add_argument("report", nargs="?", choices=["explain", "lint"], default="explain")
    return parser


def _version() -> str:
    from llmmem.version import __version__

    return f"llmmem {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    return run_entry_point("llmmem", lambda: _run(argv))


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "estimate":
        from llmmem.estimate_command import run_estimate

        return run_estimate(args)
    if args.command == "lint":
        from llmmem.lint_command import run_lint

        return run_lint(args)
    if args.command == "explain":
        from llmmem.explain_command import run_explain

        return run_explain(args)
    if args.command == "verify":
        from llmmem.verify_command import run_verify

        return run_verify(args)
    if args.command == "calibrate":
        from llmmem.calibrate import run_calibrate

        return run_calibrate(args)
    if args.command == "gpus":
        return _run_gpus(args)
    if args.command == "schema":
        from llmmem.schema import report_schema_text

        sys.stdout.write(report_schema_text(args.report))
        return EXIT_OK
    parser.print_help()
    return EXIT_USAGE


def _run_gpus(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from llmmem.gpus import all_gpus, detect_local_gpus

    detected = detect_local_gpus()
    if args.format == "json":
        print(
            json.dumps(
                {
                    "catalog": [asdict(g) for g in all_gpus()],
                    "detected": [asdict(d) for d in detected],
                },
                indent=2,
            )
        )
        return EXIT_OK
    for gpu in all_gpus():
        print(
            f"{gpu.name:<18} {gpu.capacity_bytes / 2**30:7.1f} GiB  "
            f"bf16={'yes' if gpu.bf16 else 'no '}  {', '.join(gpu.aliases[:4])}"
        )
    if detected:
        for d in detected:
            print(f"this machine: GPU {d.index} {d.nvml_name} {d.total_bytes / 2**30:.1f} GiB")
    else:
        print("this machine: no GPU detected")
    return EXIT_OK

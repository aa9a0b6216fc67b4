"""The estimate flags of the preference and RL objectives: GRPOConfig's and PPO's fields that
change the memory, the preference setup `--objective` and `--method` ask for, and the lines and
values the estimate shows for them."""

from __future__ import annotations

import argparse
from typing import Any

from llmmem.budget.setup import (
    SetupError,
    TrainingSetup,
)
from llmmem.errors import UsageError
from llmmem.model_flags import hub_wanted, resolve_spec

GRPO_FLAGS = (
    ("--num-generations", "num_generations", "num_generations"),
    ("--max-prompt-length", "max_prompt_length", "max_prompt_length"),
    ("--max-completion-length", "max_completion_length", "max_completion_length"),
    ("--beta", "beta", "beta"),
    ("--vllm", "vllm", "vllm_mode"),
    (
        "--vllm-gpu-memory-utilization",
        "vllm_gpu_memory_utilization",
        "vllm_gpu_memory_utilization",
    ),
    ("--vllm-sleep-mode", "vllm_sleep_mode", "vllm_enable_sleep_mode"),
    ("--steps-per-generation", "steps_per_generation", "steps_per_generation"),
    ("--num-iterations", "num_iterations", "num_iterations"),
)


def count_flag(text: str) -> int:
    """A count from 1 to 10**9 (`llmmem.extract.numbers.parse_count`)."""
    from llmmem.extract.numbers import parse_count

    try:
        return parse_count(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def number_flag(text: str) -> float:
    """A finite number (the range is checked with the setup, which names the flag)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text[:24]}'") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got '{text[:24]}'")
    return value


# GRPOConfig's fields as flags: (flag, dest, what GRPOConfig calls it)


def add_grpo_flags(parser: argparse.ArgumentParser) -> None:
    """`--objective grpo`'s flags: GRPOConfig's fields that change the memory (TRL 0.29.1)."""
    group = parser.add_argument_group(
        "GRPO (--objective grpo; TRL 0.29.1 GRPOTrainer, --batch counts completions)"
    )
    group.add_argument(
        "--num-generations",
        type=count_flag,
        default=None,
        help="completions per prompt (default 8); the generation batch must divide by it",
    )
    group.add_argument(
        "--max-prompt-length",
        type=count_flag,
        default=None,
        help="the longest prompt in tokens (default 512; TRL 0.29 does not truncate prompts)",
    )
    group.add_argument(
        "--max-completion-length",
        type=count_flag,
        default=None,
        help="tokens generated per completion (default 256)",
    )
    group.add_argument(
        "--beta",
        type=number_flag,
        default=None,
        help="KL coefficient (default 0.0: no reference model); above 0 a reference copy in "
        "full fine-tuning, the adapter disabled under LoRA",
    )
    group.add_argument(
        "--vllm",
        choices=["colocate", "server"],
        default=None,
        help="generate with vLLM: colocate (the engine shares this GPU) or server (another GPU)",
    )
    group.add_argument(
        "--vllm-gpu-memory-utilization",
        type=number_flag,
        default=None,
        help="--vllm colocate: the fraction of the GPU the engine reserves (default 0.3)",
    )
    group.add_argument(
        "--vllm-sleep-mode",
        action="store_true",
        default=None,
        help="--vllm colocate: vllm_enable_sleep_mode, the engine releases its memory "
        "outside generation",
    )
    group.add_argument(
        "--steps-per-generation",
        type=count_flag,
        default=None,
        help="micro-batches one generation makes (default: --grad-accum)",
    )
    group.add_argument(
        "--num-iterations",
        type=count_flag,
        default=None,
        help="times each generation batch is trained on (default 1)",
    )


def add_ppo_flags(parser: argparse.ArgumentParser) -> None:
    """`--objective ppo`'s flags: the models beside the policy and PPOConfig's rollout fields
    (TRL 0.29.1); --seq is the longest query, --new-tokens the response_length."""
    group = parser.add_argument_group(
        "PPO (--objective ppo; TRL 0.29.1 PPOTrainer: --seq is the longest query, --new-tokens "
        "the response_length, default 53)"
    )
    group.add_argument(
        "--value-model",
        default=None,
        help="the value model (a sequence-classification model, trained in full); default: "
        "the policy's size",
    )
    group.add_argument(
        "--reward-model",
        default=None,
        help="the frozen reward model; default: the policy's size",
    )
    group.add_argument(
        "--rollout-batch",
        type=count_flag,
        default=None,
        help="local_rollout_forward_batch_size: queries generated and scored at a time "
        "(default 64)",
    )
    group.add_argument(
        "--mini-batches",
        type=count_flag,
        default=None,
        help="num_mini_batches (default 1); must divide --batch × --grad-accum",
    )


PPO_FLAGS = (
    ("--value-model", "value_model"),
    ("--reward-model", "reward_model"),
    ("--rollout-batch", "rollout_batch"),
    ("--mini-batches", "mini_batches"),
)


def ppo_from_args(args: argparse.Namespace, objective: str | None) -> Any:
    """The PpoSetup the flags ask for (None unless --objective ppo); the value and reward
    models are resolved like --model."""
    given = [flag for flag, dest in PPO_FLAGS if getattr(args, dest, None) is not None]
    if objective != "ppo":
        if given:
            raise UsageError(f"{', '.join(given)}: only with --objective ppo")
        return None
    from llmmem.budget.ppo_setup import PpoSetup

    values: dict[str, Any] = {}
    for dest, name in (("value_model", "value"), ("reward_model", "reward")):
        ref = getattr(args, dest, None)
        if ref is not None:
            values[dest] = resolve_spec(ref, hub_wanted(args))
            values[f"{name}_name"] = ref
    if getattr(args, "new_tokens", None) is not None:
        values["response_length"] = args.new_tokens
    if getattr(args, "rollout_batch", None) is not None:
        values["local_rollout_forward_batch_size"] = args.rollout_batch
    if getattr(args, "mini_batches", None) is not None:
        values["num_mini_batches"] = args.mini_batches
    reference = getattr(args, "ref_model", None)
    if reference is not None:
        values["reference"] = reference
    try:
        return PpoSetup(**values)
    except SetupError as err:
        raise UsageError(str(err)) from None


def grpo_from_args(args: argparse.Namespace, objective: str | None) -> Any:
    """The GrpoSetup the flags ask for (None unless --objective grpo), with UsageError for
    the combinations that mean nothing."""
    given = [flag for flag, dest, _ in GRPO_FLAGS if getattr(args, dest, None) is not None]
    if objective != "grpo":
        if given:
            raise UsageError(f"{', '.join(given)}: only with --objective grpo")
        return None
    from llmmem.budget.grpo import GrpoSetup

    if getattr(args, "seq", None) is not None:
        raise UsageError(
            "--seq does not apply to --objective grpo: the sequence is --max-prompt-length + "
            "--max-completion-length"
        )
    if getattr(args, "ref_model", None) is not None:
        raise UsageError(
            "--ref-model does not apply to --objective grpo: --beta above 0 loads the "
            "reference (a copy in full fine-tuning, the adapter disabled under LoRA)"
        )
    if getattr(args, "max_seq", False):
        raise UsageError(
            "--max-seq does not apply to --objective grpo: vary --max-completion-length"
        )
    if getattr(args, "loss", None) not in (None, "standard"):
        raise UsageError(
            f"--loss {args.loss} does not apply to --objective grpo: its loss is the completion "
            "log-probabilities' (TRL's use_liger_loss for GRPO is not modelled)"
        )
    vllm = getattr(args, "vllm", None)
    for flag, dest in (
        ("--vllm-gpu-memory-utilization", "vllm_gpu_memory_utilization"),
        ("--vllm-sleep-mode", "vllm_sleep_mode"),
    ):
        if getattr(args, dest, None) is not None and vllm != "colocate":
            raise UsageError(
                f"{flag} needs --vllm colocate: "
                + (
                    "a vLLM server's memory is set where the server starts"
                    if vllm == "server"
                    else "without --vllm the policy generates itself"
                )
            )
    values: dict[str, Any] = {
        "num_generations": args.num_generations,
        "max_prompt_length": args.max_prompt_length,
        "max_completion_length": args.max_completion_length,
        "beta": args.beta,
        "vllm": vllm,
        "vllm_gpu_memory_utilization": args.vllm_gpu_memory_utilization,
        "vllm_enable_sleep_mode": args.vllm_sleep_mode,
        "steps_per_generation": args.steps_per_generation,
        "num_iterations": args.num_iterations,
    }
    try:
        return GrpoSetup(**{k: v for k, v in values.items() if v is not None})
    except SetupError as err:
        raise UsageError(str(err)) from None


def grpo_lines(
    grpo: Any, args: argparse.Namespace, setup: TrainingSetup
) -> list[tuple[str, str, str]]:
    """The GRPO rows of the setup table, each with where it came from."""
    from llmmem.budget.grpo import generation_rows

    def source(dest: str) -> str:
        return "flag" if getattr(args, dest, None) is not None else "TRL default"

    rows = generation_rows(grpo, setup)
    lines = [
        (
            "generations",
            f"{grpo.num_generations} per prompt; {rows} completions generated per device",
            source("num_generations"),
        ),
        (
            "prompt + completion",
            f"{grpo.max_prompt_length} + {grpo.max_completion_length} tokens",
            f"{source('max_prompt_length')}, {source('max_completion_length')}",
        ),
        ("beta", f"{grpo.beta:g}", source("beta")),
    ]
    if grpo.vllm:
        text = grpo.vllm
        if grpo.vllm == "colocate":
            text += f", {grpo.vllm_gpu_memory_utilization:g} of the GPU"
            text += ", sleeps while training" if grpo.vllm_enable_sleep_mode else ""
        lines.append(("vLLM", text, "flag"))
    return lines


def grpo_values(grpo: Any, setup: TrainingSetup) -> dict[str, Any]:
    from dataclasses import asdict

    from llmmem.budget.grpo import generation_rows, steps_per_generation

    out = asdict(grpo)
    out["steps_per_generation"] = steps_per_generation(grpo, setup)
    out["generation_batch"] = generation_rows(grpo, setup)
    return out


def preference_from_args(args: argparse.Namespace) -> Any:
    """The preference objective the flags ask for (None: SFT); `--method dpo` is short for
    `--objective dpo` with full fine-tuning."""
    from llmmem.budget.preference_setup import Objective, PreferenceSetup, Reference

    objective = getattr(args, "objective", None)
    if args.method not in (None, "full", "lora", "qlora"):
        if objective not in (None, args.method):
            raise UsageError(f"--method {args.method} and --objective {objective} disagree")
        objective, args.method = args.method, "full"
    reference = getattr(args, "ref_model", None)
    mixed = getattr(args, "mixed_precision", None)
    cpo_alpha = getattr(args, "cpo_alpha", None)
    trainer = getattr(args, "trainer", None)
    if cpo_alpha is not None and objective not in ("cpo", "simpo"):
        raise UsageError("--cpo-alpha needs --objective cpo or simpo")
    if cpo_alpha is not None and not (cpo_alpha >= 0):
        raise UsageError(f"--cpo-alpha is a weight of 0 or more, got {cpo_alpha}")
    if trainer == "llamafactory" and objective not in (
        "dpo",
        "orpo",
        "cpo",
        "simpo",
        "kto",
        "reward",
    ):
        raise UsageError(
            "--trainer llamafactory sizes LLaMA-Factory's DPO, KTO and reward trainers: "
            "--objective dpo, orpo, simpo, kto or reward"
        )
    if objective in (None, "sft"):
        grpo_from_args(args, objective)  # GRPO's flags without --objective grpo
        ppo_from_args(args, objective)  # and PPO's without --objective ppo
        if reference is not None:
            raise UsageError("--ref-model needs a preference objective (--objective dpo or kto)")
        if mixed is not None:
            raise UsageError(
                "--mixed-precision needs a preference objective: an SFT step's loss upcasts "
                "the logits to fp32 either way"
            )
        return None
    if objective == "simpo":
        objective = "cpo"  # TRL's CPOTrainer with loss_type simpo
    grpo = grpo_from_args(args, objective)
    ppo = ppo_from_args(args, objective)
    openrlhf: dict[str, Any] = {}
    if trainer == "openrlhf":
        from llmmem.preference_plan import OWN_LOG_PROBABILITIES_RELEASE, openrlhf_reference_of

        if objective != "dpo":
            raise UsageError("--trainer openrlhf sizes OpenRLHF's DPO: --objective dpo")
        # OpenRLHF loads a reference copy of its own, also under LoRA
        reference = reference or "copy"
        zero = getattr(args, "zero", None) or 0
        openrlhf = {
            **openrlhf_reference_of(int(zero), offload=False),
            "trl_release": OWN_LOG_PROBABILITIES_RELEASE,
        }
        trainer = "trl"
    try:
        return PreferenceSetup(
            objective=Objective(objective),
            reference=Reference(reference) if reference else None,
            grpo=grpo,
            ppo=ppo,
            mixed_precision=mixed,
            trainer=trainer or "trl",
            cpo_alpha=cpo_alpha,
            **openrlhf,
        )
    except SetupError as err:
        raise UsageError(str(err)) from None


def ppo_values(ppo: Any, setup: TrainingSetup) -> dict[str, Any]:
    """PPO's part of the JSON setup: the lengths, the rollout and the models beside the policy."""
    from llmmem.budget.ppo_setup import local_batch

    ppo = ppo.resolved(setup)
    return {
        "query_length": ppo.query_length,
        "response_length": ppo.response_length,
        "local_batch_size": local_batch(setup),
        "local_rollout_forward_batch_size": ppo.local_rollout_forward_batch_size,
        "num_mini_batches": ppo.num_mini_batches,
        "value_model": ppo.value_name or "the policy's size",
        "reward_model": ppo.reward_name or "the policy's size",
    }


def ppo_lines(
    ppo: Any, args: argparse.Namespace, setup: TrainingSetup
) -> list[tuple[str, str, str]]:
    """The PPO rows of the setup table, each with where it came from."""
    values = ppo_values(ppo, setup)

    def source(dest: str, default: str) -> str:
        return "flag" if getattr(args, dest, None) is not None else default

    return [
        (
            "rollout",
            f"{values['local_batch_size']} queries of {values['query_length']} tokens, "
            f"{values['local_rollout_forward_batch_size']} at a time",
            source("rollout_batch", "TRL default 64"),
        ),
        ("response", f"{values['response_length']} tokens", source("new_tokens", "TRL default 53")),
        ("value model", str(values["value_model"]), source("value_model", "the policy's size")),
        ("reward model", str(values["reward_model"]), source("reward_model", "the policy's size")),
    ]


def grpo_batch_unit(grpo: Any, setup: TrainingSetup) -> int:
    """The smallest micro-batch step that keeps `batch × devices × steps_per_generation` a
    multiple of num_generations."""
    from math import gcd

    from llmmem.budget.grpo import steps_per_generation

    per_step = setup.distributed.world_size * steps_per_generation(grpo, setup)
    return grpo.num_generations // gcd(grpo.num_generations, per_step)

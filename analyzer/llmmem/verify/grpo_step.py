"""`llmmem verify` on a GRPO plan: TRL 0.29.1's GRPO step, generation included, on the plan's
own model, on the CPU.

The step is `llmmem.verify.grpo_grid.step_peaks` (the policy's `generate` with its KV cache,
every completion run to `max_completion_length`, the prompts left-padded and one completion
right-padded as TRL pads a batch unless the plan's `padded_prompts` is off; the reference's
log-probabilities under `no_grad` when `beta != 0` — a frozen copy in full fine-tuning, the
adapter disabled under PEFT; the policy's log-probabilities, the clipped loss, backward, the
optimizer step), on the model the plan builds (config, dtype, LoRA, checkpointing,
optimizer). Under mixed precision the forwards run as accelerate prepares them (autocast,
outputs converted to fp32). A plan that generates with vLLM is not run: the engine does not
run here.
"""

from __future__ import annotations

import copy

from llmmem.verify.request import PhaseMeasurement, StepMeasurement, StepRequest


def check_grpo_request(request: StepRequest) -> str | None:
    """Why this GRPO request cannot be verified here (None: it can)."""
    grpo = request.grpo or {}
    if grpo.get("vllm"):
        return (
            f"it generates with vLLM ({grpo['vllm']} mode), which does not run here; the "
            "GRPO budget's own step is checked by `python -m llmmem.verify.grid --grpo`"
        )
    if request.world_size > 1 or request.sharding == "zero":
        return "a GRPO plan is verified on one device (run it with world_size=1)"
    if request.device != "cpu":
        return (
            "a GRPO step samples its completions, which a simulated step cannot do: verify it "
            "with --device cpu (a small model)"
        )
    if request.quant is not None:
        return "a GRPO plan over a k-bit model is not verified yet"
    return None


def run_grpo_step(request: StepRequest, result: StepMeasurement) -> None:
    """Build the plan's model (and reference), run a warm-up and a measured GRPO step, and
    fill `result` with each phase's peak."""
    import torch

    from llmmem.verify import building
    from llmmem.verify.grpo_grid import step_peaks
    from llmmem.verify.preference_grid import prepared_forward

    why = check_grpo_request(request)
    if why:
        raise building.VerifyError(why)
    grpo = request.grpo or {}
    generations = int(grpo.get("num_generations", 8))
    prompt = int(grpo.get("max_prompt_length", 512))
    completion = int(grpo.get("max_completion_length", 256))
    beta = float(grpo.get("beta", 0.0))
    # grpo_trainer.py: a generation every steps_per_generation micro-batches (default the
    # accumulation steps); the old log-probabilities when the accumulation is no multiple
    spg = int(grpo.get("steps_per_generation") or request.grad_accum)
    iterations = int(grpo.get("num_iterations") or 1)
    mixed = grpo.get("mixed_precision")
    if request.batch % generations and request.batch > generations:
        raise building.VerifyError(
            f"per_device_train_batch_size {request.batch} is not a multiple of num_generations "
            f"{generations}"
        )
    notes = result.notes
    _, transformers = building._imports()
    model = building._build(request, "cpu", notes, torch, transformers)
    result.device_name = "cpu"
    ref = None
    if beta and request.lora is None:
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    if mixed is None:
        mixed = request.precision in ("bf16", "bf16-true")
    if mixed and request.precision in ("bf16", "bf16-true"):
        # accelerate's mixed precision: autocast, and the outputs converted to fp32
        for wrapped in [model] + ([ref] if ref is not None else []):
            wrapped.forward = prepared_forward(wrapped)
        notes.append("the forwards ran as accelerate's mixed precision prepares them")
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = building.make_optimizer(torch, request, trainable)
    result.stage = "measured step"
    peaks = step_peaks(
        model,
        ref,
        optimizer,
        vocab=int(request.config.get("vocab_size") or 32000),
        prompt=prompt,
        completion=completion,
        generations=generations,
        batch=request.batch,
        beta=beta,
        steps_per_generation=spg,
        old_log_probs=request.grad_accum % (spg * iterations) != 0,
        # TRL pads a batch (prompts left-padded, completions after an EOS): the budget's default
        padded=bool(grpo.get("padded_prompts", True)),
    )
    result.phases = [
        PhaseMeasurement(phase=name, peak_bytes=int(peak), by_category={})
        for name, peak in peaks.items()
    ]
    result.allocated_peak_bytes = max(peaks.values())
    result.weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    notes.append(
        f"GRPO step as TRL 0.29.1 computes it: {request.batch} completions of {completion} "
        f"tokens ({generations} a prompt of {prompt} tokens), generated by the policy"
        + (
            ", the reference a frozen copy"
            if ref is not None
            else ", the reference the policy with its adapter disabled"
            if beta
            else ", no reference (beta = 0)"
        )
    )
    result.stage = "done"


__all__ = ["check_grpo_request", "run_grpo_step"]

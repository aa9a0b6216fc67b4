"""`llmmem verify` on a preference plan: the step TRL 0.29.1 runs for DPO, the reference-free
objectives (ORPO, CPO, SimPO), KTO and reward models, on the plan's own model.

The loss code is `llmmem.verify.preference_grid`'s (chosen and rejected concatenated,
`selective_log_softmax` over the shifted logits, the reference's log-probabilities under
`no_grad` — a frozen copy in full fine-tuning, the adapter disabled under PEFT — and DPO's
metrics after the loss, `entropy_from_logits` among them; ORPO, CPO and SimPO as TRL's
experimental ORPOTrainer: the log-probabilities on a view of the logits and the chosen half's
cross-entropy, which SimPO's `cpo_alpha=0` leaves out, and its step does too; KTO's KL batch;
LLaMA-Factory's own DPO trainer where the plan is LLaMA-Factory's); here it runs on the model
the plan builds (its config, dtype, LoRA, checkpointing, optimizer), counted by the storage
tracker, on the CPU or simulated. Each phase the budget names is measured: forward, the
reference forward, backward and the optimizer step; and the run's allocations are replayed
through the caching allocator for a reserved peak. In bf16 (weights or autocast) the models'
forwards run as accelerate's mixed precision prepares them, their outputs converted to fp32 by
accelerate's `convert_outputs_to_fp32`.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, replace
from typing import Any

from llmmem.verify.request import StepMeasurement, StepRequest

# the objectives whose step is written here, as the grid's step names them
STEP_OBJECTIVE = {
    "dpo": "dpo",
    "kto": "kto",
    "orpo": "orpo",  # no reference: the log-probabilities and the chosen half's NLL
    "cpo": "orpo",
    "simpo": "simpo",  # CPO with cpo_alpha=0: no cross-entropy
    "reward": "reward",
}


@dataclass(frozen=True)
class _Shape:
    objective: str
    method: str
    dtype: str
    reference: str | None
    batch: int
    seq: int
    grad_ckpt: bool
    # accelerate's mixed precision (bf16=True): None, as the plan's budget takes it, is on
    # for bf16 weights and bf16 autocast (the logits come back in fp32)
    mixed: bool | None = None
    trainer: str = "trl"  # "llamafactory": LLaMA-Factory's DPO trainer


def check_preference_request(request: StepRequest) -> str | None:
    """Why this preference request cannot be verified here (None: it can)."""
    objective = request.objective or ""
    if objective == "grpo":
        from llmmem.verify.grpo_step import check_grpo_request

        return check_grpo_request(request)
    if objective not in STEP_OBJECTIVE:
        return (
            f"{objective.upper()} steps are not verified on a plan yet (the PPO budget is "
            "checked on the CPU by `python -m llmmem.verify.grid --ppo`)"
        )
    if request.world_size > 1 or request.sharding == "zero":
        return "a preference plan is verified on one device (run it with world_size=1)"
    if request.device == "cuda":
        return (
            "a preference step is verified on the CPU or simulated so far: --device cpu or "
            "--simulate"
        )
    if request.device == "fake":
        if objective == "kto":
            return (
                "KTO splits its batch by value (desirable or not), which a simulated step cannot: "
                "--device cpu"
            )
        if request.quant is not None:
            return "bitsandbytes kernels do not run on fake tensors: --device cpu"
    return None


def run_preference_step(request: StepRequest, result: StepMeasurement) -> None:
    """Build the plan's model (and reference), run a warm-up and a measured preference step,
    and fill `result` with each phase's peak."""
    import torch

    from llmmem.budget.overheads import CUBLAS_WORKSPACE
    from llmmem.verify import building
    from llmmem.verify.allocator import replay_step
    from llmmem.verify.preference_grid import _Step, _Tracker, measure_step
    from llmmem.verify.request import PhaseMeasurement

    why = check_preference_request(request)
    if why:
        raise building.VerifyError(why)
    objective = STEP_OBJECTIVE[str(request.objective)]
    shape = _Shape(
        objective=objective,
        method="lora" if request.lora is not None else "full",
        dtype=request.precision if request.precision in ("bf16", "bf16-true") else "fp32",
        reference=request.reference,
        batch=request.batch,
        seq=request.seq,
        grad_ckpt=request.grad_ckpt,
        mixed=getattr(request, "mixed_precision", None),
        trainer=getattr(request, "trainer", "trl"),
    )
    if request.precision not in ("fp32", "bf16", "bf16-true"):
        raise building.VerifyError(
            f"a preference step is verified in fp32, bf16 or bf16 autocast, not {request.precision}"
        )
    build = request
    if objective == "reward":
        # TRL's RewardTrainer: a sequence-classification head with one label
        config = dict(request.config, num_labels=1)
        config.setdefault("pad_token_id", 0)
        architecture = request.architecture.replace("ForCausalLM", "ForSequenceClassification")
        build = replace(request, config=config, architecture=architecture)
    notes = result.notes
    device = request.device
    fake_mode: Any = contextlib.nullcontext()
    _, transformers = building._imports()
    if device == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        model = building.build_model(build, "meta", notes)
        building._fake_parameters(torch, model, fake_mode)
        result.device_name = "simulated (FakeTensorMode, cpu)"
    else:
        model = building._build(build, "cpu", notes, torch, transformers)
        result.device_name = "cpu"
    ref = None
    if objective in ("dpo", "kto") and request.reference == "copy":
        # a frozen second model: TRL's default in full fine-tuning, or a ref_model= given
        base = replace(build, lora=None, grad_ckpt=False)
        if device == "fake":
            # built afresh in the same fake mode (a deep copy of fake tensors would not be)
            ref = building.build_model(base, "meta", notes)
            building._fake_parameters(torch, ref, fake_mode)
        elif shape.method == "full":
            ref = copy.deepcopy(model)
        else:
            ref = building._build(base, "cpu", notes, torch, transformers)
        ref = ref.eval().requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = building.make_optimizer(torch, request, trainable)
    vocab = int(request.config.get("vocab_size") or 32000)
    step = _Step(shape, model, ref, vocab, optimizer)
    tracker = _Tracker()
    tracker.events = []
    result.stage = "measured step"
    with fake_mode:
        peaks = measure_step(step, tracker)
    result.phases = [
        PhaseMeasurement(phase=name, peak_bytes=int(peak), by_category={})
        for name, peak in peaks.items()
    ]
    result.allocated_peak_bytes = max(peaks.values())
    # the policy's weights (the reference copy is a component of its own in the budget)
    result.weights_bytes = int(tracker.bytes_of(list(model.parameters())))
    replayed = replay_step(tracker.events or [], CUBLAS_WORKSPACE)
    result.reserved_peak_bytes = replayed.peak_reserved
    notes.append(
        f"{str(request.objective).upper()} step as "
        + (
            "LLaMA-Factory 0.9.5's trainer"
            if shape.trainer == "llamafactory" and objective in ("dpo", "orpo", "kto")
            else "TRL 0.29.1"
        )
        + " computes it "
        f"({2 * request.batch} sequences: chosen and rejected of {request.batch} pairs"
        + {
            "copy": ", the reference a frozen copy",
            "adapter": ", the reference the policy with its adapter disabled",
            "precomputed": ", reference log-probabilities precomputed",
        }.get(str(request.reference), "")
        + "); reserved peak replayed through the caching allocator's rules"
    )
    result.stage = "done"


__all__ = ["STEP_OBJECTIVE", "check_preference_request", "run_preference_step"]

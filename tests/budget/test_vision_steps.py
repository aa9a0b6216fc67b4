"""A real CPU step of a tiny Qwen2.5-VL and a tiny Llama 3.2 Vision (Mllama) with images, LoRA
on q/k/v/o, the vision encoder frozen and trained, with and without gradient checkpointing:
every phase within 5% of the budget (torch 2.13, transformers 5.24, peft 0.21.2, bf16 weights,
fp32 adapters, torch's fused AdamW).

What these steps hold that a text-only step does not: the encoder's weights (and, trained, its
gradients and AdamW states), its saved tensors over the image patches (Mllama's q/k/v/o names
also put adapters into its encoder, so its tensors are kept even frozen), with checkpointing the
encoder's own checkpointed inputs (PEFT's enable_input_require_grads turns autograd on in a
frozen encoder; Mllama's encoder layers are not checkpointed at all), the image tokens in the
language model's sequence, the cross-attention blocks' vision keys and values, the fp32 pixel
values of the batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vision_steps import MLLAMA, QWEN2_5_VL, build, measured_step, mllama_batch, qwen_batch  # noqa: E402

from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.budget.setup import LoraSetup, TrainingSetup, VisionSetup  # noqa: E402
from llmmem.models.architectures import spec_from_config  # noqa: E402
from llmmem.models.spec import ModelSource  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
RANK = 8
CASES = [
    (family, encoder, checkpointing)
    for family in ("qwen2_5_vl", "mllama")
    for encoder in ("frozen", "trained")
    for checkpointing in (False, True)
]


def setup_for(family: str, encoder_trains: bool, checkpointing: bool) -> TrainingSetup:
    # Qwen: one 224×336 image (16×24 patches, 96 tokens) in 384 tokens; Mllama: one 224×224
    # image, 2×2 tiles of 112 pixels (its processor's canvas), in 256 tokens
    height, width, seq = (224, 336, 384) if family == "qwen2_5_vl" else (224, 224, 256)
    return TrainingSetup(
        method="lora",
        lora=LoraSetup(r=RANK, alpha=2 * RANK, targets=TARGETS),
        batch=2,
        seq=seq,
        precision="bf16-true",
        optim="adamw_torch_fused",
        grad_ckpt=checkpointing,
        vision=VisionSetup(
            images=1,
            height=height,
            width=width,
            seq_includes_images=True,
            encoder_trains=encoder_trains,
            projector_trains=encoder_trains,
        ),
    )


def step_of(family: str, encoder_trains: bool, checkpointing: bool) -> tuple[dict, dict, object]:
    config = QWEN2_5_VL if family == "qwen2_5_vl" else MLLAMA
    setup = setup_for(family, encoder_trains, checkpointing)
    model = build(
        config,
        torch.bfloat16,
        targets=TARGETS,
        rank=RANK,
        encoder_trains=encoder_trains,
        checkpointing=checkpointing,
    )
    if family == "qwen2_5_vl":
        batch = qwen_batch(config, setup.batch, setup.seq, 224, 336)
    else:
        batch = mllama_batch(config, setup.batch, setup.seq, tiles=4, aspect_ratio_id=6)
    measured = measured_step(model, batch)
    spec = spec_from_config(config, model_id=f"tiny-{family}", source=ModelSource.CONFIG)
    budget = estimate_budget(spec, setup, with_first_step=False)
    predicted = {phase.phase.value: phase.allocated_bytes for phase in budget.phases}
    return measured, predicted, (model, budget)


@pytest.mark.parametrize(("family", "encoder", "checkpointing"), CASES)
def test_every_phase_within_5_percent_of_a_real_cpu_step(
    family: str, encoder: str, checkpointing: bool
) -> None:
    measured, predicted, (model, budget) = step_of(family, encoder == "trained", checkpointing)
    errors = {phase: (predicted[phase] - measured[phase]) / measured[phase] for phase in measured}
    assert all(abs(error) <= 0.05 for error in errors.values()), (errors, measured, predicted)
    # the parameters that train are PEFT's, the encoder's adapters included
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)  # type: ignore[attr-defined]
    assert budget.trainable_params == trainable  # type: ignore[attr-defined]


def test_a_trained_encoder_costs_what_the_step_says() -> None:
    """Training the encoder adds its gradients, its AdamW states and its saved tensors: the
    budget's difference between the two steps within 10% of the measured one."""
    frozen, frozen_predicted, _ = step_of("qwen2_5_vl", False, False)
    trained, trained_predicted, _ = step_of("qwen2_5_vl", True, False)
    for phase in ("forward", "backward"):
        measured = trained[phase] - frozen[phase]
        predicted = trained_predicted[phase] - frozen_predicted[phase]
        assert measured > 0.2 * frozen[phase]
        assert abs(predicted - measured) <= 0.1 * measured, (phase, measured, predicted)

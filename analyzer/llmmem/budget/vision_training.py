"""What of a vision-language model's image side trains under a setup, and whether gradients
run through its encoder (llmmem.budget.vision has the terms this decides).

- Full fine-tuning trains everything the images pass through (TRL 1.16's SFTTrainer freezes
  nothing); `VisionSetup.encoder_trains` / `projector_trains` say otherwise (LLaMA-Factory's
  freeze_vision_tower and freeze_multi_modal_projector, both on by default).
- LoRA puts adapters wherever PEFT's target names match (it matches leaf names anywhere in the
  model, `all-linear` every Linear but the head): the encoder's and the projector's Linears too,
  unless the framework keeps them out (`adapters_reach_vision`).
- With LoRA and gradient checkpointing, `enable_input_require_grads` (PEFT's get_peft_model,
  TRL's SFTTrainer) hooks the input embeddings of every sub-model, the encoder's patch
  embedding too (transformers 5.24 `PreTrainedModel.enable_input_require_grads`): a frozen
  encoder then runs with autograd on.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmem.budget.lora_targets import (
    default_lora_targets,
    is_regex,
    name_matches,
    regex_layers,
    regex_matches_projector,
)
from llmmem.budget.setup import Method, TrainingSetup
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec


@dataclass(frozen=True)
class VisionTraining:
    """What of the image side trains, and whether gradients run through the encoder."""

    encoder_trains: bool
    projector_trains: bool
    encoder_adapted: frozenset[str]  # paths of the encoder's Linears with an adapter
    projector_adapted: frozenset[str]
    input_grads: bool  # LoRA with checkpointing: the patch embedding's output requires grad

    @property
    def encoder_grad(self) -> bool:
        return self.encoder_trains or bool(self.encoder_adapted) or self.input_grads

    @property
    def projector_grad(self) -> bool:
        return self.projector_trains or bool(self.projector_adapted) or self.encoder_grad


def _matches(lin: LinearModule, targets: list[str], group: BlockGroup | None = None) -> bool:
    if is_regex(targets):
        if group is None:
            return regex_matches_projector(targets[0], lin)
        return bool(regex_layers(targets[0], group, lin, vision=True))
    return name_matches(lin, targets)


def vision_training(spec: ModelSpec, setup: TrainingSetup) -> VisionTraining:
    """What trains on the image side under `setup` (nothing where no images are given)."""
    images = setup.vision
    full = setup.method is Method.FULL
    if spec.vision is None or images is None:
        return VisionTraining(False, False, frozenset(), frozenset(), False)
    encoder = full if images.encoder_trains is None else images.encoder_trains
    projector = full if images.projector_trains is None else images.projector_trains
    adapted: frozenset[str] = frozenset()
    adapted_projector: frozenset[str] = frozenset()
    lora = setup.lora
    if lora is not None and not full and images.adapters_reach_vision:
        targets = lora.targets or default_lora_targets(spec)
        adapted = frozenset(
            lin.path
            for group in spec.vision.encoder.blocks
            for lin in group.linears
            if _matches(lin, targets, group)
        )
        adapted_projector = frozenset(
            lin.path for lin in spec.vision.projector_linears if _matches(lin, targets)
        )
    input_grads = setup.grad_ckpt and not full and lora is not None
    return VisionTraining(encoder, projector, adapted, adapted_projector, input_grads)

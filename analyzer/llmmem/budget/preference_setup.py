"""What a preference or RL trainer's step is, before any of its moments is sized.

The objectives (DPO and its variants, ORPO, CPO/SimPO, KTO, reward models, GRPO, PPO), where the
reference log-probabilities come from, `PreferenceSetup` (the trainer, its TRL release, its
reference copy and accelerate's mixed precision), whether the prepared models hand back fp32
outputs, and `LogProbMoments`, the shape every objective's log-probability computation is sized
in. The budgets (llmmem.budget.preference, grpo, ppo, fused_head) all start from here, so none of
them imports another for these.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from llmmem.budget.activations import dtypes_for
from llmmem.budget.fused_head_bytes import FIRST_RELEASE
from llmmem.budget.setup import Precision, SetupError, TrainingSetup, check_release, release

# the TRL release whose trainers these budgets follow
TRL_RELEASE = "0.29"
# the first release whose DPOTrainer no longer copies the shifted logits: from 1.6 to 1.14 it
# takes the log-probabilities on views of the logits (then 1.15's fused head)
SAME_DPO_UNTIL = (1, 6)
# the trainers whose preference steps are told apart (PreferenceSetup.trainer)
TRAINERS = ("trl", "llamafactory")


class Objective(str, Enum):
    SFT = "sft"
    DPO = "dpo"  # DPO and its loss variants (IPO, hinge, robust, ...): same forward
    ORPO = "orpo"
    CPO = "cpo"  # CPO and SimPO (CPOConfig(loss_type="simpo"))
    KTO = "kto"
    REWARD = "reward"
    GRPO = "grpo"
    PPO = "ppo"


class Reference(str, Enum):
    COPY = "copy"  # a second frozen model (full fine-tuning, or ref_model= given)
    ADAPTER = "adapter"  # the policy with its LoRA adapter disabled: no copy
    PRECOMPUTED = "precomputed"  # precompute_ref_log_probs: no reference during training
    NONE = "none"  # the objective has no reference model


# the objectives whose step this module models
MODELLED = frozenset(
    {Objective.DPO, Objective.ORPO, Objective.CPO, Objective.KTO, Objective.REWARD}
)
# the objectives that compare with a reference model
WITH_REFERENCE = frozenset({Objective.DPO, Objective.KTO})


@dataclass(frozen=True, slots=True, kw_only=True)
class PreferenceSetup:
    objective: Objective = Objective.DPO
    reference: Reference | None = None  # None: what TRL does for the objective and the method
    num_labels: int = 1  # reward models: TRL requires 1
    # accelerate's mixed precision (bf16=True / fp16=True): the prepared models return fp32
    # outputs. None: on for 16-bit compute (TRL's configs default to bf16=True), off under
    # DeepSpeed; see `fp32_outputs`
    mixed_precision: bool | None = None
    # the reference copy as the trainer loads it: bytes per weight (None: the policy's dtype,
    # TRL's `ref_model_init_kwargs.setdefault("dtype", self.model.dtype)`), partitioned across
    # the data-parallel ranks (ZeRO-3: OpenRLHF's eval config takes the training's stage 3) or
    # with its weights on the CPU (OpenRLHF's --ref_offload under ZeRO-3)
    reference_bytes: int | None = None
    reference_sharded: bool = False
    reference_offloaded: bool = False
    # GRPO: a llmmem.budget.grpo.GrpoSetup (None: GRPOConfig's defaults)
    grpo: Any = None
    # PPO: a llmmem.budget.ppo_setup.PpoSetup (None: PPOConfig's defaults, every model the
    # policy's size)
    ppo: Any = None
    # the TRL release the trainer runs (None: TRL_RELEASE, the one these budgets follow); the
    # moments that are one release's own (DPO's metrics after the loss, ORPO's and CPO's
    # log-probabilities on a view of the logits) are counted for that release only
    trl_release: str | None = None
    # whose trainer runs the step: "trl" (TRL's, at `trl_release`) or "llamafactory"
    # (LLaMA-Factory's own CustomDPOTrainer, read at 0.9.5: the logits cast to fp32 and a full
    # log_softmax gathered from, the policy before the reference; ORPO and SimPO without a
    # cross-entropy; its KTO trainer likewise). Its reward trainer is sized as TRL's so far
    trainer: str = "trl"
    # CPO's weight of the chosen half's NLL (CPOConfig.cpo_alpha; None: TRL's default 1.0).
    # 0 (SimPO as its paper writes it, `loss_type="alphapo"` too) skips the cross-entropy
    cpo_alpha: float | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "objective", Objective(self.objective))
            if self.reference is not None:
                object.__setattr__(self, "reference", Reference(self.reference))
        except ValueError as err:
            raise SetupError(str(err)) from None
        if self.num_labels < 1:
            raise SetupError(f"num_labels must be at least 1, got {self.num_labels}")
        if self.reference_bytes is not None and self.reference_bytes not in (1, 2, 4):
            raise SetupError(f"reference_bytes is 1, 2 or 4, got {self.reference_bytes}")
        if self.trainer not in TRAINERS:
            raise SetupError(f"trainer is one of {', '.join(TRAINERS)}, got '{self.trainer}'")
        if self.trl_release is not None:
            check_release(self.trl_release, "trl_release", "0.29.1")

    @property
    def follows_trl_release(self) -> bool:
        """Whether the trainer runs the DPO code these budgets restate: 0.29's, which 1.0 to 1.5
        keep (`_compute_loss`' `.contiguous()` shifted copies and `entropy_from_logits`, read
        in each minor release's trl/trainer/dpo_trainer.py); 1.6 takes the log-probabilities on
        views, 1.15 through the fused head."""
        return release(TRL_RELEASE) <= release(self.trl_release or TRL_RELEASE) < SAME_DPO_UNTIL

    @property
    def dpo_on_views(self) -> bool:
        """TRL 1.6 to 1.14's DPOTrainer: `selective_log_softmax` of the views
        `logits[..., :-1, :]` (no `.contiguous()` copies), its metrics still 0.29's."""
        found = release(self.trl_release or TRL_RELEASE)
        return (
            self.objective is Objective.DPO
            and self.trainer == "trl"
            and SAME_DPO_UNTIL <= found < FIRST_RELEASE
        )


def fp32_outputs(mixed_precision: bool | None, setup: TrainingSetup) -> bool:
    """Whether the trainer's prepared models hand back fp32 outputs (logits) from a 16-bit
    compute: accelerate's `convert_outputs_to_fp32`, applied by `prepare_model` when its
    `native_amp` is on, i.e. `mixed_precision` bf16/fp16 outside DeepSpeed (accelerate 1.15.0
    `Accelerator.__init__`). Autocast over fp32 weights is that mixed precision; with 16-bit
    weights it is on when the config says `bf16=True` (TRL's configs' default), so None means
    on. fp32 compute has nothing to convert."""
    if dtypes_for(setup).compute == 4:
        return False
    if setup.distributed.zero_stage:
        return False
    return True if mixed_precision is None else bool(mixed_precision)


def policy_under_autocast(setup: TrainingSetup, mixed_precision: bool | None) -> TrainingSetup:
    """The setup the policy's activations are sized with: accelerate's mixed precision runs the
    forward under autocast, over bf16 weights too (bf16-autocast)."""
    if setup.precision is Precision.BF16_TRUE and fp32_outputs(mixed_precision, setup):
        return replace(setup, precision=Precision.BF16_AUTOCAST)
    return setup


def reference_fp32_outputs(
    mixed_precision: bool | None, setup: TrainingSetup, reference: Reference
) -> bool:
    """The same for the reference's outputs: a copy goes through `prepare_fsdp` under FSDP
    (not `prepare_model`: no conversion); the adapter-disabled policy is the prepared policy."""
    if reference is Reference.COPY and setup.distributed.fsdp is not None:
        return False
    return fp32_outputs(mixed_precision, setup)


@dataclass(frozen=True)
class LogProbMoments:
    """The log-probability computation's memory, in bytes, at the step's moments."""

    forward_end: int  # the policy's logits, their shifted copy and what autograd keeps
    reference: int  # the reference's logits and shifted copy, beside the policy's
    # of `reference` (of `forward_end` for ORPO and CPO: no reference): one row's temporary
    # made inside an aten kernel (fp32 logsumexp), which a GPU allocates and a dispatch-level
    # storage counter does not see
    inside_kernel: int
    backward_peak: int  # inside the log-softmax backward
    formula_forward: str
    formula_reference: str
    formula_backward: str
    # of `forward_end` where the policy has a reference after it too (LLaMA-Factory's full
    # log_softmax over a strided view: the contiguous copy CUDA's kernel makes of its input)
    inside_forward: int = 0
    # what the policy still holds when the reference starts, where that is not `forward_end`
    # less `inside_forward` (LLaMA-Factory's KTO: its KL batch's logits are gone by then)
    kept_for_reference: int | None = None
    formula_kept: str = ""

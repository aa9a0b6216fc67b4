"""The Hugging Face stack: transformers models, PEFT adapters, bitsandbytes quantization, the HF
Trainer and the loops around it (TRL, axolotl, LLaMA-Factory). It is what the shared budget
computes by itself (budget.weights, budget.activations, budget.logits, budget.phases), so this
stack has nothing of its own to say: every question answers "the shared rule". Another
framework's stack overrides the questions where its code differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmem.budget.activations import TRANSFORMERS_RULES, ActivationEstimate, BlockRules
from llmmem.budget.logits import LogitsMoments
from llmmem.budget.result import Term
from llmmem.budget.setup import TrainingSetup
from llmmem.budget.weights import ParameterGroup, QuantizedBytes, bitsandbytes_bytes
from llmmem.models.spec import ModelSpec


@dataclass(frozen=True)
class WeightCopies:
    """Copies of weights a step makes, at each kind of moment: when the loss is computed, when
    its and the head's backward run, while a checkpointed block is recomputed (or brought back),
    and inside any block's forward or backward."""

    at_loss: int
    backward_start: int
    recompute: int
    in_block: int
    formula: str


@dataclass(frozen=True)
class LossMoments:
    """The logits and the loss as a framework computes them, and the block the caching allocator
    keeps unused at the start of backward (freed logits too small for what follows)."""

    moments: LogitsMoments
    hole_bytes: int


@dataclass(frozen=True)
class OffloadedActivations:
    """What stays on the device when activations are offloaded: while the blocks run in forward
    (beside the running block), from the end of forward through the loss and the head's backward,
    and while a block is recomputed and run backward."""

    in_forward: Term
    after_forward: Term
    in_backward: Term


class Stack:
    """The questions the shared budget asks a framework's stack; this one answers them all with
    "the shared rule" (None, or the shared default)."""

    name = "hf"
    # whether the framework's activation offloading moves every saved tensor it may, so the
    # offloaded step is the estimate (not a floor the band reaches down to)
    offload_is_exact = False
    # FSDP: nothing gathered is left at the loss but the root (the forward's root frees the
    # last all-gather's buffer as it returns); measured on the stacks that set it
    fsdp_loss_without_last_gather = False

    def check(self, setup: TrainingSetup) -> None:
        """Raise SetupError for a setup the framework refuses to run."""
        return None

    def prepare(self, setup: TrainingSetup) -> TrainingSetup:
        """The setup with what the framework always does filled in (adapter dtype, ...)."""
        return setup

    def block_rules(self, spec: ModelSpec, setup: TrainingSetup) -> BlockRules:
        return TRANSFORMERS_RULES

    def quantized_bytes(self, setup: TrainingSetup) -> QuantizedBytes:
        return bitsandbytes_bytes

    def buffers(self, spec: ModelSpec, setup: TrainingSetup) -> tuple[ParameterGroup, ...]:
        return ()

    def loss(self, spec: ModelSpec, setup: TrainingSetup) -> LossMoments | None:
        return None

    def weight_copies(self, spec: ModelSpec, setup: TrainingSetup) -> WeightCopies | None:
        return None

    def offloaded(
        self, spec: ModelSpec, setup: TrainingSetup, acts: ActivationEstimate
    ) -> OffloadedActivations | None:
        return None

    def notes(self, spec: ModelSpec, setup: TrainingSetup) -> list[str]:
        return []

    def fsdp_root_resharded(self, setup: TrainingSetup) -> bool:
        """Whether FSDP's root unit (embeddings, final norm, head) is resharded when the
        model's forward returns and gathered again as backward reaches it. accelerate (the HF
        Trainer's FSDP2) leaves the root's `reshard_after_forward` to torch, which keeps the
        root whole (accelerate 1.15 utils/fsdp_utils.py:881-885)."""
        return False


HF_STACK = Stack()

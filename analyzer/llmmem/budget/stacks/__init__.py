"""Each framework's training stack: what it loads and casts, its loss, its checkpointing and
offload rules, its optimizer placement. The shared budget (budget.phases) asks the stack of the
setup's framework at each of these points; a stack answers where its framework's code differs
from the Hugging Face stack (stacks.hf), whose answers are the shared rules themselves.

One module per framework's stack, as one reader per framework in extract/frameworks/.

A stack whose framework builds the model differently (LitGPT: no tied weights, a quantized head)
also answers `model(spec, setup)` and `inventory(spec, setup, inv)`; `own_model` and
`own_inventory` ask them where a stack has them.
"""

from __future__ import annotations

from llmmem.budget.setup import Framework, TrainingSetup
from llmmem.budget.stacks.hf import HF_STACK, Stack
from llmmem.budget.stacks.litgpt import LITGPT_STACK
from llmmem.budget.stacks.swift import SWIFT_STACK
from llmmem.budget.stacks.torchtune import TORCHTUNE_STACK
from llmmem.budget.stacks.trl import TRL_STACK
from llmmem.budget.stacks.unsloth import UNSLOTH_STACK
from llmmem.budget.weights import Inventory
from llmmem.models.spec import ModelSpec

STACKS: dict[Framework, Stack] = {
    Framework.TORCHTUNE: TORCHTUNE_STACK,
    Framework.LITGPT: LITGPT_STACK,
    Framework.TRL: TRL_STACK,
    Framework.SWIFT: SWIFT_STACK,
    Framework.UNSLOTH: UNSLOTH_STACK,
}


def stack_for(framework: Framework) -> Stack:
    """The stack a framework trains with; the Hugging Face one where it has none of its own."""
    return STACKS.get(framework, HF_STACK)


def own_model(stack: Stack, spec: ModelSpec, setup: TrainingSetup) -> ModelSpec:
    """The model as the stack's framework builds it."""
    build = getattr(stack, "model", None)
    return spec if build is None else build(spec, setup)


def own_inventory(stack: Stack, spec: ModelSpec, setup: TrainingSetup, inv: Inventory) -> Inventory:
    """The parameters as the stack's framework holds them."""
    adjust = getattr(stack, "inventory", None)
    return inv if adjust is None else adjust(spec, setup, inv)


__all__ = ["Stack", "own_inventory", "own_model", "stack_for"]

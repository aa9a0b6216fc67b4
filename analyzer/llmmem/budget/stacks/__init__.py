"""Each framework's training stack: what it loads and casts, its loss, its checkpointing and
offload rules, its optimizer placement. The shared budget (budget.phases) asks the stack of the
setup's framework at each of these points; a stack answers where its framework's code differs
from the Hugging Face stack (stacks.hf), whose answers are the shared rules themselves.

One module per framework's stack, as one reader per framework in extract/frameworks/.
"""

from __future__ import annotations

from llmmem.budget.setup import Framework
from llmmem.budget.stacks.hf import HF_STACK, Stack
from llmmem.budget.stacks.torchtune import TORCHTUNE_STACK
from llmmem.budget.stacks.trl import TRL_STACK

STACKS: dict[Framework, Stack] = {Framework.TORCHTUNE: TORCHTUNE_STACK, Framework.TRL: TRL_STACK}


def stack_for(framework: Framework) -> Stack:
    """The stack a framework trains with; the Hugging Face one where it has none of its own
    (LitGPT's model code is sized by the shared budget's own LitGPT rules)."""
    return STACKS.get(framework, HF_STACK)


__all__ = ["Stack", "stack_for"]

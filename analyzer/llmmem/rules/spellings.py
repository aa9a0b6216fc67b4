"""How each framework's config file spells the levers a fix pulls.

The tables live beside their readers, as `FIX_SPELLINGS` in `extract/frameworks/<name>.py`
(see `llmmem.extract.frameworks.spelling`): for each lever (the keys of `fixes.CANDIDATES`) the
key paths and values that framework's own config reader takes, or no entry where the framework
has no such setting (then no fix is offered for that file). This module gathers them by the
dialect name `config_dialect` gives a plan.
"""

from __future__ import annotations

from llmmem.extract.frameworks import (
    accelerate,
    axolotl,
    deepspeed,
    deepspeed_chat,
    hf_yaml,
    litgpt,
    llamafactory,
    torchtune,
    verl,
)
from llmmem.extract.frameworks.spelling import KeyWrite, Spelling, ValueOf
from llmmem.plan import TrainingPlan

__all__ = ["HF", "SPELLINGS", "TRL", "KeyWrite", "Spelling", "ValueOf", "spelling"]

HF = hf_yaml.FIX_SPELLINGS
TRL = hf_yaml.TRL_FIX_SPELLINGS

SPELLINGS: dict[str, dict[str, Spelling]] = {
    "hf": HF,
    "trl": TRL,
    "axolotl": axolotl.FIX_SPELLINGS,
    "llamafactory": llamafactory.FIX_SPELLINGS,
    "llamafactory-v1": llamafactory.V1_FIX_SPELLINGS,
    "torchtune": torchtune.FIX_SPELLINGS,
    "litgpt": litgpt.FIX_SPELLINGS,
    "deepspeed": deepspeed.FIX_SPELLINGS,
    "accelerate": accelerate.FIX_SPELLINGS,
    "verl": verl.FIX_SPELLINGS,
    # a shell launcher starting one of DeepSpeed-Chat's scripts (`rules/shell_edits`)
    "deepspeed-chat": deepspeed_chat.FIX_SPELLINGS,
}


def spelling(dialect: str, lever: str) -> Spelling | None:
    """The keys `dialect` writes `lever` with; None where it has no such setting."""
    return SPELLINGS.get(dialect, {}).get(lever)


def config_dialect(plan: TrainingPlan) -> str:
    """The name of the spelling table (this module's) for a YAML/JSON plan."""
    schema = plan.extra.get("llamafactory_schema")
    if plan.framework == "llamafactory" and getattr(schema, "value", None) == "v1":
        return "llamafactory-v1"
    return plan.framework

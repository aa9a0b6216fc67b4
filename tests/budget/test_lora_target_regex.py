"""A LoRA `target_modules` written as one string is a regular expression PEFT matches against
each module's whole name (axolotl's multimodal examples adapt the language model only so). The
parameters the budget trains are PEFT's own count on a tiny Qwen2.5-VL built here (peft 0.21.2,
transformers 5.24)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from vision_steps import QWEN2_5_VL  # noqa: E402

from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.budget.setup import LoraSetup, TrainingSetup, VisionSetup  # noqa: E402
from llmmem.models.architectures import spec_from_config  # noqa: E402
from llmmem.models.spec import ModelSource  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

LANGUAGE_ONLY = (
    r"model.language_model.layers.[\d]+.(mlp|cross_attn|self_attn).(up|down|gate|q|k|v|o)_proj"
)
VISION_ATTENTION = r".*visual.blocks.\d+.attn.(qkv|proj)"
FIRST_TWO_LAYERS = r"model.language_model.layers.[01].self_attn.(q|v)_proj"


def peft_trainable(pattern: str) -> int:
    config = transformers.AutoConfig.for_model(**QWEN2_5_VL)
    with torch.device("meta"):
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=pattern))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def budget_for(pattern: str) -> object:
    spec = spec_from_config(QWEN2_5_VL, model_id="tiny-qwen2_5_vl", source=ModelSource.CONFIG)
    setup = TrainingSetup(
        method="lora",
        lora=LoraSetup(r=8, alpha=16, targets=[pattern]),
        batch=1,
        seq=256,
        vision=VisionSetup(images=1, height=224, width=224, seq_includes_images=True),
    )
    return estimate_budget(spec, setup, with_first_step=False)


@pytest.mark.parametrize("pattern", [LANGUAGE_ONLY, VISION_ATTENTION])
def test_an_expression_trains_what_peft_trains(pattern: str) -> None:
    assert budget_for(pattern).trainable_params == peft_trainable(pattern)  # type: ignore[attr-defined]


def test_an_expression_that_picks_some_layers_is_said_to_be_an_upper_bound() -> None:
    budget = budget_for(FIRST_TWO_LAYERS)
    assert budget.trainable_params >= peft_trainable(FIRST_TWO_LAYERS)  # type: ignore[attr-defined]
    assert any("in 2 of 4 layers" in note for note in budget.notes)  # type: ignore[attr-defined]

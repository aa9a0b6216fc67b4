"""Every bundled model, under every method, gives a budget whose parts add up."""

from __future__ import annotations

import pytest

from llmmem.budget import Phase, TrainingSetup, estimate_budget
from llmmem.budget.setup import DistributedSetup, LoraSetup
from llmmem.models.architectures import spec_from_config
from llmmem.models.catalog import catalog_entry, catalog_ids
from llmmem.models.spec import ModelSource

SETUPS = {
    "full-bf16": TrainingSetup(batch=2, seq=512),
    "full-fp32-ckpt": TrainingSetup(batch=2, seq=512, precision="fp32", grad_ckpt=True),
    "lora-default-targets": TrainingSetup(batch=2, seq=512, method="lora"),
    "lora-all-linear-eager": TrainingSetup(
        batch=2, seq=512, method="lora", attn="eager", lora=LoraSetup(targets=["all-linear"])
    ),
    "qlora": TrainingSetup(batch=2, seq=512, method="qlora", grad_ckpt=True),
    "zero3-8": TrainingSetup(
        batch=2, seq=512, distributed=DistributedSetup(world_size=8, zero_stage=3)
    ),
    "generate": TrainingSetup(mode="generate", batch=2, seq=512, precision="bf16-true"),
}


@pytest.mark.parametrize("model_id", catalog_ids())
def test_budget_adds_up(model_id: str) -> None:
    entry = catalog_entry(model_id)
    assert entry is not None
    spec = spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)
    for name, setup in SETUPS.items():
        budget = estimate_budget(spec, setup)
        assert budget.params == spec.total_params, name
        assert budget.allocated_peak_bytes == max(p.allocated_bytes for p in budget.phases)
        assert budget.reserved_peak_bytes >= budget.allocated_peak_bytes
        for phase in budget.phases:
            assert all(term.bytes >= 0 for term in phase.components.values()), (name, phase)
        if setup.mode.value == "train":
            assert 0 < budget.trainable_params <= spec.total_params + spec.params.embedding
            # weights alone never exceed the peak
            step = budget.phase(Phase.OPTIMIZER_STEP)
            assert step.allocated_bytes <= budget.allocated_peak_bytes


def test_latent_attention_caches_its_latent() -> None:
    """DeepSeek-V2-Lite caches kv_lora_rank + qk_rope_head_dim = 576 values per token and block
    (transformers 5 keeps the compressed latent), not K and V for 16 heads of 192 and 128."""
    from llmmem.budget.result import Component

    entry = catalog_entry("deepseek-ai/DeepSeek-V2-Lite")
    assert entry is not None
    spec = spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)
    setup = TrainingSetup(mode="generate", batch=2, seq=512, precision="bf16-true")
    budget = estimate_budget(spec, setup)
    kv = budget.phases[0].components[Component.KV_CACHE]
    assert kv.bytes == 27 * 576 * (setup.seq + setup.new_tokens) * 2 * 2
    assert "576-wide latent" in kv.formula

"""Expert parallelism measured: a tiny Qwen3-MoE (8 experts, top-2) laid out by transformers
5.24's own `DistributedConfig(ep_size=N, fsdp_size=N)` on 2 and 4 CPU ranks over gloo (its
`AllToAllEP` dispatch and combine, FSDP2 by its plan), one sample of 1,024 tokens per rank,
full fine-tuning in bf16 with AdamW. The budget is the average rank's: the group's mean peak
in every phase within 5% of it; each rank within 8%, the rest being the router's imbalance (a
rank whose experts are chosen more often receives more rows; a random router here)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from ep_rank_step import QWEN3_MOE, SEQ  # noqa: E402
from rank_steps import measured_ranks  # noqa: E402

from llmmem.budget.distributed import gathered_block_params, sharding_for  # noqa: E402
from llmmem.budget.expert_parallel import expert_parallel_spec  # noqa: E402
from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.budget.result import Component  # noqa: E402
from llmmem.budget.setup import DistributedSetup, SetupError, TrainingSetup  # noqa: E402
from llmmem.models.architectures import spec_from_config  # noqa: E402
from llmmem.models.spec import ModelSource  # noqa: E402

SPEC = spec_from_config(
    dict(QWEN3_MOE, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"]),
    model_id="tiny-qwen3-moe",
    source=ModelSource.CONFIG,
)


def measured(ranks: int, out: Path) -> list[dict[str, int]]:
    return measured_ranks(
        "ep_rank_step.py", ranks, out, port=29750 + ranks, env={"EP_SEQ": str(SEQ)}
    )


def setup_for(ranks: int, ep: int, **changes: object) -> TrainingSetup:
    distributed = DistributedSetup(world_size=ranks, fsdp="full_shard", ep_size=ep)
    return TrainingSetup(
        method="full",
        batch=1,
        seq=SEQ,
        precision="bf16-true",
        optim="adamw_torch",
        attn="sdpa",
        distributed=replace(distributed, **changes),  # type: ignore[arg-type]
    )


def predicted(ranks: int, ep: int) -> dict[str, int]:
    budget = estimate_budget(SPEC, setup_for(ranks, ep), with_first_step=False)
    return {phase.phase.value: phase.allocated_bytes for phase in budget.phases}


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_expert_parallel_rank_near_the_budget(ranks: int, tmp_path: Path) -> None:
    budget = predicted(ranks, ranks)
    peaks = measured(ranks, tmp_path)
    for phase in budget:
        mean = sum(p[phase] for p in peaks) / ranks
        assert abs(budget[phase] - mean) / mean <= 0.05, (phase, budget[phase], mean)
        for rank, p in enumerate(peaks):
            assert abs(budget[phase] - p[phase]) / p[phase] <= 0.08, (rank, phase, p[phase])


def test_a_twice_larger_group_halves_the_experts_a_rank_holds_and_gathers() -> None:
    """Without FSDP sharding them (efsdp = 1), a rank's experts are E / ep; the blocks' other
    parameters are the same on every rank; what a block gathers loses the other experts."""
    two, four = (expert_parallel_spec(SPEC, setup_for(4, ep))[0] for ep in (2, 4))
    assert two.params.experts == SPEC.params.experts // 2
    assert four.params.experts == SPEC.params.experts // 4
    assert two.params.total - two.params.experts == SPEC.params.total - SPEC.params.experts
    assert four.params.total - four.params.experts == two.params.total - two.params.experts
    assert two.num_experts == four.num_experts == SPEC.num_experts  # the router scores all
    expert = SPEC.params.experts // (len(SPEC.blocks) and sum(b.count for b in SPEC.blocks))
    gathered = [
        gathered_block_params(spec.blocks[0], sharding_for(setup_for(4, ep)))
        for spec, ep in ((SPEC, 1), (two, 2), (four, 4))
    ]
    assert gathered[0] - gathered[1] == expert // 2
    assert gathered[1] - gathered[2] == expert // 4
    # FSDP over every rank gives each one the same experts' bytes with or without the group
    states = [
        estimate_budget(SPEC, setup_for(4, ep), with_first_step=False)
        .phases[-1]
        .components[Component.OPTIMIZER_STATES]
        .bytes
        for ep in (1, 2, 4)
    ]
    assert states[0] == states[1] == states[2]


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"fsdp": None}, "sized under FSDP"),
        ({"fsdp": None, "zero_stage": 3}, "DeepSpeed's ep_size divides its own MoE layers"),
    ],
)
def test_layouts_no_framework_runs_are_refused(changes: dict[str, object], why: str) -> None:
    with pytest.raises(SetupError, match=why):
        estimate_budget(SPEC, setup_for(4, 2, **changes), with_first_step=False)


def test_a_group_that_divides_neither_experts_nor_ranks_is_refused() -> None:
    with pytest.raises(SetupError, match="does not divide the 3 data-parallel ranks"):
        DistributedSetup(world_size=3, fsdp="full_shard", ep_size=2)
    with pytest.raises(SetupError, match="8 routed experts of tiny-qwen3-moe do not divide"):
        estimate_budget(SPEC, setup_for(6, 3), with_first_step=False)

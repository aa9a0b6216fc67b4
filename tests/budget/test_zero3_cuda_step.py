"""DeepSpeed ZeRO-3 on GPUs: the optimizer step as DeepSpeed 0.19.8 runs it there, and the peak
that grows with the micro-batch.

The setup is the published one (HF Trainer, Llama-3-8B full fine-tuning, fp16, 4 GPUs, 512
tokens, gradient checkpointing, Liger's fused loss). Each expected number is derived from
DeepSpeed's code (budget.model_states' and budget.optimizers' docstrings cite it):

- the rank's partition is ceil(numel / 4) of each tensor, and ZeRO-3 steps it in sub-groups of
  at least `sub_group_size` (1e9) elements (stage3.py:1210-1233), one at a time: the largest
  sub-group's 16-bit gradients flattened (2 B) and copied to fp32 (4 B) is the step's largest
  moment under DeepSpeed's in-place FusedAdam (ops/adam/fused_adam.py), 4 B fp32 gradient +
  4 B `_foreach_sqrt` under torch's foreach AdamW;
- the model's states (16-bit partition, flat 16-bit gradient partition, fp32 master and two fp32
  moments: 2 + 2 + 12 B per element of the partition) and the 5e8-element bucket stay the same
  at every batch, so from the batch where backward passes the step the peak grows by what
  activations and logits grow.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from llmmem.budget.distributed import (
    DEEPSPEED_SUB_GROUP_SIZE,
    largest_sub_group,
    zero3_largest_sub_group,
)
from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Component, Phase
from llmmem.budget.setup import DistributedSetup, TrainingSetup
from llmmem.budget.weights import build_inventory
from llmmem.models.architectures import spec_from_config
from llmmem.models.catalog import catalog_entry
from llmmem.models.spec import ModelSource, ModelSpec

GiB = 2**30
WORLD = 4
BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size default, runtime/zero/config.py:113


@pytest.fixture(scope="module")
def llama3_8b() -> ModelSpec:
    entry = catalog_entry("meta-llama/Meta-Llama-3-8B")
    assert entry is not None
    return spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)


def zero3(batch: int, optim: str, loss: str = "liger") -> TrainingSetup:
    return TrainingSetup(
        method="full",
        batch=batch,
        seq=512,
        precision="fp16",
        optim=optim,
        loss=loss,
        grad_ckpt=True,
        distributed=DistributedSetup(world_size=WORLD, zero_stage=3),
    )


def partition_elements(spec: ModelSpec) -> int:
    """One rank's share of every tensor (ceil of numel / ranks)."""
    inv = build_inventory(spec, zero3(1, "adamw_torch"))
    return sum(math.ceil(g.numel / WORLD) * g.tensors for g in inv.trainable)


def test_sub_groups_are_cut_as_deepspeed_cuts_them() -> None:
    """`largest_sub_group` against DeepSpeed's own `_create_fp16_sub_groups` on parameters that
    report their partition sizes."""
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    sizes = [131_334_144] + [4_194_304, 1_048_576, 1_048_576, 4_194_304] * 30 + [131_334_144]
    params = [SimpleNamespace(partition_numel=lambda n=n: n) for n in sizes]
    for size in (DEEPSPEED_SUB_GROUP_SIZE, 100_000_000, 5_000_000, 10**12):
        owner = SimpleNamespace(sub_group_size=size)
        groups = stage3.DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(owner, params)
        theirs = max(sum(p.partition_numel() for p in group) for group in groups)
        assert largest_sub_group(sizes, size) == theirs


def test_llama3_8b_over_4_ranks_steps_two_sub_groups_of_about_1e9(llama3_8b: ModelSpec) -> None:
    inv = build_inventory(llama3_8b, zero3(1, "adamw_torch"))
    sub = zero3_largest_sub_group(llama3_8b, zero3(1, "adamw_torch"), inv.trainable)
    partition = partition_elements(llama3_8b)
    assert partition == pytest.approx(2.0075e9, rel=1e-3)
    # the embedding and 16 blocks, then 16 blocks and the head: each just over 1e9
    assert DEEPSPEED_SUB_GROUP_SIZE <= sub < DEEPSPEED_SUB_GROUP_SIZE + 60_000_000


@pytest.mark.parametrize(
    ("optim", "per_element"),
    [
        # FusedAdam steps in place: the prepare moment (16-bit flat + fp32 copy) is the largest
        ("deepspeed_fused_adam", 2 + 4),
        # torch's foreach AdamW as the trainer's client optimizer: fp32 gradient + _foreach_sqrt
        ("adamw_torch", 4 + 4),
    ],
)
def test_step_temporaries_are_one_sub_group_not_the_partition(
    llama3_8b: ModelSpec, optim: str, per_element: int
) -> None:
    setup = zero3(1, optim)
    budget = estimate_budget(llama3_8b, setup)
    step = next(p for p in budget.phases if p.phase is Phase.OPTIMIZER_STEP)
    inv = build_inventory(llama3_8b, setup)
    sub = zero3_largest_sub_group(llama3_8b, setup, inv.trainable)
    temporaries = step.components[Component.TEMPORARIES].bytes
    assert temporaries == per_element * sub + 2 * BUCKET
    assert "sub-group" in step.components[Component.TEMPORARIES].formula
    partition = partition_elements(llama3_8b)
    # before, the whole partition's fp32 copy and a foreach buffer over it: 15.9 GiB
    assert temporaries < (4 + 4) * partition / 2 + 2 * BUCKET
    # the states: 16-bit weights and gradients, fp32 master and two moments, per element
    states = sum(
        step.components[c].bytes
        for c in (Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES)
    )
    assert states == pytest.approx((2 + 2 + 12) * partition, rel=1e-3)


def test_the_peak_grows_with_the_micro_batch_as_activations_and_logits_do(
    llama3_8b: ModelSpec,
) -> None:
    batches = [1, 2, 4, 8, 16, 24, 32, 48, 64]
    budgets = {b: estimate_budget(llama3_8b, zero3(b, "deepspeed_fused_adam")) for b in batches}
    peaks = [budgets[b].allocated_peak_bytes for b in batches]
    assert peaks == sorted(peaks)
    # at one sample a row the step's prepare moment is the peak (model states + 6 B × sub-group
    # + bucket: 36.5 GiB, the published allocated peak 37.4 GiB); the backward's recompute of the
    # last block passes it by 24 samples and stays the peak
    assert budgets[1].peak_phase is Phase.OPTIMIZER_STEP
    assert budgets[1].allocated_peak_bytes / GiB == pytest.approx(36.5, abs=0.1)
    for b in batches[batches.index(24) :]:
        assert budgets[b].peak_phase is Phase.BACKWARD, b
    # past that, what grows is what the batch holds: checkpointed block inputs, the running
    # block's tensors and the loss's chunk; weights, gradients, states and buckets stay
    for low, high in [(16, 32), (32, 64)]:
        lo, hi = (
            next(p for p in budgets[b].phases if p.phase is Phase.BACKWARD) for b in (low, high)
        )
        fixed = (Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES)
        for component in fixed:
            assert lo.components[component].bytes == hi.components[component].bytes
        growth = hi.allocated_bytes - lo.allocated_bytes
        per_sample = growth / (high - low)
        # per sample of 512 tokens: 32 checkpointed inputs (2 B × h) and a block recomputed
        assert 0.2 * GiB < per_sample < 0.3 * GiB
    # the step does not depend on the batch
    steps = {
        next(p for p in budgets[b].phases if p.phase is Phase.OPTIMIZER_STEP).allocated_bytes
        for b in batches
    }
    assert len(steps) == 1


def test_without_liger_the_logits_make_the_slope(llama3_8b: ModelSpec) -> None:
    """HF's loss keeps 12 B per logit at the start of backward: 0.73 GiB per 512-token sample
    of a 128,256-token vocabulary, on top of the checkpointed inputs."""
    low, high = (estimate_budget(llama3_8b, zero3(b, "adamw_torch", "standard")) for b in (16, 32))
    assert low.peak_phase is high.peak_phase is Phase.BACKWARD
    per_sample = (high.allocated_peak_bytes - low.allocated_peak_bytes) / 16
    logits = 12 * 512 * llama3_8b.vocab_size
    inputs = 32 * 2 * 512 * llama3_8b.hidden_size
    assert per_sample == pytest.approx(logits + inputs, rel=0.03)

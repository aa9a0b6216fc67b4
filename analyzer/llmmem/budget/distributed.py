"""How data parallelism divides model states across devices and what buffers it adds.

- DDP: every rank holds everything; the reducer keeps gradient buckets the size of the gradients
  (unless `gradient_as_bucket_view=True`).
- DeepSpeed ZeRO-1/2/3 shards optimizer states (with fp32 master weights for 16-bit training),
  then gradients, then parameters, by the world size; offload moves them to the CPU. Its own
  buffers (gradient buckets, ZeRO-3's gathered parameters) are in `phases.py`.
- FSDP shards parameters, gradients and states (full shard) and all-gathers one wrapped block at
  a time (two with prefetch); hybrid shard only shards inside a node. FSDP2 (the HF trainer's
  default since transformers 5) shards each parameter along its first dimension and pads it so
  that every rank holds the same number of rows: 8 experts stored as one (8, 2I, h) tensor over
  16 ranks leave one expert, an eighth, on every rank, not a sixteenth.

ZeRO-3's optimizer step walks the rank's partition in sub-groups (DeepSpeed 0.19.8,
runtime/zero/stage3.py): `_create_fp16_sub_groups` (:1210-1233) cuts each optimizer parameter
group, in the parameters' order, into runs of at least `sub_group_size` partition elements
(1e9 by default, runtime/zero/config.py:182), and `step` (:2873-2931) prepares, steps and
releases one sub-group at a time: its fp32 gradient exists only while that sub-group steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmmem.budget.setup import FsdpShard, TrainingSetup
from llmmem.budget.weights import ParameterGroup
from llmmem.models.spec import BlockGroup, ModelSpec

# DeepSpeed 0.19.8's `sub_group_size` (runtime/zero/config.py:182), which the HF trainer does not
# fill in ("auto" is not one of its keys)
DEEPSPEED_SUB_GROUP_SIZE = 1_000_000_000
# the parameters the HF trainer leaves out of weight decay: a second optimizer parameter group,
# cut into sub-groups of its own (trainer.py `get_decay_parameter_names`: biases and norms)
NO_DECAY_KINDS = ("bias", "norm")


@dataclass(frozen=True)
class Sharding:
    weights: float  # fraction of the weights each rank holds
    gradients: float
    states: float
    shard_group: int  # devices one copy is spread over
    label: str
    gathered_blocks: int = 0  # blocks whose full parameters are gathered at once
    gradient_buckets: bool = False  # DDP keeps bucket copies of the gradients
    master_weights: bool = False  # fp32 master copy kept with the states (DeepSpeed, 16-bit)
    offload_states: bool = False
    offload_params: bool = False
    pads_each_parameter: bool = False  # FSDP2: dim 0 of each parameter, padded per rank
    # FSDP and k-bit weights: the bytes of one quantized weight that FSDP shards (the packed
    # values, where bnb_4bit_quant_storage is a float dtype), out of all it costs; the rest,
    # bitsandbytes' quant state (absmax and its constants), is not a parameter and stays whole
    # on every rank. 0: uint8 storage, which FSDP cannot flatten with the float parameters: the
    # quantized weights stay whole on every rank (the run keeps them out of FSDP's units)
    kbit_sharded_bytes: float = 0.0
    kbit_blocks: bool = False  # the blocks' linears are k-bit (QLoRA / LoRA over a k-bit base)
    kbit_experts: bool = False  # routed experts are k-bit too (transformers 4's nn.Linear ones)
    fused_experts: bool = True  # routed experts are 3-D tensors (transformers 5), not Linears
    # expert parallelism: the ranks holding the same routed experts, which FSDP shards them
    # over (transformers' `efsdp`, shard_group ÷ ep); 0: the experts shard like the rest
    expert_group: int = 0

    def share(self, group: ParameterGroup, fraction: float) -> float:
        """The fraction of `group` one rank holds, where the states it belongs to are
        `fraction` of the whole: FSDP2 gives every rank ceil(rows / ranks) rows of each
        parameter (rows: its first dimension), the rest divide evenly; of a quantized weight
        FSDP shards only the packed values."""
        if group.quantized and fraction < 1:
            packed = min(self.kbit_sharded_bytes / group.bytes_per_param, 1.0)
            return packed * fraction + (1 - packed)
        ranks = self.shard_group
        if group.shard_rows and self.expert_group and fraction < 1:
            # this rank's experts, sharded over the ranks that hold the same ones
            fraction, ranks = fraction * ranks / self.expert_group, self.expert_group
        if fraction >= 1 or not self.pads_each_parameter:
            return min(fraction, 1.0)
        rows = group.shard_rows or group.rows
        return math.ceil(rows / ranks) / rows if rows else fraction


def sharding_for(setup: TrainingSetup) -> Sharding:
    d = setup.distributed
    world = d.shard_world  # a tensor-parallel group holds one model between its ranks
    if world == 1 and not d.zero_stage and d.fsdp is None:
        return Sharding(1, 1, 1, 1, "single device")
    if d.zero_stage:
        stage = d.zero_stage
        master = setup.precision.is_autocast or setup.precision.weight_bytes == 2
        return Sharding(
            weights=1 / world if stage == 3 else 1,
            # stage 1 reduces through the same bucket as stage 2 (DeepSpeed 0.19, measured):
            # after backward each rank keeps only its partition's gradients
            gradients=1 / world,
            states=1 / world,
            shard_group=world,
            label=f"DeepSpeed ZeRO-{stage} over {world} devices"
            + (" with optimizer offload" if d.offload_optimizer else "")
            + (" with parameter offload" if d.offload_params else ""),
            gathered_blocks=1 if stage == 3 else 0,
            master_weights=master,
            offload_states=d.offload_optimizer,
            offload_params=d.offload_params,
        )
    if d.fsdp is FsdpShard.NO_SHARD:
        quant = setup.quant
        return Sharding(
            1,
            1,
            1,
            1,
            f"FSDP no_shard over {world} devices (a replica per device)"
            + (" with CPU offload" if d.offload_params or d.offload_optimizer else ""),
            offload_states=d.offload_optimizer or d.offload_params,
            offload_params=d.offload_params,
            kbit_blocks=quant is not None,
            fused_experts=not setup.experts_are_linears,
        )
    if d.fsdp is not None:
        group = min(world, d.gpus_per_node) if d.fsdp is FsdpShard.HYBRID_SHARD else world
        params_sharded = d.fsdp is not FsdpShard.SHARD_GRAD_OP
        quant = setup.quant
        packed = quant.bits / 8 if quant is not None and quant.storage_shardable else 0.0
        return Sharding(
            weights=1 / group if params_sharded else 1,
            gradients=1 / group,
            states=1 / group,
            shard_group=group,
            label=f"FSDP {d.fsdp.value} over {group} of {world} devices"
            + (" with CPU offload" if d.offload_params or d.offload_optimizer else ""),
            gathered_blocks=2 if params_sharded else 0,
            offload_states=d.offload_optimizer or d.offload_params,
            offload_params=d.offload_params,
            pads_each_parameter=True,
            kbit_sharded_bytes=packed,
            kbit_blocks=quant is not None,
            kbit_experts=quant is not None and setup.experts_are_linears,
            fused_experts=not setup.experts_are_linears,
            expert_group=group // d.ep_size if d.ep_size > 1 else 0,
        )
    return Sharding(1, 1, 1, 1, f"DDP over {world} devices", gradient_buckets=True)


def reduce_bucket_elements(setup: TrainingSetup, hidden_size: int) -> int:
    """DeepSpeed's gradient reduction bucket, in elements ("auto": hidden_size², as the HF
    trainer and accelerate fill it in)."""
    size = setup.distributed.reduce_bucket_size
    return hidden_size * hidden_size if size is None else size


def prefetch_elements(setup: TrainingSetup, hidden_size: int) -> int:
    """ZeRO-3's prefetch bucket in elements ("auto": 0.9·hidden_size², as the trainer fills it)."""
    size = setup.distributed.prefetch_bucket_size
    return int(0.9 * hidden_size * hidden_size) if size is None else size


def persistence_threshold(setup: TrainingSetup, hidden_size: int) -> int:
    """ZeRO-3 keeps parameters of at most this many elements whole on every rank ("auto":
    10·hidden_size, as the trainer fills it)."""
    size = setup.distributed.param_persistence_threshold
    return 10 * hidden_size if size is None else size


def persistent_groups(
    setup: TrainingSetup, hidden_size: int, groups: list[ParameterGroup]
) -> list[ParameterGroup]:
    """The parameters ZeRO-3 keeps whole on every rank (over more than one): each of at most
    `stage3_param_persistence_threshold` elements — norms and biases at real sizes, whole
    projections in a small model, LoRA adapters. Each also keeps its partition."""
    d = setup.distributed
    if d.zero_stage != 3 or d.shard_world == 1:
        return []
    threshold = persistence_threshold(setup, hidden_size)
    return [g for g in groups if g.numel <= threshold]


def overlaps_communication(setup: TrainingSetup) -> bool:
    d = setup.distributed
    return d.zero_stage == 3 if d.overlap_comm is None else d.overlap_comm


def deepspeed_zero_section(setup: TrainingSetup, hidden_size: int) -> dict[str, object]:
    """The `zero_optimization` section DeepSpeed runs the plan with, "auto" values filled in."""
    d = setup.distributed
    section: dict[str, object] = {
        "stage": d.zero_stage,
        "reduce_bucket_size": reduce_bucket_elements(setup, hidden_size),
        "overlap_comm": overlaps_communication(setup),
        "contiguous_gradients": d.contiguous_gradients,
    }
    if d.zero_stage == 3:
        section["stage3_max_reuse_distance"] = d.max_reuse_distance
        section["stage3_prefetch_bucket_size"] = prefetch_elements(setup, hidden_size)
        section["stage3_param_persistence_threshold"] = persistence_threshold(setup, hidden_size)
        section["sub_group_size"] = d.sub_group_size
    if d.offload_optimizer:
        section["offload_optimizer"] = {"device": "cpu"}
    if d.offload_params:
        section["offload_param"] = {"device": "cpu"}
    return section


def gathered_block_params(block: BlockGroup, shard: Sharding) -> int:
    """The elements one gathered block takes on a rank, counted in the compute dtype: with
    FSDP2's padding each routed expert tensor gathers ceil(experts ÷ ranks) × ranks experts'
    rows, and the parameters copied out of the all-gather keep that padded storage (simulated:
    4 experts over 8 ranks gather as 8). Other first dimensions are large; their padding is a
    few rows. k-bit linears gather as their packed storage (a quarter of a 16-bit weight for
    4 bits), or not at all where FSDP does not shard them."""
    params = block.params_per_block
    for lin in block.linears:
        moe_part = lin.role in ("expert", "router")
        if shard.kbit_blocks and (not moe_part or shard.kbit_experts):
            # the packed values in a 16-bit storage dtype: bits/16 of a 16-bit weight
            gathered = round(lin.params * shard.kbit_sharded_bytes / 2)
            params -= lin.params - gathered
    ranks = shard.expert_group or shard.shard_group
    if not shard.pads_each_parameter or ranks <= 1 or not shard.fused_experts:
        return params
    for lin in block.linears:
        if lin.role == "expert" and lin.count:
            padded = math.ceil(lin.count / ranks) * ranks
            params += (padded - lin.count) * lin.params // lin.count
    return params


def zero3_partition_order(
    spec: ModelSpec, groups: list[ParameterGroup], world: int
) -> list[list[int]]:
    """Each optimizer parameter group's tensors as one rank's partitions, in the model's order
    (the embeddings, each block's tensors, then the rest: the final norm and the head).

    A parameter's partition is ceil(numel ÷ ranks) elements (stage3.py `partition_numel`, the
    last rank padded); the HF trainer hands DeepSpeed two groups, the weights and the biases and
    norms it exempts from weight decay."""
    blocks = sum(b.count for b in spec.blocks)
    decay: list[list[int]] = [[], [], []]  # before the blocks, per block, after them
    no_decay: list[int] = []
    per_block: list[int] = []
    for group in groups:
        share = math.ceil(group.numel / world)
        if group.kind in NO_DECAY_KINDS:
            no_decay += [share] * group.tensors
        elif group.kind == "embedding":
            decay[0] += [share] * group.tensors
        elif blocks and group.tensors % blocks == 0 and group.kind not in ("head", "saved_copy"):
            per_block += [share] * (group.tensors // blocks)
        else:
            decay[2] += [share] * group.tensors
    decay[1] = per_block * blocks
    ordered = [decay[0] + decay[1] + decay[2], no_decay]
    return [sizes for sizes in ordered if sizes]


def largest_sub_group(partitions: list[int], sub_group_size: int) -> int:
    """The elements of the largest sub-group `_create_fp16_sub_groups` makes of one parameter
    group (stage3.py:1210-1233): the whole group where it is no larger than `sub_group_size`,
    else runs of parameters closed as soon as they reach it (the last run takes the rest)."""
    total = sum(partitions)
    if sub_group_size >= total:
        return total
    largest = run = 0
    for size in partitions:
        run += size
        if run >= sub_group_size:
            largest, run = max(largest, run), 0
    return max(largest, run)


def zero3_largest_sub_group(
    spec: ModelSpec,
    setup: TrainingSetup,
    trainable: list[ParameterGroup],
    sub_group_size: int = DEEPSPEED_SUB_GROUP_SIZE,
) -> int:
    """The elements of the largest sub-group ZeRO-3 steps at once on one rank."""
    world = max(1, setup.distributed.shard_world)
    groups = zero3_partition_order(spec, trainable, world)
    return max((largest_sub_group(sizes, sub_group_size) for sizes in groups), default=0)

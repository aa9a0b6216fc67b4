"""Expert parallelism: a MoE layer's routed experts divided over a group of ranks, each token
sent to the ranks of the experts it is routed to and its outputs sent back.

Read in transformers 5.24.0 (the release llmmem measures with), which runs it from
`DistributedConfig(ep_size=N, fsdp_size=M)` (`enable_expert_parallel=True` is its deprecated
spelling of `ep_size=tp_size`):

- `distributed/configuration_utils.py:100-123, 174-185`: `ep_size` must divide
  `fsdp_size · tp_size`; the experts' own FSDP group is `efsdp = fsdp · tp / ep`, the ranks
  holding the same experts.
- `distributed/expert_parallel.py:85-114` (`MoEParamShard`, the `grouped_gemm` style): each
  rank keeps `num_experts / ep` of every 3-D expert tensor (`Shard(0)`); the router, the shared
  experts, attention, the norms and the embeddings have no rule in `base_model_ep_plan`
  (`models/qwen3_moe/configuration_qwen3_moe.py:69-73`) and stay whole.
- `distributed/expert_parallel.py:159-259` (`AllToAllEP`, what `AutoEP`, :301-323, runs in
  training): the k routed copies of each token, sorted by expert (`hidden_states[order // k]`),
  go to their experts' ranks in one `all_to_all_single_autograd`, the experts run on what
  arrives, and a second all-to-all brings the outputs back, where they are put back in order
  and weighted by the router. These buffers live while a MoE layer runs, not at the step's
  peak (the loss, the start of backward): measured on 2 and 4 CPU ranks, the saved tensors are
  those of the same layer without expert parallelism, and no term is added for them.
- `distributed/fsdp.py:195-213`: FSDP2 shards each experts module over `efsdp` and the rest of
  the model over the data-parallel ranks.

So one rank holds `E / ep` experts of every MoE layer, their weights, gradients and optimizer
states sharded by FSDP over `shard ranks / ep` ranks, which leaves each rank the same experts'
bytes as FSDP over every rank without expert parallelism: what the group changes is what a
block gathers (`E / ep` experts instead of all `E`) and where the tokens go. Each rank sends
`k · N` rows of `h` values and receives as many on average; the router balances the experts
only on average (its auxiliary loss), and a rank whose experts are chosen more often receives
more rows and keeps more of the experts' saved tensors, up to `ep · k · N` rows when every
token of the group goes to its experts (transformers' MoE layers have no capacity factor to cap
it). Measured with a random router, ranks differ by up to 6% of their peak.

torchtitan (read at b5bcd76, `torchtitan/models/common/token_dispatcher.py`
`AllToAllTokenDispatcher`, `models/common/moe.py` `RoutedExperts`) divides the experts the
same way, `Shard(0)` over an EP mesh borrowed from `dp_shard · cp · tp`
(`distributed/parallel_dims.py:380`, `efsdp = dp_shard · cp · tp / ep`), but exchanges the
token counts first and runs dispatch and combine in its dispatcher, outside the experts; its
`TorchAOTokenDispatcher` pads each expert's rows to a multiple for quantized grouped GEMMs.
DeepSpeed-MoE's `ep_size` divides DeepSpeed's own `MoE` layers, not a transformers model's: not
sized here."""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.setup import FsdpShard, SetupError, TrainingSetup
from llmmem.models.spec import BlockGroup, ModelSpec


def expert_parallel_spec(spec: ModelSpec, setup: TrainingSetup) -> tuple[ModelSpec, list[str]]:
    """The model one rank of an expert-parallel group holds: `E / ep` routed experts in every
    MoE layer, everything else whole (the router still scores all `E` experts)."""
    d = setup.distributed
    ep = d.ep_size
    if ep <= 1:
        return spec, []
    if not spec.num_experts:
        raise SetupError(
            f"expert parallelism over {ep} ranks needs a mixture of experts: {spec.model_id} "
            "has no routed experts"
        )
    if spec.num_experts % ep:
        raise SetupError(
            f"the {spec.num_experts} routed experts of {spec.model_id} do not divide over an "
            f"expert-parallel group of {ep}"
        )
    if setup.experts_are_linears:
        raise SetupError(
            f"expert parallelism is sized as transformers 5 runs it (3-D expert tensors); "
            f"transformers {setup.transformers_version} builds one nn.Linear per expert"
        )
    if setup.quant is not None:
        raise SetupError("expert parallelism with k-bit (bitsandbytes) weights is not sized")
    if d.zero_stage:
        raise SetupError(
            "expert parallelism under DeepSpeed ZeRO is not sized: DeepSpeed's ep_size divides "
            "its own MoE layers, not a transformers model's experts"
        )
    if d.fsdp is None or d.fsdp is FsdpShard.NO_SHARD:
        raise SetupError(
            "expert parallelism is sized under FSDP (--fsdp full_shard), as transformers' "
            "DistributedConfig and torchtitan shard the model beside it"
        )
    group = min(d.shard_world, d.gpus_per_node) if d.fsdp is FsdpShard.HYBRID_SHARD else None
    if group is not None and group % ep:
        raise SetupError(
            f"an expert-parallel group of {ep} does not divide the {group} ranks hybrid "
            "sharding shards over"
        )
    blocks: list[BlockGroup] = []
    for block in spec.blocks:
        if not block.num_experts:
            blocks.append(block)
            continue
        linears = [
            replace(lin, count=lin.count // ep) if lin.role == "expert" else lin
            for lin in block.linears
        ]
        blocks.append(replace(block, linears=linears, num_experts=block.num_experts // ep))
    params = replace(spec.params, experts=spec.params.experts // ep)
    local = replace(spec, params=params, blocks=blocks)
    notes = [
        f"expert parallelism over {ep} ranks: each holds {spec.num_experts // ep} of the "
        f"{spec.num_experts} routed experts of every MoE layer (sharded by FSDP over the "
        f"{max(d.shard_world // ep, 1)} ranks holding the same ones), the router, shared "
        "experts, attention, norms and embeddings whole; each token's "
        f"{spec.experts_per_token} routed copies sent to their experts' ranks and back "
        "(all-to-all)"
    ]
    return local, notes

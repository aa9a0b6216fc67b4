"""Context (sequence) parallelism: each sample's sequence divided over a group of ranks.

Every rank of a context-parallel group of `cp` ranks holds the whole model (sharded by FSDP or
ZeRO over the data- and context-parallel ranks together: accelerate's `dp_shard_cp` mesh,
DeepSpeed's sequence-data-parallel group) and `seq / cp` tokens of each sample: the blocks'
saved tensors, the logits and the loss are those of the local tokens. What differs is
attention, which needs every token's keys and values:

- **ring** (torch 2.13 `context_parallel`, `_templated_ring_attention`; ring-flash-attn does the
  same in its own kernels): with torch's default `rotate_method=ALL_GATHER` the local K and V
  are concatenated into one buffer and all-gathered once, so while a block's attention runs the
  whole sequence's K and V are on every rank, beside the concatenated local ones; the outputs of
  each step are merged in fp32 (`_SDPAMerger`, `convert_to_f32=True`). Backward
  (`_templated_ring_attention_backward`) gathers K and V again, accumulates dQ, dK and dV in
  fp32 (`zeros_like(..., dtype=float32)`) and passes dK and dV round the ring (a send and a
  receive buffer, fp32). Torch's ring dispatch covers the CUDA SDPA kernels only (flash,
  memory-efficient, cuDNN): it is not measured on this machine's CPU.
- **ring-flash-attn** (0.1.x `ring_flash_attn_func`, what axolotl's `sequence_parallel_degree`
  runs): K and V go rank to rank, the next pair received while the current one is used, the
  output and its log-sum-exp kept in fp32 across the steps; backward keeps dQ in fp32, dK and
  dV in fp32 with the pair in transit. It needs flash-attention's CUDA kernels: not measured
  on this machine.
- **ulysses** (DeepSpeed 0.19.8 `UlyssesSPAttentionHF`): before attention an all-to-all turns
  the local tokens of every head into every token of `heads / cp` heads, after it another turns
  them back. Attention then saves the head-sharded Q, K and V (as many values as the local
  ones) and each all-to-all holds a contiguous copy and its output while it runs. Where the
  group is wider than the KV heads, K and V are first repeated to `cp` heads
  (`kv_replication_factor`).

The formulas use N_l = b·s/cp local tokens, Q the query width (heads × head_dim), kvd the
width of K (and of V)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmmem.budget.result import Term
from llmmem.budget.setup import ContextParallel, SetupError, TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes


def with_context_parallel(spec: ModelSpec, setup: TrainingSetup) -> tuple[TrainingSetup, list[str]]:
    """The setup of one rank of the context-parallel group: its share of each sequence."""
    d = setup.distributed
    cp = d.cp_size
    if cp <= 1:
        return setup, []
    if d.cp_scheme is ContextParallel.ULYSSES and spec.num_attention_heads % cp:
        raise SetupError(
            f"Ulysses needs the query heads ({spec.num_attention_heads}) to divide over the "
            f"context-parallel group of {cp}"
        )
    # torch's load balancing cuts each sequence in 2·cp chunks; both schemes pad to a multiple
    unit = 2 * cp if d.cp_scheme is not ContextParallel.ULYSSES else cp
    padded = math.ceil(setup.seq / unit) * unit
    local = padded // cp
    notes = [
        f"context parallelism ({d.cp_scheme.value}) over {cp} ranks: each holds {local} of "
        f"each sample's {setup.seq} tokens"
        + (f" (padded to {padded})" if padded != setup.seq else "")
        + "; the model's shards and states are spread over all "
        f"{d.world_size} ranks"
    ]
    return replace(setup, seq=local, distributed=replace(d, cp_size=1)), notes


@dataclass(frozen=True)
class AttentionInFlight:
    """What one block's attention holds while it runs under context parallelism, beyond the
    attention of the local tokens alone."""

    forward: Term
    backward: Term


def attention_in_flight(
    spec: ModelSpec, setup: TrainingSetup, local: TrainingSetup, compute_bytes: int
) -> AttentionInFlight | None:
    """`setup`: as given (its cp_size); `local`: one rank's (`with_context_parallel`)."""
    d = setup.distributed
    cp = d.cp_size
    if cp <= 1:
        return None
    e = compute_bytes
    n = local.batch * local.seq
    q = spec.num_attention_heads * spec.head_dim
    kv = 2 * spec.kv_dim  # K and V
    if d.cp_scheme is ContextParallel.RING:
        forward = e * kv * n * (1 + cp) + 4 * n * q + e * n * q
        backward = (
            4 * (n * q + n * kv) + e * kv * n * (1 + cp) + 2 * 4 * kv * n + e * (n * q + n * kv)
        )
        return AttentionInFlight(
            forward=Term(
                bytes=forward,
                formula=f"ring attention: the local K,V concatenated and the whole sequence's "
                f"gathered, e·2kvd·N_l·(1+{cp}), its fp32 merged output 4·Q·N_l and one step's "
                f"output e·Q·N_l (N_l {n}) = {format_bytes(forward)}",
            ),
            backward=Term(
                bytes=backward,
                formula=f"ring attention backward: fp32 dQ,dK,dV accumulators, K,V gathered "
                f"again, dK,dV passed round the ring (fp32, sent and received) and one step's "
                f"gradients = {format_bytes(backward)}",
            ),
        )
    if d.cp_scheme is ContextParallel.RING_FLASH:
        forward = 2 * e * kv * n + 4 * n * q + e * n * q
        backward = 4 * n * (q + kv) + 2 * e * kv * n + 2 * 4 * kv * n + e * n * (q + kv)
        return AttentionInFlight(
            forward=Term(
                bytes=forward,
                formula=f"ring-flash-attn: the next K,V received beside the current, "
                f"2·e·2kvd·N_l, the fp32 output 4·Q·N_l and one step's e·Q·N_l (N_l {n}) = "
                f"{format_bytes(forward)}",
            ),
            backward=Term(
                bytes=backward,
                formula=f"ring-flash-attn backward: fp32 dQ,dK,dV, the K,V and dK,dV pairs in "
                f"transit and one step's gradients = {format_bytes(backward)}",
            ),
        )
    replicated = max(1, cp // max(1, spec.num_kv_heads))
    moved = n * (q + kv * replicated)
    forward = 2 * e * moved
    return AttentionInFlight(
        forward=Term(
            bytes=forward,
            formula=f"Ulysses all-to-all: a contiguous copy of Q,K,V and the exchange's output, "
            f"2·e·N_l·(Q + 2kvd{f'·{replicated}' if replicated > 1 else ''}) = "
            f"{format_bytes(forward)}",
        ),
        backward=Term(
            bytes=2 * forward,
            formula=f"Ulysses all-to-all in backward: the gradients of Q,K,V exchanged back, "
            f"and of the output forward, = {format_bytes(2 * forward)}",
        ),
    )

"""What the device holds beside the tensors a CPU or simulated step counts.

Measured on an H100 80GB (torch 2.11.0+cu130, CUDA 13.0, driver 580.159, transformers 5.24, peft
0.21.2, bitsandbytes 0.50.2; `bench/gpu/`, README "Measured on a GPU"):

- cuBLAS keeps a workspace per handle and stream, allocated through torch's caching allocator
  (so `max_memory_allocated` counts it): one for the thread that runs forward and the optimizer,
  one for autograd's device thread that runs backward; 32 MiB each on Hopper and newer
  (`CUBLAS_WORKSPACE_CONFIG` default `:4096:8`), about 8 MiB on older GPUs. A CUDA step's
  allocated peak read 64–72 MiB above a CPU step's in every one of 37 cases;
- the caching allocator keeps freed blocks reserved, and a freed block serves only requests that
  fit in it. The loss leaves one such hole at the start of backward: the 16-bit logits are
  freed when their fp32 copy has been made, and the fp32 tensors that follow do not fit in their
  block (e·N·V bytes, 1.2 GiB for a 152k vocabulary at 4,096 tokens; measured slack 1.2–1.9 GiB
  at those shapes). Beside it, blocks are rounded up (2 MiB segments for large tensors) and
  other churn fragments;
- the CUDA context: the driver's state and the kernels loaded so far (lazy loading, the default
  since CUDA 11.7): 612 MiB after `torch.cuda.init()`, 676 MiB once cuBLAS is loaded, 742–762
  MiB after one training step (NVML's line for the process minus torch's reserved memory);
- NCCL allocates its communication buffers with cudaMalloc, outside torch's allocator.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmem.budget.result import GpuTarget, Overhead, Term
from llmmem.budget.setup import TrainingSetup
from llmmem.units import MIB, format_bytes

# Freed blocks that cannot be reused for other sizes, as a share of the memory that is allocated
# and freed within a step (activations and temporaries; the logits' hole is counted on its own).
FRAGMENTATION_SHARE = 0.08
SEGMENT_ROUNDING = 2 * MIB
# after one training step on an H100 with CUDA 13.0 (742–762 MiB measured); the context grows
# with the number of SMs and the kernels a run loads
CUDA_CONTEXT_LAZY = 760 * MIB
CUDA_CONTEXT_EAGER = 1343 * 1000 * 1000  # measured with all of torch's kernels loaded (CUDA 11.2)
CUBLAS_WORKSPACE = 32 * MIB  # per handle, Hopper's default; older GPUs use about 8 MiB
CUBLAS_HANDLES = 2  # the forward/optimizer thread and autograd's backward thread
NCCL_BUFFERS = 768 * MIB  # NCCL_BUFFSIZE × channels × peers for an 8-GPU node, typical


@dataclass(frozen=True)
class CachedAtLoss:
    """Blocks the allocator holds unused while a later step computes its loss, beyond the
    allocated peak: `bytes` in all, of which `recomputed` are the last backward's recomputed
    block and `states_spill` the loss blocks the first step's optimizer states were cut from."""

    bytes: int
    recomputed: int
    states_spill: int

    def text(self) -> str:
        parts = []
        if self.recomputed:
            parts.append(f"the recomputed block's {format_bytes(self.recomputed)}")
        if self.states_spill:
            parts.append(
                f"{format_bytes(self.states_spill)} of the loss's blocks that the first step's "
                "optimizer states were cut from"
            )
        return (
            f" + {format_bytes(self.bytes)} cached but too small for the loss's tensors when it "
            f"runs (over the allocated peak): {' and '.join(parts)}"
        )


def allocator_slack(
    transient_bytes: int,
    live_tensors: int,
    logits_hole_bytes: int = 0,
    cached_at_loss: CachedAtLoss | None = None,
) -> Term:
    rounding = live_tensors * SEGMENT_ROUNDING // 2
    fragmentation = round(FRAGMENTATION_SHARE * transient_bytes)
    hole = (
        f" + {format_bytes(logits_hole_bytes)} of 16-bit logits freed at the start of "
        "backward (too small for the fp32 tensors that follow)"
        if logits_hole_bytes
        else ""
    )
    cached = cached_at_loss.bytes if cached_at_loss is not None else 0
    cached_text = cached_at_loss.text() if cached_at_loss is not None else ""
    return Term(
        bytes=rounding + fragmentation + logits_hole_bytes + cached,
        formula=(
            f"{FRAGMENTATION_SHARE:.0%} of the {format_bytes(transient_bytes)} that churn in a step"
            f" + ½ × 2 MiB rounding × {live_tensors} large tensors{hole}{cached_text}"
        ),
        note="reserved minus allocated; "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True shrinks it",
    )


def cublas_workspaces() -> Term:
    return Term(
        bytes=CUBLAS_HANDLES * CUBLAS_WORKSPACE,
        formula=f"{CUBLAS_HANDLES} cuBLAS handles (forward, backward) × "
        f"{format_bytes(CUBLAS_WORKSPACE)} workspace",
        note="allocated through torch's caching allocator: max_memory_allocated on a GPU counts "
        "it, a CPU or simulated step does not",
    )


def cuda_context(setup: TrainingSetup) -> Term:
    if setup.cuda_module_loading == "eager":
        return Term(
            bytes=CUDA_CONTEXT_EAGER,
            formula="driver state + every torch kernel image (eager module loading)",
        )
    return Term(
        bytes=CUDA_CONTEXT_LAZY,
        formula="driver state + kernels loaded on first use (lazy loading, CUDA ≥ 11.7)",
    )


def nccl_buffers(setup: TrainingSetup) -> Term | None:
    if not setup.distributed.is_multi_gpu:
        return None
    return Term(bytes=NCCL_BUFFERS, formula="NCCL channel buffers (cudaMalloc, outside torch)")


def overhead_terms(
    setup: TrainingSetup,
    transient_bytes: int,
    live_tensors: int,
    logits_hole_bytes: int = 0,
    cached_at_loss: CachedAtLoss | None = None,
) -> dict[Overhead, Term]:
    terms = {
        Overhead.CUBLAS_WORKSPACES: cublas_workspaces(),
        Overhead.ALLOCATOR_SLACK: allocator_slack(
            transient_bytes, live_tensors, logits_hole_bytes, cached_at_loss
        ),
        Overhead.CUDA_CONTEXT: cuda_context(setup),
    }
    nccl = nccl_buffers(setup)
    if nccl is not None:
        terms[Overhead.NCCL_BUFFERS] = nccl
    return terms


def unified_memory(total_bytes: int, pool_total_bytes: int, gpu: GpuTarget | None) -> Term:
    """A paged optimizer's states (budget.optimizers): host-backed CUDA unified memory, outside
    torch's pool. The driver keeps their pages on the GPU while the rest leaves room (bitsandbytes
    prefetches each parameter's before its update) and moves them to the host when device
    allocations need it: the device shows the pages that fit beside the pool (all of them
    without a GPU named), and they never make the step run out of memory."""
    if gpu is None:
        resident = total_bytes
        where = "all on the GPU with room to spare"
    else:
        resident = min(total_bytes, max(gpu.capacity_bytes - pool_total_bytes, 0))
        where = (
            "all on the GPU beside the rest"
            if resident == total_bytes
            else f"{format_bytes(resident)} on the {gpu.name} beside the rest, "
            f"{format_bytes(total_bytes - resident)} on the host"
        )
    return Term(
        bytes=resident,
        formula=f"paged optimizer states: {format_bytes(total_bytes)} of CUDA unified memory "
        f"(cudaMallocManaged by bitsandbytes, outside max_memory_reserved), {where}",
        note="the driver moves these pages back to the host when allocations need the room",
    )


# what the caching allocator holds: the allocated peak, the workspaces it allocated for cuBLAS,
# and its slack; the rest (context, NCCL) is outside it
IN_THE_ALLOCATOR = (Overhead.CUBLAS_WORKSPACES, Overhead.ALLOCATOR_SLACK)


def with_load_kept(
    overheads: dict[Overhead, Term], allocated_peak_bytes: int, load: Term | None
) -> dict[Overhead, Term]:
    """The allocator's slack raised so that the reserved peak is at least what loading the
    model left reserved (`load`): the caching allocator keeps those blocks, and the step's own
    tensors are cut from them, so a step that needs less than the load reserved reads the
    load's reserved pool as its peak (a framework's stack says what its load holds)."""
    if load is None:
        return overheads
    step_reserved, _ = reserved_and_device_total(allocated_peak_bytes, overheads)
    kept = load.bytes - step_reserved
    if kept <= 0:
        return overheads
    slack = overheads[Overhead.ALLOCATOR_SLACK]
    raised = Term(
        bytes=slack.bytes + kept,
        formula=f"{slack.formula} + {format_bytes(kept)} kept reserved from {load.formula}, "
        f"{format_bytes(load.bytes)} in all",
        note=slack.note,
    )
    return {**overheads, Overhead.ALLOCATOR_SLACK: raised}


def reserved_and_device_total(
    allocated_peak_bytes: int, overheads: dict[Overhead, Term]
) -> tuple[int, int]:
    """(reserved peak, what nvidia-smi shows) from the allocated peak and the overheads."""
    reserved = allocated_peak_bytes + sum(
        term.bytes for name, term in overheads.items() if name in IN_THE_ALLOCATOR
    )
    outside = sum(term.bytes for name, term in overheads.items() if name not in IN_THE_ALLOCATOR)
    return reserved, reserved + outside

"""What the device holds beside the tensors torch counts as allocated.

- the caching allocator keeps freed blocks reserved: blocks are rounded up (2 MiB segments for
  large tensors) and memory freed by transient tensors of one size is not always reusable for the
  next request of another size; the slack grows with the memory that churns within a step;
- cuBLAS keeps a workspace per handle (larger on Hopper and newer);
- the CUDA context: the driver's state and torch's kernel images; with lazy module loading (the
  default since CUDA 11.7) only the kernels used are loaded;
- NCCL allocates its communication buffers with cudaMalloc, outside torch's allocator.
"""

from __future__ import annotations

from llmmem.budget.result import Overhead, Term
from llmmem.budget.setup import TrainingSetup
from llmmem.units import MIB, format_bytes

# Freed blocks that cannot be reused for other sizes, as a share of the memory that is allocated
# and freed within a step (activations, logits, temporaries).
FRAGMENTATION_SHARE = 0.08
SEGMENT_ROUNDING = 2 * MIB
CUDA_CONTEXT_LAZY = 512 * MIB
CUDA_CONTEXT_EAGER = 1343 * 1000 * 1000  # measured with all of torch's kernels loaded (CUDA 11.2)
CUBLAS_WORKSPACE = 32 * MIB  # Hopper's default; older GPUs use less
NCCL_BUFFERS = 768 * MIB  # NCCL_BUFFSIZE × channels × peers for an 8-GPU node, typical


def allocator_slack(transient_bytes: int, live_tensors: int) -> Term:
    rounding = live_tensors * SEGMENT_ROUNDING // 2
    fragmentation = round(FRAGMENTATION_SHARE * transient_bytes)
    return Term(
        bytes=rounding + fragmentation + CUBLAS_WORKSPACE,
        formula=(
            f"{FRAGMENTATION_SHARE:.0%} of the {format_bytes(transient_bytes)} that churn in a step"
            f" + ½ × 2 MiB rounding × {live_tensors} large tensors"
            f" + {format_bytes(CUBLAS_WORKSPACE)} cuBLAS workspace"
        ),
        note="reserved minus allocated; "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True shrinks it",
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
    setup: TrainingSetup, transient_bytes: int, live_tensors: int
) -> dict[Overhead, Term]:
    terms = {
        Overhead.ALLOCATOR_SLACK: allocator_slack(transient_bytes, live_tensors),
        Overhead.CUDA_CONTEXT: cuda_context(setup),
    }
    nccl = nccl_buffers(setup)
    if nccl is not None:
        terms[Overhead.NCCL_BUFFERS] = nccl
    return terms

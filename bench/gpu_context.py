"""What a CUDA process holds before any model: the context, then cuBLAS, then attention kernels.

Run in a fresh process on a GPU (`bench/gpu_run.sh` does): prints one JSON object with, after
each stage, what NVML shows for this process (nvidia-smi's per-process line; the whole device's
use where the process is not listed) and what torch's caching allocator has allocated and
reserved:

- `cuda_init`: `torch.cuda.init()` and a 1-element tensor (the driver's context, torch's
  allocator, lazily loaded kernels so far);
- `bf16_matmul`: one 4096×4096 bf16 matmul (the cuBLAS handle and its workspace);
- `fp32_matmul`: the same in fp32;
- `sdpa_fwd_bwd`: one scaled-dot-product attention forward and backward (batch 1, 32 heads,
  2048 tokens, head dim 128, bf16): the flash kernels and their workspace;
- `after_empty_cache`: the tensors dropped and the cache emptied: what stays is the context and
  the workspaces torch keeps (cuBLAS workspaces are cached per handle and stream).

    python bench/gpu_context.py > context.json
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 1
    import pynvml

    pynvml.nvmlInit()
    props = torch.cuda.get_device_properties(0)
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{props.uuid}")
    except Exception:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    before = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)

    def reading() -> dict[str, object]:
        torch.cuda.synchronize()
        process = None
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid():
                process = int(proc.usedGpuMemory or 0)
        device = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        return {
            "nvml_process_bytes": process,
            "nvml_device_bytes": device,
            "nvml_device_minus_start_bytes": device - before,
            "allocated_bytes": int(torch.cuda.memory_allocated()),
            "reserved_bytes": int(torch.cuda.memory_reserved()),
        }

    stages: dict[str, object] = {"start": {"nvml_device_bytes": before}}
    torch.cuda.init()
    one = torch.zeros(1, device="cuda")
    stages["cuda_init"] = reading()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = a @ a
    stages["bf16_matmul"] = reading()
    c = a.float() @ a.float()
    stages["fp32_matmul"] = reading()
    q = torch.randn(1, 32, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    out.sum().backward()
    stages["sdpa_fwd_bwd"] = reading()
    del one, a, b, c, q, out
    torch.cuda.empty_cache()
    stages["after_empty_cache"] = reading()
    print(
        json.dumps(
            {
                "device": props.name,
                "capacity_bytes": int(props.total_memory),
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "lazy_loading": os.environ.get("CUDA_MODULE_LOADING", "(default: LAZY)"),
                "stages": stages,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

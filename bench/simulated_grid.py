"""The accounting core against simulated steps, at real model sizes.

    python bench/simulated_grid.py [--size real|small] [--family llama ...]

For each architecture (Llama-3.1-8B, Qwen2.5-7B, gemma-2-9b, Phi-3-mini, GPT-2 medium,
Mixtral-8x7B, from the bundled catalog): full fine-tuning and LoRA, gradient checkpointing off and
on, two shapes, pure bf16 and AMP. Each row is (predicted − simulated) / simulated for the
allocated peak of each phase and of the step; the simulation runs under FakeTensorMode on the CPU
(no GPU, no weights; 5-40 s per case). Allocator slack and the CUDA context are not in either
side: this is allocated memory only.
"""

from __future__ import annotations

import sys

from llmmem.verify.grid import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a.startswith("--size") for a in argv):
        argv = ["--size", "real", *argv]
    sys.exit(main(argv))

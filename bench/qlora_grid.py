"""The accounting core against real QLoRA steps on the CPU (bitsandbytes' CPU kernels).

    python bench/qlora_grid.py [--size medium|small] [--family llama ...]

For each architecture but the MoE (Llama, Qwen2, gemma-2, Phi-3, GPT-2 at medium size: hidden
1024, MLP 2816, 4 layers, a 32,000-token vocabulary, ~100M parameters): NF4 with double
quantization after `prepare_model_for_kbit_training`, LoRA on the query and value projections,
bitsandbytes' paged 8-bit AdamW, gradient checkpointing off and on, pure bf16 and AMP. Each row
is (predicted − measured) / measured for the allocated peak of each phase; the measurement
counts every storage the real step allocates (2-6 s per case here). What a GPU adds (CUDA
context, allocator slack) is in neither side.
"""

from __future__ import annotations

import sys

from llmmem.verify.grid import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a.startswith("--size") for a in argv):
        argv = ["--size", "medium", *argv]
    sys.exit(main(["--qlora", "--device", "cpu", *argv]))

"""The preference budgets against real DPO, KTO, no-reference (ORPO-like) and reward CPU steps.

    python bench/preference_grid.py [--size medium|small] [--family llama|qwen2 ...]
                                    [--objective dpo|kto|orpo|reward ...] [--shape 1x128 ...]

Each step is written as TRL 0.29.1 computes it (`llmmem.verify.preference_grid`): chosen and
rejected concatenated, `selective_log_softmax` over the shifted logits, the reference forward
under no_grad inside the loss (a frozen copy in full fine-tuning, the adapter disabled under
LoRA). Medium configs have a real model's proportions (Llama: hidden 512, MLP 1376, a
32,000-token vocabulary; Qwen2: GQA with one KV head, a 75,968-token vocabulary). Full and LoRA,
checkpointing off and on, fp32, bf16 and bf16 autocast; each cell is a phase's allocated peak
and (predicted − measured) / measured. What a GPU adds (CUDA context, allocator slack) is in
neither side.
"""

from __future__ import annotations

import sys

from llmmem.verify.preference_grid import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["--size", "medium", "--shape", "1x128"]))

"""The preference budgets against real DPO, KTO, no-reference (ORPO-like), reward, GRPO and PPO
CPU steps.

    python bench/preference_grid.py [--size medium|small] [--family llama|qwen2 ...]
                                    [--objective dpo|kto|orpo|reward ...] [--shape 1x128 ...]
    python bench/preference_grid.py --grpo [--size medium|small] [--shape 32x4 ...]
    python bench/preference_grid.py --ppo [--size medium|small] [--shape 16x32 ...]

Each step is written as TRL 0.29.1 computes it (`llmmem.verify.preference_grid`): chosen and
rejected concatenated, `selective_log_softmax` over the shifted logits, the reference forward
under no_grad inside the loss (a frozen copy in full fine-tuning, the adapter disabled under
LoRA). Medium configs have a real model's proportions (Llama: hidden 512, MLP 1376, a
32,000-token vocabulary; Qwen2: GQA with one KV head, a 75,968-token vocabulary). Full and LoRA,
checkpointing off and on, fp32, bf16 and bf16 autocast; in bf16 and under autocast the models
run as accelerate's mixed precision prepares them (`bf16=True`, TRL's default: autocast and
accelerate's own `convert_outputs_to_fp32`, so the logits come back in fp32); each cell is a
phase's allocated peak
and (predicted − measured) / measured. What a GPU adds (CUDA context, allocator slack) is in
neither side.
"""

from __future__ import annotations

import sys

from llmmem.verify.preference_grid import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--grpo" in args:
        # GRPO (llmmem.verify.grpo_grid): generation with the KV cache, the reference pass with
        # beta != 0, the policy over the completions; medium configs unless --size is given
        from llmmem.verify.grpo_grid import main as grpo_main

        rest = [a for a in args if a != "--grpo"]
        sys.exit(grpo_main(rest if "--size" in rest else ["--size", "medium", *rest]))
    if "--ppo" in args:
        # PPO (llmmem.verify.ppo_grid): generation with kept scores, the rollout's reference,
        # value and reward forwards, the policy and value model trained together
        from llmmem.verify.ppo_grid import main as ppo_main

        rest = [a for a in args if a != "--ppo"]
        sys.exit(ppo_main(rest if "--size" in rest else ["--size", "medium", *rest]))
    sys.exit(main(args or ["--size", "medium", "--shape", "1x128"]))

"""The SFT, preference and GRPO budgets against TRL's own trainers, run on the CPU.

`python -m llmmem.verify.grid --preference` checks the budget against steps written the way
TRL computes them. This runs the trainers themselves: TRL 0.29.1's DPOTrainer and RewardTrainer
and trl.experimental's ORPOTrainer and KTOTrainer, with accelerate and transformers as TRL's
`Trainer` drives them, on a model built from a config, in fp32 on the CPU, under llmmem's
StorageTracker (bench/trl_step.py, one case per process). Of the second step two peaks are
compared with the budget's, each with the function TRL (or torch) was in when it was reached:
the step up to the optimizer (forward, the loss and its metrics, backward) against the largest
of the budget's forward, reference-forward and backward phases, and the optimizer step against
the budget's. Two settings make the run the step the budget sizes:

- gradient checkpointing is said explicitly: TRL 0.29's configs turn it on unless told
  (`BaseConfig.gradient_checkpointing = True`, DPOConfig's too); `--checkpointing off` runs
  without it;
- torch's AdamW picks its for-loop implementation on the CPU and foreach on a GPU; the budget
  sizes foreach (a parameter-sized buffer per step), so the trainer's optimizer is asked for it.

Medium (Llama-2-7B's proportions, 45M parameters), 2 pairs × 128 tokens, fp32, TRL 0.29.1
(torch 2.13.0, transformers 5.24.0, peft 0.21.2, accelerate 1.15.0), MiB, the step up to the
optimizer with checkpointing on (TRL's default) and off, then the optimizer step:

    case          ckpt on: TRL  budget  error  ckpt off: TRL  budget  error  optimizer  error
    dpo full          996.07  995.97  -0.0%        1075.15 1075.03  -0.0%    1039.61  -0.0%
    dpo lora          475.02  474.92  -0.0%         530.47  531.35  +0.2%     174.54  -0.0%
    orpo full         806.45  806.34  -0.0%         885.53  885.41  -0.0%     866.35  -0.0%
    orpo lora         458.66  458.56  -0.0%         514.11  515.00  +0.2%     174.55  -0.0%
    kto full          866.87  866.34  -0.1%         866.87  866.34  -0.1%    1039.62  -0.0%
    kto lora          300.62  301.03  +0.1%         328.13  329.25  +0.3%     174.55  -0.0%
    reward full       444.09  443.08  -0.2%         444.09  443.08  -0.2%     553.85  +0.0%
    reward lora       138.78  139.70  +0.7%         180.12  181.03  +0.5%     112.05  -0.0%

DPO peaks in `entropy_from_logits` (its metrics after the loss), ORPO and full KTO in backward,
KTO LoRA in KTO's `forward`, reward at the end of backward (in `training_step`).
`--size small` (two blocks, 2 × 64, checkpointing on): the step within 0.5% but KTO full
(−1.3%) and the reward models (full +1.3%, LoRA +2.1%: at this size a block's own moments,
its recompute and its backward, are the reward step's peak); the optimizer step within 1.9%.
The reward full case read +4.8% while the first block's backward counted all its own
gradients beside its saved tensors; only its MLP output projection's exists by then.

The table's first version (+2% to +29%) compared a step TRL ran with checkpointing (its
default) against a budget without, and the CPU's for-loop AdamW against the budget's foreach.
With both said, what was left was TRL 0.29's own code, which the budget now follows: DPO's
metrics after the loss, with every logits tensor of the loss alive (+46.9 MiB at medium), and
ORPO's log-probabilities on a view of the logits plus the chosen half's cross-entropy (+31.5
MiB in backward); and a reward model's embedding gradient, which comes last in backward
(reward full without checkpointing read +6.1%).

TRL 1.16.0 (`--trl 1.16.0`, its own environment `bench/.trl-1.16` with the same torch,
transformers, peft and accelerate): DPOTrainer and KTOTrainer (out of trl.experimental since
1.0) take their log-probabilities through TRL's fused LM head (`add_fused_lm_head`,
`ChunkedLogProbFunction`), which the budget follows where `PreferenceSetup.trl_release` is 1.0
or later (llmmem.budget.fused_head). On this CPU TRL folds each tile with torch ops (no
Triton), and the bench adds those fp32 temporaries to the budget (`fused_head_moments(...,
triton=False)`); a GPU's Triton kernel works inside the tile and the budget, sizing a GPU,
leaves them out. Same cases and settings as above, MiB, TRL / budget / error:

    case          ckpt on: TRL  budget  error  ckpt off: TRL  budget  error  optimizer  error
    medium 2x128:
    dpo full         1276.74 1276.66  -0.0%        1355.82 1355.72  -0.0%    1039.61  -0.0%
    dpo lora          694.19  694.10  -0.0%         749.64  750.54  +0.1%     174.54  -0.0%
    kto full         1016.20 1016.11  -0.0%        1055.74 1055.64  -0.0%    1039.61  -0.0%
    kto lora          434.15  434.06  -0.0%         461.87  462.28  +0.1%     174.54  -0.0%
    small 2x64:
    dpo full           42.38   42.37  -0.0%          44.64   44.62  -0.0%       4.92  -0.2%
    dpo lora           39.66   39.65  -0.0%          41.21   41.25  +0.1%       0.90  -1.3%
    kto full           22.96   22.94  -0.1%          24.09   24.07  -0.1%       4.92  -0.2%
    kto lora           20.27   20.25  -0.1%          21.04   21.05  +0.1%       0.90  -1.3%
    medium 2x128, bf16 (`--precision bf16`: accelerate's mixed precision over fp32 weights):
    dpo full         1276.73 1276.65  -0.0%        1352.44 1352.34  -0.0%    1039.61  -0.0%
    dpo lora          694.18  694.10  -0.0%         748.18  748.97  +0.1%     174.54  -0.0%
    kto full         1031.82 1031.74  -0.0%        1081.73 1081.64  -0.0%    1039.61  -0.0%
    kto lora          449.77  449.68  -0.0%         488.13  488.43  +0.1%     174.54  -0.0%

Every step peaks in TRL's `_backward_tile`: the saved copy of the scored positions' hidden
states, the fp32 gradients allocated whole (the hidden states', and the head weight's in full
fine-tuning), the 4096 × 32768 tile buffer (allocated at 32768 columns whatever the
vocabulary: at small, 1000 tokens, it is most of the step) and, on this CPU, 29 B per tile
element of the fold (y, z, log_p, p and the gradient in fp32, the target mask and its float
copy with the difference). Before the budget followed the fused head it read these cases
−15% to −87%: at these vocabularies (32000 and 1000 tokens) the 32768-wide buffer and the
CPU's fold outweigh the logits it counted; at Qwen2.5-0.5B's 151,936 it is the other way
(tests/budget/test_fused_head.py). On a GPU the fold's share is not there: medium DPO full's
budget is 866.34 MiB with Triton (the head's backward 827 MiB, the end of backward above it)
against 1276.66 MiB here. Under bf16 the buffer is 16-bit and each vocabulary chunk of the
fp32 head is cast for its tile; the budget read +2.4% to +4.5% there while it still counted
the SFT step's autocast cast of the whole head, which the fused head never makes. ORPO and
the reward model do not use the fused head at 1.16 (ORPO stays in trl.experimental on the
full logits): ORPO medium full and LoRA read 806.45 and 458.66 MiB, as at 0.29, where the
budget at `trl_release` 1.16 leaves out ORPO's 0.29 moments and reads −3.9% and −6.9%; the
reward model reads as at 0.29 (444.09 MiB).

GRPO (`--objective grpo`): TRL 0.29.1's GRPOTrainer, transformers' generation (no vLLM),
prompts of 16 words, every completion run to `max_completion_length` (`min_new_tokens` masks the
end-of-sequence token), a reward written in bench/trl_step.py, 4 completions per device. The
measured step generates (`steps_per_generation` 1, or 2 with the second generation's step
measured), and is split where TRL's own methods return: `_generate_single_turn` (generate),
the rest of `_generate_and_score_completions` (the old and reference log-probabilities without
gradient), `compute_loss` (the policy's forward and loss), backward, the optimizer step; each
against the GRPO budget's phase (`llmmem.verify.grpo_grid.predict`). num_generations 2 and 4
read the same (the batch counts completions). MiB, TRL / budget / error:

    case               generate            reference           forward             backward
    medium 4x64, ckpt on (TRL's default), fp32:
    beta 0    full 528.45/526.83 -0.3%                   - 602.24/602.30 +0.0% 693.70/693.07 -0.1%
    beta 0.04 full 701.71/700.09 -0.2% 756.07/756.06 -0.0% 775.51/775.57 +0.0% 866.97/866.34 -0.1%
    beta 0    lora 182.66/181.04 -0.9%                   - 255.32/255.27 -0.0% 302.19/302.14 -0.0%
    beta 0.04 lora 182.66/181.04 -0.9% 237.02/237.01 -0.0% 255.32/255.27 -0.0% 302.19/302.14 -0.0%
    small 4x32, fp32, ckpt off (on reads within 1.3% too):
    beta 0.04 full     3.50/3.48 -0.4%     4.27/4.26 -0.2%     7.15/7.15 -0.0%     7.15/7.15 -0.0%
    beta 0.04 lora     1.08/1.07 -1.3%     1.86/1.85 -0.5%     4.12/4.15 +0.7%     4.12/4.15 +0.8%
    small 4x32, ckpt on, steps_per_generation 2 (8 completions a generation, two chunks):
    beta 0.04 fp32     3.72/3.69 -0.8%     4.36/4.34 -0.5%     5.46/5.46 -0.1%     5.46/5.46 -0.0%
    beta 0.04 bf16     3.82/3.77 -1.4%     4.54/4.55 +0.3%     5.57/5.72 +2.7%     5.57/5.72 +2.8%

The optimizer step reads within 0.4% in every case (medium full 866.33 / 1039.59 MiB, exact
to 0.01 MiB). Medium peaks in backward, small in `entropy_from_logits` (the policy's forward).
With `steps_per_generation` 2 the no-gradient passes run over two chunks, and TRL 0.29's
`_get_per_token_logps_and_entropies` keeps the first chunk's divided logits bound to `logits`
until the second chunk's forward returns: the budget read −2.3% (fp32) there before it counted
the second chunk's LM head beside them, and under mixed precision accelerate's fp32 copy of the
second chunk's bf16 logits. Left, all under 5% and not traced yet: generation reads 0.2 to
1.7% under TRL (the restated step reads the same, so it is in transformers' `generate`, not in
TRL), and the checkpointed forward under bf16 autocast +2.7 to +3.3% over (the SFT budget's
checkpointed forward; fp32 reads exact).

GRPO at TRL 1.16.0 (`--trl 1.16.0 --objective grpo`): GRPOTrainer patches the policy (and the
reference copy) with the fused LM head (`outputs=("log_probs", "entropy")` for the policy) and
scores the completion's tokens through it; the budget follows it where `GrpoSetup.trl_release`
is 1.15 or later (llmmem.budget.grpo `fused_log_probs`). On this CPU TRL scores every position
(no Triton: `hidden_states.reshape(-1, H)`, not the completion's only) and folds each tile in
torch, and the bench sizes the same (`fused_log_probs(..., triton=False)`). num_generations 2
and 4 read the same. MiB, TRL / budget / error:

    case               generate            reference           forward             backward
    medium 4x64, ckpt on (TRL's default), fp32:
    beta 0    full 528.45/526.83 -0.3%                   - 680.09/680.03 -0.0%  906.50/906.46 -0.0%
    beta 0.04 full 701.71/700.09 -0.2% 849.57/849.55 -0.0% 853.36/853.30 -0.0% 1079.77/1079.73 -0.0%
    beta 0    lora 182.66/181.04 -0.9%                   - 333.68/333.62 -0.0%  497.59/497.55 -0.0%
    beta 0.04 lora 182.66/181.04 -0.9% 330.52/330.49 -0.0% 333.68/333.62 -0.0%  497.59/497.55 -0.0%
    small 4x32, ckpt off, fp32:
    beta 0    full     2.68/2.66 -0.5%                   -   30.11/30.08 -0.1%    33.39/33.37 -0.0%
    beta 0.04 full     3.50/3.48 -0.4%   29.04/29.02 -0.0%   30.92/30.90 -0.1%    34.20/34.19 -0.0%
    beta 0.04 lora     1.08/1.07 -1.3%   26.62/26.61 -0.1%   27.92/27.95 +0.1%    30.96/31.00 +0.1%
    small 4x32, ckpt on, bf16 mixed precision, steps_per_generation 2 (two chunks):
    beta 0    full     3.00/2.95 -1.7%   16.67/16.76 +0.6%   16.85/16.83 -0.1%    20.09/20.24 +0.7%
    beta 0.04 full     3.82/3.77 -1.4%   17.48/17.58 +0.5%   17.67/17.65 -0.1%    20.91/21.06 +0.7%

The optimizer step reads within 0.4% (medium full 866.34 / 1039.61 MiB). Every step peaks in
TRL's `_backward_tile`. At small the 4096 × 32768 tile buffer (allocated at 32768 columns
whatever the 1000-token vocabulary: 16 MiB for 128 positions) and the fold's fp32 tiles are
most of the step: 30 MiB against 7 MiB at 0.29. At medium the policy's forward is above 0.29's
(680 against 602 MiB) for the same reason and because this CPU scores the prompt's positions
too; a GPU scores the 4 × 64 completion tokens only and folds inside the tile. Generation runs
the unpatched forward and reads as at 0.29 (within 1.7% under). Under bf16 autocast the fused
head's forward and reference read 0.1 to 0.2 MiB over (+0.6 to +1.3%) while the budget counted
the vocabulary chunk's bf16 cast beside the fold (it is the tile matmul's temporary, gone
before the fold); backward's +0.7% is left, not traced yet; with two chunks the no-gradient
pass holds nothing of the first chunk's but its per-token outputs.

SFT (`--objective sft`): TRL's SFTTrainer on rows already tokenized (an `input_ids` column, no
padding: every label counts), 4 rows × 64 tokens small, × 128 medium, against the budget of
TRL's stack at the trainer's release (llmmem.budget.stacks.trl). The forward is measured to
`compute_loss`'s return (the loss and its metrics), backward from there to
`on_pre_optimizer_step`. At 0.29.1 the metrics take the returned logits after the loss (the
forward peaks in `entropy_from_logits` at small; at medium forward and backward are within
0.5 MiB of each other); at 1.16.0 the fused LM head, folded in torch on this CPU
(`triton=False`: every position scored, the fold's fp32 tiles). MiB, TRL / budget / error:

    case                  forward             backward            (optimizer: full, lora)
    TRL 0.29.1, small 4x64 (optimizer 4.09/4.09 -0.1%, 0.89/0.89 -0.7%):
    fp32 ckpt on  full     6.20/6.18 -0.3%     5.71/5.70 -0.3%
                  lora     4.48/4.46 -0.4%     3.99/3.98 -0.4%
    fp32 ckpt off full     8.46/8.44 -0.3%     7.97/7.95 -0.2%
                  lora     6.02/6.07 +0.7%     5.53/5.58 +0.8%
    bf16 ckpt on  full     6.29/6.27 -0.3%     5.80/5.87 +1.2%
                  lora     4.60/4.59 -0.4%     4.11/4.10 -0.4%
    bf16 ckpt off full     7.97/7.95 -0.3%     7.48/7.46 -0.3%
                  lora     5.63/5.66 +0.7%     5.14/5.18 +0.8%
    TRL 0.29.1, medium 4x128 (optimizer 866.33/866.34 +0.0%, 174.53/174.52 -0.0%):
    fp32 ckpt on  full   713.91/713.82 -0.0%  714.38/714.30 -0.0%
                  lora   366.12/366.03 -0.0%  366.60/366.52 -0.0%
    fp32 ckpt off full   792.98/792.88 -0.0%  793.46/793.37 -0.0%
                  lora   421.57/422.47 +0.2%  422.05/422.96 +0.2%
    bf16 ckpt on  full   744.66/744.57 -0.0%  745.13/751.08 +0.8%
                  lora   397.37/397.28 -0.0%  397.85/397.77 -0.0%
    bf16 ckpt off full   820.36/820.26 -0.0%  820.83/820.74 -0.0%
                  lora   451.37/452.16 +0.2%  451.84/452.64 +0.2%
    TRL 1.16.0, small 4x64 (optimizer as at 0.29.1):
    fp32 ckpt on  full    37.48/37.46 -0.1%   41.56/41.54 -0.0%
                  lora    35.82/35.80 -0.1%   39.66/39.64 -0.0%
    fp32 ckpt off full    39.74/39.72 -0.1%   43.82/43.80 -0.0%
                  lora    37.36/37.40 +0.1%   41.20/41.25 +0.1%
    bf16 ckpt on  full    21.92/21.90 -0.1%   25.96/26.03 +0.3%
                  lora    20.11/20.08 -0.1%   24.06/24.05 -0.1%
    bf16 ckpt off full    23.44/23.41 -0.1%   27.64/27.62 -0.1%
                  lora    21.13/21.16 +0.2%   25.08/25.12 +0.2%
    TRL 1.16.0, medium 4x128 (optimizer as at 0.29.1):
    fp32 ckpt on  full   792.94/792.85 -0.0% 1103.46/1103.38 -0.0%
                  lora   446.15/446.07 -0.0%  694.17/694.10 -0.0%
    fp32 ckpt off full   872.02/871.91 -0.0% 1182.54/1182.45 -0.0%
                  lora   501.60/502.50 +0.2%  749.62/750.54 +0.1%
    bf16 ckpt on  full   785.81/785.72 -0.0% 1103.46/1109.41 +0.5%
                  lora   415.02/414.81 -0.1%  694.17/694.09 -0.0%
    bf16 ckpt off full   837.39/837.28 -0.0% 1179.16/1179.07 -0.0%
                  lora   468.91/469.69 +0.2%  748.17/748.97 +0.1%

Every 1.16.0 step peaks in TRL's `_backward_tile`: at small the 252-row tile buffer,
allocated 32768 columns wide for a 1000-token vocabulary, and the fold's fp32 tiles are most of
the step (41.6 MiB against 0.29.1's 6.2). Sized as the HF Trainer's step (the budget before
TRL's stack), small LoRA bf16 with checkpointing read 4.1 MiB against 24.1. Before the SFT
budget counted 0.29's metrics its forward read -14% (full) and -23% (LoRA) at small; before the
fused head's forward left the vocabulary chunk's cast out of the fold (it is the tile matmul's
temporary), medium bf16 1.16 forwards read +3.7% to +7.5% (the same cast made GRPO's bf16
forward and reference read +0.6% to +1.3% below). Left: full fine-tuning under bf16 with
checkpointing reads +0.8% (0.29.1) and +0.5% (1.16.0) in backward at medium, 5.95 MiB at both
releases, about one block's bf16 weight casts (6.0 MiB), which the shared budget counts at the
start of backward and which the measured step, its casts gone with autocast's cache, has not
made yet (no block's cast is alive at that peak); the HF Trainer's step shares that rule, and
small full bf16's +1.2% at 0.29.1 is the same (0.07 MiB, a small block's casts 0.09). Not
traced: LoRA without checkpointing reads +0.05 MiB at small (+0.7%, +0.8% at 0.29.1) and
+0.8 to +0.9 MiB at medium (+0.1%, +0.2%), the same at both releases: the HF budget's LoRA
blocks, not TRL's loss.

TRL is not a dependency of llmmem: the first run makes its own environment under
`bench/.trl/` (torch, transformers, peft, accelerate and TRL at the releases below; a few
hundred MB, from the package index) and reuses it after.

    python bench/trl_trainers.py [--size small|medium] [--objective dpo|orpo|kto|reward ...]
                                 [--method full|lora ...] [--shape PAIRSxTOKENS]
                                 [--checkpointing on|off] [--precision fp32|bf16]
                                 [--trl 0.29.1|1.16.0]
    python bench/trl_trainers.py --objective sft [--size small|medium] [--shape ROWSxTOKENS]
                                 [--checkpointing on|off] [--precision fp32|bf16]
                                 [--trl 0.29.1|1.16.0]
    python bench/trl_trainers.py --objective grpo [--size small|medium] [--shape 4x32]
                                 [--precision fp32|bf16] [--steps-per-generation 1|2]
                                 [--trl 0.29.1|1.16.0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ENV = HERE / ".trl"
RELEASES = [
    "torch==2.13.0",
    "transformers==5.24.0",
    "peft==0.21.2",
    "accelerate==1.15.0",
    "trl==0.29.1",
    "datasets",
]
# each TRL release the bench runs, in an environment of its own (the same torch,
# transformers, peft and accelerate; TRL 1.16 asks for transformers >= 4.56.2, accelerate >=
# 1.10.1, datasets >= 4.7.0, Python >= 3.11)
TRL_RELEASES = {
    "0.29.1": (ENV, RELEASES),
    "1.16.0": (HERE / ".trl-1.16", [*RELEASES[:4], "trl==1.16.0", "datasets>=4.7.0"]),
}


# GRPOTrainer imports TRL's vLLM client, which imports requests (not one of TRL's requirements)
EXTRAS = ["requests"]


def environment(trl: str = "0.29.1") -> Path:
    """The Python of the environment with TRL (at `trl`), made on first use."""
    env, releases = TRL_RELEASES[trl]
    python = env / "bin" / "python"
    marker = env / "releases.txt"
    if python.exists() and marker.exists() and marker.read_text() == "\n".join(releases):
        missing = [
            name
            for name in EXTRAS
            if subprocess.run([str(python), "-c", f"import {name}"], capture_output=True).returncode
        ]
        if missing:
            subprocess.run([str(python), "-m", "pip", "install", "-q", *missing], check=True)
        return python
    print(f"making {env} with {', '.join(releases)} ...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    # the environment is no part of the repository (Python 3.13's venv writes this itself)
    (env / ".gitignore").write_text("*\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", *releases, *EXTRAS], check=True)
    marker.write_text("\n".join(releases))
    return python


def releases_in(python: Path) -> str:
    """The releases the environment's trainers run, as the table's first line says them."""
    names = ["trl", "torch", "transformers", "peft", "accelerate"]
    probe = (
        "import importlib.metadata as m\n"
        f"print(', '.join(n + ' ' + m.version(n) for n in {names!r}))"
    )
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() or "releases unknown"


def measure(python: Path, case: Any, size: str) -> dict[str, Any]:
    from llmmem.verify.grpo_grid import PROMPT
    from llmmem.verify.preference_grid import CONFIGS

    payload = {
        "method": case.method,
        "batch": case.batch,
        "config": CONFIGS[size][case.family],
        "grad_ckpt": case.grad_ckpt,
        "bf16": getattr(case, "dtype", "fp32") == "bf16",
    }
    if hasattr(case, "generations"):  # a GRPO case
        payload.update(
            objective="grpo",
            seq=PROMPT + case.completion,
            prompt=PROMPT,
            completion=case.completion,
            generations=case.generations,
            beta=case.beta,
            # one accumulation step: a generation every `spg` steps, the old log-probabilities
            # taken too; the step measured is one that generates
            steps_per_generation=case.spg,
            measured_step=case.spg,
        )
    else:
        payload.update(objective=case.objective, seq=case.seq)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "analyzer"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    done = subprocess.run(
        [str(python), str(HERE / "trl_step.py"), json.dumps(payload)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:160]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "medium"], default="small")
    parser.add_argument(
        "--objective", action="append", choices=["dpo", "orpo", "kto", "reward", "grpo", "sft"]
    )
    parser.add_argument("--method", action="append", choices=["full", "lora"])
    parser.add_argument(
        "--shape",
        help="pairs x tokens (default 2x64 small, 2x128 medium); for grpo completions per "
        "device x completion tokens (default 4x32); for sft rows x tokens (default 4x64 "
        "small, 4x128 medium)",
    )
    parser.add_argument(
        "--checkpointing",
        choices=["on", "off"],
        default="on",
        help="gradient checkpointing (default on, as TRL 0.29's configs)",
    )
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16 is accelerate's mixed precision over fp32 weights (bf16=True, "
        "TRL 0.29's default)",
    )
    parser.add_argument(
        "--steps-per-generation",
        type=int,
        default=1,
        help="grpo only: the generation batch in micro-batches (default 1)",
    )
    parser.add_argument(
        "--trl",
        choices=sorted(TRL_RELEASES),
        default="0.29.1",
        help="the TRL release the trainers run (each in its own environment; default 0.29.1)",
    )
    args = parser.parse_args(argv)
    objectives = args.objective or ["dpo", "orpo", "kto", "reward"]
    for alone in ("grpo", "sft"):
        if alone in objectives and len(objectives) > 1:
            parser.error(f"--objective {alone} runs alone (its table has a column per phase)")
    if "grpo" in objectives:
        args.shape = args.shape or "4x32"
    if "sft" in objectives:
        args.shape = args.shape or ("4x128" if args.size == "medium" else "4x64")
    args.shape = args.shape or ("2x128" if args.size == "medium" else "2x64")
    try:
        batch, seq = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        parser.error(f"--shape wants PAIRSxTOKENS, e.g. 2x64, got {args.shape!r}")
    if batch < 1 or seq < 2:
        parser.error(f"--shape {args.shape}: at least 1 pair of 2 tokens")
    python = environment(args.trl)
    print(f"TRL's own trainers on the CPU against llmmem's budget ({releases_in(python)})")
    ckpt = args.checkpointing == "on"
    if objectives == ["sft"]:
        return sft_table(
            python,
            args.size,
            args.method or ["full", "lora"],
            batch,
            seq,
            ckpt,
            args.precision,
            args.trl,
        )
    if objectives == ["grpo"]:
        methods = args.method or ["full", "lora"]
        if args.steps_per_generation < 1:
            parser.error("--steps-per-generation must be at least 1")
        return grpo_table(
            python,
            args.size,
            methods,
            batch,
            seq,
            ckpt,
            args.precision,
            args.steps_per_generation,
            args.trl,
        )
    print(
        f"{'case':30} {'step: TRL':>10} {'budget':>8} {'error':>6}  {'optimizer: TRL':>14} "
        f"{'budget':>8} {'error':>6}  step peak at (MiB; checkpointing {args.checkpointing}, "
        f"TRL {args.trl})"
    )
    from llmmem.verify.preference_grid import Case

    for objective in objectives:
        for method in args.method or ["full", "lora"]:
            case = Case("llama", objective, method, ckpt, args.precision, batch=batch, seq=seq)
            got = measure(python, case, args.size)
            name = f"{objective} {method} {args.size} {batch}x{seq}"
            if "error" in got:
                print(f"{name:30} failed: {got['error']}")
                continue
            phases = predict_release(case, args.size, args.trl)
            optimizer = phases.pop("optimizer_step")
            step = max(phases.values())
            cells = []
            for measured, budget in ((got["step"], step), (got["optimizer"], optimizer)):
                error = 100 * (budget - measured) / measured
                cells.append(f"{measured / 2**20:8.2f} {budget / 2**20:8.2f} {error:+5.1f}%")
            print(f"{name:30} {cells[0]:>26}  {cells[1]:>30}  {got['step where']}")
    return 0


def predict_release(case: Any, size: str, trl: str) -> dict[str, int]:
    """The budget's allocated bytes per phase for the TRL release the trainer ran. At 0.29
    the preference grid's prediction; at 1.x the budget with `trl_release` said, its fused LM
    head folded in torch as on a device without Triton (this CPU: the tiles' fp32
    temporaries, which a GPU's Triton kernel does without; llmmem.budget.fused_head
    `torch_fold_bytes`)."""
    from llmmem.verify.preference_grid import predict

    if trl.startswith("0."):
        return predict(case, size)
    from functools import partial
    from unittest import mock

    from llmmem.budget import fused_head
    from llmmem.budget.preference import estimate_preference_budget
    from llmmem.budget.preference_setup import Objective, PreferenceSetup, Reference
    from llmmem.verify.preference_grid import setup_of, spec_of

    pref = PreferenceSetup(
        objective=Objective(case.objective),
        reference=Reference(case.reference) if case.reference else None,
        mixed_precision=case.mixed,
        trl_release=trl,
    )
    without_triton = partial(fused_head.fused_head_moments, triton=False)
    with mock.patch.object(fused_head, "fused_head_moments", without_triton):
        budget = estimate_preference_budget(spec_of(case, size), setup_of(case), pref)
    return {p.phase.value: p.allocated_bytes for p in budget.phases}


def predict_grpo_release(case: Any, size: str, trl: str) -> dict[str, int]:
    """The GRPO budget's allocated bytes per phase for the TRL release the trainer ran: at 0.29
    the GRPO grid's prediction; at 1.x the budget with `trl_release` said, its fused LM head
    over every position and folded in torch, as on this CPU without Triton
    (`fused_log_probs(..., triton=False)`)."""
    from llmmem.verify.grpo_grid import predict

    if trl.startswith("0."):
        return predict(case, size)
    from dataclasses import replace
    from functools import partial
    from unittest import mock

    from llmmem.budget import grpo
    from llmmem.verify.grpo_grid import _grpo, _setup, _spec

    without_triton = partial(grpo.fused_log_probs, triton=False)
    with mock.patch.object(grpo, "fused_log_probs", without_triton):
        budget = grpo.estimate_grpo_budget(
            _spec(case, size), _setup(case), replace(_grpo(case), trl_release=trl)
        )
    return {p.phase.value: p.allocated_bytes for p in budget.phases}


def predict_sft_release(case: Any, size: str, trl: str) -> dict[str, int]:
    """The SFT budget's allocated bytes per phase for TRL `trl`'s SFTTrainer
    (llmmem.budget.stacks.trl), as this CPU runs it: without Triton, TRL 1.15 on scores every
    position through its fused head and folds the tiles in torch (`triton=False`)."""
    from dataclasses import replace

    from llmmem.budget.phases import estimate_budget
    from llmmem.budget.setup import Framework
    from llmmem.verify.preference_grid import setup_of, spec_of

    setup = replace(setup_of(case), framework=Framework.TRL, trl_version=trl, triton=False)
    budget = estimate_budget(spec_of(case, size), setup)
    return {p.phase.value: p.allocated_bytes for p in budget.phases}


SFT_PHASES = ("forward", "backward", "optimizer_step")


def sft_table(
    python: Path,
    size: str,
    methods: list[str],
    batch: int,
    seq: int,
    ckpt: bool,
    precision: str,
    trl: str,
) -> int:
    """TRL's SFTTrainer against the SFT budget at its release, phase by phase: the forward to
    `compute_loss`'s return (the loss and its metrics), backward, the optimizer step."""
    from llmmem.verify.preference_grid import Case

    heads = ["forward", "backward", "optimizer"]
    print(
        f"{'case':30} "
        + "  ".join(f"{h + ': TRL':>15} {'budget':>8} {'error':>6}" for h in heads)
        + f"  step peak at (MiB; checkpointing {'on' if ckpt else 'off'}, TRL {trl})"
    )
    for method in methods:
        case = Case("llama", "sft", method, ckpt, precision, batch=batch, seq=seq)
        name = f"sft {method} {precision} {size} {batch}x{seq}"
        got = measure(python, case, size)
        if "error" in got:
            print(f"{name:30} failed: {got['error']}")
            continue
        budget = predict_sft_release(case, size, trl)
        cells = []
        for phase in SFT_PHASES:
            measured = got["optimizer" if phase == "optimizer_step" else phase]
            error = 100 * (budget[phase] - measured) / measured
            cells.append(f"{measured / 2**20:15.2f} {budget[phase] / 2**20:8.2f} {error:+5.1f}%")
        print(f"{name:30} " + "  ".join(cells) + f"  {got['step where']}")
    return 0


GRPO_PHASES = ("generate", "reference_forward", "forward", "backward", "optimizer_step")


def grpo_table(
    python: Path,
    size: str,
    methods: list[str],
    batch: int,
    completion: int,
    ckpt: bool,
    precision: str = "fp32",
    spg: int = 1,
    trl: str = "0.29.1",
) -> int:
    """TRL's GRPOTrainer against the GRPO budget, phase by phase: num_generations 2 and 4,
    beta 0 and 0.04, full and LoRA."""
    from llmmem.verify.grpo_grid import Case

    heads = ["generate", "reference", "forward", "backward", "optimizer"]
    print(
        f"{'case':34} "
        + "  ".join(f"{h + ': TRL':>15} {'budget':>7} {'error':>6}" for h in heads)
        + f"  step peak at (MiB; checkpointing {'on' if ckpt else 'off'})"
    )
    for method in methods:
        for generations in (2, 4):
            for beta in (0.0, 0.04):
                if batch % generations:
                    continue
                case = Case(
                    generations,
                    completion,
                    beta,
                    batch=batch,
                    method=method,
                    grad_ckpt=ckpt,
                    dtype=precision,
                    spg=spg,
                )
                got = measure(python, case, size)
                if "error" in got:
                    print(f"{case.id:34} failed: {got['error']}")
                    continue
                budget = predict_grpo_release(case, size, trl)
                cells = []
                for phase in GRPO_PHASES:
                    measured = got.get("optimizer" if phase == "optimizer_step" else phase)
                    if measured is None or phase not in budget:
                        cells.append(f"{'-':>15} {'-':>7} {'':>6}")
                        continue
                    error = 100 * (budget[phase] - measured) / measured
                    cells.append(
                        f"{measured / 2**20:15.2f} {budget[phase] / 2**20:7.2f} {error:+5.1f}%"
                    )
                print(f"{case.id:34} " + "  ".join(cells) + f"  {got['step where']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

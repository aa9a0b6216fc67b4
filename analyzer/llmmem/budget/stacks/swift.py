"""ms-swift's stack (`swift sft`, `swift pt`, `swift rlhf`): transformers' models under swift's
own subclass of the HF Trainer, so the HF budget everywhere but where swift's code differs.

Read in ms-swift 4.6.0 (the wheel's `swift/` package; file:line at that release):

What it loads and casts
- The model is loaded in `--torch_dtype` (the checkpoint's dtype where not given), and swift
  turns on the matching mixed precision (arguments/base_args/model_args.py
  `_init_mixed_precision`, :130-142: bf16 for bfloat16, fp16 for float16 and float32): bf16
  weights under bf16 autocast, the HF budget's bf16 case (the reader says which).
- LoRA: `prepare_model` (pipelines/train/tuner.py :372-407) freezes the model
  (`model.requires_grad_(False)`) and adds the adapters; nothing in swift calls peft's
  `prepare_model_for_kbit_training` (outside Megatron-SWIFT), so a 4-bit model keeps its norms,
  embeddings and head in the model's dtype and makes no fp32 copy of them: the HF budget's
  QLoRA counts that preparation by default.
- `--quant_method bnb --quant_bits 4`: nf4 with double quantization, computing in
  `bnb_4bit_compute_dtype`, which swift takes from `torch_dtype` where not given
  (arguments/base_args/quant_args.py :40-43, :116-121: bf16 for bfloat16, fp32 for float16
  and float32); transformers loads what bitsandbytes leaves alone (embeddings, norms, head) in
  that dtype. Unprepared, an fp32 head under fp16 autocast is cast to 16 bits at each use
  (frozen: autocast caches no cast of it) and its matmul keeps the cast for the input's
  gradient until the head's backward: the same copy the HF budget counts for a head prepared
  to fp32 (`weight_copies`; bench/swift_steps.py `qlora fp16 ckpt` read -5.0% at the loss
  without it).
- The adapters follow peft (fp32 where `lora_dtype` is not given: `LoraConfig.lora_dtype`
  None, tuners/peft.py :42-43, and peft's `autocast_adapter_dtype`); `--lora_dtype bfloat16`
  keeps them in bf16 (swift's `_cast_adapter_dtype_hook`, tuners/peft.py :147-160), while any
  trainable fp16 parameter is cast to fp32 ("Attempting to unscale FP16 gradients",
  pipelines/train/tuner.py :403-407): `lora_dtype float16` trains fp32 adapters.
- `target_modules` all-linear by default (arguments/tuner_args.py :126): every Linear of the
  language model but the head (peft's all-linear); a multimodal model's vision tower and
  aligner are left out (`freeze_vit`, `freeze_aligner` True, :123-124).

Its checkpointing
- `_fix_gradient_checkpointing` (trainers/mixin.py :940-953) patches torch's checkpoint to one
  `use_reentrant`: the one `gradient_checkpointing_kwargs` gives, else non-reentrant only for a
  DDP run (several processes, no DeepSpeed, no FSDP), reentrant otherwise. transformers 5's own
  default is non-reentrant; the budget tells them apart under FSDP (budget.fsdp_moments).
  `gradient_checkpointing` is on by default (the reader's default).

Its loss
- `compute_loss` (trainers/seq2seq_trainer.py :126-251) takes the model's own loss
  (transformers' `ForCausalLMLoss`, the HF budget's) unless a loss scale, channel loss, DFT
  loss or sequence parallelism asks for its per-token loss (trainers/utils.py :202-217:
  `logits.float()` and `cross_entropy(reduction="none")`: the same fp32 logits and
  log-softmax); then `_compute_acc` (trainers/mixin.py :1174-1192) takes
  `logits.argmax(dim=-1)` with the logits still alive: 8 B a position, beside 4 B × V a
  position of fp32 logits, so left out.
- `use_logits_to_keep` (on where the model's forward takes `logits_to_keep`, trainers/mixin.py
  :213-225, set in `_prepare_inputs`, trainers/seq2seq_trainer.py :109-111) keeps the logits
  from the first labelled position on (:1271-1296; only the labelled ones for one row): the
  budget, which has no prompt length, counts every position (bench/swift_steps.py: 247 of 256
  kept, +0.8 MiB of its backward).
- `optim` is HF's TrainingArguments' (swift sets none): adamw_torch_fused on current releases
  (the reader's default, the release rule before transformers 4.54 / torch 2.8).
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.activations import dtypes_for
from llmmem.budget.setup import Precision, TrainingSetup
from llmmem.budget.stacks.hf import Stack, WeightCopies
from llmmem.models.spec import ModelSpec

RELEASE = "4.6.0"


def swift_reentrant(setup: TrainingSetup) -> bool:
    """swift's `use_reentrant` where nothing says: False only for DDP over several processes."""
    d = setup.distributed
    return not (d.world_size > 1 and not d.zero_stage and d.fsdp is None)


class SwiftStack(Stack):
    name = "swift"

    def prepare(self, setup: TrainingSetup) -> TrainingSetup:
        if setup.quant is not None and setup.quant.prepare_for_kbit_training:
            setup = replace(setup, quant=replace(setup.quant, prepare_for_kbit_training=False))
        if setup.grad_ckpt and setup.reentrant_checkpointing is None:
            setup = replace(setup, reentrant_checkpointing=swift_reentrant(setup))
        if (
            setup.lora is not None
            and setup.lora.adapter_bytes == 2
            and setup.precision in (Precision.FP16, Precision.FP16_TRUE)
        ):
            # swift casts every trainable fp16 parameter to fp32 (tuner.py :403-407)
            setup = replace(setup, lora=replace(setup.lora, adapter_bytes=4))
        return setup

    def weight_copies(self, spec: ModelSpec, setup: TrainingSetup) -> WeightCopies | None:
        """A 4-bit model loaded in fp32 (swift's compute dtype for an fp16 or fp32 checkpoint)
        under autocast: the HF budget's k-bit copies (one dequantized weight, the largest
        Linear's) and autocast's 16-bit cast of the fp32 head, kept until the head's
        backward; None (the HF budget's) otherwise."""
        quant = setup.quant
        if quant is None or quant.compute_dtype_bytes != 4 or not spec.is_causal_lm:
            return None
        if not dtypes_for(setup).autocast:
            return None
        largest = 2 * max(
            (
                lin.out_features * lin.in_features
                for group in spec.blocks
                for lin in group.linears
                if lin.role != "expert"
            ),
            default=0,
        )
        head = 2 * spec.vocab_size * spec.hidden_size
        return WeightCopies(
            at_loss=largest + head,
            backward_start=largest + head,
            recompute=largest,
            in_block=0,
            formula="one dequantized k-bit weight (the largest Linear) + autocast's 16-bit "
            "cast of the head, loaded in fp32 (swift's compute dtype), kept for the input "
            "gradient",
        )

    def notes(self, spec: ModelSpec, setup: TrainingSetup) -> list[str]:
        parts = []
        if setup.quant is not None:
            parts.append("no k-bit preparation (norms, embeddings and head stay 16-bit)")
        if setup.lora is not None:
            bits = "bf16" if setup.lora.adapter_bytes == 2 else "fp32"
            parts.append(f"{bits} adapters (lora_dtype)")
        if setup.grad_ckpt:
            kind = "reentrant" if setup.checkpoints_reentrant else "non-reentrant"
            parts.append(f"{kind} checkpointing")
        parts.append("the model's own loss, then the token accuracy's argmax")
        return [f"ms-swift {RELEASE}'s stack on the HF Trainer: " + "; ".join(parts)]


SWIFT_STACK = SwiftStack()

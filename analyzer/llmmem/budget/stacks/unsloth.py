"""unsloth's stack: transformers' models patched by unsloth (`FastLanguageModel.from_pretrained`,
`FastLanguageModel.get_peft_model`), trained by TRL's trainers under unsloth's patches.

Unmeasured here: unsloth's kernels are Triton and CUDA (its import stops without an
accelerator), so no step of its own runs on this project's CPU benches; every number below is
read from its code, not measured. Read in unsloth 2026.10.9 and unsloth_zoo 2026.10.9 (the
wheels' sources; file:line at those releases):

What it loads and casts
- `get_peft_model` prepares the model with unsloth_zoo's `prepare_model_for_training`
  (training_utils.py :328-470): the LoRA weights train in fp32 (`upcast = True` for
  `.lora_A.`/`.lora_B.`), every other parameter is frozen and keeps its loaded dtype. There is
  no peft k-bit preparation: a 4-bit model's norms, embeddings and head stay 16-bit, with no
  fp32 copy (the HF budget's QLoRA counts that preparation).

Its checkpointing: `use_gradient_checkpointing="unsloth"` (get_peft_model's default)
- `apply_unsloth_gradient_checkpointing` (unsloth/models/_utils.py :502-515) keeps it only for
  `max_seq_length` 512 or more; below, it is transformers' checkpointing (True).
- `UnslothCheckpointFunction.forward` (unsloth_zoo/gradient_checkpointing.py :1337-1520) copies
  each checkpointed layer's input of more than 2 MiB (`MINIMUM_SIZE`, :1326) into a host buffer
  on a side stream and saves nothing of it on the device, except the last layer's input, which
  it leaves where it is (`LAST_GC_INDEX`: "skips offloading it", :1393-1399). In backward each
  input comes back into a device buffer (`GPU_BUFFERS`, grown with `resize_` to the largest
  input, :1455-1480, and kept for the run; a second one, `GPU_BUFFERS_B`, only once double
  buffering turns on after the first pass with free memory to spare, :1309-1314, :1444). The
  budget counts one buffer, there from the first backward on, so in every phase of the step.

Its layers (FastLlamaModel: llama, mistral, qwen2, qwen3, gemma, gemma2, cohere, granite)
- Each decoder layer runs `fast_rms_layernorm` (models/llama.py :1212-1233), which keeps its
  input as it comes and an fp32 rsqrt a row (kernels/rms_layernorm.py :981), where
  transformers' RMSNorm keeps an fp32 copy of its input.
- `patch_peft_model` (models/llama.py :5330-5420) runs a layer's q, k and v through LoRA_QKV,
  its o through LoRA_W and its gate, up and down through LoRA_MLP where every Linear of the
  group has an adapter and no bias, the adapters no DoRA, LoRA dropout is 0 and the base
  weights are 16-bit or k-bit (an fp32 base and FSDP1 keep PEFT's forward). Those functions
  (kernels/fast_lora.py) keep their input alone (LoRA_QKV :845, LoRA_W :1073) and, for the
  MLP, the input, the gate's output and the up projection's output (LoRA_MLP :448): no LoRA
  intermediate, no dropout copy, no cast of the input for fp32 adapters (the adapters' matmuls
  run in the input's dtype, `matmul_lora`). With unsloth's offloaded checkpointing this is the
  one layer recomputed at a time; without checkpointing, every layer.

Its loss
- unsloth's Llama forward returns no logits in training (`UNSLOTH_RETURN_LOGITS` unset,
  models/llama.py :2087-2122) and computes `unsloth_fused_ce_loss` (unsloth_zoo/fused_losses/
  cross_entropy_loss.py): the positions in chunks, each chunk's head output upcast to fp32 with
  its cross-entropy, and the input gradient made in forward (`grad_inputs`). The chunk count is
  the smallest multiple of 4 that keeps a chunk's transient, 16 B a logit
  (`_CE_BYTES_PER_LOGIT`, :225), within a target of half the free memory capped at 4 GiB
  (`_CE_TARGET_GB_CAP`, :229; `get_chunk_size`, :290-303). The budget takes the cap (a GPU with
  8 GiB or more free when the loss runs); with less free memory the chunks are smaller.
"""

from __future__ import annotations

import math
from dataclasses import replace

from llmmem.budget.activations import ActivationEstimate, BlockRules, dtypes_for
from llmmem.budget.logits import LogitsMoments, cut_cross_entropy_moments
from llmmem.budget.result import Term
from llmmem.budget.setup import LossImpl, Precision, SetupError, TrainingSetup
from llmmem.budget.stacks.hf import LossMoments, OffloadedActivations, Stack
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes, format_count

RELEASE = "2026.10.9"
CE_BYTES_PER_LOGIT = 16  # unsloth_zoo's `_CE_BYTES_PER_LOGIT`
CE_TARGET_CAP = 4 * 2**30  # `_CE_TARGET_GB_CAP`: 4 GiB
OFFLOAD_MIN_SEQ = 512  # below this max_seq_length "unsloth" is plain checkpointing


# the model types FastLlamaModel's patch_peft_model fuses (models/llama.py :5253-5274; falcon_h1
# keeps PEFT's MLP, qwen3moe's experts are not a gated MLP of three Linears)
FAST_LAYER_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "cohere", "granite"}
)
# the base weights' precisions that are 16-bit (an fp32 base keeps PEFT's forward, :5326-5328)
SIXTEEN_BIT_BASES = (Precision.BF16_TRUE, Precision.FP16_TRUE, Precision.BF16_AUTOCAST)


def unsloth_block_rules(spec: ModelSpec, setup: TrainingSetup) -> BlockRules:
    """What unsloth's own layer functions keep, where they run (module docstring)."""
    if spec.model_type not in FAST_LAYER_TYPES:
        return BlockRules()
    lora = setup.lora
    fused = (
        lora is not None
        and lora.dropout == 0
        and not lora.dora
        and (setup.quant is not None or setup.precision in SIXTEEN_BIT_BASES)
        and setup.distributed.fsdp is None
    )
    return BlockRules(fast_lora=fused, fast_norm=True)


def fused_ce_chunks(tokens: int, vocab: int, target: int = CE_TARGET_CAP) -> int:
    """`get_chunk_size`: a multiple of 4 chunks, each within `target` at 16 B a logit."""
    exact = tokens * vocab * CE_BYTES_PER_LOGIT / target
    if exact <= 1.0:
        return 1
    return min(math.ceil(exact / 4) * 4, tokens)


def fused_ce_loss(spec: ModelSpec, setup: TrainingSetup) -> LossMoments:
    """unsloth_fused_ce_loss: one chunk's transient beside the input gradient made in forward."""
    e = dtypes_for(setup).compute
    tokens = setup.tokens
    chunks = fused_ce_chunks(tokens, spec.vocab_size)
    rows = math.ceil(tokens / chunks)
    transient = CE_BYTES_PER_LOGIT * rows * spec.vocab_size
    grad_input = e * tokens * spec.hidden_size
    gradient_text = f"{e} B × N·h (the input gradient, made in forward)"
    moments = LogitsMoments(
        forward_end=transient + grad_input,
        backward_start=grad_input,
        head_backward=grad_input,
        formula_forward=f"{CE_BYTES_PER_LOGIT} B × {format_count(rows)} positions × V (one of "
        f"{chunks} chunks, within unsloth's 4 GiB target) + {gradient_text}",
        formula_backward=gradient_text,
        formula_head=gradient_text,
    )
    return LossMoments(moments, 0)


# unsloth's releases (calendar versions) where its Llama training loss changed, read in the
# released wheels (models/llama.py `CausalLM_fast_forward`; 2024.1 at commit 2f55935f):
# - up to 2024.11.7 the whole logits and `fast_cross_entropy_loss` (2024.11.7 llama.py:966-993;
#   before 2024.2, a vocabulary over 65,536 went to torch's cross-entropy on `logits.float()`,
#   2024.1 kernels/cross_entropy_loss.py:163-173);
# - from 2024.11.8 Apple's Cut Cross-Entropy (`fused_linear_cross_entropy`, unsloth_zoo
#   loss_utils.py:135-157) where it loads (torch 2.4 or newer), and from 2024.12.5 the whole
#   logits again for 1,024 positions or fewer (llama.py:1004-1008);
# - from 2025.8.5 unsloth's chunked loss (`unsloth_fused_ce_loss`, llama.py:1207-1219), the
#   whole logits still for 1,024 positions or fewer;
# - from 2025.10.10 the chunked loss whatever the positions (llama.py:1206).
CUT_CROSS_ENTROPY_FROM = (2024, 11, 8)
SMALL_BATCH_LOGITS_FROM = (2024, 12, 5)
CHUNKED_LOSS_FROM = (2025, 8, 5)
ALWAYS_CHUNKED_FROM = (2025, 10, 10)
CHUNKED_VOCAB_FROM = (2024, 2)  # a vocabulary past 65,536 through its own kernel (e7c53fb3)
SMALL_BATCH_POSITIONS = 1024


def calendar(version: str | None) -> tuple[int, ...] | None:
    """ "2025.10.10" -> (2025, 10, 10); None where unknown or unreadable."""
    if not version:
        return None
    parts = tuple(int(part) for part in version.split(".")[:3] if part.isdigit())
    return parts if len(parts) >= 2 else None


def loss_of_release(spec: ModelSpec, setup: TrainingSetup) -> str:
    """Which loss the run's unsloth release computes: "fused" (the chunked loss), "cce",
    "logits" (the whole logits, unsloth's kernel) or "torch" (the whole logits upcast for
    torch's cross-entropy)."""
    found = calendar(setup.unsloth_version)
    if found is None or found >= ALWAYS_CHUNKED_FROM:
        return "fused"
    few = setup.tokens <= SMALL_BATCH_POSITIONS
    cce_loads = setup.torch_release >= (2, 4)
    if found >= CHUNKED_LOSS_FROM:
        if few or (found < (2025, 9, 1) and not cce_loads):
            return "logits"
        return "fused"
    if found >= CUT_CROSS_ENTROPY_FROM:
        if not cce_loads or (few and found >= SMALL_BATCH_LOGITS_FROM):
            return "logits"
        return "cce"
    if found < CHUNKED_VOCAB_FROM and spec.vocab_size > 65536:
        return "torch"
    return "logits"


def whole_logits_loss(spec: ModelSpec, setup: TrainingSetup) -> LossMoments:
    """`fast_cross_entropy_loss` over the whole logits (2024.11.7 kernels/cross_entropy_loss.py
    :290-365): the logits in the compute dtype, kept, with an fp32 log-sum-exp a position and the
    shifted labels (int64); backward writes the gradient into the logits themselves. No fp32
    copy of the logits: each row is upcast in the kernel's registers."""
    e = dtypes_for(setup).compute
    n = setup.tokens
    logits = e * n * spec.vocab_size
    count = f"N·V = {format_count(n)}×{format_count(spec.vocab_size)}"
    moments = LogitsMoments(
        forward_end=logits + 16 * n,
        backward_start=logits + 12 * n,
        head_backward=logits,
        formula_forward=f"{e} B × {count} (the logits) + 4 B × N (log-sum-exp) + 8 B × N "
        "(labels) + 4 B × N (the losses): unsloth's cross-entropy kernel",
        formula_backward=f"{e} B × {count}: the gradient written into the logits + 12 B × N",
        formula_head=f"{e} B × {count}: the logits' gradient, in place",
    )
    return LossMoments(moments, 0)


class UnslothStack(Stack):
    name = "unsloth"
    offload_is_exact = True

    def check(self, setup: TrainingSetup) -> None:
        if setup.activation_offload and not setup.grad_ckpt:
            raise SetupError(
                "unsloth offloads the inputs of checkpointed layers "
                '(use_gradient_checkpointing="unsloth"): add --grad-ckpt'
            )

    def prepare(self, setup: TrainingSetup) -> TrainingSetup:
        if setup.quant is not None and setup.quant.prepare_for_kbit_training:
            setup = replace(setup, quant=replace(setup.quant, prepare_for_kbit_training=False))
        if setup.lora is not None and setup.lora.adapter_bytes != 4:
            setup = replace(setup, lora=replace(setup.lora, adapter_bytes=4))
        if setup.activation_offload and setup.seq < OFFLOAD_MIN_SEQ:
            setup = replace(setup, activation_offload=False)
        return setup

    def block_rules(self, spec: ModelSpec, setup: TrainingSetup) -> BlockRules:
        return unsloth_block_rules(spec, setup)

    def loss(self, spec: ModelSpec, setup: TrainingSetup) -> LossMoments | None:
        if not spec.is_causal_lm or setup.loss is not LossImpl.STANDARD:
            return None
        kind = loss_of_release(spec, setup)
        if kind == "logits":
            return whole_logits_loss(spec, setup)
        if kind == "cce":
            return LossMoments(cut_cross_entropy_moments(spec, setup), 0)
        if kind == "torch":
            return None  # the shared rule: the logits upcast for torch's cross-entropy
        return fused_ce_loss(spec, setup)

    def offloaded(
        self, spec: ModelSpec, setup: TrainingSetup, acts: ActivationEstimate
    ) -> OffloadedActivations | None:
        d = dtypes_for(setup).residual
        layer_input = d * setup.tokens * spec.hidden_size
        outside = acts.outside.evaluate(acts.dims)
        buffer_text = f"unsloth's device buffer for a layer input coming back ({d}·N·h)"
        return OffloadedActivations(
            in_forward=Term(
                bytes=layer_input,
                formula=buffer_text + "; the earlier layers' inputs are on the host",
            ),
            after_forward=Term(
                bytes=2 * layer_input + outside,
                formula=f"{buffer_text} + the last layer's input (not offloaded, {d}·N·h) + "
                f"final norm and head input ({format_bytes(outside)})",
            ),
            in_backward=Term(bytes=layer_input, formula=buffer_text),
        )

    def notes(self, spec: ModelSpec, setup: TrainingSetup) -> list[str]:
        parts = []
        if setup.quant is not None:
            parts.append("no k-bit preparation (frozen weights keep their dtype)")
        if setup.lora is not None:
            parts.append("fp32 adapters")
        if setup.activation_offload:
            parts.append(
                "offloaded checkpointing: every layer input but the last on the host, one "
                "device buffer to bring them back"
            )
        elif setup.grad_ckpt and setup.seq < OFFLOAD_MIN_SEQ:
            parts.append(f"plain checkpointing (unsloth offloads from {OFFLOAD_MIN_SEQ} tokens)")
        rules = unsloth_block_rules(spec, setup)
        if rules.fast_lora:
            parts.append(
                "its own LoRA functions (LoRA_QKV, LoRA_W, LoRA_MLP: each keeps its input, the "
                "MLP also its gate and up outputs)"
            )
        if rules.fast_norm:
            parts.append("its RMSNorm (keeps its input, no fp32 copy)")
        if spec.is_causal_lm and setup.loss is LossImpl.STANDARD:
            parts.append(LOSS_WORDS[loss_of_release(spec, setup)])
        if setup.unsloth_version:
            head = (
                f"unsloth {setup.unsloth_version}'s stack (read in {RELEASE}, its loss in the "
                "release's own wheel)"
            )
        else:
            head = f"unsloth {RELEASE}'s stack (the run's release not found: --versions unsloth=X)"
        return [
            f"{head}, read from its code and unmeasured here (its kernels need CUDA): "
            + "; ".join(parts)
        ]


LOSS_WORDS = {
    "fused": "its fused cross-entropy (no logits kept)",
    "cce": "Cut Cross-Entropy (no logits kept)",
    "logits": "its cross-entropy kernel over the whole logits (the gradient written into them)",
    "torch": "the whole logits upcast for torch's cross-entropy (its kernel took no vocabulary "
    "past 65,536 before 2024.2)",
}

UNSLOTH_STACK = UnslothStack()

"""torchtune's own training stack, as its code runs a step (`tune run
lora_finetune_single_device` / `full_finetune_single_device`).

Read in torchtune 0.6.1, torchao 0.14.1 (the newest torchao with everything torchtune 0.6.1
imports) and torch 2.13.0; file:line at those releases, torchtune's recipes under `recipes/`,
the rest under `torchtune/`:

What it loads and casts
- The model is built under `training.set_default_dtype(dtype)` (lora recipe :431, full :428):
  every parameter, the LoRA adapters too, in the config's `dtype` (bf16 or fp32; `fp16` is
  refused, full :124-126, lora :130). No autocast, no fp32 master copy: gradients and torch
  AdamW states are in that dtype (`validate_expected_param_dtype`, full :442, lora :479).
- QLoRA (`qlora_*` builders, `quantize_base=True`): every Linear of the blocks is torchao NF4,
  the adapted ones through `LoRALinear` (modules/peft/lora.py:75-78 `to_nf4(linear.weight)`), the
  others `FrozenNF4Linear` (models/llama3_1/_component_builders.py:128-130, 354-404); the
  embeddings, the norms and the output head stay in dtype ("quantize_base is not applied to
  final output_proj", _component_builders.py:251). Nothing is upcast: there is no k-bit
  preparation.
- torchao's NF4 (dtypes/nf4tensor.py): `to_nf4(tensor, block_size=64, scaler_block_size=256)`
  (:1061) keeps the values packed two per byte (`combined_blocks.to(torch.uint8)`, :827), one int8
  scaler per 64 values (`quantized_scaler_blocks.flatten().to(torch.int8)`, :759), one
  quantization factor per 256 scalers in the weight's dtype (:760), the scalers' mean (:732) and
  a 16-entry NF4 table (:650) in the weight's dtype, per tensor: 0.5 + 1/64 + e/16384 bytes per
  value plus 17·e bytes per tensor (bitsandbytes' double quantization keeps an fp32 factor per
  256 scalers instead). torchao 0.1 (torchtune 0.1.x, torch 2.2) kept the factor as a view of
  the tensor it was taken from, one value per scaler (`quantization_factor[:, 0]`,
  nf4tensor.py:333-347 at v0.1; made contiguous in torchao 0.3, pytorch/ao#298), and a loaded
  weight keeps that view (`dest_tensor.quantization_factor = ref_tensor.quantization_factor`,
  torchtune utils/_register_nf4_dispatch_ops.py:39 at 0914d5cf): e/64 bytes per value, not
  e/16384.
- Loading the model leaves blocks in the caching allocator that every later peak counts
  (stacks/torchtune_load.py): with torchao 0.1 they decide a QLoRA run's reserved peak.
- A NF4 matmul (`LinearNF4`, :1037-1048) saves only the NF4 weight and dequantizes it at each
  use, in forward and in backward (`weight.to(input.dtype)` → `get_original_weight`, :829-855):
  two int64 index tensors of half the values each (:833-834, 8 B per value), the table lookups
  (e per value), the two scaled halves (e per value) and their stack (e per value) are alive at
  once: (8 + 3e) B per value of the Linear, 14 B in bf16 (20 in fp32), measured on the CPU as
  14.05 and 20.08.
- The RoPE table is a buffer built once for `max_seq_len` positions in fp32
  (models/llama3_1/_position_embeddings.py:96-101, modules/position_embeddings.py likewise):
  4 B × max_seq_len × head_dim, one shared by every layer (_component_builders.py:85).

Its blocks (what autograd keeps differs from transformers' modules)
- RMSNorm is `F.rms_norm(x.float(), weight=self.scale).to(x.dtype)` (modules/rms_norm.py:38-43):
  an fp32 input and a bf16 weight cannot take the fused kernel ("Mismatch dtype between input and
  weight ... Cannot dispatch to fused implementation", torch 2.13 aten/src/ATen/native/
  layer_norm.cpp:346, on CUDA as on the CPU), so the composite runs: it keeps the fp32 input and,
  where the scale trains, the normalised fp32 tensor the scale multiplies (transformers' keeps it
  in the input dtype).
- Attention copies K and V to every query head before SDPA (`expand(...).flatten(1, 2)`,
  modules/attention.py:290-291) and SDPA keeps the copies: 2·e·N·q where transformers keeps
  2·e·N·kvd.
- RoPE computes in fp32 (`x.float()`, _position_embeddings.py:171, back with `type_as`, :191);
  the products with the table keep only the table.
- LoRA (`LoRALinear.forward`, lora.py:130-139): the frozen base saves nothing, `lora_a` keeps its
  input as it comes (same dtype, no cast: one copy for every adapter reading it), `lora_b` the
  rank-r tensor.

Its loss
- `CEWithChunkedOutputLoss(num_output_chunks=8)` (modules/loss/ce_chunked_output_loss.py:30)
  with `model.set_num_output_chunks` (full recipe :298, lora :302): the model applies the head to
  8 chunks of the sequence (`chunked_output`, modules/transformer.py:482-501) and returns them in
  the model's dtype; the loss upcasts one chunk at a time (`logits.float()`, :42) and
  `cross_entropy` keeps that chunk's fp32 log-softmax for backward, so after the loop every
  chunk's log-softmax (4 B per logit) is alive beside the logits (e per logit); the recipe then
  deletes the logits (`del logits`, full :652, lora :659), so backward starts with the
  log-softmaxes, and its first chunk's two fp32 gradients (the log-softmax's and the input's).
  Autograd runs every chunk's loss backward before the head's (the head's nodes were made first),
  so the head's backward starts with every chunk's gradient in the model's dtype.
- A trainable head (full fine-tuning) gets one weight gradient per chunk: autograd adds the first
  two into a new tensor, then accumulates in place (torch's profiler on the CPU: `aten::add`,
  then `aten::add_`), so three head-sized gradients are alive once, with two chunks' logits
  gradients freed.
- `compile: True` compiles each layer and the chunk's upcast and cross-entropy
  (training/_compile.py:30-88): the compiled graph keeps the chunk's logits, not an fp32 copy
  or a log-softmax (derived from the code; the blocks are sized as in eager mode and the band
  reaches down to the checkpointed step, as for any compiled step).
- Without the chunked loss the model upcasts the whole logits (`self.output(h).float()`,
  transformer.py:659) and `torch.nn.CrossEntropyLoss` keeps their log-softmax.

Checkpointing and offload
- `training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})`
  (lora :446-449, full :434-437; training/memory.py:26-43) wraps each layer with torch's
  non-reentrant checkpoint (`checkpoint_wrapper`'s default): each layer keeps its input.
- `OffloadActivations` (training/_activation_offloading.py) moves every saved tensor of 1 KiB or
  more (`min_offload_size`, :71) that is not a parameter or a buffer (:150-153) to the host in
  forward, no storage deduplication; it keeps the 5 latest (`max_fwd_stash_size`, :70) on the
  device until their copy is done (:155-163, :193) and, in backward, a tensor brought back until
  the next node that brings one back is done (:264-266, :335-338). The output head runs under a
  `NoOpManager` (:396-418): what it saves stays. The recipes refuse offloading without
  checkpointing (lora :172-175, full :171-174), so what is offloaded is each layer's
  checkpointed input and the final norm's tensors; the offloaded step is the step, not a floor.

Its sharding (the `*_distributed` recipes)
- `training.shard_model` (training/_distributed.py:519-568): `fully_shard` on every `layers.i`
  (and `custom_sharded_layers`), then on the whole model, FSDP2, with the config's
  `fsdp_reshard_after_forward` (default True) passed explicitly to each: from torch 2.8 the
  root unit (embeddings, final norm, head) is then resharded as the model's forward returns, so
  the loss runs without it and backward gathers it again before the head's backward (its
  all-gather buffer and the parameters copied out of it, for a moment both);
  `fsdp_cpu_offload` is FSDP2's CPUOffloadPolicy. `custom_sharded_layers` names modules
  sharded as units of their own before the model (`get_shard_conditions`, :470-516): with
  `tok_embeddings` and `output` (8B_full.yaml) the root holds the final norm only, the head is
  gathered again for its backward and reduced as it ends, the embeddings at the very end
  (DistributedSetup.fsdp_own_units). The loop is the single-device one's with the
  token count all-reduced before `scale_grads` (lora_finetune_distributed.py:777-830).

Its optimizer
- `optimizer_in_bwd: True` (full recipe :143-156, :467-477): one optimizer per parameter,
  stepped and zeroed in the parameter's post-accumulate-grad hook (training/memory.py:219-242);
  gradient accumulation is refused (:153-156). The budget's `optimizer_in_backward`.
- `bitsandbytes.optim.PagedAdamW8bit` / `PagedAdamW` (the low-memory configs, e.g.
  llama3_1/8B_full_single_device.yaml): states in CUDA unified memory (budget.optimizers).
"""

from __future__ import annotations

import math
from dataclasses import replace

from llmmem.budget.activations import ActivationEstimate, BlockRules, dtypes_for
from llmmem.budget.logits import LogitsMoments, logits_count
from llmmem.budget.result import Term
from llmmem.budget.setup import (
    FsdpShard,
    LossImpl,
    Method,
    Precision,
    QuantSetup,
    QuantType,
    SetupError,
    TrainingSetup,
)
from llmmem.budget.stacks.hf import LossMoments, OffloadedActivations, Stack, WeightCopies
from llmmem.budget.stacks.torchtune_load import nf4_load_kept, torchao_unchunked
from llmmem.budget.weights import ParameterGroup, QuantizedBytes
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes, format_count

RELEASE = "0.6.1"
# torchao's NF4 (to_nf4 defaults, dtypes/nf4tensor.py:1061)
NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256
NF4_TABLE = 16  # the NF4 lookup table each tensor keeps, in the weight's dtype, with its mean
# bytes per value alive while get_original_weight runs, besides 3 × the weight's dtype: the two
# int64 index tensors of half the values each (nf4tensor.py:833-834)
NF4_DEQUANT_INDEX_BYTES = 8
# OffloadActivations' defaults (training/_activation_offloading.py:70-71)
OFFLOAD_STASH = 5
TORCHTUNE_RULES = BlockRules(norm_output_fp32=True, repeats_kv_heads=True)


def nf4_value_bytes(dtype_bytes: int, factor_per_scaler: bool = False) -> float:
    """Bytes one torchao NF4 value costs: packed data, int8 scalers, the per-256-scalers factor
    in the weight's dtype (with `factor_per_scaler`, torchao 0.1's: the factor's whole tensor,
    one value per scaler, kept behind its view)."""
    factor_values = NF4_BLOCK if factor_per_scaler else NF4_BLOCK * NF4_SCALER_BLOCK
    return 0.5 + 1.0 / NF4_BLOCK + dtype_bytes / factor_values


def nf4_bytes_per_param(dtype_bytes: int, values: int, factor_per_scaler: bool = False) -> float:
    """`nf4_value_bytes` with the tensor's own NF4 table and scalers' mean spread over it."""
    per_tensor = (NF4_TABLE + 1) * dtype_bytes
    return nf4_value_bytes(dtype_bytes, factor_per_scaler) + per_tensor / max(values, 1)


def nf4_dequantize_bytes(dtype_bytes: int, values: int) -> int:
    """The peak of `get_original_weight` for a weight of `values` values: (8 + 3e) B each."""
    return (NF4_DEQUANT_INDEX_BYTES + 3 * dtype_bytes) * values


def chunked_loss(spec: ModelSpec, setup: TrainingSetup) -> LossMoments:
    """CEWithChunkedOutputLoss over the model's chunked logits (see the module's docstring)."""
    e = dtypes_for(setup).compute
    n = logits_count(spec, setup)
    chunks = max(1, setup.loss_chunks)
    # torch.chunk over the sequence: ceil(s / chunks) positions a chunk, the last the rest
    rows = min(math.ceil(setup.seq / chunks), setup.seq)
    chunk = setup.batch * rows * spec.vocab_size
    count = f"N·V = {format_count(setup.tokens)}×{format_count(spec.vocab_size)}"
    one = f"one chunk of {rows} positions × {setup.batch}"
    upcast = 4 * chunk if e != 4 else 0
    forward_text = (
        f"({e} (logits, {chunks} chunks) + 4 (every chunk's fp32 log-softmax)) B × {count}"
        + (f" + 4 B × {one} (its fp32 copy, while its loss runs)" if upcast else "")
    )
    backward_text = (
        f"4 B × {count} (every chunk's log-softmax; the recipe deleted the logits) + "
        f"2 × 4 B × {one} (its log-softmax's and its input's fp32 gradients)"
    )
    head_text = f"{e} B × {count}: every chunk's logits gradient, in the model's dtype"
    head_backward = e * n
    if setup.method is Method.FULL and chunks > 1:
        # a trainable head's weight gradient comes from every chunk: autograd sums the first
        # two into a new tensor (its input buffer accumulates in place only after that:
        # aten::add, then aten::add_, in torch's profiler), while two chunks' logits
        # gradients are done and freed. The sum is the head's gradient, which the shared
        # budget counts beside, but not with the optimizer in backward (one gradient at a
        # time, each stepped and freed in its hook): then it is counted here
        head_weight = e * spec.vocab_size * spec.hidden_size
        copies = 3 if setup.optimizer_in_backward else 2
        head_backward = e * (n - 2 * chunk) + copies * head_weight
        head_text = (
            f"{e} B × ({count} − 2 chunks done): the chunks' logits gradients + {copies} × "
            f"{e} B × V·h: the first two chunks' head weight gradients"
            + (" and their sum" if copies == 3 else ", summed into a third")
        )
    forward_end = (e + 4) * n + upcast
    backward_start = 4 * n + 8 * chunk
    if setup.compile:
        # `compile_loss` compiles the chunk's upcast and cross-entropy as one graph
        # (training/_compile.py:76-79): the graph keeps its input, the chunk's logits, and no
        # fp32 copy or log-softmax, and its backward gives the chunk's gradient in the
        # logits' dtype (derived from the code: inductor's buffers are not counted on the CPU)
        forward_end, backward_start = e * n, e * n + e * chunk
        forward_text = (
            f"{e} B × {count}: the chunks' logits, kept by the compiled cross-entropy "
            "(no fp32 copy, no log-softmax)"
        )
        backward_text = f"{e} B × {count} + {e} B × {one}: the logits and one chunk's gradient"
    moments = LogitsMoments(
        forward_end=forward_end,
        backward_start=backward_start,
        head_backward=head_backward,
        formula_forward=forward_text,
        formula_backward=backward_text,
        formula_head=head_text,
    )
    # the logits' blocks, freed by `del logits`, are too small for the chunks' fp32 gradients
    # but take their gradients in the model's dtype: refilled by the head's backward, they are
    # a hole only where the loss's backward is the larger moment
    hole = max(0, e * n - max(0, head_backward - backward_start)) if e != 4 else 0
    if setup.compile:
        hole = 0  # the compiled graph keeps the logits: nothing is freed before backward
    return LossMoments(moments, hole)


def upcast_loss(spec: ModelSpec, setup: TrainingSetup) -> LossMoments:
    """torch's CrossEntropyLoss over `self.output(h).float()`: the fp32 logits and their
    log-softmax in forward; the log-softmax, its gradient and the logits' in backward."""
    e = dtypes_for(setup).compute
    n = logits_count(spec, setup)
    count = f"N·V = {format_count(setup.tokens)}×{format_count(spec.vocab_size)}"
    moments = LogitsMoments(
        forward_end=8 * n,
        backward_start=12 * n,
        head_backward=e * n,
        formula_forward=f"(4 (fp32 logits, upcast by the model) + 4 (log-softmax)) B × {count}",
        formula_backward=f"12 B × {count}: saved log-softmax + its gradient + the logits' (fp32)",
        formula_head=f"{e} B × {count}: the logits' gradient in the model's dtype",
    )
    return LossMoments(moments, e * n if e != 4 else 0)


class TorchtuneStack(Stack):
    name = "torchtune"
    offload_is_exact = True
    # the root's post-forward frees the last all-gather result (torch 2.13 _fsdp_state.py:
    # 333-342): measured with the root resharded and with it kept (torch < 2.8 emulated)
    fsdp_loss_without_last_gather = True

    def check(self, setup: TrainingSetup) -> None:
        if setup.precision not in (Precision.FP32, Precision.BF16_TRUE):
            raise SetupError(
                f"torchtune trains in its dtype (bf16 or fp32), without mixed precision: "
                f"precision {setup.precision.value} is not a torchtune setup (bf16 is "
                "bf16-true; torchtune refuses fp16)"
            )
        if setup.distributed.zero_stage:
            raise SetupError("torchtune does not run DeepSpeed: use --fsdp for its distributed")
        if setup.quant is not None and (
            setup.quant.quant_type is not QuantType.NF4 or setup.method is not Method.QLORA
        ):
            raise SetupError("torchtune's QLoRA quantizes to NF4 (torchao): use --quant nf4")
        if setup.activation_offload and not setup.grad_ckpt:
            raise SetupError(
                "torchtune refuses enable_activation_offloading without "
                "enable_activation_checkpointing (its recipes raise a RuntimeError): add "
                "--grad-ckpt"
            )

    def prepare(self, setup: TrainingSetup) -> TrainingSetup:
        weight = setup.precision.weight_bytes
        if setup.lora is not None and setup.lora.adapter_bytes != weight:
            setup = replace(setup, lora=replace(setup.lora, adapter_bytes=weight))
        if setup.quant is not None:
            quant = QuantSetup(
                quant_type=QuantType.NF4,
                double_quant=True,
                compute_dtype_bytes=weight,
                prepare_for_kbit_training=False,
            )
            if quant != setup.quant:
                setup = replace(setup, quant=quant)
        if setup.reentrant_checkpointing is not False:
            setup = replace(setup, reentrant_checkpointing=False)
        return setup

    def block_rules(self, spec: ModelSpec, setup: TrainingSetup) -> BlockRules:
        return TORCHTUNE_RULES

    def quantized_bytes(self, setup: TrainingSetup) -> QuantizedBytes:
        dtype_bytes = setup.precision.weight_bytes
        whole_factor = torchao_unchunked(setup)

        def nf4(_quant: QuantSetup, in_features: int, out_features: int) -> float:
            return nf4_bytes_per_param(dtype_bytes, in_features * out_features, whole_factor)

        return nf4

    def buffers(self, spec: ModelSpec, setup: TrainingSetup) -> tuple[ParameterGroup, ...]:
        positions = spec.max_position_embeddings
        if not positions:
            return ()
        return (
            ParameterGroup(
                name="RoPE table (fp32 buffer, max_seq_len positions)",
                kind="buffer",
                tensors=1,
                rows=positions,
                cols=spec.head_dim,
                bytes_per_param=4.0,
                trainable=False,
            ),
        )

    def loss(self, spec: ModelSpec, setup: TrainingSetup) -> LossMoments | None:
        if not spec.is_causal_lm:
            return None
        if setup.loss is LossImpl.CHUNKED:
            return chunked_loss(spec, setup)
        if setup.loss is LossImpl.STANDARD:
            return upcast_loss(spec, setup)
        return None

    def fsdp_root_resharded(self, setup: TrainingSetup) -> bool:
        """`training.shard_model` passes `reshard_after_forward` to every `fully_shard`, the
        root's too (training/_distributed.py:550-568), and torch from 2.8 on honours an
        explicit True on the root (pytorch#154704: `_auto_reshard_after_forward`,
        _fsdp_state.py:205-207 at 2.13; before, the root was always kept whole)."""
        return setup.distributed.fsdp is FsdpShard.FULL_SHARD and setup.torch_release >= (2, 8)

    def weight_copies(self, spec: ModelSpec, setup: TrainingSetup) -> WeightCopies | None:
        if setup.quant is None:
            return None
        e = setup.precision.weight_bytes
        largest = max(
            (
                lin.out_features * lin.in_features
                for group in spec.blocks
                for lin in group.linears
                if lin.role != "expert"
            ),
            default=0,
        )
        inside = nf4_dequantize_bytes(e, largest)
        return WeightCopies(
            at_loss=0,
            backward_start=0,
            recompute=inside,
            in_block=inside,
            formula=f"torchao dequantizing the largest NF4 Linear ({format_count(largest)} "
            f"values × (8 B of int64 indices + 3 × {e} B))",
        )

    def offloaded(
        self, spec: ModelSpec, setup: TrainingSetup, acts: ActivationEstimate
    ) -> OffloadedActivations | None:
        d = dtypes_for(setup).residual
        n_h = setup.tokens * spec.hidden_size
        blocks = sum(g.count for g in spec.blocks)
        stash = min(OFFLOAD_STASH, blocks) * d * n_h
        norm_trains = setup.method is Method.FULL
        head_trains = setup.method is Method.FULL and spec.is_causal_lm
        # the final norm saves its fp32 input twice and its rsqrt twice (and, where its scale
        # trains, the normalised fp32 tensor): those still in the stash of 5 stay on the
        # device, with the last layer's input where four of the five are the norm's
        final = 4 * n_h + 4 * setup.tokens + (4 * n_h if norm_trains else 0)
        last_input = 0 if norm_trains else d * n_h
        head_input = d * n_h if head_trains else 0
        after = final + last_input + head_input
        parts = ["the final norm's fp32 tensors (in the stash of the 5 latest)"]
        if last_input:
            parts.append("the last layer's input (still in the stash)")
        if head_input:
            parts.append("the head's input (saved under NoOpManager)")
        return OffloadedActivations(
            in_forward=Term(
                bytes=stash,
                formula=f"the stash of the {OFFLOAD_STASH} latest offloaded tensors (layer "
                f"inputs, {d}·N·h each) until their copy is done",
            ),
            after_forward=Term(bytes=after, formula=" + ".join(parts) + f": {format_bytes(after)}"),
            in_backward=Term(
                bytes=2 * d * n_h,
                formula=f"2 × {d}·N·h: the layer's input brought back and the one before it "
                "(freed when the next node that brings one back is done)",
            ),
        )

    def load_reserved(
        self, spec: ModelSpec, setup: TrainingSetup, weights_bytes: int
    ) -> Term | None:
        """What the model's build and load leave reserved for every later peak (QLoRA)."""
        kept = nf4_load_kept(spec, setup, weights_bytes)
        return kept.reserved if kept is not None else None

    def notes(self, spec: ModelSpec, setup: TrainingSetup) -> list[str]:
        dtype = "bf16" if setup.precision is Precision.BF16_TRUE else "fp32"
        e = setup.precision.weight_bytes
        parts = [f"everything in {dtype} (adapters too, no autocast)"]
        if setup.quant is not None:
            parts.append(
                f"torchao NF4 ({nf4_value_bytes(e, torchao_unchunked(setup)):.4g} B per value),"
                " no k-bit preparation"
            )
        if setup.loss is LossImpl.CHUNKED:
            parts.append(
                f"CEWithChunkedOutputLoss in {setup.loss_chunks} chunks (every chunk's fp32 "
                "log-softmax kept until backward)"
            )
        parts.append("RMSNorm over an fp32 copy, K/V copied to every head")
        if setup.activation_offload:
            parts.append("OffloadActivations: every saved tensor of 1 KiB or more on the host")
        return [f"torchtune {RELEASE}'s stack: " + "; ".join(parts)]


TORCHTUNE_STACK = TorchtuneStack()

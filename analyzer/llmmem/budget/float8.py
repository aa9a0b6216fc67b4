"""FP8 training with torchao's float8 Linears (`convert_to_float8_training`, accelerate's
`mixed_precision: fp8` with `fp8_config.backend: AO`), read in torchao 0.18.0
`torchao/float8/float8_linear.py`:

- the weights stay what they were (the high-precision master, fp32 under autocast or bf16):
  nothing FP8 is kept between steps; each matmul casts its operands to float8 on the fly
  (`hp_tensor_to_float8_dynamic`, tensorwise scales by default);
- `Float8Linear.forward` bypasses autocast's `F.linear`: it casts its input to the autocast
  dtype itself and passes `self.weight.t()`, a view of the parameter, so autocast keeps no
  16-bit copy of a converted weight;
- `matmul_with_hp_or_float8_args.forward` saves `input_hp` and `weight_hp_t` (the 16-bit input a
  plain Linear saves, and the parameter's view): the saved activations are a plain Linear's;
- in forward one matmul at a time holds the float8 input (1 byte × N·in) and weight (1 byte ×
  in·out); in backward the gradient of the output cast twice (for the input's and for the
  weight's gradient, 2 × N·out), the weight again (in·out) and the input along its other axis
  (N·in).

Converted are the blocks' Linears; the LM head stays a plain Linear (accelerate's
`filter_first_and_last_linear_layers`, torchtitan's default `module_filter_fn`), so autocast's
copy of it is kept as before. FP8 matmuls need FP8 tensor cores (compute capability 8.9+).
TransformerEngine (`te.Linear` under `fp8_autocast`) caches FP8 weight copies between
micro-batches and saves FP8 inputs for backward: not sized here."""

from __future__ import annotations

from llmmem.budget.setup import Method, TrainingSetup
from llmmem.models.spec import ModelSpec


def float8_weight_copy_terms(spec: ModelSpec, setup: TrainingSetup) -> tuple[int, int, int]:
    """The weight copies of a torchao float8 step (through forward, at the start of backward,
    while a block is recomputed): the head's autocast copy, and the float8 operands of the
    largest Linear's matmul, one at a time."""
    b, s = setup.attention_shape
    tokens = b * s
    linears = [lin for group in spec.blocks for lin in group.linears if lin.role != "expert"]
    forward = max(
        (lin.in_features * lin.out_features + tokens * lin.in_features for lin in linears),
        default=0,
    )
    backward = max(
        (
            2 * tokens * lin.out_features
            + lin.in_features * lin.out_features
            + tokens * lin.in_features
            for lin in linears
        ),
        default=0,
    )
    head = 0
    if setup.precision.is_autocast and spec.is_causal_lm and setup.method is Method.FULL:
        head = 2 * spec.vocab_size * spec.hidden_size  # autocast's bf16 copy of the fp32 head
    return head + forward, head + backward, head + max(forward, backward)


def float8_text() -> str:
    return (
        "torchao float8: no 16-bit copies of the blocks' weights, the float8 operands of one "
        "matmul at a time (input and weight; in backward the output gradient twice, the "
        "weight and the input) + autocast's copy of the head"
    )

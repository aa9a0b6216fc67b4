"""What torchtune's QLoRA recipe leaves reserved from loading the model.

`tune run lora_finetune_single_device` builds the model on the device, in its dtype (`with
set_default_dtype(dtype), self._device:`, recipes/lora_finetune_single_device.py:254-255 at
0914d5cf, :431 at 0.6.1), each NF4 Linear quantized on the device as it is made
(`to_nf4(linear.weight)`, torchtune/modules/peft/lora.py:93-94 at 0914d5cf, :74-78 at 0.6.1). It
then loads the checkpoint, read on the host (`torch.load(..., map_location="cpu", mmap=True)`,
utils/_checkpointing/_checkpointer_utils.py:70-72 at 0914d5cf), with `model.load_state_dict`
(recipe :267, :451 at 0.6.1): a NF4 weight's `copy_` moves the host tensor to the device and
quantizes it there, one weight at a time (`to_nf4(args[0][1].to(dest_tensor.device))`,
utils/_register_nf4_dispatch_ops.py:32-34 at 0914d5cf; torchao's own `copy_` from 0.2,
`NF4Tensor.from_tensor(copy_in.to(original.device), ...)`, dtypes/nf4tensor.py:452-454 at
0.14.1). The whole bf16 state dict never sits on the device.

Nothing between the load and the first step empties the cache: the single-device recipe never
calls `cleanup_before_training` (only the distributed recipes do, e.g. lora_finetune_distributed
:509 at 0914d5cf), and the peak the recipe logs is reset to what is reserved at that moment
(`torch.cuda.reset_peak_memory_stats`, utils/memory.py:190-191 at 0914d5cf, training/memory.py:
272-273 at 0.6.1). So every reserved peak the run logs is at least what the load made the caching
allocator reserve; the step's own tensors are then cut from those cached blocks.

What one quantization holds on the device, for a Linear of n values in a dtype of e bytes:

- torchao 0.1 (the release torchtune 0.1.0 and 0.1.1 pin, pyproject.toml:24 `torchao==0.1`;
  their README: "tested with the latest stable PyTorch release (2.2.2)"): `quantize_tensor_nearest`
  compares every value with the 16-entry table at once, `diff = (value - nf4).abs()`
  (dtypes/nf4tensor.py:442-445 at v0.1): two (n × 16) tensors in e bytes alive together, beside
  the weight on the device (e·n) and its scaled blocks (`blocks / scales`, :394, e·n). For
  Llama-2-7B's MLP projections (45.1M values, bf16) that is 3.1 GB.
- from torchao 0.2 (pytorch/ao#196, 2024-05-01; torchtune 0.2.0 pins torchao 0.3.1): in chunks
  of 1,048,576 values (`CHUNK_SIZE`, nf4tensor.py:82 at 0.14.1) written into one uint8 index per
  value (:810-819): e·n + e·n + n + 2 × 16·e × 2^20.

With torchao 0.1 the reserved pool ends above the load's allocated peak: the persistent tensors
(NF4 data, scalers, the 16-bit embeddings and head) are cut, best fit, from the blocks earlier
quantizations freed, and a block something persistent was cut from no longer serves the next
comparison, which makes a new segment. Replayed through the caching allocator's rules
(llmmem.verify.allocator) from every allocation of torchtune 0914d5cf's own build and load with
torchao 0.1's code (Llama-2-7B QLoRA, recorded under FakeTensorMode): 9.14 GB reserved when the
load ends, against the 9.13 GB the QLoRA tutorial prints after model init, with three free blocks
of the largest comparison's size and the persistent tensors over the rest; at 4, 8, 16, 24 and
32 layers the pool ends 2.6 to 3.5 such blocks above the persistent tensors. The budget counts
the load's allocated peak and one more comparison block: three in all beside the persistent
tensors, the weight and its scaled blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmem.budget.result import Term
from llmmem.budget.setup import Method, TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes, format_count

NF4_TABLE_VALUES = 16  # the NF4 table every value is compared with
# torchao quantizes in chunks from 0.2 (pytorch/ao#196; dtypes/nf4tensor.py:82 at 0.14.1)
TORCHAO_CHUNK = 1024**2
# the torch releases whose torchtune (0.1.x) pinned torchao 0.1: torch 2.3 came with torchtune
# 0.2.0 and torchao 0.3.1
FIRST_CHUNKED_TORCH = (2, 3)


@dataclass(frozen=True)
class LoadKept:
    """The model's load: its allocated peak, and what the caching allocator keeps reserved from
    it through training."""

    allocated: int
    reserved: Term


def torchao_unchunked(setup: TrainingSetup) -> bool:
    """torchtune 0.1.x's torchao 0.1 (torch 2.2) compares every value of a weight at once."""
    return setup.torch_release < FIRST_CHUNKED_TORCH


def largest_nf4_linear(spec: ModelSpec) -> int:
    """Values of the largest Linear torchtune quantizes (every Linear of the blocks)."""
    return max(
        (
            lin.out_features * lin.in_features
            for group in spec.blocks
            for lin in group.linears
            if lin.role != "expert"
        ),
        default=0,
    )


def quantization_bytes(setup: TrainingSetup, values: int) -> tuple[int, int, str]:
    """(bytes one `to_nf4` of `values` values holds at once on the device, of which the
    comparison block, and how)."""
    e = setup.precision.weight_bytes
    if torchao_unchunked(setup):
        comparison = NF4_TABLE_VALUES * e * values
        held = 2 * e * values + 2 * comparison
        text = (
            f"{format_count(values)} values × ({e} B the weight on the device + {e} B its "
            f"scaled blocks + 2 × {NF4_TABLE_VALUES} × {e} B its comparisons with the NF4 "
            "table, all at once: torchao 0.1)"
        )
        return held, comparison, text
    comparison = NF4_TABLE_VALUES * e * TORCHAO_CHUNK
    held = (2 * e + 1) * values + 2 * comparison
    text = (
        f"{format_count(values)} values × ({e} B the weight on the device + {e} B its scaled "
        f"blocks + 1 B its NF4 indices) + 2 × {NF4_TABLE_VALUES} × {e} B × "
        f"{format_count(TORCHAO_CHUNK)} values (one chunk's comparisons)"
    )
    return held, comparison, text


def nf4_load_kept(spec: ModelSpec, setup: TrainingSetup, weights_bytes: int) -> LoadKept | None:
    """What a QLoRA model's build and load leave reserved, for `weights_bytes` of persistent
    weights; None where torchtune quantizes nothing."""
    if setup.method is not Method.QLORA or setup.quant is None:
        return None
    values = largest_nf4_linear(spec)
    if not values:
        return None
    held, comparison, text = quantization_bytes(setup, values)
    allocated = weights_bytes + held
    carved = comparison if torchao_unchunked(setup) else 0
    formula = (
        f"the model's load: {format_bytes(weights_bytes)} of weights + the largest NF4 "
        f"Linear's quantization, {text}"
    )
    if carved:
        formula += (
            f" + one more comparison block ({format_bytes(carved)}) left unused where the "
            "persistent tensors were cut from the earlier quantizations' blocks"
        )
    return LoadKept(allocated, Term(bytes=allocated + carved, formula=formula))


__all__ = ["LoadKept", "largest_nf4_linear", "nf4_load_kept", "torchao_unchunked"]

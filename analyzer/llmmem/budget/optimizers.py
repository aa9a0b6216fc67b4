"""Optimizers by HF Trainer `optim` name or class: their states and the buffers their step needs.

State sizes follow how each implementation allocates: torch's AdamW creates `zeros_like(param)`
(states in the parameter's dtype), bitsandbytes 32-bit optimizers keep fp32 states whatever the
parameter dtype, its 8-bit optimizers keep one byte per state plus an fp32 absmax per 256-value
block, and leave tensors under 4,096 values in 32-bit.

bitsandbytes' paged optimizers (`PagedAdamW`, `PagedAdamW8bit`, ...; HF `paged_adamw_8bit`,
`paged_adamw_32bit`) put a parameter's states in CUDA unified memory, not in torch's caching
allocator (bitsandbytes 0.50.2, optim/optimizer.py:374-390 `get_state_buffer`: on a CUDA device,
for a parameter of 1e5 values or more, `F.get_paged`, functional.py:91-99, which takes the
memory from `cget_managed_ptr` — cudaMallocManaged in its C library — and wraps it with
`torch.frombuffer` as a host tensor marked `is_paged`). Smaller parameters' states, and the
8-bit states' absmax (`torch.zeros((blocks,), ...)`, optim/optimizer.py:528-529) stay in torch's
allocator. Before each parameter's update `prefetch_state` (optim/optimizer.py:392-400) asks the
driver to move its pages to the GPU (`prefetch_tensor` → `cprefetch`, functional.py:102-109,
cudaMemPrefetchAsync); the driver keeps them there while the GPU has room and moves them back
to the host when device allocations need it. So `torch.cuda.max_memory_allocated` and
`max_memory_reserved` never count them; the pages resident on the GPU take device memory beside
the caching allocator's pool.

DeepSpeed builds its own optimizer where its config has an `optimizer` section (DeepSpeed 0.19.8,
runtime/engine.py `_configure_basic_optimizer` :2476-2493 and `get_optimizer_configuration`
:2377-2409): Adam and AdamW are `FusedAdam` on a GPU (`DeepSpeedCPUAdam` with the optimizer
offloaded: fp32 moments, `fp32_optimizer_states` True by default, ops/adam/cpu_adam.py:158-164,
updated in place by its C++ kernel on the host; torch's with `torch_adam: true`), Lion
`FusedLion` (`DeepSpeedCPULion` offloaded). `FusedAdam` keeps its two moments
as `zeros_like` of the (fp32 master) parameter and updates parameter and moments in place with
one `multi_tensor_apply` launch over every tensor of a group (ops/adam/fused_adam.py:129-193):
no temporaries, unlike torch's foreach AdamW, whose `_foreach_sqrt` makes a parameter-sized
list. Without an `optimizer` section the HF trainer hands DeepSpeed its own torch optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmmem.budget.setup import SetupError
from llmmem.budget.weights import ParameterGroup

StateDtype = Literal["param", "fp32", "int8"]
Implementation = Literal["fused", "foreach", "for-loop", "bnb"]

BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes keeps smaller tensors' states in 32 bits
BNB_8BIT_BLOCK = 256
# bitsandbytes pages the states of parameters of this many values or more (optim/optimizer.py:383
# `p.numel() < 1e5`: smaller ones get `torch.zeros_like` on the device)
BNB_PAGED_MIN_NUMEL = 100_000


@dataclass(frozen=True)
class OptimizerSpec:
    name: str  # canonical HF `optim` name
    label: str  # what it is, for the report
    states: int  # state tensors per parameter (Adam: exp_avg, exp_avg_sq)
    state_dtype: StateDtype
    implementation: Implementation
    factored: bool = False  # Adafactor: row and column statistics for matrices
    paged: bool = False  # states in CUDA unified memory, evicted to CPU under pressure

    def state_bytes(self, group: ParameterGroup) -> float:
        """Bytes of optimizer state for one trainable parameter group."""
        if self.states == 0:
            return 0.0
        per_value = _state_value_bytes(self.state_dtype, group.bytes_per_param, group.numel)
        if self.factored and group.cols > 1:
            # Adafactor keeps a row vector and a column vector of second moments per matrix
            return group.tensors * (group.rows + group.cols) * per_value * self.states
        return group.params * per_value * self.states

    def unified_bytes(self, group: ParameterGroup) -> float:
        """Of `state_bytes(group)`, what a paged optimizer holds in CUDA unified memory: the
        state tensors themselves of parameters of BNB_PAGED_MIN_NUMEL values or more (an 8-bit
        state's absmax stays in torch's allocator)."""
        if not self.paged or self.states == 0 or group.numel < BNB_PAGED_MIN_NUMEL:
            return 0.0
        if self.state_dtype == "int8" and group.numel >= BNB_MIN_8BIT_SIZE:
            per_value = 1.0
        else:
            per_value = _state_value_bytes(self.state_dtype, group.bytes_per_param, group.numel)
        return group.params * per_value * self.states

    def step_temporary_bytes(self, trainable: list[ParameterGroup]) -> int:
        """Extra memory the step itself allocates, on top of weights, gradients and states."""
        if not trainable:
            return 0
        if self.implementation == "foreach":
            # torch._foreach_sqrt(exp_avg_sqs) materialises one parameter-sized list for the step
            return round(sum(g.params * _param_bytes(g) for g in trainable))
        if self.implementation == "for-loop":
            # each parameter in turn: a denominator and an update of its size
            largest = max(round(g.numel * _param_bytes(g)) for g in trainable)
            return 2 * largest
        if self.factored:
            largest = max(round(g.numel * _param_bytes(g)) for g in trainable)
            return 2 * largest
        return 0


def _param_bytes(group: ParameterGroup) -> float:
    return group.bytes_per_param


def _state_value_bytes(dtype: StateDtype, param_bytes: float, numel: int) -> float:
    if dtype == "param":
        return param_bytes
    if dtype == "fp32":
        return 4.0
    if numel < BNB_MIN_8BIT_SIZE:
        return 4.0
    return 1.0 + 4.0 / BNB_8BIT_BLOCK


def _spec(
    name: str,
    label: str,
    states: int,
    dtype: StateDtype,
    impl: Implementation,
    **extra: bool,
) -> OptimizerSpec:
    return OptimizerSpec(
        name=name, label=label, states=states, state_dtype=dtype, implementation=impl, **extra
    )


OPTIMIZERS: dict[str, OptimizerSpec] = {
    spec.name: spec
    for spec in [
        _spec("adamw_torch_fused", "torch AdamW, fused kernel", 2, "param", "fused"),
        _spec("adamw_torch", "torch AdamW, foreach implementation", 2, "param", "foreach"),
        _spec("adamw_torch_foreach", "torch AdamW, foreach implementation", 2, "param", "foreach"),
        _spec("adamw_hf", "transformers AdamW, per-parameter loop", 2, "param", "for-loop"),
        _spec("adamw_torch_xla", "torch AdamW on XLA", 2, "param", "foreach"),
        _spec("adamw_apex_fused", "apex FusedAdam", 2, "fp32", "fused"),
        _spec(
            "deepspeed_fused_adam",
            "DeepSpeed FusedAdam (one multi_tensor_apply kernel, in place)",
            2,
            "param",
            "fused",
        ),
        _spec(
            "deepspeed_fused_lion",
            "DeepSpeed FusedLion (one multi_tensor_apply kernel, in place)",
            1,
            "param",
            "fused",
        ),
        _spec(
            "deepspeed_cpu_adam",
            "DeepSpeed CPUAdam (states on the host, stepped in place)",
            2,
            "fp32",
            "fused",
        ),
        _spec(
            "deepspeed_cpu_lion",
            "DeepSpeed CPULion (states on the host, stepped in place)",
            1,
            "fp32",
            "fused",
        ),
        _spec("adamw_anyprecision", "AnyPrecision AdamW", 2, "param", "for-loop"),
        _spec("adam", "torch Adam, foreach implementation", 2, "param", "foreach"),
        _spec(
            "adafactor",
            "transformers Adafactor (factored second moment)",
            1,
            "param",
            "for-loop",
            factored=True,
        ),
        _spec("sgd", "torch SGD (no momentum)", 0, "param", "foreach"),
        _spec("sgd_momentum", "torch SGD with momentum", 1, "param", "foreach"),
        _spec("adagrad", "torch Adagrad", 1, "param", "foreach"),
        _spec("rmsprop", "torch RMSprop", 1, "param", "foreach"),
        _spec("adamw_bnb_8bit", "bitsandbytes AdamW 8-bit", 2, "int8", "bnb"),
        _spec("adamw_8bit", "bitsandbytes AdamW 8-bit", 2, "int8", "bnb"),
        _spec("paged_adamw_8bit", "bitsandbytes paged AdamW 8-bit", 2, "int8", "bnb", paged=True),
        _spec("paged_adamw_32bit", "bitsandbytes paged AdamW 32-bit", 2, "fp32", "bnb", paged=True),
        _spec("adamw_bnb_32bit", "bitsandbytes AdamW 32-bit", 2, "fp32", "bnb"),
        _spec("lion_8bit", "bitsandbytes Lion 8-bit", 1, "int8", "bnb"),
        _spec("lion_32bit", "bitsandbytes Lion 32-bit", 1, "fp32", "bnb"),
        _spec("paged_lion_8bit", "bitsandbytes paged Lion 8-bit", 1, "int8", "bnb", paged=True),
        _spec("paged_lion_32bit", "bitsandbytes paged Lion 32-bit", 1, "fp32", "bnb", paged=True),
        _spec("rmsprop_bnb", "bitsandbytes RMSprop", 1, "fp32", "bnb"),
        _spec("rmsprop_bnb_8bit", "bitsandbytes RMSprop 8-bit", 1, "int8", "bnb"),
        _spec("rmsprop_bnb_32bit", "bitsandbytes RMSprop 32-bit", 1, "fp32", "bnb"),
        _spec("ademamix", "bitsandbytes AdEMAMix (two first moments)", 3, "fp32", "bnb"),
        _spec("ademamix_8bit", "bitsandbytes AdEMAMix 8-bit", 3, "int8", "bnb"),
        _spec(
            "paged_ademamix_8bit", "bitsandbytes paged AdEMAMix 8-bit", 3, "int8", "bnb", paged=True
        ),
        _spec(
            "paged_ademamix_32bit",
            "bitsandbytes paged AdEMAMix 32-bit",
            3,
            "fp32",
            "bnb",
            paged=True,
        ),
        _spec("schedule_free_adamw", "schedule-free AdamW", 2, "param", "for-loop"),
        _spec("adamw_torch_4bit", "torchao AdamW 4-bit", 2, "int8", "fused"),
        _spec("adamw_torch_8bit", "torchao AdamW 8-bit", 2, "int8", "fused"),
    ]
}

# torch and bitsandbytes class names, and common spellings, onto the table above
ALIASES: dict[str, str] = {
    "adamw": "adamw_torch",
    "torch.optim.adamw": "adamw_torch",
    "torch.optim.adam": "adam",
    "adamw_fused": "adamw_torch_fused",
    "fused_adamw": "adamw_torch_fused",
    "adamw_foreach": "adamw_torch_foreach",
    "torch.optim.sgd": "sgd",
    "torch.optim.adagrad": "adagrad",
    "torch.optim.rmsprop": "rmsprop",
    "bnb.optim.adamw8bit": "adamw_bnb_8bit",
    "bitsandbytes.optim.adamw8bit": "adamw_bnb_8bit",
    "adamw8bit": "adamw_bnb_8bit",
    "adam8bit": "adamw_bnb_8bit",
    "bnb.optim.pagedadamw8bit": "paged_adamw_8bit",
    "pagedadamw8bit": "paged_adamw_8bit",
    "bnb.optim.pagedadamw": "paged_adamw_32bit",
    "pagedadamw": "paged_adamw_32bit",
    "pagedadamw32bit": "paged_adamw_32bit",
    "bnb.optim.pagedadamw32bit": "paged_adamw_32bit",
    "bnb.optim.adamw": "adamw_bnb_32bit",
    "bnb.optim.adamw32bit": "adamw_bnb_32bit",
    "bnb.optim.lion8bit": "lion_8bit",
    "lion8bit": "lion_8bit",
    "lion": "lion_32bit",
    "bnb.optim.lion": "lion_32bit",
    "bnb.optim.pagedlion8bit": "paged_lion_8bit",
    "adafactor": "adafactor",
    "transformers.optimization.adafactor": "adafactor",
    "transformers.adafactor": "adafactor",
    "galore_adamw": "adamw_torch",
    # DeepSpeed's config `"optimizer": {"type": "AdamW"}` on a GPU, and its class names
    "deepspeed_adamw": "deepspeed_fused_adam",
    "deepspeed_adam": "deepspeed_fused_adam",
    "deepspeed.ops.adam.fusedadam": "deepspeed_fused_adam",
    "deepspeed_lion": "deepspeed_fused_lion",
    "deepspeed.ops.lion.fusedlion": "deepspeed_fused_lion",
    "deepspeed.ops.adam.deepspeedcpuadam": "deepspeed_cpu_adam",
    "deepspeedcpuadam": "deepspeed_cpu_adam",
    "deepspeed.ops.lion.deepspeedcpulion": "deepspeed_cpu_lion",
}


def find_optimizer(name: str) -> OptimizerSpec:
    """An optimizer by HF `optim` string, torch/bitsandbytes class name or dotted path."""
    key = name.strip().lower().replace("-", "_")
    if key in OPTIMIZERS:
        return OPTIMIZERS[key]
    squashed = key.replace("_", "")
    for candidate in (key, squashed, f"torch.optim.{squashed}", f"bnb.optim.{squashed}"):
        if candidate in ALIASES:
            return OPTIMIZERS[ALIASES[candidate]]
    import difflib

    known = sorted(OPTIMIZERS)
    close = difflib.get_close_matches(key, known + sorted(ALIASES), n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise SetupError(f"unknown optimizer '{name}'{hint} (known: {', '.join(known[:8])}, ...)")

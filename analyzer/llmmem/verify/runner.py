"""Run one training step of a StepRequest and measure it: on CUDA, on the CPU, or simulated.

The model is built from its config with transformers (random weights: the memory is the same as
with the real ones), then exactly what the setup says is applied: dtype, gradient checkpointing,
attention implementation, PEFT LoRA/DoRA, bitsandbytes k-bit loading with peft's
`prepare_model_for_kbit_training`, the optimizer by HF `optim` name with its torch or bitsandbytes
implementation. A synthetic batch of the planned shape runs a warm-up step (which creates the
optimizer states) and a measured step: forward, backward, optimizer step, each phase's peak kept.

Multi-rank plans run here once per rank (under torchrun): DDP and FSDP2 wrap the model and keep
the plain loop; a DeepSpeed ZeRO plan runs `deepspeed.initialize` with the plan's
zero_optimization section and the engine's forward/backward/step (its CPU accelerator over gloo
without a GPU).

Simulated ("fake"): the same step under FakeTensorMode on the fake CPU device, counted by
`StorageTracker`; no memory is allocated and no weights are needed. What it cannot see: the CUDA
context, the caching allocator's rounding and fragmentation, cuBLAS workspaces, and
bitsandbytes kernels (k-bit models and 8-bit optimizers are refused with a message). The report
adds the core's estimate of those on top, labelled as estimated.

A k-bit plan or an 8-bit optimizer runs for real instead: on a GPU, or on the CPU with
bitsandbytes' CPU kernels (small models), counted by `StorageTracker` like any CPU step.

torch, transformers, peft and bitsandbytes are imported here only; nothing else in llmmem imports
them.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from llmmem.budget.overheads import CUBLAS_WORKSPACE
from llmmem.verify.request import (
    ACTIVATIONS,
    GRADIENTS,
    OPTIMIZER_STATES,
    OTHER,
    TEMPORARIES,
    WEIGHTS,
    PhaseMeasurement,
    StepMeasurement,
    StepRequest,
)


class VerifyError(Exception):
    """A step that cannot be built or run as asked; the message is one actionable line."""


DTYPES = {"bf16-true": "bfloat16", "fp16-true": "float16", "bf16-autocast": "bfloat16"}
AUTOCAST = {"bf16": "bfloat16", "fp16": "float16", "bf16-autocast": "bfloat16"}
ADAMW_IMPLEMENTATION = {
    "adamw_torch": {"foreach": True},
    "adamw_torch_foreach": {"foreach": True},
    "adam": {"foreach": True},
    "adamw_torch_fused": {"fused": True},
    "adamw_hf": {"foreach": False},
}


def _imports() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as err:
        raise VerifyError(
            f"verify needs torch and transformers ({err.name} is missing): "
            "pip install 'llmmem[verify]'"
        ) from None
    return torch, transformers


def _model_class(transformers: Any, request: StepRequest) -> Any:
    cls = getattr(transformers, request.architecture, None)
    if cls is None:
        raise VerifyError(
            f"this transformers ({transformers.__version__}) has no {request.architecture}; "
            "upgrade transformers"
        )
    return cls


# dropout on attention probabilities, which SDPA applies inside its kernel
ATTENTION_DROPOUT_KEYS = (
    "attn_pdrop",
    "attention_dropout",
    "attention_probs_dropout_prob",
    "attention_dropout_prob",
)


def _hf_config(transformers: Any, request: StepRequest, notes: list[str] | None = None) -> Any:
    data = dict(request.config)
    if request.device != "cuda" and request.attn == "sdpa":
        # CUDA's SDPA kernels regenerate the dropout mask in backward and keep nothing for
        # it; the CPU's SDPA with dropout falls back to a path that keeps the whole b·a·s²
        # matrix. To measure what a GPU would hold, the CPU step runs SDPA without it.
        dropped = [
            k for k in ATTENTION_DROPOUT_KEYS if isinstance(data.get(k), (int, float)) and data[k]
        ]
        for key in dropped:
            data[key] = 0.0
        if dropped and notes is not None:
            notes.append(
                "attention dropout set to 0 for the CPU step: GPU SDPA kernels keep no mask for it"
            )
    model_type = data.pop("model_type", None)
    if not model_type:
        raise VerifyError("the model's config has no model_type")
    if data.get("auto_map") and not request.trust_remote_code:
        raise VerifyError(
            f"{request.model_id} ships its own model code (auto_map); llmmem runs it only with "
            "--trust-remote-code"
        )
    try:
        config = transformers.AutoConfig.for_model(model_type, **data)
    except ValueError as err:
        raise VerifyError(f"transformers cannot build a {model_type!r} config: {err}") from None
    config.use_cache = request.use_cache
    return config


def _attn(request: StepRequest, device: str, notes: list[str]) -> str:
    if request.attn == "flash_attention_2" and device != "cuda":
        notes.append("flash_attention_2 needs CUDA: the step ran with sdpa (same saved tensors)")
        return "sdpa"
    return request.attn


@contextlib.contextmanager
def _unpacked_masks(transformers: Any) -> Iterator[None]:
    """transformers treats fake tensors as tracing and builds a (b, 1, s, s) mask a real run
    skips; with unpadded, unpacked batches there is nothing to detect, so say so."""
    masking: Any = getattr(transformers, "masking_utils", None)
    if masking is None:
        import importlib

        masking = importlib.import_module("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


def build_model(request: StepRequest, device: str, notes: list[str]) -> Any:
    """The model as the plan trains it, on `device` ("meta" for a simulated step)."""
    torch, transformers = _imports()
    config = _hf_config(transformers, request, notes)
    cls = _model_class(transformers, request)
    dtype = getattr(torch, DTYPES.get(request.precision, "float32"))
    torch.manual_seed(request.seed)
    with torch.device(device):
        try:
            model = cls._from_config(
                config, dtype=dtype, attn_implementation=_attn(request, device, notes)
            )
        except (ValueError, TypeError) as err:
            raise VerifyError(f"transformers could not build {request.model_id}: {err}") from None
    model.train()
    if request.grad_ckpt:
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)()
        if request.lora is not None:
            model.enable_input_require_grads()
    if request.lora is not None:
        model = _apply_lora(model, request)
    return model


def _apply_lora(model: Any, request: StepRequest) -> Any:
    try:
        import peft
    except ImportError:
        raise VerifyError("LoRA plans need peft: pip install 'llmmem[verify]'") from None
    lora = request.lora or {}
    targets = lora.get("targets")
    if targets == ["all-linear"]:
        targets = "all-linear"
    config = peft.LoraConfig(
        r=int(lora.get("r", 16)),
        lora_alpha=_number(lora.get("alpha", 32)),
        target_modules=targets,
        modules_to_save=lora.get("modules_to_save") or None,
        use_dora=bool(lora.get("dora", False)),
        lora_dropout=float(lora.get("dropout", 0.0)),
    )
    try:
        model = peft.get_peft_model(model, config)
    except ValueError as err:
        raise VerifyError(f"peft could not add the adapters: {err}") from None
    if int(lora.get("adapter_bytes", 4)) == 2:
        # 16-bit adapters (TRL from 0.26 casts a k-bit model's trainable parameters to bf16)
        import torch

        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.bfloat16)
    return model


def _number(value: Any) -> Any:
    """An int where the value is whole (peft types lora_alpha as int), else the float."""
    number = float(value)
    return int(number) if number.is_integer() else number


def make_optimizer(torch: Any, request: StepRequest, params: list[Any]) -> Any:
    name = request.optim
    if name in BITSANDBYTES_OPTIMIZERS:
        import bitsandbytes as bnb

        return getattr(bnb.optim, BITSANDBYTES_OPTIMIZERS[name])(params, lr=1e-5)
    if name in ADAMW_IMPLEMENTATION:
        return torch.optim.AdamW(params, lr=1e-5, **ADAMW_IMPLEMENTATION[name])
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if name == "sgd_momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-3, relative_step=False, scale_parameter=False)
    raise VerifyError(f"verify does not build optim={name} yet; use adamw_torch to compare")


def _fake_parameters(torch: Any, model: Any, mode: Any) -> None:
    """Replace each meta parameter and buffer by a fake CPU tensor of the same shape, dtype and
    requires_grad (tied weights stay tied)."""
    made: dict[int, Any] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in made:
                with mode:
                    data = torch.empty_strided(
                        param.shape, param.stride(), dtype=param.dtype, device="cpu"
                    )
                made[id(param)] = torch.nn.Parameter(data, requires_grad=param.requires_grad)
            module._parameters[name] = made[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is None:
                continue
            if id(buffer) not in made:
                with mode:
                    made[id(buffer)] = torch.zeros(buffer.shape, dtype=buffer.dtype, device="cpu")
            module._buffers[name] = made[id(buffer)]


def _batch(torch: Any, request: StepRequest, device: str, vocab: int) -> dict[str, Any]:
    shape = (request.batch, request.seq)
    if request.packing == "flat":
        shape = (1, request.batch * request.seq)
    ids = torch.randint(3, max(vocab, 4), shape, device=device)
    batch = {"input_ids": ids, "labels": ids.clone()}
    if request.packing is not None:
        # the samples' own positions: `batch` samples of `seq` tokens in one flat row (two
        # halves of one where the batch is one sample, which packs nothing), or two samples in
        # each row
        flat_samples = request.packing == "flat" and request.batch > 1
        length = request.seq if flat_samples else max(request.seq // 2, 1)
        positions = torch.arange(shape[1], device=device) % length
        batch["position_ids"] = positions.unsqueeze(0).expand(shape[0], -1).contiguous()
    if request.architecture.endswith("ForConditionalGeneration") or "T5" in request.architecture:
        batch["decoder_input_ids"] = ids.clone()
    return batch


def run_step(request: StepRequest) -> StepMeasurement:
    """Build, warm up, measure. Never raises: what stops the step is in `error` / `oom`."""
    started = time.monotonic()
    device = request.device
    result = StepMeasurement(device=device, device_name=device, stage="build")
    meters: list[_Meter] = []
    try:
        if request.objective == "grpo":
            from llmmem.verify.grpo_step import run_grpo_step

            run_grpo_step(request, result)
        elif request.objective is not None:
            from llmmem.verify.preference_step import run_preference_step

            run_preference_step(request, result)
        else:
            _run(request, result, meters)
    except VerifyError as err:
        result.error = str(err)
    except MemoryError:
        result.error = "the machine ran out of memory (RAM) while building or running the step"
    except Exception as err:  # the step is a result: report, do not crash
        message = str(err).splitlines()[0] if str(err) else ""
        if _is_oom(err):
            # the running phase's peak so far: what was allocated when the allocation failed
            so_far = meters[0].so_far() if meters else 0
            result.oom = {
                "phase": result.stage,
                "allocated_bytes": max(so_far, result.allocated_peak_bytes),
                "message": message,
            }
        else:
            result.error = f"{type(err).__name__}: {message}"
    finally:
        if device == "fake" and request.world_size > 1:
            _leave_simulated_group()
    result.seconds = round(time.monotonic() - started, 3)
    return result


# CUDA's caching allocator says "CUDA out of memory"; the CPU allocator "can't allocate memory"
OOM_MESSAGES = ("out of memory", "can't allocate memory", "not enough memory")


def _is_oom(err: Exception) -> bool:
    text = str(err).lower()
    return any(message in text for message in OOM_MESSAGES)


def _leave_simulated_group() -> None:
    """A simulated rank's fake process group ends with its step (the next may be another size)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "fake":
        dist.destroy_process_group()


def _vocab(request: StepRequest) -> int:
    text = request.config.get("text_config")
    value = request.config.get("vocab_size") or (text or {}).get("vocab_size") or 32000
    return int(value)


def _run(request: StepRequest, result: StepMeasurement, meters: list[_Meter]) -> None:
    torch, transformers = _imports()
    device = request.device
    notes = result.notes
    if device == "fake" and (request.quant is not None or runs_bitsandbytes(request.optim)):
        what = "k-bit layers" if request.quant is not None else f"optim={request.optim}"
        raise VerifyError(
            f"bitsandbytes kernels ({what}) do not run on fake tensors, so this plan cannot be "
            "simulated: verify it with --device cpu (a small model) or on a GPU"
        )
    if device == "fake" and request.world_size > 1 and request.sharding == "ddp":
        raise VerifyError(
            "a DDP plan cannot be simulated (DDP's reducer needs real tensors): use --device "
            "cpu for a small model, or cuda"
        )
    if device == "fake" and request.sharding == "zero":
        raise VerifyError(
            "a DeepSpeed ZeRO plan cannot be simulated (DeepSpeed does not run on fake "
            "tensors): use --device cpu for a small model, or cuda"
        )
    if request.compile and device != "cuda":
        raise VerifyError(
            "a torch.compile plan is measured on a GPU only (--device cuda): the CPU's and the "
            "simulator's storage trackers do not run under the compiler, and the estimate "
            "already gives its band (down to the checkpointed step)"
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise VerifyError(
            "no CUDA device here: run `llmmem verify FILE --simulate` for a simulated step, or "
            "`--device cpu` for a small model"
        )
    if request.quant is not None or runs_bitsandbytes(request.optim):
        _bitsandbytes(torch, device)
        int8 = (request.quant or {}).get("quant_type") == "int8"
        if device == "cpu" and int8 and request.precision in AUTOCAST:
            raise VerifyError(
                "LLM.int8 under autocast takes another path on the CPU than on a GPU (the CPU "
                "dequantizes and autocast multiplies in 16 bits; a GPU's int8 matmul returns "
                "fp32): verify this plan on a GPU, or on the CPU without mixed precision"
            )
        if device == "cpu" and request.optim.startswith("paged_"):
            notes.append(
                f"{request.optim} on the CPU keeps its states as ordinary tensors; on a GPU "
                "they live in CUDA managed memory, the same bytes"
            )
    offloads = {"offload_optimizer", "offload_param"} & set(request.zero or {})
    if request.sharding == "zero" and offloads and device != "cuda":
        raise VerifyError(
            "a DeepSpeed offload plan moves memory from the GPU to the host: on the CPU both are "
            "the same memory, so verify it on GPUs (--device cuda)"
        )
    mesh = None
    if request.launched:
        _join_ranks(torch, request, result)
    elif device == "fake" and request.world_size > 1:
        mesh = _simulated_rank(request, result)
    deepspeed_config = _deepspeed_config(request) if request.sharding == "zero" else None

    meter: _Meter
    fake_mode: Any = contextlib.nullcontext()
    if device == "cuda":
        meter = _CudaMeter(torch, request, result)
        meters.append(meter)
        model = _build(request, "cuda", notes, torch, transformers)
    else:
        from llmmem.verify.tracker import StorageTracker

        # FSDP2 and ZeRO-3 free gathered parameters by resizing or swapping storages
        tracker = StorageTracker(resizable=request.world_size > 1)
        if request.world_size == 1 and request.sharding != "zero":
            # one process, storages that are born and die whole: the order is replayable
            tracker.events = []
        meter = _TrackedMeter(tracker, result)
        meters.append(meter)
        if device == "fake":
            from torch._subclasses.fake_tensor import FakeTensorMode

            fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
            model = build_model(request, "meta", notes)
            _fake_parameters(torch, model, fake_mode)
            result.device_name = "simulated (FakeTensorMode, cpu)"
        else:
            model = _build(request, "cpu", notes, torch, transformers)
            result.device_name = "cpu"
    if request.world_size > 1 or request.launched:
        result.device_name = f"{result.device_name} rank {result.rank} of {request.world_size}"
    masks: Any = _unpacked_masks(transformers)
    if request.packing is not None and request.attn != "flash_attention_2":
        masks = contextlib.nullcontext()  # the packed samples' mask is what is measured
    elif request.packing is not None:
        notes.append(
            "packed samples under flash_attention_2: the kernel takes their boundaries, no "
            "mask; the step ran without one"
        )
    with fake_mode, meter, masks:
        loop = _make_loop(torch, model, request, deepspeed_config, mesh)
        meter.file(loop.weights(), WEIGHTS)
        meter.file(list(loop.model.buffers()), OTHER)
        if loop.autograd_gradients:
            meter.watch_gradients(loop.trainable)
        if request.compile:
            loop.model = torch.compile(loop.model)
            notes.append(
                "torch.compile (default mode): the warm-up step compiles, the next one is measured"
            )
        _drive(torch, loop, meter, request, result)
    result.allocated_peak_bytes = max(p.peak_bytes for p in result.phases)
    meter.finish()
    result.stage = "done"


def _build(
    request: StepRequest, device: str, notes: list[str], torch: Any, transformers: Any
) -> Any:
    """The model on `device`. Under ZeRO-3, `deepspeed.initialize` partitions it (transformers
    would load it inside `deepspeed.zero.Init`: the step's memory is the same either way)."""
    if request.quant is not None:
        return _kbit_model(request, device, notes, torch, transformers)
    return build_model(request, device, notes)


def _join_ranks(torch: Any, request: StepRequest, result: StepMeasurement) -> None:
    """This process is one rank under torchrun: join the group (gloo on the CPU, NCCL on CUDA)."""
    import os

    import torch.distributed as dist

    if request.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if request.device == "cuda" else "gloo")
    result.rank = dist.get_rank()


def _simulated_rank(request: StepRequest, result: StepMeasurement) -> Any:
    """A simulated multi-rank step is rank 0 alone in a fake process group of the plan's size:
    collectives move nothing, every tensor has the shape it has on a real rank. The device
    mesh is made before fake mode (it holds real rank tensors)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:
        raise VerifyError(
            "this torch has no fake process group: verify a multi-GPU plan with --device cpu "
            "(small models) or cuda"
        ) from None
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=request.world_size)
    result.rank = 0
    result.notes.append(
        f"rank 0 of {request.world_size} simulated alone: collectives move no data, every "
        "tensor has a real rank's shape (rank 0 holds the largest shards)"
    )
    return init_device_mesh("cpu", (request.world_size,))


# -- the ways a training loop drives the model ----------------------------------------------


class _Loop:
    """Plain torch: forward under the plan's autocast, `loss.backward()`, `optimizer.step()`.
    DDP and FSDP2 wrap the model and keep this loop."""

    autograd_gradients = True  # the gradients are the parameters' .grad

    def __init__(self, torch: Any, model: Any, optimizer: Any, request: StepRequest) -> None:
        self.torch = torch
        self.model = model
        self.optimizer = optimizer
        self.request = request
        self.trainable = [p for p in model.parameters() if p.requires_grad]

    def forward(self, batch: dict[str, Any]) -> Any:
        device = "cuda" if self.request.device == "cuda" else "cpu"
        with _autocast(self.torch, self.request, device):
            return self.model(**batch).loss

    def backward(self, loss: Any) -> None:
        loss.backward()

    def between_micro_batches(self) -> None:
        pass

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def weights(self) -> list[Any]:
        params = list(self.model.parameters())
        return params + _quant_constants(params)

    def gradients(self) -> list[Any] | None:
        """The gradients as the user sees them, or None where the loop keeps its own."""
        return [p.grad for p in self.trainable if p.grad is not None]

    def states(self) -> list[Any]:
        return [
            value
            for state in self.optimizer.state.values()
            for value in state.values()
            if isinstance(value, self.torch.Tensor)
        ]


class _InBackwardLoop(_Loop):
    """The optimizer in backward, as torchtune runs it: one optimizer per trainable parameter,
    stepped (and its gradient set to None) in the parameter's post-accumulate-grad hook."""

    autograd_gradients = False  # each lives only inside its parameter's hook

    def __init__(self, torch: Any, model: Any, request: StepRequest) -> None:
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.per_parameter = {p: make_optimizer(torch, request, [p]) for p in trainable}

        def step_and_free(param: Any) -> None:
            self.per_parameter[param].step()
            self.per_parameter[param].zero_grad(set_to_none=True)

        for p in trainable:
            p.register_post_accumulate_grad_hook(step_and_free)
        super().__init__(torch, model, None, request)

    def step(self) -> None:
        pass  # every parameter was stepped in backward

    def zero_grad(self) -> None:
        pass  # and its gradient freed there

    def gradients(self) -> list[Any] | None:
        return [p.grad for p in self.trainable if p.grad is not None]

    def states(self) -> list[Any]:
        return [
            value
            for optimizer in self.per_parameter.values()
            for state in optimizer.state.values()
            for value in state.values()
            if isinstance(value, self.torch.Tensor)
        ]


def _quant_constants(params: list[Any]) -> list[Any]:
    """What bitsandbytes keeps beside a k-bit weight, outside the parameter: a 4-bit weight's
    absmax per block and its code (double-quantized: the absmax in 8 bits with an absmax of
    its own), LLM.int8's scale per row."""
    import torch

    found: list[Any] = []
    for param in params:
        state = getattr(param, "quant_state", None)
        for holder in (state, getattr(state, "state2", None)):
            if holder is not None:
                found += [getattr(holder, name, None) for name in ("absmax", "code", "offset")]
        found.append(getattr(param, "SCB", None))
    return [t for t in found if isinstance(t, torch.Tensor)]


class _DeepSpeedLoop(_Loop):
    """DeepSpeed's engine: it casts the model to the 16-bit dtype (no autocast), keeps gradient
    partitions and the fp32 master weights itself, and steps at the accumulation boundary."""

    autograd_gradients = False

    def __init__(self, torch: Any, engine: Any, request: StepRequest) -> None:
        super().__init__(torch, engine.module, engine.optimizer, request)
        self.engine = engine

    def forward(self, batch: dict[str, Any]) -> Any:
        return self.engine(**batch).loss

    def backward(self, loss: Any) -> None:
        self.engine.backward(loss)

    def between_micro_batches(self) -> None:
        self.engine.step()  # not at the boundary: DeepSpeed only counts the micro-batch

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self) -> None:
        pass  # the engine's step zeroes its gradient partitions

    def weights(self) -> list[Any]:
        # ZeRO-3 keeps each rank's part of a parameter in `ds_tensor`, and the parameters it
        # keeps whole on every rank (`ds_persist`) also whole, once they are first gathered
        params = list(self.model.parameters())
        persistent = [p for p in params if getattr(p, "ds_persist", False) and p.numel()]
        return [getattr(p, "ds_tensor", p) for p in params] + persistent

    def gradients(self) -> list[Any] | None:
        # ZeRO-3 keeps one flat gradient partition; ZeRO-1/2 build theirs in backward
        flat = getattr(self.optimizer, "grad_partitions_flat_buffer", None)
        return [flat] if flat is not None else None

    def states(self) -> list[Any]:
        zero = self.optimizer
        masters = list(getattr(zero, "single_partition_of_fp32_groups", None) or [])
        masters += list(getattr(zero, "fp32_partitioned_groups_flat", None) or [])
        inner = getattr(zero, "optimizer", zero)
        states = [
            value
            for state in inner.state.values()
            for value in state.values()
            if isinstance(value, self.torch.Tensor)
        ]
        return masters + states


def _make_loop(
    torch: Any,
    model: Any,
    request: StepRequest,
    deepspeed_config: dict[str, Any] | None,
    mesh: Any = None,
) -> _Loop:
    if deepspeed_config is None and request.world_size > 1:
        model = _distribute(model, request, mesh)  # the optimizer then steps the shards
    if request.optimizer_in_backward and deepspeed_config is None and request.world_size == 1:
        return _InBackwardLoop(torch, model, request)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(torch, request, trainable)
    if deepspeed_config is not None:
        deepspeed = _deepspeed(request)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=deepspeed_config)
        return _DeepSpeedLoop(torch, engine, request)
    return _Loop(torch, model, optimizer, request)


def _distribute(model: Any, request: StepRequest, mesh: Any = None) -> Any:
    """This rank's part of a DDP or FSDP plan: DDP keeps a whole copy per rank; FSDP2 shards
    each transformer block and the rest.

    As the HF trainer runs FSDP (through accelerate): under bf16/fp16 mixed precision the
    parameters are gathered in that dtype (MixedPrecisionPolicy). A GPU overlaps the next
    block's all-gather with the current block's compute, so two blocks are gathered at once;
    a CPU or simulated step runs one op at a time, so that prefetch is asked for explicitly
    (the block after in forward, the block before in backward)."""
    import torch

    if request.sharding == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    autocast = AUTOCAST.get(request.precision)
    if autocast is not None:
        dtype = getattr(torch, autocast)
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [module for module in model.modules() if type(module).__name__ in names]
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for before, after in zip(blocks, blocks[1:], strict=False):
        before.set_modules_to_forward_prefetch([after])
        after.set_modules_to_backward_prefetch([before])
    return model


def _deepspeed(request: StepRequest) -> Any:
    import logging
    import os

    # a CPU step on a machine with GPUs must still run on DeepSpeed's CPU accelerator
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if request.device == "cuda" else "cpu")
    try:
        import deepspeed
        import deepspeed.ops
    except ImportError:
        raise VerifyError("a DeepSpeed ZeRO plan needs deepspeed: pip install deepspeed") from None
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if request.device != "cuda" and isinstance(compatible, dict):
        # the CPU accelerator would compile a shared-memory all-reduce first (a C++ build,
        # tens of seconds); gloo's own all-reduce moves the same tensors
        compatible["deepspeed_shm_comm"] = False
    return deepspeed


def _deepspeed_config(request: StepRequest) -> dict[str, Any]:
    """The DeepSpeed config of the plan, as the trainer hands it to `deepspeed.initialize`."""
    zero = dict(request.zero or {})
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": request.batch,
        "gradient_accumulation_steps": max(1, min(request.grad_accum, 2)),
        "zero_optimization": zero,
        "steps_per_print": 1_000_000_000,
    }
    if request.precision.startswith("bf16"):
        config["bf16"] = {"enabled": True}
    elif request.precision.startswith("fp16"):
        config["fp16"] = {"enabled": True}
    if request.device == "cuda" and "offload_optimizer" in zero:
        # the trainer's optimizer must be DeepSpeed's CPU Adam when states are offloaded
        config["zero_force_ds_cpu_optimizer"] = False
    return config


# -- measuring: a storage counter (CPU, simulated) or CUDA's allocator statistics ------------


class _Meter(contextlib.AbstractContextManager[Any]):
    """How a step is measured: a storage counter (CPU, simulated) or CUDA's statistics."""

    def __exit__(self, *exc: object) -> None:
        return None

    @abc.abstractmethod
    def begin(self, phase: str) -> None:
        """A phase starts: its peak is counted from now."""

    @abc.abstractmethod
    def end(self, phase: str) -> None:
        """A phase ends: keep its peak."""

    @abc.abstractmethod
    def size(self, tensors: list[Any]) -> int:
        """The bytes of these tensors' storages, each counted once."""

    def file(self, tensors: list[Any], category: str) -> None:
        """Say what these tensors are (a counter files new memory by phase otherwise)."""

    def watch_gradients(self, trainable: list[Any]) -> None:
        """File each gradient as such the moment autograd accumulates it."""

    @abc.abstractmethod
    def so_far(self) -> int:
        """The running phase's peak until now (what was allocated when a step runs out)."""

    @abc.abstractmethod
    def left_by_backward(self) -> int:
        """The memory backward created and left alive: the gradients a loop keeps itself."""

    def finish(self) -> None:
        """After the measured step (CUDA: reserved peak, free memory, snapshot)."""


class _TrackedMeter(_Meter):
    def __init__(self, tracker: Any, result: StepMeasurement) -> None:
        self.tracker = tracker
        self.result = result

    def __enter__(self) -> Any:
        return self.tracker.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.tracker.__exit__(*exc)

    def begin(self, phase: str) -> None:
        self.tracker.reset_peak(ACTIVATIONS if phase == "forward" else TEMPORARIES)

    def end(self, phase: str) -> None:
        tracker = self.tracker
        _record_phase(self.result, phase, tracker.peak, dict(tracker.peak_by_category))

    def size(self, tensors: list[Any]) -> int:
        return int(self.tracker.bytes_of(tensors))

    def file(self, tensors: list[Any], category: str) -> None:
        for t in tensors:
            self.tracker.track(t, category)

    def watch_gradients(self, trainable: list[Any]) -> None:
        tracker = self.tracker
        for p in trainable:
            p.register_post_accumulate_grad_hook(lambda param: tracker.track(param.grad, GRADIENTS))

    def so_far(self) -> int:
        return int(self.tracker.peak)

    def left_by_backward(self) -> int:
        return int(self.tracker.refile(TEMPORARIES, GRADIENTS))

    def finish(self) -> None:
        events = self.tracker.events
        if not events:
            return
        from llmmem.verify.allocator import OutOfMemory, replay_step

        try:
            allocator = replay_step(events, CUBLAS_WORKSPACE)
        except OutOfMemory:  # no capacity is given: cannot happen, but never fail a result
            return
        self.result.reserved_peak_bytes = allocator.peak_reserved
        self.result.notes.append(
            "reserved peak: this step's allocations, in their order, replayed through the CUDA "
            "caching allocator's rules (with two 32 MiB cuBLAS workspaces)"
        )


class _CudaMeter(_Meter):
    def __init__(self, torch: Any, request: StepRequest, result: StepMeasurement) -> None:
        self.torch = torch
        self.request = request
        self.result = result
        self.weights = 0
        self.before_forward = 0
        self.reserved = 0  # the caching allocator's peak over the measured phases
        # a paged bitsandbytes optimizer keeps its large states in CUDA managed memory, which
        # the caching allocator never sees: they sit on the GPU through the step all the same
        self.paged = 0
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        result.device_name = props.name
        result.capacity_bytes = int(props.total_memory)
        result.free_before_bytes = int(torch.cuda.mem_get_info()[0])
        self.nvml = _NvmlReader(props)
        if request.snapshot:
            torch.cuda.memory._record_memory_history(max_entries=200_000)

    def begin(self, phase: str) -> None:
        cuda = self.torch.cuda
        cuda.synchronize()
        if phase == "forward":
            self.before_forward = int(cuda.memory_allocated())
        cuda.reset_peak_memory_stats()

    def end(self, phase: str) -> None:
        cuda = self.torch.cuda
        cuda.synchronize()
        peak = int(cuda.max_memory_allocated()) + self.paged
        reserved = int(cuda.max_memory_reserved())
        self.reserved = max(self.reserved, reserved)
        used = self.nvml.used()
        _record_phase(self.result, phase, peak, {WEIGHTS: self.weights}, used, reserved)
        if used is not None:
            self.result.device_used_peak_bytes = max(self.result.device_used_peak_bytes or 0, used)
            self.result.device_used_source = self.nvml.source

    def size(self, tensors: list[Any]) -> int:
        seen: dict[int, int] = {}
        for t in tensors:
            # a paged state is a host tensor over managed memory that lives on the GPU
            if t.is_cuda or getattr(t, "is_paged", False):
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = int(storage.nbytes())
        return sum(seen.values())

    def file(self, tensors: list[Any], category: str) -> None:
        if category == WEIGHTS:
            self.weights = self.size(tensors)
        elif category == OPTIMIZER_STATES:
            paged = self.size([t for t in tensors if getattr(t, "is_paged", False)])
            if paged and not self.paged:
                self.result.notes.append(
                    f"{paged / 2**20:.1f} MiB of paged optimizer states live in CUDA managed "
                    "memory, which torch's allocator does not count: added to each phase's peak"
                )
            self.paged = paged

    def so_far(self) -> int:
        return int(self.torch.cuda.max_memory_allocated()) + self.paged

    def left_by_backward(self) -> int:
        self.torch.cuda.synchronize()
        return max(0, int(self.torch.cuda.memory_allocated()) - self.before_forward)

    def finish(self) -> None:
        cuda = self.torch.cuda
        result = self.result
        result.reserved_peak_bytes = self.reserved or int(cuda.max_memory_reserved())
        result.free_after_bytes = int(cuda.mem_get_info()[0])
        if self.request.snapshot:
            cuda.memory._dump_snapshot(self.request.snapshot)
            result.snapshot = self.request.snapshot


class _NvmlReader:
    """What nvidia-smi shows for this process: NVML's line for our pid, else the whole device's
    use (a process in another PID namespace is listed under a pid we cannot match). Context,
    the caching allocator's reserved segments, and memory outside torch (NCCL, managed memory)
    are all in it. Nothing (None) where NVML (the nvidia-ml-py package) is not there."""

    def __init__(self, props: Any) -> None:
        self.handle: Any = None
        self.source: str | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = getattr(props, "uuid", None)
            try:
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except pynvml.NVMLError:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML library, no driver binding: the readings are left out
            self.handle = None

    def used(self) -> int | None:
        if self.handle is None:
            return None
        import os

        import pynvml

        try:
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory:
                    self.source = "process"
                    return int(proc.usedGpuMemory)
            self.source = "device"
            return int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        except pynvml.NVMLError:
            return None


def _drive(
    torch: Any, loop: _Loop, meter: _Meter, request: StepRequest, result: StepMeasurement
) -> None:
    """A warm-up step (it creates the optimizer states), then the measured step, each over up
    to two micro-batches; every phase's peak is kept."""
    device = "cuda" if request.device == "cuda" else "cpu"
    vocab = _vocab(request)
    micro_batches = max(1, min(request.grad_accum, 2))
    offload: Any = None
    around_step: Any = contextlib.nullcontext
    if request.activation_offload == "trl":
        if request.device != "cuda":
            raise VerifyError(
                "TRL's own offloading hooks move tensors of an accelerator only: measure them "
                "with --device cuda (on the CPU the emulation of its rules runs instead)"
            )
        # TRL's own hooks, made once as SFTTrainer makes them, around forward and backward as
        # its training_step has them
        trl_hooks = _trl_offloading().get_act_offloading_ctx_manager(model=loop.model)
        around_step = lambda: trl_hooks  # noqa: E731
        result.notes.append(
            "activation offloading: TRL's own OffloadActivations (pinned host memory, streams)"
        )
    elif request.activation_offload:
        from llmmem.verify.offload import OffloadedActivations

        offload = OffloadedActivations(
            torch, loop.model, dedupe=request.activation_offload == "dedupe"
        )
        result.notes.append(
            "activation offloading: saved tensors leave the device as TRL's OffloadActivations "
            "moves them (host copies outside the measured memory)"
        )

    def one_step(measure: bool) -> None:
        for index in range(micro_batches):
            batch = _batch(torch, request, device, vocab)
            meter.file(list(batch.values()), OTHER)
            result.stage = "forward"
            if measure:
                meter.begin("forward")
            hooks = around_step()
            hooks.__enter__()
            try:
                with offload if offload is not None else contextlib.nullcontext():
                    loss = loop.forward(batch)
                if measure:
                    meter.end("forward")
                    meter.begin("backward")
                result.stage = "backward"
                loop.backward(loss)
            finally:
                hooks.__exit__(None, None, None)
            if offload is not None:
                offload.end_of_backward()
            del loss, batch
            _let_collectives_release(request)
            if measure:
                meter.end("backward")
                grads = loop.gradients()
                result.gradients_bytes = (
                    meter.left_by_backward() if grads is None else meter.size(grads)
                )
            if index < micro_batches - 1:
                loop.between_micro_batches()
        result.stage = "optimizer_step"
        if measure:
            meter.begin("optimizer_step")
        loop.step()
        states = loop.states()
        meter.file(states, OPTIMIZER_STATES)
        if measure:
            meter.end("optimizer_step")
            result.optimizer_state_bytes = meter.size(states)
        loop.zero_grad()

    try:
        one_step(False)
        result.weights_bytes = meter.size(loop.weights())
        one_step(True)
    finally:
        if offload is not None:
            offload.close()


def _trl_offloading() -> Any:
    """TRL's `trl.models.activation_offloading`, loaded from its file: the package's own
    `__init__` imports datasets and more that a step does not need."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise VerifyError("offloading by TRL's own hooks needs trl: pip install trl")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / "activation_offloading.py"
    if not path.is_file():
        raise VerifyError(f"this trl has no {path.name} (an older release): install a newer trl")
    module_spec = importlib.util.spec_from_file_location("_trl_activation_offloading", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _let_collectives_release(request: StepRequest) -> None:
    """Ranks on the CPU: let gloo's worker threads drop what they hold before a phase is read.

    A gloo worker keeps its own reference to a collective's tensors until it has finished the
    work, which can be after the main thread has waited for it and moved on: FSDP's last
    reduce-scatter input (a whole root unit of gradients) then outlived backward in one run of
    ten and read as part of the optimizer step. On a GPU FSDP frees it at the end of backward.
    Dropping it needs the GIL: the barrier and the pause wait with it released."""
    if request.launched and request.device != "cuda":
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            time.sleep(0.05)


@contextlib.contextmanager
def _autocast(torch: Any, request: StepRequest, device: str) -> Iterator[None]:
    """The plan's autocast (AMP) around forward, or nothing for pure fp32/bf16/fp16 weights.

    peft's k-bit LoRA layers ask `torch.is_autocast_enabled()`, which is CUDA's autocast: on a
    GPU they see it on and hand the adapter their input as it is. On the CPU they would see it
    off and make an fp32 copy first (kept, cast, by the adapter: 2·N·h more per adapted output
    projection), so the CPU step answers that question for the CPU's autocast."""
    dtype = AUTOCAST.get(request.precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device, dtype=getattr(torch, dtype)):
        if device == "cuda" or request.quant is None:
            yield
            return
        asked = torch.is_autocast_enabled
        torch.is_autocast_enabled = lambda device_type=None: asked(device_type or device)
        try:
            yield
        finally:
            torch.is_autocast_enabled = asked


def _record_phase(
    result: StepMeasurement,
    phase: str,
    peak: int,
    by_category: dict[str, int],
    device_used: int | None = None,
    reserved: int | None = None,
) -> None:
    """Keep a phase's peak, unless an earlier micro-batch peaked higher in it (the device
    figures keep their own most over the micro-batches)."""
    previous = result.phase(phase)
    if previous is not None:
        if previous.device_used_bytes is not None:
            device_used = max(device_used or 0, previous.device_used_bytes)
        if previous.reserved_bytes is not None:
            reserved = max(reserved or 0, previous.reserved_bytes)
        if previous.peak_bytes >= peak:
            previous.device_used_bytes = device_used
            previous.reserved_bytes = reserved
            return
        result.phases.remove(previous)
    result.phases.append(
        PhaseMeasurement(
            phase=phase,
            peak_bytes=peak,
            by_category=by_category,
            device_used_bytes=device_used,
            reserved_bytes=reserved,
        )
    )
    result.phases.sort(key=lambda p: ("forward", "backward", "optimizer_step").index(p.phase))


def _kbit_model(
    request: StepRequest, device: str, notes: list[str], torch: Any, transformers: Any
) -> Any:
    """A bitsandbytes k-bit model as a QLoRA script loads it: `from_pretrained` with a
    BitsAndBytesConfig (bitsandbytes quantizes while loading, so a randomly initialised copy is
    saved first), then peft's `prepare_model_for_kbit_training`, then the adapters."""
    config = _hf_config(transformers, request, notes)
    cls = _model_class(transformers, request)
    quant = request.quant or {}
    compute = torch.bfloat16 if int(quant.get("compute_dtype_bytes", 2)) == 2 else torch.float32
    if quant.get("quant_type") == "int8":
        bnb = transformers.BitsAndBytesConfig(load_in_8bit=True)
    else:
        bnb = transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=quant.get("quant_type", "nf4"),
            bnb_4bit_use_double_quant=bool(quant.get("double_quant", False)),
            bnb_4bit_compute_dtype=compute,
        )
    import tempfile

    place = torch.cuda.current_device() if device == "cuda" else "cpu"
    torch.manual_seed(request.seed)
    with tempfile.TemporaryDirectory() as directory:
        # the random 16-bit copy is made where it is fastest: a CPU fills bf16 tensors with
        # random numbers at a few hundred MB/s (55 s for a 0.5B model on 16 cores), a GPU at
        # once; on a GPU its memory is given back before the k-bit model is loaded
        with torch.device(place):
            cls._from_config(config, dtype=compute).save_pretrained(directory)
        if device == "cuda":
            import gc

            gc.collect()
            torch.cuda.empty_cache()
        try:
            model = cls.from_pretrained(
                directory,
                quantization_config=bnb,
                dtype=compute,
                device_map={"": place},
                attn_implementation=_attn(request, device, notes),
            )
        except (ValueError, TypeError, ImportError) as err:
            message = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise VerifyError(
                f"transformers could not load {request.model_id} in k-bit: {message}"
            ) from None
    if quant.get("prepare", True):
        import peft

        model = peft.prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=request.grad_ckpt
        )
    elif request.grad_ckpt:
        model.gradient_checkpointing_enable()
        if request.lora is not None:
            model.enable_input_require_grads()
    if request.lora is not None:
        model = _apply_lora(model, request)
    if quant.get("embeddings_16bit"):
        # TRL's peft_module_casting_to_bf16 (SFTTrainer up to 0.25, bf16=True): the embeddings
        # and the head, fp32 after the preparation, back to bf16; the norms stay fp32
        for name, module in model.named_modules():
            if any(part in name for part in ("lm_head", "embed_tokens", "wte", "wpe")):
                weight = getattr(module, "weight", None)
                if weight is not None and weight.dtype == torch.float32:
                    module.to(torch.bfloat16)
    model.train()
    return model


# HF `optim` names that bitsandbytes implements, and the bitsandbytes class the trainer builds
BITSANDBYTES_OPTIMIZERS = {
    "adamw_bnb_8bit": "AdamW8bit",
    "adamw_8bit": "AdamW8bit",
    "adamw_bnb_32bit": "AdamW32bit",
    "paged_adamw_8bit": "PagedAdamW8bit",
    "paged_adamw_32bit": "PagedAdamW32bit",
    "lion_8bit": "Lion8bit",
    "lion_32bit": "Lion32bit",
    "paged_lion_8bit": "PagedLion8bit",
    "paged_lion_32bit": "PagedLion32bit",
    "rmsprop_bnb": "RMSprop32bit",
    "rmsprop_bnb_8bit": "RMSprop8bit",
    "rmsprop_bnb_32bit": "RMSprop32bit",
    "ademamix": "AdEMAMix32bit",
    "ademamix_8bit": "AdEMAMix8bit",
    "paged_ademamix_8bit": "PagedAdEMAMix8bit",
    "paged_ademamix_32bit": "PagedAdEMAMix32bit",
}


def runs_bitsandbytes(optim: str) -> bool:
    return optim in BITSANDBYTES_OPTIMIZERS


def _bitsandbytes(torch: Any, device: str) -> Any:
    """bitsandbytes, able to run on `device` (older releases have no CPU kernels)."""
    import logging

    # the CPU backend logs a warning about an optional fused kernel on import
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    try:
        import bitsandbytes
    except ImportError:
        raise VerifyError(
            "k-bit layers and 8-bit optimizers need bitsandbytes: pip install 'llmmem[verify]'"
        ) from None
    if device == "cpu":
        try:
            bitsandbytes.functional.quantize_4bit(torch.zeros(64, dtype=torch.bfloat16))
        except Exception:  # an old release without CPU kernels fails in its own way
            raise VerifyError(
                f"this bitsandbytes ({bitsandbytes.__version__}) has no CPU kernels: "
                "pip install -U bitsandbytes for a CPU step, or verify on a GPU"
            ) from None
    return bitsandbytes

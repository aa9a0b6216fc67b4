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

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from llmmem.verify.building import (
    AUTOCAST,
    VerifyError,
    _batch,
    _bitsandbytes,
    _build,
    _fake_parameters,
    _imports,
    _quant_constants,
    _unpacked_masks,
    _vocab,
    build_model,
    make_optimizer,
    runs_bitsandbytes,
)
from llmmem.verify.meters import (
    _CudaMeter,
    _Meter,
    _TrackedMeter,
)
from llmmem.verify.request import (
    OPTIMIZER_STATES,
    OTHER,
    WEIGHTS,
    StepMeasurement,
    StepRequest,
)


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
    if deepspeed_config is not None:
        # the HF Trainer's two groups, as it gives them to DeepSpeed (weights that decay, then
        # biases and norms): ZeRO-1/2 steps one group at a time (llmmem.budget.zero12_step).
        # The Trainer's own rule; the method reads only `model`
        from transformers import Trainer

        decay = set(Trainer.get_decay_parameter_names(None, model))  # type: ignore[arg-type]
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        split = [[p for n, p in named if n in decay], [p for n, p in named if n not in decay]]
        trainable = [{"params": g} for g in split if g]
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

"""Run one training step of a StepRequest and measure it: on CUDA, on the CPU, or simulated.

The model is built from its config with transformers (random weights: the memory is the same as
with the real ones), then exactly what the setup says is applied: dtype, gradient checkpointing,
attention implementation, PEFT LoRA/DoRA, the optimizer by HF `optim` name with its torch
implementation. A synthetic batch of the planned shape runs a warm-up step (which creates the
optimizer states) and a measured step: forward, backward, optimizer step, each phase's peak kept.

Simulated ("fake"): the same step under FakeTensorMode on the fake CPU device, counted by
`StorageTracker`; no memory is allocated and no weights are needed. What it cannot see: the CUDA
context, the caching allocator's rounding and fragmentation, cuBLAS workspaces, and
bitsandbytes kernels (k-bit models and 8-bit optimizers are refused with a message). The report
adds the core's estimate of those on top, labelled as estimated.

torch, transformers and peft are imported here only; nothing else in llmmem imports them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

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


DTYPES = {"bf16-true": "bfloat16", "fp16-true": "float16"}
AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}
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
        return peft.get_peft_model(model, config)
    except ValueError as err:
        raise VerifyError(f"peft could not add the adapters: {err}") from None


def _number(value: Any) -> Any:
    """An int where the value is whole (peft types lora_alpha as int), else the float."""
    number = float(value)
    return int(number) if number.is_integer() else number


def make_optimizer(torch: Any, request: StepRequest, params: list[Any]) -> Any:
    name = request.optim
    if "bnb" in name or "8bit" in name or name.startswith(("paged_", "lion", "ademamix")):
        raise VerifyError(
            f"optim={name} runs bitsandbytes kernels, which need CUDA: verify on a GPU, or "
            "compare with adamw_torch in a simulation"
        )
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
    ids = torch.randint(3, max(vocab, 4), shape, device=device)
    batch = {"input_ids": ids, "labels": ids.clone()}
    if request.architecture.endswith("ForConditionalGeneration") or "T5" in request.architecture:
        batch["decoder_input_ids"] = ids.clone()
    return batch


def run_step(request: StepRequest) -> StepMeasurement:
    """Build, warm up, measure. Never raises: what stops the step is in `error` / `oom`."""
    started = time.monotonic()
    device = request.device
    result = StepMeasurement(device=device, device_name=device, stage="build")
    try:
        if device == "cuda":
            _run_cuda(request, result)
        else:
            _run_tracked(request, result, fake=device == "fake")
    except VerifyError as err:
        result.error = str(err)
    except MemoryError:
        result.error = "the machine ran out of memory (RAM) while building or running the step"
    except Exception as err:  # the step is a result: report, do not crash
        if "out of memory" in str(err).lower():
            result.oom = {
                "phase": result.stage,
                "allocated_bytes": result.allocated_peak_bytes,
                "message": str(err).splitlines()[0],
            }
        else:
            result.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _parameters(model: Any) -> list[Any]:
    return list(model.parameters())


def _vocab(request: StepRequest) -> int:
    text = request.config.get("text_config")
    value = request.config.get("vocab_size") or (text or {}).get("vocab_size") or 32000
    return int(value)


def _run_tracked(request: StepRequest, result: StepMeasurement, *, fake: bool) -> None:
    torch, transformers = _imports()
    from llmmem.verify.tracker import StorageTracker

    if request.quant is not None:
        raise VerifyError(
            "bitsandbytes k-bit layers need CUDA: without a GPU, k-bit memory stays the "
            "estimate's (run verify on a GPU to measure it)"
        )
    notes = result.notes
    tracker = StorageTracker(resizable=request.world_size > 1 and request.sharding == "fsdp")
    fake_mode: Any = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        model = build_model(request, "meta", notes)
        _fake_parameters(torch, model, fake_mode)
        result.device_name = "simulated (FakeTensorMode, cpu)"
    else:
        model = build_model(request, "cpu", notes)
        result.device_name = "cpu"
    if request.world_size > 1:
        model = _distribute(torch, model, request, result)
    params = _parameters(model)
    trainable = [p for p in params if p.requires_grad]
    for p in params:
        tracker.track(p, WEIGHTS)
    for b in model.buffers():
        tracker.track(b, OTHER)
    # a gradient is filed as such the moment autograd accumulates it into .grad
    for p in trainable:
        p.register_post_accumulate_grad_hook(lambda param: tracker.track(param.grad, GRADIENTS))
    vocab = _vocab(request)

    with fake_mode, tracker, _unpacked_masks(transformers):
        optimizer = make_optimizer(torch, request, trainable)

        def forward_backward(measure: bool) -> None:
            for _ in range(max(1, min(request.grad_accum, 2))):
                batch = _batch(torch, request, "cpu", vocab)
                for value in batch.values():
                    tracker.track(value, OTHER)
                if measure:
                    tracker.reset_peak(ACTIVATIONS)
                    result.stage = "forward"
                with _autocast(torch, request, "cpu"):
                    loss = model(**batch).loss
                if measure:
                    _keep_peak(result, "forward", tracker)
                    tracker.reset_peak(TEMPORARIES)
                    result.stage = "backward"
                loss.backward()
                del loss, batch
                if measure:
                    grads = [p.grad for p in trainable if p.grad is not None]
                    _keep_peak(result, "backward", tracker)
                    result.gradients_bytes = tracker.bytes_of(grads)

        def step(measure: bool) -> None:
            if measure:
                tracker.reset_peak(TEMPORARIES)
                result.stage = "optimizer_step"
            optimizer.step()
            states = [
                value
                for state in optimizer.state.values()
                for value in state.values()
                if isinstance(value, torch.Tensor)
            ]
            for s in states:
                tracker.track(s, OPTIMIZER_STATES)
            if measure:
                _keep_peak(result, "optimizer_step", tracker)
                result.optimizer_state_bytes = tracker.bytes_of(states)
            optimizer.zero_grad(set_to_none=True)

        result.stage = "warm-up"
        forward_backward(False)
        step(False)
        result.weights_bytes = tracker.bytes_of(params)
        forward_backward(True)
        step(True)
    result.allocated_peak_bytes = max(p.peak_bytes for p in result.phases)
    result.stage = "done"


def _distribute(torch: Any, model: Any, request: StepRequest, result: StepMeasurement) -> Any:
    """This rank's part of a multi-rank plan (under torchrun, gloo on the CPU): DDP keeps a
    whole copy per rank; FSDP2 shards each transformer block and the rest."""
    import torch.distributed as dist

    if request.device == "fake":
        raise VerifyError("a multi-GPU plan cannot be simulated yet: use --device cpu or cuda")
    if not dist.is_initialized():
        dist.init_process_group("gloo" if request.device == "cpu" else "nccl")
    result.rank = dist.get_rank()
    result.device_name = f"{result.device_name} rank {result.rank} of {dist.get_world_size()}"
    if request.sharding == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    blocks = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(model)
    return model


def _autocast(torch: Any, request: StepRequest, device: str) -> Any:
    """The plan's autocast (AMP) around forward, or nothing for pure fp32/bf16/fp16 weights."""
    dtype = AUTOCAST.get(request.precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device, dtype=getattr(torch, dtype))


def _keep_peak(result: StepMeasurement, phase: str, tracker: Any) -> None:
    _record_phase(result, phase, tracker.peak, dict(tracker.peak_by_category))


def _record_phase(
    result: StepMeasurement, phase: str, peak: int, by_category: dict[str, int]
) -> None:
    """Keep a phase's peak, unless an earlier micro-batch peaked higher in it."""
    previous = result.phase(phase)
    if previous is not None and previous.peak_bytes >= peak:
        return
    if previous is not None:
        result.phases.remove(previous)
    result.phases.append(PhaseMeasurement(phase=phase, peak_bytes=peak, by_category=by_category))
    result.phases.sort(key=lambda p: ("forward", "backward", "optimizer_step").index(p.phase))


def _run_cuda(request: StepRequest, result: StepMeasurement) -> None:
    torch, transformers = _imports()
    if not torch.cuda.is_available():
        raise VerifyError(
            "no CUDA device here: run `llmmem verify FILE --simulate` for a simulated step, or "
            "`--device cpu` for a small model"
        )
    props = torch.cuda.get_device_properties(0)
    result.device_name = props.name
    result.capacity_bytes = int(props.total_memory)
    result.free_before_bytes = int(torch.cuda.mem_get_info()[0])
    if request.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    notes = result.notes
    model = _cuda_model(request, notes, torch, transformers)
    params = _parameters(model)
    trainable = [p for p in params if p.requires_grad]
    optimizer = make_cuda_optimizer(torch, request, trainable)
    vocab = _vocab(request)

    def phase_peak(name: str) -> None:
        torch.cuda.synchronize()
        weights = sum(p.numel() * p.element_size() for p in params)
        _record_phase(result, name, int(torch.cuda.max_memory_allocated()), {WEIGHTS: weights})
        torch.cuda.reset_peak_memory_stats()

    def one_step(measure: bool) -> None:
        for _ in range(max(1, min(request.grad_accum, 2))):
            batch = _batch(torch, request, "cuda", vocab)
            torch.cuda.reset_peak_memory_stats()
            result.stage = "forward"
            with _autocast(torch, request, "cuda"):
                loss = model(**batch).loss
            if measure:
                phase_peak("forward")
            result.stage = "backward"
            loss.backward()
            del loss, batch
            if measure:
                phase_peak("backward")
                result.gradients_bytes = sum(
                    p.grad.numel() * p.grad.element_size() for p in trainable if p.grad is not None
                )
        result.stage = "optimizer_step"
        optimizer.step()
        if measure:
            phase_peak("optimizer_step")
            result.optimizer_state_bytes = sum(
                v.numel() * v.element_size()
                for state in optimizer.state.values()
                for v in state.values()
                if isinstance(v, torch.Tensor) and v.is_cuda
            )
        optimizer.zero_grad(set_to_none=True)

    one_step(False)
    result.weights_bytes = sum(p.numel() * p.element_size() for p in params)
    torch.cuda.reset_peak_memory_stats()
    one_step(True)
    result.allocated_peak_bytes = max(p.peak_bytes for p in result.phases)
    result.reserved_peak_bytes = int(torch.cuda.max_memory_reserved())
    result.free_after_bytes = int(torch.cuda.mem_get_info()[0])
    if request.snapshot:
        torch.cuda.memory._dump_snapshot(request.snapshot)
        result.snapshot = request.snapshot
    result.stage = "done"


def _cuda_model(request: StepRequest, notes: list[str], torch: Any, transformers: Any) -> Any:
    if request.quant is None:
        model = build_model(request, "cuda", notes)
        return model
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise VerifyError("k-bit plans need bitsandbytes: pip install bitsandbytes") from None
    config = _hf_config(transformers, request)
    cls = _model_class(transformers, request)
    quant = request.quant
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
    # bitsandbytes quantizes while loading: save a randomly initialised copy, load it quantized
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        with torch.device("cpu"):
            cls._from_config(config, dtype=torch.bfloat16).save_pretrained(directory)
        model = cls.from_pretrained(
            directory,
            quantization_config=bnb,
            device_map={"": 0},
            attn_implementation=_attn(request, "cuda", notes),
        )
    if quant.get("prepare", True):
        import peft

        model = peft.prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=request.grad_ckpt
        )
    elif request.grad_ckpt:
        model.gradient_checkpointing_enable()
    if request.lora is not None:
        model = _apply_lora(model, request)
    model.train()
    return model


def make_cuda_optimizer(torch: Any, request: StepRequest, params: list[Any]) -> Any:
    name = request.optim
    if "8bit" in name or "bnb" in name or name.startswith(("paged_", "lion", "ademamix")):
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise VerifyError(
                f"optim={name} needs bitsandbytes: pip install bitsandbytes"
            ) from None
        paged = name.startswith("paged_")
        if "lion" in name:
            cls = bnb.optim.PagedLion8bit if paged else bnb.optim.Lion8bit
        elif "32bit" in name:
            cls = bnb.optim.PagedAdamW32bit if paged else bnb.optim.AdamW32bit
        else:
            cls = bnb.optim.PagedAdamW8bit if paged else bnb.optim.AdamW8bit
        return cls(params, lr=1e-5)
    return make_optimizer(torch, request, params)

"""What a verified step runs: the model built from its HF config (on the meta device for a
simulated step, with LoRA and k-bit layers as the plan says), the batch, and the optimizer.
torch, transformers, peft and bitsandbytes are imported here (and by the runner) only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from llmmem.verify.request import StepRequest


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


def _vocab(request: StepRequest) -> int:
    text = request.config.get("text_config")
    value = request.config.get("vocab_size") or (text or {}).get("vocab_size") or 32000
    return int(value)


def _build(
    request: StepRequest, device: str, notes: list[str], torch: Any, transformers: Any
) -> Any:
    """The model on `device`. Under ZeRO-3, `deepspeed.initialize` partitions it (transformers
    would load it inside `deepspeed.zero.Init`: the step's memory is the same either way)."""
    if request.quant is not None:
        return _kbit_model(request, device, notes, torch, transformers)
    return build_model(request, device, notes)


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

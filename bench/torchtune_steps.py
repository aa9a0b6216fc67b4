"""The budget against torchtune's own training step, run on the CPU.

`llmmem estimate --framework torchtune` and a torchtune YAML size torchtune's own stack
(llmmem.budget.stacks.torchtune): its bf16 model and adapters, torchao's NF4 weights, its
chunked cross-entropy, its RMSNorm, its K/V copied to every head, its activation offloading and
its optimizer in backward. This runs torchtune's own pieces of a training step on the CPU under
llmmem's StorageTracker and compares each phase with the budget for the same YAML:

- the model from the YAML's `model:` through torchtune's `config.instantiate` under
  `training.set_default_dtype(dtype)` (recipes/lora_finetune_single_device.py:431,
  full_finetune_single_device.py:428), a tiny Llama 3.1 from its component builders
  (`torchtune.models.llama3_1.llama3_1` / `lora_llama3_1`, `quantize_base: True` for QLoRA);
- LoRA: `set_trainable_params(model, get_adapter_params(model))` (lora recipe :439-441);
  checkpointing: `training.set_activation_checkpointing(model, auto_wrap_policy=
  {TransformerSelfAttentionLayer})` (:446-449); offloading: `training.
  get_act_offloading_ctx_manager(model, True)` (:484);
- the loss from the YAML (`CEWithChunkedOutputLoss` and `model.set_num_output_chunks`, full
  recipe :298, lora :302, or `torch.nn.CrossEntropyLoss`), the forward and the loss through the
  recipe's own `_loss_step` (called on the recipe class), then the loop's body as the recipes
  write it (full :698-713, lora :700-717): the loss times the tokens, `backward()`,
  `training.scale_grads`, `optimizer.step()`, `zero_grad(set_to_none=True)`;
- the optimizer from the YAML (`torch.optim.AdamW` with `fused: True`), or one per parameter
  with `training.register_optim_in_bwd_hooks` where `optimizer_in_bwd: True` (full recipe
  :467-477).

Two steps run; of the second the peak of allocated bytes in forward (the model and the loss),
in backward and in the optimizer step are compared with the budget's phases, as `llmmem
explain YAML --format json` gives them (run from this tree, the releases read from the
environment below through LLMMEM_RUN_ENV). The model's shapes reach llmmem through a
`# llmmem: model_config=config.json` pragma (an HF LlamaConfig of the same shapes).

torchtune's OffloadActivations needs CUDA streams and pinned memory; on the CPU its own hooks
run with stand-ins: streams and events that do nothing (the copies they would order are
synchronous here), `empty_like(..., pin_memory=True, device="cpu")` making the host copy outside
the tracker (host memory), and `.to("cuda")` of a host copy making a counted clone (memory
brought back). Its rules (what it keeps, its forward stash of 5, when it frees) are its own.

Paged optimizers are not run here: bitsandbytes falls back to plain states on the CPU
(optim/optimizer.py `get_state_buffer`), so unified memory cannot be shown without a GPU.

Medium (a Llama 3.1 of 4 blocks, h 1024, 16 query and 4 K/V heads, MLP 3584, vocabulary 16384),
2 × 256 tokens, bf16, torch 2.13.0+cpu, torchao 0.14.1, torchtune 0.6.1, MiB, torchtune's step /
llmmem's budget, the optimizer step's error, and the forward's and backward's error of the budget
as it sized these YAMLs before torchtune's stack (the HF stack; a LoRA builder with
`quantize_base: True` read as LoRA):

    case                      forward  llmmem    err  backward  llmmem    err  step   before (%)
    lora                       320.37  322.35  +0.6%    308.37  310.35  +0.6% -0.0%   +7.9 / +27.6
    lora ckpt                  230.05  230.03  -0.0%    218.04  218.03  -0.0% -0.0%   -7.4 / +19.7
    lora ckpt offload          227.05  227.04  -0.0%    215.04  215.04  +0.0% -0.0%   -6.2 / +21.4
    lora standard loss         332.37  334.35  +0.6%    364.37  366.35  +0.5% -0.0%   +18.4 / +12.4
    qlora                      243.19  245.17  +0.8%    239.36  241.17  +0.8% -0.0%   +42.1 / +64.4
    qlora ckpt                 154.47  154.35  -0.1%    176.04  180.93  +2.8% -0.0%   +37.9 / +48.3
    qlora ckpt offload         154.47  154.35  -0.1%    175.04  180.10  +2.9% -0.0%   +37.9 / +49.1
    full                       673.71  673.68  -0.0%    729.70  729.68  -0.0% -0.0%   -5.3 / -6.0
    full ckpt in-bwd           565.57  565.55  -0.0%    621.56  621.55  -0.0% -0.0%   -3.8 / -4.7
    full ckpt offload in-bwd   561.57  561.55  -0.0%    617.56  617.55  -0.0% -0.0%   -3.1 / -4.1
    lora fsdp2 x2              305.90  300.26  -1.8%    326.61  328.33  +0.5% -0.3%
    lora ckpt fsdp2 x2         267.87  266.03  -0.7%    239.01  239.10  +0.0% -0.3%
    full fsdp2 x2              485.68  480.41  -1.1%    567.68  567.41  -0.0% -0.1%
    full ckpt fsdp2 x2         433.55  432.29  -0.3%    497.59  491.33  -1.3% -0.1%
    full fsdp2 x2 own units    481.55  480.41  -0.2%    523.68  535.41  +2.2% -0.1%
    lora fsdp2 x2 own units    294.60  300.26  +1.9%    262.60  264.33  +0.7% -0.3%
    lora fsdp2 x2 root kept    305.90  300.33  -1.8%    305.26  307.34  +0.7% -0.3%
    full fsdp2 x2 root kept    485.68  485.40  -0.1%    567.68  567.41  -0.0% -0.1%

The `fsdp2 x2` cases run the distributed recipes on 2 CPU ranks over gloo
(bench/torchtune_fsdp_rank.py: the recipe's own `_setup_model`, FSDP2 on every layer and the
model, the block after prefetched in forward and the block before in backward, as a GPU
overlaps them); the largest rank's peak per phase. Before torchtune's sharding was read they
were sized as DDP replicas; with the HF FSDP rule (the root unit whole through the loss) forward
read +6.7% and backward -10.9%: torchtune passes reshard_after_forward=True to the root as well,
which torch >= 2.8 honours, so the loss runs without the root and the last all-gather's buffer,
and backward gathers the root again (its buffer and the copied-out parameters both alive).
The `own units` cases add 8B_full.yaml's `custom_sharded_layers: ['tok_embeddings', 'output']`:
the head gathered again for its own backward only, the embeddings at the very end (sized with
the root unit, the full case read +8.3% in backward). The `root kept` cases emulate torch before
2.8 (the root kept whole after forward) and are sized for torch 2.7: the last block's buffer is
freed at the loss there too (+6.7% and +5.3% in forward while it was counted).

What each gap was, or is (`--detail` prints the storages alive at each peak and where it was
reached, with the autograd node):

- a trainable head's backward read 57 MiB low: the head's weight gets one gradient per chunk and
  autograd's input buffer adds the first two into a new tensor (torch's profiler: `aten::add`,
  then `aten::add_`), three head-sized gradients at once, peaking in TBackward0;
- QLoRA under checkpointing read +11% in forward while the running block was taken as all its
  saved tensors: a checkpointed block holds only its residual, its MLP's input, one more N·h
  tensor and one MLP-wide one while a NF4 weight is dequantized (14 B a value: two int64 index
  tensors); QLoRA without checkpointing read −2.6% in backward until the last block's backward,
  every block's tensors still alive beside a dequantized weight, was a moment of its own;
- left: QLoRA's backward under checkpointing, +2.8%: the budget holds the block's whole
  backward workspace beside the dequantized weight; the step's peak is the recompute's
  dequantization (in MmBackward0), before the MLP's gradients exist. At the small size, LoRA
  and QLoRA without checkpointing read +1.5% to +1.8%: the first layer's norm reads the frozen
  embeddings' output, needs no gradient and keeps nothing; the budget counts its fp32 input.

    python bench/torchtune_steps.py [--size small|medium] [--case NAME ...] [--detail]

The meter here reads a storage's size again when an op writes into one grown in place since it
was counted (FSDP2's copy-out into its unsharded parameters): llmmem's shared tracker does so
only when a new storage is counted, and missed those moments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ENV = HERE / ".torchtune"
# torch first, the CPU build this machine has; torchao 0.14.1 is the newest release that still
# has what torchtune 0.6.1 imports (torchao.quantization.int4_weight_only is gone from 0.15 on,
# torchao.dtypes.nf4tensor from 0.18); its C++ extensions are skipped for torch 2.13 (it says
# so), which NF4 does not use
RELEASES = ["torch==2.13.0", "torchao==0.14.1", "torchtune==0.6.1"]

# tiny Llama 3.1 shapes (GQA, as Llama 3): every quantized Linear holds a multiple of
# 64 × 256 values (torchao's NF4 blocks and scaler blocks)
SIZES: dict[str, dict[str, int]] = {
    "small": {
        "vocab_size": 4096,
        "num_layers": 2,
        "num_heads": 8,
        "num_kv_heads": 2,
        "embed_dim": 256,
        "intermediate_dim": 768,
        "max_seq_len": 1024,
    },
    "medium": {
        "vocab_size": 16384,
        "num_layers": 4,
        "num_heads": 16,
        "num_kv_heads": 4,
        "embed_dim": 1024,
        "intermediate_dim": 3584,
        "max_seq_len": 2048,
    },
}

# name -> (method, checkpointing, offloading, optimizer in backward, loss, ranks): one rank runs
# the single-device recipes' step in this process; more run the distributed recipes' (FSDP2)
# under torchrun on CPU ranks over gloo (bench/torchtune_fsdp_rank.py)
CASES: dict[str, tuple[str, bool, bool, bool, str, int]] = {
    "lora": ("lora", False, False, False, "chunked", 1),
    "lora ckpt": ("lora", True, False, False, "chunked", 1),
    "lora ckpt offload": ("lora", True, True, False, "chunked", 1),
    "lora standard loss": ("lora", False, False, False, "standard", 1),
    "qlora": ("qlora", False, False, False, "chunked", 1),
    "qlora ckpt": ("qlora", True, False, False, "chunked", 1),
    "qlora ckpt offload": ("qlora", True, True, False, "chunked", 1),
    "full": ("full", False, False, False, "chunked", 1),
    "full ckpt in-bwd": ("full", True, False, True, "chunked", 1),
    "full ckpt offload in-bwd": ("full", True, True, True, "chunked", 1),
    "lora fsdp2 x2": ("lora", False, False, False, "chunked", 2),
    "lora ckpt fsdp2 x2": ("lora", True, False, False, "chunked", 2),
    "full fsdp2 x2": ("full", False, False, False, "chunked", 2),
    "full ckpt fsdp2 x2": ("full", True, False, False, "chunked", 2),
    "full fsdp2 x2 own units": ("full", False, False, False, "chunked", 2),
    "lora fsdp2 x2 own units": ("lora", False, False, False, "chunked", 2),
    "lora fsdp2 x2 root kept": ("lora", False, False, False, "chunked", 2),
    "full fsdp2 x2 root kept": ("full", False, False, False, "chunked", 2),
}
# the `root kept` cases: torch before 2.8 kept FSDP2's root whole after forward whatever
# reshard_after_forward said (pytorch#154704); emulated on torch 2.13 by setting the root's
# reshard_after_forward to False after the recipe's setup, and sized by llmmem for torch 2.7
ROOT_KEPT_TORCH = "2.7.1"


# -- the torchtune YAML of a case ---------------------------------------------------------------


def case_yaml(name: str, size: str, batch: int, seq: int, config_path: str) -> str:
    method, ckpt, offload, in_bwd, loss, ranks = CASES[name]
    dims = SIZES[size]
    world = f" world_size={ranks}" if ranks > 1 else ""
    lines = [
        f"# llmmem: model_config={config_path}{world}",
        "model:",
        "  _component_: torchtune.models.llama3_1."
        + ("llama3_1" if method == "full" else "lora_llama3_1"),
    ]
    lines += [f"  {key}: {value}" for key, value in dims.items()]
    if method != "full":
        lines += [
            "  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']",
            "  apply_lora_to_mlp: True",
            "  apply_lora_to_output: False",
            "  lora_rank: 8",
            "  lora_alpha: 16",
            "  lora_dropout: 0.0",
        ]
        if method == "qlora":
            lines.append("  quantize_base: True")
    lines += [
        "tokenizer:",
        "  _component_: torchtune.models.llama3.llama3_tokenizer",
        "  path: /tmp/tokenizer.model",
        f"  max_seq_len: {seq}",
        f"batch_size: {batch}",
        "gradient_accumulation_steps: 1",
        "optimizer:",
        "  _component_: torch.optim.AdamW",
        "  fused: True",
        "  lr: 2e-5",
        "loss:",
        "  _component_: "
        + (
            "torchtune.modules.loss.CEWithChunkedOutputLoss"
            if loss == "chunked"
            else "torch.nn.CrossEntropyLoss"
        ),
        f"optimizer_in_bwd: {in_bwd}",
        f"enable_activation_checkpointing: {ckpt}",
        f"enable_activation_offloading: {offload}",
        "compile: False",
        "device: cpu",
        "dtype: bf16",
    ]
    if ranks > 1:
        # the distributed recipes' own keys (lora_finetune_distributed.py :279-280)
        lines += ["fsdp_cpu_offload: False", "fsdp_reshard_after_forward: True"]
    if name.endswith("own units"):
        # llama3_1/8B_full.yaml's: the embeddings and the head sharded as units of their own
        lines.append("custom_sharded_layers: ['tok_embeddings', 'output']")
    return "\n".join(lines) + "\n"


def hf_config(size: str) -> dict[str, Any]:
    """The same model as transformers' LlamaConfig, which llmmem sizes."""
    dims = SIZES[size]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": dims["vocab_size"],
        "hidden_size": dims["embed_dim"],
        "intermediate_size": dims["intermediate_dim"],
        "num_hidden_layers": dims["num_layers"],
        "num_attention_heads": dims["num_heads"],
        "num_key_value_heads": dims["num_kv_heads"],
        "max_position_embeddings": dims["max_seq_len"],
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }


# -- inside the torchtune environment -----------------------------------------------------------


def tracker_class() -> Any:
    """llmmem's StorageTracker, counting torchao's NF4 weights by their inner tensors, leaving
    out host memory (offloaded copies) and noting what was alive at each new peak (`detail`)."""
    import traceback
    import weakref

    import torch

    from llmmem.verify.tracker import StorageTracker

    class Tracker(StorageTracker):
        detail = False
        live: list[tuple[int, str]] = []
        host: set[int] = set()
        where = ""

        def track(self, t: torch.Tensor, category: str | None = None) -> None:
            if type(t).__name__ == "NF4Tensor":
                # torchao's NF4 weight: a wrapper over its packed values, scalers and table
                names, _ = t.__tensor_flatten__()
                for inner in [*(getattr(t, name) for name in names), t.nf4]:
                    self.track(inner, category)
                return
            local = getattr(t, "_local_tensor", None)  # a DTensor (FSDP2): this rank's shard
            if isinstance(local, torch.Tensor):
                t = local
            try:
                pointer = t.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError, TypeError):
                return
            if pointer in self.host:
                return
            super().track(t, category)

        def _track(self, storage: Any, category: str | None) -> None:
            # an op writing into a storage grown in place since it was counted: FSDP2's
            # copy-out into its unsharded parameters, while its all-gather buffer is alive (the
            # shared tracker reads such sizes again only when a new storage is counted)
            key = id(storage)
            if self.resizable and key in self.sizes and storage.nbytes() != self.sizes[key]:
                self._read_sizes({key: weakref.ref(storage)})
                self._note_peak()
            super()._track(storage, category)

        def _note_peak(self) -> None:
            before = self.peak
            super()._note_peak()
            if self.detail and self.peak > before:
                self.live = sorted(
                    ((s, self.category[k]) for k, s in self.sizes.items() if s >= 2**16),
                    reverse=True,
                )
                self.where = _where(traceback.extract_stack())
                node = torch._C._current_autograd_node()
                if node is not None:
                    self.where += f" in {node.name()}"

    return Tracker


def note_peak(tracker: Any, seen: dict[str, Any], phase: str) -> None:
    """A phase's peak into `seen`; with `detail`, where it was reached and what was alive."""
    seen[phase] = tracker.peak
    if tracker.detail:
        seen[phase + " where"] = tracker.where
        seen[phase + " live"] = [f"{size / 2**20:.2f} {what}" for size, what in tracker.live[:24]]


def run_case(payload: dict[str, Any]) -> dict[str, Any]:
    """One case, inside the environment with torchtune: each phase's peak of the second step."""
    import traceback
    import weakref

    import torch
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(payload["yaml"])
    offload = bool(cfg.get("enable_activation_offloading", False))
    if offload:
        _cuda_stand_ins()

    from torchtune import config, modules, training
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    recipe_class = _recipe_class("lora_finetune_single_device", "LoRAFinetuneRecipeSingleDevice")
    Tracker = tracker_class()
    Tracker.detail = bool(payload.get("detail"))
    tracker = Tracker()
    if offload:
        _host_copies(tracker, weakref)
    dtype = training.get_dtype(cfg.dtype, device=torch.device("cpu"))
    torch.manual_seed(0)
    with training.set_default_dtype(dtype), torch.device("cpu"):
        model = config.instantiate(cfg.model)
    lora = "lora" in str(cfg.model._component_)
    if lora:
        set_trainable_params(model, get_adapter_params(model))
    if cfg.enable_activation_checkpointing:
        training.set_activation_checkpointing(
            model, auto_wrap_policy={modules.TransformerSelfAttentionLayer}
        )
    loss_fn = config.instantiate(cfg.loss)
    if hasattr(loss_fn, "num_output_chunks"):
        model.set_num_output_chunks(loss_fn.num_output_chunks)
    handling = training.get_act_offloading_ctx_manager(model, offload)
    in_bwd = bool(cfg.get("optimizer_in_bwd", False))
    optimizer = None
    if in_bwd:
        optim_dict = {p: config.instantiate(cfg.optimizer, [p]) for p in model.parameters()}
        training.register_optim_in_bwd_hooks(model=model, optim_dict=optim_dict)
    else:
        optimizer = config.instantiate(cfg.optimizer, model.parameters())
    batch, seq = int(cfg.batch_size), int(cfg.tokenizer.max_seq_len)
    recipe = type("Recipe", (), {})()
    recipe._model = model
    recipe._loss_fn = loss_fn
    recipe.activations_handling_ctx = handling
    recipe.ignore_labels_cache = torch.full((batch, 1), loss_fn.ignore_index, dtype=torch.long)
    seen: dict[str, Any] = {}

    def note(phase: str) -> None:
        note_peak(tracker, seen, phase)

    try:
        with tracker:
            for tensor in [*model.parameters(), *model.buffers()]:
                tracker.track(tensor, "weights")
            for measured in (False, True):
                tokens = torch.randint(0, int(cfg.model.vocab_size), (batch, seq))
                step_batch = {"tokens": tokens, "labels": tokens.clone()}
                tracker.reset_peak("activations")
                num_tokens = (step_batch["labels"] != loss_fn.ignore_index).sum()
                # the recipes' own loss step (lora recipe :639-661)
                loss = recipe_class._loss_step(recipe, step_batch)
                current_loss = loss * num_tokens
                if measured:
                    note("forward")
                tracker.reset_peak("temporaries")
                current_loss.backward()
                if measured:
                    note("backward")
                tracker.reset_peak("temporaries")
                if optimizer is not None:
                    training.scale_grads(model, 1 / num_tokens)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                if measured:
                    note("optimizer_step")
                del loss, current_loss
    except Exception:  # noqa: BLE001 - the case's one-line failure goes back to the table
        return {"error": traceback.format_exc().strip().splitlines()[-1]}
    seen["weights"] = sum(
        size for key, size in tracker.sizes.items() if tracker.category[key] == "weights"
    )
    seen["versions"] = _versions()
    return seen


def _where(stack: list[Any]) -> str:
    """The innermost torchtune or torchao function on the stack, else torch's optimizer or
    autograd."""
    for marker in ("/torchtune/", "/torchao/", "torchtune_recipe"):
        for frame in reversed(stack):
            if marker in frame.filename:
                return f"{frame.name} ({Path(frame.filename).name}:{frame.lineno})"
    for frame in reversed(stack):
        if "/torch/optim/" in frame.filename:
            return f"optimizer {frame.name}"
        if "/torch/autograd/" in frame.filename or "/torch/utils/checkpoint" in frame.filename:
            return f"torch {frame.name} ({Path(frame.filename).name}:{frame.lineno})"
    return "?"


def _recipe_class(module: str, name: str) -> Any:
    """A recipe's class, from the `recipes` folder torchtune's wheel installs (its
    `__init__` refuses imports: the file is loaded by path)."""
    import importlib.util

    import torchtune

    path = Path(torchtune.__file__).parent.parent / "recipes" / f"{module}.py"
    spec = importlib.util.spec_from_file_location(f"torchtune_recipe_{module}", path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return getattr(loaded, name)


def _versions() -> str:
    from importlib.metadata import version

    return ", ".join(f"{name} {version(name)}" for name in ("torch", "torchao", "torchtune"))


class _Nothing:
    """A CUDA stream or event on the CPU: the copies it would order are synchronous here."""

    def wait_event(self, *_: Any) -> None:
        return None

    def wait_stream(self, *_: Any) -> None:
        return None

    def record_event(self, *_: Any) -> _Nothing:
        return self


def _cuda_stand_ins() -> None:
    """Streams and events for torchtune's OffloadActivations, which makes them in __init__."""
    import contextlib

    import torch

    torch.cuda.default_stream = lambda *a, **k: _Nothing()  # type: ignore[assignment]
    torch.cuda.Stream = lambda *a, **k: _Nothing()  # type: ignore[assignment,misc]
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]


def _host_copies(tracker: Any, weakref: Any) -> None:
    """`empty_like(x, pin_memory=..., device="cpu")` makes the offloaded copy: host memory,
    left out of the tracker; `.to("cuda")` of such a copy brings it back: a counted clone."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    empty_like = torch.empty_like

    class HostCopy(torch.Tensor):
        def to(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            if args and str(args[0]).startswith("cuda"):
                plain = self.as_subclass(torch.Tensor)
                return plain.clone()
            return super().to(*args, **kwargs)

    def host_empty_like(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if "pin_memory" not in kwargs:
            return empty_like(tensor, *args, **kwargs)
        kwargs.pop("pin_memory")
        with _disable_current_modes():
            made = empty_like(tensor, *args, **kwargs)
        storage = made.untyped_storage()
        pointer = storage.data_ptr()
        tracker.host.add(pointer)
        weakref.finalize(storage, tracker.host.discard, pointer)
        return made.as_subclass(HostCopy)

    torch.empty_like = host_empty_like  # type: ignore[assignment]


# -- on this side: the environment, llmmem's figures, the table ---------------------------------


def environment() -> Path:
    """The Python of the environment with torchtune, made on first use."""
    python = ENV / "bin" / "python"
    marker = ENV / "releases.txt"
    wanted = "\n".join(RELEASES)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"making {ENV} with {', '.join(RELEASES)} ...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(ENV)
    subprocess.run([str(python), "-m", "pip", "install", "-q", RELEASES[0]], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *RELEASES[1:]], check=True)
    marker.write_text(wanted)
    return python


def measure(
    python: Path, yaml_text: str, detail: bool, ranks: int = 1, root_kept: bool = False
) -> dict[str, Any]:
    payload = {"yaml": yaml_text, "detail": detail, "root_kept": root_kept}
    env = {**os.environ, "PYTHONPATH": str(REPO / "analyzer"), "TOKENIZERS_PARALLELISM": "false"}
    if ranks > 1:
        return measure_ranks(python, payload, env, ranks)
    done = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--run-case", json.dumps(payload)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:200]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def measure_ranks(
    python: Path, payload: dict[str, Any], env: dict[str, str], ranks: int
) -> dict[str, Any]:
    """The distributed recipe's step on `ranks` CPU ranks; per phase the largest rank's peak
    (the budget sizes one device), with the ranks' spread kept."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        (out / "payload.json").write_text(json.dumps(payload))
        done = subprocess.run(
            [
                str(python),
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                str(ranks),
                "--master-port",
                str(29500 + os.getpid() % 1000),
                str(HERE / "torchtune_fsdp_rank.py"),
                str(out),
                str(out / "payload.json"),
            ],
            capture_output=True,
            text=True,
            env={**env, "OMP_NUM_THREADS": "1"},
            timeout=3600,
            check=False,
        )
        found = [out / f"rank{rank}.json" for rank in range(ranks)]
        if done.returncode != 0 or not all(path.exists() for path in found):
            errors = [line for line in done.stderr.splitlines() if "Error" in line]
            return {"error": (errors[-1:] or ["the ranks wrote nothing"])[0][:200]}
        each = [json.loads(path.read_text()) for path in found]
    result: dict[str, Any] = {}
    for phase in ("forward", "backward", "optimizer_step"):
        peaks = [rank[phase] for rank in each]
        top = max(range(ranks), key=lambda rank: peaks[rank])
        result[phase] = peaks[top]
        result[phase + " spread"] = max(peaks) - min(peaks)
        for key in ("where", "live"):
            if phase + " " + key in each[top]:
                result[phase + " " + key] = each[top][phase + " " + key]
    result["versions"] = each[0]["versions"]
    return result


def budget(python: Path, yaml_path: Path, torch_release: str | None = None) -> dict[str, Any]:
    """llmmem's phases for the YAML, as `llmmem explain FILE --format json` gives them: the
    releases read from the environment, or with `torch_release` from a requirements file
    beside the YAML that pins it (and the environment's torchtune and torchao)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "analyzer"), "LLMMEM_RUN_ENV": str(python)}
    if torch_release is not None:
        del env["LLMMEM_RUN_ENV"]
        pins = [f"torch=={torch_release}", *RELEASES[1:]]
        (yaml_path.parent / "requirements.txt").write_text("\n".join(pins) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", str(yaml_path), "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=yaml_path.parent,
        check=False,
    )
    if not done.stdout.strip():
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:200]}
    report = json.loads(done.stdout)
    if not report.get("budget"):
        return {"error": "; ".join(report.get("problems") or ["no budget"])[:200]}
    phases = report["budget"]["phases"]
    return {
        name: phases[name]["allocated_bytes"] for name in ("forward", "backward", "optimizer_step")
    } | {name + " moment": phases[name]["moment"] for name in phases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--shape", help="batch x tokens (default 2x256)")
    parser.add_argument("--detail", action="store_true", help="the storages alive at each peak")
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_case:
        print(json.dumps(run_case(json.loads(args.run_case))))
        return 0
    try:
        batch, seq = (int(x) for x in (args.shape or "2x256").lower().split("x"))
    except ValueError:
        parser.error(f"--shape wants BATCHxTOKENS, e.g. 2x256, got {args.shape!r}")
    if batch < 1 or seq < 8 or seq % 8:
        parser.error(f"--shape {args.shape}: at least 1 row, tokens a multiple of 8")
    python = environment()
    names = args.case or list(CASES)
    versions = ""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        config_path = Path(folder) / "config.json"
        config_path.write_text(json.dumps(hf_config(args.size)))
        for name in names:
            text = case_yaml(name, args.size, batch, seq, str(config_path))
            yaml_path = Path(folder) / (name.replace(" ", "_") + ".yaml")
            yaml_path.write_text(text)
            kept = name.endswith("root kept")
            got = measure(python, text, args.detail, CASES[name][5], root_kept=kept)
            want = budget(python, yaml_path, ROOT_KEPT_TORCH if kept else None)
            (Path(folder) / "requirements.txt").unlink(missing_ok=True)
            versions = got.get("versions", versions)
            rows.append((name, got, want))
    print(
        f"torchtune's step on the CPU against llmmem's budget, {args.size} Llama 3.1 "
        f"({SIZES[args.size]['num_layers']} blocks, h {SIZES[args.size]['embed_dim']}, "
        f"V {SIZES[args.size]['vocab_size']}), {batch} x {seq} tokens, bf16 ({versions}); MiB"
    )
    print(
        f"{'case':26} {'forward':>8} {'llmmem':>8} {'err':>6}  {'backward':>8} {'llmmem':>8} "
        f"{'err':>6}  {'step':>8} {'llmmem':>8} {'err':>6}"
    )
    for name, got, want in rows:
        if "error" in got or "error" in want:
            print(f"{name:26} failed: {got.get('error') or want.get('error')}")
            continue
        cells = []
        for phase in ("forward", "backward", "optimizer_step"):
            error = 100 * (want[phase] - got[phase]) / got[phase]
            cells.append(f"{got[phase] / 2**20:8.2f} {want[phase] / 2**20:8.2f} {error:+5.1f}%")
        print(f"{name:26} {'  '.join(cells)}")
        if args.detail:
            for phase in ("forward", "backward", "optimizer_step"):
                print(
                    f"    {phase}: torchtune at {got.get(phase + ' where')}; llmmem at "
                    f"'{want.get(phase + ' moment')}'"
                )
                print(f"      alive: {', '.join(got.get(phase + ' live', []))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

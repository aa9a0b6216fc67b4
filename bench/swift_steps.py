"""The budget against ms-swift's own `swift sft` step, run on the CPU.

`llmmem estimate --framework swift` sizes ms-swift's stack (llmmem.budget.stacks.swift). This
runs ms-swift's own SFT pipeline on the CPU under llmmem's StorageTracker: `SftArguments` with
its defaults (the model's dtype from its config.json and the mixed precision swift sets from it,
arguments/base_args/model_args.py:130-142: bf16 weights under `bf16=True`, fp32 weights under
`fp16=True`; LoRA r 8, alpha 32, dropout 0.05 on all-linear, peft's adapter dtype; AdamW
`adamw_torch_fused`; non-reentrant or reentrant checkpointing as `_fix_gradient_checkpointing`
patches it), then `SwiftSft(args).run()`: swift's model loading, its template and dataset
encoding, `prepare_model` (its LoRA tuner), its Seq2SeqTrainer with its `compute_loss`,
`use_logits_to_keep` and token accuracy. Only three things are set beside swift's defaults:
`use_cpu` (the HF Trainer refuses bf16 on a CPU without it), `gradient_accumulation_steps` 1
(swift picks 16 / batch where not given) and `check_model` off (it asks the hub).

The model is a tiny Llama built from a config in a temp folder (no hub), with a word-level
tokenizer; every row is a one-word question and a 600-word answer, cut to `max_length` tokens
(`truncation_strategy right`), so every row has exactly that many. swift keeps the logits from
the first labelled position on (`prepare_logits_to_keep`, trainers/mixin.py:1271-1296): the
template's prompt (`default`: a few words) is masked, so a few positions fewer than the budget
counts (it has no prompt length to go on).

Two steps run; the second one's peaks are compared with `llmmem estimate --framework swift` of
the same settings: from `on_step_begin` to where swift's `compute_loss` returns (forward, loss,
token accuracy), from there to `on_pre_optimizer_step` (backward and gradient clipping), and
from there to `on_step_end` (the optimizer step). Beside them (`file`), the worst phase of
`llmmem explain` on the case written as a `swift sft` command line (swift's defaults as the
reader reads them, `--torch_dtype` said).

Two CPU stand-ins make the step the one a GPU runs, which the budget sizes:
- dropout is `torch.native_dropout` (a bool mask): on the CPU `F.dropout` multiplies by a mask in
  the input's dtype (ATen's fused kernel is CUDA's only), 4 B a value of each adapted input;
- the `fp16` cases turn on accelerate's fp16 autocast and a GradScaler over the fp32 weights, as
  off the CPU; on the CPU accelerate leaves fp16 mixed precision out (accelerator.py:535-548) and
  the step runs in fp32: the `fp32` cases run that step, against `--precision fp32`.

A tiny Llama (2 blocks, h 256, 8 query and 2 K/V heads, MLP 768, vocabulary 4096), 2 x 256
tokens, ms-swift 4.6.0 (torch 2.13.0+cpu, transformers 5.19.0, peft 0.20.0, bitsandbytes
0.50.2), swift's defaults (LoRA r 8, alpha 32, dropout 0.05, all-linear, adamw_torch_fused),
MiB, swift's step / llmmem's budget and the error (`lora_dtype bf16`: bf16 weights with
`--lora_dtype bfloat16`, bf16 adapters; `lora_dtype fp16`: the fp16 case with `--lora_dtype
float16`, whose adapters swift casts to fp32, pipelines/train/tuner.py:403-407; `qlora`: the
LoRA case with `--quant_method bnb --quant_bits 4`). Printed by `python bench/swift_steps.py
--env /work/venvs/swift` on 2026-12-06:

    case                              forward             backward       optimizer step   file
    lora bf16 ckpt        28.49/28.74   +0.9%  31.95/32.74   +2.5%   8.05/8.03    -0.1%  +2.5%
    lora bf16             41.76/42.89   +2.7%  45.35/46.89   +3.4%   8.05/8.03    -0.1%  +3.4%
    full bf16 ckpt        41.73/42.13   +1.0%  45.33/46.13   +1.8%  27.52/27.51   -0.0%  +1.8%
    full bf16             52.51/52.91   +0.8%  56.11/56.91   +1.4%  27.52/27.51   -0.0%  +1.4%
    lora fp32 ckpt        32.15/32.12   -0.1%  39.36/40.12   +1.9%  14.92/14.91   -0.1%      -
    lora fp32             55.27/56.12   +1.5%  62.49/64.12   +2.6%  14.92/14.91   -0.1%      -
    full fp32 ckpt        59.77/59.76   -0.0%  66.98/67.76   +1.2%  55.03/55.02   -0.0%      -
    full fp32             79.31/79.30   -0.0%  86.52/87.30   +0.9%  55.03/55.02   -0.0%      -
    lora fp16 ckpt        38.15/38.12   -0.1%  41.36/42.12   +1.9%  14.92/14.91   -0.1%  +1.9%
    lora fp16             53.61/54.45   +1.6%  56.95/58.45   +2.6%  14.92/14.91   -0.1%  +2.6%
    full fp16 ckpt        68.26/68.39   +0.2%  68.74/70.95   +3.2%  55.03/55.02   -0.0%  +3.2%
    full fp16             81.05/81.17   +0.1%  84.40/85.17   +0.9%  55.03/55.02   -0.0%  +0.9%
    lora_dtype bf16 ckpt  27.91/28.31   +1.4%  31.51/32.31   +2.5%   7.47/7.46    -0.2%  +2.5%
    lora_dtype bf16       41.18/42.45   +3.1%  44.78/46.45   +3.7%   7.47/7.46    -0.2%  +3.7%
    lora_dtype fp16 ckpt  38.15/38.12   -0.1%  41.36/42.12   +1.9%  14.92/14.91   -0.1%  +1.9%
    qlora bf16 ckpt       26.37/26.99   +2.3%  29.83/30.99   +3.9%   5.93/5.90    -0.4% +67.1%
    qlora bf16            39.64/41.13   +3.7%  43.23/45.13   +4.4%   5.93/5.90    -0.4% +67.1%
    qlora fp16 ckpt       33.16/33.49   +1.0%  36.36/37.49   +3.1%   9.93/9.90    -0.3%  +3.1%

Every phase of the budget within 4.4%. QLoRA runs on the CPU: bitsandbytes 0.50.2 has a CPU
backend for its 4-bit layers (`quantize_4bit` at load, the 4-bit matmul dequantizing to the
input's dtype), so the step is swift's own, through transformers' bitsandbytes quantizer (nf4,
double quantization, the compute dtype bf16 for the bf16 checkpoint and fp32 for the fp32 one);
each 4-bit weight's quant state (absmax and its double-quantization state) is counted with the
weights. bitsandbytes is not one of ms-swift's requirements: the environment adds it.

What each gap was, or is:
- the file road read full fine-tuning's optimizer step +25% (34.39 MiB against 27.52) while the
  `swift sft` reader took foreach AdamW for swift's default; swift sets no `optim`, so HF's
  TrainingArguments default steps (adamw_torch_fused on these releases).
- the backward's +0.78 MiB in every case (+1% to +4%) is swift's `use_logits_to_keep`: the
  logits start at the first labelled position (247 of 256 here), which the budget cannot know.
- QLoRA's +0.38 MiB beyond that, at the loss and the start of backward, is the HF budget's one
  dequantized 4-bit weight (the largest Linear, 768 x 256 in 16 bits), which this step does
  not hold there (the dequantized weight is a temporary of each matmul).
- `qlora fp16 ckpt` read -5.0% at the loss while the budget counted autocast's 16-bit cast of
  the head only for a head prepared to fp32: swift prepares nothing but loads an fp32
  checkpoint's head in fp32, and under fp16 autocast the head's matmul keeps that cast until
  its backward (2 MiB; budget.stacks.swift `weight_copies`).
- the QLoRA cases over the bf16 checkpoint read +67.1% on the file road: the `swift sft`
  reader leaves `bnb_4bit_compute_dtype` to BitsAndBytesConfig's default (fp32) where swift
  takes it from `--torch_dtype` (quant_args.py:116-121), and the budget then loads the
  embeddings and head in fp32 with an fp32 residual stream. `estimate --quant-compute-dtype
  bf16` (the bench's column) is swift's step; the reader is not fixed yet.
- before the dropout stand-in, LoRA without checkpointing read -8% to -14% (the CPU's mask).

The environment with ms-swift is made outside the repository on first use (`--env`, default
~/.cache/llmmem/bench-swift); llmmem never imports swift: each case runs in a subprocess under
that environment's Python, with llmmem's tracker on PYTHONPATH.

    python bench/swift_steps.py [--case NAME ...] [--shape BxT] [--env DIR] [--detail]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback
import venv
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_ENV = Path.home() / ".cache" / "llmmem" / "bench-swift"
# torch first, pinned, so that ms-swift's requirements pull no CUDA build; bitsandbytes for the
# QLoRA cases (0.50.2 runs its 4-bit layers on the CPU; ms-swift does not require it)
RELEASES = ["torch==2.13.0", "ms-swift==4.6.0", "bitsandbytes==0.50.2"]
RESULT = "swift-steps-result: "

# a tiny Llama (grouped K/V heads)
DIMS = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}


def _case(
    tuner: str,
    dtype: str,
    ckpt: bool,
    fp16: bool = False,
    lora_dtype: str = "",
    quant: bool = False,
) -> dict[str, Any]:
    """swift's settings of a case: `tuner_type`, the config's `torch_dtype`, checkpointing,
    `lora_dtype` (empty: swift's default, None); fp16: accelerate's fp16 autocast and
    GradScaler as off the CPU, over fp32 weights (swift's fp16=True for them); quant:
    `--quant_method bnb --quant_bits 4` (swift's nf4, double quantization, the compute dtype
    from `torch_dtype`: arguments/base_args/quant_args.py:40-43, :116-121)."""
    return {
        "tuner": tuner,
        "dtype": dtype,
        "ckpt": ckpt,
        "fp16": fp16,
        "lora_dtype": lora_dtype,
        "quant": quant,
    }


CASES: dict[str, dict[str, Any]] = {
    "lora bf16 ckpt": _case("lora", "bfloat16", True),
    "lora bf16": _case("lora", "bfloat16", False),
    "full bf16 ckpt": _case("full", "bfloat16", True),
    "full bf16": _case("full", "bfloat16", False),
    "lora fp32 ckpt": _case("lora", "float32", True),
    "lora fp32": _case("lora", "float32", False),
    "full fp32 ckpt": _case("full", "float32", True),
    "full fp32": _case("full", "float32", False),
    "lora fp16 ckpt": _case("lora", "float32", True, fp16=True),
    "lora fp16": _case("lora", "float32", False, fp16=True),
    "full fp16 ckpt": _case("full", "float32", True, fp16=True),
    "full fp16": _case("full", "float32", False, fp16=True),
    "lora_dtype bf16 ckpt": _case("lora", "bfloat16", True, lora_dtype="bfloat16"),
    "lora_dtype bf16": _case("lora", "bfloat16", False, lora_dtype="bfloat16"),
    "lora_dtype fp16 ckpt": _case("lora", "float32", True, True, "float16"),
    "qlora bf16 ckpt": _case("lora", "bfloat16", True, quant=True),
    "qlora bf16": _case("lora", "bfloat16", False, quant=True),
    "qlora fp16 ckpt": _case("lora", "float32", True, fp16=True, quant=True),
}
PHASES = ("forward", "backward", "optimizer_step")


def hf_config(dtype: str) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": dtype,
        **DIMS,
    }


# -- inside the ms-swift environment ------------------------------------------------------------


def _word(i: int) -> str:
    """The i-th word: letters only (a word-level tokenizer keeps it whole)."""
    return "w" + "".join(chr(97 + (i // 26**k) % 26) for k in range(3))


def _model_folder(dtype: str) -> str:
    """A tiny Llama saved from its config, a word-level tokenizer and the rows, in a temp folder."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    folder = tempfile.mkdtemp()
    config = hf_config(dtype)
    config.pop("architectures")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    vocab = DIMS["vocab_size"]
    tokens = Tokenizer(models.WordLevel({_word(i): i for i in range(vocab)}, unk_token=_word(1)))
    tokens.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tokens,
        pad_token=_word(0),
        unk_token=_word(1),
        eos_token=_word(2),
        bos_token=_word(3),
    ).save_pretrained(folder)
    with open(os.path.join(folder, "train.jsonl"), "w") as rows:
        for r in range(16):
            answer = " ".join(_word(8 + (7 * r + i) % (vocab - 8)) for i in range(600))
            messages = [
                {"role": "user", "content": _word(8 + r)},
                {"role": "assistant", "content": answer},
            ]
            rows.write(json.dumps({"messages": messages}) + "\n")
    return folder


def _where(stack: list[Any]) -> str:
    """The innermost swift function on the stack, else peft's or transformers', else torch's."""
    for name in ("swift", "peft", "transformers"):
        for frame in reversed(stack):
            if f"site-packages/{name}/" in frame.filename:
                return f"{frame.name} ({name} {frame.lineno})"
    for frame in reversed(stack):
        if "site-packages/torch/" in frame.filename:
            return f"torch {frame.name}"
    return ""


def run_case(payload: dict[str, Any]) -> dict[str, Any]:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)

    import torch
    from swift.arguments import SftArguments
    from swift.pipelines.train.sft import SwiftSft
    from transformers import TrainerCallback

    from llmmem.verify.tracker import StorageTracker

    tuner, dtype, ckpt = payload["tuner"], payload["dtype"], payload["ckpt"]
    detail = bool(payload.get("detail"))
    _gpu_dropout(torch)
    if payload.get("fp16"):
        _fp16_autocast_on_the_cpu(torch)

    class PeakTracker(StorageTracker):
        armed = False
        where = ""
        live: list[str] = []

        def _note_peak(self) -> None:
            before = self.peak
            super()._note_peak()
            if self.armed and self.peak > before:
                self.where = _where(traceback.extract_stack())
                if detail:
                    sizes = sorted((s for s in self.sizes.values() if s >= 2**18), reverse=True)
                    self.live = [f"{s / 2**20:.2f}" for s in sizes]

    tracker = PeakTracker()
    seen: dict[str, Any] = {}

    def note(phase: str) -> None:
        if tracker.armed:
            seen[phase] = tracker.peak
            seen[phase + " where"] = tracker.where
            if detail:
                seen[phase + " live"] = tracker.live

    def restart(category: str, where: str) -> None:
        tracker.reset_peak(category)
        tracker.where, tracker.live = where, []

    class Peak(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # weights read from a file are memory-mapped, not made by an op: count them
            model = kw["model"]
            for tensor in [*model.parameters(), *model.buffers()]:
                tracker.track(tensor, "weights")
            # a 4-bit weight's quant state (absmax, its own double-quantization state) is no
            # parameter: bitsandbytes keeps it on the Params4bit
            for module in model.modules():
                state = getattr(getattr(module, "weight", None), "quant_state", None)
                for part in (state, getattr(state, "state2", None)):
                    for name in ("absmax", "code", "offset"):
                        tensor = getattr(part, name, None)
                        if isinstance(tensor, torch.Tensor):
                            tracker.track(tensor, "weights")

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            tracker.armed = state.global_step == 1
            restart("activations", "forward")

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            note("backward")
            restart("temporaries", "optimizer step")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            note("optimizer_step")
            tracker.armed = False

    class MeasuredSft(SwiftSft):  # type: ignore[misc]
        def train(self, trainer: Any) -> Any:
            trainer.add_callback(Peak())
            compute_loss = trainer.compute_loss

            def loss(model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
                kept = inputs.get("logits_to_keep")
                if tracker.armed:
                    seen["logits_kept"] = kept if isinstance(kept, int) else None
                    seen["rows"] = list(inputs["input_ids"].shape)
                out = compute_loss(model, inputs, *a, **kw)
                note("forward")
                restart("temporaries", "backward")
                return out

            trainer.compute_loss = loss
            seen["trainable_dtypes"] = sorted(
                {str(p.dtype) for p in trainer.model.parameters() if p.requires_grad}
            )
            seen["frozen_dtypes"] = sorted(
                {str(p.dtype) for p in trainer.model.parameters() if not p.requires_grad}
            )
            seen["optim"] = str(trainer.args.optim)
            with tracker:
                return super().train(trainer)

    try:
        folder = _model_folder(dtype)
        args = SftArguments(
            model=folder,
            model_type="llama",
            template="default",
            dataset=[os.path.join(folder, "train.jsonl")],
            tuner_type=tuner,
            gradient_checkpointing=ckpt,
            max_length=payload["seq"],
            truncation_strategy="right",
            per_device_train_batch_size=payload["batch"],
            gradient_accumulation_steps=1,
            max_steps=2,
            use_cpu=True,
            check_model=False,
            output_dir=tempfile.mkdtemp(),
            report_to=["none"],
            save_strategy="no",
            eval_strategy="no",
            split_dataset_ratio=0.0,
            dataloader_num_workers=0,
            dataset_num_proc=1,
            logging_steps=100,
            lora_dtype=payload["lora_dtype"] or None,
            **({"quant_method": "bnb", "quant_bits": 4} if payload.get("quant") else {}),
        )
        seen["settings"] = {
            "torch_dtype": str(args.torch_dtype),
            "bf16": args.bf16,
            "fp16": args.fp16,
            "lora": [args.lora_rank, args.lora_alpha, args.lora_dropout, args.target_modules],
            "lora_dtype": str(args.lora_dtype),
            "quant": [
                args.quant_method,
                args.quant_bits,
                args.bnb_4bit_quant_type,
                args.bnb_4bit_use_double_quant,
                str(args.bnb_4bit_compute_dtype),
            ],
        }
        MeasuredSft(args).run()
    except Exception:  # noqa: BLE001 - the case's one-line failure goes back to the table
        return {"error": traceback.format_exc().strip().splitlines()[-1][:300]}
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("ms-swift", "torch", "transformers", "peft", "bitsandbytes"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    seen["versions"] = ", ".join(found)
    seen["reentrant"] = _reentrant_said()
    return seen


def _gpu_dropout(torch: Any) -> None:
    """Dropout as a GPU runs it: `torch.native_dropout`, which keeps a bool mask. On the CPU
    `F.dropout` multiplies by a mask in the input's dtype instead (ATen's Dropout.cpp takes the
    fused kernel on CUDA only): 4 B a value of each adapted input in fp32 where the GPU keeps 1."""
    functional = torch.nn.functional
    plain = functional.dropout

    def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and 0 < p < 1 and not inplace:
            return torch.native_dropout(input, p, True)[0]
        return plain(input, p, training, inplace)

    functional.dropout = dropout


def _fp16_autocast_on_the_cpu(torch: Any) -> None:
    """accelerate's fp16 mixed precision as it runs off the CPU: autocast to fp16 around the
    model's forward and a GradScaler (accelerator.py:535-554); on the CPU accelerate leaves
    both out and the step runs in fp32."""
    import accelerate

    made = accelerate.Accelerator.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        if self.state.mixed_precision == "fp16" and not self.native_amp:
            self.native_amp = True
            self.scaler = torch.amp.GradScaler("cpu")

    accelerate.Accelerator.__init__ = init


def _reentrant_said() -> Any:
    """The `use_reentrant` swift patched torch's checkpoint with (trainers/mixin.py:940-953)."""
    import torch.utils.checkpoint as checkpoint

    patched = getattr(checkpoint, "checkpoint", None)
    defaults = getattr(patched, "keywords", None) or {}
    return defaults.get("use_reentrant")


# -- on this side: the environment, llmmem's figures, the table ---------------------------------


def environment(env: Path) -> Path:
    """The Python of the environment with ms-swift, made on first use (outside the repository)."""
    python = env / "bin" / "python"
    wanted = {line.split("==")[0]: line.split("==")[1] for line in RELEASES}
    if python.exists():
        probe = "import importlib.metadata as m, json\nfound = {}\nfor n in %r:\n"
        probe += "    try:\n        found[n] = m.version(n)\n"
        probe += "    except m.PackageNotFoundError:\n        pass\nprint(json.dumps(found))"
        done = subprocess.run(
            [str(python), "-c", probe % list(wanted)], capture_output=True, text=True, check=False
        )
        try:
            found = json.loads(done.stdout)
        except ValueError:
            found = {}
        missing = [f"{k}=={v}" for k, v in wanted.items() if found.get(k, "").split("+")[0] != v]
        if not missing:
            return python
        if all(found.get(k, "").split("+")[0] == wanted[k] for k in ("torch", "ms-swift")):
            # an environment made before a pin was added: add what it lacks
            print(f"adding {', '.join(missing)} to {env} ...", file=sys.stderr)
            subprocess.run([str(python), "-m", "pip", "install", "-q", *missing], check=True)
            return python
    print(f"making {env} with {', '.join(RELEASES)} ...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    subprocess.run([str(python), "-m", "pip", "install", "-q", RELEASES[0]], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *RELEASES[1:]], check=True)
    return python


def measure(python: Path, payload: dict[str, Any]) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "analyzer"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    done = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--run-case", json.dumps(payload)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    found = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if not found:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:200]}
    result: dict[str, Any] = json.loads(found[-1][len(RESULT) :])
    return result


def estimate_flags(model_dir: Path, payload: dict[str, Any]) -> list[str]:
    """The `llmmem estimate` flags of swift's settings for the case."""
    # bf16 weights run under bf16 autocast; fp32 weights under swift's fp16=True run in fp32 on
    # the CPU: accelerate turns fp16 mixed precision on only off the CPU (accelerator.py:535-548)
    precision = "bf16-autocast" if payload["dtype"] == "bfloat16" else "fp32"
    if payload["fp16"]:
        precision = "fp16"  # fp16 autocast over the fp32 weights, as off the CPU
    flags = [
        "--model", str(model_dir), "--framework", "swift", "--method", payload["tuner"],
        "--batch", str(payload["batch"]), "--seq", str(payload["seq"]), "--grad-accum", "1",
        "--precision", precision, "--optim", "adamw_torch_fused",
        "--grad-ckpt" if payload["ckpt"] else "--no-grad-ckpt",
        "--versions", "transformers=5.19,torch=2.13", "--offline", "--format", "json",
    ]  # fmt: skip
    if payload.get("quant"):
        # swift's bnb defaults: nf4, double quantization, compute in the weights' 16-bit dtype
        # (fp32 under fp16 or fp32 weights), quant_args.py:40-43, :116-121
        compute = "bf16" if payload["dtype"] == "bfloat16" else "fp32"
        flags[flags.index("--method") + 1] = "qlora"
        flags += ["--quant", "nf4", "--double-quant", "--quant-compute-dtype", compute]
        flags[flags.index("--versions") + 1] += ",bitsandbytes=0.50.2"
    if payload["tuner"] == "lora":
        flags += ["--lora-r", "8", "--lora-alpha", "32", "--lora-targets", "all-linear"]
        flags += ["--lora-dropout", "0.05"]
        if payload["lora_dtype"]:
            adapter = {"bfloat16": "bf16", "float16": "fp16"}[payload["lora_dtype"]]
            flags += ["--adapter-dtype", adapter]
    return flags


def budget(model_dir: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """llmmem's phases for the same settings, as `llmmem estimate --framework swift` gives them."""
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "estimate", *estimate_flags(model_dir, payload)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "analyzer")},
        check=False,
    )
    if not done.stdout.strip():
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:200]}
    phases = json.loads(done.stdout)["phases"]
    return {name: phases[name]["allocated_bytes"] for name in PHASES} | {
        name + " moment": phases[name].get("moment") for name in PHASES
    }


def command_line(model_dir: Path, payload: dict[str, Any]) -> str:
    """The case as a `swift sft` command line (swift's defaults left out but the dtype)."""
    words = [
        "swift sft --model", str(model_dir), "--dataset train.jsonl",
        "--tuner_type", payload["tuner"], "--torch_dtype", payload["dtype"],
        "--max_length", str(payload["seq"]), "--per_device_train_batch_size", str(payload["batch"]),
        "--gradient_accumulation_steps 1", "--gradient_checkpointing", str(payload["ckpt"]).lower(),
    ]  # fmt: skip
    if payload["lora_dtype"]:
        words += ["--lora_dtype", payload["lora_dtype"]]
    if payload.get("quant"):
        words += ["--quant_method bnb --quant_bits 4"]
    return " ".join(words) + "\n"


def file_budget(model_dir: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """llmmem's phases for the case's `swift sft` command line, as `llmmem explain` reads it
    (fp32 weights read as fp16 mixed precision, as swift sets it off the CPU: None for the
    CPU's fp32 cases)."""
    if payload["dtype"] == "float32" and not payload["fp16"]:
        return {}
    script = model_dir / "train.sh"
    script.write_text(command_line(model_dir, payload))
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", str(script), "--format", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "analyzer")},
        cwd=model_dir,
        check=False,
    )
    try:
        phases = json.loads(done.stdout)["budget"]["phases"]
    except (ValueError, KeyError, TypeError):
        tail = done.stderr.strip().splitlines()[-1:] or ["no budget"]
        return {"error": tail[0][:200]}
    return {name: phases[name]["allocated_bytes"] for name in PHASES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--shape", default="2x256", help="batch x tokens (default 2x256)")
    parser.add_argument("--env", type=Path, default=DEFAULT_ENV, help="the ms-swift environment")
    parser.add_argument("--detail", action="store_true", help="where each peak was reached")
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_case:
        print(RESULT + json.dumps(run_case(json.loads(args.run_case))))
        return 0
    try:
        batch, seq = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        parser.error(f"--shape wants BATCHxTOKENS, e.g. 2x256, got {args.shape!r}")
    if batch < 1 or seq < 16:
        parser.error(f"--shape {args.shape}: at least 1 row of 16 tokens")
    python = environment(args.env)
    versions = ""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.case or list(CASES):
            payload = {**CASES[name], "batch": batch, "seq": seq, "detail": args.detail}
            dtype = payload["dtype"]
            model_dir = Path(folder) / dtype
            model_dir.mkdir(exist_ok=True)
            (model_dir / "config.json").write_text(json.dumps(hf_config(dtype)))
            got = measure(python, payload)
            want = budget(model_dir, payload)
            read = file_budget(model_dir, payload)
            versions = got.get("versions", versions)
            rows.append((name, got, want, read))
    print(
        f"ms-swift's sft step on the CPU against llmmem's budget, a tiny Llama "
        f"({DIMS['num_hidden_layers']} blocks, h {DIMS['hidden_size']}, V {DIMS['vocab_size']}), "
        f"{batch} x {seq} tokens ({versions}); MiB"
    )
    print(f"{'case':20} {'forward':>20} {'backward':>20} {'optimizer step':>20} {'file':>6}")
    for name, got, want, read in rows:
        if "error" in got or "error" in want or any(p not in got for p in PHASES):
            print(f"{name:20} failed: {got.get('error') or want.get('error') or 'no step'}")
            continue
        cells = []
        for phase in PHASES:
            error = 100 * (want[phase] - got[phase]) / got[phase]
            mine, theirs = f"{got[phase] / 2**20:.2f}", f"{want[phase] / 2**20:.2f}"
            cells.append(f"{mine:>6}/{theirs:<6} {error:+5.1f}%")
        worst = "-"
        if read.get("error"):
            worst = "failed"
        elif read:
            errors = [100 * (read[p] - got[p]) / got[p] for p in PHASES]
            worst = f"{max(errors, key=abs):+.1f}%"
        print(f"{name:20} {' '.join(cells)} {worst:>6}")
        if read.get("error"):
            print(f"    explain of the swift sft line failed: {read['error']}")
        if args.detail:
            print(f"    swift: {json.dumps(got.get('settings'))}, kept {got.get('logits_kept')}")
            print(f"    trainable {got.get('trainable_dtypes')}, frozen {got.get('frozen_dtypes')}")
            for phase in PHASES:
                print(
                    f"    {phase}: swift at {got.get(phase + ' where')}; llmmem at "
                    f"'{want.get(phase + ' moment')}'"
                )
                print(f"      alive (MiB): {', '.join(got.get(phase + ' live', []))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The budget against LitGPT's own `finetune lora` and `finetune full` steps, run on the CPU.

`llmmem estimate --framework litgpt` sizes LitGPT's own stack (llmmem.budget.stacks.litgpt). This
runs the pieces of LitGPT 0.4.0's `finetune lora` step on the CPU under llmmem's StorageTracker
and compares each phase with the budget of the same settings:

- the model: `litgpt.lora.GPT(Config(...))` built in bf16 as `fabric.init_module()` builds it
  under `precision: bf16-true` (finetune/lora.py:172-173), `mark_only_lora_as_trainable` (:174);
  QLoRA: Lightning's `BitsandbytesPrecision("nf4", torch.bfloat16).convert_module(model)`
  (finetune/lora.py:133, plugins/precision/bitsandbytes.py:103-121), every Linear the head's too,
  each weight then quantized as `_Linear4bit.quantize` does it (cast to fp16,
  `bnb.functional.quantize_4bit`), on the CPU instead of the GPU it insists on;
- the step as `fit` writes it (finetune/lora.py:287-297): `model(input_ids,
  lm_head_chunk_size=128)`, `logits[-1] = logits[-1][..., :-1, :]`, `chunked_cross_entropy`,
  `backward`, `optimizer.step()`, `optimizer.zero_grad()`; the optimizer torch's AdamW over the
  LoRA weights (`instantiate_torch_optimizer("AdamW", ...)`, utils.py:510-518), foreach as on a
  GPU.

Two steps run; the second one's forward, backward and optimizer-step peaks are compared with
`llmmem estimate --framework litgpt` for a Llama config of the same shapes.

    python bench/litgpt_steps.py [--case NAME ...] [--shape BxT]

A tiny Llama 3 (2 blocks, h 256, 8 query and 2 K/V heads, MLP 768, vocabulary 4096), LoRA r 8
on the query and value, 2 x 256 tokens, bf16-true (torch 2.13.0+cpu, litgpt 0.4.0, lightning
2.3.0.dev20240428, bitsandbytes 0.50.2), MiB, LitGPT's step / llmmem's budget:

    case            forward   llmmem    err  backward   llmmem    err      step   llmmem    err
    lora              26.89    27.25  +1.4%     28.90    29.27  +1.3%      7.27     7.25  -0.2%
    lora dropout      27.14    27.50  +1.3%     29.15    29.52  +1.3%      7.27     7.25  -0.2%
    qlora             23.38    23.76  +1.6%     25.41    25.76  +1.4%      3.76     3.75  -0.3%
    full              46.41    45.76  -1.4%     46.42    45.77  -1.4%     34.65    34.64  -0.0%

Every phase within 1.6%. `full` is `finetune full`'s step (finetune/full.py:132-139, :236-246):
`litgpt.model.GPT`, every parameter trained, `model(input_ids)` (the head not chunked) and
`chunked_cross_entropy(logits[..., :-1, :], ...)`. LitGPT drops the fused qkv's input once for all
its adapted parts (`after_A = F.linear(self.lora_dropout(x), self.lora_A)`, lora.py:421, one
`lora_A` of r x (q, v) rows, :233), and the block rule (budget.activations `consumers_save`) counts
one mask and one dropped copy for LitGPT's fused qkv (with one per adapted projection, as peft's
adapters each drop their own input, this case read +4.1%). The first block's dropout keeps no mask
(its input, from the frozen embeddings, needs no gradient); the second keeps the CPU's mask in bf16
(2 B a value; CUDA's fused kernel keeps a 1-byte bool).
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
ENV = HERE / ".litgpt"
# LitGPT 0.4.0 pins lightning 2.3.0.dev20240428; bitsandbytes 0.50.2 is the release that runs
# 4-bit layers on the CPU (LitGPT's 0.42.0 pin needs CUDA); lightning of that time imports
# pkg_resources (setuptools before 81)
RELEASES = ["torch==2.13.0", "litgpt==0.4.0", "bitsandbytes==0.50.2", "setuptools<81"]

# a tiny Llama 3 in LitGPT's terms (grouped K/V heads)
DIMS = {
    "n_layer": 2,
    "n_head": 8,
    "n_query_groups": 2,
    "n_embd": 256,
    "intermediate_size": 768,
    "vocab_size": 4096,
    "block_size": 1024,
}
# name -> (method, LoRA dropout)
CASES: dict[str, tuple[str, float]] = {
    "lora": ("lora", 0.0),
    "lora dropout": ("lora", 0.05),
    "qlora": ("qlora", 0.0),
    "full": ("full", 0.0),
}


def hf_config() -> dict[str, Any]:
    """The same model as transformers' LlamaConfig, which llmmem sizes (untied: LitGPT ties
    nothing either way)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": DIMS["vocab_size"],
        "hidden_size": DIMS["n_embd"],
        "intermediate_size": DIMS["intermediate_size"],
        "num_hidden_layers": DIMS["n_layer"],
        "num_attention_heads": DIMS["n_head"],
        "num_key_value_heads": DIMS["n_query_groups"],
        "max_position_embeddings": DIMS["block_size"],
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }


# -- inside the LitGPT environment --------------------------------------------------------------


def run_case(payload: dict[str, Any]) -> dict[str, Any]:
    import traceback

    import torch
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    from litgpt.utils import chunked_cross_entropy

    from llmmem.verify.tracker import StorageTracker

    method, dropout = payload["method"], payload["dropout"]
    quantize, full = method == "qlora", method == "full"
    batch, seq = payload["batch"], payload["seq"]
    config = Config(
        name="tiny-llama3",
        padded_vocab_size=DIMS["vocab_size"],
        bias=False,
        norm_class_name="RMSNorm",
        norm_eps=1e-5,
        mlp_class_name="LLaMAMLP",
        rotary_percentage=1.0,
        parallel_residual=False,
        lora_r=8,
        lora_alpha=16,
        lora_dropout=dropout,
        lora_query=True,
        lora_value=True,
        **DIMS,
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    if full:
        # finetune/full.py:132-133: litgpt.model.GPT, every parameter trained
        from litgpt.model import GPT as FullGPT

        model = FullGPT(config)
    else:
        model = GPT(config)
    torch.set_default_dtype(torch.float32)
    if not full:
        mark_only_lora_as_trainable(model)
    if quantize:
        _quantize_on_the_cpu(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
    tracker = StorageTracker()
    seen: dict[str, Any] = {}
    try:
        with tracker:
            for tensor in [*model.parameters(), *model.buffers()]:
                tracker.track(tensor, "weights")
            for module in model.modules():
                state = getattr(getattr(module, "weight", None), "quant_state", None)
                if state is not None:
                    tracker.track(state.absmax, "weights")
            for measured in (False, True):
                input_ids = torch.randint(0, DIMS["vocab_size"], (batch, seq))
                targets = input_ids.clone()
                tracker.reset_peak("activations")
                if full:
                    # finetune/full.py:237-239: whole logits, the loss chunked
                    logits = model(input_ids)
                    loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
                else:
                    # finetune/lora.py:287-290
                    logits = model(input_ids, lm_head_chunk_size=128)
                    logits[-1] = logits[-1][..., :-1, :]
                    loss = chunked_cross_entropy(logits, targets[..., 1:])
                if measured:
                    seen["forward"] = tracker.peak
                tracker.reset_peak("temporaries")
                loss.backward()
                del logits
                if measured:
                    seen["backward"] = tracker.peak
                tracker.reset_peak("temporaries")
                optimizer.step()
                optimizer.zero_grad()
                if measured:
                    seen["optimizer_step"] = tracker.peak
                del loss
    except Exception:  # noqa: BLE001 - the case's one-line failure goes back to the table
        return {"error": traceback.format_exc().strip().splitlines()[-1]}
    from importlib.metadata import version

    seen["versions"] = ", ".join(
        f"{name} {version(name)}" for name in ("torch", "litgpt", "lightning", "bitsandbytes")
    )
    return seen


def _quantize_on_the_cpu(model: Any) -> None:
    """Lightning's plugin: every Linear becomes its `_NF4Linear`, each weight cast to fp16 and
    quantized (plugins/precision/bitsandbytes.py:103-121, :316-341), here on the CPU."""
    import bitsandbytes as bnb
    import torch
    from lightning.fabric.plugins import BitsandbytesPrecision
    from lightning.fabric.plugins.precision import bitsandbytes as plugin

    BitsandbytesPrecision("nf4", torch.bfloat16).convert_module(model)
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            weight = module.weight.data.contiguous().to(dtype=torch.half)
            packed, state = bnb.functional.quantize_4bit(
                weight,
                blocksize=module.weight.blocksize,
                compress_statistics=module.weight.compress_statistics,
                quant_type=module.weight.quant_type,
            )
            module.weight = plugin._replace_param(module.weight, packed, state)
            module.weight.requires_grad_(False)


# -- on this side: the environment, llmmem's figures, the table ---------------------------------


def environment() -> Path:
    """The Python of the environment with LitGPT, made on first use (git ignores it)."""
    python = ENV / "bin" / "python"
    marker = ENV / "releases.txt"
    wanted = "\n".join(RELEASES)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"making {ENV} with {', '.join(RELEASES)} ...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(ENV)
    (ENV / ".gitignore").write_text("*\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", RELEASES[0]], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *RELEASES[1:]], check=True)
    marker.write_text(wanted)
    return python


def measure(python: Path, payload: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "analyzer")}
    done = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--run-case", json.dumps(payload)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:200]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def budget(model_dir: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """llmmem's phases for the same settings, as `llmmem estimate --framework litgpt` gives them."""
    flags = [
        "--model", str(model_dir), "--framework", "litgpt", "--method", payload["method"],
        "--batch", str(payload["batch"]), "--seq", str(payload["seq"]),
        "--precision", "bf16-true", "--optim", "adamw_torch", "--offline", "--format", "json",
    ]  # fmt: skip
    if payload["method"] != "full":
        flags += ["--lora-r", "8", "--lora-alpha", "16", "--lora-targets", "q_proj,v_proj"]
    if payload["method"] != "full":  # the case's own (LitGPT's default is 0.05)
        flags += ["--lora-dropout", str(payload["dropout"] or 0)]
    if payload["method"] == "qlora":
        flags += ["--quant", "nf4", "--versions", "bitsandbytes=0.50"]
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "estimate", *flags],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "analyzer")},
        check=False,
    )
    if not done.stdout.strip():
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:200]}
    report = json.loads(done.stdout)
    phases = report["phases"]
    return {name: phases[name]["allocated_bytes"] for name in phases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--shape", default="2x256", help="batch x tokens (default 2x256)")
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_case:
        print(json.dumps(run_case(json.loads(args.run_case))))
        return 0
    try:
        batch, seq = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        parser.error(f"--shape wants BATCHxTOKENS, e.g. 2x256, got {args.shape!r}")
    if batch < 1 or seq < 2:
        parser.error(f"--shape {args.shape}: at least 1 row of 2 tokens")
    python = environment()
    versions = ""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model_dir = Path(folder) / "tiny-llama3"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(hf_config()))
        for name in args.case or list(CASES):
            method, dropout = CASES[name]
            payload = {"method": method, "dropout": dropout, "batch": batch, "seq": seq}
            got = measure(python, payload)
            want = budget(model_dir, payload)
            versions = got.get("versions", versions)
            rows.append((name, got, want))
    print(
        f"LitGPT's finetune lora and full steps on the CPU against llmmem's budget, a tiny "
        f"Llama 3 ({DIMS['n_layer']} blocks, h {DIMS['n_embd']}, V {DIMS['vocab_size']}), "
        f"{batch} x {seq} tokens, bf16-true ({versions}); MiB"
    )
    print(
        f"{'case':14} {'forward':>8} {'llmmem':>8} {'err':>6}  {'backward':>8} {'llmmem':>8} "
        f"{'err':>6}  {'step':>8} {'llmmem':>8} {'err':>6}"
    )
    for name, got, want in rows:
        if "error" in got or "error" in want:
            print(f"{name:14} failed: {got.get('error') or want.get('error')}")
            continue
        cells = []
        for phase in ("forward", "backward", "optimizer_step"):
            error = 100 * (want[phase] - got[phase]) / got[phase]
            cells.append(f"{got[phase] / 2**20:8.2f} {want[phase] / 2**20:8.2f} {error:+5.1f}%")
        print(f"{name:14} {'  '.join(cells)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What torch.compile saves for backward, against eager and against checkpointing, on the CPU.

`llmmem estimate --compile` keeps the eager step as the estimate and lets the band reach down
to the step under gradient checkpointing: AOTAutograd's partitioner recomputes cheap ops in
backward instead of saving their outputs, so a compiled step should save no more than eager
and no less than the blocks' inputs. This measures where it lands on real steps: the bytes
of distinct storages autograd saves in one forward (parameters left out), for the same tiny
model and batch in eager mode, eager under gradient checkpointing, and compiled (inductor on
the CPU, torch 2.13, transformers 5.24). A GPU compiles other kernels; which tensors the
partitioner saves is decided before that, on the same graph.

    python bench/compile_saved.py [--family llama|qwen2 ...] [--shape BxS]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from llmmem.verify.grid import config_for


def saved_bytes(model: Any, batch: dict[str, Any]) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one forward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(seen.values())


def build(family: str) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(config_for(family, "small"))
    model_type = config.pop("model_type")
    config.pop("architectures", None)
    hf = AutoConfig.for_model(model_type, **config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf, attn_implementation="sdpa")
    model.train()
    return model


def measure(family: str, batch: int, seq: int) -> dict[str, float]:
    """Saved bytes of eager, eager under checkpointing, and compiled steps (and compile time)."""
    model = build(family)
    ids = torch.randint(3, model.config.vocab_size, (batch, seq))
    inputs = {"input_ids": ids, "labels": ids, "use_cache": False}
    eager = saved_bytes(model, inputs)
    model.gradient_checkpointing_enable()
    checkpointed = saved_bytes(model, inputs)
    model.gradient_checkpointing_disable()
    compiled_model = torch.compile(model)
    started = time.monotonic()
    saved_bytes(compiled_model, inputs)  # the first call compiles
    seconds = time.monotonic() - started
    compiled = saved_bytes(compiled_model, inputs)
    return {
        "eager": eager,
        "checkpointed": checkpointed,
        "compiled": compiled,
        "compile_s": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=["llama", "qwen2"])
    parser.add_argument("--shape", default="4x256", help="micro-batch x tokens (default 4x256)")
    args = parser.parse_args(argv)
    try:
        batch, seq = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        parser.error(f"--shape wants BxS, e.g. 4x256, got {args.shape!r}")
    print(f"{'family':8} {'eager':>10} {'checkpointed':>13} {'compiled':>10} {'vs eager':>9}")
    for family in args.family or ["llama", "qwen2"]:
        got = measure(family, batch, seq)
        mib = {k: v / 2**20 for k, v in got.items() if k != "compile_s"}
        change = 100 * (got["compiled"] - got["eager"]) / got["eager"]
        print(
            f"{family:8} {mib['eager']:8.1f} MiB {mib['checkpointed']:9.1f} MiB "
            f"{mib['compiled']:6.1f} MiB {change:+8.1f}%  (compiled in {got['compile_s']:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

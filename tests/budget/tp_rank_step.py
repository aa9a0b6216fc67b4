"""One rank of a tensor-parallel step (run under torchrun over gloo): a tiny Llama whose blocks
are split by transformers' own plan (q, k, v, gate, up column-wise; o, down row-wise) and whose
LM head is split by the vocabulary with its output gathered, through torch's
`parallelize_module` (torch 2.13 DTensor), measured with llmmem's meter: the peak bytes of each
phase of the second of two steps, written as JSON to the folder named by the first argument."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from llmmem.verify.tracker import StorageTracker

LLAMA = {
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 4000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
SEQ = int(os.environ.get("TP_SEQ", "1024"))
BLOCK_PLAN = {
    "self_attn.q_proj": "col",
    "self_attn.k_proj": "col",
    "self_attn.v_proj": "col",
    "self_attn.o_proj": "row",
    "mlp.gate_proj": "col",
    "mlp.up_proj": "col",
    "mlp.down_proj": "row",
}


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**LLAMA)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    model.config.use_cache = False
    for layer in model.model.layers:
        plan = {
            name: ColwiseParallel() if kind == "col" else RowwiseParallel()
            for name, kind in BLOCK_PLAN.items()
        }
        parallelize_module(layer, mesh, plan)
    parallelize_module(model, mesh, {"lm_head": ColwiseParallel(output_layouts=Replicate())})
    model.train()
    seeded = torch.Generator().manual_seed(1)
    ids = torch.randint(3, LLAMA["vocab_size"], (1, SEQ), generator=seeded)
    labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], dim=1)
    # the split parameters are DTensors, the rest (embedding, norms) plain tensors: fused
    # AdamW takes one kind at a time, so one optimizer each (the same states and steps)
    split = [p for p in model.parameters() if hasattr(p, "to_local")]
    whole = [p for p in model.parameters() if not hasattr(p, "to_local")]
    optimizers = [torch.optim.AdamW(group, lr=1e-4, fused=True) for group in (split, whole)]
    tracker = StorageTracker()
    peaks: dict[str, int] = {}

    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    with tracker:
        for tensor in [*model.parameters(), *model.buffers(), ids, labels]:
            tracker.track(local(tensor))
        for measured in (False, True):
            tracker.reset_peak("activations")
            logits = model(input_ids=ids).logits
            logits = local(logits)
            loss = torch.nn.functional.cross_entropy(
                logits.float().view(-1, logits.size(-1)), labels.view(-1)
            )
            if measured:
                peaks["forward"] = tracker.peak
                tracker.reset_peak("temporaries")
            del logits
            loss.backward()
            del loss
            if measured:
                peaks["backward"] = tracker.peak
                tracker.reset_peak("temporaries")
            for optimizer in optimizers:
                optimizer.step()
            if measured:
                peaks["optimizer_step"] = tracker.peak
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
    (out / f"rank{rank}.json").write_text(json.dumps(peaks))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

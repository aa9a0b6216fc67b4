"""One rank of an expert-parallel step (run under torchrun over gloo): a tiny Qwen3-MoE laid
out by transformers' own `DistributedConfig(ep_size=N, fsdp_size=N)` (its `base_model_ep_plan`:
each rank keeps N-th of the routed experts, tokens exchanged all-to-all by `AllToAllEP`; FSDP2
over the rest of the model by its `base_model_fsdp_plan`), measured with llmmem's meter: the
peak bytes of each phase of the second of two steps, written as JSON to the folder named by
the first argument."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from transformers.distributed import DistributedConfig

from llmmem.verify.tracker import StorageTracker

QWEN3_MOE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 2000,
    "max_position_embeddings": 4096,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
}
SEQ = int(os.environ.get("EP_SEQ", "1024"))


def main() -> None:
    out = Path(sys.argv[1])
    world = int(os.environ["WORLD_SIZE"])
    ep = int(os.environ.get("EP_SIZE", str(world)))
    cls = transformers.Qwen3MoeForCausalLM
    config, _, mesh = cls.prepare_distribute_model(DistributedConfig(ep_size=ep, fsdp_size=world))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = cls._from_config(
        transformers.Qwen3MoeConfig(**QWEN3_MOE), attn_implementation="sdpa", dtype=torch.bfloat16
    )
    model.config.use_cache = False
    model = cls.maybe_distribute_model(model, config, mesh)
    model.train()
    # each rank its own sample: the router sends its tokens wherever they go
    seeded = torch.Generator().manual_seed(1 + rank)
    ids = torch.randint(3, QWEN3_MOE["vocab_size"], (1, SEQ), generator=seeded)
    labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], dim=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tracker = StorageTracker(resizable=True)
    peaks: dict[str, int] = {}

    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    with tracker:
        for tensor in [*model.parameters(), *model.buffers(), ids, labels]:
            tracker.track(local(tensor))
        for measured in (False, True):
            tracker.reset_peak("activations")
            loss = model(input_ids=ids, labels=labels).loss
            if measured:
                peaks["forward"] = tracker.peak
                tracker.reset_peak("temporaries")
            loss.backward()
            del loss
            if measured:
                peaks["backward"] = tracker.peak
                tracker.reset_peak("temporaries")
            optimizer.step()
            if measured:
                peaks["optimizer_step"] = tracker.peak
            optimizer.zero_grad(set_to_none=True)
    (out / f"rank{rank}.json").write_text(json.dumps(peaks))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

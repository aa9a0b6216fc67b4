"""One rank of a DeepSpeed Ulysses context-parallel step (run under torchrun over gloo): a tiny
Llama whose SDPA attention DeepSpeed's UlyssesSPAttentionHF wraps (deepspeed 0.19.8), each rank
given its share of one sample's tokens (input ids, global position ids, labels), under torch's
DDP, measured with llmmem's meter: the peak bytes of each phase of the second of two steps,
written as JSON to the folder named by the first argument."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

from llmmem.verify.tracker import StorageTracker

LLAMA = {
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
SEQ = int(os.environ.get("ULYSSES_SEQ", "2048"))


def main() -> None:
    out = Path(sys.argv[1])
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")  # DeepSpeed's groups sit on torch's
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**LLAMA)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    model.config.use_cache = False
    UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        core_attn_implementation="sdpa",
        sequence_parallel_size=world,
        micro_batch_size=1,
        seq_length=SEQ,
        seq_length_is_variable=True,
    )
    model.train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    local = SEQ // world
    ids = torch.randint(
        3, LLAMA["vocab_size"], (1, SEQ), generator=torch.Generator().manual_seed(1)
    )
    part = slice(rank * local, (rank + 1) * local)
    # the labels shifted over the whole sequence first, as DeepSpeed's data loader adapter does
    shifted = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], dim=1)
    batch = {
        "input_ids": ids[:, part].contiguous(),
        "position_ids": torch.arange(SEQ)[part].unsqueeze(0),
        "shift_labels": shifted[:, part].contiguous(),
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tracker = StorageTracker()
    peaks: dict[str, int] = {}
    with tracker:
        for tensor in [*model.parameters(), *model.buffers(), *batch.values()]:
            tracker.track(tensor)
        for measured in (False, True):
            tracker.reset_peak("activations")
            logits = ddp(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
            loss = torch.nn.functional.cross_entropy(
                logits.float().view(-1, logits.size(-1)), batch["shift_labels"].view(-1)
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
            optimizer.step()
            if measured:
                peaks["optimizer_step"] = tracker.peak
            optimizer.zero_grad(set_to_none=True)
    (out / f"rank{rank}.json").write_text(json.dumps(peaks))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

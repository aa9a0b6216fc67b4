"""One rank of torchtune's distributed recipes (`tune run --nproc_per_node N
lora_finetune_distributed | full_finetune_distributed`, torchtune 0.6.1) on a CPU rank over gloo,
under llmmem's meter; bench/torchtune_steps.py launches it under torchrun for its distributed
cases and reads what each rank writes.

    python -m torch.distributed.run --nproc-per-node 2 bench/torchtune_fsdp_rank.py OUT PAYLOAD

The model is set up by the recipe's own `_setup_model` (called on the recipe class, as the
single-device cases call its `_loss_step`): built on the meta device in the config's dtype,
checkpointing as configured, every `layers.i` and then the whole model sharded with FSDP2's
`fully_shard` (`training.shard_model`, training/_distributed.py:519-568), the weights loaded
from a full state dict (`load_from_full_model_state_dict`), LoRA's adapters initialised on the
device (lora recipe :427-538, full :513-634). The state dict is built on the side, as the
recipe's checkpointer would read it, and is not counted. Then the loop's body as the recipes
write it (lora :777-830, full :774-840): the model's forward under the activations context, the
labels shifted by the ignore-index column, the loss times the tokens, `del logits`,
`backward()`, the token count all-reduced, `training.scale_grads`, `optimizer.step()`,
`zero_grad(set_to_none=True)`.

A GPU overlaps the next block's all-gather with the current block's compute (its own stream),
so two blocks are gathered at once; a CPU rank runs one op at a time. As llmmem's own FSDP
steps do (llmmem.verify.runner `_distribute`), that prefetch is asked for explicitly: the block
after in forward, the block before in backward (FSDP2's `set_modules_to_forward_prefetch` /
`set_modules_to_backward_prefetch`).

Each rank writes OUT/rank{N}.json: the peak of allocated bytes in forward, backward and the
optimizer step of the second of two steps, and its weights and states.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torchtune_steps as steps

RECIPES = {
    "lora": ("lora_finetune_distributed", "LoRAFinetuneRecipeDistributed"),
    "full": ("full_finetune_distributed", "FullFinetuneRecipeDistributed"),
}


def full_state_dict(cfg: Any, dtype: Any, lora: bool) -> dict[str, Any]:
    """The checkpoint the recipe loads: the base model's weights (no adapters, no RoPE cache)."""
    import torch
    from torchtune import config, training

    with training.set_default_dtype(dtype), torch.device("cpu"):
        model = config.instantiate(cfg.model)
    state = {
        name: tensor
        for name, tensor in model.state_dict().items()
        if not (lora and ("lora_" in name or "magnitude" in name))
    }
    return state


def setup_model(cfg: Any, dtype: Any, world: int) -> tuple[Any, Any]:
    """The recipe's `_setup_model` on an instance with only what it reads; the model and the
    recipe (its `activations_handling_ctx`)."""
    import torch

    lora = "lora" in str(cfg.model._component_)
    module, name = RECIPES["lora" if lora else "full"]
    recipe_class = steps._recipe_class(module, name)
    recipe = recipe_class.__new__(recipe_class)
    recipe._dtype = dtype
    recipe._compile = False
    recipe._device = torch.device("cpu")
    recipe._is_rank_zero = False  # its memory log reads CUDA's statistics
    state = full_state_dict(cfg, dtype, lora)
    common = {
        "cfg_model": cfg.model,
        "enable_activation_checkpointing": bool(cfg.enable_activation_checkpointing),
        "enable_activation_offloading": bool(cfg.get("enable_activation_offloading", False)),
        "fsdp_cpu_offload": bool(cfg.get("fsdp_cpu_offload", False)),
        "reshard_after_forward": bool(cfg.get("fsdp_reshard_after_forward", True)),
        "custom_sharded_layers": cfg.get("custom_sharded_layers"),
    }
    if lora:
        model = recipe._setup_model(base_model_state_dict=state, **common)
    else:
        recipe.data_parallel_dim, recipe.tensor_parallel_dim = world, 1
        recipe.tensor_parallel_plan = None
        model = recipe._setup_model(model_state_dict=state, **common)
    del state
    return model, recipe


def prefetch_as_a_gpu(model: Any) -> None:
    layers = list(model.layers)
    for before, after in zip(layers, layers[1:], strict=False):
        before.set_modules_to_forward_prefetch([after])
        after.set_modules_to_backward_prefetch([before])


def run_rank(out: Path, payload: dict[str, Any]) -> None:
    import gc

    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf
    from torchtune import config, training

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = OmegaConf.create(payload["yaml"])
    dtype = training.get_dtype(cfg.dtype, device=torch.device("cpu"))
    torch.manual_seed(0)
    model, recipe = setup_model(cfg, dtype, world)
    if payload.get("root_kept"):
        # torch before 2.8: the root kept whole after forward whatever the recipe passed
        model.set_reshard_after_forward(False, recurse=False)
    gc.collect()
    prefetch_as_a_gpu(model)
    loss_fn = config.instantiate(cfg.loss)
    if hasattr(loss_fn, "num_output_chunks"):
        model.set_num_output_chunks(loss_fn.num_output_chunks)
    optimizer = config.instantiate(cfg.optimizer, model.parameters())
    batch, seq = int(cfg.batch_size), int(cfg.tokenizer.max_seq_len)
    ignore_labels_cache = torch.full((batch, 1), loss_fn.ignore_index, dtype=torch.long)
    tracker_type = steps.tracker_class()
    tracker_type.detail = bool(payload.get("detail"))
    tracker = tracker_type(resizable=True)  # FSDP2 frees and regrows storages in place
    seen: dict[str, Any] = {}

    def note(phase: str) -> None:
        steps.note_peak(tracker, seen, phase)

    with tracker:
        for tensor in [*model.parameters(), *model.buffers()]:
            tracker.track(tensor, "weights")
        seen["weights"] = tracker.current
        for measured in (False, True):
            generator = torch.Generator().manual_seed(rank)
            tokens = torch.randint(0, int(cfg.model.vocab_size), (batch, seq), generator=generator)
            labels = tokens.clone()
            tracker.reset_peak("activations")
            num_tokens = (labels != loss_fn.ignore_index).sum()
            with recipe.activations_handling_ctx:
                logits = model(tokens=tokens)
            labels = torch.hstack((labels[..., 1:], ignore_labels_cache[: labels.shape[0]]))
            if not isinstance(logits, list):
                labels = labels.reshape(-1)
                logits = logits.reshape(-1, logits.size(-1))
            current_loss = loss_fn(logits, labels) * num_tokens
            del logits
            if measured:
                note("forward")
            tracker.reset_peak("temporaries")
            current_loss.backward()
            if measured:
                note("backward")
            # the recipe's all-reduce of the token count (lora :817), before the step phase
            # is reset: gloo's threads have let go of backward's last reduce-scatter by then
            dist.all_reduce(num_tokens)
            tracker.reset_peak("temporaries")
            training.scale_grads(model, world / num_tokens)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if measured:
                note("optimizer_step")
            del current_loss
    seen["versions"] = steps._versions()
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


if __name__ == "__main__":
    run_rank(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))

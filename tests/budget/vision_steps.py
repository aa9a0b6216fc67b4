"""One real CPU training step of a tiny vision-language model, measured with llmmem's own meter
(llmmem.verify.tracker.StorageTracker): configs built here, random weights, images given as the
tensors their processors make (fp32 pixel values; Qwen's patches with image_grid_thw, Mllama's
tiles with their aspect-ratio ids and the cross-attention mask).

The step is the HF Trainer's: forward and loss, backward, the optimizer step (torch's fused
AdamW), a warm-up step first so the measured one has its optimizer states."""

from __future__ import annotations

from typing import Any

import torch
import transformers

from llmmem.verify.tracker import StorageTracker

QWEN2_5_VL = {
    "model_type": "qwen2_5_vl",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
    "vision_config": {
        "depth": 4,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_heads": 4,
        "out_hidden_size": 256,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1, 3],
    },
    "image_token_id": 990,
    "video_token_id": 991,
    "vision_start_token_id": 992,
    "vision_end_token_id": 993,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

MLLAMA = {
    "model_type": "mllama",
    "text_config": {
        "model_type": "mllama_text_model",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "cross_attention_layers": [2, 5],
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "max_position_embeddings": 4096,
    },
    "vision_config": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 3,
        "num_global_layers": 1,
        "attention_heads": 4,
        "image_size": 112,
        "patch_size": 14,
        "max_num_tiles": 4,
        "intermediate_layers_indices": [0, 2],
        "vision_output_dim": 384,
    },
    "image_token_index": 999,
}

VISION_PARTS = (".visual.", ".vision_model.", "multi_modal_projector")


def build(
    config: dict[str, Any],
    dtype: torch.dtype,
    *,
    targets: list[str],
    rank: int,
    encoder_trains: bool,
    checkpointing: bool,
) -> torch.nn.Module:
    """The model as a LoRA script makes it: loaded in `dtype`, checkpointing enabled before
    get_peft_model (which then calls enable_input_require_grads), the cache off; where the
    encoder trains, its and the projector's weights unfrozen after PEFT froze them."""
    from peft import LoraConfig, get_peft_model

    values = dict(config)
    model_type = values.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **values)
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(
        hf_config, attn_implementation="sdpa"
    ).to(dtype)
    model.config.use_cache = False
    text = getattr(model.config, "text_config", None)
    if text is not None:
        text.use_cache = False
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))
    if encoder_trains:
        for name, param in model.named_parameters():
            if any(part in name for part in VISION_PARTS) and "lora_" not in name:
                param.requires_grad_(True)
    model.train()
    return model


def qwen_batch(
    config: dict[str, Any], batch: int, seq: int, height: int, width: int
) -> dict[str, torch.Tensor]:
    """One image per sample, its patches flattened as Qwen's processor gives them."""
    patch, merge, temporal = 14, 2, 2
    rows, cols = height // patch, width // patch
    tokens = rows * cols // (merge * merge)
    ids = torch.randint(3, 900, (batch, seq))
    ids[:, 4 : 4 + tokens] = config["image_token_id"]
    labels = ids.clone()
    labels[ids == config["image_token_id"]] = -100
    return {
        "input_ids": ids,
        "pixel_values": torch.randn(batch * rows * cols, 3 * temporal * patch * patch),
        "image_grid_thw": torch.tensor([[1, rows, cols]] * batch),
        "labels": labels,
    }


def mllama_batch(
    config: dict[str, Any], batch: int, seq: int, tiles: int, aspect_ratio_id: int
) -> dict[str, torch.Tensor]:
    """One image per sample, cut into `tiles` tiles; every text token after it reads it."""
    size = config["vision_config"]["image_size"]
    ids = torch.randint(3, 900, (batch, seq))
    ids[:, 1] = config["image_token_index"]
    cross = torch.zeros(batch, seq, 1, tiles, dtype=torch.long)
    cross[:, 1:] = 1
    labels = ids.clone()
    labels[ids == config["image_token_index"]] = -100
    return {
        "input_ids": ids,
        "pixel_values": torch.randn(batch, 1, tiles, 3, size, size),
        "aspect_ratio_ids": torch.full((batch, 1), aspect_ratio_id),
        "aspect_ratio_mask": torch.ones(batch, 1, tiles, dtype=torch.long),
        "cross_attention_mask": cross,
        "labels": labels,
    }


def measured_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """The peak bytes of each phase of the second of two steps."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    tracker = StorageTracker()
    peaks: dict[str, int] = {}
    with tracker:
        for tensor in [*model.parameters(), *model.buffers(), *batch.values()]:
            tracker.track(tensor)
        for measured in (False, True):
            tracker.reset_peak("activations")
            loss = model(**batch).loss
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
    return peaks

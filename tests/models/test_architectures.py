"""`read_architecture` against the real transformers classes.

Every family is built from its config on the meta device (no memory, no weights); the spec must
give exactly `sum(p.numel() for p in model.parameters())`, the same split of embeddings, norms,
experts, routers and head, and the same named Linear modules (and fused 3-D expert tensors) in
every block.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Llama4ForCausalLM,
    Llama4TextConfig,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.pytorch_utils import Conv1D

from llmmem.models.architectures import (
    ARCHITECTURE_READERS,
    FAMILY_OF_MODEL_TYPE,
    SUPPORTED_MODEL_TYPES,
    read_architecture,
    spec_from_config,
)
from llmmem.models.spec import ModelSource, ModelSpec, ModelSpecError

CONFIGS = Path(__file__).parent / "configs"

# --- small configs, one or more per family -----------------------------------------------------
# Sizes are tiny but keep each family's structure: heads != kv heads, head_dim != hidden / heads
# where the family honors head_dim, MLP widths that are not 4 x hidden, biases on and off.

SMALL = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 1000}

FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", **SMALL, "intermediate_size": 96, "num_key_value_heads": 2},
    "llama-3.2-tied-rope-scaling": {
        "model_type": "llama",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "tie_word_embeddings": True,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    },
    "llama-biases": {
        "model_type": "llama",
        **SMALL,
        "intermediate_size": 96,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "mistral-default-window": {
        "model_type": "mistral",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
    },
    "mistral-v0.3-no-window": {
        "model_type": "mistral",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "sliding_window": None,
    },
    "mixtral": {
        "model_type": "mixtral",
        **SMALL,
        "intermediate_size": 48,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "qwen2_moe": {
        "model_type": "qwen2_moe",
        **SMALL,
        "intermediate_size": 160,
        "num_key_value_heads": 2,
        "moe_intermediate_size": 40,
        "shared_expert_intermediate_size": 80,
        "num_experts": 6,
        "num_experts_per_tok": 2,
    },
    "qwen2_moe-dense-layers": {
        "model_type": "qwen2_moe",
        **SMALL,
        "num_hidden_layers": 5,
        "intermediate_size": 160,
        "num_key_value_heads": 2,
        "moe_intermediate_size": 40,
        "shared_expert_intermediate_size": 80,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "use_sliding_window": True,
        "sliding_window": 32,
        "max_window_layers": 4,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        **SMALL,
        "intermediate_size": 160,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "moe_intermediate_size": 40,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "mlp_only_layers": [0],
    },
    "gpt_oss": {
        "model_type": "gpt_oss",
        **SMALL,
        "num_hidden_layers": 4,
        "intermediate_size": 48,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 16,
    },
    "qwen2": {"model_type": "qwen2", **SMALL, "intermediate_size": 96, "num_key_value_heads": 2},
    "internlm3": {
        "model_type": "internlm3",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "head_dim": 8,
    },
    "glm": {
        "model_type": "glm",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "partial_rotary_factor": 0.5,
        "pad_token_id": 0,  # GlmConfig's default (151329) lies past a small vocabulary
    },
    "glm4-no-bias": {
        "model_type": "glm4",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "attention_bias": False,
        "partial_rotary_factor": 0.5,
        "pad_token_id": 0,
    },
    "qwen2-tied-sliding": {
        "model_type": "qwen2",
        **SMALL,
        "num_hidden_layers": 4,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "use_sliding_window": True,
        "sliding_window": 32,
        "max_window_layers": 1,
    },
    "qwen3-default-head-dim": {
        "model_type": "qwen3",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
    },
    "qwen3-tied": {
        "model_type": "qwen3",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "tie_word_embeddings": True,
    },
    "gemma-legacy-gelu": {
        "model_type": "gemma",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 1,
        "hidden_act": "gelu",
    },
    "gemma2": {
        "model_type": "gemma2",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "head_dim": 32,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        **SMALL,
        "num_hidden_layers": 7,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "sliding_window": 64,
    },
    "gemma3-multimodal": {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            **SMALL,
            "intermediate_size": 96,
            "num_key_value_heads": 2,
            "head_dim": 32,
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 28,
            "patch_size": 14,
        },
        "mm_tokens_per_image": 4,
        "image_token_index": 999,
        "boi_token_index": 997,
        "eoi_token_index": 998,
        "torch_dtype": "bfloat16",
    },
    "phi-2": {"model_type": "phi", **SMALL, "intermediate_size": 256, "partial_rotary_factor": 0.4},
    "phi-qk-layernorm-gqa": {
        "model_type": "phi",
        **SMALL,
        "intermediate_size": 256,
        "num_key_value_heads": 2,
        "qk_layernorm": True,
    },
    "phi3": {
        "model_type": "phi3",
        **SMALL,
        "intermediate_size": 96,
        "pad_token_id": 0,
        "sliding_window": 31,
    },
    "phi4-mini-gqa-tied": {
        "model_type": "phi3",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
    },
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 3, "n_head": 4, "vocab_size": 1000},
    "gpt_bigcode-multi-query": {
        "model_type": "gpt_bigcode",
        "n_embd": 64,
        "n_layer": 3,
        "n_head": 4,
        "n_inner": 96,
        "n_positions": 128,
        "vocab_size": 1000,
    },
    "gpt_bigcode-multi-head": {
        "model_type": "gpt_bigcode",
        "n_embd": 64,
        "n_layer": 3,
        "n_head": 4,
        "vocab_size": 1000,
        "multi_query": False,
    },
    "granite": {
        "model_type": "granite",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "embedding_multiplier": 12.0,
        "logits_scaling": 8.0,
    },
    "gpt2-untied-n-inner": {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 3,
        "n_head": 4,
        "vocab_size": 1000,
        "n_inner": 96,
        "n_positions": 128,
        "tie_word_embeddings": False,
    },
    "gpt_neox": {"model_type": "gpt_neox", **SMALL, "intermediate_size": 96},
    "gpt_neox-sequential-no-bias": {
        "model_type": "gpt_neox",
        **SMALL,
        "intermediate_size": 96,
        "use_parallel_residual": False,
        "attention_bias": False,
        "tie_word_embeddings": True,
    },
    "gptj": {
        "model_type": "gptj",
        "n_embd": 64,
        "n_layer": 3,
        "n_head": 4,
        "vocab_size": 1000,
        "rotary_dim": 8,
    },
    "opt-125m-style": {
        "model_type": "opt",
        **SMALL,
        "ffn_dim": 96,
        "max_position_embeddings": 100,
    },
    "opt-350m-style": {
        "model_type": "opt",
        **SMALL,
        "ffn_dim": 96,
        "max_position_embeddings": 100,
        "word_embed_proj_dim": 32,
        "do_layer_norm_before": False,
    },
    "falcon-7b-style": {"model_type": "falcon", **SMALL},
    "falcon-40b-style": {
        "model_type": "falcon",
        **SMALL,
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
    },
    "falcon2-11b-style": {
        "model_type": "falcon",
        **SMALL,
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
        "num_ln_in_parallel_attn": 1,
        "ffn_hidden_size": 96,
    },
    "falcon-rw-style": {
        "model_type": "falcon",
        **SMALL,
        "alibi": True,
        "bias": True,
        "multi_query": False,
        "parallel_attn": False,
    },
    "bloom": {
        "model_type": "bloom",
        "hidden_size": 64,
        "n_layer": 3,
        "n_head": 4,
        "vocab_size": 1000,
    },
    "stablelm-2": {
        "model_type": "stablelm",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 4,
        "use_qkv_bias": True,
    },
    "stablelm-2-12b-style": {
        "model_type": "stablelm",
        **SMALL,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "qk_layernorm": True,
        "use_parallel_residual": True,
    },
    "stablelm-base-alpha-is-gpt_neox": {
        "model_type": "gpt_neox",
        **SMALL,
        "intermediate_size": 256,
        "tie_word_embeddings": False,
    },
    "starcoder2": {
        "model_type": "starcoder2",
        **SMALL,
        "intermediate_size": 256,
        "num_key_value_heads": 2,
        "sliding_window": 32,
    },
    "olmo": {"model_type": "olmo", **SMALL, "intermediate_size": 96},
    "olmo2": {"model_type": "olmo2", **SMALL, "intermediate_size": 96, "num_key_value_heads": 2},
    "smollm3": {
        "model_type": "smollm3",
        **SMALL,
        "pad_token_id": 0,
        "num_hidden_layers": 5,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
    },
    "smollm3-sliding-nope-untied-biases": {
        "model_type": "smollm3",
        **SMALL,
        "pad_token_id": 0,
        "num_hidden_layers": 5,
        "intermediate_size": 96,
        "num_key_value_heads": 2,
        "no_rope_layer_interval": 2,
        "use_sliding_window": True,
        "sliding_window": 16,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "llama4_text-interleaved": {
        "model_type": "llama4_text",
        **SMALL,
        "num_hidden_layers": 4,
        "intermediate_size": 40,
        "intermediate_size_mlp": 112,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2,
        "use_qk_norm": False,
        "no_rope_layers": [1, 1, 1, 0],
    },
    "llama4_text-moe-layers-qk-norm": {
        "model_type": "llama4_text",
        **SMALL,
        "num_hidden_layers": 5,
        "intermediate_size": 40,
        "intermediate_size_mlp": 112,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 3,
        "moe_layers": [0, 1, 2, 4],
        "no_rope_layer_interval": 2,
        "attention_bias": True,
        "attention_chunk_size": 16,
    },
    "llama4-multimodal": {
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            **SMALL,
            "intermediate_size": 40,
            "intermediate_size_mlp": 112,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_local_experts": 4,
        },
        "vision_config": {
            "model_type": "llama4_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 28,
            "patch_size": 14,
            "projector_input_dim": 32,
            "projector_output_dim": 32,
            "vision_output_dim": 32,
        },
        "torch_dtype": "bfloat16",
    },
    "deepseek_v2-lite-style": {
        "model_type": "deepseek_v2",
        **SMALL,
        "num_hidden_layers": 4,
        "intermediate_size": 160,
        "num_key_value_heads": 4,
        "q_lora_rank": None,
        "kv_lora_rank": 24,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "moe_intermediate_size": 20,
        "n_routed_experts": 6,
        "n_shared_experts": 2,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
    },
    "deepseek_v2-q-latent-mlp-bias": {
        "model_type": "deepseek_v2",
        **SMALL,
        "intermediate_size": 160,
        "q_lora_rank": 32,
        "kv_lora_rank": 24,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "moe_intermediate_size": 20,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        **SMALL,
        "num_hidden_layers": 4,
        "intermediate_size": 160,
        "num_key_value_heads": 4,
        "q_lora_rank": 32,
        "kv_lora_rank": 24,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "moe_intermediate_size": 20,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 2,
        "num_nextn_predict_layers": 1,
    },
    "glm4_moe": {
        "model_type": "glm4_moe",
        **SMALL,
        "num_hidden_layers": 4,
        "intermediate_size": 160,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "moe_intermediate_size": 20,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "attention_bias": True,
        "partial_rotary_factor": 0.5,
        "num_nextn_predict_layers": 1,
    },
    "glm4_moe-qk-norm-two-shared": {
        "model_type": "glm4_moe",
        **SMALL,
        "intermediate_size": 160,
        "num_key_value_heads": 2,
        "moe_intermediate_size": 20,
        "n_routed_experts": 4,
        "n_shared_experts": 2,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 0,
        "use_qk_norm": True,
    },
    "bert": {"model_type": "bert", **SMALL, "intermediate_size": 96, "max_position_embeddings": 64},
    "bert-untied": {
        "model_type": "bert",
        **SMALL,
        "intermediate_size": 96,
        "tie_word_embeddings": False,
        "type_vocab_size": 1,
    },
    "roberta": {
        "model_type": "roberta",
        **SMALL,
        "intermediate_size": 96,
        "max_position_embeddings": 66,
        "type_vocab_size": 1,
    },
    "distilbert": {
        "model_type": "distilbert",
        "vocab_size": 320,
        "dim": 64,
        "n_layers": 3,
        "n_heads": 4,
        "hidden_dim": 96,
        "max_position_embeddings": 64,
    },
    "t5-v1.0-relu-tied": {
        "model_type": "t5",
        "d_model": 64,
        "d_kv": 8,
        "d_ff": 96,
        "num_layers": 3,
        "num_heads": 4,
        "vocab_size": 1000,
    },
    "t5-v1.1-gated-untied": {
        "model_type": "t5",
        "d_model": 64,
        "d_kv": 24,
        "d_ff": 96,
        "num_layers": 3,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "vocab_size": 1000,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
    },
    "mt5": {
        "model_type": "mt5",
        "d_model": 64,
        "d_kv": 16,
        "d_ff": 96,
        "num_layers": 2,
        "num_heads": 4,
        "vocab_size": 1000,
        "tie_word_embeddings": False,
    },
}

# Real configs as published on the hub, and counts published for their checkpoints.
REAL_CONFIGS = sorted(path.stem for path in CONFIGS.glob("*.json"))
PUBLISHED_TOTALS = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.2-3b": 3_212_749_824,
    "gpt2": 124_439_808,
    "mistral-7b-v0.1": 7_241_732_096,
    "mixtral-8x7b-v0.1": 46_702_792_704,
    "phi-2": 2_779_683_840,
    "qwen2.5-0.5b": 494_032_768,
}

# Modules holding the transformer blocks, by the attribute paths transformers 5 uses.
BLOCK_LISTS = (
    "model.layers",
    "model.decoder.layers",
    "transformer.h",
    "gpt_neox.layers",
    "bert.encoder.layer",
    "roberta.encoder.layer",
    "distilbert.transformer.layer",
    "encoder.block",
    "decoder.block",
)


def load_real_config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def read(config: dict[str, Any]) -> ModelSpec:
    return read_architecture(config, model_id="test/model", source=ModelSource.CONFIG)


# --- building the real model on the meta device ------------------------------------------------


def build_on_meta(config: dict[str, Any], spec: ModelSpec) -> nn.Module:
    """The transformers model the spec describes, on the meta device."""
    config = {key: value for key, value in config.items() if key != "quantization_config"}
    model_type = config["model_type"]
    with torch.device("meta"):
        if model_type == "gemma3":
            text = {"tie_word_embeddings": config.get("tie_word_embeddings", True)}
            text.update(config["text_config"])
            model = Gemma3ForCausalLM(Gemma3TextConfig.from_dict(text))
        elif model_type == "llama4":
            text = {"tie_word_embeddings": config.get("tie_word_embeddings", False)}
            text.update(config["text_config"])
            model = Llama4ForCausalLM(Llama4TextConfig.from_dict(text))
        else:
            hf_config = CONFIG_MAPPING[model_type].from_dict(config)
            if model_type in ("bert", "roberta", "distilbert"):
                model = AutoModelForMaskedLM.from_config(hf_config)
            elif model_type in ("t5", "mt5"):
                model = AutoModelForSeq2SeqLM.from_config(hf_config)
            else:
                model = AutoModelForCausalLM.from_config(hf_config)
        if model_type in ("t5", "mt5") and not spec.tie_word_embeddings:
            # transformers 5 builds T5 tied from a config; loading a checkpoint with its own
            # lm_head unties it, which is what the spec counts
            model.lm_head.weight = nn.Parameter(torch.empty_like(model.lm_head.weight))
    return model


def module_linears(block: nn.Module) -> list[tuple[str, str, int, int, bool, int]]:
    """(name, path, in, out, bias, count) of each Linear, Conv1D, router and fused expert tensor."""
    found = []
    for path, module in block.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        if isinstance(module, nn.Linear):
            found.append(
                (leaf, path, module.in_features, module.out_features, module.bias is not None, 1)
            )
        elif isinstance(module, Conv1D):
            fan_in, fan_out = module.weight.shape
            found.append((leaf, path, fan_in, fan_out, module.bias is not None, 1))
        elif type(module).__name__.endswith("Router"):
            fan_out, fan_in = module.weight.shape
            has_bias = isinstance(getattr(module, "bias", None), nn.Parameter)
            found.append((leaf, path, fan_in, fan_out, has_bias, 1))
        elif is_fused_experts(module):  # fused experts of transformers 5 MoE layers
            for name, param in module.named_parameters(recurse=False):
                if param.ndim != 3:
                    continue
                experts, first, second = param.shape
                transposed = getattr(module, "is_transposed", True)
                fan_in, fan_out = (first, second) if transposed else (second, first)
                has_bias = hasattr(module, f"{name}_bias")
                found.append((name, f"{path}.{name}", fan_in, fan_out, has_bias, experts))
    return sorted(found)


def is_fused_experts(module: nn.Module) -> bool:
    """Routed experts held as 3-D parameters: the modules transformers 5 marks with
    `is_transposed`, and Llama 4's, which store (experts, in, out) without the mark."""
    return hasattr(module, "is_transposed") or type(module).__name__ == "Llama4TextExperts"


def real_blocks(model: nn.Module) -> list[nn.Module]:
    blocks = []
    for list_path in BLOCK_LISTS:
        try:
            blocks.extend(model.get_submodule(list_path))
        except AttributeError:
            continue
    return blocks


def block_params_without_position_bias(block: nn.Module) -> int:
    return sum(
        param.numel()
        for name, param in block.named_parameters()
        if "relative_attention_bias" not in name
    )


def real_role_totals(model: nn.Module) -> Counter[str]:
    """Parameters by the kind of module that owns them (tied parameters counted once)."""
    totals: Counter[str] = Counter()
    for name, param in model.named_parameters():
        owner = model.get_submodule(name.rpartition(".")[0])
        kind = type(owner).__name__
        if "Norm" in kind:
            role = "norms"
        elif isinstance(owner, nn.Embedding):
            role = "other" if "relative_attention_bias" in name else "embedding"
        elif is_fused_experts(owner):
            role = "experts"
        elif kind.endswith("Router") or name.endswith("shared_expert_gate.weight"):
            role = "router"
        elif name.startswith(("lm_head.", "cls.", "vocab_transform.", "vocab_projector.")):
            role = "head"
        else:
            role = "rest"
        totals[role] += param.numel()
    return totals


def real_window(config: Any) -> int | None:
    """The sliding window, or Llama 4's attention chunk, which caches like one."""
    if "chunked_attention" in (getattr(config, "layer_types", None) or ()):
        return getattr(config, "attention_chunk_size", None)
    return getattr(config, "sliding_window", None)


def real_sliding_layers(model: nn.Module, layers: int) -> int:
    config = model.config
    window = real_window(config)
    if not window:
        return 0
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return layers
    return sum(1 for kind in layer_types if kind in ("sliding_attention", "chunked_attention"))


# --- the family checks -------------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(FAMILY_CONFIGS), ids=str)
def small_case(request: pytest.FixtureRequest) -> tuple[dict[str, Any], ModelSpec, nn.Module]:
    config = FAMILY_CONFIGS[request.param]
    spec = read(config)
    return config, spec, build_on_meta(config, spec)


@pytest.fixture(scope="module", params=REAL_CONFIGS, ids=str)
def real_case(request: pytest.FixtureRequest) -> tuple[str, ModelSpec, nn.Module]:
    config = load_real_config(request.param)
    spec = read(config)
    return request.param, spec, build_on_meta(config, spec)


def check_against_model(spec: ModelSpec, model: nn.Module) -> None:
    assert type(model).__name__ == spec.architecture
    assert spec.params.total == sum(param.numel() for param in model.parameters())

    roles = real_role_totals(model)
    assert spec.params.embedding == roles["embedding"]
    assert spec.params.norms == roles["norms"]
    assert spec.params.experts == roles["experts"]
    assert spec.params.router == roles["router"]
    assert spec.params.head == roles["head"]
    assert spec.params.total == sum(roles.values())

    blocks = real_blocks(model)
    assert len(blocks) == spec.num_layers == sum(group.count for group in spec.blocks)
    expected = Counter()
    for group in spec.blocks:
        signature = tuple(
            sorted(
                (lin.name, lin.path, lin.in_features, lin.out_features, lin.bias, lin.count)
                for lin in group.linears
            )
        )
        expected[(signature, group.params_per_block)] += group.count
    found = Counter(
        (tuple(module_linears(block)), block_params_without_position_bias(block))
        for block in blocks
    )
    assert found == expected

    assert spec.supports_sdpa == type(model)._supports_sdpa


def test_family_matches_transformers(
    small_case: tuple[dict[str, Any], ModelSpec, nn.Module],
) -> None:
    config, spec, model = small_case
    check_against_model(spec, model)
    assert spec.model_type == config["model_type"]
    output_weight = model.get_output_embeddings().weight
    assert spec.tie_word_embeddings == (output_weight is model.get_input_embeddings().weight)


def test_family_dimensions(small_case: tuple[dict[str, Any], ModelSpec, nn.Module]) -> None:
    _, spec, model = small_case
    config = model.config
    assert spec.hidden_size == config.hidden_size
    assert spec.vocab_size == config.vocab_size
    assert spec.num_attention_heads == config.num_attention_heads
    attention_head_dims = {
        module.head_dim
        for module in model.modules()
        if type(module).__name__.endswith("Attention")
        and isinstance(getattr(module, "head_dim", None), int)
    }
    if attention_head_dims:
        assert attention_head_dims == {spec.head_dim}
    assert spec.sliding_layers == real_sliding_layers(model, spec.num_layers)
    if spec.sliding_layers:
        assert spec.sliding_window == real_window(config)


def test_real_config_matches_transformers(real_case: tuple[str, ModelSpec, nn.Module]) -> None:
    name, spec, model = real_case
    check_against_model(spec, model)
    if name in PUBLISHED_TOTALS:
        assert spec.params.total == PUBLISHED_TOTALS[name]


def test_every_supported_family_is_exercised() -> None:
    from llmmem.models.architectures.remote_code import READERS as REMOTE_CODE_READERS

    covered = {config["model_type"] for config in FAMILY_CONFIGS.values()}
    # transformers cannot build the remote-code readers' models: test_remote_code.py counts
    # each of them from its modeling code
    covered |= {reader.model_type for reader in REMOTE_CODE_READERS}
    assert covered == set(SUPPORTED_MODEL_TYPES)


def test_the_family_table_names_the_module_of_every_reader() -> None:
    import llmmem.models.architectures as package

    declared = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for reader in getattr(module, "READERS", ()):
            declared[reader.model_type] = info.name
    assert declared == FAMILY_OF_MODEL_TYPE


def test_reading_a_config_imports_only_its_family() -> None:
    code = (
        "import sys\n"
        "from llmmem.models.catalog import catalog_entry\n"
        "from llmmem.models.architectures import spec_from_config\n"
        "from llmmem.models.spec import ModelSource\n"
        "entry = catalog_entry('meta-llama/Llama-3.1-8B')\n"
        "spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)\n"
        "prefix = 'llmmem.models.architectures.'\n"
        "print(sorted(m[len(prefix):] for m in sys.modules if m.startswith(prefix)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        "['assembly',",
        "'checkpoint_quantization',",
        "'config_view',",
        "'dense_decoders']",
    ]


@pytest.mark.parametrize(
    "family",
    [
        "llama",
        "gpt2",
        "gpt_bigcode-multi-query",
        "granite",
        "mixtral",
        "qwen2_moe-dense-layers",
        "gpt_oss",
        "llama4_text-interleaved",
        "smollm3",
        "phi3",
        "falcon-40b-style",
        "t5-v1.1-gated-untied",
    ],
)
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_lora_targets_match_the_spec(family: str) -> None:
    """PEFT finds every non-router Linear by its leaf name, and every fused expert tensor by its
    path, with the shapes the spec gives."""
    config = FAMILY_CONFIGS[family]
    spec = read(config)
    model = build_on_meta(config, spec)
    rank = 4
    targeted = [(group, lin) for group, lin in spec.block_linears() if lin.role != "router"]
    lora_config = LoraConfig(
        r=rank,
        target_modules=sorted({lin.name for _, lin in targeted if lin.role != "expert"}),
        target_parameters=sorted({lin.path for _, lin in targeted if lin.role == "expert"}) or None,
    )
    with torch.device("meta"):
        peft_model = get_peft_model(model, lora_config)
    found = sum(param.numel() for name, param in peft_model.named_parameters() if "lora_" in name)
    expected = sum(
        rank * (lin.in_features + lin.out_features) * lin.count * group.count
        for group, lin in targeted
    )
    assert found == expected


# --- specific facts ----------------------------------------------------------------------------


def test_llama_3_1_8b_split() -> None:
    spec = read(load_real_config("llama-3.1-8b"))
    assert spec.params.total == 8_030_261_248
    assert spec.params.embedding == spec.params.head == 128256 * 4096
    assert (spec.num_kv_heads, spec.head_dim, spec.kv_dim) == (8, 128, 1024)
    assert spec.norm == "rmsnorm" and spec.mlp == "gated" and spec.activation == "silu"
    assert spec.torch_dtype == "bfloat16"
    assert {lin.name for lin in spec.blocks[0].linears} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }


def test_llama_3_2_3b_ties_its_head() -> None:
    spec = read(load_real_config("llama-3.2-3b"))
    assert spec.tie_word_embeddings is True
    assert spec.params.head == 0
    assert spec.params.total == 3_212_749_824


def test_bert_large_masked_lm_has_no_pooler() -> None:
    spec = read(load_real_config("bert-large-uncased"))
    pooler = 1024 * 1024 + 1024
    bert_model_total = 335_141_888  # BertModel, with its pooler
    prediction_head = (
        1024 * 1024 + 1024 + 2 * 1024 + 30522
    )  # transform dense, LayerNorm, vocab bias
    assert spec.params.total == bert_model_total - pooler + prediction_head
    assert spec.architecture == "BertForMaskedLM"
    assert spec.is_causal_lm  # it has a vocabulary head


def test_moe_active_parameters() -> None:
    spec = read(load_real_config("mixtral-8x7b-v0.1"))
    per_expert = 3 * 4096 * 14336
    assert spec.params.experts == 32 * 8 * per_expert
    assert spec.params.experts_active == 32 * 2 * per_expert
    assert spec.params.router == 32 * 8 * 4096
    assert spec.params.active == spec.params.total - 32 * 6 * per_expert
    experts = [lin for lin in spec.blocks[0].linears if lin.role == "expert"]
    assert {(lin.name, lin.path, lin.count) for lin in experts} == {
        ("gate_up_proj", "mlp.experts.gate_up_proj", 8),
        ("down_proj", "mlp.experts.down_proj", 8),
    }
    assert (spec.num_experts, spec.experts_per_token) == (8, 2)


def test_qwen2_moe_shared_expert_and_dense_layers() -> None:
    spec = read(FAMILY_CONFIGS["qwen2_moe-dense-layers"])
    groups = {group.name: group for group in spec.blocks}
    assert (
        groups["decoder"].count == 1
    )  # step 2 makes blocks 1 and 3 sparse; block 3 is listed dense
    assert groups["decoder_dense"].count == 4
    roles = Counter(lin.role for lin in groups["decoder"].linears)
    assert roles == Counter(attention=4, router=2, expert=2, shared_expert=3)
    assert spec.intermediate_size == 40
    assert spec.sliding_layers == 2  # blocks 0 and 2: even and below max_window_layers


def test_gpt_oss_sinks_biases_and_alternating_window() -> None:
    spec = read(load_real_config("gpt-oss-20b"))
    assert spec.blocks[0].other_params == 64
    assert spec.params.other == 24 * 64
    assert spec.sliding_window == 128 and spec.sliding_layers == 12
    assert spec.supports_sdpa is False
    assert all(lin.bias for lin in spec.blocks[0].linears)
    assert spec.checkpoint_quantization is not None
    assert (spec.checkpoint_quantization.method, spec.checkpoint_quantization.bits) == ("mxfp4", 4)


def test_deepseek_latent_attention_sizes() -> None:
    """MLA: q and k 192 wide per head, v 128, the compressed latent cached; DeepSeek-V2-Lite's
    count is that of its published checkpoint."""
    from llmmem.models.catalog import catalog_entry

    entry = catalog_entry("deepseek-ai/DeepSeek-V2-Lite")
    assert entry is not None
    spec = read(entry.config)
    assert spec.params.total == 15_706_484_224
    assert (spec.head_dim, spec.v_head_dim, spec.num_kv_heads) == (192, 128, 16)
    assert spec.kv_cache_dim == 512 + 64
    assert spec.q_dim == spec.kv_dim == 16 * (192 + 128) // 2
    groups = {group.name: group for group in spec.blocks}
    assert (groups["decoder"].count, groups["decoder_dense"].count) == (26, 1)
    assert (spec.num_experts, spec.experts_per_token, spec.intermediate_size) == (64, 6, 1408)
    shared = [lin for lin in groups["decoder"].linears if lin.role == "shared_expert"]
    assert {lin.out_features for lin in shared if lin.name != "down_proj"} == {2 * 1408}
    assert {lin.name for lin in groups["decoder"].linears if lin.role == "attention"} == {
        "q_proj",
        "kv_a_proj_with_mqa",
        "kv_b_proj",
        "o_proj",
    }

    v3 = catalog_entry("deepseek-ai/DeepSeek-V3")
    assert v3 is not None
    spec = read(v3.config)
    assert spec.params.total == 671_026_404_352  # without the multi-token prediction layer
    assert spec.checkpoint_quantization is not None
    assert spec.checkpoint_quantization.method == "fp8"
    assert any("multi-token prediction" in note for note in spec.notes)


def test_llama4_interleaves_dense_and_sparse_blocks() -> None:
    from llmmem.models.catalog import catalog_entry

    scout = catalog_entry("meta-llama/Llama-4-Scout-17B-16E")
    maverick = catalog_entry("meta-llama/Llama-4-Maverick-17B-128E")
    assert scout is not None and maverick is not None
    spec = read(scout.config)
    assert [group.count for group in spec.blocks] == [48]
    assert (spec.num_experts, spec.experts_per_token, spec.intermediate_size) == (16, 1, 8192)
    assert (spec.sliding_window, spec.sliding_layers) == (8192, 36)  # chunked RoPE blocks
    spec = read(maverick.config)
    groups = {group.name: group for group in spec.blocks}
    assert (groups["decoder"].count, groups["decoder_dense"].count) == (24, 24)
    dense_up = [lin for lin in groups["decoder_dense"].linears if lin.name == "up_proj"]
    assert [lin.out_features for lin in dense_up] == [16384]
    assert spec.params.total == 400_711_848_960  # the text decoder; the vision encoder is apart
    assert spec.model_type == "llama4" and spec.architecture == "Llama4ForCausalLM"


def test_gemma2_softcapping_and_eager_attention() -> None:
    spec = read(load_real_config("gemma-2-9b"))
    assert spec.norm == "gemma_rmsnorm"
    assert spec.attn_logit_softcapping == 50.0 and spec.final_logit_softcapping == 30.0
    assert spec.supports_sdpa is False
    assert spec.sliding_layers == 21 and spec.sliding_window == 4096
    assert spec.torch_dtype == "float32"


def test_gemma3_multimodal_reads_the_text_decoder() -> None:
    config = load_real_config("gemma-3-4b-it")
    spec = read(config)
    assert spec.model_type == "gemma3" and spec.architecture == "Gemma3ForCausalLM"
    assert (spec.hidden_size, spec.num_layers, spec.vocab_size, spec.head_dim) == (
        2560,
        34,
        262208,
        256,
    )
    assert spec.qk_norm and spec.sliding_window == 1024
    assert spec.sliding_layers == 34 - 34 // 6
    assert any("vision" in note for note in spec.notes)
    assert spec.torch_dtype == "bfloat16"


def test_gemma3_text_part_of_the_multimodal_model() -> None:
    """A gemma3 spec is the multimodal model less its vision tower and projector."""
    config = FAMILY_CONFIGS["gemma3-multimodal"]
    spec = read(config)
    hf_config = CONFIG_MAPPING["gemma3"].from_dict(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    vision = sum(
        param.numel()
        for name, param in model.named_parameters()
        if ".vision_tower." in f".{name}" or "multi_modal_projector" in name
    )
    assert spec.params.total == sum(param.numel() for param in model.parameters()) - vision


def test_t5_relative_bias_and_untied_head() -> None:
    spec = read(load_real_config("flan-t5-base"))
    assert spec.params.total == 247_577_856
    assert spec.params.other == 2 * 32 * 12
    assert spec.params.head == 32128 * 768
    assert spec.is_encoder_decoder and spec.mlp == "gated" and spec.activation == "gelu_new"
    decoder = next(group for group in spec.blocks if group.name == "decoder")
    assert {lin.path for lin in decoder.linears} >= {
        "layer.1.EncDecAttention.q",
        "layer.2.DenseReluDense.wi_0",
        "layer.2.DenseReluDense.wi_1",
    }


def test_falcon_7b_multi_query() -> None:
    spec = read(load_real_config("falcon-7b"))
    assert spec.params.total == 6_921_720_704
    assert spec.num_kv_heads == 1 and spec.parallel_residual
    qkv = spec.blocks[0].linears[0]
    assert (qkv.name, qkv.out_features) == ("query_key_value", 4544 + 2 * 64)


def test_parallel_residual_families() -> None:
    assert read(FAMILY_CONFIGS["gptj"]).parallel_residual
    assert read(FAMILY_CONFIGS["phi-2"]).parallel_residual
    assert read(FAMILY_CONFIGS["gpt_neox"]).parallel_residual
    assert not read(FAMILY_CONFIGS["gpt_neox-sequential-no-bias"]).parallel_residual
    assert not read(FAMILY_CONFIGS["falcon-rw-style"]).parallel_residual
    assert not read(FAMILY_CONFIGS["llama"]).parallel_residual


@pytest.mark.parametrize(
    ("family", "qk_norm"),
    [
        ("qwen3-tied", True),
        ("olmo2", True),
        ("gemma3_text", True),
        ("qwen2", False),
        ("llama", False),
    ],
)
def test_qk_norm(family: str, qk_norm: bool) -> None:
    assert read(FAMILY_CONFIGS[family]).qk_norm is qk_norm


@pytest.mark.parametrize(
    ("family", "norm", "mlp"),
    [
        ("llama", "rmsnorm", "gated"),
        ("gemma2", "gemma_rmsnorm", "gated"),
        ("gpt2", "layernorm", "plain"),
        ("gpt_neox", "layernorm", "plain"),
        ("bert", "layernorm", "plain"),
        ("t5-v1.0-relu-tied", "rmsnorm", "plain"),
        ("t5-v1.1-gated-untied", "rmsnorm", "gated"),
    ],
)
def test_norm_and_mlp_kinds(family: str, norm: str, mlp: str) -> None:
    spec = read(FAMILY_CONFIGS[family])
    assert (spec.norm, spec.mlp) == (norm, mlp)


def test_defaults_mirror_the_transformers_config_classes() -> None:
    from llmmem.models.architectures.remote_code import READERS as REMOTE_CODE_READERS

    remote_code = {reader.model_type for reader in REMOTE_CODE_READERS}
    for model_type, reader in ARCHITECTURE_READERS.items():
        if model_type in remote_code:  # their config classes ship in their hub repositories
            assert not hasattr(transformers, reader.config_class), reader.config_class
            continue
        config_class = getattr(transformers, reader.config_class)
        assert config_class.model_type == model_type
        fields = {field.name: field.default for field in dataclasses.fields(config_class)}
        for key, default in reader.defaults.items():
            if key in fields:
                assert fields[key] == default, f"{reader.config_class}.{key}"


def test_defaults_are_noted() -> None:
    spec = read({"model_type": "qwen3", **SMALL, "intermediate_size": 96})
    assert spec.head_dim == 128
    assert any("Qwen3Config defaults" in note and "head_dim=128" in note for note in spec.notes)


# --- checkpoint dtype and quantization ---------------------------------------------------------


LLAMA_SMALL = FAMILY_CONFIGS["llama"]


@pytest.mark.parametrize(
    ("quantization_config", "expected"),
    [
        pytest.param(
            {
                "quant_method": "bitsandbytes",
                "load_in_4bit": True,
                "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": True,
                "bnb_4bit_compute_dtype": "bfloat16",
            },
            ("bitsandbytes", 4, "nf4", True, None),
            id="bnb-nf4-double",
        ),
        pytest.param(
            {"quant_method": "bitsandbytes", "load_in_8bit": True},
            ("bitsandbytes", 8, None, False, None),
            id="bnb-int8",
        ),
        pytest.param(
            {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
            ("gptq", 4, None, False, 128),
            id="gptq",
        ),
        pytest.param(
            {"quant_method": "gptq", "bits": 8, "group_size": -1},
            ("gptq", 8, None, False, None),
            id="gptq-per-row",
        ),
        pytest.param(
            {"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "zero_point": True},
            ("awq", 4, None, False, 128),
            id="awq-autoawq-keys",
        ),
        pytest.param(
            {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm"},
            ("awq", 4, None, False, 64),
            id="awq-hf-keys",
        ),
        pytest.param(
            {
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "weight_block_size": [128, 128],
            },
            ("fp8", 8, None, False, None),
            id="fp8",
        ),
        pytest.param(
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 4, "type": "int", "group_size": 128}}
                },
            },
            ("compressed-tensors", 4, "int", False, 128),
            id="compressed-tensors",
        ),
    ],
)
def test_checkpoint_quantization(
    quantization_config: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    spec = read({**LLAMA_SMALL, "quantization_config": quantization_config})
    quant = spec.checkpoint_quantization
    assert quant is not None
    assert (
        quant.method,
        quant.bits,
        quant.quant_type,
        quant.double_quant,
        quant.group_size,
    ) == expected


def test_unknown_quantization_method_is_noted() -> None:
    spec = read({**LLAMA_SMALL, "quantization_config": {"quant_method": "mystery"}})
    assert spec.checkpoint_quantization is not None
    assert any("mystery" in note for note in spec.notes)


def test_unquantized_checkpoint() -> None:
    assert read(LLAMA_SMALL).checkpoint_quantization is None


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        ({"torch_dtype": "bfloat16"}, "bfloat16"),
        ({"dtype": "float16"}, "float16"),
        ({"torch_dtype": "torch.float32"}, "float32"),
        ({}, None),
    ],
    ids=["torch_dtype", "dtype", "torch-prefix", "absent"],
)
def test_declared_dtype(declared: dict[str, str], expected: str | None) -> None:
    assert read({**LLAMA_SMALL, **declared}).torch_dtype == expected


# --- errors ------------------------------------------------------------------------------------


def test_unknown_model_type() -> None:
    with pytest.raises(ModelSpecError) as caught:
        read({"model_type": "rwkv7", "hidden_size": 64})
    message = str(caught.value)
    assert "rwkv7" in message and "llama" in message and "\n" not in message


def test_config_without_model_type() -> None:
    with pytest.raises(ModelSpecError, match="model_type"):
        read({"hidden_size": 64})


@pytest.mark.parametrize(
    "missing", ["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size"]
)
def test_missing_size_key(missing: str) -> None:
    config = {key: value for key, value in LLAMA_SMALL.items() if key != missing}
    with pytest.raises(ModelSpecError) as caught:
        read(config)
    message = str(caught.value)
    assert missing in message and "llama" in message and "supported" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "bad",
    [
        {"hidden_size": "4096"},
        {"hidden_size": 0},
        {"hidden_size": None},
        {"num_hidden_layers": 2.5},
    ],
    ids=["string", "zero", "null", "fraction"],
)
def test_malformed_size_key(bad: dict[str, Any]) -> None:
    with pytest.raises(ModelSpecError):
        read({**LLAMA_SMALL, **bad})


def test_gemma3_without_text_config() -> None:
    with pytest.raises(ModelSpecError, match="text_config"):
        read({"model_type": "gemma3"})


def test_missing_key_of_an_aliased_family() -> None:
    with pytest.raises(ModelSpecError, match="n_embd"):
        read({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "vocab_size": 10})


def test_spec_from_config_goes_through_the_reader() -> None:
    spec = spec_from_config(
        LLAMA_SMALL, model_id="tiny", source=ModelSource.LOCAL, source_detail="/x"
    )
    assert (spec.model_id, spec.source, spec.source_detail) == ("tiny", ModelSource.LOCAL, "/x")


# --- the reader stays light --------------------------------------------------------------------


def test_import_does_not_pull_in_torch_or_transformers() -> None:
    probe = (
        "import sys\n"
        "from llmmem.models.architectures import read_architecture\n"
        "from llmmem.models.spec import ModelSource\n"
        "config = {'model_type': 'llama', 'hidden_size': 8, 'num_hidden_layers': 1,"
        " 'num_attention_heads': 2, 'intermediate_size': 8, 'vocab_size': 10}\n"
        "read_architecture(config, model_id='m', source=ModelSource.CONFIG)\n"
        "print(sorted(name for name in ('torch', 'transformers') if name in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.filterwarnings(
    "ignore::FutureWarning", "ignore::UserWarning", "ignore::RuntimeWarning"
)
def test_peft_moves_mlp_targets_of_deepseek_to_the_routed_experts() -> None:
    """A fact the LoRA budget of these models depends on (peft 0.21, transformers 5.24): for
    the MoE types transformers 5 converts like Qwen2-MoE (deepseek_v2, deepseek_v3, qwen3_moe,
    ...), PEFT turns the module targets gate_proj/up_proj/down_proj into the fused expert
    parameters, gate_up_proj at twice the rank, and no longer adapts the dense and shared-expert
    MLP Linears of those names."""
    config = FAMILY_CONFIGS["deepseek_v2-lite-style"]
    spec = read(config)
    model = build_on_meta(config, spec)
    rank = 4
    with torch.device("meta"):
        peft_model = get_peft_model(
            model,
            LoraConfig(r=rank, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"]),
        )
    adapted = {
        name.split(".lora_")[0].split(".layers.")[1].split(".", 1)[1]
        for name, _ in peft_model.named_parameters()
        if "lora_" in name
    }
    assert adapted == {"self_attn.q_proj", "mlp.experts", "mlp.experts.base_layer"}
    sparse = next(group for group in spec.blocks if group.num_experts)
    hidden, width, experts = spec.hidden_size, spec.intermediate_size, sparse.num_experts
    per_block = experts * (2 * rank * (hidden + 2 * width) + rank * (width + hidden))
    found = sum(
        param.numel()
        for name, param in peft_model.named_parameters()
        if "lora_" in name and ".mlp.experts" in name
    )
    assert found == per_block * sparse.count

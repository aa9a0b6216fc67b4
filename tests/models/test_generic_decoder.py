"""A decoder whose `model_type` llmmem has no reader for is sized from its config.json, and says so.

Checked against the real transformers class built on the meta device."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import transformers

from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource, ModelSpecError

# Helium (kyutai) has no reader of its own: the Llama layout, grouped-query heads
HELIUM = {
    "model_type": "helium",
    "architectures": ["HeliumForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,  # stated, as published configs do: HeliumConfig's own default is 128
    "intermediate_size": 96,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}


def _real_count(config: dict[str, Any]) -> int:
    cfg = copy.deepcopy(config)
    cfg.pop("architectures", None)
    model_type = cfg.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


def test_an_unknown_llama_style_decoder_is_sized_exactly_and_says_how() -> None:
    spec = spec_from_config(HELIUM, model_id="kyutai/helium-tiny", source=ModelSource.LOCAL)
    assert spec.total_params == _real_count(HELIUM)
    assert spec.architecture == "HeliumForCausalLM"
    assert spec.num_kv_heads == 2 and spec.head_dim == 16
    assert any("generic decoder" in note for note in spec.notes)


def test_gpt_spellings_and_multi_query_are_read() -> None:
    config = {
        "model_type": "my_coder",
        "n_embd": 2048,
        "n_layer": 24,
        "n_head": 16,
        "n_inner": 8192,
        "n_positions": 2048,
        "multi_query": True,
        "vocab_size": 49280,
    }
    spec = spec_from_config(config, model_id="org/coder", source=ModelSource.LOCAL)
    # laid out as GPT-BigCode (SantaCoder's shapes): the same count as its real class
    santacoder = dict(config, model_type="gpt_bigcode")
    assert spec.total_params == _real_count(santacoder) == 1_124_886_528
    assert spec.num_kv_heads == 1 and spec.vocab_size == 49280 and spec.norm == "layernorm"


def test_a_config_without_a_decoders_sizes_is_still_refused() -> None:
    with pytest.raises(ModelSpecError, match="not supported"):
        spec_from_config(
            {"model_type": "whisper", "d_model": 64, "vocab_size": 100},
            model_id="x/y",
            source=ModelSource.LOCAL,
        )

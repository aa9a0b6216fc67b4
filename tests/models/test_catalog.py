"""The bundled model catalog: lookups, and that every bundled config builds in transformers with
exactly the published parameter count (which keeps the bundled data honest)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from functools import lru_cache
from importlib import resources
from typing import Any

import pytest

from llmmem.models.catalog import (
    CatalogEntry,
    CatalogError,
    _Index,
    catalog_entry,
    catalog_ids,
    close_catalog_ids,
)

ALL_IDS = catalog_ids()


def _raw_files() -> dict[str, dict[str, Any]]:
    folder = resources.files("llmmem.models").joinpath("catalog")
    return {
        item.name: json.loads(item.read_text(encoding="utf-8"))
        for item in folder.iterdir()
        if item.name.endswith(".json")
    }


# ---------------------------------------------------------------- the data


def test_catalog_is_large_enough_and_ids_are_unique_across_files() -> None:
    files = _raw_files()
    ids = [model_id for data in files.values() for model_id in data]
    assert len(ids) == len(set(ids)), "an id appears in two catalog files"
    assert len(ids) == len(ALL_IDS) >= 70
    assert len(files) >= 6


def test_every_entry_is_well_formed() -> None:
    for name, data in _raw_files().items():
        for model_id, entry in data.items():
            where = f"{name}: {model_id}"
            assert model_id.count("/") == 1, where
            assert set(entry) <= {"config", "params", "note", "aliases"}, where
            assert isinstance(entry["note"], str) and entry["note"], where
            params = entry["params"]
            assert params is None or (isinstance(params, int) and params > 0), where
            config = entry["config"]
            assert isinstance(config.get("model_type"), str), where
            assert isinstance(config.get("architectures"), list), where
            assert len(config["architectures"]) == 1, where
            for alias in entry.get("aliases", []):
                assert alias.lower() != model_id.lower(), where


def test_the_requested_families_are_all_there() -> None:
    for model_id in [
        "meta-llama/Llama-2-7b-hf",
        "meta-llama/Llama-3.1-405B",
        "meta-llama/Llama-3.3-70B-Instruct",
        "mistralai/Mixtral-8x22B-v0.1",
        "Qwen/Qwen2.5-72B-Instruct",
        "Qwen/Qwen3-30B-A3B",
        "Qwen/Qwen1.5-MoE-A2.7B",
        "google/gemma-3-27b-it",
        "microsoft/phi-4",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "openai-community/gpt2-xl",
        "google-t5/t5-small",
        "google/mt5-base",
        "facebook/opt-350m",
        "tiiuae/falcon-40b",
        "bigscience/bloomz-560m",
        "EleutherAI/gpt-j-6b",
        "bigcode/starcoder2-7b",
        "allenai/OLMo-2-1124-7B",
        "openai/gpt-oss-120b",
        "unsloth/mistral-7b-v0.3-bnb-4bit",
        "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
        "deepseek-ai/DeepSeek-V2-Lite",
        "deepseek-ai/DeepSeek-V3",
        "moonshotai/Moonlight-16B-A3B",
        "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "meta-llama/Llama-4-Maverick-17B-128E",
        "HuggingFaceTB/SmolLM-135M",
        "HuggingFaceTB/SmolLM3-3B",
        "microsoft/Phi-4-mini-instruct",
        "mistralai/Mistral-Small-24B-Instruct-2501",
        "bigcode/gpt_bigcode-santacoder",
        "ibm/PowerLM-3b",
        "zai-org/GLM-4.5-Air",
        "Qwen/Qwen3-235B-A22B",
        "google/gemma-3-270m",
    ]:
        assert model_id in ALL_IDS, model_id


def test_prequantized_repos_carry_their_quantization_config() -> None:
    for model_id in [
        "unsloth/llama-3-8b-bnb-4bit",
        "unsloth/Meta-Llama-3.1-8B-bnb-4bit",
        "unsloth/mistral-7b-v0.3-bnb-4bit",
    ]:
        entry = catalog_entry(model_id)
        assert entry is not None
        quant = entry.config["quantization_config"]
        assert quant["quant_method"] == "bitsandbytes"
        assert quant["load_in_4bit"] is True
        assert quant["bnb_4bit_quant_type"] == "nf4"
    oss = catalog_entry("openai/gpt-oss-20b")
    assert oss is not None and oss.config["quantization_config"]["quant_method"] == "mxfp4"


# ---------------------------------------------------------------- lookups


def test_lookup_by_full_id_returns_the_canonical_entry() -> None:
    entry = catalog_entry("meta-llama/Llama-3.1-8B")
    assert isinstance(entry, CatalogEntry)
    assert entry.model_id == "meta-llama/Llama-3.1-8B"
    assert entry.params == 8_030_261_248
    assert entry.config["model_type"] == "llama"
    assert entry.config["num_key_value_heads"] == 8


@pytest.mark.parametrize(
    ("name", "model_id"),
    [
        ("META-LLAMA/llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("  meta-llama/Llama-3.1-8B  ", "meta-llama/Llama-3.1-8B"),
        ("Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        ("llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("qwen3-0.6b", "Qwen/Qwen3-0.6B"),
        ("gpt2", "openai-community/gpt2"),
        ("GPT2-XL", "openai-community/gpt2-xl"),
        ("bert-large-uncased", "google-bert/bert-large-uncased"),
        ("t5-small", "google-t5/t5-small"),
        ("roberta-base", "FacebookAI/roberta-base"),
        ("meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        ("meta-llama/meta-llama-3.1-70b-instruct", "meta-llama/Llama-3.1-70B-Instruct"),
        ("Meta-Llama-3.1-405B", "meta-llama/Llama-3.1-405B"),
        ("unsloth/LLAMA-3-8B-BNB-4BIT", "unsloth/llama-3-8b-bnb-4bit"),
    ],
)
def test_lookup_by_case_alias_and_bare_name(name: str, model_id: str) -> None:
    entry = catalog_entry(name)
    assert entry is not None, name
    assert entry.model_id == model_id


@pytest.mark.parametrize(
    "name",
    ["", "   ", "nobody/nothing-1B", "Llama-9.9-1B", "someorg/Llama-3.1-8B", "meta-llama"],
)
def test_unknown_names_are_none(name: str) -> None:
    assert catalog_entry(name) is None


def test_a_bare_name_shared_by_two_orgs_is_not_guessed() -> None:
    index = _Index.from_raw(
        {
            "org-a/Model-7B": {"config": {"model_type": "llama"}, "params": None, "note": "a"},
            "org-b/model-7b": {"config": {"model_type": "llama"}, "params": None, "note": "b"},
            "org-a/Only-1B": {"config": {"model_type": "llama"}, "params": 1, "note": "c"},
        }
    )
    assert index.entry("Model-7B") is None
    assert index.entry("org-b/MODEL-7B").model_id == "org-b/model-7b"  # type: ignore[union-attr]
    assert index.entry("only-1b").model_id == "org-a/Only-1B"  # type: ignore[union-attr]
    assert set(index.close("model-7", 5)) == {"org-a/Model-7B", "org-b/model-7b"}


def test_an_alias_naming_two_entries_is_a_catalog_error() -> None:
    with pytest.raises(CatalogError):
        _Index.from_raw(
            {
                "a/x": {"config": {}, "params": None, "note": "", "aliases": ["x-alias"]},
                "b/y": {"config": {}, "params": None, "note": "", "aliases": ["X-ALIAS"]},
            }
        )


def test_returned_config_is_a_copy() -> None:
    first = catalog_entry("Qwen/Qwen2.5-7B")
    assert first is not None
    first.config["hidden_size"] = 1
    first.config.clear()
    again = catalog_entry("Qwen/Qwen2.5-7B")
    assert again is not None and again.config["hidden_size"] == 3584


def test_catalog_ids_are_sorted_canonical_ids() -> None:
    assert ALL_IDS == sorted(ALL_IDS, key=str.lower)
    assert "gpt2" not in ALL_IDS  # an alias, not an id
    assert "openai-community/gpt2" in ALL_IDS


def test_close_ids_suggest_near_misses() -> None:
    assert close_catalog_ids("llama-3.1-8")[0] == "meta-llama/Llama-3.1-8B"
    assert "Qwen/Qwen2.5-7B-Instruct" in close_catalog_ids("Qwen2.5-7B-Instruc")
    assert "meta-llama/Llama-3.1-8B" in close_catalog_ids("meta-llama/Llama-3.1-7B")
    assert "mistralai/Mistral-7B-v0.3" in close_catalog_ids("mistral-7b-v3")
    assert len(close_catalog_ids("llama", n=3)) <= 3
    assert close_catalog_ids("zzzzzzzzzzzzzzzz") == []
    assert close_catalog_ids("") == []


def test_importing_the_catalog_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys\n"
        "from llmmem.models.catalog import catalog_entry, catalog_ids, close_catalog_ids\n"
        "assert catalog_entry('gpt2') is not None and len(catalog_ids()) >= 70\n"
        "close_catalog_ids('llama')\n"
        "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


# ---------------------------------------------------------------- build on meta, count exactly


@lru_cache(maxsize=1)
def _transformers() -> Any:
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def _auto_class(transformers: Any, config: dict[str, Any]) -> Any:
    arch = config["architectures"][0]
    if arch.endswith("ForMaskedLM"):
        return transformers.AutoModelForMaskedLM
    if config.get("is_encoder_decoder"):
        return transformers.AutoModelForSeq2SeqLM
    if "vision_config" in config:  # gemma3: text decoder plus vision tower
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def _meta_param_count(config: dict[str, Any]) -> tuple[str, int]:
    """Build the model on the meta device (no memory, no init) and count its parameters."""
    import torch

    transformers = _transformers()
    cfg = copy.deepcopy(config)
    # a quantization_config only matters to from_pretrained; the shapes are the unquantized ones
    cfg.pop("quantization_config", None)
    model_type = cfg.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        model = _auto_class(transformers, config).from_config(hf_config)
    count = sum(p.numel() for p in model.parameters())  # tied weights counted once
    # T5 v1.1 / mT5 / Flan-T5 publish an untied lm_head (tie_word_embeddings: false), but recent
    # transformers releases force T5's lm_head onto the shared embeddings; count the published
    # layout, where the lm_head is a separate (vocab x d_model) matrix.
    if config.get("tie_word_embeddings") is False and model_type in ("t5", "mt5"):
        head, embed = model.get_output_embeddings(), model.get_input_embeddings()
        if head is not None and head.weight is embed.weight:
            count += head.weight.numel()
    return type(model).__name__, count


def _remote_code_model_types() -> set[str]:
    from llmmem.models.architectures.remote_code import READERS

    # Phi-3-vision's class is remote code too (test_phi3_vision.py counts its parts)
    return {reader.model_type for reader in READERS} | {"phi3_v"}


# model types whose hub config names its remote-code class while transformers builds another
# class of the same modules (transformers 5 reads internlm3 configs into LlamaForCausalLM)
TRANSFORMERS_CLASS = {"internlm3": "LlamaForCausalLM"}


@pytest.mark.parametrize("model_id", ALL_IDS)
def test_config_builds_with_the_published_parameter_count(model_id: str) -> None:
    entry = catalog_entry(model_id)
    assert entry is not None and entry.model_id == model_id
    if entry.config["model_type"] in _remote_code_model_types():
        # transformers cannot build these without their hub repository's code:
        # test_remote_code.py counts their modules from that code instead
        from llmmem.models.architectures import spec_from_config
        from llmmem.models.spec import ModelSource

        spec = spec_from_config(entry.config, model_id=model_id, source=ModelSource.CATALOG)
        whole = spec.vision.architecture if spec.vision is not None else spec.architecture
        assert whole == entry.config["architectures"][0]
        assert spec.total_params == entry.params
        return
    arch, count = _meta_param_count(entry.config)
    model_type = entry.config["model_type"]
    assert arch == TRANSFORMERS_CLASS.get(model_type, entry.config["architectures"][0])
    if entry.params is not None:
        assert count == entry.params, f"{model_id}: built {count:,}, catalog says {entry.params:,}"


def test_most_entries_carry_an_exact_count() -> None:
    known = [i for i in ALL_IDS if catalog_entry(i).params is not None]  # type: ignore[union-attr]
    assert len(known) >= 0.9 * len(ALL_IDS)


def test_encoder_counts_are_for_the_masked_lm_class() -> None:
    # BertForMaskedLM drops the pooler and adds the MLM head; BertModel would be 335,141,888
    entry = catalog_entry("bert-large-uncased")
    assert entry is not None and entry.params == 335_174_458
    assert entry.config["architectures"] == ["BertForMaskedLM"]

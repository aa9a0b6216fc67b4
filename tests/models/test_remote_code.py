"""The readers of models whose modeling code ships in their hub repository (Qwen 1, Baichuan 2,
InternLM2, ChatGLM): transformers cannot build them, so each test counts the tensors the
repository's modeling code creates, module by module, and the reader must give the same count and
names."""

from __future__ import annotations

from typing import Any

import pytest

from llmmem.models.architectures import spec_from_config
from llmmem.models.architectures.remote_code import READERS
from llmmem.models.catalog import catalog_entry
from llmmem.models.spec import ModelSource


def read(config: dict[str, Any]) -> Any:
    return spec_from_config(config, model_id="test", source=ModelSource.CONFIG)


def linear(rows: int, cols: int, bias: bool) -> int:
    return rows * cols + (rows if bias else 0)


def qwen_count(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int) -> int:
    """modeling_qwen.py: wte; per QWenBlock ln_1 and ln_2 (RMSNorm weights), attn.c_attn
    Linear(hidden, 3 * heads * kv_channels) with a bias, attn.c_proj without (no_bias), mlp.w1 and
    mlp.w2 Linear(hidden, intermediate_size // 2), mlp.c_proj back; ln_f; an untied lm_head."""
    projection, half = heads * kv, inter // 2
    block = (
        2 * hidden
        + linear(3 * projection, hidden, True)
        + linear(hidden, projection, False)
        + 2 * linear(half, hidden, False)
        + linear(hidden, half, False)
    )
    return 2 * vocab * hidden + layers * block + hidden


def baichuan_count(hidden: int, layers: int, inter: int, vocab: int) -> int:
    """modeling_baichuan.py: embed_tokens; per layer W_pack Linear(hidden, 3 * hidden, bias=False),
    o_proj, gate/up/down projections, two RMSNorms; norm; NormHead (vocab x hidden weight)."""
    block = 3 * hidden * hidden + hidden * hidden + 3 * hidden * inter + 2 * hidden
    return 2 * vocab * hidden + layers * block + hidden


def internlm2_count(
    hidden: int, layers: int, heads: int, kv_heads: int, inter: int, vocab: int
) -> int:
    """modeling_internlm2.py: tok_embeddings; per layer attention.wqkv Linear(hidden, (heads + 2 *
    kv_heads) * head_dim), attention.wo, feed_forward.w1/w3/w2 (no biases), attention_norm and
    ffn_norm; norm; an untied output head."""
    head_dim = hidden // heads
    qkv = (heads + 2 * kv_heads) * head_dim
    block = qkv * hidden + hidden * hidden + 3 * hidden * inter + 2 * hidden
    return 2 * vocab * hidden + layers * block + hidden


def chatglm_count(hidden: int, layers: int, heads: int, groups: int, ffn: int, vocab: int) -> int:
    """modeling_chatglm.py: embedding.word_embeddings; per GLMBlock input_layernorm and
    post_attention_layernorm (RMSNorm), self_attention.query_key_value Linear(hidden, heads *
    kv_channels + 2 * groups * kv_channels) with a bias (add_qkv_bias), self_attention.dense,
    mlp.dense_h_to_4h Linear(hidden, 2 * ffn_hidden_size), mlp.dense_4h_to_h; final_layernorm;
    an untied output_layer. kv_channels = hidden / heads here."""
    head_dim = hidden // heads
    qkv = heads * head_dim + 2 * groups * head_dim
    block = 2 * hidden + linear(qkv, hidden, True) + hidden * hidden + 3 * hidden * ffn
    return 2 * vocab * hidden + layers * block + hidden


def test_qwen_1_counts_c_attn_and_halves_intermediate_size() -> None:
    config = {
        "model_type": "qwen",
        "architectures": ["QWenLMHeadModel"],
        "hidden_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "kv_channels": 16,
        "intermediate_size": 344,  # w1 and w2 are 172 wide each
        "vocab_size": 1000,
        "no_bias": True,
    }
    spec = read(config)
    assert spec.total_params == qwen_count(64, 3, 4, 16, 344, 1000)
    names = {lin.name: lin for lin in spec.blocks[0].linears}
    assert set(names) == {"c_attn", "c_proj", "w1", "w2"}  # attn.c_proj and mlp.c_proj share a name
    assert names["w1"].out_features == names["w2"].out_features == 172
    assert names["c_attn"].bias and names["c_attn"].out_features == 3 * 64
    assert spec.intermediate_size == 172
    assert spec.architecture == "QWenLMHeadModel"


def test_baichuan_2_counts_w_pack() -> None:
    config = {
        "model_type": "baichuan",
        "architectures": ["BaichuanForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 1000,
    }
    spec = read(config)
    assert spec.total_params == baichuan_count(64, 2, 176, 1000)
    assert "W_pack" in {lin.name for lin in spec.blocks[0].linears}


def test_internlm2_counts_grouped_wqkv() -> None:
    config = {
        "model_type": "internlm2",
        "architectures": ["InternLM2ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 224,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    spec = read(config)
    assert spec.total_params == internlm2_count(64, 2, 8, 2, 224, 1000)
    assert {lin.name for lin in spec.blocks[0].linears} == {"wqkv", "wo", "w1", "w2", "w3"}


def test_chatglm_counts_query_key_value_and_dense_h_to_4h() -> None:
    config = {
        "model_type": "chatglm",
        "architectures": ["ChatGLMModel"],
        "hidden_size": 64,
        "ffn_hidden_size": 176,
        "num_layers": 2,
        "num_attention_heads": 8,
        "kv_channels": 8,
        "multi_query_attention": True,
        "multi_query_group_num": 2,
        "add_qkv_bias": True,
        "padded_vocab_size": 1000,
    }
    spec = read(config)
    assert spec.total_params == chatglm_count(64, 2, 8, 2, 176, 1000)
    names = {lin.name: lin for lin in spec.blocks[0].linears}
    assert set(names) == {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}
    assert names["dense_h_to_4h"].out_features == 2 * 176
    assert spec.num_kv_heads == 2


@pytest.mark.parametrize(
    ("model_id", "count", "published"),
    [
        # the Qwen technical report and model cards: 1.8B, 7.7B, 14.2B, 72.3B
        ("Qwen/Qwen-1_8B", qwen_count(2048, 24, 16, 128, 11008, 151936), 1.8e9),
        ("Qwen/Qwen-7B-Chat", qwen_count(4096, 32, 32, 128, 22016, 151936), 7.7e9),
        ("Qwen/Qwen-14B", qwen_count(5120, 40, 40, 128, 27392, 152064), 14.2e9),
        ("Qwen/Qwen-72B-Chat", qwen_count(8192, 80, 64, 128, 49152, 152064), 72.3e9),
        ("baichuan-inc/Baichuan2-7B-Chat", baichuan_count(4096, 32, 11008, 125696), 7.5e9),
        ("baichuan-inc/Baichuan2-13B-Base", baichuan_count(5120, 40, 13696, 125696), 13.9e9),
        ("internlm/internlm2_5-7b-chat", internlm2_count(4096, 32, 32, 8, 14336, 92544), 7.74e9),
        ("internlm/internlm2-chat-1_8b", internlm2_count(2048, 24, 16, 8, 8192, 92544), 1.89e9),
        ("internlm/internlm2-20b", internlm2_count(6144, 48, 48, 8, 16384, 92544), 19.9e9),
        # the GLM-4 report: 9.4B; the ChatGLM3-6B model card: 6.2B
        ("THUDM/glm-4-9b-chat", chatglm_count(4096, 40, 32, 2, 13696, 151552), 9.4e9),
        ("THUDM/chatglm3-6b", chatglm_count(4096, 28, 32, 2, 13696, 65024), 6.24e9),
    ],
)
def test_bundled_remote_code_models_count_as_their_modeling_code(
    model_id: str, count: int, published: float
) -> None:
    entry = catalog_entry(model_id)
    assert entry is not None
    spec = read(entry.config)
    assert spec.total_params == entry.params == count
    assert abs(count / published - 1) < 0.025  # the published figure, rounded


def test_every_remote_code_reader_is_counted_here() -> None:
    tested = {"qwen", "baichuan", "internlm2", "chatglm"}
    assert {reader.model_type for reader in READERS} == tested

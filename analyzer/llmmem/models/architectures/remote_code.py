"""Decoders whose modeling code ships in their hub repository (`trust_remote_code=True`), not in
transformers: Qwen (1), Baichuan 2 and InternLM2. Their module names are their own, and LoRA
targets and quantized modules are counted by them.

- Qwen (`QWenLMHeadModel`, model_type "qwen"): `transformer.h[i]` holds `ln_1`, `attn.c_attn`
  (query, key and value fused, with a bias), `attn.c_proj` (no bias), `ln_2`, `mlp.w1`, `mlp.w2`
  and `mlp.c_proj`. Its `intermediate_size` is the sum of the two gated halves: w1 and w2 are each
  `intermediate_size // 2` wide (modeling_qwen.py: `nn.Linear(hidden, intermediate_size // 2)`).
  RMSNorm everywhere, an untied `lm_head`, `kv_channels` per head.
- Baichuan 2 (`BaichuanForCausalLM`, model_type "baichuan"): Llama's block with query, key and
  value fused as `self_attn.W_pack` (no bias); the head is a `NormHead` (a weight only). The 13B
  uses ALiBi instead of rotary positions, which has no parameters.
- InternLM2 (`InternLM2ForCausalLM`, model_type "internlm2"): `attention.wqkv` (grouped heads
  fused), `attention.wo`, `feed_forward.w1`/`w3` (gate, up) and `w2` (down), `attention_norm`
  and `ffn_norm` (RMSNorm), `tok_embeddings` and an untied `output` head.
- ChatGLM (`ChatGLMModel`, model_type "chatglm": ChatGLM3-6B, GLM-4-9B-Chat): Megatron's names,
  `self_attention.query_key_value` (grouped heads fused, a bias with `add_qkv_bias`),
  `self_attention.dense`, `mlp.dense_h_to_4h` (gate and up, 2 × `ffn_hidden_size`) and
  `mlp.dense_4h_to_h`; RMSNorm (LayerNorm without `rmsnorm`), `padded_vocab_size` embeddings and
  an untied `output_layer`.
"""

from __future__ import annotations

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    decoder_group,
    decoder_only_spec,
    linear,
    read_rope_decoder_dims,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.spec import ModelSpec

# --- Qwen (1) ----------------------------------------------------------------------------------

QWEN_DEFAULTS = {
    "kv_channels": 128,
    "no_bias": True,
    "tie_word_embeddings": False,
    "max_position_embeddings": 8192,
}


def read_qwen(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    hidden = view.required_int("hidden_size")
    heads = view.required_int("num_attention_heads")
    head_dim = view.int_or(hidden // heads, "kv_channels")
    gated = view.required_int("intermediate_size") // 2  # w1 and w2 are half of it each
    dims = Dims(
        hidden=hidden,
        layers=view.required_int("num_hidden_layers"),
        heads=heads,
        kv_heads=heads,
        head_dim=head_dim,
        intermediate=gated,
        vocab=view.required_int("vocab_size"),
        tie_embeddings=view.flag("tie_word_embeddings"),
        max_positions=view.optional_int("max_position_embeddings", "seq_length"),
    )
    bias = not view.flag("no_bias")
    projection = heads * head_dim
    linears = [
        linear("attn.c_attn", hidden, 3 * projection, bias=True, role="attention"),
        linear("attn.c_proj", projection, hidden, bias=bias, role="attention"),
        linear("mlp.w1", hidden, gated, bias=bias, role="mlp"),
        linear("mlp.w2", hidden, gated, bias=bias, role="mlp"),
        linear("mlp.c_proj", gated, hidden, bias=bias, role="mlp"),
    ]
    return decoder_only_spec(
        view,
        origin,
        architecture="QWenLMHeadModel",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * hidden)],
        final_norms=hidden,
        norm="rmsnorm",
        mlp="gated",
        activation="silu",
        notes=[
            "Qwen (1) runs remote code: query, key and value fused as c_attn, the MLP as w1, w2 "
            f"and c_proj, each half of intermediate_size ({gated} wide)"
        ],
    )


# --- Baichuan 2 --------------------------------------------------------------------------------

BAICHUAN_DEFAULTS = {"tie_word_embeddings": False, "hidden_act": "silu"}


def read_baichuan(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    hidden, intermediate = dims.hidden, dims.intermediate
    linears = [
        linear("self_attn.W_pack", hidden, 3 * hidden, role="attention"),
        linear("self_attn.o_proj", hidden, hidden, role="attention"),
        linear("mlp.gate_proj", hidden, intermediate, role="mlp"),
        linear("mlp.up_proj", hidden, intermediate, role="mlp"),
        linear("mlp.down_proj", intermediate, hidden, role="mlp"),
    ]
    return decoder_only_spec(
        view,
        origin,
        architecture="BaichuanForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * hidden)],
        final_norms=hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        notes=["Baichuan 2 runs remote code: query, key and value fused as W_pack"],
    )


# --- InternLM2 ---------------------------------------------------------------------------------

INTERNLM2_DEFAULTS = {
    "num_key_value_heads": None,
    "bias": False,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


def read_internlm2(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    hidden, intermediate = dims.hidden, dims.intermediate
    bias = view.flag("bias")
    qkv = (dims.heads + 2 * dims.kv_heads) * dims.head_dim
    linears = [
        linear("attention.wqkv", hidden, qkv, bias=bias, role="attention"),
        linear("attention.wo", dims.heads * dims.head_dim, hidden, bias=bias, role="attention"),
        linear("feed_forward.w1", hidden, intermediate, role="mlp"),
        linear("feed_forward.w3", hidden, intermediate, role="mlp"),
        linear("feed_forward.w2", intermediate, hidden, role="mlp"),
    ]
    return decoder_only_spec(
        view,
        origin,
        architecture="InternLM2ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * hidden)],
        final_norms=hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        notes=["InternLM2 runs remote code: grouped query, key and value fused as wqkv"],
    )


# --- ChatGLM -----------------------------------------------------------------------------------

CHATGLM_DEFAULTS = {
    "add_bias_linear": False,
    "add_qkv_bias": False,
    "multi_query_attention": False,
    "rmsnorm": True,
    "post_layer_norm": True,
    "tie_word_embeddings": False,
}


def read_chatglm(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    hidden = view.required_int("hidden_size")
    heads = view.required_int("num_attention_heads")
    head_dim = view.int_or(hidden // heads, "kv_channels")
    groups = (
        view.int_or(heads, "multi_query_group_num") if view.flag("multi_query_attention") else heads
    )
    ffn = view.required_int("ffn_hidden_size")
    dims = Dims(
        hidden=hidden,
        layers=view.required_int("num_layers"),
        heads=heads,
        kv_heads=groups,
        head_dim=head_dim,
        intermediate=ffn,
        vocab=view.required_int("padded_vocab_size", "vocab_size"),
        tie_embeddings=False,
        max_positions=view.optional_int("seq_length"),
    )
    bias = view.flag("add_bias_linear")
    qkv_bias = bias or view.flag("add_qkv_bias")
    projection = heads * head_dim
    linears = [
        linear(
            "self_attention.query_key_value",
            hidden,
            projection + 2 * groups * head_dim,
            bias=qkv_bias,
            role="attention",
        ),
        linear("self_attention.dense", projection, hidden, bias=bias, role="attention"),
        linear("mlp.dense_h_to_4h", hidden, 2 * ffn, bias=bias, role="mlp"),
        linear("mlp.dense_4h_to_h", ffn, hidden, bias=bias, role="mlp"),
    ]
    rms = view.flag("rmsnorm")
    norm_width = hidden if rms else 2 * hidden
    architecture = (view.text_list("architectures") or ["ChatGLMModel"])[0]
    return decoder_only_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * norm_width)],
        final_norms=norm_width if view.flag("post_layer_norm") else 0,
        norm="rmsnorm" if rms else "layernorm",
        mlp="gated",
        activation="silu",
        notes=[
            "ChatGLM runs remote code: grouped query, key and value fused as query_key_value, "
            "gate and up as dense_h_to_4h"
        ],
    )


READERS = [
    ArchitectureReader("qwen", "QWenConfig", QWEN_DEFAULTS, read_qwen),
    ArchitectureReader("baichuan", "BaichuanConfig", BAICHUAN_DEFAULTS, read_baichuan),
    ArchitectureReader("internlm2", "InternLM2Config", INTERNLM2_DEFAULTS, read_internlm2),
    ArchitectureReader("chatglm", "ChatGLMConfig", CHATGLM_DEFAULTS, read_chatglm),
]

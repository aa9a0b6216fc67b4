"""GPT-style decoders with LayerNorm and a plain MLP: GPT-2, GPT-BigCode (SantaCoder, StarCoder),
GPT-NeoX (Pythia, StableLM-alpha), GPT-J, OPT, Falcon, BLOOM and Phi-1/1.5/2."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    attention_projections,
    build_spec,
    decoder_group,
    decoder_only_spec,
    layer_norm_params,
    linear,
    lm_head_params,
    multi_head_dims,
    plain_mlp,
    read_multi_head_dims,
    read_rope_decoder_dims,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.spec import LinearModule, ModelSpec

# GPT-J and OPT name the attention output out_proj
OUT_PROJ_ATTENTION_NAMES = ("q_proj", "k_proj", "v_proj", "out_proj")


def _layer_norm_decoder_spec(
    view: ConfigView,
    origin: SpecOrigin,
    *,
    architecture: str,
    dims: Dims,
    linears: list[LinearModule],
    block_norms: int,
    final_layer_norms: int = 1,
    **features: Any,
) -> ModelSpec:
    """Alike blocks with `block_norms` parameters of LayerNorms each, `final_layer_norms`
    LayerNorms (weight and bias) outside them, and a plain MLP."""
    return decoder_only_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=block_norms)],
        final_norms=final_layer_norms * layer_norm_params(dims.hidden),
        norm="layernorm",
        mlp="plain",
        **features,
    )


def _fused_qkv_linears(
    attention: str,
    dims: Dims,
    *,
    qkv_width: int,
    attention_bias: bool,
    mlp_bias: bool,
) -> list[LinearModule]:
    """`attention`.query_key_value and `attention`.dense, then mlp.dense_h_to_4h and
    mlp.dense_4h_to_h (GPT-NeoX, Falcon, BLOOM)."""
    hidden = dims.hidden
    return [
        linear(
            f"{attention}.query_key_value", hidden, qkv_width, bias=attention_bias, role="attention"
        ),
        linear(f"{attention}.dense", hidden, hidden, bias=attention_bias, role="attention"),
        *plain_mlp(
            "mlp.dense_h_to_4h",
            "mlp.dense_4h_to_h",
            hidden=hidden,
            intermediate=dims.intermediate,
            bias=mlp_bias,
        ),
    ]


def _read_gpt2_named_dims(view: ConfigView, *, positions_when_null: int | None = None) -> Dims:
    """Sizes under GPT-2's names (n_embd, n_layer, n_head, n_inner, n_positions) or the usual ones;
    the MLP is 4 x n_embd wide unless n_inner says otherwise."""
    hidden = view.required_int("n_embd", "hidden_size")
    dims = multi_head_dims(
        view,
        hidden=hidden,
        layers=view.required_int("n_layer", "num_hidden_layers"),
        heads=view.required_int("n_head", "num_attention_heads"),
        intermediate=view.int_or(4 * hidden, "n_inner"),
        max_positions=view.optional_int("n_positions", "max_position_embeddings"),
    )
    if dims.max_positions is None:
        return replace(dims, max_positions=positions_when_null)
    return dims


# --- GPT-2 -------------------------------------------------------------------------------------

GPT2_DEFAULTS = {
    "n_positions": 1024,
    "n_inner": None,
    "activation_function": "gelu_new",
    "add_cross_attention": False,
    "tie_word_embeddings": True,
}


def read_gpt2(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = _read_gpt2_named_dims(view, positions_when_null=1024)
    hidden = dims.hidden
    # GPT-2 uses Conv1D modules (weight stored as in x out); PEFT treats them as Linear layers
    linears = [
        linear("attn.c_attn", hidden, 3 * hidden, bias=True, role="attention"),
        linear("attn.c_proj", hidden, hidden, bias=True, role="attention"),
        *plain_mlp(
            "mlp.c_fc", "mlp.c_proj", hidden=hidden, intermediate=dims.intermediate, bias=True
        ),
    ]
    notes = ["GPT-2 projections are transformers Conv1D modules (weight stored in x out)"]
    if view.flag("add_cross_attention"):
        notes.append(
            "add_cross_attention is set: the cross-attention of GPT2 as a decoder is not counted"
        )
    return _layer_norm_decoder_spec(
        view,
        origin,
        architecture="GPT2LMHeadModel",
        dims=dims,
        linears=linears,
        block_norms=2 * layer_norm_params(hidden),
        learned_positions=dims.max_positions or 0,
        activation=view.text("activation_function") or "gelu_new",
        notes=notes,
    )


# --- GPT-BigCode (SantaCoder, StarCoder 1) ----------------------------------------------------

GPT_BIGCODE_DEFAULTS = {
    "n_positions": 1024,
    "n_inner": None,
    "activation_function": "gelu_pytorch_tanh",
    "multi_query": True,
    "tie_word_embeddings": True,
}


def read_gpt_bigcode(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """GPT-2's layout in nn.Linear modules, with multi-query attention: c_attn projects to the
    queries and one shared key and value head (hidden + 2·head_dim) when `multi_query` is set."""
    dims = _read_gpt2_named_dims(view, positions_when_null=1024)
    hidden = dims.hidden
    multi_query = view.flag("multi_query")
    if multi_query:
        dims = replace(dims, kv_heads=1)
    qkv_width = hidden + 2 * dims.head_dim if multi_query else 3 * hidden
    linears = [
        linear("attn.c_attn", hidden, qkv_width, bias=True, role="attention"),
        linear("attn.c_proj", hidden, hidden, bias=True, role="attention"),
        *plain_mlp(
            "mlp.c_fc", "mlp.c_proj", hidden=hidden, intermediate=dims.intermediate, bias=True
        ),
    ]
    return _layer_norm_decoder_spec(
        view,
        origin,
        architecture="GPTBigCodeForCausalLM",
        dims=dims,
        linears=linears,
        block_norms=2 * layer_norm_params(hidden),
        learned_positions=dims.max_positions or 0,
        activation=view.text("activation_function") or "gelu_pytorch_tanh",
        notes=["multi-query attention: one key/value head shared by all query heads"]
        if multi_query
        else [],
    )


# --- GPT-NeoX ----------------------------------------------------------------------------------

GPT_NEOX_DEFAULTS = {
    "hidden_act": "gelu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "use_parallel_residual": True,
    "attention_bias": True,
}


def read_gpt_neox(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_multi_head_dims(view)
    hidden = dims.hidden
    linears = _fused_qkv_linears(
        "attention",
        dims,
        qkv_width=3 * hidden,
        attention_bias=view.flag("attention_bias"),
        mlp_bias=True,
    )
    return _layer_norm_decoder_spec(
        view,
        origin,
        architecture="GPTNeoXForCausalLM",
        dims=dims,
        linears=linears,
        block_norms=2 * layer_norm_params(hidden),
        activation=view.text("hidden_act") or "gelu",
        parallel_residual=view.flag("use_parallel_residual"),
    )


# --- GPT-J -------------------------------------------------------------------------------------

GPTJ_DEFAULTS = {
    "n_positions": 2048,
    "n_inner": None,
    "activation_function": "gelu_new",
    "tie_word_embeddings": False,
}


def read_gptj(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = _read_gpt2_named_dims(view)
    hidden = dims.hidden
    linears = [
        *attention_projections(dims, prefix="attn", names=OUT_PROJ_ATTENTION_NAMES),
        *plain_mlp(
            "mlp.fc_in", "mlp.fc_out", hidden=hidden, intermediate=dims.intermediate, bias=True
        ),
    ]
    return _layer_norm_decoder_spec(
        view,
        origin,
        architecture="GPTJForCausalLM",
        dims=dims,
        linears=linears,
        block_norms=layer_norm_params(hidden),
        head_bias=True,
        activation=view.text("activation_function") or "gelu_new",
        parallel_residual=True,
        notes=[
            "GPTJForCausalLM uses SDPA since transformers 5.24 (before it, it trained with "
            "eager attention and its b·a·s² softmax)"
        ],
    )


# --- OPT ---------------------------------------------------------------------------------------

OPT_DEFAULTS = {
    "max_position_embeddings": 2048,
    "do_layer_norm_before": True,
    "_remove_final_layer_norm": False,
    "word_embed_proj_dim": None,
    "activation_function": "relu",
    "enable_bias": True,
    "layer_norm_elementwise_affine": True,
    "tie_word_embeddings": True,
}

_OPT_POSITION_OFFSET = 2  # OPT's learned positions keep two extra rows


def read_opt(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_multi_head_dims(view, intermediate_key="ffn_dim", positions_when_null=2048)
    hidden = dims.hidden
    bias = view.flag("enable_bias")
    norm_width = layer_norm_params(hidden) if view.flag("layer_norm_elementwise_affine") else 0
    linears = [
        *attention_projections(
            dims, qkv_bias=bias, output_bias=bias, names=OUT_PROJ_ATTENTION_NAMES
        ),
        *plain_mlp("fc1", "fc2", hidden=hidden, intermediate=dims.intermediate, bias=bias),
    ]
    projection = view.int_or(hidden, "word_embed_proj_dim")
    # project_in / project_out map between a narrower embedding width and the hidden width
    projections = 2 * projection * hidden if projection != hidden else 0
    pre_norm = view.flag("do_layer_norm_before")
    final_norm = norm_width if pre_norm and not view.flag("_remove_final_layer_norm") else 0
    notes = []
    if projections:
        notes.append(
            f"OPT embeds at width {projection}: project_in/project_out counted under other"
        )
    if not pre_norm:
        notes.append("do_layer_norm_before is false: post-norm blocks and no final LayerNorm")
    return build_spec(
        view,
        origin,
        architecture="OPTForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * norm_width)],
        embedding=dims.vocab * projection
        + ((dims.max_positions or 0) + _OPT_POSITION_OFFSET) * hidden,
        head=lm_head_params(dims, in_features=projection),
        model_norms=final_norm,
        model_other=projections,
        norm="layernorm",
        mlp="plain",
        activation=view.text("activation_function") or "relu",
        notes=notes,
    )


# --- Falcon ------------------------------------------------------------------------------------

FALCON_DEFAULTS = {
    "num_ln_in_parallel_attn": None,
    "num_kv_heads": None,
    "alibi": False,
    "new_decoder_architecture": False,
    "multi_query": True,
    "parallel_attn": True,
    "bias": False,
    "max_position_embeddings": 2048,
    "ffn_hidden_size": None,
    "activation": "gelu",
    "tie_word_embeddings": True,
}


def read_falcon(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    hidden = view.required_int("hidden_size", "n_embed")
    heads = view.required_int("num_attention_heads", "n_head")
    head_dim = hidden // heads
    new_architecture = view.flag("new_decoder_architecture")
    multi_query = view.flag("multi_query")
    if new_architecture:
        kv_heads = view.int_or(heads, "num_kv_heads", "n_head_kv")
        qkv_width = (heads + 2 * kv_heads) * head_dim
    elif multi_query:
        kv_heads = 1
        qkv_width = hidden + 2 * head_dim
    else:
        kv_heads = heads
        qkv_width = 3 * hidden
    dims = multi_head_dims(
        view,
        hidden=hidden,
        layers=view.required_int("num_hidden_layers", "n_layer"),
        heads=heads,
        kv_heads=kv_heads,
        intermediate=view.int_or(4 * hidden, "ffn_hidden_size"),
        max_positions=view.optional_int("max_position_embeddings"),
    )
    bias = view.flag("bias")
    linears = _fused_qkv_linears(
        "self_attention", dims, qkv_width=qkv_width, attention_bias=bias, mlp_bias=bias
    )
    parallel = view.flag("parallel_attn")
    norms_in_parallel = view.optional_int("num_ln_in_parallel_attn")
    if norms_in_parallel is None and new_architecture:
        norms_in_parallel = 2
    block_norms = 2 if (not parallel or norms_in_parallel == 2) else 1
    notes = []
    if view.flag("alibi"):
        notes.append("Falcon with ALiBi position biases (no parameters)")
    return _layer_norm_decoder_spec(
        view,
        origin,
        architecture="FalconForCausalLM",
        dims=dims,
        linears=linears,
        block_norms=block_norms * layer_norm_params(hidden),
        activation=view.text("activation") or "gelu",
        parallel_residual=parallel,
        notes=notes,
    )


# --- BLOOM -------------------------------------------------------------------------------------

BLOOM_DEFAULTS = {"tie_word_embeddings": True}


def read_bloom(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    hidden = view.required_int("hidden_size", "n_embed")
    dims = multi_head_dims(
        view,
        hidden=hidden,
        layers=view.required_int("n_layer", "num_hidden_layers"),
        heads=view.required_int("n_head", "num_attention_heads"),
        intermediate=4 * hidden,
        max_positions=None,
    )
    linears = _fused_qkv_linears(
        "self_attention", dims, qkv_width=3 * hidden, attention_bias=True, mlp_bias=True
    )
    return _layer_norm_decoder_spec(
        view,
        origin,
        architecture="BloomForCausalLM",
        dims=dims,
        linears=linears,
        block_norms=2 * layer_norm_params(hidden),
        final_layer_norms=2,  # word_embeddings_layernorm after the embeddings, ln_f at the end
        activation="gelu_pytorch_tanh",
        supports_sdpa=False,
        notes=[
            "BLOOM uses ALiBi (no position parameters) and a tanh-approximated GELU",
            "BloomForCausalLM has no SDPA attention in transformers 5; it trains with eager "
            "attention",
        ],
    )


# --- Phi-1 / Phi-1.5 / Phi-2 -------------------------------------------------------------------

PHI_DEFAULTS = {
    "num_key_value_heads": None,
    "hidden_act": "gelu_new",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "qk_layernorm": False,
}


def read_phi(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    linears = [
        *attention_projections(
            dims, qkv_bias=True, output_bias=True, names=("q_proj", "k_proj", "v_proj", "dense")
        ),
        *plain_mlp(
            "mlp.fc1", "mlp.fc2", hidden=dims.hidden, intermediate=dims.intermediate, bias=True
        ),
    ]
    qk_norm = view.flag("qk_layernorm")
    block_norms = layer_norm_params(dims.hidden)
    if qk_norm:
        block_norms += 2 * layer_norm_params(dims.head_dim)
    return _layer_norm_decoder_spec(
        view,
        origin,
        architecture="PhiForCausalLM",
        dims=dims,
        linears=linears,
        block_norms=block_norms,
        head_bias=True,
        activation=view.text("hidden_act") or "gelu_new",
        qk_norm=qk_norm,
        parallel_residual=True,
    )


READERS = [
    ArchitectureReader("gpt2", "GPT2Config", GPT2_DEFAULTS, read_gpt2),
    ArchitectureReader("gpt_bigcode", "GPTBigCodeConfig", GPT_BIGCODE_DEFAULTS, read_gpt_bigcode),
    ArchitectureReader("gpt_neox", "GPTNeoXConfig", GPT_NEOX_DEFAULTS, read_gpt_neox),
    ArchitectureReader("gptj", "GPTJConfig", GPTJ_DEFAULTS, read_gptj),
    ArchitectureReader("opt", "OPTConfig", OPT_DEFAULTS, read_opt),
    ArchitectureReader("falcon", "FalconConfig", FALCON_DEFAULTS, read_falcon),
    ArchitectureReader("bloom", "BloomConfig", BLOOM_DEFAULTS, read_bloom),
    ArchitectureReader("phi", "PhiConfig", PHI_DEFAULTS, read_phi),
]

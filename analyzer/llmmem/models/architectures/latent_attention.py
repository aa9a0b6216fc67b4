"""DeepSeek-V2 and DeepSeek-V3 (and the models built on them: DeepSeek-R1, Moonlight, ...):
multi-head latent attention (MLA) and routed experts beside always-on shared experts.

MLA projects the hidden state down to a small latent (`kv_lora_rank`, normed) plus one shared
rotary key part (`qk_rope_head_dim`), then up again to per-head keys (`qk_nope_head_dim` +
`qk_rope_head_dim`) and values (`v_head_dim`); queries go through a latent of their own when
`q_lora_rank` is set, else through one q_proj. transformers 5 caches the compressed latent, not
K and V.

The first `first_k_dense_replace` blocks have a dense MLP; every later block routes
(`moe_layer_freq` is not read by transformers 5, which makes every later block sparse). The
routed experts are the fused 3-D parameters of the other MoE readers, the router a bare fp32
weight; DeepSeek-V3's `e_score_correction_bias` is a buffer, not a parameter. The multi-token
prediction layers of DeepSeek-V3 checkpoints (`num_nextn_predict_layers`) are not built by
transformers and are not counted.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    fused_experts,
    gated_mlp,
    linear,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.architectures.dense_decoders import rmsnorm_decoder_spec
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec

DEEPSEEK_V2_DEFAULTS = {
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "first_k_dense_replace": 0,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_experts_per_tok": None,
    "moe_intermediate_size": 1407,
}

DEEPSEEK_V3_DEFAULTS = {
    "num_key_value_heads": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "first_k_dense_replace": 3,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
}


def _latent_attention(
    view: ConfigView, *, hidden: int, heads: int
) -> tuple[list[LinearModule], int, dict[str, int]]:
    """MLA's projections, the parameters of its two latent norms, and its head sizes."""
    bias = view.flag("attention_bias")
    q_rank = view.optional_int("q_lora_rank")
    kv_rank = view.int_or(0, "kv_lora_rank")
    nope = view.int_or(0, "qk_nope_head_dim")
    rope = view.int_or(0, "qk_rope_head_dim")
    v_dim = view.int_or(0, "v_head_dim")
    qk_dim = nope + rope
    if q_rank:
        query = [
            linear("self_attn.q_a_proj", hidden, q_rank, bias=bias, role="attention"),
            linear("self_attn.q_b_proj", q_rank, heads * qk_dim, role="attention"),
        ]
    else:
        query = [linear("self_attn.q_proj", hidden, heads * qk_dim, role="attention")]
    linears = [
        *query,
        linear("self_attn.kv_a_proj_with_mqa", hidden, kv_rank + rope, bias=bias, role="attention"),
        linear("self_attn.kv_b_proj", kv_rank, heads * (nope + v_dim), role="attention"),
        linear("self_attn.o_proj", heads * v_dim, hidden, bias=bias, role="attention"),
    ]
    norms = kv_rank + (q_rank or 0)  # kv_a_layernorm and q_a_layernorm
    sizes = {"qk_head_dim": qk_dim, "v_head_dim": v_dim, "latent": kv_rank + rope}
    return linears, norms, sizes


def _read_deepseek(
    view: ConfigView, origin: SpecOrigin, *, architecture: str, mlp_bias: bool
) -> ModelSpec:
    """`mlp_bias`: whether the dense and shared-expert MLPs carry biases."""
    hidden = view.required_int("hidden_size")
    heads = view.required_int("num_attention_heads")
    layers = view.required_int("num_hidden_layers")
    attention, latent_norms, sizes = _latent_attention(view, hidden=hidden, heads=heads)
    experts = view.int_or(0, "n_routed_experts", "num_local_experts", "num_experts")
    top_k = view.int_or(0, "num_experts_per_tok")
    expert_width = view.int_or(0, "moe_intermediate_size")
    shared_width = expert_width * view.int_or(0, "n_shared_experts")
    dense_width = view.required_int("intermediate_size")
    dense_layers = min(view.int_or(0, "first_k_dense_replace"), layers) if experts else layers
    sparse_layers = layers - dense_layers
    dims = Dims(
        hidden=hidden,
        layers=layers,
        heads=heads,
        # every head gets keys and values of its own out of the latent
        kv_heads=heads,
        head_dim=sizes["qk_head_dim"],
        intermediate=expert_width if sparse_layers else dense_width,
        vocab=view.required_int("vocab_size"),
        tie_embeddings=view.flag("tie_word_embeddings"),
        max_positions=view.optional_int("max_position_embeddings"),
    )
    norm_params = 2 * hidden + latent_norms
    groups = []
    if sparse_layers:
        sparse = [
            *attention,
            linear("mlp.gate", hidden, experts, role="router"),
            *fused_experts(
                "mlp.experts", hidden=hidden, intermediate=expert_width, num_experts=experts
            ),
        ]
        if shared_width:
            sparse += gated_mlp(
                "mlp.shared_experts",
                hidden=hidden,
                intermediate=shared_width,
                bias=mlp_bias,
                role="shared_expert",
            )
        groups.append(
            BlockGroup(
                name="decoder",
                count=sparse_layers,
                linears=sparse,
                norm_params=norm_params,
                num_experts=experts,
                experts_per_token=top_k,
            )
        )
    if dense_layers:
        dense = [
            *attention,
            *gated_mlp("mlp", hidden=hidden, intermediate=dense_width, bias=mlp_bias),
        ]
        groups.append(
            BlockGroup(
                name="decoder_dense", count=dense_layers, linears=dense, norm_params=norm_params
            )
        )
    notes = [
        "multi-head latent attention: queries and keys "
        f"{sizes['qk_head_dim']} wide per head, values {sizes['v_head_dim']}; the KV cache "
        f"holds the {sizes['latent']}-wide compressed latent per token and block"
    ]
    if sparse_layers and shared_width:
        notes.append(
            f"each sparse block also runs {view.int_or(0, 'n_shared_experts')} shared expert(s) "
            f"({shared_width} wide) for every token"
        )
    if view.int_or(0, "num_nextn_predict_layers"):
        notes.append(
            "the checkpoint's multi-token prediction layers are not loaded by transformers and "
            "are not counted"
        )
    if view.int_or(1, "moe_layer_freq") != 1:
        notes.append(
            "moe_layer_freq is not read by transformers 5: every block after "
            "first_k_dense_replace is sparse"
        )
    spec = rmsnorm_decoder_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=groups,
        num_experts=experts if sparse_layers else 0,
        experts_per_token=top_k if sparse_layers else 0,
        notes=notes,
    )
    return replace(spec, v_head_dim=sizes["v_head_dim"], kv_cache_per_token=sizes["latent"])


def read_deepseek_v2(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_deepseek(
        view, origin, architecture="DeepseekV2ForCausalLM", mlp_bias=view.flag("mlp_bias")
    )


def read_deepseek_v3(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    # DeepSeek-V3's MLPs have no biases whatever the config says
    return _read_deepseek(view, origin, architecture="DeepseekV3ForCausalLM", mlp_bias=False)


READERS = [
    ArchitectureReader("deepseek_v2", "DeepseekV2Config", DEEPSEEK_V2_DEFAULTS, read_deepseek_v2),
    ArchitectureReader("deepseek_v3", "DeepseekV3Config", DEEPSEEK_V3_DEFAULTS, read_deepseek_v3),
]

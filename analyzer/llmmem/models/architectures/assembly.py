"""Building blocks the family readers share: sizes read under their usual keys, named Linear
modules, block groups, and the sums that turn them into a `ParamBreakdown` and a `ModelSpec`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.spec import (
    BlockGroup,
    LinearModule,
    LinearRole,
    ModelSource,
    ModelSpec,
    ParamBreakdown,
)


@dataclass(frozen=True)
class SpecOrigin:
    """Where the config came from; copied onto the ModelSpec unchanged."""

    model_id: str
    source: ModelSource
    source_detail: str = ""


ReadFunction = Callable[[ConfigView, SpecOrigin], ModelSpec]


@dataclass(frozen=True)
class ArchitectureReader:
    """How one `model_type` is read: its config class, that class's defaults, and the reader."""

    model_type: str
    config_class: str  # the transformers config class whose defaults `defaults` mirrors
    defaults: Mapping[str, Any]
    read: ReadFunction


@dataclass(frozen=True)
class Dims:
    """The sizes every transformer spec states."""

    hidden: int
    layers: int  # all blocks
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    max_positions: int | None = None


def read_rope_decoder_dims(
    view: ConfigView,
    *,
    intermediate_key: str = "intermediate_size",
    honors_head_dim: bool = True,
) -> Dims:
    """Sizes as the Llama-style configs name them; `head_dim` falls back to hidden / heads.

    `intermediate_key` names the MLP width (the per-expert width of a MoE config).
    """
    hidden = view.required_int("hidden_size")
    heads = view.required_int("num_attention_heads")
    head_dim = view.int_or(hidden // heads, "head_dim") if honors_head_dim else hidden // heads
    return Dims(
        hidden=hidden,
        layers=view.required_int("num_hidden_layers"),
        heads=heads,
        kv_heads=view.int_or(heads, "num_key_value_heads"),
        head_dim=head_dim,
        intermediate=view.required_int(intermediate_key),
        vocab=view.required_int("vocab_size"),
        tie_embeddings=view.flag("tie_word_embeddings"),
        max_positions=view.optional_int("max_position_embeddings"),
    )


def multi_head_dims(
    view: ConfigView,
    *,
    hidden: int,
    layers: int,
    heads: int,
    intermediate: int,
    max_positions: int | None,
    kv_heads: int | None = None,
) -> Dims:
    """Sizes of a model whose heads split the hidden width evenly (head_dim = hidden / heads), with
    the vocabulary and the embedding tie read under their usual names."""
    return Dims(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=heads if kv_heads is None else kv_heads,
        head_dim=hidden // heads,
        intermediate=intermediate,
        vocab=view.required_int("vocab_size"),
        tie_embeddings=view.flag("tie_word_embeddings"),
        max_positions=max_positions,
    )


def read_multi_head_dims(
    view: ConfigView,
    *,
    intermediate_key: str = "intermediate_size",
    positions_when_null: int | None = None,
) -> Dims:
    """`multi_head_dims` read under the usual keys (hidden_size, num_hidden_layers,
    num_attention_heads, max_position_embeddings); `positions_when_null` stands in for a null
    max_position_embeddings."""
    hidden = view.required_int("hidden_size")
    dims = multi_head_dims(
        view,
        hidden=hidden,
        layers=view.required_int("num_hidden_layers"),
        heads=view.required_int("num_attention_heads"),
        intermediate=view.required_int(intermediate_key),
        max_positions=view.optional_int("max_position_embeddings"),
    )
    if dims.max_positions is None:
        return replace(dims, max_positions=positions_when_null)
    return dims


def linear(
    path: str,
    in_features: int,
    out_features: int,
    *,
    role: LinearRole,
    bias: bool = False,
    count: int = 1,
) -> LinearModule:
    """The Linear module at dotted `path` inside a block, named after the last part of the path."""
    return LinearModule(
        name=path.rsplit(".", 1)[-1],
        path=path,
        in_features=in_features,
        out_features=out_features,
        bias=bias,
        count=count,
        role=role,
    )


LLAMA_ATTENTION_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj")


def attention_projections(
    dims: Dims,
    *,
    prefix: str = "self_attn",
    qkv_bias: bool = False,
    output_bias: bool = False,
    names: tuple[str, str, str, str] = LLAMA_ATTENTION_NAMES,
) -> list[LinearModule]:
    """Separate query, key, value and output projections (grouped-query when kv_heads < heads)."""
    q_name, k_name, v_name, o_name = names
    q_width = dims.heads * dims.head_dim
    kv_width = dims.kv_heads * dims.head_dim
    return [
        linear(f"{prefix}.{q_name}", dims.hidden, q_width, bias=qkv_bias, role="attention"),
        linear(f"{prefix}.{k_name}", dims.hidden, kv_width, bias=qkv_bias, role="attention"),
        linear(f"{prefix}.{v_name}", dims.hidden, kv_width, bias=qkv_bias, role="attention"),
        linear(f"{prefix}.{o_name}", q_width, dims.hidden, bias=output_bias, role="attention"),
    ]


def gated_mlp(
    prefix: str,
    *,
    hidden: int,
    intermediate: int,
    bias: bool = False,
    role: LinearRole = "mlp",
) -> list[LinearModule]:
    """gate_proj and up_proj into the intermediate width, down_proj back (SwiGLU, GeGLU)."""
    return [
        linear(f"{prefix}.gate_proj", hidden, intermediate, bias=bias, role=role),
        linear(f"{prefix}.up_proj", hidden, intermediate, bias=bias, role=role),
        linear(f"{prefix}.down_proj", intermediate, hidden, bias=bias, role=role),
    ]


def plain_mlp(
    up: str,
    down: str,
    *,
    hidden: int,
    intermediate: int,
    bias: bool,
) -> list[LinearModule]:
    """One projection up, an activation, one projection down; `up`/`down` are dotted paths."""
    return [
        linear(up, hidden, intermediate, bias=bias, role="mlp"),
        linear(down, intermediate, hidden, bias=bias, role="mlp"),
    ]


def fused_experts(
    prefix: str,
    *,
    hidden: int,
    intermediate: int,
    num_experts: int,
    bias: bool = False,
) -> list[LinearModule]:
    """Routed experts stored as two 3-D parameters: gate_up_proj (E, 2I, h) and down_proj (E, h, I).

    transformers 5 keeps them as nn.Parameter tensors, not nn.Linear modules; PEFT reaches them
    through `target_parameters`.
    """
    return [
        linear(
            f"{prefix}.gate_up_proj",
            hidden,
            2 * intermediate,
            bias=bias,
            count=num_experts,
            role="expert",
        ),
        linear(
            f"{prefix}.down_proj", intermediate, hidden, bias=bias, count=num_experts, role="expert"
        ),
    ]


def decoder_group(
    linears: list[LinearModule],
    *,
    layers: int,
    norm_params: int,
    other_params: int = 0,
) -> BlockGroup:
    """All blocks of a decoder stack, when they are alike."""
    return BlockGroup(
        name="decoder",
        count=layers,
        linears=linears,
        norm_params=norm_params,
        other_params=other_params,
    )


def layer_norm_params(width: int, *, bias: bool = True) -> int:
    """Weights (and biases) of one LayerNorm over `width` features."""
    return 2 * width if bias else width


def lm_head_params(dims: Dims, *, in_features: int | None = None, bias: bool = False) -> int:
    """An LM head's own parameters: the weight only when untied; a bias is never tied."""
    weight = 0 if dims.tie_embeddings else (in_features or dims.hidden) * dims.vocab
    return weight + (dims.vocab if bias else 0)


def param_breakdown(
    groups: Iterable[BlockGroup],
    *,
    embedding: int,
    head: int,
    model_norms: int,
    model_other: int = 0,
) -> ParamBreakdown:
    """Sum block groups by role and add what sits outside the blocks."""
    sums = {"attention": 0, "mlp": 0, "expert": 0, "router": 0, "other": 0}
    experts_active = 0
    norms = model_norms
    other = model_other
    for group in groups:
        for lin in group.linears:
            role = "mlp" if lin.role == "shared_expert" else lin.role
            sums[role] += lin.params * group.count
            if lin.role == "expert" and group.num_experts:
                per_expert = lin.params // lin.count
                experts_active += per_expert * group.experts_per_token * group.count
        norms += group.norm_params * group.count
        other += group.other_params * group.count
    return ParamBreakdown(
        embedding=embedding,
        attention=sums["attention"],
        mlp=sums["mlp"],
        experts=sums["expert"],
        experts_active=experts_active,
        router=sums["router"],
        norms=norms,
        head=head,
        other=other + sums["other"],
    )


def count_sliding_layers(layer_types: list[str] | None, *, layers: int, window: int | None) -> int:
    """Blocks that attend through a sliding window, from `layer_types` when the config has one."""
    if window is None or window <= 0:
        return 0
    if layer_types is None:
        return layers
    return sum(1 for kind in layer_types[:layers] if kind == "sliding_attention")


def alternating_layer_types(layers: int, *, period: int) -> list[str]:
    """Every `period`-th block global, the others sliding (transformers' default layer_types)."""
    return [
        "sliding_attention" if (index + 1) % period else "full_attention" for index in range(layers)
    ]


def build_spec(
    view: ConfigView,
    origin: SpecOrigin,
    *,
    architecture: str,
    dims: Dims,
    groups: list[BlockGroup],
    embedding: int,
    head: int,
    model_norms: int,
    model_other: int = 0,
    **features: Any,
) -> ModelSpec:
    """A ModelSpec from the sizes, the blocks and what sits outside them.

    `features` are the remaining ModelSpec fields (norm, mlp, activation, qk_norm, notes, ...).
    """
    return ModelSpec(
        model_id=origin.model_id,
        model_type=view.model_type,
        architecture=architecture,
        source=origin.source,
        source_detail=origin.source_detail,
        hidden_size=dims.hidden,
        num_layers=dims.layers,
        num_attention_heads=dims.heads,
        num_kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        intermediate_size=dims.intermediate,
        vocab_size=dims.vocab,
        max_position_embeddings=dims.max_positions,
        tie_word_embeddings=dims.tie_embeddings,
        params=param_breakdown(
            groups,
            embedding=embedding,
            head=head,
            model_norms=model_norms,
            model_other=model_other,
        ),
        blocks=groups,
        **features,
    )


def decoder_only_spec(
    view: ConfigView,
    origin: SpecOrigin,
    *,
    architecture: str,
    dims: Dims,
    groups: list[BlockGroup],
    final_norms: int,
    learned_positions: int = 0,
    head_bias: bool = False,
    **features: Any,
) -> ModelSpec:
    """A causal LM: token embeddings (and `learned_positions` rows of position embeddings), the
    block groups, `final_norms` parameters of norms after the last block, and an LM head that is
    tied to the embeddings or not (with a bias of its own when `head_bias`).

    `features` are the remaining ModelSpec fields, as for `build_spec`.
    """
    return build_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=groups,
        embedding=(dims.vocab + learned_positions) * dims.hidden,
        head=lm_head_params(dims, bias=head_bias),
        model_norms=final_norms,
        **features,
    )

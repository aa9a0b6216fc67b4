"""Building blocks the family readers share: named Linear modules, block groups, and the sums that
turn them into a `ParamBreakdown` and a `ModelSpec`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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


def linear(
    name: str,
    path: str,
    in_features: int,
    out_features: int,
    *,
    role: LinearRole,
    bias: bool = False,
    count: int = 1,
) -> LinearModule:
    return LinearModule(
        name=name,
        path=path,
        in_features=in_features,
        out_features=out_features,
        bias=bias,
        count=count,
        role=role,
    )


def attention_projections(
    prefix: str,
    *,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    qkv_bias: bool,
    output_bias: bool,
    names: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
) -> list[LinearModule]:
    """Separate query, key, value and output projections (grouped-query when kv_heads < heads)."""
    q_name, k_name, v_name, o_name = names
    return [
        linear(
            q_name, f"{prefix}.{q_name}", hidden, heads * head_dim, bias=qkv_bias, role="attention"
        ),
        linear(
            k_name,
            f"{prefix}.{k_name}",
            hidden,
            kv_heads * head_dim,
            bias=qkv_bias,
            role="attention",
        ),
        linear(
            v_name,
            f"{prefix}.{v_name}",
            hidden,
            kv_heads * head_dim,
            bias=qkv_bias,
            role="attention",
        ),
        linear(
            o_name,
            f"{prefix}.{o_name}",
            heads * head_dim,
            hidden,
            bias=output_bias,
            role="attention",
        ),
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
        linear("gate_proj", f"{prefix}.gate_proj", hidden, intermediate, bias=bias, role=role),
        linear("up_proj", f"{prefix}.up_proj", hidden, intermediate, bias=bias, role=role),
        linear("down_proj", f"{prefix}.down_proj", intermediate, hidden, bias=bias, role=role),
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
        linear(up.rsplit(".", 1)[-1], up, hidden, intermediate, bias=bias, role="mlp"),
        linear(down.rsplit(".", 1)[-1], down, intermediate, hidden, bias=bias, role="mlp"),
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
            "gate_up_proj",
            f"{prefix}.gate_up_proj",
            hidden,
            2 * intermediate,
            bias=bias,
            count=num_experts,
            role="expert",
        ),
        linear(
            "down_proj",
            f"{prefix}.down_proj",
            intermediate,
            hidden,
            bias=bias,
            count=num_experts,
            role="expert",
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

"""BERT, RoBERTa and DistilBERT as masked language models (`BertForMaskedLM`,
`RobertaForMaskedLM`, `DistilBertForMaskedLM`): post-norm encoder blocks, learned absolute
positions, and a prediction head (dense + LayerNorm + decoder tied to the word embeddings, with its
own vocabulary bias). The pooler of `BertModel` is not part of the masked-LM classes; DistilBERT
has no token types and spells its sizes `dim`, `n_layers`, `n_heads`, `hidden_dim`."""

from __future__ import annotations

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    SpecOrigin,
    build_spec,
    layer_norm_params,
    linear,
    multi_head_dims,
    plain_mlp,
    read_multi_head_dims,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.spec import BlockGroup, ModelSpec

BERT_DEFAULTS = {
    "hidden_act": "gelu",
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "tie_word_embeddings": True,
}

ROBERTA_DEFAULTS = dict(BERT_DEFAULTS)

# transformers' DistilBertConfig defaults (distilbert-base-uncased's shapes)
DISTILBERT_DEFAULTS = {
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "n_layers": 6,
    "n_heads": 12,
    "dim": 768,
    "hidden_dim": 3072,
    "activation": "gelu",
    "tie_word_embeddings": True,
}


def _read_masked_lm(view: ConfigView, origin: SpecOrigin, *, architecture: str) -> ModelSpec:
    dims = read_multi_head_dims(view, positions_when_null=512)
    hidden = dims.hidden
    linears = [
        linear("attention.self.query", hidden, hidden, bias=True, role="attention"),
        linear("attention.self.key", hidden, hidden, bias=True, role="attention"),
        linear("attention.self.value", hidden, hidden, bias=True, role="attention"),
        linear("attention.output.dense", hidden, hidden, bias=True, role="attention"),
        *plain_mlp(
            "intermediate.dense",
            "output.dense",
            hidden=hidden,
            intermediate=dims.intermediate,
            bias=True,
        ),
    ]
    block = BlockGroup(
        name="encoder",
        count=dims.layers,
        linears=linears,
        norm_params=2 * layer_norm_params(hidden),  # after attention and after the MLP
    )
    positions = dims.max_positions or 0
    token_types = view.int_or(0, "type_vocab_size")
    # prediction head: transform dense, then the decoder's vocabulary bias; the decoder weight is
    # the word embedding unless untied, and untied it keeps a second bias of its own
    head = hidden * hidden + hidden + dims.vocab
    if not dims.tie_embeddings:
        head += dims.vocab * hidden + dims.vocab
    return build_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=[block],
        embedding=(dims.vocab + positions + token_types) * hidden,
        head=head,
        # embeddings LayerNorm and the prediction head's LayerNorm
        model_norms=2 * layer_norm_params(hidden),
        norm="layernorm",
        mlp="plain",
        activation=view.text("hidden_act") or "gelu",
        notes=[
            f"{architecture}: bidirectional encoder; the vocabulary head scores every position",
        ],
    )


def read_bert(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_masked_lm(view, origin, architecture="BertForMaskedLM")


def read_roberta(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_masked_lm(view, origin, architecture="RobertaForMaskedLM")


def read_distilbert(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """DistilBertForMaskedLM: q_lin/k_lin/v_lin/out_lin and ffn.lin1/lin2 with biases,
    sa_layer_norm and output_layer_norm in each block; word and position embeddings (no token
    types) with a LayerNorm; vocab_transform, vocab_layer_norm and the tied vocab_projector's
    bias as the head."""
    hidden = view.required_int("dim")
    dims = multi_head_dims(
        view,
        hidden=hidden,
        layers=view.required_int("n_layers"),
        heads=view.required_int("n_heads"),
        intermediate=view.required_int("hidden_dim"),
        max_positions=view.optional_int("max_position_embeddings"),
    )
    linears = [
        linear(f"attention.{name}", hidden, hidden, bias=True, role="attention")
        for name in ("q_lin", "k_lin", "v_lin", "out_lin")
    ]
    linears += plain_mlp(
        "ffn.lin1", "ffn.lin2", hidden=hidden, intermediate=dims.intermediate, bias=True
    )
    block = BlockGroup(
        name="transformer",
        count=dims.layers,
        linears=linears,
        norm_params=2 * layer_norm_params(hidden),  # sa_layer_norm, output_layer_norm
    )
    head = hidden * hidden + hidden + dims.vocab  # vocab_transform, vocab_projector's bias
    if not dims.tie_embeddings:
        head += dims.vocab * hidden
    return build_spec(
        view,
        origin,
        architecture="DistilBertForMaskedLM",
        dims=dims,
        groups=[block],
        embedding=(dims.vocab + (dims.max_positions or 0)) * hidden,
        head=head,
        model_norms=2 * layer_norm_params(hidden),  # the embeddings' and vocab_layer_norm
        norm="layernorm",
        mlp="plain",
        activation=view.text("activation") or "gelu",
        notes=[
            "DistilBertForMaskedLM: bidirectional encoder; the vocabulary head scores every "
            "position"
        ],
    )


READERS = [
    ArchitectureReader("bert", "BertConfig", BERT_DEFAULTS, read_bert),
    ArchitectureReader("roberta", "RobertaConfig", ROBERTA_DEFAULTS, read_roberta),
    ArchitectureReader("distilbert", "DistilBertConfig", DISTILBERT_DEFAULTS, read_distilbert),
]

"""GLM-4 dense decoders in transformers: GLM-4-9B (`glm`, GlmForCausalLM: the `-hf` uploads of
glm-4-9b-chat) and GLM-4-0414 (`glm4`, Glm4ForCausalLM: GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1).

Both keep Llama's attention (q, k and v with a bias where `attention_bias`, o_proj without) and
fuse gate and up as `mlp.gate_up_proj` (2 × intermediate_size wide, as Phi-3 does). GLM-4-0414
adds a norm after attention and one after the MLP: four RMSNorms a block instead of two.
"""

from __future__ import annotations

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    SpecOrigin,
    attention_projections,
    decoder_group,
    linear,
    read_rope_decoder_dims,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.architectures.dense_decoders import rmsnorm_decoder_spec
from llmmem.models.spec import ModelSpec

GLM_DEFAULTS = {
    "num_key_value_heads": 2,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "attention_bias": True,
}


def _read_glm(
    view: ConfigView, origin: SpecOrigin, *, architecture: str, norms_per_block: int
) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    linears = [
        *attention_projections(dims, qkv_bias=view.flag("attention_bias")),
        linear("mlp.gate_up_proj", dims.hidden, 2 * dims.intermediate, role="mlp"),
        linear("mlp.down_proj", dims.intermediate, dims.hidden, role="mlp"),
    ]
    return rmsnorm_decoder_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=[
            decoder_group(linears, layers=dims.layers, norm_params=norms_per_block * dims.hidden)
        ],
        notes=["GLM fuses gate and up into gate_up_proj"],
    )


def read_glm(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_glm(view, origin, architecture="GlmForCausalLM", norms_per_block=2)


def read_glm4(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_glm(view, origin, architecture="Glm4ForCausalLM", norms_per_block=4)


READERS = [
    ArchitectureReader("glm", "GlmConfig", GLM_DEFAULTS, read_glm),
    ArchitectureReader("glm4", "Glm4Config", dict(GLM_DEFAULTS), read_glm4),
]

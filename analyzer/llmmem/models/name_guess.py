"""The last resort of resolution: a model sized from what its name says.

A name can state a size ("7B", "1.5B", "135M", "8x7B") and a family ("Qwen2.5", "gemma-3",
"Llama-3", "Phi-3"). Where it names a family the bundled catalog holds, the guess takes the shapes
of that family's model nearest the size (its vocabulary, depth and MLP width are what set the
memory, and they differ threefold between families of one size); where it names none, the shapes
of a real Llama-family model of about that size.

Either way the shapes are not known, only allowed: `guess_alternatives(ref)` lists every bundled
shape the name allows (the family's models near the size, or every family's where the name names
none), so that a verdict can be given as the range they span and never as "fits" on one of them.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from llmmem.models.architectures import spec_from_config
from llmmem.models.resolved import PRAGMA_HINT, ResolvedConfig
from llmmem.models.spec import ModelSource, ModelSpecError

GUESS_SIZE_TOLERANCE = 0.10  # a shape within 10% of the size in the name is used as it is
# a bundled model is one the name allows when its size is within this factor of the stated one
# (gemma-7b has 8.5B parameters, Qwen2.5-7B 7.6B, Llama-3-8B 8.0B)
ALLOWED_SIZE_FACTOR = 1.35
MAX_ALTERNATIVES = 8
MAX_LAYER_SCALING = 4.0  # a family's shape is stretched to the size in the name up to this factor


# --- the families a name can name --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NameFamily:
    """A family of models as their names spell it: `label` is how a message names it, `keys` the
    catalog families the name allows (a bare "qwen" allows Qwen-1 and Qwen2)."""

    label: str
    keys: tuple[str, ...]
    pattern: re.Pattern[str]


def _family(label: str, keys: tuple[str, ...], pattern: str) -> NameFamily:
    return NameFamily(label, keys, re.compile(pattern))


# first match wins: the specific spellings before the general ones
NAME_FAMILIES: tuple[NameFamily, ...] = (
    _family("Qwen2.5 (an R1 distill)", ("qwen2",), r"distill-qwen"),
    _family("Llama 3 (an R1 distill)", ("llama3",), r"distill-llama"),
    _family("Qwen3", ("qwen3",), r"qwen-?3"),
    _family("Qwen2/Qwen2.5", ("qwen2",), r"qwen-?2|qwen1\.5|qwq"),
    _family("Qwen (1 or 2)", ("qwen", "qwen2"), r"qwen"),
    # "gemma-2b" is Gemma 1 at 2B: a version is not followed by a size
    _family("Gemma 3", ("gemma3",), r"gemma-?3(?![0-9.]*[bm])"),
    _family("Gemma 2", ("gemma2",), r"gemma-?2(?![0-9.]*[bm])"),
    _family("Gemma", ("gemma", "gemma2", "gemma3"), r"gemma"),
    _family("TinyLlama", ("tinyllama",), r"tinyllama"),
    _family("Llama 3", ("llama3",), r"llama-?3"),
    _family("Llama 2", ("llama2",), r"llama-?2"),
    _family("Llama", ("llama2", "llama3", "tinyllama"), r"llama"),
    _family("Mixtral", ("mixtral",), r"mixtral"),
    _family("Mistral", ("mistral",), r"mistral|ministral|codestral"),
    _family("Phi-3/Phi-4", ("phi3",), r"phi-?[34]"),
    _family("Phi", ("phi", "phi3"), r"(?<![a-z])phi"),
    _family("SmolLM", ("smollm",), r"smollm"),
    _family("OLMo", ("olmo",), r"olmo"),
    _family("Yi", ("yi",), r"(?<![a-z])yi-"),
    _family("Baichuan", ("baichuan",), r"baichuan"),
    _family("InternLM", ("internlm",), r"internlm"),
    _family("GLM", ("glm",), r"glm"),
    _family("gpt-oss", ("gpt-oss",), r"gpt-oss"),
    _family("DeepSeek", ("deepseek",), r"deepseek"),
    _family("Falcon", ("falcon",), r"falcon"),
    _family("StarCoder", ("starcoder",), r"starcoder"),
    _family("StableLM", ("stablelm",), r"stablelm"),
    _family("Pythia", ("pythia",), r"pythia"),
    _family("OPT", ("opt",), r"(?<![a-z])opt-"),
    _family("BLOOM", ("bloom",), r"bloom"),
)


def family_of_name(name: str) -> NameFamily | None:
    """The family a model name (an id, a path, a folder name) names; None when it names none."""
    lowered = name.lower()
    for family in NAME_FAMILIES:
        if family.pattern.search(lowered):
            return family
    return None


def catalog_family(model_id: str) -> str | None:
    """The one family a bundled model belongs to: its id's first family key."""
    family = family_of_name(model_id)
    return family.keys[0] if family is not None else None


# --- the size a name states --------------------------------------------------------------------

MIN_GUESS_PARAMS = 10_000_000
MAX_GUESS_PARAMS = 3_000_000_000_000

# a size not glued to another number: "8B", "7b", "1.5B", "135M", "0.5B"; not "4bit", not "v0.1"
_DENSE_SIZE = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)([BbMm])(?![A-Za-z0-9])")
_MOE_SIZE = re.compile(r"(?<![0-9.])(\d+)[xX](\d+(?:\.\d+)?)([BbMm])(?![A-Za-z0-9])")


@dataclass(frozen=True, slots=True, kw_only=True)
class NameSize:
    """A parameter count read from a model name."""

    text: str  # as written: "8B", "8x7B"
    params: int  # of one expert-sized model for a MoE name
    num_experts: int = 0


def size_from_name(ref: str) -> NameSize | None:
    """The parameter count a model name states, the largest when it states several
    ("Qwen2.5-7B-Instruct-1M" -> 7B); None when it states none."""
    name = path_tail(ref)
    moe = _MOE_SIZE.search(name)
    if moe:
        params = _params_of(moe.group(2), moe.group(3))
        if MIN_GUESS_PARAMS <= params <= MAX_GUESS_PARAMS:
            return NameSize(text=moe.group(0), params=params, num_experts=int(moe.group(1)))
    sizes = [
        NameSize(text=match.group(0), params=_params_of(match.group(1), match.group(2)))
        for match in _DENSE_SIZE.finditer(name)
    ]
    sizes = [size for size in sizes if MIN_GUESS_PARAMS <= size.params <= MAX_GUESS_PARAMS]
    return max(sizes, key=lambda size: size.params) if sizes else None


def _params_of(number: str, unit: str) -> int:
    return round(float(number) * (1e9 if unit.lower() == "b" else 1e6))


# --- Llama shapes, for a name that names no family ----------------------------------------------


@dataclass(frozen=True)
class LlamaShape:
    """The shapes of a real Llama-family model, used when only a size is known."""

    name: str
    params: int  # its published parameter count
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope_theta: float


LLAMA_SHAPES: tuple[LlamaShape, ...] = (
    LlamaShape("SmolLM-135M", 134_515_008, 576, 30, 1536, 9, 3, 49152, True, 2048, 10_000.0),
    LlamaShape("SmolLM-360M", 361_821_120, 960, 32, 2560, 15, 5, 49152, True, 2048, 10_000.0),
    LlamaShape(
        "TinyLlama-1.1B", 1_100_048_384, 2048, 22, 5632, 32, 4, 32000, False, 2048, 10_000.0
    ),
    LlamaShape(
        "Llama-3.2-1B", 1_235_814_400, 2048, 16, 8192, 32, 8, 128256, True, 131072, 500_000.0
    ),
    LlamaShape("SmolLM2-1.7B", 1_711_376_384, 2048, 24, 8192, 32, 32, 49152, True, 8192, 130_000.0),
    LlamaShape(
        "Llama-3.2-3B", 3_212_749_824, 3072, 28, 8192, 24, 8, 128256, True, 131072, 500_000.0
    ),
    LlamaShape("Llama-2-7B", 6_738_415_616, 4096, 32, 11008, 32, 32, 32000, False, 4096, 10_000.0),
    LlamaShape(
        "Mistral-7B", 7_241_732_096, 4096, 32, 14336, 32, 8, 32000, False, 32768, 1_000_000.0
    ),
    LlamaShape(
        "Llama-3.1-8B", 8_030_261_248, 4096, 32, 14336, 32, 8, 128256, False, 131072, 500_000.0
    ),
    LlamaShape(
        "Llama-2-13B", 13_015_864_320, 5120, 40, 13824, 40, 40, 32000, False, 4096, 10_000.0
    ),
    LlamaShape(
        "Codestral-22B", 22_247_282_688, 6144, 56, 16384, 48, 8, 32768, False, 32768, 1_000_000.0
    ),
    LlamaShape(
        "CodeLlama-34B", 33_743_970_304, 8192, 48, 22016, 64, 8, 32000, False, 16384, 1_000_000.0
    ),
    LlamaShape(
        "Llama-3.1-70B", 70_553_706_496, 8192, 80, 28672, 64, 8, 128256, False, 131072, 500_000.0
    ),
    LlamaShape(
        "Llama-3.1-405B",
        405_853_388_800,
        16384,
        126,
        53248,
        128,
        8,
        128256,
        False,
        131072,
        500_000.0,
    ),
)


def nearest_llama_shape(params: int) -> LlamaShape:
    return min(LLAMA_SHAPES, key=lambda shape: abs(math.log(shape.params / params)))


def llama_config(shape: LlamaShape, *, num_layers: int | None = None) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": num_layers or shape.num_layers,
        "intermediate_size": shape.intermediate_size,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.hidden_size // shape.num_heads,
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    }


def _layers_for(config: dict[str, Any], target_params: int, model_id: str) -> int | None:
    """How many blocks of `config`'s shape make about `target_params` (embeddings and head kept);
    None where the config is not one run of identical blocks counted at its top level."""
    if not isinstance(config.get("num_hidden_layers"), int):
        return None
    try:
        spec = spec_from_config(config, model_id=model_id, source=ModelSource.GUESS)
    except ModelSpecError:
        return None
    if len(spec.blocks) != 1 or spec.num_experts:
        return None
    per_block = spec.blocks[0].params_per_block
    outside_blocks = spec.total_params - per_block * spec.num_layers
    return max(1, round((target_params - outside_blocks) / per_block))


# --- the bundled models a name allows ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BundledShape:
    model_id: str
    params: int
    config: dict[str, Any]


def _decoder_config(config: dict[str, Any]) -> bool:
    architecture = (config.get("architectures") or [""])[0]
    return not (
        config.get("is_encoder_decoder")
        or str(architecture).endswith("ForMaskedLM")
        or config.get("model_type") in ("t5", "mt5")
    )


def _shape_key(config: dict[str, Any]) -> str:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    keys = (
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "tie_word_embeddings",
        "num_local_experts",
        "num_experts",
    )
    return repr([config.get("model_type"), *(text.get(key) for key in keys)])  # type: ignore[union-attr]


# a name that says it routes experts: "30B-A3B", "MoE", "8x7B"
_MOE_NAME = re.compile(r"(?<![a-z0-9])a\d+(?:\.\d+)?b(?![a-z0-9])|moe|\d+x\d", re.IGNORECASE)
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def is_moe_config(config: dict[str, Any]) -> bool:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return any(
        isinstance(holder.get(key), int) and holder[key] > 1
        for holder in (config, text)
        if isinstance(holder, dict)
        for key in _EXPERT_KEYS
    )


# a name that says it reads images: "Qwen2.5-VL", "Llama-3.2-11B-Vision", "llava-1.5"
_VISION_NAME = re.compile(
    r"(?<![a-z0-9])vl(?![a-z])|vision|llava|pixtral|idefics|smolvlm|internvl", re.IGNORECASE
)


def _derived(model_id: str) -> bool:
    """A re-upload or a distill: its shapes are the original's, listed under the original's id."""
    return model_id.lower().startswith("unsloth/") or "distill" in model_id.lower()


def bundled_shapes(
    family_keys: tuple[str, ...] | None, *, moe_name: bool | None = None, near: str = ""
) -> list[BundledShape]:
    """The bundled shapes of these families, as `_bundled_shapes` finds them (kept per
    question: the catalog does not change, and an editor asks again on every change)."""
    return list(_bundled_shapes(family_keys, moe_name, near))


@lru_cache(maxsize=64)
def _bundled_shapes(
    family_keys: tuple[str, ...] | None, moe_name: bool | None, near: str
) -> tuple[BundledShape, ...]:
    """The bundled decoders of these families (every family's for None), one per distinct shape,
    without the quantization of a pre-quantized upload (a guess does not know it). A shape is
    named after an original model, not a re-upload or distill of it, and among originals after
    the one whose name is most like `near` (Qwen2.5-Coder-7B's shape is Qwen2-7B's too). With
    `moe_name` given, those that route experts as the name says (a dense name gets the dense
    ones) where there are any."""
    from difflib import SequenceMatcher

    from llmmem.models.catalog import catalog_entry, catalog_ids

    name = path_tail(near).lower()

    def preference(model_id: str) -> tuple[bool, float, int, str]:
        likeness = SequenceMatcher(None, name, path_tail(model_id).lower()).ratio() if name else 0
        return _derived(model_id), -likeness, len(model_id), model_id.lower()

    members = [
        model_id
        for model_id in catalog_ids()
        if family_keys is None or catalog_family(model_id) in family_keys
    ]
    found: dict[str, BundledShape] = {}
    # a text model's name gets text models' shapes, a vision-language name those with images
    vision_name = bool(_VISION_NAME.search(name))
    for model_id in sorted(members, key=preference):
        entry = catalog_entry(model_id)
        if entry is None or entry.params is None or not _decoder_config(entry.config):
            continue
        if ("vision_config" in entry.config) != vision_name and any(
            ("vision_config" in (other.config if other else {})) == vision_name
            for other in map(catalog_entry, members)
        ):
            continue  # (where the family has no shape of that kind, any shape of it)
        config = dict(entry.config)
        config.pop("quantization_config", None)
        found.setdefault(_shape_key(config), BundledShape(model_id, entry.params, config))
    shapes = tuple(found.values())
    if moe_name is None:
        return shapes
    as_named = tuple(shape for shape in shapes if is_moe_config(shape.config) == moe_name)
    return as_named or shapes


def path_tail(ref: str) -> str:
    """The last part of an id or a path: the model's own name."""
    return re.split(r"[\\/]", ref.rstrip("/\\"))[-1]


def names_experts(ref: str) -> bool:
    """Whether a name says the model routes experts ("30B-A3B", "MoE", "8x7B")."""
    return bool(_MOE_NAME.search(path_tail(ref)))


def _distance(params: int, target: int) -> float:
    return abs(math.log(params / target))


def _allowed(shapes: list[BundledShape], target: int) -> list[BundledShape]:
    near = [s for s in shapes if _distance(s.params, target) <= math.log(ALLOWED_SIZE_FACTOR)]
    return sorted(near, key=lambda s: _distance(s.params, target))[:MAX_ALTERNATIVES]


@dataclass(frozen=True, slots=True, kw_only=True)
class GuessAlternatives:
    """What a name allows: the family it names (None: none) and the bundled shapes near its size
    (the guess's own among them)."""

    family: NameFamily | None
    size: NameSize
    shapes: list[BundledShape]
    within_family: bool  # the shapes are the family's (else every family's near the size)

    @property
    def family_text(self) -> str:
        if self.family is None:
            return "a name that names no family: every bundled family's shapes of its size"
        if not self.within_family:
            return (
                f"the {self.family.label} family, none of it bundled near '{self.size.text}': "
                "every bundled family's shapes of that size"
            )
        return f"the {self.family.label} family"


def guess_alternatives(ref: str) -> GuessAlternatives | None:
    """The bundled shapes a name allows; None for a name that states no size."""
    size = size_from_name(ref)
    if size is None:
        return None
    target = size.params * max(size.num_experts, 1)
    family = family_of_name(ref)
    shapes: list[BundledShape] = []
    moe = names_experts(ref)
    if family is not None:
        shapes = _allowed(bundled_shapes(family.keys, moe_name=moe, near=ref), target)
    within_family = bool(shapes)
    if not shapes:
        shapes = _allowed(bundled_shapes(None, moe_name=moe, near=ref), target)
    return GuessAlternatives(family=family, size=size, shapes=shapes, within_family=within_family)


# --- the guess ---------------------------------------------------------------------------------


def guess_config_from_name(ref: str) -> ResolvedConfig | None:
    """The config of a model of the family and size the name states, or None when it states no
    size: the family's bundled model nearest the size, else a Llama-shaped one."""
    size = size_from_name(ref)
    if size is None:
        return None
    if size.num_experts:
        return _guess_moe_config(ref, size, nearest_llama_shape(size.params))
    family = family_of_name(ref)
    if family is not None:
        members = bundled_shapes(family.keys, moe_name=names_experts(ref), near=ref)
        guess = _guess_from_family(ref, size, family, members)
        if guess is not None:
            return guess
    return _guess_llama(ref, size)


def _guess_from_family(
    ref: str, size: NameSize, family: NameFamily, members: list[BundledShape]
) -> ResolvedConfig | None:
    """The family's bundled model nearest the size: as it is within 10%, else with as many
    blocks as make the size (a dense model up to 4 times larger or smaller); None otherwise."""
    by_distance = sorted(members, key=lambda shape: _distance(shape.params, size.params))
    for nearest in by_distance:
        config = copy.deepcopy(nearest.config)  # the bundled shape is kept for the next guess
        shape_text = f"the shapes of {nearest.model_id}"
        if _distance(nearest.params, size.params) <= math.log(1 + GUESS_SIZE_TOLERANCE):
            break
        if _distance(nearest.params, size.params) > math.log(MAX_LAYER_SCALING):
            return None
        layers = _layers_for(config, size.params, ref)
        if layers is not None:
            config["num_hidden_layers"] = layers
            config.pop("layer_types", None)
            shape_text += f" with {layers} layers"
            break
    else:
        return None
    return ResolvedConfig(
        model_id=ref,
        config=config,
        source=ModelSource.GUESS,
        source_detail=f"guessed from '{size.text}' in the name; {shape_text} "
        f"({family.label} family)",
        notes=[
            f"only the family ({family.label}) and the size '{size.text}' are known: "
            f"{shape_text}; for exact numbers {PRAGMA_HINT}"
        ],
    )


def _guess_llama(ref: str, size: NameSize) -> ResolvedConfig:
    shape = nearest_llama_shape(size.params)
    num_layers = shape.num_layers
    shape_text = f"shapes of a {shape.name}-sized model"
    if abs(shape.params / size.params - 1) > GUESS_SIZE_TOLERANCE:
        num_layers = _layers_for(llama_config(shape), size.params, ref) or num_layers
        shape_text = f"shapes of {shape.name} with {num_layers} layers"
    return ResolvedConfig(
        model_id=ref,
        config=llama_config(shape, num_layers=num_layers),
        source=ModelSource.GUESS,
        source_detail=f"guessed from '{size.text}' in the name; {shape_text}",
        notes=[
            f"only the size '{size.text}' is known: the layer shapes are those of {shape.name} "
            f"({num_layers} layers); for exact numbers {PRAGMA_HINT}"
        ],
    )


def _guess_moe_config(ref: str, size: NameSize, shape: LlamaShape) -> ResolvedConfig:
    config = llama_config(shape)
    config.update(
        model_type="mixtral",
        architectures=["MixtralForCausalLM"],
        num_local_experts=size.num_experts,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.02,
        sliding_window=None,
    )
    detail = (
        f"guessed from '{size.text}' in the name; {size.num_experts} experts in the shapes of a "
        f"{shape.name}-sized model, 2 per token"
    )
    return ResolvedConfig(
        model_id=ref,
        config=config,
        source=ModelSource.GUESS,
        source_detail=detail,
        notes=[
            f"only the size '{size.text}' is known: a Mixtral-style model with {size.num_experts} "
            f"experts of {shape.name} shapes, 2 per token; for exact numbers {PRAGMA_HINT}"
        ],
    )

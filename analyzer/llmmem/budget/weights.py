"""Which parameters a setup holds on the device, at what size, and which of them train.

The inventory is a list of parameter groups (same shape, same storage, same trainability); the
weights, gradients and optimizer states are all read off it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from llmmem.budget.lora_targets import lora_target_linears, partial_regex_notes
from llmmem.budget.setup import Method, QuantSetup, QuantType, SetupError, TrainingSetup
from llmmem.budget.vision_training import VisionTraining, vision_training
from llmmem.models.spec import LinearModule, ModelSpec

GroupKind = Literal[
    "embedding", "head", "linear", "bias", "norm", "other", "adapter", "saved_copy", "buffer"
]
# bytes per parameter of one quantized Linear weight (its quantization, in and out features)
QuantizedBytes = Callable[[QuantSetup, int, int], float]

# bitsandbytes 4-bit storage (blocksize 64): 4 bits per value, an fp32 absmax per block; with double
# quantization the absmax is stored in 8 bits with an fp32 absmax per 256 blocks.
NF4_BLOCK = 64
NF4_DQ_BLOCK = 256


def kbit_bytes_per_param(quant: QuantSetup, in_features: int) -> float:
    """Bytes one quantized weight costs, block constants included."""
    if quant.quant_type is QuantType.INT8:
        # LLM.int8: one int8 per weight and an fp32 scale per output row (SCB)
        return 1.0 + 4.0 / in_features
    if quant.double_quant:
        return 0.5 + 1.0 / NF4_BLOCK + 4.0 / (NF4_BLOCK * NF4_DQ_BLOCK)
    return 0.5 + 4.0 / NF4_BLOCK


@dataclass(frozen=True)
class ParameterGroup:
    name: str
    kind: GroupKind
    tensors: int  # how many tensors of this shape
    rows: int
    cols: int  # 1 for vectors
    bytes_per_param: float
    trainable: bool
    quantized: bool = False
    # the first dimension of each tensor, which FSDP shards, where it is not `rows`: routed
    # experts are stored as one (experts, out, in) tensor per projection
    shard_rows: int = 0

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    @property
    def params(self) -> int:
        return self.tensors * self.numel

    @property
    def bytes(self) -> int:
        return round(self.params * self.bytes_per_param)


@dataclass(frozen=True)
class Inventory:
    groups: list[ParameterGroup]
    base_bytes_per_param: float  # the storage of unquantized base weights
    notes: list[str] = field(default_factory=list)

    @property
    def params(self) -> int:
        """The model's own parameters (adapters, saved copies and buffers are extra)."""
        return sum(
            g.params for g in self.groups if g.kind not in ("saved_copy", "adapter", "buffer")
        )

    @property
    def trainable(self) -> list[ParameterGroup]:
        return [g for g in self.groups if g.trainable]

    @property
    def trainable_params(self) -> int:
        return sum(g.params for g in self.trainable)

    @property
    def weight_bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    @property
    def gradient_bytes(self) -> int:
        return sum(g.bytes for g in self.trainable)

    @property
    def quantized_params(self) -> int:
        return sum(g.params for g in self.groups if g.quantized)

    @property
    def largest_trainable_bytes(self) -> int:
        return max((round(g.numel * g.bytes_per_param) for g in self.trainable), default=0)


def base_weight_bytes(setup: TrainingSetup, spec: ModelSpec) -> float:
    """Storage of an unquantized base weight: the precision's weight dtype."""
    if setup.method is Method.QLORA and setup.quant is not None:
        return float(setup.quant.compute_dtype_bytes)
    return float(setup.precision.weight_bytes)


def bitsandbytes_bytes(quant: QuantSetup, in_features: int, _out_features: int) -> float:
    return kbit_bytes_per_param(quant, in_features)


def build_inventory(
    spec: ModelSpec,
    setup: TrainingSetup,
    *,
    quantized_bytes: QuantizedBytes = bitsandbytes_bytes,
    buffers: tuple[ParameterGroup, ...] = (),
) -> Inventory:
    """Every parameter of the model as the setup holds it on one device (before any sharding).

    `quantized_bytes` sizes a quantized Linear's weight (bitsandbytes' layout unless the
    framework's stack quantizes otherwise); `buffers` are device tensors the framework's model
    keeps beside its parameters (a precomputed RoPE table)."""
    base = base_weight_bytes(setup, spec)
    quant = setup.quant
    full = setup.method is Method.FULL
    notes: list[str] = []
    # prepare_model_for_kbit_training upcasts every parameter that is not quantized to fp32
    unquantized_bytes = base
    matrix_bytes = base  # the embeddings and the head
    if quant is not None and quant.prepare_for_kbit_training and setup.method is not Method.FULL:
        unquantized_bytes = 4.0
        matrix_bytes = 2.0 if quant.embeddings_16bit else 4.0
        notes.append(
            "prepare_model_for_kbit_training keeps the norms in fp32, and "
            + (
                "TRL casts the embeddings and the head back to bf16 (peft_module_casting_to_bf16)"
                if quant.embeddings_16bit
                else "the embeddings and the head in fp32"
            )
        )

    p = spec.params
    hidden = spec.hidden_size
    groups = [
        *_matrix_groups("embeddings", "embedding", p.embedding, hidden, matrix_bytes, full),
        *_matrix_groups("lm_head", "head", p.head, hidden, matrix_bytes, full),
        *_vector_groups("norms", "norm", p.norms, hidden, unquantized_bytes, full),
        *_vector_groups("other", "other", p.other, p.other, unquantized_bytes, full),
    ]

    # transformers 4 builds each routed expert from nn.Linear modules, which bitsandbytes
    # quantizes like any other; transformers 5's 3-D expert parameters stay unquantized
    experts_quantized = setup.experts_are_linears  # and, in FSDP, sharded one by one
    for block in spec.blocks:
        for lin in block.linears:
            tensors = lin.count * block.count
            # transformers 5's router is a bare parameter too, not an nn.Linear
            moe_part = lin.role in ("expert", "router")
            # FSDP2 shards a 3-D expert tensor along its experts
            expert_rows = lin.count if lin.role == "expert" and not experts_quantized else 0
            quantized = quant is not None and (not moe_part or experts_quantized)
            weight_bytes = (
                quantized_bytes(quant, lin.in_features, lin.out_features)
                if quantized and quant
                else base
            )
            if quant is not None and not quantized:
                weight_bytes = unquantized_bytes
            groups.append(
                ParameterGroup(
                    name=lin.name,
                    kind="linear",
                    tensors=tensors,
                    rows=lin.out_features,
                    cols=lin.in_features,
                    bytes_per_param=weight_bytes,
                    trainable=full,
                    quantized=quantized,
                    shard_rows=expert_rows,
                )
            )
            if lin.bias:
                groups.append(
                    ParameterGroup(
                        name=f"{lin.name}.bias",
                        kind="bias",
                        tensors=tensors,
                        rows=lin.out_features,
                        cols=1,
                        bytes_per_param=unquantized_bytes if quant else base,
                        trainable=full,
                        shard_rows=lin.count
                        if lin.role == "expert" and not experts_quantized
                        else 0,
                    )
                )
        has_experts = any(lin.role == "expert" for lin in block.linears)
        if quant is not None and has_experts and not experts_quantized:
            notes.append(
                f"transformers {setup.transformers_version} stores the experts as 3-D tensors, "
                "which bitsandbytes does not replace: they stay unquantized (transformers 4 "
                "quantized its one nn.Linear per expert)"
            )
        elif quant is not None and has_experts:
            notes.append(
                f"transformers {setup.transformers_version} builds each expert from nn.Linear "
                "modules: bitsandbytes quantizes them"
            )

    if setup.method in (Method.LORA, Method.QLORA) and setup.lora is not None:
        groups.extend(_adapter_groups(spec, setup))
        groups.extend(_modules_to_save(spec, setup, groups))
        notes.extend(partial_regex_notes(spec, setup.lora.targets))
    groups.extend(buffers)
    if spec.vision is not None:  # a vision-language model's encoder and projector
        groups.extend(vision_parameter_groups(spec, setup, quantized_bytes))
    return Inventory(groups=groups, base_bytes_per_param=base, notes=notes)


def _matrix_groups(
    name: str, kind: GroupKind, total: int, width: int, bytes_per_param: float, trainable: bool
) -> list[ParameterGroup]:
    """`total` parameters as one matrix `width` wide, and a vector of whatever is left over
    (learned positions, a head's bias)."""
    rows = total // width if width else 0
    groups = []
    if rows:
        groups.append(
            ParameterGroup(
                name=name,
                kind=kind,
                tensors=1,
                rows=rows,
                cols=width,
                bytes_per_param=bytes_per_param,
                trainable=trainable,
            )
        )
    groups += _vector_groups(
        f"{name} extras",
        "other",
        total - rows * width,
        total - rows * width,
        bytes_per_param,
        trainable,
    )
    return groups


def _vector_groups(
    name: str, kind: GroupKind, total: int, length: int, bytes_per_param: float, trainable: bool
) -> list[ParameterGroup]:
    """`total` parameters as vectors of `length` (norm weights), and one with the rest."""
    if total <= 0 or length <= 0:
        return []
    count, rest = divmod(total, length)
    groups = []
    if count:
        groups.append(
            ParameterGroup(
                name=name,
                kind=kind,
                tensors=count,
                rows=length,
                cols=1,
                bytes_per_param=bytes_per_param,
                trainable=trainable,
            )
        )
    if rest:
        groups.append(
            ParameterGroup(
                name=f"{name} extras",
                kind=kind,
                tensors=1,
                rows=rest,
                cols=1,
                bytes_per_param=bytes_per_param,
                trainable=trainable,
            )
        )
    return groups


def _adapter_groups(spec: ModelSpec, setup: TrainingSetup) -> list[ParameterGroup]:
    lora = setup.lora
    assert lora is not None
    groups: list[ParameterGroup] = []
    adapter_bytes = float(lora.adapter_bytes)
    for lin in lora_target_linears(spec, lora.targets):
        tensors = lin.count * sum(g.count for g in spec.blocks if lin in g.linears)
        shapes = [("lora_A", lora.r, lin.in_features), ("lora_B", lin.out_features, lora.r)]
        if lora.dora:
            shapes.append(("lora_magnitude", lin.out_features, 1))
        groups += [
            ParameterGroup(
                name=f"{part}.{lin.name}",
                kind="adapter",
                tensors=tensors,
                rows=rows,
                cols=cols,
                bytes_per_param=adapter_bytes,
                trainable=True,
            )
            for part, rows, cols in shapes
        ]
    return groups


CLASSIFIER_HEADS = ("score", "classifier")


def _modules_to_save(
    spec: ModelSpec, setup: TrainingSetup, groups: list[ParameterGroup]
) -> list[ParameterGroup]:
    """`modules_to_save` keeps the original frozen and trains a full copy of the module."""
    lora = setup.lora
    assert lora is not None
    copies: list[ParameterGroup] = []
    wanted = {name.lower() for name in lora.modules_to_save}
    aliases = {
        "embed_tokens": "embeddings",
        "wte": "embeddings",
        "word_embeddings": "embeddings",
        "shared": "embeddings",
        "lm_head": "lm_head",
        "embed_out": "lm_head",
    }
    classifier = spec.architecture.endswith("ForSequenceClassification")
    for name in sorted(wanted):
        target = aliases.get(name)
        if name in CLASSIFIER_HEADS:
            # a sequence-classification model's head (TRL's RewardTrainer recommends
            # modules_to_save=["score"]; PEFT's SEQ_CLS task adds it by itself)
            if not classifier:
                raise SetupError(
                    f"modules_to_save '{name}' names a sequence-classification head; "
                    f"{spec.architecture} has lm_head instead"
                )
            target = "lm_head"
        if target is None:
            raise SetupError(
                f"modules_to_save '{name}' is not a module llmmem can count: use "
                f"{', '.join(sorted(aliases))}"
                + (f" (or {' / '.join(CLASSIFIER_HEADS)} for a reward model)")
            )
        if target == "lm_head" and not spec.params.head:
            target = "embeddings"  # a tied head is the embedding matrix
        for g in groups:
            if g.name == target and g.kind in ("embedding", "head"):
                copies.append(
                    replace(
                        g,
                        name=f"modules_to_save.{name}",
                        kind="saved_copy",
                        trainable=True,
                        quantized=False,
                        bytes_per_param=4.0 if setup.method is Method.QLORA else g.bytes_per_param,
                    )
                )
    return copies


# --- the image side of a vision-language model ------------------------------------------------


def vision_parameter_groups(
    spec: ModelSpec, setup: TrainingSetup, quantized_bytes: QuantizedBytes
) -> list[ParameterGroup]:
    """The encoder's and the projector's parameters as the setup holds them, and the LoRA
    adapters PEFT puts on their Linears."""
    tower = spec.vision
    if tower is None:
        return []
    training = vision_training(spec, setup)
    base = base_weight_bytes(setup, spec)
    quant = setup.quant
    # prepare_model_for_kbit_training upcasts every parameter bitsandbytes left alone
    unquantized = 4.0 if quant is not None and quant.prepare_for_kbit_training else base
    encoder = tower.encoder
    groups: list[ParameterGroup] = []

    def linear_groups(
        prefix: str, lin: LinearModule, count: int, trains: bool
    ) -> list[ParameterGroup]:
        weight = quantized_bytes(quant, lin.in_features, lin.out_features) if quant else base
        found = [
            ParameterGroup(
                name=f"{prefix}.{lin.path}",
                kind="linear",
                tensors=count * lin.count,
                rows=lin.out_features,
                cols=lin.in_features,
                bytes_per_param=weight,
                trainable=trains,
                quantized=quant is not None,
            )
        ]
        if lin.bias:
            found.append(
                ParameterGroup(
                    name=f"{prefix}.{lin.path}.bias",
                    kind="bias",
                    tensors=count * lin.count,
                    rows=lin.out_features,
                    cols=1,
                    bytes_per_param=unquantized if quant else base,
                    trainable=trains,
                )
            )
        return found

    in_blocks = 0
    for group in encoder.blocks:
        for lin in group.linears:
            groups += linear_groups("vision", lin, group.count, training.encoder_trains)
        rest = group.norm_params + group.other_params
        in_blocks += group.params_per_block * group.count
        if rest:
            groups.append(
                ParameterGroup(
                    name=f"vision.{group.name} norms",
                    kind="norm",
                    tensors=group.count,
                    rows=rest,
                    cols=1,
                    bytes_per_param=unquantized if quant else base,
                    trainable=training.encoder_trains,
                )
            )
    outside = encoder.params.total - in_blocks
    if outside:
        groups.append(
            ParameterGroup(
                name="vision.embeddings and norms",
                kind="other",
                tensors=1,
                rows=outside,
                cols=1,
                bytes_per_param=unquantized if quant else base,
                trainable=training.encoder_trains,
            )
        )
    projector_linears = 0
    for lin in tower.projector_linears:
        groups += linear_groups("projector", lin, 1, training.projector_trains)
        projector_linears += lin.params
    if tower.projector_params > projector_linears:
        groups.append(
            ParameterGroup(
                name="projector.rest",
                kind="other",
                tensors=1,
                rows=tower.projector_params - projector_linears,
                cols=1,
                bytes_per_param=unquantized if quant else base,
                trainable=training.projector_trains,
            )
        )
    groups += vision_adapters(spec, setup, training)
    return groups


def vision_adapters(
    spec: ModelSpec, setup: TrainingSetup, training: VisionTraining
) -> list[ParameterGroup]:
    lora = setup.lora
    tower = spec.vision
    if lora is None or tower is None:
        return []
    found: list[ParameterGroup] = []
    placed = [
        (lin, group.count)
        for group in tower.encoder.blocks
        for lin in group.linears
        if lin.path in training.encoder_adapted
    ] + [(lin, 1) for lin in tower.projector_linears if lin.path in training.projector_adapted]
    for lin, count in placed:
        shapes = [("lora_A", lora.r, lin.in_features), ("lora_B", lin.out_features, lora.r)]
        found += [
            ParameterGroup(
                name=f"vision.{part}.{lin.path}",
                kind="adapter",
                tensors=count,
                rows=rows,
                cols=cols,
                bytes_per_param=float(lora.adapter_bytes),
                trainable=True,
            )
            for part, rows, cols in shapes
        ]
    return found

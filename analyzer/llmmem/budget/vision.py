"""The image side of a vision-language model in one training step: the vision encoder's and
projector's parameters, what of them trains, the tensors the encoder keeps for backward, and
the image tokens that lengthen the language model's sequence.

What decides each term (read in transformers 5.24 and peft 0.21.2, measured on CPU steps of
Qwen2.5-VL and Llama 3.2 Vision in tests/budget/test_vision_steps.py):

- weights: the encoder and the projector are loaded with the model, in its dtype; bitsandbytes
  quantizes their Linears as it does the language model's;
- what trains: full fine-tuning trains everything the images pass through (TRL 1.16's
  SFTTrainer freezes nothing); LoRA trains adapters wherever PEFT's target names match, the
  encoder's and projector's Linears included (`all-linear` takes them all, `q_proj` also the
  encoder's q_proj); LLaMA-Factory's freeze_vision_tower and freeze_multi_modal_projector
  freeze them and keep the adapters out (VisionSetup says so);
- gradients through the encoder: where anything in it trains, and also where LoRA runs with
  gradient checkpointing: `enable_input_require_grads` (PEFT's get_peft_model, TRL's
  SFTTrainer) hooks the input embeddings of every sub-model, the encoder's patch embedding
  too, so a frozen encoder runs with autograd on and its checkpointed blocks keep their
  inputs;
- saved tensors: the encoder's blocks keep what the language model's keep (the same op by op
  rules, llmmem.budget.activations), over the image's patches, attention within each image or
  tile (Qwen's ViTs call attention per image and concatenate: the output projection's input
  is a copy); with checkpointing, each block's input and one block recomputed in backward;
- image tokens: the processor's rule (llmmem.budget.image_tokens) gives the tokens each image
  takes in the language model's sequence; they are added to `seq` unless it already counts
  them (a maximum length over the whole sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmmem.budget.activations import (
    TRANSFORMERS_RULES,
    BlockContext,
    Trainability,
    block_tally,
    dtypes_for,
)
from llmmem.budget.image_tokens import ImageTokens, image_tokens
from llmmem.budget.result import Component, PhaseBudget, Term
from llmmem.budget.setup import AttnImpl, Method, TrainingSetup, VisionSetup
from llmmem.budget.vision_training import VisionTraining, vision_training
from llmmem.models.spec import ModelSpec, VisionTower
from llmmem.units import format_bytes

# --- parameters --------------------------------------------------------------------------------


# --- the image tokens in the language model's sequence --------------------------------------------


def sample_tokens(spec: ModelSpec, images: VisionSetup) -> ImageTokens:
    """What one sample's images become in this model."""
    assert spec.vision is not None
    return image_tokens(spec.vision, images, pinpoints=None)


def with_image_tokens(spec: ModelSpec, setup: TrainingSetup) -> tuple[TrainingSetup, list[str]]:
    """The setup with the language model's whole sequence: the text's tokens and the images'.
    Once applied, `seq_includes_images` says so (applying it again changes nothing)."""
    images = setup.vision
    if images is None:
        if spec.vision is not None and setup.method is Method.FULL:
            return setup, [
                "no images given: the vision encoder and projector are counted as weights "
                "only (images per sample and their size: --images N --image-size WxH)"
            ]
        return setup, []
    if spec.vision is None:
        return replace(setup, vision=None), [
            f"{spec.model_id} has no vision encoder: the images are not counted"
        ]
    found = sample_tokens(spec, images)
    notes = [
        f"images: {found.formula}; {found.lm_tokens} tokens of each sample's sequence"
        + (f" ({images.assumed})" if images.assumed else "")
    ]
    if images.seq_includes_images:
        if found.lm_tokens >= setup.seq:
            notes.append(
                f"the images take {found.lm_tokens} tokens, not fewer than the maximum length "
                f"{setup.seq}: truncation would cut image tokens, which transformers refuses "
                "(image features and image tokens do not match)"
            )
        return setup, notes
    seq = setup.seq + found.lm_tokens
    notes.append(f"sequence: {setup.seq} text tokens + {found.lm_tokens} image tokens = {seq}")
    return replace(setup, seq=seq, vision=replace(images, seq_includes_images=True)), notes


# --- the encoder's tensors ---------------------------------------------------------------------


@dataclass(frozen=True)
class VisionActivations:
    """The image side's memory in one step, for one micro-batch."""

    saved: Term  # kept from the encoder's forward to its backward
    # while the encoder's last (or, checkpointed, any) block runs in forward, beyond `saved`
    running: Term
    # the encoder's backward, at its last block: one block's tensors and their gradients
    backward: Term
    features: Term  # the projector's output, scattered into the language model's embeddings
    # alive while the model's forward runs, gone when it returns: the encoder's last hidden
    # state (its output object) and the projector's output
    forward_only: Term


def vision_activations(spec: ModelSpec, setup: TrainingSetup) -> VisionActivations | None:
    """What the encoder and projector hold over a step of `setup` (None without images)."""
    tower = spec.vision
    images = setup.vision
    if tower is None or images is None:
        return None
    training = vision_training(spec, setup)
    tokens = sample_tokens(spec, images)
    encoder = tower.encoder
    dt = dtypes_for(setup)
    e = dt.compute
    n = setup.batch * tokens.encoder_tokens
    width = encoder.hidden_size
    dims = _encoder_dims(encoder, setup, tokens)
    block_bytes = 0
    per_block: list[tuple[int, int, str]] = []  # (count, bytes, formula)
    if training.encoder_grad:
        train = Trainability(
            base_trains=training.encoder_trains,
            adapted=training.encoder_adapted,
            lora_dropout=bool(setup.lora and setup.lora.dropout > 0),
            dora=False,
            adapter_bytes=setup.lora.adapter_bytes if setup.lora else 4,
            linears_save_input=setup.distributed.zero_stage == 3,
        )
        tower_setup = replace(setup, vision=None, packing=None, attn=_encoder_attention(setup))
        ctx = BlockContext(encoder, tower_setup, dt, train, TRANSFORMERS_RULES)
        for group in encoder.blocks:
            tally = block_tally(ctx, group)
            if _splits_attention(tower) and any(
                ctx.train.linear_inputs_saved or ctx.train.adapter(lin)
                for lin in group.linears
                if lin.name == "proj"
            ):
                tally.add(e, "N·q")  # the per-image outputs concatenated: a copy proj keeps
            per_block.append((group.count, tally.evaluate(dims), tally.formula()))
        block_bytes = max((b for _, b, _ in per_block), default=0)
    layers = sum(g.count for g in encoder.blocks)
    residual = dt.residual * n * width
    if not training.encoder_grad:
        saved = 0
        saved_text = "none: the encoder is frozen and nothing before it needs a gradient"
    elif setup.grad_ckpt and _encoder_checkpoints(tower):
        saved = layers * residual
        saved_text = f"{dt.residual}·N·w × {layers} checkpointed encoder blocks (their inputs)"
    else:
        saved = sum(count * b for count, b, _ in per_block)
        saved_text = "; ".join(f"{count} × ({formula})" for count, _, formula in per_block)
    extra, extra_text = _outside_blocks(tower, setup, training, tokens, e)
    saved += extra
    if extra_text:
        saved_text += f" + {extra_text}"
    if training.encoder_trains and e != 4:
        # the patch embedding keeps its input, the pixels cast to the weights' dtype
        pixels = n * 3 * tower.geometry.temporal_patch_size * tower.geometry.patch_size**2
        saved += e * pixels
        saved_text += f" + {e}·{pixels} cast pixels (kept by the patch embedding)"
    if training.encoder_grad and tower.geometry.rule == "cross_attention":
        # Mllama's encoder attends over each image's tiles under one mask in the weights'
        # dtype, made once and kept by every block's SDPA: (tiles · padded patches)² per image
        mask = e * setup.batch * tokens.square
        saved += mask
        saved_text += f" + {e}·{setup.batch * tokens.square} (the tiles' attention mask)"
    leaves = 0
    if training.input_grads:
        # enable_input_require_grads makes the token embeddings' and the patch embedding's
        # outputs leaves that require grad: their AccumulateGrad nodes keep them to the end of
        # backward (the image features are scattered into a copy of the first)
        leaves = dt.residual * setup.tokens * spec.hidden_size + e * n * width
        saved += leaves
        saved_text += " + the embeddings' outputs, made leaves by enable_input_require_grads"
    rows = setup.batch * tokens.merged_tokens
    features = Term(
        bytes=e * rows * spec.hidden_size,
        formula=f"{e}·{rows} image tokens·{spec.hidden_size} (the projector's output)",
    )
    checkpointed = setup.grad_ckpt and _encoder_checkpoints(tower)
    if training.encoder_grad and checkpointed:
        running = Term(bytes=block_bytes, formula="one encoder block run for its input")
    elif training.encoder_grad:
        running = Term(bytes=0, formula="none beyond its saved tensors")
    else:
        # a frozen block: its input, its attention's q, k, v and output, or its MLP's
        mlp = (3 if encoder.mlp == "gated" else 2) * e * n * encoder.intermediate_size
        attention = 5 * e * n * width
        running = Term(
            bytes=residual + max(mlp, attention),
            formula=f"a frozen encoder block's tensors in flight "
            f"({format_bytes(residual + max(mlp, attention))})",
        )
    backward = Term(
        bytes=(block_bytes if checkpointed else 0)
        + 2 * dt.residual * n * width
        + 2 * e * n * encoder.intermediate_size,
        formula="the encoder's first block: its tensors (recomputed) and gradients in flight"
        if checkpointed
        else "the encoder's first block's gradients in flight",
    )
    if not training.encoder_grad:
        backward = Term(bytes=0, formula="none")
    elif leaves:
        backward = Term(
            bytes=backward.bytes + leaves,
            formula=backward.formula + " + the embeddings' leaves' gradients",
        )
    forward_only = Term(
        bytes=e * n * width + features.bytes,
        formula=f"{e}·{n}·{width} (the encoder's last hidden state) + {features.formula}",
    )
    return VisionActivations(
        saved=Term(bytes=saved, formula=f"vision encoder, {n} patch tokens: {saved_text}"),
        running=running,
        backward=backward,
        features=features,
        forward_only=forward_only,
    )


def _encoder_checkpoints(tower: VisionTower) -> bool:
    """Whether gradient checkpointing reaches the encoder's blocks: every family's are
    GradientCheckpointingLayers but Mllama's (MllamaVisionEncoderLayer is a plain module)."""
    return tower.geometry.rule != "cross_attention"


def _encoder_attention(setup: TrainingSetup) -> AttnImpl:
    """The encoders' attention: SDPA unless eager is asked (they take no flash kernel of
    their own in transformers 5.24 on the CPU)."""
    return AttnImpl.EAGER if setup.attn is AttnImpl.EAGER else AttnImpl.SDPA


def _splits_attention(tower: VisionTower) -> bool:
    """The Qwen ViTs call attention once per image (or window) and concatenate the outputs."""
    return tower.geometry.rule == "grid" and not tower.geometry.row_break


def _encoder_dims(
    encoder: ModelSpec, setup: TrainingSetup, tokens: ImageTokens
) -> dict[str, float]:
    n = setup.batch * tokens.encoder_tokens
    r = setup.lora.r if setup.lora else 0
    heads = encoder.num_attention_heads
    square = setup.batch * tokens.square
    return {
        "N·h": n * encoder.hidden_size,
        "N·q": n * encoder.q_dim,
        "N·kvd": n * encoder.kv_dim,
        "N·I": n * encoder.intermediate_size,
        "N·Is": 0,
        "k·N": 0,
        "N·r": n * r,
        "N·E": n,
        "b·a·s": heads * n,
        "b·a·s²": heads * square,
        "b·s²": square,
        "k·N·h": 0,
        "k·N·I": 0,
    }


def _outside_blocks(
    tower: VisionTower,
    setup: TrainingSetup,
    training: VisionTraining,
    tokens: ImageTokens,
    e: int,
) -> tuple[int, str]:
    """What the patch embedding, the position tables and the projector keep."""
    if not training.projector_grad:
        return 0, ""
    rows = setup.batch * tokens.merged_tokens
    n = setup.batch * tokens.encoder_tokens
    width = tower.encoder.hidden_size
    kept = 0
    parts = []
    # the projector: its norm's fp32 input, each trained or adapted Linear's input, and the
    # activation between its Linears
    linears = tower.projector_linears
    norm = 4 * n * width if tower.projector_params > sum(lin.params for lin in linears) else 0
    kept += norm
    for index, lin in enumerate(linears):
        trains = training.projector_trains or lin.path in training.projector_adapted
        if trains:
            kept += e * rows * lin.in_features
        if index < len(linears) - 1:
            kept += e * rows * lin.out_features
    parts.append(f"the projector's kept inputs over {rows} merged tokens")
    return kept, " + ".join(parts)


def vision_phase_parts(
    vision: VisionActivations | None,
    in_forward: dict[Component, Term],
    temporaries: Term,
    gradients: Term,
) -> tuple[list[tuple[str, dict[Component, Term]]], list[tuple[str, dict[Component, Term]]]]:
    """The moments of the encoder's own forward and backward, as (moment, components) for the
    forward and the backward phases: the encoder's last block running in forward (nothing of
    the language model's yet), and its first block's backward after the language model's
    (every gradient of the language model made)."""
    if vision is None:
        return [], []
    forward = [
        (
            "forward of the vision encoder's last block",
            {
                **in_forward,
                Component.ACTIVATIONS: vision.saved,
                Component.TEMPORARIES: Term(
                    bytes=temporaries.bytes + vision.running.bytes,
                    formula=" + ".join(
                        [temporaries.formula] * bool(temporaries.bytes) + [vision.running.formula]
                    ),
                ),
            },
        )
    ]
    backward = []
    if vision.backward.bytes:
        backward.append(
            (
                "backward of the vision encoder's first block",
                {
                    Component.GRADIENTS: gradients,
                    Component.ACTIVATIONS: vision.saved,
                    Component.TEMPORARIES: Term(
                        bytes=temporaries.bytes + vision.backward.bytes,
                        formula=" + ".join(
                            [temporaries.formula] * bool(temporaries.bytes)
                            + [vision.backward.formula]
                        ),
                    ),
                },
            )
        )
    return forward, backward


def pixel_values(spec: ModelSpec, setup: TrainingSetup) -> Term:
    """The batch's pixel values, on the device from the forward to the end of the step: fp32
    as the processors return them, channels × (temporal ×) patch² values per encoder patch."""
    tower = spec.vision
    images = setup.vision
    if tower is None or images is None:
        return Term(bytes=0, formula="none")
    tokens = sample_tokens(spec, images)
    g = tower.geometry
    if g.rule == "grid":
        patches = setup.batch * tokens.encoder_tokens
    else:  # whole images or tiles of image_size, each (image_size / patch)² patches
        patches = setup.batch * tokens.units * ((g.image_size or 0) // g.patch_size) ** 2
    per_patch = 3 * g.temporal_patch_size * g.patch_size * g.patch_size
    return Term(
        bytes=4 * patches * per_patch,
        formula=f"4·{patches} patches·{per_patch} values (the batch's fp32 pixel values)",
    )


def with_pixel_values(
    phases: list[PhaseBudget], spec: ModelSpec, setup: TrainingSetup
) -> list[PhaseBudget]:
    """Each phase with the batch's pixel values beside its temporaries (the same bytes at every
    moment, so each phase's peak moment stays the one it was)."""
    pixels = pixel_values(spec, setup)
    if not pixels.bytes:
        return phases
    out = []
    for budget in phases:
        parts = dict(budget.components)
        kept = parts.get(Component.TEMPORARIES) or Term(bytes=0, formula="none")
        parts[Component.TEMPORARIES] = Term(
            bytes=pixels.bytes + kept.bytes,
            formula=" + ".join([kept.formula] * bool(kept.bytes) + [pixels.formula]),
        )
        out.append(replace(budget, components=parts))
    return out

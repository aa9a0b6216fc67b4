"""Which Linear modules a LoRA `target_modules` names, as PEFT decides it (peft 0.21.2
`check_target_module_exists`):

- a list of names: a module matches where its name is one of them or its full name ends with
  `.` + one of them;
- `all-linear`: every Linear but the output head;
- one string that is not `all-linear`: a regular expression that must match the module's whole
  name (`re.fullmatch`), such as axolotl's
  `model.language_model.layers.[\\d]+.(mlp|self_attn).(up|down|gate|q|k|v|o)_proj`.

A spec's Linears carry their path inside their block (`self_attn.q_proj`); a regular expression is
matched against the full names transformers gives them, under the prefixes its model classes
use for the language model's blocks, a vision encoder's blocks and a projector. A block group
counts as adapted where the expression matches any of its layers (a group is one shape repeated;
an expression that picks some layers only is sized as if it picked them all, and said)."""

from __future__ import annotations

import re

from llmmem.budget.setup import SetupError
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec

# characters that make a target a regular expression rather than a module name
REGEX_CHARS = re.compile(r"[\\^$*+?()\[\]{}|]")

# where transformers' model classes put the language model's blocks ({i}: the layer index)
LANGUAGE_PREFIXES = (
    "model.layers.{i}.",
    "model.language_model.layers.{i}.",
    "model.language_model.model.layers.{i}.",
    "language_model.model.layers.{i}.",
    "language_model.layers.{i}.",
    "model.text_model.layers.{i}.",
    "transformer.h.{i}.",
    "transformer.layers.{i}.",
    "transformer.blocks.{i}.",
    "gpt_neox.layers.{i}.",
    "model.decoder.layers.{i}.",
    "layers.{i}.",
)
# a vision encoder's blocks
VISION_PREFIXES = (
    "model.visual.blocks.{i}.",
    "visual.blocks.{i}.",
    "model.vision_tower.vision_model.encoder.layers.{i}.",
    "vision_tower.vision_model.encoder.layers.{i}.",
    "model.vision_tower.transformer.layers.{i}.",
    "vision_tower.transformer.layers.{i}.",
    "model.vision_tower.encoder.layer.{i}.",
    "model.vision_model.encoder.layers.{i}.",
    "model.vision_model.transformer.layers.{i}.",
    "model.vision_model.global_transformer.layers.{i}.",
    "vision_model.encoder.layers.{i}.",
)
# a projector's Linears (their path already names the projector's own parts)
PROJECTOR_PREFIXES = (
    "model.visual.",
    "visual.",
    "model.",
    "model.multi_modal_projector.",
    "multi_modal_projector.",
    "model.connector.",
    "",
)


def is_regex(targets: list[str] | None) -> bool:
    """PEFT reads one string (not `all-linear`) as a regular expression; llmmem holds it as a
    one-item list, so a single target with a regex character is one."""
    return (
        targets is not None
        and len(targets) == 1
        and targets[0].lower() != "all-linear"
        and bool(REGEX_CHARS.search(targets[0]))
    )


def _compiled(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


def regex_layers(pattern: str, group: BlockGroup, lin: LinearModule, *, vision: bool) -> int:
    """How many of the group's layers the expression adapts this Linear in."""
    compiled = _compiled(pattern)
    if compiled is None:
        return 0
    prefixes = VISION_PREFIXES if vision else LANGUAGE_PREFIXES
    return sum(
        1
        for i in range(group.count)
        if any(compiled.fullmatch(p.format(i=i) + lin.path) for p in prefixes)
    )


def regex_matches_projector(pattern: str, lin: LinearModule) -> bool:
    compiled = _compiled(pattern)
    return compiled is not None and any(
        compiled.fullmatch(prefix + lin.path) for prefix in PROJECTOR_PREFIXES
    )


def name_matches(lin: LinearModule, targets: list[str]) -> bool:
    """A list of names (or `all-linear`): PEFT's suffix match."""
    return any(t.lower() == "all-linear" for t in targets) or any(
        t == lin.name or lin.path == t or lin.path.endswith("." + t) for t in targets
    )


def partial_regex_notes(spec: ModelSpec, targets: list[str] | None) -> list[str]:
    """Where a regular expression adapts a Linear in some layers of a group only: a note (the
    group is sized as if it adapted every layer)."""
    if not is_regex(targets):
        return []
    assert targets is not None
    notes = []
    for group in spec.blocks:
        for lin in group.linears:
            found = regex_layers(targets[0], group, lin, vision=False)
            if 0 < found < group.count:
                notes.append(
                    f"the LoRA target expression adapts {lin.path} in {found} of "
                    f"{group.count} layers; sized as if in all (an upper bound)"
                )
    return notes


def regex_reaches_vision(spec: ModelSpec, pattern: str) -> bool:
    """Whether the expression adapts any Linear of the vision encoder or the projector."""
    tower = spec.vision
    if tower is None:
        return False
    return any(
        regex_layers(pattern, group, lin, vision=True)
        for group in tower.encoder.blocks
        for lin in group.linears
    ) or any(regex_matches_projector(pattern, lin) for lin in tower.projector_linears)


def default_lora_targets(spec: ModelSpec) -> list[str]:
    """PEFT's per-architecture default: the query and value projections (or the fused qkv)."""
    names = {lin.name for group in spec.blocks for lin in group.linears}
    for pair in (["q_proj", "v_proj"], ["query", "value"], ["q", "v"]):
        if set(pair) <= names:
            return pair
    for fused in ("c_attn", "query_key_value", "qkv_proj", "Wqkv"):
        if fused in names:
            return [fused]
    return ["all-linear"]


def torchtune_lora_targets(spec: ModelSpec) -> list[str]:
    """The LoRA targets of torchtune's built-in configs (the torchtune reader's
    TORCHTUNE_LORA_TARGETS) where the model has those modules, else PEFT's default."""
    from llmmem.extract.frameworks.torchtune import TORCHTUNE_LORA_TARGETS

    names = {lin.name for group in spec.blocks for lin in group.linears}
    chosen = [name for name in TORCHTUNE_LORA_TARGETS if name in names]
    return chosen if len(chosen) == len(TORCHTUNE_LORA_TARGETS) else default_lora_targets(spec)


def lora_target_linears(spec: ModelSpec, targets: list[str] | None) -> list[LinearModule]:
    """The block linears PEFT would adapt for `target_modules` (leaf names or path suffixes);
    None means PEFT's default for the architecture."""
    every = [lin for group in spec.blocks for lin in group.linears]
    if not targets:
        targets = default_lora_targets(spec)
    if any(t.lower() == "all-linear" for t in targets):
        return every
    if is_regex(targets):
        matched = [
            lin
            for group in spec.blocks
            for lin in group.linears
            if regex_layers(targets[0], group, lin, vision=False)
        ]
        if not matched and regex_reaches_vision(spec, targets[0]):
            return []  # the adapters are all in the vision encoder or the projector
    else:
        matched = [lin for lin in every if name_matches(lin, targets)]
    if not matched:
        names = sorted({lin.name for lin in every})
        raise SetupError(
            f"LoRA targets {', '.join(targets)} match no Linear module of {spec.model_id}; "
            f"its modules are: {', '.join(names)} (or use all-linear)"
        )
    return matched

"""What a step needs when the model's shapes are only guessed from its name.

A guess is one of several shapes the name allows (the family's bundled models near the stated size,
or every family's where the name names none), and the memory of a step differs by more between
them than any band of measured residuals: Qwen2.5-7B's 152k vocabulary against Mistral-7B's 32k is
a threefold difference in the logits. So a guessed model gets no verdict of its own: the step is
sized under each shape the name allows, and the range they span, bands included, is what is said.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmem.scenario import Analysis


@dataclass(frozen=True, slots=True, kw_only=True)
class GuessedRange:
    """The device totals of the step under every shape a guessed model's name allows."""

    low_bytes: int  # the low end of the smallest shape's band
    high_bytes: int  # the high end of the largest shape's band
    family_text: str  # "the Qwen2/Qwen2.5 family", or what the name allows where it names none
    shapes: tuple[str, ...]  # the bundled models whose shapes were sized

    def span(self) -> str:
        """`106–115 GiB`, in the unit of the high end."""
        from llmmem.budget.bands import Band, band_range

        ends, unit = band_range(self.high_bytes, Band(self.low_bytes, self.high_bytes, "", 0))
        return f"{ends} {unit}"

    def describe(self) -> str:
        """`106–115 GiB with the shapes the name allows (the Qwen2/Qwen2.5 family:
        Qwen/Qwen2.5-7B)`."""
        named = ", ".join(self.shapes[:3])
        if len(self.shapes) > 3:
            named += f" and {len(self.shapes) - 3} more"
        family = f"{self.family_text}: {named}" if named else self.family_text
        return f"{self.span()} with the shapes the name allows ({family})"


def guessed_range(analysis: Analysis) -> GuessedRange | None:
    """The range of a step whose model was guessed from its name; None for a model whose shapes
    were read, or a step that could not be sized."""
    spec, setup, budget = analysis.spec, analysis.setup, analysis.budget
    if spec is None or setup is None or budget is None or not spec.is_guess:
        return None
    from llmmem.models.architectures import spec_from_config
    from llmmem.models.name_guess import guess_alternatives
    from llmmem.models.spec import ModelSource, ModelSpecError
    from llmmem.preference_plan import budget_for_plan

    band = budget.band
    low, high = band.low_bytes, band.high_bytes
    alternatives = guess_alternatives(spec.model_id)
    if alternatives is None:
        return GuessedRange(
            low_bytes=low, high_bytes=high, family_text=spec.source_detail, shapes=()
        )
    sized = []
    for shape in alternatives.shapes:
        try:
            other = spec_from_config(shape.config, model_id=spec.model_id, source=ModelSource.GUESS)
            other_band = budget_for_plan(analysis.plan, other, setup, analysis.gpu).band
        except (ModelSpecError, ValueError):  # a LoRA target or a setting this shape refuses
            continue
        low, high = min(low, other_band.low_bytes), max(high, other_band.high_bytes)
        sized.append(shape.model_id)
    return GuessedRange(
        low_bytes=low,
        high_bytes=high,
        family_text=alternatives.family_text,
        shapes=tuple(sized),
    )


def guessed_verdict_text(analysis: Analysis) -> str | None:
    """`unknown: sized from its name; 14.1–31.2 GiB under the shapes ...` for a guessed model
    (None otherwise): what stands where a verdict would."""
    found = guessed_range(analysis)
    if found is None:
        return None
    text = f"unknown: the model is sized from its name only, {found.describe()}"
    gpu = analysis.gpu
    if gpu is not None and found.low_bytes > gpu.capacity_bytes:
        text += ", every one of them over the GPU"
    return text

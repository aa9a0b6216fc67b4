"""The estimate as Markdown for editor hovers: the model, the breakdown, LoRA, quantization.

Each function takes an `Analysis` and returns a Markdown string (empty when there is nothing to
say). The language server shows them as they are; nothing here knows about LSP.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from llmmem.budget.bands import band_range
from llmmem.budget.result import Budget, Component
from llmmem.plan import Provenance, Sourced
from llmmem.scenario import Analysis
from llmmem.units import format_bytes

BAR_WIDTH = 24
SETTING_LABELS = {
    "per_device_train_batch_size": "micro-batch",
    "gradient_accumulation_steps": "accumulation",
    "max_seq_length": "sequence length",
    "gradient_checkpointing": "gradient checkpointing",
    "precision": "precision",
    "optim": "optimizer",
    "attn_implementation": "attention",
    "use_cache": "use_cache",
    "loss": "loss",
    "gpu": "GPU",
}


def cell(text: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def code(text: Any) -> str:
    value = str(text).replace("`", "'")
    return f"`{value}`"


def bar(used: int, capacity: int, width: int = BAR_WIDTH) -> str:
    filled = min(width, round(width * used / capacity)) if capacity > 0 else width
    return "█" * filled + "░" * (width - filled)


def verdict_line(analysis: Analysis) -> str:
    """`**≈ 21.3 GiB of 24.0 GiB on RTX-4090** (band 20.6–22.3 GiB) · fits, 2.7 GiB to spare`;
    tight where the band crosses the capacity; `fit unknown` with the range the name allows
    for a model sized from its name."""
    budget, gpu = analysis.budget, analysis.gpu
    if budget is None:
        return ""
    total = format_bytes(budget.device_total_bytes)
    ends, unit = band_range(budget.device_total_bytes, budget.band)
    within = f"(band {ends} {unit})"
    if gpu is None:
        return f"**≈ {total}** {within} peak (no GPU chosen: set one to check the fit)"
    head = f"**≈ {total} of {format_bytes(gpu.capacity_bytes)} on {gpu.name}** {within}"
    from llmmem.rules.guessed_model import guessed_verdict_text

    guessed = guessed_verdict_text(analysis)
    if guessed is not None:  # sized from its name: no verdict, the range its name allows
        return f"{head} · **fit {guessed}**"
    headroom = budget.headroom_bytes or 0
    if budget.verdict == "tight":
        at = (
            f"{format_bytes(headroom)} to spare"
            if headroom >= 0
            else f"{format_bytes(-headroom)} over"
        )
        return f"{head} · **tight**: the band crosses the capacity ({at} at the estimate)"
    if budget.fits:
        share = 100 * headroom / gpu.capacity_bytes if gpu.capacity_bytes else 0
        return f"{head} · fits, {format_bytes(headroom)} ({share:.0f}%) to spare"
    return f"{head} · **does not fit**: {format_bytes(-headroom)} over"


def _breakdown_table(budget: Budget) -> list[str]:
    peak = budget.peak
    total = peak.allocated_bytes or 1
    lines = ["| component | memory | share | formula |", "|---|---:|---:|---|"]
    for component, term in peak.components.items():
        if term.bytes == 0 and component is not Component.ACTIVATIONS:
            continue
        lines.append(
            f"| {cell(component.value.replace('_', ' '))} | {nowrap(format_bytes(term.bytes))} | "
            f"{100 * term.bytes / total:.0f}% | {cell(term.formula)} |"
        )
    lines.append(
        f"| **allocated peak** | **{nowrap(format_bytes(peak.allocated_bytes))}** | | "
        "torch.cuda.max_memory_allocated |"
    )
    for overhead, term in budget.overheads.items():
        lines.append(
            f"| + {cell(overhead.value.replace('_', ' '))} | "
            f"{nowrap(format_bytes(term.bytes))} | | "
            f"{cell(term.formula)} |"
        )
    lines.append(
        f"| **device total** | **{nowrap(format_bytes(budget.device_total_bytes))}** | | "
        "what nvidia-smi shows |"
    )
    return lines


def _not_stated(analysis: Analysis) -> list[str]:
    """The settings that were defaults or assumptions, one `name = value (why)` each."""
    out = []
    for name, sourced in analysis.plan.sourced_fields().items():
        if name in ("model_id",) or sourced.source not in (
            Provenance.DEFAULT,
            Provenance.ASSUMED,
            Provenance.CLI_DEFAULT,
        ):
            continue
        label = SETTING_LABELS.get(name, name)
        why = sourced.source.value + (f": {sourced.note}" if sourced.note else "")
        out.append(f"{label} = {code(sourced.value)} ({cell(why)})")
    if analysis.spec is not None and analysis.spec.is_guess:
        out.append(f"model shapes guessed: {cell(analysis.spec.source_detail)}")
    return out


def largest_batch_line(analysis: Analysis) -> str:
    """`Largest micro-batch that fits: **9** (now 4)`, or why none does."""
    from llmmem.budget.limits import largest_batch
    from llmmem.budget.result import GpuTarget

    spec, setup, gpu = analysis.spec, analysis.setup, analysis.gpu
    if spec is None or setup is None or not isinstance(gpu, GpuTarget):
        return ""
    plan = analysis.plan
    sized = None
    if plan.objective is not None:
        from llmmem.preference_plan import budget_for_plan

        def sized(spec: Any, setup: Any, gpu: Any) -> Any:
            return budget_for_plan(plan, spec, setup, gpu)

    try:
        best, _ = largest_batch(spec, setup, gpu, sized)
    except ValueError:
        return ""
    if best == 0:
        return f"Not even a micro-batch of 1 fits {gpu.name} at this sequence length."
    return f"Largest micro-batch that fits {gpu.name}: **{best}** (now {setup.batch})."


def budget_hover(analysis: Analysis, *, measured: str | None = None) -> str:
    """The breakdown at the peak phase against the GPU: the trainer configuration's hover."""
    budget, spec = analysis.budget, analysis.spec
    if budget is None or spec is None:
        reasons = [analysis.model_error] if analysis.model_error else []
        reasons += analysis.problems
        if not reasons:
            return ""
        return "**llmmem: no estimate**\n\n" + "\n".join(f"- {cell(r)}" for r in reasons)
    parts = [verdict_line(analysis)]
    if analysis.gpu is not None:
        parts.append(
            code(bar(budget.device_total_bytes, analysis.gpu.capacity_bytes))
            + f" {100 * budget.device_total_bytes / max(analysis.gpu.capacity_bytes, 1):.0f}%"
        )
    peak = budget.peak
    parts.append(
        f"Peak in **{peak.phase.value.replace('_', ' ')}**: {cell(peak.moment)}. "
        f"{spec.model_id}, {spec.total_params / 1e9:.2f}B parameters, "
        f"{budget.trainable_params / 1e6:,.1f}M trainable."
    )
    parts.append("\n".join(_breakdown_table(budget)))
    batch_line = largest_batch_line(analysis)
    if batch_line:
        parts.append(batch_line)
    unstated = _not_stated(analysis)
    if unstated:
        parts.append("Not stated in the file:\n" + "\n".join(f"- {item}" for item in unstated))
    notes = list(budget.notes) + analysis.problems
    if notes:
        parts.append("Notes:\n" + "\n".join(f"- {cell(note)}" for note in notes))
    if measured:
        parts.append(measured)
    return "\n\n".join(parts)


# the settings whose hover shows what two nearby values would give: (setup field, how)
NEARBY = {
    "per_device_train_batch_size": ("batch", "micro-batch"),
    "max_seq_length": ("seq", "sequence length"),
}


def setting_hover(
    analysis: Analysis,
    field: str,
    *,
    in_path: str | None = None,
    measured: str | None = None,
    breakdown_link: str | None = None,
) -> str:
    """A setting's own hover, short enough for the first screen of a hover box: the headline
    for the whole step, then what this setting costs (per sample, per 1k tokens, what it
    saves), what its nearby values would give and, for the micro-batch, the largest that
    fits. The full table stays in Explain (`breakdown_link`: a link target that opens it)."""
    from llmmem.report.deltas import setting_deltas

    budget, setup = analysis.budget, analysis.setup
    if budget is None or setup is None or analysis.spec is None:
        return budget_hover(analysis, measured=measured)
    parts = [verdict_line(analysis)]
    sourced = analysis.plan.sourced_fields().get(field)
    written = f"{field}={sourced.value}" if sourced is not None else field
    delta = next(iter(setting_deltas(analysis, in_path, only=field)), None)
    parts.append(code(written) + (f": {delta.detail}" if delta else ""))
    nearby = NEARBY.get(field)
    if nearby is not None:
        attribute, label = nearby
        now = int(getattr(setup, attribute))
        values = sorted({max(1, now // 2), now * 2} - {now})
        items = _what_ifs(analysis, [(f"{label} {v}", {attribute: v}) for v in values])
        if items:
            parts.append(
                " · ".join(
                    f"at {item.label}: {nowrap(format_bytes(item.device_total_bytes))} "
                    f"({nowrap(_signed(item.delta_bytes))})"
                    for item in items
                )
            )
    if field == "per_device_train_batch_size":
        line = largest_batch_line(analysis)
        if line:
            parts.append(line)
    if measured:
        parts.append(measured)
    if breakdown_link:
        parts.append(f"[The whole breakdown]({breakdown_link}): phases, band, formulas")
    else:
        parts.append("_The whole breakdown: run llmmem: Explain._")
    return "\n\n".join(part for part in parts if part)


def nowrap(text: str) -> str:
    """A number and its unit kept on one line (a no-break space between them)."""
    return text.replace(" ", "\u00a0")


def plain_text(markdown: str) -> str:
    """A hover for a client that renders no Markdown: no emphasis marks, code spans or table
    rules; table rows as `cell · cell`."""
    import re

    out = []
    for line in markdown.splitlines():
        if re.fullmatch(r"\|?(\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*", line):
            continue  # a table's header rule
        if line.startswith("|") and line.endswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in line.strip("|").split(" | ")]
            line = " · ".join(c for c in cells if c)
        line = re.sub(r"\*\*(.+?)\*\*", r"\1", line)
        line = re.sub(r"(?<![\w`])_(.+?)_(?![\w`])", r"\1", line)
        line = re.sub(r"`([^`]*)`", r"\1", line)
        out.append(line)
    return "\n".join(out)


def model_hover(analysis: Analysis) -> str:
    """The model id's hover: parameters by role, dtype, where the shapes came from."""
    spec = analysis.spec
    if spec is None:
        if analysis.model_error:
            return f"**llmmem: model not sized**\n\n{cell(analysis.model_error)}"
        return ""
    p = spec.params
    origin = spec.source.value + (f" ({spec.source_detail})" if spec.source_detail else "")
    lines = [
        f"**{spec.model_id}** · {spec.architecture} · {spec.total_params / 1e9:.2f}B parameters",
        "",
        "| part | parameters |",
        "|---|---:|",
    ]
    rows = [
        ("embeddings", p.embedding),
        ("attention", p.attention),
        ("MLP", p.mlp),
        ("experts (all)", p.experts),
        ("router", p.router),
        ("norms", p.norms),
        ("head" + (" (tied to embeddings)" if spec.tie_word_embeddings else ""), p.head),
        ("other", p.other),
    ]
    for name, count in rows:
        if count or name.startswith("head"):
            lines.append(f"| {name} | {count:,} |")
    if p.experts:
        lines.append(f"| active per token | {p.active:,} |")
    lines += [
        "",
        f"{spec.num_layers} layers, hidden {spec.hidden_size}, {spec.num_attention_heads} heads "
        f"({spec.num_kv_heads} KV), vocabulary {spec.vocab_size:,}.",
        "",
        f"Checkpoint dtype: {code(spec.torch_dtype or 'not declared')}. From: {cell(origin)}.",
    ]
    if spec.checkpoint_quantization is not None:
        q = spec.checkpoint_quantization
        lines.append(f"Pre-quantized checkpoint: {q.method}, {q.bits}-bit.")
    if spec.is_guess:
        lines.append("")
        lines.append("**The shapes are a guess from the name**: point llmmem at the config.")
    return "\n".join(lines)


@dataclass(frozen=True)
class WhatIf:
    label: str  # "r = 64"
    device_total_bytes: int
    delta_bytes: int  # against the current estimate


def _share(analysis: Analysis, component: Component) -> int:
    assert analysis.budget is not None
    term = analysis.budget.peak.components.get(component)
    return term.bytes if term is not None else 0


def _what_ifs(analysis: Analysis, changes: list[tuple[str, dict[str, Any]]]) -> list[WhatIf]:
    from llmmem.preference_plan import budget_for_plan

    spec, setup, budget = analysis.spec, analysis.setup, analysis.budget
    if spec is None or setup is None or budget is None:
        return []
    out = []
    for label, update in changes:
        try:
            changed = replace(setup, **update)
            other = budget_for_plan(analysis.plan, spec, changed, analysis.gpu)
        except ValueError:
            continue
        out.append(
            WhatIf(
                label,
                other.device_total_bytes,
                other.device_total_bytes - budget.device_total_bytes,
            )
        )
    return out


def _signed(delta: int) -> str:
    return ("+" if delta >= 0 else "−") + format_bytes(abs(delta))


def _what_if_table(items: list[WhatIf]) -> list[str]:
    if not items:
        return []
    lines = ["| if | device total | change |", "|---|---:|---:|"]
    for item in items:
        lines.append(
            f"| {cell(item.label)} | {format_bytes(item.device_total_bytes)} | "
            f"{_signed(item.delta_bytes)} |"
        )
    return lines


def lora_hover(analysis: Analysis) -> str:
    """LoraConfig's hover: the adapters' share and what other ranks or targets would cost."""
    setup, budget = analysis.setup, analysis.budget
    if setup is None or budget is None or setup.lora is None:
        return ""
    lora = setup.lora
    lines = [
        f"**LoRA** r = {lora.r}, alpha = {lora.alpha:g}"
        + (", DoRA" if lora.dora else "")
        + f": {budget.trainable_params / 1e6:,.2f}M trainable parameters "
        f"({100 * budget.trainable_params / max(budget.params, 1):.2f}% of the model).",
        "",
        f"Their gradients {format_bytes(_share(analysis, Component.GRADIENTS))} and optimizer "
        f"states {format_bytes(_share(analysis, Component.OPTIMIZER_STATES))} at the peak; "
        "the frozen weights and the activations dominate.",
        "",
    ]
    changes: list[tuple[str, dict[str, Any]]] = []
    for rank in (8, 16, 64, 128):
        if rank != lora.r:
            changes.append((f"r = {rank}", {"lora": replace(lora, r=rank)}))
    if lora.targets is not None and lora.targets != ["all-linear"]:
        changes.append(
            (
                "target_modules = all-linear",
                {"lora": replace(lora, targets=["all-linear"])},
            )
        )
    if setup.quant is None:
        from llmmem.budget.setup import Method, QuantSetup, QuantType

        changes.append(
            (
                "QLoRA (4-bit NF4 base)",
                {
                    "method": Method.QLORA,
                    "quant": QuantSetup(quant_type=QuantType.NF4, double_quant=True),
                },
            )
        )
    lines += _what_if_table(_what_ifs(analysis, changes))
    return "\n".join(lines).rstrip()


def quantization_hover(analysis: Analysis) -> str:
    """BitsAndBytesConfig's hover: the quantized weights' share and the alternatives."""
    setup, budget = analysis.setup, analysis.budget
    if setup is None or budget is None or setup.quant is None:
        return ""
    from llmmem.budget.setup import Method, QuantType

    quant = setup.quant
    weights = _share(analysis, Component.WEIGHTS)
    lines = [
        f"**{quant.bits}-bit base weights** ({quant.quant_type.value}"
        + (", double quantization" if quant.double_quant else "")
        + f"): weights {format_bytes(weights)} at the peak, "
        f"{100 * weights / max(budget.peak.allocated_bytes, 1):.0f}% of allocated memory.",
        "",
    ]
    changes: list[tuple[str, dict[str, Any]]] = []
    if quant.quant_type is not QuantType.INT8:
        changes.append(
            (
                "8-bit (load_in_8bit)",
                {"quant": replace(quant, quant_type=QuantType.INT8)},
            )
        )
        changes.append(
            (
                "double quantization " + ("off" if quant.double_quant else "on"),
                {"quant": replace(quant, double_quant=not quant.double_quant)},
            )
        )
    if not quant.prepare_for_kbit_training:
        changes.append(
            (
                "prepare_model_for_kbit_training",
                {"quant": replace(quant, prepare_for_kbit_training=True)},
            )
        )
    if setup.method is Method.QLORA:
        changes.append(("no quantization (16-bit LoRA)", {"method": Method.LORA, "quant": None}))
    lines += _what_if_table(_what_ifs(analysis, changes))
    return "\n".join(lines).rstrip()


def describe_sourced(name: str, sourced: Sourced[Any]) -> str:
    """`micro-batch = 4 (explicit)` for one plan value."""
    label = SETTING_LABELS.get(name, name)
    return f"{label} = {sourced.value} ({sourced.source.value})"

"""Will the step fit the GPU? LLM001 (it will not), LLM002 (it fits with little room), and LLM017
(the model is sized from its name only: no verdict, the range its name allows)."""

from __future__ import annotations

from llmmem.budget.bands import format_with_band
from llmmem.plan import SourceRange
from llmmem.rules.finding import Finding, Related, Severity
from llmmem.rules.fixes import candidate_fixes
from llmmem.rules.registry import Rule, register
from llmmem.scenario import Analysis
from llmmem.units import format_bytes

TIGHT_HEADROOM = 0.10  # under 10% of the GPU left: allocator spikes and fragmentation bite


def anchor(analysis: Analysis) -> SourceRange | None:
    """Where a finding about the whole step points: the trainer call, else the model."""
    plan = analysis.plan
    return (
        plan.trainer_range
        or plan.model_range
        or (plan.model_id.range if plan.model_id is not None else None)
    )


def largest_parts(analysis: Analysis, count: int = 3) -> str:
    assert analysis.budget is not None
    parts = sorted(analysis.budget.peak.components.items(), key=lambda kv: -kv[1].bytes)
    return ", ".join(f"{c.value} {format_bytes(t.bytes)}" for c, t in parts[:count])


def driving_values(analysis: Analysis) -> list[Related]:
    """The plan values that drive the number, for the diagnostic's related information."""
    plan = analysis.plan
    related = []
    for name in (
        "model_id",
        "per_device_train_batch_size",
        "max_seq_length",
        "gradient_checkpointing",
        "optim",
        "precision",
    ):
        sourced = getattr(plan, name, None)
        if sourced is not None and sourced.range is not None and sourced.range.path is None:
            related.append(
                Related(
                    range=sourced.range,
                    message=f"{name} = {sourced.value} ({sourced.source.value})",
                )
            )
    return related


def has_read_shapes(analysis: Analysis) -> bool:
    """Whether the model's shapes were read (a config, the catalog, the hub), not guessed from
    its name: only then does the step get a verdict against the GPU."""
    return analysis.spec is not None and not analysis.spec.is_guess


def check_will_not_fit(analysis: Analysis, text: str) -> list[Finding]:
    budget, gpu = analysis.budget, analysis.gpu
    if budget is None or gpu is None or budget.fits or not has_read_shapes(analysis):
        return []
    over = budget.device_total_bytes - gpu.capacity_bytes
    total = format_with_band(budget.device_total_bytes, budget.band)  # 27.8 GiB (27.0–29.3)
    message = (
        f"Will not fit {gpu.name}: about {total} of "
        f"{format_bytes(gpu.capacity_bytes)} ({format_bytes(over)} over) at "
        f"{budget.peak.moment}; largest: {largest_parts(analysis)}"
    )
    fixes = candidate_fixes(analysis, text)
    if not any(fix.fits for fix in fixes):
        from llmmem.rules.make_fit import make_it_fit

        search = make_it_fit(analysis, text)
        if search.fix is not None:
            fixes.insert(0, search.fix)
        elif search.closest:
            message += f". {search.closest[0].upper()}{search.closest[1:]}"
    return [
        Finding(
            code="LLM001",
            severity=Severity.ERROR,
            message=message,
            path=analysis.plan.path,
            range=anchor(analysis),
            fixes=fixes,
            related=driving_values(analysis),
        )
    ]


def check_tight(analysis: Analysis, text: str) -> list[Finding]:
    budget, gpu = analysis.budget, analysis.gpu
    if budget is None or gpu is None or not budget.fits or not has_read_shapes(analysis):
        return []
    headroom = budget.headroom_bytes or 0
    if headroom >= TIGHT_HEADROOM * gpu.capacity_bytes:
        return []
    message = (
        f"Fits {gpu.name} with {format_bytes(headroom)} to spare "
        f"({100 * headroom / gpu.capacity_bytes:.0f}%): about "
        f"{format_bytes(budget.device_total_bytes)} of {format_bytes(gpu.capacity_bytes)}; "
        "a longer batch or fragmentation may tip it over"
    )
    return [
        Finding(
            code="LLM002",
            severity=Severity.WARNING,
            message=message,
            path=analysis.plan.path,
            range=anchor(analysis),
            fixes=candidate_fixes(analysis, text),
            related=driving_values(analysis),
        )
    ]


def check_guessed_model(analysis: Analysis, text: str) -> list[Finding]:
    from llmmem.rules.guessed_model import guessed_range
    from llmmem.scenario import model_reference

    found = guessed_range(analysis)
    if found is None or analysis.spec is None or analysis.budget is None:
        return []
    spec, gpu = analysis.spec, analysis.gpu
    message = f"{spec.model_id} is sized from its name only: the step needs {found.describe()}"
    if gpu is not None:
        capacity = format_bytes(gpu.capacity_bytes)
        if found.low_bytes > gpu.capacity_bytes:
            message += f", over the {capacity} of {gpu.name} whichever shape it has"
        else:
            message += f"; whether it fits the {capacity} of {gpu.name} is unknown"
    message += (
        "; for a verdict add `# llmmem: model_config=path/to/config.json` or name a local "
        "folder holding its config.json"
    )
    model = model_reference(analysis.plan)
    where = model.range if model is not None else None
    if where is None or where.path is not None:
        where = anchor(analysis)
    return [
        Finding(
            code="LLM017",
            severity=Severity.WARNING,
            message=message,
            path=analysis.plan.path,
            range=where,
            related=driving_values(analysis),
        )
    ]


register(
    Rule(
        code="LLM001",
        name="will-not-fit",
        severity=Severity.ERROR,
        summary="The predicted peak of one training step is larger than the GPU's memory.",
        why="The job would load, start, and die with `CUDA out of memory`, often after minutes of "
        "loading. The peak is the largest moment of the step (usually the start of backward, when "
        "activations and the logits' gradient are alive together), plus the CUDA context and the "
        "allocator's cached blocks.",
        example="args = TrainingArguments(per_device_train_batch_size=16)  # Llama-3.1-8B, 24 GiB",
        fix="Each finding carries the changes that bring the peak down, each with the predicted "
        "total after it: gradient checkpointing, an 8-bit optimizer, a smaller micro-batch "
        "with more accumulation (same effective batch), bf16; for DPO/KTO, precomputed "
        "reference log-probs or, under LoRA, no `ref_model`; for GRPO with vLLM colocated, a "
        "smaller `vllm_gpu_memory_utilization` or sleep mode.",
        check=check_will_not_fit,
    )
)

register(
    Rule(
        code="LLM002",
        name="tight-headroom",
        severity=Severity.WARNING,
        summary="The step fits, but with less than 10% of the GPU to spare.",
        why="Real batches vary in length, the caching allocator fragments, and other processes "
        "(a second model, an eval loop, another user) take memory: a prediction this close is a "
        "coin flip.",
        example="args = TrainingArguments(per_device_train_batch_size=6)  # 22.9 of 24 GiB",
        fix="Take one of the listed changes, or set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to cut fragmentation.",
        check=check_tight,
    )
)

register(
    Rule(
        code="LLM017",
        name="model-sized-from-name",
        severity=Severity.WARNING,
        summary="The model's shapes were not read anywhere: it is sized from the family and size "
        "its name states, and the step gets no verdict.",
        why="A name says little about memory: the vocabulary, depth and MLP width of models of "
        "one size differ between families, and with them the logits, activations and weights "
        "(Qwen2.5-7B has 152,064 vocabulary entries, Mistral-7B 32,000: the logits of one batch "
        "differ almost fivefold). So a model "
        "whose config was not found (not a local folder, not in the Hugging Face cache, not "
        "bundled, the hub not asked) is sized under every bundled shape its name allows, and "
        "the finding gives the range they span instead of fits or does not fit; LLM001 and "
        "LLM002 are not given for it.",
        example='model = AutoModelForCausalLM.from_pretrained("acme/Qwen2.5-Coder-7B-sft")',
        fix="Point llmmem at the model's config: `# llmmem: model_config=path/to/config.json`, "
        "a local folder or Hugging Face cache path holding its config.json, the base model's "
        "hub id (`# llmmem: model=Qwen/Qwen2.5-Coder-7B`), or `--hub` to read its config from "
        "the hub.",
        check=check_guessed_model,
    )
)

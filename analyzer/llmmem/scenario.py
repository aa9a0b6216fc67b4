"""From a TrainingPlan to a fully determined scenario: the model, the setup, the GPU, the budget.

`analyze(plan, ...)` is the one call the linter, `llmmem explain` and the language server make
after extraction: it resolves the model, maps every plan value onto the accounting core's
`TrainingSetup` (keeping the plan's provenance beside it) and runs the estimate. It never raises
for a bad plan: what cannot be determined becomes a problem line and the budget is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmmem.budget.result import Budget, GpuTarget
from llmmem.budget.setup import SetupError, TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.plan import Sourced, TrainingPlan
from llmmem.scenario_setup import (  # noqa: F401  (the plan's setup, as callers import it)
    loaded_dtype_note,
    own_units_note,
    packing_of,
    setup_from_plan,
)
from llmmem.sizing import budget_of, plan_setup


@dataclass
class Analysis:
    """Everything known about one file: the plan, and (when it could be built) the estimate."""

    plan: TrainingPlan
    spec: ModelSpec | None = None
    setup: TrainingSetup | None = None
    gpu: GpuTarget | None = None
    gpu_source: str = "none"  # "plan", "flag", "detected", "none"
    budget: Budget | None = None
    problems: list[str] = field(default_factory=list)
    model_error: str | None = None  # why the model could not be resolved
    # why the setup is not sized: its framework refuses it, or llmmem does not model it
    refusal: str | None = None
    # the releases of the stack the file runs with, each with its source (llmmem.versions)
    versions: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return Path(self.plan.path)


def resolve_gpu_target(name: str | None) -> tuple[GpuTarget | None, str | None]:
    """A GPU by name, or (None, the error message)."""
    if not name:
        return None, None
    from llmmem.gpus import UnknownGpuError, find_gpu

    try:
        gpu = find_gpu(name)
    except UnknownGpuError as err:
        return None, str(err)
    return GpuTarget(name=gpu.name, capacity_bytes=gpu.capacity_bytes, bf16=gpu.bf16), None


def model_reference(plan: TrainingPlan) -> Sourced[Any] | None:
    """What the model is sized from: a `# llmmem: model_config=path/to/config.json` pragma
    (the shapes, for a model id that cannot be looked up), else the plan's model id."""
    config = plan.extra.get("model_config")
    if isinstance(config, Sourced) and isinstance(config.value, str) and config.value:
        return config
    return plan.model_id


def analyze(
    plan: TrainingPlan,
    *,
    gpu: str | None = None,
    hub: bool = False,
    local_model_paths: dict[str, str] | None = None,
    hub_timeout_s: float = 3.0,
) -> Analysis:
    """Resolve, map and estimate. `gpu` (a flag or setting) wins over the plan's pragma."""
    from llmmem.models.resolve import ModelResolutionError, resolve_model

    analysis = Analysis(plan=plan, problems=list(plan.problems))
    from llmmem.versions import find_versions

    try:
        analysis.versions = find_versions(Path(plan.path))
    except OSError:
        analysis.versions = {}
    gpu_name = gpu or (str(plan.gpu.value) if plan.gpu is not None else None)
    analysis.gpu, gpu_error = resolve_gpu_target(gpu_name)
    analysis.gpu_source = ("flag" if gpu else "plan") if analysis.gpu else "none"
    if gpu_error:
        analysis.problems.append(gpu_error)
    model = model_reference(plan)
    if model is None:
        analysis.model_error = "no model found in the file"
        return analysis
    try:
        analysis.spec = resolve_model(
            str(model.value),
            hub=hub,
            hub_timeout_s=hub_timeout_s,
            local_model_paths=local_model_paths,
            base_dir=Path(plan.path).parent,
        )
    except ModelResolutionError as err:
        analysis.spec = _written_in_project(
            str(model.value), plan, hub=hub, hub_timeout_s=hub_timeout_s, error=err
        )
        if analysis.spec is None:
            analysis.model_error = str(err)
            return analysis
    analysis.spec = _with_plan_task_head(plan, analysis.spec, analysis.problems)
    try:
        from llmmem.preference_plan import preference_setup, unmodelled_objective_problem

        try:
            preference = preference_setup(plan)
        except (SetupError, ValueError):
            # the setup without the objective still shows; the objective's error is the refusal
            supervised = plan_setup(
                plan, analysis.spec, analysis.versions, preference=None, gpu=analysis.gpu
            )
            analysis.setup = supervised.setup
            raise
        unmodelled = unmodelled_objective_problem(plan)
        made = plan_setup(
            plan, analysis.spec, analysis.versions, preference=preference, gpu=analysis.gpu
        )
        analysis.setup = made.setup
        if unmodelled:
            analysis.problems.append(unmodelled)
        analysis.problems.extend(made.problems)
        analysis.budget = budget_of(analysis.spec, made, analysis.gpu)
        if made.preference is not None:
            from llmmem.preference_plan import grpo_assumed_note, trl_release_note

            release_note = trl_release_note(analysis.versions)
            if release_note:
                analysis.budget.notes.append(release_note)
            assumed = grpo_assumed_note(plan)
            if assumed:
                analysis.budget.notes.append(assumed)
        if made.trl_note:
            analysis.budget.notes.append(made.trl_note)
        analysis.budget.notes.extend(made.release_notes)
        from llmmem.calibration.store import with_local_evidence

        analysis.budget = with_local_evidence(analysis.budget, Path(plan.path), plan.framework)
        if made.dtype_note:
            analysis.budget.notes.append(made.dtype_note)
        units = own_units_note(plan)
        if units:
            analysis.budget.notes.append(units)
    except (SetupError, ValueError) as err:
        analysis.refusal = str(err).removeprefix("Value error, ")
        analysis.problems.append(analysis.refusal)
    return analysis


def _written_in_project(
    ref: str, plan: TrainingPlan, *, hub: bool, hub_timeout_s: float, error: Exception
) -> ModelSpec | None:
    """The spec of the model another training file of the project trains into the folder `ref`
    names (llmmem.project_outputs), for a reference nothing else resolved; None where no file
    writes it. A stage that loads a folder an earlier stage writes itself is followed up to
    MAX_STAGES files back. Where files disagree, `error`'s message says so."""
    from llmmem.models.resolve import ModelResolutionError, resolve_model
    from llmmem.project_outputs import find_project_writer, writer_note

    if "/" not in ref and "\\" not in ref:
        return None
    notes: list[str] = []
    path = Path(plan.path)
    for _ in range(MAX_STAGES):
        writer, disagreement = find_project_writer(ref, path)
        if writer is None:
            if disagreement:
                error.args = (f"{error.args[0]}; {disagreement}", *error.args[1:])
            return None
        notes.append(writer_note(ref, writer, path))
        if len(notes) == 1 and _takes_writers_adapter(plan, writer):
            plan.lora = writer.lora
            notes.append(
                f"the k-bit model here can train only through the adapter "
                f"{writer.path.name} saves in that folder: its LoRA settings are used"
            )
        try:
            spec = resolve_model(
                writer.model, hub=hub, hub_timeout_s=hub_timeout_s, base_dir=writer.path.parent
            )
        except ModelResolutionError:
            ref, path = writer.model, writer.path
            continue
        return replace(spec, notes=[*notes, *spec.notes])
    return None


MAX_STAGES = 3  # earlier stages followed back through the folders they write


def _takes_writers_adapter(plan: TrainingPlan, writer: Any) -> bool:
    """A k-bit model with no adapter of its own, loaded from the folder where an earlier stage
    saves its adapter (not a merged copy): that adapter is what trains (a k-bit model cannot be
    trained in full, so a file that trains it trains the adapter it loads)."""
    return (
        plan.lora is None
        and plan.quantization is not None
        and writer.lora is not None
        and not writer.merged
    )


def _with_plan_task_head(plan: TrainingPlan, spec: ModelSpec, problems: list[str]) -> ModelSpec:
    """The model as the file's `AutoModelFor{SequenceClassification,TokenClassification,
    QuestionAnswering}` builds it: its task head, no vocabulary logits
    (llmmem.models.task_heads)."""
    task = plan.extra.get("task_head")
    if not isinstance(task, Sourced):
        return spec
    from llmmem.models.spec import ModelSpecError
    from llmmem.models.task_heads import with_task_head

    labels = plan.extra.get("num_labels")
    count = labels.value if isinstance(labels, Sourced) and isinstance(labels.value, int) else 2
    try:
        return with_task_head(spec, task.value, count)
    except ModelSpecError as err:
        problems.append(str(err))
        return spec

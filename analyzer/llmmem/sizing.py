"""One road from a plan to the setup the budget sizes, for a file and for flags alike.

`llmmem explain` (and the linter and the server, through `llmmem.scenario.analyze`) reads a
file into a plan; `llmmem estimate` makes a plan of its flags (`llmmem.flag_plan`). Both then
take `plan_setup`: the plan's setup (`scenario.setup_from_plan`), the library releases the run
uses, their defaults for what the plan leaves unsaid, TRL's trainers' rules, the dtype a
checkpoint loads in, the preference trainers' rules over k-bit models and the mixed precision
of their objectives, FP8. Each rule is written here once, so the two commands cannot size the
same settings apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from llmmem.budget.float8_te import te_refusal
from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Budget, GpuTarget
from llmmem.budget.setup import Framework, Precision, TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.plan import Provenance, TrainingPlan
from llmmem.release_defaults import with_release_defaults
from llmmem.scenario_setup import extra_flag, extra_text, loaded_dtype_note, setup_from_plan

if TYPE_CHECKING:
    from llmmem.budget.preference_setup import PreferenceSetup


@dataclass
class PlanSetup:
    """The setup a plan trains with, the objective's setup, and what the rules said."""

    setup: TrainingSetup
    preference: PreferenceSetup | None = None
    problems: list[str] = field(default_factory=list)
    trl_note: str | None = None  # what TRL's trainer did to a k-bit model
    checkpointing_note: str | None = None  # what TRL's SFTTrainer did to checkpointing
    release_notes: list[str] = field(default_factory=list)
    dtype_note: str | None = None  # the dtype the checkpoint loads in, where it decides
    restated: dict[str, str] = field(default_factory=dict)  # plan key -> the release's note


def plan_setup(
    plan: TrainingPlan,
    spec: ModelSpec,
    versions: dict[str, Any],
    *,
    preference: PreferenceSetup | None,
    overlay: Callable[[TrainingSetup], TrainingSetup] | None = None,
    gpu: GpuTarget | None = None,
) -> PlanSetup:
    """The setup `plan` trains `spec` with under the library releases `versions` (name ->
    FoundVersion), `preference` the objective's setup (None: supervised); `overlay` lays what
    only a flag says over the plan's setup; `gpu` the target, where a framework's rule depends on
    it. Raises SetupError (or ValueError) for a plan that
    cannot run."""
    from llmmem.versions import apply_to_setup

    setup = setup_from_plan(plan, spec)
    setup = apply_to_setup(setup, versions)
    noted = {name: value.note for name, value in plan.sourced_fields().items()}
    setup, release_notes = with_release_defaults(plan, spec, setup, versions)
    made = PlanSetup(setup=setup, preference=preference, release_notes=release_notes)
    made.restated = {
        name: value.note
        for name, value in plan.sourced_fields().items()
        if noted.get(name) != value.note
    }
    _sft_trainer_rules(plan, versions, made)
    _trl_sft_stack(plan, versions, made)
    made.dtype_note = _loaded_dtype(plan, spec, made) or _swift_checkpoint_dtype(
        plan, spec, made, gpu
    )
    if overlay is not None:
        made.setup = overlay(made.setup)
    _float8(plan, spec, made)
    if made.preference is not None:
        from llmmem.preference_plan import autocast_as_mixed_precision

        kbit_note = _preference_trainer_on_kbit(plan, made)
        made.trl_note = made.trl_note or kbit_note
        made.setup, made.preference = autocast_as_mixed_precision(made.setup, made.preference)
    return made


def budget_of(spec: ModelSpec, made: PlanSetup, gpu: GpuTarget | None) -> Budget:
    """The budget of the plan's step: the supervised one, or the objective's."""
    if made.preference is None:
        return estimate_budget(spec, made.setup, gpu)
    from llmmem.budget.preference import estimate_preference_budget

    return estimate_preference_budget(spec, made.setup, made.preference, gpu)


def _kbit_stated(plan: TrainingPlan) -> bool:
    """The plan says how its k-bit model is prepared, or which dtype its adapters keep."""
    q = plan.quantization
    return (
        q is not None and q.prepare_for_kbit_training.source is not Provenance.DEFAULT
    ) or "lora_dtype" in plan.extra


def _sft_trainer_rules(plan: TrainingPlan, versions: dict[str, Any], made: PlanSetup) -> None:
    """A model handed to TRL's SFTTrainer, with the TRL release of the run known: that
    release's checkpointing and, over a k-bit model with a LoRA config, the preparation and the
    adapters' dtype as it leaves them (llmmem.sft_trainer_rules); a preparation the plan
    states stays as stated."""
    found = versions.get("trl")
    trainer = plan.extra.get("trainer")
    if found is None or getattr(trainer, "value", trainer) != "SFTTrainer":
        return
    from llmmem.sft_trainer_rules import with_sft_trainer

    done = with_sft_trainer(made.setup, str(found.version), kbit_stated=_kbit_stated(plan))
    made.setup = done.setup
    made.trl_note = done.kbit_note
    made.checkpointing_note = done.checkpointing_note


def _trl_sft_stack(plan: TrainingPlan, versions: dict[str, Any], made: PlanSetup) -> None:
    """TRL's SFTTrainer with its release known: that release's own stack, its loss and
    metrics (llmmem.budget.stacks.trl). Its other trainers are the preference budgets';
    unsloth's patched SFTTrainer keeps the HF budget."""
    trainer = plan.extra.get("trainer")
    objective = str(plan.objective.value).lower() if plan.objective is not None else "sft"
    unsloth = plan.extra.get("unsloth")
    if (
        "trl" not in versions
        or plan.framework != "trl"
        or getattr(trainer, "value", trainer) not in (None, "SFTTrainer")
        or objective != "sft"
        or made.preference is not None
        or getattr(unsloth, "value", unsloth)
    ):
        return
    made.setup = replace(made.setup, framework=Framework.TRL)


def _loaded_dtype(plan: TrainingPlan, spec: ModelSpec, made: PlanSetup) -> str | None:
    """A script that gives from_pretrained no dtype=: transformers 5 trains the checkpoint's
    own 16-bit weights (autocast over them under the Trainer's bf16=True); before 5 they load
    as fp32. The note, where it decides."""
    note = loaded_dtype_note(plan, spec)
    if not note:
        return None
    setup = made.setup
    if setup.transformers_release < (5, 0):
        # before transformers 5, from_pretrained without dtype= loads torch's default
        # dtype (fp32); 5 made "auto", the checkpoint's own dtype, the default
        return (
            f"no dtype= given: transformers {setup.transformers_version} loads "
            f"the checkpoint's {spec.torch_dtype} weights as fp32 (its default "
            "before transformers 5)"
        )
    precision = (
        Precision.FP16_TRUE
        if spec.torch_dtype == "float16"
        else Precision.BF16_AUTOCAST
        if setup.precision is Precision.BF16
        else Precision.BF16_TRUE
    )
    if precision is Precision.BF16_AUTOCAST:
        # the Trainer's bf16=True still autocasts over the 16-bit weights it was given
        note += "; bf16=True autocasts over them"
    made.setup = replace(setup, precision=precision)
    return note


def _swift_checkpoint_dtype(
    plan: TrainingPlan, spec: ModelSpec, made: PlanSetup, gpu: GpuTarget | None
) -> str | None:
    """ms-swift without --torch_dtype loads the checkpoint's own dtype and turns on the mixed
    precision that goes with it (ModelArguments._init_mixed_precision, ms-swift 4.6.0): a bf16
    checkpoint trains as bf16 weights under bf16 autocast, an fp32 one under fp16 AMP. The
    note, where this changed the setup. Not on a GPU without bf16 (the precision stays as the
    plan has it: fp16 there), nor where the objective's mixed precision is said to be off."""
    if (
        plan.framework != "swift"
        or "torch_dtype" in plan.extra
        or plan.precision.source not in (Provenance.DEFAULT, Provenance.ASSUMED)
        or plan.quantization is not None
        or (made.preference is not None and made.preference.mixed_precision is False)
    ):
        return None
    if spec.torch_dtype == "bfloat16" and gpu is not None and not gpu.bf16:
        return None
    if spec.torch_dtype == "bfloat16":
        precision, said = Precision.BF16_AUTOCAST, "bf16 weights under bf16 autocast"
    elif spec.torch_dtype == "float32":
        precision, said = Precision.FP16, "fp32 weights under fp16 autocast"
    else:
        return None
    made.setup = replace(made.setup, precision=precision)
    return (
        f"no --torch_dtype: ms-swift loads the checkpoint's {spec.torch_dtype} and turns on the "
        f"mixed precision that goes with it: {said}"
    )


def _float8(plan: TrainingPlan, spec: ModelSpec, made: PlanSetup) -> None:
    """accelerate's fp8 (`mixed_precision: fp8` with a backend): torchao's float8 Linears or
    TransformerEngine's, where they are sized; a problem line where they are not."""
    backend = extra_text(plan, "fp8_backend")
    # a file's config falls back to bf16 autocast with a problem line; a flag (`--fp8 te`,
    # no backend in the plan) is refused by the budget in one line
    te_reason = te_refusal(spec, made.setup) if made.setup.float8_te and backend else None
    if te_reason is not None:
        made.setup = replace(made.setup, float8_te=False)
    if backend and not made.setup.float8 and not made.setup.float8_te:
        made.problems.append(
            f"accelerate's fp8 with the {backend} backend"
            + (" under LoRA or k-bit weights" if backend in ("AO", "TE") and not te_reason else "")
            + (f" ({te_reason})" if te_reason else "")
            + " is not sized: the step is sized as bf16 autocast"
        )


def _preference_trainer_on_kbit(plan: TrainingPlan, made: PlanSetup) -> str | None:
    """A k-bit model handed to TRL's preference trainer with a LoRA config: what that trainer
    does to it (llmmem.budget.trl_rules), unless the plan says how it is prepared."""
    preference = made.preference
    if (
        preference is None
        or preference.trainer != "trl"
        or plan.framework not in ("trl", "hf")
        or _kbit_stated(plan)
        or extra_flag(plan, "unsloth")  # unsloth's patched trainers: its stack's own rules
    ):
        return None
    from llmmem.budget.trl_rules import preference_trainer_on_kbit

    made.setup, note = preference_trainer_on_kbit(made.setup, preference.objective.value)
    return note

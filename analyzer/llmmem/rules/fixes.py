"""The changes that bring a step's memory down, each as edits plus the predicted result.

A candidate says whether it applies to the setup, and edits the text; it is offered only when the
edited text, analysed again, gives a lower total, and its title states that total, e.g.
`Enable gradient checkpointing → 31.2 GiB (fits A100-80GB)`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from llmmem.budget.result import Budget, Component
from llmmem.budget.setup import (
    LossImpl,
    Method,
    Precision,
    QuantSetup,
    QuantType,
    SetupError,
    TrainingSetup,
)
from llmmem.plan import Provenance, TrainingPlan
from llmmem.rules.edits import qlora_edits, set_setting, set_settings, statement_after_load
from llmmem.rules.finding import Fix, TextEdit
from llmmem.rules.python_nodes import Rescaled
from llmmem.rules.spellings import config_dialect
from llmmem.rules.text_edits import apply_edits
from llmmem.scenario import Analysis
from llmmem.units import format_bytes


@dataclass(frozen=True)
class Candidate:
    key: str  # stable id: "grad-ckpt", "optim-8bit", ...
    title: str
    change: Callable[[TrainingSetup], TrainingSetup | None]  # None: does not apply
    edit: Callable[[Analysis, str], list[TextEdit] | None]
    safe: bool = True  # `--fix` applies it without asking
    # a lever of the preference or GRPO setup (the plan's, not TrainingSetup's): whether the
    # file's plan can take it (None: `change` decides alone)
    applies: Callable[[Analysis], bool] | None = None
    # a title naming the value written (None: `title`)
    title_of: Callable[[Analysis], str | None] | None = None


def _grad_ckpt(setup: TrainingSetup) -> TrainingSetup | None:
    return None if setup.grad_ckpt else replace(setup, grad_ckpt=True)


def _optim(name: str) -> Callable[[TrainingSetup], TrainingSetup | None]:
    def change(setup: TrainingSetup) -> TrainingSetup | None:
        if setup.optim == name or "8bit" in setup.optim:
            return None
        return replace(setup, optim=name)

    return change


def _halve_batch(setup: TrainingSetup) -> TrainingSetup | None:
    if setup.batch < 2:
        return None
    return replace(setup, batch=setup.batch // 2, grad_accum=setup.grad_accum * 2)


def _bf16(setup: TrainingSetup) -> TrainingSetup | None:
    if setup.precision is not Precision.FP32:
        return None
    return replace(setup, precision=Precision.BF16)


def _liger(setup: TrainingSetup) -> TrainingSetup | None:
    if setup.loss is not LossImpl.STANDARD:
        return None
    return replace(setup, loss=LossImpl.LIGER)


def _setting(field: str, value: object) -> Callable[[Analysis, str], list[TextEdit] | None]:
    def edit(analysis: Analysis, text: str) -> list[TextEdit] | None:
        return set_setting(analysis.plan, text, field, value)

    return edit


def _grad_ckpt_edit(analysis: Analysis, text: str) -> list[TextEdit] | None:
    """`gradient_checkpointing=True` where the trainer's settings are; in a plain training loop
    (no trainer call) `model.gradient_checkpointing_enable()` after the model is loaded."""
    edits = set_setting(analysis.plan, text, "gradient_checkpointing", True)
    if edits or analysis.plan.kind != "python" or analysis.plan.model_range is None:
        return edits
    return statement_after_load(
        text, analysis.plan.model_range, lambda name: f"{name}.gradient_checkpointing_enable()"
    )


def _qlora(setup: TrainingSetup) -> TrainingSetup | None:
    """LoRA over 16-bit weights -> the same adapters over 4-bit NF4 base weights."""
    if setup.method is not Method.LORA or setup.quant is not None:
        return None
    return replace(
        setup,
        method=Method.QLORA,
        quant=QuantSetup(
            quant_type=QuantType.NF4,
            double_quant=True,
            compute_dtype_bytes=2,
            prepare_for_kbit_training=True,
        ),
    )


QLORA_CONFIG = (
    'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", '
    "bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)"
)


def _qlora_edit(analysis: Analysis, text: str) -> list[TextEdit] | None:
    """`quantization_config=BitsAndBytesConfig(...)` on the model's `from_pretrained` call,
    `prepare_model_for_kbit_training(model)` after it, and the imports they need: one
    codemod (`rules/codemods.qlora_edits`)."""
    plan = analysis.plan
    if plan.kind != "python" or plan.model_range is None or plan.quantization is not None:
        return None
    return qlora_edits(text, plan.model_range, QLORA_CONFIG)


def _halved(batch: int) -> int | None:
    """A branch's micro-batch halved, where that keeps its effective batch exactly."""
    return batch // 2 if batch >= 2 and batch % 2 == 0 else None


def _doubled(steps: int) -> int | None:
    return steps * 2 if steps >= 1 else None


def _halve_batch_edit(analysis: Analysis, text: str) -> list[TextEdit] | None:
    """The micro-batch halved and the accumulation doubled; a value a conditional expression
    chooses (`16 if BIG else 8`) is changed in every branch (`8 if BIG else 4`), so each
    branch keeps its effective batch, or the fix is not offered (`edits.Rescaled`)."""
    setup = analysis.setup
    if setup is None:
        return None
    return set_settings(
        analysis.plan,
        text,
        {
            "per_device_train_batch_size": Rescaled(setup.batch // 2, _halved),
            "gradient_accumulation_steps": Rescaled(setup.grad_accum * 2, _doubled),
        },
    )


def _bf16_edit(analysis: Analysis, text: str) -> list[TextEdit] | None:
    gpu = analysis.gpu
    if gpu is not None and not gpu.bf16:
        return None
    return set_setting(analysis.plan, text, "bf16", True)


def _in_dialect(
    lever: str, python_edit: Callable[[Analysis, str], list[TextEdit] | None]
) -> Callable[[Analysis, str], list[TextEdit] | None]:
    """The lever's edit in the file's own dialect: a YAML/JSON config gets its framework's keys
    and values (none where the framework has no such setting), a shell launcher the flags of
    the program it starts (`rules/shell_edits`); other files `python_edit`."""

    def edit(analysis: Analysis, text: str) -> list[TextEdit] | None:
        plan = analysis.plan
        if plan.kind == "shell":
            from llmmem.rules.shell_edits import launcher_edits

            return launcher_edits(analysis, text, lever)
        if plan.kind not in ("yaml", "json"):
            return python_edit(analysis, text)
        if lever == "bf16" and analysis.gpu is not None and not analysis.gpu.bf16:
            return None
        # the framework spelling tables load only for a config file (a Python file's lint
        # never needs them)
        from llmmem.rules.config_edits import spelled_edits
        from llmmem.rules.spellings import spelling

        writes = spelling(config_dialect(plan), lever)
        if writes is None or analysis.setup is None:
            return None
        return spelled_edits(text, writes, analysis.setup, json_file=plan.kind == "json")

    return edit


# The preference and GRPO levers (issue 19): they change how the reference log-probabilities
# are made or what the colocated vLLM engine keeps, settings the plan carries beside the
# training setup (`preference_plan`), so `change` leaves the setup as it is and `applies`
# reads the plan. What each saves is what the re-analysed file says, as for every fix.


def _unchanged(setup: TrainingSetup) -> TrainingSetup:
    return setup


def _kept(analysis: Analysis, name: str) -> object:
    from llmmem.plan import Sourced

    kept = analysis.plan.extra.get(name)
    return kept.value if isinstance(kept, Sourced) else kept


def _precompute_applies(analysis: Analysis) -> bool:
    """DPO and KTO (the objectives with a reference model) whose reference runs in the step."""
    from llmmem.budget.preference_setup import WITH_REFERENCE, Reference
    from llmmem.preference_plan import objective_of, reference_of

    if objective_of(analysis.plan) not in WITH_REFERENCE:
        return False
    reference, _ = reference_of(analysis.plan)
    return reference is not Reference.PRECOMPUTED


def _own_reference_applies(analysis: Analysis) -> bool:
    """LoRA/QLoRA DPO or KTO given a reference model of its own (`ref_model=`): without it
    TRL takes the reference from the policy with its adapter disabled, no second copy. In full
    fine-tuning TRL would load the copy itself: nothing to gain there."""
    from llmmem.budget.preference_setup import WITH_REFERENCE, Reference
    from llmmem.preference_plan import objective_of, reference_of

    if analysis.setup is None or analysis.setup.method is Method.FULL:
        return False
    if objective_of(analysis.plan) not in WITH_REFERENCE:
        return False
    if reference_of(analysis.plan)[0] is not Reference.COPY:
        return False
    # the same checkpoint as the policy's base: the adapter-disabled policy is that model, so
    # training does not change; another checkpoint (an SFT model as the reference) would
    model_id = analysis.plan.model_id.value if analysis.plan.model_id is not None else None
    return model_id is not None and _kept(analysis, "ref_model_id") == model_id


def _drop_reference_edit(analysis: Analysis, text: str) -> list[TextEdit] | None:
    """The trainer call's `ref_model` argument (keyword, or DPOTrainer's second positional)
    taken out, with the separator after it; and the `name = ...from_pretrained(...)` line
    that loaded it, when nothing else reads the name. Text edits from the syntax tree, so the
    rest of the call keeps its layout."""
    import ast

    from llmmem.plan import Sourced, SourceRange
    from llmmem.rules.python_nodes import python_tree
    from llmmem.rules.text_edits import line_starts, node_span, position

    plan = analysis.plan
    trainer = plan.extra.get("trainer")
    if plan.kind != "python" or not isinstance(trainer, Sourced) or trainer.range is None:
        return None
    if trainer.range.path is not None:
        return None
    tree = python_tree(text)
    if tree is None:
        return None
    starts = line_starts(text)
    call = next(
        (
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and node.lineno - 1 == trainer.range.start_line
            and node.end_lineno is not None
            and node.end_lineno - 1 == trainer.range.end_line
        ),
        None,
    )
    if call is None or any(isinstance(arg, ast.Starred) for arg in call.args):
        return None
    arguments: list[ast.expr | ast.keyword] = sorted(
        [*call.args, *call.keywords], key=lambda node: (node.lineno, node.col_offset)
    )
    target: ast.expr | ast.keyword | None = next(
        (kw for kw in call.keywords if kw.arg == "ref_model"), None
    )
    if target is None and str(trainer.value) == "DPOTrainer" and len(call.args) > 1:
        target = call.args[1]  # DPOTrainer(model, ref_model, ...)
    if target is None:
        return None
    value = target.value if isinstance(target, ast.keyword) else target
    index = arguments.index(target)
    start, end = node_span(text, target, starts)
    if index + 1 < len(arguments):
        end = node_span(text, arguments[index + 1], starts)[0]
    elif index > 0:
        start = node_span(text, arguments[index - 1], starts)[1]

    def edit(start: int, end: int) -> TextEdit:
        (l0, c0), (l1, c1) = position(text, start, starts), position(text, end, starts)
        return TextEdit(
            range=SourceRange(start_line=l0, start_col=c0, end_line=l1, end_col=c1), new_text=""
        )

    edits = [edit(start, end)]
    if isinstance(value, ast.Name):
        reads = sum(
            isinstance(node, ast.Name) and node.id == value.id and isinstance(node.ctx, ast.Load)
            for node in ast.walk(tree)
        )
        loads = [
            statement
            for statement in ast.walk(tree)
            if isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and statement.targets[0].id == value.id
        ]
        if reads == 1 and len(loads) == 1 and isinstance(loads[0].value, ast.Call):
            load = loads[0]
            first, last = load.lineno - 1, (load.end_lineno or load.lineno) - 1
            line_end = starts[last + 1] if last + 1 < len(starts) else len(text)
            alone = text[starts[first] : node_span(text, load, starts)[0]].strip() == "" and (
                text[node_span(text, load, starts)[1] : line_end].strip() == ""
            )
            if alone and line_end > starts[first]:
                edits.insert(0, edit(starts[first], line_end))
    return edits


def _grpo(analysis: Analysis) -> object | None:
    """The plan's GrpoSetup when it generates with a colocated vLLM engine, else None."""
    from llmmem.budget.preference_setup import Objective
    from llmmem.preference_plan import grpo_setup, objective_of

    if objective_of(analysis.plan) is not Objective.GRPO:
        return None
    grpo = grpo_setup(analysis.plan)
    return grpo if grpo.vllm == "colocate" else None


def _sleep_applies(analysis: Analysis) -> bool:
    grpo = _grpo(analysis)
    return grpo is not None and not grpo.vllm_enable_sleep_mode  # type: ignore[attr-defined]


def engine_room(analysis: Analysis) -> int | None:
    """The least a colocated vLLM engine needs, in bytes: its 16-bit weights and the KV cache
    of the whole generation batch at full length (prompt + completion), so every completion
    of a generation is decoded at once, as before. None without a GRPO colocate plan."""
    from llmmem.budget.generation import kv_cache_term
    from llmmem.budget.grpo import generation_rows

    grpo = _grpo(analysis)
    if grpo is None or analysis.spec is None or analysis.setup is None:
        return None
    rows = generation_rows(grpo, analysis.setup)  # type: ignore[arg-type]
    full = replace(analysis.setup, batch=rows, seq=grpo.seq, new_tokens=0)  # type: ignore[attr-defined]
    return 2 * analysis.spec.total_params + kv_cache_term(analysis.spec, full).bytes


def smaller_vllm_share(analysis: Analysis) -> float | None:
    """The colocated engine's `vllm_gpu_memory_utilization` halved, but never below what
    `engine_room` needs (rounded up to a hundredth); None where that is no smaller than the
    file's value or the GPU is not known."""
    grpo = _grpo(analysis)
    room = engine_room(analysis)
    if grpo is None or room is None or analysis.gpu is None:
        return None
    current = float(grpo.vllm_gpu_memory_utilization)  # type: ignore[attr-defined]
    needed = -(-room * 100 // analysis.gpu.capacity_bytes) / 100
    share = max(-(-current * 100 // 2) / 100, needed)
    return share if share < current else None


def _share_title(analysis: Analysis) -> str | None:
    share = smaller_vllm_share(analysis)
    if share is None:
        return None
    return f"Give the colocated vLLM engine less of the GPU (vllm_gpu_memory_utilization={share:g})"


def _plan_setting(
    field: str, value_of: Callable[[Analysis], object]
) -> Callable[[Analysis, str], list[TextEdit] | None]:
    """`field=value` in a Python script's config call (DPOConfig, KTOConfig, GRPOConfig): the
    value replaced where the plan read it, else added as a keyword of the call."""

    def edit(analysis: Analysis, text: str) -> list[TextEdit] | None:
        from llmmem.plan import Sourced
        from llmmem.rules import edits as writer

        plan = analysis.plan
        value = value_of(analysis)
        if plan.kind != "python" or value is None:
            return None
        kept = plan.extra.get(field)
        where = writer._written_at(kept if isinstance(kept, Sourced) else None)
        if where is not None and where.path is not None:
            return None  # another file: not edited from here
        codemods = writer._codemods(text)
        if codemods is not None:
            return codemods.setting_edits(plan, text, [(field, value, where)])  # type: ignore[no-any-return]
        if where is not None:
            return writer._python_value_edit(plan, text, field, where, value)
        found = writer._insert_python_setting(plan, text, field, value)
        return [found] if found else None

    return edit


def _plan_in_dialect(
    lever: str, field: str, value_of: Callable[[Analysis], object]
) -> Callable[[Analysis, str], list[TextEdit] | None]:
    """The lever's edit in the file's dialect: a Python script's config call gets `field`; a
    YAML/JSON config its framework's keys (`FIX_SPELLINGS`), each written with `value_of`'s
    value (none where the framework has no such setting)."""
    python_edit = _plan_setting(field, value_of)

    def edit(analysis: Analysis, text: str) -> list[TextEdit] | None:
        plan = analysis.plan
        if plan.kind not in ("yaml", "json"):
            return python_edit(analysis, text)
        from llmmem.rules.config_edits import spelled_edits
        from llmmem.rules.spellings import spelling

        writes = spelling(config_dialect(plan), lever)
        value = value_of(analysis)
        if writes is None or analysis.setup is None or value is None:
            return None
        writes = tuple(replace(write, value=value) for write in writes)
        edits = spelled_edits(text, writes, analysis.setup, json_file=plan.kind == "json")
        if edits is None and plan.kind == "yaml" and len(writes) == 1:
            from llmmem.rules.config_edits import add_to_block

            write = writes[0]
            if not (write.only_if_written or write.layout_key):
                edits = add_to_block(text, write.path, value)  # `trl:` gets the key
        return edits

    return edit


CANDIDATES = [
    Candidate(
        "grad-ckpt",
        "Enable gradient checkpointing",
        _grad_ckpt,
        _in_dialect("grad-ckpt", _grad_ckpt_edit),
    ),
    Candidate(
        "optim-8bit",
        "Use the 8-bit AdamW (adamw_bnb_8bit)",
        _optim("adamw_bnb_8bit"),
        _in_dialect("optim-8bit", _setting("optim", "adamw_bnb_8bit")),
    ),
    Candidate(
        "optim-paged-8bit",
        "Use the paged 8-bit AdamW (paged_adamw_8bit)",
        _optim("paged_adamw_8bit"),
        _in_dialect("optim-paged-8bit", _setting("optim", "paged_adamw_8bit")),
    ),
    Candidate(
        "halve-batch",
        "Halve the micro-batch, double the accumulation",
        _halve_batch,
        _in_dialect("halve-batch", _halve_batch_edit),
    ),
    Candidate("bf16", "Train in bf16 mixed precision", _bf16, _in_dialect("bf16", _bf16_edit)),
    Candidate(
        "qlora",
        "Switch to QLoRA (4-bit NF4 base weights)",
        _qlora,
        _in_dialect("qlora", _qlora_edit),
        safe=False,  # changes the numerics of training: the user decides
    ),
    Candidate(
        "liger",
        "Use Liger's fused linear cross-entropy",
        _liger,
        _in_dialect("liger", _setting("use_liger_kernel", True)),
        safe=False,
    ),
    Candidate(
        "precompute-ref",
        "Precompute the reference log-probs (precompute_ref_log_probs)",
        _unchanged,
        _plan_in_dialect("precompute-ref", "precompute_ref_log_probs", lambda _a: True),
        applies=_precompute_applies,
    ),
    Candidate(
        "own-reference",
        "Use the policy with its adapter disabled as the reference (drop ref_model)",
        _unchanged,
        _drop_reference_edit,
        applies=_own_reference_applies,
    ),
    Candidate(
        "vllm-share",
        "Give the colocated vLLM engine less of the GPU",
        _unchanged,
        _plan_in_dialect("vllm-share", "vllm_gpu_memory_utilization", smaller_vllm_share),
        safe=False,  # a smaller KV cache: generation may run slower
        applies=lambda analysis: _grpo(analysis) is not None,
        title_of=_share_title,
    ),
    Candidate(
        "vllm-sleep",
        "Put the vLLM engine to sleep while the policy trains (vllm_enable_sleep_mode)",
        _unchanged,
        _plan_in_dialect("vllm-sleep", "vllm_enable_sleep_mode", lambda _a: True),
        safe=False,  # the engine's weights are reloaded for every generation: slower steps
        applies=_sleep_applies,
    ),
]


# Each fix is checked by reading the edited file again, and the YAML reader that keeps positions
# takes about 0.2 s per 100 kB: past this size a config gets its findings without fixes (a
# training config is a few kB; a larger one is data or generated).
LARGEST_CONFIG_FIXED = 64_000


def fixes_left_out(plan: TrainingPlan, text: str) -> bool:
    """Whether the file is a config too large for its fixes to be checked."""
    return plan.kind in ("yaml", "json") and len(text) > LARGEST_CONFIG_FIXED


def candidate_fixes(
    analysis: Analysis,
    text: str,
    keys: tuple[str, ...] | None = None,
    target: Component | None = None,
) -> list[Fix]:
    """Every candidate that applies, with its edits and the total after it; best first.

    A candidate is offered only when the file with its edits, analysed again as `check_text`
    analyses it, gives a lower total (and, with `target`, a smaller `target` component at the
    peak, the part of the step the finding is about); that analysis' total is the title's."""
    if analysis.spec is None or analysis.setup is None or analysis.budget is None:
        return []
    if fixes_left_out(analysis.plan, text):
        return []
    before = analysis.budget
    fixes: list[Fix] = []
    for candidate in CANDIDATES:
        if keys is not None and candidate.key not in keys:
            continue
        try:
            if candidate.change(analysis.setup) is None:
                continue
            if candidate.applies is not None and not candidate.applies(analysis):
                continue
        except (SetupError, ValueError):
            continue
        title = candidate.title_of(analysis) if candidate.title_of else candidate.title
        if title is None:
            continue
        edits = candidate.edit(analysis, text)
        if not edits:
            continue
        budget = reanalysed_budget(analysis, text, edits)
        if budget is None or (
            before.device_total_bytes - budget.device_total_bytes < worth_a_change(before)
        ):
            continue  # the edit is not read where it was written, or it does not help enough
        if target is not None and _component_bytes(budget, target) >= _component_bytes(
            before, target
        ):
            continue  # it does not move what the finding is about
        total = budget.device_total_bytes
        verdict = ""
        guessed = analysis.spec.is_guess  # a shape from the name: no verdict (LLM017)
        if analysis.gpu is not None and not guessed:
            verdict = " (fits " if budget.fits else " (still over "
            verdict += f"{analysis.gpu.name})"
        fixes.append(
            Fix(
                title=f"{title} → {format_bytes(total)}{verdict}",
                edits=edits,
                predicted_device_bytes=total,
                fits=None if guessed else budget.fits,
                safe=candidate.safe,
            )
        )
    fixes.sort(key=lambda fix: (not fix.fits, fix.predicted_device_bytes or 0))
    return fixes


def worth_a_change(before: Budget) -> int:
    """The least a fix must save to be offered: 1% of the total, at most 256 MiB. Less than
    that does not show in a total printed to 0.1 GiB (8-bit AdamW on a LoRA plan saves a few
    MiB of adapter states), and a change to the user's file must be worth making."""
    return min(256 * 2**20, before.device_total_bytes // 100)


def _component_bytes(budget: Budget, component: Component) -> int:
    term = budget.peak.components.get(component)
    return term.bytes if term is not None else 0


# one analysis' re-analyses, per edited text: the rules of one file ask for the same fixes
_recent = threading.local()


def reanalysed_budget(analysis: Analysis, text: str, edits: list[TextEdit]) -> Budget | None:
    """The budget of the file after `edits`, read and analysed again as `check_text` does
    for it (same project settings, GPU and editor world size; no hub lookup), or None when
    the edited file gives none."""
    edited = edited_text(analysis, text, edits)
    if edited is None:
        return None
    again = reanalysed(analysis, edited)
    return again.budget if again is not None else None


def reanalysed(analysis: Analysis, edited: str) -> Analysis | None:
    """The analysis of an edited version of `analysis`' file (None: it no longer reads)."""
    cache: tuple[Analysis, dict[str, Analysis | None]] | None = getattr(_recent, "cache", None)
    if cache is None or cache[0] is not analysis:
        cache = (analysis, {})
        _recent.cache = cache
    analyses = cache[1]
    if edited not in analyses:
        analyses[edited] = _analyse_again(analysis, edited)
    return analyses[edited]


def _analyse_again(analysis: Analysis, edited: str) -> Analysis | None:
    from llmmem.extract import extract_plan, find_project_settings
    from llmmem.scenario import analyze

    path = Path(analysis.plan.path)
    settings = find_project_settings(path)
    plan = extract_plan(path, edited, settings=settings)
    if plan.unreadable:
        return None
    unset = (Provenance.DEFAULT, Provenance.ASSUMED)
    world_size = analysis.plan.distributed.world_size
    if plan.distributed.world_size.source in unset and world_size.source not in unset:
        plan.distributed.world_size = world_size  # set by the caller, not by the file
    return analyze(
        plan,
        gpu=analysis.gpu.name if analysis.gpu is not None else None,
        hub=False,
        local_model_paths=settings.local_model_paths,
    )


def edited_text(analysis: Analysis, text: str, edits: list[TextEdit]) -> str | None:
    """The file's text with `edits` applied; in a notebook, edits of a cell (a range naming
    the cell) are applied to that cell's source inside the notebook's JSON, as `--fix`
    writes them (`rules/notebook_edits`). None where they cannot be applied."""
    if all(edit.range.path is None for edit in edits):
        return apply_edits(text, edits)
    from llmmem.rules.notebook_edits import NotebookEditError, apply_cell_edits

    try:
        return apply_cell_edits(text, analysis.plan.path, edits)
    except NotebookEditError:
        return None

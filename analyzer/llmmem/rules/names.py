"""Names a file writes that match nothing llmmem (or the framework) knows: LLM012 and LLM013.

An optimizer name with a typo makes the trainer raise at start-up, after the model has loaded;
LoRA targets that match no module of the model make PEFT raise, or, in a list next to names that
do match, adapt less than intended. Both leave llmmem without an estimate, so they must be
findings, not a silent pass.
"""

from __future__ import annotations

import difflib
import re

from llmmem.budget.lora_targets import lora_target_linears
from llmmem.budget.optimizers import ALIASES, OPTIMIZERS, find_optimizer
from llmmem.budget.setup import SetupError
from llmmem.plan import SourceRange
from llmmem.rules.finding import Finding, Fix, Severity, TextEdit
from llmmem.rules.fit import anchor
from llmmem.rules.registry import Rule, register
from llmmem.scenario import Analysis

# modules PEFT can adapt that are not block linears (llmmem's model specs list block linears)
_OUTSIDE_BLOCKS = frozenset(
    {"lm_head", "embed_tokens", "embed_out", "wte", "word_embeddings", "output", "tok_embeddings"}
)


def _text_at(text: str, where: SourceRange) -> str | None:
    """The text a one-line range of this file covers (None for another file or several lines)."""
    if where.path is not None or where.start_line != where.end_line:
        return None
    lines = text.splitlines()
    if where.start_line >= len(lines):
        return None
    return lines[where.start_line][where.start_col : where.end_col]


def _renaming_fix(
    text: str, where: SourceRange | None, renames: dict[str, str], title: str
) -> list[Fix]:
    """One fix that writes each name of `renames` as its replacement inside `where`."""
    if where is None:
        return []
    written = _text_at(text, where)
    if written is None:
        return []
    edited = written
    for old, new in renames.items():
        edited = re.sub(rf"(?<![\w.-]){re.escape(old)}(?![\w.-])", new, edited)
    if edited == written:
        return []
    return [Fix(title=title, edits=[TextEdit(range=where, new_text=edited)], safe=False)]


def _name_finding(
    analysis: Analysis,
    code: str,
    severity: Severity,
    message: str,
    where: SourceRange | None,
    fixes: list[Fix],
) -> list[Finding]:
    """One finding on the name's range; a name written in another file (a config the script
    points to) is said at this file's anchor, with that file's name and line."""
    if where is not None and where.path is not None:
        message += f" (in {where.path}, line {where.start_line + 1})"
        where = anchor(analysis)
    return [
        Finding(
            code=code,
            severity=severity,
            message=message,
            path=analysis.plan.path,
            range=where or anchor(analysis),
            fixes=fixes,
        )
    ]


# -- LLM012 unknown optimizer ---------------------------------------------------------------


def optimizer_close_matches(name: str) -> list[str]:
    key = name.strip().lower().replace("-", "_")
    return difflib.get_close_matches(key, sorted(OPTIMIZERS), n=3, cutoff=0.6)


def check_unknown_optimizer(analysis: Analysis, text: str) -> list[Finding]:
    plan = analysis.plan
    name = str(plan.optim.value)
    try:
        find_optimizer(name)
        return []
    except SetupError:
        pass
    close = optimizer_close_matches(name)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    where = plan.optim.range
    fixes = [
        fix
        for match in close
        for fix in _renaming_fix(text, where, {name: match}, f"Use optim={match}")
    ]
    message = f"unknown optimizer '{name}'{hint}: the trainer stops on it; no estimate without it"
    return _name_finding(analysis, "LLM012", Severity.ERROR, message, where, fixes)


register(
    Rule(
        code="LLM012",
        name="unknown-optimizer",
        severity=Severity.ERROR,
        summary="The optimizer name (`optim=`, `optimizer:`) is not one the frameworks know.",
        why="Transformers checks `optim` against its list when the trainer starts, after the "
        "model has loaded, and the optimizer decides how much memory its states take (8 bytes "
        "a parameter for AdamW, about 2 for 8-bit AdamW). llmmem does not guess which one was "
        "meant: without it there is no estimate.",
        example='args = TrainingArguments(output_dir="out", optim="adamw_bnb_8bt")',
        fix='Write one of the names the finding suggests (`optim="adamw_bnb_8bit"`); '
        f"the known names: {', '.join(sorted(OPTIMIZERS))}; also accepted: "
        f"{', '.join(sorted(name for name in ALIASES if '.' not in name))}.",
        check=check_unknown_optimizer,
    )
)


# -- LLM013 LoRA targets that match no module -------------------------------------------------


def check_unmatched_lora_targets(analysis: Analysis, text: str) -> list[Finding]:
    plan, spec = analysis.plan, analysis.spec
    if plan.lora is None or spec is None:
        return []
    written = plan.lora.target_modules.value
    if written is None:
        return []
    targets = [written] if isinstance(written, str) else [str(item) for item in written]
    if not targets or any(t in _OUTSIDE_BLOCKS or t.lower() == "all-linear" for t in targets):
        return []
    if isinstance(written, str) and re.search(r"[\\^$*+?()\[\]|]", written):
        return []  # PEFT reads a string as a regular expression: not checked here
    try:
        lora_target_linears(spec, targets)
        return []
    except SetupError:
        pass
    names = sorted({lin.name for group in spec.blocks for lin in group.linears})
    renames = {}
    for target in targets:
        close = difflib.get_close_matches(target, names, n=1, cutoff=0.6)
        if close:
            renames[target] = close[0]
    hint = (
        " (did you mean " + ", ".join(f"{new} for {old}" for old, new in renames.items()) + "?)"
        if renames
        else ""
    )
    where = plan.lora.target_modules.range or plan.lora.range
    message = (
        f"LoRA target_modules {', '.join(targets)} match no module of {spec.model_id}{hint}; "
        f"its block modules: {', '.join(names)} (or all-linear)"
    )
    fixes = _renaming_fix(
        text, where, renames, "Target " + ", ".join(dict.fromkeys(renames.values()))
    )
    return _name_finding(analysis, "LLM013", Severity.WARNING, message, where, fixes)


register(
    Rule(
        code="LLM013",
        name="lora-targets-unmatched",
        severity=Severity.WARNING,
        summary="LoRA `target_modules` name no module of the model.",
        why="PEFT raises when no module matches (after the model has loaded), and the adapter's "
        "size, its gradients and optimizer states all follow from what it adapts. Names copied "
        "from another architecture (`q_proj` on GPT-2, whose attention is `c_attn`) are the "
        "usual cause.",
        example='LoraConfig(r=16, target_modules=["q_prj", "v_prj"])  # Llama: q_proj, v_proj',
        fix="Use the model's module names the finding lists, or `all-linear`.",
        check=check_unmatched_lora_targets,
    )
)


# -- LLM014 unknown GPU in the file ------------------------------------------------------------


def check_unknown_gpu(analysis: Analysis, text: str) -> list[Finding]:
    """A GPU named by the file (a pragma, the project's settings) that no GPU is: without it
    nothing is checked against a capacity, so a typo would turn the check off in CI."""
    plan = analysis.plan
    if plan.gpu is None or analysis.gpu is not None:
        return []  # none named, or it resolved (or a --gpu flag won over it)
    from llmmem.gpus import UnknownGpuError, find_gpu

    name = str(plan.gpu.value)
    try:
        find_gpu(name)
        return []
    except UnknownGpuError as err:
        close = err.suggestions
    hint = f" (close matches: {', '.join(close)})" if close else " (no close match)"
    where = plan.gpu.range
    fixes = [
        fix
        for match in close[:3]
        for fix in _renaming_fix(text, where, {name: match}, f"Use gpu={match}")
    ]
    message = f"unknown GPU '{name}'{hint}: nothing is checked against a GPU's memory"
    return _name_finding(analysis, "LLM014", Severity.ERROR, message, where, fixes)


register(
    Rule(
        code="LLM014",
        name="unknown-gpu",
        severity=Severity.ERROR,
        summary="The GPU a pragma (`# llmmem: gpu=`) names is not one llmmem knows.",
        why="The fit check (LLM001, LLM002) needs the GPU's memory; with a name that matches "
        "no GPU there is nothing to check against, and a CI run would pass whatever the step "
        "needs.",
        example="# llmmem: gpu=A100-80B",
        fix="Write one of the close matches the finding names (`gpu=A100-80GB`), or a "
        "capacity such as `gpu=80GB`; `llmmem gpus` lists the catalog.",
        check=check_unknown_gpu,
    )
)

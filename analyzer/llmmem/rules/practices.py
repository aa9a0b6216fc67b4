"""Where the memory goes and settings that waste it: LLM003 to LLM010."""

from __future__ import annotations

from dataclasses import fields

from llmmem.budget.result import Component
from llmmem.budget.setup import LossImpl
from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan
from llmmem.rules.finding import Finding, Fix, Severity
from llmmem.rules.fit import anchor
from llmmem.rules.fixes import candidate_fixes
from llmmem.rules.pragma_fixes import pragma_fix
from llmmem.rules.registry import Check, Rule, register
from llmmem.scenario import Analysis, model_reference
from llmmem.units import format_bytes

DOMINANT_SHARE = 0.40  # a component over this share of the peak is worth a word
LOGITS_SHARE = 0.30


def _share(analysis: Analysis, component: Component) -> tuple[float, int]:
    budget = analysis.budget
    if budget is None:
        return 0.0, 0
    peak = budget.peak
    total = peak.allocated_bytes or 1
    term = peak.components.get(component)
    size = term.bytes if term is not None else 0
    return size / total, size


def _dominates(
    analysis: Analysis,
    text: str,
    *,
    code: str,
    component: Component,
    share: float,
    what: str,
    fix_keys: tuple[str, ...],
) -> list[Finding]:
    fraction, size = _share(analysis, component)
    if fraction < share:
        return []
    budget = analysis.budget
    assert budget is not None
    fixes = candidate_fixes(analysis, text, fix_keys, component)
    if not fixes:
        return []  # already done what would help
    severity = Severity.WARNING if budget.fits is False else Severity.INFO
    message = (
        f"{what} take {format_bytes(size)}, {100 * fraction:.0f}% of the peak "
        f"({budget.peak.moment})"
    )
    return [
        Finding(
            code=code,
            severity=severity,
            message=message,
            path=analysis.plan.path,
            range=anchor(analysis),
            fixes=fixes,
        )
    ]


def check_logits(analysis: Analysis, text: str) -> list[Finding]:
    if analysis.setup is None or analysis.setup.loss is not LossImpl.STANDARD:
        return []
    return _dominates(
        analysis,
        text,
        code="LLM003",
        component=Component.LOGITS,
        share=LOGITS_SHARE,
        what="The logits and the loss",
        fix_keys=("liger",),
    )


def check_activations(analysis: Analysis, text: str) -> list[Finding]:
    return _dominates(
        analysis,
        text,
        code="LLM004",
        component=Component.ACTIVATIONS,
        share=DOMINANT_SHARE,
        what="Saved activations",
        fix_keys=("grad-ckpt", "halve-batch"),
    )


def check_optimizer_states(analysis: Analysis, text: str) -> list[Finding]:
    return _dominates(
        analysis,
        text,
        code="LLM005",
        component=Component.OPTIMIZER_STATES,
        share=DOMINANT_SHARE,
        what="Optimizer states",
        fix_keys=("optim-8bit", "optim-paged-8bit"),
    )


def check_bf16_support(analysis: Analysis, text: str) -> list[Finding]:
    gpu, plan = analysis.gpu, analysis.plan
    if does_not_train(plan) is not None:
        return []
    bf16 = ("bf16", "bf16-true", "bf16-autocast")
    if gpu is None or gpu.bf16 or plan.precision.value not in bf16:
        return []
    if "bf16_auto_fallback" in plan.extra:
        # axolotl's `bf16: auto` (also an unset bf16) asks for bf16 only where the GPU has it:
        # on this GPU axolotl trains in fp16 (or fp32), nothing fails
        return []
    fixes = []
    if plan.precision.value == "bf16" and plan.precision.range is not None:
        from llmmem.rules.edits import keyword_at, set_setting

        if keyword_at(text, plan.precision.range) == "bf16":
            bf16_off = set_setting(plan, text, "bf16", False)
            fp16_on = set_setting(plan, text, "fp16", True)
            if bf16_off and fp16_on:
                fixes.append(
                    Fix(
                        title="Use fp16 mixed precision instead (fp16=True, bf16=False)",
                        edits=bf16_off + fp16_on,
                    )
                )
    return [
        Finding(
            code="LLM006",
            severity=Severity.ERROR,
            message=f"{gpu.name} has no bf16 support: training in bf16 fails or runs emulated; "
            "use fp16 mixed precision (or fp32)",
            path=plan.path,
            range=plan.precision.range or anchor(analysis),
            fixes=fixes,
        )
    ]


def check_checkpointing_with_cache(analysis: Analysis, text: str) -> list[Finding]:
    plan = analysis.plan
    if does_not_train(plan) is not None:
        return []
    if not plan.gradient_checkpointing.value or plan.use_cache is None:
        return []
    if not plan.use_cache.value or plan.use_cache.source is not Provenance.EXPLICIT:
        return []
    fixes = []
    if plan.use_cache.range is not None and plan.use_cache.range.path is None:
        from llmmem.rules.finding import TextEdit

        fixes.append(
            Fix(
                title="Set use_cache=False",
                edits=[
                    TextEdit(
                        range=plan.use_cache.range,
                        new_text=("False" if plan.kind == "python" else "false"),
                    )
                ],
            )
        )
    return [
        Finding(
            code="LLM007",
            severity=Severity.WARNING,
            message="use_cache=True with gradient checkpointing: transformers turns the cache off "
            "with a warning; without checkpointing it would keep an unused KV cache "
            "through forward",
            path=plan.path,
            range=plan.use_cache.range or anchor(analysis),
            fixes=fixes,
        )
    ]


# TRL trainers that prepare a k-bit model they are given with a `peft_config` (PEFT's
# prepare_model_for_kbit_training, or `prepare_peft_model` calling it): the last release seen
# doing it and the first seen not doing it (None: every release read does), each read in the
# trainer's module of the wheel (0.19.0, 0.25.0 to 0.29.1, 1.16.0)
TRL_PREPARES_KBIT: dict[str, tuple[str, str | None]] = {
    "SFTTrainer": ("0.25", "0.26"),
    "GRPOTrainer": ("0.25", "0.26"),
    "RewardTrainer": ("0.25", "0.26"),
    "RLOOTrainer": ("0.26", "0.27"),
    "DPOTrainer": ("0.28", "0.29"),
    "KTOTrainer": ("0.29", "1.16"),
    "ORPOTrainer": ("1.16", None),
    "CPOTrainer": ("1.16", None),
    "OnlineDPOTrainer": ("1.16", None),
}

# frameworks that load the model themselves and prepare a k-bit one their own way: axolotl's
# ModelLoader calls prepare_model_for_kbit_training for lora/qlora (axolotl 0.19.0,
# loaders/model.py `_prepare_model_for_quantization`), LLaMA-Factory its own
# `prepare_model_for_training` (checkpointing and input gradients; norms upcast only with
# `upcast_layernorm`, llamafactory 0.9.5), torchtune and LitGPT quantize without PEFT at all
FRAMEWORK_LOADERS = frozenset(
    {"axolotl", "llamafactory", "torchtune", "litgpt", "verl", "openrlhf", "swift", "unsloth"}
)


def kbit_prepared_elsewhere(analysis: Analysis) -> bool:
    """Whether something other than the file's own code prepares its k-bit model, or the file
    does not show how the model is loaded (a config, a launcher whose script is not read)."""
    plan = analysis.plan
    if plan.framework in FRAMEWORK_LOADERS or "unsloth" in plan.extra:
        # unsloth's get_peft_model calls its own prepare_model_for_kbit_training
        # (unsloth 2026.10.9, models/llama.py FastLlamaModel.get_peft_model)
        return True
    if plan.kind in ("yaml", "json") or (plan.kind == "shell" and plan.model_range is None):
        return True  # a config, or a launcher whose script was not read
    trainer = _extra_text(plan, "adapter_applied_by")
    if trainer not in TRL_PREPARES_KBIT:
        return False
    last, _first_not = TRL_PREPARES_KBIT[trainer]
    found = analysis.versions.get("trl")
    if found is None or found.kind == "default":
        return _first_not is None
    from llmmem.budget.setup import release

    try:
        return release(str(found.version)) <= release(last)
    except ValueError:
        return False


def _extra_text(plan: TrainingPlan, key: str) -> str | None:
    found = plan.extra.get(key)
    value = found.value if isinstance(found, Sourced) else found
    return value if isinstance(value, str) else None


def check_kbit_preparation(analysis: Analysis, text: str) -> list[Finding]:
    plan = analysis.plan
    if does_not_train(plan) is not None:
        return []
    q = plan.quantization
    if q is None or q.prepare_for_kbit_training.value or plan.lora is None:
        return []
    if kbit_prepared_elsewhere(analysis):
        return []
    message = (
        "k-bit model trained without prepare_model_for_kbit_training: norms and "
        "embeddings stay in 16 bits (unstable training) and checkpointing is not "
        "enabled for you"
    )
    trainer = _extra_text(plan, "adapter_applied_by")
    if trainer in TRL_PREPARES_KBIT:
        last, first_not = TRL_PREPARES_KBIT[trainer]
        message += (
            f"; TRL's {trainer} prepared a k-bit model it is given up to {last}, "
            f"not from {first_not}"
        )
    return [
        Finding(
            code="LLM008",
            severity=Severity.WARNING,
            message=message,
            path=plan.path,
            range=q.range or plan.model_range or anchor(analysis),
        )
    ]


def check_effective_batch(analysis: Analysis, text: str) -> list[Finding]:
    """A DeepSpeed config that fixes train_batch_size disagrees with the trainer's settings."""
    plan, setup = analysis.plan, analysis.setup
    found = plan.extra.get("train_batch_size")
    stated = found.value if isinstance(found, Sourced) else found
    range_ = found.range if isinstance(found, Sourced) else None
    if setup is None or not isinstance(stated, int):
        return []
    effective = setup.effective_batch
    if stated == effective:
        return []
    return [
        Finding(
            code="LLM009",
            severity=Severity.WARNING,
            message=f"effective batch changed: the DeepSpeed config says "
            f"train_batch_size={stated}, but micro-batch {setup.batch} × "
            f"accumulation {setup.grad_accum} × "
            f"{setup.distributed.world_size} devices = {effective}; DeepSpeed refuses to start",
            path=plan.path,
            range=range_ if range_ is not None and range_.path is None else anchor(analysis),
        )
    ]


def does_not_train(plan: TrainingPlan) -> str | None:
    """Why the file trains nothing, where its reader found so (`not_training` in the plan:
    LLaMA-Factory's do_train false, a script that only evaluates, a helper module that builds
    a trainer for another file), else None."""
    return _extra_text(plan, "not_training")


_FILE_SOURCES = (Provenance.EXPLICIT, Provenance.CLI_DEFAULT, Provenance.CONFIG, Provenance.PRAGMA)


def has_training_signal(plan: TrainingPlan) -> bool:
    """Whether the file says anything about training: a model, a trainer or training config,
    an adapter or quantization, a `# llmmem:` pragma or a training value written in it (not
    only `[tool.llmmem]` or the framework's defaults). A file without any is not a training
    file, and gets no finding at all. Neither is a DeepSpeed or accelerate config alone (it
    names no model by design: the script or launcher that passes it is read with it), nor a
    file the reader found to train nothing (`does_not_train`: an evaluation, a helper)."""
    model_by_pragma = plan.model_id is not None and plan.model_id.source is Provenance.PRAGMA
    if does_not_train(plan) is not None and not model_by_pragma:
        return False
    if (
        plan.kind in ("yaml", "json")
        and plan.framework in ("deepspeed", "accelerate")
        and plan.model_id is None
    ):
        return False
    if plan.model_id is not None or plan.model_range is not None or plan.trainer_range:
        return True
    if plan.lora is not None or plan.quantization is not None or plan.rejected:
        return True
    if isinstance(plan.extra.get("launch"), Sourced):
        return True  # a command that starts training (accelerate launch, swift sft, ...)
    values = [value for name, value in plan.sourced_fields().items() if name not in ("path", "gpu")]
    values.extend(getattr(plan.distributed, item.name) for item in fields(plan.distributed))
    return any(
        isinstance(value, Sourced)
        and value.source in _FILE_SOURCES
        and not value.note.startswith("[tool.llmmem]")
        for value in values
    )


def check_unresolved_model(analysis: Analysis, text: str) -> list[Finding]:
    """One finding for a training file that cannot be sized for want of its model: where the
    model is (or would be) written, what is missing there, and the pragma that gives it."""
    if analysis.model_error is None:
        return []
    plan = analysis.plan
    if not has_training_signal(plan):
        return []
    model = model_reference(plan)
    if model is None:
        where, what = _where_the_model_goes(plan)
        message = (
            f"no model found: {what}; add `# llmmem: model=org/name` (or "
            "`model_config=path/to/config.json`) to get a memory estimate"
        )
        pragma = "model=org/name"
    else:
        message = (
            f"cannot size model '{model.value}': add "
            "`# llmmem: model_config=path/to/config.json` or a known model id "
            f"({analysis.model_error.split(';')[-1].strip()})"
        )
        where = model.range
        pragma = "model_config=path/to/config.json"
    fix = pragma_fix(plan, text, where, pragma)
    return [
        Finding(
            code="LLM010",
            severity=Severity.INFO,
            message=message,
            path=plan.path,
            range=where,
            fixes=[fix] if fix is not None else [],
        )
    ]


def _where_the_model_goes(plan: TrainingPlan) -> tuple[SourceRange | None, str]:
    """Where the plan would read the model from, and what is missing there."""
    unread = plan.extra.get("model_unread")
    if isinstance(unread, Sourced):
        return unread.range, f"the model is {unread.value}"
    if plan.model_range is not None:
        return plan.model_range, "the model loaded here is not named where llmmem can read it"
    launch = plan.extra.get("launch")
    if isinstance(launch, Sourced):
        return launch.range, f"`{launch.value}` trains, but names no model llmmem can read"
    if plan.trainer_range is not None:
        return plan.trainer_range, "the trainer is given no model llmmem can read"
    return None, "the file names no model"


def _rule(
    code: str,
    name: str,
    severity: Severity,
    summary: str,
    why: str,
    example: str,
    fix: str,
    check: Check,
) -> None:
    register(
        Rule(
            code=code,
            name=name,
            severity=severity,
            summary=summary,
            why=why,
            example=example,
            fix=fix,
            check=check,
        )
    )  # type: ignore[arg-type]


_rule(
    "LLM003",
    "logits-dominate",
    Severity.INFO,
    "The logits and the cross-entropy take a large share (30% or more) of the peak.",
    "HF's loss upcasts the logits to fp32 and keeps the log-softmax: at the start of backward "
    "12 bytes per logit (batch × sequence × vocabulary) are alive. With a 128k or 256k "
    "vocabulary this is often the largest single item.",
    "args = SFTConfig(per_device_train_batch_size=8, max_length=4096)  # Llama-3, 128k vocab",
    "A fused linear cross-entropy that never materialises the logits: "
    "`use_liger_kernel=True` (pip install liger-kernel), or a smaller micro-batch.",
    check_logits,
)
_rule(
    "LLM004",
    "activations-dominate",
    Severity.INFO,
    "Saved activations take 40% or more of the peak and checkpointing is off.",
    "Autograd keeps each block's intermediate tensors from forward to backward; they grow with "
    "micro-batch × sequence length. Gradient checkpointing keeps only each block's input and "
    "recomputes one block at a time, for about a third more compute.",
    "args = TrainingArguments(per_device_train_batch_size=8)  # no gradient_checkpointing",
    "`gradient_checkpointing=True` (or `model.gradient_checkpointing_enable()`), or a smaller "
    "micro-batch with more accumulation.",
    check_activations,
)
_rule(
    "LLM005",
    "optimizer-states-dominate",
    Severity.INFO,
    "Optimizer states take 40% or more of the peak.",
    "AdamW keeps two states per trainable parameter (8 bytes in fp32): for full fine-tuning "
    "this is often the largest item. bitsandbytes' 8-bit AdamW keeps about 2 bytes.",
    'args = TrainingArguments(optim="adamw_torch")  # full fine-tuning of 7B',
    '`optim="adamw_bnb_8bit"` or `"paged_adamw_8bit"` (pip install bitsandbytes), or LoRA.',
    check_optimizer_states,
)
_rule(
    "LLM006",
    "bf16-unsupported",
    Severity.ERROR,
    "bf16 training on a GPU without bf16 support (V100, T4 and older).",
    "Pre-Ampere GPUs have no bf16 tensor cores: torch either refuses or emulates it slowly.",
    "args = TrainingArguments(bf16=True)  # on a T4",
    "`fp16=True` (mixed precision with loss scaling) or fp32.",
    check_bf16_support,
)
_rule(
    "LLM007",
    "checkpointing-with-cache",
    Severity.WARNING,
    "Gradient checkpointing is on and the model config keeps use_cache=True.",
    "A KV cache is useless while training; transformers switches it off under checkpointing "
    "with a warning, and without checkpointing it costs 2 × layers × tokens × kv width.",
    "model.config.use_cache = True\nmodel.gradient_checkpointing_enable()",
    "`model.config.use_cache = False` (or `use_cache=False` in from_pretrained).",
    check_checkpointing_with_cache,
)
_rule(
    "LLM008",
    "kbit-without-preparation",
    Severity.WARNING,
    "A 4- or 8-bit model the script loads is trained without prepare_model_for_kbit_training, "
    "and nothing it hands the model to prepares it.",
    "PEFT's preparation casts norms and embeddings to fp32 for stable training and enables "
    "gradient checkpointing with input gradients; without it QLoRA trains in 16-bit norms. "
    "unsloth's get_peft_model, axolotl's and LLaMA-Factory's loaders prepare the model "
    "themselves, torchtune and LitGPT quantize without PEFT, and TRL's trainers prepare a "
    "k-bit model given with a peft_config up to a release (SFTTrainer and GRPOTrainer 0.25, "
    "DPOTrainer 0.28; ORPO and CPO in every release): none of these is reported.",
    "model = AutoModelForCausalLM.from_pretrained(mid, quantization_config=bnb)\n"
    "model = get_peft_model(model, lora)",
    "`model = prepare_model_for_kbit_training(model)` before get_peft_model.",
    check_kbit_preparation,
)
_rule(
    "LLM009",
    "effective-batch-changed",
    Severity.WARNING,
    "The effective batch the trainer computes differs from what a DeepSpeed config fixes.",
    "DeepSpeed checks train_batch_size = micro-batch × accumulation × world size and refuses "
    "to start when they disagree, after the model has loaded.",
    '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}  # 8 GPUs, accumulation 1',
    'Use "auto" in the DeepSpeed config so the trainer fills it in.',
    check_effective_batch,
)
_rule(
    "LLM010",
    "model-unresolved",
    Severity.INFO,
    "A file that trains names no model llmmem can read, or one it cannot size (not local, "
    "not cached, not on the hub, not bundled). The finding stands where the model is written "
    "(or would be: the from_pretrained call, the launch command) and says what is missing "
    "there. A DeepSpeed or accelerate config alone, and a file that trains nothing, get none.",
    "Without its shapes no memory can be predicted; llmmem never guesses silently, and never "
    "leaves a training file without an answer.",
    'model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"])',
    "The quick fix writes `# llmmem: model=org/name` (or `model_config=path/to/config.json`) "
    "on the line above, to fill in.",
    check_unresolved_model,
)

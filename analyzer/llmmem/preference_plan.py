"""From a plan's training objective to the preference budget's setup.

`preference_setup(plan)` is None for supervised fine-tuning; otherwise it says which objective
the file trains for and how the reference log-probabilities are made: read from the dataset
(`precompute_ref_log_probs=True`), by a reference model the script builds itself
(`DPOTrainer(model, ref_model, ...)`: a second copy, LoRA or not), or TRL's default (a copy in
full fine-tuning, the adapter disabled under PEFT).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmmem.budget.preference_setup import Objective, PreferenceSetup, Reference
from llmmem.budget.setup import Precision, SetupError, TrainingSetup
from llmmem.plan import Sourced, TrainingPlan


def _kept(plan: TrainingPlan, name: str) -> Any:
    kept = plan.extra.get(name)
    return kept.value if isinstance(kept, Sourced) else kept


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def objective_of(plan: TrainingPlan) -> Objective | None:
    """The plan's objective; None for SFT or a value llmmem does not know."""
    if plan.objective is None:
        return None
    try:
        objective = Objective(str(plan.objective.value).lower())
    except ValueError:
        return None
    return None if objective is Objective.SFT else objective


# objectives whose step is the supervised one: next-token loss over every token (pretraining,
# LLaMA-Factory `stage: pt`, `swift pt`) costs what SFT costs
SUPERVISED_OBJECTIVES = frozenset({"sft", "pretrain"})


def unmodelled_objective_problem(plan: TrainingPlan) -> str | None:
    """A clear word where the plan trains for an objective llmmem does not size (trl's online
    DPO, an axolotl `rl:` value it does not know): the estimate is then the supervised step of
    the same model and setup, which leaves out what that objective adds."""
    if plan.objective is None or objective_of(plan) is not None:
        return None
    name = str(plan.objective.value)
    if name.lower() in SUPERVISED_OBJECTIVES:
        return None
    return (
        f"trains for {name}, whose step llmmem does not size yet: the estimate is the "
        "supervised step of the same model and setup, which leaves out what the objective "
        "adds (generation in the step, a reference, reward or judge model)"
    )


def reference_of(plan: TrainingPlan) -> tuple[Reference | None, str]:
    """How the plan makes its reference log-probabilities, and why (None: TRL's default)."""
    if _truthy(_kept(plan, "precompute_ref_log_probs")):
        return Reference.PRECOMPUTED, "precompute_ref_log_probs=True"
    reference_model = _kept(plan, "ref_model_id")
    if reference_model:
        return Reference.COPY, f"ref_model= {reference_model}"
    return None, ""


def mixed_precision_of(plan: TrainingPlan) -> bool | None:
    """Whether the plan's trainer runs under accelerate's mixed precision (`bf16=True` or
    `fp16=True`), which hands the prepared models' logits back in fp32. Autocast precisions
    are that flag; a `bf16`/`fp16` flag the plan keeps says it for 16-bit weights; None where
    the plan does not say (the budget takes TRL's configs' default, `bf16=True`)."""
    flags = [_kept(plan, key) for key in ("bf16", "fp16") if key in plan.extra]
    if any(_truthy(flag) for flag in flags if flag is not None):
        return True
    if str(plan.precision.value) in ("bf16", "fp16", "bf16-autocast"):
        return True
    if flags and all(flag is not None for flag in flags):
        return False
    return None


# OpenRLHF's critic-free estimators whose advantage needs several completions a prompt
# (cli/train_ppo_ray.py at 0.11.0: "requires n_samples_per_prompt > 1"); `reinforce`
# (REINFORCE++) runs with one
OPENRLHF_GROUP_ESTIMATORS = frozenset({"rloo", "reinforce_baseline", "group_norm", "dr_grpo"})


def openrlhf_reference(plan: TrainingPlan) -> dict[str, Any]:
    """How OpenRLHF loads its reference copy (0.11.0: `Actor(..., param_dtype=...)` with
    `strategy.get_ds_eval_config(offload=...)`): in `--param_dtype` (bf16 or fp16, 2 bytes),
    ZeRO-3 partitioned when the training runs ZeRO-3 (stage 0 otherwise), on the CPU with
    `--ref_offload` under ZeRO-3. Empty for other frameworks (TRL's defaults)."""
    if plan.framework != "openrlhf":
        return {}
    stage = plan.distributed.zero_stage.value
    offload = _truthy(_kept(plan, "ref_offload")) or _truthy(_kept(plan, "ref_reward_offload"))
    return openrlhf_reference_of(stage if isinstance(stage, int) else 0, offload)


def openrlhf_reference_of(zero_stage: int, offload: bool) -> dict[str, Any]:
    """OpenRLHF's reference copy under a ZeRO stage, with or without --ref_offload (the rule of
    openrlhf_reference, also `llmmem estimate --trainer openrlhf`'s)."""
    zero3 = zero_stage == 3
    return {
        "reference_bytes": 2,
        "reference_sharded": zero3,
        "reference_offloaded": zero3 and offload,
    }


def llamafactory_trainer(plan: TrainingPlan) -> dict[str, Any]:
    """LLaMA-Factory runs its own preference trainers (0.9.5: llamafactory/train/dpo/trainer.py
    CustomDPOTrainer, whose log-probabilities differ from TRL's: `PreferenceSetup.trainer`), and
    loads a full fine-tune's reference copy with `create_ref_model` (train/trainer_utils.py):
    `load_model(..., is_trainable=False)`, in the compute dtype, without the fp32 upcast the
    trained model gets. Empty for other frameworks."""
    if plan.framework != "llamafactory":
        return {}
    precision = str(plan.precision.value)
    return {"trainer": "llamafactory", "reference_bytes": 4 if precision == "fp32" else 2}


# GRPOConfig's fields (TRL 0.29.1) the GRPO budget reads, as a plan keeps them
GRPO_KEYS: dict[str, str] = {
    "num_generations": "num_generations",
    "max_prompt_length": "max_prompt_length",
    "max_completion_length": "max_completion_length",
    "beta": "beta",
    "vllm_gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "vllm_enable_sleep_mode": "vllm_enable_sleep_mode",
    "vllm_importance_sampling_correction": "vllm_importance_sampling_correction",
    "steps_per_generation": "steps_per_generation",
    "num_iterations": "num_iterations",
}
_GRPO_BOOLEANS = frozenset({"vllm_enable_sleep_mode", "vllm_importance_sampling_correction"})
_GRPO_FLOATS = frozenset({"beta", "vllm_gpu_memory_utilization"})


def grpo_setup(plan: TrainingPlan) -> Any:
    """The GrpoSetup of a GRPO plan: the GRPOConfig fields the file sets, TRL 0.29.1's
    defaults for the others (`use_vllm` off, `vllm_mode` "server" when on). A field written
    as something other than a number is left at its default."""
    from llmmem.budget.grpo import GrpoSetup

    values: dict[str, Any] = {}
    for key, field_name in GRPO_KEYS.items():
        value = _kept(plan, key)
        if value is None:
            continue
        try:
            if key in _GRPO_BOOLEANS:
                values[field_name] = _truthy(value)
            elif key in _GRPO_FLOATS:
                values[field_name] = float(value)
            else:
                values[field_name] = int(value)
        except (TypeError, ValueError):
            continue
    if _truthy(_kept(plan, "use_vllm")):
        mode = str(_kept(plan, "vllm_mode") or "server").strip().lower()
        values["vllm"] = mode
    values.update(own_log_probabilities(plan))  # OpenRLHF's and verl's: not TRL's fused head
    if plan.framework == "openrlhf":
        estimator = str(_kept(plan, "advantage_estimator") or "").strip().lower()
        values["group_baseline"] = estimator in OPENRLHF_GROUP_ESTIMATORS
        if _kept(plan, "ref_model_id"):
            # OpenRLHF loads the reference as a model of its own, under LoRA too
            values["reference_copy"] = True
            values.update(openrlhf_reference(plan))
    return GrpoSetup(**values)  # SetupError for values TRL refuses too


def grpo_assumed_note(plan: TrainingPlan) -> str | None:
    """For a GRPO plan, the GRPOConfig fields that change the memory and that the plan does
    not carry: the budget takes TRL 0.29.1's defaults for them. A Python script's plan carries
    them all (the file's values, else TRL's defaults with their provenance); a config file's
    reader may not."""
    if objective_of(plan) is not Objective.GRPO:
        return None
    defaults = {
        "num_generations": "8",
        "beta": "0.0",
        "use_vllm": "False",
        "steps_per_generation": "gradient_accumulation_steps",
    }
    missing = [f"{key}={value}" for key, value in defaults.items() if key not in plan.extra]
    if not missing:
        return None
    return (
        "grpo: TRL 0.29.1's defaults taken for " + ", ".join(missing) + " (not read from the file)"
    )


# the frameworks whose PPO step llmmem.budget.ppo sizes: TRL's PPOTrainer (a script) and
# LLaMA-Factory's stage: ppo
PPO_FRAMEWORKS = ("trl", "hf", "llamafactory", "openrlhf")


def _whole(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 1 else None


def _spec_of(ref: Any, what: str, plan: TrainingPlan) -> Any:
    """The ModelSpec of a value or reward model the file names (the catalog, a local config
    or an earlier hub lookup; no network); SetupError when it cannot be found."""
    from pathlib import Path

    from llmmem.budget.setup import SetupError
    from llmmem.models.resolve import ModelResolutionError, resolve_model

    try:
        return resolve_model(str(ref), hub=False, base_dir=Path(plan.path).parent)
    except ModelResolutionError as err:
        raise SetupError(f"the {what} '{ref}' could not be sized: {err}") from None


def ppo_setup(plan: TrainingPlan) -> Any:
    """The PpoSetup of a PPO plan. A TRL script: PPOConfig's response_length,
    local_rollout_forward_batch_size and num_mini_batches (TRL 0.29.1's defaults where the
    file leaves them), the value and reward models at the policy's size. LLaMA-Factory's
    stage: ppo: a value head on the policy, reward_model_type lora (an adapter on the
    policy), full (the reward_model, sized) or api, max_new_tokens (default 1024), a
    mini-batch generated at a time. Other frameworks' PPO (verl, OpenRLHF: actor, critic,
    reference and reward in separate workers) is not sized: SetupError."""
    from llmmem.budget.ppo_setup import PpoSetup
    from llmmem.budget.setup import SetupError

    framework = plan.framework
    if framework not in PPO_FRAMEWORKS:
        raise SetupError(
            f"{framework}'s PPO (actor, critic, reference and reward models in their own "
            "workers) is not modelled; TRL's PPOTrainer, LLaMA-Factory's stage: ppo and "
            "OpenRLHF's train_ppo_ray are"
        )
    if framework == "openrlhf":
        return _openrlhf_ppo(plan)
    if framework == "llamafactory":
        kind = str(_kept(plan, "reward_model_type") or "lora").strip().lower()
        reward = {"lora": "adapter", "full": "model", "api": "api"}.get(kind)
        if reward is None:
            raise SetupError(f"reward_model_type is lora, full or api, got {kind!r}")
        reward_spec = None
        reward_name = ""
        if reward == "model":
            named = _kept(plan, "reward_model")
            if not named:
                raise SetupError("reward_model_type: full needs reward_model: (its path or id)")
            reward_spec, reward_name = _spec_of(named, "reward model", plan), str(named)
        reference = None
        if _kept(plan, "ref_model"):
            reference = Reference.COPY
        return PpoSetup(
            value="head",
            reward=reward,
            reward_model=reward_spec,
            reward_name=reward_name,
            reference=reference,
            response_length=_whole(_kept(plan, "max_new_tokens")) or 1024,
            local_rollout_forward_batch_size=None,
            keep_scores=False,
            trainer="llamafactory",
        )
    values: dict[str, Any] = {}
    for key in ("response_length", "local_rollout_forward_batch_size", "num_mini_batches"):
        number = _whole(_kept(plan, key))
        if number is not None:
            values[key] = number
    reference, _ = reference_of(plan)
    for key, what in (("value_model_id", "value_model"), ("reward_model_id", "reward_model")):
        named = _kept(plan, key)
        if named:
            values[what] = _spec_of(named, what.replace("_", " "), plan)
            values[what.split("_")[0] + "_name"] = str(named)
    return PpoSetup(reference=reference if reference is Reference.COPY else None, **values)


def _openrlhf_ppo(plan: TrainingPlan) -> Any:
    """OpenRLHF's train_ppo_ray on the actor's GPU (openrlhf 0.11.0, cli/train_ppo_ray.py):
    queries of `max_len − max_new_tokens` and responses of `max_new_tokens` (the plan's
    max_prompt_length and max_completion_length); `micro_rollout_batch_size` rows a rollout
    forward; the critic and a reward model share the actor's GPUs only with
    `colocate_all_models` (a `remote_rm_url` reward is a server); the reference (KL
    coefficient above 0) with `colocate_all_models` or `colocate_actor_ref`, loaded as
    OpenRLHF loads it; vLLM engines colocated or on GPUs of their own."""
    from llmmem.budget.ppo_setup import PpoSetup

    colocated = _truthy(_kept(plan, "colocate_all_models"))
    values: dict[str, Any] = {"trainer": "openrlhf", "keep_scores": False}
    for key, name in (
        ("max_prompt_length", "query_length"),
        ("max_completion_length", "response_length"),
        ("micro_rollout_batch_size", "local_rollout_forward_batch_size"),
    ):
        number = _whole(_kept(plan, key))
        if number is not None:
            values[name] = number
    values.setdefault("local_rollout_forward_batch_size", None)
    critic = _kept(plan, "critic_model_id")
    if critic and colocated:
        values["value_model"] = _spec_of(critic, "critic model", plan)
        values["value_name"] = str(critic)
    else:
        values["value"] = "remote"
        values["value_name"] = f"the critic {critic}" if critic else "the critic"
    reward = _kept(plan, "reward_model_id")
    if _kept(plan, "remote_rm_url"):
        values["reward"] = "api"
        values["reward_name"] = f"a reward server ({_kept(plan, 'remote_rm_url')})"
    elif reward and colocated:
        values["reward_model"] = _spec_of(reward, "reward model", plan)
        values["reward_name"] = str(reward)
    else:
        values["reward"] = "api"
        values["reward_name"] = f"the reward model {reward or ''} on GPUs of its own".replace(
            "  ", " "
        )
    try:
        beta = float(_kept(plan, "beta") or 0)
    except (TypeError, ValueError):
        beta = 0.0
    if beta > 0 and _kept(plan, "ref_model_id"):
        values["reference"] = Reference.COPY
        values.update(openrlhf_reference(plan))
    else:
        values["reference"] = Reference.NONE  # on GPUs of its own, or no KL term
    if _truthy(_kept(plan, "use_vllm")):
        mode = str(_kept(plan, "vllm_mode") or "server").strip().lower()
        values["vllm"] = mode if mode in ("colocate", "server") else "server"
        try:
            values["vllm_gpu_memory_utilization"] = float(
                _kept(plan, "vllm_gpu_memory_utilization") or 0.95
            )
        except (TypeError, ValueError):
            pass
        values["vllm_enable_sleep_mode"] = _truthy(_kept(plan, "vllm_enable_sleep_mode"))
    return PpoSetup(**values)


def preference_setup(plan: TrainingPlan) -> PreferenceSetup | None:
    objective = objective_of(plan)
    if objective is None:
        return None
    reference, _ = reference_of(plan)
    mixed = mixed_precision_of(plan)
    if objective is Objective.GRPO:
        return PreferenceSetup(objective=objective, grpo=grpo_setup(plan), mixed_precision=mixed)
    if objective is Objective.PPO:
        return PreferenceSetup(objective=objective, ppo=ppo_setup(plan), mixed_precision=mixed)
    return PreferenceSetup(
        objective=objective,
        reference=reference,
        mixed_precision=mixed,
        **own_log_probabilities(plan),
        **openrlhf_reference(plan),
        **llamafactory_trainer(plan),
        **cpo_alpha_of(plan, objective),
    )


# frameworks whose trainers take their log-probabilities from the full logits in code of their
# own, whatever TRL is installed beside them: TRL 0.29's moments, not TRL 1.x's fused LM head
OWN_LOG_PROBABILITIES = ("openrlhf", "verl")


# the TRL release whose moments those frameworks' steps follow
OWN_LOG_PROBABILITIES_RELEASE = "0.29.1"


def own_log_probabilities(plan: TrainingPlan) -> dict[str, Any]:
    """`trl_release` pinned to the release whose moments such a framework's step follows."""
    if plan.framework not in OWN_LOG_PROBABILITIES:
        return {}
    return {"trl_release": OWN_LOG_PROBABILITIES_RELEASE}


def cpo_alpha_of(plan: TrainingPlan, objective: Objective) -> dict[str, Any]:
    """CPO's `cpo_alpha` where the plan sets it (TRL's CPOConfig, axolotl's key): 0 drops the
    chosen half's cross-entropy from the step. Empty where unset or unreadable (TRL's 1.0)."""
    if objective is not Objective.CPO:
        return {}
    value = _kept(plan, "cpo_alpha")
    try:
        return {} if value is None else {"cpo_alpha": float(value)}
    except (TypeError, ValueError):
        return {}


REFERENCE_TEXT = {
    Reference.COPY: "a second, frozen copy of the model",
    Reference.ADAPTER: "the policy with its LoRA adapter disabled (no copy)",
    Reference.PRECOMPUTED: "none during training (log-probabilities precomputed)",
    Reference.NONE: "none (no reference model)",
}


def reference_row(plan: TrainingPlan, method: Any) -> Sourced[str] | None:
    """The reference model as explain shows it, with where it was decided; `method` is the
    setup's Method (full, lora, qlora) or None when the setup could not be built."""
    from llmmem.budget.preference_setup import WITH_REFERENCE
    from llmmem.plan import Provenance

    objective = objective_of(plan)
    if objective is None or method is None:
        return None
    reference, why = reference_of(plan)
    if objective is Objective.GRPO and "beta" not in plan.extra and "use_kl_loss" in plan.extra:
        # verl: the KL term's reference policy is FSDP-wrapped with CPU offload, its weights
        # on the CPU; nothing on the GPU to size either way
        kl = plan.extra["use_kl_loss"]
        on = _truthy(_kept(plan, "use_kl_loss"))
        return Sourced(
            value=f"{Reference.NONE.value}: "
            + ("the reference policy is kept on the CPU" if on else REFERENCE_TEXT[Reference.NONE]),
            source=kl.source if isinstance(kl, Sourced) else Provenance.EXPLICIT,
            range=kl.range if isinstance(kl, Sourced) else plan.trainer_range,
            note=f"verl use_kl_loss: {str(on).lower()}"
            + (" (FSDP offloads its weights to the CPU: not held on the GPU)" if on else ""),
        )
    if objective is Objective.GRPO:
        kept = plan.extra.get("beta")
        beta = _kept(plan, "beta")
        if isinstance(kept, Sourced):
            source, where = kept.source, kept.range or plan.trainer_range
        else:
            source = Provenance.DEFAULT if beta is None else Provenance.EXPLICIT
            where = plan.trainer_range
        try:
            with_reference = float(beta) != 0 if beta is not None else False
        except (TypeError, ValueError):
            with_reference = False
        full = str(getattr(method, "value", method)) == "full"
        default = " (TRL 0.29.1's default)" if source is Provenance.DEFAULT else ""
        # a framework's own reading of its KL coefficient (OpenRLHF: where the reference
        # runs) says more than TRL's default does
        said = kept.note if isinstance(kept, Sourced) and plan.framework != "trl" else ""
        if said:
            default = ""
        separate = plan.framework == "openrlhf" and bool(_kept(plan, "ref_model_id"))
        if not with_reference:
            reference = Reference.NONE
            why = "beta = 0" + default + (f": {said}" if said else "")
        else:
            reference = Reference.COPY if full or separate else Reference.ADAPTER
            why = f"beta = {beta}{default}: " + (
                _note_of(plan, "ref_model_id")
                if separate
                else "a second model"
                if full
                else "the adapter disabled"
            )
            if said:
                why += f"; {said}"
        return Sourced(
            value=f"{reference.value}: {REFERENCE_TEXT[reference]}",
            source=source,
            range=where,
            note=why,
        )
    if objective is Objective.PPO:
        full = str(getattr(method, "value", method)) == "full"
        lf = plan.framework == "llamafactory"
        if lf and _kept(plan, "ref_model"):
            reference, why = Reference.COPY, f"ref_model: {_kept(plan, 'ref_model')}"
            source = Provenance.EXPLICIT
        elif reference is None:
            reference = Reference.COPY if full else Reference.ADAPTER
            why = (
                ("LLaMA-Factory's" if lf else "TRL's PPOTrainer")
                + " default for "
                + ("full fine-tuning" if full else "a PEFT model")
            )
            source = Provenance.DEFAULT
        else:
            source = Provenance.EXPLICIT
        return Sourced(
            value=f"{reference.value}: {REFERENCE_TEXT[reference]}",
            source=source,
            range=plan.trainer_range,
            note=why,
        )
    if objective not in WITH_REFERENCE:
        reference, why = Reference.NONE, f"{objective.value} compares no reference"
        source = Provenance.DEFAULT
    elif reference is None:
        full = str(getattr(method, "value", method)) == "full"
        reference = Reference.COPY if full else Reference.ADAPTER
        if plan.framework == "llamafactory":
            # create_ref_model (train/trainer_utils.py, 0.9.5): None under LoRA, else the model
            # loaded again, untrainable, in the compute dtype
            why = (
                "LLaMA-Factory's create_ref_model: the model loaded again, in the compute dtype"
                if full
                else "LLaMA-Factory's create_ref_model: none under LoRA, the adapter disabled"
            )
        else:
            why = "TRL's default for " + ("full fine-tuning" if full else "a PEFT model")
        source = Provenance.DEFAULT
    else:
        source = Provenance.EXPLICIT
    where = plan.trainer_range
    decided = plan.extra.get(
        "precompute_ref_log_probs" if reference is Reference.PRECOMPUTED else "ref_model_id"
    )
    if reference in (Reference.COPY, Reference.PRECOMPUTED) and isinstance(decided, Sourced):
        # where the file (or the framework's default) decided it, as the plan kept it
        source, where = decided.source, decided.range or plan.trainer_range
        if decided.note:
            why = decided.note
    return Sourced(
        value=f"{reference.value}: {REFERENCE_TEXT[reference]}",
        source=source,
        range=where,
        note=why,
    )


def _note_of(plan: TrainingPlan, key: str) -> str:
    kept = plan.extra.get(key)
    if isinstance(kept, Sourced) and kept.note:
        return kept.note
    return f"{key} {_kept(plan, key)}"


def trl_release_note(versions: dict[str, Any]) -> str | None:
    """A note where the run's TRL computes the log-probabilities otherwise than TRL 0.29: 1.6 to
    1.14 DPOTrainer on views of the logits, without 0.29's shifted copies (sized so); from 1.15
    DPOTrainer, KTOTrainer and GRPOTrainer through a fused, tiled LM head (trl/trainer/utils.py
    `add_fused_lm_head`), which the budget sizes (llmmem.budget.fused_head), for DPO and KTO
    over every position, where a GPU scores only the labelled ones. 1.0 to 1.5 run 0.29's
    code: no note."""
    from llmmem.budget.fused_head_bytes import FIRST_RELEASE
    from llmmem.budget.preference_setup import SAME_DPO_UNTIL
    from llmmem.budget.setup import release

    found = versions.get("trl")
    text = str(getattr(found, "version", "") or "")
    try:
        found_release = release(text)
    except ValueError:
        return None
    if found_release < SAME_DPO_UNTIL:
        return None
    if found_release < FIRST_RELEASE:
        return (
            f"trl {text}: DPOTrainer takes its log-probabilities on views of the logits (no "
            "shifted copies since 1.6), and the budget sizes them so; KTO and GRPO are sized "
            "as TRL 0.29's"
        )
    return (
        f"trl {text}: DPO, KTO and GRPO take their log-probabilities from a fused, tiled LM "
        "head that never holds the logits whole, and the budget sizes it; for DPO and KTO "
        "with every position scored, an upper bound where only the completions are"
    )


def budget_for_plan(plan: TrainingPlan, spec: Any, setup: Any, gpu: Any) -> Any:
    """The budget of one step of `plan` under `setup`: the preference budget where the plan
    trains for a preference objective, the SFT step's otherwise (for what-if searches that
    change the setup and must size it as the file trains)."""
    from llmmem.budget.phases import estimate_budget

    preference = preference_setup(plan)
    if preference is None:
        return estimate_budget(spec, setup, gpu)
    from llmmem.budget.preference import estimate_preference_budget

    setup, preference = autocast_as_mixed_precision(setup, preference)

    return estimate_preference_budget(spec, setup, preference, gpu)


def autocast_as_mixed_precision(
    setup: TrainingSetup, preference: PreferenceSetup
) -> tuple[TrainingSetup, PreferenceSetup]:
    """The setup and the preference plan as the preference, GRPO and PPO budgets take them:
    the TRL release the setup knows (their moments that are one release's own follow it), and
    accelerate's autocast as mixed precision over the weights' own dtype
    (`PreferenceSetup.mixed_precision`): bf16 weights under bf16 autocast are bf16 weights
    with mixed precision on."""
    if setup.trl_version is not None and preference.trl_release is None:
        preference = replace(preference, trl_release=setup.trl_version)
    if setup.precision is not Precision.BF16_AUTOCAST:
        return setup, preference
    if preference.mixed_precision is False:
        raise SetupError(
            "bf16-autocast runs forward under accelerate's autocast, which is its mixed "
            "precision: drop --no-mixed-precision, or use --precision bf16-true"
        )
    return (
        replace(setup, precision=Precision.BF16_TRUE),
        replace(preference, mixed_precision=True),
    )

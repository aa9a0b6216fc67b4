"""PPO (TRL's PPOTrainer): a policy and a value model trained together, a reference and a reward
model beside them, generation inside the step.

Read in TRL 0.29.1 (`trl/experimental/ppo/ppo_trainer.py`, `ppo_config.py`,
`trl/experimental/utils.py` `get_reward` and `create_reference_model`, `trl/trainer/utils.py`
`pad` and `selective_log_softmax`) and transformers 5.24's `generate`. What lives on the GPU:

- four models. The policy (trainable: every weight, or its LoRA adapter when `peft_config` is
  given); the value model, an `AutoModelForSequenceClassification` (`num_labels=1`: a score head
  of hidden × 1 instead of the vocabulary head) of its own size, loaded by the script (TRL's
  example loads it from `reward_model_path`: it may be smaller or larger than the policy), and
  trained in full even when the policy has an adapter; the reference policy, a frozen
  `deepcopy` of the policy (`create_reference_model`, full fine-tuning), the model passed as
  `ref_model`, or under PEFT the policy itself with its adapter disabled (`null_ref_context`:
  no copy); the reward model, a frozen sequence-classification model, moved to the device as
  loaded.
- `PolicyAndValueWrapper(policy, value_model)` is what the accelerator prepares, and one
  optimizer (`create_optimizer_and_scheduler`) covers both trainables: the optimizer states,
  the gradients and the step's buffers are the policy's trainable set plus the whole value
  model.
- one update, per device, over `local_batch_size = per_device_train_batch_size ×
  gradient_accumulation_steps` queries:
  1. generation (`batch_generation`, no gradient): the policy generates `response_length`
     tokens for `local_rollout_forward_batch_size` queries at a time, with its KV cache and
     `output_scores=True`: every step's processed fp32 scores (rows × V) are kept, stacked into
     rows × response_length × V per chunk, and the chunks padded into one tensor (`pad`: the
     list and the padded copy alive together). `train` keeps that tensor (`logitss`) until the
     next update's generation returns: through the whole update, and beside the next
     generation.
  2. the rollout forwards (no gradient), chunk by chunk: the policy's log-probabilities from
     the kept scores; the reference's forward over query + response (`forward`,
     `output_hidden_states=True`: every layer's hidden states alive with the logits, which
     cover the whole sequence in the compute dtype, divided by the temperature in place), the
     value model's and the reward model's backbones (`get_reward`, hidden states kept, the
     score head on the last). Only per-token numbers leave a chunk.
  3. training: `num_ppo_epochs` passes over `num_mini_batches` mini-batches, each
     `gradient_accumulation_steps` micro-batches of `per_device_train_batch_size` rows through
     the wrapper: the value backbone first (with gradient, hidden states kept; its output,
     with the KV cache it builds, stays bound in the wrapper's forward through the policy's
     forward, and its score head keeps its input), then the policy (the whole sequence's
     logits), `logits /= temperature` in place on the response slice,
     `selective_log_softmax`, the clipped policy and value losses, backward,
     `optimizer.step()` and `zero_grad()` (a step every `gradient_accumulation_steps`
     micro-batches under `accelerator.accumulate`), then, without gradient, the entropy
     (`softmax(logits)` and its product with the logits) while the micro-batch's output is
     still alive. A micro-batch's tensors are deleted only at the end of its mini-batch: with
     several micro-batches per mini-batch the one before is alive through the next's forward.
  The peaks repeat across epochs and mini-batches: one of each is the step's.
- `PPOConfig(gradient_checkpointing=True)` is not applied: PPOTrainer runs its own loop and
  never calls `gradient_checkpointing_enable`. Under mixed precision (`bf16=True`, PPOConfig's
  default) the accelerator wraps the prepared wrapper only, in autocast and in
  `convert_outputs_to_fp32` (accelerate 1.15.0): the training forward's logits come back in
  fp32, and 16-bit hidden states as fp32 copies; generation and the rollout forwards (the
  unwrapped policy, the reference, the value and the reward models) run in the weights' dtype.

LLaMA-Factory's `stage: ppo` (llamafactory 0.9.3, `llamafactory/train/ppo/trainer.py`
`CustomPPOTrainer`, `train/trainer_utils.py` `create_ref_model`, `create_reward_model`) runs TRL
0.9's older PPOTrainer (it pins trl <= 0.9.6; read at 0.9.6: `trl/trainer/ppo_trainer.py`
`batched_forward_pass`, `trl/core.py` `logprobs_from_logits`, `trl/models/modeling_value_head.py`:
the logits upcast to fp32, copied by `torch.cat` and put through a whole `log_softmax`) with its
own models: the value is a head on the policy
(`AutoModelForCausalLMWithValueHead`, a hidden × 1 linear: no value backbone), the reference is
a copy in full fine-tuning and the adapter disabled under LoRA, and the reward is a separate
frozen model (`reward_model_type: full`), a second adapter on the policy (`lora`: no copy) or a
server (`api`: nothing on the GPU). It generates `per_device_train_batch_size` queries at a time
with `max_new_tokens` and does not keep the scores. This module sizes it with the same phases;
that path is not checked against a run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from llmmem.budget.activations import (
    dtypes_for,
    eager_mask_kinds,
    head_input_dtype,
    trainability_for,
)
from llmmem.budget.generation import kv_cache_term
from llmmem.budget.phases import estimate_budget
from llmmem.budget.preference_moments import (
    budget_from_phases,
    later_backward_moments,
    reference_copy_term,
    reward_spec,
)
from llmmem.budget.preference_setup import Reference, fp32_outputs
from llmmem.budget.result import Budget, Component, GpuTarget, Phase, PhaseBudget, Term
from llmmem.budget.setup import (
    AttnImpl,
    Method,
    Mode,
    Packing,
    Precision,
    SetupError,
    TrainingSetup,
)
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes, format_count

# the TRL release whose PPOTrainer this budget follows
TRL_RELEASE = "0.29.1"
REWARD_KINDS = ("model", "adapter", "api")
# "remote": a critic on GPUs of its own (OpenRLHF without --colocate_all_models)
VALUE_KINDS = ("model", "head", "remote")


@dataclass(frozen=True, slots=True, kw_only=True)
class PpoSetup:
    """PPOConfig's fields (TRL 0.29.1 defaults) and the models that change the memory."""

    value_model: ModelSpec | None = None  # None: the policy's size
    reward_model: ModelSpec | None = None  # None: the policy's size
    value: str = "model"  # "model": a separate value model (TRL); "head": on the policy
    reward: str = "model"  # "model", "adapter" (LLaMA-Factory lora) or "api"
    reference: Reference | None = None  # None: a copy in full fine-tuning, else the adapter
    query_length: int | None = None  # the longest query (None: the setup's sequence length)
    response_length: int = 53
    # None: per_device_train_batch_size (LLaMA-Factory generates a mini-batch at a time)
    local_rollout_forward_batch_size: int | None = 64
    num_ppo_epochs: int = 4
    num_mini_batches: int = 1
    keep_scores: bool = True  # TRL 0.29.1 keeps the rollout's generation scores
    # accelerate's mixed precision (bf16=True): the prepared wrapper's outputs come back in
    # fp32; None: llmmem.budget.preference_setup.fp32_outputs's default
    mixed_precision: bool | None = None
    # the queries of a batch differ in length and the collator left-pads them to the longest:
    # the attention mask `forward` builds (`query_responses != pad_token_id`) has zeros, so
    # transformers hands SDPA a mask, and SDPA a mask repeats K and V to every query head.
    # False: every query is as long and no generated token is the pad token (no mask)
    padded_queries: bool = True
    trainer: str = "trl"  # "trl", "llamafactory" or "openrlhf"
    # what the notes call the value and reward models (a hub id, "the policy's size")
    value_name: str = ""
    reward_name: str = ""
    # the reference copy as the trainer loads it (see
    # llmmem.budget.preference_setup.PreferenceSetup)
    reference_bytes: int | None = None
    reference_sharded: bool = False
    reference_offloaded: bool = False
    # OpenRLHF's vLLM engines: None (the policy generates), "colocate" (an engine on this GPU
    # holding `vllm_gpu_memory_utilization` of it, released outside generation with
    # `vllm_enable_sleep`) or "server" (engines on GPUs of their own)
    vllm: str | None = None
    vllm_gpu_memory_utilization: float = 0.9
    vllm_enable_sleep_mode: bool = False

    def __post_init__(self) -> None:
        for name in (
            "query_length",
            "response_length",
            "local_rollout_forward_batch_size",
            "num_ppo_epochs",
            "num_mini_batches",
        ):
            value = getattr(self, name)
            if value is None and name in ("query_length", "local_rollout_forward_batch_size"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SetupError(f"{name} must be a whole number of at least 1, got {value!r}")
        if self.reward not in REWARD_KINDS:
            raise SetupError(f"the reward model is model, adapter or api, got {self.reward!r}")
        if self.value not in VALUE_KINDS:
            raise SetupError(f"the value model is model or head, got {self.value!r}")
        if self.reference is not None:
            try:
                object.__setattr__(self, "reference", Reference(self.reference))
            except ValueError as err:
                raise SetupError(str(err)) from None
            if self.reference is Reference.PRECOMPUTED:
                raise SetupError(
                    "PPO's reference is a copy, the policy with its adapter disabled, or none "
                    "on this GPU (a model on GPUs of its own)"
                )
        if self.vllm is not None and self.vllm not in ("colocate", "server"):
            raise SetupError(f"vllm is colocate or server, got {self.vllm!r}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise SetupError(
                "vllm_gpu_memory_utilization is a fraction of the GPU's memory, above 0 and at "
                f"most 1, got {self.vllm_gpu_memory_utilization}"
            )

    def resolved(self, setup: TrainingSetup) -> PpoSetup:
        """The lengths and the rollout chunk the setup leaves open, filled in from it."""
        return replace(
            self,
            query_length=self.query_length or setup.seq,
            local_rollout_forward_batch_size=self.local_rollout_forward_batch_size or setup.batch,
        )

    @property
    def seq(self) -> int:
        return (self.query_length or 0) + self.response_length


def local_batch(setup: TrainingSetup) -> int:
    """`local_batch_size`: the queries one device rolls out per update."""
    return setup.batch * setup.grad_accum


def check_ppo(ppo: PpoSetup, setup: TrainingSetup) -> None:
    """PPOTrainer.__init__'s checks that concern the sizes."""
    if setup.mode is Mode.GENERATE:
        raise SetupError("PPO is a training objective: drop --mode generate")
    if local_batch(setup) % ppo.num_mini_batches:
        raise SetupError(
            f"local_batch_size ({setup.batch} × {setup.grad_accum} = {local_batch(setup)}) must "
            f"be a multiple of num_mini_batches ({ppo.num_mini_batches})"
        )


def reference_of(ppo: PpoSetup, setup: TrainingSetup) -> Reference:
    if ppo.reference is Reference.ADAPTER and setup.method is Method.FULL:
        raise SetupError(
            "the reference can be the adapter-disabled policy only with LoRA/QLoRA: full "
            "fine-tuning keeps a reference copy"
        )
    if ppo.reference is not None:
        return ppo.reference
    return Reference.COPY if setup.method is Method.FULL else Reference.ADAPTER


def _rollout_bytes(setup: TrainingSetup) -> int:
    """The dtype the rollout computes in: the weights' under mixed precision (the unwrapped
    models run outside autocast), the compute dtype otherwise."""
    dt = dtypes_for(setup)
    if setup.precision.is_autocast and setup.quant is None:
        return setup.precision.weight_bytes
    return dt.compute


def _rollout_setup(setup: TrainingSetup) -> TrainingSetup:
    """The setup the rollout's models compute under: outside autocast."""
    if setup.precision is Precision.BF16_AUTOCAST and setup.quant is None:
        return replace(setup, precision=Precision.BF16_TRUE)
    if setup.precision.is_autocast and setup.quant is None:
        return replace(
            setup,
            precision=Precision.FP32 if setup.precision.weight_bytes == 4 else setup.precision,
        )
    return setup


def _hidden_states(spec: ModelSpec, rows: int, seq: int, size: int) -> int:
    """`output_hidden_states=True`: the embeddings' output and every block's, the last one
    normalised: blocks + 1 tensors of rows × seq × hidden."""
    blocks = sum(g.count for g in spec.blocks if g.name != "encoder")
    return (blocks + 1) * rows * seq * spec.hidden_size * size


def _eager_attention(spec: ModelSpec, setup: TrainingSetup, rows: int, seq: int, size: int) -> int:
    """One layer's eager attention without gradient (0 under SDPA): the scores in `size`, their
    fp32 copy (16-bit) and fp32 softmax (`softmax(..., dtype=float32)`), the masks transformers
    builds once per forward and per kind of layer (Gemma-2: full and sliding), and grouped K/V
    heads repeated to every query head (`repeat_kv`)."""
    if setup.attn is not AttnImpl.EAGER and spec.supports_sdpa:
        return 0
    kinds = eager_mask_kinds(spec)
    square = rows * seq * seq
    scores = (size + (4 if size != 4 else 0) + 4) * spec.num_attention_heads * square
    grouped = spec.num_kv_heads < spec.num_attention_heads
    repeated = 2 * size * rows * seq * spec.q_dim if grouped else 0
    return scores + kinds * size * square + repeated


def _block(spec: ModelSpec, rows: int, seq: int, size: int) -> int:
    """One block's intermediates without gradient."""
    return size * rows * seq * (3 * spec.intermediate_size + 4 * spec.hidden_size)


@dataclass(frozen=True)
class _Models:
    policy: ModelSpec
    value: ModelSpec | None  # None: a value head on the policy
    reward: ModelSpec | None  # None: no separate reward model


def _models(spec: ModelSpec, ppo: PpoSetup) -> _Models:
    value = reward_spec(ppo.value_model or spec, 1) if ppo.value == "model" else None
    reward = reward_spec(ppo.reward_model or spec, 1) if ppo.reward == "model" else None
    return _Models(spec, value, reward)


def unseen_by_a_counter(
    budget: Budget, spec: ModelSpec, setup: TrainingSetup, ppo: PpoSetup
) -> dict[str, int]:
    """Of each phase's bytes, what aten allocates inside a kernel and a dispatch-level storage
    counter does not see: fp32 logsumexp's row temporary (response_length × V), where the
    rollout's peak is the reference's log-probabilities."""
    rollout = budget.phase(Phase.REFERENCE_FORWARD)
    if _rollout_bytes(setup) != 4 or "logits" not in rollout.moment:
        return {}
    return {Phase.REFERENCE_FORWARD.value: 4 * ppo.response_length * spec.vocab_size}


def estimate_ppo_budget(
    spec: ModelSpec,
    setup: TrainingSetup,
    ppo: PpoSetup,
    gpu: GpuTarget | None = None,
) -> Budget:
    """One update of TRL 0.29.1's PPOTrainer: generation, the rollout forwards without
    gradient, the policy's and the value model's forward and backward on a micro-batch, the
    step. `setup.batch` is `per_device_train_batch_size`; its `seq` is replaced by query +
    response."""
    ppo = ppo.resolved(setup)
    check_ppo(ppo, setup)
    reference = reference_of(ppo, setup)
    models = _models(spec, ppo)
    q, r_len = ppo.query_length or setup.seq, ppo.response_length
    seq = ppo.seq
    # TRL's PPOTrainer runs its own loop: `gradient_checkpointing=True` is never applied. The
    # unused KV cache TRL's `forward` builds (use_cache left at the config's default) is
    # counted here, not by the SFT step
    ckpt = setup.grad_ckpt and ppo.trainer != "trl"
    policy_setup = replace(setup, seq=seq, use_cache=False, grad_ckpt=ckpt)
    if ppo.padded_queries and setup.packing is None:
        # padded queries: SDPA gets the padding mask and K/V repeated to every head, as it does
        # the block-diagonal mask of packed rows (flash-attention unpads instead: no mask)
        policy_setup = replace(policy_setup, packing=Packing.ROWS)
    sft = estimate_budget(spec, policy_setup, gpu)
    forward = sft.phase(Phase.FORWARD)
    step = sft.phase(Phase.OPTIMIZER_STEP)
    value_sft = None
    if models.value is not None:
        value_setup = replace(policy_setup, method=Method.FULL, lora=None, quant=None)
        value_sft = estimate_budget(models.value, value_setup, gpu)

    e = dtypes_for(policy_setup).compute
    residual = dtypes_for(policy_setup).residual
    e_roll = _rollout_bytes(setup)
    vocab = spec.vocab_size
    rows_local = local_batch(setup)
    chunk = min(ppo.local_rollout_forward_batch_size or setup.batch, rows_local)
    chunks = ceil(rows_local / chunk)
    last_chunk = rows_local - (chunks - 1) * chunk
    padded_rows = chunks * chunk
    micro = setup.batch
    first = setup.first_step

    # -- what every phase holds
    held: dict[Component, Term] = {}
    held[Component.WEIGHTS] = _weights_term(forward, value_sft, models, ppo)
    frozen = _frozen_term(spec, setup, models, reference, ppo)
    if frozen.bytes:
        held[Component.REFERENCE_MODEL] = frozen
    engine = _vllm_engine(ppo, gpu)
    # the optimizer states as the forward finds them (none before the first step)
    states = _policy_and_value(forward, value_sft, Phase.FORWARD, Component.OPTIMIZER_STATES)
    step_states = _policy_and_value(
        step, value_sft, Phase.OPTIMIZER_STEP, Component.OPTIMIZER_STATES
    )
    if states.bytes:
        held[Component.OPTIMIZER_STATES] = states
    score_row = r_len * vocab * 4
    kept_bytes = padded_rows * score_row if ppo.keep_scores else 0
    kept = Term(
        bytes=kept_bytes,
        formula=f"4 B × {padded_rows} rows × {r_len} × {format_count(vocab)} (the rollout's "
        "fp32 generation scores, kept through the update)",
    )

    # -- 1. generation
    if ppo.vllm is None:
        phases = [
            _generation_phase(
                spec,
                policy_setup,
                ppo,
                held,
                kept,
                first,
                rows_local,
                chunk,
                last_chunk,
                padded_rows,
            )
        ]
    else:
        phases = [
            PhaseBudget(
                phase=Phase.GENERATE,
                moment="the colocated vLLM engines generate"
                if engine is not None
                else "the vLLM engines on GPUs of their own generate; weights synced to them",
                components={**held, Component.VLLM_ENGINE: engine} if engine else dict(held),
            )
        ]
    if engine is not None and not ppo.vllm_enable_sleep_mode:
        held[Component.VLLM_ENGINE] = engine  # reserved through the whole update

    # -- 2. the rollout forwards, one chunk of `chunk` rows
    rollout = dict(held)
    if kept.bytes:
        rollout[Component.LOGITS] = kept
    candidates: list[tuple[int, str, str]] = []
    ref_hidden = _hidden_states(spec, chunk, seq, e_roll if residual != 4 else 4)
    ref_logits = chunk * seq * vocab * e_roll
    ref_cache = kv_cache_term(
        spec, replace(_rollout_setup(setup), batch=chunk, seq=seq, new_tokens=0)
    )
    row_temp = r_len * vocab * (4 if e_roll == 4 else e_roll)
    row_text = "one row's " + ("fp32 logsumexp temporary" if e_roll == 4 else "log-softmax")
    if ppo.trainer == "llamafactory":
        # TRL 0.9.6's batched_forward_pass: the logits upcast to fp32 beside the model's, and
        # a whole fp32 log_softmax
        row_temp = 2 * 4 * chunk * seq * vocab
        row_text = "2 × 4 B × the logits (TRL 0.9: their fp32 upcast and whole log-softmax)"
    elif ppo.trainer == "openrlhf":
        # OpenRLHF 0.11.0 models/actor.py: `output["logits"].to(torch.float32)`, then a
        # chunked logsumexp or flash-attn's cross-entropy over them
        row_temp = 4 * chunk * seq * vocab
        row_text = "4 B × the logits (OpenRLHF's actor: their fp32 copy)"
    # OpenRLHF with the reference on GPUs of its own: the actor's own (old) log-probabilities
    whose = "the actor's" if reference is Reference.NONE else "the reference"
    candidates.append(
        (
            ref_hidden + ref_cache.bytes + ref_logits + row_temp,
            f"{whose} forward's logits: its hidden states, the whole sequence's logits "
            "and their log-softmax",
            f"({_blocks(spec)} + 1) × {chunk}×{seq}×{spec.hidden_size} hidden states + "
            f"{e_roll} B × {chunk}×{seq}×{format_count(vocab)} logits + its unused KV cache ("
            + ref_cache.formula
            + ") + "
            + row_text,
        )
    )
    if spec.final_logit_softcapping is not None:
        # Gemma-2's soft-capped head (`logits / cap`, tanh, `* cap`): each step a new
        # whole-sequence tensor beside the one before; the first, the head's output beside its
        # division by the cap, can outweigh the log-softmax's moment
        candidates.append(
            (
                ref_hidden + ref_cache.bytes + 2 * ref_logits,
                f"{whose} forward's soft-capped head: its hidden states and two "
                "whole-sequence copies",
                f"({_blocks(spec)} + 1) × {chunk}×{seq}×{spec.hidden_size} hidden states + "
                f"2 × {e_roll} B × {chunk}×{seq}×{format_count(vocab)} (the head's output and "
                f"its division by the cap) + its unused KV cache ({ref_cache.formula})",
            )
        )
    ref_eager = _eager_attention(spec, setup, chunk, seq, e_roll)
    if ref_eager:
        candidates.append(
            (
                ref_hidden + ref_cache.bytes + ref_eager,
                f"{whose} forward's eager attention",
                f"({_blocks(spec)} + 1) × {chunk}×{seq}×{spec.hidden_size} hidden states + its "
                f"KV cache ({ref_cache.formula}) + one layer's scores, their fp32 softmax, "
                "the masks and K/V repeated to every head",
            )
        )
    for name, model in (("value", models.value), ("reward", models.reward)):
        if model is None:
            continue
        size = e_roll if residual != 4 else 4
        hidden = _hidden_states(model, chunk, seq, size)
        block = _block(model, chunk, seq, e_roll)
        eager = _eager_attention(model, setup, chunk, seq, e_roll)
        candidates.append(
            (
                hidden + max(block, eager),
                f"the {name} model's backbone",
                f"({_blocks(model)} + 1) hidden states of {chunk}×{seq}×{model.hidden_size} + "
                + (
                    "one layer's eager attention (scores, fp32 softmax, masks, K/V repeated)"
                    if eager > block
                    else "one block's intermediates"
                ),
            )
        )
    best = max(candidates, key=lambda c: c[0])
    rollout[Component.ACTIVATIONS] = Term(bytes=best[0], formula=best[2])
    phases.append(
        PhaseBudget(
            phase=Phase.REFERENCE_FORWARD,
            moment=f"rollout, {chunk} queries at a time without gradient: {best[1]}",
            components=rollout,
        )
    )

    # -- 3. training: the wrapper's forward on one micro-batch
    train = dict(held)
    copies = _policy_and_value(forward, value_sft, Phase.FORWARD, Component.WEIGHT_COPIES)
    if copies.bytes:
        train[Component.WEIGHT_COPIES] = copies
    policy_acts = forward.components.get(Component.ACTIVATIONS, Term(0, ""))
    value_acts = (
        value_sft.phase(Phase.FORWARD).components.get(Component.ACTIVATIONS, Term(0, ""))
        if value_sft
        else Term(0, "")
    )
    score_input = _score_input(models.value, policy_setup, micro, seq)
    if score_input.bytes:
        value_acts = Term(
            bytes=value_acts.bytes + score_input.bytes,
            formula=f"{value_acts.formula} + {score_input.formula}",
        )
    train[Component.ACTIVATIONS] = _sum_terms(
        policy_acts, value_acts, "the policy's", "the value backbone's"
    )
    # accelerate's mixed precision converts the prepared wrapper's outputs to fp32: the
    # policy's logits, and its 16-bit hidden states (`output_hidden_states=True`) as copies
    # beside the ones autograd keeps; the rollout's unwrapped models are not converted
    out32 = (
        ppo.trainer == "trl" and fp32_outputs(ppo.mixed_precision, policy_setup)
    ) or ppo.trainer == "openrlhf"
    hidden_copies = (
        _hidden_states(spec, micro, seq, 4)
        if out32 and residual != 4 and ppo.trainer == "trl"
        else 0
    )
    if hidden_copies:
        acts = train[Component.ACTIVATIONS]
        train[Component.ACTIVATIONS] = Term(
            bytes=acts.bytes + hidden_copies,
            formula=acts.formula
            + f" + ({_blocks(spec)} + 1) × {micro}×{seq}×{spec.hidden_size} × 4 B (the "
            "output's hidden states, converted to fp32)",
        )
    # `output_hidden_states=True` with a 16-bit residual stream: an RMS norm saves its fp32 copy
    # (`hidden_states.to(torch.float32)`), not its input, so the embeddings' output and every
    # block's output but the last (the tuple's last entry is the final norm's, which the head
    # keeps) are held by the policy's output alone, until accelerate's conversion ends (mixed
    # precision) or the output is deleted
    unsaved = (
        _blocks(spec) * micro * seq * spec.hidden_size * residual
        if residual != 4 and spec.norm != "layernorm" and ppo.trainer == "trl"
        else 0
    )
    if unsaved:
        acts = train[Component.ACTIVATIONS]
        train[Component.ACTIVATIONS] = Term(
            bytes=acts.bytes + unsaved,
            formula=acts.formula
            + f" + {_blocks(spec)} × {micro}×{seq}×{spec.hidden_size} × {residual} B (the "
            "output's hidden states autograd does not keep)",
        )
    compute = e
    # the model's 16-bit logits, alive beside their fp32 copy while the output is converted
    converted = micro * seq * vocab * compute if out32 and compute != 4 else 0
    if out32:
        e = 4
    if ppo.trainer in ("trl", "openrlhf"):
        whole = micro * seq * vocab * e
        response = micro * r_len * vocab * e
        lp = whole + (response if e != 4 else 0)
        lp_text = f"{e} B × {micro}×{seq}×{format_count(vocab)} (the policy's logits)" + (
            f" + {e} B × {micro}×{r_len}×V (every row's log-softmax, kept)" if e != 4 else ""
        )
        if converted:
            # the conversion builds a new output: the model's 16-bit logits stay alive, held
            # by the old one, until every tensor in it is converted; the fp32 path keeps
            # nothing logits-sized after that (the slice is a view, divided in place)
            lp += converted
            lp_text = (
                f"4 B + {compute} B × {micro}×{seq}×{format_count(vocab)} (the policy's "
                "logits converted to fp32, beside the 16-bit ones until the conversion ends)"
            )
    else:
        # TRL 0.9.6 (LLaMA-Factory 0.9.3 pins trl <= 0.9.6): the value-head wrapper upcasts
        # the logits to fp32, batched_forward_pass copies them (torch.cat) and
        # logprobs_from_logits keeps a whole log_softmax; read, not measured
        e = 4
        whole = micro * seq * vocab * 4
        response = micro * r_len * vocab * 4
        lp = 3 * whole
        lp_text = (
            f"3 × 4 B × {micro}×{seq}×{format_count(vocab)} (TRL 0.9: the logits upcast to "
            "fp32, their torch.cat copy and the whole log-softmax)"
        )
    capped = 0
    if spec.final_logit_softcapping is not None:
        # Gemma-2's soft-capped logits: the policy's tanh output (compute dtype, the whole
        # sequence) is kept for the capping's backward, which runs after the log-probabilities'
        capped = micro * seq * vocab * compute
        lp += capped
        lp_text += f" + {compute} B × {micro}×{seq}×V (the soft-capping's tanh, kept)"
    logits = Term(
        bytes=lp + kept.bytes,
        formula=lp_text
        + (f" + {format_count(kept.bytes)} B of kept rollout scores" if kept.bytes else ""),
    )
    train[Component.LOGITS] = logits
    caches = _training_caches(spec, policy_setup, micro, seq)
    if caches.bytes:
        train[Component.KV_CACHE] = caches
    policy_forward = PhaseBudget(
        phase=Phase.FORWARD,
        moment="end of the policy and value forward: log-probabilities and values taken",
        components=train,
    )
    head = _head_moment(
        spec, policy_setup, models, train, micro, seq, compute, kept, caches, hidden_copies
    )
    if head is not None and head.allocated_bytes > policy_forward.allocated_bytes:
        policy_forward = head
    phases.append(policy_forward)

    grads = _policy_and_value(step, value_sft, Phase.OPTIMIZER_STEP, Component.GRADIENTS)
    tuple_bytes = hidden_copies or _hidden_states(spec, micro, seq, residual)
    # with several micro-batches a mini-batch, the one before is alive through the next one's
    # forward (its output is replaced only as that forward returns, its softmax only after
    # the next step); with gradient accumulation the gradients live between steps
    per_mini = ceil(rows_local / ppo.num_mini_batches / micro)
    leftover = Term(
        bytes=whole + response + caches.bytes + tuple_bytes if per_mini > 1 else 0,
        formula="the micro-batch before's output (logits, KV cache, hidden states) and its softmax",
    )
    softmax = Term(
        bytes=response if per_mini > 1 else 0, formula="the micro-batch before's softmax"
    )

    def before(moment: PhaseBudget, extra: Term, accumulated: Term | None) -> PhaseBudget:
        parts = dict(moment.components)
        if extra.bytes:
            logits_term = parts.get(Component.LOGITS, Term(0, ""))
            parts[Component.LOGITS] = Term(
                bytes=logits_term.bytes + extra.bytes,
                formula=logits_term.formula + " + " + extra.formula,
            )
        if accumulated is not None and accumulated.bytes:
            parts[Component.GRADIENTS] = accumulated
        return replace(moment, components=parts)

    accumulated = (
        Term(bytes=grads.bytes, formula=grads.formula + ", accumulated over the micro-batches")
        if setup.grad_accum > 1
        else None
    )
    phases[-1] = before(policy_forward, leftover, accumulated)

    # backward: the log-probabilities' gradient (measured on CPU: two logits-sized buffers,
    # the gradient of the whole output and of its response slice, and two response-sized
    # ones, the gather's scattered gradient and the per-row logsumexp gradients stacked; a
    # 16-bit row's saved log-softmax is freed as its gradient is made)
    backward_parts = dict(train)
    if converted:
        # the 16-bit logits died as the conversion ended
        backward_parts[Component.LOGITS] = Term(
            bytes=logits.bytes - converted,
            formula=logits.formula + f" − the 16-bit logits ({format_count(converted)} B)",
        )
    if unsaved and hidden_copies:
        # and the 16-bit hidden states with them: the converted output holds fp32 copies
        acts = train[Component.ACTIVATIONS]
        backward_parts[Component.ACTIVATIONS] = Term(
            bytes=acts.bytes - unsaved, formula=acts.formula + " − the 16-bit hidden states"
        )
    grad = 2 * whole + (2 * response if e == 4 else response)
    backward_parts[Component.TEMPORARIES] = Term(
        bytes=grad,
        formula=f"2 × {e} B × {micro}×{seq}×V (the logits' gradient, and its slice's) + "
        + ("2" if e == 4 else "1")
        + f" × {e} B × {micro}×{r_len}×V (the log-probabilities' gradients)",
    )
    logprob_backward = PhaseBudget(
        phase=Phase.BACKWARD,
        moment="backward of the log-probabilities",
        components=backward_parts,
    )
    value_kept = (
        value_sft.phase(Phase.OPTIMIZER_STEP).components.get(Component.GRADIENTS)
        if value_sft is not None and setup.grad_accum > 1
        else None
    )
    after_head = dict(train)
    if capped:
        # past the head's backward the tanh is freed
        after_head[Component.LOGITS] = Term(
            bytes=logits.bytes - capped, formula=logits.formula + " − the tanh, freed"
        )
    later = _later_moments(
        spec,
        policy_setup,
        forward,
        step,
        value_sft,
        models,
        held,
        after_head,
        caches,
        value_kept,
        score_input,
    )
    moments = [before(logprob_backward, softmax, accumulated)]
    moments += [before(m, softmax, None) for m in later]
    phases.append(max(moments, key=lambda p: p.allocated_bytes))

    # after backward the micro-batch's output is still alive: its logits, its KV cache and
    # the hidden states `output_hidden_states` holds (the saved tensors are freed)
    kept_hidden = Term(
        bytes=tuple_bytes,
        formula=f"({_blocks(spec)} + 1) × {micro}×{seq}×{spec.hidden_size} × "
        f"{4 if hidden_copies else residual} B (the policy's hidden states, kept by its output)",
    )
    step_parts = dict(held)
    step_parts[Component.OPTIMIZER_STATES] = step_states
    step_parts[Component.GRADIENTS] = grads
    step_parts[Component.TEMPORARIES] = _policy_and_value(
        step, value_sft, Phase.OPTIMIZER_STEP, Component.TEMPORARIES
    )
    step_parts[Component.LOGITS] = Term(
        bytes=whole + kept.bytes,
        formula=f"{e} B × {micro}×{seq}×{format_count(vocab)} (the micro-batch's logits, still "
        "alive)" + (" + the kept rollout scores" if kept.bytes else ""),
    )
    step_parts[Component.ACTIVATIONS] = kept_hidden
    if caches.bytes:
        step_parts[Component.KV_CACHE] = caches
    step_phase = PhaseBudget(
        phase=Phase.OPTIMIZER_STEP, moment="inside the optimizer step", components=step_parts
    )
    # then the entropy, without gradient: softmax(logits) and its product with the logits.
    # The micro-batch before's softmax (`prob_dist`) dies as the new one is assigned: while
    # the new one is made the two are alive, as the new one and the product are after. Before
    # the last micro-batch of an accumulation the step is skipped (`accelerator.accumulate`):
    # the accumulated gradients are alive through the entropy
    entropy_parts: dict[Component, Term] = {
        k: v for k, v in step_parts.items() if k not in (Component.GRADIENTS, Component.TEMPORARIES)
    }
    if accumulated is not None:
        entropy_parts[Component.GRADIENTS] = Term(
            bytes=grads.bytes,
            formula=grads.formula + ", accumulated (the step comes at the last micro-batch)",
        )
    entropy_parts[Component.TEMPORARIES] = Term(
        bytes=2 * response,
        formula=f"2 × {e} B × {micro}×{r_len}×V (softmax of the logits and its product with "
        "them; or the micro-batch before's softmax and the new one)",
    )
    entropy_phase = PhaseBudget(
        phase=Phase.OPTIMIZER_STEP,
        moment="after the step: the entropy of the micro-batch's logits"
        if accumulated is None
        else "the entropy of a micro-batch's logits, its gradients accumulated",
        components=entropy_parts,
    )
    phases.append(
        max(
            (before(step_phase, softmax, None), entropy_phase),
            key=lambda p: p.allocated_bytes,
        )
    )

    notes = list(sft.notes)
    trainer = {
        "trl": f"TRL {TRL_RELEASE}",
        "llamafactory": "LLaMA-Factory stage: ppo",
        "openrlhf": "OpenRLHF train_ppo_ray",
    }.get(ppo.trainer, ppo.trainer)
    notes.append(
        f"ppo ({trainer}): {rows_local} queries per device per update, generated {chunk} at a "
        f"time up to {r_len} tokens after queries of {q}; {micro} rows of {seq} tokens per "
        "micro-batch through the policy" + (" and the value model" if models.value else "")
    )
    if out32 and ppo.trainer == "trl":
        notes.append(
            "mixed precision: accelerate returns the training forward's logits in fp32 "
            "(convert_outputs_to_fp32), 4 B per logit"
        )
    notes.append(
        "ppo: four models: " + "; ".join(_model_lines(spec, setup, ppo, models, reference))
    )
    if setup.grad_ckpt and not ckpt:
        notes.append(
            "gradient_checkpointing: PPOTrainer (TRL 0.29.1) runs its own loop and never enables "
            "it; the step is sized without"
        )
    if ppo.keep_scores:
        notes.append(
            "the rollout keeps every generated token's fp32 scores over the vocabulary "
            f"({format_count(kept.bytes)} B) through the update (TRL 0.29.1 `logitss`)"
        )
    if setup.distributed.zero_stage == 3 or setup.distributed.fsdp is not None:
        notes.append(
            "ZeRO-3/FSDP: generation gathers the whole policy (ds3_gather_for_generation) and "
            + (
                "the reward model is counted whole on each device; the gather is not counted"
                if ppo.reference_sharded
                else "the frozen models are counted whole on each device; neither is sharded here"
            )
        )
    if ppo.trainer == "openrlhf":
        notes.append(
            "OpenRLHF's PPO is sized with TRL 0.29.1's phases on the actor's GPU, with the "
            "models OpenRLHF puts there (critic and reward only with colocate_all_models, the "
            "reference with colocate_all_models or colocate_actor_ref) and its actor's fp32 "
            "logits (openrlhf 0.11.0 models/actor.py); not checked against a run"
        )
    if ppo.trainer == "llamafactory":
        notes.append(
            "LLaMA-Factory's PPO step is sized with TRL 0.29.1's phases, its own models and "
            "TRL 0.9's fp32 logits as read in its code; not checked against a run"
        )
    budget = budget_from_phases(sft, phases, notes, spec, policy_setup, reference)
    if setup.first_step or budget.first_step_allocated_peak_bytes is None:
        return budget
    # the first update: no optimizer states, no scores kept from an update before
    first_budget = estimate_ppo_budget(spec, replace(setup, first_step=True), ppo, gpu)
    return replace(budget, first_step_allocated_peak_bytes=first_budget.allocated_peak_bytes)


def _blocks(spec: ModelSpec) -> int:
    return sum(g.count for g in spec.blocks if g.name != "encoder")


def _policy_and_value(
    policy: PhaseBudget, value_sft: Budget | None, phase: Phase, component: Component
) -> Term:
    """`component` of the policy's phase and of the value model's same phase, summed."""
    value = value_sft.phase(phase).components.get(component) if value_sft else None
    return _sum_terms(policy.components.get(component), value, "the policy's", "the value model's")


def _sum_terms(a: Term | None, b: Term | None, what_a: str, what_b: str) -> Term:
    parts = [(t, w) for t, w in ((a, what_a), (b, what_b)) if t is not None and t.bytes]
    return Term(
        bytes=sum(t.bytes for t, _ in parts),
        formula=" + ".join(f"{t.formula} ({w})" for t, w in parts) or "none",
    )


def _weights_term(
    forward: PhaseBudget, value_sft: Budget | None, models: _Models, ppo: PpoSetup
) -> Term:
    policy = forward.components[Component.WEIGHTS]
    if value_sft is None:
        return Term(
            bytes=policy.bytes,
            formula=policy.formula
            + " (the policy"
            + (", its value head" if ppo.value == "head" else "")
            + ")",
        )
    value = value_sft.phase(Phase.FORWARD).components[Component.WEIGHTS]
    return _sum_terms(policy, value, "the policy", "the value model, trained in full")


def _frozen_term(
    spec: ModelSpec, setup: TrainingSetup, models: _Models, reference: Reference, ppo: PpoSetup
) -> Term:
    size = setup.precision.weight_bytes
    parts = []
    if reference is Reference.COPY:
        copy = reference_copy_term(
            spec, setup, ppo.reference_bytes, ppo.reference_sharded, ppo.reference_offloaded
        )
        if copy.bytes:
            parts.append((copy.bytes, copy.formula))
    if models.reward is not None:
        parts.append(
            (
                models.reward.total_params * size,
                f"{format_count(models.reward.total_params)} params × {size} B (the reward model)",
            )
        )
    return Term(bytes=sum(b for b, _ in parts), formula=" + ".join(f for _, f in parts) or "none")


def _vllm_engine(ppo: PpoSetup, gpu: GpuTarget | None) -> Term | None:
    """The colocated vLLM engines' reservation on this GPU (None: no engine here)."""
    if ppo.vllm != "colocate":
        return None
    if gpu is None:
        raise SetupError(
            "colocated vLLM engines reserve a fraction of the GPU's memory "
            "(vllm_gpu_memory_utilization): name the GPU (--gpu NAME or a capacity such as "
            "80GiB)"
        )
    return Term(
        bytes=int(ppo.vllm_gpu_memory_utilization * gpu.capacity_bytes),
        formula=f"vllm_gpu_memory_utilization {ppo.vllm_gpu_memory_utilization:g} × "
        f"{format_bytes(gpu.capacity_bytes)} ({gpu.name}): the colocated engines' weights and "
        "KV cache",
    )


def _generation_phase(
    spec: ModelSpec,
    setup: TrainingSetup,
    ppo: PpoSetup,
    held: dict[Component, Term],
    kept: Term,
    first: bool,
    rows_local: int,
    chunk: int,
    last_chunk: int,
    padded_rows: int,
) -> PhaseBudget:
    """The larger of the last chunk's last generated token and the padding of the chunks'
    scores into one tensor."""
    q, r_len = ppo.query_length or setup.seq, ppo.response_length
    vocab = spec.vocab_size
    score_row = r_len * vocab * 4
    old = 0 if first else kept.bytes
    parts = dict(held)
    if not ppo.keep_scores:
        old = 0
    # the padding: the chunks' stacked scores, the padded copy, the update before's
    pad = (rows_local + padded_rows) * score_row if ppo.keep_scores else 0
    # the last chunk's scores stacked while `generate`'s output (its scores and its KV cache)
    # is alive; without kept scores, its last generated token
    blocks = _blocks(spec)
    cached = max(q + r_len - 1, 1)
    kv = kv_cache_term(
        spec, replace(_rollout_setup(setup), batch=last_chunk, seq=cached, new_tokens=0)
    )
    ids = 8 * last_chunk * (q + r_len) * 2
    before = (rows_local - last_chunk) * score_row if ppo.keep_scores else 0
    if ppo.keep_scores:
        own = 2 * last_chunk * score_row
        own_text = (
            f"2 × 4 B × {last_chunk} rows × {r_len} × {format_count(vocab)} (the chunk's scores "
            "and their stacked copy)"
        )
    else:
        one_layer = kv.bytes // max(2 * blocks, 1) if blocks else 0
        own = one_layer + 4 * last_chunk * vocab * 3
        own_text = "one layer's keys copied as the cache grows + 3 × 4 B × rows × V (the last "
        "position's fp32 logits, processed scores and sampling probabilities)"
    last = kv.bytes + ids + own + before
    # the last chunk's prefill: the queries' cache and one block's intermediates
    rollout = _rollout_setup(setup)
    prefill_cache = kv_cache_term(spec, replace(rollout, batch=last_chunk, seq=q, new_tokens=0))
    block = _block(spec, last_chunk, q, dtypes_for(rollout).compute)
    prefill = prefill_cache.bytes + block + before
    if prefill > max(pad, last):
        parts[Component.KV_CACHE] = Term(
            bytes=prefill_cache.bytes, formula=f"the queries' cache ({q} tokens)"
        )
        parts[Component.ACTIVATIONS] = Term(
            bytes=block, formula=f"N = {last_chunk}×{q}: one block's intermediates at the prefill"
        )
        if before + old:
            parts[Component.LOGITS] = Term(
                bytes=before + old,
                formula="the chunks before's scores" + (" and the update before's" if old else ""),
            )
        moment = f"prefill of the last chunk ({last_chunk} queries)"
    elif pad >= last:
        parts[Component.LOGITS] = Term(
            bytes=pad + old,
            formula=f"4 B × ({rows_local} + {padded_rows}) rows × {r_len} × "
            f"{format_count(vocab)} (the chunks' scores and their padded copy)"
            + (" + the update before's, still kept" if old else ""),
        )
        moment = "the generation scores padded into one tensor"
    else:
        parts[Component.KV_CACHE] = kv
        parts[Component.LOGITS] = Term(
            bytes=own + before + old,
            formula=own_text
            + (
                f" + 4 B × {rows_local - last_chunk} rows × {r_len} × V (the chunks before's)"
                if before
                else ""
            )
            + (" + the update before's scores, still kept" if old else ""),
        )
        parts[Component.TEMPORARIES] = Term(bytes=ids, formula="the token ids and mask (int64)")
        moment = (
            f"the last chunk's ({last_chunk} queries) scores stacked, its KV cache alive"
            if ppo.keep_scores
            else f"last generated token of the last chunk ({last_chunk} queries)"
        )
    return PhaseBudget(phase=Phase.GENERATE, moment=moment, components=parts)


def _later_moments(
    spec: ModelSpec,
    setup: TrainingSetup,
    forward: PhaseBudget,
    step: PhaseBudget,
    value_sft: Budget | None,
    models: _Models,
    held: dict[Component, Term],
    train: dict[Component, Term],
    caches: Term,
    value_kept: Term | None,
    score_input: Term,
) -> list[PhaseBudget]:
    """The backward moments after the log-probabilities': the policy's (its first block, the
    end of its backward) with the value backbone's saved tensors still waiting, then the value
    model's with the policy's gradients complete. Autograd runs the policy's nodes first: they
    were made after the value backbone's. The micro-batch's output (its logits, KV cache and
    hidden states) stays alive throughout."""
    kept = train.get(Component.LOGITS, Term(0, ""))
    output = Term(
        bytes=kept.bytes + caches.bytes,
        formula=kept.formula + " + the policy's KV cache (the micro-batch's output)",
    )
    value_acts = Term(0, "")
    value_moments: list[PhaseBudget] = []
    if value_sft is not None and models.value is not None:
        value_forward = value_sft.phase(Phase.FORWARD)
        value_acts = value_forward.components.get(Component.ACTIVATIONS, Term(0, ""))
        value_acts = Term(bytes=value_acts.bytes + score_input.bytes, formula=value_acts.formula)
        value_setup = replace(setup, method=Method.FULL, lora=None, quant=None)
        value_moments = later_backward_moments(
            models.value, value_setup, value_forward, value_sft.phase(Phase.OPTIMIZER_STEP)
        )
    policy_grads = step.components.get(Component.GRADIENTS, Term(0, ""))
    out = []
    for moment in later_backward_moments(spec, setup, forward, step):
        parts = dict(held)
        for comp in (Component.GRADIENTS, Component.TEMPORARIES):
            if comp in moment.components:
                parts[comp] = moment.components[comp]
        if value_kept is not None and value_kept.bytes:
            own = parts.get(Component.GRADIENTS, Term(0, ""))
            parts[Component.GRADIENTS] = Term(
                bytes=own.bytes + value_kept.bytes,
                formula=f"{own.formula} (the policy's) + {value_kept.formula} (the value "
                "model's, accumulated)",
            )
        acts = moment.components.get(Component.ACTIVATIONS, Term(0, ""))
        parts[Component.ACTIVATIONS] = Term(
            bytes=acts.bytes + value_acts.bytes,
            formula=(acts.formula + " + " if acts.bytes else "")
            + "the value backbone's saved tensors (its backward comes after)",
        )
        parts[Component.LOGITS] = output
        out.append(replace(moment, moment="policy: " + moment.moment, components=parts))
    for moment in value_moments:
        parts = dict(held)
        grads = moment.components.get(Component.GRADIENTS, Term(0, ""))
        parts[Component.GRADIENTS] = Term(
            bytes=grads.bytes + policy_grads.bytes,
            formula=f"{grads.formula} (the value model's) + {policy_grads.formula} (the "
            "policy's, complete)",
        )
        for comp in (Component.ACTIVATIONS, Component.TEMPORARIES):
            if comp in moment.components:
                parts[comp] = moment.components[comp]
        parts[Component.LOGITS] = output
        out.append(replace(moment, moment="value model: " + moment.moment, components=parts))
    return out


def _score_input(value: ModelSpec | None, setup: TrainingSetup, rows: int, seq: int) -> Term:
    """The value model's score head (hidden × 1) runs over every position
    (`self.value_model.score(output.hidden_states[-1])` in `PolicyAndValueWrapper.forward`) and
    keeps its input for the weight's gradient: the final norm's output, rows × seq × hidden in
    the residual stream's dtype (autocast's 16-bit cast of it under mixed precision). A
    sequence-classification model's activations leave it out (no vocabulary head)."""
    if value is None:
        return Term(0, "")
    size = head_input_dtype(dtypes_for(setup))
    return Term(
        bytes=size * rows * seq * value.hidden_size,
        formula=f"{size} B × {rows}×{seq}×{value.hidden_size} (the value score head's input)",
    )


def _head_moment(
    spec: ModelSpec,
    setup: TrainingSetup,
    models: _Models,
    train: dict[Component, Term],
    micro: int,
    seq: int,
    compute: int,
    kept: Term,
    caches: Term,
    hidden_copies: int,
) -> PhaseBudget | None:
    """The policy's LM head inside `PolicyAndValueWrapper.forward` (ppo_trainer.py, TRL
    0.29.1): `output = self.critic_backbone(**kwargs)` is bound until the wrapper returns, so
    the value backbone's output, and in it the KV cache it builds (called without
    `use_cache=False`), is alive through the policy's whole forward. At the head the policy's
    logits exist in the compute dtype only (accelerate's fp32 conversion of the outputs, and
    of the hidden states, comes after the wrapper returns); Gemma-2's soft-capping has the
    head's output beside its division by the cap. None without a value backbone."""
    if models.value is None:
        return None
    value_cache = _training_caches(models.value, setup, micro, seq)
    if not value_cache.bytes:
        return None
    parts = dict(train)
    acts = parts[Component.ACTIVATIONS]
    if hidden_copies:
        acts = Term(
            bytes=acts.bytes - hidden_copies,
            formula=acts.formula + " − the fp32 copies of the hidden states (made later)",
        )
    if not trainability_for(spec, setup).linear_inputs_saved:
        # a frozen head saves nothing, but its input, the final norm's output, is alive while
        # the head runs
        size = dtypes_for(setup).residual
        acts = Term(
            bytes=acts.bytes + size * micro * seq * spec.hidden_size,
            formula=acts.formula + f" + {size} B × {micro}×{seq}×{spec.hidden_size} (the "
            "frozen head's input, the final norm's output)",
        )
    parts[Component.ACTIVATIONS] = acts
    copies = 2 if spec.final_logit_softcapping is not None else 1
    head = copies * micro * seq * spec.vocab_size * compute
    parts[Component.LOGITS] = Term(
        bytes=head + kept.bytes,
        formula=f"{copies} × {compute} B × {micro}×{seq}×{format_count(spec.vocab_size)} (the "
        "LM head's output"
        + (" and its division by the soft-cap" if copies > 1 else "")
        + ")"
        + (f" + {format_count(kept.bytes)} B of kept rollout scores" if kept.bytes else ""),
    )
    parts[Component.KV_CACHE] = Term(
        bytes=caches.bytes + value_cache.bytes,
        formula=f"{caches.formula} + "
        + value_cache.formula.replace("the policy", "the value backbone")
        + " (its output still bound in the wrapper's forward)",
    )
    return PhaseBudget(
        phase=Phase.FORWARD,
        moment="the policy's LM head inside the wrapper's forward, the value backbone's output "
        "(its KV cache) still alive",
        components=parts,
    )


def _training_caches(spec: ModelSpec, setup: TrainingSetup, rows: int, seq: int) -> Term:
    """The wrapper calls the policy without `use_cache=False`: it builds a KV cache (fp32 under
    autocast: the rotary output) that the micro-batch's output keeps until it is deleted. The
    value backbone's dies with its output, inside the wrapper's forward."""
    cache_setup = replace(_rollout_setup(setup), batch=rows, seq=seq, new_tokens=0)
    policy = kv_cache_term(spec, cache_setup)
    return Term(bytes=policy.bytes, formula=policy.formula + " (the policy's, never read)")


def _model_lines(
    spec: ModelSpec, setup: TrainingSetup, ppo: PpoSetup, models: _Models, reference: Reference
) -> list[str]:
    """The four models, one line each: what they are and whether they train."""
    policy = spec.model_id + (" (its LoRA adapter trains)" if setup.lora else " (trains in full)")
    if ppo.value == "remote":
        value = (ppo.value_name or "a critic") + " on GPUs of its own (nothing on this GPU)"
    elif models.value is None:
        value = "a value head on the policy (hidden × 1, trains)"
    else:
        name = ppo.value_name or "the policy's size"
        value = (
            f"{name}, a sequence-classification model of "
            f"{format_count(models.value.total_params)} params, trains in full"
        )
    ref = {
        Reference.COPY: "a frozen copy ("
        + reference_copy_term(
            spec,
            setup,
            ppo.reference_bytes,
            ppo.reference_sharded,
            ppo.reference_offloaded,
            "on this GPU",
        ).formula
        + ")",
        Reference.ADAPTER: "the policy with its adapter disabled (no copy)",
        Reference.NONE: "on GPUs of its own (nothing on this GPU)",
    }.get(reference, reference.value)
    if models.reward is not None:
        name = ppo.reward_name or "the policy's size"
        reward = f"{name}, frozen ({format_count(models.reward.total_params)} params)"
    elif ppo.reward == "adapter":
        reward = "a second adapter on the policy (no copy)"
    else:
        reward = (ppo.reward_name or "a reward server") + " (nothing on this GPU)"
    return [f"policy {policy}", f"value model {value}", f"reference {ref}", f"reward {reward}"]

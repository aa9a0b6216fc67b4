"""GRPO (TRL's GRPOTrainer): generation inside the step, then the SFT step over the completions.

Read in TRL 0.29.1 (`trl/trainer/grpo_trainer.py`, `trl/trainer/grpo_config.py`,
`trl/generation/vllm_generation.py`, `trl/trainer/utils.py`) and transformers 5.24's `generate`
(`generation/utils.py`, `cache_utils.py` `DynamicLayer.update`). One optimizer step goes through
four phases, one after the other:

- generation (`_generate_single_turn`): a generation batch of `per_device_train_batch_size ×
  steps_per_generation` completions (`per_device_train_batch_size` counts completions, not
  prompts: the sampler repeats each prompt `num_generations` times, and
  `generation_batch_size` must divide by `num_generations`), each up to
  `max_completion_length` tokens after its prompt. Without vLLM the policy itself generates,
  under `torch.no_grad()` with its KV cache: a `DynamicCache` grown by `torch.cat` one token at
  a time, so at the last token it holds prompt + completion − 1 tokens per row, and the layer
  being updated has its old keys (or values) beside the new ones. `generate` asks the model
  for the last position's logits only (`logits_to_keep=1`). With vLLM `colocate` the engine
  lives in the training process and holds `vllm_gpu_memory_utilization` × the GPU's memory
  for the whole run; with `vllm_enable_sleep_mode` it sleeps (weights and cache released,
  `llm.sleep(level=2)`) outside generation. With vLLM `server` the completions come from
  another GPU.
- log-probabilities without gradient (`_generate_and_score_completions`): with `beta != 0`
  the reference model's per-token log-probabilities over the completions, and the policy's
  own ("old") ones when vLLM's importance-sampling correction is on (the default) or when
  `gradient_accumulation_steps` is not a multiple of `steps_per_generation × num_iterations`.
  Both run over the whole generation batch in chunks of `per_device_train_batch_size` rows
  (`_get_per_token_logps_and_entropies` with `batch_size`), each with `logits_to_keep =
  completion + 1`. From the second chunk on, the previous chunk's divided logits are still
  bound to `logits` while the next chunk's forward makes its own (`logits = model(...).logits`
  rebinds the name only when the forward has returned): its LM head runs beside them, and under
  accelerate's mixed precision so does `convert_outputs_to_fp32`'s fp32 copy of the 16-bit
  logits. `steps_per_generation` (the accumulation steps by default) sets the chunks. `beta`
  defaults to 0.0 at 0.29.1: no reference model is loaded at all. With `beta != 0` the
  reference is a second copy in full fine-tuning (`create_model_from_path`) and the policy with
  its adapter disabled under PEFT (`use_adapter(model, None)`: no copy).
- the policy's forward and backward (`_compute_loss`): one micro-batch of
  `per_device_train_batch_size` completions, prompt + completion tokens through the model with
  gradient, the logits of the last completion + 1 positions only; `logits[:, :-1]`,
  `logits[:, -C:]` (views), `logits / temperature` (a copy, always made), then
  `selective_log_softmax` and, without gradient, `entropy_from_logits` (128 rows at a time:
  a log-softmax, its exp and their product alive together). Gradient checkpointing as for SFT.
- the optimizer step, as for SFT.

Padding (`GrpoSetup.padded_prompts`, on by default as in real runs): `_generate_single_turn`
left-pads a device's prompts to the longest and `_generate_and_score_completions` right-pads
the completions after their EOS, so the forwards over prompt + completion get an attention mask
with zeros. transformers 5.24 then hands SDPA a mask (`sdpa_attention_forward`,
integrations/sdpa_attention.py: `use_gqa_in_sdpa` is false with a mask, so `repeat_kv` copies K
and V to every query head), and torch's SDPA converts the boolean mask to an additive one in q's
dtype in every layer (`convert_boolean_attn_mask`), both kept for backward: the policy's
forward is sized as for packed rows' mask (llmmem.budget.activations). The no-gradient passes
make the same per layer and free it there. Generation is not changed: one query a step, SDPA
packs the grouped heads (`pack_gqa`) and the mask is rows × cached tokens.

`steps_per_generation` (default `gradient_accumulation_steps`) sets how many micro-batches one
generation makes; `num_iterations` reuses them. The buffered generation batch between phases
is token ids and per-token log-probabilities (a few bytes per token), not counted.

TRL 1.15 and later (read at 1.16.0; `add_fused_lm_head` is in no 1.x release before 1.15):
`GRPOConfig` and the phases are the same, but the trainer patches
the policy (and the reference copy) with `add_fused_lm_head` and
`_get_per_token_logps_and_entropies` calls it with `fused_lm_head=True` and labels on the
completion's tokens only (`labels[:, :-logits_to_keep] = -100`): the log-probabilities come
from the tiled head (llmmem.budget.fused_head), never from whole logits. The policy asks for
`outputs=("log_probs", "entropy")`, the reference copy for `log_probs`. So where
`GrpoSetup.trl_release` is 1.15 or later (`fused_log_probs`) the logits terms of the
no-gradient passes (no earlier chunk's logits stay bound either: a chunk keeps only its
per-token outputs) and of the policy's forward and backward are the fused head's: the last
hidden state, the scored positions' copy, the 4096 × 32768 tile buffer and, in backward, the
fp32 gradients. Generation runs the unpatched forward (`fused_lm_head=False`): unchanged, as
is the padding (`pad_to_multiple_of="auto"` pads only on Neuron). `cast_lm_head_to_fp32` is
off by default at 1.16 and not sized here (it would keep the head in fp32).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmmem.budget import fused_head
from llmmem.budget.activations import dtypes_for
from llmmem.budget.generation import decode_attention_copies, kv_cache_term
from llmmem.budget.phases import estimate_budget
from llmmem.budget.preference_moments import (
    backward_phase,
    budget_from_phases,
    last_block_moment,
    later_backward_moments,
    reference_copy_term,
    replace_logits,
    with_terms,
)
from llmmem.budget.preference_setup import (
    LogProbMoments,
    Objective,
    Reference,
    fp32_outputs,
    policy_under_autocast,
)
from llmmem.budget.result import Budget, Component, GpuTarget, Phase, PhaseBudget, Term
from llmmem.budget.setup import (
    Method,
    Mode,
    Packing,
    SetupError,
    TrainingSetup,
    check_release,
    release,
)
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes, format_count

# the TRL release whose GRPOTrainer this budget follows
TRL_RELEASE = "0.29.1"
VLLM_MODES = ("colocate", "server")
# trl/trainer/utils.py `entropy_from_logits(logits, chunk_size=128)`
ENTROPY_CHUNK = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class GrpoSetup:
    """GRPOConfig's fields that change the memory, with TRL 0.29.1's defaults."""

    num_generations: int = 8
    max_prompt_length: int = 512  # the longest prompt: TRL 0.29.1 no longer truncates prompts
    max_completion_length: int = 256
    beta: float = 0.0
    vllm: str | None = None  # None (the policy generates), "colocate" or "server"
    vllm_gpu_memory_utilization: float = 0.3
    vllm_enable_sleep_mode: bool = False
    vllm_importance_sampling_correction: bool = True
    steps_per_generation: int | None = None  # None: gradient_accumulation_steps
    num_iterations: int = 1
    # accelerate's mixed precision (bf16=True): the prepared policy's (and reference's)
    # logits come back in fp32; None: llmmem.budget.preference_setup.fp32_outputs's default
    mixed_precision: bool | None = None
    # whether the advantage compares a prompt's completions with each other (GRPO; OpenRLHF's
    # rloo, reinforce_baseline, group_norm, dr_grpo): then num_generations must be 2 or more.
    # OpenRLHF's REINFORCE++ (`reinforce`) runs with one completion a prompt
    group_baseline: bool = True
    # the reference with beta != 0: a separate frozen copy under LoRA too (OpenRLHF loads its
    # own reference model; TRL disables the adapter), its bytes per weight (None: the
    # policy's), partitioned under ZeRO-3 or offloaded to the CPU
    reference_copy: bool = False
    reference_bytes: int | None = None
    reference_sharded: bool = False
    reference_offloaded: bool = False
    # the batch holds padding: TRL left-pads a generation batch's prompts to the longest and
    # right-pads the completions after their EOS, so the forwards' attention mask has zeros
    # (False: every prompt as long and every completion run to max_completion_length)
    padded_prompts: bool = True
    # the TRL release whose GRPOTrainer runs (None: TRL_RELEASE); 1.15 and later take the
    # log-probabilities through the fused LM head (llmmem.budget.fused_head.FIRST_RELEASE)
    trl_release: str | None = None

    def __post_init__(self) -> None:
        if self.trl_release is not None:
            check_release(self.trl_release, "trl_release", "0.29.1")
        for name in ("num_generations", "max_prompt_length", "max_completion_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SetupError(f"{name} must be a whole number of at least 1, got {value!r}")
        if self.num_generations < 2 and self.group_baseline:
            raise SetupError(
                f"num_generations must be at least 2 (GRPO compares completions of one prompt), "
                f"got {self.num_generations}"
            )
        if self.vllm is not None and self.vllm not in VLLM_MODES:
            raise SetupError(f"vllm_mode must be colocate or server, got {self.vllm!r}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise SetupError(
                "vllm_gpu_memory_utilization is a fraction of the GPU's memory, above 0 and at "
                f"most 1, got {self.vllm_gpu_memory_utilization}"
            )
        if not self.beta >= 0:  # also NaN
            raise SetupError(f"beta must be 0 or more, got {self.beta}")
        if self.steps_per_generation is not None and self.steps_per_generation < 1:
            raise SetupError(
                f"steps_per_generation must be at least 1, got {self.steps_per_generation}"
            )
        if self.num_iterations < 1:
            raise SetupError(f"num_iterations must be at least 1, got {self.num_iterations}")

    @property
    def seq(self) -> int:
        return self.max_prompt_length + self.max_completion_length


def steps_per_generation(grpo: GrpoSetup, setup: TrainingSetup) -> int:
    return grpo.steps_per_generation or setup.grad_accum


def generation_rows(grpo: GrpoSetup, setup: TrainingSetup) -> int:
    """The completions one device generates at once: `per_device_train_batch_size ×
    steps_per_generation` (grpo_trainer.py `_prepare_inputs`: one generation for the whole
    generation batch, split into micro-batches afterwards)."""
    return setup.batch * steps_per_generation(grpo, setup)


def padded_forwards(grpo: GrpoSetup, setup: TrainingSetup) -> TrainingSetup:
    """The setup the forwards over prompt + completion run under. With padding (left-padded
    prompts, or completions right-padded after an early EOS) the attention mask
    (`torch.cat([prompt_mask, completion_mask], dim=1)`, `_generate_and_score_completions`)
    has zeros: transformers hands SDPA a mask, SDPA converts it to an additive one in q's
    dtype in every layer and keeps it for backward, and K and V are repeated to every query
    head, as for packed rows' block-diagonal mask (flash-attention unpads instead)."""
    if grpo.padded_prompts and setup.packing is None:
        return replace(setup, packing=Packing.ROWS)
    return setup


def check_grpo(grpo: GrpoSetup, setup: TrainingSetup) -> None:
    """GRPOConfig.__post_init__'s checks that concern the sizes (grpo_config.py)."""
    spg = steps_per_generation(grpo, setup)
    world = setup.distributed.world_size
    global_batch = setup.batch * world * spg
    if global_batch % grpo.num_generations:
        raise SetupError(
            f"the generation batch ({setup.batch} completions per device × {world} devices × "
            f"{spg} steps per generation = {global_batch}) must divide by num_generations "
            f"({grpo.num_generations}): the batch counts completions, num_generations of "
            "each prompt"
        )
    if setup.mode is Mode.GENERATE:
        raise SetupError("GRPO is a training objective: drop --mode generate")


def reference_of(grpo: GrpoSetup, setup: TrainingSetup) -> Reference:
    """grpo_trainer.py `__init__`: no reference with beta = 0, the adapter disabled under
    PEFT, else a second model."""
    if grpo.beta == 0:
        return Reference.NONE
    if grpo.reference_copy:
        return Reference.COPY
    return Reference.COPY if setup.method is Method.FULL else Reference.ADAPTER


def uses_fused_head(grpo: GrpoSetup) -> bool:
    """Whether the GRPOTrainer takes its log-probabilities through the fused LM head (TRL 1.15
    and later)."""
    return release(grpo.trl_release or TRL_RELEASE) >= fused_head.FIRST_RELEASE


def old_log_probs(grpo: GrpoSetup, setup: TrainingSetup) -> bool:
    """Whether the policy's own log-probabilities are computed without gradient before
    training (grpo_trainer.py `_generate_and_score_completions`)."""
    every = steps_per_generation(grpo, setup) * grpo.num_iterations
    vllm_correction = grpo.vllm is not None and grpo.vllm_importance_sampling_correction
    return setup.grad_accum % every != 0 or vllm_correction


@dataclass(frozen=True)
class GrpoLogProbs:
    """The completion log-probabilities' memory, in bytes, for `rows` rows of `C` tokens."""

    forward_end: Term  # with gradient, at the end of the policy's forward
    no_grad: Term  # the reference (or old-policy) pass: one chunk's logits
    inside_kernel: int  # of `no_grad`: fp32 logsumexp's row temporary (a GPU sees it)
    backward_peak: Term
    # a later chunk's fp32 copy of its 16-bit logits, made after the forward has left autocast
    # (its cached weight casts released): None with one chunk or without mixed precision
    no_grad_outside_autocast: Term | None = None


def grpo_log_probs(spec: ModelSpec, setup: TrainingSetup, grpo: GrpoSetup) -> GrpoLogProbs:
    """`_get_per_token_logps_and_entropies` on `per_device_train_batch_size` rows.

    L⁺ = rows × (C + 1) × V logits come out of the model in the compute dtype e (called
    without labels), or in fp32 under accelerate's mixed precision (its
    `convert_outputs_to_fp32` on the prepared model: the division and the log-probabilities
    then work on fp32); L = rows × C × V is `logits / temperature`, a copy. While the copy is made
    both are alive; the model's logits then die (nothing saves them). `selective_log_softmax`
    keeps, for autograd, the divided logits themselves (fp32: per-row logsumexp) or every
    row's log-softmax (16-bit), and `entropy_from_logits` holds three 128-row × V tensors at
    once. Backward takes what preference training's log-probabilities take over L."""
    e = 4 if fp32_outputs(grpo.mixed_precision, setup) else dtypes_for(setup).compute
    vocab = spec.vocab_size
    rows = setup.batch
    c = grpo.max_completion_length
    plus = rows * (c + 1) * vocab
    kept = rows * c * vocab
    chunk = min(ENTROPY_CHUNK, rows * c)
    count = f"L⁺ = {rows}×{c + 1}×{format_count(vocab)}, L = {rows}×{c}×{format_count(vocab)}"
    division = e * plus + e * kept
    if e == 4:
        saved, saved_text = 4 * kept, "4 B × L (the divided logits, kept by logsumexp)"
    else:
        saved = 2 * e * kept
        saved_text = f"{e} B × L (divided) + {e} B × L (every row's log-softmax, kept)"
    entropy = saved + 3 * e * chunk * vocab
    if division >= entropy:
        forward = Term(
            bytes=division,
            formula=f"{e} B × {count}: the model's logits and their copy divided by the "
            "temperature",
        )
    else:
        forward = Term(
            bytes=entropy,
            formula=f"{saved_text} + 3 × {e} B × {chunk} rows × V (the entropy's chunk: "
            f"log-softmax, exp, product; {count})",
        )
    row = c * vocab
    inside = 4 * row if e == 4 else 0
    no_grad = Term(
        bytes=division + inside,
        formula=f"{e} B × {count}: one chunk's logits and their divided copy"
        + (" + one row's fp32 logsumexp temporary" if inside else ""),
    )
    later = later_chunk_moment(spec, setup, grpo, e)
    at_head = later[0] if later else None
    if at_head is not None and at_head.bytes > division + inside:
        no_grad, inside = at_head, 0
    elif at_head is not None and at_head.bytes > division:
        inside = division + inside - at_head.bytes  # what a counter misses of the GPU's moment
    if spec.final_logit_softcapping is not None:
        # Gemma-2's soft-capped head without gradient: the head's output beside its division
        # by the cap (compute dtype, L⁺ each), the final norm's output still alive
        dt = dtypes_for(setup)
        head = 2 * dt.compute * plus + dt.residual * rows * grpo.seq * spec.hidden_size
        if head > no_grad.bytes:
            no_grad = Term(
                bytes=head,
                formula=f"2 × {dt.compute} B × L⁺ ({count}): the soft-capped head's output and "
                f"its division by the cap + the final norm's output ({dt.residual} B × "
                f"{rows}×{grpo.seq}×h)",
            )
            inside = 0
        elif head > no_grad.bytes - inside:
            inside = no_grad.bytes - head  # what a counter misses of the GPU's moment
    if e == 4:
        backward = Term(
            bytes=16 * kept,
            formula="16 B × L (the saved divided logits, the gather's gradient, the "
            "logsumexp gradients' buffer and one row's)",
        )
    else:
        backward = Term(
            bytes=2 * e * kept,
            formula=f"{2 * e} B × L (the saved log-softmax and its gradient buffer)",
        )
    if spec.final_logit_softcapping is not None:
        # Gemma-2's soft-capped logits (`tanh(logits / cap) * cap` inside the model's
        # forward): with gradient the tanh output, rows × (C + 1) × V in the compute dtype, is
        # kept for the capping's backward, which runs after the log-probabilities'; without
        # gradient it lives only inside the model's head
        capped = dtypes_for(setup).compute * plus
        text = f" + {dtypes_for(setup).compute} B × L⁺ (the soft-capping's tanh, kept)"
        forward = Term(bytes=forward.bytes + capped, formula=forward.formula + text)
        backward = Term(bytes=backward.bytes + capped, formula=backward.formula + text)
    return GrpoLogProbs(forward, no_grad, inside, backward, later[1] if later else None)


def fused_log_probs(
    spec: ModelSpec, setup: TrainingSetup, grpo: GrpoSetup, triton: bool = True
) -> GrpoLogProbs:
    """`_get_per_token_logps_and_entropies` from TRL 1.15 on `per_device_train_batch_size`
    rows: the fused LM head (llmmem.budget.fused_head) over the completion's C labelled positions a
    row on a GPU (every s − 1 without Triton, `triton=False`). With gradient the policy's
    forward ends with the head's saved tensors and its backward is the head's; without
    gradient (reference, old policy) one chunk's head at its largest: the last hidden state,
    the positions' copy and the tile buffer. Nothing logits-sized, nothing from the previous
    chunk but its per-token outputs."""
    rows, c = setup.batch, grpo.max_completion_length
    moments = fused_head.fused_head_moments(
        spec, setup, rows, Objective.GRPO, triton=triton, scored=c
    )
    head = fused_head.head_bytes(spec, setup, rows, Objective.GRPO, triton=triton, scored=c)
    return GrpoLogProbs(
        forward_end=Term(bytes=moments.forward_end, formula=moments.formula_forward),
        no_grad=Term(
            bytes=head.no_grad,
            formula=f"one chunk ({rows} rows) through the fused LM head (TRL 1.15+) without "
            "gradient: the last hidden state, the scored positions' copy and the tile buffer",
        ),
        inside_kernel=0,
        backward_peak=Term(bytes=moments.backward_peak, formula=moments.formula_backward),
    )


def later_chunk_moment(
    spec: ModelSpec, setup: TrainingSetup, grpo: GrpoSetup, e: int
) -> tuple[Term, Term | None] | None:
    """The no-gradient pass's second and later chunks (None with one chunk): TRL 0.29.1's
    `_get_per_token_logps_and_entropies` keeps the previous chunk's divided logits (`logits /
    temperature`, e B × rows × C × V) bound to `logits` until the next chunk's forward returns.
    That forward's LM head makes the new logits (compute dtype, rows × (C + 1) × V) from the
    final norm's output over every position (residual dtype) and a contiguous copy of the kept
    positions (the head's input); under accelerate's mixed precision the 16-bit logits are then
    copied to fp32 (`convert_outputs_to_fp32`) with the previous chunk's still alive: that
    copy is made outside the forward's autocast, so its cached weight casts are gone then.
    Returns the LM head's moment and the fp32 copy's (None without mixed precision)."""
    rows = setup.batch
    gen_rows = generation_rows(grpo, setup)
    if gen_rows <= rows:
        return None
    dt = dtypes_for(setup)
    ec = dt.compute
    c, vocab, h = grpo.max_completion_length, spec.vocab_size, spec.hidden_size
    plus = rows * (c + 1) * vocab
    previous = e * rows * c * vocab
    head_input = dt.residual * rows * grpo.seq * h + ec * rows * (c + 1) * h
    at_head = previous + ec * plus + head_input
    capped = ""
    if spec.final_logit_softcapping is not None:
        # Gemma-2's soft-capped head: the logits divided by the cap, beside the head's output
        at_head += ec * plus
        capped = f", and their division by the soft-cap ({ec} B × {rows}×{c + 1}×V)"
    chunks = -(-gen_rows // rows)
    count = f"{chunks} chunks of {rows} rows, V = {format_count(vocab)}"
    copy = None
    if e != ec:
        copy = Term(
            bytes=previous + ec * plus + 4 * plus,
            formula=f"the previous chunk's divided logits (4 B × {rows}×{c}×V) beside the next "
            f"chunk's {ec} B logits and their fp32 copy (4 B × {rows}×{c + 1}×V; {count}), "
            "outside autocast",
        )
    return Term(
        bytes=at_head,
        formula=f"the previous chunk's divided logits ({e} B × {rows}×{c}×V) beside the next "
        f"chunk's LM head: its {ec} B logits ({rows}×{c + 1}×V){capped}, the final norm's output "
        f"({dt.residual} B × {rows}×{grpo.seq}×h) and the head's input ({ec} B × "
        f"{rows}×{c + 1}×h; {count})",
    ), copy


def _held(phase: PhaseBudget) -> dict[Component, Term]:
    """What lives between steps: the weights and the optimizer states (the gradients are
    freed by zero_grad before the next generation)."""
    return {
        k: v
        for k, v in phase.components.items()
        if k in (Component.WEIGHTS, Component.OPTIMIZER_STATES)
    }


def _vllm_term(grpo: GrpoSetup, gpu: GpuTarget | None) -> Term:
    if gpu is None:
        raise SetupError(
            "vllm colocate reserves a fraction of the GPU's memory "
            "(vllm_gpu_memory_utilization): name the GPU (--gpu NAME or a capacity such as "
            "80GiB)"
        )
    size = int(grpo.vllm_gpu_memory_utilization * gpu.capacity_bytes)
    return Term(
        bytes=size,
        formula=f"vllm_gpu_memory_utilization {grpo.vllm_gpu_memory_utilization:g} × "
        f"{format_bytes(gpu.capacity_bytes)} ({gpu.name}): the colocated engine's weights and "
        "KV cache",
    )


def generation_phase(
    spec: ModelSpec,
    setup: TrainingSetup,
    grpo: GrpoSetup,
    held: dict[Component, Term],
    vllm: Term | None,
) -> PhaseBudget:
    """The generation of the whole generation batch."""
    rows = generation_rows(grpo, setup)
    if grpo.vllm == "server":
        return PhaseBudget(
            phase=Phase.GENERATE,
            moment="completions from the vLLM server (another GPU); weights synced to it",
            components=dict(held),
        )
    if grpo.vllm == "colocate":
        assert vllm is not None
        return PhaseBudget(
            phase=Phase.GENERATE,
            moment="the colocated vLLM engine generates"
            + (" (woken from sleep)" if grpo.vllm_enable_sleep_mode else ""),
            components={**held, Component.VLLM_ENGINE: vllm},
        )
    p, c = grpo.max_prompt_length, grpo.max_completion_length
    e = dtypes_for(setup).compute
    # the cache at the last token: every token but the last generated one went through
    cached = max(p + c - 1, 1)
    gen = replace(setup, batch=rows, seq=cached, new_tokens=0)
    kv = kv_cache_term(spec, gen)
    # the layer being updated: its old keys beside the new ones (torch.cat), or under eager
    # attention its K and V repeated to every query head
    copies = decode_attention_copies(spec, setup, kv)
    one_layer = copies.bytes
    ids = 8 * rows * (p + c) * 2  # input_ids and attention mask (int64), grown by torch.cat
    # the last position's logits copied to fp32, the processed scores and the sampling
    # probabilities: a step's are alive through the next step's forward
    logits = 4 * rows * spec.vocab_size * 3
    last = kv.bytes + one_layer + ids + logits
    # the prefill: the prompt's cache, one block's intermediates without gradient
    prefill_cache = kv_cache_term(spec, replace(gen, seq=p)).bytes
    n = rows * p
    block = e * n * (3 * spec.intermediate_size + 4 * spec.hidden_size)
    if prefill_cache + block > last:
        return PhaseBudget(
            phase=Phase.GENERATE,
            moment=f"prefill of {rows} prompts ({_prompts_text(grpo, rows)})",
            components={
                **held,
                Component.KV_CACHE: Term(
                    bytes=prefill_cache, formula=f"the prompts' cache ({p} tokens)"
                ),
                Component.ACTIVATIONS: Term(
                    bytes=block,
                    formula=f"{e}·N·(3·I + 4·h), N = {rows}×{p}: one block's intermediates",
                ),
            },
        )
    return PhaseBudget(
        phase=Phase.GENERATE,
        moment=f"last generated token of {rows} completions (KV cache of {cached} tokens)",
        components={
            **held,
            Component.KV_CACHE: kv,
            Component.TEMPORARIES: Term(
                bytes=one_layer + ids + logits,
                formula=f"{copies.formula} + the token ids and mask "
                "(int64) + 3 × 4 B × rows × V (the last position's fp32 logits, processed "
                "scores and sampling probabilities)",
            ),
        },
    )


def _prompts_text(grpo: GrpoSetup, rows: int) -> str:
    if rows >= grpo.num_generations:
        return f"{rows // grpo.num_generations} distinct, each {grpo.num_generations} times"
    return f"each repeated {grpo.num_generations} times across devices"


def no_grad_phase(
    spec: ModelSpec,
    setup: TrainingSetup,
    grpo: GrpoSetup,
    held: dict[Component, Term],
    lp: GrpoLogProbs,
    reference: Reference,
) -> PhaseBudget | None:
    """The reference's (and the old policy's) log-probabilities, chunk by chunk, without
    gradient: the larger of one block's intermediates and one chunk's logits."""
    old = old_log_probs(grpo, setup)
    if reference is Reference.NONE and not old:
        return None
    e = dtypes_for(setup).compute
    n = setup.batch * grpo.seq
    block = e * n * (3 * spec.intermediate_size + 4 * spec.hidden_size)
    what = []
    if old:
        what.append("the policy's own (old) log-probabilities")
    if reference is Reference.COPY:
        what.append("the reference copy's")
    elif reference is Reference.ADAPTER:
        what.append("the reference's (the adapter disabled)")
    parts = dict(held)
    if block > lp.no_grad.bytes:
        parts[Component.ACTIVATIONS] = Term(
            bytes=block,
            formula=f"{e}·N·(3·I + 4·h), N = {setup.batch}×{grpo.seq}: one block's "
            "intermediates without gradient",
        )
    else:
        parts[Component.LOGITS] = lp.no_grad
    return PhaseBudget(
        phase=Phase.REFERENCE_FORWARD,
        moment=" and ".join(what) + f", {setup.batch} rows at a time, without gradient",
        components=parts,
    )


def estimate_grpo_budget(
    spec: ModelSpec,
    setup: TrainingSetup,
    grpo: GrpoSetup,
    gpu: GpuTarget | None = None,
) -> Budget:
    """One optimizer step of TRL 0.29.1's GRPOTrainer (1.15's and later where
    `grpo.trl_release` says so: the fused LM head): generation, the log-probabilities
    without gradient, the policy's forward and backward over the completions, the step.
    `setup.batch` is `per_device_train_batch_size` (completions); its `seq` is replaced by
    prompt + completion."""
    check_grpo(grpo, setup)
    reference = reference_of(grpo, setup)
    policy_setup = policy_under_autocast(
        padded_forwards(grpo, replace(setup, seq=grpo.seq, use_cache=False)),
        grpo.mixed_precision,
    )
    sft = estimate_budget(spec, policy_setup, gpu)
    forward = sft.phase(Phase.FORWARD)
    backward = sft.phase(Phase.BACKWARD)
    step = sft.phase(Phase.OPTIMIZER_STEP)

    extra: dict[Component, Term] = {}
    if reference is Reference.COPY:
        extra[Component.REFERENCE_MODEL] = reference_copy_term(
            spec,
            setup,
            grpo.reference_bytes,
            grpo.reference_sharded,
            grpo.reference_offloaded,
            "the frozen reference copy, beta != 0",
        )
    vllm = _vllm_term(grpo, gpu) if grpo.vllm == "colocate" else None
    # asleep outside generation with sleep mode, else reserved throughout
    training_extra = dict(extra)
    if vllm is not None and not grpo.vllm_enable_sleep_mode:
        training_extra[Component.VLLM_ENGINE] = vllm
    held_training = {**_held(step), **training_extra}
    # autocast's 16-bit copies of the weights (cached for the forward, whether or not grad is
    # enabled) and a k-bit layer's dequantized weight live in every forward, generation's too
    copies = forward.components.get(Component.WEIGHT_COPIES)
    running = {**held_training, Component.WEIGHT_COPIES: copies} if copies else held_training

    generating = running if grpo.vllm is None else held_training
    phases = [generation_phase(spec, setup, grpo, generating, vllm)]
    lp = (
        fused_log_probs(spec, policy_setup, grpo)
        if uses_fused_head(grpo)
        else grpo_log_probs(spec, policy_setup, grpo)
    )
    # autocast caches the casts of trainable weights only: a frozen reference casts per op;
    # a k-bit base is dequantized in every forward, with or without its adapter
    cached = old_log_probs(grpo, setup) or setup.quant is not None
    no_grad_held = running if cached else held_training
    no_grad = no_grad_phase(spec, policy_setup, grpo, no_grad_held, lp, reference)
    if no_grad is not None and lp.no_grad_outside_autocast is not None:
        # a later chunk's fp32 copy of its logits: autocast's cached casts released by then
        outside = replace(lp, no_grad=lp.no_grad_outside_autocast, inside_kernel=0)
        alternative = no_grad_phase(spec, policy_setup, grpo, held_training, outside, reference)
        if alternative is not None and alternative.allocated_bytes > no_grad.allocated_bytes:
            no_grad = alternative
    if no_grad is not None:
        phases.append(no_grad)
    policy_forward = replace_logits(
        forward,
        "end of the policy's forward: completion log-probabilities and entropies taken",
        lp.forward_end,
        training_extra,
    )
    phases.append(policy_forward)
    last_block = last_block_moment(spec, policy_setup, forward)
    later = later_backward_moments(spec, policy_setup, forward, step)
    moments = LogProbMoments(
        lp.forward_end.bytes,
        lp.no_grad.bytes,
        lp.inside_kernel,
        lp.backward_peak.bytes,
        lp.forward_end.formula,
        lp.no_grad.formula,
        lp.backward_peak.formula,
    )
    phases.append(
        backward_phase(backward, policy_forward, moments, training_extra, last_block, later)
    )
    phases.append(with_terms(step, training_extra))

    notes = list(sft.notes)
    rows = generation_rows(grpo, setup)
    notes.append(
        f"grpo (TRL {grpo.trl_release or TRL_RELEASE}): {rows} completions generated per device "
        f"({rows // grpo.num_generations if rows >= grpo.num_generations else 'part of'} "
        f"prompt(s) × {grpo.num_generations}), up to {grpo.max_completion_length} tokens after "
        f"prompts of {grpo.max_prompt_length}; {setup.batch} completions of {grpo.seq} tokens "
        "per micro-batch through the policy"
    )
    notes.append(
        {
            Reference.NONE: "beta = 0: no reference model",
            Reference.COPY: f"beta = {grpo.beta:g}: a frozen reference copy of the model",
            Reference.ADAPTER: f"beta = {grpo.beta:g}: the reference is the policy with its "
            "adapter disabled (no copy)",
            Reference.PRECOMPUTED: "",
        }[reference]
    )
    if grpo.vllm == "server":
        notes.append("vllm server: generation runs on another GPU, sized separately")
    elif grpo.vllm == "colocate":
        notes.append(
            "vllm colocate: the engine's reservation "
            + (
                "is released while the policy trains (sleep mode)"
                if grpo.vllm_enable_sleep_mode
                else "stays through the whole step (no sleep mode)"
            )
        )
    if setup.distributed.zero_stage == 3 or setup.distributed.fsdp is not None:
        notes.append(
            "ZeRO-3/FSDP: generation gathers the whole model on each device "
            "(ds3_gather_for_generation); that gather is not counted"
        )
    budget = budget_from_phases(sft, phases, notes, spec, policy_setup, reference)
    return _with_first_step(budget, spec, setup, grpo, gpu)


def _with_first_step(
    budget: Budget, spec: ModelSpec, setup: TrainingSetup, grpo: GrpoSetup, gpu: GpuTarget | None
) -> Budget:
    if setup.first_step or budget.first_step_allocated_peak_bytes is None:
        return budget
    first = estimate_grpo_budget(spec, replace(setup, first_step=True), grpo, gpu)
    return replace(budget, first_step_allocated_peak_bytes=first.allocated_peak_bytes)

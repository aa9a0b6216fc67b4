"""The GRPO budget against a GRPO step run on the CPU, phase by phase.

    python -m llmmem.verify.grid --grpo [--size small|medium] [--family llama|qwen2|gemma2 ...]

The step is TRL 0.29.1's GRPOTrainer restated on a model built from a config, each part
following the trainer's code (trl/trainer/grpo_trainer.py at 0.29.1):

- generation: `_generate_single_turn`'s regular path (`unwrapped_model.generate(...)` under
  `torch.no_grad()`): each prompt repeated `num_generations` times (the sampler's
  `RepeatSampler`), left-padded to the longest prompt (all but the first distinct prompt
  shorter by a quarter: a case's `padded`, on in the grid but for one case a family),
  transformers' `generate` with its
  KV cache, sampling, every completion run to `max_completion_length` (no EOS: the longest
  case); then one completion is cut a quarter short and right-padded, as an early EOS leaves
  it, so the forwards' attention mask has zeros even when the batch holds a single prompt;
- with `beta != 0`, the reference log-probabilities of `_generate_and_score_completions` under
  `torch.no_grad()`, chunked by `per_device_train_batch_size`: a frozen copy in full
  fine-tuning, the policy with its adapter disabled under LoRA; with `steps_per_generation` 2
  (a case's `spg`; one accumulation step) the generation batch is two micro-batches, the
  policy's old log-probabilities are taken too, and both passes run over two chunks (the
  first chunk's divided logits alive while the second's forward runs);
- the policy's `_get_per_token_logps_and_entropies`: `logits_to_keep = C + 1`, the last logit
  dropped, `logits / temperature`, `selective_log_softmax`, `entropy_from_logits` without
  gradient in 128-row chunks;
- `_compute_loss` with the default `loss_type="dapo"`: the clipped ratio against the detached
  log-probabilities, the k3 KL term when `beta != 0`, summed over the completion tokens;
- backward and an AdamW step.

The cases run in fp32, in bf16 and under bf16 autocast over fp32 weights. Under accelerate's mixed
precision (bf16 autocast, and bf16 weights unless a case's `mixed` is False: GRPOConfig's default
`bf16=True`) each model's forward is wrapped as `Accelerator.prepare_model` wraps it, in autocast
and in accelerate's own `convert_outputs_to_fp32` (the reference's too; generation's steps
included): the logits come back in fp32. A warm-up
step makes the optimizer states; the second is measured with StorageTracker, one peak per
phase. The no-gradient pass's budget counts one row's fp32 logsumexp temporary that aten makes
inside the kernel (a GPU allocates it, a dispatch-level counter cannot see it): it is left out
of the comparison, by name.
"""

from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from llmmem.budget.grpo import GrpoSetup, estimate_grpo_budget, grpo_log_probs
from llmmem.budget.result import Component, Phase
from llmmem.budget.setup import AttnImpl, LoraSetup, Method, Precision, TrainingSetup
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.preference_grid import (
    CONFIGS,
    GENERATING_FAMILIES,
    attention_of,
    mixed_precision,
    parse_shapes,
    prepared_forward,
    print_grid,
    selective_log_softmax,
)
from llmmem.verify.tracker import StorageTracker

PROMPT = 16


@dataclass(frozen=True)
class Case:
    generations: int = 2
    completion: int = 32
    beta: float = 0.0
    batch: int = 4  # per_device_train_batch_size: completions
    method: str = "full"
    dtype: str = "fp32"
    grad_ckpt: bool = False
    family: str = "llama"
    mixed: bool | None = None  # accelerate's mixed precision; None: on for bf16 and bf16-true
    # generations per micro-batch's worth: with 2 and one accumulation step, the policy's old
    # log-probabilities are taken too, and both no-gradient passes run over two chunks
    spg: int = 1
    # the batch holds padding, as TRL pads it: the prompts of a generation batch left-padded to
    # the longest (all but the first distinct prompt shorter by a quarter) and one completion
    # ended early (an EOS: the rest right-padded); False: equal prompts, full completions (as
    # bench/trl_trainers.py runs TRL's own trainer). The grid pads every case but one a family
    padded: bool = False

    @property
    def id(self) -> str:
        parts = [self.family] if self.family != "llama" else []
        parts += [f"g{self.generations}", f"c{self.completion}", f"b{self.batch}"]
        parts += [f"beta{self.beta:g}", self.method, self.dtype]
        parts += ["no-amp"] if self.mixed is False else []
        parts += [f"spg{self.spg}"] if self.spg != 1 else []
        parts += ["padded"] if self.padded else []
        return "-".join(parts + (["ckpt"] if self.grad_ckpt else []))


def _config(case: Case, size: str) -> dict[str, Any]:
    return dict(CONFIGS[size][case.family])


def _spec(case: Case | None = None, size: str = "small") -> Any:
    case = case or Case()
    return spec_from_config(
        _config(case, size), model_id=f"{size}-{case.family}", source=ModelSource.CONFIG
    )


def _setup(case: Case) -> TrainingSetup:
    lora = LoraSetup(r=8, alpha=16, targets=["q_proj", "v_proj"]) if case.method == "lora" else None
    return TrainingSetup(
        method=Method(case.method),
        batch=case.batch,
        seq=PROMPT + case.completion,
        precision=Precision(case.dtype),
        optim="adamw_torch",
        grad_ckpt=case.grad_ckpt,
        lora=lora,
        attn=AttnImpl(attention_of(case.family)),
    )


def _grpo(case: Case) -> GrpoSetup:
    return GrpoSetup(
        num_generations=case.generations,
        max_prompt_length=PROMPT,
        max_completion_length=case.completion,
        beta=case.beta,
        mixed_precision=case.mixed,
        steps_per_generation=case.spg,
        padded_prompts=case.padded,
    )


def _log_probs(model: Any, ids: Any, mask: Any, keep: int, rows: int, entropy: bool) -> Any:
    """`_get_per_token_logps_and_entropies` (grpo_trainer.py, 0.29.1), temperature 1."""
    logps, entropies = [], []
    for start in range(0, ids.size(0), rows):
        chunk = ids[start : start + rows]
        logits = model(
            input_ids=chunk,
            attention_mask=mask[start : start + rows],
            logits_to_keep=keep + 1,
            use_cache=False,
        ).logits
        logits = logits[:, :-1, :]
        logits = logits[:, -keep:, :]
        logits = logits / 1.0
        logps.append(selective_log_softmax(logits, chunk[:, -keep:]))
        if entropy:  # trl/trainer/utils.py `entropy_from_logits`, 128 rows at a time
            with torch.no_grad():
                flat = logits.reshape(-1, logits.shape[-1])
                parts = []
                for piece in flat.split(128, dim=0):
                    piece_logps = F.log_softmax(piece, dim=-1)
                    parts.append(-(torch.exp(piece_logps) * piece_logps).sum(-1))
                entropies.append(torch.cat(parts).reshape(logits.shape[:-1]))
    return torch.cat(logps), torch.cat(entropies) if entropy else None


def measure(case: Case, size: str = "small") -> dict[str, int]:
    """Each phase's peak of allocated bytes, weights (and a reference copy) included."""
    import peft
    import transformers

    config = _config(case, size)
    config.pop("architectures", None)
    vocab = config["vocab_size"]
    torch.manual_seed(0)
    dtype = torch.bfloat16 if case.dtype == "bf16-true" else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config),
        dtype=dtype,
        attn_implementation=attention_of(case.family),
    )
    model.train()
    ref = None
    if case.beta and case.method == "full":
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    if mixed_precision(case):
        # mixed precision: accelerate wraps each prepared model's forward in autocast and
        # converts its outputs to fp32 (the reference's too); generate calls that forward,
        # the loss runs outside it
        for wrapped in [model] + ([ref] if ref is not None else []):
            wrapped.forward = prepared_forward(wrapped)
    if case.grad_ckpt:
        model.gradient_checkpointing_enable()
    if case.method == "lora":
        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        model = peft.get_peft_model(model, lora)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)
    return step_peaks(
        model,
        ref,
        optimizer,
        vocab=vocab,
        prompt=PROMPT,
        completion=case.completion,
        generations=case.generations,
        batch=case.batch,
        beta=case.beta,
        steps_per_generation=case.spg,
        padded=case.padded,
    )


def step_peaks(
    model: Any,
    ref: Any,
    optimizer: Any,
    *,
    vocab: int,
    prompt: int,
    completion: int,
    generations: int,
    batch: int,
    beta: float,
    tracker: StorageTracker | None = None,
    steps_per_generation: int = 1,
    old_log_probs: bool | None = None,
    padded: bool = False,
) -> dict[str, int]:
    """A warm-up and a measured GRPO step of `model` (generation, the reference's
    log-probabilities when `beta`, the policy's forward and backward, the optimizer step):
    each phase's peak of allocated bytes, weights (and a reference copy) included. The
    generation batch is `steps_per_generation` micro-batches, of which the first trains; the
    policy's old log-probabilities are taken when `old_log_probs` (None: with more than one
    micro-batch a generation, as one accumulation step makes TRL take them). With `padded`
    the prompts differ in length, left-padded to the longest as `_generate_single_turn` pads
    them (pad token 0, attention mask 0), and the second completion ends a quarter early, the
    rest right-padded as `_generate_and_score_completions` pads the completions."""
    c = completion
    if old_log_probs is None:
        old_log_probs = steps_per_generation > 1
    peaks: dict[str, int] = {}
    tracker = tracker or StorageTracker()
    with tracker:
        frozen = list(model.parameters()) + list(model.buffers())
        if ref is not None:
            frozen += list(ref.parameters()) + list(ref.buffers())
        for tensor in frozen:
            tracker.track(tensor, "weights")
        for _ in range(2):  # a warm-up step, then the measured one
            tracker.reset_peak("activations")
            rows = batch * steps_per_generation  # the generation batch
            prompts = torch.randint(3, vocab, (max(rows // generations, 1), prompt))
            prompt_mask = torch.ones_like(prompts)
            if padded:  # left-padded to the longest prompt
                prompts[1:, : prompt // 4] = 0
                prompt_mask[1:, : prompt // 4] = 0
            prompts = prompts.repeat_interleave(generations, dim=0)
            prompt_mask = prompt_mask.repeat_interleave(generations, dim=0)
            with torch.no_grad():
                out = model.generate(
                    input_ids=prompts,
                    attention_mask=prompt_mask,
                    max_new_tokens=c,
                    min_new_tokens=c,
                    do_sample=True,
                    pad_token_id=0,
                    eos_token_id=None,
                    use_cache=True,
                    disable_compile=True,
                )
            peaks["generate"] = tracker.peak
            completions = out[:, prompt:]
            del out
            completion_mask = torch.ones_like(completions)
            if padded:  # one completion stopped early: the rest right-padded
                completions[1, c - c // 4 :] = 0
                completion_mask[1, c - c // 4 :] = 0
            ids = torch.cat([prompts, completions], dim=1)
            mask = torch.cat([prompt_mask, completion_mask], dim=1)
            ref_logps = None
            if beta or old_log_probs:
                tracker.reset_peak("activations")
                with torch.no_grad():
                    old_logps = None
                    if old_log_probs:
                        old_logps, _ = _log_probs(model, ids, mask, c, batch, False)
                    if beta and ref is None:
                        with model.disable_adapter():
                            ref_logps, _ = _log_probs(model, ids, mask, c, batch, False)
                    elif beta:
                        ref_logps, _ = _log_probs(ref, ids, mask, c, batch, False)
                    del old_logps
                peaks["reference_forward"] = tracker.peak
            ids, mask = ids[:batch], mask[:batch]  # the first micro-batch trains
            if ref_logps is not None:
                ref_logps = ref_logps[:batch]
            advantages = torch.randn(ids.size(0)).unsqueeze(1)
            tracker.reset_peak("activations")
            logps, _ = _log_probs(model, ids, mask, c, batch, True)
            ratio = torch.exp(logps - logps.detach())
            clipped = torch.clamp(ratio, 0.8, 1.28)
            per_token = -torch.min(ratio * advantages, clipped * advantages)
            if beta:
                diff = ref_logps - logps
                per_token = per_token + beta * (torch.exp(diff) - diff - 1)
            loss = per_token.sum() / per_token.numel()
            peaks["forward"] = tracker.peak
            tracker.reset_peak("temporaries")
            loss.backward()
            del loss, per_token, ratio, clipped, logps
            peaks["backward"] = tracker.peak
            tracker.reset_peak("temporaries")
            optimizer.step()
            for state in optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        tracker.track(value, "optimizer_states")
            peaks["optimizer_step"] = tracker.peak
            optimizer.zero_grad()
    return peaks


def predict(case: Case, size: str = "small") -> dict[str, int]:
    """The budget's allocated bytes per phase, less what no storage counter sees."""
    spec = _spec(case, size)
    setup = _setup(case)
    budget = estimate_grpo_budget(spec, setup, _grpo(case))
    phases = {p.phase.value: p.allocated_bytes for p in budget.phases}
    lp = grpo_log_probs(spec, replace(setup, seq=_grpo(case).seq), _grpo(case))
    no_grad = next((p for p in budget.phases if p.phase is Phase.REFERENCE_FORWARD), None)
    if no_grad is not None and no_grad.components.get(Component.LOGITS) == lp.no_grad:
        phases[Phase.REFERENCE_FORWARD.value] -= lp.inside_kernel
    return phases


def grid(families: list[str], shapes: list[tuple[int, int]]) -> list[Case]:
    """num_generations × completion length × with and without a reference, full and LoRA,
    for each family; every case padded as TRL pads a batch, and one without padding."""
    cases: list[Case] = []
    for family in families:
        start = len(cases)
        for generations in (2, 4):
            for completion, batch in shapes:
                for beta in (0.0, 0.04):
                    cases.append(Case(generations, completion, beta, batch=batch, family=family))
        cases.append(Case(2, shapes[0][0], 0.04, batch=shapes[0][1], method="lora", family=family))
        cases.append(
            Case(4, shapes[0][0], 0.0, batch=max(8, shapes[0][1]), grad_ckpt=True, family=family)
        )
        # two micro-batches a generation: both no-gradient passes run over two chunks
        for dtype in ("fp32", "bf16"):
            cases.append(
                Case(2, shapes[0][0], 0.04, batch=shapes[0][1], dtype=dtype, spg=2, family=family)
            )
        cases[start:] = [replace(c, padded=True) for c in cases[start:]]
        # equal prompts and full completions: no padding, no mask
        cases.append(Case(2, shapes[0][0], 0.04, batch=shapes[0][1], family=family))
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmmem.verify.grid --grpo")
    parser.add_argument("--size", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--family", action="append", choices=sorted(CONFIGS["small"]))
    parser.add_argument(
        "--shape",
        action="append",
        help="completion tokens x completions per device, e.g. 32x4 (default 32x4 and 64x4)",
    )
    args = parser.parse_args(argv)
    shapes = parse_shapes(parser, args.shape, ["32x4", "64x4"])
    cases = grid(args.family or list(GENERATING_FAMILIES), shapes)
    print_grid(cases, measure, predict, args.size, 40)
    return 0


if __name__ == "__main__":
    sys.exit(main())

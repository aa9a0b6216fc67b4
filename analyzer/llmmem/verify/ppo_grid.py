"""The PPO budget against a PPO step run on the CPU, phase by phase.

    python -m llmmem.verify.grid --ppo [--size small|medium] [--family llama|qwen2|gemma2 ...]

The step is TRL 0.29.1's PPOTrainer (trl/experimental/ppo/ppo_trainer.py) restated on models
built from a config, each part following the trainer's code:

- `batch_generation`: the policy generates `response_length` tokens for each query,
  `local_rollout_forward_batch_size` queries at a time, with `output_scores=True`; each chunk's
  scores are stacked (`torch.stack(output.scores, 1)`) and the chunks padded into one tensor
  (`trl.trainer.utils.pad`), which `train` keeps as `logitss` until the next update's generation
  returns;
- the rollout, chunk by chunk under `torch.no_grad()`: the policy's log-probabilities from the
  kept scores, the reference's forward (a frozen copy in full fine-tuning, the policy with its
  adapter disabled under LoRA) with `output_hidden_states=True`, the value model's and the reward
  model's backbones through `get_reward`;
- training: `PolicyAndValueWrapper` (the value backbone first, then the policy) on one
  micro-batch, `logits /= temperature` in place on the response slice,
  `selective_log_softmax`, the clipped policy and value losses, backward, `optimizer.step()`
  over both trainables, `zero_grad`, then the entropy of the logits without gradient.

Every response runs to `response_length` (no stop token: the longest case). The queries are
left-padded as the collator pads queries of different lengths (all but the first shorter by a
quarter): `forward`'s attention mask then has zeros, and SDPA gets a mask and K/V repeated to
every head, as in a real run. An unpadded case (`padded=False`) never samples the pad token,
which would otherwise bring the mask by chance. A warm-up update
makes the optimizer states and leaves its rollout scores alive, as TRL's loop does; the second
update is measured with StorageTracker, one peak per phase. The cases run in fp32 and in bf16
(weights and compute); one PPO epoch and one mini-batch (the peaks repeat across them). Under
accelerate's mixed precision (bf16 autocast, and bf16 weights unless a case's `mixed` is False:
PPOConfig's default `bf16=True`) the prepared wrapper's forward runs in autocast and through
accelerate's own `convert_outputs_to_fp32`: its logits and hidden states come back in fp32.
"""

from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

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

TEMPERATURE = 0.7 + 1e-7  # PPOConfig.temperature's default, as `train` passes it


@dataclass(frozen=True)
class Case:
    batch: int = 2  # per_device_train_batch_size
    grad_accum: int = 1
    chunk: int = 2  # local_rollout_forward_batch_size
    prompt: int = 16
    response: int = 32  # response_length
    method: str = "full"
    dtype: str = "fp32"
    # "same": the value and reward models are the policy's size; "small" or "large"
    value: str = "same"
    family: str = "llama"
    # accelerate's mixed precision (PPOConfig's default bf16=True); None: on for bf16 and
    # bf16-true
    mixed: bool | None = None
    # the queries differ in length, left-padded to the longest (all but the first by a
    # quarter: every micro-batch of two rows or more holds padding);
    # False: every query is as long, and sampling never picks the pad token
    padded: bool = True

    @property
    def id(self) -> str:
        parts = [self.family, self.method, self.dtype, f"b{self.batch}x{self.grad_accum}"]
        parts += ["no-amp"] if self.mixed is False else []
        parts += ["unpadded"] if not self.padded else []
        parts += [f"r{self.chunk}", f"q{self.prompt}", f"R{self.response}"]
        return "-".join(parts + ([f"value-{self.value}"] if self.value != "same" else []))


def _config(case: Case, size: str, which: str = "policy") -> dict[str, Any]:
    config = dict(CONFIGS[size][case.family])
    if which != "policy" and case.value == "small":
        # a narrower, shallower critic (same tokenizer, same vocabulary)
        config.update(
            hidden_size=config["hidden_size"] // 2,
            intermediate_size=config["intermediate_size"] // 2,
            num_hidden_layers=1,
        )
    if which != "policy" and case.value == "large":
        # a wider, deeper critic: its backbone can outweigh the reference's logits
        config.update(
            hidden_size=config["hidden_size"] * 2,
            intermediate_size=config["intermediate_size"] * 4,
            num_hidden_layers=config["num_hidden_layers"] * 2,
        )
    return config


def spec_of(case: Case, size: str = "small", which: str = "policy") -> Any:
    from llmmem.models.architectures import spec_from_config
    from llmmem.models.spec import ModelSource

    return spec_from_config(
        _config(case, size, which),
        model_id=f"{size}-{case.family}-{which}",
        source=ModelSource.CONFIG,
    )


def setup_of(case: Case) -> Any:
    from llmmem.budget.setup import AttnImpl, LoraSetup, Method, Precision, TrainingSetup

    lora = LoraSetup(r=8, alpha=16, targets=["q_proj", "v_proj"]) if case.method == "lora" else None
    return TrainingSetup(
        attn=AttnImpl(attention_of(case.family)),
        method=Method(case.method),
        batch=case.batch,
        seq=case.prompt + case.response,
        grad_accum=case.grad_accum,
        precision=Precision(case.dtype),
        optim="adamw_torch",
        lora=lora,
    )


def ppo_of(case: Case, size: str = "small") -> Any:
    from llmmem.budget.ppo_setup import PpoSetup

    value = None if case.value == "same" else spec_of(case, size, "value")
    return PpoSetup(
        value_model=value,
        reward_model=value,
        query_length=case.prompt,
        response_length=case.response,
        local_rollout_forward_batch_size=case.chunk,
        mixed_precision=case.mixed,
        padded_queries=case.padded,
    )


def _first_true_indices(bools: torch.Tensor, dtype: Any = torch.long) -> torch.Tensor:
    """trl/experimental/utils.py `first_true_indices`."""
    row_len = bools.size(-1)
    zero_or_index = row_len * (~bools).type(dtype) + torch.arange(
        row_len, dtype=dtype, device=bools.device
    )
    return torch.min(zero_or_index, dim=-1).values


def _pad(tensors: list[torch.Tensor], value: int) -> torch.Tensor:
    """trl/trainer/utils.py `pad`, right side."""
    shape = [max(t.shape[i] for t in tensors) for i in range(tensors[0].dim())]
    out = torch.full((len(tensors), *shape), value, dtype=tensors[0].dtype)
    for i, t in enumerate(tensors):
        out[i][tuple(slice(0, s) for s in t.shape)] = t
    return out


def _forward(model: Any, query_responses: torch.Tensor, pad: int) -> Any:
    """ppo_trainer.py `forward`."""
    attention_mask = query_responses != pad
    position_ids = attention_mask.cumsum(1) - attention_mask.long()
    input_ids = torch.masked_fill(query_responses, ~attention_mask, 0)
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        return_dict=True,
        output_hidden_states=True,
    )


def _get_reward(model: Any, query_responses: torch.Tensor, pad: int, context: int) -> Any:
    """trl/experimental/utils.py `get_reward`."""
    attention_mask = query_responses != pad
    position_ids = attention_mask.cumsum(1) - attention_mask.long()
    backbone = getattr(model, model.base_model_prefix)
    input_ids = torch.masked_fill(query_responses, ~attention_mask, 0)
    output = backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        return_dict=True,
        output_hidden_states=True,
        use_cache=False,
    )
    reward_logits = model.score(output.hidden_states[-1])
    lengths = _first_true_indices(query_responses[:, context:] == pad) - 1 + context
    rows = torch.arange(reward_logits.size(0))
    return reward_logits, reward_logits[rows, lengths].squeeze(-1), lengths


class _PolicyAndValue(torch.nn.Module):
    """ppo_trainer.py `PolicyAndValueWrapper`."""

    def __init__(self, policy: Any, value_model: Any) -> None:
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self.critic_backbone = getattr(value_model, value_model.base_model_prefix)

    def forward(self, **kwargs: Any) -> Any:
        output = self.critic_backbone(**kwargs)
        logits = self.value_model.score(output.hidden_states[-1])
        return self.policy(**kwargs), logits


def _models(case: Case, size: str) -> tuple[Any, Any, Any, Any]:
    import peft
    import transformers

    dtype = torch.bfloat16 if case.dtype == "bf16-true" else torch.float32

    def build(which: str, head: str) -> Any:
        config = _config(case, size, which)
        config.pop("architectures", None)
        if head == "score":
            config["num_labels"] = 1
        hf = transformers.AutoConfig.for_model(**config)
        cls = (
            transformers.AutoModelForSequenceClassification
            if head == "score"
            else transformers.AutoModelForCausalLM
        )
        return cls.from_config(hf, dtype=dtype, attn_implementation=attention_of(case.family))

    torch.manual_seed(0)
    policy = build("policy", "lm")
    value = build("value", "score")
    reward = build("value", "score").eval().requires_grad_(False)
    ref = None
    if case.method == "full":
        ref = copy.deepcopy(policy).eval().requires_grad_(False)  # create_reference_model
    else:
        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        policy = peft.get_peft_model(policy, lora)
    return policy, value, ref, reward


def measure(case: Case, size: str = "small") -> dict[str, int]:
    """Each phase's peak of allocated bytes, every model's weights included."""
    policy, value, ref, reward = _models(case, size)
    model = _PolicyAndValue(policy, value)
    model.train()
    if mixed_precision(case):
        # mixed precision: accelerate wraps the prepared wrapper's forward in autocast and
        # converts its outputs to fp32; the unwrapped policy's generation and the rollout
        # forwards run outside it
        model.forward = prepared_forward(model)  # type: ignore[method-assign]
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-5, foreach=True
    )
    vocab = _config(case, size)["vocab_size"]
    pad = 0
    local = case.batch * case.grad_accum  # local_batch_size
    chunk = case.chunk
    q = case.prompt
    peaks: dict[str, int] = {}
    tracker = StorageTracker()
    kept: Any = None  # `logitss` of the update before, alive until the new one is assigned
    with tracker:
        frozen = list(model.parameters()) + list(model.buffers())
        for other in (ref, reward):
            if other is not None:
                frozen += list(other.parameters()) + list(other.buffers())
        for tensor in frozen:
            tracker.track(tensor, "weights")
        for update in range(2):  # a warm-up update, then the measured one
            tracker.reset_peak("activations")
            queries = torch.randint(3, vocab, (local, q))
            if case.padded:
                queries[1:, : q // 4] = pad  # the collator left-pads the shorter queries
            with torch.no_grad():
                responses_list, scores_list = [], []
                for i in range(0, local, chunk):
                    query = queries[i : i + chunk]
                    attention_mask = query != pad
                    input_ids = torch.masked_fill(query, ~attention_mask, 0)
                    output = policy.generate(
                        input_ids=input_ids,
                        attention_mask=attention_mask,
                        max_new_tokens=case.response,
                        min_new_tokens=case.response,
                        temperature=TEMPERATURE,
                        top_k=0,
                        top_p=1.0,
                        do_sample=True,
                        pad_token_id=pad,
                        eos_token_id=None,
                        return_dict_in_generate=True,
                        output_scores=True,
                        disable_compile=True,
                        # without padded queries, a sampled pad token would be the only zero
                        # in the attention mask: one case in eight, by chance
                        suppress_tokens=None if case.padded else [pad],
                    )
                    stacked = torch.stack(output.scores, 1)
                    responses_list.append(torch.cat((query, output.sequences[:, q:]), dim=1))
                    del output
                    scores_list.append(stacked)
                    del stacked
                query_responses = _pad(responses_list, pad)
                logitss = _pad(scores_list, 0)
                query_responses = query_responses.view(-1, query_responses.shape[-1])[:local]
                logitss = logitss.view(-1, *logitss.shape[2:])[:local]
                del responses_list, scores_list
                kept = logitss  # the update before's scores die here, as TRL reassigns
                peaks["generate"] = tracker.peak
                tracker.reset_peak("activations")
                logprob_list: list[Any] = []
                ref_list: list[Any] = []
                value_list: list[Any] = []
                score_list: list[Any] = []
                for i in range(0, local, chunk):
                    query_response = query_responses[i : i + chunk]
                    response = query_response[:, q:]
                    logits = kept[i : i + chunk]
                    logprob = selective_log_softmax(logits, response)
                    del logits
                    if ref is None:
                        with policy.disable_adapter():
                            ref_output = _forward(policy, query_response, pad)
                    else:
                        ref_output = _forward(ref, query_response, pad)
                    ref_logits = ref_output.logits[:, q - 1 : -1]
                    ref_logits /= TEMPERATURE
                    ref_logprob = selective_log_softmax(ref_logits, response)
                    del ref_output, ref_logits
                    full_value, _, _ = _get_reward(value, query_response, pad, q)
                    value_ = full_value[:, q - 1 : -1].squeeze(-1)
                    _, score, _ = _get_reward(reward, query_response, pad, q)
                    logprob_list.append(logprob)
                    ref_list.append(ref_logprob)
                    value_list.append(value_)
                    score_list.append(score)
                logprobs = torch.cat(logprob_list, 0)
                ref_logprobs = torch.cat(ref_list, 0)
                values = torch.cat(value_list, 0)
                scores = torch.cat(score_list, 0)
                del logprob_list, ref_list, value_list, score_list
                del logprob, ref_logprob, full_value, value_, score
                # the advantages (GAE, gamma 1, lam 0.95): a few values a token
                rewards = -0.05 * (ref_logprobs - logprobs)
                rewards[:, -1] += scores
                last = torch.zeros(local)
                reversed_: list[Any] = []
                for t in reversed(range(case.response)):
                    following: Any = values[:, t + 1] if t < case.response - 1 else 0.0
                    delta = rewards[:, t] + following - values[:, t]
                    last = delta + 0.95 * last
                    reversed_.append(last)
                advantages = torch.stack(reversed_[::-1], dim=1)
                returns = advantages + values
                advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                peaks["reference_forward"] = tracker.peak
            order = torch.randperm(local)
            micro = []
            for start in range(0, local, case.batch):
                micro.append(order[start : start + case.batch])
            for index, rows in enumerate(micro):
                tracker.reset_peak("activations")
                output, vpred_temp = _forward(model, query_responses[rows], pad)
                logits = output.logits[:, q - 1 : -1]
                logits /= TEMPERATURE
                new_logprobs = selective_log_softmax(logits, query_responses[rows][:, q:])
                vpred = vpred_temp[:, q - 1 : -1].squeeze(-1)
                vpredclipped = torch.clamp(vpred, values[rows] - 0.2, values[rows] + 0.2)
                vf_losses1 = torch.square(vpred - returns[rows])
                vf_losses2 = torch.square(vpredclipped - returns[rows])
                vf_loss = 0.5 * torch.max(vf_losses1, vf_losses2).mean()
                ratio = torch.exp(new_logprobs - logprobs[rows])
                pg_losses = -advantages[rows] * ratio
                pg_losses2 = -advantages[rows] * torch.clamp(ratio, 0.8, 1.2)
                pg_loss = torch.max(pg_losses, pg_losses2).mean()
                loss = pg_loss + 0.1 * vf_loss
                peaks["forward"] = max(peaks.get("forward", 0), tracker.peak)
                tracker.reset_peak("temporaries")
                (loss / case.grad_accum).backward()
                peaks["backward"] = max(peaks.get("backward", 0), tracker.peak)
                tracker.reset_peak("temporaries")
                if index == len(micro) - 1:  # accelerator.accumulate: a step at the last
                    optimizer.step()
                    for state in optimizer.state.values():
                        for tensor in state.values():
                            if isinstance(tensor, torch.Tensor):
                                tracker.track(tensor, "optimizer_states")
                    optimizer.zero_grad()
                with torch.no_grad():
                    prob_dist = F.softmax(logits, dim=-1)
                    entropy = torch.logsumexp(logits, dim=-1) - torch.sum(
                        prob_dist * logits, dim=-1
                    )
                peaks["optimizer_step"] = max(peaks.get("optimizer_step", 0), tracker.peak)
                del entropy
            # the end of the mini-batch: its tensors deleted
            del output, vpred_temp, logits, new_logprobs, vpred, vpredclipped, prob_dist
            del vf_losses1, vf_losses2, vf_loss, ratio, pg_losses, pg_losses2, pg_loss, loss
            del query_responses, logprobs, ref_logprobs, values, scores, rewards, advantages
            del returns, logitss
            if update == 0:
                peaks.clear()
    return peaks


def predict(case: Case, size: str = "small") -> dict[str, int]:
    """The budget's allocated bytes per phase, less what no storage counter sees."""
    from llmmem.budget.ppo import estimate_ppo_budget, unseen_by_a_counter

    spec = spec_of(case, size)
    setup = setup_of(case)
    ppo = ppo_of(case, size)
    budget = estimate_ppo_budget(spec, setup, ppo)
    phases = {p.phase.value: p.allocated_bytes for p in budget.phases}
    for phase, unseen in unseen_by_a_counter(budget, spec, setup, ppo).items():
        phases[phase] -= unseen
    return phases


def grid(families: list[str], shapes: list[tuple[int, int]]) -> list[Case]:
    """Full and LoRA, fp32 and bf16, the value model the policy's size and smaller, and a
    rollout chunk smaller than the batch, for each family and shape."""
    cases = []
    for family in families:
        for prompt, response in shapes:
            for method in ("full", "lora"):
                for dtype in ("fp32", "bf16-true"):
                    cases.append(
                        Case(
                            prompt=prompt,
                            response=response,
                            method=method,
                            dtype=dtype,
                            family=family,
                        )
                    )
            cases.append(Case(prompt=prompt, response=response, value="small", family=family))
            cases.append(
                Case(
                    batch=2,
                    grad_accum=2,
                    chunk=2,
                    prompt=prompt,
                    response=response,
                    method="lora",
                    value="small",
                    family=family,
                )
            )
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmmem.verify.grid --ppo")
    parser.add_argument("--size", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--family", action="append", choices=sorted(CONFIGS["small"]))
    parser.add_argument(
        "--shape",
        action="append",
        help="query tokens x response tokens, e.g. 16x32 (default 16x32 and 32x64)",
    )
    args = parser.parse_args(argv)
    shapes = parse_shapes(parser, args.shape, ["16x32", "32x64"])
    cases = grid(args.family or list(GENERATING_FAMILIES), shapes)
    print_grid(cases, measure, predict, args.size, 48)
    return 0


if __name__ == "__main__":
    sys.exit(main())

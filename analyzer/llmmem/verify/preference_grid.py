"""Preference-training steps on the CPU, written the way TRL computes them, against the budget.

The loss is TRL 0.29.1's `DPOTrainer._compute_loss` (trl/trainer/dpo_trainer.py) restated: the
policy's forward on chosen and rejected concatenated, called without labels, the shifted copy of
its logits, `selective_log_softmax` (trl/trainer/utils.py: gather and a per-row logsumexp for fp32
logits, a per-row log_softmax for 16-bit ones), completion tokens summed; then, inside the same
call and with the policy's tensors alive, the reference forward under `torch.no_grad()`: a frozen
copy of the model (full fine-tuning) or the policy with its adapter disabled (PEFT); the sigmoid
loss; then the metrics TRL 0.29.1 logs with every tensor of the loss still alive
(`entropy_from_logits` over 128-row chunks, a boolean-mask copy of the chosen completions'
logits). With precomputed log-probabilities the loss compares the policy's own. An ORPO step
(CPO's is the same) is trl.experimental's ORPOTrainer at 0.29.1: the log-probabilities taken on a
view of the logits, no shifted copy, and the chosen half's NLL a cross-entropy over a shifted
copy of that half; the odds-ratio loss. A reward step is TRL's
`RewardTrainer.compute_loss`: a sequence-classification model on the concatenated pairs,
`-logsigmoid(chosen - rejected)`. A KTO step is TRL 0.29.1's
(trl/experimental/kto/kto_trainer.py): unpaired examples, the KL batch's log-probabilities without
gradient before the completions', the logits' index_select copies returned, the reference's the
same way. Under mixed precision (accelerate's `mixed_precision="bf16"`, which TrainingArguments'
`bf16=True` turns on, TRL's default) the forwards run as `Accelerator.prepare_model` leaves them:
under autocast and wrapped in accelerate's own `convert_outputs_to_fp32`, so the logits come back
in fp32 (the policy's, the adapter-disabled policy's and the reference copy's: TRL prepares it
too); the log-probabilities run outside it. A `bf16-true` case is under mixed precision unless
its `mixed` is False (`bf16=False` over bf16 weights).

`--trainer llamafactory` restates LLaMA-Factory 0.9.5's own CustomDPOTrainer instead
(llamafactory/train/dpo/trainer.py, trainer_utils.py `get_batch_logps`): the logits cast to
fp32, a full `log_softmax` of the view `logits[:, :-1, :]` gathered from, the policy's forward
before the reference's, whose outputs die as it returns; ORPO and SimPO without a reference and
without a cross-entropy. Its budget is `PreferenceSetup(trainer="llamafactory")`.

`measure(case)` runs a warm-up step (it makes the optimizer states) and a measured one under the
project's StorageTracker and returns the peak of each phase: the policy's forward, the reference
forward, backward and the optimizer step; `predict(case)` is the budget's figure for each.

    python -m llmmem.verify.preference_grid [--size small|medium] [--family llama|qwen2 ...]
                                            [--objective dpo|kto|orpo|reward ...]
                                            [--trainer trl|llamafactory]

The reference forward's budget counts one row's fp32 logsumexp temporary that aten makes inside
the kernel (a GPU allocates it; a dispatch-level counter cannot see it): `predict` leaves it out.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from llmmem.verify.tracker import StorageTracker

SMALL: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
    },
    "qwen2": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1500,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "pad_token_id": 0,
    },
    # Gemma-2's ways: tied embeddings, a (1 + weight) RMSNorm in fp32, norms after attention
    # and the MLP too, GELU-tanh, logits soft-capped by tanh
    "gemma2": {
        "model_type": "gemma2",
        "architectures": ["Gemma2ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "sliding_window": 256,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 16,
        "pad_token_id": 0,
    },
}


@dataclass(frozen=True)
class Case:
    family: str
    objective: str = "dpo"  # "dpo", "kto", "orpo" (no reference), "simpo" (cpo_alpha=0), "reward"
    method: str = "full"  # "full" or "lora"
    grad_ckpt: bool = False
    dtype: str = "fp32"  # "fp32", "bf16-true" or "bf16" (autocast over fp32 weights)
    reference: str | None = None  # None: TRL's default (a copy, or the adapter disabled)
    batch: int = 2  # pairs per micro-batch
    seq: int = 64
    # accelerate's mixed precision (bf16=True); None: on for bf16 and bf16-true, as TRL's
    # configs default
    mixed: bool | None = None
    # whose trainer runs the step: "trl" (TRL 0.29.1's), "trl-views" (TRL 1.6 to 1.13's DPO,
    # the log-probabilities on views of the logits) or "llamafactory" (LLaMA-Factory
    # 0.9.5's own CustomDPOTrainer: DPO, and ORPO/SimPO without a reference)
    trainer: str = "trl"

    @property
    def id(self) -> str:
        parts = [self.family, self.objective, self.method, self.dtype, f"b{self.batch}s{self.seq}"]
        if self.trainer != "trl":
            parts.insert(0, self.trainer)
        if self.mixed is False:
            parts.append("no-amp")
        if self.grad_ckpt:
            parts.append("ckpt")
        if self.reference:
            parts.append(f"ref-{self.reference}")
        return "-".join(parts)


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """TRL's selective_log_softmax (trl 0.29.1, trl/trainer/utils.py), restated."""
    index = index.unsqueeze(-1)
    if logits.dtype in (torch.float32, torch.float64):
        selected = torch.gather(logits, dim=-1, index=index)
        sums = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        per_token = selected - sums.unsqueeze(-1)
    else:
        rows = [
            F.log_softmax(row, dim=-1).gather(dim=-1, index=labels)
            for row, labels in zip(logits, index, strict=True)
        ]
        per_token = torch.stack(rows)
    return per_token.squeeze(-1)


class _Step:
    """One preference step as TRL 0.29.1 computes it, over a model it is given: `case` says
    the objective, the reference handling, the dtype and the shape (a `Case`, or any object
    with those attributes)."""

    def __init__(
        self, case: Any, model: Any, ref: Any, vocab: int, optimizer: Any, device_type: str = "cpu"
    ) -> None:
        self.case = case
        self.model = model
        self.ref = ref
        self.vocab = vocab
        self.optimizer = optimizer
        self.device_type = device_type

    @classmethod
    def for_case(cls, case: Case, size: str = "small") -> _Step:
        import peft
        import transformers

        dtype = torch.bfloat16 if case.dtype == "bf16-true" else torch.float32
        config = dict(CONFIGS[size][case.family])
        config.pop("architectures")
        # LLaMA-Factory's rm stage: a causal LM under a value head, not a classifier
        value_head = (
            case.objective == "reward" and getattr(case, "trainer", "trl") == "llamafactory"
        )
        if case.objective == "reward" and not value_head:
            config["num_labels"] = 1
        hf_config = transformers.AutoConfig.for_model(**config)
        torch.manual_seed(0)
        model_class = (
            transformers.AutoModelForSequenceClassification
            if case.objective == "reward" and not value_head
            else transformers.AutoModelForCausalLM
        )
        model = model_class.from_config(
            hf_config, dtype=dtype, attn_implementation=attention_of(case.family)
        )
        model.train()
        ref = None
        if needs_reference_copy(case):
            ref = copy.deepcopy(model).eval().requires_grad_(False)
        if case.grad_ckpt:
            model.gradient_checkpointing_enable()
            if case.method == "lora":
                model.enable_input_require_grads()
        if case.method == "lora":
            lora = peft.LoraConfig(
                r=8,
                lora_alpha=16,
                target_modules=["q_proj", "v_proj"],
                # a reward model trains its new score head whole, as TRL's RewardTrainer
                # recommends (modules_to_save=["score"])
                modules_to_save=["score"]
                if case.objective == "reward" and not value_head
                else None,
            )
            model = peft.get_peft_model(model, lora)
        if value_head:
            model = ValueHeadModel(model, config["hidden_size"], dtype)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)
        return cls(case, model, ref, config["vocab_size"], optimizer)

    def frozen_storages(self) -> list[torch.Tensor]:
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        if self.ref is not None:
            tensors += list(self.ref.parameters()) + list(self.ref.buffers())
        return tensors

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        case = self.case
        ids = torch.randint(3, self.vocab, (2 * case.batch, case.seq), device=self.device_type)
        completion = torch.ones_like(ids)
        completion[:, : case.seq // 4] = 0  # the prompt
        return ids, completion

    def forward(self, model: Any, ids: torch.Tensor, **extra: Any) -> Any:
        """The model's forward as the prepared model runs it: under mixed precision in
        autocast, its outputs converted to fp32 by accelerate's `convert_outputs_to_fp32`
        (the reference's too; the loss runs outside it)."""
        if not mixed_precision(self.case):
            return model(input_ids=ids, use_cache=False, **extra)
        return prepared_forward(model, self.device_type)(input_ids=ids, use_cache=False, **extra)

    def log_probs(self, model: Any, ids: torch.Tensor, completion: torch.Tensor) -> Any:
        outputs = self.forward(model, ids)
        shifted = outputs.logits[..., :-1, :]
        if getattr(self.case, "trainer", "trl") != "trl-views":
            shifted = shifted.contiguous()  # TRL 0.29 to 1.5
        per_token = selective_log_softmax(shifted, ids[..., 1:].contiguous())
        per_token[completion[..., 1:] == 0] = 0.0
        return outputs, shifted, per_token.sum(dim=1).chunk(2, dim=0)

    def loss(self, ids: torch.Tensor, completion: torch.Tensor, tracker: _Tracker) -> Any:
        """The loss call; `tracker.marks` gets the peak of the policy's part."""
        case = self.case
        if case.objective == "reward" and isinstance(self.model, ValueHeadModel):
            # LLaMA-Factory's PairwiseTrainer.compute_loss: `_, _, values = model(**inputs)`,
            # each sequence's score its last token's value; the pairwise collator's inputs
            # carry labels, so the causal LM computes its cross-entropy too, unread
            labels = ids.clone()
            labels[completion == 0] = -100
            _, _, values = self.forward(self.model, ids, labels=labels)
            chosen, rejected = values[:, -1].float().chunk(2)
            tracker.marks["forward"] = tracker.peak
            return -F.logsigmoid(chosen - rejected).mean()
        if case.objective == "reward":
            scores = self.forward(self.model, ids).logits.squeeze(-1)
            chosen, rejected = scores.chunk(2)
            tracker.marks["forward"] = tracker.peak
            return -F.logsigmoid(chosen - rejected).mean()
        if getattr(case, "trainer", "trl") == "llamafactory" and case.objective in (
            "dpo",
            "orpo",
            "simpo",
        ):
            return self.llamafactory_loss(ids, completion, tracker)
        if getattr(case, "trainer", "trl") == "llamafactory" and case.objective == "kto":
            return self.kto_loss(ids, completion, tracker, self.llamafactory_kto_forward)
        if case.objective == "kto":
            return self.kto_loss(ids, completion, tracker)
        if case.objective in ("orpo", "simpo"):
            loss = self.orpo_loss(ids, completion, nll=case.objective == "orpo")
            tracker.marks["forward"] = tracker.peak
            return loss
        outputs, shifted, (chosen, rejected) = self.log_probs(self.model, ids, completion)
        if case.reference == "precomputed":
            loss = -F.logsigmoid(0.1 * (chosen - rejected)).mean()
            self.dpo_metrics(shifted, completion)
            tracker.marks["forward"] = tracker.peak
            return loss
        tracker.marks["forward"] = tracker.peak
        tracker.reset_peak("activations")
        with torch.no_grad():
            if self.ref is None:
                with self.model.disable_adapter():
                    ref_out, ref_shifted, (ref_chosen, ref_rejected) = self.log_probs(
                        self.model, ids, completion
                    )
            else:
                ref_out, ref_shifted, (ref_chosen, ref_rejected) = self.log_probs(
                    self.ref, ids, completion
                )
        margin = (chosen - ref_chosen) - (rejected - ref_rejected)
        loss = -F.logsigmoid(0.1 * margin).mean()
        # the metrics run with the reference's logits and shifted copy still alive
        self.dpo_metrics(shifted, completion)
        tracker.marks["reference_forward"] = tracker.peak
        return loss

    # -- LLaMA-Factory 0.9.5's CustomDPOTrainer (llamafactory/train/dpo/trainer.py
    # `concatenated_forward`, `compute_reference_log_probs`, `get_batch_loss_metrics`;
    # llamafactory/train/trainer_utils.py `get_batch_logps`): the logits cast to fp32, a full
    # log_softmax over the view `logits[:, :-1, :]` and a gather from it; the policy's forward
    # before the reference's; ORPO and SimPO (`pref_loss`) without a reference and without a
    # cross-entropy (their NLL term is the chosen half's averaged log-probabilities)

    def llamafactory_logps(self, model: Any, ids: torch.Tensor, completion: torch.Tensor) -> Any:
        all_logits = self.forward(model, ids).logits.to(torch.float32)
        labels = ids[:, 1:].clone()
        mask = completion[:, 1:] != 0
        labels[~mask] = 0
        logits = all_logits[:, :-1, :]
        per_token = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2))
        per_token = per_token.squeeze(2)
        valid = mask.sum(-1)
        logps = (per_token * mask).sum(-1)
        return all_logits, logps, valid

    def llamafactory_loss(
        self, ids: torch.Tensor, completion: torch.Tensor, tracker: _Tracker
    ) -> Any:
        case = self.case
        all_logits, logps, valid = self.llamafactory_logps(self.model, ids, completion)
        if case.objective != "dpo":
            logps = logps / valid
        chosen, rejected = logps.chunk(2)
        tracker.marks["forward"] = tracker.peak
        if case.objective != "dpo":
            # ORPO's odds ratio (SimPO's margin costs no more): the chosen half's NLL included
            log_odds = (chosen - rejected) - (
                torch.log1p(-torch.exp(chosen)) - torch.log1p(-torch.exp(rejected))
            )
            loss = (-chosen - 0.1 * F.logsigmoid(log_odds)).mean()
            all_logits.mean().item()
            return loss
        tracker.reset_peak("activations")
        with torch.no_grad():
            if self.ref is None:
                with self.model.disable_adapter():
                    _, ref_logps, _ = self.llamafactory_logps(self.model, ids, completion)
            else:
                _, ref_logps, _ = self.llamafactory_logps(self.ref, ids, completion)
        ref_chosen, ref_rejected = ref_logps.chunk(2)
        margin = (chosen - ref_chosen) - (rejected - ref_rejected)
        loss = -F.logsigmoid(0.1 * margin).mean()
        # the metrics: means of the policy's logits, nothing logit-sized
        all_logits.mean().item()
        tracker.marks["reference_forward"] = tracker.peak
        return loss

    # -- LLaMA-Factory 0.9.5's CustomKTOTrainer (llamafactory/train/kto/trainer.py `forward`,
    # `concatenated_forward`, `compute_reference_log_probs`, `get_batch_loss_metrics`): the
    # completions' forward with gradient first, then the KL batch's without; the completions'
    # logits split by boolean masks (copies) once the KL batch is done; the reference the same
    # way under no_grad

    def llamafactory_kto_forward(
        self, model: Any, ids: torch.Tensor, completion: torch.Tensor
    ) -> Any:
        half = ids.shape[0] // 2
        logits, logps, _ = self.llamafactory_logps(model, ids[:half], completion[:half])
        with torch.no_grad():
            _, kl_logps, _ = self.llamafactory_logps(model, ids[half:], completion[half:])
        tags = torch.arange(half, device=ids.device) % 2 == 0
        chosen_logits = logits[tags]
        rejected_logits = logits[~tags]
        return logps[tags], logps[~tags], chosen_logits, rejected_logits, kl_logps

    def dpo_metrics(self, shifted: torch.Tensor, completion: torch.Tensor) -> None:
        """The metrics TRL 0.29.1's `DPOTrainer._compute_loss` logs after the loss, on the
        policy's shifted logits: `entropy_from_logits` (trl/trainer/utils.py: log_softmax,
        exp and their product over 128-row chunks), the mean logit of the chosen and of the
        rejected completion tokens (a boolean-mask copy of those rows), the chosen half's
        argmax."""
        logits = shifted.detach()
        flat = logits.reshape(-1, logits.shape[-1])
        for chunk in flat.split(128, dim=0):
            logps = F.log_softmax(chunk, dim=-1)
            _ = -(torch.exp(logps) * logps).sum(-1)
        del logps
        chosen_logits, rejected_logits = logits.chunk(2, dim=0)
        chosen_mask, rejected_mask = completion[..., 1:].chunk(2, dim=0)
        for half, mask in ((chosen_logits, chosen_mask), (rejected_logits, rejected_mask)):
            _masked_rows(half, mask).mean(-1).sum()
        chosen_logits.argmax(dim=-1)

    def orpo_loss(self, ids: torch.Tensor, completion: torch.Tensor, nll: bool = True) -> Any:
        """TRL 0.29.1's ORPO step (trl/experimental/orpo/orpo_trainer.py `concatenated_forward`,
        `get_batch_logps`, `odds_ratio_loss`; CPO's is the same with `cpo_alpha` > 0): the
        chosen half's NLL is a cross-entropy over a shifted copy of that half's logits (its
        log_softmax kept for backward, the copy freed); the log-probabilities are taken on a
        view of the logits (`logits[:, :-1, :]`, no copy), whose rows the per-row logsumexp
        keeps alive through backward. `nll=False` is CPO's step with `cpo_alpha=0` (SimPO as
        its paper writes it: `nll_loss = torch.tensor(0.0)`, no cross-entropy)."""
        half = ids.shape[0] // 2
        all_logits = self.forward(self.model, ids).logits
        if nll:
            chosen = all_logits[:half][..., :-1, :].contiguous()
            nll_loss = F.cross_entropy(
                chosen.view(-1, chosen.shape[-1]), ids[:half, 1:].reshape(-1)
            )
            del chosen
        else:
            nll_loss = torch.zeros((), device=ids.device)
        labels = ids[:, 1:].clone()
        mask = completion[:, 1:] != 0
        labels[~mask] = 0
        per_token = selective_log_softmax(all_logits[:, :-1, :], labels)
        logps = (per_token * mask).sum(-1) / mask.sum(-1)
        chosen_logps, rejected_logps = logps.chunk(2)
        log_odds = (chosen_logps - rejected_logps) - (
            torch.log1p(-torch.exp(chosen_logps)) - torch.log1p(-torch.exp(rejected_logps))
        )
        return nll_loss - 0.1 * F.logsigmoid(log_odds).mean()

    # -- KTO (trl 0.29.1, trl/experimental/kto/kto_trainer.py: `forward`, `get_batch_logps`,
    # `_compute_kl_logps`, `get_batch_loss_metrics`): unpaired examples, half desirable; the
    # first half of the rows are the completions, the second their KL (mismatched) pairs

    def batch_logps(self, logits: Any, ids: torch.Tensor, completion: torch.Tensor) -> Any:
        labels = ids[:, 1:].clone()
        mask = completion[:, 1:] != 0
        labels[~mask] = 0
        per_token = selective_log_softmax(logits[:, :-1, :], labels)
        return (per_token * mask).sum(-1)

    def kto_forward(self, model: Any, ids: torch.Tensor, completion: torch.Tensor) -> Any:
        half = ids.shape[0] // 2
        with torch.no_grad():
            kl_logits = self.forward(model, ids[half:]).logits
            kl_logps = self.batch_logps(kl_logits, ids[half:], completion[half:])
            del kl_logits
        logits = self.forward(model, ids[:half]).logits
        logps = self.batch_logps(logits, ids[:half], completion[:half])
        desirable = torch.arange(half, device=ids.device) % 2 == 0
        chosen_idx = torch.nonzero(desirable).view(-1)
        rejected_idx = torch.nonzero(~desirable).view(-1)
        return (
            logps.index_select(0, chosen_idx),
            logps.index_select(0, rejected_idx),
            logits.index_select(0, chosen_idx),
            logits.index_select(0, rejected_idx),
            kl_logps,
        )

    def kto_loss(
        self,
        ids: torch.Tensor,
        completion: torch.Tensor,
        tracker: _Tracker,
        forward: Callable[..., Any] | None = None,
    ) -> Any:
        """KTO's loss over `forward` (TRL's `kto_forward`, or LLaMA-Factory's), the policy's
        then the reference's; the logits it returns stay alive through the loss, as the
        trainers' metrics read them."""
        forward = forward or self.kto_forward
        chosen, rejected, chosen_logits, rejected_logits, kl_logps = forward(
            self.model, ids, completion
        )
        tracker.marks["forward"] = tracker.peak
        tracker.reset_peak("activations")
        with torch.no_grad():
            if self.ref is None:
                with self.model.disable_adapter():
                    ref_chosen, ref_rejected, _, _, ref_kl = forward(self.model, ids, completion)
            else:
                ref_chosen, ref_rejected, _, _, ref_kl = forward(self.ref, ids, completion)
        kl = (kl_logps - ref_kl).mean().clamp(min=0).detach()
        chosen_losses = 1 - torch.sigmoid(0.1 * (chosen - ref_chosen - kl))
        rejected_losses = 1 - torch.sigmoid(0.1 * (kl - (rejected - ref_rejected)))
        loss = torch.cat((chosen_losses, rejected_losses), 0).mean()
        tracker.marks["reference_forward"] = tracker.peak
        return loss


class ValueHeadModel(torch.nn.Module):
    """TRL 0.24's `AutoModelForCausalLMWithValueHead` (trl/models/modeling_value_head.py), as
    LLaMA-Factory 0.9.5's rm stage loads it: the causal LM called with
    `output_hidden_states=True` (and the collator's labels: its own cross-entropy, unread), its
    last hidden state through dropout and a Linear(hidden, 1) (fp32 unless the model is pure
    bf16), and its full LM logits upcast to fp32 and returned, though the pairwise loss reads
    only the values."""

    def __init__(self, lm: Any, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.pretrained_model = lm
        self.dropout = torch.nn.Dropout(0.1)
        self.summary = torch.nn.Linear(hidden, 1, dtype=dtype)

    def disable_adapter(self) -> Any:
        return self.pretrained_model.disable_adapter()

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False, labels: Any = None) -> Any:
        out = self.pretrained_model(
            input_ids=input_ids, use_cache=use_cache, output_hidden_states=True, labels=labels
        )
        hidden = self.dropout(out.hidden_states[-1])
        if hidden.dtype != self.summary.weight.dtype:
            hidden = hidden.to(self.summary.weight.dtype)
        value = self.summary(hidden).squeeze(-1)
        lm_logits = out.logits
        if lm_logits.dtype != torch.float32:
            lm_logits = lm_logits.float()
        return (lm_logits, out.loss, value)


def _masked_rows(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`logits[mask.bool()]`; under fake tensors (a simulated step), whose count of rows is
    data-dependent, a tensor of the same size: `_Step.batch` masks the first quarter of every
    sequence as its prompt."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(logits, FakeTensor):
        return logits[mask.bool()]
    seq = mask.shape[-1] + 1
    rows = mask.shape[0] * (seq - max(seq // 4, 1))
    return logits.new_empty((rows, logits.shape[-1]))


def mixed_precision(case: Any) -> bool:
    """Whether the case runs under accelerate's mixed precision: bf16 autocast over fp32
    weights always; bf16 weights unless `mixed` is False."""
    dtype = getattr(case, "dtype", "fp32")
    if dtype == "bf16":
        return True
    return dtype == "bf16-true" and getattr(case, "mixed", None) is not False


def prepared_forward(model: Any, device_type: str = "cpu") -> Callable[..., Any]:
    """The forward `Accelerator.prepare_model` gives a model under bf16 mixed precision:
    autocast, then accelerate's `convert_outputs_to_fp32` around it."""
    from accelerate.utils import convert_outputs_to_fp32

    return convert_outputs_to_fp32(torch.autocast(device_type, dtype=torch.bfloat16)(model.forward))


class _Tracker(StorageTracker):
    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[str, int] = {}


def needs_reference_copy(case: Any) -> bool:
    """DPO and KTO in full fine-tuning load a frozen second copy (TRL's default with
    `ref_model=None`); under PEFT the adapter is disabled instead, and precomputed
    log-probabilities need none."""
    return (
        case.objective in ("dpo", "kto")
        and case.method == "full"
        and case.reference != "precomputed"
    )


def measure(case: Case, size: str = "small") -> dict[str, int]:
    """Each phase's peak of allocated bytes, the weights (and a reference copy) included."""
    return measure_step(_Step.for_case(case, size))


def measure_step(step: _Step, tracker: _Tracker | None = None) -> dict[str, int]:
    """A warm-up step, then the measured one: each phase's peak, weights included."""
    tracker = tracker or _Tracker()
    with tracker:
        for tensor in step.frozen_storages():
            tracker.track(tensor, "weights")
        for measured in (False, True):
            ids, completion = step.batch()
            tracker.reset_peak("activations")
            loss = step.loss(ids, completion, tracker)
            tracker.reset_peak("temporaries")
            loss.backward()
            del loss
            backward = tracker.peak
            tracker.reset_peak("temporaries")
            step.optimizer.step()
            for state in step.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        tracker.track(value, "optimizer_states")
            optimizer_step = tracker.peak
            step.optimizer.zero_grad()
            if measured:
                peaks = dict(tracker.marks)
                peaks["backward"] = backward
                peaks["optimizer_step"] = optimizer_step
    return peaks


# the small configs at a real model's proportions (Llama-2-7B's and Qwen2.5-0.5B's ratios of
# width, MLP and vocabulary), about 60M parameters: the logits weigh against the blocks as they
# do in the real models
MEDIUM: dict[str, dict[str, Any]] = {
    "llama": {
        **SMALL["llama"],
        "hidden_size": 512,
        "intermediate_size": 1376,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    },
    "qwen2": {
        **SMALL["qwen2"],
        "hidden_size": 448,
        "intermediate_size": 2432,
        "num_hidden_layers": 4,
        "num_attention_heads": 7,
        "num_key_value_heads": 1,
        "vocab_size": 75968,
    },
    "gemma2": {
        **SMALL["gemma2"],
        # Gemma-2-2B's ratios: MLP 4 × the width, heads of 256 over a width of 2304, a
        # vocabulary 111 × the width
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 56,
        "query_pre_attn_scalar": 56,
        "vocab_size": 56832,
    },
}
CONFIGS = {"small": SMALL, "medium": MEDIUM}
# the families the GRPO and PPO grids generate with, each with its own attention and cache
GENERATING_FAMILIES = ("llama", "qwen2", "gemma2")


def spec_of(case: Case, size: str = "small") -> Any:
    from llmmem.models.architectures import spec_from_config
    from llmmem.models.spec import ModelSource

    config = CONFIGS[size][case.family]
    return spec_from_config(config, model_id=f"{size}-{case.family}", source=ModelSource.CONFIG)


def attention_of(family: str) -> str:
    """The attention a family trains with: SDPA, but eager for Gemma-2 (transformers refuses
    SDPA for it, and TRL's docs ask for eager)."""
    return "eager" if family == "gemma2" else "sdpa"


def setup_of(case: Case) -> Any:
    from llmmem.budget.setup import AttnImpl, LoraSetup, Method, Precision, TrainingSetup

    lora = (
        LoraSetup(
            r=8,
            alpha=16,
            targets=["q_proj", "v_proj"],
            modules_to_save=["score"] if case.objective == "reward" else [],
        )
        if case.method == "lora"
        else None
    )
    return TrainingSetup(
        method=Method(case.method),
        batch=case.batch,
        seq=case.seq,
        precision=Precision(case.dtype),
        optim="adamw_torch",
        grad_ckpt=case.grad_ckpt,
        lora=lora,
        attn=AttnImpl(attention_of(case.family)),
    )


def predict(case: Case, size: str = "small") -> dict[str, int]:
    """The budget's allocated bytes per phase, less what no storage counter sees."""
    from llmmem.budget.preference import estimate_preference_budget
    from llmmem.budget.preference_setup import Objective, PreferenceSetup, Reference

    spec = spec_of(case, size)
    setup = setup_of(case)
    reference = Reference(case.reference) if case.reference else None
    trainer = getattr(case, "trainer", "trl")
    # "simpo": TRL's CPO trainer with cpo_alpha=0
    simpo = case.objective == "simpo"
    pref = PreferenceSetup(
        objective=Objective.CPO if simpo else Objective(case.objective),
        reference=reference,
        mixed_precision=case.mixed,
        trainer="trl" if trainer == "trl-views" else trainer,
        cpo_alpha=0.0 if simpo else None,
        # "trl-views": TRL 1.6 to 1.13's DPOTrainer, on views of the logits
        trl_release="1.6.0" if trainer == "trl-views" else None,
    )
    budget = estimate_preference_budget(spec, setup, pref)
    # less what the kernels allocate for themselves, which no storage counter sees
    return {p.phase.value: p.allocated_bytes - p.inside_kernels for p in budget.phases}


def grid(
    families: list[str],
    objectives: list[str],
    shapes: list[tuple[int, int]],
    trainer: str = "trl",
) -> list[Case]:
    out = []
    for family, objective, (batch, seq) in itertools.product(families, objectives, shapes):
        for method, ckpt, dtype in itertools.product(
            ("full", "lora"), (False, True), ("fp32", "bf16-true", "bf16")
        ):
            out.append(
                Case(family, objective, method, ckpt, dtype, batch=batch, seq=seq, trainer=trainer)
            )
    return out


OBJECTIVES = ["dpo", "orpo", "kto", "reward"]
# the objectives whose step is told apart per trainer: TRL's CPO trainer with cpo_alpha=0
# ("simpo"; with cpo_alpha > 0 its step is ORPO's) besides the defaults; LLaMA-Factory's DPO
# trainer runs DPO, and ORPO and SimPO (its `pref_loss`), whose memory is ORPO's
TRAINER_OBJECTIVES = {
    "trl": [*OBJECTIVES, "simpo"],
    "trl-views": ["dpo"],
    "llamafactory": ["dpo", "orpo", "kto", "reward"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmmem.verify.preference_grid")
    parser.add_argument("--size", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--family", action="append", choices=sorted(SMALL))
    parser.add_argument(
        "--objective",
        action="append",
        choices=["dpo", "kto", "orpo", "reward", "simpo"],
        help="simpo: TRL's CPO trainer with cpo_alpha=0 (not in the default set)",
    )
    parser.add_argument("--shape", action="append", help="pairs x tokens, e.g. 2x64")
    parser.add_argument(
        "--trainer",
        choices=sorted(TRAINER_OBJECTIVES),
        default="trl",
        help="whose trainer the step restates: TRL 0.29.1's, or LLaMA-Factory 0.9.5's own "
        "DPO trainer (dpo, and orpo for its ORPO and SimPO)",
    )
    args = parser.parse_args(argv)
    shapes = parse_shapes(parser, args.shape, ["2x64", "1x128"])
    objectives = args.objective or (
        OBJECTIVES if args.trainer == "trl" else TRAINER_OBJECTIVES[args.trainer]
    )
    unsupported = sorted(set(objectives) - set(TRAINER_OBJECTIVES[args.trainer]))
    if unsupported:
        parser.error(
            f"--trainer {args.trainer} restates {', '.join(TRAINER_OBJECTIVES[args.trainer])}, "
            f"not {', '.join(unsupported)}"
        )
    cases = grid(args.family or sorted(SMALL), objectives, shapes, args.trainer)
    print_grid(cases, measure, predict, args.size, width=48)
    return 0


def parse_shapes(
    parser: argparse.ArgumentParser, given: list[str] | None, default: list[str]
) -> list[tuple[int, int]]:
    """`--shape AxB` values as pairs of whole numbers (the grids' shapes); a bad one is a
    usage error, not a traceback."""
    shapes = []
    for text in given or default:
        try:
            a, b = (int(n) for n in text.lower().split("x"))
        except ValueError:
            parser.error(f"--shape wants two whole numbers joined by x ({default[0]}): {text!r}")
        if a < 1 or b < 1:
            parser.error(f"--shape {text}: both numbers must be at least 1")
        shapes.append((a, b))
    return shapes


def print_grid(
    cases: list[Any],
    measure: Callable[[Any, str], dict[str, int]],
    predict: Callable[[Any, str], dict[str, int]],
    size: str,
    width: int,
) -> float:
    """One line a case: each phase's measured peak and (predicted − measured) / measured; the
    worst phase error last (returned too)."""
    worst = 0.0
    for case in cases:
        measured = measure(case, size)
        predicted = predict(case, size)
        cells = []
        for phase, got in measured.items():
            error = (predicted[phase] - got) / got
            worst = max(worst, abs(error))
            cells.append(f"{phase} {got / 2**20:.2f} MiB {error:+.1%}")
        print(f"{case.id:{width}} " + "  ".join(cells), flush=True)
    print(f"worst phase error: {worst:.1%}")
    return worst


if __name__ == "__main__":
    sys.exit(main())

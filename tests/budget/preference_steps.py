"""One preference-training step on the CPU, written the way TRL computes it, measured per phase.

The loss is TRL 0.29.1's `DPOTrainer._compute_loss` (trl/trainer/dpo_trainer.py) restated: the
policy's forward on chosen and rejected concatenated, called without labels, the shifted copy of
its logits, `selective_log_softmax` (trl/trainer/utils.py: gather and a per-row logsumexp for fp32
logits, a per-row log_softmax for 16-bit ones), completion tokens summed; then, inside the same
call and with the policy's tensors alive, the reference forward under `torch.no_grad()`: a frozen
copy of the model (full fine-tuning) or the policy with its adapter disabled (PEFT); the sigmoid
loss. A reward step is TRL's `RewardTrainer.compute_loss`: a sequence-classification model on the
concatenated pairs, `-logsigmoid(chosen - rejected)`.

`measure(case)` runs a warm-up step (it makes the optimizer states) and a measured one under the
project's StorageTracker, and returns the peak of each phase: the policy's forward, the reference
forward, backward and the optimizer step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from llmmem.verify.tracker import StorageTracker

TINY: dict[str, dict[str, Any]] = {
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
}


@dataclass(frozen=True)
class Case:
    family: str
    objective: str = "dpo"  # "dpo", "orpo" (no reference), "reward"
    method: str = "full"  # "full" or "lora"
    grad_ckpt: bool = False
    dtype: str = "fp32"  # "fp32", "bf16-true" or "bf16" (autocast over fp32 weights)
    reference: str | None = None  # None: TRL's default (a copy, or the adapter disabled)
    batch: int = 2  # pairs per micro-batch
    seq: int = 64

    @property
    def id(self) -> str:
        parts = [self.family, self.objective, self.method, self.dtype, f"b{self.batch}s{self.seq}"]
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
    def __init__(self, case: Case) -> None:
        import peft
        import transformers

        self.case = case
        dtype = torch.bfloat16 if case.dtype == "bf16-true" else torch.float32
        config = dict(TINY[case.family])
        config.pop("architectures")
        if case.objective == "reward":
            config["num_labels"] = 1
        hf_config = transformers.AutoConfig.for_model(**config)
        torch.manual_seed(0)
        cls = (
            transformers.AutoModelForSequenceClassification
            if case.objective == "reward"
            else transformers.AutoModelForCausalLM
        )
        model = cls.from_config(hf_config, dtype=dtype, attn_implementation="sdpa")
        model.train()
        self.ref = None
        if case.objective == "dpo" and case.method == "full" and case.reference != "precomputed":
            self.ref = copy.deepcopy(model).eval().requires_grad_(False)
        if case.grad_ckpt:
            model.gradient_checkpointing_enable()
            if case.method == "lora":
                model.enable_input_require_grads()
        if case.method == "lora":
            lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
            model = peft.get_peft_model(model, lora)
        self.model = model
        self.vocab = config["vocab_size"]
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)

    def frozen_storages(self) -> list[torch.Tensor]:
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        if self.ref is not None:
            tensors += list(self.ref.parameters()) + list(self.ref.buffers())
        return tensors

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        case = self.case
        ids = torch.randint(3, self.vocab, (2 * case.batch, case.seq))
        completion = torch.ones_like(ids)
        completion[:, : case.seq // 4] = 0  # the prompt
        return ids, completion

    def forward(self, model: Any, ids: torch.Tensor) -> Any:
        """The model's forward, under autocast for mixed precision (accelerate wraps the
        prepared models' forward, the reference's too; the loss runs outside it)."""
        if self.case.dtype != "bf16":
            return model(input_ids=ids, use_cache=False)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(input_ids=ids, use_cache=False)

    def log_probs(self, model: Any, ids: torch.Tensor, completion: torch.Tensor) -> Any:
        outputs = self.forward(model, ids)
        shifted = outputs.logits[..., :-1, :].contiguous()
        per_token = selective_log_softmax(shifted, ids[..., 1:].contiguous())
        per_token[completion[..., 1:] == 0] = 0.0
        return outputs, shifted, per_token.sum(dim=1).chunk(2, dim=0)

    def loss(self, ids: torch.Tensor, completion: torch.Tensor, tracker: StorageTracker) -> Any:
        """The loss call; `tracker.marks` gets the peak of the policy's part."""
        case = self.case
        if case.objective == "reward":
            scores = self.forward(self.model, ids).logits.squeeze(-1)
            chosen, rejected = scores.chunk(2)
            tracker.marks["forward"] = tracker.peak
            return -F.logsigmoid(chosen - rejected).mean()
        outputs, shifted, (chosen, rejected) = self.log_probs(self.model, ids, completion)
        tracker.marks["forward"] = tracker.peak
        tracker.reset_peak("activations")
        if case.objective != "dpo" or case.reference == "precomputed":
            margin = chosen - rejected  # ORPO-like: no reference
            return -F.logsigmoid(0.1 * margin).mean()
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
        tracker.marks["reference_forward"] = tracker.peak
        return loss


class _Tracker(StorageTracker):
    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[str, int] = {}


def measure(case: Case) -> dict[str, int]:
    """Each phase's peak of allocated bytes, the weights (and a reference copy) included."""
    step = _Step(case)
    tracker = _Tracker()
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

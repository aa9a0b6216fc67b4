"""One case of bench/trl_trainers.py, run inside the environment that has TRL.

TRL's own trainer (DPOTrainer, RewardTrainer, GRPOTrainer, trl.experimental's ORPOTrainer and
KTOTrainer) trains a model built from a config for two steps on the CPU under llmmem's
StorageTracker. Of the
second step two peaks of allocated bytes are printed as JSON: from `on_step_begin` to
`on_pre_optimizer_step` (the forward, the loss and its metrics, backward, gradient clipping) and
from there to `on_step_end` (the optimizer step), each with the function it was reached in. The
tokens are words of a word-level tokenizer, so every pair is exactly the asked length: a prompt of
half the tokens, a completion of the rest less the end-of-sequence token.

torch's AdamW runs its foreach implementation on a GPU and its for-loop one on the CPU (torch
2.13 `_default_to_fused_or_foreach`: foreach only on cuda, xpu, mtia and privateuse1 devices);
the budget sizes the GPU's step, so the trainer's optimizer is asked for foreach here.
With `"detail": true` the sizes of the storages alive at each peak (1 MiB and more) come too.

GRPO (`"objective": "grpo"`, with `"generations"`, `"prompt"`, `"completion"` and `"beta"`):
`per_device_train_batch_size` is `"batch"` completions, `steps_per_generation` is 1, so every
step generates (transformers' `generate`, no vLLM) inside `_prepare_inputs` and the measured
second step holds one generation. Its phases are split where TRL's own methods return:
`_generate_single_turn` (generation), the rest of `_generate_and_score_completions` (the
reference's log-probabilities without gradient), `compute_loss` (the policy's forward and the
loss), then backward up to `on_pre_optimizer_step`. Prompts are exactly `"prompt"` words and
`min_new_tokens = max_completion_length` keeps the end-of-sequence token from being sampled, so
every completion runs to its full length.

    python bench/trl_step.py '{"objective": "dpo", "method": "full", "batch": 2, "seq": 64,
                               "config": {...}}'
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
import warnings
from typing import Any

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PreTrainedTokenizerFast,
    TrainerCallback,
)

from llmmem.verify.tracker import StorageTracker  # noqa: E402


class PeakTracker(StorageTracker):
    """The tracker, remembering where the step's peak was reached (and, asked, what was
    alive then)."""

    where = ""
    armed = False
    detail = False
    live: list[int] = []

    def _note_peak(self) -> None:
        before = self.peak
        super()._note_peak()
        if self.armed and self.peak > before:
            self.where = _where(traceback.extract_stack())
            if self.detail:
                self.live = sorted((s for s in self.sizes.values() if s >= 2**20), reverse=True)


def _where(stack: list[Any]) -> str:
    """The innermost TRL function on the stack, else the optimizer's or autograd's."""
    for frame in reversed(stack):
        if "/trl/" in frame.filename:
            return f"{frame.name} (trl {frame.lineno})"
    for frame in reversed(stack):
        if "/torch/optim/" in frame.filename:
            return f"optimizer {frame.name}"
        if "/torch/autograd/" in frame.filename or "/torch/nn/utils/clip_grad" in frame.filename:
            return f"torch {frame.name}"
    return ""


def word(i: int) -> str:
    """The i-th word: letters only (a word-level tokenizer keeps it whole)."""
    return "w" + "".join(chr(97 + (i // 26**k) % 26) for k in range(3))


def tokenizer_for(vocab: int) -> Any:
    words = {word(i): i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token=word(1)))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=word(0), eos_token=word(2), unk_token=word(1)
    )


def dataset_for(objective: str, vocab: int, seq: int, rows: int = 8) -> Any:
    prompt = seq // 2
    completion = seq - prompt - 1  # the end-of-sequence token TRL appends

    def words(n: int, start: int) -> str:  # a space after each: text appended stays apart
        return "".join(word(3 + (start + i) % (vocab - 3)) + " " for i in range(n))

    prompts = [words(prompt, i) for i in range(rows)]
    if objective == "kto":
        return Dataset.from_dict(
            {
                "prompt": prompts,
                "completion": [words(completion, 7 * i) for i in range(rows)],
                "label": [i % 2 == 0 for i in range(rows)],
            }
        )
    return Dataset.from_dict(
        {
            "prompt": prompts,
            "chosen": [words(completion, 7 * i) for i in range(rows)],
            "rejected": [words(completion, 11 * i) for i in range(rows)],
        }
    )


def token_rows_for(vocab: int, seq: int, rows: int = 8) -> Any:
    """SFT's rows, already tokenized: `seq` token ids each (no text: SFTTrainer keeps an
    `input_ids` column as it is, truncated to `max_length`), none of them the padding token,
    so every row is exactly `seq` long and every label counts."""
    return Dataset.from_dict(
        {"input_ids": [[3 + (7 * i + j) % (vocab - 3) for j in range(seq)] for i in range(rows)]}
    )


def prompts_for(vocab: int, prompt: int, rows: int = 16) -> Any:
    """GRPO's prompts: `prompt` words each, no completion (the policy writes it)."""
    return Dataset.from_dict(
        {
            "prompt": [
                "".join(word(3 + (5 * i + j) % (vocab - 3)) + " " for j in range(prompt))
                for i in range(rows)
            ]
        }
    )


def reward_length(completions: list[str], **_: Any) -> list[float]:
    """A reward written here: the completion's distinct words (the length is fixed)."""
    return [float(len(set(text.split()))) for text in completions]


def trl_major() -> int:
    import trl

    return int(trl.__version__.split(".")[0])


def trainer_classes(objective: str) -> tuple[Any, Any]:
    if objective == "sft":
        from trl import SFTConfig, SFTTrainer

        return SFTConfig, SFTTrainer
    if objective == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        return GRPOConfig, GRPOTrainer
    if objective == "dpo":
        from trl import DPOConfig, DPOTrainer

        return DPOConfig, DPOTrainer
    if objective == "reward":
        from trl import RewardConfig, RewardTrainer

        return RewardConfig, RewardTrainer
    if objective == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        return ORPOConfig, ORPOTrainer
    if objective == "kto":
        if trl_major() >= 1:  # TRL 1.x moved KTO out of trl.experimental (fused LM head)
            from trl import KTOConfig, KTOTrainer
        else:
            from trl.experimental.kto import KTOConfig, KTOTrainer

        return KTOConfig, KTOTrainer
    raise SystemExit(f"unknown objective {objective!r}")


def run(case: dict[str, Any]) -> dict[str, Any]:
    objective, seq = case["objective"], int(case["seq"])
    config = dict(case["config"])
    config.pop("architectures", None)
    vocab = int(config["vocab_size"])
    hf = AutoConfig.for_model(**config)
    cls = AutoModelForCausalLM
    if objective == "reward":
        hf.num_labels = 1
        cls = AutoModelForSequenceClassification
    torch.manual_seed(0)
    folder = tempfile.mkdtemp()
    cls.from_config(hf).save_pretrained(folder)  # TRL loads its reference from the model's path
    peft_config = None
    if case["method"] == "lora":
        from peft import LoraConfig

        task = "SEQ_CLS" if objective == "reward" else "CAUSAL_LM"
        peft_config = LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type=task
        )
    tracker = PeakTracker()
    # the step measured (0 is the first): the second unless a GRPO case whose generation comes
    # every other step asks for a later one
    measured = int(case.get("measured_step", 1))
    tracker.detail = bool(case.get("detail"))
    seen: dict[str, Any] = {}

    def note(phase: str) -> None:
        seen[phase] = tracker.peak
        seen[phase + " where"] = tracker.where
        if tracker.detail:
            seen[phase + " live"] = tracker.live

    class Peak(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # weights loaded from a file are memory-mapped, not made by an op: count them
            models = [kw.get("model"), getattr(trainer, "ref_model", None)]
            for module in models:
                if module is not None:
                    for tensor in list(module.parameters()) + list(module.buffers()):
                        tracker.track(tensor, "weights")
            # the GPU's AdamW implementation, which the budget sizes
            for group in trainer.optimizer.param_groups:
                group["foreach"] = True

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            tracker.reset_peak("activations")
            tracker.armed = state.global_step == measured
            tracker.where, tracker.live = "", []

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if tracker.armed:
                note("backward" if objective in ("grpo", "sft") else "step")
            tracker.reset_peak("temporaries")
            tracker.where, tracker.live = "optimizer step", []

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if tracker.armed:
                note("optimizer")
            tracker.armed = False

    config_class, trainer_class = trainer_classes(objective)
    common = dict(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=int(case["batch"]),
        max_steps=measured + 1,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        # accelerate's mixed precision over fp32 weights (bf16 autocast, fp32 outputs): the
        # default of TRL 0.29's configs; off unless the case asks
        bf16=bool(case.get("bf16", False)),
        optim="adamw_torch",
        dataloader_num_workers=0,
        remove_unused_columns=False,
        # TRL 0.29's configs turn checkpointing on unless told otherwise: say which
        gradient_checkpointing=bool(case.get("grad_ckpt", True)),
    )
    extra: dict[str, Any] = {"processing_class": tokenizer_for(vocab)}
    if objective == "grpo":
        completion = int(case["completion"])
        args = config_class(
            **common,
            num_generations=int(case["generations"]),
            max_completion_length=completion,
            beta=float(case["beta"]),
            gradient_accumulation_steps=int(case.get("grad_accum", 1)),
            steps_per_generation=int(case.get("steps_per_generation", 1)),
            num_iterations=int(case.get("num_iterations", 1)),
            # the end-of-sequence token is masked until the last token: full-length completions
            generation_kwargs={"min_new_tokens": completion},
        )
        extra["reward_funcs"] = reward_length
        data = prompts_for(vocab, int(case["prompt"]))
    elif objective == "sft":
        args = config_class(**common, max_length=seq)
        data = token_rows_for(vocab, seq)
    else:
        args = config_class(**common, max_length=seq)
        data = dataset_for(objective, vocab, seq)
    with tracker:
        model = cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
        trainer = trainer_class(
            model=model,
            args=args,
            train_dataset=data,
            peft_config=peft_config,
            callbacks=[Peak()],
            **extra,
        )
        if objective == "grpo":
            split_grpo_phases(trainer, tracker, note)
        elif objective == "sft":
            split_sft_phases(trainer, tracker, note)
        trainer.train()
    if objective in ("grpo", "sft"):
        phases = [k for k in ("generate", "reference_forward", "forward", "backward") if k in seen]
        top = max(phases, key=lambda k: seen[k])
        seen["step"], seen["step where"] = seen[top], f"{top}: {seen[top + ' where']}"
    seen["peak"] = max(seen["step"], seen["optimizer"])
    return seen


def split_sft_phases(trainer: Any, tracker: PeakTracker, note: Any) -> None:
    """Note the forward's peak where SFTTrainer's `compute_loss` returns (the forward, the loss
    and its metrics); backward runs on to `on_pre_optimizer_step` (noted as "backward")."""
    compute_loss = trainer.compute_loss

    def loss(*a: Any, **kw: Any) -> Any:
        out = compute_loss(*a, **kw)
        if tracker.armed:
            note("forward")
        tracker.reset_peak("temporaries")
        tracker.where, tracker.live = "", []
        return out

    trainer.compute_loss = loss


def split_grpo_phases(trainer: Any, tracker: PeakTracker, note: Any) -> None:
    """Note a peak where each of GRPOTrainer's phases returns: the generation, the scoring
    (the reference's log-probabilities), the policy's forward and loss; backward runs on to
    `on_pre_optimizer_step` (noted as "backward" there)."""
    generate_single_turn = trainer._generate_single_turn
    generate_and_score = trainer._generate_and_score_completions
    compute_loss = trainer.compute_loss

    def restart(category: str, where: str) -> None:
        tracker.reset_peak(category)
        tracker.where, tracker.live = where, []

    def generating(*a: Any, **kw: Any) -> Any:
        restart("activations", "")
        out = generate_single_turn(*a, **kw)
        if tracker.armed:
            note("generate")
        restart("activations", "")
        return out

    def scoring(*a: Any, **kw: Any) -> Any:
        out = generate_and_score(*a, **kw)
        if tracker.armed:
            note("reference_forward")
        restart("activations", "")
        return out

    def loss(*a: Any, **kw: Any) -> Any:
        out = compute_loss(*a, **kw)
        if tracker.armed:
            note("forward")
        restart("temporaries", "")
        return out

    trainer._generate_single_turn = generating
    trainer._generate_and_score_completions = scoring
    trainer.compute_loss = loss


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))

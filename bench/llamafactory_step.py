"""One case of bench/llamafactory_trainers.py, run inside the environment that has LLaMA-Factory.

The case is a LLaMA-Factory YAML's settings (a dict, the same one llmmem reads): LLaMA-Factory's
own `get_train_args` turns it into its argument objects, `load_tokenizer`, `load_model` and
`create_ref_model` load a model saved from a config the way `llamafactory/train/<stage>/
workflow.py` does (its gradient checkpointing, its LoRA, the value head of `stage: rm`), and
CustomDPOTrainer, CustomKTOTrainer or PairwiseTrainer are built with the stage's collator. Only
the dataset is made here, already tokenized the way the collators expect (LLaMA-Factory's
`get_dataset` reads files): a prompt of half the tokens, a completion of the rest, labels
masked over the prompt, so every row is exactly `cutoff_len` tokens (a multiple of 8: the
collators pad to one). The trainer trains two steps on the CPU in fp32 under llmmem's
StorageTracker; of the second two peaks of allocated bytes are printed as JSON: from
`on_step_begin` to `on_pre_optimizer_step` (the forward, the loss and its metrics, backward)
and from there to `on_step_end` (the optimizer step), each with the function it was reached in
(the innermost LLaMA-Factory one, else TRL's, else torch's optimizer or autograd); with
`"detail": true` the sizes of the storages alive at each peak (1 MiB and more) come too.

torch's AdamW runs its for-loop implementation on the CPU; the trainer's optimizer is asked for
foreach, which a GPU runs and the budget sizes. torchaudio has no release for torch 2.13 on
the package index; LLaMA-Factory imports it only to read audio (data/mm_plugin.py), so an empty
module stands in for it.

    python bench/llamafactory_step.py '{"yaml": {...}, "config": {...}}'
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import tempfile
import traceback
import types
import warnings
from typing import Any

warnings.filterwarnings("ignore")

try:
    import torchaudio  # noqa: F401
except ImportError:
    _stand_in = types.ModuleType("torchaudio")
    _stand_in.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    sys.modules["torchaudio"] = _stand_in

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    PreTrainedTokenizerFast,
    TrainerCallback,
)

from llmmem.verify.tracker import StorageTracker  # noqa: E402

IGNORE_INDEX = -100


class PeakTracker(StorageTracker):
    """The tracker, remembering where the step's peak was reached."""

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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        """Count the contiguous copy `_log_softmax` makes of a strided input inside its kernel
        (`get_batch_logps` takes it over the view `logits[:, :-1, :]`) beside the output: the
        ops a kernel runs inside itself pass below this mode, but torch's profiler shows the copy
        (aten::_log_softmax → aten::contiguous → aten::clone, 4 B × rows × (s − 1) × V)."""
        source = args[0] if args else None
        copy = 0
        if (
            func is torch.ops.aten._log_softmax.default
            and isinstance(source, torch.Tensor)
            and not source.is_contiguous()
        ):
            copy = source.numel() * source.element_size()
        if not copy:
            return super().__torch_dispatch__(func, types, args, kwargs)
        with self.lock:
            self.current += copy
            self.totals[self.new_category] += copy
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            with self.lock:
                self.current -= copy
                self.totals[self.new_category] -= copy


def _where(stack: list[Any]) -> str:
    """The innermost LLaMA-Factory function on the stack, else TRL's, else the optimizer's or
    autograd's."""
    for marker, name in (("/llamafactory/", "lf"), ("/trl/", "trl")):
        for frame in reversed(stack):
            if marker in frame.filename:
                return f"{frame.name} ({name} {frame.lineno})"
    for frame in reversed(stack):
        if "/torch/optim/" in frame.filename:
            return f"optimizer {frame.name}"
        if "/torch/autograd/" in frame.filename or "/torch/utils/checkpoint" in frame.filename:
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


def _tokens(n: int, start: int, vocab: int) -> list[int]:
    return [3 + (start + i) % (vocab - 3) for i in range(n)]


def _encoded(prompt: list[int], completion: list[int]) -> dict[str, list[int]]:
    ids = prompt + completion
    return {
        "input_ids": ids,
        "attention_mask": [1] * len(ids),
        "labels": [IGNORE_INDEX] * len(prompt) + completion,
    }


def dataset_for(stage: str, vocab: int, seq: int, eos: int, rows: int = 8) -> Any:
    """Rows as LLaMA-Factory's preprocessing leaves them (data/processor/pairwise.py and
    feedback.py): prompt and completion token ids, the completion ending in the end-of-sequence
    token, labels masked over the prompt; KTO's with its KL row (the prompt beside another
    row's completion) and its tag."""
    prompt_len = seq // 2
    completion_len = seq - prompt_len - 1
    prompts = [_tokens(prompt_len, i, vocab) for i in range(rows)]
    chosen = [_tokens(completion_len, 7 * i, vocab) + [eos] for i in range(rows)]
    rejected = [_tokens(completion_len, 11 * i, vocab) + [eos] for i in range(rows)]
    media = {"images": [None] * rows, "videos": [None] * rows, "audios": [None] * rows}
    columns: dict[str, list[Any]] = {}
    if stage == "kto":
        for i in range(rows):
            row = _encoded(prompts[i], chosen[i])
            row.update({f"kl_{k}": v for k, v in _encoded(prompts[i], chosen[-1 - i]).items()})
            row["kto_tags"] = i % 2 == 0
            for key, value in row.items():
                columns.setdefault(key, []).append(value)
    else:
        for i in range(rows):
            row = {f"chosen_{k}": v for k, v in _encoded(prompts[i], chosen[i]).items()}
            row.update({f"rejected_{k}": v for k, v in _encoded(prompts[i], rejected[i]).items()})
            for key, value in row.items():
                columns.setdefault(key, []).append(value)
    return Dataset.from_dict({**columns, **media})


def run(case: dict[str, Any]) -> dict[str, Any]:
    from llamafactory.data import (
        KTODataCollatorWithPadding,
        PairwiseDataCollatorWithPadding,
        get_template_and_fix_tokenizer,
    )
    from llamafactory.extras.constants import IGNORE_INDEX as LF_IGNORE
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer
    from llamafactory.train.trainer_utils import create_ref_model

    assert LF_IGNORE == IGNORE_INDEX
    config = dict(case["config"])
    config.pop("architectures", None)
    vocab = int(config["vocab_size"])
    torch.manual_seed(0)
    folder = tempfile.mkdtemp()
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).save_pretrained(folder)
    tokenizer_for(vocab).save_pretrained(folder)

    settings = dict(case["yaml"])
    settings.update(
        model_name_or_path=folder,
        output_dir=tempfile.mkdtemp(),
        overwrite_output_dir=True,
        max_steps=2,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
    )
    settings.pop("optim", None)
    settings["optim"] = "adamw_torch"
    model_args, data_args, training_args, finetuning_args, _ = get_train_args(settings)
    stage = finetuning_args.stage
    seq = int(data_args.cutoff_len)

    tracker = PeakTracker()
    seen: dict[str, Any] = {}
    trainer: Any = None

    tracker.detail = bool(case.get("detail"))

    def note(phase: str) -> None:
        seen[phase] = tracker.peak
        seen[phase + " where"] = tracker.where
        if tracker.detail:
            seen[phase + " live"] = tracker.live

    class Peak(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # weights loaded from a file are memory-mapped, not made by an op: count them
            for module in (kw.get("model"), getattr(trainer, "ref_model", None)):
                if module is not None:
                    for tensor in list(module.parameters()) + list(module.buffers()):
                        tracker.track(tensor, "weights")
            for group in trainer.optimizer.param_groups:
                group["foreach"] = True

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            tracker.reset_peak("activations")
            tracker.armed = state.global_step == 1
            tracker.where = ""

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if tracker.armed:
                note("step")
            tracker.reset_peak("temporaries")
            tracker.where = "optimizer step"

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if tracker.armed:
                note("optimizer")
            tracker.armed = False

    with tracker:
        tokenizer_module = load_tokenizer(model_args)
        tokenizer = tokenizer_module["tokenizer"]
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
        model = load_model(
            tokenizer,
            model_args,
            finetuning_args,
            training_args.do_train,
            add_valuehead=stage == "rm",
        )
        data = dataset_for(stage, vocab, seq, tokenizer.eos_token_id)
        common = dict(
            model=model,
            args=training_args,
            finetuning_args=finetuning_args,
            callbacks=[Peak()],
            train_dataset=data,
            **tokenizer_module,
        )
        if stage == "rm":
            from llamafactory.train.rm.trainer import PairwiseTrainer

            collator = PairwiseDataCollatorWithPadding(
                template=template, model=model, pad_to_multiple_of=8, **tokenizer_module
            )
            trainer = PairwiseTrainer(data_collator=collator, **common)
        elif stage == "dpo":
            from llamafactory.train.dpo.trainer import CustomDPOTrainer

            collator = PairwiseDataCollatorWithPadding(
                template=template,
                model=model,
                pad_to_multiple_of=8,
                label_pad_token_id=IGNORE_INDEX,
                **tokenizer_module,
            )
            ref_model = (
                create_ref_model(model_args, finetuning_args)
                if finetuning_args.use_ref_model
                else None
            )
            trainer = CustomDPOTrainer(ref_model=ref_model, data_collator=collator, **common)
        elif stage == "kto":
            from llamafactory.train.kto.trainer import CustomKTOTrainer

            collator = KTODataCollatorWithPadding(
                template=template,
                model=model,
                pad_to_multiple_of=8,
                label_pad_token_id=IGNORE_INDEX,
                **tokenizer_module,
            )
            ref_model = create_ref_model(model_args, finetuning_args)
            trainer = CustomKTOTrainer(ref_model=ref_model, data_collator=collator, **common)
        else:
            raise SystemExit(f"stage {stage!r} is not measured here")
        trainer.train()
    seen["peak"] = max(seen["step"], seen["optimizer"])
    seen["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    seen["reference"] = type(getattr(trainer, "ref_model", None)).__name__
    inner = getattr(model, "pretrained_model", model)  # under stage rm's value head
    seen["checkpointing"] = bool(getattr(inner, "is_gradient_checkpointing", False))
    return seen


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))

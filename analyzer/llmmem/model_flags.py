"""The model an estimate flag names: looked up offline unless `--hub` asks for the network; with
`--task`, loaded with a task head in place of its vocabulary head, as a file's
`AutoModelFor{SequenceClassification,TokenClassification,QuestionAnswering}` is
(llmmem.models.task_heads, the same rule for both)."""

from __future__ import annotations

import argparse

from llmmem.errors import UsageError
from llmmem.models.spec import ModelSpec

# --task's values, as the task heads name them
TASK_FLAGS = {
    "sequence-classification": "SequenceClassification",
    "token-classification": "TokenClassification",
    "question-answering": "QuestionAnswering",
}


def add_task_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task",
        choices=["causal-lm", *TASK_FLAGS],
        default=None,
        help="the head the model is loaded with: causal-lm (its language-model head, the "
        "default) or a task head (AutoModelForSequenceClassification and the like: a head of "
        "--num-labels outputs, no vocabulary logits)",
    )
    parser.add_argument(
        "--num-labels",
        type=int,
        default=None,
        help="the task head's outputs (num_labels; default 2)",
    )


def with_task_flags(args: argparse.Namespace, spec: ModelSpec) -> ModelSpec:
    """The model under the head --task names; refused where it has none of that kind."""
    from llmmem.models.spec import ModelSpecError
    from llmmem.models.task_heads import with_task_head

    task = getattr(args, "task", None)
    labels = getattr(args, "num_labels", None)
    if task in (None, "causal-lm"):
        if labels is not None:
            raise UsageError("--num-labels needs --task with a task head")
        return spec
    if labels is not None and labels < 1:
        raise UsageError(f"--num-labels must be at least 1, got {labels}")
    try:
        return with_task_head(spec, TASK_FLAGS[task], 2 if labels is None else labels)  # type: ignore[arg-type]
    except ModelSpecError as err:
        raise UsageError(str(err)) from None


def hub_wanted(args: argparse.Namespace) -> bool:
    """--hub: the only way estimate reaches the network (--offline, the default, says so)."""
    if getattr(args, "hub", False) and getattr(args, "offline", False):
        raise UsageError("--hub and --offline: give one of them")
    return bool(getattr(args, "hub", False))


def resolve_spec(ref: str, hub: bool) -> ModelSpec:
    from llmmem.models.resolve import ModelResolutionError, resolve_model

    try:
        return resolve_model(ref, hub=hub)
    except ModelResolutionError as err:
        hint = "; --hub looks it up on the Hugging Face Hub" if err.hub_not_asked else ""
        raise UsageError(f"{err}{hint}") from None

"""A model loaded with a task head (`AutoModelForSequenceClassification`,
`...ForTokenClassification`, `...ForQuestionAnswering`) in place of its vocabulary head.

The catalog and the configs describe the language-model class (`LlamaForCausalLM`,
`BertForMaskedLM`). A script that loads the task class trains the same blocks under a head of
`num_labels` outputs (two for question answering: a start and an end score per position), with
no vocabulary logits at all. What transformers 5 builds, per family:

- an encoder (BERT, RoBERTa, DistilBERT): the masked-LM prediction head (its dense, LayerNorm
  and vocabulary bias) goes; sequence classification adds BERT's pooler (dense h × h) and a
  classifier h × num_labels (RoBERTa: a dense h × h and out_proj; DistilBERT: pre_classifier
  h × h and classifier), all with biases; token classification a classifier h × num_labels and
  question answering qa_outputs h × num_labels (2 by default), with biases, and no pooler;
- a decoder: the LM head goes (or, tied, the embedding is used no more as a head): sequence
  classification adds `score` h × num_labels without a bias, token classification `score`
  h × num_labels with one, question answering `qa_outputs` h × 2 with one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from llmmem.models.spec import ModelSpec, ModelSpecError

Task = Literal["SequenceClassification", "TokenClassification", "QuestionAnswering"]
TASKS: tuple[Task, ...] = ("SequenceClassification", "TokenClassification", "QuestionAnswering")

# encoders whose masked-LM head has a dense + LayerNorm transform (counted in their spec's head
# and norms); the task classes drop it
ENCODER_TYPES = frozenset({"bert", "roberta", "distilbert"})
# the language-model classes' suffixes, replaced by the task's
LM_SUFFIXES = ("ForCausalLM", "ForMaskedLM", "LMHeadModel", "ForConditionalGeneration")


def task_of_class(class_name: str) -> Task | None:
    """The task a model class loads (`AutoModelForTokenClassification` -> TokenClassification),
    else None."""
    for task in TASKS:
        if class_name.endswith(f"For{task}"):
            return task
    return None


def qa_outputs(spec: ModelSpec, task: Task, num_labels: int) -> int:
    """The head's outputs: num_labels, but for a decoder's question answering, whose qa_outputs
    is always h × 2 (an encoder's reads num_labels, 2 by default)."""
    if task == "QuestionAnswering" and spec.model_type not in ENCODER_TYPES:
        return 2
    return num_labels


def task_head_params(spec: ModelSpec, task: Task, num_labels: int) -> int:
    """Every parameter of the task head transformers builds for `spec`'s family."""
    h = spec.hidden_size
    outputs = qa_outputs(spec, task, num_labels)
    if spec.model_type in ENCODER_TYPES:
        classifier = h * outputs + outputs
        if task == "SequenceClassification":  # BERT's pooler, RoBERTa's dense, pre_classifier
            return h * h + h + classifier
        return classifier
    if task == "SequenceClassification":
        return h * outputs  # score, no bias
    return h * outputs + outputs


def with_task_head(spec: ModelSpec, task: Task, num_labels: int = 2) -> ModelSpec:
    """`spec` as `AutoModelFor{task}` builds it: the vocabulary head replaced by the task's
    (see the module's note), no vocabulary logits. Raises ModelSpecError for a model whose task
    class llmmem cannot build (an encoder-decoder, a vision-language model)."""
    if num_labels < 1:
        raise ModelSpecError(f"num_labels must be at least 1, got {num_labels}")
    if spec.model_type == "distilbert" and task == "QuestionAnswering" and num_labels != 2:
        # DistilBertForQuestionAnswering raises so itself
        raise ModelSpecError(
            f"DistilBERT's question answering needs num_labels 2, got {num_labels}"
        )
    if spec.is_encoder_decoder or spec.vision is not None:
        raise ModelSpecError(f"{spec.architecture} with a {task} head is not modelled")
    norms = spec.params.norms
    if spec.model_type in ENCODER_TYPES:
        norms -= 2 * spec.hidden_size  # the prediction head's LayerNorm
    params = replace(spec.params, head=task_head_params(spec, task, num_labels), norms=norms)
    base = spec.architecture
    for suffix in LM_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    outputs = str(qa_outputs(spec, task, num_labels))
    return replace(
        spec,
        architecture=f"{base}For{task}",
        params=params,
        is_causal_lm=False,
        tie_word_embeddings=False,
        notes=[
            *spec.notes,
            f"{base}For{task}: a head of {outputs} outputs in place of the vocabulary head; no "
            "vocabulary logits",
        ],
    )

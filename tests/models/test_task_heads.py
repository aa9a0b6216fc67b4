"""A model loaded for a task (`AutoModelFor{SequenceClassification,TokenClassification,
QuestionAnswering}`) is counted with its own head: the parameter count of the spec equals the real
model's, built by transformers from the same tiny config, for encoders and decoders alike, and
the budget has no vocabulary logits."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from llmmem.budget import estimate_budget
from llmmem.budget.setup import TrainingSetup
from llmmem.models.architectures import read_architecture
from llmmem.models.spec import ModelSource
from llmmem.models.task_heads import TASKS, task_of_class, with_task_head

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL_DECODER = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 320,
    "max_position_embeddings": 128,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "bert": {"model_type": "bert", **SMALL_DECODER},
    "roberta": {"model_type": "roberta", **SMALL_DECODER, "max_position_embeddings": 130},
    "distilbert": {
        "model_type": "distilbert",
        "dim": 64,
        "hidden_dim": 96,
        "n_layers": 2,
        "n_heads": 4,
        "vocab_size": 320,
        "max_position_embeddings": 128,
    },
    "llama": {"model_type": "llama", **SMALL_DECODER, "num_key_value_heads": 2},
    "llama-tied": {"model_type": "llama", **SMALL_DECODER, "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2", **SMALL_DECODER, "num_key_value_heads": 2},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 320},
}


def real_count(config: dict[str, Any], task: str, num_labels: int) -> tuple[str, int]:
    cfg = copy.deepcopy(config)
    hf_config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    hf_config.num_labels = num_labels
    auto = getattr(transformers, f"AutoModelFor{task}")
    with torch.device("meta"):
        model = auto.from_config(hf_config)
    return type(model).__name__, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_the_task_head_counts_as_transformers_builds_it(family: str, task: str) -> None:
    config = CONFIGS[family]
    spec = read_architecture(config, model_id="test/tiny", source=ModelSource.CONFIG)
    # DistilBertForQuestionAnswering accepts only 2 labels (and raises otherwise, as llmmem does)
    labels = 2 if (family, task) == ("distilbert", "QuestionAnswering") else 3
    headed = with_task_head(spec, task, num_labels=labels)
    architecture, count = real_count(config, task, num_labels=labels)
    assert headed.architecture == architecture
    assert headed.total_params == count, f"{family} {task}: {headed.total_params} vs {count}"
    assert not headed.is_causal_lm


def test_a_classifier_has_no_vocabulary_logits() -> None:
    spec = read_architecture(CONFIGS["bert"], model_id="test/tiny", source=ModelSource.CONFIG)
    setup = TrainingSetup(batch=4, seq=128)
    as_lm = estimate_budget(spec, setup)
    as_classifier = estimate_budget(with_task_head(spec, "SequenceClassification"), setup)

    def logits(budget: Any) -> int:
        return sum(
            term.bytes
            for phase in budget.phases
            for component, term in phase.components.items()
            if component.value == "logits"
        )

    assert logits(as_lm) > 0
    assert logits(as_classifier) == 0
    assert as_classifier.device_total_bytes < as_lm.device_total_bytes


@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("AutoModelForSequenceClassification", "SequenceClassification"),
        ("BertForTokenClassification", "TokenClassification"),
        ("AutoModelForQuestionAnswering", "QuestionAnswering"),
        ("AutoModelForCausalLM", None),
    ],
)
def test_the_task_is_read_from_the_class(name: str, task: str | None) -> None:
    assert task_of_class(name) == task


def test_the_script_s_task_class_and_labels_are_read(tmp_path: Any) -> None:
    from pathlib import Path

    from llmmem.extract import ProjectSettings, extract_plan

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "longtail" / "classifier_bert.py"
    text = fixture.read_text()
    (tmp_path / ".git").mkdir()
    cases = {
        "AutoModelForSequenceClassification": ("SequenceClassification", 2, "explicit"),
        "AutoModelForTokenClassification": ("TokenClassification", 2, "explicit"),
        "AutoModelForQuestionAnswering": ("QuestionAnswering", 2, "explicit"),
    }
    for class_name, (task, labels, source) in cases.items():
        target = tmp_path / "train.py"
        target.write_text(text.replace("AutoModelForSequenceClassification", class_name))
        plan = extract_plan(target, target.read_text(), settings=ProjectSettings())
        assert plan.extra["task_head"].value == task
        assert (plan.extra["num_labels"].value, plan.extra["num_labels"].source.value) == (
            labels,
            source,
        )
    target.write_text(text.replace(", num_labels=2", ""))
    plan = extract_plan(target, target.read_text(), settings=ProjectSettings())
    assert (plan.extra["num_labels"].value, plan.extra["num_labels"].source.value) == (2, "default")
    target.write_text(text.replace("AutoModelForSequenceClassification", "AutoModelForCausalLM"))
    plan = extract_plan(target, target.read_text(), settings=ProjectSettings())
    assert "task_head" not in plan.extra

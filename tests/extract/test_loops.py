"""Loops are followed as Python runs them, to a bound; a value a loop changes in ways the file
does not state is unknown, never a partial value labelled explicit."""

from __future__ import annotations

from pathlib import Path

from llmmem.extract.python import extract_python_plan
from llmmem.plan import Provenance

HEAD = (
    "from transformers import AutoModelForCausalLM, TrainingArguments\n"
    'model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")\n'
)


def plan_of(body: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    text = HEAD + body
    return extract_python_plan(tmp_path / "train.py", text)


def test_a_while_loop_runs_to_its_end(tmp_path: Path) -> None:
    plan = plan_of(
        "B = 64\nwhile B > 4:\n    B //= 2\n"
        'args = TrainingArguments(output_dir="o", per_device_train_batch_size=B)\n',
        tmp_path,
    )
    batch = plan.per_device_train_batch_size
    assert (batch.value, batch.source) == (4, Provenance.EXPLICIT)  # not 32 (one run)


def test_a_for_loop_over_stated_values_runs_each(tmp_path: Path) -> None:
    plan = plan_of(
        "ACC = 1\nfor _ in range(3):\n    ACC *= 2\n"
        "for extra in [1, 1]:\n    ACC += extra\n"
        'args = TrainingArguments(output_dir="o", gradient_accumulation_steps=ACC)\n',
        tmp_path,
    )
    assert plan.gradient_accumulation_steps.value == 10


def test_a_dict_override_loop_is_followed(tmp_path: Path) -> None:
    plan = plan_of(
        'cfg = {"per_device_train_batch_size": 16, "max_steps": 10}\n'
        'overrides = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}\n'
        "for key, value in overrides.items():\n    cfg[key] = value\n"
        'args = TrainingArguments(output_dir="o", **cfg)\n',
        tmp_path,
    )
    assert plan.per_device_train_batch_size.value == 2
    assert plan.gradient_accumulation_steps.value == 8


def test_setattr_in_a_loop_is_followed(tmp_path: Path) -> None:
    plan = plan_of(
        'args = TrainingArguments(output_dir="o", per_device_train_batch_size=16)\n'
        "for name, value in {'per_device_train_batch_size': 4}.items():\n"
        "    setattr(args, name, value)\n",
        tmp_path,
    )
    assert plan.per_device_train_batch_size.value == 4


def test_a_loop_of_unknown_length_leaves_what_it_changes_unknown(tmp_path: Path) -> None:
    plan = plan_of(
        "import sys\nB = 64\nfor arg in sys.argv:\n    B = B // 2\n"
        'args = TrainingArguments(output_dir="o", per_device_train_batch_size=B)\n',
        tmp_path,
    )
    batch = plan.per_device_train_batch_size
    assert batch.source is not Provenance.EXPLICIT
    assert batch.value != 32  # one run of the body, claimed as the file's value
    assert "loop at line 5" in (batch.note + " ".join(plan.problems))


def test_a_while_loop_past_the_bound_says_so(tmp_path: Path) -> None:
    plan = plan_of(
        "B = 10**6\nwhile B > 1:\n    B -= 1\n"
        'args = TrainingArguments(output_dir="o", per_device_train_batch_size=B)\n',
        tmp_path,
    )
    batch = plan.per_device_train_batch_size
    assert batch.source is not Provenance.EXPLICIT
    assert "more than 32 times" in (batch.note + " ".join(plan.problems))


def test_an_override_with_a_key_only_the_run_knows_unclaims_the_dict(tmp_path: Path) -> None:
    plan = plan_of(
        "import json, sys\n"
        'cfg = {"per_device_train_batch_size": 16}\n'
        "for key, value in json.load(open(sys.argv[1])).items():\n    cfg[key] = value\n"
        'args = TrainingArguments(output_dir="o", **cfg)\n',
        tmp_path,
    )
    batch = plan.per_device_train_batch_size
    assert batch.source is not Provenance.EXPLICIT
    assert batch.value != 16 or batch.source is not Provenance.EXPLICIT


def test_a_training_loop_still_reads_what_it_builds(tmp_path: Path) -> None:
    """`for epoch in range(epochs)` around the trainer: the trainer's settings are read."""
    plan = plan_of(
        "import sys\nepochs = int(sys.argv[1])\nfor epoch in range(epochs):\n"
        '    args = TrainingArguments(output_dir="o", per_device_train_batch_size=8)\n',
        tmp_path,
    )
    assert (plan.per_device_train_batch_size.value, plan.per_device_train_batch_size.source) == (
        8,
        Provenance.EXPLICIT,
    )

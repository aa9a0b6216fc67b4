"""The shell and YAML readers stay in proportion to what they read, and a config's number that
is not one is rejected where it is written, as the Python reader rejects it.

- a launcher of many backslash-continued flags is read in time linear in its length; past
  MAX_SHELL_CHARS it is refused with a line that says so (its pragmas are still read);
- shell variables that double, arithmetic past 64 bits and `${A:-${B:-...}}` nested without end
  give a problem line, not a hang or an internal error;
- a YAML whose aliases expand past MAX_ALIAS_NODES nodes is not read at all; a config reusing an
  anchor or two is read as before;
- `micro_batch_size: four`, `per_device_train_batch_size: -2` and `sequence_len: 0` each become a
  RejectedValue with the value's range, and the framework's default stands in for all three.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from llmmem.extract import extract_plan
from llmmem.extract.configs import Override, overlay_document
from llmmem.extract.shell import extract_shell_plan
from llmmem.extract.shell.reader import MAX_SHELL_CHARS
from llmmem.extract.yaml_positions import (
    MAX_ALIAS_NODES,
    KeyPath,
    PositionedYaml,
    read_positioned_yaml,
)
from llmmem.plan import Provenance, SourceRange, TrainingPlan


def launcher(size: int, last_flag: str = "--per_device_train_batch_size 3") -> str:
    """A torchrun launcher of about `size` characters: one flag a continuation line."""
    lines = ["#!/bin/bash", "torchrun --nproc_per_node 4 train.py \\"]
    written = sum(len(line) + 1 for line in lines)
    index = 0
    while written < size:
        line = f"    --option_{index} value_{index} \\"
        lines.append(line)
        written += len(line) + 1
        index += 1
    lines.append(f"    {last_flag}")
    return "\n".join(lines) + "\n"


def timed_shell_plan(path: Path, text: str) -> tuple[TrainingPlan, float]:
    started = time.monotonic()
    plan = extract_shell_plan(path, text)
    return plan, time.monotonic() - started


# -- shell launchers ------------------------------------------------------------------------


def test_a_launcher_of_many_continuation_lines_is_read_whole_in_linear_time(
    tmp_path: Path,
) -> None:
    text = launcher(900_000)  # under the bound: ~24,000 continuation lines
    assert len(text) < MAX_SHELL_CHARS
    plan, seconds = timed_shell_plan(tmp_path / "launch.sh", text)
    assert seconds < 5, seconds  # it took minutes when every flag re-scanned the file
    batch = plan.per_device_train_batch_size
    assert batch.value == 3 and batch.source is Provenance.EXPLICIT
    assert batch.range is not None and batch.range.start_line == text.count("\n") - 1


def test_a_launcher_past_the_bound_is_refused_quickly_with_its_pragmas_read(
    tmp_path: Path,
) -> None:
    text = "# llmmem: model=Qwen/Qwen2.5-0.5B\n" + launcher(2_400_000)
    plan, seconds = timed_shell_plan(tmp_path / "launch.sh", text)
    assert seconds < 2, seconds
    message = (
        "file is 2.4 MB; llmmem reads shell scripts up to 1 MB "
        "(only `# llmmem:` comments were read)"
    )
    assert plan.problems == [message]
    assert plan.unreadable == message
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-0.5B"
    assert plan.model_id.source is Provenance.PRAGMA


def test_a_number_past_the_shells_64_bits_is_not_an_internal_error(tmp_path: Path) -> None:
    text = (
        "A=16\n"
        + "A=$((A * A))\n" * 30
        + "torchrun train.py --per_device_train_batch_size $A --gradient_accumulation_steps 2\n"
    )
    plan = extract_shell_plan(tmp_path / "launch.sh", text)
    assert not any("internal error" in problem for problem in plan.problems), plan.problems
    assert any(
        "--per_device_train_batch_size comes from" in problem for problem in plan.problems
    ), plan.problems
    assert plan.gradient_accumulation_steps.value == 2  # the rest of the line is read


def test_parameters_nested_without_end_are_given_up_quickly(tmp_path: Path) -> None:
    depth = 150_000
    text = "torchrun train.py --max_steps " + "${A:-" * depth + "1" + "}" * depth + "\n"
    plan, seconds = timed_shell_plan(tmp_path / "launch.sh", text)
    assert seconds < 5, seconds  # each level scanned the file to its closing brace
    assert (
        "line 1, column 71: ${...} nests more than 8 deep; read as known only when the "
        "script runs" in plan.problems
    )


def test_a_variable_appended_to_without_end_stays_within_the_budget(tmp_path: Path) -> None:
    text = "A=x\n" + 'A="$A --flag value"\n' * 45_000 + "torchrun train.py $A --bf16\n"
    plan, seconds = timed_shell_plan(tmp_path / "launch.sh", text)
    assert seconds < 5, seconds
    assert any(
        "the script expands its variables past 1000000 pieces" in problem
        for problem in plan.problems
    ), plan.problems
    assert plan.precision.value == "bf16"


# -- YAML aliases ---------------------------------------------------------------------------

BOMB = (
    "base_model: Qwen/Qwen2.5-0.5B\n"
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{name}: &{name} [{','.join([f'*{previous}'] * 9)}]\n"
        for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
    )
)


def test_a_yaml_whose_aliases_expand_without_end_is_not_read() -> None:
    assert len(BOMB) < 500
    started = time.monotonic()
    document = read_positioned_yaml(BOMB)
    assert time.monotonic() - started < 1
    message = f"the YAML expands its aliases past {MAX_ALIAS_NODES} nodes; not read"
    assert document.value is None
    assert document.refused == message
    assert document.problems == (message,)


def test_the_bomb_as_a_config_gives_the_line_and_no_settings(tmp_path: Path) -> None:
    config = tmp_path / "axolotl.yaml"
    config.write_text(BOMB)
    started = time.monotonic()
    plan = extract_plan(config)
    assert time.monotonic() - started < 2
    message = f"the YAML expands its aliases past {MAX_ALIAS_NODES} nodes; not read"
    assert plan.problems == [message]
    assert plan.unreadable == message
    assert plan.model_id is None or plan.model_id.source is not Provenance.EXPLICIT


def test_merges_of_a_large_mapping_count_against_the_bound() -> None:
    keys = "".join(f"  key_{index}: {index}\n" for index in range(2_000))
    text = "base: &base\n" + keys + "merged:\n  <<: [" + ", ".join(["*base"] * 20) + "]\n"
    document = read_positioned_yaml(text)
    assert document.refused is not None


ANCHORED = """\
base_model: meta-llama/Llama-3.1-8B
lora_target_modules: &targets
  - q_proj
  - v_proj
defaults: &training
  micro_batch_size: 2
  sequence_len: 2048
<<: *training
adapter: lora
lora_r: 16
peft_layers_to_transform: *targets
"""


def test_a_config_reusing_an_anchor_or_two_is_read(tmp_path: Path) -> None:
    document = read_positioned_yaml(ANCHORED)
    assert document.refused is None and document.problems == ()
    assert document.value["micro_batch_size"] == 2
    assert document.value["peft_layers_to_transform"] == ["q_proj", "v_proj"]
    config = tmp_path / "axolotl.yaml"
    config.write_text(ANCHORED)
    plan = extract_plan(config)
    assert plan.per_device_train_batch_size.value == 2
    assert plan.max_seq_length.value == 2048
    assert plan.lora is not None and plan.lora.target_modules.value == ["q_proj", "v_proj"]
    assert plan.unreadable is None


def test_aliases_up_to_the_bound_are_read() -> None:
    items = ", ".join(str(index) for index in range(99))
    uses = MAX_ALIAS_NODES // 100  # each alias visits the list and its 99 items again
    text = f"block: &block [{items}]\n" + "".join(f"use_{i}: *block\n" for i in range(uses))
    document = read_positioned_yaml(text)
    assert document.refused is None
    assert document.value[f"use_{uses - 1}"][-1] == 98


# -- numbers that are not numbers -----------------------------------------------------------

AXOLOTL = """\
base_model: Qwen/Qwen2.5-0.5B
adapter: lora
lora_r: 16
micro_batch_size: {batch}
gradient_accumulation_steps: 4
sequence_len: 512
"""


def rejected_of(plan: TrainingPlan) -> dict[str, tuple[str, SourceRange | None]]:
    return {rejected.key: (rejected.message, rejected.range) for rejected in plan.rejected}


def test_axolotl_batches_that_are_not_counts_are_rejected_alike(tmp_path: Path) -> None:
    config = tmp_path / "axolotl.yaml"
    for written in ("four", "-2", "0"):
        config.write_text(AXOLOTL.format(batch=written))
        plan = extract_plan(config)
        message, located = rejected_of(plan)["per_device_train_batch_size"]
        assert written in message
        assert located == SourceRange(
            start_line=3, start_col=18, end_line=3, end_col=18 + len(written)
        )
        # axolotl's own default stands in, whatever the value written
        assert plan.per_device_train_batch_size.value == 1, written
        assert plan.per_device_train_batch_size.source is Provenance.DEFAULT


LLAMAFACTORY = """\
model_name_or_path: Qwen/Qwen2.5-0.5B
stage: sft
finetuning_type: lora
lora_rank: eight
per_device_train_batch_size: four
gradient_accumulation_steps: -2
cutoff_len: 0
flash_attn: maybe
"""


def test_llamafactory_numbers_that_are_not_numbers_are_rejected_where_written(
    tmp_path: Path,
) -> None:
    config = tmp_path / "sft.yaml"
    config.write_text(LLAMAFACTORY)
    plan = extract_plan(config)
    rejected = rejected_of(plan)
    # a value that is not a number the key could take: a problem line, not a rejected number
    assert "line 8, column 13: unknown flash_attn 'maybe'" in plan.problems
    assert set(rejected) == {
        "lora.r",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "max_seq_length",
    }
    lines = {key: located.start_line for key, (_, located) in rejected.items() if located}
    assert lines == {
        "lora.r": 3,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 5,
        "max_seq_length": 6,
    }
    assert rejected["lora.r"][0] == "lora_rank must be a whole number, got 'eight'"
    assert rejected["per_device_train_batch_size"][0] == "must be a whole number, got 'four'"


def test_a_deepspeed_json_rejects_its_numbers_in_that_file(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(
        '{\n  "train_micro_batch_size_per_gpu": "auto",\n'
        '  "zero_optimization": {"stage": "three", "reduce_bucket_size": -5}\n}\n'
    )
    config = tmp_path / "axolotl.yaml"
    config.write_text(AXOLOTL.format(batch=2) + "deepspeed: ds.json\n")
    rejected = rejected_of(extract_plan(config))
    stage_message, stage_range = rejected["distributed.zero_stage"]
    assert stage_message == "zero_optimization.stage must be a whole number, got 'three'"
    assert stage_range is not None and stage_range.path is not None
    assert Path(stage_range.path).name == "ds.json" and stage_range.start_line == 2
    assert "distributed.reduce_bucket_size" in rejected


def test_a_json_hf_config_rejects_a_batch_that_is_not_a_number(tmp_path: Path) -> None:
    config = tmp_path / "args.json"
    config.write_text(
        '{\n  "model_name_or_path": "Qwen/Qwen2.5-0.5B",\n'
        '  "per_device_train_batch_size": "four"\n}\n'
    )
    message, located = rejected_of(extract_plan(config))["per_device_train_batch_size"]
    assert message == "must be a whole number, got 'four'"
    assert located is not None and located.start_line == 2


def test_a_launcher_carries_the_rejections_of_the_config_it_starts(tmp_path: Path) -> None:
    (tmp_path / "sft.yaml").write_text(LLAMAFACTORY)
    launch = tmp_path / "train.sh"
    launch.write_text("llamafactory-cli train sft.yaml \\\n    cutoff_len=nine\n")
    rejected = rejected_of(extract_plan(launch))
    message, located = rejected["max_seq_length"]
    assert message == "cutoff_len must be a whole number, got 'nine'"
    assert located is not None and located.path is None and located.start_line == 1
    assert rejected["lora.r"][1] is not None
    assert Path(rejected["lora.r"][1].path or "").name == "sft.yaml"


def test_a_here_document_deepspeed_config_rejects_in_the_launcher(tmp_path: Path) -> None:
    launch = tmp_path / "run.sh"
    launch.write_text(
        "cat > ds.json <<JSON\n"
        '{"train_micro_batch_size_per_gpu": "four", "zero_optimization": {"stage": 2}}\n'
        "JSON\n"
        "torchrun train.py --deepspeed ds.json\n"
    )
    message, located = rejected_of(extract_plan(launch))["per_device_train_batch_size"]
    assert message == "train_micro_batch_size_per_gpu must be a whole number, got 'four'"
    assert located is not None and located.path is None and located.start_line == 1


# -- overrides laid over a document ---------------------------------------------------------


def overlay_one_at_a_time(document: PositionedYaml, overrides: list[Override]) -> dict[Any, Any]:
    """The ranges as laying each override in turn gives them: the reference the one-pass
    overlay must agree with."""
    ranges = dict(document.ranges)
    for override in overrides:
        if not override.path:
            continue
        for existing in [p for p in ranges if p[: len(override.path)] == override.path]:
            del ranges[existing]
        ranges[override.path] = override.range
    return ranges


paths = st.lists(st.sampled_from(["a", "b", "c"]), min_size=0, max_size=3).map(tuple)


@settings(max_examples=200, deadline=None)
@given(document_paths=st.lists(paths, max_size=8), override_paths=st.lists(paths, max_size=8))
def test_overlaid_ranges_are_those_of_laying_each_override_in_turn(
    document_paths: list[KeyPath], override_paths: list[KeyPath]
) -> None:
    document = PositionedYaml(
        value={},
        ranges={
            path: SourceRange(start_line=index, start_col=0, end_line=index, end_col=1)
            for index, path in enumerate(document_paths)
        },
    )
    overrides = [
        Override(
            path,
            index,
            SourceRange(path="cli", start_line=index, start_col=0, end_line=index, end_col=1),
        )
        for index, path in enumerate(override_paths)
    ]
    expected = overlay_one_at_a_time(document, overrides)
    got = overlay_document(document, overrides).ranges
    assert list(got.items()) == list(expected.items())

"""The shell and YAML readers stay in proportion to what they read.

- a launcher of many backslash-continued flags is read in time linear in its length; past
  MAX_SHELL_CHARS it is refused with a line that says so (its pragmas are still read);
- shell variables that double, arithmetic past 64 bits and `${A:-${B:-...}}` nested without end
  give a problem line, not a hang or an internal error;
- a YAML whose aliases expand past MAX_ALIAS_NODES nodes is not read at all; a config reusing an
  anchor or two is read as before.
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

"""What every offered fix keeps, over every fixture and example and over generated launchers.

`test_fix_titles.py` checks that each fix, applied, parses and gives the total in its title.
This adds what a user would notice beyond the number:

- the bytes a fix is not about stay: every comment, tab-indented line, the byte-order mark
  and the line endings (a CRLF file stays CRLF, as the editor applies the edits to it);
- a shell launcher still splits into the same commands, with the written flag a word of its own;
- `llmmem-lint --fix` run a second time on the fixed file changes nothing.

The same checks run on launchers generated from their parts (launcher, flag spelling `--k v`,
`--k=v` or `k=v`, quotes, one line or one flag per continuation line, a trailing comment,
CRLF), each launcher written beside the script or config it starts.
"""

from __future__ import annotations

import codecs
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmmem.check import check_text
from llmmem.extract.shell import ShellScanner
from llmmem.lint_command import lint_main
from llmmem.rules.finding import Fix
from llmmem.rules.text_edits import apply_edits
from llmmem.units import format_bytes

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SUFFIXES = {".py", ".yaml", ".yml", ".json", ".sh", ".ipynb"}
FILES = sorted(
    path
    for folder in (FIXTURES, ROOT / "examples")
    for path in folder.rglob("*")
    if path.is_file() and path.suffix in SUFFIXES
)
# the kinds an editor applies edits to as text (a notebook's edits are to its cells)
TEXT_FILES = [path for path in FILES if path.suffix != ".ipynb"]
GPUS = ("RTX-4090", "A100-80GB")
COMMENTED = {".py", ".sh", ".yaml", ".yml"}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fixes_of(path: Path, text: str, gpu: str) -> list[Fix]:
    checked = check_text(path, text, gpu=gpu, hub=False)
    unique: dict[str, Fix] = {}
    for finding in checked.findings:
        for fix in finding.fixes:
            if not fix.safe and fix.predicted_device_bytes is None:
                continue  # a pragma to fill in (LLM010): no memory change to check
            unique.setdefault(fix.title, fix)
    return list(unique.values())


def comments(path: Path, text: str) -> list[str]:
    """The comment text of each line that has one (`# ...` to the end of the line)."""
    if path.suffix not in COMMENTED:
        return []
    found = []
    for line in text.splitlines():
        at = line.find("#")
        if at >= 0 and (at == 0 or line[at - 1] in " \t"):
            found.append(line[at:].rstrip("\r"))
    return found


def endings(text: str) -> set[str]:
    return set(re.findall(r"\r\n|\r|\n", text))


def check_kept(path: Path, before: str, after: str, title: str) -> None:
    """The bytes the fix is not about are the same after it."""
    assert after.startswith(codecs.BOM_UTF8.decode()) == before.startswith(
        codecs.BOM_UTF8.decode()
    ), title
    if endings(before):
        assert endings(after) <= endings(before), (title, endings(after))
    remaining = comments(path, after)
    for comment in comments(path, before):
        assert comment in remaining, (title, comment)
        remaining.remove(comment)
    after_lines = after.splitlines()
    for line in before.splitlines():
        if "\t" in line:
            assert line in after_lines, (title, line)


def check_shell(before: str, after: str, fix: Fix) -> None:
    """The launcher still scans without new problems, and each written flag is a word."""
    scanner = ShellScanner(after)
    commands = scanner.commands()
    assert len(scanner.problems) <= len(ShellScanner(before).problems), scanner.problems
    assert len(commands) == len(ShellScanner(before).commands()), fix.title
    words = {after[word.start : word.end] for command in commands for word in command.words}
    for edit in fix.edits:
        for written in edit.new_text.replace("\\\n", " ").replace("\\\r\n", " ").split():
            if written.startswith("-") or "=" in written:
                # an edit is trimmed to what changed: `--x="16"` -> `--x="4"` writes `--x="4`
                # before the kept closing quote; the flag must still lie inside one word
                assert any(word.startswith(written) for word in words), (fix.title, written)


def check_fix(path: Path, text: str, fix: Fix, gpu: str, before_bytes: int) -> str:
    after = apply_edits(text, fix.edits)
    assert after != text, fix.title
    check_kept(path, text, after, fix.title)
    if path.suffix == ".sh":
        check_shell(text, after, fix)
    budget = check_text(path, after, gpu=gpu, hub=False).analysis.budget
    assert budget is not None, fix.title
    assert f"→ {format_bytes(budget.device_total_bytes)}" in fix.title, fix.title
    assert budget.device_total_bytes < before_bytes, fix.title
    return after


def variants(path: Path) -> list[tuple[str, str]]:
    """The file as written, and (a text file with LF endings) with CRLF endings and a BOM."""
    text = path.read_text(encoding="utf-8", errors="replace")
    found = [("as-is", text)]
    if "\r" not in text and path.suffix in (".py", ".sh", ".yaml", ".yml"):
        found.append(("crlf", text.replace("\n", "\r\n")))
    if path.suffix in (".yaml", ".yml", ".json") and not text.startswith("\ufeff"):
        found.append(("bom", "\ufeff" + text))
    return found


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("path", TEXT_FILES, ids=rel)
def test_each_fix_keeps_what_it_is_not_about(path: Path, gpu: str, tmp_path: Path) -> None:
    for name, text in variants(path):
        # beside its neighbours (a launcher's script, a config's DeepSpeed file)
        target = path if name == "as-is" else tmp_path / path.name
        if name != "as-is":
            for sibling in path.parent.iterdir():
                if sibling.is_file() and sibling != path:
                    shutil.copy(sibling, tmp_path / sibling.name)
            target.write_bytes(text.encode("utf-8"))
        budget = check_text(target, text, gpu=gpu, hub=False).analysis.budget
        for fix in fixes_of(target, text, gpu):
            if any(edit.range.path is not None for edit in fix.edits):
                continue
            assert budget is not None
            check_fix(target, text, fix, gpu, budget.device_total_bytes)


def lint_fix(path: Path, gpu: str) -> bytes:
    lint_main([str(path), "--gpu", gpu, "--fix", "--exit-zero", "--format", "concise"])
    return path.read_bytes()


def fixed_twice(path: Path, gpu: str, folder: Path, crlf: bool = False) -> tuple[bytes, bytes]:
    """The file's bytes before and after `llmmem-lint --fix`, checked to be what a second
    `--fix` leaves, and to keep what the fixes are not about."""
    for sibling in path.parent.iterdir():
        if sibling.is_file():
            shutil.copy(sibling, folder / sibling.name)
    copy = folder / path.name
    if crlf:
        copy.write_bytes(copy.read_bytes().replace(b"\n", b"\r\n"))
    original = copy.read_bytes()
    once = lint_fix(copy, gpu)
    if once != original and path.suffix != ".ipynb":
        before = original.decode("utf-8", errors="replace")
        after = once.decode("utf-8", errors="replace")
        check_kept(path, before, after, "llmmem-lint --fix")
        if path.suffix == ".sh":
            assert len(ShellScanner(after).commands()) == len(ShellScanner(before).commands())
    twice = lint_fix(copy, gpu)
    assert twice == once, rel(path)
    return original, once


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("path", FILES, ids=rel)
def test_lint_fix_a_second_time_changes_nothing(
    path: Path, gpu: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixed_twice(path, gpu, tmp_path)
    if path.suffix in (".sh", ".yaml", ".yml", ".py") and b"\r" not in path.read_bytes():
        crlf = tmp_path / "crlf"
        crlf.mkdir()
        fixed_twice(path, gpu, crlf, crlf=True)
    capsys.readouterr()


@pytest.mark.parametrize(
    "name",
    ["shell/launch_deepspeed.sh", "shell/launch_tune.sh", "configs/axolotl_qlora.yml"],
)
def test_lint_fix_does_change_these(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the property above must not hold only because nothing was fixed
    original, once = fixed_twice(FIXTURES / name, "RTX-4090", tmp_path)
    capsys.readouterr()
    assert once != original


# -- generated launchers


SCRIPT = """\
from transformers import HfArgumentParser, Trainer, TrainingArguments

parser = HfArgumentParser(TrainingArguments)
(args,) = parser.parse_args_into_dataclasses()
"""

LAUNCHERS = {
    "torchrun": "torchrun --nproc_per_node 1 train.py",
    "accelerate": "accelerate launch --num_processes 1 train.py",
    "deepspeed": "deepspeed --num_gpus 1 train.py",
    "python": "python train.py",
    "trl": "trl sft --dataset_name trl-lib/Capybara",
}
MODELS = ("meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-8B")


@st.composite
def launchers(draw: st.DrawFn) -> str:
    launcher = draw(st.sampled_from(sorted(LAUNCHERS)))
    model = draw(st.sampled_from(MODELS))
    flags = [("model_name_or_path", model), ("output_dir", "out")]
    flags.append(("per_device_train_batch_size", str(draw(st.sampled_from((2, 4, 8, 16))))))
    flags.append(("max_length" if launcher == "trl" else "max_steps", "1024"))
    if draw(st.booleans()):
        flags.append(("gradient_accumulation_steps", str(draw(st.sampled_from((1, 2, 4))))))
    if draw(st.booleans()):
        flags.append(("optim", draw(st.sampled_from(("adamw_torch", "adamw_torch_fused")))))
    if draw(st.booleans()):
        flags.append(("bf16", ""))
    flags = draw(st.permutations(flags))
    words = []
    for name, value in flags:
        if not value:
            words.append(f"--{name}")
            continue
        if draw(st.booleans()):
            value = f'"{value}"'
        words.append(f"--{name}={value}" if draw(st.booleans()) else f"--{name} {value}")
    comment = "  # the run" if draw(st.booleans()) else ""
    if draw(st.booleans()):
        body = LAUNCHERS[launcher] + "".join(f" \\\n    {word}" for word in words)
    else:
        body = " ".join([LAUNCHERS[launcher], *words])
    text = f"#!/bin/bash\n# generated\n{body}{comment}\n"
    return text.replace("\n", "\r\n") if draw(st.booleans()) else text


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=launchers(), gpu=st.sampled_from(("RTX-4090", "A100-40GB")))
def test_generated_launchers_fixes_keep_the_command_line(
    text: str, gpu: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("launch")
    (folder / "train.py").write_text(SCRIPT, encoding="utf-8")
    path = folder / "launch.sh"
    path.write_bytes(text.encode("utf-8"))
    budget = check_text(path, text, gpu=gpu, hub=False).analysis.budget
    assert budget is not None
    for fix in fixes_of(path, text, gpu):
        check_fix(path, text, fix, gpu, budget.device_total_bytes)


# -- generated configs

AXOLOTL_PLUGINS = (
    "",
    "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin  # cce\n",
    "plugins:\n- my_org.plugins.Logging\n- my_org.plugins.Other\n",
    "plugins: [my_org.plugins.Logging]\n",
    "plugins: []\n",
)


@st.composite
def axolotl_configs(draw: st.DrawFn) -> str:
    lines = [
        f"base_model: {draw(st.sampled_from(MODELS))}",
        "# generated\tconfig",
        f"micro_batch_size: {draw(st.sampled_from((2, 4, 8)))}",
        f"gradient_accumulation_steps: {draw(st.sampled_from((1, 2)))}",
        f"sequence_len: {draw(st.sampled_from((1024, 4096)))}",
    ]
    if draw(st.booleans()):
        lines.append(f"gradient_checkpointing: {draw(st.sampled_from(('false', 'true')))}")
    if draw(st.booleans()):
        lines.append(f"optimizer: {draw(st.sampled_from(('adamw_torch', 'adamw_torch_fused')))}")
    if draw(st.booleans()):
        lines += ["adapter: lora", "lora_r: 16", "lora_target_linear: true"]
    lines = draw(st.permutations(lines))
    text = "\n".join(lines) + "\n" + draw(st.sampled_from(AXOLOTL_PLUGINS))
    return text.replace("\n", "\r\n") if draw(st.booleans()) else text


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=axolotl_configs(), gpu=st.sampled_from(("RTX-4090", "A100-40GB")))
def test_generated_axolotl_configs_fixes_keep_the_rest(
    text: str, gpu: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import yaml

    path = tmp_path_factory.mktemp("axolotl") / "config.yml"
    path.write_bytes(text.encode("utf-8"))
    budget = check_text(path, text, gpu=gpu, hub=False).analysis.budget
    assert budget is not None
    for fix in fixes_of(path, text, gpu):
        after = check_fix(path, text, fix, gpu, budget.device_total_bytes)
        document = yaml.safe_load(after)
        plugins = document.get("plugins") or []
        assert len(plugins) == len(set(plugins)), fix.title  # nothing listed twice
        before_plugins = yaml.safe_load(text).get("plugins") or []
        assert plugins[: len(before_plugins)] == before_plugins, fix.title


# -- generated scripts


@st.composite
def trainer_scripts(draw: st.DrawFn) -> str:
    model = draw(st.sampled_from(MODELS))
    keywords = [
        'output_dir="out"',
        f"per_device_train_batch_size={draw(st.sampled_from((2, 4, 8)))}",
    ]
    if draw(st.booleans()):
        keywords.append(f"gradient_accumulation_steps={draw(st.sampled_from((1, 2)))}")
    if draw(st.booleans()):
        keywords.append(f'optim="{draw(st.sampled_from(("adamw_torch", "adamw_torch_fused")))}"')
    if draw(st.booleans()):
        keywords.append(f"gradient_checkpointing={draw(st.sampled_from(('False', 'True')))}")
    if draw(st.booleans()):
        keywords.append("bf16=True")
    keywords = draw(st.permutations(keywords))
    comment = "  # the last one" if draw(st.booleans()) else ""
    if draw(st.booleans()):
        trailing = "," if draw(st.booleans()) else ""
        body = "".join(f"    {keyword},\n" for keyword in keywords[:-1])
        arguments = f"\n{body}    {keywords[-1]}{trailing}{comment}\n"
    else:
        arguments = ", ".join(keywords)
    text = (
        "# generated\n"
        "import torch\n"
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n\n"
        f'model = AutoModelForCausalLM.from_pretrained("{model}", torch_dtype=torch.bfloat16)\n'
        f"args = TrainingArguments({arguments})\n"
        "trainer = Trainer(model=model, args=args)\n"
        "trainer.train()\n"
    )
    return text.replace("\n", "\r\n") if draw(st.booleans()) else text


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=trainer_scripts(), gpu=st.sampled_from(("RTX-4090", "A100-40GB")))
def test_generated_trainer_scripts_fixes_keep_the_rest(
    text: str, gpu: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("script") / "train.py"
    path.write_bytes(text.encode("utf-8"))
    budget = check_text(path, text, gpu=gpu, hub=False).analysis.budget
    assert budget is not None
    for fix in fixes_of(path, text, gpu):
        after = check_fix(path, text, fix, gpu, budget.device_total_bytes)
        compile(after, str(path), "exec", dont_inherit=True)

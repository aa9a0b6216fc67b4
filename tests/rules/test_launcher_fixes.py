"""Fixes of a shell launcher edit the flags on its command line, as its program reads them.

Each case writes a launcher (and the script or config it starts) to a folder, asks for the
fixes as `llmmem-lint` and the editor do, applies one, and checks what a user would see: the
edited script's text (only the flag changed; continuations, quotes, comments and line endings
kept) and its estimate read again, which is the title's number.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from llmmem.check import check_text
from llmmem.extract.shell import ShellScanner
from llmmem.rules.finding import Fix
from llmmem.rules.text_edits import apply_edits
from llmmem.units import format_bytes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHELL = FIXTURES / "shell"

LIGER = "Use Liger's fused linear cross-entropy"
HALVE = "Halve the micro-batch, double the accumulation"
CHECKPOINTING = "Enable gradient checkpointing"
QLORA = "Switch to QLoRA (4-bit NF4 base weights)"


def fixes_of(path: Path, text: str, gpu: str) -> dict[str, Fix]:
    checked = check_text(path, text, gpu=gpu, hub=False)
    return {fix.title.split(" → ")[0]: fix for finding in checked.findings for fix in finding.fixes}


def fixed(path: Path, title: str, gpu: str = "RTX-4090") -> str:
    """The launcher after the fix titled `title`, checked to give the title's total, lower
    than before, and to still split into words."""
    text = path.read_bytes().decode("utf-8")
    before = check_text(path, text, gpu=gpu, hub=False).analysis.budget
    fixes = fixes_of(path, text, gpu)
    assert title in fixes, sorted(fixes)
    after_text = apply_edits(text, fixes[title].edits)
    ShellScanner(after_text).commands()
    after = check_text(path, after_text, gpu=gpu, hub=False).analysis.budget
    assert before is not None and after is not None
    assert f"→ {format_bytes(after.device_total_bytes)}" in fixes[title].title
    assert after.device_total_bytes < before.device_total_bytes
    return after_text


def folder(tmp_path: Path, *names: str) -> Path:
    for name in names:
        source = next(FIXTURES.rglob(name))
        shutil.copy(source, tmp_path / name)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


def test_deepspeed_launcher_adds_hf_checkpointing_flag_on_a_continuation_line() -> None:
    # finetune.py is not beside the file; the command line uses HF names, so HF flags are read
    path = SHELL / "launch_deepspeed.sh"
    text = path.read_text(encoding="utf-8")
    after = fixed(path, CHECKPOINTING)
    assert after == text.replace(
        "    --output_dir $OUT 2>&1",
        "    --output_dir $OUT \\\n    --gradient_checkpointing 2>&1",
    )


def test_deepspeed_launcher_halves_batch_and_adds_accumulation() -> None:
    path = SHELL / "launch_deepspeed.sh"
    text = path.read_text(encoding="utf-8")
    after = fixed(path, HALVE)
    expected = text.replace("--per_device_train_batch_size 4", "--per_device_train_batch_size 2")
    expected = expected.replace(
        "    --output_dir $OUT 2>&1",
        "    --output_dir $OUT \\\n    --gradient_accumulation_steps 2 2>&1",
    )
    assert after == expected


def test_torchtune_launcher_halves_with_key_value_overrides() -> None:
    path = SHELL / "launch_tune.sh"
    text = path.read_text(encoding="utf-8")
    after = fixed(path, HALVE)
    assert after == text.replace(
        "batch_size=4 gradient_accumulation_steps=2", "batch_size=2 gradient_accumulation_steps=4"
    )


def test_torchrun_variable_used_once_is_changed_at_its_assignment() -> None:
    path = SHELL / "launch_torchrun.sh"
    text = path.read_text(encoding="utf-8")
    after = fixed(path, HALVE)
    assert after == text.replace("BATCH=8", "BATCH=4").replace("--grad_accum 4", "--grad_accum 8")


def test_llamafactory_launcher_liger_is_an_override_in_its_own_spelling() -> None:
    path = SHELL / "launch_llamafactory.sh"
    text = path.read_text(encoding="utf-8")
    after = fixed(path, LIGER)
    assert after == text.replace(
        "per_device_train_batch_size=1\n",
        "per_device_train_batch_size=1 \\\n    enable_liger_kernel=true\n",
    )


def test_trl_launcher_liger_is_the_bare_hf_flag(trl_release: Callable[[str], Path]) -> None:
    trl_release("0.29.1")  # Liger's fused cross-entropy helps SFTTrainer up to 1.14's logits
    path = SHELL / "launch_trl.sh"
    text = path.read_text(encoding="utf-8")
    after = fixed(path, LIGER)
    assert after == text.replace(
        "  --num_processes 2\n", "  --num_processes 2 \\\n  --use_liger_kernel\n"
    )


def test_equals_form_quotes_comment_and_crlf_are_kept(tmp_path: Path) -> None:
    folder(tmp_path, "hf_argparser_dataclass.py")
    text = (
        "#!/bin/bash\r\n"
        "torchrun --nproc_per_node 1 hf_argparser_dataclass.py \\\r\n"
        "  --per_device_train_batch_size=16 \\\r\n"
        '  --optim "adamw_torch"  # keep this comment\r\n'
    )
    path = write(tmp_path / "launch.sh", text)
    after = fixed(path, HALVE, gpu="A100-40GB")
    assert after == text.replace(
        "--per_device_train_batch_size=16 ", "--per_device_train_batch_size=8 "
    ).replace(
        '"adamw_torch"  #',
        '"adamw_torch" \\\r\n  --gradient_accumulation_steps 2  #',
    )
    after = fixed(path, LIGER, gpu="A100-40GB")
    assert '--optim "adamw_torch" \\\r\n  --use_liger_kernel  # keep this comment\r\n' in after
    assert "\n" not in after.replace("\r\n", "")


def test_argparse_script_gets_only_its_own_options(tmp_path: Path) -> None:
    # argparse_script.py defines --batch-size, --grad_accum and a store_true
    # --gradient_checkpointing; an HF flag it does not define would stop it at start
    folder(tmp_path, "argparse_script.py")
    text = "python argparse_script.py --batch-size 16 --seq_len 4096\n"
    path = write(tmp_path / "run.sh", text)
    after = fixed(path, CHECKPOINTING, gpu="A100-80GB")
    assert (
        after
        == "python argparse_script.py --batch-size 16 --seq_len 4096 --gradient_checkpointing\n"
    )
    after = fixed(path, HALVE, gpu="A100-80GB")
    assert after == "python argparse_script.py --batch-size 8 --seq_len 4096 --grad_accum 16\n"
    titles = fixes_of(path, text, "A100-80GB")
    assert LIGER not in titles  # the script has no option for it
    assert not any("8-bit" in title for title in titles)


def test_shared_variable_is_replaced_on_the_command_line(tmp_path: Path) -> None:
    folder(tmp_path, "argparse_script.py")
    text = "B=16\npython argparse_script.py --batch-size=$B --seq_len 4096 --output runs/b$B\n"
    path = write(tmp_path / "run.sh", text)
    after = fixed(path, HALVE, gpu="A100-80GB")
    assert after == (
        "B=16\npython argparse_script.py --batch-size=8 --seq_len 4096 --output runs/b$B"
        " --grad_accum 16\n"
    )


def test_torchtune_launcher_qlora_overrides_the_model_builder(tmp_path: Path) -> None:
    config = (FIXTURES / "configs" / "torchtune_qlora.yaml").read_text(encoding="utf-8")
    write(tmp_path / "lora.yaml", config.replace("qlora_llama3_1_8b", "lora_llama3_1_8b"))
    text = "tune run lora_finetune_single_device --config lora.yaml batch_size=8\n"
    path = write(tmp_path / "run.sh", text)
    after = fixed(path, QLORA)
    assert after == text.replace(
        "batch_size=8\n",
        "batch_size=8 model._component_=torchtune.models.llama3_1.qlora_llama3_1_8b\n",
    )


def test_llamafactory_v1_launcher_qlora_is_its_quant_config(tmp_path: Path) -> None:
    folder(tmp_path, "llamafactory_v1_lora.yaml")
    text = "llamafactory-cli train llamafactory_v1_lora.yaml micro_batch_size=8\n"
    path = write(tmp_path / "run.sh", text)
    after = fixed(path, QLORA)
    assert after == text.replace(
        "micro_batch_size=8\n",
        "micro_batch_size=8 quant_config.name=bnb quant_config.quantization_bit=4\n",
    )


@pytest.mark.parametrize("name", sorted(p.name for p in SHELL.glob("*.sh")))
def test_fixing_twice_changes_nothing_more(name: str) -> None:
    """Every fix of a shell fixture, applied, leaves nothing for the same fix to do (but
    halving a micro-batch, which may be halved again)."""
    path = SHELL / name
    text = path.read_text(encoding="utf-8")
    for gpu in ("RTX-4090", "A100-80GB"):
        for title, fix in fixes_of(path, text, gpu).items():
            after = apply_edits(text, fix.edits)
            again = fixes_of(path, after, gpu)
            if title.startswith(("Make it fit", HALVE)):
                continue
            assert title not in again, (gpu, title)


def test_torchtune_builtin_lora_config_gets_the_qlora_builder_override() -> None:
    # `--config llama3_1/8B_lora` ships inside torchtune: its builder follows from its name
    path = SHELL / "launch_tune.sh"
    text = path.read_text(encoding="utf-8")
    after = fixed(path, QLORA)
    assert after == text.replace(
        "tokenizer.max_seq_len=4096\n",
        "tokenizer.max_seq_len=4096 \\\n"
        "  model._component_=torchtune.models.llama3_1.qlora_llama3_1_8b\n",
    )
    plan = check_text(path, after, gpu="RTX-4090", hub=False).analysis.plan
    assert plan.quantization is not None and plan.quantization.bits.value == 4
    assert QLORA not in fixes_of(path, after, "RTX-4090")


def test_script_given_a_config_file_gets_no_new_flags(tmp_path: Path) -> None:
    # `python train.py config.yaml`: an HfArgumentParser script reading parse_yaml_file takes
    # its settings from the file; a flag added after it would be ignored when it runs
    folder(tmp_path, "hf_argparser_dataclass.py", "trl_sft.yaml")
    text = "python hf_argparser_dataclass.py trl_sft.yaml\n"
    path = write(tmp_path / "run.sh", text)
    for gpu in ("T4", "RTX-4090", "A100-80GB"):
        for fix in fixes_of(path, text, gpu).values():
            assert not any("--" in edit.new_text for edit in fix.edits), fix.title


def test_variable_with_an_environment_default_keeps_its_override(tmp_path: Path) -> None:
    # `BATCH=${BATCH:-16}` read once: its default changes, so `BATCH=2 ./run.sh` still works
    folder(tmp_path, "argparse_script.py")
    text = 'BATCH=${BATCH:-16}\npython argparse_script.py --batch-size "$BATCH" --seq_len 4096\n'
    path = write(tmp_path / "run.sh", text)
    after = fixed(path, HALVE, gpu="A100-80GB")
    assert after == text.replace(":-16}", ":-8}").replace("4096\n", "4096 --grad_accum 16\n")


def test_trl_launcher_8bit_optimizer_replaces_the_written_value(tmp_path: Path) -> None:
    text = (
        "#!/bin/bash\n"
        "trl sft --model_name_or_path Qwen/Qwen2.5-1.5B --dataset_name trl-lib/Capybara \\\n"
        "  --per_device_train_batch_size 4 --max_length 2048 \\\n"
        "  --optim adamw_torch --output_dir out\n"
    )
    path = write(tmp_path / "run.sh", text)
    after = fixed(path, "Use the 8-bit AdamW (adamw_bnb_8bit)", gpu="A100-40GB")
    assert after == text.replace("--optim adamw_torch", "--optim adamw_bnb_8bit")


def test_bf16_and_8bit_optimizer_are_added_before_a_trailing_comment(tmp_path: Path) -> None:
    # the script is not beside the file; its flags are HF names, so HF flags are added, each
    # before the comment (a backslash after a comment would not continue the line)
    text = (
        "#!/bin/bash\n"
        "torchrun --nproc_per_node 1 finetune.py \\\n"
        "  --model_name_or_path meta-llama/Llama-3.2-1B \\\n"
        "  --per_device_train_batch_size 8 \\\n"
        "  --output_dir out  # fp32 by default\n"
    )
    path = write(tmp_path / "run.sh", text)
    after = fixed(path, "Train in bf16 mixed precision", gpu="A100-40GB")
    assert after == text.replace("out  #", "out \\\n  --bf16  #")
    after = fixed(path, "Use the 8-bit AdamW (adamw_bnb_8bit)", gpu="A100-40GB")
    assert after == text.replace("out  #", "out \\\n  --optim adamw_bnb_8bit  #")
    assert len(ShellScanner(after).commands()) == len(ShellScanner(text).commands())


def test_bf16_is_not_offered_on_a_gpu_without_bf16(tmp_path: Path) -> None:
    text = "torchrun finetune.py --model_name_or_path meta-llama/Llama-3.2-1B --output_dir out\n"
    path = write(tmp_path / "run.sh", text)
    assert "Train in bf16 mixed precision" not in fixes_of(path, text, "T4")


def test_litgpt_launcher_qlora_and_micro_batch_are_its_own_flags(tmp_path: Path) -> None:
    text = (
        "#!/bin/bash\n"
        "litgpt finetune_lora checkpoints/meta-llama/Llama-3.1-8B \\\n"
        "  --devices 1 --train.micro_batch_size 4 --train.global_batch_size 16"
        " --train.max_seq_length 2048 --precision bf16-true\n"
    )
    path = write(tmp_path / "run.sh", text)
    after = fixed(path, QLORA)
    assert after == text.replace("bf16-true\n", "bf16-true \\\n  --quantize bnb.nf4-dq\n")
    after = fixed(path, HALVE)
    # the accumulation follows from the global batch, which stays
    assert after == text.replace("micro_batch_size 4", "micro_batch_size 2")


# -- DeepSpeed-Chat launchers --------------------------------------------------------------------
#
# DeepSpeed-Chat's step 1 script (applications/DeepSpeed-Chat/training/
# step1_supervised_finetuning/main.py, microsoft/DeepSpeedExamples f5c0ef6d) parses its flags with
# its own argparse and `deepspeed.add_config_arguments`; a flag it does not declare stops it with
# "unrecognized arguments". Its declarations, by kind, as that file writes them:
DEEPSPEED_CHAT_LISTS = ("data_path", "sft_only_data_path")  # nargs="*"
DEEPSPEED_CHAT_STRINGS = (
    "data_split",
    "data_output_path",
    "model_name_or_path",
    "output_dir",
    "lora_module_name",
    "tensorboard_path",
    "eot_token",
    "lr_scheduler_type",
)
DEEPSPEED_CHAT_INTS = (
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "max_seq_len",
    "num_train_epochs",
    "gradient_accumulation_steps",
    "num_warmup_steps",
    "seed",
    "local_rank",
    "zero_stage",
    "lora_dim",
)
DEEPSPEED_CHAT_FLOATS = ("learning_rate", "weight_decay", "dropout", "lora_learning_rate")
DEEPSPEED_CHAT_SWITCHES = (  # action="store_true"
    "gradient_checkpointing",
    "offload",
    "only_optimize_lora",
    "compute_fp32_loss",
    "enable_tensorboard",
    "add_eot_token",
    "print_loss",
    "deepspeed",  # deepspeed.add_config_arguments (DeepSpeed 0.19.8), as --deepscale
    "deepscale",
)
DEEPSPEED_CHAT_PATHS = ("deepspeed_config", "deepscale_config")  # add_config_arguments
DEEPSPEED_CHAT_DTYPES = ("fp16", "bf16")  # --dtype choices
DEEPSPEED_CHAT_FIXTURES = ("deepspeed_chat_full.sh", "deepspeed_chat_lora.sh")
# the variables the fixtures expand, as they are when the scripts run without arguments
DEEPSPEED_CHAT_VARIABLES = {"$OUTPUT": "out", "$ZERO_STAGE": "3"}


def deepspeed_chat_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="main.py", exit_on_error=False)
    for name in DEEPSPEED_CHAT_LISTS:
        parser.add_argument(f"--{name}", nargs="*")
    for name in DEEPSPEED_CHAT_STRINGS + DEEPSPEED_CHAT_PATHS:
        parser.add_argument(f"--{name}", type=str)
    for name in DEEPSPEED_CHAT_INTS:
        parser.add_argument(f"--{name}", type=int)
    for name in DEEPSPEED_CHAT_FLOATS:
        parser.add_argument(f"--{name}", type=float)
    for name in DEEPSPEED_CHAT_SWITCHES:
        parser.add_argument(f"--{name}", action="store_true")
    parser.add_argument("--dtype", type=str, default="fp16", choices=DEEPSPEED_CHAT_DTYPES)
    return parser


def deepspeed_chat_arguments(text: str) -> argparse.Namespace:
    """The launcher's `main.py ...` arguments parsed as main.py parses them; fails the test on
    an argument main.py would stop on."""
    joined = re.sub(r"\\\r?\n", " ", text)
    for variable, value in DEEPSPEED_CHAT_VARIABLES.items():
        joined = joined.replace(variable, value)
    (line,) = [line for line in joined.splitlines() if " main.py " in line]
    words = shlex.split(line.split(" main.py ", 1)[1], comments=True)
    if "&>" in words:
        words = words[: words.index("&>")]
    parser = deepspeed_chat_parser()
    try:
        parsed, unknown = parser.parse_known_args(words)
    except (argparse.ArgumentError, SystemExit) as error:
        pytest.fail(f"main.py stops on {words}: {error}")
    assert unknown == [], f"main.py stops on unrecognized arguments {unknown}"
    return parsed


def all_fixes(path: Path, text: str) -> dict[str, Fix]:
    found: dict[str, Fix] = {}
    for gpu in ("T4", "RTX-3080-10GB", "RTX-4090", "A100-40GB"):
        for title, fix in fixes_of(path, text, gpu).items():
            found.setdefault(f"{title} [{gpu}]", fix)
    return found


def lora_variant(tmp_path: Path, old: str, new: str) -> Path:
    text = (SHELL / "deepspeed_chat_lora.sh").read_text(encoding="utf-8")
    assert old in text
    return write(tmp_path / "deepspeed_chat_lora.sh", text.replace(old, new))


@pytest.mark.parametrize("name", DEEPSPEED_CHAT_FIXTURES)
def test_deepspeed_chat_fixes_keep_the_command_line_that_main_py_parses(name: str) -> None:
    path = SHELL / name
    text = path.read_text(encoding="utf-8")
    deepspeed_chat_arguments(text)  # the fixture as written runs
    fixes = all_fixes(path, text)
    for fix in fixes.values():
        deepspeed_chat_arguments(apply_edits(text, fix.edits))
    if name == "deepspeed_chat_full.sh":  # 15.8 GiB in fp16 without checkpointing
        assert any(title.startswith(CHECKPOINTING) for title in fixes), sorted(fixes)
        assert any(title.startswith(HALVE) for title in fixes), sorted(fixes)


@pytest.mark.parametrize("name", DEEPSPEED_CHAT_FIXTURES)
def test_deepspeed_chat_has_no_8bit_optimizer_liger_or_qlora_fix(name: str) -> None:
    # main.py builds DeepSpeed's FusedAdam (DeepSpeedCPUAdam with --offload) itself and has no
    # flag for a fused loss or 4-bit base weights
    # (the LoRA run with 16 sequences a step, 8-bit AdamW and Liger would save memory)
    path = SHELL / name
    text = path.read_text(encoding="utf-8")
    for batch in ("4", "8"):
        text = text.replace(
            f"--per_device_train_batch_size {batch} ", "--per_device_train_batch_size 16 "
        )
    titles = all_fixes(path, text)
    assert titles, "the runs are made not to fit somewhere"
    for title in titles:
        assert "8-bit" not in title and LIGER not in title and QLORA not in title, title


def test_deepspeed_chat_checkpointing_is_the_bare_switch() -> None:
    path = SHELL / "deepspeed_chat_full.sh"
    text = path.read_text(encoding="utf-8")
    after = fixed(path, CHECKPOINTING, gpu="T4")
    assert after == text.replace(
        "   --output_dir $OUTPUT \\\n",
        "   --output_dir $OUTPUT \\\n   --gradient_checkpointing \\\n",
    )
    plan = check_text(path, after, gpu="T4", hub=False).analysis.plan
    assert plan.gradient_checkpointing.value is True
    assert deepspeed_chat_arguments(after).gradient_checkpointing is True


def test_deepspeed_chat_halving_edits_its_batch_and_accumulation_flags(tmp_path: Path) -> None:
    path = lora_variant(
        tmp_path, "   --gradient_checkpointing \\\n", ""
    )  # 4 sequences of 1024 tokens on each GPU, every activation kept
    text = path.read_text(encoding="utf-8")
    after = fixed(path, HALVE, gpu="RTX-3080-10GB")
    assert after == text.replace(
        "--per_device_train_batch_size 4 ", "--per_device_train_batch_size 2 "
    ).replace("--gradient_accumulation_steps 2 ", "--gradient_accumulation_steps 4 ")
    plan = check_text(path, after, gpu="RTX-3080-10GB", hub=False).analysis.plan
    assert plan.per_device_train_batch_size.value == 2
    assert plan.gradient_accumulation_steps.value == 4
    parsed = deepspeed_chat_arguments(after)
    assert (parsed.per_device_train_batch_size, parsed.gradient_accumulation_steps) == (2, 4)


def test_deepspeed_chat_bf16_is_its_dtype_flag(tmp_path: Path) -> None:
    # `--dtype fp32` is read as fp32 (main.py at f5c0ef6d itself takes only fp16 or bf16): the
    # fix writes a value it takes
    path = lora_variant(tmp_path, "--dtype bf16", "--dtype fp32")
    text = path.read_text(encoding="utf-8")
    after = fixed(path, "Train in bf16 mixed precision", gpu="RTX-3080-10GB")
    assert after == text.replace("--dtype fp32", "--dtype bf16")
    plan = check_text(path, after, gpu="RTX-3080-10GB", hub=False).analysis.plan
    assert plan.precision.value == "bf16"
    assert deepspeed_chat_arguments(after).dtype == "bf16"


def test_deepspeed_chat_script_beside_the_file_declares_what_is_added(tmp_path: Path) -> None:
    # main.py beside the launcher: a flag is added only where main.py declares it
    main = (FIXTURES / "python" / "followed" / "deepspeed_chat_main.py").read_text("utf-8")
    shutil.copy(SHELL / "deepspeed_chat_full.sh", tmp_path / "run.sh")
    path = tmp_path / "run.sh"
    text = path.read_text(encoding="utf-8")
    write(tmp_path / "main.py", main)
    titles = fixes_of(path, text, "T4")
    assert any(title.startswith(CHECKPOINTING) for title in titles), sorted(titles)
    assert not any("8-bit" in title or LIGER in title for title in titles), sorted(titles)
    without = main.replace(
        '    parser.add_argument("--gradient_checkpointing", action="store_true")\n', ""
    )
    assert without != main
    write(tmp_path / "main.py", without)
    titles = fixes_of(path, text, "T4")
    assert not any(title.startswith(CHECKPOINTING) for title in titles), sorted(titles)
    assert any(title.startswith(HALVE) for title in titles), sorted(titles)

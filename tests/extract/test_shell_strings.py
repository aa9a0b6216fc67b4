"""Launch lines whose values are not literal flags: a bash array expanded as
`"${ARGS[@]}"`, a command built in a string and run by `bash -c "$CMD"` or `eval`, a launch
inside a container's `bash -c "..."`, `uv run`, an abbreviated flag HfArgumentParser takes,
the script's `sys.argv[1]`, and a `--config` file handed to a script that is not there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llmmem.extract import extract_plan

LINT = Path(sys.executable).parent / "llmmem-lint"

# written here rather than under tests/fixtures: the fix properties there check that each new flag
# is a word of the file's own commands, and these write theirs inside a quoted command string
SCRIPTS = {
    "args_array.sh": """#!/bin/bash
MODEL="Qwen/Qwen2.5-3B-Instruct"
TRAIN_ARGS=(
    --per_device_train_batch_size 6   # fits one A100 at this length
    --gradient_accumulation_steps 4
    --max_length "2048"
    --bf16 True
)
accelerate launch --num_processes 2 finetune_elsewhere.py \\
    --model_name_or_path "$MODEL" "${TRAIN_ARGS[@]}"
""",
    "command_string.sh": """#!/bin/bash
NPROC=4
BATCH=2
CMD="torchrun --nproc_per_node=${NPROC} sft_elsewhere.py --model_name_or_path Qwen/Qwen2.5-7B"
CMD="${CMD} --per_device_train_batch_size ${BATCH} --gradient_accumulation_steps 8"
USE_CKPT="--gradient_checkpointing"
CMD="${CMD} ${USE_CKPT}"
nohup bash -c "${CMD}" > train.log 2>&1 &
""",
    "container_launch.sh": """#!/bin/bash
port=$(shuf -i 29500-29999 -n 1)
enroot start --mount=/scratch/me:/workspace trainer_image bash -c "
    cd /workspace &&
    python -m torch.distributed.run --nproc_per_node=8 --master_port=${port} \\
        train_elsewhere.py --model_name_or_path Qwen/Qwen2.5-1.5B --per_device_train_batch_size 16
"
""",
}


def plan_of(tmp_path: Path, name: str):  # type: ignore[no-untyped-def]
    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / name).write_text(SCRIPTS[name])
    return extract_plan(tmp_path / name)


def inline(tmp_path: Path, text: str, **files: str):  # type: ignore[no-untyped-def]
    (tmp_path / ".git").mkdir(exist_ok=True)
    for name, body in files.items():
        target = tmp_path / name.replace("__", "/").replace("_py", ".py").replace("_yaml", ".yaml")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    script = tmp_path / "run.sh"
    script.write_text(text)
    return extract_plan(script)


def test_a_bash_array_expands_to_its_elements(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "args_array.sh")
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-3B-Instruct"
    assert plan.per_device_train_batch_size.value == 6
    assert plan.gradient_accumulation_steps.value == 4
    assert plan.max_seq_length.value == 2048
    where = plan.per_device_train_batch_size.range
    assert where is not None and (where.start_line, where.start_col) == (3, 34)


def test_a_command_built_in_a_string_and_run_by_bash_c(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "command_string.sh")
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-7B"
    assert plan.distributed.world_size.value == 4
    assert plan.per_device_train_batch_size.value == 2
    where = plan.per_device_train_batch_size.range
    assert where is not None and where.start_line == 2  # BATCH=2, where it is written
    assert plan.gradient_accumulation_steps.value == 8
    assert plan.gradient_checkpointing.value is True


def test_a_launch_inside_a_container_command(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "container_launch.sh")
    assert plan.distributed.world_size.value == 8
    assert plan.per_device_train_batch_size.value == 16
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-1.5B"


def test_eval_and_uv_run(tmp_path: Path) -> None:
    plan = inline(
        tmp_path,
        'CMD="python train_x.py --model_name_or_path Qwen/Qwen2.5-0.5B --max_length 512"\n'
        'eval "$CMD"\n',
    )
    assert plan.max_seq_length.value == 512
    plan = inline(tmp_path, "uv run --with peft torchrun --nproc_per_node 2 train_x.py\n")
    assert plan.distributed.world_size.value == 2


def test_an_abbreviated_flag_is_the_argument_it_abbreviates(tmp_path: Path) -> None:
    plan = inline(tmp_path, "python train_x.py --per_device_train_batch 3 --gradient_accum 5\n")
    assert plan.per_device_train_batch_size.value == 3
    assert plan.gradient_accumulation_steps.value == 5


def test_the_first_argument_a_script_reads_from_sys_argv(tmp_path: Path) -> None:
    script = (
        "import sys\nfrom transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        'name = sys.argv[1] if len(sys.argv) > 1 else "Qwen/Qwen2.5-0.5B"\n'
        "model = AutoModelForCausalLM.from_pretrained(name)\n"
        'Trainer(model=model, args=TrainingArguments(output_dir="o")).train()\n'
    )
    plan = inline(tmp_path, "python train.py Qwen/Qwen2.5-1.5B\n", train_py=script)
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-1.5B"
    alone = extract_plan(tmp_path / "train.py")
    assert alone.model_id is not None and alone.model_id.value == "Qwen/Qwen2.5-0.5B"
    assert alone.model_id.source.value == "cli-default"


def test_a_config_flag_to_a_script_not_here_is_read(tmp_path: Path) -> None:
    config = "model:\n  name: Qwen/Qwen2.5-1.5B\ntraining:\n  batch_size: 12\n"
    plan = inline(
        tmp_path,
        "torchrun --nproc_per_node 2 src/missing.py --config conf/run.yaml\n",
        conf__run_yaml=config,
    )
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-1.5B"
    assert plan.per_device_train_batch_size.value == 12


def test_fix_writes_a_new_flag_inside_the_string(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    target = tmp_path / "container_launch.sh"
    target.write_text(SCRIPTS["container_launch.sh"])
    proc = subprocess.run(
        [str(LINT), "--gpu", "H100", "--fix", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    fixed = target.read_text()
    assert fixed != SCRIPTS["container_launch.sh"]
    assert fixed.rstrip().endswith('"')  # every flag written inside the quoted command
    plan = extract_plan(target)
    assert plan.gradient_checkpointing.value is True


def test_a_plain_python_launch_runs_one_process(tmp_path: Path) -> None:
    plan = inline(tmp_path, "CUDA_VISIBLE_DEVICES=0,1 python train_x.py --bf16\n")
    assert plan.distributed.world_size.value == 1
    assert plan.distributed.world_size.source.value == "explicit"
    plan = inline(tmp_path, "tune run lora_finetune_single_device --config llama3_1/8B_lora\n")
    assert plan.distributed.world_size.value == 1
    plan = inline(tmp_path, "srun --ntasks 4 python train_x.py\n")
    assert plan.distributed.world_size.value == 4

"""Shell launchers: the command that starts training, the files it starts, and where each value
is written (across backslash continuations and through shell variables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmmem.extract.shell import (
    ShellExpander,
    ShellScanner,
    ShellWord,
    evaluate_integer_expression,
    extract_shell_plan,
)
from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan

SHELL = Path(__file__).resolve().parent.parent / "fixtures" / "shell"

EXPLICIT = Provenance.EXPLICIT
DEFAULT = Provenance.DEFAULT
CONFIG = Provenance.CONFIG
CLI_DEFAULT = Provenance.CLI_DEFAULT
ASSUMED = Provenance.ASSUMED


def plan_of(name: str) -> TrainingPlan:
    return extract_shell_plan(SHELL / name)


def setting(plan: TrainingPlan, key: str) -> Sourced[Any]:
    owner: Any = plan
    for part in key.split("."):
        owner = getattr(owner, part)
    assert isinstance(owner, Sourced), key
    return owner


INLINE_TEXTS: dict[str, str] = {}  # scripts given as text, by the path they pretend to have


def text_at(located: SourceRange, plan_file: Path) -> str:
    file = Path(located.path) if located.path is not None else plan_file
    if located.path is None and str(plan_file) in INLINE_TEXTS:
        content = INLINE_TEXTS[str(plan_file)]
    else:
        content = file.read_text(encoding="utf-8")
    lines = content.split("\n")
    if located.start_line == located.end_line:
        return lines[located.start_line][located.start_col : located.end_col]
    parts = [lines[located.start_line][located.start_col :]]
    parts += lines[located.start_line + 1 : located.end_line]
    parts.append(lines[located.end_line][: located.end_col])
    return "\n".join(parts)


def expect(
    plan: TrainingPlan,
    key: str,
    value: Any,
    source: Provenance,
    text: str | None = None,
    *,
    line: int | None = None,
    in_file: str | None = None,
) -> Sourced[Any]:
    """The setting has this value and provenance, and its range covers `text` on `line`
    (0-based) of the shell file, or of `in_file` when it comes from another file."""
    found = setting(plan, key)
    assert found.value == value, f"{key}: {found.value!r} != {value!r}"
    assert found.source is source, f"{key}: {found.source} != {source}"
    if text is not None:
        assert found.range is not None, key
        if in_file is None:
            assert found.range.path is None, f"{key}: {found.range.path}"
        else:
            assert found.range.path is not None and Path(found.range.path).name == in_file
        assert text_at(found.range, Path(plan.path)) == text, key
        if line is not None:
            assert found.range.start_line == line, f"{key}: line {found.range.start_line}"
    return found


# -- launchers with their files -----------------------------------------------------------------


def test_torchrun_with_the_script_beside_it() -> None:
    plan = plan_of("launch_torchrun.sh")
    assert (plan.kind, plan.framework) == ("shell", "hf")
    # ${NGPUS:-4}: the default is what the file says
    expect(plan, "distributed.world_size", 4, EXPLICIT, "4", line=4)
    # --model_name "$MODEL": the value written in MODEL=${MODEL:-...}
    expect(plan, "model_id", "meta-llama/Llama-3.2-3B", EXPLICIT, "meta-llama/Llama-3.2-3B", line=5)
    # --batch_size $BATCH: the 8 of BATCH=8
    expect(plan, "per_device_train_batch_size", 8, EXPLICIT, "8", line=6)
    # on a continuation line
    expect(plan, "gradient_accumulation_steps", 4, EXPLICIT, "4", line=12)
    expect(plan, "gradient_checkpointing", True, EXPLICIT, "--gradient_checkpointing", line=13)
    # what the command line leaves alone comes from train.py
    expect(plan, "max_seq_length", 1024, CLI_DEFAULT, "1024", in_file="train.py")
    expect(plan, "precision", "bf16-autocast", EXPLICIT, "torch.bfloat16", in_file="train.py")
    expect(plan, "optim", "adamw_torch_fused", EXPLICIT, '"adamw_torch_fused"', in_file="train.py")
    assert plan.problems == []


def test_accelerate_launch_with_a_config_file_and_a_missing_script() -> None:
    plan = plan_of("launch_accelerate.sh")
    # --num_processes 4 on the command line beats num_processes: 8 in the config file
    expect(plan, "distributed.world_size", 4, EXPLICIT, "4", line=4)
    expect(plan, "distributed.zero_stage", 3, CONFIG, "3", in_file="accelerate_zero3.yaml")
    expect(
        plan, "distributed.offload_optimizer", True, CONFIG, "cpu", in_file="accelerate_zero3.yaml"
    )
    expect(plan, "model_id", "mistralai/Mistral-7B-v0.1", EXPLICIT, "mistralai/Mistral-7B-v0.1")
    expect(plan, "per_device_train_batch_size", 2, EXPLICIT, "2", line=7)
    expect(plan, "gradient_accumulation_steps", 8, EXPLICIT, "8", line=8)
    expect(plan, "max_seq_length", 2048, EXPLICIT, "2048", line=9)
    expect(plan, "precision", "bf16", EXPLICIT, "--bf16", line=10)
    expect(plan, "gradient_checkpointing", True, EXPLICIT, "--gradient_checkpointing", line=11)
    assert any("'sft.py' not found" in problem for problem in plan.problems)


def test_deepspeed_with_a_config_written_by_a_here_document() -> None:
    plan = plan_of("launch_deepspeed.sh")
    expect(plan, "distributed.world_size", 8, EXPLICIT, "8", line=13)
    expect(plan, "distributed.deepspeed_config", "ds_config.json", EXPLICIT, "ds_config.json")
    expect(plan, "distributed.zero_stage", 2, EXPLICIT, "2", line=7)
    expect(plan, "distributed.offload_optimizer", True, EXPLICIT, '"cpu"', line=7)
    expect(plan, "precision", "bf16", EXPLICIT, "true", line=8)
    expect(plan, "model_id", "meta-llama/Llama-3.1-8B", EXPLICIT, "meta-llama/Llama-3.1-8B")
    expect(plan, "per_device_train_batch_size", 4, EXPLICIT, "4", line=16)
    assert any("'finetune.py' not found" in problem for problem in plan.problems)


def test_llamafactory_cli_with_overrides() -> None:
    plan = plan_of("launch_llamafactory.sh")
    assert plan.framework == "llamafactory"
    expect(plan, "distributed.world_size", 2, EXPLICIT, "2", line=2)  # NPROC_PER_NODE=2
    # key=value overrides beat the YAML
    expect(plan, "per_device_train_batch_size", 1, EXPLICIT, "1", line=3)
    expect(plan, "max_seq_length", 2048, EXPLICIT, "2048", line=3)
    # the rest is the YAML's
    expect(plan, "gradient_accumulation_steps", 4, CONFIG, "4", in_file="lf_qlora.yaml")
    expect(
        plan,
        "model_id",
        "meta-llama/Llama-3.1-8B-Instruct",
        CONFIG,
        "meta-llama/Llama-3.1-8B-Instruct",
        in_file="lf_qlora.yaml",
    )
    expect(plan, "lora.r", 8, CONFIG, "8", in_file="lf_qlora.yaml")
    expect(plan, "lora.target_modules", ["all-linear"], CONFIG, "all", in_file="lf_qlora.yaml")
    expect(plan, "quantization.bits", 4, CONFIG, "4", in_file="lf_qlora.yaml")


def test_tune_run_with_a_built_in_config() -> None:
    plan = plan_of("launch_tune.sh")
    assert plan.framework == "torchtune"
    expect(plan, "distributed.world_size", 2, EXPLICIT, "2", line=1)
    expect(plan, "model_id", "meta-llama/Llama-3.1-8B", ASSUMED, "llama3_1/8B_lora", line=1)
    assert plan.lora is not None
    expect(plan, "per_device_train_batch_size", 4, EXPLICIT, "4", line=2)
    expect(plan, "gradient_accumulation_steps", 2, EXPLICIT, "2", line=2)
    expect(plan, "max_seq_length", 4096, EXPLICIT, "4096", line=2)
    assert any("built-in config" in problem for problem in plan.problems)


def test_trl_cli_flags() -> None:
    plan = plan_of("launch_trl.sh")
    assert plan.framework == "trl"
    expect(plan, "model_id", "Qwen/Qwen2.5-0.5B", EXPLICIT, "Qwen/Qwen2.5-0.5B", line=1)
    expect(plan, "per_device_train_batch_size", 2, EXPLICIT, "2", line=3)  # --flag=value
    expect(plan, "gradient_accumulation_steps", 4, EXPLICIT, "4", line=3)
    expect(plan, "max_seq_length", 1024, EXPLICIT, "1024", line=3)
    expect(plan, "lora.r", 16, EXPLICIT, "16", line=4)
    expect(plan, "lora.target_modules", ["q_proj", "v_proj"], EXPLICIT, "q_proj v_proj", line=4)
    expect(plan, "lora.alpha", 32.0, DEFAULT)  # TRL ModelConfig
    expect(plan, "distributed.world_size", 2, EXPLICIT, "2", line=5)
    expect(plan, "gradient_checkpointing", True, DEFAULT)  # SFTConfig


def test_litgpt_finetune_lora() -> None:
    plan = plan_of("launch_litgpt.sh")
    assert plan.framework == "litgpt"
    expect(
        plan,
        "model_id",
        "meta-llama/Llama-3.2-1B",
        EXPLICIT,
        "checkpoints/meta-llama/Llama-3.2-1B",
        line=1,
    )
    expect(plan, "distributed.world_size", 2, EXPLICIT, "2", line=2)
    expect(plan, "per_device_train_batch_size", 4, EXPLICIT, "4", line=2)
    expect(plan, "max_seq_length", 512, EXPLICIT, "512", line=2)
    expect(plan, "precision", "bf16-true", EXPLICIT, "bf16-true", line=2)
    expect(plan, "lora.r", 8, DEFAULT)
    expect(plan, "gradient_accumulation_steps", 2, DEFAULT)  # 16 / 2 devices / 4
    expect(plan, "gradient_checkpointing", True, DEFAULT)  # FSDP on 2 GPUs


def test_broken_launcher_says_what_it_could_not_read() -> None:
    plan = plan_of("broken_launch.sh")
    assert any("never closed" in problem for problem in plan.problems)
    assert any("$(nvidia-smi" in problem for problem in plan.problems)
    expect(plan, "per_device_train_batch_size", 2, EXPLICIT, "2", line=2)
    expect(plan, "distributed.world_size", 1, ASSUMED)


# -- launchers written inline -------------------------------------------------------------------


def inline(text: str) -> TrainingPlan:
    """A script as if saved beside the fixtures (so train.py and the configs resolve)."""
    path = SHELL / "inline.sh"
    INLINE_TEXTS[str(path)] = text
    return extract_shell_plan(path, text)


def test_python_module_launcher_and_node_count() -> None:
    plan = inline(
        "python -m torch.distributed.run --nnodes=2 --nproc-per-node=8 train.py --batch_size 3\n"
    )
    expect(plan, "distributed.world_size", 16, EXPLICIT, "8")
    expect(plan, "per_device_train_batch_size", 3, EXPLICIT, "3")


def test_visible_devices_set_the_process_count() -> None:
    plan = inline("export CUDA_VISIBLE_DEVICES=0,1,2\ntorchrun --nproc_per_node gpu train.py\n")
    expect(plan, "distributed.world_size", 3, EXPLICIT, "0,1,2")


def test_deepspeed_include_list() -> None:
    plan = inline("deepspeed --include localhost:0,1 train.py --batch_size 2\n")
    expect(plan, "distributed.world_size", 2, EXPLICIT, "localhost:0,1")


def test_accelerate_flags_without_a_config_file() -> None:
    plan = inline(
        "accelerate launch --use_deepspeed --zero_stage 3 --offload_optimizer_device cpu "
        "--num_processes 8 --mixed_precision bf16 train.py\n"
    )
    expect(plan, "distributed.zero_stage", 3, EXPLICIT, "3")
    expect(plan, "distributed.offload_optimizer", True, EXPLICIT, "cpu")
    expect(plan, "distributed.world_size", 8, EXPLICIT, "8")
    # the script's own torch_dtype=bfloat16 decides the weights; its bf16=True autocasts
    expect(plan, "precision", "bf16-autocast", EXPLICIT, "torch.bfloat16", in_file="train.py")


def test_axolotl_through_accelerate() -> None:
    plan = inline(
        "accelerate launch --config_file accelerate_zero3.yaml -m axolotl.cli.train "
        "../configs/axolotl_qlora.yml\n"
    )
    assert plan.framework == "axolotl"
    expect(plan, "lora.r", 64, CONFIG, "64", in_file="axolotl_qlora.yml")
    expect(plan, "distributed.world_size", 8, CONFIG, "8", in_file="accelerate_zero3.yaml")


def test_trl_with_a_config_file_and_a_flag_over_it() -> None:
    plan = inline("trl sft --config ../configs/trl_sft.yaml --per_device_train_batch_size 2\n")
    assert plan.framework == "trl"
    expect(plan, "per_device_train_batch_size", 2, EXPLICIT, "2")
    expect(plan, "gradient_accumulation_steps", 2, CONFIG, "2", in_file="trl_sft.yaml")
    expect(plan, "lora.r", 32, CONFIG, "32", in_file="trl_sft.yaml")


def test_accelerate_fsdp_config_file_with_the_script() -> None:
    plan = inline("accelerate launch --config_file ../configs/accelerate_fsdp.yaml train.py\n")
    expect(plan, "distributed.world_size", 4, CONFIG, "4", in_file="accelerate_fsdp.yaml")
    expect(
        plan, "distributed.fsdp", "full_shard", CONFIG, "FULL_SHARD", in_file="accelerate_fsdp.yaml"
    )
    expect(plan, "per_device_train_batch_size", 4, CLI_DEFAULT, "4", in_file="train.py")


def test_a_deepspeed_flag_to_a_script_reads_the_file() -> None:
    plan = inline("deepspeed --num_gpus 2 train.py --deepspeed ../configs/ds_zero3.json\n")
    expect(plan, "distributed.world_size", 2, EXPLICIT, "2")
    expect(plan, "distributed.zero_stage", 3, CONFIG, "3", in_file="ds_zero3.json")


def test_slurm_tasks_are_ranks() -> None:
    plan = inline("srun --nodes=2 --ntasks-per-node=4 python train.py --batch_size 1\n")
    expect(plan, "distributed.world_size", 8, EXPLICIT, "4")
    expect(plan, "per_device_train_batch_size", 1, EXPLICIT, "1")
    plan = inline("mpirun -np 6 python train.py\n")
    expect(plan, "distributed.world_size", 6, EXPLICIT, "6")


def test_a_file_given_to_a_flag_is_not_the_config() -> None:
    plan = inline("llamafactory-cli train --deepspeed ../configs/ds_zero3.json lf_qlora.yaml\n")
    expect(plan, "lora.r", 8, CONFIG, "8", in_file="lf_qlora.yaml")
    expect(plan, "distributed.zero_stage", 3, CONFIG, "3", in_file="ds_zero3.json")


def test_a_flag_does_not_beat_what_the_script_hard_codes() -> None:
    # train.py writes optim="adamw_torch_fused" itself; it has no --optim option
    plan = inline("python train.py --optim sgd --batch_size 16\n")
    expect(plan, "optim", "adamw_torch_fused", EXPLICIT, '"adamw_torch_fused"', in_file="train.py")
    expect(plan, "per_device_train_batch_size", 16, EXPLICIT, "16")


def test_the_training_command_is_chosen_over_others() -> None:
    plan = inline("python prepare_data.py --out data\ntorchrun --nproc_per_node 2 train.py\n")
    expect(plan, "distributed.world_size", 2, EXPLICIT, "2", line=1)
    assert not any("training commands" in problem for problem in plan.problems)


def test_no_launcher_is_a_problem() -> None:
    plan = inline("echo hello\nls -la\n")
    assert any("no training command" in problem for problem in plan.problems)


def test_shell_pragmas() -> None:
    plan = inline("# llmmem: gpu=H100-80GB\ntorchrun --nproc_per_node 2 train.py\n")
    assert plan.gpu is not None and plan.gpu.value == "H100-80GB"
    assert plan.gpu.source is Provenance.PRAGMA


# -- DeepSpeed-Chat training scripts --------------------------------------------------------------

DEEPSPEED_CHAT_MAIN = """import argparse

import deepspeed
from transformers import AutoModelForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--model_name_or_path", type=str, required=True)
parser.add_argument("--per_device_train_batch_size", type=int, default=16)
parser.add_argument("--max_seq_len", type=int, default=512)
parser.add_argument("--offload", action="store_true")
parser.add_argument("--dtype", type=str, default="fp16", choices=["fp16", "bf16"])
parser.add_argument("--zero_stage", type=int, default=0)
parser.add_argument("--lora_dim", type=int, default=0)
parser.add_argument("--only_optimize_lora", action="store_true")
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()
model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
"""


def test_deepspeed_chat_lora_on_zero3_with_offload() -> None:
    plan = plan_of("deepspeed_chat_lora.sh")
    # ZERO_STAGE=$2, then 3 when the script is run without arguments
    expect(plan, "distributed.zero_stage", 3, EXPLICIT, "3", line=10)
    expect(plan, "distributed.world_size", 8, EXPLICIT, "8", line=14)
    expect(plan, "model_id", "meta-llama/Llama-2-7b-hf", EXPLICIT, "meta-llama/Llama-2-7b-hf")
    expect(plan, "per_device_train_batch_size", 4, EXPLICIT, "4", line=18)
    expect(plan, "gradient_accumulation_steps", 2, EXPLICIT, "2")
    expect(plan, "max_seq_length", 1024, EXPLICIT, "1024", line=20)
    expect(plan, "gradient_checkpointing", True, EXPLICIT, "--gradient_checkpointing", line=28)
    # DeepSpeed's bf16 engine keeps fp32 master weights: mixed precision, not pure bf16
    expect(plan, "precision", "bf16", EXPLICIT, "bf16", line=29)
    # --offload: the optimizer on the CPU, and under ZeRO-3 the parameters too
    expect(plan, "distributed.offload_optimizer", True, EXPLICIT, "--offload", line=31)
    expect(plan, "distributed.offload_params", True, EXPLICIT, "--offload", line=31)
    assert plan.lora is not None
    expect(plan, "lora.r", 64, EXPLICIT, "64", line=33)
    expect(plan, "lora.target_modules", ["all-linear"], EXPLICIT, "layers.", line=34)
    # the bare --deepspeed is DeepSpeed's own switch, not a config path; only main.py is missing
    assert len(plan.problems) == 1, plan.problems
    assert "'main.py' not found" in plan.problems[0]


def test_deepspeed_chat_full_fine_tune() -> None:
    plan = plan_of("deepspeed_chat_full.sh")
    assert plan.lora is None
    expect(plan, "distributed.world_size", 4, EXPLICIT, "localhost:0,1,2,3", line=6)
    expect(plan, "distributed.zero_stage", 2, EXPLICIT, "2", line=3)
    expect(plan, "precision", "fp16", EXPLICIT, "fp16", line=20)
    expect(plan, "max_seq_length", 512, EXPLICIT, "512")
    expect(plan, "per_device_train_batch_size", 8, EXPLICIT, "8", line=10)
    assert plan.distributed.offload_optimizer.value is False
    assert plan.distributed.offload_params.value is False


def test_deepspeed_chat_flags_left_out_take_its_defaults() -> None:
    plan = inline(
        "deepspeed main.py --model_name_or_path facebook/opt-350m --lora_dim 8 "
        "--only_optimize_lora\n"
    )
    # DeepSpeed-Chat's main.py defaults: --dtype fp16, --max_seq_len 512, LoRA on every Linear
    # layer of decoder.layers., ZeRO off
    expect(plan, "precision", "fp16", CLI_DEFAULT)
    expect(plan, "max_seq_length", 512, CLI_DEFAULT)
    expect(plan, "lora.r", 8, EXPLICIT, "8")
    expect(plan, "lora.target_modules", ["all-linear"], CLI_DEFAULT)
    assert plan.distributed.zero_stage.value == 0
    assert not any("only_optimize_lora" in problem for problem in plan.problems)


def test_deepspeed_chat_lora_that_also_trains_the_rest_says_so() -> None:
    plan = inline("deepspeed main.py --model_name_or_path facebook/opt-350m --lora_dim 16\n")
    expect(plan, "lora.r", 16, EXPLICIT, "16")
    assert any("--only_optimize_lora" in problem for problem in plan.problems), plan.problems


def test_deepspeed_chat_lora_dim_zero_is_no_lora() -> None:
    plan = inline(
        "deepspeed main.py --model_name_or_path facebook/opt-350m --zero_stage 1 --lora_dim 0\n"
    )
    assert plan.lora is None
    expect(plan, "distributed.zero_stage", 1, EXPLICIT, "1")


def test_deepspeed_chat_wrong_values_are_reported() -> None:
    plan = inline(
        "deepspeed main.py --model_name_or_path facebook/opt-350m --zero_stage 5 --dtype fp8 "
        "--max_seq_len long --lora_dim 4 --only_optimize_lora\n"
    )
    problems = "\n".join(plan.problems)
    assert "--zero_stage must be a whole number from 0 to 3; got '5'" in problems
    assert "--dtype must be fp16, bf16 or fp32; got 'fp8'" in problems
    assert "--max_seq_len must be a whole number 1 or more; got 'long'" in problems
    assert plan.distributed.zero_stage.value == 0
    assert plan.precision.source is not EXPLICIT
    assert plan.max_seq_length.source is not EXPLICIT


def test_deepspeed_chat_offload_needs_a_zero_stage() -> None:
    plan = inline(
        "deepspeed main.py --model_name_or_path facebook/opt-350m --lora_dim 8 "
        "--only_optimize_lora --offload\n"
    )
    assert plan.distributed.offload_optimizer.value is False
    assert any("--offload needs --zero_stage" in problem for problem in plan.problems)
    # a stage known only at run time: the offload is counted, the parameters stay on the GPU
    plan = inline(
        "deepspeed main.py --model_name_or_path facebook/opt-350m --zero_stage $1 --offload\n"
    )
    expect(plan, "distributed.offload_optimizer", True, EXPLICIT, "--offload")
    assert plan.distributed.offload_params.value is False
    assert any("$1" in problem for problem in plan.problems)


def test_deepspeed_chat_script_beside_the_launcher(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(DEEPSPEED_CHAT_MAIN, encoding="utf-8")
    launcher = tmp_path / "run.sh"
    launcher.write_text(
        "deepspeed --num_gpus 2 main.py --model_name_or_path facebook/opt-1.3b \\\n"
        "    --per_device_train_batch_size 2 --max_seq_len 256 --dtype bf16 \\\n"
        "    --zero_stage 2 --offload --lora_dim 32 --only_optimize_lora --deepspeed\n",
        encoding="utf-8",
    )
    plan = extract_shell_plan(launcher)
    expect(plan, "distributed.world_size", 2, EXPLICIT, "2", line=0)
    expect(plan, "distributed.zero_stage", 2, EXPLICIT, "2", line=2)
    expect(plan, "distributed.offload_optimizer", True, EXPLICIT, "--offload", line=2)
    assert plan.distributed.offload_params.value is False  # ZeRO-2 keeps them on the GPU
    expect(plan, "precision", "bf16", EXPLICIT, "bf16", line=1)
    expect(plan, "max_seq_length", 256, EXPLICIT, "256", line=1)
    expect(plan, "lora.r", 32, EXPLICIT, "32", line=2)
    assert not any("not found" in problem for problem in plan.problems), plan.problems
    assert not any("must be the path" in problem for problem in plan.problems), plan.problems


def test_zero_stage_alone_is_not_deepspeed_chat() -> None:
    # OpenRLHF's trainers take --zero_stage too, with --max_len and --bf16: DeepSpeed-Chat's
    # defaults (fp16, 512 tokens) must not be put on them
    plan = inline(
        "deepspeed --module openrlhf.cli.train_sft --pretrain meta-llama/Llama-3.1-8B "
        "--max_len 2048 --zero_stage 2 --bf16 --micro_train_batch_size 2\n"
    )
    assert plan.precision.value != "fp16"
    assert plan.max_seq_length.source is not CLI_DEFAULT
    assert not any("DeepSpeed-Chat" in found.note for found in plan.sourced_fields().values())


HF_SCRIPT_WITH_LIKE_NAMED_FIELDS = """from dataclasses import dataclass, field

from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="facebook/opt-350m")
    dtype: str = field(default="float32")
    lora_dim: int = field(default=0)


parser = HfArgumentParser((ModelArguments, TrainingArguments))
model_args, training_args = parser.parse_args_into_dataclasses()
model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, dtype=model_args.dtype)
Trainer(model=model, args=training_args).train()
"""


def test_hf_scripts_keep_the_meaning_of_like_named_flags(tmp_path: Path) -> None:
    (tmp_path / "sft.py").write_text(HF_SCRIPT_WITH_LIKE_NAMED_FIELDS, encoding="utf-8")
    launcher = tmp_path / "run.sh"
    launcher.write_text(
        "torchrun --nproc_per_node 2 sft.py --dtype bfloat16 --lora_dim 16 --zero_stage 3\n",
        encoding="utf-8",
    )
    plan = extract_shell_plan(launcher)
    # --dtype is the model's load dtype (pure bf16), and the script has no ZeRO or LoRA of its
    # own: DeepSpeed-Chat's meanings are not applied to an HfArgumentParser script
    expect(plan, "precision", "bf16-true", EXPLICIT, "bfloat16")
    assert plan.distributed.zero_stage.value == 0
    assert plan.lora is None
    # without any DeepSpeed-Chat flag, a script that is not found keeps the HF names too
    plan = inline("python finetune_elsewhere.py --dtype bf16 --max_seq_len 2048\n")
    expect(plan, "precision", "bf16-true", EXPLICIT, "bf16")
    # the script is not there to say otherwise: a flag is read by what its name means
    expect(plan, "max_seq_length", 2048, EXPLICIT, "2048")
    assert plan.max_seq_length.note == "found at max_seq_len"


# -- the scanner and the expansion ----------------------------------------------------------------


def words_of(text: str) -> list[list[ShellWord]]:
    commands = ShellScanner(text).commands()
    return [command.words for command in ShellExpander(text).expanded_commands(commands)]


def texts_of(text: str) -> list[list[str]]:
    return [[word.text for word in words] for words in words_of(text)]


def test_quoting_follows_posix() -> None:
    assert texts_of("cmd 'a b' \"c $HOME_UNSET\" d\\ e f#g # comment\n") == [
        ["cmd", "a b", "c ", "d e", "f#g"]
    ]
    assert texts_of("A=1\ncmd '$A' \"$A\" $A\n") == [["cmd", "$A", "1", "1"]]


def test_parameter_expansion_forms() -> None:
    text = (
        "SET=x\nEMPTY=\n"
        "cmd ${SET:-d} ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} ${SET:+alt} ${NEW:=n} $NEW"
        ' "${UNSET:-a b}"\n'
    )
    assert texts_of(text) == [["cmd", "x", "d", "d", "alt", "n", "n", "a b"]]


def test_unquoted_expansions_split_and_empty_ones_vanish() -> None:
    text = 'ARGS="--bf16 --gradient_checkpointing"\nNONE=\ncmd $ARGS $NONE "$NONE" "" end\n'
    assert texts_of(text) == [["cmd", "--bf16", "--gradient_checkpointing", "", "", "end"]]


def test_arithmetic_and_run_time_values() -> None:
    text = "B=4\nN=$(nproc)\ncmd $((64 / (B * 2))) $N `date`\n"
    words = words_of(text)[0]
    assert [word.text for word in words[:2]] == ["cmd", "8"]
    assert words[2].unknown == ("$(nproc)",)
    assert words[3].unknown == ("`date`",)
    assert evaluate_integer_expression("-7 / 2") == -3  # C division
    assert evaluate_integer_expression("-7 % 2") == -1
    assert evaluate_integer_expression("2 ** 100000") is None
    assert evaluate_integer_expression("__import__('os')") is None


def test_word_offsets_follow_continuations_and_variables() -> None:
    text = "BATCH=16\ncmd \\\n  --batch=$BATCH \\\n  --x 'y z'\n"
    words = words_of(text)[0]
    batch = words[1]
    start, end = batch.span(len("--batch="))
    assert text[start:end] == "16"  # where BATCH is set
    start, end = words[3].span()
    assert text[start:end] == "y z"


def test_redirections_here_documents_and_operators() -> None:
    text = "cat > a.json <<'EOF'\n{\"x\": 1}\nEOF\nrun 2>&1 | tee log && echo ok; done=1\n"
    assert texts_of(text) == [["cat"], ["run"], ["tee", "log"], ["echo", "ok"]]
    commands = ShellScanner(text).commands()
    assert len(commands) == 5  # the last one only assigns
    document = commands[0].here_documents[0]
    assert text[document.start : document.end] == '{"x": 1}\n'


# -- nothing raises -----------------------------------------------------------------------------

FIXTURES = sorted(path for path in SHELL.iterdir() if path.suffix == ".sh")


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda path: path.name)
def test_every_line_prefix_reads(fixture: Path) -> None:
    lines = fixture.read_text(encoding="utf-8").splitlines(keepends=True)
    for count in range(len(lines) + 1):
        assert isinstance(extract_shell_plan(fixture, "".join(lines[:count])), TrainingPlan)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(fixture=st.sampled_from(FIXTURES), cut=st.floats(0, 1))
def test_character_cuts_read(fixture: Path, cut: float) -> None:
    text = fixture.read_text(encoding="utf-8")
    assert isinstance(extract_shell_plan(fixture, text[: int(len(text) * cut)]), TrainingPlan)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    fixture=st.sampled_from(FIXTURES),
    edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_byte_edits_read(fixture: Path, edits: list[tuple[float, int]]) -> None:
    data = bytearray(fixture.read_bytes())
    for where, byte in edits:
        data[min(len(data) - 1, int(len(data) * where))] = byte
    text = data.decode("utf-8", errors="replace")
    assert isinstance(extract_shell_plan(fixture, text), TrainingPlan)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(text=st.text(alphabet=st.sampled_from(list(" \\\n'\"$`{}()=:-+?#<>|&;ab01")), max_size=60))
def test_shell_punctuation_soup_reads(text: str) -> None:
    assert isinstance(inline(text), TrainingPlan)

"""Calls into the script's own functions and lambdas: a tokenizer's `max_length` reached through
`dataset.map(...)`, the bound on how deep calls are followed, and the package's layering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmmem.extract.pragmas import ProjectSettings
from llmmem.extract.python import extract_python_plan
from llmmem.plan import Provenance, SourceRange, TrainingPlan

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "python" / "followed"
NO_SETTINGS = ProjectSettings()


def read(name: str) -> tuple[TrainingPlan, str]:
    path = FIXTURES / name
    text = path.read_text(encoding="utf-8")
    return extract_python_plan(path, text, settings=NO_SETTINGS), text


def plan_of(source: str) -> TrainingPlan:
    return extract_python_plan(Path("train.py"), source, settings=NO_SETTINGS)


def covered(text: str, where: SourceRange | None) -> tuple[int, str]:
    """The 1-based line and the text a one-line range covers."""
    assert where is not None and where.start_line == where.end_line
    line = text.split("\n")[where.start_line]
    return where.start_line + 1, line[where.start_col : where.end_col]


HEAD = """\
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

tokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-0.5B")
model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")
ds = load_dataset("json", data_files="train.jsonl", split="train")
"""
TAIL = """
args = TrainingArguments(output_dir="out", per_device_train_batch_size=2)
Trainer(model=model, args=args, train_dataset=ds).train()
"""


# -- the fixtures ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "length", "line", "written"),
    [
        ("tokenize_function.py", 4096, 22, "4096"),  # def tokenize_function + ds.map(...)
        ("tokenize_lambda.py", 1024, 14, "1024"),  # ds.map(lambda batch: tok(...))
        ("tokenize_fn_kwargs.py", 2048, 8, "2048"),  # fn_kwargs={"max_length": CONTEXT}
    ],
)
def test_a_tokenizer_max_length_inside_dataset_map_is_the_sequence_length(
    name: str, length: int, line: int, written: str
) -> None:
    plan, text = read(name)
    found = plan.max_seq_length
    assert found.value == length
    assert found.source is Provenance.EXPLICIT
    assert covered(text, found.range) == (line, written)
    assert "tokenizer max_length" in found.note
    assert plan.problems == []


# -- which tokenizer calls count ----------------------------------------------------------------


def test_a_named_function_and_a_lambda_give_the_same_length() -> None:
    named = HEAD + (
        "def tokenize(batch):\n"
        '    return tokenizer(batch["text"], truncation=True, max_length=4096)\n'
        "ds = ds.map(tokenize, batched=True)\n"
    )
    inline = HEAD + (
        'ds = ds.map(lambda b: tokenizer(b["text"], truncation=True, max_length=4096), '
        "batched=True)\n"
    )
    for source in (named + TAIL, inline + TAIL):
        plan = plan_of(source)
        assert (plan.max_seq_length.value, plan.max_seq_length.source) == (
            4096,
            Provenance.EXPLICIT,
        )
        assert plan.max_seq_length.range is not None
        assert "max_length=4096" in source.split("\n")[plan.max_seq_length.range.start_line]


def test_max_length_that_neither_truncates_nor_pads_says_nothing() -> None:
    source = HEAD + (
        'ds = ds.map(lambda b: tokenizer(b["text"], max_length=4096), batched=True)\n'
        'ds = ds.map(lambda b: tokenizer(b["text"], truncation=False, max_length=8192))\n'
    )
    plan = plan_of(source + TAIL)
    assert plan.max_seq_length.source is Provenance.ASSUMED
    assert plan.max_seq_length.value not in (4096, 8192)


def test_padding_to_max_length_counts_without_truncation() -> None:
    source = HEAD + (
        'ds = ds.map(lambda b: tokenizer(b["text"], padding="max_length", max_length=768))\n'
    )
    plan = plan_of(source + TAIL)
    assert (plan.max_seq_length.value, plan.max_seq_length.source) == (768, Provenance.EXPLICIT)


def test_a_tokenizer_known_only_by_its_name_counts_an_other_callable_does_not() -> None:
    by_name = HEAD + (
        "def encode(batch, tokenizer):\n"
        '    return tokenizer(batch["text"], truncation=True, max_length=3072)\n'
        "ds = ds.map(encode)\n"
    )
    assert plan_of(by_name + TAIL).max_seq_length.value == 3072
    other = HEAD + (
        "def encode(batch, encoder):\n"
        '    return encoder(batch["text"], truncation=True, max_length=3072)\n'
        "ds = ds.map(encode)\n"
    )
    assert plan_of(other + TAIL).max_seq_length.source is Provenance.ASSUMED


def test_the_trainers_own_length_wins_over_the_tokenizers() -> None:
    source = (
        "from datasets import load_dataset\n"
        "from transformers import AutoTokenizer\n"
        "from trl import SFTConfig, SFTTrainer\n"
        'tokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-0.5B")\n'
        'ds = load_dataset("json", data_files="t.jsonl", split="train")\n'
        'ds = ds.map(lambda b: tokenizer(b["text"], truncation=True, max_length=4096))\n'
        'config = SFTConfig(output_dir="o", max_length=2048)\n'
        'SFTTrainer(model="Qwen/Qwen2.5-0.5B", args=config, train_dataset=ds).train()\n'
    )
    plan = plan_of(source)
    assert (plan.max_seq_length.value, plan.max_seq_length.source) == (2048, Provenance.EXPLICIT)
    assert plan.max_seq_length.range is not None
    assert plan.max_seq_length.range.start_line == 6  # the SFTConfig line


SFT_HEAD = (
    "from datasets import load_dataset\n"
    "from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments\n"
    "from trl import SFTConfig, SFTTrainer\n"
    'tokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-0.5B")\n'
    'ds = load_dataset("json", data_files="t.jsonl", split="train")\n'
    'ds = ds.map(lambda b: tokenizer(b["text"], truncation=True, max_length={length}))\n'
)
SFT_RUN = 'SFTTrainer(model="Qwen/Qwen2.5-0.5B", args=config, train_dataset=ds).train()\n'


@pytest.mark.parametrize(
    "config",
    [
        'config = SFTConfig(output_dir="o")\n',
        'config = TrainingArguments(output_dir="o")\n',  # SFTTrainer makes it an SFTConfig
        "config = None\n",  # SFTTrainer's own SFTConfig
    ],
)
def test_sft_trainer_cuts_a_tokenized_dataset_to_its_default_max_length(config: str) -> None:
    # TRL 0.29.1 SFTTrainer._prepare_dataset truncates a dataset that already has input_ids to
    # SFTConfig.max_length, 1024 unless written: the step sees 1024 tokens, not the 4096 the
    # tokenizer was allowed
    plan = plan_of(SFT_HEAD.format(length=4096) + config + SFT_RUN)
    found = plan.max_seq_length
    assert (found.value, found.source) == (1024, Provenance.DEFAULT)
    assert "TRL 0.29.1" in found.note and "max_length=4096" in found.note
    assert found.range is not None
    assert found.range.start_line == (6 if config != "config = None\n" else 7)


def test_sft_trainer_keeps_a_shorter_tokenizer_length() -> None:
    source = SFT_HEAD.format(length=512) + 'config = SFTConfig(output_dir="o")\n' + SFT_RUN
    found = plan_of(source).max_seq_length
    assert (found.value, found.source) == (512, Provenance.EXPLICIT)
    assert found.range is not None and found.range.start_line == 5  # the tokenizer call


@pytest.mark.parametrize(
    "config",
    [
        'config = SFTConfig(output_dir="o", max_length=None)\n',  # no cut
        'config = SFTConfig(output_dir="o", dataset_kwargs={"skip_prepare_dataset": True})\n',
    ],
)
def test_sft_trainer_that_does_not_cut_keeps_the_tokenizers_length(config: str) -> None:
    found = plan_of(SFT_HEAD.format(length=4096) + config + SFT_RUN).max_seq_length
    assert (found.value, found.source) == (4096, Provenance.EXPLICIT)


def test_hf_trainer_keeps_the_tokenizers_length() -> None:
    source = SFT_HEAD.format(length=4096) + (
        'model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")\n'
        'Trainer(model=model, args=TrainingArguments("o"), train_dataset=ds).train()\n'
    )
    found = plan_of(source).max_seq_length
    assert (found.value, found.source) == (4096, Provenance.EXPLICIT)


def test_a_lambda_called_in_the_script_gives_its_value() -> None:
    source = (
        "from trl import SFTConfig, SFTTrainer\n"
        "double = lambda n: n * 2\n"
        'config = SFTConfig(output_dir="o", max_length=double(1536))\n'
        'SFTTrainer(model="Qwen/Qwen2.5-0.5B", args=config).train()\n'
    )
    plan = plan_of(source)
    assert (plan.max_seq_length.value, plan.max_seq_length.source) == (3072, Provenance.EXPLICIT)


# -- bounds --------------------------------------------------------------------------------------


def test_recursion_and_long_call_chains_end_silently() -> None:
    chain = "".join(f"def step{i}(b):\n    return step{i + 1}(b)\n" for i in range(40))
    source = HEAD + (
        "def ping(b):\n    return pong(b)\n"
        "def pong(b):\n    return ping(b)\n"
        "def loop(b):\n    return loop(b)\n"
        f"{chain}"
        "def step40(b):\n    return tokenizer(b, truncation=True, max_length=9999)\n"
        "ds = ds.map(ping).map(loop).map(lambda b: (lambda c: c)(b))\n"
        "ds = ds.map(step0)\n"
    )
    plan = plan_of(source + TAIL)
    assert plan.problems == []  # a bound reached is not a problem to report
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-0.5B"


# -- the script's own defaults -------------------------------------------------------------------

CLI = Provenance.CLI_DEFAULT


@pytest.mark.parametrize(
    ("key", "value", "line", "written"),
    [
        ("model_id", "meta-llama/Llama-2-7b-hf", 24, '"meta-llama/Llama-2-7b-hf"'),
        ("quantization.bits", 4, 27, "True"),  # load_in_4bit: bool = True
        ("lora.r", 64, 28, "64"),  # lora_r: int = 64
        ("lora.alpha", 16, 29, "16"),
        ("lora.dropout", 0.05, 30, "0.05"),
        ("max_seq_length", 2048, 34, "2048"),  # through tokenize() in dataset.map
    ],
)
def test_dataclass_field_defaults_are_the_scripts_own_defaults(
    key: str, value: object, line: int, written: str
) -> None:
    plan, text = read("sft_script_arguments.py")
    owner: Any = plan
    for part in key.split("."):
        owner = getattr(owner, part)
    assert owner.value == value
    assert owner.source is CLI
    assert covered(text, owner.range) == (line, written)
    assert "ScriptArguments." in owner.note


def test_a_default_factory_and_the_remaining_strings_of_the_parser() -> None:
    plan, text = read("sft_script_arguments.py")
    targets = plan.lora.target_modules if plan.lora is not None else None
    assert targets is not None
    assert sorted(targets.value or []) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert targets.source is CLI
    assert targets.range is not None and targets.range.start_line + 1 == 32
    assert plan.problems == []  # `script_args, training_args, _ = ...` unpacks


def test_argparse_and_fire_defaults_name_their_flag() -> None:
    argparse_source = (
        "import argparse\n"
        "from peft import LoraConfig\n"
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        "parser = argparse.ArgumentParser()\n"
        'parser.add_argument("--model", default="Qwen/Qwen2.5-7B")\n'
        'parser.add_argument("--lora_r", type=int, default=64)\n'
        "args = parser.parse_args()\n"
        "model = AutoModelForCausalLM.from_pretrained(args.model)\n"
        'Trainer(model=model, args=TrainingArguments("o"), peft_config=LoraConfig(r=args.lora_r))\n'
    )
    fire_source = (
        "import fire\n"
        "from peft import LoraConfig, get_peft_model\n"
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        'def train(model: str = "Qwen/Qwen2.5-7B", lora_r: int = 64):\n'
        "    m = AutoModelForCausalLM.from_pretrained(model)\n"
        "    m = get_peft_model(m, LoraConfig(r=lora_r))\n"
        '    Trainer(model=m, args=TrainingArguments("o")).train()\n'
        'if __name__ == "__main__":\n'
        "    fire.Fire(train)\n"
    )
    for source, line in ((argparse_source, 6), (fire_source, 4)):
        plan = plan_of(source)
        assert plan.lora is not None
        r = plan.lora.r
        assert (r.value, r.source) == (64, CLI)
        assert r.range is not None and r.range.start_line + 1 == line
        assert "--lora_r" in r.note
        assert plan.model_id is not None
        assert (plan.model_id.value, plan.model_id.source) == ("Qwen/Qwen2.5-7B", CLI)


@pytest.mark.parametrize(
    ("key", "value", "line", "written", "flag"),
    [
        ("model_id", "meta-llama/Llama-2-7b-hf", 19, '"meta-llama/Llama-2-7b-hf"', "base_model"),
        ("per_device_train_batch_size", 4, 22, "4", "micro_batch_size"),
        ("gradient_accumulation_steps", 32, 23, "32", "accumulation"),
        ("max_seq_length", 512, 24, "512", "cutoff_len"),  # through tokenize() in dataset.map
        ("gradient_checkpointing", True, 29, "True", "checkpointing"),
        ("lora.r", 8, 25, "8", "lora_r"),
        ("lora.alpha", 16, 26, "16", "lora_alpha"),
    ],
)
def test_a_fire_entry_points_keyword_defaults_are_its_flags_defaults(
    key: str, value: object, line: int, written: str, flag: str
) -> None:
    plan, text = read("fire_entry_point.py")
    owner: Any = plan
    for part in key.split("."):
        owner = getattr(owner, part)
    assert owner.value == value
    assert owner.source is CLI
    assert covered(text, owner.range) == (line, written)
    assert f"--{flag} " in owner.note
    assert plan.problems == []


def test_a_factory_not_known_is_unknown_not_an_error() -> None:
    source = (
        "from dataclasses import dataclass, field\n"
        "from peft import LoraConfig\n"
        "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer\n"
        "from transformers import TrainingArguments\n"
        "from mylib import default_modules\n"
        "@dataclass\n"
        "class Args:\n"
        "    targets: list = field(default_factory=default_modules)\n"
        "(args,) = HfArgumentParser(Args).parse_args_into_dataclasses()\n"
        'model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")\n'
        "config = LoraConfig(target_modules=args.targets)\n"
        'Trainer(model=model, args=TrainingArguments("o"), peft_config=config).train()\n'
    )
    plan = plan_of(source)
    assert any("`args.targets`" in line and "default_factory" in line for line in plan.problems)
    assert not any("internal error" in line for line in plan.problems)


# -- deepspeed.add_config_arguments --------------------------------------------------------------


def test_deepspeed_add_config_arguments_keeps_the_scripts_own_options() -> None:
    # DeepSpeed-Chat's main.py: `parser = deepspeed.add_config_arguments(parser)` returns the
    # same parser with DeepSpeed's --deepspeed/--deepspeed_config added
    plan, text = read("deepspeed_chat_main.py")
    batch = plan.per_device_train_batch_size
    assert (batch.value, batch.source) == (16, CLI)
    assert covered(text, batch.range) == (27, "16")
    assert "--per_device_train_batch_size" in batch.note
    assert (plan.max_seq_length.value, plan.max_seq_length.source) == (512, CLI)
    assert not any("add_config_arguments" in line for line in plan.problems), plan.problems
    # --model_name_or_path is required and has no default: the file alone does not name the
    # model, and the problem says where it comes from
    (problem,) = plan.problems
    assert "model id" in problem and "--model_name_or_path is required" in problem


def test_deepspeed_add_config_arguments_leaves_no_model_problem() -> None:
    source = (
        "import argparse\n"
        "import deepspeed\n"
        "from transformers import AutoModelForCausalLM\n"
        "def parse_args():\n"
        "    parser = argparse.ArgumentParser()\n"
        '    parser.add_argument("--model_name_or_path", type=str, default="facebook/opt-1.3b")\n'
        '    parser.add_argument("--zero_stage", type=int, default=0)\n'
        "    parser = deepspeed.add_config_arguments(parser)\n"
        "    return parser.parse_args()\n"
        "args = parse_args()\n"
        "model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)\n"
        "if args.deepspeed and args.deepspeed_config is None:\n"
        "    model.gradient_checkpointing_enable()\n"
    )
    plan = plan_of(source)
    assert plan.problems == []
    assert plan.model_id is not None
    assert (plan.model_id.value, plan.model_id.source) == ("facebook/opt-1.3b", CLI)
    assert plan.model_id.range is not None and plan.model_id.range.start_line + 1 == 6
    # a parser not known stays unknown: no options are made up for it
    unknown = source.replace("parser = argparse.ArgumentParser()", "parser = make_parser()")
    assert any("model id" in line for line in plan_of(unknown).problems)


# -- unsloth's checkpointing --------------------------------------------------------------------


def test_unsloth_checkpointing_asked_for_at_loading_is_on_and_offloaded() -> None:
    plan, text = read("unsloth_fastmodel.py")
    found = plan.gradient_checkpointing
    assert (found.value, found.source) == (True, Provenance.EXPLICIT)
    assert covered(text, found.range) == (12, '"unsloth"')
    assert "offloaded" in found.note and "CPU" in found.note
    assert plan.problems == []


UNSLOTH = """\
from unsloth import FastLanguageModel
from trl import SFTConfig, SFTTrainer
model, tokenizer = FastLanguageModel.from_pretrained(
    model_name="unsloth/Qwen2.5-7B", max_seq_length=4096, load_in_4bit=True{loading}
)
model = FastLanguageModel.get_peft_model(model, r=16{adapter})
SFTTrainer(model=model, tokenizer=tokenizer, args=SFTConfig(output_dir="o")).train()
"""


@pytest.mark.parametrize(
    ("loading", "adapter", "value", "source", "offloaded"),
    [
        ("", "", True, Provenance.DEFAULT, True),  # get_peft_model's default is "unsloth"
        ("", ', use_gradient_checkpointing="unsloth"', True, Provenance.EXPLICIT, True),
        ("", ", use_gradient_checkpointing=True", True, Provenance.EXPLICIT, False),
        ("", ", use_gradient_checkpointing=False", False, Provenance.EXPLICIT, False),
        (", use_gradient_checkpointing=False", "", False, Provenance.EXPLICIT, False),
        (
            ", use_gradient_checkpointing=False",
            ', use_gradient_checkpointing="unsloth"',
            True,
            Provenance.EXPLICIT,
            True,
        ),
    ],
)
def test_unsloth_use_gradient_checkpointing(
    loading: str, adapter: str, value: bool, source: Provenance, offloaded: bool
) -> None:
    plan = plan_of(UNSLOTH.format(loading=loading, adapter=adapter))
    found = plan.gradient_checkpointing
    assert (found.value, found.source) == (value, source)
    assert ("offloaded" in found.note) is offloaded


GRPO_THROUGH_A_FACTORY = """\
from trl import GRPOConfig, GRPOTrainer

VLLM = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.25)


def build_args(generations: int = 4, beta: float = 0.0) -> GRPOConfig:
    return GRPOConfig(
        output_dir="out",
        per_device_train_batch_size=8,
        num_generations=generations,
        beta=beta,
        vllm_enable_sleep_mode=True,
        **VLLM,
    )


trainer = GRPOTrainer(
    model="Qwen/Qwen2.5-0.5B-Instruct",
    reward_funcs=lambda completions, **kw: [0.0] * len(completions),
    args=build_args(generations=16, beta=0.02),
)
trainer.train()
"""


def test_grpo_fields_reached_through_a_function_and_a_splatted_dict() -> None:
    plan = plan_of(GRPO_THROUGH_A_FACTORY)
    assert plan.problems == []
    text = GRPO_THROUGH_A_FACTORY
    # the call's arguments win over the function's defaults, and point at the call
    for key, value, written in (("num_generations", 16, "16"), ("beta", 0.02, "0.02")):
        kept = plan.extra[key]
        assert (kept.value, kept.source) == (value, Provenance.EXPLICIT)
        assert covered(text, kept.range) == (20, written)
    for key, value, written in (
        ("use_vllm", True, "True"),
        ("vllm_mode", "colocate", '"colocate"'),
        ("vllm_gpu_memory_utilization", 0.25, "0.25"),
    ):
        kept = plan.extra[key]
        assert (kept.value, kept.source) == (value, Provenance.EXPLICIT)
        assert covered(text, kept.range) == (3, written)
    assert plan.extra["vllm_enable_sleep_mode"].value is True
    assert plan.extra["num_iterations"].source is Provenance.DEFAULT

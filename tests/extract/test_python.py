"""Reading Python training scripts: each value, where it came from, and the exact text its range
covers; the builder's precedence; pragmas and [tool.llmmem]; and input that must never raise."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmmem.extract import extract_plan
from llmmem.extract.builder import PlanBuilder
from llmmem.extract.pragmas import (
    ALL_CODES,
    ProjectSettings,
    find_project_settings,
    is_suppressed,
    parse_suppressions,
    read_pragmas,
)
from llmmem.extract.python import extract_python_plan
from llmmem.extract.vocabulary import (
    canonical_key,
    normalize_fsdp,
    optim_for_optimizer_class,
    split_module_names,
)
from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "python"
FIXTURE_NAMES = sorted(path.name for path in FIXTURES.glob("*.py"))
NO_SETTINGS = ProjectSettings()

EXPLICIT = Provenance.EXPLICIT
DEFAULT = Provenance.DEFAULT
CLI = Provenance.CLI_DEFAULT
PRAGMA = Provenance.PRAGMA
CONFIG = Provenance.CONFIG
ASSUMED = Provenance.ASSUMED


def read(name: str) -> tuple[TrainingPlan, str]:
    path = FIXTURES / name
    text = path.read_text(encoding="utf-8")
    return extract_plan(path, text, settings=NO_SETTINGS), text


def text_at(text: str, where: SourceRange) -> str:
    lines = text.split("\n")
    if where.start_line == where.end_line:
        return lines[where.start_line][where.start_col : where.end_col]
    middle = lines[where.start_line + 1 : where.end_line]
    return "\n".join(
        [
            lines[where.start_line][where.start_col :],
            *middle,
            lines[where.end_line][: where.end_col],
        ]
    )


def sourced(plan: TrainingPlan, key: str) -> Sourced[Any]:
    """`per_device_train_batch_size`, `lora.r`, `quantization.bits`, `distributed.zero_stage`,
    `extra.ref_model_id`."""
    owner: Any = plan
    *parents, leaf = key.split(".")
    for parent in parents:
        owner = owner.extra if parent == "extra" else getattr(owner, parent)
        assert owner is not None, f"{parent} is missing"
    found = owner[leaf] if isinstance(owner, dict) else getattr(owner, leaf)
    assert isinstance(found, Sourced), f"{key} is {found!r}"
    return found


@dataclass(frozen=True)
class Expect:
    key: str
    value: object
    source: Provenance
    text: str | None = None  # what the range covers; None: do not check the range
    line: int | None = None  # 1-based, as the fixture reads
    before: str = ""  # what the line has just before the range, where the text repeats


EXPECTED: dict[str, list[Expect]] = {
    "hf_trainer_full.py": [
        Expect("model_id", "Qwen/Qwen2.5-0.5B", EXPLICIT, '"Qwen/Qwen2.5-0.5B"', 13),
        Expect("per_device_train_batch_size", 4, EXPLICIT, "4", 38),
        Expect("gradient_accumulation_steps", 8, EXPLICIT, "8", 39),
        Expect("max_seq_length", 1024, EXPLICIT, "1024", 14),  # MAX_LEN via tokenize()
        Expect("gradient_checkpointing", True, EXPLICIT, "True", 42),
        Expect("precision", "bf16-autocast", EXPLICIT, "torch.bfloat16", 21),
        Expect("optim", "adamw_torch_fused", EXPLICIT, '"adamw_torch_fused"', 44),
        Expect("attn_implementation", "sdpa", EXPLICIT, '"sdpa"', 22),
        Expect("use_cache", False, EXPLICIT, "False", 24),
        Expect("distributed.world_size", 1, ASSUMED),
        Expect("distributed.zero_stage", 0, DEFAULT),
    ],
    "trl_sft_lora.py": [
        Expect("model_id", "meta-llama/Llama-3.2-1B", EXPLICIT, '"meta-llama/Llama-3.2-1B"', 27),
        Expect("max_seq_length", 2048, EXPLICIT, "2048", 18),
        Expect("per_device_train_batch_size", 2, EXPLICIT, "2", 19),
        Expect("gradient_accumulation_steps", 4, EXPLICIT, "4", 20),
        Expect("gradient_checkpointing", True, DEFAULT),  # TRL turns it on
        Expect("precision", "bf16-autocast", EXPLICIT, '"bfloat16"', 23),
        Expect("attn_implementation", "flash_attention_2", EXPLICIT, '"flash_attention_2"', 23),
        Expect("optim", "adamw_torch_fused", DEFAULT),
        Expect("lora.r", 16, EXPLICIT, "16", 9),
        Expect("lora.alpha", 32.0, EXPLICIT, "32", 10),
        Expect("lora.dropout", 0.05, EXPLICIT, "0.05", 11),
        Expect("lora.target_modules", ["all-linear"], EXPLICIT, '"all-linear"', 12),
        Expect("lora.dora", False, DEFAULT),
    ],
    "trl_dpo.py": [
        Expect(
            "model_id",
            "HuggingFaceTB/SmolLM2-360M-Instruct",
            EXPLICIT,
            '"HuggingFaceTB/SmolLM2-360M-Instruct"',
            6,
        ),
        Expect("max_seq_length", 1536, EXPLICIT, "1536", 17),
        Expect("per_device_train_batch_size", 1, EXPLICIT, "1", 19),
        Expect("gradient_accumulation_steps", 16, EXPLICIT, "16", 20),
        Expect("precision", "fp16", EXPLICIT, "True", 21),  # fp16 autocast over float32
        Expect("gradient_checkpointing", False, EXPLICIT, "False", 22),
        Expect("extra.ref_model_id", "HuggingFaceTB/SmolLM2-360M-Instruct", EXPLICIT, None, 6),
    ],
    "qlora.py": [
        Expect(
            "model_id", "mistralai/Mistral-7B-v0.1", EXPLICIT, '"mistralai/Mistral-7B-v0.1"', 12
        ),
        Expect("per_device_train_batch_size", 8, EXPLICIT, "8", 43),
        Expect("gradient_accumulation_steps", 2, EXPLICIT, "2", 44),
        Expect("optim", "paged_adamw_8bit", EXPLICIT, '"paged_adamw_8bit"', 45),
        Expect("precision", "bf16", EXPLICIT, "True", 46),
        Expect("max_seq_length", 512, EXPLICIT, "512", 37),  # tokenizer model_max_length
        Expect(
            "gradient_checkpointing",
            True,
            DEFAULT,
            "prepare_model_for_kbit_training(model)",
            24,
        ),
        Expect("lora.r", 64, EXPLICIT, "64", 27),
        Expect("lora.alpha", 16.0, EXPLICIT, "16", 28),
        Expect(
            "lora.target_modules",
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            EXPLICIT,
            '["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]',
            29,
        ),
        Expect("lora.dropout", 0.1, EXPLICIT, "0.1", 30),
        Expect("quantization.bits", 4, EXPLICIT, "True", 15),
        Expect("quantization.quant_type", "nf4", EXPLICIT, '"nf4"', 16),
        Expect("quantization.double_quant", True, EXPLICIT, "True", 17),
        Expect("quantization.compute_dtype", "bfloat16", EXPLICIT, "torch.bfloat16", 18),
        Expect(
            "quantization.prepare_for_kbit_training",
            True,
            EXPLICIT,
            "prepare_model_for_kbit_training(model)",
            24,
        ),
    ],
    "unsloth_sft.py": [
        Expect(
            "model_id",
            "unsloth/Llama-3.2-3B-Instruct",
            EXPLICIT,
            '"unsloth/Llama-3.2-3B-Instruct"',
            8,
        ),
        Expect("max_seq_length", 2048, EXPLICIT, "2048", 5),
        Expect("per_device_train_batch_size", 2, EXPLICIT, "2", 31),
        Expect("gradient_accumulation_steps", 4, EXPLICIT, "4", 32),
        Expect("optim", "adamw_8bit", EXPLICIT, '"adamw_8bit"', 35),
        Expect("gradient_checkpointing", True, EXPLICIT, '"unsloth"', 20),
        Expect("precision", "bf16-autocast", ASSUMED, "None", 10),  # dtype=None: unsloth picks
        Expect("lora.r", 32, EXPLICIT, "32", 16),
        Expect("lora.alpha", 32.0, EXPLICIT, "32", 18),
        Expect("lora.dropout", 0.0, EXPLICIT, "0", 19),
        Expect(
            "lora.target_modules",
            ["q_proj", "k_proj", "v_proj", "o_proj"],
            EXPLICIT,
            '["q_proj", "k_proj", "v_proj", "o_proj"]',
            17,
        ),
        Expect("quantization.bits", 4, EXPLICIT, "True", 11),
        Expect("quantization.quant_type", "nf4", DEFAULT),
        Expect("quantization.double_quant", True, DEFAULT),
        Expect("extra.unsloth", True, EXPLICIT),
    ],
    "torch_loop.py": [
        Expect("model_id", "openai-community/gpt2", EXPLICIT, '"openai-community/gpt2"', 7),
        Expect("per_device_train_batch_size", 16, EXPLICIT, "16", 15),  # not the eval loader
        Expect("max_seq_length", 512, EXPLICIT, "512", 12),
        Expect("precision", "bf16", EXPLICIT, "torch.bfloat16", 24),
        Expect("optim", "adamw_torch", EXPLICIT, "torch.optim.AdamW", 18),
        Expect("gradient_accumulation_steps", 1, ASSUMED),
        Expect("gradient_checkpointing", False, ASSUMED),
    ],
    "argparse_script.py": [
        Expect("model_id", "mistralai/Mistral-7B-v0.1", CLI, '"mistralai/Mistral-7B-v0.1"', 11),
        Expect("per_device_train_batch_size", 4, CLI, "4", 12),
        Expect("gradient_accumulation_steps", 8, CLI, '"8"', 13),  # type=int applies
        Expect("max_seq_length", 2048, CLI, "2048", 14),
        Expect(
            "gradient_checkpointing",
            False,
            CLI,
            'parser.add_argument("--gradient_checkpointing", action="store_true")',
            15,
        ),
        Expect("precision", "fp32", CLI, "torch.float32", 24),  # chosen by --bf16's default
        Expect("optim", "adamw_torch_fused", DEFAULT),
    ],
    "default_args_expansion.py": [
        Expect("model_id", "google/flan-t5-large", EXPLICIT, '"google/flan-t5-large"', 13),
        Expect("per_device_train_batch_size", 1, EXPLICIT, "1", 16),
        Expect("precision", "fp16", EXPLICIT, "True", 17),
        Expect("gradient_accumulation_steps", 4, EXPLICIT, "4", 10),
        Expect("optim", "adafactor", EXPLICIT, '"adafactor"', 10),
        Expect("gradient_checkpointing", True, EXPLICIT, "True", 11),
        Expect("max_seq_length", 1024, ASSUMED),
    ],
    "conditional_expression.py": [
        Expect("model_id", "google/gemma-2-2b", CLI, '"google/gemma-2-2b"', 7),  # env default
        Expect("per_device_train_batch_size", 4, EXPLICIT, "4", 13),  # SMALL_GPU is False
        Expect("gradient_accumulation_steps", 2, CLI, "2", 14),
        Expect("precision", "bf16", EXPLICIT, "True", 15, "bf16="),
        Expect("attn_implementation", "eager", EXPLICIT, '"eager"', 9),
        Expect("distributed.fsdp", "full_shard", EXPLICIT, '"full_shard auto_wrap"', 16),
        Expect("distributed.offload_params", False, DEFAULT),
    ],
    "decoys.py": [
        Expect("model_id", "EleutherAI/pythia-410m", EXPLICIT, '"EleutherAI/pythia-410m"', 13),
        Expect("per_device_train_batch_size", 2, EXPLICIT, "2", 14),
        Expect("gradient_checkpointing", False, DEFAULT),
        Expect("max_seq_length", 1024, ASSUMED),
        Expect("precision", "fp32", DEFAULT),
    ],
    "pragma_script.py": [
        Expect(
            "model_id",
            "meta-llama/Llama-3.1-8B",
            PRAGMA,
            "# llmmem: model=meta-llama/Llama-3.1-8B",
            2,
        ),
        Expect("max_seq_length", 4096, PRAGMA, "# llmmem: gpu=A100-80GB seq=4096 world_size=8", 1),
        Expect("gpu", "A100-80GB", PRAGMA, "# llmmem: gpu=A100-80GB seq=4096 world_size=8", 1),
        Expect("distributed.world_size", 8, PRAGMA, None, 1),
        Expect("per_device_train_batch_size", 2, EXPLICIT, "2", 10),
        Expect("distributed.deepspeed_config", "ds_zero3.json", EXPLICIT, '"ds_zero3.json"', 11),
        Expect("distributed.zero_stage", 3, CONFIG, '"ds_zero3.json"', 11),
        Expect("distributed.offload_optimizer", True, CONFIG, '"ds_zero3.json"', 11),
        Expect("distributed.offload_params", False, CONFIG, '"ds_zero3.json"', 11),
        Expect("distributed.overlap_comm", True, CONFIG, '"ds_zero3.json"', 11),
        Expect("distributed.reduce_bucket_size", 500_000_000, DEFAULT),
    ],
    "hf_argparser_dataclass.py": [
        Expect("model_id", "meta-llama/Llama-3.2-3B", CLI, '"meta-llama/Llama-3.2-3B"', 16),
        Expect("precision", "bf16-true", CLI, '"bfloat16"', 18),
        Expect("gradient_checkpointing", True, CLI, "True", 29),
        Expect("optim", "adamw_bnb_8bit", CLI, '"adamw_bnb_8bit"', 30),
        Expect("max_seq_length", 1024, CLI, "1024", 24),  # --block_size
        Expect("per_device_train_batch_size", 8, DEFAULT),
    ],
    "grpo_helpers.py": [
        Expect(
            "model_id", "Qwen/Qwen2.5-1.5B-Instruct", EXPLICIT, '"Qwen/Qwen2.5-1.5B-Instruct"', 16
        ),
        Expect("per_device_train_batch_size", 8, EXPLICIT, "8", 22, "per_device_train_batch_size="),
        # prompt 512 (TRL default) + completion 1024: as weak as its weakest part
        Expect("max_seq_length", 1536, DEFAULT, "1024", 22, "max_completion_length="),
        Expect(
            "gradient_checkpointing", True, EXPLICIT, "model.gradient_checkpointing_enable()", 18
        ),
        Expect("precision", "bf16-autocast", EXPLICIT, "torch.bfloat16", 17),
        Expect("gradient_accumulation_steps", 1, DEFAULT),
    ],
}

FRAMEWORKS = {
    "trl_sft_lora.py": "trl",
    "trl_dpo.py": "trl",
    "unsloth_sft.py": "trl",
    "grpo_helpers.py": "trl",
    "hf_trainer_full.py": "hf",
    "qlora.py": "hf",
    "torch_loop.py": "hf",
}


def test_every_fixture_has_expectations() -> None:
    assert sorted(EXPECTED) == FIXTURE_NAMES
    assert 8 <= len(FIXTURE_NAMES) <= 14


@pytest.mark.parametrize(
    ("name", "expect"),
    [(name, expect) for name, expects in EXPECTED.items() for expect in expects],
    ids=lambda item: item if isinstance(item, str) else item.key,
)
def test_fixture_value_provenance_and_range(name: str, expect: Expect) -> None:
    plan, text = read(name)
    found = sourced(plan, expect.key)
    assert found.value == expect.value
    assert found.source is expect.source, found.note
    if expect.line is not None:
        assert found.range is not None and found.range.path is None
        assert found.range.start_line == expect.line - 1
    if expect.text is not None:
        assert found.range is not None
        assert text_at(text, found.range) == expect.text
        if expect.before:
            line = text.split("\n")[found.range.start_line]
            assert line[: found.range.start_col].endswith(expect.before)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixtures_read_without_problems(name: str) -> None:
    plan, _ = read(name)
    assert plan.problems == []
    assert plan.kind == "python"
    if name in FRAMEWORKS:
        assert plan.framework == FRAMEWORKS[name]


def test_calls_the_plan_points_at() -> None:
    plan, text = read("hf_trainer_full.py")
    assert plan.trainer_range is not None and plan.model_range is not None
    assert text_at(text, plan.trainer_range).startswith("TrainingArguments(\n")
    assert text_at(text, plan.trainer_range).endswith(")")
    assert text_at(text, plan.model_range).startswith("AutoModelForCausalLM.from_pretrained(")
    qlora, qlora_text = read("qlora.py")
    assert qlora.lora is not None and qlora.lora.range is not None
    assert text_at(qlora_text, qlora.lora.range).startswith("LoraConfig(")
    assert qlora.quantization is not None and qlora.quantization.range is not None
    assert text_at(qlora_text, qlora.quantization.range).startswith("BitsAndBytesConfig(")


def test_plans_without_adapters_or_quantization() -> None:
    for name in ("hf_trainer_full.py", "decoys.py", "torch_loop.py", "argparse_script.py"):
        plan, _ = read(name)
        assert plan.lora is None and plan.quantization is None, name


def test_decoys_change_nothing() -> None:
    plan, _ = read("decoys.py")
    # an unused `gradient_checkpointing = True`, a list of other model ids, an `if False:` block
    assert plan.model_id is not None and plan.model_id.value == "EleutherAI/pythia-410m"
    assert plan.gradient_checkpointing.value is False
    assert plan.per_device_train_batch_size.value == 2
    assert plan.max_seq_length.source is ASSUMED  # `max_seq_length = 8192` reaches nothing


def test_first_branch_of_an_unknown_condition_is_noted() -> None:
    plan, _ = read("conditional_expression.py")
    assert "first branch of a conditional expression" in plan.precision.note
    assert "is_bf16_supported" in plan.precision.note


def test_pragma_line_suppressions() -> None:
    text = (FIXTURES / "pragma_script.py").read_text(encoding="utf-8")
    assert parse_suppressions(text) == {9: {"LLM003"}}


# -- small scripts: how values travel -----------------------------------------------------------


def plan_of(source: str, name: str = "train.py") -> tuple[TrainingPlan, str]:
    return extract_python_plan(Path(name), source, settings=NO_SETTINGS), source


def test_kwargs_through_a_function_and_a_dict_call() -> None:
    source = (
        "from transformers import TrainingArguments\n"
        "shared = dict(gradient_accumulation_steps=16, bf16=True)\n"
        "def build(batch=3, **extra):\n"
        "    return TrainingArguments(per_device_train_batch_size=batch, **shared, **extra)\n"
        "args = build(optim='adamw_8bit')\n"
    )
    plan, text = plan_of(source)
    assert plan.per_device_train_batch_size.value == 3
    assert "default of parameter `batch`" in plan.per_device_train_batch_size.note
    assert plan.gradient_accumulation_steps.value == 16
    assert plan.optim.value == "adamw_8bit"
    assert plan.optim.range is not None and text_at(text, plan.optim.range) == "'adamw_8bit'"


def test_a_deepspeed_dict_in_the_script_gives_its_zero3_sizes() -> None:
    source = (
        "from transformers import TrainingArguments\n"
        "ds = {'zero_optimization': {'stage': 3, 'stage3_prefetch_bucket_size': 1e7,\n"
        "      'stage3_param_persistence_threshold': 'auto', 'stage3_max_reuse_distance': 0,\n"
        "      'reduce_bucket_size': 2e8, 'overlap_comm': False}}\n"
        "args = TrainingArguments(output_dir='x', deepspeed=ds)\n"
    )
    plan, _ = plan_of(source)
    d = plan.distributed
    assert d.zero_stage.value == 3
    assert d.prefetch_bucket_size.value == 10_000_000
    assert d.param_persistence_threshold.value == "auto"
    assert d.max_reuse_distance.value == 0
    assert d.reduce_bucket_size.value == 200_000_000
    assert d.overlap_comm.value is False
    assert plan.problems == []


def test_attribute_set_after_construction_counts() -> None:
    source = (
        "from transformers import TrainingArguments\n"
        "args = TrainingArguments(output_dir='x')\n"
        "args.gradient_checkpointing = True\n"
    )
    plan, _ = plan_of(source)
    assert plan.gradient_checkpointing.value is True
    assert plan.gradient_checkpointing.source is EXPLICIT


def test_precision_rules() -> None:
    cases = {
        "bf16=True": "bf16",
        "fp16=True": "fp16",
        "": "fp32",
        # the trainer autocasts over the bf16 weights it was given (kept as loaded)
        "bf16=True, torch_dtype=torch.bfloat16": "bf16-autocast",
        "bf16=False, torch_dtype=torch.bfloat16": "bf16-true",
        "torch_dtype=torch.float16": "fp16-true",
        "dtype='bfloat16'": "bf16-true",
    }
    for arguments, expected in cases.items():
        model_keywords = ", ".join(
            part for part in arguments.split(", ") if part.startswith(("torch_dtype", "dtype"))
        )
        trainer_keywords = ", ".join(part for part in arguments.split(", ") if "16=" in part)
        source = (
            "import torch\n"
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            f"model = AutoModelForCausalLM.from_pretrained('gpt2', {model_keywords})\n"
            f"Trainer(model=model, args=TrainingArguments('o', {trainer_keywords}))\n"
        )
        plan, _ = plan_of(source)
        assert plan.precision.value == expected, arguments


def test_unknown_model_id_asks_for_a_pragma() -> None:
    plan, _ = plan_of(
        "import sys\n"
        "from transformers import AutoModel\n"
        "m = AutoModel.from_pretrained(sys.argv[1])\n"
    )
    assert plan.model_id is None
    assert any("llmmem: model=" in problem for problem in plan.problems)


def test_if_statement_with_an_error_exit_takes_the_other_branch() -> None:
    source = (
        "import torch\n"
        "from transformers import TrainingArguments\n"
        "if not torch.cuda.is_available():\n"
        "    raise SystemExit('needs a GPU')\n"
        "else:\n"
        "    bs = 6\n"
        "TrainingArguments('o', per_device_train_batch_size=bs)\n"
    )
    plan, _ = plan_of(source)
    assert plan.per_device_train_batch_size.value == 6


def test_manual_optimizer_passed_to_the_trainer_wins() -> None:
    source = (
        "import bitsandbytes as bnb\n"
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        "model = AutoModelForCausalLM.from_pretrained('gpt2')\n"
        "opt = bnb.optim.PagedAdamW8bit(model.parameters(), lr=1e-4)\n"
        "Trainer(model=model, args=TrainingArguments('o', optim='adamw_torch'),\n"
        "        optimizers=(opt, None))\n"
    )
    plan, text = plan_of(source)
    assert plan.optim.value == "paged_adamw_8bit"
    assert plan.optim.range is not None
    assert text_at(text, plan.optim.range) == "bnb.optim.PagedAdamW8bit"


def test_fire_entry_point_parameters_are_command_line_defaults() -> None:
    source = (
        "import fire\n"
        "from transformers import TrainingArguments\n"
        "def train(batch_size: int = 12):\n"
        "    TrainingArguments('o', per_device_train_batch_size=batch_size)\n"
        "fire.Fire(train)\n"
    )
    plan, _ = plan_of(source)
    assert plan.per_device_train_batch_size.value == 12
    assert plan.per_device_train_batch_size.source is CLI


def test_non_ascii_lines_count_columns_in_characters() -> None:
    source = (
        "from transformers import TrainingArguments\n"
        "args = TrainingArguments('über-ñ', per_device_train_batch_size=5)  # ✓\n"
    )
    plan, text = plan_of(source)
    found = plan.per_device_train_batch_size
    assert found.range is not None and text_at(text, found.range) == "5"


def test_settings_give_gpu_and_world_size_but_pragmas_win(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.llmmem]\ngpu = "H100"\nworld_size = 4\nhub = false\n'
        '[tool.llmmem.severity]\nLLM003 = "warning"\n',
        encoding="utf-8",
    )
    script = tmp_path / "scripts" / "train.py"
    script.parent.mkdir()
    script.write_text("# llmmem: world_size=2\nx = 1\n", encoding="utf-8")
    project = find_project_settings(script)
    assert project.gpu == "H100" and project.world_size == 4 and project.hub is False
    assert project.severity == {"LLM003": "warning"}
    plan = extract_plan(script)  # finds the settings itself
    assert plan.gpu is not None and plan.gpu.value == "H100" and plan.gpu.source is PRAGMA
    assert plan.gpu.range is not None and plan.gpu.range.path == str(tmp_path / "pyproject.toml")
    assert plan.gpu.range.start_line == 4
    assert plan.distributed.world_size.value == 2  # the file's pragma beats the project


def test_bad_settings_are_problems_not_errors(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[tool.llmmem]\nworld_size = 0\ncolour = 'red'\n[tool.llmmem.severity]\nLLM001 = 'loud'\n",
        encoding="utf-8",
    )
    project = find_project_settings(tmp_path / "a.py")
    assert project.world_size is None
    assert len(project.problems) == 3
    (tmp_path / "pyproject.toml").write_text("[tool.llmmem\n", encoding="utf-8")
    assert find_project_settings(tmp_path / "b.py").problems


def test_a_config_subclass_defined_in_the_file() -> None:
    source = (
        "from dataclasses import dataclass, field\n"
        "from trl import SFTConfig\n"
        "@dataclass\n"
        "class LongConfig(SFTConfig):\n"
        "    max_length: int = field(default=8192)\n"
        "    per_device_train_batch_size: int = 1\n"
        "cfg = LongConfig(output_dir='o', per_device_train_batch_size=2)\n"
    )
    plan, text = plan_of(source)
    assert plan.framework == "trl"
    assert plan.max_seq_length.value == 8192 and plan.max_seq_length.source is EXPLICIT
    assert plan.max_seq_length.range is not None
    assert text_at(text, plan.max_seq_length.range) == "8192"
    assert plan.per_device_train_batch_size.value == 2  # the call beats the field default
    assert plan.gradient_checkpointing.source is DEFAULT  # SFTConfig's own default


def test_pragmas_override_what_the_script_says() -> None:
    source = (
        "# llmmem: precision=bf16-true optim=adamw_8bit model_config=configs/llama.json\n"
        "from transformers import TrainingArguments\n"
        "TrainingArguments('o', bf16=False, optim='adamw_torch')\n"
    )
    plan, _ = plan_of(source)
    assert (plan.precision.value, plan.precision.source) == ("bf16-true", PRAGMA)
    assert (plan.optim.value, plan.optim.source) == ("adamw_8bit", PRAGMA)
    assert plan.extra["model_config"].value == "configs/llama.json"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("train.yaml", "yaml"),
        ("train.yml", "yaml"),
        ("ds.json", "json"),
        ("launch.sh", "shell"),
        ("explore.ipynb", "notebook"),
        ("notes.txt", "unknown"),
    ],
)
def test_every_file_kind_gives_a_plan(name: str, kind: str) -> None:
    for text in ("", "{{{ ]]] :\n\t- !!python/object", "\x00\xff" * 50):
        plan = extract_plan(Path(name), text, settings=NO_SETTINGS)
        assert isinstance(plan, TrainingPlan)
        assert plan.kind == kind


def test_a_missing_file_is_a_problem(tmp_path: Path) -> None:
    plan = extract_plan(tmp_path / "gone.py", settings=NO_SETTINGS)
    assert plan.problems and "cannot read" in plan.problems[0]


# -- pragmas, builder, vocabulary ---------------------------------------------------------------


def test_pragmas_and_their_problems() -> None:
    text = (
        'x = "# llmmem: seq=1"  # llmmem: seq=2048 batch=2 model="org/m"\n'
        "# llmmem: seq=abc colour=red ignore\n"
        "y = 1  # llmmem: ignore[LLM001, llm004]\n"
        "z = 2  # don't worry  # llmmem: grad_accum=7\n"
        "echo ${#items}  # llmmem: world_size=3\n"
    )
    reading = read_pragmas(text)
    values = {pragma.written: pragma.value for pragma in reading.pragmas}
    assert values == {
        "seq": 2048,
        "batch": 2,
        "model": "org/m",
        "grad_accum": 7,
        "world_size": 3,
    }
    first = reading.pragmas[0].range
    assert (first.start_line, first.start_col) == (0, 23)
    assert len(reading.problems) == 2
    assert reading.suppressions == {1: {ALL_CODES}, 2: {"LLM001", "LLM004"}}
    assert is_suppressed(reading.suppressions, 1, "LLM009")
    assert is_suppressed(reading.suppressions, 2, "llm004")
    assert not is_suppressed(reading.suppressions, 2, "LLM002")
    assert not is_suppressed(reading.suppressions, 0, "LLM001")


def test_builder_precedence_and_conversion() -> None:
    builder = PlanBuilder()
    at = SourceRange(start_line=0, start_col=0, end_line=0, end_col=1)
    builder.set("per_device_train_batch_size", 4, Provenance.EXPLICIT, at)
    builder.set("per_device_train_batch_size", 2, Provenance.CLI_DEFAULT, at)
    builder.set("per_device_train_batch_size", "16", Provenance.PRAGMA, at)
    builder.set("gradient_accumulation_steps", "many", Provenance.PRAGMA, at)
    builder.set("gradient_accumulation_steps", 3, Provenance.CONFIG, at)
    builder.set("max_seq_length", 100, Provenance.EXPLICIT, at)
    builder.set("max_seq_length", 200, Provenance.EXPLICIT, at)
    plan = builder.build("x.yaml", "yaml", "axolotl")
    assert plan.per_device_train_batch_size.value == 16
    assert plan.per_device_train_batch_size.source is PRAGMA
    assert plan.gradient_accumulation_steps.value == 3  # the bad pragma is a problem
    assert any("gradient_accumulation_steps" in problem for problem in plan.problems)
    assert plan.max_seq_length.value == 200  # later among equals
    assert plan.optim.value == "adamw_torch_fused" and plan.optim.source is DEFAULT


def test_builder_defaults_per_config_class() -> None:
    sft = PlanBuilder().build("t.py", "python", "trl", config_class="SFTConfig")
    assert (sft.max_seq_length.value, sft.max_seq_length.source) == (1024, DEFAULT)
    assert sft.gradient_checkpointing.value is True
    assert sft.precision.value == "bf16"
    hf = PlanBuilder().build("t.py", "python", "hf")
    assert hf.per_device_train_batch_size.value == 8 and hf.precision.value == "fp32"
    assert hf.max_seq_length.source is ASSUMED and "llmmem: seq=" in hf.max_seq_length.note
    grpo = PlanBuilder().build("t.py", "python", "trl", config_class="GRPOConfig")
    assert grpo.max_seq_length.value == 512 + 256
    loop = PlanBuilder().build("t.py", "python", "hf", config_class="none")
    assert loop.per_device_train_batch_size.source is ASSUMED


def test_vocabulary() -> None:
    for name in ("max_length", "block_size", "sequence_len", "cutoff_len", "max_seq_len"):
        assert canonical_key(name) == "max_seq_length"
    assert canonical_key("micro_batch_size") == "per_device_train_batch_size"
    assert canonical_key("Gradient-Accumulation-Steps") == "gradient_accumulation_steps"
    assert optim_for_optimizer_class("torch.optim.AdamW") == "adamw_torch"
    assert optim_for_optimizer_class("torch.optim.AdamW", fused=True) == "adamw_torch_fused"
    assert optim_for_optimizer_class("bnb.optim.AdamW8bit") == "adamw_bnb_8bit"
    assert optim_for_optimizer_class("bitsandbytes.optim.PagedAdamW") == "paged_adamw_32bit"
    assert optim_for_optimizer_class("PagedAdamW8bit") == "paged_adamw_8bit"
    assert normalize_fsdp("full_shard auto_wrap offload") == ("full_shard", True)
    assert split_module_names("q_proj, v_proj") == ["q_proj", "v_proj"]
    assert split_module_names("all") == ["all-linear"]


# -- input that must never raise ----------------------------------------------------------------


def test_syntax_error_mid_typing_keeps_the_pragmas() -> None:
    text = (
        "# llmmem: seq=2048\n"
        "from transformers import TrainingArguments\n"
        "args = TrainingArguments(per_device_train_batch_size=4,\n"
    )
    plan, _ = plan_of(text)
    assert plan.problems and plan.problems[0].startswith("syntax error at line 3")
    assert plan.max_seq_length.value == 2048 and plan.max_seq_length.source is PRAGMA


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n\n",
        "\ufeffimport os\n",
        "x = '\udcff'\n",
        "def f(:\n",
        "x = 1\x00\n",
        bytes(range(256)).decode("latin-1") * 20,
        "x = " + "(" * 5000 + "1" + ")" * 5000,
        "x = " + "[" * 150 + "]" * 150,
        "x = " + "-" * 100_000 + "1",
        "x = " + "not " * 3000 + "1",
        "x = " + "1 + " * 3000 + "1",
        "x = " + "a." * 20_000 + "b",
        "f = " + "lambda: " * 3000 + "1",
        "x = " + "f(" * 190 + ")" * 190,
        "x = 2 ** 10 ** 10\ny = 'a' * 10 ** 12\n",
        "def f(x):\n    return f(x)\nf(1)\n",
        "def f():\n    return g()\ndef g():\n    return f()\nf()\n",
        "class A(A): pass\n",
        "from transformers import TrainingArguments\nTrainingArguments(**None, *1)\n",
    ],
    ids=lambda text: repr(text[:20]),
)
def test_hostile_input_gives_a_plan(text: str) -> None:
    started = time.perf_counter()
    plan = extract_plan(Path("hostile.py"), text, settings=NO_SETTINGS)
    assert isinstance(plan, TrainingPlan)
    assert time.perf_counter() - started < 2.0


def test_binary_file_from_disk(tmp_path: Path) -> None:
    path = tmp_path / "weights.py"
    path.write_bytes(bytes(range(256)) * 100)
    plan = extract_plan(path, settings=NO_SETTINGS)
    assert plan.problems


def test_a_five_megabyte_file_is_refused_quickly() -> None:
    text = "# llmmem: batch=3\n" + "CONSTANTS = [" + ", ".join(["123456"] * 700_000) + "]\n"
    assert len(text) > 5_000_000
    started = time.perf_counter()
    plan = extract_plan(Path("big.py"), text, settings=NO_SETTINGS)
    assert time.perf_counter() - started < 2.0
    assert any("MB" in problem for problem in plan.problems)
    assert plan.per_device_train_batch_size.value == 3  # pragmas are still read


def thousand_line_script() -> str:
    sections: list[str] = []
    index = 0
    while sum(section.count("\n") for section in sections) < 1000:
        body = (FIXTURES / FIXTURE_NAMES[index % len(FIXTURE_NAMES)]).read_text(encoding="utf-8")
        indented = "".join(f"    {line}\n" if line else "\n" for line in body.split("\n"))
        sections.append(f"def section_{index}():\n{indented}\n")
        index += 1
    return "".join(sections)


def test_a_thousand_line_script_is_fast() -> None:
    text = thousand_line_script()
    extract_plan(Path("long.py"), text, settings=NO_SETTINGS)  # imports, caches
    started = time.perf_counter()
    plan = extract_plan(Path("long.py"), text, settings=NO_SETTINGS)
    elapsed = time.perf_counter() - started
    assert plan.problems == []
    assert elapsed < 0.5  # about 25 ms on a slow two-core machine


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_line_prefix_reads(name: str) -> None:
    text = (FIXTURES / name).read_text(encoding="utf-8")
    lines = text.split("\n")
    for end in range(len(lines) + 1):
        plan = extract_plan(FIXTURES / name, "\n".join(lines[:end]), settings=NO_SETTINGS)
        assert isinstance(plan, TrainingPlan)


FIXTURE_TEXTS = {name: (FIXTURES / name).read_text(encoding="utf-8") for name in FIXTURE_NAMES}


@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_truncations_and_byte_edits_never_raise(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(FIXTURE_NAMES))
    encoded = FIXTURE_TEXTS[name].encode("utf-8")
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded)))
    edited = bytearray(encoded[:cut])
    edits = data.draw(
        st.lists(
            st.tuples(st.integers(min_value=0, max_value=4096), st.binary(max_size=4)),
            max_size=6,
        )
    )
    for position, replacement in edits:
        at = position % (len(edited) + 1)
        edited[at : at + len(replacement)] = replacement
    text = bytes(edited).decode("utf-8", errors="replace")
    plan = extract_plan(FIXTURES / name, text, settings=NO_SETTINGS)
    assert isinstance(plan, TrainingPlan)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_single_line_deletion_reads(name: str) -> None:
    lines = FIXTURE_TEXTS[name].split("\n")
    for index in range(len(lines)):
        text = "\n".join(lines[:index] + lines[index + 1 :])
        plan = extract_plan(FIXTURES / name, text, settings=NO_SETTINGS)
        assert not any("internal error" in problem for problem in plan.problems), problem_lines(
            plan
        )


def problem_lines(plan: TrainingPlan) -> str:
    return "\n".join(plan.problems)


# small programs made of the constructs the reader follows, wired together at random: whatever
# the wiring, reading them ends in a plan and never in an internal error
NAMES = ("a", "b", "model", "args", "cfg", "parser", "lora", "opt")
CALLEES = (
    "TrainingArguments",
    "SFTConfig",
    "GRPOConfig",
    "Trainer",
    "SFTTrainer",
    "DPOTrainer",
    "LoraConfig",
    "BitsAndBytesConfig",
    "AutoModelForCausalLM.from_pretrained",
    "AutoTokenizer.from_pretrained",
    "AutoConfig.from_pretrained",
    "AutoModelForCausalLM.from_config",
    "FastLanguageModel.from_pretrained",
    "FastLanguageModel.get_peft_model",
    "get_peft_model",
    "prepare_model_for_kbit_training",
    "PeftModel.from_pretrained",
    "pipeline",
    "DataLoader",
    "torch.optim.AdamW",
    "bnb.optim.PagedAdamW8bit",
    "HfArgumentParser",
    "argparse.ArgumentParser",
    "os.environ.get",
    "dict",
    "int",
    "min",
    "getattr",
    "vars",
    "torch.autocast",
    "Accelerator",
    "fire.Fire",
    "f",
    "g",
)
METHODS = (
    "gradient_checkpointing_enable",
    "add_argument",
    "parse_args",
    "parse_known_args",
    "parse_args_into_dataclasses",
    "set_defaults",
    "update",
    "get",
    "pop",
    "copy",
    "to",
    "half",
    "add_adapter",
    "config",
)
KEYWORDS = (
    "per_device_train_batch_size",
    "max_length",
    "torch_dtype",
    "quantization_config",
    "peft_config",
    "args",
    "model",
    "optimizers",
    "deepspeed",
    "fsdp",
    "r",
    "default",
    "type",
    "action",
    "load_in_4bit",
    "model_init_kwargs",
    "use_gradient_checkpointing",
)


@st.composite
def expressions(draw: st.DrawFn, depth: int = 0) -> str:
    leaves = st.one_of(
        st.sampled_from(NAMES),
        st.sampled_from(["1", "0", "-2", "4096", "True", "False", "None", "2.5"]),
        st.sampled_from(['"gpt2"', '"--bs"', '"store_true"', '"full_shard offload"', '"bf16"']),
        st.sampled_from(["torch.bfloat16", "torch.float16", "int", "sys.argv[1]"]),
    )
    if depth >= 3:
        return draw(leaves)
    inner = expressions(depth + 1)
    kind = draw(st.integers(min_value=0, max_value=9))
    if kind <= 2:
        return draw(leaves)
    if kind == 3:
        callee = draw(st.sampled_from(CALLEES))
        positional = draw(st.lists(inner, max_size=2))
        keywords = draw(st.lists(st.tuples(st.sampled_from(KEYWORDS), inner), max_size=3))
        parts = positional + [f"{key}={value}" for key, value in dict(keywords).items()]
        if draw(st.booleans()):
            parts.append(f"**{draw(st.sampled_from(NAMES))}")
        return f"{callee}({', '.join(parts)})"
    if kind == 4:
        method = draw(st.sampled_from(METHODS))
        arguments = ", ".join(draw(st.lists(inner, max_size=2)))
        return f"{draw(st.sampled_from(NAMES))}.{method}({arguments})"
    if kind == 5:
        return f"({draw(inner)} if {draw(inner)} else {draw(inner)})"
    if kind == 6:
        operator = draw(st.sampled_from(["+", "*", "//", "**", "|", "or", "and", "==", "<"]))
        return f"({draw(inner)} {operator} {draw(inner)})"
    if kind == 7:
        return (
            "{"
            + ", ".join(
                f'"{key}": {value}'
                for key, value in draw(
                    st.lists(st.tuples(st.sampled_from(KEYWORDS), inner), max_size=3)
                )
            )
            + "}"
        )
    if kind == 8:
        return f"[{', '.join(draw(st.lists(inner, max_size=3)))}]"
    return f"{draw(inner)}[{draw(inner)}]"


@st.composite
def statements(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES))
    kind = draw(st.integers(min_value=0, max_value=7))
    value = draw(expressions())
    if kind <= 2:
        return f"{name} = {value}"
    if kind == 3:
        attribute = draw(st.sampled_from(["use_cache", "gradient_checkpointing", "config"]))
        return f"{name}.{attribute} = {value}"
    if kind == 4:
        return f"if {value}:\n    {name} = {draw(expressions())}\nelse:\n    raise SystemExit"
    if kind == 5:
        return f"for {name} in {value}:\n    {draw(expressions())}"
    if kind == 6:
        parameter = draw(st.sampled_from(NAMES))
        function = draw(st.sampled_from(["f", "g"]))
        return f"def {function}({parameter}={value}, **kw):\n    return {draw(expressions())}"
    return value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.lists(statements(), min_size=1, max_size=12))
def test_random_programs_read_without_internal_errors(body: list[str]) -> None:
    header = (
        "import argparse, os, sys\nimport torch\nimport bitsandbytes as bnb\nimport fire\n"
        "from transformers import *\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer, AutoConfig, Trainer\n"
        "from trl import SFTConfig, SFTTrainer, DPOTrainer, GRPOConfig\n"
        "from peft import LoraConfig, get_peft_model, PeftModel\n"
    )
    text = header + "\n".join(body) + "\n"
    plan = extract_plan(Path("generated.py"), text, settings=NO_SETTINGS)
    assert isinstance(plan, TrainingPlan)
    assert not any("internal error" in problem for problem in plan.problems), (
        text + "\n---\n" + problem_lines(plan)
    )


@pytest.mark.parametrize(
    ("init_kwargs", "expected", "source"),
    [
        # TRL's create_model_from_path: dtype defaults to float32 (0.29.1 and 1.16.0)
        ("", "float32", Provenance.DEFAULT),
        ('model_init_kwargs={"dtype": "bfloat16"}, ', "bfloat16", Provenance.EXPLICIT),
    ],
)
def test_a_model_named_by_string_is_loaded_as_trl_loads_it(
    init_kwargs: str, expected: str, source: Provenance
) -> None:
    plan, _ = plan_of(
        "from trl import DPOConfig, DPOTrainer\n"
        f"args = DPOConfig(output_dir='out', {init_kwargs}bf16=True)\n"
        "trainer = DPOTrainer(model='Qwen/Qwen2.5-0.5B-Instruct', args=args, train_dataset=None)\n"
        "trainer.train()\n"
    )
    dtype = plan.extra["torch_dtype"]
    assert dtype.value == expected
    assert dtype.source is source

"""YAML and JSON training configs: what each framework's file says, where it says it, and that
nothing a user can type makes the reader raise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmmem.extract.configs import detect_framework, extract_config_plan
from llmmem.extract.frameworks.torchtune import torchtune_model
from llmmem.extract.pragmas import ProjectSettings
from llmmem.extract.yaml_positions import read_positioned_yaml
from llmmem.models.architectures import spec_from_config
from llmmem.models.catalog import catalog_entry
from llmmem.models.spec import ModelSource
from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan
from llmmem.scenario import setup_from_plan

CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "configs"

EXPLICIT = Provenance.EXPLICIT
DEFAULT = Provenance.DEFAULT
CONFIG = Provenance.CONFIG
ASSUMED = Provenance.ASSUMED


def plan_of(name: str) -> TrainingPlan:
    return extract_config_plan(CONFIGS / name)


def setting(plan: TrainingPlan, key: str) -> Sourced[Any]:
    """`lora.r` -> plan.lora.r, `per_device_train_batch_size` -> the top-level field."""
    owner: Any = plan
    for part in key.split("."):
        owner = getattr(owner, part)
    assert isinstance(owner, Sourced), key
    return owner


def text_at(located: SourceRange, plan_file: Path) -> str:
    """The text a range covers, in the plan's file or in the file the range names."""
    file = Path(located.path) if located.path is not None else plan_file
    lines = file.read_text(encoding="utf-8").split("\n")
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
    in_file: str | None = None,
) -> Sourced[Any]:
    """The setting has this value and provenance; its range covers `text` (in `in_file`, a
    fixture name, when the value comes from another file)."""
    found = setting(plan, key)
    assert found.value == value, f"{key}: {found.value!r} != {value!r}"
    assert found.source is source, f"{key}: {found.source} != {source}"
    if text is not None:
        assert found.range is not None, key
        if in_file is None:
            assert found.range.path is None, key
        else:
            assert found.range.path is not None and Path(found.range.path).name == in_file
        assert text_at(found.range, Path(plan.path)) == text, key
    return found


# -- axolotl -----------------------------------------------------------------------------------


def test_axolotl_qlora() -> None:
    plan = plan_of("axolotl_qlora.yml")
    assert (plan.framework, plan.kind) == ("axolotl", "yaml")
    expect(plan, "model_id", "meta-llama/Llama-3.1-8B", EXPLICIT, "meta-llama/Llama-3.1-8B")
    expect(plan, "per_device_train_batch_size", 4, EXPLICIT, "4")
    expect(plan, "gradient_accumulation_steps", 2, EXPLICIT, "2")
    expect(plan, "max_seq_length", 2048, EXPLICIT, "2048")
    expect(plan, "gradient_checkpointing", True, EXPLICIT, "true")
    expect(plan, "precision", "bf16-autocast", EXPLICIT, "auto")
    expect(plan, "optim", "paged_adamw_8bit", EXPLICIT, "paged_adamw_8bit")
    attention = expect(plan, "attn_implementation", "flash_attention_2", EXPLICIT, "true")
    assert attention.range is not None and attention.range.start_line == 35  # flash_attention
    expect(plan, "lora.r", 64, EXPLICIT, "64")
    expect(plan, "lora.alpha", 32.0, EXPLICIT, "32")
    expect(plan, "lora.dropout", 0.05, EXPLICIT, "0.05")
    targets = expect(plan, "lora.target_modules", ["all-linear"], EXPLICIT, "true")
    assert targets.range is not None and targets.range.start_line == 18  # lora_target_linear
    expect(plan, "quantization.bits", 4, EXPLICIT, "true")
    expect(plan, "quantization.quant_type", "nf4", EXPLICIT)
    expect(plan, "quantization.double_quant", True, EXPLICIT)
    expect(plan, "quantization.compute_dtype", "bfloat16", EXPLICIT)
    expect(plan, "quantization.prepare_for_kbit_training", True, EXPLICIT)
    assert plan.extra["sample_packing"].value is True
    expect(plan, "distributed.world_size", 1, ASSUMED)
    assert plan.problems == []


def test_axolotl_full_finetune_follows_the_deepspeed_file_beside_it() -> None:
    plan = plan_of("axolotl_full_zero3.yml")
    assert plan.framework == "axolotl"
    assert plan.lora is None and plan.quantization is None
    expect(plan, "model_id", "Qwen/Qwen2.5-7B", EXPLICIT, "Qwen/Qwen2.5-7B")
    expect(plan, "max_seq_length", 4096, EXPLICIT, "4096")
    expect(plan, "gradient_checkpointing", True, EXPLICIT, "true")
    expect(plan, "optim", "adamw_torch_fused", EXPLICIT, "adamw_torch_fused")
    expect(plan, "attn_implementation", "sdpa", EXPLICIT, "true")  # sdp_attention
    # DeepSpeed keeps fp32 master weights, so axolotl's bf16 is mixed precision here
    expect(plan, "precision", "bf16", EXPLICIT, "true")
    # the JSON says "auto": the YAML's value stands and says why
    batch = expect(plan, "per_device_train_batch_size", 1, EXPLICIT, "1")
    assert "auto" in batch.note
    accumulation = expect(plan, "gradient_accumulation_steps", 8, EXPLICIT, "8")
    assert "auto" in accumulation.note
    expect(plan, "distributed.deepspeed_config", "ds_zero3.json", EXPLICIT, "ds_zero3.json")
    expect(plan, "distributed.zero_stage", 3, CONFIG, "3", in_file="ds_zero3.json")
    expect(plan, "distributed.offload_optimizer", True, CONFIG, '"cpu"', in_file="ds_zero3.json")
    expect(plan, "distributed.offload_params", False, CONFIG, '"none"', in_file="ds_zero3.json")
    assert plan.problems == []


def test_deepspeed_json_on_its_own() -> None:
    plan = plan_of("ds_zero3.json")
    assert (plan.framework, plan.kind) == ("deepspeed", "json")
    expect(plan, "distributed.zero_stage", 3, EXPLICIT, "3")
    expect(plan, "distributed.offload_optimizer", True, EXPLICIT, '"cpu"')
    expect(plan, "distributed.offload_params", False, EXPLICIT, '"none"')
    assert any("'auto'" in problem and "line 21" in problem for problem in plan.problems)


def test_missing_deepspeed_file_is_a_problem_and_its_name_a_guess() -> None:
    plan = plan_of("axolotl_missing_deepspeed.yml")
    assert any(
        "deepspeed_configs/zero2.json" in problem and "not found" in problem
        for problem in plan.problems
    )
    stage = expect(plan, "distributed.zero_stage", 2, ASSUMED, "deepspeed_configs/zero2.json")
    assert "file name" in stage.note
    expect(plan, "per_device_train_batch_size", 2, EXPLICIT, "2")


def test_a_deepspeed_reference_to_another_frameworks_file_is_one_problem(tmp_path: Path) -> None:
    (tmp_path / "train.yaml").write_text(
        "base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: 2\ndeepspeed: other.yaml\n"
    )
    # an axolotl config, not a DeepSpeed one: nothing in it is taken, and its own mistakes
    # (a bad micro_batch_size, a DeepSpeed file that is not there) are not reported
    (tmp_path / "other.yaml").write_text(
        "base_model: x\nmicro_batch_size: true\ndeepspeed: zero3.json\n"
    )
    plan = extract_config_plan(tmp_path / "train.yaml")
    assert plan.problems == [
        "line 3, column 12: 'other.yaml' does not look like a DeepSpeed config"
    ]
    expect(plan, "per_device_train_batch_size", 2, EXPLICIT, "2")
    # not stage 3 from the name of the file the other config names
    expect(plan, "distributed.zero_stage", 0, DEFAULT)


def axolotl_plan(tmp_path: Path, lines: str) -> TrainingPlan:
    path = tmp_path / "axolotl.yml"
    path.write_text("base_model: Qwen/Qwen2.5-0.5B\nmicro_batch_size: 2\n" + lines)
    return extract_config_plan(path)


def test_axolotl_bf16_auto_says_what_an_older_gpu_gets(tmp_path: Path) -> None:
    plan = axolotl_plan(tmp_path, "bf16: auto\n")
    found = expect(plan, "precision", "bf16-autocast", EXPLICIT, "auto")
    assert "where the GPU supports it" in found.note and "fp16" in found.note
    assert plan.extra["bf16_auto_fallback"].value == "fp16"
    # fp16: false leaves float32 on an older GPU
    plan = axolotl_plan(tmp_path, "bf16: auto\nfp16: false\n")
    found = expect(plan, "precision", "bf16-autocast", EXPLICIT, "auto")
    assert "float32" in found.note
    assert plan.extra["bf16_auto_fallback"].value == "fp32"
    # fp16: true beside auto wins: axolotl turns bf16 off
    plan = axolotl_plan(tmp_path, "bf16: auto\nfp16: true\n")
    expect(plan, "precision", "fp16-true", EXPLICIT, "true")
    assert plan.problems == []


def test_axolotl_without_bf16_trains_in_bf16(tmp_path: Path) -> None:
    # bf16 defaults to auto in axolotl: no bf16 key is not float32
    plan = axolotl_plan(tmp_path, "")
    found = expect(plan, "precision", "bf16-autocast", DEFAULT)
    assert "default auto" in found.note
    # under DeepSpeed bf16 is mixed precision over fp32 master weights
    plan = axolotl_plan(tmp_path, "deepspeed: deepspeed_configs/zero2.json\n")
    expect(plan, "precision", "bf16", DEFAULT)
    # a QLoRA adapter computes in the model's bf16
    plan = axolotl_plan(tmp_path, "adapter: qlora\nload_in_4bit: true\n")
    expect(plan, "quantization.compute_dtype", "bfloat16", EXPLICIT)
    # only bf16: false (and no fp16) loads float32
    plan = axolotl_plan(tmp_path, "bf16: false\n")
    expect(plan, "precision", "fp32", DEFAULT)


def test_axolotl_auto_is_for_bf16_only(tmp_path: Path) -> None:
    plan = axolotl_plan(tmp_path, "fp16: auto\n")
    assert plan.problems == ["line 3, column 7: fp16 takes true or false; only bf16 takes auto"]
    expect(plan, "precision", "bf16-autocast", DEFAULT)


def test_hf_yaml_bf16_auto_is_true_with_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nmax_length: 512\nbf16: auto\n")
    plan = extract_config_plan(path)
    # no fp16 fallback in TrainingArguments: HfArgumentParser reads the text as true
    found = expect(plan, "precision", "bf16", EXPLICIT, "auto")
    assert "no fp16 fallback" in found.note
    assert len(plan.problems) == 1
    assert "TrlParser" in plan.problems[0] and "write true or false" in plan.problems[0]


# -- LLaMA-Factory ------------------------------------------------------------------------------


def test_llamafactory_lora() -> None:
    plan = plan_of("llamafactory_lora_sft.yaml")
    assert plan.framework == "llamafactory"
    expect(plan, "model_id", "Qwen/Qwen2.5-7B-Instruct", EXPLICIT, "Qwen/Qwen2.5-7B-Instruct")
    expect(plan, "per_device_train_batch_size", 2, EXPLICIT, "2")
    expect(plan, "gradient_accumulation_steps", 8, EXPLICIT, "8")
    expect(plan, "max_seq_length", 1024, EXPLICIT, "1024")
    expect(plan, "gradient_checkpointing", True, DEFAULT)
    expect(plan, "precision", "bf16-autocast", EXPLICIT, "true")
    expect(plan, "attn_implementation", "flash_attention_2", EXPLICIT, "fa2")
    expect(plan, "lora.r", 16, EXPLICIT, "16")
    alpha = expect(plan, "lora.alpha", 32.0, DEFAULT, "16")  # lora_rank × 2
    assert "lora_rank" in alpha.note
    expect(
        plan,
        "lora.target_modules",
        ["q_proj", "k_proj", "v_proj", "o_proj"],
        EXPLICIT,
        "q_proj,k_proj,v_proj,o_proj",
    )
    expect(plan, "quantization.bits", 4, EXPLICIT, "4")
    expect(plan, "quantization.quant_type", "nf4", EXPLICIT)
    expect(plan, "quantization.double_quant", True, DEFAULT)
    assert plan.extra["stage"].value == "sft"
    assert plan.extra["template"].value == "qwen"


def test_llamafactory_v1_schema() -> None:
    plan = plan_of("llamafactory_v1_lora.yaml")
    assert plan.framework == "llamafactory"
    expect(plan, "model_id", "Qwen/Qwen3-4B", EXPLICIT, "Qwen/Qwen3-4B")
    expect(plan, "per_device_train_batch_size", 2, EXPLICIT, "2")
    expect(plan, "gradient_accumulation_steps", 8, EXPLICIT, "16")  # 16 / 2
    expect(plan, "max_seq_length", 4096, EXPLICIT, "4096")
    expect(plan, "precision", "bf16-true", EXPLICIT, "true")
    expect(plan, "lora.r", 32, EXPLICIT, "32")
    expect(plan, "lora.alpha", 64.0, EXPLICIT, "64")
    expect(plan, "lora.target_modules", ["all-linear"], EXPLICIT, "all")
    expect(plan, "distributed.fsdp", "full_shard", EXPLICIT, "fsdp2")


# -- torchtune and LitGPT -----------------------------------------------------------------------


def test_torchtune_qlora() -> None:
    plan = plan_of("torchtune_qlora.yaml")
    assert plan.framework == "torchtune"
    expect(
        plan,
        "model_id",
        "meta-llama/Llama-3.1-8B",
        EXPLICIT,
        "torchtune.models.llama3_1.qlora_llama3_1_8b",
    )
    expect(plan, "per_device_train_batch_size", 4, EXPLICIT, "4")
    expect(plan, "gradient_accumulation_steps", 4, EXPLICIT, "4")
    expect(plan, "max_seq_length", 2048, EXPLICIT, "2048")
    expect(plan, "gradient_checkpointing", True, EXPLICIT, "True")
    expect(plan, "precision", "bf16-true", EXPLICIT, "bf16")
    expect(plan, "optim", "paged_adamw_8bit", EXPLICIT, "bitsandbytes.optim.PagedAdamW8bit")
    expect(plan, "loss", "chunked", EXPLICIT, "torchtune.modules.loss.CEWithChunkedOutputLoss")
    expect(plan, "lora.r", 16, EXPLICIT, "16")
    expect(plan, "lora.alpha", 32.0, EXPLICIT, "32")
    expect(plan, "lora.dropout", 0.0, EXPLICIT, "0.0")
    expect(
        plan,
        "lora.target_modules",
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        EXPLICIT,
    )
    expect(plan, "quantization.bits", 4, EXPLICIT)
    expect(plan, "quantization.quant_type", "nf4", EXPLICIT)


@pytest.mark.parametrize(
    ("builder", "model_id", "method"),
    [
        ("torchtune.models.llama3_1.qlora_llama3_1_8b", "meta-llama/Llama-3.1-8B", "qlora"),
        ("lora_llama3_2_3b", "meta-llama/Llama-3.2-3B", "lora"),
        ("llama3_1_8b", "meta-llama/Llama-3.1-8B", "full"),
        ("llama3_8b", "meta-llama/Meta-Llama-3-8B", "full"),
        ("lora_qwen2_5_1_5b_instruct", "Qwen/Qwen2.5-1.5B-Instruct", "lora"),
        ("llama2_7b", "meta-llama/Llama-2-7b-hf", "full"),
        ("lora_phi3_mini", "microsoft/Phi-3-mini-4k-instruct", "lora"),
        ("llama3_2_vision_11b", None, "full"),
    ],
)
def test_torchtune_builders_name_hub_models(
    builder: str, model_id: str | None, method: str
) -> None:
    assert torchtune_model(builder) == (model_id, method)


def test_litgpt_lora_with_quantization() -> None:
    plan = plan_of("litgpt_lora.yaml")
    assert plan.framework == "litgpt"
    expect(
        plan,
        "model_id",
        "meta-llama/Llama-3.2-3B",
        EXPLICIT,
        "checkpoints/meta-llama/Llama-3.2-3B",
    )
    expect(plan, "per_device_train_batch_size", 2, EXPLICIT, "2")
    # global_batch_size 16 on 1 device, 2 per micro-batch
    expect(plan, "gradient_accumulation_steps", 8, EXPLICIT, "16")
    expect(plan, "max_seq_length", 1024, EXPLICIT, "1024")
    expect(plan, "precision", "bf16-true", EXPLICIT, "bf16-true")
    expect(plan, "quantization.bits", 4, EXPLICIT, "bnb.nf4")
    expect(plan, "quantization.double_quant", False, EXPLICIT, "bnb.nf4")
    expect(plan, "lora.r", 16, EXPLICIT, "16")
    expect(plan, "lora.alpha", 32.0, EXPLICIT, "32")
    expect(plan, "lora.target_modules", ["q_proj", "v_proj", "o_proj"], EXPLICIT)
    expect(plan, "distributed.world_size", 1, EXPLICIT, "1")
    expect(plan, "loss", "chunked", DEFAULT)
    # LitGPT swaps AdamW for bitsandbytes' paged AdamW when it quantizes
    expect(plan, "optim", "paged_adamw_32bit", EXPLICIT, "torch.optim.AdamW")


# -- TRL and accelerate -------------------------------------------------------------------------


def test_trl_sft_config() -> None:
    plan = plan_of("trl_sft.yaml")
    assert plan.framework == "trl"
    expect(plan, "model_id", "Qwen/Qwen2.5-1.5B", EXPLICIT, "Qwen/Qwen2.5-1.5B")
    expect(plan, "per_device_train_batch_size", 8, EXPLICIT, "8")
    expect(plan, "gradient_accumulation_steps", 2, EXPLICIT, "2")
    expect(plan, "max_seq_length", 2048, EXPLICIT, "2048")
    expect(plan, "gradient_checkpointing", True, EXPLICIT, "true")
    # bf16 weights (torch_dtype) under the config's bf16: true autocast
    expect(plan, "precision", "bf16-autocast", EXPLICIT, "bfloat16")
    expect(plan, "attn_implementation", "flash_attention_2", EXPLICIT, "flash_attention_2")
    expect(plan, "lora.r", 32, EXPLICIT, "32")
    expect(plan, "lora.alpha", 16.0, EXPLICIT, "16")
    expect(plan, "lora.dropout", 0.05, DEFAULT)  # TRL ModelConfig
    expect(
        plan,
        "lora.target_modules",
        ["q_proj", "k_proj", "v_proj", "o_proj"],
        EXPLICIT,
        "[q_proj, k_proj, v_proj, o_proj]",
    )
    assert plan.quantization is None  # load_in_4bit: false


def test_accelerate_fsdp_config() -> None:
    plan = plan_of("accelerate_fsdp.yaml")
    assert plan.framework == "accelerate"
    expect(plan, "distributed.world_size", 4, EXPLICIT, "4")
    expect(plan, "distributed.fsdp", "full_shard", EXPLICIT, "FULL_SHARD")
    expect(plan, "distributed.offload_params", False, EXPLICIT, "false")
    expect(plan, "precision", "bf16", EXPLICIT, "bf16")


@pytest.mark.parametrize("strategy", ["NO_SHARD", "3"])
def test_accelerate_fsdp_no_shard_is_a_replica_per_device(strategy: str) -> None:
    text = (
        "distributed_type: FSDP\nnum_processes: 2\n"
        f"fsdp_config:\n  fsdp_sharding_strategy: {strategy}\n"
    )
    plan = extract_config_plan(CONFIGS / "inline.yaml", text)
    assert plan.distributed.fsdp.value == "no_shard"
    assert plan.distributed.fsdp.source is EXPLICIT


def test_hf_fsdp_option_no_shard() -> None:
    text = "model_name_or_path: m\nfsdp: no_shard auto_wrap\n"
    plan = extract_config_plan(CONFIGS / "inline.yaml", text)
    assert plan.distributed.fsdp.value == "no_shard"


# -- broken input -------------------------------------------------------------------------------


def test_tabs_keep_the_lines_above_and_say_where() -> None:
    plan = plan_of("broken_tabs.yaml")
    assert plan.parse_error is not None  # LLM015 says it, on the line
    assert "tab" in plan.parse_error and "line 4" in plan.parse_error
    assert plan.parse_error_range is not None and plan.parse_error_range.start_line == 3
    expect(plan, "model_id", "meta-llama/Llama-3.1-8B", EXPLICIT, "meta-llama/Llama-3.1-8B")
    expect(plan, "lora.r", 16, EXPLICIT, "16")


def test_a_binary_file_named_yaml() -> None:
    plan = plan_of("binary.yaml")
    assert any("binary" in problem for problem in plan.problems)
    assert plan.model_id is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# only a comment\n",
        "- a list\n- not a mapping\n",
        "just a string",
        "a: [1, 2\n",
        "base_model: x\nmicro_batch_size: two\n",
        "micro_batch_size: -3\nbase_model: x\n",
        "deepspeed: 12\nbase_model: x\n",
        "deepspeed: {zero_optimization: {stage: 3}}\nmodel_name_or_path: m\n",
        "model: {_component_: 5}\nbatch_size: [1]\n",
        "a: &x [*x]\nbase_model: *x\n",
        "\ufeffbase_model: m\n",
        "base_model: m\r\nmicro_batch_size: 2\r\n",
        "checkpoint_dir: c\ntrain: 3\nprecision: 7\n",
        "distributed_type: FSDP\nfsdp_config: {fsdp_sharding_strategy: 9}\n",
    ],
)
def test_odd_documents_give_a_plan(text: str) -> None:
    plan = extract_config_plan(CONFIGS / "inline.yaml", text)
    assert plan.path.endswith("inline.yaml")


def test_wrong_types_are_problems_not_values() -> None:
    plan = extract_config_plan(CONFIGS / "inline.yaml", "base_model: m\nmicro_batch_size: two\n")
    assert any("micro_batch_size" in problem and "line 2" in problem for problem in plan.problems)
    assert plan.per_device_train_batch_size.source is DEFAULT


def test_the_text_given_wins_over_the_file() -> None:
    plan = extract_config_plan(CONFIGS / "axolotl_qlora.yml", "base_model: other/model\n")
    assert plan.model_id is not None and plan.model_id.value == "other/model"


def test_pragmas_and_project_settings() -> None:
    text = "base_model: m  # llmmem: gpu=A100-80GB seq=4096\nsequence_len: 1024\n"
    project = ProjectSettings(world_size=8, path="pyproject.toml")
    plan = extract_config_plan(CONFIGS / "inline.yaml", text, settings=project)
    assert plan.gpu is not None and plan.gpu.value == "A100-80GB"
    expect(plan, "max_seq_length", 4096, Provenance.PRAGMA)
    expect(plan, "distributed.world_size", 8, Provenance.PRAGMA)


def test_framework_detection() -> None:
    assert detect_framework({"zero_optimization": {}}) == "deepspeed"
    assert detect_framework({"distributed_type": "FSDP"}) == "accelerate"
    assert detect_framework({"model": {"_component_": "x"}}) == "torchtune"
    assert detect_framework({"checkpoint_dir": "c", "train": {}}) == "litgpt"
    assert detect_framework({"model": "m", "micro_batch_size": 1}) == "llamafactory"
    assert detect_framework({"finetuning_type": "lora"}) == "llamafactory"
    assert detect_framework({"base_model": "m"}) == "axolotl"
    assert detect_framework({"max_length": 1}) == "trl"
    assert detect_framework({"per_device_train_batch_size": 1}) == "hf"


# -- the YAML reader ----------------------------------------------------------------------------


def test_yaml_ranges_cover_each_value() -> None:
    text = 'train:\n  micro_batch_size: 2\n  name: "quoted"\nlist:\n  - a\n  - b\n'
    document = read_positioned_yaml(text)
    assert document.value == {
        "train": {"micro_batch_size": 2, "name": "quoted"},
        "list": ["a", "b"],
    }
    lines = text.split("\n")

    def covered(path: tuple[str | int, ...]) -> str:
        located = document.ranges[path]
        if located.start_line == located.end_line:
            return lines[located.start_line][located.start_col : located.end_col]
        return "multi-line"

    assert covered(("train", "micro_batch_size")) == "2"
    assert covered(("train", "name")) == '"quoted"'
    assert covered(("list", 1)) == "b"
    block = document.ranges[("list",)]
    assert (block.end_line, block.end_col) == (5, 5)  # ends with its last item, not the file


def test_yaml_duplicate_keys_anchors_and_merges() -> None:
    text = "base: &base\n  r: 8\n  alpha: 16\nlora:\n  <<: *base\n  r: 32\nr: 1\nr: 2\n"
    document = read_positioned_yaml(text)
    assert document.value["lora"] == {"r": 32, "alpha": 16}
    assert document.value["r"] == 2
    assert any("'r' appears again" in problem for problem in document.problems)
    assert document.ranges[("lora", "alpha")].start_line == 2  # the anchored text


def test_yaml_oddities_are_problems() -> None:
    assert read_positioned_yaml("a: 1\n---\nb: 2\n").problems
    recursive = read_positioned_yaml("a: &x [*x]\n")
    assert recursive.value == {"a": [None]} and recursive.problems
    tagged = read_positioned_yaml("a: !include other.yaml\n")
    assert tagged.value == {"a": "other.yaml"}
    bad_date = read_positioned_yaml("d: 2024-13-45\n")
    assert bad_date.value == {"d": "2024-13-45"}
    assert read_positioned_yaml("a: *missing\n").value is None


def test_json_with_tab_indentation() -> None:
    document = read_positioned_yaml(
        '{\n\t"zero_optimization": {\n\t\t"stage": 2\n\t}\n}\n', is_json=True
    )
    assert document.value == {"zero_optimization": {"stage": 2}}
    located = document.ranges[("zero_optimization", "stage")]
    assert (located.start_line, located.start_col) == (2, 11)


# -- nothing raises -----------------------------------------------------------------------------

FIXTURES = sorted(path for path in CONFIGS.iterdir() if path.suffix in (".yaml", ".yml", ".json"))
TEXT_FIXTURES = [path for path in FIXTURES if path.name != "binary.yaml"]


@pytest.mark.parametrize("fixture", TEXT_FIXTURES, ids=lambda path: path.name)
def test_every_line_prefix_reads(fixture: Path) -> None:
    text = fixture.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    for count in range(len(lines) + 1):
        plan = extract_config_plan(fixture, "".join(lines[:count]))
        assert isinstance(plan, TrainingPlan)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(fixture=st.sampled_from(TEXT_FIXTURES), cut=st.floats(0, 1))
def test_character_cuts_read(fixture: Path, cut: float) -> None:
    text = fixture.read_text(encoding="utf-8")
    plan = extract_config_plan(fixture, text[: int(len(text) * cut)])
    assert isinstance(plan, TrainingPlan)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    fixture=st.sampled_from(FIXTURES),
    edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_byte_edits_read(fixture: Path, edits: list[tuple[float, int]]) -> None:
    data = bytearray(fixture.read_bytes())
    for where, byte in edits:
        data[min(len(data) - 1, int(len(data) * where))] = byte
    plan = extract_config_plan(fixture, data.decode("utf-8", errors="replace"))
    assert isinstance(plan, TrainingPlan)


def test_deepspeed_buffer_settings_are_read(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(
        '{"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",\n'
        '  "overlap_comm": false, "contiguous_gradients": true,\n'
        '  "stage3_max_reuse_distance": 1e8, "stage3_prefetch_bucket_size": "auto",\n'
        '  "stage3_param_persistence_threshold": 0}}\n'
    )
    plan = extract_config_plan(config)
    expect(plan, "distributed.reduce_bucket_size", "auto", EXPLICIT, '"auto"')
    expect(plan, "distributed.overlap_comm", False, EXPLICIT, "false")
    expect(plan, "distributed.contiguous_gradients", True, EXPLICIT, "true")
    expect(plan, "distributed.max_reuse_distance", 100_000_000, EXPLICIT, "1e8")
    expect(plan, "distributed.prefetch_bucket_size", "auto", EXPLICIT, '"auto"')
    expect(plan, "distributed.param_persistence_threshold", 0, EXPLICIT, "0")
    assert plan.problems == []
    entry = catalog_entry("meta-llama/Llama-3.1-8B")
    assert entry is not None
    spec = spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)
    setup = setup_from_plan(plan, spec)
    assert setup.distributed.reduce_bucket_size is None  # sized from the model
    assert setup.distributed.max_reuse_distance == 100_000_000
    assert setup.distributed.prefetch_bucket_size is None  # sized from the model
    assert setup.distributed.param_persistence_threshold == 0  # nothing kept whole


def test_deepspeed_buffer_defaults_and_bad_values(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(
        '{"zero_optimization": {"stage": 3, "reduce_bucket_size": "big",\n'
        '  "stage3_prefetch_bucket_size": -1}}\n'
    )
    plan = extract_config_plan(config)
    # DeepSpeed's own defaults stand where the file says nothing usable
    assert plan.distributed.reduce_bucket_size.value == 500_000_000
    assert plan.distributed.overlap_comm.value is None
    assert plan.distributed.prefetch_bucket_size.value == 50_000_000
    assert plan.distributed.param_persistence_threshold.value == 100_000
    assert any("reduce_bucket_size" in problem for problem in plan.problems)
    assert any("stage3_prefetch_bucket_size" in problem for problem in plan.problems)


@pytest.mark.parametrize(
    ("finetuning", "flag", "expected"),
    [
        # no bf16/fp16: no autocast; a full fine-tune's trainable weights upcast to fp32
        ("full", "", "fp32"),
        ("full", "bf16: false\n", "fp32"),
        ("full", "bf16: true\n", "bf16"),
        ("lora", "", "bf16-true"),
        ("lora", "bf16: true\n", "bf16-autocast"),
    ],
)
def test_llamafactory_precision_follows_its_trainer_flags(
    tmp_path: Path, finetuning: str, flag: str, expected: str
) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\nstage: sft\ndo_train: true\n"
        f"finetuning_type: {finetuning}\ndataset: alpaca_en_demo\ntemplate: qwen\n"
        f"cutoff_len: 512\nper_device_train_batch_size: 1\noutput_dir: out\n{flag}"
    )
    plan = extract_config_plan(path)
    assert plan.framework == "llamafactory"
    assert plan.precision.value == expected

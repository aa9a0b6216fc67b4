"""Fixes of a framework's config write that framework's own keys.

For each framework's fixture, on a GPU where it does not fit: the offered fixes write the key
path and value spelling that framework's config reader takes (never HF `TrainingArguments`
names it ignores), the edited file still parses, and `check_text` on it gives the title's total.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmmem.check import check_text
from llmmem.rules.finding import Fix
from llmmem.rules.text_edits import apply_edits
from llmmem.units import format_bytes

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"


def fixes_of(path: Path, text: str, gpu: str) -> dict[str, Fix]:
    checked = check_text(path, text, gpu=gpu, hub=False)
    return {fix.title.split(" → ")[0]: fix for finding in checked.findings for fix in finding.fixes}


def applied(path: Path, text: str, fix: Fix, gpu: str) -> dict[str, Any]:
    """The edited document, after checking that it parses and gives the title's total."""
    fixed = apply_edits(text, fix.edits)
    document = yaml.safe_load(fixed)
    assert isinstance(document, dict)
    after = check_text(path, fixed, gpu=gpu, hub=False).analysis.budget
    assert after is not None, fix.title
    assert f"→ {format_bytes(after.device_total_bytes)}" in fix.title
    return document


def offered(path: Path, gpu: str, title: str, text: str | None = None) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8") if text is None else text
    fixes = fixes_of(path, text, gpu)
    assert title in fixes, sorted(fixes)
    return applied(path, text, fixes[title], gpu)


LIGER = "Use Liger's fused linear cross-entropy"
HALVE = "Halve the micro-batch, double the accumulation"
CHECKPOINTING = "Enable gradient checkpointing"


def test_axolotl_liger_writes_its_plugin_and_key() -> None:
    document = offered(CONFIGS / "axolotl_qlora.yml", "RTX-4090", LIGER)
    assert document["liger_fused_linear_cross_entropy"] is True
    assert document["plugins"] == ["axolotl.integrations.liger.LigerPlugin"]
    assert "use_liger_kernel" not in document


def test_axolotl_halves_micro_batch_size() -> None:
    document = offered(CONFIGS / "axolotl_qlora.yml", "RTX-4090", HALVE)
    assert document["micro_batch_size"] == 2
    assert document["gradient_accumulation_steps"] == 4
    assert "per_device_train_batch_size" not in document


def test_axolotl_checkpointing_and_8bit_optimizer(tmp_path: Path) -> None:
    text = (CONFIGS / "axolotl_qlora.yml").read_text(encoding="utf-8")
    text = text.replace("gradient_checkpointing: true", "gradient_checkpointing: false")
    text = text.replace("optimizer: paged_adamw_8bit", "optimizer: adamw_torch")
    path = tmp_path / "axolotl.yml"
    path.write_text(text, encoding="utf-8")
    document = offered(path, "RTX-4090", CHECKPOINTING, text)
    assert document["gradient_checkpointing"] is True
    document = offered(path, "RTX-4090", "Use the 8-bit AdamW (adamw_bnb_8bit)", text)
    assert document["optimizer"] == "adamw_bnb_8bit"
    assert "optim" not in document


def test_llamafactory_liger_is_enable_liger_kernel() -> None:
    document = offered(CONFIGS / "llamafactory_lora_sft.yaml", "RTX-4090", LIGER)
    assert document["enable_liger_kernel"] is True
    assert "use_liger_kernel" not in document


def test_llamafactory_checkpointing_clears_disable_flag(tmp_path: Path) -> None:
    text = (CONFIGS / "llamafactory_lora_sft.yaml").read_text(encoding="utf-8")
    text += "disable_gradient_checkpointing: true\n"
    path = tmp_path / "lf.yaml"
    path.write_text(text, encoding="utf-8")
    document = offered(path, "T4", CHECKPOINTING, text)
    assert document["disable_gradient_checkpointing"] is False
    assert "gradient_checkpointing" not in document


def test_llamafactory_v1_halves_micro_batch_keeping_global_batch() -> None:
    document = offered(CONFIGS / "llamafactory_v1_lora.yaml", "T4", HALVE)
    assert document["micro_batch_size"] == 1
    assert document["global_batch_size"] == 16
    assert "per_device_train_batch_size" not in document
    assert "gradient_accumulation_steps" not in document


def test_llamafactory_v1_checkpointing_is_enable_activation_checkpointing(
    tmp_path: Path,
) -> None:
    text = (CONFIGS / "llamafactory_v1_lora.yaml").read_text(encoding="utf-8")
    text += "enable_activation_checkpointing: false\n"
    path = tmp_path / "v1.yaml"
    path.write_text(text, encoding="utf-8")
    document = offered(path, "RTX-4090", CHECKPOINTING, text)
    assert document["enable_activation_checkpointing"] is True
    assert "gradient_checkpointing" not in document


def test_litgpt_halves_train_micro_batch_size_and_has_no_checkpointing_key() -> None:
    path = CONFIGS / "litgpt_lora.yaml"
    document = offered(path, "T4", HALVE)
    assert document["train"]["micro_batch_size"] == 1
    assert document["train"]["global_batch_size"] == 16
    assert "gradient_checkpointing" not in document
    text = path.read_text(encoding="utf-8")
    assert CHECKPOINTING not in fixes_of(path, text, "T4")


def test_torchtune_halves_batch_size() -> None:
    document = offered(CONFIGS / "torchtune_qlora.yaml", "T4", HALVE)
    assert document["batch_size"] == 2
    assert document["gradient_accumulation_steps"] == 8


def test_torchtune_checkpointing_and_optimizer_component(tmp_path: Path) -> None:
    text = (CONFIGS / "torchtune_qlora.yaml").read_text(encoding="utf-8")
    text = text.replace(
        "enable_activation_checkpointing: True", "enable_activation_checkpointing: False"
    )
    text = text.replace("bitsandbytes.optim.PagedAdamW8bit", "torch.optim.AdamW")
    path = tmp_path / "tune.yaml"
    path.write_text(text, encoding="utf-8")
    document = offered(path, "T4", CHECKPOINTING, text)
    assert document["enable_activation_checkpointing"] is True
    assert "gradient_checkpointing" not in document
    # the adapters' AdamW states are a few MiB: 8-bit AdamW is not worth a change to the file
    assert "Use the 8-bit AdamW (adamw_bnb_8bit)" not in fixes_of(path, text, "T4")
    # a full fine-tune of the same model, where the states are 8 bytes a parameter
    full = text.replace(
        "torchtune.models.llama3_1.qlora_llama3_1_8b", "torchtune.models.llama3_1.llama3_1_8b"
    )
    path.write_text(full, encoding="utf-8")
    document = offered(path, "A100-80GB", "Use the 8-bit AdamW (adamw_bnb_8bit)", full)
    assert document["optimizer"]["_component_"] == "bitsandbytes.optim.AdamW8bit"


def test_trl_liger_and_qlora_use_trl_keys(trl_release: Callable[[str], Path]) -> None:
    # Liger's fused cross-entropy replaces TRL 0.29.1's full logits (from 1.15 SFTTrainer turns
    # it off and takes its fused LM head, which no Liger fix improves)
    trl_release("0.29.1")
    path = CONFIGS / "trl_sft.yaml"
    document = offered(path, "RTX-4090", LIGER)
    assert document["use_liger_kernel"] is True
    document = offered(path, "RTX-4090", "Switch to QLoRA (4-bit NF4 base weights)")
    assert document["load_in_4bit"] is True


@pytest.mark.parametrize(
    ("name", "foreign"),
    [
        ("axolotl_qlora.yml", ("use_liger_kernel", "per_device_train_batch_size", "optim:")),
        ("llamafactory_v1_lora.yaml", ("per_device_train_batch_size", "gradient_accumulation")),
        ("litgpt_lora.yaml", ("gradient_checkpointing", "per_device_train_batch_size")),
    ],
)
def test_no_hf_trainer_names_in_other_frameworks(name: str, foreign: tuple[str, ...]) -> None:
    path = CONFIGS / name
    text = path.read_text(encoding="utf-8")
    for gpu in ("T4", "RTX-4090"):
        for fix in fixes_of(path, text, gpu).values():
            written = "".join(edit.new_text for edit in fix.edits)
            assert not any(key in written for key in foreign), (fix.title, written)


QLORA = "Switch to QLoRA (4-bit NF4 base weights)"


def edited_text(path: Path, text: str, title: str, gpu: str) -> str:
    fixes = fixes_of(path, text, gpu)
    assert title in fixes, sorted(fixes)
    applied(path, text, fixes[title], gpu)
    return apply_edits(text, fixes[title].edits)


def test_torchtune_qlora_swaps_the_lora_builder_for_its_qlora_twin(tmp_path: Path) -> None:
    text = (CONFIGS / "torchtune_qlora.yaml").read_text(encoding="utf-8")
    text = text.replace("qlora_llama3_1_8b", "lora_llama3_1_8b")
    path = tmp_path / "lora.yaml"
    path.write_text(text, encoding="utf-8")
    after = edited_text(path, text, QLORA, "RTX-4090")
    assert after == text.replace(
        "_component_: torchtune.models.llama3_1.lora_llama3_1_8b",
        "_component_: torchtune.models.llama3_1.qlora_llama3_1_8b",
    )
    checked = check_text(path, after, gpu="RTX-4090", hub=False)
    assert checked.analysis.plan.quantization is not None
    # applied, the file is QLoRA: the fix is not offered again
    assert QLORA not in fixes_of(path, after, "RTX-4090")


def test_torchtune_qlora_is_not_offered_where_torchtune_has_no_qlora_builder(
    tmp_path: Path,
) -> None:
    text = (CONFIGS / "torchtune_qlora.yaml").read_text(encoding="utf-8")
    text = text.replace(
        "torchtune.models.llama3_1.qlora_llama3_1_8b",
        "torchtune.models.qwen2_5.lora_qwen2_5_7b_base",
    )
    path = tmp_path / "qwen.yaml"
    path.write_text(text, encoding="utf-8")
    for gpu in ("T4", "RTX-4090"):
        assert QLORA not in fixes_of(path, text, gpu)


def test_llamafactory_v1_qlora_writes_its_quant_config() -> None:
    path = CONFIGS / "llamafactory_v1_lora.yaml"
    text = path.read_text(encoding="utf-8")
    after = edited_text(path, text, QLORA, "RTX-4090")
    assert after == text + "quant_config: {name: bnb, quantization_bit: 4}\n"
    document = yaml.safe_load(after)
    assert document["quant_config"] == {"name": "bnb", "quantization_bit": 4}
    assert "quantization_bit" not in document  # the 0.9 key, which v1 does not read
    assert QLORA not in fixes_of(path, after, "RTX-4090")


AXOLOTL_LIGER = "axolotl.integrations.liger.LigerPlugin"
CCE = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"


def axolotl_with(tmp_path: Path, plugins: str) -> tuple[Path, str]:
    text = (CONFIGS / "axolotl_qlora.yml").read_text(encoding="utf-8")
    text = text.replace("adapter: qlora\n", plugins + "adapter: qlora\n")
    path = tmp_path / "axolotl.yml"
    path.write_text(text, encoding="utf-8")
    return path, text


def test_axolotl_liger_appends_to_a_block_plugins_list(tmp_path: Path) -> None:
    block = f"plugins:\n  - {CCE}  # kept\n\n"
    path, text = axolotl_with(tmp_path, block)
    after = edited_text(path, text, LIGER, "RTX-4090")
    expected = text.replace(block, f"plugins:\n  - {CCE}  # kept\n  - {AXOLOTL_LIGER}\n\n")
    assert after == expected + "liger_fused_linear_cross_entropy: true\n"
    assert LIGER not in fixes_of(path, after, "RTX-4090")


def test_axolotl_liger_appends_to_a_flow_plugins_list(tmp_path: Path) -> None:
    path, text = axolotl_with(tmp_path, "plugins: [my_org.plugins.Logging]\n")
    after = edited_text(path, text, LIGER, "RTX-4090")
    expected = text.replace(
        "plugins: [my_org.plugins.Logging]\n",
        f"plugins: [my_org.plugins.Logging, {AXOLOTL_LIGER}]\n",
    )
    assert after == expected + "liger_fused_linear_cross_entropy: true\n"


def test_axolotl_liger_with_the_plugin_listed_only_adds_the_key(tmp_path: Path) -> None:
    path, text = axolotl_with(tmp_path, f"plugins:\n- {AXOLOTL_LIGER}\n")
    after = edited_text(path, text, LIGER, "RTX-4090")
    assert after == text + "liger_fused_linear_cross_entropy: true\n"
    assert after.count(AXOLOTL_LIGER) == 1


def verl_plan(path: Path, text: str) -> Any:
    from llmmem.extract.configs import extract_config_plan

    return extract_config_plan(path, text)


def test_verl_sft_checkpointing_turns_its_model_switch_back_on(tmp_path: Path) -> None:
    text = (CONFIGS / "verl_sft_lora.yaml").read_text(encoding="utf-8")
    text = text.replace(
        "enable_gradient_checkpointing: true", "enable_gradient_checkpointing: false"
    )
    path = tmp_path / "verl_sft.yaml"
    document = offered(path, "RTX-4090", CHECKPOINTING, text)
    assert document["model"]["enable_gradient_checkpointing"] is True
    assert "gradient_checkpointing" not in document
    assert "actor_rollout_ref" not in document
    fixed = apply_edits(text, fixes_of(path, text, "RTX-4090")[CHECKPOINTING].edits)
    assert verl_plan(path, fixed).gradient_checkpointing.value is True


def test_verl_sft_halves_the_micro_batch_and_keeps_the_global_batch(tmp_path: Path) -> None:
    text = (CONFIGS / "verl_sft_lora.yaml").read_text(encoding="utf-8")
    text = text.replace(
        "enable_gradient_checkpointing: true", "enable_gradient_checkpointing: false"
    )
    path = tmp_path / "verl_sft.yaml"
    document = offered(path, "RTX-4090", HALVE, text)
    assert document["data"]["micro_batch_size_per_gpu"] == 1
    assert document["data"]["train_batch_size"] == 64
    before = verl_plan(path, text)
    after = verl_plan(path, apply_edits(text, fixes_of(path, text, "RTX-4090")[HALVE].edits))
    assert after.per_device_train_batch_size.value == 1
    # 64 rows over 4 GPUs: 8 micro-batches of 2 become 16 of 1
    assert before.gradient_accumulation_steps.value == 8
    assert after.gradient_accumulation_steps.value == 16


def test_verl_grpo_fixes_write_the_actor_keys(
    tmp_path: Path, trl_release: Callable[[str], Path]
) -> None:
    trl_release("0.29.1")  # the GRPO step the budget restates: the full logits, not 1.15's head
    text = (CONFIGS / "verl_grpo.yaml").read_text(encoding="utf-8")
    document = offered(CONFIGS / "verl_grpo.yaml", "RTX-4090", HALVE, text)
    actor = document["actor_rollout_ref"]["actor"]
    assert actor["ppo_micro_batch_size_per_gpu"] == 8
    assert actor["ppo_mini_batch_size"] == 256
    assert "micro_batch_size_per_gpu" not in document["data"]

    text = text.replace(
        "enable_gradient_checkpointing: true", "enable_gradient_checkpointing: false"
    )
    path = tmp_path / "verl_grpo.yaml"
    document = offered(path, "A100-40GB", CHECKPOINTING, text)
    assert document["actor_rollout_ref"]["model"]["enable_gradient_checkpointing"] is True
    assert "model" not in document

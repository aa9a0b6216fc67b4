"""The bases people fine-tune, named as training files name them, resolve from the bundled catalog
(never a guess from the name) with their exact parameter counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmmem.models.resolve import resolve_model
from llmmem.models.spec import ModelSource


@pytest.fixture(autouse=True)
def no_cache_no_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("LLMMEM_CACHE_DIR", str(tmp_path / "llmmem-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize(
    ("ref", "model_id", "params"),
    [
        # named in real training files and, before, sized by a guess or not at all
        ("Qwen/Qwen2.5-Coder-3B-Instruct", "Qwen/Qwen2.5-Coder-3B", 3_085_938_688),
        ("Qwen/Qwen2.5-Coder-7B", "Qwen/Qwen2.5-Coder-7B", 7_615_616_512),
        ("google/gemma-2b-it", "google/gemma-2b-it", 2_506_172_416),
        ("Qwen/Qwen2-Math-7B-Instruct", "Qwen/Qwen2-Math-7B", 7_615_616_512),
        ("openai-mirror/gpt-oss-20b", "openai/gpt-oss-20b", 20_914_757_184),
        (
            "unsloth/DeepSeek-R1-Distill-Qwen-14B",
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B",
            14_770_033_664,
        ),
        ("Qwen/Qwen-7B-Chat", "Qwen/Qwen-7B", 7_721_324_544),
        ("google/gemma-3-270m", "google/gemma-3-270m", 268_098_176),
        (
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            7_615_616_512,
        ),
        # one of each family the catalog was grown by
        ("Qwen/Qwen2-72B-Instruct", "Qwen/Qwen2-72B", 72_706_203_648),
        ("Qwen/Qwen2.5-Math-7B-Instruct", "Qwen/Qwen2.5-Math-7B", 7_615_616_512),
        ("Qwen/Qwen3-4B-Thinking-2507", "Qwen/Qwen3-4B", 4_022_468_096),
        ("Qwen/QwQ-32B", "Qwen/QwQ-32B", 32_763_876_352),
        (
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
            1_777_088_000,  # Qwen2.5-Math-1.5B's shapes with an untied head
        ),
        (
            "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
            "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
            70_553_706_496,
        ),
        ("01-ai/Yi-1.5-9B-Chat", "01-ai/Yi-1.5-9B", 8_829_407_232),
        ("01-ai/Yi-6B", "01-ai/Yi-6B", 6_061_035_520),
        ("baichuan-inc/Baichuan2-7B-Chat", "baichuan-inc/Baichuan2-7B-Base", 7_505_973_248),
        ("internlm/internlm2_5-7b-chat", "internlm/internlm2_5-7b", 7_737_708_544),
        ("unsloth/Qwen2.5-Coder-7B-bnb-4bit", "Qwen/Qwen2.5-Coder-7B", 7_615_616_512),
        ("THUDM/glm-4-9b-chat", "THUDM/glm-4-9b-chat", 9_399_951_360),
        ("internlm/internlm3-8b-instruct", "internlm/internlm3-8b-instruct", 8_804_241_408),
        ("allenai/OLMo-7B-hf", "allenai/OLMo-7B-hf", 6_888_095_744),
        ("allenai/OLMo-2-1124-13B-Instruct", "allenai/OLMo-2-1124-13B", 13_716_198_400),
        (
            "mistralai/Mistral-Small-Instruct-2409",
            "mistralai/Mistral-Small-Instruct-2409",
            22_247_282_688,
        ),
        ("google/gemma-3-1b-pt", "google/gemma-3-1b-it", 999_885_952),
        (
            "unsloth/llama-3-8b-Instruct-bnb-4bit",
            "meta-llama/Meta-Llama-3-8B-Instruct",
            8_030_261_248,
        ),
        ("zai-org/glm-4-9b-chat-hf", "THUDM/glm-4-9b-chat-hf", 9_399_951_360),
        ("THUDM/GLM-Z1-9B-0414", "THUDM/GLM-4-9B-0414", 9_400_279_040),
    ],
)
def test_named_base_resolves_from_the_catalog(ref: str, model_id: str, params: int) -> None:
    spec = resolve_model(ref, hub=False)
    assert spec.source is ModelSource.CATALOG, spec.source_detail
    assert not spec.is_guess
    assert spec.model_id == model_id
    assert spec.total_params == params


def test_qwen_1_has_its_own_module_names() -> None:
    spec = resolve_model("Qwen/Qwen-7B-Chat", hub=False)
    names = {lin.name for lin in spec.blocks[0].linears}
    assert {"c_attn", "c_proj", "w1", "w2"} == names
    assert spec.intermediate_size == 11008  # w1 and w2 each half of the config's 22016
    assert spec.vocab_size == 151936 and not spec.tie_word_embeddings


def test_lora_on_qwen_1_module_names_is_linted_without_a_guess(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        "from peft import LoraConfig, get_peft_model\n"
        'model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen-7B-Chat")\n'
        'model = get_peft_model(model, LoraConfig(r=8, target_modules=["c_attn", "w1", "w2"]))\n'
        "args = TrainingArguments(output_dir='out', per_device_train_batch_size=1, bf16=True)\n"
        "Trainer(model=model, args=args).train()\n"
    )
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("llmmem-lint")),
            "--format",
            "json",
            "--gpu",
            "A100-80GB",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    codes = [finding["code"] for finding in json.loads(done.stdout)]
    assert "LLM013" not in codes  # the targets match Qwen's own modules
    assert "LLM017" not in codes  # its shapes are read, not guessed

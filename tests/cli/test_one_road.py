"""`llmmem estimate` makes a plan of its flags and takes the road a file's plan takes
(llmmem.flag_plan, llmmem.sizing): a rule that was written on one road only now holds on both.

Each case here was sized apart before the two roads met: a pre-quantized bitsandbytes
checkpoint loaded with no BitsAndBytesConfig (estimate knew it loads in 4 bits, explain sized
LoRA over 16-bit weights), ms-swift without a dtype (explain followed ms-swift's own rule,
estimate the HF default), a vision-language model with no image flags (explain assumed one
image, estimate none)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from llmmem.cli import build_parser, main
from llmmem.plan import Provenance

PREQUANTIZED = "unsloth/Llama-3.2-1B-bnb-4bit"


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report: dict[str, Any] = json.loads(captured.out)
    return report


def explain(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    report = _run(capsys, ["explain", str(path), "--format", "json", "--gpu", "A100-80GB"])
    budget: dict[str, Any] = report["budget"]
    return budget


def estimate(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    return _run(capsys, ["estimate", "--offline", "--format", "json", "--gpu", "A100-80GB", *flags])


def test_the_flags_become_a_plan_each_value_saying_whether_a_flag_gave_it() -> None:
    from llmmem.flag_plan import plan_from_flags
    from llmmem.models.resolve import resolve_model

    parser = build_parser()
    args = parser.parse_args(
        ["estimate", "--model", "Qwen/Qwen2.5-0.5B", "--method", "qlora", "--batch", "4"]
    )
    assert isinstance(args, argparse.Namespace)
    spec = resolve_model("Qwen/Qwen2.5-0.5B", hub=False)
    plan = plan_from_flags(args, spec, None).plan
    assert plan.per_device_train_batch_size.value == 4
    assert plan.per_device_train_batch_size.source is Provenance.FLAG
    assert plan.gradient_accumulation_steps.source is Provenance.DEFAULT
    # no framework fixes the sequence: an assumption, which the releases' defaults may restate
    assert plan.max_seq_length.source is Provenance.ASSUMED
    assert plan.quantization is not None and plan.quantization.bits.value == 4
    assert plan.lora is not None and plan.lora.r.source is Provenance.DEFAULT


def test_a_prequantized_checkpoint_without_a_quantization_config_loads_in_4_bits_on_both_roads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from peft import LoraConfig, get_peft_model\n"
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        f'model = AutoModelForCausalLM.from_pretrained("{PREQUANTIZED}")\n'
        "model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, "
        'target_modules=["q_proj", "v_proj"]))\n'
        'args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, bf16=True)\n'
        "Trainer(model=model, args=args).train()\n",
        encoding="utf-8",
    )
    lora = ["--lora-r", "16", "--lora-alpha", "32", "--lora-targets", "q_proj,v_proj"]
    flags = ["--model", PREQUANTIZED, "--method", "lora", *lora, "--batch", "4"]
    flags += ["--precision", "bf16", "--no-kbit-prepare"]  # the script prepares nothing
    by_file = explain(capsys, script)
    by_flags = estimate(capsys, *flags)
    assert by_file["allocated_peak_bytes"] == by_flags["allocated_peak_bytes"]
    assert by_flags["setup"]["values"]["method"] == "qlora"
    # the 16-bit base the checkpoint was made from needs more: the file's weights are 4-bit
    full_base = estimate(capsys, "--model", "meta-llama/Llama-3.2-1B", "--method", "lora", *lora,
                         "--batch", "4", "--precision", "bf16")  # fmt: skip
    assert by_file["allocated_peak_bytes"] < full_base["allocated_peak_bytes"]


def test_a_file_that_prepares_the_prequantized_model_is_sized_prepared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training\n"
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        f'model = AutoModelForCausalLM.from_pretrained("{PREQUANTIZED}")\n'
        "model = prepare_model_for_kbit_training(model)\n"
        "model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, "
        'target_modules=["q_proj", "v_proj"]))\n'
        'args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, bf16=True)\n'
        "Trainer(model=model, args=args).train()\n",
        encoding="utf-8",
    )
    flags = ["--model", PREQUANTIZED, "--method", "lora", "--lora-r", "16", "--lora-alpha", "32"]
    flags += ["--lora-targets", "q_proj,v_proj", "--batch", "4", "--precision", "bf16"]
    flags.append("--grad-ckpt")  # prepare_model_for_kbit_training turns it on
    prepared = estimate(capsys, *flags)  # estimate's default: the run prepares its model
    unprepared = estimate(capsys, *flags, "--no-kbit-prepare")
    by_file = explain(capsys, script)
    assert by_file["allocated_peak_bytes"] == prepared["allocated_peak_bytes"]
    # fp32 embeddings and head after the preparation: a 1B model's 128k vocabulary shows it
    assert prepared["allocated_peak_bytes"] > unprepared["allocated_peak_bytes"]


@pytest.mark.parametrize(
    ("model", "precision", "loaded"),
    [
        ("Qwen/Qwen2.5-0.5B", "bf16-autocast", "bfloat16"),
        ("google/gemma-2-2b", "fp16", "float32"),
    ],
)
def test_ms_swift_without_a_dtype_loads_the_checkpoints_own_on_both_roads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, precision: str, loaded: str
) -> None:
    script = tmp_path / "train.sh"
    script.write_text(
        f"swift sft --model {model} --train_type lora --per_device_train_batch_size 2 "
        "--max_length 1024 --output_dir out\n",
        encoding="utf-8",
    )
    # ms-swift's own defaults for what neither says (checkpointing on, LoRA r 8 alpha 32 on
    # every linear layer, dropout 0.05), as its reader takes them
    flags = ["--model", model, "--framework", "swift", "--method", "lora", "--batch", "2"]
    flags += ["--seq", "1024"]
    by_flags = estimate(capsys, *flags)
    assert by_flags["setup"]["values"]["precision"] == precision
    assert f"loads the checkpoint's {loaded}" in by_flags["setup"]["provenance"]["precision"]
    by_file = explain(capsys, script)
    assert by_file["allocated_peak_bytes"] == by_flags["allocated_peak_bytes"]
    assert by_flags["setup"]["values"]["grad_ckpt"] is True
    assert "ms-swift" in by_flags["setup"]["provenance"]["grad_ckpt"]
    # a dtype given is kept: the HF default's bf16 autocast over fp32 weights
    stated = estimate(capsys, *flags, "--precision", "bf16")
    assert stated["setup"]["values"]["precision"] == "bf16"


def test_a_vision_model_without_image_flags_is_sized_with_one_assumed_image(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = ["--model", "Qwen/Qwen2.5-VL-7B-Instruct", "--method", "lora"]
    assumed = estimate(capsys, *model)
    vision = assumed["setup"]["values"]["vision"]
    assert vision is not None and vision["images"] == 1
    assert "assumed" in assumed["setup"]["provenance"]["images"]
    none = estimate(capsys, *model, "--images", "0")
    assert none["setup"]["values"]["vision"] is None
    assert none["allocated_peak_bytes"] < assumed["allocated_peak_bytes"]
    two = estimate(capsys, *model, "--images", "2")
    assert two["allocated_peak_bytes"] > assumed["allocated_peak_bytes"]


def test_flags_that_cannot_run_together_are_still_refused_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for flags, said in (
        (["--zero", "3", "--fsdp", "full_shard", "--world-size", "2"], "ZeRO or FSDP, not both"),
        (["--method", "full", "--quant", "nf4"], "--quant needs --method lora or qlora"),
        (["--offload", "params"], "--offload params needs ZeRO stage 3"),
    ):
        code = main(["estimate", "--offline", "--model", "Qwen/Qwen2.5-0.5B", *flags])
        err = capsys.readouterr().err
        assert code != 0 and err.count("\n") == 1 and said in err, (flags, err)


def test_ms_swift_on_a_gpu_without_bf16_keeps_fp16(capsys: pytest.CaptureFixture[str]) -> None:
    """ms-swift's rule would load a bf16 checkpoint as bf16: not on a T4, where the precision
    stays the fp16 that GPU takes, as `--precision bf16` is refused there."""
    flags = ["estimate", "--offline", "--format", "json", "--model", "Qwen/Qwen2.5-0.5B"]
    report = _run(capsys, [*flags, "--framework", "swift", "--method", "lora", "--gpu", "T4"])
    assert report["setup"]["values"]["precision"] == "fp16"
    assert "no bf16" in report["setup"]["provenance"]["precision"]


def test_the_table_shows_the_setup_the_framework_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchtune prepares no k-bit model and keeps its adapters in bf16: the settings table says
    what the budget sized, as the JSON does."""
    monkeypatch.setenv("COLUMNS", "240")  # one line a setting
    flags = ["--offline", "--model", "Qwen/Qwen2.5-0.5B", "--method", "qlora"]
    assert main(["estimate", *flags, "--framework", "torchtune", "--gpu", "A100-80GB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("quantization" in line and "no kbit prepare" in line for line in lines)
    assert any(line.strip().startswith("LoRA") and "in 16 bits" in line for line in lines)


def test_unsloths_preference_trainer_keeps_its_own_adapters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """unsloth patches TRL's trainers and keeps fp32 adapters over a 4-bit base: TRL's own
    k-bit rule (bf16 adapters) is not laid over it."""
    flags = ["--model", "Qwen/Qwen2.5-0.5B", "--objective", "dpo", "--method", "qlora"]
    report = estimate(capsys, *flags, "--framework", "unsloth")
    assert report["setup"]["values"]["lora"]["adapter_bytes"] == 4
    assert "DPOTrainer" not in report["setup"]["provenance"].get("quant", "")

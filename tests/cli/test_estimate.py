"""`llmmem estimate` as a user runs it: a real process, real flags, real output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmmem.cli import main


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmmem", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def estimate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code = main(["estimate", "--offline", "--format", "json", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_json_has_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    out = estimate_json(
        capsys,
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "qlora",
        "--batch",
        "2",
        "--seq",
        "2048",
        "--gpu",
        "A100-80GB",
    )
    assert out["model"]["id"] == "meta-llama/Llama-3.1-8B"
    assert out["model"]["params"] == 8_030_261_248
    assert out["model"]["source"] == "catalog"
    for key in ("allocated_peak_bytes", "reserved_peak_bytes", "device_total_bytes"):
        assert isinstance(out[key], int) and out[key] > 0
    assert out["allocated_peak_bytes"] < out["reserved_peak_bytes"] < out["device_total_bytes"]
    assert out["peak_phase"] in ("forward", "backward", "optimizer_step")
    assert sum(out["components"].values()) == out["allocated_peak_bytes"]
    assert set(out["phases"]) == {"forward", "backward", "optimizer_step"}
    assert out["gpu"] == {"name": "A100-80GB", "capacity_bytes": 85_899_345_920}
    assert out["fits"] is True
    assert out["setup"]["provenance"]["batch"] == "flag"
    assert out["setup"]["provenance"]["optim"] == "default"


def test_qlora_uses_far_less_than_full_fine_tuning(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--model", "meta-llama/Llama-3.1-8B", "--batch", "1", "--seq", "1024"]
    full = estimate_json(capsys, *common, "--method", "full")
    qlora = estimate_json(capsys, *common, "--method", "qlora")
    assert full["device_total_bytes"] > 4 * qlora["device_total_bytes"]
    assert full["components"]["optimizer_states"] > 60e9  # 2 × 4 B × 8.03e9 under fp32 AdamW


def test_max_batch_is_the_edge_of_fitting(capsys: pytest.CaptureFixture[str]) -> None:
    common = [
        "--model",
        "meta-llama/Llama-3.2-1B",
        "--method",
        "lora",
        "--seq",
        "2048",
        "--gpu",
        "RTX-4090",
    ]
    out = estimate_json(capsys, *common, "--max-batch")
    best = out["max_batch"]["value"]
    assert best >= 1
    at_best = estimate_json(capsys, *common, "--batch", str(best))
    above = estimate_json(capsys, *common, "--batch", str(best + 1))
    assert at_best["fits"] is True
    assert above["fits"] is False


def test_max_seq_is_the_edge_of_fitting(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--model", "Qwen/Qwen2.5-0.5B", "--batch", "2", "--gpu", "T4", "--precision", "fp16"]
    best = estimate_json(capsys, *common, "--max-seq")["max_seq"]["value"]
    assert estimate_json(capsys, *common, "--seq", str(best))["fits"] is True
    assert estimate_json(capsys, *common, "--seq", str(best + 1))["fits"] is False


def test_text_report_shows_the_verdict_and_formulas() -> None:
    proc = run_cli(
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--batch",
        "8",
        "--seq",
        "4096",
        "--gpu",
        "4090",
        "--offline",
    )
    assert proc.returncode == 0, proc.stderr
    assert "does not fit" in proc.stdout
    assert "RTX-4090" in proc.stdout
    assert "12 B × N·V" in proc.stdout or "log-softmax" in proc.stdout
    assert "default" in proc.stdout  # defaulted settings are labelled


def test_local_config_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = estimate_json(capsys, "--model", str(tmp_path), "--batch", "1", "--seq", "32")
    assert out["model"]["source"] == "local"
    # embeddings + head 2·1000·256, per block 2·256² + 2·256·128 attention, 3·256·512 MLP,
    # 2·256 norms; final norm 256
    expected = 2 * 1000 * 256 + 2 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512 + 512) + 256
    assert out["model"]["params"] == expected


BAD_INPUT = [
    (["--model", "meta-llama/Llama-3.1-8B", "--gpu", "A100-90GB"], "A100-80GB"),
    (["--model", "no-such-org/no-such-model"], "no-such-org/no-such-model"),
    (["--model", "meta-llama/Llama-3.1-8B", "--batch", "0"], "at least 1"),
    (["--model", "meta-llama/Llama-3.1-8B", "--method", "full", "--quant", "nf4"], "qlora"),
    (["--model", "meta-llama/Llama-3.1-8B", "--precision", "bf16", "--gpu", "V100"], "bf16"),
    (["--model", "meta-llama/Llama-3.1-8B", "--precision", "bf16-true", "--gpu", "T4"], "bf16"),
    (["--model", "meta-llama/Llama-3.1-8B", "--optim", "adamw_turbo"], "optimizer"),
    (
        ["--model", "openai-community/gpt2", "--method", "lora", "--lora-targets", "q_proj"],
        "c_attn",
    ),
    (
        ["--model", "meta-llama/Llama-3.1-8B", "--mode", "generate", "--new-tokens", "-1"],
        "new_tokens must be at least 0",
    ),
    (
        ["--model", "meta-llama/Llama-3.1-8B", "--offload", "params"],
        "--offload params needs ZeRO stage 3",
    ),
]


@pytest.mark.parametrize(
    ("args", "says"),
    BAD_INPUT,
    ids=[
        "unknown-gpu",
        "unknown-model",
        "zero-batch",
        "qlora-full",
        "bf16-v100",
        "bf16-t4",
        "unknown-optimizer",
        "lora-target-missing",
        "negative-new-tokens",
        "offload-params-unsharded",
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    proc = run_cli("estimate", "--offline", *args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert says in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2  # argparse adds a usage line


@pytest.mark.parametrize(
    ("output", "may_import"),
    [("json", set()), ("text", {"rich"})],
)
def test_estimate_imports_only_what_it_needs(output: str, may_import: set[str]) -> None:
    code = (
        "import sys, contextlib, io\n"
        "from llmmem.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['estimate', '--offline', '--format', '{output}',\n"
        "          '--model', 'meta-llama/Llama-3.1-8B', '--method', 'qlora', '--gpu', '4090'])\n"
        "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('llmmem.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    packages, ours = (set(line.split()) for line in out.stdout.splitlines())
    heavy = {"pydantic", "rich", "torch", "transformers", "huggingface_hub", "yaml", "libcst"}
    assert packages & heavy == may_import
    # the hub client code and the other model families stay unloaded for a bundled llama
    assert "llmmem.models.hub" not in ours
    assert "llmmem.models.architectures.gpt_style" not in ours


def test_malformed_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    proc = run_cli("estimate", "--offline", "--model", str(tmp_path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "config.json" in proc.stderr


def test_guessed_model_is_marked(capsys: pytest.CaptureFixture[str]) -> None:
    out = estimate_json(capsys, "--model", "acme/support-bot-8B-sft", "--batch", "1")
    assert out["model"]["source"] == "guess"
    assert out["model"]["is_guess"] is True
    assert 7.5e9 < out["model"]["params"] < 8.5e9


def test_gpus_command_lists_the_catalog() -> None:
    proc = run_cli("gpus")
    assert proc.returncode == 0
    assert "A100-80GB" in proc.stdout and "no GPU detected" in proc.stdout


def test_prequantized_checkpoint_is_qlora(capsys: pytest.CaptureFixture[str]) -> None:
    quantized = estimate_json(capsys, "--model", "unsloth/llama-3-8b-bnb-4bit", "--batch", "1")
    original = estimate_json(
        capsys,
        "--model",
        "meta-llama/Meta-Llama-3-8B",
        "--method",
        "qlora",
        "--double-quant",
        "--batch",
        "1",
    )
    assert quantized["setup"]["values"]["method"] == "qlora"
    assert quantized["setup"]["values"]["quant"]["double_quant"] is True
    assert quantized["setup"]["provenance"]["quant"] == "the checkpoint's own quantization"
    assert quantized["components"]["weights"] == original["components"]["weights"]


QLORA_8B = [
    "--model",
    "meta-llama/Llama-3.1-8B",
    "--method",
    "qlora",
    "--batch",
    "4",
    "--seq",
    "2048",
    "--grad-ckpt",
]


def test_the_device_total_carries_its_band_in_json_and_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = estimate_json(capsys, *QLORA_8B, "--gpu", "A100-80GB")
    assert out["band_low_bytes"] < out["device_total_bytes"] < out["band_high_bytes"]
    assert out["band_basis"].startswith("hf qlora, on the device, 1 GPU: ")
    assert "measured rows" in out["band_basis"]
    assert out["verdict"] == "fits"
    proc = run_cli("estimate", *QLORA_8B, "--gpu", "A100-80GB")
    gib = 2**30
    shown = (
        f"{out['device_total_bytes'] / gib:.1f} GiB "
        f"({out['band_low_bytes'] / gib:.1f}–{out['band_high_bytes'] / gib:.1f})"
    )
    assert shown in proc.stdout, proc.stdout
    assert "band: hf qlora, on the device, 1 GPU" in proc.stdout


def test_a_gpu_inside_the_band_is_tight(capsys: pytest.CaptureFixture[str]) -> None:
    out = estimate_json(capsys, *QLORA_8B)
    # a capacity a little above the estimate, below the band's high end
    capacity = f"{(out['device_total_bytes'] + out['band_high_bytes']) / 2 / 2**30:.2f}GiB"
    tight = estimate_json(capsys, *QLORA_8B, "--gpu", capacity)
    assert tight["fits"] is True and tight["verdict"] == "tight"
    proc = run_cli("estimate", *QLORA_8B, "--gpu", capacity)
    assert "tight: the band crosses the capacity" in " ".join(proc.stdout.split())
    below = f"{out['band_low_bytes'] / 2**30 - 0.05:.2f}GiB"
    low = estimate_json(capsys, *QLORA_8B, "--gpu", below)
    assert low["verdict"] == "does not fit"


def test_offload_says_what_lives_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """ZeRO-3 over 4 GPUs: `--offload optimizer` moves the states, `--offload params` the
    parameters, a bare `--offload` both."""
    base = ["--model", "meta-llama/Llama-3.1-8B", "--method", "full", "--zero", "3"]
    base += ["--world-size", "4", "--grad-ckpt", "--gpu", "A100-80GB"]

    def held(*extra: str) -> tuple[int, int]:
        step = estimate_json(capsys, *base, *extra)["phases"]["optimizer_step"]["components"]
        return step.get("weights", 0), step.get("optimizer_states", 0)

    weights, states = held()
    assert weights > 0 and states > 0
    kept_weights, no_states = held("--offload", "optimizer")
    assert kept_weights == pytest.approx(weights, rel=0.001) and no_states == 0
    # offloaded parameters: at most ZeRO-3's small persistent ones stay on the GPU
    on_gpu, kept_states = held("--offload", "params")
    assert on_gpu < 2**20 and kept_states == states
    on_gpu, no_states = held("--offload")
    assert on_gpu < 2**20 and no_states == 0


LORA_RUN = ("--model", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--batch", "2", "--seq", "1024")


def test_sixteen_bit_adapters_hold_two_bytes_less_per_adapter_parameter(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fp32 = estimate_json(capsys, *LORA_RUN)
    bf16 = estimate_json(capsys, *LORA_RUN, "--adapter-dtype", "bf16")
    adapters = fp32["trainable_params"]
    assert fp32["components"]["weights"] - bf16["components"]["weights"] == 2 * adapters
    # AdamW's states follow the parameter's dtype: two states, two bytes less each
    saved = fp32["components"]["optimizer_states"] - bf16["components"]["optimizer_states"]
    assert saved == 2 * 2 * adapters
    assert bf16["setup"]["values"]["lora"]["adapter_bytes"] == 2


def test_lora_dropout_keeps_more_activations(capsys: pytest.CaptureFixture[str]) -> None:
    plain = estimate_json(capsys, *LORA_RUN)
    dropout = estimate_json(capsys, *LORA_RUN, "--lora-dropout", "0.1")
    assert dropout["components"]["activations"] > plain["components"]["activations"]
    assert dropout["components"]["weights"] == plain["components"]["weights"]


def test_skipping_kbit_preparation_keeps_the_unquantized_parameters_in_16_bits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    qlora = ("--model", "Qwen/Qwen2.5-0.5B", "--method", "qlora", "--precision", "bf16-true")
    prepared = estimate_json(capsys, *qlora)
    skipped = estimate_json(capsys, *qlora, "--no-kbit-prepare")
    # prepare_model_for_kbit_training upcasts embeddings and norms to fp32: 2 more bytes each
    assert prepared["components"]["weights"] > skipped["components"]["weights"]
    assert skipped["setup"]["values"]["quant"]["prepare_for_kbit_training"] is False


def test_litgpt_framework_runs_its_chunked_loss(capsys: pytest.CaptureFixture[str]) -> None:
    run = ("--model", "microsoft/phi-1_5", "--method", "lora", "--batch", "4", "--seq", "2048")
    hf = estimate_json(capsys, *run)
    litgpt = estimate_json(capsys, *run, "--framework", "litgpt")
    assert litgpt["components"]["logits"] < hf["components"]["logits"]
    assert litgpt["setup"]["values"]["loss"] == "chunked"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--lora-dropout", "1.5"), "--lora-dropout"),
        (("--adapter-dtype", "bf16"), "need --method lora or qlora"),
        (("--kbit-prepare",), "--kbit-prepare needs --quant"),
    ],
)
def test_adapter_flags_without_their_setup_are_usage_errors(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    extra = ("--method", "lora") if args[0] == "--lora-dropout" else ()
    code = main(["estimate", "--offline", "--model", "Qwen/Qwen2.5-0.5B", *extra, *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_trl_release_decides_how_a_kbit_model_is_prepared(
    capsys: pytest.CaptureFixture[str],
) -> None:
    qlora = ("--model", "mistralai/Mistral-7B-v0.1", "--method", "qlora", "--precision", "bf16")
    old = estimate_json(capsys, *qlora, "--framework", "trl", "--versions", "trl=0.21")
    new = estimate_json(capsys, *qlora, "--framework", "trl", "--versions", "trl=0.29.1")
    old_quant, new_quant = old["setup"]["values"]["quant"], new["setup"]["values"]["quant"]
    # up to 0.25: prepared (norms in fp32), embeddings and head cast back to bf16
    assert old_quant["prepare_for_kbit_training"] and old_quant["embeddings_16bit"]
    assert old["setup"]["values"]["lora"]["adapter_bytes"] == 4
    # from 0.26: not prepared, the adapters in bf16
    assert not new_quant["prepare_for_kbit_training"]
    assert new["setup"]["values"]["lora"]["adapter_bytes"] == 2
    assert "trl 0.29" in new["setup"]["provenance"]["quant"]
    # an explicit flag wins over the release's default
    flagged = estimate_json(
        capsys, *qlora, "--framework", "trl", "--versions", "trl=0.29.1", "--kbit-prepare"
    )
    assert flagged["setup"]["values"]["quant"]["prepare_for_kbit_training"]

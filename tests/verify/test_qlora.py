"""QLoRA verified by real steps on the CPU: bitsandbytes' CPU kernels quantize, multiply and
step the 8-bit optimizer, and the storage counter measures what they hold.

Expected bytes are counted by hand from the config and bitsandbytes' storage layout (a 4-bit
weight: two values per byte, one absmax per block of 64, double-quantized to a byte with an fp32
absmax per 256 blocks), or come from the core's estimate held to the measured step within 5%.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmmem.budget.phases import estimate_budget
from llmmem.budget.setup import (
    LoraSetup,
    Method,
    Precision,
    QuantSetup,
    QuantType,
    TrainingSetup,
)
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.compare import request_for
from llmmem.verify.grid import SMALL_CONFIGS, SMALL_SHAPES, config_for, qlora_cases, run_case
from llmmem.verify.request import StepRequest
from llmmem.verify.runner import run_step

pytest.importorskip("bitsandbytes")

TINY = dict(SMALL_CONFIGS["llama"])
QUANT = {"quant_type": "nf4", "double_quant": True, "compute_dtype_bytes": 2, "prepare": True}
LORA = {"r": 16, "alpha": 32, "targets": ["q_proj", "v_proj"]}


def qlora_request(**changes: object) -> StepRequest:
    fields: dict[str, object] = {
        "model_id": "tiny-llama",
        "architecture": "LlamaForCausalLM",
        "config": TINY,
        "batch": 1,
        "seq": 128,
        "precision": "bf16",
        "optim": "paged_adamw_8bit",
        "lora": LORA,
        "quant": QUANT,
        "device": "cpu",
    }
    fields.update(changes)
    return StepRequest(**fields)  # type: ignore[arg-type]


def shapes(config: dict[str, object]) -> tuple[list[tuple[int, int]], int]:
    """The Llama Linears of every block as (out, in), and the parameters nobody quantizes."""
    h, i, layers, v = (
        int(config[k])  # type: ignore[call-overload]
        for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
    )
    kvd = int(config["num_key_value_heads"]) * h // int(config["num_attention_heads"])  # type: ignore[call-overload]
    block = [(h, h), (kvd, h), (kvd, h), (h, h), (i, h), (i, h), (h, i)]
    plain = 2 * v * h + layers * 2 * h + h  # embeddings, head, norms
    return block * layers, plain


def nf4_double_quant_bytes(out_features: int, in_features: int) -> int:
    """One NF4 weight with double quantization, as bitsandbytes stores it."""
    numel = out_features * in_features
    blocks = numel // 64
    return (
        numel // 2  # two 4-bit values per byte
        + blocks  # each block's absmax, quantized to a byte
        + 4 * math.ceil(blocks / 256)  # an fp32 absmax per 256 blocks
        + 4 * 256  # the 8-bit code of the absmax quantization
        + 4 * 16  # the NF4 code
        + 4  # the offset subtracted from the absmax before quantizing it
    )


def test_a_qlora_model_holds_the_hand_counted_bytes() -> None:
    measured = run_step(qlora_request())
    assert measured.error is None, measured.error
    linears, plain = shapes(TINY)
    h = int(TINY["hidden_size"])  # type: ignore[call-overload]
    kvd = int(TINY["num_key_value_heads"]) * h // int(TINY["num_attention_heads"])  # type: ignore[call-overload]
    layers = int(TINY["num_hidden_layers"])  # type: ignore[call-overload]
    adapters = layers * 16 * ((h + h) + (h + kvd))  # A: r×in, B: out×r, on q and v
    quantized = sum(nf4_double_quant_bytes(o, i) for o, i in linears)
    # prepare_model_for_kbit_training upcasts what bitsandbytes leaves alone to fp32
    assert measured.weights_bytes == quantized + 4 * plain + 4 * adapters
    assert measured.gradients_bytes == 4 * adapters


def test_the_paged_8bit_optimizer_keeps_blockwise_states() -> None:
    """bitsandbytes quantizes a state to 8 bits blockwise (an fp32 absmax per 256 values) only
    for tensors of 4,096 elements or more; smaller ones keep fp32 states."""
    measured = run_step(qlora_request())
    assert measured.error is None, measured.error
    h = int(TINY["hidden_size"])  # type: ignore[call-overload]
    kvd = int(TINY["num_key_value_heads"]) * h // int(TINY["num_attention_heads"])  # type: ignore[call-overload]
    layers = int(TINY["num_hidden_layers"])  # type: ignore[call-overload]
    adapters = [16 * h, h * 16, 16 * h, kvd * 16] * layers  # q A, q B, v A, v B
    expected = 0
    for numel in adapters:
        if numel >= 4096:
            expected += 2 * (numel + 4 * math.ceil(numel / 256))  # two 8-bit states
        else:
            expected += 2 * 4 * numel  # two fp32 states
    expected += 2 * 4 * 256  # the two 8-bit codes, one tensor each, shared by every parameter
    assert measured.optimizer_state_bytes == expected
    assert any("paged_adamw_8bit on the CPU" in note for note in measured.notes)


@pytest.mark.parametrize(
    "case",
    qlora_cases(list(SMALL_CONFIGS), SMALL_SHAPES),
    ids=lambda case: case.name,
)
def test_the_core_agrees_with_a_qlora_step(case) -> None:  # type: ignore[no-untyped-def]
    result = run_case(case, config_for(case.family, "small"), case.family, device="cpu")
    assert result.error is None, result.error
    for phase, measured in result.simulated.items():
        error = (result.predicted[phase] - measured) / measured
        assert abs(error) <= 0.05, f"{case.name} {phase}: {error:+.1%}"


@pytest.mark.parametrize("grad_ckpt", [False, True], ids=["nockpt", "ckpt"])
def test_llm_int8_without_autocast_agrees_with_the_core(grad_ckpt: bool) -> None:
    spec = spec_from_config(TINY, model_id="tiny-llama", source=ModelSource.LOCAL)
    setup = TrainingSetup(
        method=Method.QLORA,
        lora=LoraSetup(r=16, alpha=32, targets=["q_proj", "v_proj"]),
        quant=QuantSetup(quant_type=QuantType.INT8),
        batch=2,
        seq=256,
        grad_ckpt=grad_ckpt,
        precision=Precision.BF16_TRUE,
        optim="adamw_8bit",
    )
    budget = estimate_budget(spec, setup, None, with_first_step=False)
    measured = run_step(request_for(spec, setup, TINY, "cpu"))
    assert measured.error is None, measured.error
    for phase in budget.phases:
        got = measured.phase(phase.phase.value)
        assert got is not None
        error = (phase.allocated_bytes - got.peak_bytes) / got.peak_bytes
        assert abs(error) <= 0.05, f"{phase.phase.value}: {error:+.1%}"


def test_llm_int8_under_autocast_is_refused_on_the_cpu() -> None:
    measured = run_step(qlora_request(quant={**QUANT, "quant_type": "int8"}))
    assert measured.error is not None
    assert measured.error.startswith("LLM.int8 under autocast takes another path on the CPU")
    assert measured.phases == []


def test_an_adapted_output_projection_keeps_what_a_gpu_keeps() -> None:
    """peft's k-bit LoRA layers ask `torch.is_autocast_enabled()` (CUDA's autocast): the CPU
    step answers for the CPU's, so an adapter on o_proj keeps the attention output itself, as
    on a GPU, and not a cast of an fp32 copy (2·N·h per layer)."""
    lora = {**LORA, "targets": ["q_proj", "v_proj", "o_proj"]}
    with_o = run_step(qlora_request(lora=lora, seq=256))
    without = run_step(qlora_request(seq=256))
    assert with_o.error is None and without.error is None
    h = int(TINY["hidden_size"])  # type: ignore[call-overload]
    layers = int(TINY["num_hidden_layers"])  # type: ignore[call-overload]
    tokens = 256
    forward = {p.phase: p.by_category for p in with_o.phases}["forward"]
    before = {p.phase: p.by_category for p in without.phases}["forward"]
    # o_proj's adapter adds, per layer, its lora_A output (bf16, r wide) and autocast's cached
    # bf16 casts of its two r×h matrices; no copy of its input
    added = forward["activations"] - before["activations"]
    assert added == layers * (tokens * 16 * 2 + 2 * 16 * h * 2)


def test_a_missing_bitsandbytes_is_named(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    shadow = tmp_path_factory.mktemp("without")
    (shadow / "bitsandbytes").mkdir()
    (shadow / "bitsandbytes" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'bitsandbytes'\", name='bitsandbytes')\n"
    )
    monkeypatch.syspath_prepend(str(shadow))
    for name in [m for m in sys.modules if m == "bitsandbytes" or m.startswith("bitsandbytes.")]:
        monkeypatch.delitem(sys.modules, name)
    measured = run_step(qlora_request())
    assert measured.error == (
        "k-bit layers and 8-bit optimizers need bitsandbytes: pip install 'llmmem[verify]'"
    )


def test_the_cli_verifies_a_qlora_script_on_the_cpu(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps({**TINY, "torch_dtype": "bfloat16"}))
    (tmp_path / "train.py").write_text(QLORA_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "llmmem", "verify", "train.py", "--device", "cpu", "--format=json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["measurement"]["stage"] == "done"
    rows = {row["what"]: row for row in report["comparison"]}
    assert abs(rows["allocated peak"]["error"]) < 0.05
    linears, plain = shapes(TINY)
    quantized = sum(nf4_double_quant_bytes(o, i) for o, i in linears)
    h = int(TINY["hidden_size"])  # type: ignore[call-overload]
    layers = int(TINY["num_hidden_layers"])  # type: ignore[call-overload]
    kvd = int(TINY["num_key_value_heads"]) * h // int(TINY["num_attention_heads"])  # type: ignore[call-overload]
    adapters = layers * 8 * ((h + h) + (h + kvd))
    assert rows["weights"]["measured_bytes"] == quantized + 4 * plain + 4 * adapters
    assert "Traceback" not in proc.stderr


QLORA_SCRIPT = """import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, TrainingArguments
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

bnb = BitsAndBytesConfig(
    load_in_4bit=True,
    bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True,
    bnb_4bit_compute_dtype=torch.bfloat16,
)
model = AutoModelForCausalLM.from_pretrained("./tiny", quantization_config=bnb)
model = prepare_model_for_kbit_training(model)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=1,
    gradient_checkpointing=True,
    bf16=True,
    optim="paged_adamw_8bit",
)
# llmmem: seq=256
"""


def test_a_kbit_cpu_step_too_large_for_the_machine_is_refused_with_what_to_do() -> None:
    from llmmem.errors import UsageError
    from llmmem.models.catalog import catalog_entry
    from llmmem.verify_command import _check_host_memory, _cpu_step_bytes

    entry = catalog_entry("meta-llama/Llama-3.1-8B")
    assert entry is not None
    spec = spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)
    setup = TrainingSetup(method=Method.QLORA, batch=1, seq=128)
    small_peak = 6 * 2**30
    # bitsandbytes quantizes while loading: the whole model is built in bf16 first
    assert _cpu_step_bytes(spec, setup, small_peak) == 2 * spec.total_params
    with pytest.raises(UsageError, match=r"needs about .* of RAM .*: verify it on a GPU$"):
        _check_host_memory(2**60, simulable=False)

"""The core against published tables of other teams (`../shared/calibration/measured-wide.jsonl`):
fms-acceleration's HF Trainer + TRL + PEFT runs on an A100-80GB (transformers 4.48.1, torch 2.4.1,
bitsandbytes 0.43.3) and Answer.AI's FSDP-QLoRA runs on two 24 GB GPUs (early 2024).

The bounds are what the core reaches today, not targets: each row outside 12% is listed with what
is not explained yet, and a row that comes within bounds must leave the list.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from accuracy import wide_errors  # noqa: E402
from calibration import WIDE_CALIBRATION_FILE  # noqa: E402

from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.budget.result import Component  # noqa: E402
from llmmem.budget.setup import (  # noqa: E402
    TESTED_TRANSFORMERS,
    DistributedSetup,
    LoraSetup,
    QuantSetup,
    SetupError,
    TrainingSetup,
)
from llmmem.budget.weights import build_inventory  # noqa: E402
from llmmem.models.architectures import spec_from_config  # noqa: E402
from llmmem.models.catalog import catalog_entry  # noqa: E402
from llmmem.models.spec import ModelSource, ModelSpec  # noqa: E402

pytestmark = pytest.mark.skipif(
    not WIDE_CALIBRATION_FILE.exists(), reason="../shared/calibration is not beside the repo"
)

MEDIAN_BOUND = 0.025  # reached: 2.0% over all 43 rows
WITHIN_10_AT_LEAST = 40  # of 43
ROW_BOUND = 0.12
OUTSIDE = {
    # explained, not modelled: fsdp_qlora's train.py resets the peak right after the FSDP1 wrap
    # without emptying the cache (the wrap leaves 3.72 GiB reserved against about 2 GiB
    # allocated, its own log says), and FSDP1 all-gathers and reduce-scatters on streams of
    # their own, whose pools cannot reuse that cache: about 4.8 GiB before the step's own
    # tensors count. At 512 tokens the step never outgrows that floor; at 2048 it does, and
    # the same setup is within 0.1%. The estimate is of the step, not of the script's loading.
    "aai-l2-7b-qlora-fsdp-ctx512-bs1": "a reserved floor left by the script's FSDP1 wrap",
}
SKIPPED: dict[str, str] = {}  # every row is expressible


@pytest.fixture(scope="module")
def summary():  # type: ignore[no-untyped-def]
    return wide_errors()


def test_the_wide_rows_median_and_share_within_ten_percent(summary) -> None:  # type: ignore[no-untyped-def]
    assert summary.median <= MEDIAN_BOUND
    assert summary.within_10 >= WITHIN_10_AT_LEAST


def test_each_wide_row_is_within_its_bound_or_listed_with_why(summary) -> None:  # type: ignore[no-untyped-def]
    outside = {e.row_id for e in summary.errors if abs(e.error) > ROW_BOUND}
    assert outside == set(OUTSIDE)
    assert all(abs(e.error) <= 0.25 for e in summary.errors)


def test_only_the_unexpressible_rows_are_skipped(summary) -> None:  # type: ignore[no-untyped-def]
    assert set(summary.skipped) == set(SKIPPED)
    for row_id, word in SKIPPED.items():
        assert word in summary.skipped[row_id]


# --- the version rule: MoE experts under k-bit loading ------------------------------------------


def _spec(model_id: str) -> ModelSpec:
    entry = catalog_entry(model_id)
    assert entry is not None
    return spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)


def _mixtral_qlora(transformers_version: str) -> TrainingSetup:
    return TrainingSetup(
        method="qlora",
        batch=4,
        seq=4096,
        grad_ckpt=True,
        precision="bf16",
        optim="adamw_torch",
        attn="flash_attention_2",
        lora=LoraSetup(r=16, alpha=16, targets=["q_proj", "k_proj", "v_proj", "o_proj"]),
        quant=QuantSetup(double_quant=True, bitsandbytes_version="0.43"),
        torch_version="2.4",
        transformers_version=transformers_version,
    )


def test_mixtral_qlora_quantizes_its_experts_before_transformers_5() -> None:
    """fms-acceleration's Mixtral-8x7B QLoRA at 4 x 4096 (transformers 4.48.1) measured 39.9 GiB
    allocated: the experts were Linear4bit; on transformers 5 they stay bf16 (185 GiB)."""
    spec = _spec("mistralai/Mixtral-8x7B-Instruct-v0.1")
    old = estimate_budget(spec, _mixtral_qlora("4.48"))
    new = estimate_budget(spec, _mixtral_qlora(TESTED_TRANSFORMERS))
    measured = 42_794_268_160
    assert abs(old.allocated_peak_bytes / measured - 1) < 0.08
    assert new.allocated_peak_bytes > 3 * measured
    old_inv = build_inventory(spec, _mixtral_qlora("4.48"))
    assert old_inv.quantized_params == spec.total_params - spec.params.embedding - (
        spec.params.head + spec.params.norms
    )


def test_the_installed_transformers_keeps_mixtral_experts_unquantized(tmp_path: Path) -> None:
    """A real tiny Mixtral loaded in 4 bits on the CPU with the installed transformers and
    bitsandbytes: the k-bit parameters are the ones the inventory quantizes for that release."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    bnb = pytest.importorskip("bitsandbytes")
    config = {
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 256,
    }
    hf_config = transformers.MixtralConfig(**{k: v for k, v in config.items() if k != "model_type"})
    transformers.MixtralForCausalLM(hf_config).save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path,
        quantization_config=transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16
        ),
        device_map="cpu",
    )
    kbit = sum(
        p.numel() * 2  # two 4-bit values per packed byte
        for p in model.parameters()
        if isinstance(p, bnb.nn.Params4bit)
    )
    release = ".".join(transformers.__version__.split(".")[:2])
    spec = spec_from_config(config, model_id="tiny-mixtral", source=ModelSource.LOCAL)
    setup = TrainingSetup(method="qlora", transformers_version=release)
    assert build_inventory(spec, setup).quantized_params == kbit
    experts = spec.params.experts
    assert (kbit >= experts) == setup.experts_are_linears


# --- FSDP-QLoRA: bnb_4bit_quant_storage -------------------------------------------------------


def test_a_float_quant_storage_packs_the_same_bytes_in_a_dtype_fsdp_can_flatten() -> None:
    """bitsandbytes stores the packed 4-bit values in the storage dtype: bf16 elements holding
    four values each, the same bytes as uint8 ones holding two."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    weight = torch.randn(128, 64, dtype=torch.bfloat16)
    layers = {}
    for storage in (torch.uint8, torch.bfloat16):
        layer = bnb.nn.Linear4bit(64, 128, bias=False, quant_storage=storage)
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_storage=storage)
        layer = layer.to("cpu")
        layer.weight = (
            layer.weight._quantize("cpu") if not layer.weight.bnb_quantized else layer.weight
        )
        layers[storage] = layer.weight
    packed_u8, packed_bf16 = layers[torch.uint8], layers[torch.bfloat16]
    assert packed_bf16.dtype == torch.bfloat16
    assert packed_u8.numel() * 1 == packed_bf16.numel() * 2 == 128 * 64 // 2


def _fsdp_qlora(storage: str) -> TrainingSetup:
    return TrainingSetup(
        method="qlora",
        batch=2,
        seq=4096,
        grad_ckpt=True,
        precision="bf16",
        optim="adamw_torch",
        quant=QuantSetup(double_quant=True, quant_storage=storage),
        distributed=DistributedSetup(world_size=2, fsdp="full_shard"),
    )


def test_fsdp_shards_the_packed_weights_only_with_a_float_storage() -> None:
    spec = _spec("mistralai/Mistral-7B-v0.1")
    sharded = estimate_budget(spec, _fsdp_qlora("bfloat16")).peak.components[Component.WEIGHTS]
    whole = estimate_budget(spec, _fsdp_qlora("uint8")).peak.components[Component.WEIGHTS]
    inv = build_inventory(spec, _fsdp_qlora("bfloat16"))
    packed = 0.5 * inv.quantized_params
    # half of the packed values leave each of the two ranks; the quant state stays whole
    assert whole.bytes - sharded.bytes == pytest.approx(packed / 2, rel=0.01)
    with pytest.raises(SetupError, match="quant_storage"):
        QuantSetup(quant_storage="int4")


def test_estimate_reads_versions_and_quant_storage_flags() -> None:
    from llmmem.cli import build_parser
    from llmmem.errors import UsageError
    from llmmem.estimate_command import build_setup, parse_versions

    parser = build_parser()
    args = parser.parse_args(
        [
            "estimate",
            "--model",
            "mistralai/Mixtral-8x7B-Instruct-v0.1",
            "--method",
            "qlora",
            "--quant-storage",
            "bfloat16",
            "--versions",
            "transformers=4.48.1",
        ]
    )
    spec = _spec("mistralai/Mixtral-8x7B-Instruct-v0.1")
    setup, prov = build_setup(args, spec, None)
    assert setup.transformers_version == "4.48" and setup.experts_are_linears
    assert setup.quant is not None and setup.quant.quant_storage == "bfloat16"
    assert prov["transformers_version"] == "flag"
    with pytest.raises(UsageError, match="no rule depends on"):
        parse_versions("numpy=2.0")


# --- FSDP NO_SHARD: a replica per device, FSDP-wrapped ------------------------------------------


def test_fsdp_no_shard_keeps_a_whole_replica_without_ddp_bucket_copies() -> None:
    spec = _spec("meta-llama/Llama-2-7b-hf")

    def budget(**distributed):  # type: ignore[no-untyped-def]
        setup = TrainingSetup(
            method="lora",
            batch=2,
            seq=1024,
            precision="bf16-true",
            grad_ckpt=True,
            distributed=DistributedSetup(**distributed),
        )
        return estimate_budget(spec, setup)

    single = budget()
    replica = budget(world_size=2, fsdp="no_shard")
    ddp = budget(world_size=2)
    sharded = budget(world_size=2, fsdp="full_shard")
    weights = Component.WEIGHTS
    # every rank holds the whole model, as on one GPU; full sharding halves it
    assert replica.peak.components[weights].bytes == single.peak.components[weights].bytes
    assert sharded.peak.components[weights].bytes < 0.55 * single.peak.components[weights].bytes
    # FSDP all-reduces each unit's flat gradient in place: no DDP bucket copies
    assert replica.allocated_peak_bytes <= ddp.allocated_peak_bytes


def test_every_wide_row_is_an_estimate_command_line(capsys) -> None:  # type: ignore[no-untyped-def]
    """Each published row, written as `llmmem estimate` flags, gives the bench's numbers: no row
    needs a setting the command line cannot express."""
    import json

    from calibration import estimate_flags, load_rows, wide_case_from_row

    from llmmem.cli import main

    for row in load_rows(WIDE_CALIBRATION_FILE):
        case = wide_case_from_row(row)
        budget = estimate_budget(case.spec, case.setup, case.gpu)
        code = main(["estimate", "--offline", "--format", "json", *estimate_flags(case)])
        out = capsys.readouterr().out
        assert code == 0, (row["id"], out)
        got = json.loads(out)
        report = got.get("budget", got)
        for key in ("allocated_peak_bytes", "reserved_peak_bytes", "device_total_bytes"):
            assert report[key] == getattr(budget, key), (row["id"], key, estimate_flags(case))

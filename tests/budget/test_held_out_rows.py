"""The held-out rows of bench/peers.py (`bench/held_out_rows.jsonl`): published measurements that
nothing here is fitted to, read as the stack each ran on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from calibration import (  # noqa: E402
    CALIBRATION_FILE,
    HELD_OUT_FILE,
    WIDE_CALIBRATION_FILE,
    RowSkipped,
    load_rows,
    wide_case_from_row,
)
from peers import with_stated_stack  # noqa: E402

from llmmem.budget.bands import BANDS_FILE  # noqa: E402
from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.budget.result import Component, Phase  # noqa: E402
from llmmem.budget.setup import AttnImpl, Framework, LossImpl, Precision  # noqa: E402
from llmmem.models.spec import ModelSource  # noqa: E402

HELD_OUT = {str(row["id"]): row for row in load_rows(HELD_OUT_FILE)}


def test_every_row_names_its_source_metric_and_number() -> None:
    assert len(HELD_OUT) == len(load_rows(HELD_OUT_FILE)), "row ids repeat"
    for row_id, row in HELD_OUT.items():
        assert str(row["source"]).startswith("https://"), row_id
        assert row["metric"] in ("allocated", "reserved", "nvml"), row_id
        assert int(row["measured_bytes"]) > 0, row_id


@pytest.mark.skipif(not WIDE_CALIBRATION_FILE.exists(), reason="../shared/calibration is absent")
def test_no_held_out_row_is_a_calibration_row_or_band_evidence() -> None:
    fitted = {
        str(r["id"]) for path in (CALIBRATION_FILE, WIDE_CALIBRATION_FILE) for r in load_rows(path)
    }
    assert not fitted & set(HELD_OUT)
    evidence = json.loads(BANDS_FILE.read_text())["evidence"]["calibration_files"]
    assert HELD_OUT_FILE.name not in evidence


def test_a_litgpt_row_runs_litgpts_own_stack() -> None:
    case = wide_case_from_row(HELD_OUT["litgpt-rt-llama2-7b-nf4-mb1"])
    setup = case.setup
    assert setup.framework is Framework.LITGPT
    assert setup.loss is LossImpl.CHUNKED
    assert setup.lora is not None and setup.lora.adapter_bytes == 2  # bf16-true adapters
    assert setup.quant is not None and not setup.quant.prepare_for_kbit_training
    assert setup.quant.bitsandbytes_version == "0.41"  # as its source states
    assert setup.torch_version == "2.1"


def test_a_fused_qkv_carries_litgpts_query_and_value_adapters() -> None:
    case = wide_case_from_row(HELD_OUT["litgpt-hub-falcon-7b-lora-mb1"])
    assert case.setup.lora is not None and case.setup.lora.targets == ["query_key_value"]


def test_lora_on_the_output_head_is_named_as_not_modelled() -> None:
    with pytest.raises(RowSkipped, match="lm_head"):
        wide_case_from_row(HELD_OUT["litgpt-hub-phi-2-lora-mb4"])


def test_unsloths_notebook_row_runs_unsloths_stack_as_the_notebook_set_it() -> None:
    case = with_stated_stack(
        wide_case_from_row(HELD_OUT["unsloth-nb-tinyllama-rope4096-qlora-r32"])
    )
    setup = case.setup
    assert setup.framework is Framework.UNSLOTH and setup.unsloth_version == "2024.1"
    assert setup.precision is Precision.FP16 and not case.gpu.bf16  # fp16 autocast on a T4
    assert (setup.batch, setup.seq, setup.grad_accum, setup.grad_ckpt) == (2, 4096, 4, False)
    assert setup.optim == "adamw_8bit" and setup.torch_version == "2.1"
    assert setup.quant is not None and setup.quant.double_quant
    budget = estimate_budget(case.spec, setup, case.gpu)
    assert budget.trainable_params == 25_231_360  # as the notebook prints it
    # 2024.1 computed its loss on the whole fp16 logits, with its own kernel
    (note,) = [note for note in budget.notes if note.startswith("unsloth 2024.1's stack")]
    assert "over the whole logits" in note
    logits = 2 * 2 * 4096 * case.spec.vocab_size
    forward = budget.phase(Phase.FORWARD)
    assert forward.components[Component.LOGITS].bytes >= logits


def test_unsloths_gpt_oss_row_names_the_kernels_llmmem_does_not_size() -> None:
    with pytest.raises(RowSkipped, match=r"attention flex_attention .* tiled MLP"):
        wide_case_from_row(HELD_OUT["unsloth-nb-gpt-oss-20b-486k-tiled-mlp"])


DEEPSPEED_BASELINE = "deepspeed-bf16-master-baseline-6.9b-zero3-4gpu"


def test_a_models_own_code_is_sized_from_the_config_committed_beside_the_rows() -> None:
    case = with_stated_stack(wide_case_from_row(HELD_OUT[DEEPSPEED_BASELINE]))
    assert case.spec.source is ModelSource.LOCAL
    assert case.spec.architecture == "GPT2LMHeadModel"
    # train.py's SimpleTransformerModel at hidden 4096, 32 blocks, 512 positions and the GPT-2
    # tokenizer's vocabulary; the config has GPT-2's final LayerNorm and no output bias
    vocab, positions, h, blocks = 50_257, 512, 4096, 32
    block = (3 * h * h + 3 * h) + (h * h + h) + 2 * 2 * h + (4 * h * h + 4 * h) + (4 * h * h + h)
    train_py = vocab * h + positions * h + blocks * block + (h * vocab + vocab)
    assert case.spec.total_params == train_py - vocab + 2 * h
    setup = case.setup
    assert setup.framework is Framework.PLAIN  # its own loop over the DeepSpeed engine
    assert setup.attn is AttnImpl.EAGER and setup.grad_ckpt
    d = setup.distributed
    assert (d.world_size, d.zero_stage) == (4, 3)
    # configs/baseline.json's buckets, not DeepSpeed's defaults
    assert d.reduce_bucket_size == 50_000_000 and d.param_persistence_threshold == 0
    budget = estimate_budget(case.spec, setup, case.gpu)
    assert budget.peak_phase is Phase.OPTIMIZER_STEP
    assert "kept whole on every rank" not in budget.peak.components[Component.WEIGHTS].formula


def test_deepspeeds_bf16_model_states_are_named_as_not_modelled() -> None:
    with pytest.raises(
        RowSkipped,
        match="bf16_master_weights_and_grads, bf16_optimizer_states and DeepSpeed's "
        "torch_autocast are not modelled",
    ):
        wide_case_from_row(HELD_OUT["deepspeed-bf16-master-bf16-states-6.9b-zero3-4gpu"])


def test_a_model_config_that_is_not_there_is_said_in_one_line() -> None:
    row = {**HELD_OUT[DEEPSPEED_BASELINE], "model_config": "models/no-such-model/config.json"}
    with pytest.raises(RowSkipped) as raised:
        wide_case_from_row(row)
    assert "no-such-model" in str(raised.value) and "\n" not in str(raised.value)

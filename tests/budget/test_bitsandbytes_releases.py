"""What bitsandbytes' 4-bit matmul keeps for backward, release by release, and what LitGPT's loop
makes of it.

Read in the wheels: `MatMul4Bit.forward` keeps its input as a plain attribute of the autograd
context, `ctx.tensors = (A, B)` (autograd/_functions.py:523 in 0.41.0, 0.41.3, 0.42.0 and 0.43.0,
:516 in 0.43.1), and from 0.43.2 keeps `(None, B)` (bitsandbytes #1270). Backward frees a graph's
saved tensors, not its contexts' attributes: such an input lives as long as the graph.

LitGPT's `fit` keeps a step's logits, and with them its graph, until the next step's model call
returns (finetune/lora.py:276 at 5895df10), so a later step's head runs beside the previous
step's logits and, up to bitsandbytes 0.43.1, every input its 4-bit Linears kept.

Every expected number is written from the model's shapes here.
"""

from __future__ import annotations

import pytest

from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Component, Phase
from llmmem.budget.setup import (
    Framework,
    LoraSetup,
    LossImpl,
    QuantSetup,
    QuantType,
    TrainingSetup,
)
from llmmem.models.architectures import spec_from_config
from llmmem.models.catalog import catalog_entry
from llmmem.models.spec import ModelSource, ModelSpec

BATCH, SEQ = 2, 512


@pytest.fixture(scope="module")
def llama2_7b() -> ModelSpec:
    entry = catalog_entry("meta-llama/Llama-2-7b-hf")
    assert entry is not None
    return spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)


def litgpt_qlora(bnb: str, **changes: object) -> TrainingSetup:
    """config_hub/finetune/llama-2-7b/qlora.yaml at 5895df10: bf16-true, bnb.nf4, LoRA r 32 on
    query and value, micro-batch 2, 512 tokens."""
    values: dict[str, object] = {
        "method": "qlora",
        "batch": BATCH,
        "seq": SEQ,
        "precision": "bf16-true",
        "optim": "paged_adamw_32bit",
        "loss": LossImpl.CHUNKED,
        "framework": Framework.LITGPT,
        "lora": LoraSetup(r=32, alpha=16, targets=["q_proj", "v_proj"], dropout=0.05),
        "quant": QuantSetup(bitsandbytes_version=bnb),
    }
    values.update(changes)
    return TrainingSetup(**values)  # type: ignore[arg-type]


def at_the_head(spec: ModelSpec, setup: TrainingSetup) -> int:
    """The forward's logits term: the moment the last chunk's head runs."""
    forward = next(p for p in estimate_budget(spec, setup).phases if p.phase is Phase.FORWARD)
    return forward.components[Component.LOGITS].bytes


def kept_inputs(spec: ModelSpec) -> int:
    """The bf16 inputs of Llama-2-7B's 4-bit Linears that need a gradient, one step's: per block
    the attention's input (h), its output projection's (h), the MLP's (h) and the down
    projection's (I); the first block's attention input comes from the frozen embeddings and
    needs none; the head's input (h)."""
    h, inter, layers = 4096, 11008, 32
    assert (spec.hidden_size, spec.intermediate_size, spec.num_layers) == (h, inter, layers)
    return 2 * BATCH * SEQ * (layers * (3 * h + inter) - h + h)


@pytest.mark.parametrize(
    ("release", "keeps"),
    [
        ("0.41.3", True),
        ("0.42.0", True),
        ("0.42", True),
        ("0.43.0", True),
        ("0.43.1", True),
        ("0.43.2", False),
        ("0.44.1", False),
        ("0.50.2", False),
        # a release without its patch is that minor release's newest patch (0.43.3)
        ("0.43", False),
    ],
)
def test_the_4bit_matmul_keeps_its_input_up_to_0_43_1(release: str, keeps: bool) -> None:
    assert QuantSetup(bitsandbytes_version=release).matmul_keeps_input is keeps


def test_llm_int8_keeps_its_input_in_every_release() -> None:
    int8 = QuantSetup(quant_type=QuantType.INT8, bitsandbytes_version="0.50.2")
    assert int8.matmul_keeps_input


def test_a_litgpt_step_runs_beside_the_kept_inputs_of_the_step_before(
    llama2_7b: ModelSpec,
) -> None:
    """bitsandbytes 0.43.1 against 0.43.2, the same LitGPT QLoRA step: when the head runs, the
    previous step's 4-bit inputs are there under 0.43.1 and not under 0.43.2 (1.42 GiB)."""
    kept = at_the_head(llama2_7b, litgpt_qlora("0.43.1"))
    freed = at_the_head(llama2_7b, litgpt_qlora("0.43.2"))
    assert kept - freed == kept_inputs(llama2_7b) == 1_526_726_656


def test_the_first_step_has_no_step_before_it(llama2_7b: ModelSpec) -> None:
    """The previous step's logits (bf16, N·V) and kept inputs: in a later step, not the first."""
    later = at_the_head(llama2_7b, litgpt_qlora("0.42.0"))
    first = at_the_head(llama2_7b, litgpt_qlora("0.42.0", first_step=True))
    previous_logits = 2 * BATCH * SEQ * 32000
    assert later - first == kept_inputs(llama2_7b) + previous_logits


def test_lit_gpt_resource_table_rows_are_first_steps() -> None:
    """lit-gpt's scripts of 2023 ran the longest sample as step one (finetune/lora.py:212 at
    8641822): the bench sizes their published rows as first steps, whatever bitsandbytes."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from calibration import runs_longest_first

    table = "https://github.com/Lightning-AI/litgpt/blob/0cc02af/tutorials/resource-tables.md"
    assert runs_longest_first({"source": f"{table} (lit-gpt 8641822, bitsandbytes 0.41.1)"})
    hub = "https://github.com/Lightning-AI/litgpt/blob/5895df1/config_hub/finetune/README.md"
    assert not runs_longest_first({"source": hub})


def test_the_peak_names_the_previous_steps_tensors(llama2_7b: ModelSpec) -> None:
    budget = estimate_budget(llama2_7b, litgpt_qlora("0.42.0"))
    assert budget.peak_phase is Phase.FORWARD
    forward = next(p for p in budget.phases if p.phase is Phase.FORWARD)
    formula = forward.components[Component.LOGITS].formula
    assert "the previous step's logits" in formula
    assert "kept on their autograd contexts by bitsandbytes 0.42.0" in formula

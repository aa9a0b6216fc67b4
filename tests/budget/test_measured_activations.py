"""llmmem's per-block activation tally against what autograd really saves in one block.

Each case builds a tiny HF model of a family on the CPU (real torch, dropout 0), runs one forward
with saved-tensor hooks active while the middle block runs, and sums the storages that block
keeps for backward that depend on its input (parameters, weight casts and the rotary tables
shared by every block are left out; see `saved_tensors.py`). The prediction is
`estimate_activations(spec, setup).per_block` evaluated on the same batch and sequence.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from saved_tensors import CASES, Case, measure_case, predict_case, tolerance  # noqa: E402


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_block_activations_match_autograd(case: Case) -> None:
    measured = measure_case(case)
    predicted = predict_case(case)
    got = measured.activation_bytes
    detail = "\n".join(s.describe() for s in measured.of_kind("activation"))
    assert abs(got - predicted.bytes) <= tolerance(got), (
        f"{case.id}: autograd saved {got} B in the block, llmmem predicts {predicted.bytes} B "
        f"({predicted.formula}); saved tensors:\n{detail}"
    )

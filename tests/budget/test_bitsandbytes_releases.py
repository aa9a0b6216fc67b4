"""What bitsandbytes' 4-bit matmul keeps for backward, release by release.

Read in the wheels: `MatMul4Bit.forward` keeps its input as a plain attribute of the autograd
context, `ctx.tensors = (A, B)` (autograd/_functions.py:523 in 0.41.0, 0.41.3, 0.42.0 and 0.43.0,
:516 in 0.43.1), and from 0.43.2 keeps `(None, B)` (bitsandbytes #1270). Backward frees a graph's
saved tensors, not its contexts' attributes: such an input lives as long as the graph.
"""

from __future__ import annotations

import pytest

from llmmem.budget.setup import QuantSetup, QuantType


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

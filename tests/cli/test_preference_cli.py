"""`llmmem estimate --objective dpo ...` and `llmmem explain` on the preference examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmmem.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code = main([*args, "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_method_dpo_is_full_fine_tuning_with_a_reference_copy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--model", "Qwen/Qwen2.5-0.5B-Instruct", "--batch", "2", "--seq", "512")
    out = _json(capsys, "estimate", "--offline", *args, "--method", "dpo")
    assert out["setup"]["values"]["objective"] == "dpo"
    assert out["setup"]["values"]["reference"] == "copy"
    assert out["setup"]["values"]["method"] == "full"
    assert set(out["phases"]) == {"forward", "reference_forward", "backward", "optimizer_step"}
    assert out["phases"]["optimizer_step"]["components"]["reference_model"] > 0
    sft = _json(capsys, "estimate", "--offline", *args)
    assert out["allocated_peak_bytes"] > sft["allocated_peak_bytes"]


def test_precomputed_reference_and_lora(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--model", "Qwen/Qwen2.5-0.5B-Instruct", "--batch", "2", "--seq", "512")
    adapter = _json(
        capsys, "estimate", "--offline", *args, "--objective", "dpo", "--method", "lora"
    )
    assert adapter["setup"]["values"]["reference"] == "adapter"
    assert "reference_forward" in adapter["phases"]
    pre = _json(
        capsys, "estimate", "--offline", *args, "--objective", "dpo", "--ref-model", "precomputed"
    )
    assert "reference_forward" not in pre["phases"]


def test_grpo_says_it_is_not_modelled(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["estimate", "--offline", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--objective", "grpo"]
    )
    assert code != 0
    assert "not modelled yet" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("example", "reference"), [("dpo_lora.py", "adapter"), ("axolotl_dpo.yaml", "copy")]
)
def test_explain_shows_the_method_the_reference_and_the_phases(
    capsys: pytest.CaptureFixture[str], example: str, reference: str
) -> None:
    out = _json(capsys, "explain", str(EXAMPLES / example))
    assert out["plan"]["objective"]["value"] == "dpo"
    assert "reference_forward" in out["budget"]["phases"]
    has_copy = "reference_model" in out["budget"]["phases"]["optimizer_step"]["components"]
    assert has_copy is (reference == "copy")
    main(["explain", str(EXAMPLES / example)])
    text = capsys.readouterr().out
    assert "reference model" in text
    assert reference in text


def test_verify_says_it_runs_supervised_steps_only(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", str(EXAMPLES / "dpo_lora.py"), "--offline"])
    assert code != 0
    assert "supervised steps only" in capsys.readouterr().err


def test_the_largest_micro_batch_is_searched_with_the_preference_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--model", "Qwen/Qwen2.5-0.5B-Instruct", "--seq", "1024", "--gpu", "24GiB")
    sft = _json(capsys, "estimate", "--offline", *args, "--max-batch")
    dpo = _json(capsys, "estimate", "--offline", *args, "--method", "dpo", "--max-batch")
    assert 0 < dpo["max_batch"]["value"] < sft["max_batch"]["value"]

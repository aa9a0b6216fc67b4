"""`llmmem estimate --framework unsloth --grad-ckpt`: unsloth's get_peft_model checkpoints with
use_gradient_checkpointing="unsloth" unless told otherwise, so the checkpointed layers' inputs
wait on the host, as a script that leaves it unsaid is read; --no-activation-offload is
use_gradient_checkpointing=True."""

from __future__ import annotations

from estimate_runs import report

BASE = ["--model", "unsloth/Llama-3.2-3B-Instruct", "--method", "qlora", "--framework", "unsloth"]
BASE += ["--batch", "2", "--seq", "2048", "--grad-ckpt"]


def test_unsloths_checkpointing_offloads_unless_told_not_to() -> None:
    default = report(*BASE)
    offloaded = report(*BASE, "--activation-offload")
    plain = report(*BASE, "--no-activation-offload")
    assert default["allocated_peak_bytes"] == offloaded["allocated_peak_bytes"]
    assert plain["allocated_peak_bytes"] > default["allocated_peak_bytes"]
    assert "unsloth" in default["setup"]["provenance"]["activation_offload"]
    assert default["setup"]["values"]["activation_offload"] is True
    assert plain["setup"]["values"]["activation_offload"] is False

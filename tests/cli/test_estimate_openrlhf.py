"""`llmmem estimate --trainer openrlhf`: OpenRLHF's DPO as a launcher of it is read (its reference
copy in bf16, ZeRO-3 partitioned under --zero 3), by the same rule (preference_plan)."""

from __future__ import annotations

from typing import Any

from estimate_runs import estimate, report

LLAMA_31_8B = 8_030_261_248
BASE = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--objective", "dpo", "--method", "full"]
BASE += ["--batch", "1", "--seq", "2048", "--world-size", "8", "--zero", "3"]


def reference_bytes(out: dict[str, Any]) -> int:
    return max(phase["components"].get("reference_model", 0) for phase in out["phases"].values())


def test_openrlhfs_reference_is_a_bf16_copy_partitioned_under_zero_3() -> None:
    openrlhf = report(*BASE, "--trainer", "openrlhf")
    # 2 bytes a weight, one eighth a rank (ZeRO-3 over 8 ranks)
    assert abs(reference_bytes(openrlhf) - 2 * LLAMA_31_8B / 8) < 2**20
    zero2 = report(*[f if f != "3" else "2" for f in BASE], "--trainer", "openrlhf")
    assert abs(reference_bytes(zero2) - 2 * LLAMA_31_8B) < 2**20


def test_openrlhf_sizes_dpo_only() -> None:
    done = estimate(*[f if f != "dpo" else "kto" for f in BASE], "--trainer", "openrlhf")
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "llmmem: error: --trainer openrlhf sizes OpenRLHF's DPO: --objective dpo"
    )

"""Expert parallelism as a user asks for it: `llmmem estimate --ep N` divides a mixture of
experts' routed experts over N ranks (FSDP2 beside them, as transformers' DistributedConfig
runs it), or says in one line why it cannot."""

from __future__ import annotations

import json
import subprocess
from typing import Any

MOE = ("--model", "Qwen/Qwen3-30B-A3B", "--seq", "2048", "--batch", "1", "--grad-ckpt")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["llmmem", "estimate", "--offline", "--gpu", "H100-80GB", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def estimate(*args: str) -> dict[str, Any]:
    done = run("--format", "json", *args)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def refusal(*args: str) -> str:
    done = run(*args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr


def peak(report: dict[str, Any]) -> int:
    return int(report["allocated_peak_bytes"])


def test_ep_gathers_fewer_experts_on_each_rank() -> None:
    fsdp = estimate(*MOE, "--world-size", "8", "--fsdp")
    grouped = estimate(*MOE, "--world-size", "8", "--fsdp", "--ep", "8")
    assert peak(grouped) < peak(fsdp)
    assert any("expert parallelism over 8 ranks" in note for note in grouped["notes"])


def test_ep_alone_makes_its_group_and_shards_with_fsdp() -> None:
    done = run(*MOE, "--ep", "4")
    assert done.returncode == 0, done.stderr
    assert "expert 4; 4 data-parallel" in done.stdout
    assert "FSDP full_shard over 4 of 4 devices" in done.stdout


def test_a_dense_model_is_refused() -> None:
    err = refusal("--model", "meta-llama/Llama-3.1-8B", "--ep", "2")
    assert "needs a mixture of experts" in err


def test_a_group_that_does_not_divide_the_data_parallel_ranks_is_refused() -> None:
    err = refusal(*MOE, "--ep", "4", "--world-size", "6")
    assert "does not divide the 6 data-parallel ranks" in err


def test_zero_is_refused() -> None:
    assert "DeepSpeed ZeRO is not sized" in refusal(*MOE, "--ep", "4", "--zero", "3")

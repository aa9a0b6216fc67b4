"""`llmmem calibrate add`: what real runs write, recorded beside the prediction, narrows the
band of later predictions for the same GPU, stack, method and sharding.

The HF Trainer output is made for real: a tiny Llama built from a config trains 2 steps on the
CPU with `skip_memory_metrics=False`. On a CPU transformers' TrainerMemoryTracker writes only
the `*_mem_cpu_*` keys (its GPU branch runs only when torch sees a device), so the test checks
that such a run is refused, then writes the same file as a GPU run writes it: the keys
`update_metrics` adds on a GPU (`before_init_mem_gpu`, `init_mem_gpu_alloc_delta`,
`init_mem_gpu_peaked_delta`, `train_mem_gpu_alloc_delta`, `train_mem_gpu_peaked_delta`) put into
the run's own summary entry of `log_history`. The torchtune lines are in the format of its
metric loggers (`Step N | name:value ...`, torchtune 0.6 `DiskLogger.log_dict`), with the keys
`training.get_memory_stats` returns (GiB).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from llmmem.calibrate import (
    CALIBRATION_VARIABLE,
    NothingMeasured,
    device_ratio,
    read_run_output,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qlora_sft.py"
TORCHTUNE = ROOT / "tests" / "fixtures" / "configs" / "torchtune_qlora.yaml"
GIB = 2**30

TINY_TRAINER = textwrap.dedent(
    """
    import sys
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            ids = torch.randint(0, 128, (16,))
            return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}

    args = TrainingArguments(
        output_dir=sys.argv[1], max_steps=2, per_device_train_batch_size=2,
        skip_memory_metrics=False, report_to=[], save_strategy="no", use_cpu=True,
        logging_steps=1, disable_tqdm=True,
    )
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=Tokens())
    result = trainer.train()
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    """
)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("psutil")  # the Trainer writes no memory metrics without it
    out = tmp_path_factory.mktemp("hf") / "out"
    subprocess.run(
        [sys.executable, "-c", TINY_TRAINER, str(out)],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"},
    )
    return out


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(CALIBRATION_VARIABLE, raising=False)
    (tmp_path / ".git").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "train.py")
    shutil.copy(TORCHTUNE, tmp_path / "torchtune_qlora.yaml")
    return tmp_path


def llmmem(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != CALIBRATION_VARIABLE}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "llmmem", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def explain_budget(path: Path, gpu: str = "A100-80GB") -> dict[str, Any]:
    out = llmmem("explain", str(path), "--gpu", gpu, "--format", "json", cwd=path.parent)
    assert out.returncode == 0, out.stderr
    budget: dict[str, Any] = json.loads(out.stdout)["budget"]
    return budget


def predicted_allocated(budget: dict[str, Any]) -> int:
    """What max_memory_allocated would read if the prediction were exact: the allocated peak
    and cuBLAS's workspaces (handed out by torch's allocator)."""
    workspaces = budget["overheads"].get("cublas_workspaces", {}).get("bytes", 0)
    return int(budget["allocated_peak_bytes"]) + int(workspaces)


def as_gpu_run(cpu_run: Path, into: Path, allocated_peak: int) -> Path:
    """The CPU run's trainer_state.json, written as a GPU run writes it: the GPU keys of
    TrainerMemoryTracker.update_metrics in the summary entry, adding up to `allocated_peak`
    (weights moved to the GPU in Trainer.__init__, states and gradients left after train(),
    the rest the step's peak above that)."""
    state = json.loads((cpu_run / "trainer_state.json").read_text())
    summary = state["log_history"][-1]
    assert "train_mem_cpu_peaked_delta" in summary and "train_runtime" in summary
    weights = allocated_peak * 6 // 10
    kept = allocated_peak // 20
    summary.update(
        {
            "before_init_mem_gpu": 0,
            "init_mem_gpu_alloc_delta": weights,
            "init_mem_gpu_peaked_delta": 0,
            "train_mem_gpu_alloc_delta": kept,
            "train_mem_gpu_peaked_delta": allocated_peak - weights - kept,
        }
    )
    into.mkdir(parents=True)
    (into / "trainer_state.json").write_text(json.dumps(state, indent=2))
    return into


def test_a_cpu_trainer_run_has_no_gpu_peak_to_record(cpu_run: Path, workspace: Path) -> None:
    state = json.loads((cpu_run / "trainer_state.json").read_text())
    summary = state["log_history"][-1]
    assert "train_mem_cpu_peaked_delta" in summary
    assert not any("mem_gpu" in key for key in summary)
    with pytest.raises(NothingMeasured, match="CPU memory metrics only"):
        read_run_output(cpu_run)
    out = llmmem("calibrate", "add", str(cpu_run), "--for", "train.py", cwd=workspace)
    assert out.returncode == 2
    assert "the run had no GPU" in out.stderr
    assert not (workspace / ".llmmem").exists()


def test_trainer_runs_narrow_the_band_of_the_same_setup(cpu_run: Path, workspace: Path) -> None:
    before = explain_budget(workspace / "train.py")
    assert "local run" not in before["band_basis"]
    class_width = before["band_high_bytes"] - before["band_low_bytes"]
    allocated = predicted_allocated(before)
    # three runs that agree within 0.4%: the band they give is narrower than the class's
    for n, ratio in enumerate((1.010, 1.012, 1.014)):
        run = as_gpu_run(cpu_run, workspace / f"run{n}", round(allocated * ratio))
        out = llmmem(
            "calibrate", "add", str(run), "--for", "train.py", "--gpu", "A100-80GB", cwd=workspace
        )
        assert out.returncode == 0, out.stderr
        assert f"{n + 1} local run" in out.stdout
    rows = [
        json.loads(line)
        for line in (workspace / ".llmmem" / "calibration.jsonl").read_text().splitlines()
    ]
    assert [row["key"] for row in rows] == ["A100-80GB/hf/qlora/1 GPU"] * 3
    assert rows[0]["measured"] == {"allocated": round(allocated * 1.01)}
    assert rows[0]["ratio_from"] == "allocated"
    assert rows[0]["source"] == "HF Trainer memory metrics (trainer_state.json)"
    # the same run again is not a fourth run
    again = llmmem(
        "calibrate", "add", "run0", "--for", "train.py", "--gpu", "A100-80GB", cwd=workspace
    )
    assert again.returncode == 2 and "already recorded" in again.stderr

    after = explain_budget(workspace / "train.py")
    assert after["device_total_bytes"] == before["device_total_bytes"]  # the estimate stays
    assert after["band_basis"].startswith("band from 3 local runs")
    assert after["band_high_bytes"] - after["band_low_bytes"] < 0.75 * class_width
    # the measured runs sit inside the band
    for row in rows:
        implied = row["device_ratio"] * after["device_total_bytes"]
        assert after["band_low_bytes"] <= implied <= after["band_high_bytes"]
    text = llmmem("explain", "train.py", "--gpu", "A100-80GB", cwd=workspace).stdout
    assert "band from 3 local runs" in " ".join(text.split())

    # another shape of the same setup, from the command line in the workspace
    estimate = llmmem(
        "estimate", "--model", "Qwen/Qwen2.5-7B", "--method", "qlora", "--batch", "2",
        "--gpu", "A100-80GB", "--format", "json", cwd=workspace,
    )  # fmt: skip
    assert json.loads(estimate.stdout)["band_basis"].startswith("band from 3 local runs")
    # another GPU, or the same GPU with another method: the class band as before
    other_gpu = explain_budget(workspace / "train.py", gpu="H100")
    assert "local run" not in other_gpu["band_basis"]
    full = llmmem(
        "estimate", "--model", "Qwen/Qwen2.5-0.5B", "--method", "full", "--gpu", "A100-80GB",
        "--format", "json", cwd=workspace,
    )  # fmt: skip
    assert "local run" not in json.loads(full.stdout)["band_basis"]
    listed = llmmem("calibrate", "list", cwd=workspace).stdout
    assert "A100-80GB/hf/qlora/1 GPU: 3 runs" in listed


TORCHTUNE_LOG = """\
INFO:torchtune.utils._logging:Memory stats after model init:
\tGPU peak memory allocation: 6.02 GiB
\tGPU peak memory reserved: 6.20 GiB
\tGPU peak memory active: 6.02 GiB
Step 1 | loss:1.7712 lr:0.0003 tokens_per_second_per_gpu:1804.53 peak_memory_active:{a1} \
peak_memory_alloc:{a1} peak_memory_reserved:{r1} \n\
Step 2 | loss:1.6520 lr:0.0003 tokens_per_second_per_gpu:1866.10 peak_memory_active:{a2} \
peak_memory_alloc:{a2} peak_memory_reserved:{r2} \n\
"""


def test_torchtune_memory_logs_are_their_own_stack(workspace: Path) -> None:
    config = workspace / "torchtune_qlora.yaml"
    before = explain_budget(config)
    reserved = before["reserved_peak_bytes"] / GIB
    allocated = predicted_allocated(before) / GIB
    logs = workspace / "tt" / "logs"
    logs.mkdir(parents=True)
    log = logs / "log_1712345678.txt"
    log.write_text(
        TORCHTUNE_LOG.format(
            a1=f"{allocated * 0.97:.4f}",
            a2=f"{allocated:.4f}",
            r1=f"{reserved * 1.05:.4f}",
            r2=f"{reserved * 1.2:.4f}",
        )
    )
    measured = read_run_output(workspace / "tt")
    assert measured.metrics["reserved"] == round(float(f"{reserved * 1.2:.4f}") * GIB)
    assert measured.source.startswith("torchtune get_memory_stats")
    out = llmmem(
        "calibrate", "add", "tt", "--for", config.name, "--gpu", "A100-80GB", "--format", "json",
        cwd=workspace,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["row"]
    assert row["key"] == "A100-80GB/torchtune/qlora/1 GPU"
    assert row["ratio_from"] == "reserved"  # nearer the device total than the allocated peak
    after = explain_budget(config)
    assert after["band_basis"].startswith("band from 1 local run")
    # torchtune's reserved memory read 20% above the estimate: the band moves to cover it
    assert after["band_high_bytes"] >= row["device_ratio"] * after["device_total_bytes"]
    # an HF script on the same GPU and method is another stack: untouched
    assert "local run" not in explain_budget(workspace / "train.py")["band_basis"]


def test_max_memory_lines_and_verify_reports(workspace: Path) -> None:
    log = workspace / "train.log"
    log.write_text(
        "epoch 0 step 10\n"
        "max_memory_allocated: 20.50 GiB  max_memory_reserved = 23.0 GiB\n"
        "torch.cuda.max_memory_allocated() 22871867392\n"
        "max_memory_allocated 3.2\n"  # no unit: not read
    )
    measured = read_run_output(log)
    assert measured.metrics == {"allocated": 22871867392, "reserved": round(23.0 * GIB)}

    prediction = explain_budget(workspace / "train.py")
    report = {
        "file": str(workspace / "train.py"),
        "model": prediction["model"]["id"],
        "device": "NVIDIA A100-SXM4-80GB",
        "measurement": {
            "device": "cuda",
            "device_name": "NVIDIA A100-SXM4-80GB",
            "allocated_peak_bytes": predicted_allocated(prediction),
            "reserved_peak_bytes": prediction["reserved_peak_bytes"] + GIB,
            "device_used_peak_bytes": prediction["device_total_bytes"] + 2 * GIB,
        },
        "prediction": prediction,
    }
    path = workspace / "verify.json"
    path.write_text(json.dumps(report))
    # no --for (the report names its file) and no --gpu (the report names its device)
    out = llmmem("calibrate", "add", "verify.json", "--format", "json", cwd=workspace)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["row"]
    assert row["gpu"] == "A100-80GB" and row["ratio_from"] == "device"
    assert row["device_ratio"] == pytest.approx(
        (prediction["device_total_bytes"] + 2 * GIB) / prediction["device_total_bytes"], abs=1e-4
    )
    report["measurement"]["device"] = "cpu"
    path.write_text(json.dumps(report))
    with pytest.raises(NothingMeasured, match="only a CUDA step"):
        read_run_output(path)


def test_the_device_ratio_adds_the_predicted_terms_above_the_metric() -> None:
    predicted = {"allocated": 20 * GIB, "reserved": 22 * GIB, "device": 23 * GIB}
    ratio, metric = device_ratio({"allocated": 21 * GIB}, predicted)
    assert metric == "allocated" and ratio == pytest.approx(24 / 23)
    ratio, metric = device_ratio({"allocated": 21 * GIB, "reserved": 22 * GIB}, predicted)
    assert metric == "reserved" and ratio == pytest.approx(1.0)


def test_nothing_to_read_says_how_to_get_it(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("loss went down\n")
    with pytest.raises(NothingMeasured, match="skip_memory_metrics=False"):
        read_run_output(tmp_path)

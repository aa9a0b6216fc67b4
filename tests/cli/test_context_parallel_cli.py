"""Context parallelism as a user asks for it: `--cp N --cp-scheme ...` on the command line, and
the keys of axolotl, accelerate and LLaMA-Factory configs that divide each sequence over a
group of ranks. Each changes the budget (a rank's share of the sequence, and the attention's
keys and values in flight) or is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmmem.cli import main

LONG = ("--model", "meta-llama/Llama-3.1-8B", "--seq", "32768", "--batch", "1", "--grad-ckpt")


def estimate(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["estimate", "--offline", "--format", "json", "--gpu", "H100-80GB", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    report: dict[str, Any] = json.loads(out)
    return report


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    try:
        code = main(["estimate", "--offline", *args])
    except SystemExit as exit:
        code = int(exit.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    return err


def test_cp_divides_the_sequence_over_the_group(capsys: pytest.CaptureFixture[str]) -> None:
    whole = estimate(capsys, *LONG, "--world-size", "8", "--fsdp")
    divided = estimate(capsys, *LONG, "--world-size", "8", "--fsdp", "--cp", "4")
    # the shards are the same (FSDP over the 8 ranks either way); the activations and the
    # logits of 8,192 tokens instead of 32,768
    assert divided["components"]["weights"] == whole["components"]["weights"]
    assert divided["components"]["activations"] * 3.5 < whole["components"]["activations"]
    assert any("each holds 8192 of each sample's 32768 tokens" in n for n in divided["notes"])
    assert divided["setup"]["values"]["distributed"]["cp_size"] == 4


def test_the_schemes_differ_where_attention_runs(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--model", "meta-llama/Llama-3.1-8B", "--seq", "131072", "--batch", "1")
    common = (*args, "--grad-ckpt", "--world-size", "8", "--fsdp", "--cp", "8", "--loss", "liger")
    ring = estimate(capsys, *common, "--cp-scheme", "ring")
    ulysses = estimate(capsys, *common, "--cp-scheme", "ulysses")
    # torch's ring gathers the whole sequence's K and V at each attention: more than Ulysses'
    # exchanged copies of the local ones
    ring_moments = ring["phases"]
    assert ring["allocated_peak_bytes"] > ulysses["allocated_peak_bytes"], ring_moments


def test_cp_alone_makes_its_group_the_world(capsys: pytest.CaptureFixture[str]) -> None:
    report = estimate(capsys, *LONG, "--cp", "2")
    distributed = report["setup"]["values"]["distributed"]
    assert distributed["world_size"] == 2 and distributed["cp_size"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--cp-scheme", "ulysses"), "give the group's size"),
        (("--cp", "3", "--world-size", "8"), "does not divide 8"),
        (("--cp", "4", "--objective", "dpo"), "supervised fine-tuning"),
        (("--cp", "0"), "1 to 4096"),
        (("--cp", "3", "--cp-scheme", "ulysses"), "query heads (32)"),
    ],
)
def test_cp_that_would_say_nothing_is_refused(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    assert message in refused(capsys, "--model", "meta-llama/Llama-3.1-8B", *args)


AXOLOTL = """\
base_model: meta-llama/Llama-3.1-8B
sequence_len: 32768
micro_batch_size: 1
gradient_checkpointing: true
flash_attention: true
bf16: true
sequence_parallel_degree: 4
"""

ACCELERATE = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: 8
fsdp_config:
  fsdp_version: 2
parallelism_config:
  parallelism_config_dp_shard_size: 4
  parallelism_config_cp_size: 2
"""

LLAMAFACTORY = """\
model_name_or_path: meta-llama/Llama-3.1-8B
stage: sft
do_train: true
finetuning_type: full
cutoff_len: 32768
per_device_train_batch_size: 1
bf16: true
sequence_parallel_size: 4
sequence_parallel_mode: ulysses
"""


def explain(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    code = main(["explain", str(path), "--format", "json", "--gpu", "H100-80GB"])
    out = capsys.readouterr().out
    assert code == 0, out
    budget: dict[str, Any] = json.loads(out)["budget"]
    return budget


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("axolotl.yaml", AXOLOTL, "(ring-flash-attn) over 4 ranks: each holds 8192"),
        ("llamafactory.yaml", LLAMAFACTORY, "(ulysses) over 4 ranks: each holds 8192"),
    ],
)
def test_config_keys_divide_the_sequence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, said: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    divided = explain(capsys, path)
    assert any(said in note for note in divided["notes"]), divided["notes"]
    path.write_text(
        "\n".join(line for line in text.splitlines() if "sequence_parallel" not in line)
    )
    whole = explain(capsys, path)
    assert divided["components"]["activations"] * 3 < whole["components"]["activations"]


def test_an_accelerate_config_beside_a_script_reads_its_cp_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmmem.extract import extract_plan  # the reader lint and explain use

    path = tmp_path / "accelerate.yaml"
    path.write_text(ACCELERATE)
    plan = extract_plan(path)
    assert plan.extra["cp_size"].value == 2


def test_tp_splits_the_blocks_and_keeps_the_residual_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--model", "meta-llama/Llama-3.1-8B", "--seq", "4096", "--batch", "1")
    whole = estimate(capsys, *args, "--grad-ckpt", "--world-size", "8", "--fsdp")
    split = estimate(capsys, *args, "--grad-ckpt", "--world-size", "8", "--fsdp", "--tp", "2")
    # each rank trains half of every block's Linears (and of the head): the parameters FSDP
    # shards over the 4 other ranks are half as many
    assert split["trainable_params"] < 0.6 * whole["trainable_params"]
    # the checkpointed block inputs are the residual stream, whole on every rank
    assert split["components"]["activations"] == whole["components"]["activations"]
    assert any("tensor parallelism over 2 ranks" in note for note in split["notes"])
    alone = estimate(capsys, *args, "--tp", "4")
    assert alone["setup"]["values"]["distributed"]["world_size"] == 4


@pytest.mark.parametrize(
    ("model", "args", "message"),
    [
        ("meta-llama/Llama-3.1-8B", ("--tp", "3"), "query heads"),
        ("meta-llama/Llama-3.1-8B", ("--tp", "16"), "key and value heads"),
        ("Qwen/Qwen3-30B-A3B", ("--tp", "2"), "expert parallelism"),
        ("meta-llama/Llama-3.1-8B", ("--tp", "2", "--method", "qlora"), "k-bit"),
        ("meta-llama/Llama-3.1-8B", ("--tp", "2", "--world-size", "3"), "do not divide 3"),
    ],
)
def test_tp_that_cannot_be_sized_is_refused(
    capsys: pytest.CaptureFixture[str], model: str, args: tuple[str, ...], message: str
) -> None:
    assert message in refused(capsys, "--model", model, *args)


def test_an_axolotl_config_reads_its_parallel_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nd.yaml"
    path.write_text(
        AXOLOTL.replace("sequence_parallel_degree: 4", "context_parallel_size: 2")
        + "tensor_parallel_size: 2\n"
    )
    budget = explain(capsys, path)
    notes = " ".join(budget["notes"])
    assert "over 2 ranks: each holds 16384" in notes and "tensor parallelism over 2" in notes


DEEPSPEED_SCRIPT = """\
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
args = TrainingArguments(
    output_dir="o",
    per_device_train_batch_size=1,
    gradient_checkpointing=True,
    bf16=True,
    deepspeed="ds.json",
)
Trainer(model=model, args=args).train()
"""


def test_a_deepspeed_configs_sequence_parallel_size_is_ulysses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text(DEEPSPEED_SCRIPT)
    config = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    whole = explain(capsys, tmp_path / "train.py")
    (tmp_path / "ds.json").write_text(json.dumps({**config, "sequence_parallel_size": 4}))
    divided = explain(capsys, tmp_path / "train.py")
    notes = " ".join(divided["notes"])
    assert "(ulysses) over 4 ranks: each holds 256 of each sample's 1024" in notes, notes
    kept = [report["phases"]["forward"]["components"]["activations"] for report in (divided, whole)]
    assert kept[0] * 3 < kept[1]


PARALLELISM_SCRIPT = """\
from accelerate.parallelism_config import ParallelismConfig
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
parallelism = ParallelismConfig(dp_shard_size=2, cp_size=2, tp_size=2)
args = TrainingArguments(
    output_dir="o",
    per_device_train_batch_size=1,
    gradient_checkpointing=True,
    bf16=True,
    fsdp="full_shard",
    parallelism_config=parallelism,
)
Trainer(model=model, args=args).train()
"""


def test_a_scripts_parallelism_config_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text(PARALLELISM_SCRIPT)
    budget = explain(capsys, tmp_path / "train.py")
    notes = " ".join(budget["notes"])
    assert "context parallelism (ring) over 2 ranks: each holds 512 of each sample's 1024" in notes
    assert "tensor parallelism over 2 ranks" in notes
    # the world is 2 × 2 × 2: FSDP shards each tensor-parallel slice over the other 4
    assert "FSDP full_shard over 4 of 4 devices" in notes

"""The long-tail bench scores what llmmem reads against hand labels, and rebuilds its corpus from
git snapshots without ever needing the network.

The end-to-end case builds a one-repository snapshot with git, labels three files of it (one
training script, one DeepSpeed config, one file at a commit the snapshot lacks) and runs
`bench/longtail.py` as a user would, in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from longtail import label_of, same, score  # noqa: E402

SCRIPT = """\
import torch
from transformers import AutoModelForCausalLM
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B", torch_dtype=torch.bfloat16)
peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear")
args = SFTConfig(
    output_dir="out",
    per_device_train_batch_size=4,
    gradient_accumulation_steps=8,
    max_length=2048,
    gradient_checkpointing=True,
    bf16=True,
)
SFTTrainer(model=model, args=args, train_dataset=None, peft_config=peft_config).train()
"""
DS_CONFIG = '{"zero_optimization": {"stage": 2}, "bf16": {"enabled": true}}\n'


def got(value, source="explicit", line=None):
    return {"value": value, "source": source, "line": line}


def absent():
    return {"value": None, "source": "absent", "line": None}


def test_label_kinds():
    assert label_of(4) == ("plain", 4)
    assert label_of("cli") == ("cli", None)
    assert label_of(None) == ("null", None)
    assert label_of({"cli_default": 2}) == ("default", 2)
    assert label_of({"cli_default": None}) == ("null", None)
    assert label_of({"derived": 64, "expr": "128 // 2"}) == ("derived", 64)


def test_values_compare_as_a_reader_would_write_them():
    assert same("lora.target_modules", "all", "all-linear")
    assert same("lora.target_modules", ["v_proj", "q_proj"], ["q_proj", "v_proj"])
    assert not same("lora.target_modules", ["q_proj"], ["q_proj", "v_proj"])
    assert same("deepspeed.config", "ds_config_zero2.json", "/runs/x/ds_config_zero2.json")
    assert same("model_id", "../Meta-Llama-3-8B-Instruct/", "../Meta-Llama-3-8B-Instruct")
    assert same("per_device_train_batch_size", 4, 4.0)
    assert not same("gradient_checkpointing", True, 1)


def test_a_value_counts_only_when_llmmem_says_it_read_it():
    values = {
        "per_device_train_batch_size": got(8, "default"),
        "gradient_accumulation_steps": got(4, "cli-default", 12),
        "max_seq_length": got(1024, "assumed"),
        "gradient_checkpointing": got(False, "default"),
    }
    results = {
        r.field: r
        for r in score(
            {
                "per_device_train_batch_size": 8,  # right value, but only the framework default
                "gradient_accumulation_steps": {"cli_default": 4},
                "max_seq_length": "cli",  # not scored
                "gradient_checkpointing": None,  # nothing claimed: right
            },
            values,
        )
    }
    assert not results["per_device_train_batch_size"].correct
    assert results["gradient_accumulation_steps"].correct
    assert results["gradient_accumulation_steps"].label == "default"
    assert results["max_seq_length"].label == "cli"
    assert results["gradient_checkpointing"].correct


def test_groups_and_deepspeed_are_scored_per_key():
    values = {
        "lora": got(True),
        "lora.r": got(16),
        "lora.alpha": got(16),
        "quantization": got(False, "absent"),
        "deepspeed.stage": got(3, "config"),
        "deepspeed.config": got("ds_z3.json"),
    }
    for key in (
        "lora.dropout",
        "lora.target_modules",
        "quantization.bits",
        "quantization.quant_type",
        "quantization.double_quant",
    ):
        values[key] = absent()
    results = score({"lora": {"r": 16, "alpha": 32}, "quantization": None, "deepspeed": 3}, values)
    verdict = {r.field: r.correct for r in results}
    assert verdict == {
        "lora": True,
        "lora.r": True,
        "lora.alpha": False,
        "quantization": True,
        "deepspeed": True,
    }


@pytest.fixture
def snapshot(tmp_path):
    """<mirror>/someone+proj/repo: a git checkout with two files in one commit."""
    work = tmp_path / "mirror" / "someone+proj" / "repo"
    work.mkdir(parents=True)
    (work / "train.py").write_text(SCRIPT, encoding="utf-8")
    (work / "ds_zero2.json").write_text(DS_CONFIG, encoding="utf-8")
    run = {"cwd": work, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q"], **run)
    subprocess.run(["git", "add", "."], **run)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"], **run
    )
    commit = subprocess.run(["git", "rev-parse", "HEAD"], text=True, **run).stdout.strip()
    return tmp_path / "mirror", commit


def test_the_bench_rebuilds_scores_and_lists_what_is_missing(tmp_path, snapshot):
    mirror, commit = snapshot
    rows = [
        {
            "repo": "someone/proj",
            "path": "train.py",
            "commit": commit,
            "kind": "python",
            "framework": "trl",
            "trains": True,
            "names_model": True,
            "hard": "plain",
            "expected": {
                "model_id": "Qwen/Qwen2.5-0.5B",
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 16,  # the file says 8: one miss
                "lora": {"r": 16, "alpha": 32, "target_modules": "all-linear"},
                "precision": "bf16",
            },
        },
        {
            "repo": "someone/proj",
            "path": "ds_zero2.json",
            "commit": commit,
            "kind": "json",
            "framework": "deepspeed",
            "trains": False,
            "names_model": False,
            "hard": "alone",
            "expected": {"deepspeed": 2},
        },
        {
            "repo": "someone/proj",
            "path": "gone.py",
            "commit": commit,
            "kind": "python",
            "framework": "hf",
            "trains": True,
            "names_model": False,
            "hard": "not there",
            "expected": {},
        },
    ]
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    out = tmp_path / "out.json"
    cache = tmp_path / "cache"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "longtail.py"),
            "--manifest",
            str(manifest),
            "--mirror",
            str(mirror),
            "--cache",
            str(cache),
            "--json",
            str(out),
            "--jobs",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "| files in the manifest | 3 |" in text
    assert "| tracebacks | 0 |" in text
    assert "missing: someone/proj/gone.py" in text
    assert "| training files with an estimate | 1/1 (100%) |" in text
    assert (
        "| someone/proj/train.py | gradient_accumulation_steps | 11 | 16 | 8 [explicit] |" in text
    )
    # the cache holds the snapshot's bytes and a marker that ends llmmem's upward search there
    assert (cache / "someone+proj" / "train.py").read_text(encoding="utf-8") == SCRIPT
    assert (cache / "someone+proj" / ".git").is_file()
    data = json.loads(out.read_text(encoding="utf-8"))
    assert [m["path"] for m in data["missing"]] == ["gone.py"]
    fields = {f["field"]: f["correct"] for f in data["files"][0]["fields"]}
    assert fields["per_device_train_batch_size"] and fields["lora.alpha"]
    assert not fields["gradient_accumulation_steps"]
    assert data["files"][1]["fields"][0] == {
        "field": "deepspeed",
        "label": "plain",
        "expected": 2,
        "got": 2,
        "source": "explicit",
        "line": data["files"][1]["fields"][0]["line"],
        "found": True,
        "correct": True,
    }

"""llmmem inside the run: preflight of the live trainer, the first steps measured against it, and
the run recorded for later bands. Real HF Trainer steps on CPU with a tiny Llama, each in its own
process (as a user's script runs); llmmem's CPU meter stands in for CUDA's counters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
TINY = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    max_position_embeddings=256,
)

HEAD = f"""
import json, sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

torch.manual_seed(0)
if not Path("tiny-llama/config.json").exists():  # a checkpoint of its own, saved once
    LlamaForCausalLM(LlamaConfig(**{TINY!r})).save_pretrained("tiny-llama")
model = LlamaForCausalLM.from_pretrained("tiny-llama")


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        ids = torch.randint(0, 1000, (64,))
        return {{"input_ids": ids, "labels": ids.clone()}}
"""


def run_script(folder: Path, body: str) -> subprocess.CompletedProcess[str]:
    (folder / ".git").mkdir(exist_ok=True)  # the project root: the calibration file lands here
    script = folder / "train.py"
    script.write_text(HEAD + textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )


def measured_gap(stderr: str) -> float:
    found = re.search(r"llmmem: measured .* predicted .* \(([-+]\d+\.\d)%\)", stderr)
    assert found, stderr[-3000:]
    return float(found.group(1))


def rows(folder: Path) -> list[dict]:
    path = folder / ".llmmem" / "calibration.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


TRAINER = """
from llmmem import LlmmemCallback
{before}
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, max_steps=3,
                         use_cpu=True, report_to=[], save_strategy="no", logging_steps=100,
                         {arguments})
callback = LlmmemCallback(gpu="A100-80GB", meter="cpu")
Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[callback]).train()
"""

LORA = """
from peft import LoraConfig, get_peft_model
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                         task_type="CAUSAL_LM"))
"""


@pytest.mark.parametrize(
    ("before", "arguments", "method"),
    [
        ("", "", "full"),
        (LORA, "bf16=True, gradient_checkpointing=True", "lora"),
    ],
    ids=["full-fp32", "lora-bf16-checkpointing"],
)
def test_the_callback_predicts_measures_and_records(
    tmp_path: Path, before: str, arguments: str, method: str
) -> None:
    proc = run_script(tmp_path, TRAINER.format(before=before, arguments=arguments))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "llmmem preflight: tiny-llama" in proc.stderr  # before the first step
    assert f", {method}, batch 4 x 64 tokens" in proc.stderr
    assert abs(measured_gap(proc.stderr)) <= 5.0
    (row,) = rows(tmp_path)
    assert row["key"] == f"A100-80GB/hf/{method}/1 GPU"
    assert row["ratio_from"] == "allocated"
    assert 0.95 <= row["device_ratio"] <= 1.05
    assert row["for"] == str(tmp_path / "train.py")
    # the next explain of the same script and GPU takes its band from the recorded run
    explained = subprocess.run(
        [str(BIN / "llmmem"), "explain", "train.py", "--gpu", "A100-80GB", "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    report = json.loads(explained.stdout)
    assert "band from 1 local run" in json.dumps(report), explained.stdout[-2000:]


SFT_TRAINER = """
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer
from llmmem import LlmmemCallback
{before}
# a word-level tokenizer made here (no download) and rows already tokenized, 60 tokens each
backend = Tokenizer(models.WordLevel(vocab={{f"w{{i}}": i for i in range(1000)}}, unk_token="w1"))
backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0", eos_token="w2",
                                    unk_token="w1")
data = Dataset.from_dict({{"input_ids": [[3 + (7 * i + j) % 997 for j in range(60)]
                                         for i in range(16)]}})
args = SFTConfig(output_dir="out", per_device_train_batch_size=4, max_steps=3, max_length=60,
                 use_cpu=True, report_to=[], save_strategy="no", logging_steps=100,
                 {arguments})
callback = LlmmemCallback(gpu="A100-80GB", meter="cpu")
SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
           callbacks=[callback]).train()
print("PREDICTED", callback.preflight.budget.allocated_peak_bytes)
print("NOTES", callback.preflight.budget.notes)
"""


@pytest.mark.parametrize(
    ("before", "arguments", "method"),
    [
        ("", "bf16=False, gradient_checkpointing=False", "full"),
        (LORA, "bf16=True, gradient_checkpointing=True", "lora"),
    ],
    ids=["full-fp32", "lora-bf16-checkpointing"],
)
def test_trl_sft_trainer_is_predicted_as_its_release_runs_it(
    tmp_path: Path, before: str, arguments: str, method: str
) -> None:
    """TRL 1.16's SFTTrainer (the tests' pin) takes its loss through TRL's fused LM head: on
    this CPU, without Triton, a (236, 32768) tile buffer for 4 rows × 59 scored positions and
    the fold's fp32 tiles, where the HF Trainer's step holds the (4, 60, 1000) logits. The
    preflight sizes the step as this release runs it here, and the first steps measured read
    within 5% of it; the run is recorded as the HF Trainer's class."""
    import trl

    assert trl.__version__ == "1.16.0"  # the release these shapes were read in
    proc = run_script(tmp_path, SFT_TRAINER.format(before=before, arguments=arguments))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "llmmem preflight: tiny-llama" in proc.stderr
    assert f", {method}, batch 4 x 60 tokens" in proc.stderr
    assert abs(measured_gap(proc.stderr)) <= 5.0
    notes = proc.stdout.split("NOTES", 1)[1]
    assert "from TRL's fused LM head" in notes and "no Triton on this device" in notes
    # the fused head's buffer alone (4 B or, under bf16 autocast, 2 B × 236 × 32768) is more
    # than the HF Trainer's whole logits and loss (12 B × 240 × 1000)
    predicted = int(proc.stdout.split("PREDICTED", 1)[1].split()[0])
    assert predicted > 2 * 236 * 32768 > 12 * 240 * 1000
    (row,) = rows(tmp_path)
    assert row["key"] == f"A100-80GB/hf/{method}/1 GPU"
    assert 0.95 <= row["device_ratio"] <= 1.05


def test_preflight_raises_before_any_step_with_what_would_fit(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import llmmem
        steps = []
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=64, max_steps=2,
                                 use_cpu=True, report_to=[], save_strategy="no")
        trainer = Trainer(model=model, args=args, train_dataset=Rows())
        trainer.add_callback(type("Count", (__import__("transformers").TrainerCallback,),
                                  {"on_step_begin": lambda self, *a, **k: steps.append(1)})())
        try:
            llmmem.preflight(trainer, gpu="0.05GiB", on_oom="raise")
        except llmmem.WillNotFit as err:
            print("RAISED", err.gpu, err.predicted_bytes > err.capacity_bytes, err.fixes)
            print("MESSAGE", err)
        else:
            trainer.train()
        print("STEPS", len(steps))
        fitting = llmmem.preflight(trainer, gpu="24GiB", on_oom="raise")
        print("FITS", fitting.fits)
        """,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "RAISED" in out and "True" in out.split("RAISED")[1].splitlines()[0]
    assert "STEPS 0" in out  # raised before step one
    assert "What would fit:" in out
    assert "FITS True" in out


def test_watch_measures_a_plain_loop(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import llmmem
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        loader = torch.utils.data.DataLoader(Rows(), batch_size=2)
        first = next(iter(loader))
        with llmmem.watch(model, optimizer, batch=first, gpu="A100-80GB", meter="cpu") as run:
            for step, batch in enumerate(loader):
                loss = model(**batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if step == 2:
                    break
        print("WATCHED", run.steps, run.row is not None)
        """,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "llmmem preflight: tiny-llama" in proc.stderr
    assert ", full, batch 2 x 64 tokens" in proc.stderr
    assert abs(measured_gap(proc.stderr)) <= 5.0
    assert "WATCHED 2 True" in proc.stdout
    (row,) = rows(tmp_path)
    assert row["key"] == "A100-80GB/hf/full/1 GPU"


def test_importing_llmmem_stays_cheap() -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import llmmem; llmmem.__version__"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()}
    assert "llmmem" in imported
    assert not imported & {"torch", "transformers", "pydantic", "rich"}, imported


@pytest.fixture(scope="module")
def axolotl_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """axolotl's own package (its plugin loader and BasePlugin), without its training stack."""
    target = tmp_path_factory.mktemp("axolotl")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         "axolotl==0.19.0", "addict==2.4.0"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"axolotl 0.19.0 could not be installed from the package index: {proc.stderr}")
    return target


def test_the_axolotl_plugin_is_loaded_by_axolotl_and_records_against_its_yaml(
    tmp_path: Path, axolotl_library: Path
) -> None:
    config = tmp_path / "qlora.yml"
    config.write_text(
        "base_model: ./tiny-llama\nplugins:\n  - llmmem.integrations.axolotl.LlmmemPlugin\n"
        "llmmem_gpu: A100-80GB\nllmmem_meter: cpu\nmicro_batch_size: 4\nsequence_len: 64\n"
    )
    body = f"""
    import yaml
    from axolotl.integrations.base import PluginManager
    from axolotl.utils.dict import DictDefault
    cfg = DictDefault(yaml.safe_load(open({str(config)!r})))
    cfg.axolotl_config_path = {str(config)!r}
    manager = PluginManager.get_instance()
    for name in cfg.plugins:
        manager.register(name)
    print("ARGS", manager.get_input_args())
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, max_steps=3,
                             use_cpu=True, report_to=[], save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=Rows())
    for callback in manager.add_callbacks_post_trainer(cfg, trainer):
        trainer.add_callback(callback)
    trainer.train()
    """
    env_path = f"{axolotl_library}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    (tmp_path / ".git").mkdir()
    script = tmp_path / "train.py"
    script.write_text(HEAD + textwrap.dedent(body))
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**ENV, "PYTHONPATH": env_path},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "llmmem.integrations.axolotl.LlmmemArgs" in proc.stdout
    assert "llmmem preflight: tiny-llama" in proc.stderr
    assert abs(measured_gap(proc.stderr)) <= 5.0
    (row,) = rows(tmp_path)
    assert row["for"] == str(config)  # the run is recorded against the YAML axolotl started with

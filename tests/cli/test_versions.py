"""The releases a file runs with: read from its environment's installed distributions (without
importing them), else the workspace's requirement and lock files, else the tests' pins; each
says where it came from, and the budget's version rules follow them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmmem.versions import (
    RUN_ENV_VARIABLE,
    TESTED_RELEASES,
    allows,
    find_versions,
    pinned,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qlora_sft.py"


@pytest.fixture(autouse=True)
def _no_configured_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUN_ENV_VARIABLE, raising=False)


def _workspace(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()  # the workspace root: the search stops here
    return tmp_path


def _fake_venv(folder: Path, installed: dict[str, str]) -> Path:
    venv = folder / ".venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for name, version in installed.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n"
        )
    return venv


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != RUN_ENV_VARIABLE}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "llmmem", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def test_the_tests_pins_are_the_constraints_file() -> None:
    pins = {}
    for line in (ROOT / "tests" / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip()] = version.strip()
    for library, version in TESTED_RELEASES.items():
        assert pins[library] == version


def test_requirements_pin_names_the_release_and_its_file(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "requirements.txt").write_text(
        "# training\n-r base.txt\ntransformers==4.44.0  # MoE experts as nn.Linear\n"
        "torch>=2.1\npeft[dev] == 0.12.0 ; python_version >= '3.9'\n"
    )
    found = find_versions(ws / "train.py")
    assert found["transformers"].label == "transformers 4.44.0 (requirements.txt)"
    assert found["transformers"].line == 2
    assert found["peft"].version == "0.12.0"
    # a range that holds the tests' release: that release, saying so
    assert found["torch"].version == TESTED_RELEASES["torch"]
    assert "requirements.txt" in found["torch"].source
    # not named anywhere: the tests' pin; TRL and torchtune are not pinned, so unknown
    assert found["deepspeed"].source == "the tests' pin"
    assert "trl" not in found and "torchtune" not in found


def test_a_range_that_excludes_the_tests_release_gives_its_lowest(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "requirements-train.txt").write_text("transformers>=4.40,<5\n")
    found = find_versions(ws)
    assert found["transformers"].version == "4.40"
    assert "lowest" in found["transformers"].source


def test_lock_files_and_pyproject(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "uv.lock").write_text(
        'version = 1\n\n[[package]]\nname = "transformers"\nversion = "4.46.3"\n'
        'source = { registry = "https://pypi.org/simple" }\n\n'
        '[[package]]\nname = "trl"\nversion = "0.12.1"\n'
    )
    (ws / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["transformers>=4.40", "torch==2.4.1"]\n'
        '[tool.poetry.dependencies]\nbitsandbytes = "^0.42.0"\n'
    )
    found = find_versions(ws / "sub" / "train.py")
    # the lock file is trusted before pyproject's range
    assert found["transformers"].label == "transformers 4.46.3 (uv.lock)"
    assert found["trl"].version == "0.12.1"
    assert found["torch"].label == "torch 2.4.1 (pyproject.toml)"
    # Poetry's ^0.42.0 is >=0.42.0,<1: the tests' 0.50.2 is within it
    assert found["bitsandbytes"].version == TESTED_RELEASES["bitsandbytes"]


def test_poetry_lock_and_conda_environment(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "poetry.lock").write_text(
        '[[package]]\nname = "peft"\nversion = "0.13.2"\ndescription = ""\n'
    )
    (ws / "environment.yml").write_text(
        "name: ft\nchannels: [pytorch]\ndependencies:\n  - python=3.11\n"
        "  - pytorch::pytorch=2.3.1=py3.11_cuda12.1_cudnn8_0\n  - pip:\n"
        "    - bitsandbytes==0.42.0\n    - transformers~=4.41.0\n"
    )
    found = find_versions(ws)
    assert found["peft"].label == "peft 0.13.2 (poetry.lock)"
    assert found["torch"].label == "torch 2.3.1 (environment.yml)"
    assert found["bitsandbytes"].version == "0.42.0"
    assert found["transformers"].version == "4.41.0"


def test_the_environment_beside_the_file_wins(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "requirements.txt").write_text("transformers==4.44.0\npeft==0.10.0\n")
    _fake_venv(ws, {"transformers": "4.48.1", "torch": "2.4.1+cu121", "torchtune": "0.6.1"})
    found = find_versions(ws / "scripts" / "train.py")
    assert found["transformers"].label == "transformers 4.48.1 (../.venv)"
    assert found["transformers"].kind == "environment"
    assert found["torch"].release == "2.4"
    assert found["torchtune"].version == "0.6.1"
    # not installed there: the next source
    assert found["peft"].label == "peft 0.10.0 (requirements.txt)"


def test_the_installed_environment_is_read_without_importing_it() -> None:
    """This interpreter's own environment, named as the configured one: the versions equal
    what importlib.metadata says, and torch is never imported."""
    code = (
        "import sys, json\n"
        "from llmmem.versions import find_versions\n"
        f"found = find_versions({str(ROOT)!r}, environment=sys.executable)\n"
        "print(json.dumps({'versions': {k: v.to_dict() for k, v in found.items()},"
        " 'imported': sorted(m for m in ('torch', 'transformers', 'peft', 'bitsandbytes')"
        " if m in sys.modules)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    report = json.loads(out.stdout)
    assert report["imported"] == []
    from importlib.metadata import version

    for library in ("torch", "transformers", "peft", "bitsandbytes"):
        item = report["versions"][library]
        assert item["kind"] == "environment"
        assert item["version"] == version(library)


def test_specifiers() -> None:
    assert pinned("==4.44.0") == "4.44.0"
    assert pinned(">=4.40,<5") is None
    assert allows(">=4.40,<5", "4.48.1") and not allows(">=4.40,<5", "5.0.0")
    assert allows("~=4.41.0", "4.41.3") and not allows("~=4.41.0", "4.42.0")
    assert allows("==4.*", "4.9") and not allows("!=4.44.0", "4.44.0")


MIXTRAL_SCRIPT = EXAMPLE.read_text().replace(
    "meta-llama/Llama-3.1-8B", "mistralai/Mixtral-8x7B-v0.1"
)


def test_explain_uses_the_requirements_release_for_the_moe_rule(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    script = ws / "train.py"
    assert "Mixtral" in MIXTRAL_SCRIPT
    script.write_text(MIXTRAL_SCRIPT)
    modern = json.loads(_run("explain", str(script), "--format", "json", cwd=ws).stdout)
    (ws / "requirements.txt").write_text("transformers==4.44.0\n")
    older = json.loads(_run("explain", str(script), "--format", "json", cwd=ws).stdout)
    assert older["versions"]["transformers"]["label"] == "transformers 4.44.0 (requirements.txt)"
    assert modern["versions"]["transformers"]["kind"] != "workspace"
    # before transformers 5 the experts are nn.Linear layers that bitsandbytes quantizes
    assert any("4.44 builds each expert from nn.Linear" in n for n in older["budget"]["notes"])
    assert older["budget"]["device_total_bytes"] < 0.6 * modern["budget"]["device_total_bytes"]
    text = _run("explain", str(script), cwd=ws).stdout
    assert "transformers 4.44.0 (requirements.txt)" in " ".join(text.split())


def test_estimate_reads_the_current_folder_and_the_flag_wins(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "requirements.txt").write_text("transformers==4.44.0\n")
    args = ("estimate", "--model", "mistralai/Mixtral-8x7B-v0.1", "--method", "qlora")
    found = json.loads(_run(*args, "--format", "json", cwd=ws).stdout)
    setup = found["setup"]
    assert setup["values"]["transformers_version"] == "4.44"
    assert setup["provenance"]["transformers_version"] == "requirements.txt"
    assert setup["versions"]["transformers"]["label"] == "transformers 4.44.0 (requirements.txt)"
    flagged = json.loads(
        _run(*args, "--versions", "transformers=5.2", "--format", "json", cwd=ws).stdout
    )
    assert flagged["setup"]["values"]["transformers_version"] == "5.2"
    assert flagged["setup"]["provenance"]["transformers_version"] == "flag"
    assert flagged["device_total_bytes"] > found["device_total_bytes"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_fifo_in_place_of_a_requirement_file_is_not_read(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    for name in ("requirements.txt", "pyproject.toml", "uv.lock"):
        os.mkfifo(ws / name)
    venv = _fake_venv(ws, {"peft": "0.13.2"})
    os.mkfifo(venv / "lib" / "python3.11" / "site-packages" / "trl-0.12.1.dist-info")
    code = (
        "from llmmem.versions import find_versions\n"
        f"found = find_versions({str(ws / 'train.py')!r})\n"
        "print(found['peft'].label, found['transformers'].source)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.split("\n")[0] == "peft 0.13.2 (.venv) the tests' pin"


def test_no_dtype_loads_fp32_before_transformers_5(tmp_path: Path) -> None:
    """from_pretrained without dtype=: transformers 5 loads the checkpoint's bf16, 4.x loads
    torch's default fp32 (its `torch_dtype` default before "auto" became the default)."""
    ws = _workspace(tmp_path)
    script = ws / "train.py"
    script.write_text(
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        'model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")\n'
        'args = TrainingArguments(output_dir="out", bf16=True, per_device_train_batch_size=2)\n'
        "Trainer(model=model, args=args).train()\n"
    )
    modern = json.loads(_run("explain", str(script), "--format", "json", cwd=ws).stdout)
    (ws / "requirements.txt").write_text("transformers==4.46.3\n")
    older = json.loads(_run("explain", str(script), "--format", "json", cwd=ws).stdout)
    assert any(
        "transformers 5 loads the checkpoint's bfloat16" in n for n in modern["budget"]["notes"]
    )
    assert any(
        "4.46 loads the checkpoint's bfloat16 weights as fp32" in n
        for n in older["budget"]["notes"]
    )
    # fp32 weights, gradients and AdamW states: twice the bytes of the bf16 ones
    assert older["budget"]["components"]["weights"] == 2 * modern["budget"]["components"]["weights"]


def test_requirements_included_with_r_and_c(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "requirements").mkdir()
    (ws / "requirements.txt").write_text(
        "-r requirements/base.txt\n-c constraints.txt\naccelerate\n"
    )
    (ws / "requirements" / "base.txt").write_text("numpy\ntransformers==4.45.2\n")
    (ws / "constraints.txt").write_text("torch==2.5.1\n")
    found = find_versions(ws / "train.py")
    assert found["transformers"].label == "transformers 4.45.2 (base.txt)"
    assert found["transformers"].path == str(ws / "requirements" / "base.txt")
    assert found["torch"].label == "torch 2.5.1 (constraints.txt)"


QLORA_SFT_SCRIPT = """\
import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from trl import SFTConfig, SFTTrainer

bnb = BitsAndBytesConfig(
    load_in_4bit=True,
    bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True,
    bnb_4bit_compute_dtype=torch.bfloat16,
)
model = AutoModelForCausalLM.from_pretrained(
    "mistralai/Mistral-7B-v0.1", quantization_config=bnb, dtype=torch.bfloat16
)
peft_config = LoraConfig(r=16, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj"])
args = SFTConfig(output_dir="out", bf16=True, per_device_train_batch_size=4, max_length=4096)
trainer = SFTTrainer(
    model=model, args=args, train_dataset=load_dataset("x")["train"], peft_config=peft_config
)
trainer.train()
"""


def test_the_trl_release_decides_how_sfttrainer_prepares_a_kbit_model(tmp_path: Path) -> None:
    """TRL up to 0.25 prepares the model for k-bit training (norms fp32) and casts embeddings
    and head back to bf16; from 0.26 it does not prepare and casts the adapters to bf16."""
    ws = _workspace(tmp_path)
    script = ws / "train.py"
    script.write_text(QLORA_SFT_SCRIPT)
    unknown = json.loads(_run("explain", str(script), "--format", "json", cwd=ws).stdout)
    (ws / "requirements.txt").write_text("trl==0.21.0\n")
    older = json.loads(_run("explain", str(script), "--format", "json", cwd=ws).stdout)
    (ws / "requirements.txt").write_text("trl==0.29.1\n")
    newer = json.loads(_run("explain", str(script), "--format", "json", cwd=ws).stdout)
    assert not any("SFTTrainer on a k-bit model" in n for n in unknown["budget"]["notes"])
    assert any("trl 0.21.0 SFTTrainer" in n for n in older["budget"]["notes"])
    assert any("adapters are cast to bf16" in n for n in newer["budget"]["notes"])
    # the preparation upcasts the norms to fp32: more weight bytes under 0.21 than under 0.29
    assert older["budget"]["components"]["weights"] > newer["budget"]["components"]["weights"]

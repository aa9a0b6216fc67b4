"""No command reaches the network unless the user said it may (`--hub`).

Each case runs an installed command in a subprocess under `strace -f -e trace=connect`, which
sees every process it starts (the step's process of `verify` too, which `python -I` keeps
out of reach of a sitecustomize on PYTHONPATH), and counts the connections to an IPv4 or IPv6
address (a local socket of the system's own, AF_UNIX, is not the network). The hub they would
ask is a socket this test listens on (HF_ENDPOINT), so a lookup is seen there too, whatever
the machine's DNS; the caches are empty folders, so nothing is answered from an earlier run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")

BIN = Path(sys.executable).parent


def installed(name: str) -> str:
    return str(BIN / name) if (BIN / name).exists() else shutil.which(name) or name


LLMMEM, LINT = installed("llmmem"), installed("llmmem-lint")

UNKNOWN = "acme-research/tiny-decoder-2024"  # a hub id in no catalog and no cache
TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
SCRIPT = """import torch
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("{model}", dtype=torch.bfloat16)
args = TrainingArguments(
    output_dir="out", per_device_train_batch_size=2, bf16=True, optim="adamw_torch"
)
# llmmem: seq=64
"""
# what keeps transformers and huggingface_hub offline: left out, so that only llmmem sets them
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


@dataclass
class Run:
    proc: subprocess.CompletedProcess[str]
    connections: list[str]  # strace's lines of connect() to an AF_INET or AF_INET6 address
    hub_contacted: bool  # whether something connected to the listening hub


@pytest.fixture
def hub() -> Iterator[socket.socket]:
    """A hub that listens and never answers: a connection shows in its backlog."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener
    listener.close()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "local.py").write_text(SCRIPT.format(model="./tiny"))
    (tmp_path / "unknown.py").write_text(SCRIPT.format(model=UNKNOWN))
    return tmp_path


def run(
    command: list[str], project: Path, hub: socket.socket, tmp: Path, timeout: float = 180
) -> Run:
    log = tmp / "connect.log"
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_VARIABLES}
    env.update(
        HF_ENDPOINT=f"http://127.0.0.1:{hub.getsockname()[1]}",
        HF_HOME=str(tmp / "hf-home"),  # an empty Hugging Face cache
        LLMMEM_CACHE_DIR=str(tmp / "llmmem-cache"),  # no earlier lookup, found or failed
    )
    strace = [str(shutil.which("strace")), "-f", "-qq", "-e", "trace=connect", "-o", str(log)]
    proc = subprocess.run(
        [*strace, *command],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    lines = log.read_text().splitlines() if log.exists() else []
    connections = [line for line in lines if re.search(r"sa_family=AF_INET6?\b", line)]
    hub.setblocking(False)
    try:
        accepted, _ = hub.accept()
    except BlockingIOError:
        contacted = False
    else:
        accepted.close()
        contacted = True
    return Run(proc, connections, contacted)


@pytest.mark.parametrize(
    "command",
    [
        [LLMMEM, "estimate", "--model", UNKNOWN, "--gpu", "A100-80GB"],
        [LLMMEM, "explain", "unknown.py"],
        [LINT, "unknown.py"],
        [LLMMEM, "verify", "unknown.py", "--simulate"],
        [LLMMEM, "verify", "local.py", "--simulate"],
    ],
    ids=["estimate", "explain", "lint", "verify-unknown", "verify-local"],
)
def test_no_connection_without_hub(
    command: list[str], project: Path, hub: socket.socket, tmp_path_factory: pytest.TempPathFactory
) -> None:
    result = run(command, project, hub, tmp_path_factory.mktemp("run"))
    assert "Traceback" not in result.proc.stderr, result.proc.stderr
    assert result.connections == [], result.connections
    assert not result.hub_contacted


def test_estimate_says_that_hub_would_look_an_unknown_model_up(
    project: Path, hub: socket.socket, tmp_path_factory: pytest.TempPathFactory
) -> None:
    result = run(
        [LLMMEM, "estimate", "--model", UNKNOWN], project, hub, tmp_path_factory.mktemp("r")
    )
    assert result.proc.returncode == 2
    lines = result.proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"llmmem: error: unknown model '{UNKNOWN}'")
    assert lines[0].endswith("--hub looks it up on the Hugging Face Hub"), lines[0]


def test_estimate_with_hub_asks_the_hub(
    project: Path, hub: socket.socket, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The other side of the consent, and proof that this test would see a lookup."""
    command = [LLMMEM, "estimate", "--model", UNKNOWN, "--hub"]
    result = run(command, project, hub, tmp_path_factory.mktemp("run"))
    assert result.hub_contacted
    assert result.connections
    assert result.proc.returncode == 2  # the hub never answered
    assert "no answer within" in result.proc.stderr


def test_hub_and_offline_together_are_a_usage_error(
    project: Path, hub: socket.socket, tmp_path_factory: pytest.TempPathFactory
) -> None:
    command = [LLMMEM, "estimate", "--model", UNKNOWN, "--hub", "--offline"]
    result = run(command, project, hub, tmp_path_factory.mktemp("run"))
    assert result.proc.returncode == 2
    assert result.proc.stderr.strip().splitlines() == [
        "llmmem: error: --hub and --offline: give one of them"
    ]
    assert not result.hub_contacted


def test_the_steps_process_runs_offline_unless_hub_is_given(
    project: Path, hub: socket.socket, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The environment the step's process was started with, as the kernel saw it: the hub's
    offline switches and transformers' hub kernels off; with --hub, the user's own."""
    strace = [str(shutil.which("strace")), "-f", "-qq", "-v", "-s", "8192", "-e", "trace=execve"]
    seen = {}
    for flags in ([], ["--hub"]):
        log = tmp_path_factory.mktemp("exec") / "exec.log"
        command = [*strace, "-o", str(log), LLMMEM, "verify", "local.py", "--simulate", *flags]
        env = {k: v for k, v in os.environ.items() if k not in OFFLINE_VARIABLES}
        env["USE_HUB_KERNELS"] = "1"
        proc = subprocess.run(
            command, cwd=project, capture_output=True, text=True, timeout=180, env=env
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        worker = [line for line in log.read_text().splitlines() if "llmmem.verify.worker" in line]
        assert worker, log.read_text()[-2000:]
        seen[bool(flags)] = worker[0]
    for variable in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "USE_HUB_KERNELS=0"):
        assert f'"{variable}"' in seen[False], variable
        assert f'"{variable}"' not in seen[True], variable
    assert '"USE_HUB_KERNELS=1"' in seen[True]

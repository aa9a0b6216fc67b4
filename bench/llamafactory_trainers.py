"""The preference budgets against LLaMA-Factory's own trainers, run on the CPU.

TABLE

    python bench/llamafactory_trainers.py [--size small|medium] [--stage dpo|orpo|simpo|kto|rm ...]
                                          [--method full|lora ...] [--shape PAIRSxTOKENS]
                                          [--checkpointing on|off ...] [--measured FILE]
                                          [--budget-rev REV]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ENV = HERE / ".llamafactory"
# llamafactory 0.9.5's pins (transformers <= 5.6.0, trl <= 0.24.0, peft 0.18.x, accelerate
# <= 1.11.0, datasets <= 4.0.0) at their newest releases; omegaconf is the one of its other
# requirements its argument parser imports (the rest serve its web UI, API and media)
RELEASES = [
    "torch==2.13.0",
    "transformers==5.6.0",
    "trl==0.24.0",
    "peft==0.18.1",
    "accelerate==1.11.0",
    "datasets==4.0.0",
    "omegaconf",
]
LLAMAFACTORY = "llamafactory==0.9.5"


def environment(wheel: str | None = None) -> Path:
    """The Python of the environment with LLaMA-Factory, made on first use. LLaMA-Factory goes in
    without its requirements (its web UI, API server and media readers are not used here)."""
    python = ENV / "bin" / "python"
    marker = ENV / "releases.txt"
    wanted = "\n".join([*RELEASES, LLAMAFACTORY])
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"making {ENV} with {', '.join(RELEASES)} and {LLAMAFACTORY} ...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(ENV)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *RELEASES], check=True)
    source = wheel or LLAMAFACTORY
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", source], check=True)
    marker.write_text(wanted)
    return python


@dataclass(frozen=True)
class Case:
    stage: str  # dpo (pref_loss sigmoid, with a reference), orpo, simpo, kto, rm
    method: str  # full or lora
    grad_ckpt: bool
    batch: int
    seq: int

    @property
    def name(self) -> str:
        return f"{self.stage} {self.method} ckpt {'on' if self.grad_ckpt else 'off'}"

    def yaml(self) -> dict[str, Any]:
        """The LLaMA-Factory YAML's settings for the case."""
        settings: dict[str, Any] = {
            "stage": "rm" if self.stage == "rm" else "kto" if self.stage == "kto" else "dpo",
            "do_train": True,
            "finetuning_type": self.method,
            "dataset": "pairs",
            "template": "empty",
            "cutoff_len": self.seq,
            "per_device_train_batch_size": self.batch,
            "gradient_accumulation_steps": 1,
            "optim": "adamw_torch",
            "bf16": False,
        }
        if self.stage in ("dpo", "orpo", "simpo"):
            settings["pref_loss"] = "sigmoid" if self.stage == "dpo" else self.stage
        if self.method == "lora":
            settings.update(lora_rank=8, lora_target="q_proj,v_proj")
        if not self.grad_ckpt:
            settings["disable_gradient_checkpointing"] = True
        return settings


def yaml_text(settings: dict[str, Any], model: str) -> str:
    def value(v: Any) -> str:
        return ("true" if v else "false") if isinstance(v, bool) else str(v)

    # a model whose config says float32 trains in fp32 under LLaMA-Factory (its compute dtype is
    # the model's); llmmem reads a LLaMA-Factory YAML without `bf16` as bf16, so say it
    lines = ["# llmmem: precision=fp32", f"model_name_or_path: {model}"]
    lines += [f"{k}: {value(v)}" for k, v in settings.items()]
    return "\n".join(lines) + "\n"


def measure(python: Path, case: Case, config: dict[str, Any]) -> dict[str, Any]:
    payload = {"yaml": case.yaml(), "config": config}
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "analyzer"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "DISABLE_VERSION_CHECK": "1",
    }
    done = subprocess.run(
        [str(python), str(HERE / "llamafactory_step.py"), json.dumps(payload)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:160]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def budget(python: Path, case: Case, config: dict[str, Any], analyzer: Path) -> dict[str, Any]:
    """llmmem's figures for the YAML, as `llmmem explain FILE --format json` gives them, with the
    releases read from the LLaMA-Factory environment."""
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
        path = Path(folder) / f"{case.stage}.yaml"
        path.write_text(yaml_text(case.yaml(), str(model)))
        env = {**os.environ, "PYTHONPATH": str(analyzer), "LLMMEM_RUN_ENV": str(python)}
        done = subprocess.run(
            [sys.executable, "-m", "llmmem", "explain", str(path), "--format", "json"],
            capture_output=True,
            text=True,
            env=env,
            cwd=folder,
            check=False,
        )
    if done.returncode != 0 or not done.stdout.strip():
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:160]}
    report = json.loads(done.stdout)
    phases = {k: v["allocated_bytes"] for k, v in report["budget"]["phases"].items()}
    moments = {k: v["moment"] for k, v in report["budget"]["phases"].items()}
    optimizer = phases.pop("optimizer_step")
    top = max(phases, key=lambda k: phases[k])
    return {
        "step": phases[top],
        "step phase": f"{top}: {moments[top]}",
        "optimizer": optimizer,
        "objective": report["plan"]["objective"]["value"],
    }


def analyzer_at(rev: str, folder: Path) -> Path:
    """llmmem's source as committed at `rev`, unpacked under `folder`."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "analyzer"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder / "analyzer"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", choices=["small", "medium"], default="medium")
    parser.add_argument("--stage", action="append", choices=["dpo", "orpo", "simpo", "kto", "rm"])
    parser.add_argument("--method", action="append", choices=["full", "lora"])
    parser.add_argument("--checkpointing", action="append", choices=["on", "off"])
    parser.add_argument(
        "--shape",
        help="pairs (kto: examples) x tokens, a multiple of 8 (default 2x128, small 2x64)",
    )
    parser.add_argument(
        "--measured",
        type=Path,
        help="a JSON file of the trainers' measurements: read when it exists, else written",
    )
    parser.add_argument(
        "--budget-rev", help="llmmem's budget as committed at this git revision (default: the tree)"
    )
    parser.add_argument(
        "--llamafactory-wheel", help="install LLaMA-Factory from this wheel (first run only)"
    )
    args = parser.parse_args(argv)
    args.shape = args.shape or ("2x128" if args.size == "medium" else "2x64")
    try:
        batch, seq = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        parser.error(f"--shape wants PAIRSxTOKENS, e.g. 2x128, got {args.shape!r}")
    if batch < 1 or seq < 8 or seq % 8:
        parser.error(f"--shape {args.shape}: at least 1 pair, tokens a multiple of 8")
    sys.path.insert(0, str(REPO / "analyzer"))
    from llmmem.verify.preference_grid import CONFIGS

    config = CONFIGS[args.size]["llama"]
    python = environment(args.llamafactory_wheel)
    cases = [
        Case(stage, method, ckpt == "on", batch, seq)
        for stage in args.stage or ["dpo", "orpo", "simpo", "kto", "rm"]
        for method in args.method or ["full", "lora"]
        for ckpt in args.checkpointing or ["on", "off"]
    ]
    measured: dict[str, Any] = {}
    if args.measured and args.measured.exists():
        measured = json.loads(args.measured.read_text())
    with tempfile.TemporaryDirectory() as folder:
        analyzer = REPO / "analyzer"
        if args.budget_rev:
            analyzer = analyzer_at(args.budget_rev, Path(folder))
        print(
            f"{'case':20} {'step: LF':>9} {'llmmem':>8} {'error':>6}  {'optimizer: LF':>13} "
            f"{'llmmem':>8} {'error':>6}  LF's step peak at / llmmem's (MiB, {args.size} "
            f"{batch}x{seq}, fp32)"
        )
        for case in cases:
            key = f"{case.name} {args.size} {batch}x{seq}"
            if key not in measured:
                measured[key] = measure(python, case, config)
                if args.measured:
                    args.measured.write_text(json.dumps(measured, indent=1))
            got = measured[key]
            if "error" in got:
                print(f"{case.name:20} failed: {got['error']}")
                continue
            want = budget(python, case, config, analyzer)
            if "error" in want:
                print(f"{case.name:20} llmmem failed: {want['error']}")
                continue
            cells = []
            for part in ("step", "optimizer"):
                error = 100 * (want[part] - got[part]) / got[part]
                cells.append(f"{got[part] / 2**20:8.2f} {want[part] / 2**20:8.2f} {error:+6.1f}%")
            print(
                f"{case.name:20} {cells[0]}  {cells[1]:>29}  {got['step where']} / "
                f"{want['step phase']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

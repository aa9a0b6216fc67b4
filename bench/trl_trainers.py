"""The preference budgets against TRL's own trainers, run on the CPU.

`python -m llmmem.verify.grid --preference` checks the budget against steps written the way
TRL computes them. This runs the trainers themselves: TRL 0.29.1's DPOTrainer and RewardTrainer
and trl.experimental's ORPOTrainer and KTOTrainer, with accelerate and transformers as TRL's
`Trainer` drives them, on a model built from a config, in fp32 on the CPU, under llmmem's
StorageTracker (bench/trl_step.py, one case per process). The peak of the second step (forward,
backward and optimizer step) is compared with the budget's allocated peak for the same setup,
with the function TRL was in when the peak was reached.

TRL is not a dependency of llmmem: the first run makes its own environment under
`bench/.trl/` (torch, transformers, peft, accelerate and TRL at the releases below; a few
hundred MB, from the package index) and reuses it after.

    python bench/trl_trainers.py [--size small|medium] [--objective dpo|orpo|kto|reward ...]
                                 [--method full|lora ...] [--shape PAIRSxTOKENS]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ENV = HERE / ".trl"
RELEASES = [
    "torch==2.13.0",
    "transformers==5.24.0",
    "peft==0.21.2",
    "accelerate==1.15.0",
    "trl==0.29.1",
    "datasets",
]


def environment() -> Path:
    """The Python of the environment with TRL, made on first use."""
    python = ENV / "bin" / "python"
    marker = ENV / "releases.txt"
    if python.exists() and marker.exists() and marker.read_text() == "\n".join(RELEASES):
        return python
    print(f"making {ENV} with {', '.join(RELEASES)} ...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(ENV)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *RELEASES], check=True)
    marker.write_text("\n".join(RELEASES))
    return python


def measure(python: Path, case: Any, size: str) -> dict[str, Any]:
    from llmmem.verify.preference_grid import CONFIGS

    payload = {
        "objective": case.objective,
        "method": case.method,
        "batch": case.batch,
        "seq": case.seq,
        "config": CONFIGS[size][case.family],
    }
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "analyzer"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    done = subprocess.run(
        [str(python), str(HERE / "trl_step.py"), json.dumps(payload)],
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "medium"], default="small")
    parser.add_argument("--objective", action="append", choices=["dpo", "orpo", "kto", "reward"])
    parser.add_argument("--method", action="append", choices=["full", "lora"])
    parser.add_argument("--shape", default="2x64", help="pairs x tokens (default 2x64)")
    args = parser.parse_args(argv)
    try:
        batch, seq = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        parser.error(f"--shape wants PAIRSxTOKENS, e.g. 2x64, got {args.shape!r}")
    from llmmem.verify.preference_grid import Case, predict

    python = environment()
    print(f"{'case':34} {'TRL step':>10} {'budget':>10} {'error':>7}  where TRL peaked")
    for objective in args.objective or ["dpo", "orpo", "kto", "reward"]:
        for method in args.method or ["full", "lora"]:
            case = Case("llama", objective, method, batch=batch, seq=seq)
            got = measure(python, case, args.size)
            name = f"{objective} {method} {args.size} {batch}x{seq}"
            if "error" in got:
                print(f"{name:34} failed: {got['error']}")
                continue
            budget = max(predict(case, args.size).values())
            error = 100 * (budget - got["peak"]) / got["peak"]
            print(
                f"{name:34} {got['peak'] / 2**20:7.2f} MiB {budget / 2**20:6.2f} MiB "
                f"{error:+6.1f}%  {got['where']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs one of the rank-step scripts here (`*_rank_step.py`) under torchrun on CPU ranks over
gloo and reads each rank's peaks per phase (the JSON each rank writes to the output folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measured_ranks(
    script: str, ranks: int, out: Path, *, port: int, env: dict[str, str]
) -> list[dict[str, int]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(ranks),
            "--master-port",
            str(port),
            str(HERE / script),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(ranks)]

"""How fast `llmmem estimate` and `llmmem-lint` answer, cold (a new process each time) and
in-process.

    python bench/speed.py [--runs 10]

Targets: under 0.5 s cold for a bundled model (estimate) and for one script (lint), with no torch
or transformers import.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CASES = [
    ["--model", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu", "4090"],
    [
        "--model",
        "Qwen/Qwen2.5-7B-Instruct",
        "--method",
        "lora",
        "--batch",
        "4",
        "--seq",
        "2048",
        "--gpu",
        "A100-80GB",
        "--format",
        "json",
    ],
    ["--model", "google/gemma-2-9b", "--grad-ckpt", "--gpu", "H100", "--max-batch"],
]


LINT_CASES = [["examples/qlora_sft.py", "--gpu", "A100-80GB"]]


def cold_seconds(args: list[str], runs: int, command: str = "estimate") -> list[float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "llmmem", command, *args],
            check=command == "estimate",  # lint exits 1 when it has findings
            capture_output=True,
            env=env,
        )
        times.append(time.perf_counter() - start)
    return times


def in_process_seconds(args: list[str], runs: int) -> list[float]:
    import contextlib
    import io

    from llmmem.cli import main

    times = []
    for _ in range(runs):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            main(["estimate", "--offline", *args])
        times.append(time.perf_counter() - start)
    return times


def imports_torch() -> bool:
    code = (
        "import sys, contextlib, io\nfrom llmmem.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['estimate', '--offline', '--model', 'meta-llama/Llama-3.1-8B'])\n"
        "print('torch' in sys.modules or 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    print(f"{'case':<72} {'cold p50':>9} {'cold max':>9} {'warm p50':>9}")
    for case in CASES:
        cold = cold_seconds(case, args.runs)
        warm = in_process_seconds(case, args.runs)
        label = " ".join(case)[:72]
        print(
            f"{label:<72} {statistics.median(cold):>8.3f}s {max(cold):>8.3f}s "
            f"{statistics.median(warm) * 1000:>7.1f}ms"
        )
    for case in LINT_CASES:
        cold = cold_seconds(case, args.runs, command="lint")
        label = ("lint " + " ".join(case))[:72]
        print(f"{label:<72} {statistics.median(cold):>8.3f}s {max(cold):>8.3f}s {'':>9}")
    print(f"torch or transformers imported on the estimate path: {imports_torch()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

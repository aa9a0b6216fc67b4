"""DeepSpeed ZeRO plans: the core's prediction against real two-rank steps on the CPU.

Each case writes a small project (a tiny Llama config, a TrainingArguments script with
`deepspeed="ds.json"`, the ZeRO config) and runs `llmmem verify train.py --device cpu`, which
launches the ranks (two, or one) under torchrun on DeepSpeed's CPU accelerator (gloo) and
compares every rank's forward, backward and optimizer-step peak with the estimate. Needs
deepspeed installed.

    python bench/zero_grid.py                # every case, about 10 s each
    python bench/zero_grid.py z3 z2-lora     # some of them
    python bench/zero_grid.py --device cuda  # the same plans on GPUs (two of them)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from llmmem.verify.grid import SMALL_CONFIGS

SCRIPT = """import torch
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("./tiny", dtype=torch.float32)
{lora}args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=2,
    bf16=True,
    optim="adamw_torch",
    deepspeed="ds.json",{extra}
)
# llmmem: seq=128 world_size={ranks}
"""
LORA = (
    "from peft import LoraConfig, get_peft_model\n"
    "model = get_peft_model(model, LoraConfig(r=8, target_modules=['q_proj', 'v_proj']))\n"
)
AUTO = {"reduce_bucket_size": "auto"}

# name: (zero_optimization, LoRA, extra TrainingArguments[, ranks])
CASES: dict[str, tuple[dict[str, object], bool, str] | tuple[dict[str, object], bool, str, int]] = {
    "z1": ({"stage": 1}, False, ""),
    "z2": ({"stage": 2}, False, ""),
    "z2-auto": ({"stage": 2, **AUTO}, False, ""),
    "z2-overlap": ({"stage": 2, "overlap_comm": True}, False, ""),
    "z2-auto-ckpt": ({"stage": 2, **AUTO}, False, "\n    gradient_checkpointing=True,"),
    "z2-auto-accum2": ({"stage": 2, **AUTO}, False, "\n    gradient_accumulation_steps=2,"),
    "z2-lora": ({"stage": 2, **AUTO}, True, ""),
    "z3": ({"stage": 3}, False, ""),
    "z3-auto": ({"stage": 3, **AUTO}, False, ""),
    "z3-auto-ckpt": ({"stage": 3, **AUTO}, False, "\n    gradient_checkpointing=True,"),
    "z3-lora": ({"stage": 3, **AUTO}, True, ""),
    "z3-lora-ckpt": ({"stage": 3, **AUTO}, True, "\n    gradient_checkpointing=True,"),
    "z3-reuse0": ({"stage": 3, **AUTO, "stage3_max_reuse_distance": 0}, False, ""),
    # a bucket the gradients fill before backward ends, reduce-scattered several times
    "z3-bucket": ({"stage": 3, "reduce_bucket_size": 1_500_000}, False, ""),
    "z2-1rank": ({"stage": 2, **AUTO}, False, "", 1),
    "z3-1rank": ({"stage": 3, **AUTO}, False, "", 1),
}
ROWS = ("forward peak", "backward peak", "optimizer step peak", "allocated peak")


def run_case(name: str, directory: Path, device: str = "cpu") -> dict[str, object]:
    zero, lora, extra, *rest = CASES[name]
    ranks = rest[0] if rest else 2
    project = directory / name
    (project / ".git").mkdir(parents=True)
    (project / "tiny").mkdir()
    config = {**SMALL_CONFIGS["llama"], "torch_dtype": "bfloat16"}
    (project / "tiny" / "config.json").write_text(json.dumps(config))
    script = SCRIPT.format(lora=LORA if lora else "", extra=extra, ranks=ranks)
    (project / "train.py").write_text(script)
    ds = {"zero_optimization": zero, "bf16": {"enabled": "auto"}}
    (project / "ds.json").write_text(json.dumps(ds))
    proc = subprocess.run(
        [sys.executable, "-m", "llmmem", "verify", "train.py", "--device", device]
        + ["--format", "json"],
        cwd=project,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={"HF_HUB_OFFLINE": "1", **os.environ},
    )
    try:
        report: dict[str, object] = json.loads(proc.stdout)
    except ValueError:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return report


def main(argv: list[str]) -> int:
    device = "cpu"
    if "--device" in argv:
        at = argv.index("--device")
        device = argv[at + 1] if at + 1 < len(argv) else ""
        argv = argv[:at] + argv[at + 2 :]
        if device not in ("cpu", "cuda"):
            print("--device takes cpu or cuda")
            return 2
    names = argv
    chosen = names or list(CASES)
    unknown = [n for n in chosen if n not in CASES]
    if unknown:
        print(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(CASES)}")
        return 2
    header = f"{'case':16s}" + "".join(f"{row.split()[0][:9]:>18s}" for row in ROWS)
    print(header + f"{'measured peak':>16s}")
    print("-" * len(header + " " * 16))
    errors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="llmmem-zero-") as tmp:
        for name in chosen:
            report = run_case(name, Path(tmp), device)
            measured = report.get("measurement")
            if not isinstance(measured, dict) or measured.get("error"):
                why = measured.get("error") if isinstance(measured, dict) else report.get("error")
                print(f"{name:16s} could not run: {why}")
                continue
            rows = {row["what"]: row for row in report["comparison"]}  # type: ignore[union-attr]
            cells = []
            for what in ROWS:
                row = rows.get(what)
                error = row["error"] if row else None
                if error is None:
                    cells.append(f"{'—':>18s}")
                    continue
                errors.append(abs(error))
                cells.append(f"{100 * error:+17.1f}%")
            peak = measured["allocated_peak_bytes"] / 2**20
            print(f"{name:16s}" + "".join(cells) + f"{peak:13.1f} MiB")
    if errors:
        errors.sort()
        median = errors[len(errors) // 2]
        print(
            f"\n{len(chosen)} cases, {len(errors)} phase rows: median |error| "
            f"{100 * median:.1f}%, max {100 * errors[-1]:.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

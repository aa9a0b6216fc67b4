"""The preference budgets against LLaMA-Factory's own trainers, run on the CPU.

llmmem reads a LLaMA-Factory YAML (`stage: dpo|kto|rm`, `pref_loss`), but LLaMA-Factory runs
its own trainers, not TRL's. This runs LLaMA-Factory 0.9.5's CustomDPOTrainer (`pref_loss:
sigmoid` with a reference: a reference copy for full fine-tuning, the adapter disabled for LoRA;
`orpo` and `simpo` without one), CustomKTOTrainer and PairwiseTrainer (`stage: rm`), built as
its `train/<stage>/workflow.py` builds them (bench/llamafactory_step.py: `get_train_args`,
`load_model`, `create_ref_model`, the stage's collator, one case per process), two steps on the
CPU in fp32 under llmmem's StorageTracker, and compares the second step's peaks with llmmem's
figure for the same YAML, as a user gets it: `llmmem explain FILE --format json` on the YAML
(written to a temp folder, the model a folder holding the config.json; `# llmmem:
precision=fp32`, since llmmem reads a YAML without `bf16` as bf16; the releases read from the
environment below through LLMMEM_RUN_ENV). The step up to the optimizer (forward, loss and
metrics, backward) is compared with the largest of the budget's forward, reference-forward and
backward phases, the optimizer step with the budget's; AdamW is asked for foreach (the GPU's
implementation, which the budget sizes). `get_batch_logps` takes a full `log_softmax` over the
strided view `logits[:, :-1, :]`; the kernel first makes a contiguous copy of it (torch's
profiler: aten::_log_softmax → aten::contiguous → aten::clone, 62.01 MiB at medium), which a
dispatch-level counter cannot see: the step counts it beside the kernel's output.

Medium Llama (Llama-2-7B's proportions, 45M parameters, vocabulary 32000), 2 pairs (KTO: 2
examples and their KL rows) × 128 tokens, fp32, LLaMA-Factory 0.9.5 (torch 2.13.0, transformers
5.6.0, TRL 0.24.0, peft 0.18.1, accelerate 1.11.0), LoRA r 8 on q_proj and v_proj, MiB: the step
up to the optimizer, LLaMA-Factory's, llmmem's before 600deb2 (TRL's trainers) and after
6c832b1 (LLaMA-Factory's own DPO trainer from 600deb2, its KTO trainer and rm stage from
78103c7, the rm stage's unread cross-entropy from 6c832b1), then the optimizer step with llmmem's
error before and after, and the function
LLaMA-Factory's step peaked in:

    case                 LF   before  error    after  error  optimizer before after peak at
    dpo full ckpt on  1011.22   964.60  -4.6%  1011.11  -0.0%   1039.61  -0.0% -0.0% get_batch_logps
    dpo full ckpt off 1090.30  1043.66  -4.3%  1090.17  -0.0%   1039.61  -0.0% -0.0% get_batch_logps
    dpo lora ckpt on   490.16   443.54  -9.5%   490.05  -0.0%    174.54  -0.0% -0.0% get_batch_logps
    dpo lora ckpt off  545.61   499.98  -8.4%   546.49  +0.2%    174.54  -0.0% -0.0% get_batch_logps
    orpo full ckpt on  713.42   774.85  +8.6%   713.33  -0.0%    866.34  -0.0% -0.0% get_batch_logps
    orpo full ckpt off 792.50   853.91  +7.7%   792.39  -0.0%    866.34  -0.0% -0.0% get_batch_logps
    orpo lora ckpt on  365.63   427.06 +16.8%   365.54  -0.0%    174.54  -0.0% -0.0% get_batch_logps
    orpo lora ckpt off 421.08   483.50 +14.8%   421.98  +0.2%    174.54  -0.0% -0.0% get_batch_logps
    simpo (every case as orpo's: the same step, the same figures)
    kto full ckpt on   883.44   866.34  -1.9%   883.34  -0.0%   1039.61  -0.0% -0.0% get_batch_logps
    kto full ckpt off  922.98   876.12  -5.1%   922.87  -0.0%   1039.61  -0.0% -0.0% get_batch_logps
    kto lora ckpt on   363.39   316.53 -12.9%   363.29  -0.0%    174.54  -0.0% -0.0% get_batch_logps
    kto lora ckpt off  391.11   344.75 -11.9%   391.50  +0.1%    174.54  -0.0% -0.0% get_batch_logps
    rm full ckpt on    528.90   443.08 -16.2%   528.06  -0.2%    616.35 -10.1% -0.0% compute_loss
    rm full ckpt off   607.98   443.08 -27.1%   607.12  -0.1%    616.35 -10.1% -0.0% compute_loss
    rm lora ckpt on    307.12   139.69 -54.5%   306.27  -0.3%    174.55 -35.8% -0.0% compute_loss
    rm lora ckpt off   363.57   181.02 -50.2%   362.71  -0.2%    174.55 -35.8% -0.0% compute_loss

DPO peaks in the reference's `get_batch_logps`, ORPO and SimPO in the policy's (LF 612:
the log_softmax), KTO in the reference's, the reward model in `compute_loss` (LF 98: inside
the value head's linear, TRL's modeling_value_head.py). What each gap was, or is:

- sized as TRL 0.24's, DPO read exactly LLaMA-Factory's step less the kernel's copy (+1.5% to
  +3.6% against the step without it: the budget's one row of logsumexp temporary from TRL's
  `selective_log_softmax`); ORPO and SimPO read one logits-sized tensor over in backward
  (+62 MiB): LLaMA-Factory keeps neither the logits nor a cross-entropy after its forward, only
  the log_softmax (its backward holds three copies of 4 B × rows × (s − 1) × V).
- KTO sized as TRL's read −1.9% to −12.9%: LLaMA-Factory's `forward` keeps the policy's fp32
  logits and its full log_softmax, and `concatenated_forward` the chosen and rejected rows'
  index copies of the logits, through the KL pass and both reference passes, each log_softmax
  over the strided view (the copy); at the reference's peak, with LoRA, the policy's logits,
  log_softmax and two index copies (a logits' worth) and the reference's logits, log_softmax
  and copy, about 186 MiB, where TRL's shape has 47 MiB less. Within 0.1% since 78103c7.
- `stage: rm` is not TRL's sequence classifier: LLaMA-Factory wraps the causal LM in TRL's
  AutoModelForCausalLMWithValueHead. The LM head stays (a frozen 62.5 MiB weight: not in the
  loss, so no gradient and no optimizer states; the optimizer step's −10.1% and −35.8% were that
  weight exactly, exact since 78103c7), and the forward computes the full logits. The
  collator's `labels` reach the model (PairwiseTrainer passes `**inputs`), so the causal LM
  computes its own cross-entropy too, unused (transformers' ForCausalLMLoss: a log_softmax of
  4 B × rows × s × V, 62.5 MiB here), alive with the logits while the value head runs, where
  the step peaks; the budget counts it since 6c832b1 (with the labels taken out of the inputs
  rm LoRA with checkpointing reads 244.61 MiB, 62.50 MiB less).

`--size small` (two blocks, vocabulary 1000, 2 × 64, checkpointing on), after 78103c7: DPO,
ORPO, SimPO and KTO within 0.7% (the optimizer step within 1.4%); the reward models read
−13.3% (full) and −25.9% (LoRA) then, for the same unused cross-entropy, which 6c832b1 counts.

A first table, with the kernel's copy not counted, read DPO +6.0% to +14.5% after 600deb2 (the
budget counts the copy, the counter did not see it); torch's profiler showed the copy on the CPU
too, and the step counts it since.

LLaMA-Factory is installed without its requirements (`--no-deps`): its trainers import only
torch, transformers, TRL, peft, accelerate, datasets and omegaconf (its argument parser); the
rest serve its web UI, API server and media readers. torchaudio has no release for torch 2.13
on the package index; LLaMA-Factory imports it only to read audio (data/mm_plugin.py), so an
empty module stands in for it. The first run makes the environment under `bench/.llamafactory`
(`--llamafactory-wheel FILE` where the index has no LLaMA-Factory) and reuses it after;
`--measured FILE` keeps the trainers' measurements, so the budget at another revision
(`--budget-rev REV`) is compared without running them again.

    python bench/llamafactory_trainers.py [--size small|medium] [--stage dpo|orpo|simpo|kto|rm ...]
                                          [--method full|lora ...] [--shape PAIRSxTOKENS]
                                          [--checkpointing on|off ...] [--measured FILE]
                                          [--budget-rev REV] [--llamafactory-wheel FILE]
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

    # without bf16 or fp16 LLaMA-Factory computes in `infer_optim_dtype` of the model's dtype:
    # fp32 on the CPU (bf16 for a bf16 model where bf16 runs, else fp16 where fp16 runs); llmmem
    # reads a LLaMA-Factory YAML without `bf16` as bf16, so the pragma says what runs here
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
        ["git", "-C", str(REPO), "archive", rev, "analyzer"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise SystemExit(
            f"--budget-rev {rev}: {archive.stderr.decode().strip() or 'no such revision'}"
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
        try:
            measured = json.loads(args.measured.read_text())
        except (OSError, ValueError) as error:
            parser.error(f"--measured {args.measured}: not a file of measurements ({error})")
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

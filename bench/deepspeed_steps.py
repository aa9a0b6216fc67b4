"""DeepSpeed ZeRO-2 and ZeRO-3 through the HF Trainer, on two CPU ranks, against the budget.

`bench/zero_grid.py` checks the ZeRO budget against `llmmem verify`'s own loop around
`deepspeed.initialize`. This runs the stack a user runs: transformers' `Trainer` with
`TrainingArguments(deepspeed="ds.json")`, which hands the model and its torch AdamW to accelerate,
which builds DeepSpeed's engine (DeepSpeed 0.19.8, accelerate 1.15.0, transformers 5.24.0,
torch 2.13.0). Two ranks under torchrun on DeepSpeed's CPU accelerator, over gloo (no oneCCL
here: `cpu_accelerator.py` falls back to gloo), a tiny Llama (2 blocks, h 256, vocab 4096)
built from its config inside the run (under ZeRO-3 inside `deepspeed.zero.Init`, as
`from_pretrained` would), bf16 (DeepSpeed's bf16 block: 16-bit weights, fp32 master), 2 × 128
tokens a rank.

Each rank counts its storages with llmmem's StorageTracker (llmmem.verify.tracker) over the
second step (the first creates the optimizer states) and splits it where the stack's own code
returns: the forward and the loss (`Trainer.compute_loss`), backward (`DeepSpeedEngine.backward`,
which accelerate calls; it reduces and partitions the gradients) and the optimizer step
(`DeepSpeedEngine.step`, which accelerate calls from `backward` on an accumulation boundary).
Each phase's peak on each rank is compared with the same phase of `llmmem explain` over the same
script and DeepSpeed file.

Where the CPU differs from a GPU:
- the optimizer: the trainer's torch AdamW runs its for-loop implementation on the CPU and
  foreach on a GPU (torch `_default_to_fused_or_foreach`); the budget sizes the GPU's, so the
  run asks for foreach (as bench/trl_step.py does). A config's own `"optimizer": {"type":
  "AdamW"}` is DeepSpeed's FusedAdam on a GPU (one `multi_tensor_apply` kernel, in place, no
  temporaries: budget.optimizers); on the CPU accelerator FusedAdam is a C++ op built on first
  use (op_builder/cpu/fused_adam.py) whose memory is not the CUDA kernel's, so that optimizer is
  not measured here: its step is read from DeepSpeed's CUDA code (tests/budget/
  test_zero3_cuda_step.py, tests/extract/test_deepspeed_optimizer_section.py).
- communication: gloo's worker threads can hold a collective's input after the main thread has
  moved on; each phase boundary waits on a barrier first (llmmem.verify.runner does the same).
- nothing of CUDA's allocator (reserved, its rounding) is here: allocated bytes only.

    python bench/deepspeed_steps.py            # every case (about 15 s each, 1.5 min)
    python bench/deepspeed_steps.py z3 z2-lora # some
    LLMMEM_BENCH_DETAIL=1 python bench/deepspeed_steps.py z2  # and, at each phase's peak,
                                               # rank 0's storages of 1 MiB or more, where made

Each rank's peak per phase, MiB, measured / budget / error (both ranks read the same):

    case          rank    forward                  backward                 optimizer_step
    z2               0    43.07   43.02  -0.1%     45.06   45.02  -0.1%     44.00   43.99  -0.0%
    z2-ckpt          0    37.87   37.82  -0.1%     39.87   39.82  -0.1%     44.00   43.99  -0.0%
    z2-lora          0    21.09   21.17  +0.4%     22.96   23.17  +0.9%      6.94    6.93  -0.1%
    z3               0    49.96   49.91  -0.1%     51.96   51.91  -0.1%     40.74   40.73  -0.0%
    z3-ckpt          0    44.76   44.72  -0.1%     46.76   46.72  -0.1%     40.74   40.73  -0.0%
    z3-lora          0    24.48   23.72  -3.1%     26.47   25.72  -2.8%      4.45    4.40  -1.1%
    z3-subgroup      0    49.96   49.91  -0.1%     51.96   51.91  -0.1%     32.55   32.54  -0.0%

Every phase within 3.1%. ZeRO-2's full step read -7.7% while the budget sized it as one
parameter group: the trainer hands DeepSpeed two (the weights, then the biases and norms), and
while the weights' group steps the norms' views keep the whole 16-bit contiguous gradient
partition (`copy_grads_in_partition`, stage_1_and_2.py, 3.38 MiB) alive beside that group's fp32
gradient and `_foreach_sqrt` over its fp32 master (6.77 MiB each; budget.zero12_step).
z3-subgroup (sub_group_size 2e5) read +25.1% before the script reader took `sub_group_size`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

TINY: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
BATCH, SEQ, RANKS = 2, 128, 2
AUTO = {"reduce_bucket_size": "auto"}

# name: (zero_optimization, LoRA, gradient checkpointing)
CASES: dict[str, tuple[dict[str, Any], bool, bool]] = {
    "z2": ({"stage": 2, **AUTO}, False, False),
    "z2-ckpt": ({"stage": 2, **AUTO}, False, True),
    "z2-lora": ({"stage": 2, **AUTO}, True, False),
    "z3": ({"stage": 3, **AUTO}, False, False),
    "z3-ckpt": ({"stage": 3, **AUTO}, False, True),
    "z3-lora": ({"stage": 3, **AUTO}, True, False),
    "z3-subgroup": ({"stage": 3, **AUTO, "sub_group_size": 200_000}, False, False),
}
PHASES = ("forward", "backward", "optimizer_step")

# the script llmmem reads for its budget; the rank below runs the same settings
SCRIPT = """import torch
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("./tiny", dtype=torch.float32)
{lora}args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size={batch},
    bf16=True,
    optim="adamw_torch",
    gradient_checkpointing={ckpt},
    deepspeed="ds.json",
)
# llmmem: seq={seq} world_size={ranks}
"""
LORA = (
    "from peft import LoraConfig, get_peft_model\n"
    "model = get_peft_model(model, LoraConfig(r=8, target_modules=['q_proj', 'v_proj']))\n"
)


# -- one rank (under torchrun) ----------------------------------------------------------------


def where_in(stack: list[Any]) -> str:
    """The innermost frame of DeepSpeed, torch's optimizers or autograd, else transformers'."""
    for marks in (("/deepspeed/", "/torch/optim/"), ("/torch/autograd/", "/transformers/")):
        for frame in reversed(stack):
            if any(mark in frame.filename for mark in marks):
                short = frame.filename.split("site-packages/")[-1]
                return f"{frame.name} ({short}:{frame.lineno})"
    return ""


def run_rank(project: Path, lora: bool, ckpt: bool) -> dict[str, Any]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    import deepspeed
    import deepspeed.ops
    import torch
    import torch.distributed as dist
    from datasets import Dataset
    from deepspeed.runtime.engine import DeepSpeedEngine
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback
    from transformers import TrainingArguments as Arguments
    from transformers.utils import logging as hf_logging

    from llmmem.verify.tracker import StorageTracker

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    hf_logging.set_verbosity_error()
    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        # the CPU accelerator would build a shared-memory all-reduce first (a C++ build);
        # gloo's own moves the same tensors
        compatible["deepspeed_shm_comm"] = False

    class PeakTracker(StorageTracker):
        """The tracker, remembering the innermost DeepSpeed or optimizer frame at each peak."""

        where = ""
        live: list[tuple[int, str]] = []

        def _note_peak(self) -> None:
            before = self.peak
            super()._note_peak()
            if armed["on"] and self.peak > before:
                self.where = where_in(traceback.extract_stack())
                if detail:
                    self.live = sorted(
                        ((s, origin.get(k, "")) for k, s in self.sizes.items() if s >= 2**20),
                        reverse=True,
                    )

    detail = bool(os.environ.get("LLMMEM_BENCH_DETAIL"))
    tracker = PeakTracker()
    origin: dict[int, str] = {}
    if detail:
        track = tracker._track

        def tracking(storage: Any, category: str | None) -> None:
            if id(storage) not in tracker.sizes and storage.nbytes() >= 2**20:
                stack = traceback.extract_stack()
                origin[id(storage)] = " < ".join(
                    f"{f.name}:{f.lineno}" for f in reversed(stack[-12:-2])
                )
            track(storage, category)

        tracker._track = tracking  # type: ignore[method-assign]
    seen: dict[str, Any] = {}
    armed = {"on": False}

    def settle() -> None:
        """Let gloo's worker threads drop a collective's tensors before a phase is read."""
        if dist.is_initialized():
            dist.barrier()
            time.sleep(0.05)

    def boundary(phase: str, next_category: str) -> None:
        settle()
        if armed["on"]:
            seen[phase] = tracker.peak
            seen[phase + " where"] = tracker.where
            if detail:
                seen[phase + " live"] = tracker.live
        tracker.reset_peak(next_category)
        tracker.where = ""

    backward, step = DeepSpeedEngine.backward, DeepSpeedEngine.step

    def engine_backward(self: Any, *a: Any, **kw: Any) -> Any:
        out = backward(self, *a, **kw)
        boundary("backward", "temporaries")
        return out

    def engine_step(self: Any, *a: Any, **kw: Any) -> Any:
        out = step(self, *a, **kw)
        boundary("optimizer_step", "activations")
        return out

    DeepSpeedEngine.backward = engine_backward  # type: ignore[method-assign]
    DeepSpeedEngine.step = engine_step  # type: ignore[method-assign]

    class Phases(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # the GPU's AdamW implementation, which the budget sizes
            inner: Any = trainer.optimizer
            while hasattr(inner, "optimizer"):
                inner = inner.optimizer
            for group in inner.param_groups:
                group["foreach"] = True

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            settle()
            tracker.reset_peak("activations")
            armed["on"] = state.global_step == 1

    vocab = int(TINY["vocab_size"])
    rows = {"input_ids": [[3 + (7 * i + j) % (vocab - 3) for j in range(SEQ)] for i in range(8)]}
    rows["labels"] = rows["input_ids"]
    data = Dataset.from_dict(rows)
    with tracker:
        args = Arguments(
            output_dir=tempfile.mkdtemp(),
            per_device_train_batch_size=BATCH,
            max_steps=2,
            bf16=True,
            use_cpu=True,
            optim="adamw_torch",
            gradient_checkpointing=ckpt,
            deepspeed=str(project / "ds.json"),
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        config = AutoConfig.for_model(**{k: v for k, v in TINY.items() if k != "architectures"})
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Phases()])
        compute_loss = trainer.compute_loss

        def loss(*a: Any, **kw: Any) -> Any:
            out = compute_loss(*a, **kw)
            boundary("forward", "temporaries")
            return out

        trainer.compute_loss = loss  # type: ignore[method-assign]
        trainer.train()
    return seen


# -- the driver --------------------------------------------------------------------------------


def write_project(folder: Path, name: str) -> Path:
    zero, lora, ckpt = CASES[name]
    project = folder / name
    (project / ".git").mkdir(parents=True)
    (project / "tiny").mkdir()
    (project / "tiny" / "config.json").write_text(json.dumps(TINY))
    script = SCRIPT.format(lora=LORA if lora else "", batch=BATCH, ckpt=ckpt, seq=SEQ, ranks=RANKS)
    (project / "train.py").write_text(script)
    ds = {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "steps_per_print": 1_000_000_000,
    }
    (project / "ds.json").write_text(json.dumps(ds))
    return project


def budget_phases(project: Path) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", "--format", "json", "train.py"],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    report = json.loads(done.stdout)
    phases = report["budget"]["phases"]
    return {phase: int(phases[phase]["allocated_bytes"]) for phase in PHASES}


def measure(project: Path, name: str) -> list[dict[str, Any]] | str:
    """Each rank's measured phases, or why the ranks did not run. A launch that ends without
    a Python error (the rendezvous port taken by a launch before it, a rank gone without a
    word) is tried once more on another port; one whose every rank wrote its phases before a
    rank died at teardown counts as measured."""
    _zero, lora, ckpt = CASES[name]
    case = json.dumps({"project": str(project), "lora": lora, "ckpt": ckpt})
    why = "no output"
    for attempt in range(2):
        for stale in project.glob("rank*.json"):
            stale.unlink()
        port = 29500 + (os.getpid() + 389 * attempt) % 1000
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={RANKS}"]
            + ["--master_port", str(port), __file__, "--rank", case],
            cwd=project,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
            timeout=600,
        )
        outputs = sorted(project.glob("rank*.json"))
        if done.returncode == 0 and len(outputs) == RANKS:
            return [json.loads(path.read_text()) for path in outputs]
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        raised = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line)]
        if raised:
            return raised[0]
        if len(outputs) == RANKS:
            # every rank wrote its phases, then a rank died at teardown without a Python
            # error (a SIGABRT in gloo's shutdown on a loaded machine): the step was measured
            return [json.loads(path.read_text()) for path in outputs]
        # bitsandbytes' import notices come first: the end of the output says more
        why = f"exit {done.returncode}, {len(outputs)} of {RANKS} ranks wrote their phases: " + (
            " | ".join(lines[-3:]) if lines else "no output"
        )
    return why


def releases() -> str:
    """The releases the ranks run (this interpreter's)."""
    from importlib.metadata import version

    names = ("deepspeed", "accelerate", "transformers", "peft", "torch")
    return ", ".join(f"{name} {version(name)}" for name in names)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--rank"]:
        case = json.loads(argv[1])
        seen = run_rank(Path(case["project"]), bool(case["lora"]), bool(case["ckpt"]))
        rank = int(os.environ.get("RANK", "0"))
        (Path(case["project"]) / f"rank{rank}.json").write_text(json.dumps(seen))
        return 0
    if argv[:1] in (["-h"], ["--help"]):
        print((__doc__ or "").strip())
        return 0
    chosen = argv or list(CASES)
    unknown = [n for n in chosen if n not in CASES]
    if unknown:
        print(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(CASES)}")
        return 2
    mib = 2**20
    print(
        f"The HF Trainer with DeepSpeed on {RANKS} CPU ranks against llmmem's budget, a tiny Llama "
        f"({TINY['num_hidden_layers']} blocks, h {TINY['hidden_size']}, V {TINY['vocab_size']}), "
        f"{BATCH} x {SEQ} tokens a rank, bf16 ({releases()}); MiB"
    )
    print(f"{'case':13s}{'rank':>5s}" + "".join(f"{p:>26s}" for p in PHASES))
    print(f"{'':18s}" + "    measured  budget  error" * len(PHASES))
    errors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="llmmem-ds-") as tmp:
        for name in chosen:
            project = write_project(Path(tmp), name)
            budget = budget_phases(project)
            ranks = measure(project, name)
            if isinstance(ranks, str):
                print(f"{name:13s} could not run: {ranks}")
                continue
            for rank, seen in enumerate(ranks):
                cells = []
                for phase in PHASES:
                    measured, predicted = seen.get(phase), budget[phase]
                    if not measured:
                        cells.append(f"{'—':>26s}")
                        continue
                    error = predicted / measured - 1
                    errors.append(abs(error))
                    cells.append(
                        f"{measured / mib:12.2f}{predicted / mib:8.2f}{100 * error:+6.1f}%"
                    )
                print(f"{name if rank == 0 else '':13s}{rank:5d}" + "".join(cells))
            for phase in PHASES if os.environ.get("LLMMEM_BENCH_DETAIL") else ():
                print(f"  {phase} peak in {ranks[0].get(phase + ' where')}")
                for size, made in ranks[0].get(phase + " live", []):
                    print(f"    {size / mib:8.2f} MiB  {made}")
    if errors:
        errors.sort()
        print(
            f"\n{len(chosen)} cases × {RANKS} ranks, {len(errors)} phase rows: median |error| "
            f"{100 * errors[len(errors) // 2]:.1f}%, max {100 * errors[-1]:.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env bash
# Real CUDA numbers for the calibration, in one run on a machine with one NVIDIA GPU.
#
#   OUT=gpu-out bash bench/gpu_run.sh            # all of it, about 8 minutes on an H100
#   OUT=gpu-out bash bench/gpu_run.sh qlora full # some steps: context lora eager qlora full
#                                                # full-expandable holdout example-full
#                                                # example-qlora packed offload compile
#                                                # packed-holdout offload-holdout
#                                                # compile-holdout compile-full
#
# What it needs: python3 with pip. transformers, peft, bitsandbytes (and regex, which
# transformers checks) are installed at the versions the tests pin: from wheels in .gpu-wheels/
# when that folder exists (a machine that reaches no package registry; its torch and
# nvidia-ml-py are used as they are), else from the registry, with a CUDA torch if none is
# there and flash-attn where a wheel exists. The grid trains with attn_implementation="sdpa",
# whose flash kernel is torch's own either way.
#
# In order of value, each step time-boxed so that a slow one leaves the others their time, and
# each writing JSON under $OUT as it goes (a step cut short keeps the cases it finished):
#   1. context.json   the CUDA context, cuBLAS and SDPA workspaces alone (bench/gpu_context.py),
#                     with the machine's driver, CUDA and library versions;
#   2. grid-lora.json LoRA at real sizes: Qwen2.5-0.5B/1.5B/7B, Llama-3.2-1B/3B, checkpointing
#                     off and on, two shapes, SDPA (eager too on two of them);
#   3. grid-qlora.json QLoRA (NF4, double quantization, paged 8-bit AdamW, bf16 autocast);
#   4. grid-full.json  full fine-tuning, pure bf16, AdamW;
#   5. verify-full.json / verify-qlora.json  `llmmem verify` on the bundled examples;
#   6. grid-packed.json, grid-offload.json, grid-compile.json  packed samples, activation
#                     offloading (TRL 0.29.1's own hooks beside the emulation of its rules) and
#                     torch.compile, each against the estimate and the band's floor.
# Every grid case has the prediction beside the measurement: allocated per phase, reserved,
# and on the device (NVML, as nvidia-smi shows it). `python bench/gpu_report.py DIR` prints
# the tables.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
LOG="$OUT/run.log"
log() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; }
step() { # step SECONDS NAME COMMAND...: run, time-boxed, output into the log
    local seconds=$1 name=$2
    shift 2
    log "$name (at most ${seconds}s)"
    timeout --signal=INT --kill-after=10 "$seconds" "$@" >>"$LOG" 2>&1
    log "$name: exit $?"
}

log "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv >>"$LOG" 2>&1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' >>"$LOG"

PINS="transformers==5.24.0 peft==0.21.2 bitsandbytes==0.50.2 trl==0.29.1 nvidia-ml-py"
if [ -d .gpu-wheels ]; then
    log "installing from .gpu-wheels"
    python3 -m pip install -q --no-index --no-deps --no-compile .gpu-wheels/*.whl >>"$LOG" 2>&1
else
    # an unpinned torch from the registry is a CUDA build; flash-attn only where a wheel exists
    python3 -c 'import torch' 2>/dev/null || { log "installing torch"; python3 -m pip install -q torch >>"$LOG" 2>&1; }
    log "installing $PINS"
    python3 -m pip install -q $PINS >>"$LOG" 2>&1
    python3 -m pip install -q --only-binary=:all: flash-attn >>"$LOG" 2>&1 ||
        log "no flash-attn wheel for this torch: SDPA's own flash kernel is measured"
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 ||
    export PYTHONPATH="$PWD/analyzer${PYTHONPATH:+:$PYTHONPATH}"
python3 - >>"$LOG" 2>&1 <<'EOF'
import importlib.metadata as m
for name in ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "trl", "nvidia-ml-py", "llmmem"):
    try:
        print(name, m.version(name))
    except m.PackageNotFoundError:
        print(name, "not installed")
import llmmem.verify.runner  # noqa: F401  (must import)
try:
    import bitsandbytes  # noqa: F401  (the QLoRA steps need it)
except ImportError as err:
    print("bitsandbytes does not import:", err)
EOF

want() { [ -z "$STEPS" ] || [[ " $STEPS " == *" $1 "* ]]; }
STEPS="$*"

GRID="python3 -m llmmem.verify.grid --device cuda --size real"
SMALL="--model Qwen/Qwen2.5-0.5B --model meta-llama/Llama-3.2-1B"
if want context; then
    log "context"
    timeout 45 python3 bench/gpu_context.py >"$OUT/context.json" 2>>"$LOG"
    log "context: exit $?"
fi
want lora && step 130 "LoRA grid" $GRID --method lora --shape 1x512 --shape 2x2048 \
    $SMALL --model Qwen/Qwen2.5-1.5B --model meta-llama/Llama-3.2-3B --model Qwen/Qwen2.5-7B \
    --json "$OUT/grid-lora.json"
want eager && step 45 "LoRA grid, eager attention" $GRID --method lora --attn eager \
    --shape 1x512 --shape 2x2048 --model Qwen/Qwen2.5-0.5B --model meta-llama/Llama-3.2-3B \
    --json "$OUT/grid-eager.json"
want qlora && step 100 "QLoRA grid" $GRID --method qlora --shape 1x512 --shape 2x2048 \
    $SMALL --model Qwen/Qwen2.5-1.5B --model meta-llama/Llama-3.2-3B \
    --json "$OUT/grid-qlora.json"
want full && step 45 "full fine-tuning grid" $GRID --method full --shape 1x512 \
    --shape 2x2048 $SMALL --json "$OUT/grid-full.json"
# the same with the allocator's expandable segments: what is left of the slack when freed
# memory no longer has to fit into the segments it was cut from
want full-expandable && step 45 "full fine-tuning grid, expandable segments" \
    env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $GRID --method full \
    --shape 1x512 --shape 2x2048 $SMALL --json "$OUT/grid-full-expandable.json"
# shapes and a model none of the steps above has, to check the terms those runs set
want holdout && step 100 "held-out shapes" $GRID --method lora --method qlora --shape 4x1024 \
    --shape 1x4096 --model Qwen/Qwen2.5-3B --model meta-llama/Llama-3.2-1B \
    --json "$OUT/grid-holdout.json"
# packed samples (position ids restarting per sample) under SDPA: the block-diagonal mask
want packed && step 90 "packed samples" $GRID --method lora --shape 2x2048 $SMALL \
    --packed flat --packed rows --json "$OUT/grid-packed.json"
# activation offloading: the emulation of TRL's rules beside TRL's own OffloadActivations
want offload && step 150 "activation offloading" $GRID --method lora --shape 2x2048 $SMALL \
    --offload all --offload dedupe --offload trl --json "$OUT/grid-offload.json"
# torch.compile of the whole model (default mode); the warm-up step compiles
want compile && step 240 "torch.compile" $GRID --method lora --shape 2x2048 \
    --model Qwen/Qwen2.5-0.5B --model meta-llama/Llama-3.2-1B --compile \
    --json "$OUT/grid-compile.json"
# the same settings on models and shapes none of the runs above has
want packed-holdout && step 45 "packed samples, held out" $GRID --method lora --shape 1x4096 \
    --model Qwen/Qwen2.5-1.5B --model meta-llama/Llama-3.2-3B --packed flat \
    --json "$OUT/grid-packed-holdout.json"
want offload-holdout && step 60 "activation offloading, held out" $GRID --method lora \
    --shape 4x1024 --model Qwen/Qwen2.5-1.5B --offload all --offload trl \
    --json "$OUT/grid-offload-holdout.json"
want compile-holdout && step 110 "torch.compile, held out (LoRA)" $GRID --method lora \
    --shape 1x4096 --model Qwen/Qwen2.5-1.5B --compile --json "$OUT/grid-compile-holdout.json"
want compile-full && step 110 "torch.compile, full fine-tuning" $GRID --method full \
    --shape 1x2048 --model meta-llama/Llama-3.2-1B --compile --json "$OUT/grid-compile-full.json"
want example-full && step 60 "verify examples/full_finetune.py" python3 -m llmmem verify \
    examples/full_finetune.py --device cuda --format json --output "$OUT/verify-full.json" \
    --timeout 50 --offline
want example-qlora && step 130 "verify examples/qlora_sft.py" python3 -m llmmem verify \
    examples/qlora_sft.py --device cuda --format json --output "$OUT/verify-qlora.json" \
    --timeout 120 --offline
log "done"
ls -la "$OUT" >>"$LOG"

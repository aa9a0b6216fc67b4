"""What a verify run is asked to do and what it measured: plain data that crosses the process
boundary as JSON (the step runs in a subprocess so that a crash, an OOM or a hang is a result)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# the categories a measurement splits allocated memory into
WEIGHTS = "weights"
GRADIENTS = "gradients"
OPTIMIZER_STATES = "optimizer_states"
ACTIVATIONS = "activations"  # created in forward and alive: saved activations, logits, loss
TEMPORARIES = "temporaries"  # created in backward or the step and not a gradient or a state
OTHER = "other"  # alive before the step and none of the above (buffers, the batch)
CATEGORIES = (WEIGHTS, GRADIENTS, OPTIMIZER_STATES, ACTIVATIONS, TEMPORARIES, OTHER)

PHASES = ("forward", "backward", "optimizer_step")


@dataclass
class StepRequest:
    """One training step to run: the model's HF config and the setup, as the core saw them."""

    model_id: str
    architecture: str  # the transformers class, e.g. "LlamaForCausalLM"
    config: dict[str, Any]
    batch: int
    seq: int
    grad_accum: int = 1
    grad_ckpt: bool = False
    precision: str = "bf16-true"  # fp32 | fp16 | bf16 | bf16-true | fp16-true
    optim: str = "adamw_torch"
    attn: str = "sdpa"
    # r, alpha, targets, modules_to_save, dora, dropout, adapter_bytes (2: 16-bit adapters)
    lora: dict[str, Any] | None = None
    # quant_type, double_quant, compute_dtype_bytes, prepare, embeddings_16bit (TRL's cast back)
    quant: dict[str, Any] | None = None
    use_cache: bool = False
    optimizer_in_backward: bool = False  # one optimizer per parameter, stepped in its hook
    world_size: int = 1  # ranks, each launched by torchrun when more than one
    sharding: str = "ddp"  # "ddp", "fsdp" (FSDP2 full shard per block) or "zero" (DeepSpeed)
    zero: dict[str, Any] | None = None  # DeepSpeed's zero_optimization section, as it runs
    device: str = "fake"  # "fake" (simulated), "cpu", "cuda"
    trust_remote_code: bool = False
    snapshot: str | None = None  # CUDA: where to save a torch.cuda.memory snapshot
    seed: int = 0
    # a preference plan: "dpo", "orpo", "cpo", "simpo" (CPO with cpo_alpha=0), "kto" or
    # "reward" (None: supervised),
    # and how its reference log-probabilities are made ("copy", "adapter", "precomputed";
    # None: TRL's default for the method)
    objective: str | None = None
    reference: str | None = None
    # whose preference trainer the step restates: "trl" or "llamafactory" (its DPO trainer)
    trainer: str = "trl"
    # GRPO: num_generations, max_prompt_length, max_completion_length, beta, vllm (None: the
    # policy generates), mixed_precision
    grpo: dict[str, Any] | None = None
    # packed samples: "flat" (one row of batch × seq tokens) or "rows" (two samples per row),
    # position ids restarting at each sample; None: one sample per row
    packing: str | None = None
    # saved activations moved off the device in forward and back in backward: "all" (every
    # tensor TRL's rules let go) or "dedupe" (a second save of a storage still being offloaded
    # stays on the device, as TRL's stream mode keeps it); None: no offloading
    # "trl": TRL's own OffloadActivations (needs trl installed), the whole forward and backward
    # under its hooks as SFTTrainer.training_step runs them
    activation_offload: str | None = None
    # the model runs under torch.compile (default mode), CUDA only
    compile: bool = False

    @property
    def launched(self) -> bool:
        """Whether the step runs under torchrun: several real ranks, or DeepSpeed (which
        always runs in a process group, also on one GPU). A simulated step is one process."""
        return self.device != "fake" and (self.world_size > 1 or self.sharding == "zero")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRequest:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


@dataclass
class PhaseMeasurement:
    phase: str
    peak_bytes: int  # the most allocated at any moment of the phase
    by_category: dict[str, int]  # what was alive at that moment, by category
    # CUDA: what NVML (nvidia-smi) shows for this process as the phase ends; the caching
    # allocator returns nothing within a step, so this is the phase's most
    device_used_bytes: int | None = None
    # CUDA: the caching allocator's reserved peak within the phase (max_memory_reserved)
    reserved_bytes: int | None = None


@dataclass
class StepMeasurement:
    device: str  # "fake", "cpu", "cuda"
    device_name: str
    capacity_bytes: int | None = None
    phases: list[PhaseMeasurement] = field(default_factory=list)
    allocated_peak_bytes: int = 0
    reserved_peak_bytes: int | None = None  # CUDA only: what the caching allocator held
    # CUDA only: the most NVML (nvidia-smi) showed for this process over the measured phases,
    # context included; `device_used_source` says whether it is the process's own line
    # ("process") or the whole device's use ("device", where the process is not listed)
    device_used_peak_bytes: int | None = None
    device_used_source: str | None = None
    free_before_bytes: int | None = None  # CUDA mem_get_info before the model was built
    free_after_bytes: int | None = None
    weights_bytes: int = 0
    gradients_bytes: int = 0  # at the end of backward
    optimizer_state_bytes: int = 0  # after the step
    oom: dict[str, Any] | None = None  # {"phase": ..., "allocated_bytes": ..., "message": ...}
    error: str | None = None  # anything else that stopped the step, one line
    stage: str = ""  # how far it got: "build", "warm-up", "measured step", "done"
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    snapshot: str | None = None
    rank: int = 0
    ranks: list[dict[str, Any]] = field(default_factory=list)  # each rank's peak, multi-rank runs

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepMeasurement:
        phases = [PhaseMeasurement(**p) for p in data.get("phases", [])]
        rest = {
            name: data[name]
            for name in cls.__dataclass_fields__
            if name in data and name != "phases"
        }
        return cls(phases=phases, **rest)

    def phase(self, name: str) -> PhaseMeasurement | None:
        for item in self.phases:
            if item.phase == name:
                return item
        return None

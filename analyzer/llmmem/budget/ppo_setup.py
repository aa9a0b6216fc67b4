"""What a PPO update is, before any of its moments is sized: PPOConfig's fields (TRL 0.29.1's
defaults), the value, reward and reference models it runs with, and the trainer's checks on the
sizes. llmmem.budget.ppo sizes the update from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmmem.budget.preference_setup import Reference
from llmmem.budget.setup import Method, Mode, SetupError, TrainingSetup
from llmmem.models.spec import ModelSpec

# the TRL release whose PPOTrainer this budget follows
TRL_RELEASE = "0.29.1"
REWARD_KINDS = ("model", "adapter", "api")
# "remote": a critic on GPUs of its own (OpenRLHF without --colocate_all_models)
VALUE_KINDS = ("model", "head", "remote")


@dataclass(frozen=True, slots=True, kw_only=True)
class PpoSetup:
    """PPOConfig's fields (TRL 0.29.1 defaults) and the models that change the memory."""

    value_model: ModelSpec | None = None  # None: the policy's size
    reward_model: ModelSpec | None = None  # None: the policy's size
    value: str = "model"  # "model": a separate value model (TRL); "head": on the policy
    reward: str = "model"  # "model", "adapter" (LLaMA-Factory lora) or "api"
    reference: Reference | None = None  # None: a copy in full fine-tuning, else the adapter
    query_length: int | None = None  # the longest query (None: the setup's sequence length)
    response_length: int = 53
    # None: per_device_train_batch_size (LLaMA-Factory generates a mini-batch at a time)
    local_rollout_forward_batch_size: int | None = 64
    num_ppo_epochs: int = 4
    num_mini_batches: int = 1
    keep_scores: bool = True  # TRL 0.29.1 keeps the rollout's generation scores
    # accelerate's mixed precision (bf16=True): the prepared wrapper's outputs come back in
    # fp32; None: llmmem.budget.preference_setup.fp32_outputs's default
    mixed_precision: bool | None = None
    # the queries of a batch differ in length and the collator left-pads them to the longest:
    # the attention mask `forward` builds (`query_responses != pad_token_id`) has zeros, so
    # transformers hands SDPA a mask, and SDPA a mask repeats K and V to every query head.
    # False: every query is as long and no generated token is the pad token (no mask)
    padded_queries: bool = True
    trainer: str = "trl"  # "trl", "llamafactory" or "openrlhf"
    # what the notes call the value and reward models (a hub id, "the policy's size")
    value_name: str = ""
    reward_name: str = ""
    # the reference copy as the trainer loads it (see
    # llmmem.budget.preference_setup.PreferenceSetup)
    reference_bytes: int | None = None
    reference_sharded: bool = False
    reference_offloaded: bool = False
    # OpenRLHF's vLLM engines: None (the policy generates), "colocate" (an engine on this GPU
    # holding `vllm_gpu_memory_utilization` of it, released outside generation with
    # `vllm_enable_sleep`) or "server" (engines on GPUs of their own)
    vllm: str | None = None
    vllm_gpu_memory_utilization: float = 0.9
    vllm_enable_sleep_mode: bool = False

    def __post_init__(self) -> None:
        for name in (
            "query_length",
            "response_length",
            "local_rollout_forward_batch_size",
            "num_ppo_epochs",
            "num_mini_batches",
        ):
            value = getattr(self, name)
            if value is None and name in ("query_length", "local_rollout_forward_batch_size"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SetupError(f"{name} must be a whole number of at least 1, got {value!r}")
        if self.reward not in REWARD_KINDS:
            raise SetupError(f"the reward model is model, adapter or api, got {self.reward!r}")
        if self.value not in VALUE_KINDS:
            raise SetupError(f"the value model is model or head, got {self.value!r}")
        if self.reference is not None:
            try:
                object.__setattr__(self, "reference", Reference(self.reference))
            except ValueError as err:
                raise SetupError(str(err)) from None
            if self.reference is Reference.PRECOMPUTED:
                raise SetupError(
                    "PPO's reference is a copy, the policy with its adapter disabled, or none "
                    "on this GPU (a model on GPUs of its own)"
                )
        if self.vllm is not None and self.vllm not in ("colocate", "server"):
            raise SetupError(f"vllm is colocate or server, got {self.vllm!r}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise SetupError(
                "vllm_gpu_memory_utilization is a fraction of the GPU's memory, above 0 and at "
                f"most 1, got {self.vllm_gpu_memory_utilization}"
            )

    def resolved(self, setup: TrainingSetup) -> PpoSetup:
        """The lengths and the rollout chunk the setup leaves open, filled in from it."""
        return replace(
            self,
            query_length=self.query_length or setup.seq,
            local_rollout_forward_batch_size=self.local_rollout_forward_batch_size or setup.batch,
        )

    @property
    def seq(self) -> int:
        return (self.query_length or 0) + self.response_length


def local_batch(setup: TrainingSetup) -> int:
    """`local_batch_size`: the queries one device rolls out per update."""
    return setup.batch * setup.grad_accum


def check_ppo(ppo: PpoSetup, setup: TrainingSetup) -> None:
    """PPOTrainer.__init__'s checks that concern the sizes."""
    if setup.mode is Mode.GENERATE:
        raise SetupError("PPO is a training objective: drop --mode generate")
    if local_batch(setup) % ppo.num_mini_batches:
        raise SetupError(
            f"local_batch_size ({setup.batch} × {setup.grad_accum} = {local_batch(setup)}) must "
            f"be a multiple of num_mini_batches ({ppo.num_mini_batches})"
        )


def reference_of(ppo: PpoSetup, setup: TrainingSetup) -> Reference:
    if ppo.reference is Reference.ADAPTER and setup.method is Method.FULL:
        raise SetupError(
            "the reference can be the adapter-disabled policy only with LoRA/QLoRA: full "
            "fine-tuning keeps a reference copy"
        )
    if ppo.reference is not None:
        return ppo.reference
    return Reference.COPY if setup.method is Method.FULL else Reference.ADAPTER

# llmmem: gpu=A100-80GB
"""GRPO of Qwen2.5-0.5B-Instruct with vLLM in colocate mode, as the TRL documentation writes it.

Each prompt is completed `num_generations` times; `per_device_train_batch_size` counts
completions. With `use_vllm=True` and `vllm_mode="colocate"` the vLLM engine runs in the
training process and keeps `vllm_gpu_memory_utilization` of the GPU for itself, beside the
policy, its gradients and its optimizer states. `beta` is left at TRL's default (0.0): no
reference model. TRL 0.29 no longer truncates prompts (GRPOConfig has no `max_prompt_length`):
the longest prompt of the dataset is the one to size for.

`llmmem explain examples/grpo_vllm_colocate.py` reads these fields from the file (the pragma
above names the GPU the engine's share is taken of); the same budget from flags:

    llmmem estimate --model Qwen/Qwen2.5-0.5B-Instruct --objective grpo --batch 8 \
        --num-generations 8 --max-prompt-length 512 --max-completion-length 1024 \
        --vllm colocate --vllm-gpu-memory-utilization 0.3 --gpu A100-80GB
"""

from datasets import load_dataset
from trl import GRPOConfig, GRPOTrainer

dataset = load_dataset("trl-lib/DeepMath-103K", split="train")


def reward_len(completions, **kwargs):
    """Reward completions close to 200 characters."""
    return [-abs(200 - len(completion[0]["content"])) for completion in completions]


training_args = GRPOConfig(
    output_dir="Qwen2.5-0.5B-GRPO",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    num_generations=8,
    max_completion_length=1024,
    bf16=True,
    gradient_checkpointing=True,
    learning_rate=1e-6,
    use_vllm=True,
    vllm_mode="colocate",
    vllm_gpu_memory_utilization=0.3,
    logging_steps=10,
)
trainer = GRPOTrainer(
    model="Qwen/Qwen2.5-0.5B-Instruct",
    reward_funcs=reward_len,
    args=training_args,
    train_dataset=dataset,
)
trainer.train()

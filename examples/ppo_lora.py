# llmmem: gpu=A100-80GB
"""PPO of Qwen2.5-1.5B-Instruct with a LoRA adapter, as the TRL documentation writes it
(trl/experimental/ppo, TRL 0.29); the value and reward models come from the reward model's
checkpoint, here the policy's own (the documentation's commands do the same).

Four models share the GPU: the policy (its adapter trains), the value model (a
sequence-classification model loaded from the reward model's checkpoint, trained in full even
though the policy has an adapter), the reference (under PEFT the policy with its adapter
disabled: no copy) and the reward model (frozen). One optimizer covers the adapter and the whole
value model. Each update generates `response_length` tokens for `per_device_train_batch_size ×
gradient_accumulation_steps` queries, `local_rollout_forward_batch_size` at a time, keeps every
generated token's fp32 scores over the vocabulary, runs the reference, value and reward models
over query + response without gradient, then trains on micro-batches.

`llmmem explain examples/ppo_lora.py` reads the models and these fields from the file; the same
budget from flags:

    llmmem estimate --model Qwen/Qwen2.5-1.5B-Instruct --objective ppo --method lora \
        --batch 8 --grad-accum 2 --seq 512 --new-tokens 256 --rollout-batch 16 \
        --precision bf16-true --gpu A100-80GB

(`--value-model` and `--reward-model` size a value or reward model other than the policy.)
"""

import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from trl.experimental.ppo import PPOConfig, PPOTrainer

policy_path = "Qwen/Qwen2.5-1.5B-Instruct"
reward_path = "Qwen/Qwen2.5-1.5B-Instruct"

tokenizer = AutoTokenizer.from_pretrained(policy_path, padding_side="left")
dataset = load_dataset(
    "trl-internal-testing/descriptiveness-sentiment-trl-style", split="descriptiveness"
)


def tokenize(element):
    return {"input_ids": tokenizer(element["prompt"], truncation=True, max_length=512)["input_ids"]}


train_dataset = dataset.map(tokenize, remove_columns=dataset.column_names)

training_args = PPOConfig(
    output_dir="Qwen2.5-1.5B-PPO",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    local_rollout_forward_batch_size=16,
    response_length=256,
    num_ppo_epochs=4,
    num_mini_batches=1,
    learning_rate=3e-6,
    bf16=True,
)

policy = AutoModelForCausalLM.from_pretrained(policy_path, torch_dtype=torch.bfloat16)
value_model = AutoModelForSequenceClassification.from_pretrained(
    reward_path, num_labels=1, torch_dtype=torch.bfloat16
)
reward_model = AutoModelForSequenceClassification.from_pretrained(
    reward_path, num_labels=1, torch_dtype=torch.bfloat16
)
peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")

trainer = PPOTrainer(
    args=training_args,
    processing_class=tokenizer,
    model=policy,
    ref_model=None,
    reward_model=reward_model,
    train_dataset=train_dataset,
    value_model=value_model,
    peft_config=peft_config,
)
trainer.train()

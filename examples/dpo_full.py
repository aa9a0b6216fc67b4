# llmmem: world_size=8 gpu=H100-80GB
"""Full-parameter DPO of Mistral-7B-Instruct-v0.3 on 8 GPUs with DeepSpeed ZeRO-3.

No `ref_model` is given and the model has no adapter, so TRL's DPOTrainer builds the
reference itself: a second, frozen copy of the model (ZeRO-3 shards it like the policy).
Every step runs chosen and rejected through the reference without gradient, then through the
policy, and the optimizer states of all 7.25B parameters are sharded over the 8 GPUs.

    llmmem explain examples/dpo_full.py
"""

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer

model_name = "mistralai/Mistral-7B-Instruct-v0.3"
model = AutoModelForCausalLM.from_pretrained(model_name, dtype="bfloat16")
tokenizer = AutoTokenizer.from_pretrained(model_name)
tokenizer.pad_token = tokenizer.eos_token
preference_data = load_dataset("trl-lib/ultrafeedback_binarized", split="train")

zero3 = {
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "bf16": {"enabled": "auto"},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
}

config = DPOConfig(
    output_dir="Mistral-7B-DPO-full",
    beta=0.1,
    max_length=1024,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=8,
    gradient_checkpointing=True,
    bf16=True,
    learning_rate=5e-7,
    deepspeed=zero3,
)
trainer = DPOTrainer(
    model=model,
    args=config,
    train_dataset=preference_data,
    processing_class=tokenizer,
)
trainer.train()

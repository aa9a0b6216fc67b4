"""Full fine-tuning of Qwen2.5-7B with the HF Trainer (a typical script that runs out of memory).

    llmmem explain examples/full_finetune.py --gpu A100-80GB
"""

import torch
from datasets import load_dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

model_name = "Qwen/Qwen2.5-7B"
model = AutoModelForCausalLM.from_pretrained(model_name, torch_dtype=torch.bfloat16)
tokenizer = AutoTokenizer.from_pretrained(model_name, model_max_length=4096)

args = TrainingArguments(
    output_dir="qwen2.5-7b-full",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    learning_rate=1e-5,
    bf16=True,
    optim="adamw_torch",
    logging_steps=10,
)

dataset = load_dataset("wikitext", "wikitext-103-raw-v1", split="train")
trainer = Trainer(
    model=model,
    args=args,
    train_dataset=dataset,
    data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
)
trainer.train()

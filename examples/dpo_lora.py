"""DPO of Qwen2.5-7B-Instruct with a LoRA adapter, as the TRL documentation writes it.

With `ref_model` left out and a PEFT model, TRL takes the reference log-probabilities from the
same model with its adapter disabled: no second copy of the weights. Chosen and rejected go
through the model together, twice the micro-batch.

    llmmem explain examples/dpo_lora.py --gpu A100-80GB
"""

from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer

model_id = "Qwen/Qwen2.5-7B-Instruct"
model = AutoModelForCausalLM.from_pretrained(model_id, dtype="bfloat16")
tokenizer = AutoTokenizer.from_pretrained(model_id)
train_dataset = load_dataset("trl-lib/ultrafeedback_binarized", split="train")

peft_config = LoraConfig(
    r=16,
    lora_alpha=32,
    lora_dropout=0.05,
    target_modules="all-linear",
    task_type="CAUSAL_LM",
)

training_args = DPOConfig(
    output_dir="Qwen2.5-7B-DPO",
    per_device_train_batch_size=4,
    gradient_accumulation_steps=4,
    max_length=1024,
    beta=0.1,
    learning_rate=5e-6,
    logging_steps=10,
)
trainer = DPOTrainer(
    model=model,
    args=training_args,
    train_dataset=train_dataset,
    processing_class=tokenizer,
    peft_config=peft_config,
)
trainer.train()

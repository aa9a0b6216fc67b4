"""unsloth, read from a Python script: what its loaders and `get_peft_model` mean for a plan.

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name="unsloth/Llama-3.2-1B-bnb-4bit", max_seq_length=2048, load_in_4bit=True,
        dtype=None,
    )
    model = FastLanguageModel.get_peft_model(model, r=16, use_gradient_checkpointing="unsloth")

unsloth has no config file: a script calls it. This module holds what the calls mean, as data:
the loader classes, `get_peft_model`'s own LoRA defaults, what `use_gradient_checkpointing=
"unsloth"` does, how it loads a model in 4 bits and which dtype `dtype=None` becomes. The
handlers that apply it stay in the Python reader (`extract/python/libraries.py`, `load_pretrained`,
`get_peft_model`, `unsloth_checkpointing`; `extract/python/emitter.py` for the dtype and 4-bit
defaults): they work on the interpreter's values, and a framework module does not import the
Python reader. The reader imports this module; this module imports nothing of the extraction
house, so loading the Python reader loads no config reader.

Defaults as unsloth's signatures have them (`FastLanguageModel.from_pretrained` in
unsloth/models/loader.py, `get_peft_model` in unsloth/models/llama.py); `FastModel` and
`FastVisionModel` take the same keywords.
"""

from __future__ import annotations

# the classes whose `from_pretrained` returns (model, tokenizer) and whose `get_peft_model`
# adds LoRA with unsloth's own defaults
LOADERS = frozenset({"FastLanguageModel", "FastModel", "FastVisionModel"})

# -- get_peft_model: its own keyword defaults (not PEFT's LoraConfig's), as plan keys
LORA_DEFAULTS: dict[str, object] = {
    "lora.r": 16,
    "lora.alpha": 16,
    "lora.dropout": 0.0,
    "lora.target_modules": [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ],
}
LORA_DEFAULTS_NOTE = "unsloth get_peft_model default"

# -- use_gradient_checkpointing: "unsloth" (get_peft_model's default) is checkpointing with the
# saved activations offloaded to CPU memory; True is transformers' checkpointing, False off
OFFLOADED_CHECKPOINTING = "unsloth"
OFFLOADED_CHECKPOINTING_MEANS = (
    "unsloth's offloaded gradient checkpointing, the saved activations wait in CPU memory"
)
CHECKPOINTING_DEFAULT_NOTE = (
    "unsloth get_peft_model default (use_gradient_checkpointing='unsloth'): "
    + OFFLOADED_CHECKPOINTING_MEANS
)

# -- dtype: None (the default) or absent lets unsloth choose by the GPU; the plan assumes a
# recent GPU
DTYPE_WHEN_UNSET = "bfloat16"
DTYPE_WHEN_UNSET_NOTE = "unsloth picks bfloat16 on Ampere or newer GPUs (float16 before)"

# -- load_in_4bit=True: bitsandbytes NF4 with double quantization; the compute dtype is the
# model's dtype (bfloat16 where that is "auto" or unknown)
FOUR_BIT_DEFAULTS: dict[str, object] = {
    "quantization.quant_type": "nf4",
    "quantization.double_quant": True,
}
FOUR_BIT_COMPUTE_DTYPE = "bfloat16"
FOUR_BIT_NOTE = "unsloth's 4-bit loading"

# the model id when `model_name` cannot be read
DEFAULT_MODEL_NOTE = "unsloth's default model"

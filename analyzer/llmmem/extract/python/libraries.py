"""What the libraries' calls mean, as tables: a call the script makes to transformers, TRL,
PEFT, bitsandbytes, unsloth, torch (optimizers, data loaders, autocast) or accelerate is looked
up by the name it is called by, and its handler builds the object that later statements change.

Teaching the reader a new call is an entry in `CALLS_BY_LEAF` (or, for a trainer or its config
class, in `llmmem.extract.vocabulary`'s TRAINER_CLASSES / TRAINER_CONFIG_CLASSES); the
interpreter itself knows only Python.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import replace

from llmmem.extract.builder import CONFIG_DEFAULTS
from llmmem.extract.frameworks import unsloth
from llmmem.extract.python.findings import Findings
from llmmem.extract.python.values import (
    CallArgs,
    ConfigObject,
    DataLoaderObject,
    DictValue,
    Known,
    ListValue,
    LoraObject,
    ModelObject,
    OptimizerObject,
    PretrainedConfigObject,
    QuantObject,
    Symbol,
    TokenizerObject,
    TrainerObject,
    Unknown,
    Value,
    _combine_notes,
    _truth,
    settle,
)
from llmmem.extract.vocabulary import (
    TRAINER_CLASSES,
    TRAINER_CONFIG_CLASSES,
    canonical_key,
    normalize_dtype,
    optim_for_optimizer_class,
)
from llmmem.plan import Provenance

# a handler: what the call builds, or None when this call is not the one the table meant
Handler = Callable[[Findings, Symbol, CallArgs], Value | None]


_UNSLOTH_LOADERS = unsloth.LOADERS
_MODEL_CLASS_ENDINGS = (
    "ForCausalLM",
    "LMHeadModel",
    "ForConditionalGeneration",
    "ForSeq2SeqLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMaskedLM",
    "ForImageTextToText",
    "ForVision2Seq",
    "Model",
)
_PEFT_MODEL_CLASSES = frozenset({"PeftModel", "PeftModelForCausalLM", "PeftModelForSeq2SeqLM"})
_MODEL_METHODS_RETURNING_THE_MODEL = frozenset(
    {
        "to",
        "cuda",
        "cpu",
        "half",
        "bfloat16",
        "float",
        "train",
        "eval",
        "requires_grad_",
        "gradient_checkpointing_enable",
        "gradient_checkpointing_disable",
        "activation_checkpointing_enable",
        "activation_checkpointing_disable",
        "add_adapter",
        "load_adapter",
    }
)

# PEFT's LoraConfig defaults are applied by the builder; unsloth's get_peft_model has its own
# (`extract/frameworks/unsloth.py`, as are the other unsloth defaults the handlers below apply)
_UNSLOTH_LORA_DEFAULTS = unsloth.LORA_DEFAULTS


def is_model_class(name: str) -> bool:
    if any(word in name for word in ("Tokenizer", "Processor", "Config", "FeatureExtractor")):
        return False
    if name.startswith("Auto") and "Model" in name:
        return True
    return name.endswith(_MODEL_CLASS_ENDINGS)


def config_class_of(name: str) -> str | None:
    return name if name in TRAINER_CONFIG_CLASSES else None


def config_default(config: ConfigObject, name: str) -> Value:
    """`args.bf16` for a field the script did not set: the config class's default."""
    table = CONFIG_DEFAULTS.get(TRAINER_CONFIG_CLASSES.get(config.class_name, ""), {})
    key = canonical_key(name)
    if key is not None and key in table:
        return Known(table[key], None, Provenance.DEFAULT, f"{config.class_name} default")
    if name in ("bf16", "fp16") and "bf16" not in table:
        return Known(False, None, Provenance.DEFAULT, f"{config.class_name} default")
    return Unknown(f"{config.declared_name}.{name}")


# -- models ----------------------------------------------------------------------------------


def new_model(
    found: Findings, node: ast.Call, model_id: Value, keywords: dict[str, Value], loader: str = ""
) -> ModelObject:
    model = ModelObject(node, model_id, keywords, loader or "transformers")
    quantization = keywords.get("quantization_config")
    if isinstance(quantization, QuantObject):
        quantization.used = True
    found.models.append(model)
    return model


def _trained_adapter(node: ast.Call) -> LoraObject:
    return LoraObject(
        node,
        {},
        [],
        used=True,
        default_note="a trained adapter: its settings are in adapter_config.json",
    )


def load_pretrained(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    owner = callee.owner
    node = args.node
    model_id = args.get("pretrained_model_name_or_path", 0)
    if owner in _UNSLOTH_LOADERS:
        found.unsloth = True
        model_id = args.get("model_name", 0)
        model = new_model(
            found, node, model_id or Unknown(unsloth.DEFAULT_MODEL_NOTE), args.keywords, "unsloth"
        )
        given = args.keywords.get("use_gradient_checkpointing")
        if given is not None:
            model.checkpointing = unsloth_checkpointing(given) or model.checkpointing
        return ListValue([model, TokenizerObject(node)], node)
    if owner in _PEFT_MODEL_CLASSES:
        base = args.get("model", 0)
        adapter = _trained_adapter(node)
        found.loras.append(adapter)
        if isinstance(base, ModelObject):
            base.lora = adapter
            return base
        return Unknown("a PEFT model")
    if owner.startswith("AutoPeftModel"):
        model = new_model(
            found, node, model_id or Unknown("no model id"), args.keywords, "peft-adapter"
        )
        adapter = _trained_adapter(node)
        found.loras.append(adapter)
        model.lora = adapter
        return model
    if "Tokenizer" in owner or "Processor" in owner:
        tokenizer = TokenizerObject(node, args.keywords.get("model_max_length"))
        found.tokenizers.append(tokenizer)
        return tokenizer
    if owner.endswith("Config"):
        return PretrainedConfigObject(model_id or Unknown("no model id"), node)
    if is_model_class(owner):
        return new_model(found, node, model_id or Unknown("no model id"), args.keywords)
    return Unknown(f"the result of {callee.name}()")


def from_config(found: Findings, callee: Symbol, args: CallArgs) -> Value | None:
    if not is_model_class(callee.owner):
        return None
    config = args.get("config", 0)
    model_id: Value = Unknown("a model built from a config")
    if isinstance(config, PretrainedConfigObject):
        model_id = config.model_id
    return new_model(found, args.node, model_id, args.keywords)


def load_pipeline(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    model = args.get("model", 1)
    if isinstance(model, ModelObject):
        return model
    if model is None:
        return Unknown("a pipeline with the task's default model")
    return new_model(found, args.node, model, args.keywords, "pipeline")


def model_method(model: ModelObject, method: str, args: CallArgs) -> Value:
    node = args.node
    if method in ("gradient_checkpointing_enable", "activation_checkpointing_enable"):
        model.checkpointing = Known(True, node)
    elif method in ("gradient_checkpointing_disable", "activation_checkpointing_disable"):
        model.checkpointing = Known(False, node)
    elif method in ("half", "bfloat16", "float"):
        dtype = {"half": "float16", "bfloat16": "bfloat16", "float": "float32"}[method]
        model.dtype = Known(dtype, node)
    elif method == "to":
        for value in [*args.positional, args.keywords.get("dtype")]:
            known = settle(value) if value is not None else None
            if known is not None and normalize_dtype(known.value) in (
                "bfloat16",
                "float16",
                "float32",
            ):
                model.dtype = known
    elif method in ("add_adapter", "load_adapter"):
        adapter = args.get("adapter_config", 0) or args.get("peft_config", 0)
        if isinstance(adapter, LoraObject):
            adapter.used = True
            model.lora = adapter
    elif method not in _MODEL_METHODS_RETURNING_THE_MODEL:
        return Unknown(f"the result of model.{method}()")
    return model


# -- tokenizers ------------------------------------------------------------------------------

TOKENIZER_METHODS = frozenset(
    {"__call__", "encode", "encode_plus", "batch_encode_plus", "apply_chat_template"}
)


def tokenizer_method(found: Findings, method: str, args: CallArgs) -> Value:
    if method in TOKENIZER_METHODS:
        read_tokenizer_call(found, args)
    return Unknown("tokenized text")


def named_like_tokenizer(dotted_name: str) -> bool:
    """`tokenizer`, `self.tokenizer`, `tok`, `llama_tokenizer`: a name that is a tokenizer
    where its value is not known (a parameter, an attribute, an import from another file)."""
    leaf = dotted_name.rsplit(".", 1)[-1].lower()
    return "tokenizer" in leaf or "tokeniser" in leaf or leaf == "tok"


def read_tokenizer_call(found: Findings, args: CallArgs) -> None:
    """`tokenizer(text, truncation=True, max_length=4096)`: every sequence is cut (or padded,
    with `padding="max_length"`) to 4096 tokens, the sequence length where nothing that
    reaches the trainer says otherwise. A `max_length` that neither cuts nor pads says nothing
    about the length of the sequences that are trained on."""
    length = args.keywords.get("max_length")
    known = settle(length) if length is not None else None
    if known is None or not isinstance(known.value, int) or isinstance(known.value, bool):
        return
    truncation = settle(args.keywords.get("truncation")) if "truncation" in args.keywords else None
    padding = settle(args.keywords.get("padding")) if "padding" in args.keywords else None
    if truncation is not None and (
        truncation.value is True
        or truncation.value in ("longest_first", "only_first", "only_second")
    ):
        how = "truncation"
    elif padding is not None and padding.value == "max_length":
        how = "padding='max_length'"
    else:
        return
    note = f"tokenizer max_length, {how}"
    found.tokenizer_lengths.append(replace(known, note=_combine_notes(known.note, note)))


# -- training configs and trainers -----------------------------------------------------------


def training_config(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    leaf = callee.leaf
    config = ConfigObject(leaf, leaf, args.node, dict(args.keywords), list(args.unread))
    found.configs.append(config)
    return config


def make_trainer(found: Findings, class_name: str, args: CallArgs) -> TrainerObject:
    trainer = TrainerObject(class_name, args)
    found.trainers.append(trainer)
    peft = args.get("peft_config")
    if isinstance(peft, LoraObject):
        peft.used = True
    return trainer


def trainer_call(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    return make_trainer(found, callee.leaf, args)


# -- PEFT and bitsandbytes -------------------------------------------------------------------


def lora_config(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    lora = LoraObject(args.node, dict(args.keywords), list(args.unread))
    found.loras.append(lora)
    return lora


def bitsandbytes_config(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    quant = QuantObject(args.node, dict(args.keywords))
    found.quants.append(quant)
    return quant


def get_peft_model(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    model = args.get("model", 0)
    if callee.owner in _UNSLOTH_LOADERS:
        lora = LoraObject(
            args.node,
            dict(args.keywords),
            list(args.unread),
            defaults=_UNSLOTH_LORA_DEFAULTS,
            default_note=unsloth.LORA_DEFAULTS_NOTE,
            used=True,
        )
        found.loras.append(lora)
        if isinstance(model, ModelObject):
            # its own keyword, else the one given to from_pretrained, else unsloth's default
            checkpointing = args.keywords.get("use_gradient_checkpointing")
            if checkpointing is None:
                checkpointing = model.keywords.get("use_gradient_checkpointing")
            if checkpointing is not None:
                model.checkpointing = unsloth_checkpointing(checkpointing) or model.checkpointing
            else:
                model.checkpointing = Known(
                    True, args.node, Provenance.DEFAULT, unsloth.CHECKPOINTING_DEFAULT_NOTE
                )
    else:
        lora_value = args.get("peft_config", 1)
        if isinstance(lora_value, LoraObject):
            lora = lora_value
        else:
            lora = LoraObject(
                args.node,
                {},
                [],
                used=True,
                default_note="the adapter config passed to get_peft_model could not be read",
            )
            found.loras.append(lora)
        lora.used = True
    if isinstance(model, ModelObject):
        model.lora = lora
        return model
    return Unknown("a PEFT model")


_UNSLOTH_OFFLOAD = unsloth.OFFLOADED_CHECKPOINTING_MEANS


def unsloth_checkpointing(value: Value) -> Known | None:
    """unsloth's `use_gradient_checkpointing`: "unsloth" (its default) is checkpointing with the
    saved activations offloaded to CPU memory, True is transformers' checkpointing, False off."""
    known = settle(value)
    if known is None:
        return None
    if known.value == unsloth.OFFLOADED_CHECKPOINTING:
        note = f'use_gradient_checkpointing="unsloth": {_UNSLOTH_OFFLOAD}'
        return replace(known, value=True, note=_combine_notes(known.note, note))
    return replace(known, value=known.value is True)


def prepare_kbit(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    model = args.get("model", 0)
    found.kbit_calls.append(args.node)
    if not isinstance(model, ModelObject):
        return Unknown("a prepared model")
    model.kbit_prepared = args.node
    checkpointing = args.get("use_gradient_checkpointing", 1)
    if checkpointing is None:
        model.checkpointing = Known(
            True,
            args.node,
            Provenance.DEFAULT,
            "prepare_model_for_kbit_training enables it (use_gradient_checkpointing=True)",
        )
    else:
        known = settle(checkpointing)
        if known is not None:
            model.checkpointing = known
    return model


# -- torch and accelerate --------------------------------------------------------------------


def data_loader(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    batch = args.get("batch_size", 1)
    if batch is None:
        batch = Known(1, args.node, Provenance.DEFAULT, "torch DataLoader default")
    loader = DataLoaderObject(batch)
    found.data_loaders.append(loader)
    return loader


def autocast(found: Findings, callee: Symbol, args: CallArgs) -> Value | None:
    name = callee.name
    if "torch" not in name and "amp" not in name:
        return None
    enabled = args.keywords.get("enabled")
    if enabled is not None and _truth(enabled) is False:
        return Unknown("an autocast context")
    dtype_value = args.get("dtype", 1 if name.endswith("torch.autocast") else None)
    if dtype_value is None:
        device = settle(args.get("device_type", 0))
        if device is not None and device.value == "cpu":
            return Unknown("an autocast context")
        found.precision_flags.append(
            ("fp16", Known(True, args.node, Provenance.DEFAULT, "autocast on CUDA: float16"))
        )
        return Unknown("an autocast context")
    known = settle(dtype_value)
    dtype = normalize_dtype(known.value) if known is not None else None
    if known is not None and dtype in ("bfloat16", "float16"):
        flag = "bf16" if dtype == "bfloat16" else "fp16"
        found.precision_flags.append((flag, replace(known, value=True, note="autocast")))
    return Unknown("an autocast context")


def accelerator(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    mixed = settle(args.keywords.get("mixed_precision"))
    if mixed is not None and mixed.value in ("bf16", "fp16"):
        found.precision_flags.append((str(mixed.value), replace(mixed, value=True)))
    accumulation = settle(args.keywords.get("gradient_accumulation_steps"))
    if accumulation is not None:
        found.accumulation.append(accumulation)
    return Unknown("an Accelerator")


def optimizer(found: Findings, callee: Symbol, args: CallArgs) -> Value | None:
    fused = args.get("fused")
    optim = optim_for_optimizer_class(
        callee.name, fused=fused is not None and _truth(fused) is True
    )
    if optim is None or not callee.leaf[:1].isupper():
        return None
    made = OptimizerObject(Known(optim, callee.node))
    found.optimizers.append(made)
    return made


# -- the tables ------------------------------------------------------------------------------
# keyed by the last part of the called name: `transformers.AutoModelForCausalLM.from_pretrained`
# and `AM.from_pretrained` both end in `from_pretrained`

# transformers and TRL: loading, pipelines, the training config classes and the trainers (the
# last two from the vocabulary's TRAINER_CONFIG_CLASSES and TRAINER_CLASSES)
TRANSFORMERS_CALLS: dict[str, Handler] = {
    "from_pretrained": load_pretrained,  # also unsloth's FastLanguageModel and PEFT's models
    "from_config": from_config,
    "pipeline": load_pipeline,
    **{name: training_config for name in TRAINER_CONFIG_CLASSES},
    **{name: trainer_call for name in TRAINER_CLASSES},
}

# PEFT; unsloth's `FastLanguageModel.get_peft_model` is told apart by its owner
PEFT_CALLS: dict[str, Handler] = {
    "LoraConfig": lora_config,
    "get_peft_model": get_peft_model,
    "prepare_model_for_kbit_training": prepare_kbit,
    # its name before PEFT 0.4 (8-bit only), still in alpaca-lora and its forks
    "prepare_model_for_int8_training": prepare_kbit,
}


def snapshot_download(found: Findings, callee: Symbol, args: CallArgs) -> Value | None:
    """`snapshot_download("Qwen/Qwen3-0.6B")` (huggingface_hub, modelscope): a local copy of
    that repository, whose config.json is the repository's: the model is the id."""
    repository = args.get("repo_id", 0) or args.get("model_id")
    known = settle(repository) if repository is not None else None
    if known is None or not isinstance(known.value, str):
        return None
    note = f"the local copy {callee.leaf}() makes of {known.value}"
    return replace(known, note=_combine_notes(known.note, note))


HUB_CALLS: dict[str, Handler] = {"snapshot_download": snapshot_download}

# Keras' model zoos: a preset is a Keras model (JAX, TensorFlow or torch backend), trained by
# Keras' own fit(), whose memory is not a transformers model's step
KERAS_PACKAGES = ("keras_nlp.", "keras_hub.")


def keras_preset(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    """`keras_nlp.models.GemmaCausalLM.from_preset("gemma_2b_en")`: a model llmmem does not size,
    said where it is loaded."""
    if not callee.name.startswith(KERAS_PACKAGES):
        return Unknown(f"the result of {callee.name}()")
    preset = settle(args.get("preset", 0)) if args.get("preset", 0) is not None else None
    named = f"'{preset.value}'" if preset is not None else "a preset"
    reason = (
        f"{callee.owner}.from_preset({named}) is a Keras model ({callee.name.split('.')[0]}), "
        "trained by Keras on JAX, TensorFlow or torch: llmmem sizes the PyTorch steps of "
        "transformers-style models"
    )
    return new_model(found, args.node, Unknown(reason), args.keywords)


KERAS_CALLS: dict[str, Handler] = {"from_preset": keras_preset}

BITSANDBYTES_CALLS: dict[str, Handler] = {"BitsAndBytesConfig": bitsandbytes_config}

# torch (optimizer classes are matched by `optimizer`, after every table) and accelerate
TORCH_CALLS: dict[str, Handler] = {"DataLoader": data_loader, "autocast": autocast}


def parallelism_config(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    """accelerate's `ParallelismConfig(dp_shard_size=..., cp_size=..., tp_size=...)`: its sizes
    as a dict, for `TrainingArguments(parallelism_config=...)` to pass on."""
    return DictValue(entries=dict(args.keywords), node=args.node, unread=list(args.unread))


ACCELERATE_CALLS: dict[str, Handler] = {
    "Accelerator": accelerator,
    "ParallelismConfig": parallelism_config,
}

CALLS_BY_LEAF: dict[str, Handler] = {
    **TRANSFORMERS_CALLS,
    **PEFT_CALLS,
    **HUB_CALLS,
    **KERAS_CALLS,
    **BITSANDBYTES_CALLS,
    **TORCH_CALLS,
    **ACCELERATE_CALLS,
}

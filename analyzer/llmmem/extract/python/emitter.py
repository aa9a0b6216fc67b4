"""From what the script reader found to the plan: `PlanEmitter` feeds the objects that reach
the trainer to a `PlanBuilder`."""

from __future__ import annotations

import ast
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmmem.extract.builder import PlanBuilder
from llmmem.extract.frameworks import unsloth
from llmmem.extract.numbers import shown
from llmmem.extract.python.findings import Findings
from llmmem.extract.python.training_evidence import why_not_training
from llmmem.extract.python.values import (
    ConfigObject,
    DictValue,
    Known,
    ListValue,
    LoraObject,
    ModelObject,
    OptimizerObject,
    QuantObject,
    Symbol,
    TrainerObject,
    Unknown,
    Value,
    _combine_notes,
    _truth,
    settle,
)
from llmmem.extract.vocabulary import (
    KEPT_TRAINING_SWITCHES,
    TRAINER_CLASSES,
    TRL_CONFIG_CLASSES,
    TRL_TRAINER_CLASSES,
    canonical_key,
    flag_setting,
    lora_key,
    normalize_dtype,
    normalize_fsdp,
    normalize_quant_storage,
    optim_for_optimizer_class,
)
from llmmem.files import UnreadableFile, read_file_bytes
from llmmem.plan import Provenance

MAX_DEEPSPEED_CONFIG_BYTES = 1_000_000
# TRL 0.29.1 SFTConfig.max_length (trl/trainer/sft_config.py)
SFT_DEFAULT_MAX_LENGTH = 1024
# GRPOConfig's fields that change the memory and are kept in the plan under their own names
# (read by `preference_plan.grpo_setup`), with TRL 0.29.1's defaults (trl/trainer/grpo_config.py);
# the lengths, batch, accumulation and checkpointing are the plan's own fields
GRPO_CONFIG_DEFAULTS: dict[str, object] = {
    "num_generations": 8,
    "beta": 0.0,
    "use_vllm": False,
    "vllm_mode": "server",
    "vllm_gpu_memory_utilization": 0.3,
    "vllm_enable_sleep_mode": False,
    "vllm_importance_sampling_correction": True,
    "steps_per_generation": None,
    "num_iterations": 1,
}
GRPO_FIELD_KINDS: dict[str, str] = {
    "num_generations": "int",
    "beta": "float",
    "use_vllm": "bool",
    "vllm_mode": "str",
    "vllm_gpu_memory_utilization": "float",
    "vllm_enable_sleep_mode": "bool",
    "vllm_importance_sampling_correction": "bool",
    "steps_per_generation": "int",
    "num_iterations": "int",
}
GRPO_KIND_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "True or False",
    "str": "a string",
}
GRPO_DEFAULT_NOTES: dict[str, str] = {
    "steps_per_generation": (
        "TRL 0.29.1 GRPOConfig default None: one generation per gradient_accumulation_steps"
    ),
    "vllm_mode": 'TRL 0.29.1 GRPOConfig default "server" (used only with use_vllm=True)',
}


# the task heads a model class may carry in place of its vocabulary head
TASK_HEADS = ("SequenceClassification", "TokenClassification", "QuestionAnswering")


class PlanEmitter:
    """Feeds what the script reader found to a PlanBuilder, choosing the objects that reach the
    trainer: its `args`, its `model`, its `peft_config`, its optimizer."""

    def __init__(self, reader: Findings, builder: PlanBuilder) -> None:
        self.reader = reader
        self.builder = builder
        self.source = reader.source

    def pragma_gives(self, key: str) -> bool:
        found = self.builder.get(key)
        return found is not None and found.source is Provenance.PRAGMA

    def set_known(self, key: str, known: Known, note: str = "") -> None:
        self.builder.set(
            key,
            known.value,
            known.source,
            self.source.range_of(known.node),
            _combine_notes(known.note, note),
        )

    def unread(
        self, label: str, value: Value, node: ast.AST | None = None, key: str | None = None
    ) -> None:
        """A line in `problems` for a value that matters but could not be read, unless a
        pragma already gives it."""
        if key is not None and self.pragma_gives(key):
            return
        reason = value.reason if isinstance(value, Unknown) else "not a plain value"
        where = value.node if isinstance(value, Unknown) and value.node is not None else node
        text = self.source.text_of(where) if where is not None else ""
        written = f"`{text}`" if text else "the value"
        self.reader.problem(where, f"{label}: could not read {written} ({reason})")

    def emit(self) -> tuple[str, str]:
        """Feed the builder; returns (framework, config class for the defaults)."""
        reader = self.reader
        trainer = reader.trainers[0] if reader.trainers else None
        config = self.pick_config(trainer)
        model, model_string = self.pick_model(trainer)

        # sequence-length hints from the tokenizer come first: the config's own values win
        for tokenizer in reader.tokenizers:
            known = settle(tokenizer.model_max_length)
            if known is not None and isinstance(known.value, int) and known.value < 1_000_000:
                self.set_known("max_seq_length", known, "tokenizer model_max_length")
        cut = self.sft_truncation(trainer, config)
        for length in reader.tokenizer_lengths:
            if cut is not None and isinstance(length.value, int) and length.value > cut:
                self.set_sft_truncation(trainer, config, cut, length)
            else:
                self.set_known("max_seq_length", length)
        for flag, known in reader.precision_flags:
            self.set_known(flag, known)
        for known in reader.accumulation:
            self.set_known("gradient_accumulation_steps", known)

        if model is not None:
            self.emit_model(model)
        elif model_string is not None:
            self.builder.model_range = self.source.range_of(model_string.node)
            self.set_known("model_id", model_string)
        elif len(reader.command_line_models) == 1 and (trainer is not None or config is not None):
            # the model is loaded where this file cannot be read (a helper of a module not
            # here, a wrapper of the trainer): the script's model argument names it
            argument = reader.command_line_models[0]
            self.builder.model_range = self.source.range_of(argument.node)
            self.set_known(
                "model_id",
                argument,
                "the script's model argument; what loads it is not read here",
            )
        if trainer is not None:
            self.emit_trainer_keywords(trainer)
        if config is not None:
            self.builder.trainer_range = self.source.range_of(config.node)
            self.emit_config(config, model_loaded_by_trainer=model is None)
        elif trainer is not None:
            self.builder.trainer_range = self.source.range_of(trainer.args.node)
        if model is None and model_string is not None and self.builder.get("torch_dtype") is None:
            # TRL's trainers load a model named by string with `create_model_from_path`
            # (trl/trainer/utils.py, 0.29.1 and 1.16.0): `dtype` defaults to float32 there,
            # not to the checkpoint's dtype as transformers 5's from_pretrained would
            self.builder.set(
                "torch_dtype",
                "float32",
                Provenance.DEFAULT,
                self.builder.model_range,
                "TRL loads a model named by string in float32 unless model_init_kwargs says dtype",
            )
        if model is not None:
            self.emit_model_switches(model)
        self.emit_adapter(trainer, model)
        self.emit_quantization(model)
        self.emit_optimizer(trainer, config)
        if config is None and trainer is None:
            self.emit_plain_loop()
            if model is None and model_string is None and reader.launched_command is not None:
                command, node = reader.launched_command
                self.builder.set(
                    "launch",
                    command,
                    Provenance.EXPLICIT,
                    self.source.range_of(node),
                    "a training command the script runs",
                )
        self.emit_sequence_hints()

        framework = "hf"
        if (trainer is not None and trainer.class_name in TRL_TRAINER_CLASSES) or (
            config is not None and config.class_name in TRL_CONFIG_CLASSES
        ):
            framework = "trl"
        if config is not None:
            config_class = config.class_name
        elif trainer is not None:
            config_class = TRAINER_CLASSES[trainer.class_name][0]
        else:
            config_class = "none"
        if config_class == "GRPOConfig":
            self.emit_grpo_defaults()
            self.emit_grpo_world_size()
        if reader.unsloth:
            self.builder.set("unsloth", True, Provenance.EXPLICIT, None)
        if config is not None and not config.unread:
            # TRL: how samples share a micro-batch (scenario turns these into the packing)
            for name in KEPT_TRAINING_SWITCHES:
                given = config.fields.get(name)
                if isinstance(given, Known) and given.value is not None:
                    self.set_known(name, given)
            kwargs = config.fields.get("gradient_checkpointing_kwargs")
            if isinstance(kwargs, DictValue) and not kwargs.unread:
                reentrant = kwargs.entries.get("use_reentrant")
                if isinstance(reentrant, Known) and isinstance(reentrant.value, bool):
                    self.set_known("use_reentrant", reentrant)
        if trainer is not None:
            self.builder.set(
                "trainer",
                trainer.class_name,
                Provenance.EXPLICIT,
                self.source.range_of(trainer.args.node),
            )
        reason = why_not_training(reader)
        if reason is not None:
            self.builder.set("not_training", reason, Provenance.EXPLICIT, None)
        return framework, config_class

    # -- TRL's SFTTrainer cuts a tokenized dataset -------------------------------------------

    def sft_truncation(
        self, trainer: TrainerObject | None, config: ConfigObject | None
    ) -> int | None:
        """The length TRL's SFTTrainer cuts every sequence of its dataset to, where the script
        leaves `max_length` to its default: TRL 0.29.1 `SFTTrainer._prepare_dataset` truncates
        to `SFTConfig.max_length` (default 1024) a dataset already tokenized (an `input_ids`
        column) as much as text it tokenizes itself, unless `dataset_kwargs` says
        `skip_prepare_dataset` (a `TrainingArguments` given to it becomes an `SFTConfig` with
        that default). None where it does not apply: another trainer (HF `Trainer` keeps the
        tokenizer's length), a `max_length` written (None included: no cut), packing (the
        sequence is then the packed length, not modelled here)."""
        if trainer is None or trainer.class_name != "SFTTrainer":
            return None
        if any(name in trainer.args.keywords for name in ("max_length", "max_seq_length")):
            return None
        if config is None:  # no `args`: SFTTrainer makes an SFTConfig of its defaults
            given = trainer.args.get("args", TRAINER_CLASSES[trainer.class_name][1])
            if given is not None and not (isinstance(given, Known) and given.value is None):
                return None
            return SFT_DEFAULT_MAX_LENGTH
        fields = config.fields
        if config.unread or any(name in fields for name in ("max_length", "max_seq_length")):
            return None
        if "packing" in fields and _truth(fields["packing"]) is not False:
            return None
        if "dataset_kwargs" in fields:
            given = fields["dataset_kwargs"]
            if not isinstance(given, DictValue) or given.unread:
                return None
            skip = given.entries.get("skip_prepare_dataset")
            if skip is not None and _truth(skip) is not False:
                return None
        return SFT_DEFAULT_MAX_LENGTH

    def set_sft_truncation(
        self, trainer: TrainerObject | None, config: ConfigObject | None, cut: int, length: Known
    ) -> None:
        node = config.node if config is not None else trainer.args.node if trainer else None
        self.builder.set(
            "max_seq_length",
            cut,
            Provenance.DEFAULT,
            self.source.range_of(node) if node is not None else None,
            f"SFTTrainer truncates the tokenized dataset to SFTConfig.max_length, default {cut} "
            f"(TRL 0.29.1), shorter than the tokenizer's max_length={length.value}",
        )

    # -- choices -----------------------------------------------------------------------------

    def pick_config(self, trainer: TrainerObject | None) -> ConfigObject | None:
        if trainer is not None:
            index = TRAINER_CLASSES[trainer.class_name][1]
            given = trainer.args.get("args", index)
            if isinstance(given, ConfigObject):
                return given
            if given is not None and not (isinstance(given, Known) and given.value is None):
                self.unread(f"{trainer.class_name}(args=...)", given, trainer.args.node)
                return self.reader.configs[0] if self.reader.configs else None
            return None
        return self.reader.configs[0] if self.reader.configs else None

    def pick_model(self, trainer: TrainerObject | None) -> tuple[ModelObject | None, Known | None]:
        reader = self.reader
        if trainer is not None:
            given = trainer.args.get("model", 0)
            if isinstance(given, ModelObject):
                self.note_reference_model(trainer, given)
                return given, None
            known = settle(given) if given is not None else None
            if known is not None and isinstance(known.value, str):
                return None, known
        models = [model for model in reader.models if model.loader != "pipeline"] or reader.models
        if not models:
            return None, None
        if trainer is not None:
            self.note_reference_model(trainer, models[0])
        return models[0], None

    def note_reference_model(self, trainer: TrainerObject, model: ModelObject) -> None:
        reference = trainer.args.get("ref_model", 1 if trainer.class_name == "DPOTrainer" else None)
        if isinstance(reference, ModelObject) and reference is not model:
            known = settle(reference.model_id)
            if known is not None and isinstance(known.value, str):
                self.set_known("ref_model_id", known)
        if trainer.class_name == "PPOTrainer":
            # the value and reward models beside the policy (TRL's PPOTrainer keywords)
            for keyword, key in (
                ("value_model", "value_model_id"),
                ("reward_model", "reward_model_id"),
            ):
                other = trainer.args.get(keyword)
                if isinstance(other, ModelObject):
                    known = settle(other.model_id)
                    if known is not None and isinstance(known.value, str):
                        self.set_known(key, known)

    # -- the model ---------------------------------------------------------------------------

    def emit_model(self, model: ModelObject) -> None:
        builder = self.builder
        builder.model_range = self.source.range_of(model.call)
        known = settle(model.model_id)
        if self.pragma_gives("model_id"):
            pass
        elif known is not None and isinstance(known.value, str) and known.value.strip():
            note = (
                "a PEFT adapter: the base model is named in its adapter_config.json"
                if model.loader == "peft-adapter"
                else ""
            )
            self.set_known("model_id", known, note)
        else:
            reason = (
                "empty: the command line must give it"
                if known is not None and known.value == ""
                else known.note
                if known is not None and known.note
                else model.model_id.reason
                if isinstance(model.model_id, Unknown)
                else "not a string"
            )
            written = model.call.args[0] if model.call.args else model.call
            text = self.source.text_of(written)
            self.reader.problem(
                model.call,
                f"model id: could not read `{text}` ({reason}); "
                "add `# llmmem: model=<hub id or local path>`",
            )
            # where the model is written, and why it is not known (LLM010 says it there)
            builder.set(
                "model_unread",
                reason if reason.startswith(f"`{text}`") else f"`{text}` ({reason})",
                Provenance.EXPLICIT,
                self.source.range_of(written),
            )
        self.emit_loading_keywords(model.keywords, model.loader)
        if model.dtype is not None:
            dtype = normalize_dtype(model.dtype.value)
            if dtype is not None:
                self.set_known("torch_dtype", replace(model.dtype, value=dtype))

    def emit_loading_keywords(self, keywords: dict[str, Value], loader: str) -> None:
        for name in ("torch_dtype", "dtype"):
            if name not in keywords:
                continue
            known = settle(keywords[name])
            if known is None:
                self.unread(name, keywords[name])
            elif known.value is None and loader == "unsloth":
                self.set_known(
                    "torch_dtype",
                    replace(known, value=unsloth.DTYPE_WHEN_UNSET, source=Provenance.ASSUMED),
                    unsloth.DTYPE_WHEN_UNSET_NOTE,
                )
            elif normalize_dtype(known.value) is not None:
                self.set_known("torch_dtype", replace(known, value=normalize_dtype(known.value)))
        if loader == "unsloth" and "dtype" not in keywords and "torch_dtype" not in keywords:
            self.builder.set(
                "torch_dtype",
                unsloth.DTYPE_WHEN_UNSET,
                Provenance.ASSUMED,
                self.builder.model_range,
                unsloth.DTYPE_WHEN_UNSET_NOTE,
            )
        attention = keywords.get("attn_implementation")
        if attention is not None:
            known = settle(attention)
            if known is not None:
                self.set_known("attn_implementation", known)
        flash = keywords.get("use_flash_attention_2")
        if flash is not None and _truth(flash):
            known = settle(flash)
            if known is not None:
                self.set_known("attn_implementation", replace(known, value="flash_attention_2"))
        cache = settle(keywords.get("use_cache")) if "use_cache" in keywords else None
        if cache is not None:
            self.set_known("use_cache", cache)
        if loader == "unsloth":
            length = keywords.get("max_seq_length")
            if length is not None:
                known = settle(length)
                if known is not None:
                    self.set_known("max_seq_length", known)
                else:
                    self.unread("max_seq_length", length)

    def emit_model_switches(self, model: ModelObject) -> None:
        """What later calls on the model turned on; set after the trainer's arguments, because
        `model.gradient_checkpointing_enable()` stays on whatever the arguments say."""
        if model.checkpointing is not None:
            self.set_known("gradient_checkpointing", model.checkpointing)
        if model.use_cache is not None:
            self.set_known("use_cache", model.use_cache)
        if model.attention is not None:
            self.set_known("attn_implementation", model.attention)
        self.emit_task_head(model)

    def emit_task_head(self, model: ModelObject) -> None:
        """`AutoModelForSequenceClassification.from_pretrained(..., num_labels=3)`: the task
        head the model is loaded with (none for a language-model class), and its labels
        (transformers' default 2 where the call gives none)."""
        func = model.call.func
        owner = func.value if isinstance(func, ast.Attribute) else func
        class_name = ast.unparse(owner).rsplit(".", 1)[-1]
        task = next(
            (task for task in TASK_HEADS if class_name.endswith(f"For{task}")),
            None,
        )
        if task is None:
            return
        where = self.source.range_of(model.call)
        self.builder.set("task_head", task, Provenance.EXPLICIT, where, f"{class_name}")
        labels = settle(model.keywords.get("num_labels"))
        if labels is not None and isinstance(labels.value, int):
            self.set_known("num_labels", labels)
        else:
            self.builder.set("num_labels", 2, Provenance.DEFAULT, where, "transformers' default")

    # -- the trainer and its arguments -------------------------------------------------------

    def emit_trainer_keywords(self, trainer: TrainerObject) -> None:
        for name in ("max_seq_length", "max_length"):
            value = trainer.args.keywords.get(name)
            if value is None:
                continue
            known = settle(value)
            if known is not None and known.value is not None:
                self.set_known("max_seq_length", known)

    def emit_config(self, config: ConfigObject, *, model_loaded_by_trainer: bool) -> None:
        for description in config.unread:
            self.reader.problem(
                config.node, f"{config.declared_name}: could not read {description}"
            )
        for name, value in config.fields.items():
            self.emit_config_field(config, name, value, model_loaded_by_trainer)

    def emit_config_field(
        self, config: ConfigObject, name: str, value: Value, model_loaded_by_trainer: bool
    ) -> None:
        if name == "deepspeed":
            self.emit_deepspeed(value)
            return
        if name == "fsdp":
            self.emit_fsdp(value)
            return
        if name == "parallelism_config":
            self.emit_parallelism(value)
            return
        if name == "model_init_kwargs":
            if model_loaded_by_trainer and isinstance(value, DictValue):
                self.emit_loading_keywords(value.entries, "trl")
            return
        if name == "loss_type" and config.class_name == "CPOConfig":
            # CPOConfig.__post_init__ (trl 0.29.1): "alphapo" is SimPO's loss with cpo_alpha 0
            known = settle(value)
            if known is not None and known.value == "alphapo":
                self.set_known("cpo_alpha", replace(known, value=0.0))
            return
        if name == "loss_type":
            known = settle(value)
            if known is not None and isinstance(known.value, str):
                loss = "chunked" if "chunk" in known.value else "standard"
                self.set_known("loss", replace(known, value=loss))
            return
        if config.class_name == "GRPOConfig" and name in GRPO_CONFIG_DEFAULTS:
            self.emit_grpo_field(config, name, value)
            return
        flag = flag_setting(name)
        if flag is not None:
            known = settle(value)
            if known is not None and _truth(known):
                key, meaning = flag
                self.set_known(key, replace(known, value=meaning))
            return
        canonical = canonical_key(name)
        if canonical is None or canonical == "model_id":
            return
        known = settle(value)
        if known is None:
            self.unread(f"{config.declared_name}.{name}", value, config.node, canonical)
            return
        if known.value is None:
            return  # None means "not set" for every key read here
        self.set_known(canonical, known)

    def emit_grpo_field(self, config: ConfigObject, name: str, value: Value) -> None:
        label = f"{config.declared_name}.{name}"
        known = settle(value)
        if known is None:
            self.unread(label, value, config.node, name)
            return
        if known.value is None:
            return  # None is the field's "not set": TRL's default stays
        kind = GRPO_FIELD_KINDS[name]
        written = known.value
        if isinstance(written, bool):
            fits = kind == "bool"
        elif isinstance(written, int):
            fits = kind in ("int", "float")
        elif isinstance(written, float):
            fits = kind == "float"
        else:
            fits = kind == "str" and isinstance(written, str)
        if not fits:
            default = GRPO_CONFIG_DEFAULTS[name]
            self.reader.problem(
                known.node or config.node,
                f"{label}: {shown(repr(written), 40)} is not {GRPO_KIND_WORDS[kind]}; "
                f"TRL 0.29.1's default {default!r} is assumed",
            )
            return
        self.set_known(name, known)

    def emit_grpo_defaults(self) -> None:
        """TRL 0.29.1's GRPOConfig defaults for the fields the file leaves out; a value the file
        gives outranks them."""
        for key, default in GRPO_CONFIG_DEFAULTS.items():
            note = GRPO_DEFAULT_NOTES.get(key, f"TRL 0.29.1 GRPOConfig default {default!r}")
            self.builder.set(key, default, Provenance.DEFAULT, self.builder.trainer_range, note)

    def emit_grpo_world_size(self) -> None:
        """Where nothing states the world size and one device cannot hold the generation batch
        GRPOConfig asks for (`per_device_train_batch_size × world × steps_per_generation` must
        divide by num_generations: it raises otherwise), the smallest world size it accepts is
        assumed: the script is launched on that many processes by a file not read here."""
        if self.builder.has("distributed.world_size"):
            return
        values = [
            self.builder.get(key)
            for key in (
                "per_device_train_batch_size",
                "steps_per_generation",
                "gradient_accumulation_steps",
                "num_generations",
            )
        ]
        batch, per_generation, accumulation, generations = (
            known.value if known is not None and isinstance(known.value, int) else None
            for known in values
        )
        steps = per_generation or accumulation or 1
        if not batch or not generations or generations < 1 or (batch * steps) % generations == 0:
            return
        world = generations // math.gcd(batch * steps, generations)
        self.builder.set(
            "distributed.world_size",
            world,
            Provenance.ASSUMED,
            self.builder.trainer_range,
            f"assumed {world} GPUs: the fewest GRPOConfig accepts ({batch} per device × {steps} "
            f"steps per generation × GPUs must divide by num_generations {generations}); add "
            "`# llmmem: world_size=N` for the launch's own",
        )

    def emit_deepspeed(self, value: Value) -> None:
        known = settle(value)
        if known is None:
            self.unread("deepspeed", value)
            return
        if isinstance(known.value, dict):
            self.builder.set(
                "distributed.deepspeed_config",
                "<inline dict>",
                known.source,
                self.source.range_of(known.node),
                known.note,
            )
            self.emit_deepspeed_settings(known.value, known, "")
            return
        if not isinstance(known.value, str) or not known.value:
            return
        self.set_known("distributed.deepspeed_config", known)
        config_path = Path(known.value)
        if not config_path.is_absolute():
            config_path = self.reader.path.parent / config_path
        try:
            data = read_file_bytes(config_path, MAX_DEEPSPEED_CONFIG_BYTES)
            document = json.loads(data.decode("utf-8", errors="replace"))
        except (OSError, ValueError) as err:
            reason = str(err) if isinstance(err, UnreadableFile) else type(err).__name__
            self.reader.problem(
                known.node,
                f"DeepSpeed config {known.value} could not be read ({reason}); "
                "ZeRO stage unknown, assumed off",
            )
            return
        if isinstance(document, dict):
            config_known = replace(known, source=Provenance.CONFIG)
            self.emit_deepspeed_settings(document, config_known, f"from {known.value}")

    def emit_deepspeed_settings(self, document: dict[Any, Any], origin: Known, note: str) -> None:
        sequence = document.get("sequence_parallel_size")  # Ulysses' group (DeepSpeed's ALST)
        if isinstance(sequence, int) and not isinstance(sequence, bool):
            known = replace(origin, value=sequence)
            self.set_known("deepspeed_sequence_parallel_size", known, note)
        zero = document.get("zero_optimization")
        if not isinstance(zero, dict):
            return
        stage = zero.get("stage")
        if isinstance(stage, int) and not isinstance(stage, bool):
            self.set_known("distributed.zero_stage", replace(origin, value=stage), note)
        for section, key in (
            ("offload_optimizer", "distributed.offload_optimizer"),
            ("offload_param", "distributed.offload_params"),
        ):
            offload = zero.get(section)
            if isinstance(offload, dict):
                device = str(offload.get("device", "none")).lower()
                self.set_known(key, replace(origin, value=device in ("cpu", "nvme")), note)
        for name, key in (
            ("reduce_bucket_size", "reduce_bucket_size"),
            ("overlap_comm", "overlap_comm"),
            ("contiguous_gradients", "contiguous_gradients"),
            ("stage3_max_reuse_distance", "max_reuse_distance"),
            ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
            ("stage3_param_persistence_threshold", "param_persistence_threshold"),
            ("sub_group_size", "sub_group_size"),
        ):
            if name in zero:
                self.set_known(f"distributed.{key}", replace(origin, value=zero[name]), note)

    def emit_parallelism(self, value: Value) -> None:
        """accelerate's ParallelismConfig: the context (cp_size: torch's ring; sp_size:
        DeepSpeed's Ulysses) and tensor-parallel groups (llmmem.scenario reads them)."""
        if not isinstance(value, DictValue):
            self.unread("parallelism_config", value)
            return
        for key in ("dp_replicate_size", "dp_shard_size", "cp_size", "sp_size", "tp_size"):
            entry = value.entries.get(key)
            known = settle(entry) if entry is not None else None
            if known is not None and isinstance(known.value, int):
                self.set_known(key, known)
            elif entry is not None:
                self.unread(f"ParallelismConfig.{key}", entry)

    def emit_fsdp(self, value: Value) -> None:
        known = settle(value)
        if known is None:
            self.unread("fsdp", value)
            return
        if not known.value:
            return
        sharding, offload = normalize_fsdp(known.value)
        if sharding is None:
            self.reader.problem(known.node, f"fsdp: cannot read {known.value!r}")
            return
        self.set_known("distributed.fsdp", replace(known, value=sharding))
        if offload:
            self.set_known("distributed.offload_params", replace(known, value=True))
            self.set_known("distributed.offload_optimizer", replace(known, value=True))

    # -- adapters, quantization, optimizers, loops --------------------------------------------

    def emit_adapter(self, trainer: TrainerObject | None, model: ModelObject | None) -> None:
        lora: LoraObject | None = None
        note = ""
        if trainer is not None:
            given = trainer.args.get("peft_config")
            if isinstance(given, LoraObject):
                lora = given
                # the trainer wraps the model itself (and, in some TRL releases, prepares a
                # k-bit one first: rules/practices.py)
                self.builder.set(
                    "adapter_applied_by",
                    trainer.class_name,
                    Provenance.EXPLICIT,
                    self.source.range_of(trainer.args.node),
                )
        if lora is None and model is not None and model.lora is not None:
            lora = model.lora
        if lora is None:
            unused = [item for item in self.reader.loras if not item.used]
            if len(unused) == 1:
                lora = unused[0]
                note = "this LoraConfig is not passed to anything llmmem follows; assumed used"
        if lora is None:
            return
        builder = self.builder
        builder.lora_range = self.source.range_of(lora.call)
        builder.set(
            "lora.enabled",
            True,
            Provenance.EXPLICIT,
            builder.lora_range,
            _combine_notes(lora.default_note, note),
        )
        for description in lora.unread:
            self.reader.problem(lora.call, f"LoRA settings: could not read {description}")
        for name, value in lora.fields.items():
            key = lora_key(name)
            if key is None:
                continue
            known = settle(value)
            if known is None:
                self.unread(f"LoRA {name}", value, lora.call)
                continue
            if key == "lora.target_modules" and known.value is None:
                continue
            self.set_known(key, known, note)
        for key, default in lora.defaults.items():
            builder.set(key, default, Provenance.DEFAULT, builder.lora_range, lora.default_note)

    def emit_quantization(self, model: ModelObject | None) -> None:
        builder = self.builder
        quant: QuantObject | None = None
        note = ""
        keywords = model.keywords if model is not None else {}
        given = keywords.get("quantization_config")
        if isinstance(given, QuantObject):
            quant = given
        elif given is not None and not (isinstance(given, Known) and given.value is None):
            self.unread("quantization_config", given, model.call if model else None)
        if quant is None and given is None:
            unused = [item for item in self.reader.quants if not item.used]
            if len(unused) == 1:
                quant = unused[0]
                note = "this BitsAndBytesConfig is not passed to anything llmmem follows"
        fields: dict[str, Value] = dict(keywords)
        if quant is not None:
            fields = quant.fields
            builder.quantization_range = self.source.range_of(quant.call)
        for name, value in fields.items():
            flag = flag_setting(name)
            if flag is not None and flag[0] == "quantization.bits":
                known = settle(value)
                if known is not None and known.value is True:
                    self.set_known("quantization.bits", replace(known, value=flag[1]), note)
                    if builder.quantization_range is None:
                        builder.quantization_range = self.source.range_of(known.node)
                continue
            key = canonical_key(name)
            if key is None or not key.startswith("quantization."):
                continue
            known = settle(value)
            if known is None:
                self.unread(name, value)
                continue
            if key == "quantization.compute_dtype":
                dtype = normalize_dtype(known.value)
                if dtype is None:
                    continue
                known = replace(known, value=dtype)
            if key == "quantization.quant_storage":
                storage = normalize_quant_storage(known.value)
                if storage is None:
                    self.unread(name, value)
                    continue
                known = replace(known, value=storage)
            self.set_known(key, known, note)
        if model is not None and model.loader == "unsloth" and builder.has("quantization.bits"):
            where = builder.quantization_range
            unsloth_note = unsloth.FOUR_BIT_NOTE
            for key, default in unsloth.FOUR_BIT_DEFAULTS.items():
                builder.set(key, default, Provenance.DEFAULT, where, unsloth_note)
            weights = builder.get("torch_dtype")
            compute = (
                weights.value
                if weights is not None and weights.value != "auto"
                else unsloth.FOUR_BIT_COMPUTE_DTYPE
            )
            builder.set(
                "quantization.compute_dtype", compute, Provenance.DEFAULT, where, unsloth_note
            )
        kbit = model.kbit_prepared if model is not None else None
        if kbit is None and self.reader.kbit_calls:
            kbit = self.reader.kbit_calls[0]
        if kbit is not None:
            builder.set(
                "quantization.prepare_for_kbit_training",
                True,
                Provenance.EXPLICIT,
                self.source.range_of(kbit),
            )

    def emit_optimizer(self, trainer: TrainerObject | None, config: ConfigObject | None) -> None:
        chosen: OptimizerObject | None = None
        if trainer is not None:
            optimizers = trainer.args.get("optimizers")
            if isinstance(optimizers, ListValue) and optimizers.items:
                first = optimizers.items[0]
                if isinstance(first, OptimizerObject):
                    chosen = first
                elif not (isinstance(first, Known) and first.value is None):
                    self.unread("optimizers", first, trainer.args.node)
            pair = trainer.args.get("optimizer_cls_and_kwargs")
            if isinstance(pair, ListValue) and pair.items and isinstance(pair.items[0], Symbol):
                name = optim_for_optimizer_class(pair.items[0].name)
                if name is not None:
                    chosen = OptimizerObject(Known(name, pair.items[0].node))
        elif config is None and self.reader.optimizers:
            chosen = self.reader.optimizers[0]
        if chosen is not None:
            self.set_known("optim", chosen.optim, "an optimizer built in the script")

    def emit_plain_loop(self) -> None:
        loaders = self.reader.data_loaders
        if loaders:
            batch = loaders[0].batch_size
            known = settle(batch)
            if known is not None:
                self.set_known("per_device_train_batch_size", known)
            else:
                self.unread("DataLoader batch_size", batch)

    def emit_sequence_hints(self) -> None:
        """Where nothing that reaches the model says how long sequences are, a command-line
        argument or dataclass field named like a sequence length is the best guess."""
        if self.builder.has("max_seq_length") or not self.reader.command_line_lengths:
            return
        hint = self.reader.command_line_lengths[0]
        self.set_known(
            "max_seq_length",
            hint,
            "an argument named like a sequence length (where it is used was not traced)",
        )

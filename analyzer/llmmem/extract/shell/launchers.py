"""Launchers: which program a command runs and how its options are taken apart.

python, torchrun, `python -m torch.distributed.run`, accelerate launch, deepspeed,
llamafactory-cli, tune run, trl, axolotl, litgpt, ms-swift (`swift sft|pt|rlhf`) and the
schedulers that start them (srun, mpirun, `ray job submit`). The tables here say which
launcher options are bare flags, which program arguments take several values, which framework
each launcher implies, and when a command line starts a DeepSpeed-Chat training script (what
its flags mean: `extract/frameworks/deepspeed_chat.py`) or an OpenRLHF trainer
(`extract/frameworks/openrlhf.py`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

from llmmem.extract.frameworks.deepspeed_chat import (
    DEEPSPEED_CHAT_BESIDE_ZERO_STAGE,
    DEEPSPEED_CHAT_LAUNCHERS,
    DEEPSPEED_CHAT_OWN_FLAGS,
    HF_ARGUMENT_PARSERS,
)
from llmmem.extract.frameworks.deepspeed_chat import (  # the shell reader takes them from here
    DEEPSPEED_CHAT_FLAGS as DEEPSPEED_CHAT_FLAGS,
)
from llmmem.extract.frameworks.deepspeed_chat import (
    deepspeed_chat_meanings as deepspeed_chat_meanings,
)
from llmmem.extract.frameworks.openrlhf import LIST_FLAGS as OPENRLHF_LIST_FLAGS
from llmmem.extract.frameworks.openrlhf import openrlhf_trainer
from llmmem.extract.frameworks.swift import SWIFT_COMMANDS
from llmmem.extract.shell.expand import ExpandedCommand, ShellWord


@dataclass(frozen=True)
class WordSlice:
    """A word, or the part of it after `=` in `--name=value`."""

    word: ShellWord
    begin: int = 0

    @property
    def text(self) -> str:
        return self.word.text[self.begin :]

    @property
    def is_known(self) -> bool:
        return self.word.is_known

    def offsets(self) -> tuple[int, int]:
        return self.word.span(self.begin)


@dataclass(frozen=True)
class CommandOption:
    """`--name value`, `--name=value` or a bare `--name`, as a launcher or a program reads it."""

    name: str  # dashes stripped, `-` inside read as `_`: "nproc_per_node", "train.epochs"
    flag: ShellWord
    values: tuple[WordSlice, ...] = ()  # empty: a bare flag

    @property
    def value(self) -> WordSlice | None:
        return self.values[0] if self.values else None


@dataclass
class Launch:
    """One command that starts training, taken apart."""

    launcher: str  # python, torchrun, accelerate, deepspeed, llamafactory, tune, trl, axolotl,
    # litgpt
    command: ExpandedCommand
    options: dict[str, CommandOption] = field(default_factory=dict)  # the launcher's own
    target: ShellWord | None = None  # the script, module, config or recipe it starts
    target_kind: str = "none"  # "script", "module", "config", "none"
    subcommand: str | None = None  # trl sft, llamafactory-cli train, litgpt finetune_lora
    arguments: list[ShellWord] = field(default_factory=list)  # what the program receives
    scheduler_options: dict[str, CommandOption] = field(default_factory=dict)  # srun, mpirun
    outer_launcher: str | None = None  # `accelerate launch -m axolotl.cli.train`: accelerate

    def uses(self, *launchers: str) -> bool:
        """Started by one of `launchers`, directly or through another launcher."""
        return self.launcher in launchers or self.outer_launcher in launchers

    @property
    def priority(self) -> int:
        """Launchers made for training come before a plain `python x.py`."""
        if self.launcher != "python":
            return 2
        name = self.target.text.lower() if self.target is not None else ""
        return 1 if any(word in name for word in ("train", "finetune", "sft", "tune")) else 0


PYTHON_NAME = re.compile(r"^python[0-9.]*$")
SCHEDULERS = frozenset({"srun", "mpirun", "mpiexec"})
LAUNCH_PROGRAMS = frozenset(
    {
        "torchrun",
        "accelerate",
        "deepspeed",
        "llamafactory-cli",
        "lmf",
        "tune",
        "trl",
        "axolotl",
        "litgpt",
        "swift",
    }
)
RUNNERS = frozenset({"uv", "poetry", "pipenv", "pixi", "conda", "mamba", "micromamba", "pdm"})
RUNNER_VALUE_OPTIONS = frozenset(
    {"-n", "--name", "-p", "--prefix", "--with", "--env-file", "--python", "--project", "-e"}
)
WRAPPERS = frozenset({"nohup", "exec", "time", "command", "builtin", "stdbuf", "nice", "sudo"})
PYTHON_BOOLEAN_OPTIONS = frozenset("bBdEiIOqsSuvx")
TORCHRUN_BOOLEANS = frozenset(
    {"standalone", "no_python", "module", "m", "run_path", "virtual_local_rank"}
)
ACCELERATE_BOOLEANS = frozenset(
    {
        "multi_gpu",
        "use_deepspeed",
        "use_fsdp",
        "use_megatron_lm",
        "use_xpu",
        "cpu",
        "tpu",
        "debug",
        "quiet",
        "q",
        "module",
        "m",
        "no_python",
        "same_network",
        "enable_cpu_affinity",
        "dynamo_use_fullgraph",
        "dynamo_use_dynamic",
        "ipex",
    }
)
DEEPSPEED_BOOLEANS = frozenset(
    {
        "no_python",
        "module",
        "no_local_rank",
        "no_ssh_check",
        "autotuning",
        "force_multi",
        "save_pid",
        "enable_each_rank_log",
        "bind_cores_to_rank",
        "elastic_training",
        "no_ssh",
    }
)
TRL_COMMANDS = {
    "sft": "SFTConfig",
    "dpo": "DPOConfig",
    "grpo": "GRPOConfig",
    "kto": "KTOConfig",
    "reward": "RewardConfig",
    "orpo": "ORPOConfig",
}
LITGPT_COMMANDS = frozenset(
    {
        "finetune",
        "finetune_lora",
        "finetune_full",
        "finetune_adapter",
        "finetune_adapter_v2",
        "pretrain",
    }
)
KNOWN_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "accelerate.commands.launch": "accelerate",
    "deepspeed.launcher.runner": "deepspeed",
    "axolotl.cli.train": "axolotl",
    "llamafactory.launcher": "llamafactory",
}
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
LIST_FLAGS = frozenset(
    {
        "lora_target_modules",
        "lora_modules_to_save",
        "target_modules",
        "modules_to_save",
        "lora_target",
        "dataset",  # ms-swift and HF scripts take several datasets after one flag
        "val_dataset",
    }
    | OPENRLHF_LIST_FLAGS
)


def option_name(text: str) -> str:
    return text.lstrip("-").replace("-", "_")


def read_options(
    words: list[ShellWord],
    start: int,
    *,
    booleans: frozenset[str],
    list_flags: frozenset[str] = frozenset(),
) -> tuple[dict[str, CommandOption], int]:
    """Options from `words[start:]` up to the first positional word; returns them and the index
    of that word. A flag not known to be boolean takes the next word as its value unless that
    word is another option or looks like the script or config being launched."""
    options: dict[str, CommandOption] = {}
    index = start
    while index < len(words):
        word = words[index]
        text = word.text
        if text == "--":
            return options, index + 1
        if not text.startswith("-") or text == "-" or _is_number(text):
            break
        if "=" in text:
            name = option_name(text.split("=", 1)[0])
            options[name] = CommandOption(name, word, (WordSlice(word, text.index("=") + 1),))
            index += 1
            continue
        name = option_name(text)
        index += 1
        if name in booleans:
            options[name] = CommandOption(name, word)
            continue
        values: list[WordSlice] = []
        while index < len(words) and _takes_as_value(words[index]):
            values.append(WordSlice(words[index]))
            index += 1
            if name not in list_flags:
                break
        options[name] = CommandOption(name, word, tuple(values))
    return options, index


def program_options(words: list[ShellWord]) -> dict[str, CommandOption]:
    """Every `--name value` among a program's arguments; positional words are skipped."""
    options: dict[str, CommandOption] = {}
    index = 0
    while index < len(words):
        found, after = read_options(words, index, booleans=frozenset(), list_flags=LIST_FLAGS)
        options.update(found)
        index = after if after > index else index + 1
    return options


def _is_number(text: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(\.\d*)?([eE]-?\d+)?", text))


def _takes_as_value(word: ShellWord) -> bool:
    text = word.text
    if text.startswith("-") and not _is_number(text) and text != "-":
        return False
    return not text.endswith(".py")


def interpret_command(command: ExpandedCommand) -> Launch | None:
    """The launch a command makes, or None when it starts no training."""
    words = command.words
    index = 0
    while index < len(words) and (
        _basename(words[index].text) in WRAPPERS
        or words[index].text.startswith("-")
        and index > 0
        and _basename(words[index - 1].text) in WRAPPERS
    ):
        index += 1
    index = _past_runners(words, index)
    if index < len(words) and _basename(words[index].text) == "env":
        index += 1
        while index < len(words) and (
            "=" in words[index].text or words[index].text.startswith("-")
        ):
            index += 1
    if index >= len(words):
        return None
    program = _basename(words[index].text)
    rest = index + 1
    if PYTHON_NAME.match(program):
        return interpret_python(command, rest)
    if program == "torchrun":
        return interpret_torchrun(command, rest, "torchrun")
    if program == "accelerate" and rest < len(words) and words[rest].text == "launch":
        return interpret_accelerate(command, rest + 1)
    if program == "deepspeed":
        return interpret_deepspeed(command, rest)
    if program in ("llamafactory-cli", "lmf"):
        return interpret_llamafactory(command, rest)
    if program == "tune" and rest < len(words) and words[rest].text == "run":
        return interpret_tune(command, rest + 1)
    if program == "trl" and rest < len(words) and words[rest].text in TRL_COMMANDS:
        launch = Launch("trl", command, subcommand=words[rest].text)
        return with_config_option(launch, words[rest + 1 :])
    if program == "axolotl" and rest < len(words) and words[rest].text == "train":
        return with_positional_config(
            Launch("axolotl", command, subcommand="train"), words[rest + 1 :]
        )
    if program == "litgpt" and rest < len(words) and words[rest].text in LITGPT_COMMANDS:
        return interpret_litgpt(command, rest)
    if program == "swift" and rest < len(words) and words[rest].text in SWIFT_COMMANDS:
        return interpret_swift(command, rest)
    if program in SCHEDULERS:
        return interpret_scheduler(command, rest)
    if program == "ray" and [word.text for word in words[rest : rest + 2]] == ["job", "submit"]:
        return interpret_ray_job(command, rest + 2)
    return None


def _past_runners(words: list[ShellWord], index: int) -> int:
    """Past an environment runner and its options: `uv run --with x`, `poetry run`, `conda
    run -n env`, `pixi run`: the command it runs is the launch."""
    if index + 1 >= len(words):
        return index
    if _basename(words[index].text) not in RUNNERS or words[index + 1].text != "run":
        return index
    index += 2
    while index < len(words) and words[index].text.startswith("-"):
        option = words[index].text
        index += 2 if option in RUNNER_VALUE_OPTIONS else 1
    return index


def interpret_ray_job(command: ExpandedCommand, start: int) -> Launch | None:
    """`ray job submit --address=... --runtime-env-json='...' -- python3 -m train ...`: the
    entrypoint after `--` (else the first Python or launcher word) is the launch; the Ray
    cluster places the processes the program asks for (OpenRLHF's PPO trainer does)."""
    words = command.words
    index = next((at + 1 for at in range(start, len(words)) if words[at].text == "--"), None)
    if index is None:
        index = next(
            (
                at
                for at in range(start, len(words))
                if PYTHON_NAME.match(_basename(words[at].text))
                or _basename(words[at].text) in LAUNCH_PROGRAMS
            ),
            len(words),
        )
    if index >= len(words):
        return None
    inner = interpret_command(
        ExpandedCommand(
            words[index:],
            command.environment,
            command.raw,
            command.working_directory,
            command.variables,
        )
    )
    if inner is not None and inner.outer_launcher is None:
        inner.outer_launcher = "ray"
    return inner


def openrlhf_trainer_of(launch: Launch) -> str | None:
    """The OpenRLHF trainer (`train_dpo`, ...) a launch starts, as a module or a script."""
    if launch.target is None or launch.target_kind not in ("script", "module"):
        return None
    if not launch.target.is_known:
        return None
    return openrlhf_trainer(launch.target.text)


def interpret_scheduler(command: ExpandedCommand, start: int) -> Launch | None:
    """`srun -N 2 --ntasks-per-node 8 python train.py`, `mpirun -np 4 python train.py`: the
    scheduler's options, then the command it runs on every task."""
    words = command.words
    index = start
    while index < len(words):
        program = _basename(words[index].text)
        if PYTHON_NAME.match(program) or program in LAUNCH_PROGRAMS:
            break
        index += 1
    else:
        return None
    options, _ = read_options(words[:index], start, booleans=frozenset())
    inner = interpret_command(
        ExpandedCommand(
            words[index:],
            command.environment,
            command.raw,
            command.working_directory,
            command.variables,
        )
    )
    if inner is not None:
        inner.scheduler_options = options
    return inner


def _basename(text: str) -> str:
    return text.rsplit("/", 1)[-1]


def interpret_python(command: ExpandedCommand, start: int) -> Launch | None:
    words = command.words
    index = start
    while index < len(words):
        text = words[index].text
        if text == "-m" and index + 1 < len(words):
            return interpret_module(command, words[index + 1], index + 2, "python")
        if text.startswith("-m") and len(text) > 2:
            return interpret_module(command, words[index], index + 1, "python", begin=2)
        if text == "-c" or text == "-":
            return None
        if text in ("-W", "-X"):
            index += 2
        elif text.startswith("-") and set(text[1:]) <= PYTHON_BOOLEAN_OPTIONS | set("WX"):
            index += 1
        else:
            break
    if index >= len(words) or not words[index].text.endswith(".py"):
        return None
    return Launch(
        "python", command, target=words[index], target_kind="script", arguments=words[index + 1 :]
    )


def interpret_module(
    command: ExpandedCommand, module_word: ShellWord, after: int, launcher: str, begin: int = 0
) -> Launch | None:
    module = module_word.text[begin:]
    words = command.words
    known = KNOWN_MODULES.get(module)
    if known == "torchrun":
        return interpret_torchrun(command, after, "torchrun")
    if known == "accelerate":
        return interpret_accelerate(command, after)
    if known == "deepspeed":
        return interpret_deepspeed(command, after)
    if known == "axolotl":
        return with_positional_config(Launch("axolotl", command), words[after:])
    if known == "llamafactory":
        return with_positional_config(Launch("llamafactory", command), words[after:])
    return Launch(
        launcher, command, target=module_word, target_kind="module", arguments=words[after:]
    )


def interpret_torchrun(command: ExpandedCommand, start: int, launcher: str) -> Launch | None:
    options, index = read_options(command.words, start, booleans=TORCHRUN_BOOLEANS)
    return launched_program(
        Launch(launcher, command, options=options),
        index,
        module="module" in options or "m" in options,
    )


def interpret_accelerate(command: ExpandedCommand, start: int) -> Launch | None:
    options, index = read_options(command.words, start, booleans=ACCELERATE_BOOLEANS)
    return launched_program(
        Launch("accelerate", command, options=options),
        index,
        module="module" in options or "m" in options,
    )


def interpret_deepspeed(command: ExpandedCommand, start: int) -> Launch | None:
    options, index = read_options(command.words, start, booleans=DEEPSPEED_BOOLEANS)
    return launched_program(
        Launch("deepspeed", command, options=options), index, module="module" in options
    )


def launched_program(launch: Launch, index: int, *, module: bool) -> Launch | None:
    """What a distributed launcher starts: a script, a module or (torchrun --no_python) a
    program such as `llamafactory-cli`."""
    words = launch.command.words
    if index >= len(words):
        return launch
    first = words[index]
    if module:
        inner = interpret_module(launch.command, first, index + 1, launch.launcher)
        if inner is not None and inner.launcher in ("axolotl", "llamafactory"):
            return adopt_launcher(inner, launch)
        if inner is not None and inner.launcher == launch.launcher and not inner.options:
            inner.options = launch.options  # `deepspeed --num_gpus 8 --module pkg.train`
        return inner
    if not first.text.endswith(".py"):
        nested = interpret_command(
            ExpandedCommand(
                words[index:],
                launch.command.environment,
                launch.command.raw,
                launch.command.working_directory,
                launch.command.variables,
            )
        )
        if nested is not None:
            return adopt_launcher(nested, launch)
    launch.target = first
    launch.target_kind = "script" if first.text.endswith(".py") else "module"
    launch.arguments = words[index + 1 :]
    return launch


def adopt_launcher(inner: Launch, outer: Launch) -> Launch:
    """A training CLI started by a distributed launcher keeps the launcher's world size."""
    merged = dict(outer.options)
    merged.update(inner.options)
    inner.options = merged
    inner.outer_launcher = outer.launcher
    return inner


def with_config_option(launch: Launch, words: list[ShellWord]) -> Launch:
    """`trl sft --config x.yaml --flag v ...`: the config is an option."""
    launch.arguments = words
    options = program_options(words)
    config = options.get("config")
    if config is not None and config.value is not None:
        launch.target = config.value.word
        launch.target_kind = "config"
    return launch


def with_positional_config(launch: Launch, words: list[ShellWord]) -> Launch:
    """`axolotl train x.yml ...` / `llamafactory-cli train x.yaml key=value`: the first
    positional word naming a YAML or JSON file is the config (`--deepspeed ds.json` is not)."""
    position = 0
    while position < len(words):
        text = words[position].text
        if text.startswith("-"):
            follows = words[position + 1].text if position + 1 < len(words) else "-"
            position += 1 if "=" in text or follows.startswith("-") else 2
            continue
        if text.endswith(CONFIG_SUFFIXES):
            launch.target = words[position]
            launch.target_kind = "config"
            launch.arguments = words[:position] + words[position + 1 :]
            return launch
        position += 1
    launch.arguments = words
    return launch


def interpret_llamafactory(command: ExpandedCommand, start: int) -> Launch | None:
    words = command.words
    if start >= len(words) or words[start].text != "train":
        return None
    return with_positional_config(
        Launch("llamafactory", command, subcommand="train"), words[start + 1 :]
    )


def interpret_swift(command: ExpandedCommand, start: int) -> Launch:
    """`swift sft|pt|rlhf [config.yaml] --flag value ...`: a config is swift's first argument
    only (swift/cli/main.py `parse_yaml_args`); `--dataset train.json` is data."""
    words = command.words
    launch = Launch("swift", command, subcommand=words[start].text)
    rest = words[start + 1 :]
    if rest and rest[0].text.endswith(CONFIG_SUFFIXES):
        launch.target = rest[0]
        launch.target_kind = "config"
        rest = rest[1:]
    launch.arguments = rest
    return launch


def interpret_tune(command: ExpandedCommand, start: int) -> Launch | None:
    """`tune run [torchrun options] <recipe> --config <file or built-in name> [key=value]`."""
    options, index = read_options(command.words, start, booleans=TORCHRUN_BOOLEANS)
    words = command.words
    if index >= len(words):
        return None
    launch = Launch("tune", command, options=options, subcommand=words[index].text)
    rest = words[index + 1 :]
    launch.arguments = rest
    config = program_options(rest).get("config")
    if config is not None and config.value is not None:
        launch.target = config.value.word
        launch.target_kind = "config"
    return launch


def interpret_litgpt(command: ExpandedCommand, start: int) -> Launch:
    words = command.words
    subcommand = words[start].text
    rest = words[start + 1 :]
    if (
        subcommand == "finetune"
        and rest
        and rest[0].text in ("lora", "full", "adapter", "adapter_v2")
    ):
        subcommand = f"finetune_{rest[0].text}"
        rest = rest[1:]
    elif subcommand == "finetune":
        subcommand = "finetune_lora"  # `litgpt finetune` is LoRA fine-tuning
    launch = Launch("litgpt", command, subcommand=subcommand)
    return with_config_option(launch, rest)


LAUNCHER_FRAMEWORKS = {
    "llamafactory": "llamafactory",
    "axolotl": "axolotl",
    "tune": "torchtune",
    "litgpt": "litgpt",
    "trl": "trl",
    "swift": "swift",
}
OVERRIDE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
FILE_VALUE_HINTS = ("config", "deepspeed", "file", "path", "dir", "data")


def parse_override_value(text: str) -> Any:
    """`key=value` overrides are read as YAML values (`4` -> 4, `[q_proj,v_proj]` -> a list),
    as OmegaConf reads them for torchtune and LLaMA-Factory."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, str | int | float | bool | list) else text


# --------------------------------------------------------------------------------------------
# DeepSpeed-Chat's training scripts
#
# `deepspeed main.py --lora_dim 128 --zero_stage 3 ...`: what the flags mean, main.py's
# defaults and the flag sets the rule below tests are in `llmmem.extract.frameworks.deepspeed_chat`.


def is_deepspeed_chat(launch: Launch, written: Iterable[str], script_text: str | None) -> bool:
    """Whether the program started is read as a DeepSpeed-Chat training script: it is a
    Python script or module, its command line carries DeepSpeed-Chat's own flags (`written`:
    the flag names, dashes stripped), and (when the script was found) it does not parse its
    flags into HF dataclasses."""
    if launch.launcher not in DEEPSPEED_CHAT_LAUNCHERS or launch.outer_launcher is not None:
        return False
    if launch.target_kind not in ("script", "module"):
        return False
    written = set(written)
    if not written & DEEPSPEED_CHAT_OWN_FLAGS and not (
        "zero_stage" in written and written & DEEPSPEED_CHAT_BESIDE_ZERO_STAGE
    ):
        return False
    return script_text is None or HF_ARGUMENT_PARSERS.search(script_text) is None


# diffusers' example trainers (examples/text_to_image, dreambooth, controlnet, ...): they train an
# image model (a UNet or a diffusion transformer), which llmmem does not size
IMAGE_MODEL_TRAINER = re.compile(
    r"^(train_(text_to_image|dreambooth|controlnet|instruct_pix2pix|custom_diffusion|"
    r"t2i_adapter|lcm_distill|unconditional|amused|cogvideox|flux|sd3|sdxl|kandinsky|"
    r"wuerstchen|diffusion)\w*|textual_inversion\w*)\.py$"
)


def image_model_trainer(target: str | None) -> str | None:
    """Why a launched script trains no language model (diffusers' image trainers), else None."""
    if target is None:
        return None
    name = target.rsplit("/", 1)[-1]
    if IMAGE_MODEL_TRAINER.match(name) is None:
        return None
    return f"{name} is diffusers' trainer of an image model, not a language model"


# the last part of a path or hub id that names a language model: a family's name or a size
MODEL_NAME_WORDS = re.compile(
    r"(?i)(llama|qwen|mistral|mixtral|gemma|phi-?\d|deepseek|baichuan|internlm|chatglm|glm-?\d|"
    r"olmo|smollm|falcon|bloom|pythia|starcoder|yi-\d|gpt-?(2|j|neo|oss)|(?<![\w.])\d+(\.\d+)?[bm]"
    r"(?![a-z]))"
)


def reads_as_model(text: str) -> bool:
    """Whether a word reads as a model reference (`/data/models/Qwen2.5-3B-Instruct`,
    `org/Name-7B`): not a flag, not a config or data file, and its last part names a model."""
    if not text or text.startswith("-") or text.endswith(CONFIG_SUFFIXES + (".jsonl", ".py")):
        return False
    last = text.rstrip("/").rsplit("/", 1)[-1]
    return MODEL_NAME_WORDS.search(last) is not None

"""The plan of a launcher script: the training command chosen among the file's commands, its
world size and launcher options, and the script or config it starts when that file lies beside
the shell file (or where the path points, relative to it); the flags after it override what
that file says.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from llmmem.extract.builder import PlanBuilder
from llmmem.extract.configs import FRAMEWORK_CONFIG_CLASSES, ConfigReading, Override, read_config
from llmmem.extract.frameworks.common import Setting
from llmmem.extract.frameworks.litgpt import LITGPT_LORA_DEFAULTS
from llmmem.extract.frameworks.openrlhf import openrlhf_meanings
from llmmem.extract.frameworks.swift import swift_accumulation
from llmmem.extract.frameworks.torchtune import TORCHTUNE_LORA_TARGETS, torchtune_model
from llmmem.extract.frameworks.trl_fields import HF_TRAINING_ARGUMENTS, HF_TRL_ARGUMENTS
from llmmem.extract.pragmas import ProjectSettings, apply_project_settings
from llmmem.extract.shell.expand import ExpandedCommand, ShellExpander, ShellWord
from llmmem.extract.shell.launchers import (
    CONFIG_SUFFIXES,
    DEEPSPEED_CHAT_FLAGS,
    FILE_VALUE_HINTS,
    LAUNCHER_FRAMEWORKS,
    LIST_FLAGS,
    OVERRIDE_KEY,
    TRL_COMMANDS,
    Launch,
    WordSlice,
    _is_number,
    deepspeed_chat_meanings,
    image_model_trainer,
    interpret_command,
    is_deepspeed_chat,
    openrlhf_trainer_of,
    option_name,
    parse_override_value,
    program_options,
    reads_as_model,
)
from llmmem.extract.shell.lexer import (
    HereDocument,
    LiteralPart,
    ShellScanner,
)
from llmmem.extract.shell.nested import command_strings, nested_commands
from llmmem.extract.shell.options import LaunchOptionReader
from llmmem.extract.text import (
    apply_file_pragmas,
    display_path,
    plan_from_problems,
    read_text_file,
)
from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan


def extract_shell_plan(
    path: Path, text: str | None = None, *, settings: ProjectSettings | None = None
) -> TrainingPlan:
    """The TrainingPlan a launcher script describes, with the script or config it starts when
    that file can be found. Never raises."""
    path = Path(path)
    problems: list[str] = []
    if text is None:
        text = read_text_file(path, problems)
    if text is None:
        return plan_from_problems(path, "shell", settings, problems)
    if len(text) > MAX_SHELL_CHARS:
        return oversized_plan(path, text, settings)
    try:
        return ShellPlanReader(path, text).plan(settings)
    except RecursionError:
        return plan_from_problems(path, "shell", settings, ["the file nests too deeply to read"])
    except Exception as error:  # a gap in the reader must not take the editor down
        problem = f"internal error while reading the script: {error!r}"
        return plan_from_problems(path, "shell", settings, [problem])


MAX_SHELL_CHARS = 1_000_000  # larger launchers are not read (pragmas are still read)


def oversized_plan(path: Path, text: str, settings: ProjectSettings | None) -> TrainingPlan:
    """The plan of a launcher past MAX_SHELL_CHARS: its `# llmmem:` comments and why the rest
    is not read, as for a Python file past its bound."""
    size = len(text.encode("utf-8", errors="replace")) / 1e6
    problem = (
        f"file is {size:.1f} MB; llmmem reads shell scripts up to "
        f"{MAX_SHELL_CHARS / 1e6:.0f} MB (only `# llmmem:` comments were read)"
    )
    builder = PlanBuilder()
    if settings is not None:
        apply_project_settings(builder, settings)
    apply_file_pragmas(builder, text, None)
    builder.problems.append(problem)
    builder.unreadable = problem
    return builder.build(str(path), "shell", "hf", config_class="none")


class ShellPlanReader(LaunchOptionReader):
    """Reads one shell file: picks its training launch and gathers what it and the files it
    starts say, then builds the plan."""

    def __init__(self, path: Path, text: str) -> None:
        super().__init__(path, text)
        self.written_files: dict[str, HereDocument] = {}  # `cat > ds.json <<EOF`
        self.framework = "hf"
        self.config_class: str | None = None
        # the calls a launched script makes, for the builder to point its defaults at
        self.call_ranges: dict[str, SourceRange | None] = {}

    # -- the whole file

    def plan(self, project_settings: ProjectSettings | None) -> TrainingPlan:
        launch = self.choose_launch()
        if launch is None:
            self.problems.append(
                "no training command found (python, torchrun, accelerate launch, deepspeed, "
                "llamafactory-cli, tune run, trl, axolotl, litgpt or swift)"
            )
        else:
            self.record_launch(launch)
            self.read_launch(launch)
        builder = PlanBuilder()
        builder.trainer_range = self.call_ranges.get("trainer")
        builder.model_range = self.call_ranges.get("model")
        builder.lora_range = self.call_ranges.get("lora")
        builder.quantization_range = self.call_ranges.get("quantization")
        if project_settings is not None:
            apply_project_settings(builder, project_settings)
        for setting in self.settings:
            builder.set(setting.key, setting.value, setting.source, setting.range, setting.note)
        for reading in self.readings:
            builder.rejected.extend(reading.rejected)
            if reading.range_path is not None:
                apply_file_pragmas(builder, reading.text, reading.range_path)
        builder.rejected.extend(self.rejected)
        apply_file_pragmas(builder, self.text, None)
        plan = builder.build(
            str(self.path),
            "shell",
            self.framework,
            config_class=self.config_class
            or FRAMEWORK_CONFIG_CLASSES.get(self.framework, "TrainingArguments"),
        )
        for problem in self.problems:
            if problem not in plan.problems:
                plan.problems.append(problem)
        return plan

    def choose_launch(self) -> Launch | None:
        """The file's training launch; None where there is none, or where the file is past
        MAX_SHELL_CHARS (not read: the fixes that ask for the launch get none)."""
        if len(self.text) > MAX_SHELL_CHARS:
            return None
        scanner = ShellScanner(self.text)
        commands = scanner.commands()
        self.problems.extend(scanner.problems)
        launches: list[Launch] = []
        expander = ShellExpander(self.text)
        for command in expander.expanded_commands(commands):
            for target in command.raw.output_targets:
                for document in command.raw.here_documents:
                    name = "".join(
                        part.text for part in target.parts if isinstance(part, LiteralPart)
                    )
                    self.written_files[name] = document
            launch = interpret_command(command)
            if launch is not None:
                launches.append(launch)
            else:
                launches.extend(self.launches_in_strings(command))
        self.problems.extend(expander.problems)
        if not launches:
            return None
        best = max(launch.priority for launch in launches)
        chosen = [launch for launch in launches if launch.priority == best]
        if len(chosen) > 1:
            first_line = self.line_of(chosen[0].command.words[0].start)
            self.problems.append(
                f"{len(chosen)} training commands in this file; the first one "
                f"(line {first_line + 1}) is read"
            )
        return chosen[0]

    def launches_in_strings(self, command: ExpandedCommand) -> list[Launch]:
        """The launches of a command string a command runs (`bash -c "$CMD"`, `eval`)."""
        found = []
        for string in command_strings(command):
            for nested in nested_commands(command, string):
                launch = interpret_command(nested)
                if launch is not None:
                    found.append(launch)
        return found

    # -- one launch

    def record_launch(self, launch: Launch) -> None:
        """The training command itself, where the plan points what the command line leaves
        unsaid (a pragma for the model goes on the line above it); a plain `python x.py`
        whose script is not named like training is not taken for one."""
        if launch.priority < 1 or not launch.command.raw.words:
            return
        first = launch.command.raw.words[0]
        program = (
            launch.launcher
            if launch.subcommand is None
            else (f"{launch.launcher} {launch.subcommand}")
        )
        target = f" {launch.target.text.rsplit('/', 1)[-1]}" if launch.target is not None else ""
        self.settings.append(
            Setting(
                "launch",
                f"{program}{target}",
                Provenance.EXPLICIT,
                self.offsets_range(first.start, first.end),
                "the training command",
            )
        )

    def read_launch(self, launch: Launch) -> None:
        self.framework = LAUNCHER_FRAMEWORKS.get(launch.launcher, "hf")
        image_trainer = image_model_trainer(launch.target.text if launch.target else None)
        if image_trainer is not None and launch.target is not None:
            self.settings.append(
                Setting(
                    "not_training",
                    image_trainer,
                    Provenance.EXPLICIT,
                    self.offsets_range(launch.target.start, launch.target.end),
                    "the launched script",
                )
            )
        if launch.launcher == "trl" and launch.subcommand is not None:
            self.config_class = TRL_COMMANDS[launch.subcommand]
        self.read_world_size(launch)
        self.read_launcher_options(launch)
        trainer = openrlhf_trainer_of(launch)
        if trainer is not None:
            self.read_openrlhf(launch, trainer)
            return
        directory = self.working_directory(launch)
        overrides, positionals = self.argument_overrides(launch)
        target_path = self.target_path(launch, directory)
        if launch.target_kind == "script" and target_path is not None:
            self.read_script(launch, target_path, overrides, positionals, directory)
            return
        builtin_config: ShellWord | None = None
        if launch.target_kind == "config" and target_path is None and launch.target is not None:
            if launch.launcher == "tune":
                builtin_config = launch.target
            else:
                self.problem_at(launch.target, f"'{launch.target.text}' not found")
        elif launch.target_kind in ("script", "module") and launch.target is not None:
            self.problem_at(
                launch.target,
                f"'{launch.target.text}' not found next to this file; only the command line "
                "is read",
            )
            self.positional_model(positionals)
        config_path = target_path if launch.target_kind == "config" else None
        if config_path is None and launch.launcher != "swift":
            config_path = self.positional_config(positionals, directory)
        if config_path is None and launch.target_kind in ("script", "module"):
            config_path, overrides = self.config_flag(overrides, directory)
        overrides = self.deepspeed_chat_flags(launch, overrides, None)
        if launch.target_kind in ("script", "module"):
            overrides = hf_abbreviations(overrides)
        self.read_config_with_overrides(config_path, overrides, directory, launch)
        if builtin_config is not None:
            self.read_torchtune_builtin(builtin_config)

    def read_config_with_overrides(
        self,
        config_path: Path | None,
        overrides: list[Override],
        directory: Path,
        launch: Launch,
    ) -> None:
        framework = LAUNCHER_FRAMEWORKS.get(launch.launcher)
        if config_path is not None:
            reading = read_config(
                config_path,
                range_path=display_path(config_path),
                overrides=overrides,
                framework=framework,
                search_directories=[directory],
            )
        elif overrides or framework is not None:
            reading = read_config(
                self.path,
                "",
                overrides=overrides,
                framework=framework,
                search_directories=[directory],
            )
        else:
            return
        self.add_reading(reading)
        if launch.launcher == "swift":
            self.swift_launch_defaults(launch, reading)
        if launch.launcher == "litgpt" and launch.subcommand:
            # the script decides how the head and the loss run (budget.stacks.litgpt)
            self.settings.append(
                Setting(
                    "litgpt_script",
                    launch.subcommand,
                    Provenance.EXPLICIT,
                    self.word_range(launch.command.words[1]),
                    f"litgpt {launch.subcommand.replace('_', ' ')}",
                )
            )
        if launch.launcher == "litgpt" and launch.subcommand == "finetune_lora":
            self.settings.append(
                Setting(
                    "lora.enabled",
                    True,
                    Provenance.EXPLICIT,
                    self.word_range(launch.command.words[1]),
                    "litgpt finetune_lora",
                )
            )
            for key, value, note in LITGPT_LORA_DEFAULTS:
                self.settings.append(Setting(key, value, Provenance.DEFAULT, None, note))

    def swift_launch_defaults(self, launch: Launch, reading: ConfigReading) -> None:
        """What ms-swift decides from the command and the world: `swift rlhf` trains DPO
        unless --rlhf_type says otherwise; the accumulation, when not given, is
        ceil(16 / batch / world size)."""
        command = launch.command.words[0] if launch.command.words else None
        located = self.word_range(command) if command is not None else None
        if launch.subcommand == "rlhf" and not reading.has("objective"):
            self.settings.append(
                Setting("objective", "dpo", Provenance.DEFAULT, located, "swift rlhf: dpo")
            )
        if launch.subcommand == "pt" and not reading.has("objective"):
            self.settings.append(
                Setting("objective", "pretrain", Provenance.EXPLICIT, located, "swift pt")
            )
        if not reading.has("gradient_accumulation_steps"):
            batch = reading.value_of("per_device_train_batch_size")
            world = self.known_world_size() or 1
            steps = swift_accumulation(batch if isinstance(batch, int) and batch > 0 else 1, world)
            self.settings.append(
                Setting(
                    "gradient_accumulation_steps",
                    steps,
                    Provenance.DEFAULT,
                    located,
                    f"ms-swift: ceil(16 / batch / {world} processes) when not given",
                )
            )

    def add_reading(self, reading: ConfigReading) -> None:
        self.readings.append(reading)
        self.settings.extend(reading.settings)
        self.problems.extend(reading.problems)
        if reading.framework not in ("deepspeed", "accelerate") and (
            reading.settings or reading.range_path is not None
        ):
            self.framework = reading.framework

    def read_script(
        self,
        launch: Launch,
        script: Path,
        overrides: list[Override],
        positionals: list[WordSlice],
        directory: Path,
    ) -> None:
        """A Python script: its own plan, then a YAML it is given, then the flags; a flag
        beats what the script leaves to a default or an argparse default, not what it
        hard-codes."""
        from llmmem.extract.python import extract_python_plan

        script_text = read_text_file(script, self.problems, display_path(script))
        if script_text is None:
            overrides = self.deepspeed_chat_flags(launch, overrides, None)
            self.read_config_with_overrides(None, overrides, directory, launch)
            return
        script_plan = extract_python_plan(script, script_text)
        script_settings = settings_of_plan(script_plan, display_path(script))
        flag_settings = self.flag_settings_for_script(
            script_plan, script_text, overrides, directory, launch
        )
        config_path = self.positional_config(positionals, directory)
        if config_path is not None:
            reading = read_config(
                config_path,
                range_path=display_path(config_path),
                search_directories=[directory],
            )
            self.readings.append(reading)
            self.problems.extend(reading.problems)
            script_settings.extend(reading.settings)
        self.settings.extend(flag_settings)
        self.settings.extend(script_settings)
        self.settings.extend(self.argv_settings(launch, script_settings))
        self.framework = script_plan.framework
        self.call_ranges = {
            "trainer": in_file(script_plan.trainer_range, display_path(script)),
            "model": in_file(script_plan.model_range, display_path(script)),
            "lora": in_file(
                script_plan.lora.range if script_plan.lora else None, display_path(script)
            ),
            "quantization": in_file(
                script_plan.quantization.range if script_plan.quantization else None,
                display_path(script),
            ),
        }
        self.problems.extend(
            f"{display_path(script)}: {problem}" for problem in script_plan.problems
        )

    def argv_settings(self, launch: Launch, script_settings: list[Setting]) -> list[Setting]:
        """A script value that defaults where `sys.argv[N]` is missing
        (`sys.argv[1] if len(sys.argv) > 1 else "org/model"`) is the launch's N-th word."""
        found: list[Setting] = []
        for setting in script_settings:
            match = re.search(r"default of sys\.argv\[(\d+)\]", setting.note)
            if match is None:
                continue
            index = int(match.group(1))
            if not 0 < index <= len(launch.arguments):
                continue
            word = launch.arguments[index - 1]
            if not word.is_known or word.text.startswith("-"):
                continue
            found.append(
                Setting(
                    setting.key,
                    word.text,
                    Provenance.EXPLICIT,
                    self.word_range(word),
                    f"sys.argv[{index}] of the launched script",
                )
            )
        return found

    def flag_settings_for_script(
        self,
        script_plan: TrainingPlan,
        script_text: str,
        overrides: list[Override],
        directory: Path,
        launch: Launch,
    ) -> list[Setting]:
        """Flags as plan settings: through the script's own argparse options where it has
        them, else through the HF names (HfArgumentParser scripts take TrainingArguments
        fields as flags)."""
        argparse_keys = argparse_options_of(script_plan)
        overrides = self.deepspeed_chat_flags(launch, overrides, script_text, argparse_keys)
        mapped: list[Override] = []
        settings: list[Setting] = []
        for override in overrides:
            name = ".".join(str(step) for step in override.path)
            key = argparse_keys.get(name)
            if key == "distributed.deepspeed_config":
                # the script's own --deepspeed option: the file is read all the same
                mapped.append(Override(("deepspeed",), override.value, override.range))
            elif key is not None:
                settings.append(
                    Setting(
                        key,
                        override.value,
                        Provenance.EXPLICIT,
                        override.range,
                        f"--{name} on the command line",
                    )
                )
            else:
                mapped.append(override)
        mapped = hf_abbreviations(mapped)
        if mapped:
            reading = read_config(
                self.path, "", overrides=mapped, framework="hf", search_directories=[directory]
            )
            self.readings.append(reading)
            self.problems.extend(reading.problems)
            settings.extend(
                setting for setting in reading.settings if setting.source is not Provenance.DEFAULT
            )
        return settings

    def deepspeed_chat_flags(
        self,
        launch: Launch,
        overrides: list[Override],
        script_text: str | None,
        script_options: Container[str] = frozenset(),
    ) -> list[Override]:
        """A DeepSpeed-Chat script's own flags (`--lora_dim`, `--zero_stage`, `--dtype`,
        `--offload`, `--max_seq_len`) as plan settings; the other flags are returned, to be
        read by their HF names. Flags the script's own argparse options map (`script_options`)
        keep that meaning."""
        written = set(program_options(launch.arguments))
        if not is_deepspeed_chat(launch, written, script_text):
            return overrides
        rest: list[Override] = []
        chat: list[Override] = []
        for override in overrides:
            name = ".".join(str(step) for step in override.path)
            if name in script_options:
                rest.append(override)
            elif name == "deepspeed" and override.value is True:
                continue  # DeepSpeed's own `--deepspeed` switch; the config is built in code
            elif name in DEEPSPEED_CHAT_FLAGS:
                chat.append(override)
            else:
                rest.append(override)
        meanings, problems = deepspeed_chat_meanings(
            chat, {name for name in written if name not in script_options}
        )
        for meaning in meanings:
            self.settings.append(
                Setting(meaning.key, meaning.value, meaning.source, meaning.range, meaning.note)
            )
        self.report_flag_problems(problems)
        return rest

    def read_openrlhf(self, launch: Launch, trainer: str) -> None:
        """An OpenRLHF trainer (`openrlhf.cli.train_dpo`, ...): its own flags, read with the
        meanings of the release they are spelled for (`extract/frameworks/openrlhf.py`); its
        code is OpenRLHF's, not a script beside this file."""
        self.framework = "openrlhf"
        overrides, _ = self.argument_overrides(launch)
        written = set(program_options(launch.arguments))
        trainer_range = self.word_range(launch.target) if launch.target is not None else None
        meanings, problems = openrlhf_meanings(
            trainer,
            overrides,
            written,
            trainer_range=trainer_range,
            world_size=self.known_world_size(),
        )
        self.settings.append(
            Setting(
                "openrlhf_trainer",
                trainer,
                Provenance.EXPLICIT,
                trainer_range,
                f"OpenRLHF's {trainer}",
            )
        )
        for meaning in meanings:
            self.settings.append(
                Setting(meaning.key, meaning.value, meaning.source, meaning.range, meaning.note)
            )
        self.report_flag_problems(problems)

    def known_world_size(self) -> int | None:
        """The process count the launcher's own options state, where they state one."""
        stated = [
            setting
            for setting in self.settings
            if setting.key == "distributed.world_size"
            and setting.source is not Provenance.ASSUMED
            and isinstance(setting.value, int)
        ]
        return stated[-1].value if stated else None

    def report_flag_problems(self, problems: list[tuple[SourceRange | None, str]]) -> None:
        for located, message in problems:
            where = (
                f"line {located.start_line + 1}, column {located.start_col + 1}: "
                if located is not None and located.path is None
                else ""
            )
            self.problems.append(where + message)

    # -- the program's arguments

    def argument_overrides(self, launch: Launch) -> tuple[list[Override], list[WordSlice]]:
        """The program's `--name value` flags and `key=value` overrides as config overrides,
        and its positional words."""
        consumed = (
            {"config", "accelerate_config", "num_processes"}
            if launch.launcher in ("trl", "tune", "litgpt")
            else set()
        )
        overrides: list[Override] = []
        positionals: list[WordSlice] = []
        for item in program_words(launch.arguments):
            if item.kind == "flag":
                if item.name in consumed:
                    continue
                override = self.flag_override(item.name, item.word, list(item.values))
                if override is not None:
                    overrides.append(override)
            elif item.kind == "override":
                value = item.values[0]
                if not value.is_known:
                    self.unknown_value(item.word, f"{item.name}")
                    continue
                overrides.append(
                    Override(
                        tuple(item.name.split(".")),
                        parse_override_value(value.text),
                        self.slice_range(value),
                    )
                )
            elif item.kind == "positional":
                positionals.append(WordSlice(item.word))
        if (
            launch.launcher == "litgpt"
            and positionals
            and not positionals[0].text.endswith(CONFIG_SUFFIXES)
        ):
            checkpoint = positionals.pop(0)
            overrides.insert(
                0, Override(("checkpoint_dir",), checkpoint.text, self.slice_range(checkpoint))
            )
        return overrides, positionals

    @staticmethod
    def is_flag_value(name: str, word: ShellWord) -> bool:
        text = word.text
        if text.startswith("-") and not _is_number(text):
            return False
        if text.endswith(CONFIG_SUFFIXES + (".py",)):
            return any(hint in name for hint in FILE_VALUE_HINTS)
        return "=" not in text or not OVERRIDE_KEY.match(text.split("=", 1)[0])

    def flag_override(self, name: str, flag: ShellWord, values: list[WordSlice]) -> Override | None:
        path = tuple(part for part in name.split(".") if part)
        if name == "deepspeed_config":
            path = ("deepspeed",)
        if not path:
            return None
        if not values:
            return Override(path, True, self.word_range(flag))
        unknown = [value for value in values if not value.is_known]
        if unknown:
            self.unknown_value(unknown[0].word, f"--{name}")
            return None
        if (
            path == ("deepspeed",)
            and values[0].text in self.written_files
            and not (self.find_file(values[0].text, Path(self.path.parent)))
        ):
            self.read_written_deepspeed(values[0])
            return None
        if len(values) == 1:
            return Override(path, values[0].text, self.slice_range(values[0]))
        first = self.slice_range(values[0])
        last = self.slice_range(values[-1])
        spanning = replace(first, end_line=last.end_line, end_col=last.end_col)
        return Override(path, [value.text for value in values], spanning)

    def read_written_deepspeed(self, value: WordSlice) -> None:
        """`cat > ds.json <<EOF ... EOF` then `--deepspeed ds.json`: the here-document is the
        DeepSpeed config, and its ranges are in this file."""
        document = self.written_files[value.text]
        self.settings.append(
            Setting(
                "distributed.deepspeed_config",
                value.text,
                Provenance.EXPLICIT,
                self.slice_range(value),
            )
        )
        body = self.text[document.start : document.end]
        first_line = self.line_of(document.start)
        reading = read_config(Path(value.text), body, range_path=HERE_DOCUMENT_PATH)

        def in_this_file(located: SourceRange | None) -> SourceRange | None:
            if located is None or located.path != HERE_DOCUMENT_PATH:
                return located
            return replace(
                located,
                path=None,
                start_line=located.start_line + first_line,
                end_line=located.end_line + first_line,
            )

        for setting in reading.settings:
            self.settings.append(
                Setting(
                    setting.key,
                    setting.value,
                    Provenance.EXPLICIT,
                    in_this_file(setting.range),
                    setting.note,
                )
            )
        self.rejected.extend(
            replace(rejected, range=in_this_file(rejected.range)) for rejected in reading.rejected
        )
        self.problems.extend(
            problem.replace(HERE_DOCUMENT_PATH, f"here-document for {value.text}")
            for problem in reading.problems
        )

    def config_flag(
        self, overrides: list[Override], directory: Path
    ) -> tuple[Path | None, list[Override]]:
        """`--config run.yaml` handed to a script llmmem cannot read: the run's own config,
        read by what its keys mean (the flags beside it still win)."""
        for override in overrides:
            name = ".".join(str(step) for step in override.path)
            value = override.value
            if name not in CONFIG_FLAGS or not isinstance(value, str):
                continue
            if not value.endswith(CONFIG_SUFFIXES):
                continue
            found = self.find_file(value, directory)
            if found is not None:
                return found, [other for other in overrides if other is not override]
        return None, overrides

    def positional_model(self, positionals: list[WordSlice]) -> None:
        """`python train.py "$MODEL_NAME" --lr 5e-6` with the script not here: a positional
        argument that reads as a model (`/data/models/Qwen2.5-3B-Instruct`, `org/Name-7B`) is
        taken for the one the script trains, since nothing else names it."""
        for positional in positionals:
            if positional.is_known and reads_as_model(positional.text):
                self.settings.append(
                    Setting(
                        "model_id",
                        positional.text,
                        Provenance.EXPLICIT,
                        self.slice_range(positional),
                        "a positional argument of the script, read as its model",
                    )
                )
                return

    def positional_config(self, positionals: list[WordSlice], directory: Path) -> Path | None:
        """`python train.py config.yaml` (HfArgumentParser.parse_yaml_file) and friends."""
        for positional in positionals:
            if positional.text.endswith(CONFIG_SUFFIXES):
                found = self.find_file(positional.text, directory)
                if found is None:
                    self.problem_at_slice(positional, f"'{positional.text}' not found")
                return found
        return None

    # -- built-in torchtune configs

    def read_torchtune_builtin(self, name_word: ShellWord) -> None:
        """`--config llama3_1/8B_lora`: a config shipped inside torchtune; its model and method
        follow from its name, the rest from torchtune's recipe defaults."""
        name = name_word.text
        located = self.word_range(name_word)
        family, _, variant = name.partition("/")
        match = re.match(r"^(?P<size>[0-9.]+[BbMm]|mini)_(?P<method>q?lora|dora|full)", variant)
        if not family or match is None:
            self.problem_at(name_word, f"torchtune config '{name}' not found")
            return
        method = match.group("method")
        prefix = {"lora": "lora_", "qlora": "qlora_", "dora": "dora_"}.get(method, "")
        size = match.group("size").lower().replace(".", "_")
        model_id, _ = torchtune_model(f"{prefix}{family}_{size}")
        note = f"torchtune built-in config {name}: model and method from its name"
        if model_id is not None:
            self.settings.append(Setting("model_id", model_id, Provenance.ASSUMED, located, note))
        method_settings: list[tuple[str, Any]] = []
        if method in ("lora", "qlora", "dora"):
            method_settings.append(("lora.enabled", True))
            # the LoRA of torchtune's LoRA configs (TORCHTUNE_LORA_TARGETS), rank 8,
            # alpha 16, adapters in the model's dtype
            lora_note = (
                "torchtune's built-in LoRA configs (89 of 91: rank 8, alpha 16, the q, v and "
                "output projections and the MLP)"
            )
            for key, value in (
                ("lora.r", 8),
                ("lora.alpha", 16.0),
                ("lora.target_modules", list(TORCHTUNE_LORA_TARGETS)),
            ):
                self.settings.append(Setting(key, value, Provenance.DEFAULT, located, lora_note))
        if method == "qlora":
            method_settings += [("quantization.bits", 4), ("quantization.quant_type", "nf4")]
        for key, value in method_settings:
            self.settings.append(Setting(key, value, Provenance.ASSUMED, located, note))
        # what torchtune's shipped configs have in common; set after the recipe defaults, so
        # they replace them, and below anything the command line says
        for key, value, shared_note in TORCHTUNE_BUILTIN_COMMON:
            self.settings.append(Setting(key, value, Provenance.DEFAULT, located, shared_note))
        self.problems.append(
            f"{self.lines.describe(name_word.start)}: torchtune's built-in config "
            f"'{name}' is not read; copy it (`tune cp {name} .`) to have its values read"
        )

    # -- small things

    def target_path(self, launch: Launch, directory: Path) -> Path | None:
        if launch.target is None or not launch.target.is_known:
            return None
        name = launch.target.text
        if launch.target_kind == "module":
            module_path = name.replace(".", "/")
            for folder in ("", "src/"):  # a package installed from a src layout
                found = self.find_file(f"{folder}{module_path}.py", directory) or self.find_file(
                    f"{folder}{module_path}/__main__.py", directory
                )
                if found is not None:
                    launch.target_kind = "script"
                    return found
            return None
        found = self.find_file(name, directory)
        if found is None and launch.launcher == "tune" and not name.endswith(CONFIG_SUFFIXES):
            found = self.find_file(f"{name}.yaml", directory)
        if found is not None and launch.target_kind == "module":
            launch.target_kind = "script"
        return found


HERE_DOCUMENT_PATH = "<here-document>"
# the flags a project script names its own config with (`--config run.yaml`)
CONFIG_FLAGS = frozenset({"config", "config_file", "config_path", "cfg", "train_config"})
TORCHTUNE_BUILTIN_COMMON: tuple[tuple[str, Any, str], ...] = (
    ("precision", "bf16-true", "torchtune's built-in configs train in dtype bf16"),
    (
        "gradient_checkpointing",
        True,
        "torchtune's built-in configs enable activation checkpointing",
    ),
    ("loss", "chunked", "torchtune's built-in configs use CEWithChunkedOutputLoss"),
)


def in_file(located: SourceRange | None, range_path: str) -> SourceRange | None:
    """A range of another file's plan, naming that file (ranges naming a third file stay)."""
    if located is None or located.path is not None:
        return located
    return replace(located, path=range_path)


def settings_of_plan(plan: TrainingPlan, range_path: str) -> list[Setting]:
    """A plan's values as settings again, their ranges naming the plan's file, so that a
    launcher's plan can take them in beside its own."""
    settings: list[Setting] = []

    def add(key: str, value: Sourced[Any] | None) -> None:
        if value is not None:
            located = in_file(value.range, range_path)
            settings.append(Setting(key, value.value, value.source, located, value.note))

    for name, value in plan.sourced_fields().items():
        add(name, value)
    for section, prefix in (
        (plan.lora, "lora."),
        (plan.quantization, "quantization."),
        (plan.distributed, "distributed."),
    ):
        if section is None:
            continue
        for item in dataclass_fields(section):
            field_value = getattr(section, item.name)
            if isinstance(field_value, Sourced):
                add(prefix + item.name, field_value)
    if plan.lora is not None:
        settings.append(Setting("lora.enabled", True, plan.lora.r.source, None))
    for name, value in plan.extra.items():
        if isinstance(value, Sourced):
            add(name, value)
    return settings


def argparse_options_of(plan: TrainingPlan) -> dict[str, str]:
    """Which plan key each of a script's argparse options feeds, from the notes the Python
    extractor leaves on `cli-default` values."""
    options: dict[str, str] = {}
    for key, value in settings_by_key(plan).items():
        if value.source is not Provenance.CLI_DEFAULT:
            continue
        for option in re.findall(r"--([A-Za-z0-9_\-.]+)", value.note):
            options[option.replace("-", "_")] = key
    return options


def settings_by_key(plan: TrainingPlan) -> dict[str, Setting]:
    return {setting.key: setting for setting in settings_of_plan(plan, plan.path)}


@dataclass(frozen=True)
class ProgramWord:
    """One word of a launched program's command line, as the reader takes it: a `--name` flag
    with the values it consumes, a `key=value` override, a short option the program reads
    itself, or a positional word."""

    kind: str  # "flag", "override", "short", "positional"
    name: str
    word: ShellWord
    values: tuple[WordSlice, ...] = ()


def program_words(words: list[ShellWord]) -> Iterator[ProgramWord]:
    """The program's words in order (the fixes walk them the same way to edit them)."""
    index = 0
    while index < len(words):
        word = words[index]
        text = word.text
        index += 1
        if text.startswith("--") and len(text) > 2:
            if "=" in text:
                name = option_name(text.split("=", 1)[0])
                yield ProgramWord("flag", name, word, (WordSlice(word, text.index("=") + 1),))
                continue
            name = option_name(text)
            values: list[WordSlice] = []
            while index < len(words) and ShellPlanReader.is_flag_value(name, words[index]):
                values.append(WordSlice(words[index]))
                index += 1
                if name not in LIST_FLAGS:
                    break
            yield ProgramWord("flag", name, word, tuple(values))
        elif not text.startswith("-") and "=" in text and OVERRIDE_KEY.match(text.split("=", 1)[0]):
            name = text.split("=", 1)[0].replace("-", "_")
            yield ProgramWord("override", name, word, (WordSlice(word, len(name) + 1),))
        elif text.startswith("-"):
            yield ProgramWord("short", text, word)
        else:
            yield ProgramWord("positional", "", word)


def hf_abbreviations(overrides: list[Override]) -> list[Override]:
    """Flags read with HF's names, each abbreviation written out (`abbreviated_hf_argument`)."""
    renamed = []
    for override in overrides:
        if len(override.path) == 1 and isinstance(override.path[0], str):
            full = abbreviated_hf_argument(override.path[0])
            if full != override.path[0]:
                override = Override((full,), override.value, override.range)
        renamed.append(override)
    return renamed


def abbreviated_hf_argument(name: str) -> str:
    """HfArgumentParser is an argparse parser that takes a unique prefix of an option
    (`--per_device_train_batch 3`): the full name where exactly one TrainingArguments field
    (which every such script parses) starts with it and no HF or TRL argument is written so,
    else the name as written."""
    if name in HF_TRL_ARGUMENTS or len(name) < 4:
        return name
    matches = [argument for argument in HF_TRL_ARGUMENTS if argument.startswith(name)]
    if len(matches) == 1 and matches[0] in HF_TRAINING_ARGUMENTS:
        return matches[0]
    return name

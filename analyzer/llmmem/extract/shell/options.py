"""What a shell file's launcher options say, and the means every reading of the file shares.

The launcher's own options give the world size (torchrun --nproc_per_node and --nnodes,
accelerate --num_processes, deepspeed --num_gpus or --include, srun and mpirun tasks, one process
per GPU of CUDA_VISIBLE_DEVICES), mixed precision, ZeRO and FSDP, and name the accelerate and
DeepSpeed files read beside them. Every value keeps the range it was written at; a value known
only when the script runs is a problem that says so.
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path

from llmmem.extract.configs import ConfigReading, read_config
from llmmem.extract.frameworks.accelerate import FSDP_STRATEGY_NAMES
from llmmem.extract.frameworks.common import Setting
from llmmem.extract.numbers import shown
from llmmem.extract.shell.expand import ShellWord
from llmmem.extract.shell.launchers import CommandOption, Launch, WordSlice, program_options
from llmmem.extract.shell.lexer import LineIndex
from llmmem.extract.text import display_path, resolve_reference
from llmmem.plan import Provenance, RejectedValue, SourceRange


class LaunchOptionReader:
    """The launcher options of one shell file as settings, and the ranges and problems of its
    words."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.text = text
        self.settings: list[Setting] = []
        self.readings: list[ConfigReading] = []
        self.problems: list[str] = []
        # numbers written that no key can take, where the readings above do not hold them
        self.rejected: list[RejectedValue] = []

    @cached_property
    def lines(self) -> LineIndex:
        return LineIndex(self.text)

    # -- launcher options

    def read_world_size(self, launch: Launch) -> None:
        options = launch.options
        environment = {**launch.command.variables, **launch.command.environment}
        processes: WordSlice | None = None
        nodes: WordSlice | None = None
        total = False
        if launch.uses("torchrun", "tune") or "nproc_per_node" in options:
            processes = self.option_value(options, "nproc_per_node")
            nodes = self.option_value(options, "nnodes")
        if launch.uses("accelerate") or "num_processes" in options:
            processes = self.option_value(options, "num_processes") or processes
            total = "num_processes" in options
        if launch.uses("deepspeed") or "num_gpus" in options:
            processes = self.option_value(options, "num_gpus") or processes
            nodes = self.option_value(options, "num_nodes") or nodes
            include = self.option_value(options, "include")
            if processes is None and include is not None:
                devices = include.text.split("@")[0].split(":", 1)[-1].count(",") + 1
                self.settings.append(
                    Setting(
                        "distributed.world_size",
                        devices,
                        Provenance.EXPLICIT,
                        self.slice_range(include),
                        f"--include {include.text}",
                    )
                )
                return
        if launch.launcher in ("llamafactory", "swift") and processes is None:
            processes = self.environment_value(environment, "NPROC_PER_NODE")
            nodes = self.environment_value(environment, "NNODES")
        if launch.launcher == "swift" and processes is None:
            self.swift_single_process(environment)
            return
        if launch.launcher == "trl":
            trl_options = program_options(launch.arguments)
            if "num_processes" in trl_options:
                processes = self.option_value(trl_options, "num_processes")
                total = True
        if launch.launcher == "python" and launch.scheduler_options and processes is None:
            self.read_scheduler_tasks(launch.scheduler_options)
            return
        if processes is not None and processes.text in ("gpu", "auto"):
            processes = None
        if processes is None and self.one_process(launch):
            return
        if processes is None:
            self.world_size_from_visible_devices(launch, environment)
            return
        count = self.integer(processes, "the number of processes")
        if count is None:
            return
        node_count = self.integer(nodes, "the number of nodes") if nodes is not None else None
        if node_count is not None and not total and node_count > 1:
            note = f"{count} per node × {node_count} nodes"
            self.settings.append(
                Setting(
                    "distributed.world_size",
                    count * node_count,
                    Provenance.EXPLICIT,
                    self.slice_range(processes),
                    note,
                )
            )
            return
        self.settings.append(
            Setting(
                "distributed.world_size",
                count,
                Provenance.EXPLICIT,
                self.slice_range(processes),
                "",
            )
        )

    def one_process(self, launch: Launch) -> bool:
        """A launch that runs one training process whatever the machine has: `python x.py`
        (not under srun, mpirun or another launcher) and torchtune's `*_single_device`
        recipes."""
        command = launch.command.words[0] if launch.command.words else None
        if command is None:
            return False
        if launch.launcher == "python" and not launch.scheduler_options:
            if launch.priority < 1:
                return False  # a script not named like training: it may train nothing
            note = "a plain python launch runs one process"
        elif launch.launcher == "tune" and (launch.subcommand or "").endswith("_single_device"):
            note = f"torchtune's {launch.subcommand} recipe runs on one device"
        else:
            return False
        if launch.outer_launcher is not None:
            return False
        self.settings.append(
            Setting(
                "distributed.world_size", 1, Provenance.EXPLICIT, self.word_range(command), note
            )
        )
        return True

    def swift_single_process(self, environment: dict[str, ShellWord]) -> None:
        """ms-swift without NPROC_PER_NODE (or NNODES) runs one process (swift/cli/main.py
        `use_torchrun`): on one visible GPU that is the world; over several, the model is
        spread across them by device_map, which llmmem sizes as one GPU and says so."""
        visible = environment.get("CUDA_VISIBLE_DEVICES")
        if visible is None or not visible.is_known or not visible.text.strip():
            return
        count = len([device for device in visible.text.split(",") if device.strip()])
        if count == 1:
            self.settings.append(
                Setting(
                    "distributed.world_size",
                    1,
                    Provenance.EXPLICIT,
                    self.word_range(visible),
                    "ms-swift runs one process without NPROC_PER_NODE; one GPU visible",
                )
            )
            return
        self.problems.append(
            f"{self.lines.describe(visible.start)}: without NPROC_PER_NODE ms-swift runs one "
            f"process and spreads the model over the {count} visible GPUs (device_map); sized "
            "as one GPU holding all of it"
        )

    def read_scheduler_tasks(self, options: dict[str, CommandOption]) -> None:
        """One rank per task: `srun --ntasks 8`, `-N 2 --ntasks-per-node 4`, `mpirun -np 4`."""
        total = next(
            (
                value
                for name in ("ntasks", "n", "np")
                if (value := self.option_value(options, name))
            ),
            None,
        )
        if total is not None:
            count = self.integer(total, "the number of tasks")
            if count is not None:
                self.settings.append(
                    Setting(
                        "distributed.world_size",
                        count,
                        Provenance.EXPLICIT,
                        self.slice_range(total),
                        "one rank per task",
                    )
                )
            return
        per_node = self.option_value(options, "ntasks_per_node") or self.option_value(
            options, "npernode"
        )
        if per_node is None:
            return
        count = self.integer(per_node, "the number of tasks per node")
        nodes = self.option_value(options, "nodes") or self.option_value(options, "N")
        node_count = self.integer(nodes, "the number of nodes") if nodes is not None else 1
        if count is not None and node_count is not None:
            self.settings.append(
                Setting(
                    "distributed.world_size",
                    count * node_count,
                    Provenance.EXPLICIT,
                    self.slice_range(per_node),
                    f"{count} tasks per node × {node_count} nodes",
                )
            )

    def world_size_from_visible_devices(
        self, launch: Launch, environment: dict[str, ShellWord]
    ) -> None:
        """Launchers that start one process per visible GPU when not told how many."""
        if not launch.uses("torchrun", "tune", "accelerate", "llamafactory"):
            return
        if launch.uses("accelerate") and "multi_gpu" not in launch.options:
            return
        visible = environment.get("CUDA_VISIBLE_DEVICES")
        if visible is None or not visible.is_known or not visible.text.strip():
            return
        count = len([device for device in visible.text.split(",") if device.strip()])
        self.settings.append(
            Setting(
                "distributed.world_size",
                count,
                Provenance.EXPLICIT,
                self.word_range(visible),
                "one process per GPU in CUDA_VISIBLE_DEVICES",
            )
        )

    def read_launcher_options(self, launch: Launch) -> None:
        options = launch.options
        directory = self.working_directory(launch)
        config_file = self.option_value(options, "config_file")
        if launch.uses("accelerate") and config_file is not None:
            self.read_referenced_config(config_file, directory, expected="accelerate")
        mixed = self.option_value(options, "mixed_precision")
        if mixed is not None and mixed.text.lower() in ("bf16", "fp16"):
            self.settings.append(
                Setting(
                    mixed.text.lower(),
                    True,
                    Provenance.CONFIG,
                    self.slice_range(mixed),
                    "accelerate launch --mixed_precision: used where the script sets none",
                )
            )
        if "use_deepspeed" in options or "zero_stage" in options:
            stage = self.option_value(options, "zero_stage")
            if stage is not None and (count := self.integer(stage, "zero_stage")) is not None:
                self.settings.append(
                    Setting(
                        "distributed.zero_stage",
                        count,
                        Provenance.EXPLICIT,
                        self.slice_range(stage),
                    )
                )
            for name, key in (
                ("offload_optimizer_device", "distributed.offload_optimizer"),
                ("offload_param_device", "distributed.offload_params"),
            ):
                device = self.option_value(options, name)
                if device is not None:
                    self.settings.append(
                        Setting(
                            key,
                            device.text.lower() in ("cpu", "nvme"),
                            Provenance.EXPLICIT,
                            self.slice_range(device),
                            f"--{name} {device.text}",
                        )
                    )
            deepspeed_file = self.option_value(options, "deepspeed_config_file")
            if deepspeed_file is not None:
                self.read_deepspeed_file(deepspeed_file, directory)
        if "use_fsdp" in options:
            strategy = self.option_value(options, "fsdp_sharding_strategy")
            value = (
                FSDP_STRATEGY_NAMES.get(strategy.text.lower(), "full_shard")
                if strategy
                else "full_shard"
            )
            located = (
                self.slice_range(strategy)
                if strategy
                else self.word_range(options["use_fsdp"].flag)
            )
            self.settings.append(
                Setting("distributed.fsdp", value, Provenance.EXPLICIT, located, "--use_fsdp")
            )
            offload = self.option_value(options, "fsdp_offload_params")
            if offload is not None and offload.text.lower() in ("true", "1", "yes"):
                for key in ("distributed.offload_params", "distributed.offload_optimizer"):
                    self.settings.append(
                        Setting(key, True, Provenance.EXPLICIT, self.slice_range(offload))
                    )
        if launch.launcher == "tune" and (launch.subcommand or "").endswith("_distributed"):
            # torchtune's distributed recipes shard every layer and the model with FSDP2
            # (torchtune 0.6.1 training/_distributed.py shard_model); the config's
            # fsdp_reshard_after_forward, read with it, decides full or grad-op sharding
            command = launch.command.words[0]
            self.settings.append(
                Setting(
                    "distributed.fsdp",
                    "full_shard",
                    Provenance.DEFAULT,
                    self.word_range(command),
                    f"torchtune's {launch.subcommand} recipe shards with FSDP2",
                )
            )
        if launch.launcher == "trl":
            trl_options = program_options(launch.arguments)
            accelerate_config = trl_options.get("accelerate_config")
            if accelerate_config is not None and accelerate_config.value is not None:
                self.read_trl_accelerate_config(accelerate_config.value, directory)

    def read_trl_accelerate_config(self, value: WordSlice, directory: Path) -> None:
        """`trl sft --accelerate_config zero3`: TRL ships configs named by scheme."""
        name = value.text.lower()
        located = self.slice_range(value)
        bundled = re.fullmatch(r"zero([1-3])|fsdp([12])?|multi_gpu|single_gpu", name)
        if bundled is None:
            self.read_referenced_config(value, directory, expected="accelerate")
            return
        if bundled.group(1):
            self.settings.append(
                Setting(
                    "distributed.zero_stage",
                    int(bundled.group(1)),
                    Provenance.EXPLICIT,
                    located,
                    f"TRL's {name} config",
                )
            )
        elif name.startswith("fsdp"):
            self.settings.append(
                Setting(
                    "distributed.fsdp",
                    "full_shard",
                    Provenance.EXPLICIT,
                    located,
                    f"TRL's {name} config",
                )
            )

    def read_referenced_config(self, value: WordSlice, directory: Path, expected: str) -> None:
        target = self.find_file(value.text, directory)
        if target is None:
            self.problem_at_slice(value, f"'{value.text}' not found")
            return
        reading = read_config(
            target, range_path=display_path(target), search_directories=[directory]
        )
        if reading.framework != expected and reading.settings:
            self.problem_at_slice(value, f"'{value.text}' does not look like an {expected} config")
        self.readings.append(reading)
        self.settings.extend(reading.settings)
        self.problems.extend(reading.problems)

    def read_deepspeed_file(self, value: WordSlice, directory: Path) -> None:
        self.settings.append(
            Setting(
                "distributed.deepspeed_config",
                value.text,
                Provenance.EXPLICIT,
                self.slice_range(value),
            )
        )
        target = self.find_file(value.text, directory)
        if target is None:
            self.problem_at_slice(value, f"DeepSpeed config '{value.text}' not found")
            return
        reading = read_config(target, range_path=display_path(target))
        self.readings.append(reading)
        self.settings.extend(reading.settings)
        self.problems.extend(reading.problems)

    # -- small things

    def working_directory(self, launch: Launch) -> Path:
        return self.path.parent / launch.command.working_directory

    def find_file(self, name: str, directory: Path) -> Path | None:
        return resolve_reference(name, directory / "launch", [self.path.parent])

    def option_value(self, options: dict[str, CommandOption], name: str) -> WordSlice | None:
        option = options.get(name)
        if option is None or option.value is None:
            return None
        if not option.value.is_known:
            self.unknown_value(option.value.word, f"--{name}")
            return None
        return option.value

    def environment_value(self, environment: dict[str, ShellWord], name: str) -> WordSlice | None:
        word = environment.get(name)
        if word is None:
            return None
        if not word.is_known:
            self.unknown_value(word, name)
            return None
        return WordSlice(word)

    def integer(self, value: WordSlice | None, what: str) -> int | None:
        if value is None:
            return None
        text = value.text.split(":")[0].strip()  # torchrun --nnodes MIN:MAX: the fewest
        if text.isdigit() and int(text) > 0:
            return int(text)
        self.problem_at_slice(value, f"{what} must be a positive whole number, got '{value.text}'")
        return None

    def unknown_value(self, word: ShellWord, what: str) -> None:
        expansion = word.unknown[0] if word.unknown else word.text
        if expansion in ("$@", "$*"):
            return
        self.problems.append(
            f"{self.lines.describe(word.start)}: {what} comes from {shown(expansion, 60)}, known "
            "only when the script runs; add a `# llmmem:` pragma to say what it is"
        )

    def problem_at(self, word: ShellWord, message: str) -> None:
        self.problems.append(f"{self.lines.describe(word.start)}: {message}")

    def problem_at_slice(self, value: WordSlice, message: str) -> None:
        start, _ = value.offsets()
        self.problems.append(f"{self.lines.describe(start)}: {message}")

    def line_of(self, offset: int) -> int:
        return self.lines.position(offset)[0]

    def offsets_range(self, start: int, end: int) -> SourceRange:
        start_line, start_col = self.lines.position(start)
        end_line, end_col = self.lines.position(end)
        return SourceRange(
            start_line=start_line, start_col=start_col, end_line=end_line, end_col=end_col
        )

    def slice_range(self, value: WordSlice) -> SourceRange:
        return self.offsets_range(*value.offsets())

    def word_range(self, word: ShellWord) -> SourceRange:
        return self.offsets_range(*word.span())

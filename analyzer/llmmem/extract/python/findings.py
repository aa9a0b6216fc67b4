"""What the reading of one script found: the objects it builds, in order, and the lines for
`problems`. The library tables add to it; the emitter reads it."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from llmmem.extract.python.source import SourceMap
from llmmem.extract.python.values import (
    ConfigObject,
    DataLoaderObject,
    Known,
    LoraObject,
    ModelObject,
    OptimizerObject,
    QuantObject,
    TokenizerObject,
    TrainerObject,
)


class Findings:
    """The objects that decide memory, as the script builds them (models, training configs,
    adapters, quantization configs, optimizers, trainers), and the problems met reading it."""

    def __init__(self, source: SourceMap, path: Path) -> None:
        self.source = source
        self.path = path
        self.problems: list[str] = []
        self.models: list[ModelObject] = []
        self.configs: list[ConfigObject] = []
        self.trainers: list[TrainerObject] = []
        self.loras: list[LoraObject] = []
        self.quants: list[QuantObject] = []
        self.optimizers: list[OptimizerObject] = []
        self.data_loaders: list[DataLoaderObject] = []
        self.tokenizers: list[TokenizerObject] = []
        self.tokenizer_lengths: list[Known] = []
        self.precision_flags: list[tuple[str, Known]] = []  # ("bf16", Known(True)) from autocast
        self.accumulation: list[Known] = []  # Accelerator(gradient_accumulation_steps=...)
        self.kbit_calls: list[ast.Call] = []
        self.command_line_lengths: list[Known] = []  # --block_size and friends
        self.command_line_models: list[Known] = []  # --model_name_or_path's default
        self.unsloth = False
        # every `x.name(...)` the module writes, run or not (`trainer.train()` under a
        # condition not known before run time counts): what the file does with what it builds
        self.method_names: frozenset[str] = frozenset()
        self.returned_trainer = False  # a function returns a trainer it built (a helper)
        # `model = torch.nn.Linear(20, 1)`: the script's model is a bare torch layer
        self.bare_torch_model: str | None = None
        # `subprocess.run(['llamafactory-cli', 'train', path])`: the command and where it is
        self.launched_command: tuple[str, ast.AST] | None = None

    def problem(self, node: ast.AST | None, text: str) -> None:
        where = self.source.range_of(node)
        prefix = f"line {where.start_line + 1}: " if where is not None else ""
        if where is not None and where.path is not None:  # in a module the script imports
            prefix = f"{_near(where.path, self.path)}:{where.start_line + 1}: "
        self.problems.append(prefix + text)


def _near(path: str, script: Path) -> str:
    """A path as the script's folder names it (`helpers/factory.py`)."""
    try:
        relative = os.path.relpath(path, script.absolute().parent)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative

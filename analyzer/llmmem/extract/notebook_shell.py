"""What a notebook runs outside Python: its shell lines and the files its cells write.

A notebook often trains through a shell line (`!accelerate launch train.py --flag v`,
`!llamafactory-cli train config.yaml`) or a `%%bash` cell, with the config written by a
`%%writefile config.yaml` cell above it. `NotebookShell` gathers them:

- the shell text: every `!` line of a code cell (with its backslash continuations), every
  `# llmmem:` comment, and the body of every `%%bash`, `%%sh` or `%%script bash` cell, as one
  script whose lines remember their cell and line (a `!` becomes a blank, so every column stays);
- the written files: `%%writefile [-a] name` cells by the name they write, each with its cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SHELL_CELL_MAGICS = frozenset({"bash", "sh", "script", "system"})


@dataclass(frozen=True)
class WrittenFile:
    """A `%%writefile name` cell: the cell's index and its text, the magic line left blank so
    that its lines are the cell's lines."""

    cell: int
    text: str


@dataclass
class NotebookShell:
    text: str = ""
    origins: list[tuple[int, int]] = field(default_factory=list)  # line -> (cell, cell line)
    written: dict[str, WrittenFile] = field(default_factory=dict)

    @property
    def has_commands(self) -> bool:
        return bool(self.text.strip())


def notebook_shell(sources: list[str | None]) -> NotebookShell:
    """The shell lines and written files of a notebook's code cells, given as their sources
    by cell index (None for a cell that is not code)."""
    shell = NotebookShell()
    pieces: list[str] = []
    for index, source in enumerate(sources):
        if source is None or not source.strip():
            continue
        lines = source.split("\n")
        first = lines[0].strip()
        if first.startswith("%%"):
            magic = first[2:].split()
            if magic and magic[0] == "writefile":
                names = [word for word in magic[1:] if not word.startswith("-")]
                if names:
                    shell.written[names[0]] = WrittenFile(index, "\n".join(["", *lines[1:]]))
            elif magic and magic[0] in SHELL_CELL_MAGICS and _runs_a_shell(magic):
                for number, line in enumerate(lines[1:], 1):
                    pieces.append(line + "\n")
                    shell.origins.append((index, number))
            continue
        continuing = False
        for number, line in enumerate(lines):
            stripped = line.lstrip()
            if not continuing and stripped.startswith("#") and "llmmem:" in stripped:
                pieces.append(line + "\n")  # a pragma speaks for the launch too
                shell.origins.append((index, number))
                continue
            if continuing or stripped.startswith("!"):
                indentation = len(line) - len(stripped)
                shown = line if continuing else line[:indentation] + " " + stripped[1:]
                pieces.append(shown + "\n")
                shell.origins.append((index, number))
                continuing = line.rstrip().endswith("\\")
    shell.text = "".join(pieces)
    return shell


def _runs_a_shell(magic: list[str]) -> bool:
    """`%%bash`, `%%sh`, `%%system`, or `%%script bash|sh`."""
    if magic[0] != "script":
        return True
    return len(magic) > 1 and magic[1].rsplit("/", 1)[-1] in ("bash", "sh", "zsh")


def launches_training(text: str) -> bool:
    """Whether a shell text starts a training command llmmem reads (python train.py,
    torchrun, accelerate launch, llamafactory-cli train, ...)."""
    from llmmem.extract.shell import ShellExpander, ShellScanner, interpret_command

    scanner = ShellScanner(text)
    for command in ShellExpander(text).expanded_commands(scanner.commands()):
        launch = interpret_command(command)
        if launch is not None and launch.priority > 0:
            return True
    return False

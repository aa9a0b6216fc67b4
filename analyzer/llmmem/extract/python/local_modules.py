"""The project's own modules a script imports: `from config import *`, `import config as cfg`,
`from training_utils import build_trainer`, `from .helpers import make_args`.

Python finds such a module beside the script it runs (the script's folder is `sys.path[0]`),
or from the folder a launcher runs in (the project's root); a relative import from the
importing module's package. `LocalModules` finds the file the same way, and keeps what reading
it bound (its module scope) so that each module is read once per script, whichever module
imports it. Reading is bounded: at most MAX_MODULES modules of at most MAX_MODULE_BYTES each,
imports nested at most MAX_IMPORT_DEPTH deep; a module that imports one being read gets nothing
from it (as Python gives a partly initialised module).

Values read in another module keep their own positions: every node of that module carries its
file (`source.mark_origin`), so a range names the module's path, as a range in a DeepSpeed JSON a
config refers to names that file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from llmmem.extract.python.values import Scope

MAX_MODULES = 8
MAX_MODULE_BYTES = 1_000_000
MAX_IMPORT_DEPTH = 3
MAX_ROOT_LEVELS = 4  # folders above the script that may be the project's root
ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


@dataclass
class LocalModules:
    """The modules of one script's project, found and read once each."""

    script: Path
    scopes: dict[Path, Scope | None] = field(default_factory=dict)  # None: being read
    depth: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def folders(self) -> list[Path]:
        """Where an absolute import is looked for: the script's folder, then the folders above
        it up to the project's root (a launcher runs `python path/to/train.py` from there)."""
        folder = self.script.parent.absolute()
        found = [folder]
        for _ in range(MAX_ROOT_LEVELS):
            if any((folder / marker).exists() for marker in ROOT_MARKERS):
                return found
            if folder.parent == folder:
                break
            folder = folder.parent
            found.append(folder)
        return found[:1]  # no project root above: only the script's own folder (sys.path[0])

    def find(self, module: str, level: int, importer: Path) -> Path | None:
        """The file of `module` (`a.b`, or relative with `level` dots from `importer`); None
        where the project has none (a library, or a file not in the checkout)."""
        parts = [part for part in module.split(".") if part] if module else []
        if level:
            base = importer.parent
            for _ in range(level - 1):
                base = base.parent
            bases = [base]
        else:
            if not parts:
                return None
            bases = self.folders
        for base in bases:
            target = base.joinpath(*parts) if parts else base
            for candidate in (target.with_suffix(".py"), target / "__init__.py"):
                if parts and candidate == target.with_suffix(".py") and not parts[-1]:
                    continue
                try:
                    if candidate.is_file():
                        return candidate
                except OSError:
                    continue
        return None

    def can_read(self, path: Path) -> bool:
        if len([scope for scope in self.scopes.values() if scope is not None]) >= MAX_MODULES:
            return False
        if self.depth >= MAX_IMPORT_DEPTH:
            return False
        try:
            return path.stat().st_size <= MAX_MODULE_BYTES
        except OSError:
            return False


def display_name(path: Path) -> str:
    """A module's path as ranges and problems name it (as a launcher names the script it
    reads)."""
    return os.path.normpath(str(path))

"""Extractors: the text of a training script or config -> TrainingPlan.

`extract_plan` picks the reader by file kind (.py, .yaml/.yml, .json, .sh, .ipynb) and never
raises: a file that cannot be read (a syntax error mid-typing, binary bytes, a huge file) gives a
plan whose `problems` say why, with llmmem's assumptions and any `# llmmem:` pragmas in it.
"""

from __future__ import annotations

from pathlib import Path

from llmmem.extract.builder import PlanBuilder
from llmmem.extract.pragmas import (
    ProjectSettings,
    apply_pragmas,
    apply_project_settings,
    find_project_settings,
)
from llmmem.plan import TrainingPlan

__all__ = ["ProjectSettings", "extract_plan", "file_kind", "find_project_settings"]

MAX_FILE_BYTES = 50_000_000  # beyond this the file is not even read
# a YAML or JSON config past this is not parsed (its `# llmmem:` comments are read): the YAML
# reader with positions takes seconds per megabyte, and each fix offered reads the file again
MAX_CONFIG_CHARS = 1_000_000

_KINDS: dict[str, str] = {
    ".py": "python",
    ".pyw": "python",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
    ".sh": "shell",
    ".bash": "shell",
    ".ipynb": "notebook",
}


def file_kind(path: Path, text: str | None = None) -> str:
    """ "python", "yaml", "json", "shell", "notebook", or "unknown"; a file without a known
    suffix is recognised by its `#!` line."""
    kind = _KINDS.get(path.suffix.lower())
    if kind is not None:
        return kind
    first_line = (text or "").lstrip("\ufeff").split("\n", 1)[0]
    if first_line.startswith("#!"):
        if "python" in first_line:
            return "python"
        if any(shell in first_line for shell in ("sh", "bash", "zsh")):
            return "shell"
    return "unknown"


def _read_text(path: Path) -> tuple[str, str | None]:
    from llmmem.files import read_file_bytes

    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return "", f"file is {size / 1e6:.0f} MB; not read"
        data = read_file_bytes(path, MAX_FILE_BYTES)
    except OSError as err:
        return "", f"cannot read {path}: {err.strerror or err}"
    return data.decode("utf-8-sig", errors="replace"), None


def _plan_without_reader(
    path: Path, kind: str, text: str, settings: ProjectSettings | None, problem: str
) -> TrainingPlan:
    builder = PlanBuilder()
    try:
        if settings is not None:
            apply_project_settings(builder, settings)
        apply_pragmas(builder, text)
    except Exception as err:  # pragmas are best effort here
        builder.problems.append(f"could not read llmmem pragmas: {err!r}")
    builder.problems.append(problem)
    return builder.build(path, kind, "hf", config_class="none")


def extract_plan(
    path: Path, text: str | None = None, *, settings: ProjectSettings | None = None
) -> TrainingPlan:
    """The TrainingPlan of one file. `text` is the editor's buffer (read from disk when None);
    `settings` default to `[tool.llmmem]` of the nearest pyproject.toml. Never raises."""
    path = Path(path)
    kind = "unknown"
    problem: str | None = None
    try:
        if text is None:
            text, problem = _read_text(path)
        kind = file_kind(path, text)
        if settings is None:
            settings = find_project_settings(path)
        if problem is not None:
            return _plan_without_reader(path, kind, text, settings, problem)
        if kind == "python":
            from llmmem.extract.python import extract_python_plan

            return extract_python_plan(path, text, settings=settings)
        if kind in ("yaml", "json") and len(text) > MAX_CONFIG_CHARS:
            problem = (
                f"the config is {len(text) / 1e6:.1f} MB, over the {MAX_CONFIG_CHARS / 1e6:.0f} "
                "MB llmmem parses (only `# llmmem:` comments were read)"
            )
            return _plan_without_reader(path, kind, text, settings, problem)
        if kind in ("yaml", "json"):
            from llmmem.extract.configs import extract_config_plan

            return extract_config_plan(path, text, settings=settings)
        if kind == "shell":
            from llmmem.extract.shell import extract_shell_plan

            return extract_shell_plan(path, text, settings=settings)
        if kind == "notebook":
            from llmmem.extract.notebook import extract_notebook_plan

            return extract_notebook_plan(path, text, settings=settings)
        return _plan_without_reader(
            path, kind, text, settings, f"llmmem does not read {path.suffix or 'these'} files"
        )
    except ImportError as err:
        return _plan_without_reader(
            path, kind, text or "", settings, f"no reader for {kind} files yet ({err})"
        )
    except RecursionError:
        return _plan_without_reader(
            path, kind, text or "", settings, "the file nests too deeply to read"
        )
    except Exception as err:  # the last line of defence for the editor
        return _plan_without_reader(
            path, kind, text or "", settings, f"internal error while reading the file: {err!r}"
        )

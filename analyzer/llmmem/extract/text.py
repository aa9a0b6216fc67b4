"""Reading a file's text, and the plan of a file that could not be read.

What every reader of a file (configs, launcher scripts, notebooks) needs before it knows which
framework it reads: the text of a file as a problem line rather than an exception (missing,
unreadable, binary, too large, not UTF-8), the file another file names (`deepspeed: ds_z3.json`),
the name a referenced file goes by in problems and ranges, a file's `# llmmem:` pragmas, and the
plan of a file that says nothing readable. Imports nothing of the framework readers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path

from llmmem.extract.builder import PlanBuilder
from llmmem.extract.pragmas import ProjectSettings, apply_project_settings, read_pragmas
from llmmem.plan import Provenance, TrainingPlan

MAX_CONFIG_FILE_BYTES = 16 * 1024 * 1024  # a config, a DeepSpeed JSON, a launcher script


@dataclass(frozen=True)
class WrittenText:
    """A file the analysed file writes before it runs its command (a notebook's `%%writefile`
    cell): its text, and the name its ranges carry (the cell's path)."""

    text: str
    range_path: str


# files written by the file being read, by absolute path: found and read as if on disk
_WRITTEN: ContextVar[dict[Path, WrittenText] | None] = ContextVar("written_files", default=None)


@contextmanager
def written_files(files: dict[Path, WrittenText]) -> Iterator[None]:
    """While reading a file that writes `files` itself, a reference to one of them finds it."""
    token = _WRITTEN.set({_normal(path): written for path, written in files.items()})
    try:
        yield
    finally:
        _WRITTEN.reset(token)


def _normal(path: Path) -> Path:
    return Path(os.path.normpath(os.path.abspath(path)))


def written_text(path: Path) -> WrittenText | None:
    written = _WRITTEN.get()
    return written.get(_normal(path)) if written else None


def plan_from_problems(
    path: Path,
    kind: str,
    settings: ProjectSettings | None,
    problems: list[str],
    *,
    unreadable: bool = False,
) -> TrainingPlan:
    """The plan of a file that could not be read: llmmem's assumptions and the reasons.
    `unreadable`: the file could not be parsed at all (not merely holds no settings)."""
    builder = PlanBuilder()
    if unreadable and problems:
        builder.unreadable = problems[-1]
    if settings is not None:
        apply_project_settings(builder, settings)
    builder.problems.extend(problems)
    return builder.build(str(path), kind, "hf", config_class="none")


def read_text_file(path: Path, problems: list[str], range_path: str | None = None) -> str | None:
    """The file's text, or None with a problem line (missing, unreadable, not a regular file,
    larger than MAX_CONFIG_FILE_BYTES, not UTF-8 text)."""
    from llmmem.files import read_file_bytes

    written = written_text(path)
    if written is not None:
        return written.text
    name = range_path or str(path)
    try:
        data = read_file_bytes(path, MAX_CONFIG_FILE_BYTES)
    except FileNotFoundError:
        problems.append(f"{name}: file not found")
        return None
    except OSError as error:
        problems.append(f"{name}: cannot be read ({error.strerror or error})")
        return None
    return decode_text(data, name, problems)


def decode_text(data: bytes, name: str, problems: list[str]) -> str | None:
    if b"\x00" in data[:8192]:
        problems.append(f"{name}: a binary file, not a text config")
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        problems.append(f"{name}: not UTF-8 text (byte {error.start} cannot be decoded)")
        return None


def apply_file_pragmas(builder: PlanBuilder, text: str, range_path: str | None) -> None:
    """The `# llmmem:` comments of a file, with ranges naming it (None: the plan's file)."""
    if "llmmem" not in text:
        return
    reading = read_pragmas(text)
    for pragma in reading.pragmas:
        located = replace(pragma.range, path=range_path)
        builder.set(pragma.key, pragma.value, Provenance.PRAGMA, located)
    prefix = f"{range_path}: " if range_path else ""
    builder.problems.extend(prefix + problem for problem in reading.problems)
    builder.rejected.extend(
        replace(
            rejected, range=replace(rejected.range, path=range_path) if rejected.range else None
        )
        for rejected in reading.rejected
    )


def resolve_reference(
    reference: str, referring_file: Path, search_directories: list[Path] | None = None
) -> Path | None:
    """A file named in another file: absolute, or relative to the referring file's folder (or
    one of `search_directories`)."""
    candidate = Path(os.path.expanduser(reference))
    folders = [referring_file.parent, *(search_directories or [])]
    candidates = [candidate] if candidate.is_absolute() else [f / candidate for f in folders]
    for option in candidates:
        if written_text(option) is not None:
            return option
        try:
            if option.is_file():
                return option
        except OSError:
            continue
    return None


def display_path(path: Path) -> str:
    written = written_text(path)
    if written is not None:
        return written.range_path
    return os.path.normpath(str(path))

"""The model in a folder another training file of the same project writes.

A project trains in stages: an SFT script writes `./output/qwen3_sft_lora`, and the DPO or GRPO
stage loads that folder (`model_name_or_path: ./output/qwen3_sft_lora`, often as an absolute path
of the machine it ran on: `/workspace/<project>/results/sft_model/merged_model`). Where the run
happens the folder holds the first stage's `config.json` (a merged or fully trained model) or its
`adapter_config.json` (an adapter, loaded on its base): the shapes of the model the first stage
started from. Where llmmem reads the file the folder does not exist yet, so the project is
searched for the file that writes it, and the model that file trains is sized in its place.

A file writes a folder when a line that names an output (`output_dir`, `save_pretrained`,
`save_model`, `--output_dir`, `output_path`, ...) holds the folder's path. The written path
matches a reference when its parts appear, in order and together, in the reference's parts and
what follows them is only what a trainer or a merge step adds below an output folder
(`checkpoint-500`, `final`, `merged_model`, `best_model`, `adapter`). Where several files write
it, the longest match wins; files that train different models leave it unresolved. The search
is bounded (the project's own folder: the nearest one above the file that holds `.git` or
`pyproject.toml`; at most MAX_ENTRIES entries, files of at most MAX_FILE_BYTES and
MAX_BYTES_READ in all), and parses only the files whose text holds the folder's last part.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmmem.plan import LoraPlan

# the files a stage is written in
WRITER_SUFFIXES = frozenset({".py", ".sh", ".bash", ".yaml", ".yml", ".json", ".ipynb"})
MAX_ENTRIES = 3000  # files and folders looked at in one search
MAX_FILE_BYTES = 512_000
MAX_BYTES_READ = 8_000_000  # all the files one search reads (an editor searches on each edit)
MAX_ROOT_LEVELS = 6  # folders above the file searched for the project's root
SKIPPED_FOLDERS = frozenset(
    {"node_modules", "__pycache__", "site-packages", "wandb", "mlruns", "logs", "data"}
)

# what a trainer, a save or a merge puts below an output folder
_BELOW_OUTPUT = re.compile(
    r"^(checkpoint-\d+|checkpoint|final\w*|merged\w*|best\w*|last\w*|latest|adapters?\w*|"
    r"lora_adapters?|model)$",
    re.IGNORECASE,
)
# a line that names where a file saves
_WRITES = re.compile(
    r"output_dir|save_pretrained|save_model|save_dir|output_path|save_path|out_dir|"
    r"--output\b|--save\b|merged_model_path|export_dir",
    re.IGNORECASE,
)
_PATH_TOKEN = re.compile(r"[\w.~\-]+(?:[/\\][\w.~\-]+)*[/\\]?")


@dataclass(frozen=True)
class ProjectWriter:
    """A file of the project that writes the folder a reference names."""

    path: Path
    line: int
    written: str  # the output path as that file writes it
    model: str  # the model reference of that file's own plan
    lora: LoraPlan | None = None  # that file's adapter, its ranges in that file
    merged: bool = False  # the reference is a merged copy (`merged_model`) below the output


def path_parts(ref: str) -> list[str]:
    """The parts of a path, without empty, `.` and `~` parts."""
    return [part for part in re.split(r"[/\\]+", ref.strip()) if part not in ("", ".", "~")]


def tail_after(written: list[str], ref: list[str]) -> list[str] | None:
    """What follows `written` in `ref` when `written`'s parts appear there together and only
    output sub-folders follow them; None where they do not."""
    if not written or len(written) > len(ref):
        return None
    for start in range(len(ref) - len(written), -1, -1):
        if ref[start : start + len(written)] == written:
            tail = ref[start + len(written) :]
            if len(tail) <= 2 and all(_BELOW_OUTPUT.match(part) for part in tail):
                return tail
            return None
    return None


def project_root(path: Path) -> Path:
    """The nearest folder above `path` that holds `.git` or `pyproject.toml`; else its own
    folder."""
    folder = path.parent
    for _ in range(MAX_ROOT_LEVELS):
        if (folder / ".git").exists() or (folder / "pyproject.toml").is_file():
            return folder
        if folder.parent == folder:
            break
        folder = folder.parent
    return path.parent


def _candidate_files(root: Path, needle: str, skip: Path) -> list[tuple[Path, str]]:
    """The project's files whose text holds `needle`, and that text, within the search's bounds."""
    found: list[tuple[Path, str]] = []
    seen = read = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in SKIPPED_FOLDERS
            and not (Path(folder) / d / "pyvenv.cfg").exists()
        )
        for name in sorted(files):
            seen += 1
            if seen > MAX_ENTRIES:
                return found
            candidate = Path(folder) / name
            if candidate.suffix.lower() not in WRITER_SUFFIXES or candidate == skip:
                continue
            try:
                status = candidate.stat()
                # a named pipe or a device would block the read or never end
                if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_FILE_BYTES:
                    continue
                size = status.st_size
                read += size
                if read > MAX_BYTES_READ:
                    return found
                text = candidate.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if needle in text:
                found.append((candidate, text))
        seen += len(dirs)
        if seen > MAX_ENTRIES:
            break
    return found


def _written_paths(text: str, ref_parts: list[str], named: str) -> list[tuple[int, str, int]]:
    """(line, written path, parts matched) for each output path in `text` that `ref_parts`
    lies in or below and that names `named`, the reference's own folder."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not _WRITES.search(line):
            continue
        for token in _PATH_TOKEN.findall(line):
            parts = path_parts(token)
            if named in parts and tail_after(parts, ref_parts) is not None:
                out.append((number, token, len(parts)))
    return out


def _model_of(path: Path) -> tuple[str | None, LoraPlan | None]:
    """A writer's model reference and its adapter, the adapter's ranges pointing into it."""
    from llmmem.extract import extract_plan

    plan = extract_plan(path)
    if plan.model_id is None or not isinstance(plan.model_id.value, str):
        return None, None
    lora = plan.lora
    if lora is not None:
        lora = replace(
            lora,
            range=_in_file(lora.range, path),
            **{
                f.name: _sourced_in_file(getattr(lora, f.name), path)
                for f in fields(lora)
                if f.name != "range"
            },
        )
    return plan.model_id.value or None, lora


def _in_file(where: Any, path: Path) -> Any:
    if where is None or where.path is not None:
        return where
    return replace(where, path=str(path))


def _sourced_in_file(value: Any, path: Path) -> Any:
    from llmmem.plan import Provenance

    source = Provenance.CONFIG if value.source == Provenance.EXPLICIT else value.source
    return replace(value, source=source, range=_in_file(value.range, path))


def find_project_writer(ref: str, path: Path) -> tuple[ProjectWriter | None, str | None]:
    """The file of `path`'s project that writes the folder `ref` names, and why none where
    files were found that do not agree. Never raises for what it reads."""
    ref_parts = path_parts(ref)
    if not ref_parts:
        return None, None
    # the last part that is not an output sub-folder is what a writer must name
    named = [part for part in ref_parts if not _BELOW_OUTPUT.match(part)]
    if not named:
        return None, None
    root = project_root(path.absolute())
    best: list[ProjectWriter] = []
    best_score = 0
    for candidate, text in _candidate_files(root, named[-1], path.absolute()):
        matches = _written_paths(text, ref_parts, named[-1])
        if not matches:
            continue
        line, written, score = max(matches, key=lambda match: match[2])
        if score < best_score:
            continue
        model, lora = _model_of(candidate)
        if model is None or path_parts(model) == ref_parts:
            continue
        tail = tail_after(path_parts(written), ref_parts) or []
        writer = ProjectWriter(
            path=candidate,
            line=line,
            written=written,
            model=model,
            lora=lora,
            merged=any(part.lower().startswith("merged") for part in tail),
        )
        if score > best_score:
            best, best_score = [writer], score
        else:
            best.append(writer)
    if not best:
        return None, None
    models = sorted({writer.model for writer in best})
    if len(models) > 1:
        where = ", ".join(f"{_relative(w.path, root)} ({w.model})" for w in best)
        return (
            None,
            f"'{ref}' is written by files of this project that train different models: {where}",
        )
    return best[0], None


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def writer_note(ref: str, writer: ProjectWriter, path: Path) -> str:
    """The note a model sized through its project's writer carries."""
    root = project_root(path.absolute())
    return (
        f"'{ref}' is not on this machine: {_relative(writer.path, root)}:{writer.line} of this "
        f"project writes it ('{writer.written}') from '{writer.model}', so it is sized as that "
        "model (a merged or trained copy, or an adapter on it, has its shapes)"
    )

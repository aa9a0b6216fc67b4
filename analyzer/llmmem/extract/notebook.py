"""Jupyter notebooks (.ipynb) read into a TrainingPlan.

The notebook's JSON (nbformat 4, and the `worksheets` of nbformat 3) is read without nbformat.
Its code cells are joined, in order, into one Python text that the Python extractor reads; what
IPython adds to Python is taken out first, line for line, so that every line keeps its number:

- a line magic (`%pip install peft`, `%env X=1`) or shell line (`!pip install -U trl`) becomes
  `pass` at the same indentation, and `files = !ls` becomes `files = None`;
- a cell magic whose body is Python (`%%capture`, `%%time`) loses its first line only; any other
  cell magic (`%%bash`, `%%writefile train.py`) leaves the cell out;
- a cell that still is not valid Python is left out, with a problem line.

Positions. A range in a notebook names its cell: `SourceRange(path=f"{notebook}#cell={index}")`,
where `index` is the 0-based position of the cell in the notebook's `cells` list (markdown and raw
cells count, as editors number them), and its lines and columns are 0-based within that cell's
source. Ranges in other files (a DeepSpeed JSON the notebook names) keep their own path.
Problem lines speak of "cell N, line M", both 1-based, as people count them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmmem.extract.notebook_shell import NotebookShell, launches_training, notebook_shell
from llmmem.extract.pragmas import ProjectSettings
from llmmem.extract.text import decode_text, plan_from_problems
from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan

MAX_NOTEBOOK_BYTES = 50_000_000  # outputs with images make notebooks large

# cell magics whose body IPython runs as Python
PYTHON_BODY_CELL_MAGICS = frozenset({"capture", "time", "timeit", "prun", "debug"})
MAGIC_ASSIGNMENT = re.compile(r"^(\s*)([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*=\s*[!%]")
HELP_LINE = re.compile(r"^\s*(\?{1,2}[\w.]+|[\w.]+\?{1,2})\s*$")
LINE_REFERENCE = re.compile(r"\bline (\d+)")


@dataclass(frozen=True)
class CellLine:
    """Where a line of the joined text was written: a cell (its index in `cells`) and a line."""

    cell: int
    line: int


@dataclass
class JoinedCells:
    """The code cells of a notebook as one Python text, with where each line came from."""

    text: str = ""
    origins: list[CellLine] = field(default_factory=list)  # joined line -> cell line
    cell_lines: dict[int, list[str]] = field(default_factory=dict)  # cell -> its lines
    problems: list[str] = field(default_factory=list)
    # the first code cell that does not parse: its message and where, in the cell's lines
    syntax_error: tuple[int, str, SourceRange | None] | None = None


def extract_notebook_plan(
    path: Path, text: str | None = None, *, settings: ProjectSettings | None = None
) -> TrainingPlan:
    """The TrainingPlan of a notebook's code cells, every range naming its cell. Never raises."""
    path = Path(path)
    problems: list[str] = []
    try:
        return _read_notebook(path, text, settings, problems)
    except RecursionError:
        problems.append("the notebook nests too deeply to read")
    except Exception as error:  # a gap in the reader must not take the editor down
        problems.append(f"internal error while reading the notebook: {error!r}")
    return plan_from_problems(path, "notebook", settings, problems)


def _read_notebook(
    path: Path, text: str | None, settings: ProjectSettings | None, problems: list[str]
) -> TrainingPlan:
    if text is None:
        text = _read_notebook_text(path, problems)
    cells = _notebook_cells(text, problems) if text is not None else None
    if cells is None:
        return plan_from_problems(path, "notebook", settings, problems, unreadable=True)
    joined = join_code_cells(cells)
    problems.extend(joined.problems)
    shell = notebook_shell([cell_source(cell) for cell in cells])
    if not joined.text.strip():
        if shell.has_commands and launches_training(shell.text):
            return _launched_plan(path, cells, shell, settings, problems)
        problems.append("the notebook has no Python code cells")
        return plan_from_problems(path, "notebook", settings, problems)
    from llmmem.extract.python import extract_python_plan

    plan = extract_python_plan(path, joined.text, settings=settings)
    if not _trains_in_python(plan) and shell.has_commands and launches_training(shell.text):
        return _launched_plan(path, cells, shell, settings, problems)
    mapped = map_plan_to_cells(plan, joined, str(path))
    mapped.kind = "notebook"
    if joined.syntax_error is not None and mapped.parse_error is None:
        index, message, where = joined.syntax_error
        mapped.parse_error = message
        if where is not None:
            mapped.parse_error_range = dataclasses.replace(where, path=cell_path(str(path), index))
    mapped.problems = problems + [problem for problem in mapped.problems if problem not in problems]
    return mapped


def _trains_in_python(plan: TrainingPlan) -> bool:
    """Whether the notebook's Python builds the training step itself (a trainer, a model)
    rather than loading a model beside a shell line that trains."""
    if "not_training" in plan.extra:
        return False
    return plan.trainer_range is not None or plan.model_id is not None


def _launched_plan(
    path: Path,
    cells: list[dict[str, Any]],
    shell: NotebookShell,
    settings: ProjectSettings | None,
    problems: list[str],
) -> TrainingPlan:
    """The plan of the training command a notebook's shell lines run, read as a launcher
    script would be, with the files its `%%writefile` cells write found by their names; every
    range names the cell it is written in."""
    from llmmem.extract.shell import extract_shell_plan
    from llmmem.extract.text import WrittenText, written_files

    notebook = str(path)
    folder = path.parent
    written = {
        folder / name: WrittenText(file.text, cell_path(notebook, file.cell))
        for name, file in shell.written.items()
    }
    with written_files(written):
        plan = extract_shell_plan(path, shell.text, settings=settings)
    joined = JoinedCells(
        text=shell.text,
        origins=[CellLine(cell, line) for cell, line in shell.origins],
        cell_lines={
            index: (cell_source(cell) or "").split("\n") for index, cell in enumerate(cells)
        },
    )
    mapped = _written_in_the_notebook(map_plan_to_cells(plan, joined, notebook), notebook)
    assert isinstance(mapped, TrainingPlan)
    mapped.kind = "notebook"
    mapped.problems = problems + [problem for problem in mapped.problems if problem not in problems]
    return mapped


def _written_in_the_notebook(value: Any, notebook: str) -> Any:
    """A value read from a `%%writefile` cell is written in the notebook: `explicit`, as the
    values of its Python cells are, not `config` (a file the notebook refers to)."""
    if isinstance(value, Sourced):
        if value.source is Provenance.CONFIG and cell_index(value.range, notebook) is not None:
            return dataclasses.replace(value, source=Provenance.EXPLICIT)
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        updates = {
            item.name: _written_in_the_notebook(getattr(value, item.name), notebook)
            for item in dataclasses.fields(value)
            if item.init
        }
        return dataclasses.replace(value, **updates)
    if isinstance(value, dict):
        return {key: _written_in_the_notebook(item, notebook) for key, item in value.items()}
    return value


def _read_notebook_text(path: Path, problems: list[str]) -> str | None:
    from llmmem.files import read_file_bytes

    try:
        data = read_file_bytes(path, MAX_NOTEBOOK_BYTES)
    except OSError as error:
        problems.append(f"{path}: cannot be read ({error.strerror or error})")
        return None
    return decode_text(data, str(path), problems)


def _notebook_cells(text: str, problems: list[str]) -> list[dict[str, Any]] | None:
    """The notebook's cells, or None with a problem line when the JSON is not a notebook."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        problems.append(
            f"line {error.lineno}, column {error.colno}: not valid notebook JSON ({error.msg})"
        )
        return None
    except (ValueError, RecursionError) as error:
        problems.append(f"not valid notebook JSON ({error})")
        return None
    if not isinstance(document, dict):
        problems.append("not a Jupyter notebook: the JSON is not an object")
        return None
    cells = document.get("cells")
    if cells is None and isinstance(document.get("worksheets"), list):  # nbformat 3
        cells = [
            cell
            for sheet in document["worksheets"]
            if isinstance(sheet, dict) and isinstance(sheet.get("cells"), list)
            for cell in sheet["cells"]
        ]
    if not isinstance(cells, list):
        problems.append("not a Jupyter notebook: no list of cells")
        return None
    return [cell if isinstance(cell, dict) else {} for cell in cells]


def cell_source(cell: dict[str, Any]) -> str | None:
    """A code cell's source as one string; None for other cells or a malformed source."""
    if cell.get("cell_type") != "code":
        return None
    source = cell.get("source", cell.get("input"))
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        source = "".join(source)
    if not isinstance(source, str):
        return None
    return source.replace("\r\n", "\n").replace("\r", "\n")


def code_cell_text(notebook_text: str, index: int) -> str | None:
    """The source of code cell `index` of a notebook's JSON text; None when there is none."""
    cells = _notebook_cells(notebook_text, [])
    if cells is None or not 0 <= index < len(cells) or not isinstance(cells[index], dict):
        return None
    return cell_source(cells[index])


def join_code_cells(cells: list[dict[str, Any]]) -> JoinedCells:
    joined = JoinedCells()
    pieces: list[str] = []
    for index, cell in enumerate(cells):
        source = cell_source(cell)
        if source is None or not source.strip():
            continue
        lines = source.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        joined.cell_lines[index] = lines
        python_lines = python_lines_of_cell(lines)
        if python_lines is None:
            continue
        problem = _syntax_problem("\n".join(python_lines) + "\n", index)
        if problem is not None:
            joined.problems.append(problem[0])
            if joined.syntax_error is None:
                joined.syntax_error = (index, problem[0], problem[1])
            continue
        for line_number, line in enumerate(python_lines):
            pieces.append(line + "\n")
            joined.origins.append(CellLine(index, line_number))
    joined.text = "".join(pieces)
    return joined


def python_lines_of_cell(lines: list[str]) -> list[str] | None:
    """The cell's lines with IPython syntax replaced line for line; None for a cell that is not
    Python at all (`%%bash`, `%%writefile x.py`)."""
    result: list[str] = []
    start = 0
    if lines and lines[0].lstrip().startswith("%%"):
        magic = lines[0].lstrip()[2:].split(maxsplit=1)
        if not magic or magic[0] not in PYTHON_BODY_CELL_MAGICS:
            return None
        result.append("")
        start = 1
    continuing = False
    for line in lines[start:]:
        stripped = line.lstrip()
        indentation = line[: len(line) - len(stripped)]
        assignment = MAGIC_ASSIGNMENT.match(line)
        if continuing or stripped.startswith(("%", "!")) or HELP_LINE.match(line):
            result.append(f"{indentation}pass" if not continuing else "")
            continuing = line.rstrip().endswith("\\")
        elif assignment is not None:
            result.append(f"{assignment.group(1)}{assignment.group(2)} = None")
            continuing = line.rstrip().endswith("\\")
        else:
            result.append(line)
    return result


def _syntax_problem(source: str, index: int) -> tuple[str, SourceRange | None] | None:
    """Why a cell's Python does not parse (syntax of newer releases is read), and where."""
    from llmmem.extract.python.source import parse_script

    parsed = parse_script(source)
    if parsed.module is not None:
        return None
    where = parsed.problem_range
    if parsed.syntax_message is not None and where is not None:
        problem = f"cell {index + 1}, line {where.start_line + 1}: {parsed.syntax_message}"
    else:
        problem = f"cell {index + 1}: {parsed.problem}"
    return problem + "; the cell is left out", where


# -- positions back to cells ------------------------------------------------------------------


def map_plan_to_cells(plan: TrainingPlan, joined: JoinedCells, notebook: str) -> TrainingPlan:
    """The plan with every range in the joined text moved to its cell (see the module doc)."""
    mapped = _map_model(plan, joined, notebook)
    assert isinstance(mapped, TrainingPlan)
    mapped.problems = [_map_problem(problem, joined) for problem in mapped.problems]
    return mapped


def cell_path(notebook: str, index: int) -> str:
    """The `path` of a range in cell `index` of `notebook`."""
    return f"{notebook}#cell={index}"


def cell_index(located: SourceRange | None, notebook: str) -> int | None:
    """The cell a range of `notebook`'s plan lies in; None for a range elsewhere (or none)."""
    if located is None or located.path is None:
        return None
    prefix = f"{notebook}#cell="
    if not located.path.startswith(prefix):
        return None
    number = located.path[len(prefix) :]
    return int(number) if number.isdigit() else None


def map_range(located: SourceRange, joined: JoinedCells, notebook: str) -> SourceRange | None:
    """A range in the joined text as a range in its cell; one that runs past the end of its
    cell stops at that cell's last character."""
    if located.path is not None:
        return located
    if not 0 <= located.start_line < len(joined.origins):
        return None
    start = joined.origins[located.start_line]
    end_line, end_col = located.end_line, located.end_col
    end = joined.origins[end_line] if 0 <= end_line < len(joined.origins) else None
    if end is None or end.cell != start.cell:
        lines = joined.cell_lines.get(start.cell, [""])
        end = CellLine(start.cell, len(lines) - 1)
        end_col = len(lines[-1]) if lines else 0
    return SourceRange(
        path=cell_path(notebook, start.cell),
        start_line=start.line,
        start_col=located.start_col,
        end_line=end.line,
        end_col=end_col,
    )


def _map_model(value: Any, joined: JoinedCells, notebook: str) -> Any:
    if isinstance(value, SourceRange):
        return map_range(value, joined, notebook)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        updates = {
            item.name: _map_model(getattr(value, item.name), joined, notebook)
            for item in dataclasses.fields(value)
            if item.init
        }
        return dataclasses.replace(value, **updates)
    if isinstance(value, list):
        return [_map_model(item, joined, notebook) for item in value]
    if isinstance(value, dict):
        return {key: _map_model(item, joined, notebook) for key, item in value.items()}
    return value


def _map_problem(problem: str, joined: JoinedCells) -> str:
    """`line 12` (1-based, in the joined text) -> `cell 3, line 2`."""

    def replace(match: re.Match[str]) -> str:
        number = int(match.group(1)) - 1
        if not 0 <= number < len(joined.origins):
            return match.group(0)
        origin = joined.origins[number]
        return f"cell {origin.cell + 1}, line {origin.line + 1}"

    return LINE_REFERENCE.sub(replace, problem)

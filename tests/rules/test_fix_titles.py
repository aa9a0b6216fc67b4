"""Every offered fix delivers the number in its title.

Over every fixture and example (Python, YAML, JSON, shell, notebooks) and two GPUs: each fix's
edits are applied here (a notebook's cell edits to that cell of the JSON), the result must still
parse, and `check_text` on it, the entry point `llmmem-lint` and the editor use, must give the
title's total to the 0.1 GiB printed, lower than before the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmmem.check import check_text
from llmmem.extract.notebook import cell_index
from llmmem.rules.finding import Fix, TextEdit
from llmmem.rules.text_edits import apply_edits
from llmmem.units import format_bytes

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".py", ".yaml", ".yml", ".json", ".sh", ".ipynb"}
FILES = sorted(
    path
    for folder in (ROOT / "tests" / "fixtures", ROOT / "examples")
    for path in folder.rglob("*")
    if path.is_file() and path.suffix in SUFFIXES
)
GPUS = ("RTX-4090", "A100-80GB")


def applied(path: Path, text: str, fix: Fix) -> str:
    """The file's text after the fix, as an editor holding the file (or its cells) would
    apply the edits."""
    if all(edit.range.path is None for edit in fix.edits):
        return apply_edits(text, fix.edits)
    notebook = json.loads(text)
    for edit in fix.edits:
        index = cell_index(edit.range, str(path))
        assert index is not None, edit
        cell = notebook["cells"][index]
        source = cell["source"]
        source = "".join(source) if isinstance(source, list) else source
        plain = TextEdit(
            range=type(edit.range)(
                start_line=edit.range.start_line,
                start_col=edit.range.start_col,
                end_line=edit.range.end_line,
                end_col=edit.range.end_col,
            ),
            new_text=edit.new_text,
        )
        cell["source"] = apply_edits(source, [plain])
    return json.dumps(notebook)


def parses(path: Path, text: str) -> None:
    if path.suffix == ".py":
        compile(text, str(path), "exec", dont_inherit=True)
    elif path.suffix in (".json", ".ipynb"):
        json.loads(text)
    elif path.suffix in (".yaml", ".yml"):
        list(yaml.safe_load_all(text))


def offered(path: Path, gpu: str) -> list[tuple[str, Fix, int]]:
    text = path.read_text(encoding="utf-8", errors="replace")
    checked = check_text(path, text, gpu=gpu, hub=False)
    budget = checked.analysis.budget
    return [
        (finding.code, fix, budget.device_total_bytes if budget else 0)
        for finding in checked.findings
        for fix in finding.fixes
        if not asks_for_a_value(fix)
    ]


def asks_for_a_value(fix: Fix) -> bool:
    """A pragma to fill in (`# llmmem: model=org/name`, LLM010): it changes no memory and is
    never applied by `--fix`, so it has no total to give."""
    return not fix.safe and fix.predicted_device_bytes is None


def test_the_fixtures_offer_fixes_to_check() -> None:
    # the property below must not hold vacuously
    count = sum(len(offered(path, gpu)) for path in FILES for gpu in GPUS)
    assert count >= 40


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_offered_fix_gives_the_total_in_its_title(path: Path, gpu: str) -> None:
    text = path.read_text(encoding="utf-8", errors="replace")
    for code, fix, before in offered(path, gpu):
        fixed = applied(path, text, fix)
        assert fixed != text, fix.title
        parses(path, fixed)
        analysis = check_text(path, fixed, gpu=gpu, hub=False).analysis
        after = analysis.budget
        assert after is not None, f"{code} {fix.title}: no estimate after the fix"
        assert f"→ {format_bytes(after.device_total_bytes)}" in fix.title, (code, fix.title)
        assert after.device_total_bytes < before, (code, fix.title)
        guessed = analysis.spec is not None and analysis.spec.is_guess
        # a model sized from its name has no verdict (LLM017): the title says none
        assert fix.fits == (None if guessed else after.fits), (code, fix.title)
        assert guessed is not ("fits " in fix.title or "still over" in fix.title), fix.title

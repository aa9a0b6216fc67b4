"""Every output the README and the documentation show is what the tool prints today.

Each fenced block after an `<!-- output: COMMAND -->` marker is compared with what COMMAND prints
when run with the installed commands in a subprocess (bash, from the repository's root, offline,
100 columns wide, with empty caches and an empty environment for the release lookup); each block
after an `<!-- editor output: ... -->` marker with what `llmmem-lsp` answers over stdio. When the
tool's output changes on purpose, `python docs/generate.py` writes the blocks again.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from docs_pages import GENERATE, REPO

SHOWN = [shown for page in GENERATE.pages() for shown in GENERATE.shown_outputs(page)]


def test_every_marker_is_followed_by_its_block() -> None:
    loose = {str(page.relative_to(REPO)): GENERATE.loose_markers(page) for page in GENERATE.pages()}
    assert not {page: lines for page, lines in loose.items() if lines}, (
        "a marker with no fenced block right after it checks nothing"
    )


def test_the_readme_and_the_pages_show_checked_outputs() -> None:
    pages = {shown.page.relative_to(REPO).as_posix() for shown in SHOWN}
    assert "README.md" in pages
    assert {"docs/getting-started.md", "docs/editor/index.md", "docs/rules/index.md"} <= pages
    readme = [shown.command for shown in SHOWN if shown.page.name == "README.md"]
    # the README's own excerpt is the first command's, as the README gives it
    assert any(c.startswith("llmmem explain examples/qlora_sft.py --gpu RTX-4090") for c in readme)
    assert len(SHOWN) <= 20, "each shown output costs test time: keep them few"


@pytest.mark.parametrize("shown", SHOWN, ids=[shown.where for shown in SHOWN])
def test_shown_output_is_what_the_tool_prints(shown) -> None:  # type: ignore[no-untyped-def]
    printed = GENERATE.produce(shown.kind, shown.command)
    if printed != shown.shown:
        diff = "".join(
            difflib.unified_diff(
                shown.shown.splitlines(keepends=True),
                printed.splitlines(keepends=True),
                "shown in " + shown.where,
                "printed by: " + shown.command,
            )
        )
        pytest.fail(
            f"{shown.where} shows something else than `{shown.command}` prints today; if the "
            f"change is meant, run `python docs/generate.py`\n{diff}"
        )


def test_a_stale_block_is_caught_and_written_again(tmp_path: Path) -> None:
    """The check compares the whole block: one changed number is drift, and the generator puts
    back exactly what the command prints."""
    command = "llmmem gpus | head -n 2"
    printed = GENERATE.produce("output", command)
    stale = printed.replace(" GiB", " GB", 1)  # one unit written differently
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n<!-- output: {command} -->\n```text\n{stale}```\n", "utf-8")
    (shown,) = GENERATE.shown_outputs(page)
    assert shown.shown == stale != printed
    assert GENERATE.rewrite_outputs(page) == [f"{page}:3: {command}"]
    (rewritten,) = GENERATE.shown_outputs(page)
    assert rewritten.shown == printed
    assert page.read_text("utf-8").startswith("# A page\n\n<!-- output: ")


def test_a_command_that_prints_nothing_is_an_error_not_an_empty_block() -> None:
    with pytest.raises(RuntimeError, match="printed nothing"):
        GENERATE.run_command("llmmem explain no/such/file.py --gpu RTX-4090")

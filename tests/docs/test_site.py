"""The documentation site builds with `mkdocs build --strict`, its rule pages are the rule
registry's, and the README stays a short front page whose test command is the one CI runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docs_pages import GENERATE, REPO


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of `config` into `site` (never into the repository)."""
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[test]' -c tests/constraints.txt")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strictly_with_every_page(tmp_path: Path) -> None:
    done = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    pages = ("getting-started", "cli/estimate", "rules/LLM017", "editor/neovim", "accuracy/gpu")
    for page in pages:
        assert (tmp_path / "site" / page / "index.html").is_file(), page


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """--strict with link and anchor validation: a link to a page or a heading that is not there
    stops the build (so the CI build is a check, not a formality)."""
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "getting-started.md"
    page.write_text(
        page.read_text("utf-8") + "\nSee [the rules](rules/index.md#no-such-heading).\n", "utf-8"
    )
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-heading" in done.stderr


def test_the_rule_pages_are_the_registrys() -> None:
    for path, text in GENERATE.generated_rule_files().items():
        assert path.read_text("utf-8") == text, (
            f"{path.relative_to(REPO)} is out of date: run `python docs/generate.py`"
        )
    assert GENERATE.stale_rule_pages() == []


def test_the_readme_is_a_short_front_page() -> None:
    lines = (REPO / "README.md").read_text("utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the detail into docs/"


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    readme = (REPO / "README.md").read_text("utf-8")
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("\n", 1)[1].strip() for block in section.split("```sh")[1:]]
    first, second = (block.split("```")[0].strip() for block in blocks[:2])
    assert first.endswith("llmmem explain examples/qlora_sft.py --gpu RTX-4090")
    ci = (REPO / ".ci" / "run").read_text("utf-8").strip().splitlines()
    assert ci[-1] == second

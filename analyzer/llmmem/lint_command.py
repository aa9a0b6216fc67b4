"""`llmmem-lint PATH... --gpu NAME` (and `llmmem lint`): findings for CI and pre-commit.

Exit codes: 0 no findings at or above `--fail-on` (default warning: info findings are printed
but pass), 1 such findings, 2 a usage or read error; `--exit-zero` turns 1 into 0. `--fix`
applies safe fixes one at a time (one that makes the step fit first, else the one that saves
most), re-linting after each, and reports what is left.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from llmmem.errors import UsageError

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2

FAIL_ON_LEVELS = ("error", "warning", "info")
DEFAULT_FAIL_ON = "warning"
_RANK = {"error": 3, "warning": 2, "info": 1}

LINTED_SUFFIXES = {".py", ".yaml", ".yml", ".json", ".sh", ".ipynb"}
MAX_FILE_BYTES = 5 * 1024 * 1024


def add_lint_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or directories to lint")
    p.add_argument("--gpu", default=None, help="target GPU (default: [tool.llmmem] gpu, pragma)")
    p.add_argument(
        "--format", default="concise", choices=["concise", "full", "json", "github", "sarif"]
    )
    p.add_argument("--fix", action="store_true", help="apply safe fixes in place")
    p.add_argument("--explain", metavar="CODE", help="print a rule's documentation and exit")
    p.add_argument("--hub", action="store_true", help="allow hub lookups for unknown models")
    p.add_argument("--select", default=None, help="only these codes, e.g. LLM001,LLM002")
    p.add_argument(
        "--fail-on",
        choices=FAIL_ON_LEVELS,
        default=None,
        help="the least severity that exits 1 (default: [tool.llmmem] fail_on, else warning)",
    )
    p.add_argument(
        "--exit-zero",
        action="store_true",
        help="exit 0 even with findings (2 still means a usage or read error)",
    )


def iter_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files += sorted(
                p
                for p in path.rglob("*")
                if p.suffix in LINTED_SUFFIXES
                and p.is_file()
                and not any(
                    part.startswith(".") or part in ("node_modules", "__pycache__")
                    for part in p.parts
                )
            )
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"{raw}: no such file or directory")
    return files


def read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UsageError(f"{path}: cannot read ({err.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(f"{path}: larger than 5 MiB, not a training script or config")
    return data.decode("utf-8", errors="replace")


def lint_text(
    path: Path, text: str, *, gpu: str | None, hub: bool, select: set[str] | None
) -> tuple[list, str]:
    """Findings for one file (suppressions applied) and the analysis' GPU name."""
    from llmmem.check import check_text

    checked = check_text(path, text, gpu=gpu, hub=hub, select=select)
    gpu_target = checked.analysis.gpu
    return checked.findings, gpu_target.name if gpu_target else ""


MAX_FIX_ROUNDS = 5


def best_safe_fix(findings: list) -> object | None:
    """The safe fix to apply next: one that makes the step fit, else the one that saves most."""
    fixes = [
        fix
        for finding in findings
        for fix in finding.fixes
        if fix.safe and all(edit.range.path is None for edit in fix.edits)  # not notebook cells
    ]
    if not fixes:
        return None
    return min(fixes, key=lambda fix: (not fix.fits, fix.predicted_device_bytes or 0))


def fix_file(
    path: Path, text: str, *, gpu: str | None, hub: bool, select: set[str] | None
) -> tuple[str, list]:
    """Apply safe fixes one at a time (each changes the estimate the others were made on),
    re-linting after each, until no finding has one; returns the text and what is left."""
    from llmmem.rules.edits import apply_edits

    findings, _ = lint_text(path, text, gpu=gpu, hub=hub, select=select)
    for _ in range(MAX_FIX_ROUNDS):
        fix = best_safe_fix(findings)
        if fix is None:
            break
        fixed = apply_edits(text, fix.edits)  # type: ignore[attr-defined]
        if fixed == text:
            break
        text = fixed
        findings, _ = lint_text(path, text, gpu=gpu, hub=hub, select=select)
    return text, findings


def run_lint(args: argparse.Namespace) -> int:
    from llmmem.report import findings as render
    from llmmem.rules.registry import RULES, all_rules

    if args.explain:
        all_rules()
        rule = RULES.get(args.explain.upper())
        if rule is None:
            raise UsageError(f"unknown rule {args.explain}; rules are {', '.join(sorted(RULES))}")
        print(rule.doc())
        return EXIT_CLEAN
    if not args.paths:
        raise UsageError("nothing to lint: give one or more files or directories")
    select = {c.strip().upper() for c in args.select.split(",")} if args.select else None
    from llmmem.check import require_known_gpus
    from llmmem.extract import find_project_settings

    all_findings = []
    failing = False
    for path in iter_files(args.paths):
        settings = find_project_settings(path)
        require_known_gpus(args.gpu, settings)
        text = read_text(path)
        if args.fix:
            fixed, findings = fix_file(path, text, gpu=args.gpu, hub=args.hub, select=select)
            if fixed != text:
                path.write_text(fixed, encoding="utf-8")
        else:
            findings, _ = lint_text(path, text, gpu=args.gpu, hub=args.hub, select=select)
        all_findings += findings
        failing = failing or fails(findings, args.fail_on or settings.fail_on or DEFAULT_FAIL_ON)
    if args.format == "concise":
        sys.stdout.write(render.concise(all_findings))
    elif args.format == "full":
        sys.stdout.write(render.full(all_findings))
    elif args.format == "json":
        sys.stdout.write(render.as_json(all_findings))
    elif args.format == "github":
        sys.stdout.write(render.github(all_findings))
    else:
        sys.stdout.write(render.sarif(all_findings, all_rules()))
    return EXIT_FINDINGS if failing and not args.exit_zero else EXIT_CLEAN


def fails(findings: list, fail_on: str) -> bool:
    """Whether any finding is at least as severe as `fail_on`."""
    least = _RANK[fail_on]
    return any(_RANK.get(finding.severity.value, 0) >= least for finding in findings)


def lint_main(argv: Sequence[str] | None = None) -> int:
    """The `llmmem-lint` entry point."""
    from llmmem.cli import OneLineParser

    parser = OneLineParser(
        prog="llmmem-lint", description="Lint training scripts and configs for GPU memory."
    )
    add_lint_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_lint(args)
    except UsageError as err:
        print(f"llmmem-lint: error: {err}", file=sys.stderr)
        return EXIT_USAGE

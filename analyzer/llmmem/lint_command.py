"""`llmmem-lint PATH... --gpu NAME` (and `llmmem lint`): findings for CI and pre-commit.

Exit codes: 0 no findings at or above `--fail-on` (default warning: info findings are printed
but pass), 1 such findings, 2 a usage or read error; `--exit-zero` turns 1 into 0. `--fix`
applies safe fixes one at a time (one that makes the step fit first, else the one that saves
most), re-linting after each, and reports what is left. A fixed file is written only when it
still parses and gives an estimate, in its own encoding and line endings, all at once; symbolic
links are not written through, and a file that cannot be written is an error (exit 2).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from llmmem.errors import EXIT_USAGE, OneLineParser, UsageError, non_empty, run_entry_point
from llmmem.fix_writer import fix_file, fix_in_place, lint_text

__all__ = ["fix_file", "lint_main", "run_lint"]

EXIT_CLEAN = 0
EXIT_FINDINGS = 1

FAIL_ON_LEVELS = ("error", "warning", "info")
DEFAULT_FAIL_ON = "warning"
_RANK = {"error": 3, "warning": 2, "info": 1}

LINTED_SUFFIXES = {".py", ".yaml", ".yml", ".json", ".sh", ".ipynb"}
# report formats that print no fix: a lint in them lets the fixes of a Python file be written
# by the text writer (`rules.edits.preview_python_edits`), which does not import libcst
UNSHOWN_FIXES = ("concise", "github", "sarif")
MAX_FILE_BYTES = 5 * 1024 * 1024


def add_lint_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or directories to lint")
    p.add_argument(
        "--gpu",
        type=non_empty,
        default=None,
        help="target GPU (default: [tool.llmmem] gpu, pragma)",
    )
    p.add_argument(
        "--format", default="concise", choices=["concise", "full", "json", "github", "sarif"]
    )
    p.add_argument("--fix", action="store_true", help="apply safe fixes in place")
    p.add_argument(
        "--fit",
        action="store_true",
        help="with --fix: where no single fix makes the step fit, first apply the fewest "
        "changes that together do (the 'Make it fit' fix)",
    )
    p.add_argument("--explain", metavar="CODE", help="print a rule's documentation and exit")
    p.add_argument("--hub", action="store_true", help="allow hub lookups for unknown models")
    p.add_argument("--select", default=None, help="only these codes, e.g. LLM001,LLM002")
    p.add_argument("--ignore", default=None, help="not these codes, e.g. LLM003,LLM004")
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
    """The files to lint: each file named, and the linted files under each directory named
    (hidden folders, node_modules and __pycache__ left out; links to folders not followed). A
    folder that changes while it is walked (checkpoints rotated, /proc) is read as it stands;
    one that cannot be listed is a usage error, not a silent pass."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        try:
            info = path.stat()
        except FileNotFoundError:
            raise UsageError(f"{shown_path(raw)}: no such file or directory") from None
        except OSError as err:
            raise UsageError(f"{shown_path(raw)}: cannot read ({describe(err)})") from None
        if stat.S_ISDIR(info.st_mode):
            files += walk(path)
        elif stat.S_ISREG(info.st_mode):
            files.append(path)
        else:
            from llmmem.files import why_not_a_file

            raise UsageError(f"{shown_path(raw)}: {why_not_a_file(path)}")
    return files


def walk(root: Path) -> list[Path]:
    found: list[Path] = []

    def unlistable(err: OSError) -> None:
        if isinstance(err, FileNotFoundError | NotADirectoryError):
            return  # it went away while the walk ran
        where = shown_path(err.filename or str(root))
        raise UsageError(f"{where}: cannot list the folder ({describe(err)})")

    for folder, subfolders, names in os.walk(root, onerror=unlistable):
        subfolders[:] = sorted(
            name
            for name in subfolders
            if not name.startswith(".") and name not in ("node_modules", "__pycache__")
        )
        for name in sorted(names):
            if name.startswith(".") or os.path.splitext(name)[1] not in LINTED_SUFFIXES:
                continue
            candidate = Path(folder, name)
            try:
                if stat.S_ISREG(candidate.stat().st_mode):
                    found.append(candidate)
            except OSError:
                continue  # gone, or a link to nothing
    return sorted(found)


def shown_path(raw: str | bytes, limit: int = 120) -> str:
    """A path as a one-line message quotes it: a 4,000-character name is cut."""
    text = os.fsdecode(raw)
    return text if len(text) <= limit else f"{text[: limit // 2]}…{text[-limit // 2 :]}"


def describe(err: OSError) -> str:
    return err.strerror or type(err).__name__


def read_text(path: Path) -> str:
    from llmmem.files import UnreadableFile, read_file_bytes

    try:
        data = read_file_bytes(path, MAX_FILE_BYTES)
    except UnreadableFile as err:
        if "larger than" in str(err):
            raise UsageError(
                f"{shown_path(str(path))}: larger than 5 MiB, not a training script or config"
            ) from None
        raise UsageError(f"{shown_path(str(path))}: {err}") from None
    except OSError as err:
        raise UsageError(f"{shown_path(str(path))}: cannot read ({describe(err)})") from None
    return data.decode("utf-8", errors="replace")


def run_lint(args: argparse.Namespace) -> int:
    from llmmem.report import findings as render
    from llmmem.rules.catalog import all_rules
    from llmmem.rules.registry import RULES

    if args.explain:
        all_rules()
        rule = RULES.get(args.explain.upper())
        if rule is None:
            raise UsageError(f"unknown rule {args.explain}; rules are {', '.join(sorted(RULES))}")
        print(rule.doc())
        return EXIT_CLEAN
    if not args.paths:
        raise UsageError("nothing to lint: give one or more files or directories")
    all_rules()
    if args.fit and not args.fix:
        raise UsageError("--fit goes with --fix")
    select = chosen_codes(args.select, args.ignore, set(RULES))
    from llmmem.check import require_known_gpus
    from llmmem.extract import find_project_settings
    from llmmem.rules.edits import preview_python_edits

    all_findings = []
    failing = False
    files = iter_files(args.paths)
    roots = [Path(raw) for raw in args.paths if os.path.isdir(raw)]
    named = {Path(raw) for raw in args.paths}
    unwritten = 0
    with hub_run_deadline(args.hub):
        for path in files:
            settings = find_project_settings(path)
            require_known_gpus(args.gpu, settings)
            if path not in named and not path.exists():
                continue  # found by walking a folder, and gone since (a rotated checkpoint)
            try:
                text = read_text(path)
            except UsageError:
                if path not in named and not path.exists():
                    continue  # gone between the look and the read
                raise
            if args.fix:
                findings, written = fix_in_place(
                    path, text, roots, gpu=args.gpu, hub=args.hub, select=select, fit=args.fit
                )
                unwritten += not written
            elif args.format in UNSHOWN_FIXES:
                with preview_python_edits():
                    findings, _ = lint_text(path, text, gpu=args.gpu, hub=args.hub, select=select)
            else:
                findings, _ = lint_text(path, text, gpu=args.gpu, hub=args.hub, select=select)
            all_findings += findings
            failing = failing or fails(
                findings, args.fail_on or settings.fail_on or DEFAULT_FAIL_ON
            )
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
    if unwritten:
        return EXIT_USAGE  # a file's fixes could not be written
    return EXIT_FINDINGS if failing and not args.exit_zero else EXIT_CLEAN


def rule_codes(raw: str, option: str, known: set[str]) -> set[str]:
    """The codes of a `--select`/`--ignore` value; an empty value or an unknown code is a
    usage error (a typo must not turn every check off)."""
    codes = {code.strip().upper() for code in raw.split(",") if code.strip()}
    if not codes:
        raise UsageError(f"{option} is empty: give rule codes, e.g. {option} LLM001,LLM003")
    unknown = sorted(codes - known)
    if unknown:
        import difflib

        close = {m for code in unknown for m in difflib.get_close_matches(code, known, 3, 0.6)}
        hint = f"; did you mean {', '.join(sorted(close))}?" if close else ""
        raise UsageError(
            f"{option}: unknown rule code{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}{hint} (rules are {min(known)} to {max(known)}; "
            "`llmmem-lint --explain CODE` describes one)"
        )
    return codes


def chosen_codes(select: str | None, ignore: str | None, known: set[str]) -> set[str] | None:
    """The rule codes a lint reports (None: every one), from `--select` and `--ignore`."""
    chosen = rule_codes(select, "--select", known) if select is not None else None
    if ignore is not None:
        chosen = (chosen if chosen is not None else set(known)) - rule_codes(
            ignore, "--ignore", known
        )
    return chosen


def hub_run_deadline(hub: bool) -> contextlib.AbstractContextManager[None]:
    """With --hub, one deadline for all the run's hub lookups (`hub.run_deadline`); the hub
    client is not imported otherwise."""
    if not hub:
        return contextlib.nullcontext()
    from llmmem.models.hub import run_deadline

    return run_deadline()


def fails(findings: list, fail_on: str) -> bool:
    """Whether any finding is at least as severe as `fail_on`."""
    least = _RANK[fail_on]
    return any(_RANK.get(finding.severity.value, 0) >= least for finding in findings)


def lint_main(argv: Sequence[str] | None = None) -> int:
    """The `llmmem-lint` entry point."""
    parser = OneLineParser(
        prog="llmmem-lint", description="Lint training scripts and configs for GPU memory."
    )
    add_lint_arguments(parser)
    return run_entry_point("llmmem-lint", lambda: run_lint(parser.parse_args(argv)))

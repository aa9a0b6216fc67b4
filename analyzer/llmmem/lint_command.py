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
import codecs
import contextlib
import errno
import io
import json
import os
import re
import stat
import sys
import tempfile
import tokenize
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmmem.errors import EXIT_USAGE, OneLineParser, UsageError, non_empty

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
        elif path.exists():
            from llmmem.files import why_not_a_file

            raise UsageError(f"{raw}: {why_not_a_file(path)}")
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


def best_safe_fix(findings: list, fit: bool = False) -> object | None:
    """The safe fix to apply next: one that makes the step fit, else the one that saves most;
    with `fit`, a "make it fit" combination first where a finding has one."""
    if fit:
        combined = [fix for finding in findings for fix in finding.fixes if fix.levers]
        if combined:
            return min(combined, key=lambda fix: fix.predicted_device_bytes or 0)
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
    path: Path,
    text: str,
    *,
    gpu: str | None = None,
    hub: bool = False,
    select: set[str] | None = None,
    check: Callable[[str], Any] | None = None,
    skipped: Callable[[str], None] | None = None,
    fit: bool = False,
) -> tuple[str, list]:
    """Apply safe fixes one at a time (each changes the estimate the others were made on),
    re-linting after each, until no finding has one; returns the text and what is left.

    A fix is kept only when the text after it still parses and still gives an estimate, and
    that estimate moved; otherwise it is dropped with a warning and no later fix is tried.
    `check` analyses a text as the caller does (the language server passes its own settings;
    default: `check_text` with `gpu`, `hub`, `select`); `skipped` receives each warning
    (default: printed to stderr); with `fit`, a "make it fit" combination is applied first."""
    from llmmem.check import check_text
    from llmmem.rules.edits import apply_edits

    def analyse(candidate: str) -> Any:
        if check is not None:
            return check(candidate)
        return check_text(path, candidate, gpu=gpu, hub=hub, select=select)

    checked = analyse(text)
    for _ in range(MAX_FIX_ROUNDS):
        fix = best_safe_fix(checked.findings, fit)
        if fix is None:
            break
        fixed = apply_edits(text, fix.edits)  # type: ignore[attr-defined]
        if fixed == text:
            break
        problem = parse_problem(path, fixed)
        if problem is None:
            again = analyse(fixed)
            problem = outcome_problem(checked.analysis, again.analysis)
        if problem is not None:
            message = f"{fix.title}: not applied, {problem}"  # type: ignore[attr-defined]
            if skipped is not None:
                skipped(message)
            else:
                warn(path, message)
            break
        text, checked = fixed, again
    return text, checked.findings


def warn(path: Path, message: str) -> None:
    print(f"llmmem-lint: warning: {path}: {message}", file=sys.stderr)


def parse_problem(path: Path, text: str) -> str | None:
    """Why `text` is no longer a valid file of its kind, or None."""
    try:
        if path.suffix == ".py":
            compile_script(text, path)
        elif path.suffix == ".json":
            json.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            for _ in yaml.safe_load_all(text):
                pass
    except SyntaxError as err:
        return f"the result would not parse ({err.msg}, line {err.lineno})"
    except ValueError as err:  # json.JSONDecodeError
        return f"the result would not parse ({err})"
    except Exception as err:  # yaml.YAMLError and what a constructor raises
        return f"the result would not parse ({' '.join(str(err).split())})"
    return None


def compile_script(text: str, path: Path) -> None:
    """Compile a script as Python does (stricter than parsing: `return` outside a function),
    syntax of newer releases than this one included; raises SyntaxError."""
    try:
        compile(text, str(path), "exec", dont_inherit=True)
    except SyntaxError:
        from llmmem.extract.python.syntax import downlevel

        newer = downlevel(text)
        if newer is None:
            raise
        compile(newer.text, str(path), "exec", dont_inherit=True)


def outcome_problem(before: object, after: object) -> str | None:
    """Why an analysis after a fix does not show the fix working, or None."""
    old, new = getattr(before, "budget", None), getattr(after, "budget", None)
    if old is not None and new is None:
        return "the file would no longer give an estimate (is the model still found?)"
    if old is not None and new is not None:
        if new.device_total_bytes == old.device_total_bytes:
            return "the estimate would not change (the setting is not read where it was written)"
    return None


@dataclass(frozen=True)
class FixableText:
    """A file's text as the fixes see it (every line break a `\\n`), and how to write it
    back byte for byte: its encoding (a UTF-8 byte-order mark kept) and its line breaks."""

    text: str
    encoding: str
    newline: str

    def encode(self, text: str) -> bytes:
        if self.newline != "\n":
            text = text.replace("\n", self.newline)
        return text.encode(self.encoding)


def fixable_text(path: Path, data: bytes) -> FixableText | str:
    """The text to fix, or why the file is not fixed (it is still linted)."""
    if path.suffix == ".py":
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError as err:
            return f"it does not decode with its declared or the default encoding ({err})"
    else:
        encoding = "utf-8-sig" if data.startswith(codecs.BOM_UTF8) else "utf-8"
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError):
        return f"it does not decode as {encoding}"
    endings = set(re.findall(r"\r\n|\r|\n", text))
    if len(endings) > 1:
        return "it mixes line endings"
    newline = endings.pop() if endings else "\n"
    if newline != "\n":
        text = text.replace(newline, "\n")
    return FixableText(text, encoding, newline)


def write_refusal(path: Path, roots: list[Path]) -> str | None:
    """Why `path` must not be rewritten: a symbolic link, or a file found under a directory
    being linted that resolves outside it."""
    if path.is_symlink():
        return "it is a symbolic link (fix the file it points to)"
    resolved = path.resolve()
    for root in roots:
        if path.is_relative_to(root) and not resolved.is_relative_to(root.resolve()):
            return f"it resolves to {resolved}, outside {root}"
    return None


def write_in_place(path: Path, data: bytes) -> None:
    """Replace the file's bytes all at once (a temporary file beside it, then a rename),
    keeping its permissions; a read-only file is refused."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o222 or not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "the file is read-only")
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".fix")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def fix_in_place(
    path: Path,
    text: str,
    roots: list[Path],
    *,
    gpu: str | None,
    hub: bool,
    select: set[str] | None,
    fit: bool = False,
) -> tuple[list, bool]:
    """`--fix` for one file: the findings left, and False when the fixed file could not be
    written (then the findings are the unfixed file's)."""
    refusal = write_refusal(path, roots)
    source = fixable_text(path, path.read_bytes()) if refusal is None else refusal
    if isinstance(source, str):
        warn(path, f"not fixed: {source}")
        return lint_text(path, text, gpu=gpu, hub=hub, select=select)[0], True
    fixed, findings = fix_file(path, source.text, gpu=gpu, hub=hub, select=select, fit=fit)
    if fixed == source.text:
        return findings, True
    try:
        write_in_place(path, source.encode(fixed))
    except (OSError, UnicodeEncodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        print(f"llmmem-lint: error: {path}: cannot write the fixes ({reason})", file=sys.stderr)
        return lint_text(path, text, gpu=gpu, hub=hub, select=select)[0], False
    return findings, True


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
    roots = [Path(raw) for raw in args.paths if Path(raw).is_dir()]
    unwritten = 0
    with hub_run_deadline(args.hub):
        for path in iter_files(args.paths):
            settings = find_project_settings(path)
            require_known_gpus(args.gpu, settings)
            text = read_text(path)
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
    args = parser.parse_args(argv)
    try:
        return run_lint(args)
    except UsageError as err:
        print(f"llmmem-lint: error: {err}", file=sys.stderr)
        return EXIT_USAGE

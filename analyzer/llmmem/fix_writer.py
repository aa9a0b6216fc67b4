"""`llmmem-lint --fix`: safe fixes applied one at a time, and a fixed file written back.

A fix is kept only when the text after it still parses (compiles, for Python) and still gives an
estimate that moved; the file is written in its own encoding and line endings, all at once, and
never through a symbolic link or outside the directory being linted. A notebook's fixes edit its
cells' sources inside the notebook's JSON (`rules/notebook_edits`), every other byte kept. The
language server's "fix all" runs `fix_file` with its own analysis.

A fixed file stays the same file: its owner, group, mode and extended attributes (ACLs among
them) are kept. It is replaced all at once: a temporary file beside it is given the original's
owner, group, mode and attributes, then renamed over it. Where that cannot keep them, the new
bytes (prepared in full first) are written through the file itself, keeping its inode: a file
with other names (hard links), so every name shows the fix; a file whose owner this user may not
give a new file (one owned by someone else that this user may write); a file in a directory that
takes no new file. Such a write is not atomic: a crash in the middle can leave part of the new
text.
"""

from __future__ import annotations

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def lint_text(
    path: Path, text: str, *, gpu: str | None, hub: bool, select: set[str] | None
) -> tuple[list, str]:
    """Findings for one file (suppressions applied) and the analysis' GPU name."""
    from llmmem.check import check_text

    checked = check_text(path, text, gpu=gpu, hub=hub, select=select)
    gpu_target = checked.analysis.gpu
    return checked.findings, gpu_target.name if gpu_target else ""


MAX_FIX_ROUNDS = 5


def best_safe_fix(findings: list, fit: bool = False, notebook: str | None = None) -> object | None:
    """The safe fix to apply next: one that makes the step fit, else the one that saves most;
    with `fit`, a "make it fit" combination first where a finding has one. Only fixes whose
    edits are of this file's text count, or, in the notebook `notebook` (its plan's path), of
    its cells."""
    if fit:
        combined = [fix for finding in findings for fix in finding.fixes if fix.levers]
        if combined:
            return min(combined, key=lambda fix: fix.predicted_device_bytes or 0)
    fixes = [
        fix
        for finding in findings
        for fix in finding.fixes
        if fix.safe and edits_of_this_file(fix.edits, notebook)
    ]
    if not fixes:
        return None
    return min(fixes, key=lambda fix: (not fix.fits, fix.predicted_device_bytes or 0))


def edits_of_this_file(edits: list, notebook: str | None) -> bool:
    """The edits are all of the file's own text, or all of cells of the notebook `notebook`."""
    if all(edit.range.path is None for edit in edits):
        return True
    from llmmem.rules.notebook_edits import is_cell_fix

    return notebook is not None and is_cell_fix(edits, notebook)


def applied(text: str, edits: list, notebook: str | None) -> str:
    """The text with a fix's edits applied (a notebook's cell edits inside its JSON, or
    NotebookEditError saying why they cannot be)."""
    from llmmem.rules.text_edits import apply_edits

    if all(edit.range.path is None for edit in edits) or notebook is None:
        return apply_edits(text, edits)
    from llmmem.rules.notebook_edits import apply_cell_edits

    return apply_cell_edits(text, notebook, edits)


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
    from llmmem.rules.notebook_edits import NotebookEditError

    def analyse(candidate: str) -> Any:
        if check is not None:
            return check(candidate)
        return check_text(path, candidate, gpu=gpu, hub=hub, select=select)

    checked = analyse(text)
    for _ in range(MAX_FIX_ROUNDS):
        plan = checked.analysis.plan
        notebook = plan.path if plan.kind == "notebook" else None
        fix = best_safe_fix(checked.findings, fit, notebook)
        if fix is None:
            break
        problem: str | None
        try:
            fixed = applied(text, fix.edits, notebook)  # type: ignore[attr-defined]
        except NotebookEditError as err:
            fixed, problem = text, f"the notebook's cell cannot take it ({err})"
        else:
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
        elif path.suffix in (".json", ".ipynb"):
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
    """Replace the file's bytes keeping the file's identity (see the module's doc): a renamed
    temporary copy where it can be given the original's owner, group, mode and attributes and
    the file has one name, else a write through the file itself; a read-only file is refused."""
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if not mode & 0o222 or not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "the file is read-only")
    if info.st_nlink > 1 or not replaced_by_copy(path, data, info):
        write_through(path, data)


class IdentityNotKept(Exception):
    """A temporary copy cannot be given the original file's owner, group, mode or attributes."""


def replaced_by_copy(path: Path, data: bytes, info: os.stat_result) -> bool:
    """Write `data` to a temporary file beside `path`, give it `path`'s owner, group, mode and
    extended attributes and rename it over `path`; False (nothing changed) where the
    temporary cannot be made or given them."""
    try:
        handle, temporary = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=".fix"
        )
    except PermissionError:
        return False  # the directory takes no new file
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            give_identity(out.fileno(), path, info)
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except IdentityNotKept:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return False
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return True


def give_identity(handle: int, original: Path, info: os.stat_result) -> None:
    """The open file gets `original`'s owner and group, then its mode (a change of owner clears
    set-user-ID bits), then its extended attributes; IdentityNotKept where one is refused."""
    mine = os.fstat(handle)
    try:
        if (mine.st_uid, mine.st_gid) != (info.st_uid, info.st_gid):
            os.fchown(handle, info.st_uid, info.st_gid)
        os.fchmod(handle, stat.S_IMODE(info.st_mode))
    except PermissionError as err:
        raise IdentityNotKept from err
    copy_attributes(handle, original)


def copy_attributes(handle: int, original: Path) -> None:
    """The open file's extended attributes made the same as `original`'s (ACLs are stored as
    such attributes); nothing where the file system has none."""
    if not hasattr(os, "listxattr"):
        return
    try:
        wanted = {name: os.getxattr(original, name) for name in os.listxattr(original)}
        present = {name: os.getxattr(handle, name) for name in os.listxattr(handle)}
    except OSError as err:
        if err.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return
        raise IdentityNotKept from err
    try:
        for name in present.keys() - wanted.keys():
            os.removexattr(handle, name)
        for name, value in wanted.items():
            if present.get(name) != value:
                os.setxattr(handle, name, value)
    except OSError as err:
        raise IdentityNotKept from err


def write_through(path: Path, data: bytes) -> None:
    """`data` written over the file's own bytes (same inode, every name and attribute kept),
    the rest cut off, and flushed to the disk."""
    handle = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if hasattr(os, "posix_fallocate") and data:
            try:  # the room for the new bytes first: a full disk fails before a byte changes
                os.posix_fallocate(handle, 0, len(data))
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                    raise
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(handle, view[written:])
        os.ftruncate(handle, len(view))
        os.fsync(handle)
    finally:
        os.close(handle)


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

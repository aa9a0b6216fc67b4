"""`llmmem verify` as the server runs it (the `llmmem.verify` command): on a copy of the
editor's text, in a subprocess that imports nothing from the user's project.

Editors start the server in the user's project, and a `python -m llmmem` started from there
imports that folder's `json.py`, `typing.py`, `datasets.py` or `llmmem.py` in place of the real
modules (`-m` puts the working directory first on `sys.path`; PYTHONPATH may name the folder
too). So the subprocess runs as `python -I` (no working directory on the path, no PYTHON*
variables, no user site-packages) with `sys.path` set to the server's own, less the working
directory and the workspace's folders, from a temporary working directory of its own; every
path passed to it is absolute. Unless the server's `hub` setting is on, it runs with
`HF_HUB_OFFLINE=1`: nothing it loads reaches the Hugging Face Hub.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

VERIFY_TIMEOUT_S = 900
RUN_DIRECTORY_PREFIX = "llmmem-verify-run-"

# run by `python -I -c`: the path to import from, then the module run as `-m` runs it
_RUN_MODULE = (
    "import json, runpy, sys; "
    "sys.path[:] = json.loads(sys.argv[1]); "
    "sys.argv[:] = [sys.argv[2], *sys.argv[3:]]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def import_path(excluded: Sequence[str]) -> list[str]:
    """The server's `sys.path` less what names the working directory or one of `excluded`
    (the workspace's folders): empty and relative entries, and those folders themselves."""
    unsafe = set()
    try:
        folders = [os.getcwd(), *excluded]
    except OSError:  # the working directory was removed: relative entries are dropped anyway
        folders = list(excluded)
    for folder in folders:
        try:
            unsafe.add(os.path.realpath(folder))
        except (OSError, ValueError):
            continue
    return [
        entry
        for entry in sys.path
        if entry and os.path.isabs(entry) and os.path.realpath(entry) not in unsafe
    ]


def isolated_command(module: str, arguments: Sequence[str], excluded: Sequence[str]) -> list[str]:
    """`python -m module arguments`, isolated: `-I`, `sys.path` given explicitly (`-u`: `-I`
    ignores PYTHONUNBUFFERED)."""
    path = json.dumps(import_path(excluded))
    return [sys.executable, "-I", "-u", "-c", _RUN_MODULE, path, module, *arguments]


def verify_command(
    copy: Path, options: dict[str, Any], gpu: str | None, hub: bool, workspace: Sequence[str]
) -> list[str]:
    arguments = ["verify", os.path.abspath(copy), "--format", "json"]
    if options.get("simulate"):
        arguments.append("--simulate")
    elif options.get("device") in ("cpu", "cuda"):
        arguments += ["--device", str(options["device"])]
    if gpu:
        arguments += ["--gpu", gpu]
    arguments.append("--hub" if hub else "--offline")  # verify asks the hub only with --hub
    return isolated_command("llmmem", arguments, workspace)


def verify_environment(hub: bool) -> dict[str, str]:
    """The server's environment, with the hub's offline switch unless hub lookups are on."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not hub:
        environment["HF_HUB_OFFLINE"] = "1"
    return environment


async def start_verify(
    copy: Path, options: dict[str, Any], gpu: str | None, hub: bool, workspace: Sequence[str]
) -> tuple[asyncio.subprocess.Process, Path]:
    """The verify subprocess, started in a temporary directory of its own (returned, for
    `remove_run_directory` once it has ended)."""
    directory = Path(tempfile.mkdtemp(prefix=RUN_DIRECTORY_PREFIX))
    try:
        process = await asyncio.create_subprocess_exec(
            *verify_command(copy, options, gpu, hub, workspace),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=directory,
            env=verify_environment(hub),
            start_new_session=True,  # its own process group: killed with what it starts
        )
    except BaseException:
        remove_run_directory(directory)
        raise
    return process, directory


def remove_run_directory(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def named_as_document(outcome: dict[str, Any], copy: Path, path: Path) -> dict[str, Any]:
    """The outcome's words name the document, not the copy that was measured."""
    for key in ("message", "markdown"):
        if isinstance(outcome.get(key), str):
            outcome[key] = outcome[key].replace(str(copy), str(path)).replace(copy.name, path.name)
    return outcome


async def verify_run(
    process: asyncio.subprocess.Process,
    cancelled: asyncio.Future[None],
    version: int | None,
    stopping: Callable[[], bool],
) -> dict[str, Any]:
    """The outcome of one run: its report, or why it has none (cancelled, too long, stopped
    by `shutdown`)."""
    output = asyncio.ensure_future(process.communicate())
    waited: set[asyncio.Future[Any]] = {output, cancelled}
    try:
        await asyncio.wait(waited, timeout=VERIFY_TIMEOUT_S, return_when="FIRST_COMPLETED")
    finally:
        if not output.done():
            kill_process_group(process)
            output.cancel()
    if cancelled.done():
        await process.wait()
        return {"ok": False, "cancelled": True, "message": "verify cancelled"}
    if not output.done() or output.cancelled():
        await process.wait()
        return {"ok": False, "message": f"verify took longer than {VERIFY_TIMEOUT_S} s"}
    stdout, stderr = output.result()
    if stopping():
        return {"ok": False, "message": "verify stopped: the server is shutting down"}
    return verify_outcome(
        process.returncode or 0,
        stdout.decode("utf-8", errors="replace"),
        stderr.decode("utf-8", errors="replace"),
        version,
    )


def kill_process_group(process: asyncio.subprocess.Process) -> None:
    """End a verify run and the step it started (the worker, torchrun's ranks): it runs in a
    session of its own, so its process group is all of them."""
    if process.returncode is not None:
        return
    try:
        if sys.platform == "win32":
            process.kill()
        else:
            os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def verify_outcome(
    returncode: int, stdout: str, stderr: str, version: int | None = None
) -> dict[str, Any]:
    """`llmmem verify --format json` exits 0 (measured) or 1 (OOM, also a result) with a report;
    3 (could not run here) with a report saying why; 2 (bad input) with one line on stderr."""
    report: dict[str, Any] | None = None
    try:
        parsed = json.loads(stdout) if stdout.strip() else None
        report = parsed if isinstance(parsed, dict) else None
    except ValueError:
        report = None
    if report is not None:
        summary = str(report.get("summary") or "verify finished")
        ok = returncode in (0, 1)
        outcome: dict[str, Any] = {"ok": ok, "message": summary, "report": report}
        if ok:
            rows = [
                f"| {row['what']} | {_gib(row['predicted_bytes'])} | "
                f"{_gib(row['measured_bytes'])} |"
                for row in report.get("comparison", [])
            ]
            outcome["markdown"] = "\n".join(
                [
                    f"**Verified** ({report.get('device', 'this machine')}"
                    f"{'' if version is None else f', version {version}'}): {summary}",
                    "",
                    "| | predicted | measured |",
                    "|---|---:|---:|",
                    *rows,
                ]
            )
        return outcome
    last = (stderr or stdout).strip().splitlines()
    reason = last[-1] if last else f"exit code {returncode}"
    if "invalid choice" in reason and "verify" in reason:
        reason = "this llmmem installation has no `verify` command"
    return {
        "ok": False,
        "message": f"llmmem verify failed: {reason.removeprefix('llmmem: error: ')}",
    }


def _gib(value: Any) -> str:
    from llmmem.units import format_bytes

    return format_bytes(int(value)) if isinstance(value, (int, float)) and value else "—"

"""`llmmem estimate --offline` run as a user runs it (a new process), for the CLI tests of its
flags: the process itself, or its JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def estimate(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmmem", "estimate", "--offline", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )


def report(*flags: str) -> dict[str, Any]:
    done = estimate("--format", "json", *flags)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out

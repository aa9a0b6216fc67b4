"""A released package's source file, read out of its wheel from the package registry (pip's
cache keeps it after the first run); the test is skipped where the registry cannot be reached."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


def wheel_source(folder: Path, package: str, release: str, member: str) -> str:
    """`member` (a path inside the wheel) of `package==release`, downloaded into `folder`."""
    folder = folder / f"{package}-{release}"
    pattern = f"{package.replace('-', '_')}-*.whl"
    found = list(folder.glob(pattern))
    if not found:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            + ["--only-binary=:all:", f"{package}=={release}", "-d", str(folder)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        found = list(folder.glob(pattern))
        if done.returncode != 0 or not found:
            pytest.skip(f"{package} {release} not downloadable here: {done.stderr[-300:]}")
    with zipfile.ZipFile(found[0]) as wheel:
        return wheel.read(member).decode()
